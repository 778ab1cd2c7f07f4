//! The encodings of what members send each other ([`Msg`]) and of the parts of a member's
//! state that a host persists (log entries, versions). Versioned by the frame that carries
//! them (`carmine_proto::PROTOCOL_VERSION`) and the record that stores them; every count and
//! string is bounded before anything is allocated, so a hostile peer costs one message, never
//! a panic.

use crate::log::{Entry, OpKind, PgLog, ReqId};
use crate::member::Msg;
use crate::peering::PeerInfo;
use crate::version::{Version, RUN_MAX};
use bytes::{BufMut, BytesMut};
use carmine_types::limits::OBJECT_NAME_LEN_MAX;
use carmine_types::{DecodeError, Decoder, Encoder};
use std::collections::{BTreeMap, BTreeSet};

/// Entries one message may carry: a log is bounded by its own limit, far below this.
pub const LOG_ENTRIES_MAX: usize = 1 << 16;
/// Objects one message may list: a PG's whole object list travels in peering messages.
pub const OBJECTS_MAX: usize = 1 << 22;

const MSG_QUERY: u8 = 1;
const MSG_INFO: u8 = 2;
const MSG_ACTIVATE: u8 = 3;
const MSG_ACTIVATE_ACK: u8 = 4;
const MSG_REP: u8 = 5;
const MSG_REP_ACK: u8 = 6;
const MSG_NOT_ACTIVE: u8 = 7;
const MSG_RECOVERED: u8 = 8;
const MSG_LACKS: u8 = 9;
const MSG_PING: u8 = 10;
const MSG_PONG: u8 = 11;
/// A pong from a replica whose store is full (kind 11 otherwise, so that a build that knows
/// no fullness reads every pong of a replica with room).
const MSG_PONG_FULL: u8 = 12;
/// An info that names the primary each read lease it reports was granted to (kind 2 reports
/// only the longest, to whom unknown).
const MSG_INFO_GRANTEES: u8 = 13;
const MSG_OVERTAKEN: u8 = 14;
/// Leases one info may report by grantee: one per primary a member pinged for within a lease
/// (a handful); a longer list is refused.
pub const PROMISES_MAX: usize = 64;
/// The grantee of a lease granted by an earlier run of the member (unknown).
const GRANTEE_UNKNOWN: u32 = u32::MAX;

/// Leases by grantee as an info carries them: longest first (ties in the order given), at
/// most `PROMISES_MAX`; past that the longest stands for the rest, to whom unknown (always
/// waited out). Decoding yields this form, so an info survives encode → decode unchanged.
fn canonical_promises(mut p: Vec<(Option<u32>, u64)>) -> Vec<(Option<u32>, u64)> {
    p.sort_by_key(|x| std::cmp::Reverse(x.1));
    if p.len() > PROMISES_MAX {
        let longest = p[0].1;
        p.truncate(PROMISES_MAX - 1);
        p.insert(0, (None, longest));
    }
    p
}

fn encode_names<'a, B: BufMut>(
    e: &mut Encoder<'_, B>,
    n: usize,
    names: impl Iterator<Item = &'a String>,
) {
    e.count(n);
    for name in names {
        e.str(name);
    }
}

fn decode_names(d: &mut Decoder) -> Result<Vec<String>, DecodeError> {
    let n = d.count("object name count", OBJECTS_MAX)?;
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        out.push(d.string("object name", OBJECT_NAME_LEN_MAX)?);
    }
    Ok(out)
}

pub fn encode_version<B: BufMut>(e: &mut Encoder<'_, B>, v: Version) {
    e.u32(v.epoch).u64(v.v);
}

/// The largest version counter a message or record may carry: the largest run with the
/// largest sequence (see [`Version`]), below 2^62, so counting on can never wrap.
pub const VERSION_COUNTER_MAX: u64 = crate::version::COUNTER_MAX;

pub fn decode_version(d: &mut Decoder) -> Result<Version, DecodeError> {
    let epoch = d.u32("version epoch")?;
    let v = d.u64("version")?;
    if v > VERSION_COUNTER_MAX {
        return Err(DecodeError::TooLarge {
            what: "version counter",
            found: v,
            limit: VERSION_COUNTER_MAX,
        });
    }
    Ok(Version::new(epoch, v))
}

pub fn encode_entry<B: BufMut>(e: &mut Encoder<'_, B>, entry: &Entry) {
    encode_version(e, entry.version);
    e.str(&entry.oid).u8(match entry.kind {
        OpKind::Modify => 1,
        OpKind::Delete => 2,
    });
    match entry.reqid {
        None => {
            e.u8(0);
        }
        Some(r) => {
            e.u8(1).u64(r.client).u64(r.tid);
        }
    }
}

pub fn decode_entry(d: &mut Decoder) -> Result<Entry, DecodeError> {
    let version = decode_version(d)?;
    let oid = d.string("entry object", OBJECT_NAME_LEN_MAX)?;
    let kind = match d.u8("entry kind")? {
        1 => OpKind::Modify,
        2 => OpKind::Delete,
        k => {
            return Err(DecodeError::Invalid {
                what: "entry kind",
                found: k as u64,
            })
        }
    };
    let reqid = match d.bool("entry request")? {
        false => None,
        true => Some(ReqId {
            client: d.u64("entry client")?,
            tid: d.u64("entry request number")?,
        }),
    };
    Ok(Entry {
        version,
        oid,
        kind,
        reqid,
    })
}

pub fn encode_log<B: BufMut>(e: &mut Encoder<'_, B>, log: &PgLog) {
    encode_version(e, log.tail());
    encode_version(e, log.head());
    e.count(log.len());
    for entry in log.entries() {
        encode_entry(e, entry);
    }
}

/// A log as sent; `max` is the receiver's own bound (it keeps what it keeps).
pub fn decode_log(d: &mut Decoder, max: usize) -> Result<PgLog, DecodeError> {
    let tail = decode_version(d)?;
    let head = decode_version(d)?;
    let n = d.count("log entries", LOG_ENTRIES_MAX)?;
    let mut entries = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        entries.push(decode_entry(d)?);
    }
    PgLog::from_parts(max, tail, head, entries).map_err(|why| DecodeError::Invalid {
        what: why,
        found: n as u64,
    })
}

fn encode_objects<'a, B: BufMut>(
    e: &mut Encoder<'_, B>,
    n: usize,
    objects: impl Iterator<Item = (&'a str, Option<Version>)>,
) {
    e.count(n);
    for (oid, v) in objects {
        e.str(oid);
        encode_present(e, v);
    }
}

/// `u8 present, [version]`: an object's version, or none (the object does not exist).
fn encode_present<B: BufMut>(e: &mut Encoder<'_, B>, v: Option<Version>) {
    match v {
        None => {
            e.u8(0);
        }
        Some(v) => {
            e.u8(1);
            encode_version(e, v);
        }
    }
}

fn decode_present(d: &mut Decoder) -> Result<Option<Version>, DecodeError> {
    Ok(match d.bool("object present")? {
        false => None,
        true => Some(decode_version(d)?),
    })
}

fn decode_objects(d: &mut Decoder) -> Result<Vec<(String, Option<Version>)>, DecodeError> {
    let n = d.count("object count", OBJECTS_MAX)?;
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let oid = d.string("object name", OBJECT_NAME_LEN_MAX)?;
        out.push((oid, decode_present(d)?));
    }
    Ok(out)
}

pub fn encode_msg(out: &mut BytesMut, msg: &Msg) {
    let mut e = Encoder::new(out);
    match msg {
        Msg::Query { epoch } => {
            e.u8(MSG_QUERY).u32(*epoch);
        }
        Msg::Info {
            epoch,
            info,
            log,
            objects,
            missing,
            promises_left,
        } => {
            e.u8(MSG_INFO_GRANTEES)
                .u32(*epoch)
                .u32(info.osd)
                .u32(info.last_epoch_started);
            encode_version(&mut e, info.head);
            encode_version(&mut e, info.tail);
            e.u32(info.primary_run.0).u32(info.primary_run.1);
            encode_log(&mut e, log);
            encode_objects(
                &mut e,
                objects.len(),
                objects.iter().map(|(k, v)| (k.as_str(), Some(*v))),
            );
            encode_names(&mut e, missing.len(), missing.iter());
            // The longest first, as kind 2 has it, then each by grantee.
            let promises = canonical_promises(promises_left.to_vec());
            e.u64(promises.first().map_or(0, |p| p.1));
            e.u32(promises.len() as u32);
            for (g, left) in &promises {
                e.u32(g.unwrap_or(GRANTEE_UNKNOWN)).u64(*left);
            }
        }
        Msg::Activate {
            epoch,
            round,
            run,
            log,
            objects,
        } => {
            e.u8(MSG_ACTIVATE).u32(*epoch).u32(*round);
            e.u32(run.0).u32(run.1);
            encode_log(&mut e, log);
            encode_objects(
                &mut e,
                objects.len(),
                objects.iter().map(|(k, v)| (k.as_str(), *v)),
            );
        }
        Msg::ActivateAck {
            epoch,
            round,
            head,
            missing,
        } => {
            e.u8(MSG_ACTIVATE_ACK).u32(*epoch).u32(*round);
            encode_version(&mut e, *head);
            encode_names(&mut e, missing.len(), missing.iter());
        }
        Msg::Rep { epoch, entry } => {
            e.u8(MSG_REP).u32(*epoch);
            encode_entry(&mut e, entry);
        }
        Msg::RepAck { epoch, version } => {
            e.u8(MSG_REP_ACK).u32(*epoch);
            encode_version(&mut e, *version);
        }
        Msg::NotActive { epoch } => {
            e.u8(MSG_NOT_ACTIVE).u32(*epoch);
        }
        Msg::Recovered {
            epoch,
            round,
            oid,
            version,
        } => {
            e.u8(MSG_RECOVERED).u32(*epoch).u32(*round).str(oid);
            encode_present(&mut e, *version);
        }
        Msg::Overtaken { epoch, round, oid } => {
            e.u8(MSG_OVERTAKEN).u32(*epoch).u32(*round).str(oid);
        }
        Msg::Lacks {
            epoch,
            oids,
            urgent,
        } => {
            e.u8(MSG_LACKS).u32(*epoch).u8(u8::from(*urgent));
            encode_names(&mut e, oids.len(), oids.iter());
        }
        Msg::Ping { epoch, stamp } => {
            e.u8(MSG_PING).u32(*epoch).u64(*stamp);
        }
        Msg::Pong {
            epoch,
            stamp,
            granted,
            full,
        } => {
            let kind = if *full { MSG_PONG_FULL } else { MSG_PONG };
            e.u8(kind).u32(*epoch).u64(*stamp).u64(*granted);
        }
    }
}

/// A primary's run: one past [`RUN_MAX`] would leave no run for the next activation.
fn decode_run(d: &mut Decoder) -> Result<u32, DecodeError> {
    let run = d.u32("primary's run")?;
    if run > RUN_MAX {
        return Err(DecodeError::Invalid {
            what: "a primary's run",
            found: run.into(),
        });
    }
    Ok(run)
}

/// One message; `log_max` bounds the logs it carries as the receiver keeps them.
pub fn decode_msg(d: &mut Decoder, log_max: usize) -> Result<Msg, DecodeError> {
    let tag = d.u8("message kind")?;
    let epoch = d.u32("message epoch")?;
    Ok(match tag {
        MSG_QUERY => Msg::Query { epoch },
        MSG_INFO | MSG_INFO_GRANTEES => {
            let osd = d.u32("info osd")?;
            let last_epoch_started = d.u32("info last epoch started")?;
            let head = decode_version(d)?;
            let tail = decode_version(d)?;
            let primary_run = (d.u32("info run's epoch")?, decode_run(d)?);
            let log = decode_log(d, log_max)?;
            let mut objects = BTreeMap::new();
            for (oid, v) in decode_objects(d)? {
                let Some(v) = v else {
                    return Err(DecodeError::Invalid {
                        what: "an info lists a removed object",
                        found: 0,
                    });
                };
                objects.insert(oid, v);
            }
            let mut missing = BTreeSet::new();
            for oid in decode_names(d)? {
                if !objects.contains_key(&oid) {
                    return Err(DecodeError::Invalid {
                        what: "an info says an object it does not list is missing",
                        found: 0,
                    });
                }
                missing.insert(oid);
            }
            let longest = d.u64("lease promise left")?;
            let mut promises_left = Vec::new();
            if tag == MSG_INFO_GRANTEES {
                let n = d.u32("lease promises")? as usize;
                if n > PROMISES_MAX {
                    return Err(DecodeError::Invalid {
                        what: "lease promises in an info",
                        found: n as u64,
                    });
                }
                for _ in 0..n {
                    let g = d.u32("lease grantee")?;
                    let left = d.u64("lease promise left")?;
                    promises_left.push(((g != GRANTEE_UNKNOWN).then_some(g), left));
                }
            }
            if longest > 0 && promises_left.iter().all(|p| p.1 < longest) {
                // (Kind 2, or a list short of its own longest: that one to whom unknown.)
                promises_left.push((None, longest));
            }
            let promises_left = canonical_promises(promises_left);
            Msg::Info {
                epoch,
                info: PeerInfo {
                    osd,
                    last_epoch_started,
                    head,
                    tail,
                    primary_run,
                },
                log,
                objects,
                missing,
                promises_left: promises_left.into_boxed_slice(),
            }
        }
        MSG_ACTIVATE => Msg::Activate {
            epoch,
            round: d.u32("activation round")?,
            run: {
                let run_epoch = d.u32("activation run's epoch")?;
                if run_epoch > epoch {
                    return Err(DecodeError::Invalid {
                        what: "an activation's run from a later epoch",
                        found: run_epoch.into(),
                    });
                }
                (run_epoch, decode_run(d)?)
            },
            log: decode_log(d, log_max)?,
            objects: decode_objects(d)?,
        },
        MSG_ACTIVATE_ACK => Msg::ActivateAck {
            epoch,
            round: d.u32("activation round")?,
            head: decode_version(d)?,
            missing: decode_names(d)?.into_iter().collect(),
        },
        MSG_REP => Msg::Rep {
            epoch,
            entry: decode_entry(d)?,
        },
        MSG_REP_ACK => Msg::RepAck {
            epoch,
            version: decode_version(d)?,
        },
        MSG_NOT_ACTIVE => Msg::NotActive { epoch },
        MSG_RECOVERED => Msg::Recovered {
            epoch,
            round: d.u32("activation round")?,
            oid: d.string("object name", OBJECT_NAME_LEN_MAX)?,
            version: decode_present(d)?,
        },
        MSG_LACKS => Msg::Lacks {
            epoch,
            urgent: d.bool("urgency")?,
            oids: decode_names(d)?,
        },
        MSG_OVERTAKEN => Msg::Overtaken {
            epoch,
            round: d.u32("activation round")?,
            oid: d.string("object name", OBJECT_NAME_LEN_MAX)?,
        },
        MSG_PING => Msg::Ping {
            epoch,
            stamp: d.u64("ping stamp")?,
        },
        MSG_PONG | MSG_PONG_FULL => Msg::Pong {
            epoch,
            stamp: d.u64("ping stamp")?,
            granted: d.u64("lease granted")?,
            full: tag == MSG_PONG_FULL,
        },
        other => {
            return Err(DecodeError::Invalid {
                what: "message kind",
                found: other as u64,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(v: u64, oid: &str) -> Entry {
        Entry {
            version: Version::new(3, v),
            oid: oid.into(),
            kind: if v.is_multiple_of(2) {
                OpKind::Delete
            } else {
                OpKind::Modify
            },
            reqid: (!v.is_multiple_of(3)).then_some(ReqId { client: 7, tid: v }),
        }
    }

    fn log() -> PgLog {
        let mut l = PgLog::new(4);
        for v in 1..=6 {
            l.append(entry(v, &format!("o{v}"))).unwrap();
        }
        l
    }

    fn info(objects: BTreeMap<String, Version>, missing: &[&str]) -> Msg {
        Msg::Info {
            epoch: 9,
            info: PeerInfo {
                osd: 2,
                last_epoch_started: 5,
                head: Version::new(3, 6),
                tail: Version::new(3, 2),
                primary_run: (4, 2),
            },
            log: log(),
            objects,
            missing: missing.iter().map(|m| m.to_string()).collect(),
            promises_left: vec![(Some(1), 1_500_000_000), (None, 900), (Some(7), 0)].into(),
        }
    }

    fn round_trip(m: &Msg) -> Msg {
        let mut b = BytesMut::new();
        encode_msg(&mut b, m);
        let mut d = Decoder::new(b.freeze());
        let back = decode_msg(&mut d, 4).unwrap();
        d.finish("message").unwrap();
        back
    }

    /// An info's leases come back longest first and at most `PROMISES_MAX` (the longest then
    /// standing for those cut, to whom unknown), and that form is stable: what decodes
    /// survives encode → decode unchanged (the fuzz target's invariant).
    #[test]
    fn an_infos_leases_decode_to_one_form_that_round_trips() {
        let with = |promises: Vec<(Option<u32>, u64)>| match info(BTreeMap::new(), &[]) {
            Msg::Info {
                epoch,
                info,
                log,
                objects,
                missing,
                ..
            } => Msg::Info {
                epoch,
                info,
                log,
                objects,
                missing,
                promises_left: promises.into(),
            },
            _ => unreachable!(),
        };
        let leases = |m: &Msg| match m {
            Msg::Info { promises_left, .. } => promises_left.to_vec(),
            _ => unreachable!(),
        };
        let unsorted = with(vec![(Some(1), 5), (Some(2), 9), (None, 7)]);
        let back = round_trip(&unsorted);
        assert_eq!(leases(&back), vec![(Some(2), 9), (None, 7), (Some(1), 5)]);
        assert_eq!(round_trip(&back), back);

        let many = with((0..70).map(|g| (Some(g), 1000 + u64::from(g))).collect());
        let back = round_trip(&many);
        let l = leases(&back);
        assert_eq!(l.len(), PROMISES_MAX);
        assert_eq!(l[0], (None, 1069), "the longest stands for those cut");
        assert_eq!(l[1], (Some(69), 1069));
        assert_eq!(round_trip(&back), back);
    }

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            Msg::Query { epoch: 9 },
            info(
                [
                    ("a".to_string(), Version::new(3, 5)),
                    ("b".to_string(), Version::new(3, 1)),
                ]
                .into(),
                &["b"],
            ),
            Msg::Activate {
                epoch: 9,
                round: 2,
                run: (8, 3),
                log: log(),
                objects: vec![("a".into(), Some(Version::new(3, 5))), ("b".into(), None)],
            },
            Msg::ActivateAck {
                epoch: 9,
                round: 3,
                head: Version::new(3, 6),
                missing: ["a".to_string(), "c".to_string()].into(),
            },
            Msg::Rep {
                epoch: 9,
                entry: entry(7, "x"),
            },
            Msg::RepAck {
                epoch: 9,
                version: Version::new(9, 7),
            },
            Msg::NotActive { epoch: 9 },
            Msg::Recovered {
                epoch: 9,
                round: 1,
                oid: "a".into(),
                version: Some(Version::new(9, 7)),
            },
            Msg::Recovered {
                epoch: 9,
                round: 1,
                oid: "gone".into(),
                version: None,
            },
            Msg::Lacks {
                epoch: 9,
                oids: vec!["a".into(), "b".into()],
                urgent: true,
            },
            Msg::Overtaken {
                epoch: 9,
                round: 2,
                oid: "hot".into(),
            },
            Msg::Ping {
                epoch: 9,
                stamp: u64::MAX - 3,
            },
            Msg::Pong {
                epoch: 9,
                stamp: 12_345,
                granted: 2_000_000_000,
                full: false,
            },
            Msg::Pong {
                epoch: 9,
                stamp: 12_346,
                granted: 2_000_000_000,
                full: true,
            },
        ];
        for m in &msgs {
            assert_eq!(&round_trip(m), m);
        }
    }

    #[test]
    fn an_info_that_says_an_unlisted_object_is_missing_is_refused() {
        let mut b = BytesMut::new();
        encode_msg(&mut b, &info(BTreeMap::new(), &["ghost"]));
        let err = decode_msg(&mut Decoder::new(b.freeze()), 4).unwrap_err();
        assert!(err.to_string().contains("does not list"), "{err}");
    }

    #[test]
    fn a_version_counter_past_the_bound_is_refused() {
        let mut out = BytesMut::new();
        encode_version(
            &mut Encoder::new(&mut out),
            Version::new(3, VERSION_COUNTER_MAX),
        );
        let at_bound = decode_version(&mut Decoder::new(out.clone().freeze())).unwrap();
        assert_eq!(at_bound.v, VERSION_COUNTER_MAX);
        let mut past = BytesMut::new();
        encode_version(&mut Encoder::new(&mut past), Version::new(3, u64::MAX));
        assert!(matches!(
            decode_version(&mut Decoder::new(past.freeze())),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn truncated_or_damaged_messages_are_errors_not_panics() {
        let mut b = BytesMut::new();
        encode_msg(
            &mut b,
            &Msg::Activate {
                epoch: 1,
                round: 0,
                run: (1, 0),
                log: log(),
                objects: vec![("a".into(), None)],
            },
        );
        let full = b.freeze();
        for cut in 0..full.len() {
            let mut d = Decoder::new(full.slice(..cut));
            assert!(decode_msg(&mut d, 4).is_err(), "cut at {cut}");
        }
        // A log whose entries are out of order, or newer than its head, is refused.
        let mut bad = BytesMut::new();
        let mut e = Encoder::new(&mut bad);
        e.u8(MSG_ACTIVATE).u32(1).u32(0).u32(1).u32(0);
        encode_version(&mut e, Version::ZERO);
        encode_version(&mut e, Version::new(1, 1));
        e.count(2);
        encode_entry(&mut e, &entry(2, "a"));
        encode_entry(&mut e, &entry(1, "a"));
        e.count(0);
        assert!(decode_msg(&mut Decoder::new(bad.freeze()), 4).is_err());
    }

    #[test]
    fn a_run_past_the_last_one_is_refused() {
        let activate = |run| Msg::Activate {
            epoch: 1,
            round: 0,
            run: (1, run),
            log: log(),
            objects: Vec::new(),
        };
        let mut at_bound = info(BTreeMap::new(), &[]);
        if let Msg::Info { info, .. } = &mut at_bound {
            info.primary_run = (4, RUN_MAX);
        }
        let mut past = at_bound.clone();
        if let Msg::Info { info, .. } = &mut past {
            info.primary_run = (4, RUN_MAX + 1);
        }
        assert_eq!(round_trip(&activate(RUN_MAX)), activate(RUN_MAX));
        assert_eq!(round_trip(&at_bound), at_bound);
        let mut later = activate(0);
        if let Msg::Activate { run, .. } = &mut later {
            *run = (2, 0);
        }
        for m in [activate(RUN_MAX + 1), past, later] {
            let mut b = BytesMut::new();
            encode_msg(&mut b, &m);
            let err = decode_msg(&mut Decoder::new(b.freeze()), 4).unwrap_err();
            assert!(err.to_string().contains("run"), "{err}");
        }
    }
}
