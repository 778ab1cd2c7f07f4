//! Read leases between two members of a PG, driven by hand: the primary serves reads only
//! while its replica answers its pings, says which member went silent once the lease lapsed,
//! and a replica tells a new primary how long its promise to the old one still runs.

mod common;

use carmine_pg::{Action, Event, Member, Msg};

const LEASE: u64 = 1_000;

/// Delivers what `m` asked for, answering persists and records at once, and returns the
/// messages it sent.
fn carry(m: &mut Member, now: u64, actions: Vec<Action>) -> Vec<(u32, Msg)> {
    common::carry(m, now, actions).0
}

/// Runs the two members until nothing is in flight, at `now`; `link` says whether messages
/// between them arrive.
fn settle(ms: &mut [Member], now: u64, mut inbox: Vec<(u32, u32, Msg)>, link: bool) {
    while let Some((from, to, msg)) = inbox.pop() {
        if !link && from != to {
            continue;
        }
        let m = &mut ms[to as usize];
        let actions = m.handle(now, Event::Msg { from, msg });
        for (dest, msg) in carry(m, now, actions) {
            inbox.push((to, dest, msg));
        }
    }
}

fn tick(ms: &mut [Member], now: u64, ev: Event, link: bool) {
    let mut inbox = Vec::new();
    for (i, m) in ms.iter_mut().enumerate() {
        let actions = m.handle(now, ev.clone());
        for (to, msg) in carry(m, now, actions) {
            inbox.push((i as u32, to, msg));
        }
    }
    settle(ms, now, inbox, link);
}

/// The promise an answer to a query reports.
fn promise_in(actions: &[Action]) -> Option<u64> {
    actions.iter().find_map(|a| match a {
        Action::Send {
            msg: Msg::Info { promises_left, .. },
            ..
        } => Some(promises_left.iter().map(|p| p.1).max().unwrap_or(0)),
        _ => None,
    })
}

fn two_members(earlier_until: u64) -> Vec<Member> {
    let mut ms: Vec<Member> = (0..2).map(|o| Member::new(o, 16)).collect();
    for m in &mut ms {
        m.set_read_lease(LEASE, earlier_until);
    }
    let map = Event::Map {
        epoch: 1,
        acting: vec![0, 1],
        targets: Vec::new(),
        history: Some(Vec::new()),
        min_size: 1,
        lost: Default::default(),
    };
    tick(&mut ms, 0, map, true);
    ms
}

#[test]
fn a_primary_reads_only_while_its_replica_renews_the_lease_and_names_it_once_silent() {
    let mut ms = two_members(0);
    assert!(ms[0].is_active_primary(), "{}", ms[0].describe());
    // Active, pinged on activation and answered: readable.
    tick(&mut ms, 1, Event::Clock, true);
    assert!(ms[0].readable(1), "{}", ms[0].describe());
    assert_eq!(ms[0].lease_lapsed(1), None);
    // Pings go on every quarter lease while the link holds: still readable much later.
    for t in (1..=10).map(|i| i * LEASE / 4) {
        tick(&mut ms, t, Event::Clock, true);
    }
    let t = 10 * LEASE / 4;
    assert!(ms[0].readable(t));
    // The link breaks: the lease holds for most of a lease after the last answered ping,
    // then reads stop, and the silent member is named.
    let mut now = t;
    while ms[0].readable(now) {
        now += 10;
        tick(&mut ms, now, Event::Clock, false);
        assert!(
            now < t + LEASE,
            "still readable a lease after the link broke"
        );
    }
    assert!(
        now > t + LEASE / 2,
        "the lease lapsed early, at {}",
        now - t
    );
    let (_, silent) = ms[0].lease_lapsed(now).expect("lapsed");
    assert_eq!(silent, vec![1]);
    // Back: the next ping renews it.
    tick(&mut ms, now + LEASE / 4, Event::Clock, true);
    assert!(ms[0].readable(now + LEASE / 4), "{}", ms[0].describe());
}

#[test]
fn a_replica_reports_its_promise_to_the_old_primary_and_not_to_the_one_asking() {
    let mut ms = two_members(0);
    // Pinged at 0 on activation, and at 300 (a ping is due every quarter lease).
    tick(&mut ms, 300, Event::Clock, true);
    assert!(ms[0].readable(300));
    // osd.1 promised osd.0 a lease from t=300. A query from a third OSD in a new epoch, at
    // t=500, hears how much of it is left; osd.0 asking would hear nothing of its own.
    let map = Event::Map {
        epoch: 2,
        acting: vec![2, 1],
        targets: Vec::new(),
        history: Some(Vec::new()),
        min_size: 1,
        lost: Default::default(),
    };
    let _ = ms[1].handle(500, map);
    let from_new = ms[1].handle(
        500,
        Event::Msg {
            from: 2,
            msg: Msg::Query { epoch: 2 },
        },
    );
    let promise = promise_in(&from_new);
    assert_eq!(promise, Some(LEASE - 200));
    let from_old = ms[1].handle(
        500,
        Event::Msg {
            from: 0,
            msg: Msg::Query { epoch: 2 },
        },
    );
    let promise = promise_in(&from_old);
    assert_eq!(promise, Some(0));
}

#[test]
fn a_restarted_member_takes_its_earlier_promises_to_run_a_lease_past_its_start() {
    // Started at t=5000: whatever its earlier incarnation promised runs out by 6000.
    let mut m = Member::new(1, 16);
    m.set_read_lease(LEASE, 5_000 + LEASE);
    let _ = m.handle(
        5_200,
        Event::Map {
            epoch: 3,
            acting: vec![2, 1],
            targets: Vec::new(),
            history: Some(Vec::new()),
            min_size: 1,
            lost: Default::default(),
        },
    );
    let out = m.handle(
        5_200,
        Event::Msg {
            from: 2,
            msg: Msg::Query { epoch: 3 },
        },
    );
    let promise = promise_in(&out);
    assert_eq!(promise, Some(800));
}

#[test]
fn a_new_primary_goes_active_only_after_the_promises_it_heard_of_ran_out() {
    let mut ms = two_members(0);
    tick(&mut ms, 300, Event::Clock, true);
    assert!(ms[0].readable(300));
    // osd.1 becomes primary of a new interval with osd.0 cut off: it heard only itself,
    // and its own promise to osd.0 (from the ping at t=300) runs until 1300.
    let map = Event::Map {
        epoch: 2,
        acting: vec![1],
        targets: Vec::new(),
        history: Some(Vec::new()),
        min_size: 1,
        lost: Default::default(),
    };
    let mut p = ms.remove(1);
    let actions = p.handle(400, map);
    carry(&mut p, 400, actions);
    assert!(!p.is_active_primary(), "active at 400: {}", p.describe());
    let actions = p.handle(1_250, Event::Clock);
    carry(&mut p, 1_250, actions);
    assert!(!p.is_active_primary(), "active at 1250: {}", p.describe());
    let actions = p.handle(1_301, Event::Clock);
    carry(&mut p, 1_301, actions);
    assert!(p.is_active_primary(), "{}", p.describe());
}

#[test]
fn a_primary_trusts_no_more_than_the_lease_its_replica_granted() {
    // The replica was started with half the primary's lease.
    let mut ms = two_members(0);
    ms[1].set_read_lease(LEASE / 2, 0);
    tick(&mut ms, 300, Event::Clock, true);
    assert!(ms[0].readable(300));
    // 90% of the replica's 500, from the ping at 300: not past 750.
    assert!(ms[0].readable(749), "{}", ms[0].describe());
    assert!(
        !ms[0].readable(751),
        "trusted the primary's own, longer lease"
    );
}

#[test]
fn a_primary_names_members_it_waits_on_with_how_long_they_have_been_silent() {
    let mut ms = two_members(0);
    tick(&mut ms, 1, Event::Clock, true);
    assert!(ms[0].unresponsive(1).is_empty(), "{}", ms[0].describe());
    assert!(
        ms[1].unresponsive(1).is_empty(),
        "pinged: the replica names nobody"
    );
    // Pings answered every quarter lease: nobody silent.
    let mut now = 1;
    for _ in 0..8 {
        now += LEASE / 4;
        tick(&mut ms, now, Event::Clock, true);
        assert!(ms[0].unresponsive(now).is_empty());
    }
    // The link breaks after the ping at `now`: silent only once the promise has run out, and
    // then counted from the last ping it answered.
    let last = now;
    while now < last + 3 * LEASE {
        now += 50;
        tick(&mut ms, now, Event::Clock, false);
        let silent = ms[0].unresponsive(now);
        if ms[0].readable(now) {
            assert!(
                silent.is_empty(),
                "silent while its lease holds: {silent:?}"
            );
        } else {
            assert_eq!(silent, vec![(1, now - last)]);
        }
    }
    // The replica misses the pings of its active primary: silent since the last one came.
    assert_eq!(ms[1].unresponsive(now), vec![(0, now - last)]);
    // A new interval (an epoch was missed) with the replica still silent: the primary waits
    // on its query since peering began.
    let map = Event::Map {
        epoch: 3,
        acting: vec![0, 1],
        targets: Vec::new(),
        history: Some(Vec::new()),
        min_size: 1,
        lost: Default::default(),
    };
    let t = now + 10;
    tick(&mut ms, t, map, false);
    assert!(ms[0].is_peering(), "{}", ms[0].describe());
    assert_eq!(ms[0].unresponsive(t + 700), vec![(1, 700)]);
    // The link heals: the member answers, the PG goes active, nobody is silent.
    let t = t + 800;
    tick(&mut ms, t, Event::Tick, true);
    tick(&mut ms, t + 1, Event::Clock, true);
    assert!(ms[0].is_active_primary(), "{}", ms[0].describe());
    assert!(ms[0].unresponsive(t + 1).is_empty(), "{}", ms[0].describe());
}

#[test]
fn a_replica_with_a_shorter_lease_is_pinged_often_enough_and_forgets_pings_when_queried_again() {
    let mut ms: Vec<Member> = (0..2).map(|o| Member::new(o, 16)).collect();
    ms[0].set_read_lease(4 * LEASE, 0);
    ms[1].set_read_lease(LEASE, 0);
    let map = Event::Map {
        epoch: 1,
        acting: vec![0, 1],
        targets: Vec::new(),
        history: Some(Vec::new()),
        min_size: 1,
        lost: Default::default(),
    };
    tick(&mut ms, 0, map, true);
    assert!(ms[0].is_active_primary(), "{}", ms[0].describe());
    // The primary pings every quarter of the shorter lease the replica granted: neither side
    // ever sees the other silent.
    let mut now = 0;
    for _ in 0..40 {
        now += LEASE / 8;
        tick(&mut ms, now, Event::Clock, true);
        assert!(ms[0].unresponsive(now).is_empty(), "{}", ms[0].describe());
        assert!(ms[1].unresponsive(now).is_empty(), "at {now}");
    }
    // The primary restarts within the interval and queries the replica again: until it is
    // active and pings, the replica does not count it silent, however long peering takes.
    let _ = ms[1].handle(
        now,
        Event::Msg {
            from: 0,
            msg: Msg::Query { epoch: 1 },
        },
    );
    assert!(ms[1].unresponsive(now + 10 * LEASE).is_empty());
}

#[test]
fn the_peering_listing_grows_with_each_object_and_its_log_entry() {
    let mut ms = two_members(0);
    let empty = ms[0].peering_listing_bytes();
    for (i, oid) in ["a", "object-two"].into_iter().enumerate() {
        let write = Event::Write {
            req: carmine_pg::ReqId {
                client: 1,
                tid: i as u64,
            },
            oid: oid.into(),
            kind: carmine_pg::OpKind::Modify,
        };
        let actions = ms[0].handle(10, write);
        let mut inbox: Vec<(u32, u32, Msg)> = Vec::new();
        for (to, msg) in carry(&mut ms[0], 10, actions) {
            inbox.push((0, to, msg));
        }
        settle(&mut ms, 10, inbox, true);
    }
    // Each object: its name and 16 bytes in the list, its name and 48 in the log.
    let names = "a".len() + "object-two".len();
    assert_eq!(
        ms[0].peering_listing_bytes(),
        empty + 2 * names + 2 * (16 + 48),
        "{}",
        ms[0].describe()
    );
    // And it bounds what an answer to a query really encodes to (beyond a fixed header).
    let answer = ms[0].handle(
        20,
        Event::Msg {
            from: 1,
            msg: Msg::Query { epoch: 1 },
        },
    );
    let info = answer
        .into_iter()
        .find_map(|a| match a {
            Action::Send {
                msg: msg @ Msg::Info { .. },
                ..
            } => Some(msg),
            _ => None,
        })
        .expect("an answer");
    let mut out = bytes::BytesMut::new();
    carmine_pg::wire::encode_msg(&mut out, &info);
    let listed = ms[0].peering_listing_bytes();
    assert!(
        out.len() <= listed + 128,
        "{} bytes encoded, {listed} estimated",
        out.len()
    );
}

#[test]
fn a_replica_says_in_its_pongs_whether_its_store_is_full() {
    let mut ms = two_members(0);
    assert!(ms[0].is_active_primary(), "{}", ms[0].describe());
    tick(&mut ms, 1, Event::Clock, true);
    assert!(ms[0].full_members().is_empty());
    // Full: the next answered ping tells the primary.
    ms[1].note_store_full(true);
    tick(&mut ms, LEASE / 2, Event::Clock, true);
    assert_eq!(ms[0].full_members(), &[1].into(), "{}", ms[0].describe());
    // Room again (removals): the next one clears it.
    ms[1].note_store_full(false);
    tick(&mut ms, LEASE, Event::Clock, true);
    assert!(ms[0].full_members().is_empty(), "{}", ms[0].describe());
}

/// Three members, osd.0 the active primary with leases from both others (pinged at 0 and 300).
fn three_members() -> Vec<Member> {
    let mut ms: Vec<Member> = (0..3).map(|o| Member::new(o, 16)).collect();
    for m in &mut ms {
        m.set_read_lease(LEASE, 0);
    }
    let map = Event::Map {
        epoch: 1,
        acting: vec![0, 1, 2],
        targets: Vec::new(),
        history: Some(Vec::new()),
        min_size: 2,
        lost: Default::default(),
    };
    tick(&mut ms, 0, map, true);
    tick(&mut ms, 300, Event::Clock, true);
    assert!(ms[0].readable(300), "{}", ms[0].describe());
    ms
}

/// A planned handover (a temporary acting set released, say): the old primary is a member
/// of the new interval and answers its primary's query, so it has taken the map that ended
/// its interval and serves no more reads; the leases granted to it fence nothing, and the new
/// primary goes active without waiting them out. One that does not answer is waited out.
#[test]
fn a_new_primary_waits_for_no_lease_of_an_old_primary_that_answered_it() {
    let ended = |acting: Vec<u32>, history: Vec<carmine_pg::Interval>| Event::Map {
        epoch: 2,
        acting,
        targets: Vec::new(),
        history: Some(history),
        min_size: 2,
        lost: Default::default(),
    };
    let before = vec![carmine_pg::Interval {
        epoch: 1,
        acting: vec![0, 1, 2],
    }];

    // osd.0 stays, osd.1 becomes primary: active at once (at 400, leases run to 1300).
    let mut ms = three_members();
    tick(&mut ms, 400, ended(vec![1, 2, 0], before.clone()), true);
    assert!(
        !ms[0].readable(400),
        "the old primary stopped serving reads"
    );
    assert!(ms[1].is_active_primary(), "{}", ms[1].describe());

    // osd.0 leaves the acting set but is asked as a member of the last interval: the same.
    let mut ms = three_members();
    tick(&mut ms, 400, ended(vec![1, 2], before.clone()), true);
    assert!(ms[1].is_active_primary(), "{}", ms[1].describe());

    // osd.0 cut off (it has not taken the map): another member of the last interval vouches
    // for it, but osd.0 may still serve reads under the leases granted to it: waited out.
    let mut ms = three_members();
    let mut old = ms.remove(0);
    let mut rest: Vec<Member> = vec![Member::new(9, 16)];
    rest.append(&mut ms);
    // (Index 0 stands in for osd.0, unreachable: its messages are dropped below.)
    let map = ended(vec![1, 2], before);
    for i in 1..3 {
        let actions = rest[i].handle(400, map.clone());
        let mut inbox = Vec::new();
        for (to, msg) in carry(&mut rest[i], 400, actions) {
            inbox.push((i as u32, to, msg));
        }
        settle_without(&mut rest, 400, inbox, 0);
    }
    assert!(old.readable(400), "osd.0 never took the map");
    for (t, ev) in [
        (500, Event::Tick),
        (1_250, Event::Clock),
        (1_500, Event::Clock),
    ] {
        if t == 1_500 {
            assert!(!rest[1].is_active_primary(), "{}", rest[1].describe());
        }
        let actions = rest[1].handle(t, ev);
        let mut inbox = Vec::new();
        for (to, msg) in carry(&mut rest[1], t, actions) {
            inbox.push((1, to, msg));
        }
        settle_without(&mut rest, t, inbox, 0);
    }
    assert!(rest[1].is_active_primary(), "{}", rest[1].describe());
    let _ = old.handle(1_301, Event::Clock);
}

/// As `settle`, for members indexed by OSD id, dropping every message to or from `cut`.
fn settle_without(ms: &mut [Member], now: u64, mut inbox: Vec<(u32, u32, Msg)>, cut: u32) {
    while let Some((from, to, msg)) = inbox.pop() {
        if from == cut || to == cut {
            continue;
        }
        let m = &mut ms[to as usize];
        let actions = m.handle(now, Event::Msg { from, msg });
        for (dest, msg) in carry(m, now, actions) {
            inbox.push((to, dest, msg));
        }
    }
}

/// A lease a peer reports as running past the longest any OSD may grant (a bug, or a damaged
/// message) is waited out only that long: one peer cannot keep a PG inactive for good.
#[test]
fn a_new_primary_waits_out_no_more_than_the_longest_lease_there_may_be() {
    let mut ms = two_members(0);
    // osd.0 reports a promise that runs practically forever.
    ms[0].set_read_lease(LEASE, u64::MAX / 4);
    ms[1].set_lease_bound(2 * LEASE);
    let map = Event::Map {
        epoch: 2,
        acting: vec![1, 0],
        targets: Vec::new(),
        history: Some(Vec::new()),
        min_size: 1,
        lost: Default::default(),
    };
    tick(&mut ms, 400, map, true);
    assert!(!ms[1].is_active_primary(), "{}", ms[1].describe());
    // Waited out a bound and a tenth from when it heard: 400 + 2200.
    tick(&mut ms, 2_550, Event::Clock, true);
    assert!(
        !ms[1].is_active_primary(),
        "active at 2550: {}",
        ms[1].describe()
    );
    tick(&mut ms, 2_650, Event::Clock, true);
    assert!(ms[1].is_active_primary(), "{}", ms[1].describe());
}
