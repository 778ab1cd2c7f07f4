//! Which other OSDs a member waits on and does not hear from: what its host reports to the
//! managers as unreachable once it lasts (a broken link between two OSDs that both still reach
//! the map store, or a hung OSD whose registration outlives it; ARCHITECTURE.md, "Failure
//! reports"). Only the member that waits can tell: a primary waits on every member it peers
//! with, and while active on every acting member's answers to its pings; a replica waits on
//! its active primary's pings.

use super::{Member, Role};
use carmine_types::OsdId;

impl Member {
    /// About how many bytes this copy's history takes in a peering message (an answer to a
    /// query, an activation): its object list and its log. Peering sends it in one message,
    /// so it must stay below a frame's payload until object lists go in chunks (backfill by
    /// scan); hosts watch it. O(objects): for a periodic look, not per request.
    pub fn peering_listing_bytes(&self) -> usize {
        // Per object: its name and length prefix, a version; per log entry, the same plus
        // kind and request id.
        let objects: usize = self.objects.keys().map(|o| o.len() + 16).sum();
        let log: usize = self.log.entries().map(|e| e.oid.len() + 48).sum();
        objects + log
    }

    /// The OSDs this member waits on that have not answered, each with how long it has been
    /// silent (in the host's clock):
    /// - as the active primary with read leases, each other acting member whose last promise
    ///   ran out (silent since the ping it last answered was sent, or since the PG went
    ///   active);
    /// - while peering, each member it queried that has not answered this round (silent since
    ///   peering began, or since the history named more members), and while activating, each
    ///   acting member that has not acknowledged (silent since the activation was sent).
    ///
    /// As the active primary, too, each backfill target a write waits on (silent since the
    /// oldest such write was sent, or since it was last activated if later): a target takes no pings (it grants no leases), but a
    /// hung one, or one behind a broken link, holds every write of the PG until the map
    /// marks it down, which this report brings about.
    ///
    /// As a replica, its primary once its pings stopped for longer than a lease (an active
    /// primary pings every quarter lease, whatever else it waits for; silent since the last
    /// ping came). Nothing before the first ping of the interval, nor after the primary
    /// queried or activated it again (restarted within the interval): it may be peering,
    /// waiting on another member. Nothing as a stray.
    pub fn unresponsive(&self, now: u64) -> Vec<(OsdId, u64)> {
        let since_peering = now.saturating_sub(self.peering_since);
        match &self.role {
            Role::Active => {
                let mut silent = self.silent_targets(now);
                if self.lease == 0 || self.acting.len() < 2 {
                    return silent;
                }
                silent.extend(
                    self.acting
                        .iter()
                        .filter(|o| **o != self.osd)
                        .filter(|o| self.promise_from(**o).is_none_or(|end| end <= now))
                        .map(|o| {
                            let last = self.pongs.get(o).map_or(0, |p| p.0);
                            (*o, now.saturating_sub(last.max(self.active_since)))
                        }),
                );
                silent
            }
            Role::Peering { heard } => self
                .probe_set()
                .into_iter()
                .filter(|o| *o != self.osd && !heard.contains_key(o))
                .map(|o| (o, since_peering))
                .collect(),
            Role::Activating { acked, .. } => self
                .acting
                .iter()
                .filter(|o| !acked.contains(o))
                .map(|o| (*o, since_peering))
                .collect(),
            Role::Replica => match (self.pinged_at, self.acting.first()) {
                (Some(at), Some(&primary)) if self.lease > 0 && now > at + self.lease => {
                    vec![(primary, now - at)]
                }
                _ => Vec::new(),
            },
            Role::Stray => Vec::new(),
        }
    }

    /// Backfill targets the primary's writes wait on, each with how long the oldest of those
    /// writes has waited, or since the target was last activated or said it restarted, if
    /// later (until it acknowledges its activation, every write waits on it).
    fn silent_targets(&self, now: u64) -> Vec<(OsdId, u64)> {
        self.targets
            .iter()
            .filter_map(|t| {
                let oldest = self.pending.iter().find(|p| p.waiting.contains(t))?;
                let since = oldest
                    .since
                    .max(self.target_since.get(t).copied().unwrap_or(0));
                Some((*t, now.saturating_sub(since)))
            })
            .collect()
    }
}
