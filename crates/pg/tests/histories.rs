//! Peering against random histories: a PG on four OSDs lives through intervals with random
//! acting sets; each interval's primary peers (only once every recorded interval has been
//! heard from), brings its acting set to the authoritative history, and writes, each write
//! reaching a random prefix of the replicas. A write is acknowledged once every acting member
//! has it. Checked at every activation and at the end: the authoritative copy holds every
//! acknowledged write (or a newer one of the same object), and every member brought up to
//! date holds exactly the authoritative objects.

use carmine_pg::{
    choose_authoritative, plan_member, uncovered_intervals, Entry, Interval, MemberPlan, OpKind,
    PeerInfo, PgLog, Version,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const OSDS: u32 = 4;

#[derive(Clone, Debug)]
struct Step {
    /// Bit i: osd.i is in the acting set (the lowest is the primary).
    acting: u8,
    /// Bit i: osd.i is up and heard during peering without being acting.
    extra: u8,
    /// Objects written in this interval, in order.
    writes: Vec<u8>,
    /// How many of the writes each OSD received (the primary has all).
    delivered: [u8; OSDS as usize],
    /// Keep logs short in this interval's members, to exercise backfill.
    short_log: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        1u8..16,
        0u8..16,
        proptest::collection::vec(0u8..4, 0..6),
        proptest::array::uniform4(0u8..7),
        proptest::bool::weighted(0.1),
    )
        .prop_map(|(acting, extra, writes, delivered, short_log)| Step {
            acting,
            extra,
            writes,
            delivered,
            short_log,
        })
}

#[derive(Clone)]
struct Copy {
    log: PgLog,
    les: u32,
    objects: BTreeMap<String, Version>,
}

fn members(mask: u8) -> Vec<u32> {
    (0..OSDS).filter(|i| mask & (1 << i) != 0).collect()
}

/// Peers with `heard` and brings `acting` to the authoritative history; returns the
/// authoritative OSD, or `None` if some recorded interval was not heard from.
fn peer(
    copies: &mut [Copy],
    history: &[Interval],
    acting: &[u32],
    heard: &BTreeSet<u32>,
) -> Option<u32> {
    let heard_les: std::collections::BTreeMap<u32, u32> =
        heard.iter().map(|&o| (o, copies[o as usize].les)).collect();
    if !uncovered_intervals(history, &heard_les, &Default::default()).is_empty() {
        return None;
    }
    let ids: Vec<u32> = heard.iter().copied().collect();
    let infos: Vec<PeerInfo> = ids
        .iter()
        .map(|&o| {
            let c = &copies[o as usize];
            PeerInfo {
                osd: o,
                last_epoch_started: c.les,
                head: c.log.head(),
                tail: c.log.tail(),
                primary_run: (0, 0),
            }
        })
        .collect();
    let auth = ids[choose_authoritative(&infos, acting[0]).expect("someone was heard")];
    let auth_copy = copies[auth as usize].clone();
    for &m in acting {
        let c = &mut copies[m as usize];
        match plan_member(&auth_copy.log, &c.log) {
            MemberPlan::UpToDate => {}
            MemberPlan::Recover {
                merge,
                entries,
                missing,
                ..
            } => {
                c.log.rewind_to(merge);
                for e in entries {
                    c.log.append(e).unwrap();
                }
                for n in missing {
                    match auth_copy.objects.get(&n.oid) {
                        Some(v) => c.objects.insert(n.oid, *v),
                        None => c.objects.remove(&n.oid),
                    };
                }
            }
            MemberPlan::Backfill => {
                c.log.reset_to(&auth_copy.log);
                c.objects = auth_copy.objects.clone();
            }
        }
        assert_eq!(
            c.objects, auth_copy.objects,
            "osd.{m} differs from osd.{auth} after its plan"
        );
    }
    Some(auth)
}

fn holds_acknowledged(c: &Copy, acked: &BTreeMap<String, Version>) -> Result<(), String> {
    for (oid, v) in acked {
        match c.objects.get(oid) {
            Some(have) if have >= v => {}
            other => {
                return Err(format!(
                    "{oid}: acknowledged {v}, authoritative has {other:?}"
                ))
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    #[test]
    fn peering_never_loses_an_acknowledged_write(steps in proptest::collection::vec(step(), 1..12)) {
        let mut copies: Vec<Copy> = (0..OSDS)
            .map(|_| Copy { log: PgLog::new(1000), les: 0, objects: BTreeMap::new() })
            .collect();
        let mut history: Vec<Interval> = Vec::new();
        let mut acked: BTreeMap<String, Version> = BTreeMap::new();
        for (i, s) in steps.iter().enumerate() {
            let epoch = i as u32 + 1;
            let acting = members(s.acting);
            let heard: BTreeSet<u32> = members(s.acting | s.extra).into_iter().collect();
            let Some(auth) = peer(&mut copies, &history, &acting, &heard) else {
                continue; // down: waits for a member of an unheard interval
            };
            if let Err(e) = holds_acknowledged(&copies[auth as usize], &acked) {
                prop_assert!(false, "epoch {epoch}: osd.{auth} chosen but {e}");
            }
            for &m in &acting {
                copies[m as usize].les = epoch;
                if s.short_log {
                    let c = &mut copies[m as usize];
                    let mut short = PgLog::new(2);
                    short.reset_to(&c.log);
                    c.log = short;
                }
            }
            history.push(Interval { epoch, acting: acting.clone() });
            let primary = acting[0];
            let mut version = copies[primary as usize].log.head();
            let mut writes = Vec::new();
            for o in &s.writes {
                version = version.next_in(epoch, 0).expect("far from the bound");
                writes.push(Entry {
                    version,
                    oid: format!("o{o}"),
                    kind: OpKind::Modify,
                    reqid: None,
                });
            }
            let mut all_have = writes.len();
            for &m in &acting {
                let n = if m == primary {
                    writes.len()
                } else {
                    (s.delivered[m as usize] as usize).min(writes.len())
                };
                all_have = all_have.min(n);
                let c = &mut copies[m as usize];
                for w in &writes[..n] {
                    c.log.append(w.clone()).unwrap();
                    c.objects.insert(w.oid.clone(), w.version);
                }
            }
            for w in &writes[..all_have] {
                acked.insert(w.oid.clone(), w.version);
            }
        }
        // Everyone comes back: the PG peers once more with all of them.
        let everyone: Vec<u32> = (0..OSDS).collect();
        let heard: BTreeSet<u32> = everyone.iter().copied().collect();
        let auth = peer(&mut copies, &history, &everyone, &heard).expect("all heard");
        if let Err(e) = holds_acknowledged(&copies[auth as usize], &acked) {
            prop_assert!(false, "at the end: osd.{auth} chosen but {e}");
        }
    }
}
