//! Versions order the writes of one PG across primaries, and name each write uniquely.

/// `(epoch, v)`: the epoch in which the PG went active under the primary that made the write,
/// and a counter. Ordered by epoch, then counter.
///
/// The counter is two numbers in one (decision 0009, "versions name one write"): its low
/// [`SEQ_BITS`] are the sequence, which grows by one per write in the PG and continues
/// across epochs and primaries (a member takes an entry only if it follows its head), and
/// the bits above are the primary's *run* within the epoch. A primary restarted within its
/// epoch (its process, or its copy alone) may have given versions to writes its disk never
/// kept; by going active in a run above every run of the epoch it persisted or heard of, it
/// gives its writes versions that sort after, and differ from, all of those, though their
/// sequence continues from the authoritative head. Runs start again from 0 in a new epoch,
/// so a counter written by a build without runs is a counter of run 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub epoch: u32,
    pub v: u64,
}

/// The bits of a counter that hold the sequence; the run is above them.
pub const SEQ_BITS: u32 = 46;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// The largest run a primary may go active in within one epoch (a primary that would need
/// a larger one waits for a new epoch).
pub const RUN_MAX: u32 = (1 << 16) - 1;
/// The largest counter: the largest run with the largest sequence (below 2^62).
pub const COUNTER_MAX: u64 = ((RUN_MAX as u64) << SEQ_BITS) | SEQ_MASK;
const _: () = assert!(COUNTER_MAX < 1 << 62);

impl Version {
    pub const ZERO: Version = Version { epoch: 0, v: 0 };

    pub fn new(epoch: u32, v: u64) -> Self {
        Version { epoch, v }
    }

    /// The version of sequence `seq` made in `run` of `epoch`.
    pub fn in_run(epoch: u32, run: u32, seq: u64) -> Self {
        debug_assert!(run <= RUN_MAX && seq <= SEQ_MASK);
        Version {
            epoch,
            v: ((run as u64) << SEQ_BITS) | (seq & SEQ_MASK),
        }
    }

    /// The sequence: one more than the version's predecessor in the PG's history.
    pub fn seq(self) -> u64 {
        self.v & SEQ_MASK
    }

    /// The run of its epoch's primary that made it (see [`Version`]).
    pub fn run(self) -> u32 {
        (self.v >> SEQ_BITS) as u32
    }

    /// Whether `self` directly follows `prev` in a history: later, with the next sequence.
    pub fn follows(self, prev: Version) -> bool {
        self > prev && self.seq() == prev.seq() + 1
    }

    /// The version the next write gets from a primary active in `run` of `epoch` whose head
    /// is `self`; `None` once the sequence is used up (2^46 writes in one PG: at a million
    /// writes a second, two years).
    pub fn next_in(self, epoch: u32, run: u32) -> Option<Version> {
        let seq = self.seq() + 1;
        if seq > SEQ_MASK || run > RUN_MAX {
            return None;
        }
        // A head of a later epoch, or of a later run of this one, is not expected here (the
        // primary's run is above every run it heard of); keeping its place keeps the order.
        let (epoch, run) = (epoch, run).max((self.epoch, self.run()));
        Some(Version::in_run(epoch, run, seq))
    }
}

/// Reads what [`Version`]'s `Display` writes: `epoch'counter`, or `epoch'seq` `r` `run`.
impl std::str::FromStr for Version {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a version (epoch'counter, or epoch'sequence r run)");
        let (epoch, rest) = s.split_once('\'').ok_or_else(bad)?;
        let epoch = epoch.parse().map_err(|_| bad())?;
        let (seq, run) = rest.split_once('r').unwrap_or((rest, "0"));
        let (seq, run): (u64, u32) = (
            seq.parse().map_err(|_| bad())?,
            run.parse().map_err(|_| bad())?,
        );
        if run == 0 {
            return (seq <= COUNTER_MAX)
                .then_some(Version::new(epoch, seq))
                .ok_or_else(bad);
        }
        if seq > SEQ_MASK || run > RUN_MAX {
            return Err(bad());
        }
        Ok(Version::in_run(epoch, run, seq))
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.run() {
            0 => write!(f, "{}'{}", self.epoch, self.v),
            run => write!(f, "{}'{}r{}", self.epoch, self.seq(), run),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_run_sorts_after_an_earlier_one_at_the_same_sequence() {
        let earlier = Version::in_run(5, 0, 10);
        let head = Version::in_run(5, 0, 9);
        let later = head.next_in(5, 1).unwrap();
        assert_eq!(later.seq(), earlier.seq());
        assert_ne!(later, earlier);
        assert!(later > earlier);
        assert!(later.follows(head));
        assert!(!earlier.follows(later));
    }

    #[test]
    fn runs_start_again_in_a_new_epoch_and_the_order_holds() {
        let head = Version::in_run(5, 3, 9);
        let next = head.next_in(6, 0).unwrap();
        assert_eq!((next.epoch, next.run(), next.seq()), (6, 0, 10));
        assert!(next.follows(head));
        // A stale epoch or run keeps the head's place.
        let kept = head.next_in(5, 1).unwrap();
        assert_eq!((kept.epoch, kept.run(), kept.seq()), (5, 3, 10));
    }

    #[test]
    fn a_used_up_sequence_or_run_gives_no_version() {
        assert!(Version::in_run(1, 0, SEQ_MASK).next_in(1, 0).is_none());
        assert!(Version::new(1, 7).next_in(1, RUN_MAX + 1).is_none());
        assert_eq!(Version::in_run(1, RUN_MAX, SEQ_MASK).v, COUNTER_MAX);
    }

    #[test]
    fn a_counter_of_run_zero_is_the_plain_sequence() {
        let v = Version::new(4, 1234);
        assert_eq!((v.run(), v.seq()), (0, 1234));
        assert_eq!(v.to_string(), "4'1234");
        assert_eq!(Version::in_run(4, 2, 7).to_string(), "4'7r2");
    }

    #[test]
    fn a_displayed_version_reads_back() {
        for v in [
            Version::new(4, 1234),
            Version::in_run(4, 2, 7),
            Version::in_run(u32::MAX, RUN_MAX, SEQ_MASK),
        ] {
            assert_eq!(v.to_string().parse::<Version>(), Ok(v));
        }
        for bad in [
            "",
            "4",
            "4'",
            "x'1",
            "4'1r",
            "4'1r70000",
            "4'99999999999999999r1",
        ] {
            assert!(bad.parse::<Version>().is_err(), "{bad}");
        }
    }
}
