//! A PG's recorded history (decision 0009, point 4): the acting sets of the intervals that
//! went active, oldest first. A primary appends its own once every member took its
//! activation and before it goes active, with a compare-and-swap on the last one, and
//! activates only once each earlier interval is vouched for (`uncovered_intervals`).
//! Stored in the map store, one record per PG, in this encoding (docs/format/pg-history.md).

use crate::peering::Interval;
use bytes::{Bytes, BytesMut};
use carmine_types::{crc32c, DecodeError, Decoder, Encoder, OsdId};
use thiserror::Error;

const MAGIC: u32 = u32::from_le_bytes(*b"CPGH");
pub const HISTORY_FORMAT_VERSION: u16 = 1;
/// Intervals kept: a PG that never gets clean would grow without this; past it, the record
/// is refused rather than cut (cutting could forget an interval that holds writes).
pub const HISTORY_INTERVALS_MAX: usize = 4096;
const ACTING_MAX: usize = 16;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum HistoryError {
    #[error("PG history: {0}")]
    Decode(#[from] DecodeError),
    #[error("PG history: bad magic {0:#010x}")]
    BadMagic(u32),
    #[error(
        "PG history: unsupported format version {0} (this build reads {HISTORY_FORMAT_VERSION})"
    )]
    BadVersion(u16),
    #[error("PG history: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("PG history: {0}")]
    Invalid(String),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub intervals: Vec<Interval>,
}

impl History {
    /// The epoch of the newest recorded interval.
    pub fn last_epoch(&self) -> Option<u32> {
        self.intervals.last().map(|i| i.epoch)
    }

    /// Appends `interval` if the newest recorded interval is still the one of epoch `after`
    /// (`None`: none recorded) and `interval` is newer; false otherwise, changing nothing.
    pub fn append(&mut self, after: Option<u32>, interval: Interval) -> Result<bool, HistoryError> {
        if self.last_epoch() != after || Some(interval.epoch) <= after {
            return Ok(false);
        }
        if self.intervals.len() >= HISTORY_INTERVALS_MAX {
            return Err(HistoryError::Invalid(format!(
                "{} intervals recorded since the PG was last clean; refusing to grow further",
                self.intervals.len()
            )));
        }
        check_interval(&interval)?;
        self.intervals.push(interval);
        Ok(true)
    }

    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        let mut e = Encoder::new(&mut out);
        e.u32(MAGIC)
            .u16(HISTORY_FORMAT_VERSION)
            .count(self.intervals.len());
        for i in &self.intervals {
            e.u32(i.epoch).count(i.acting.len());
            for o in &i.acting {
                e.u32(*o);
            }
        }
        let crc = crc32c(&out);
        Encoder::new(&mut out).u32(crc);
        out.freeze()
    }

    pub fn decode(buf: Bytes) -> Result<Self, HistoryError> {
        if buf.len() < 4 {
            return Err(DecodeError::Truncated {
                what: "PG history checksum",
                needed: 4,
                available: buf.len(),
            }
            .into());
        }
        let body = buf.len() - 4;
        let stored = u32::from_le_bytes(buf[body..].try_into().expect("4 bytes"));
        let computed = crc32c(&buf[..body]);
        if stored != computed {
            return Err(HistoryError::Checksum { stored, computed });
        }
        let mut d = Decoder::new(buf.slice(..body));
        let magic = d.u32("history magic")?;
        if magic != MAGIC {
            return Err(HistoryError::BadMagic(magic));
        }
        let version = d.u16("history version")?;
        if version != HISTORY_FORMAT_VERSION {
            return Err(HistoryError::BadVersion(version));
        }
        let n = d.count("interval count", HISTORY_INTERVALS_MAX)?;
        let mut intervals: Vec<Interval> = Vec::with_capacity(n);
        for _ in 0..n {
            let epoch = d.u32("interval epoch")?;
            let k = d.count("acting count", ACTING_MAX)?;
            let mut acting: Vec<OsdId> = Vec::with_capacity(k);
            for _ in 0..k {
                acting.push(d.u32("acting osd")?);
            }
            let i = Interval { epoch, acting };
            check_interval(&i)?;
            if intervals.last().is_some_and(|p| p.epoch >= epoch) {
                return Err(HistoryError::Invalid(format!(
                    "interval of epoch {epoch} after one of epoch {}",
                    intervals.last().expect("checked").epoch
                )));
            }
            intervals.push(i);
        }
        d.finish("PG history")?;
        Ok(History { intervals })
    }
}

fn check_interval(i: &Interval) -> Result<(), HistoryError> {
    if i.acting.is_empty() || i.acting.len() > ACTING_MAX {
        return Err(HistoryError::Invalid(format!(
            "interval of epoch {} has {} members",
            i.epoch,
            i.acting.len()
        )));
    }
    for (k, o) in i.acting.iter().enumerate() {
        if i.acting[..k].contains(o) {
            return Err(HistoryError::Invalid(format!(
                "interval of epoch {} names osd.{o} twice",
                i.epoch
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(epoch: u32, acting: &[u32]) -> Interval {
        Interval {
            epoch,
            acting: acting.to_vec(),
        }
    }

    #[test]
    fn appends_only_after_the_interval_it_saw_and_round_trips() {
        let mut h = History::default();
        assert!(h.append(None, iv(3, &[1, 2])).unwrap());
        assert!(
            !h.append(None, iv(4, &[2])).unwrap(),
            "it saw no interval, one is there"
        );
        assert!(!h.append(Some(3), iv(3, &[2])).unwrap(), "not newer");
        assert!(h.append(Some(3), iv(5, &[2, 0])).unwrap());
        assert_eq!(History::decode(h.encode()).unwrap(), h);
        assert!(h.append(Some(5), iv(6, &[1, 1])).is_err(), "an OSD twice");
    }

    #[test]
    fn damaged_or_inconsistent_records_are_refused() {
        let mut h = History::default();
        h.append(None, iv(3, &[1, 2])).unwrap();
        let mut raw = h.encode().to_vec();
        raw[8] ^= 1;
        assert!(matches!(
            History::decode(Bytes::from(raw)),
            Err(HistoryError::Checksum { .. })
        ));
        // Epochs out of order, sealed with a correct checksum.
        let bad = History {
            intervals: vec![iv(5, &[1]), iv(4, &[2])],
        };
        assert!(matches!(
            History::decode(bad.encode()),
            Err(HistoryError::Invalid(_))
        ));
        assert!(History::decode(Bytes::from_static(b"xx")).is_err());
    }
}
