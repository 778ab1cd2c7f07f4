//! Versions order the writes of one PG across primaries.

/// `(epoch, v)`: the epoch in which the PG went active under the primary that made the write,
/// and a counter that grows by one per write in the PG. Ordered by epoch, then counter, so a
/// later primary's writes sort after an earlier one's even if its counter restarted lower
/// (it never does: it continues from the authoritative head).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub epoch: u32,
    pub v: u64,
}

impl Version {
    pub const ZERO: Version = Version { epoch: 0, v: 0 };

    pub fn new(epoch: u32, v: u64) -> Self {
        Version { epoch, v }
    }

    /// The version the next write gets from a primary active in `epoch` whose head is `self`.
    pub fn next_in(self, epoch: u32) -> Version {
        Version {
            epoch: epoch.max(self.epoch),
            // (Decoded counters are bounded far below the wrap: `wire::VERSION_COUNTER_MAX`.)
            v: self.v.saturating_add(1),
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}'{}", self.epoch, self.v)
    }
}
