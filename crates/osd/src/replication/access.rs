//! Reads and writes of one object take turns at its primary, as Ceph's object contexts make
//! them (its `rwstate`):
//! - a read runs only once no write to its object is in flight (`write::ready_to_read`), and
//!   holds a [`ReadTurn`] until its last op is done: no write to the object enters meanwhile,
//!   so a request of several read ops, or a store read that looks again because its block
//!   moved, never sees a write that entered after it began;
//! - a write that finds reads of its object running or waiting queues behind them (in its
//!   object's line) and marks the object ([`WriteWait`]) until it enters: reads that come
//!   after it wait for it, so neither a stream of writes nor a stream of reads holds the
//!   other back for ever.
//!
//! Objects are known here by a hash of their name: two names with the same hash only make one
//! wait for the other's turn. The tables hold one entry per object in use and are reused, so
//! the common case allocates nothing.

use super::PgReplica;
use carmine_reactor::WakeAll;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// How long a waiter sleeps at most between looks, in case a wake-up it needed did not come
/// (every change that matters wakes it; this only bounds the damage of one that does not).
const LOOK_AGAIN: Duration = Duration::from_millis(20);

fn key(oid: &str) -> u64 {
    // FNV-1a: a few ns for a volume object's name; collisions only cost a needless wait.
    oid.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Per object (by key), how many hold a turn.
#[derive(Default)]
struct Counts(RefCell<Vec<(u64, u32)>>);

impl Counts {
    fn has(&self, k: u64) -> bool {
        self.0.borrow().iter().any(|(x, _)| *x == k)
    }

    fn add(&self, k: u64) {
        let mut v = self.0.borrow_mut();
        match v.iter_mut().find(|(x, _)| *x == k) {
            Some((_, n)) => *n += 1,
            None => v.push((k, 1)),
        }
    }

    /// Takes one away; true if that was the object's last.
    fn remove(&self, k: u64) -> bool {
        let mut v = self.0.borrow_mut();
        let Some(i) = v.iter().position(|(x, _)| *x == k) else {
            debug_assert!(false, "a turn removed twice");
            return false;
        };
        v[i].1 -= 1;
        if v[i].1 == 0 {
            v.swap_remove(i);
            return true;
        }
        false
    }

    fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }
}

/// Who reads, and which writes wait for readers, per object of one PG at its primary.
#[derive(Default)]
pub(crate) struct Access {
    /// Reads running, or waiting for the writes in flight to their object.
    readers: Counts,
    /// Writes waiting for the readers of their object to finish (the head of its line).
    writers: Counts,
    /// Woken when a reader of an object a write waits for leaves, when a waiting write enters
    /// or gives up, and when writes in flight in the PG complete.
    pub changed: WakeAll,
}

impl Access {
    /// Whether reads of `oid` run or wait: a write to it must wait for them.
    pub fn reading(&self, oid: &str) -> bool {
        !self.readers.is_empty() && self.readers.has(key(oid))
    }

    /// Whether any read of the PG runs or waits.
    pub fn any_reading(&self) -> bool {
        !self.readers.is_empty()
    }

    /// Whether a write to `oid` waits for its readers: a read that comes now waits for it.
    pub fn write_waits(&self, oid: &str) -> bool {
        !self.writers.is_empty() && self.writers.has(key(oid))
    }

    /// Wakes the waiters, if any: something they wait for may have changed (writes in flight
    /// completed, the copy stopped, a waiting write entered or gave up).
    pub fn wake_waiters(&self) {
        if self.changed.has_waiters() {
            self.changed.wake_all();
        }
    }

    /// Waits for a change that may let a waiter go, or `LOOK_AGAIN` at most.
    pub async fn wait_change(&self) {
        let _ = carmine_reactor::timeout(LOOK_AGAIN, self.changed.wait()).await;
    }
}

/// A read's turn on its object: writes to it wait until it is dropped. It belongs to the PG
/// copy it was taken on: a copy that restarts from its store (`restart`) is a new one, whose
/// writes do not wait for reads still finishing on the old one (in practice those are long
/// done: the restart waits out a pause and a peering before the new copy takes a write).
pub(crate) struct ReadTurn {
    pgr: Rc<PgReplica>,
    key: u64,
}

impl ReadTurn {
    pub fn take(pgr: &Rc<PgReplica>, oid: &str) -> Self {
        let key = key(oid);
        pgr.access.readers.add(key);
        ReadTurn {
            pgr: pgr.clone(),
            key,
        }
    }
}

impl Drop for ReadTurn {
    fn drop(&mut self) {
        let a = &self.pgr.access;
        if a.readers.remove(self.key) && a.writers.has(self.key) {
            a.changed.wake_all();
        }
    }
}

/// A write's mark on its object while it waits for the object's readers: reads that come
/// meanwhile wait for it. Dropped once the write entered (or gave up).
pub(crate) struct WriteWait<'a> {
    access: &'a Access,
    key: u64,
}

impl<'a> WriteWait<'a> {
    pub fn mark(access: &'a Access, oid: &str) -> Self {
        let key = key(oid);
        access.writers.add(key);
        WriteWait { access, key }
    }

    /// Whether the reads it waits for are done.
    pub fn readers_gone(&self) -> bool {
        !self.access.readers.has(self.key)
    }
}

impl Drop for WriteWait<'_> {
    fn drop(&mut self) {
        self.access.writers.remove(self.key);
        self.access.wake_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_object_share_and_forget() {
        let c = Counts::default();
        let (a, b) = (key("rbd_data.1.0"), key("rbd_data.1.1"));
        assert_ne!(a, b);
        c.add(a);
        c.add(a);
        c.add(b);
        assert!(c.has(a) && c.has(b));
        assert!(!c.remove(a), "one reader of a is left");
        assert!(c.has(a));
        assert!(c.remove(a));
        assert!(!c.has(a) && c.has(b));
        assert!(c.remove(b));
        assert!(c.is_empty());
    }

    #[test]
    fn a_write_mark_shows_until_dropped_and_sees_readers_go() {
        let access = Access::default();
        access.readers.add(key("x"));
        let mark = WriteWait::mark(&access, "x");
        assert!(access.write_waits("x") && !access.write_waits("y"));
        assert!(!mark.readers_gone());
        assert!(access.readers.remove(key("x")));
        assert!(mark.readers_gone());
        drop(mark);
        assert!(!access.write_waits("x"));
    }
}
