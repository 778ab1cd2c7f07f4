//! Scrub's decisions, without I/O: given what each member of the acting set reports of a range
//! of a PG's objects, which copies are wrong, why, and which copy a repair takes them from.
//!
//! The authoritative *set* of objects and their versions is the primary's member state (what
//! peering agreed and the log extended); the authoritative *bytes* of an object are those most
//! members with the right version hold (a deep scrub compares checksums), the primary's copy
//! breaking a tie. A copy that cannot be read (a checksum error in its store) never wins.

use crate::version::Version;
use crate::wire::{decode_version, encode_version};
use bytes::BufMut;
use carmine_types::limits::OBJECT_NAME_LEN_MAX;
use carmine_types::{DecodeError, Decoder, Encoder, OsdId};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Objects one member lists for one scrub chunk; a member with more in the range says its
/// list is cut, and the chunk ends where the shortest list did.
pub const SCRUB_LIST_MAX: usize = 4096;
const ERROR_LEN_MAX: usize = 1024;

/// Checksums of one copy's contents (deep scrub): its data, its attributes (names and values
/// in name order) and its omap (header, then keys and values in key order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    pub data: u32,
    pub attrs: u32,
    pub omap: u32,
}

/// One member's report of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubObject {
    pub oid: String,
    /// The version this member's PG state gives the object (zero: none, a stray object).
    pub version: Version,
    pub size: u64,
    /// Deep scrub only.
    pub digest: Option<Digest>,
    /// Why the member could not read the object (a checksum error, an I/O error).
    pub error: Option<String>,
}

/// One member's report of a range of the PG: the objects its store holds there, in name
/// order. Objects its PG state lists but its store lacks are left out (they are missing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubMap {
    pub objects: Vec<ScrubObject>,
    /// More objects were in the range than one list carries.
    pub truncated: bool,
}

/// What is wrong with one member's copy of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The PG holds the object; this member does not.
    Missing,
    /// This member holds an object the PG does not.
    Unexpected,
    /// The member's copy is of another write.
    Version {
        found: Version,
        want: Version,
    },
    Size {
        found: u64,
        want: u64,
    },
    /// The data's checksum differs from the authoritative copy's.
    Data,
    Attrs,
    Omap,
    /// The member's store could not read it.
    Unreadable(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing => write!(f, "missing"),
            Problem::Unexpected => write!(f, "stray: the PG holds no such object"),
            Problem::Version { found, want } => write!(f, "version {found}, want {want}"),
            Problem::Size { found, want } => write!(f, "size {found}, want {want}"),
            Problem::Data => write!(f, "data checksum differs"),
            Problem::Attrs => write!(f, "attributes differ"),
            Problem::Omap => write!(f, "omap differs"),
            Problem::Unreadable(why) => write!(f, "unreadable: {why}"),
        }
    }
}

/// An object whose copies disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub oid: String,
    /// The version the PG holds (`None`: the object should not exist).
    pub want: Option<Version>,
    /// The member whose copy is right (`None` with `want` set: no member has a good copy).
    pub source: Option<OsdId>,
    /// The members whose copies are wrong, and how.
    pub bad: Vec<(OsdId, Problem)>,
}

/// Compares the members' reports of one range. `expected` holds the PG's objects in that
/// range with their versions; `maps` every acting member's report (the primary's too).
/// Returns only the objects with a problem, in name order.
pub fn compare(
    expected: &BTreeMap<String, Version>,
    maps: &[(OsdId, &ScrubMap)],
    primary: OsdId,
) -> Vec<Verdict> {
    let by_member: Vec<(OsdId, BTreeMap<&str, &ScrubObject>)> = maps
        .iter()
        .map(|(osd, m)| {
            (
                *osd,
                m.objects.iter().map(|o| (o.oid.as_str(), o)).collect(),
            )
        })
        .collect();
    let mut oids: BTreeSet<&str> = expected.keys().map(String::as_str).collect();
    for (_, m) in &by_member {
        oids.extend(m.keys().copied());
    }
    let mut out = Vec::new();
    for oid in oids {
        let want = expected.get(oid).copied();
        let copies: Vec<(OsdId, Option<&ScrubObject>)> = by_member
            .iter()
            .map(|(osd, m)| (*osd, m.get(oid).copied()))
            .collect();
        let verdict = match want {
            None => Verdict {
                oid: oid.to_owned(),
                want: None,
                source: None,
                bad: copies
                    .iter()
                    .filter(|(_, c)| c.is_some())
                    .map(|(osd, _)| (*osd, Problem::Unexpected))
                    .collect(),
            },
            Some(want) => judge(oid, want, &copies, primary),
        };
        if !verdict.bad.is_empty() {
            out.push(verdict);
        }
    }
    out
}

/// The verdict on an object the PG holds at `want`.
fn judge(
    oid: &str,
    want: Version,
    copies: &[(OsdId, Option<&ScrubObject>)],
    primary: OsdId,
) -> Verdict {
    // Good candidates grouped by what they hold; the biggest group wins, then the primary's.
    let mut groups: BTreeMap<(u64, Option<Digest>), Vec<OsdId>> = BTreeMap::new();
    for (osd, c) in copies {
        if let Some(c) = c {
            if c.version == want && c.error.is_none() {
                groups.entry((c.size, c.digest)).or_default().push(*osd);
            }
        }
    }
    let winner = groups
        .iter()
        .max_by(|(_, a), (_, b)| {
            a.len()
                .cmp(&b.len())
                .then(a.contains(&primary).cmp(&b.contains(&primary)))
                .then(b.iter().min().cmp(&a.iter().min()))
        })
        .map(|(k, members)| (*k, members.clone()));
    let source = winner.as_ref().map(|(_, members)| {
        if members.contains(&primary) {
            primary
        } else {
            *members.iter().min().expect("a group has members")
        }
    });
    let bad = copies
        .iter()
        .filter(|(osd, _)| !winner.as_ref().is_some_and(|(_, m)| m.contains(osd)))
        .map(|(osd, c)| {
            let problem = match c {
                None => Problem::Missing,
                Some(c) if c.version != want => Problem::Version {
                    found: c.version,
                    want,
                },
                Some(ScrubObject { error: Some(e), .. }) => Problem::Unreadable(e.clone()),
                Some(c) => match &winner {
                    Some(((size, _), _)) if c.size != *size => Problem::Size {
                        found: c.size,
                        want: *size,
                    },
                    Some(((_, Some(d)), _)) => match c.digest {
                        Some(mine) if mine.data != d.data => Problem::Data,
                        Some(mine) if mine.attrs != d.attrs => Problem::Attrs,
                        _ => Problem::Omap,
                    },
                    // Cannot be: a readable copy of the right version with the winner's
                    // size and no digest is in the winning group.
                    _ => Problem::Data,
                },
            };
            (*osd, problem)
        })
        .collect();
    Verdict {
        oid: oid.to_owned(),
        want: Some(want),
        source,
        bad,
    }
}

pub fn encode_scrub_map<B: BufMut>(e: &mut Encoder<'_, B>, m: &ScrubMap) {
    e.bool(m.truncated).count(m.objects.len());
    for o in &m.objects {
        e.str(&o.oid);
        encode_version(e, o.version);
        e.u64(o.size);
        match o.digest {
            None => e.u8(0),
            Some(d) => e.u8(1).u32(d.data).u32(d.attrs).u32(d.omap),
        };
        match &o.error {
            None => e.u8(0),
            Some(why) => e.u8(1).str(&why[..floor_char_boundary(why, ERROR_LEN_MAX)]),
        };
    }
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    let mut i = s.len().min(max);
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

pub fn decode_scrub_map(d: &mut Decoder) -> Result<ScrubMap, DecodeError> {
    let truncated = d.bool("scrub list cut")?;
    let n = d.count("scrub object count", SCRUB_LIST_MAX)?;
    let mut objects = Vec::with_capacity(n);
    for _ in 0..n {
        let oid = d.string("scrubbed object", OBJECT_NAME_LEN_MAX)?;
        let version = decode_version(d)?;
        let size = d.u64("scrubbed size")?;
        let digest = match d.bool("digest present")? {
            false => None,
            true => Some(Digest {
                data: d.u32("data digest")?,
                attrs: d.u32("attribute digest")?,
                omap: d.u32("omap digest")?,
            }),
        };
        let error = match d.bool("read error present")? {
            false => None,
            true => Some(d.string("read error", ERROR_LEN_MAX)?),
        };
        objects.push(ScrubObject {
            oid,
            version,
            size,
            digest,
            error,
        });
    }
    if objects.windows(2).any(|w| w[0].oid >= w[1].oid) {
        return Err(DecodeError::Invalid {
            what: "scrub list order",
            found: n as u64,
        });
    }
    Ok(ScrubMap { objects, truncated })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(oid: &str, v: u64, size: u64, data: u32) -> ScrubObject {
        ScrubObject {
            oid: oid.into(),
            version: Version::new(1, v),
            size,
            digest: Some(Digest {
                data,
                attrs: 7,
                omap: 9,
            }),
            error: None,
        }
    }

    fn map(objects: Vec<ScrubObject>) -> ScrubMap {
        ScrubMap {
            objects,
            truncated: false,
        }
    }

    fn expected(items: &[(&str, u64)]) -> BTreeMap<String, Version> {
        items
            .iter()
            .map(|(o, v)| (o.to_string(), Version::new(1, *v)))
            .collect()
    }

    #[test]
    fn identical_copies_have_no_verdict() {
        let m = map(vec![obj("a", 1, 10, 5), obj("b", 2, 20, 6)]);
        let exp = expected(&[("a", 1), ("b", 2)]);
        assert!(compare(&exp, &[(0, &m), (1, &m), (2, &m)], 0).is_empty());
    }

    #[test]
    fn the_majority_copy_wins_over_a_corrupt_primary() {
        let good = map(vec![obj("a", 1, 10, 5)]);
        let bad = map(vec![obj("a", 1, 10, 99)]);
        let v = compare(
            &expected(&[("a", 1)]),
            &[(0, &bad), (1, &good), (2, &good)],
            0,
        );
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].source, Some(1));
        assert_eq!(v[0].bad, vec![(0, Problem::Data)]);
        // Two copies that differ: the primary's breaks the tie.
        let v = compare(&expected(&[("a", 1)]), &[(0, &bad), (1, &good)], 0);
        assert_eq!(v[0].source, Some(0));
        assert_eq!(v[0].bad, vec![(1, Problem::Data)]);
    }

    #[test]
    fn unreadable_missing_stale_and_stray_copies_are_each_named() {
        let mut unreadable = obj("a", 1, 10, 5);
        unreadable.error = Some("checksum mismatch".into());
        let p = map(vec![obj("a", 1, 10, 5), obj("b", 2, 20, 6)]);
        let r1 = map(vec![unreadable, obj("b", 1, 20, 6), obj("z", 3, 1, 1)]);
        let r2 = map(vec![obj("a", 1, 12, 5)]);
        let v = compare(
            &expected(&[("a", 1), ("b", 2)]),
            &[(0, &p), (1, &r1), (2, &r2)],
            0,
        );
        let verdict = |oid: &str, want: Option<u64>, source, bad| Verdict {
            oid: oid.into(),
            want: want.map(|v| Version::new(1, v)),
            source,
            bad,
        };
        assert_eq!(
            v,
            vec![
                verdict(
                    "a",
                    Some(1),
                    Some(0),
                    vec![
                        (1, Problem::Unreadable("checksum mismatch".into())),
                        (
                            2,
                            Problem::Size {
                                found: 12,
                                want: 10
                            }
                        )
                    ]
                ),
                verdict(
                    "b",
                    Some(2),
                    Some(0),
                    vec![
                        (
                            1,
                            Problem::Version {
                                found: Version::new(1, 1),
                                want: Version::new(1, 2)
                            }
                        ),
                        (2, Problem::Missing)
                    ]
                ),
                verdict("z", None, None, vec![(1, Problem::Unexpected)]),
            ]
        );
    }

    #[test]
    fn an_object_nobody_holds_well_has_no_source() {
        let mut broken = obj("a", 1, 10, 5);
        broken.error = Some("io".into());
        let m = map(vec![broken]);
        let v = compare(&expected(&[("a", 1)]), &[(0, &m), (1, &map(vec![]))], 0);
        assert_eq!(v[0].source, None);
        assert_eq!(v[0].bad.len(), 2);
    }

    #[test]
    fn scrub_maps_round_trip_and_refuse_disorder() {
        let mut m = map(vec![obj("a", 1, 10, 5), obj("b", 2, 0, 6)]);
        m.objects[1].digest = None;
        m.objects[1].error = Some("é".repeat(600));
        m.truncated = true;
        let mut b = bytes::BytesMut::new();
        encode_scrub_map(&mut Encoder::new(&mut b), &m);
        let got = decode_scrub_map(&mut Decoder::new(b.freeze())).unwrap();
        assert_eq!(got.objects[0], m.objects[0]);
        assert!(got.truncated);
        // The error is cut at a character boundary within the bound.
        assert!(got.objects[1].error.as_ref().unwrap().len() <= ERROR_LEN_MAX);
        m.objects.swap(0, 1);
        let mut b = bytes::BytesMut::new();
        encode_scrub_map(&mut Encoder::new(&mut b), &m);
        assert!(decode_scrub_map(&mut Decoder::new(b.freeze())).is_err());
    }
}
