//! The PG log: the most recent writes of a PG, in version order, bounded. It is what peering
//! compares between members, what recovery reads to know which objects a member lacks, and
//! where a retried request finds the answer it already had.

use crate::version::Version;
use std::collections::{HashMap, VecDeque};
use thiserror::Error;

/// Entries a PG keeps by default (Ceph's `osd_min_pg_log_entries` is 250 to 3,000).
pub const LOG_ENTRIES_DEFAULT: usize = 3000;

/// A client request's identity: the client instance and its request number. A retry after a
/// failover carries the same id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId {
    pub client: u64,
    pub tid: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// The object was written (created or changed).
    Modify,
    /// The object was removed.
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub version: Version,
    pub oid: String,
    pub kind: OpKind,
    /// The request that made it (none for writes the OSD makes itself).
    pub reqid: Option<ReqId>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LogError {
    #[error("entry {new} does not follow the log's head {head}")]
    OutOfOrder { new: Version, head: Version },
}

/// The log of one PG on one member: entries with versions in `(tail, head]`, ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgLog {
    /// Everything at or before it was trimmed (or never seen).
    tail: Version,
    entries: VecDeque<Entry>,
    /// The version of the newest entry, kept when entries are trimmed away.
    head: Version,
    max: usize,
    /// The entry of each request id in `entries`: a write's duplicate check is one lookup,
    /// not a scan of the log.
    by_request: HashMap<ReqId, Version>,
}

impl PgLog {
    pub fn new(max: usize) -> Self {
        PgLog {
            tail: Version::ZERO,
            entries: VecDeque::new(),
            head: Version::ZERO,
            max: max.max(1),
            by_request: HashMap::new(),
        }
    }

    /// A log from its parts as stored or sent: `entries` ascending within `(tail, head]`
    /// (a log rewound to a merge point may end below its head). Keeps the newest `max`.
    pub fn from_parts(
        max: usize,
        tail: Version,
        head: Version,
        entries: Vec<Entry>,
    ) -> Result<Self, &'static str> {
        if tail > head {
            return Err("a log whose tail is past its head");
        }
        if entries.windows(2).any(|w| w[0].version >= w[1].version) {
            return Err("log entries out of order");
        }
        if entries.first().is_some_and(|e| e.version <= tail)
            || entries.last().is_some_and(|e| e.version > head)
        {
            return Err("log entries outside the log's span");
        }
        let mut log = PgLog {
            tail,
            entries: entries.into(),
            head,
            max: max.max(1),
            by_request: HashMap::new(),
        };
        while log.entries.len() > log.max {
            let old = log.entries.pop_front().expect("longer than the bound");
            log.tail = old.version;
        }
        log.by_request = log
            .entries
            .iter()
            .filter_map(|e| e.reqid.map(|r| (r, e.version)))
            .collect();
        Ok(log)
    }

    /// The newest version the member has.
    pub fn head(&self) -> Version {
        self.head
    }

    /// Versions at or before the tail are not in the log.
    pub fn tail(&self) -> Version {
        self.tail
    }

    pub fn entries(&self) -> impl DoubleEndedIterator<Item = &Entry> + '_ {
        self.entries.iter()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends a write; its version must be newer than the head. Trims the oldest entries
    /// beyond the bound.
    pub fn append(&mut self, e: Entry) -> Result<(), LogError> {
        if e.version <= self.head {
            return Err(LogError::OutOfOrder {
                new: e.version,
                head: self.head,
            });
        }
        self.head = e.version;
        if let Some(r) = e.reqid {
            self.by_request.insert(r, e.version);
        }
        self.entries.push_back(e);
        while self.entries.len() > self.max {
            let old = self.entries.pop_front().expect("longer than the bound");
            self.forget_request(&old);
            self.tail = old.version;
        }
        Ok(())
    }

    fn forget_request(&mut self, e: &Entry) {
        if let Some(r) = e.reqid {
            if self.by_request.get(&r) == Some(&e.version) {
                self.by_request.remove(&r);
            }
        }
    }

    /// Whether version `v` is in the log (within its span and present).
    pub fn contains(&self, v: Version) -> bool {
        self.find(v).is_some()
    }

    fn find(&self, v: Version) -> Option<usize> {
        self.entries.binary_search_by(|e| e.version.cmp(&v)).ok()
    }

    /// The entry of an earlier request with id `r`, if it is still in the log: a retry is
    /// answered from it, not applied again.
    pub fn find_request(&self, r: ReqId) -> Option<&Entry> {
        let v = *self.by_request.get(&r)?;
        self.find(v).map(|i| &self.entries[i])
    }

    /// Entries newer than `v`, oldest first.
    pub fn after(&self, v: Version) -> impl Iterator<Item = &Entry> + '_ {
        let start = self.entries.partition_point(|e| e.version <= v);
        self.entries.range(start..)
    }

    /// Drops the entries newer than `v` (they were never acknowledged) and returns them,
    /// oldest first. The head becomes `v`.
    pub fn rewind_to(&mut self, v: Version) -> Vec<Entry> {
        let start = self.entries.partition_point(|e| e.version <= v);
        let dropped: Vec<Entry> = self.entries.drain(start..).collect();
        for e in &dropped {
            self.forget_request(e);
        }
        if !dropped.is_empty() || v < self.head {
            self.head = v.max(self.tail);
        }
        dropped
    }

    /// Replaces the log with `auth`'s (a member that was backfilled, or whose log no longer
    /// overlaps): it now has everything `auth` describes.
    pub fn reset_to(&mut self, auth: &PgLog) {
        *self = PgLog {
            max: self.max,
            ..auth.clone()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(epoch: u32, v: u64, oid: &str) -> Entry {
        Entry {
            version: Version::new(epoch, v),
            oid: oid.into(),
            kind: OpKind::Modify,
            reqid: Some(ReqId { client: 1, tid: v }),
        }
    }

    #[test]
    fn entries_go_in_version_order_and_the_oldest_are_trimmed() {
        let mut l = PgLog::new(3);
        for v in 1..=5 {
            l.append(e(1, v, "a")).unwrap();
        }
        assert_eq!(l.len(), 3);
        assert_eq!(l.tail(), Version::new(1, 2));
        assert_eq!(l.head(), Version::new(1, 5));
        assert!(!l.contains(Version::new(1, 2)) && l.contains(Version::new(1, 3)));
        assert_eq!(
            l.append(e(1, 5, "b")),
            Err(LogError::OutOfOrder {
                new: Version::new(1, 5),
                head: Version::new(1, 5)
            })
        );
        // A later epoch may continue from the head.
        l.append(e(2, 6, "b")).unwrap();
        assert_eq!(
            l.find_request(ReqId { client: 1, tid: 4 })
                .unwrap()
                .version
                .v,
            4
        );
        assert!(
            l.find_request(ReqId { client: 1, tid: 1 }).is_none(),
            "trimmed"
        );
        let after: Vec<u64> = l.after(Version::new(1, 4)).map(|e| e.version.v).collect();
        assert_eq!(after, vec![5, 6]);
    }

    #[test]
    fn rewinding_drops_what_follows_and_moves_the_head_back() {
        let mut l = PgLog::new(10);
        for v in 1..=4 {
            l.append(e(1, v, "a")).unwrap();
        }
        let dropped = l.rewind_to(Version::new(1, 2));
        assert_eq!(dropped.len(), 2);
        assert_eq!(l.head(), Version::new(1, 2));
        l.append(e(2, 3, "c")).unwrap();
        assert_eq!(l.head(), Version::new(2, 3));
    }
}
