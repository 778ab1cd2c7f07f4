//! Objects no member holds any more: the primary waits for them and counts them as unfound;
//! the operator's `GiveUpUnfound` deletes them from the history (a delete entry each, in the
//! primary's epoch), and the PG goes active and takes writes to them again.

mod common;

use carmine_pg::{Action, Event, Member, Msg, OpKind, ReqId};

fn carry(m: &mut Member, actions: Vec<Action>) -> (Vec<(u32, Msg)>, Vec<ReqId>) {
    common::carry(m, 0, actions)
}

/// Hands `ev` to the members named in `to` (all if `None`), then delivers every message
/// until none is in flight; returns the writes acknowledged.
fn run(ms: &mut [Member], to: Option<usize>, ev: Event) -> Vec<ReqId> {
    let mut inbox = Vec::new();
    let mut acked = Vec::new();
    for (i, m) in ms.iter_mut().enumerate() {
        if to.is_some_and(|t| t != i) {
            continue;
        }
        let (sent, a) = {
            let actions = m.handle(0, ev.clone());
            carry(m, actions)
        };
        acked.extend(a);
        inbox.extend(sent.into_iter().map(|(dest, msg)| (i as u32, dest, msg)));
    }
    while let Some((from, dest, msg)) = inbox.pop() {
        let m = &mut ms[dest as usize];
        let actions = m.handle(0, Event::Msg { from, msg });
        let (sent, a) = carry(m, actions);
        acked.extend(a);
        inbox.extend(sent.into_iter().map(|(d, msg)| (dest, d, msg)));
    }
    acked
}

fn map(epoch: u32, acting: Vec<u32>) -> Event {
    Event::Map {
        epoch,
        acting,
        targets: Vec::new(),
        history: Some(Vec::new()),
        min_size: 1,
        lost: Default::default(),
    }
}

fn write(ms: &mut [Member], primary: usize, tid: u64, oid: &str) -> bool {
    let req = ReqId { client: 7, tid };
    let ev = Event::Write {
        req,
        oid: oid.into(),
        kind: OpKind::Modify,
    };
    run(ms, Some(primary), ev).contains(&req)
}

#[test]
fn objects_nobody_holds_are_waited_for_until_given_up_then_deleted() {
    let mut ms: Vec<Member> = (0..3).map(|o| Member::new(o, 64)).collect();
    // Epoch 1: osd.0 and osd.1 hold "a" and "b".
    run(&mut ms, None, map(1, vec![0, 1]));
    assert!(ms[0].is_active_primary(), "{}", ms[0].describe());
    assert!(write(&mut ms, 0, 1, "a"));
    assert!(write(&mut ms, 0, 2, "b"));
    // Epoch 2: osd.2 joins and takes the history, lacking both (nothing recovers them here).
    run(&mut ms, None, map(2, vec![0, 1, 2]));
    assert!(ms[0].is_active_primary(), "{}", ms[0].describe());
    assert_eq!(ms[2].missing.len(), 2, "{}", ms[2].describe());
    // Both holders lose their disks and come back empty; osd.2 leads epoch 3.
    ms[0] = Member::new(0, 64);
    ms[1] = Member::new(1, 64);
    run(&mut ms, None, map(3, vec![2, 0, 1]));
    assert!(!ms[2].is_active_primary(), "{}", ms[2].describe());
    assert_eq!(ms[2].unfound(), 2, "{}", ms[2].describe());
    assert!(
        !write(&mut ms, 2, 3, "c"),
        "a PG waiting for objects took a write"
    );
    // Asked on a member that waits for nothing: nothing happens.
    run(&mut ms, Some(0), Event::GiveUpUnfound);
    assert_eq!(ms[2].unfound(), 2);
    // Given up at the primary: active, "a" and "b" gone from every copy's history.
    run(&mut ms, Some(2), Event::GiveUpUnfound);
    assert!(ms[2].is_active_primary(), "{}", ms[2].describe());
    assert_eq!(ms[2].unfound(), 0);
    for m in &ms {
        assert!(
            m.objects.is_empty() && m.missing.is_empty(),
            "{}",
            m.describe()
        );
        let deletes: Vec<&str> = m
            .log
            .entries()
            .filter(|e| e.kind == OpKind::Delete)
            .map(|e| e.oid.as_str())
            .collect();
        assert_eq!(deletes, ["a", "b"], "{}", m.describe());
        assert!(m
            .log
            .entries()
            .all(|e| e.kind != OpKind::Delete || e.version.epoch == 3));
    }
    // The PG takes writes again, to the lost objects too.
    assert!(write(&mut ms, 2, 4, "a"));
    assert!(write(&mut ms, 2, 5, "c"));
    assert_eq!(ms[0].objects.len(), 2, "{}", ms[0].describe());
}

/// Like [`run`], but messages to the OSDs in `down` are lost.
fn run_without(ms: &mut [Member], down: &[u32], to: Option<usize>, ev: Event) {
    let mut inbox = Vec::new();
    for (i, m) in ms.iter_mut().enumerate() {
        if to.is_some_and(|t| t != i) || down.contains(&(i as u32)) {
            continue;
        }
        let actions = m.handle(0, ev.clone());
        let (sent, _) = carry(m, actions);
        inbox.extend(sent.into_iter().map(|(dest, msg)| (i as u32, dest, msg)));
    }
    while let Some((from, dest, msg)) = inbox.pop() {
        if down.contains(&dest) {
            continue;
        }
        let m = &mut ms[dest as usize];
        let actions = m.handle(0, Event::Msg { from, msg });
        let (sent, _) = carry(m, actions);
        inbox.extend(sent.into_iter().map(|(d, msg)| (dest, d, msg)));
    }
}

#[test]
fn a_give_up_passes_intervals_whose_copies_came_back_empty_never_unheard_ones() {
    let mut ms: Vec<Member> = (0..4).map(|o| Member::new(o, 64)).collect();
    run(&mut ms, None, map(1, vec![0, 1]));
    assert!(write(&mut ms, 0, 1, "a"));
    let history = vec![carmine_pg::Interval {
        epoch: 1,
        acting: vec![0, 1],
    }];
    let epoch2 = Event::Map {
        epoch: 2,
        acting: vec![2, 3],
        targets: Vec::new(),
        history: Some(history),
        min_size: 1,
        lost: Default::default(),
    };
    // osd.0 and osd.1 are down: the interval that wrote "a" is not accounted for, and a
    // give-up does not pass it (they may come back with "a").
    run_without(&mut ms, &[0, 1], None, epoch2.clone());
    run_without(&mut ms, &[0, 1], Some(2), Event::GiveUpUnfound);
    assert!(!ms[2].is_active_primary(), "{}", ms[2].describe());
    assert_eq!(ms[2].lost_intervals(), 0, "{}", ms[2].describe());
    // They come back empty (lost disks) and answer: the interval is lost, and the PG waits
    // for the operator.
    ms[0] = Member::new(0, 64);
    ms[1] = Member::new(1, 64);
    run(&mut ms, Some(0), epoch2.clone());
    run(&mut ms, Some(1), epoch2);
    run(&mut ms, Some(2), Event::Tick);
    assert!(!ms[2].is_active_primary(), "{}", ms[2].describe());
    assert_eq!(ms[2].lost_intervals(), 1, "{}", ms[2].describe());
    run(&mut ms, Some(2), Event::GiveUpUnfound);
    assert!(ms[2].is_active_primary(), "{}", ms[2].describe());
    assert!(ms[2].objects.is_empty(), "{}", ms[2].describe());
}

#[test]
fn an_osd_declared_lost_lets_a_give_up_pass_the_intervals_it_was_waited_for() {
    let mut ms: Vec<Member> = (0..4).map(|o| Member::new(o, 64)).collect();
    run(&mut ms, None, map(1, vec![0, 1]));
    assert!(write(&mut ms, 0, 1, "a"));
    let history = vec![carmine_pg::Interval {
        epoch: 1,
        acting: vec![0, 1],
    }];
    let at = |epoch: u32, lost: &[(u32, u32)]| Event::Map {
        epoch,
        acting: vec![2, 3],
        targets: Vec::new(),
        history: Some(history.clone()),
        min_size: 1,
        lost: lost.iter().copied().collect(),
    };
    // osd.0 comes back empty; osd.1 never comes back. The interval waits for osd.1, and a
    // give-up does not pass it.
    ms[0] = Member::new(0, 64);
    run_without(&mut ms, &[1], None, at(2, &[]));
    run_without(&mut ms, &[1], Some(2), Event::GiveUpUnfound);
    assert!(!ms[2].is_active_primary(), "{}", ms[2].describe());
    assert_eq!(ms[2].lost_intervals(), 0, "{}", ms[2].describe());
    assert_eq!(ms[2].waiting_on(), &[1].into(), "{}", ms[2].describe());
    // Declared lost before the interval began (it served epoch 1 after that): still waited for.
    run_without(&mut ms, &[1], None, at(3, &[(1, 1)]));
    run_without(&mut ms, &[1], Some(2), Event::GiveUpUnfound);
    assert!(!ms[2].is_active_primary(), "{}", ms[2].describe());
    assert_eq!(ms[2].lost_intervals(), 0, "{}", ms[2].describe());
    // Declared lost in epoch 4: the interval is lost, and waits for the operator only.
    run_without(&mut ms, &[1], None, at(4, &[(1, 4)]));
    assert!(!ms[2].is_active_primary(), "{}", ms[2].describe());
    assert_eq!(ms[2].lost_intervals(), 1, "{}", ms[2].describe());
    assert!(ms[2].waiting_on().is_empty(), "{}", ms[2].describe());
    run_without(&mut ms, &[1], Some(2), Event::GiveUpUnfound);
    assert!(ms[2].is_active_primary(), "{}", ms[2].describe());
    assert!(ms[2].objects.is_empty(), "{}", ms[2].describe());
    assert!(write(&mut ms, 2, 2, "b"));
}

/// The deletes of a give-up are writes of the primary's new run: its activation, which
/// carries them, leaves only once that run is durable at the primary. Sent before, a crash
/// could give the run again, and the deletes' versions to other writes (a reviewer's finding).
#[test]
fn a_give_ups_deletes_leave_only_once_the_primarys_run_is_durable() {
    let mut ms: Vec<Member> = (0..3).map(|o| Member::new(o, 64)).collect();
    run(&mut ms, None, map(1, vec![0, 1]));
    assert!(write(&mut ms, 0, 1, "a"));
    run(&mut ms, None, map(2, vec![0, 1, 2]));
    ms[0] = Member::new(0, 64);
    ms[1] = Member::new(1, 64);
    run(&mut ms, None, map(3, vec![2, 0, 1]));
    assert_eq!(ms[2].unfound(), 1, "{}", ms[2].describe());
    let activations = |actions: &[Action]| {
        actions
            .iter()
            .filter(|a| {
                matches!(
                    a,
                    Action::Send {
                        msg: Msg::Activate { .. },
                        ..
                    }
                )
            })
            .count()
    };
    let actions = ms[2].handle(0, Event::GiveUpUnfound);
    assert_eq!(activations(&actions), 0, "{actions:?}");
    let tick = ms[2].handle(1, Event::Tick);
    assert_eq!(activations(&tick), 0, "{tick:?}");
    let seq = actions
        .iter()
        .find_map(|a| match a {
            Action::Persist { seq, .. } => Some(*seq),
            _ => None,
        })
        .expect("the history is persisted");
    let durable = ms[2].handle(2, Event::Persisted { seq });
    assert_eq!(activations(&durable), 2, "{durable:?}");
}
