//! One OSD's copy of a PG (`carmine_pg::Member`) fed whatever the network could bring it: any
//! PG message that decodes, from any OSD and incarnation, in any order, between maps, ticks,
//! client writes, recoveries and persists that complete late or never. A peer with a bug (or
//! a message damaged past its checksum) costs a refused or ignored message, never a panic
//! that takes the OSD down.
#![no_main]

use bytes::Bytes;
use carmine_pg::{wire, Action, Event, Interval, Member, OpKind, ReqId};
use carmine_types::Decoder;
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, VecDeque};

/// Events one input drives at most.
const EVENTS_MAX: usize = 256;

fn oid(d: &mut Decoder) -> Option<String> {
    Some(format!("o{}", d.u8("object").ok()? % 4))
}

/// An acting set of up to four OSDs, this one (osd.0) among them or not, in an order the
/// input picks: bits 0–3 say who is in, bits 4–5 who goes first.
fn acting(bits: u8) -> Vec<u32> {
    let mut set: Vec<u32> = (0..4).filter(|o| bits & (1 << o) != 0).collect();
    if !set.is_empty() {
        let first = (bits >> 4) as usize % set.len();
        set.swap(0, first);
    }
    set
}

fn event(d: &mut Decoder, m: &mut Member, persists: &mut VecDeque<u64>) -> Option<Event> {
    let op = d.u8("event").ok()?;
    Some(match op % 10 {
        0 => {
            let epoch = u32::from(d.u8("epoch").ok()? % 8);
            let set = acting(d.u8("acting").ok()?);
            let extra = d.u8("targets").ok()?;
            let targets = acting(extra & 0x0f)
                .into_iter()
                .filter(|o| !set.contains(o))
                .collect();
            let history = match extra >> 6 {
                0 => None,
                1 => Some(Vec::new()),
                _ => Some(vec![Interval {
                    epoch: epoch.saturating_sub(1),
                    acting: set.clone(),
                }]),
            };
            let mut lost = BTreeMap::new();
            if extra & 0x10 != 0 {
                lost.insert(u32::from(extra >> 5 & 3), epoch);
            }
            Event::Map {
                epoch,
                acting: set,
                targets,
                history,
                min_size: 1 + usize::from(extra >> 7),
                lost,
            }
        }
        1 => Event::Tick,
        2 => Event::Clock,
        3 => Event::Persisted {
            seq: persists.pop_front()?,
        },
        4 => Event::Write {
            req: ReqId {
                client: 1,
                tid: u64::from(d.u8("tid").ok()?),
            },
            oid: oid(d)?,
            kind: if op & 0x80 != 0 {
                OpKind::Delete
            } else {
                OpKind::Modify
            },
        },
        5 if op & 0x80 != 0 => Event::NotStored {
            oid: oid(d)?,
            version: wire::decode_version(d).ok()?,
        },
        5 => Event::Recovered {
            oid: oid(d)?,
            version: wire::decode_version(d).ok()?,
        },
        6 => Event::GiveUpUnfound,
        7 => Event::Recorded {
            epoch: u32::from(d.u8("epoch").ok()? % 8),
        },
        _ => {
            let from = u32::from(d.u8("from").ok()? % 4);
            let incs = d.u8("incarnations").ok()?;
            let msg = wire::decode_msg(d, 64).ok()?;
            if !m.admit(from, u64::from(incs & 0x0f), u64::from(incs >> 4), &msg) {
                return Some(Event::Clock);
            }
            Event::Msg { from, msg }
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let mut d = Decoder::new(Bytes::copy_from_slice(data));
    let mut m = Member::new(0, 16);
    m.set_read_lease(1_000, 0);
    m.set_lease_bound(4_000);
    m.set_incarnation(1);
    let mut persists = VecDeque::new();
    let mut now = 0;
    for _ in 0..EVENTS_MAX {
        let Some(ev) = event(&mut d, &mut m, &mut persists) else {
            break;
        };
        now += 10;
        for a in m.handle(now, ev) {
            if let Action::Persist { seq, .. } = a {
                persists.push_back(seq);
            }
        }
        // What a host asks after each event.
        let _ = (m.recoverable(), m.degraded(), m.misplaced(), m.is_clean());
        let _ = (m.wants_temp(1), m.targets_filled(), m.readable(now));
    }
    let _ = m.describe();
});
