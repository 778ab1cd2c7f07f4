//! Self-fencing by lease (decision 0009, point 6). An OSD is alive for the cluster while its
//! etcd lease is (decision 0007); once the lease may have run out, the managers may have marked
//! it down and a new primary may serve its PGs. An OSD cut off from etcd but not from its
//! clients (a partition, a long pause) must then stop answering them, or a client on its side
//! could read data that the other side has overwritten since.
//!
//! The control thread that renews the lease records, on each success, until when the lease
//! surely holds: the send time of the renewal plus the TTL, less a margin for the two clocks'
//! rates (etcd starts the TTL only when it gets the renewal, so its lease lasts at least that
//! long). The reactors compare that instant with their own clock before they take a client
//! request: two relaxed loads and a clock read, no lock.
//!
//! After a lapse the OSD resumes only once it has renewed *and* its reactors have the map epoch
//! etcd held after that renewal: in between, the cluster may have moved its PGs, and the
//! epoch that says so is the one to serve by.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the OSD trusts a renewal: this share of the TTL (the rest absorbs clock rate
/// differences and a renewal's own delay).
pub const LEASE_TRUSTED_SHARE: f64 = 0.8;

/// Until when the OSD's lease surely holds, shared by its control thread and its reactors.
#[derive(Debug)]
pub struct LeaseClock {
    origin: Instant,
    /// Nanoseconds after `origin` until which the OSD may serve (0: not yet).
    until_ns: AtomicU64,
    /// The map epoch the reactors must have reached to serve (after a lapse).
    epoch_needed: AtomicU32,
    ttl: Duration,
}

impl LeaseClock {
    pub fn new(ttl: Duration) -> Self {
        LeaseClock {
            origin: Instant::now(),
            until_ns: AtomicU64::new(0),
            epoch_needed: AtomicU32::new(0),
            ttl,
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// A renewal sent at `sent` succeeded. After a lapse, the caller first says which epoch
    /// to wait for ([`LeaseClock::resume_at_epoch`]).
    pub fn renewed(&self, sent: Instant) {
        let until = self.ns(sent) + self.ttl.mul_f64(LEASE_TRUSTED_SHARE).as_nanos() as u64;
        self.until_ns.fetch_max(until, Ordering::Release);
    }

    /// Serve again only once the reactors have map epoch `epoch` or newer.
    pub fn resume_at_epoch(&self, epoch: u32) {
        self.epoch_needed.fetch_max(epoch, Ordering::Release);
    }

    /// True once the trusted part of the lease is over (no renewal since).
    pub fn lapsed(&self) -> bool {
        self.ns(Instant::now()) >= self.until_ns.load(Ordering::Acquire)
    }

    /// Why a reactor at map `epoch` may not serve clients now, if it may not.
    pub fn refusal(&self, epoch: u32) -> Option<String> {
        let now = self.ns(Instant::now());
        let until = self.until_ns.load(Ordering::Acquire);
        if now >= until {
            let since = Duration::from_nanos(now - until);
            return Some(format!(
                "its lease in etcd was not renewed in time (trusted part over {since:?} ago): \
                 it may be marked down and its PGs served elsewhere, so it serves nothing until \
                 it renews"
            ));
        }
        let needed = self.epoch_needed.load(Ordering::Acquire);
        (epoch < needed).then(|| {
            format!(
                "its lease lapsed and was renewed; it serves again once it has map epoch \
                 {needed} (it has {epoch})"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_osd_serves_only_within_the_trusted_part_of_its_last_renewal() {
        let l = LeaseClock::new(Duration::from_millis(200));
        assert!(l.refusal(1).is_some(), "nothing renewed yet");
        l.renewed(Instant::now());
        assert_eq!(l.refusal(1), None);
        assert!(!l.lapsed());
        std::thread::sleep(Duration::from_millis(170));
        let why = l.refusal(1).expect("past 80% of the TTL");
        assert!(why.contains("not renewed in time"), "{why}");
        assert!(l.lapsed());
        // An older renewal completing late does not move the deadline back.
        let late = Instant::now();
        l.renewed(late);
        l.renewed(late - Duration::from_millis(150));
        assert_eq!(l.refusal(1), None);
    }

    #[test]
    fn after_a_lapse_it_waits_for_the_epoch_the_cluster_moved_to() {
        let l = LeaseClock::new(Duration::from_secs(5));
        l.resume_at_epoch(7);
        l.renewed(Instant::now());
        let why = l.refusal(6).expect("behind the epoch after the lapse");
        assert!(why.contains("map epoch 7"), "{why}");
        assert_eq!(l.refusal(7), None);
        assert_eq!(l.refusal(8), None);
    }
}
