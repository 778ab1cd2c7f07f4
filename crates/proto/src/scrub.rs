//! The scrub request an operator sends a PG's primary (`carmine pg scrub|deep-scrub|repair`),
//! and the report it answers with once the whole PG was compared across its copies.

use bytes::BufMut;
use carmine_types::limits::OBJECT_NAME_LEN_MAX;
use carmine_types::{DecodeError, Decoder, Encoder};

/// Findings one report lists; more are counted in `findings_total`.
pub const SCRUB_FINDINGS_MAX: usize = 1000;
const WHAT_LEN_MAX: usize = 1024;
const ACTING_MAX: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScrubMode {
    /// Object lists, versions and sizes.
    Light = 0,
    /// Also every copy's data, attributes and omap, by checksum.
    Deep = 1,
    /// A deep scrub that rewrites every bad copy from a good one, then checks again.
    Repair = 2,
}

impl ScrubMode {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Light),
            1 => Some(Self::Deep),
            2 => Some(Self::Repair),
            _ => None,
        }
    }

    pub fn is_deep(self) -> bool {
        self != ScrubMode::Light
    }
}

/// One copy of one object that was found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubFinding {
    pub oid: String,
    pub osd: u32,
    /// What is wrong with it, in words.
    pub what: String,
    /// A repair rewrote it and a second look found it right.
    pub repaired: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubReport {
    /// The map epoch the scrub ran in, and the members it compared (primary first).
    pub epoch: u32,
    pub acting: Vec<u32>,
    pub mode: ScrubMode,
    /// Objects the PG holds, and their bytes at the primary.
    pub objects: u64,
    pub bytes: u64,
    pub findings_total: u64,
    pub findings: Vec<ScrubFinding>,
}

impl ScrubReport {
    /// Findings no repair fixed.
    pub fn unrepaired(&self) -> u64 {
        self.findings_total - self.findings.iter().filter(|f| f.repaired).count() as u64
    }

    pub(crate) fn encode<B: BufMut>(&self, e: &mut Encoder<'_, B>) {
        e.u32(self.epoch).count(self.acting.len());
        self.acting.iter().for_each(|o| {
            e.u32(*o);
        });
        e.u8(self.mode as u8)
            .u64(self.objects)
            .u64(self.bytes)
            .u64(self.findings_total)
            .count(self.findings.len());
        for f in &self.findings {
            let mut end = f.what.len().min(WHAT_LEN_MAX);
            while !f.what.is_char_boundary(end) {
                end -= 1;
            }
            e.str(&f.oid)
                .u32(f.osd)
                .str(&f.what[..end])
                .bool(f.repaired);
        }
    }

    pub(crate) fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        let epoch = d.u32("epoch")?;
        let n = d.count("acting count", ACTING_MAX)?;
        let mut acting = Vec::with_capacity(n);
        for _ in 0..n {
            acting.push(d.u32("acting osd")?);
        }
        let mode = d.u8("scrub mode")?;
        let mode = ScrubMode::from_u8(mode).ok_or(DecodeError::Invalid {
            what: "scrub mode",
            found: mode as u64,
        })?;
        let objects = d.u64("objects")?;
        let bytes = d.u64("bytes")?;
        let findings_total = d.u64("findings")?;
        let n = d.count("finding count", SCRUB_FINDINGS_MAX)?;
        let mut findings = Vec::with_capacity(n);
        for _ in 0..n {
            findings.push(ScrubFinding {
                oid: d.string("object name", OBJECT_NAME_LEN_MAX)?,
                osd: d.u32("osd")?,
                what: d.string("finding", WHAT_LEN_MAX)?,
                repaired: d.bool("repaired")?,
            });
        }
        if (findings.len() as u64) > findings_total {
            return Err(DecodeError::Invalid {
                what: "findings listed beyond their total",
                found: findings.len() as u64,
            });
        }
        Ok(ScrubReport {
            epoch,
            acting,
            mode,
            objects,
            bytes,
            findings_total,
            findings,
        })
    }
}
