//! Helpers shared by the protocol tests that drive members by hand.

use carmine_pg::{Action, Event, Member, Msg, ReqId};

/// Carries out `actions` of member `m` at `now`, answering persists and records at once;
/// returns the messages it sent and the writes it acknowledged.
pub fn carry(m: &mut Member, now: u64, actions: Vec<Action>) -> (Vec<(u32, Msg)>, Vec<ReqId>) {
    let (mut sent, mut acked) = (Vec::new(), Vec::new());
    let mut queue = actions;
    while !queue.is_empty() {
        let mut next = Vec::new();
        for a in queue {
            match a {
                Action::Send { to, msg } => sent.push((to, msg)),
                Action::Persist { seq, .. } => {
                    next.extend(m.handle(now, Event::Persisted { seq }));
                }
                Action::Record { interval, .. } => {
                    next.extend(m.handle(
                        now,
                        Event::Recorded {
                            epoch: interval.epoch,
                        },
                    ));
                }
                Action::Ack { req, .. } => acked.push(req),
                _ => {}
            }
        }
        queue = next;
    }
    (sent, acked)
}
