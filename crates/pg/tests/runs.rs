//! A version names one write: a primary restarted within its epoch, whose earlier run made
//! writes its disk never kept, goes active in a later run, and its writes get versions that
//! differ from, and sort after, all of the earlier run's (decision 0009, "Versions name one
//! write"). Simulator seeds 193 and 749 (a restart in the activation's epoch) and 1135 (in
//! an epoch after it, the interval unchanged) gave two writes one version before.

mod common;

use carmine_pg::{Event, Interval, Member, Msg, OpKind, ReqId, Version};

fn map(epoch: u32, acting: &[u32], history: Vec<Interval>) -> Event {
    Event::Map {
        epoch,
        acting: acting.to_vec(),
        targets: Vec::new(),
        history: Some(history),
        min_size: 1,
        lost: Default::default(),
    }
}

/// Delivers `msgs` between `p` (osd.2) and `r` (osd.0) until none is left.
fn exchange(p: &mut Member, r: &mut Member, now: u64, mut msgs: Vec<(u32, u32, Msg)>) {
    while let Some((from, to, msg)) = msgs.pop() {
        let m = if to == 2 { &mut *p } else { &mut *r };
        let actions = m.handle(now, Event::Msg { from, msg });
        let (sent, _) = common::carry(m, now, actions);
        msgs.extend(sent.into_iter().map(|(dest, msg)| (to, dest, msg)));
    }
}

/// Hands map `ev` to both and lets them peer: osd.2 ends the active primary.
fn peer(p: &mut Member, r: &mut Member, now: u64, ev: Event) {
    let mut msgs = Vec::new();
    for (o, m) in [(2u32, &mut *p), (0, &mut *r)] {
        let actions = m.handle(now, ev.clone());
        let (sent, _) = common::carry(m, now, actions);
        msgs.extend(sent.into_iter().map(|(dest, msg)| (o, dest, msg)));
    }
    exchange(p, r, now, msgs);
    // Ticks resend what a restart dropped, until the primary is active.
    for t in 1..20 {
        if p.is_active_primary() {
            return;
        }
        let actions = p.handle(now + t, Event::Tick);
        let (sent, _) = common::carry(p, now + t, actions);
        exchange(
            p,
            r,
            now + t,
            sent.into_iter().map(|(d, m)| (2, d, m)).collect(),
        );
    }
    assert!(p.is_active_primary(), "{}", p.describe());
}

/// A write at the primary that reaches no other member (its replication is lost).
fn write_lost(p: &mut Member, now: u64, tid: u64, oid: &str) -> Version {
    let actions = p.handle(
        now,
        Event::Write {
            req: ReqId { client: 1, tid },
            oid: oid.into(),
            kind: OpKind::Modify,
        },
    );
    common::carry(p, now, actions);
    p.log.head()
}

/// osd.2 restarted from `disk` (its disk before its last write), with a new incarnation.
fn restarted(disk: &Member) -> Member {
    let mut p = disk.clone();
    p.set_incarnation(20);
    p
}

#[test]
fn a_primary_restarted_in_its_epoch_writes_in_a_later_run() {
    let (mut p, mut r) = (Member::new(2, 64), Member::new(0, 64));
    p.set_incarnation(10);
    peer(&mut p, &mut r, 1, map(1, &[2, 0], Vec::new()));
    assert_eq!(p.primary_run.0, 1);
    let first_run = p.primary_run.1;
    let disk = p.restart();
    let lost = write_lost(&mut p, 2, 1, "a");
    assert_eq!(lost.run(), first_run);

    let mut p = restarted(&disk);
    peer(&mut p, &mut r, 3, map(1, &[2, 0], Vec::new()));
    assert_eq!(p.primary_run, (1, first_run + 1), "{}", p.describe());
    let made = write_lost(&mut p, 4, 2, "b");
    assert_eq!(
        made.seq(),
        lost.seq(),
        "the sequence continues from the head heard"
    );
    assert_ne!(made, lost, "two writes, one version");
    assert!(made > lost);
}

#[test]
fn a_primary_that_wrote_in_a_later_epoch_of_its_interval_takes_a_later_run_there_too() {
    let (mut p, mut r) = (Member::new(2, 64), Member::new(0, 64));
    p.set_incarnation(10);
    peer(&mut p, &mut r, 1, map(1, &[2, 0], Vec::new()));
    let first_run = p.primary_run;
    // Epoch 2 keeps the acting set: the primary stays active and writes in it.
    for m in [&mut p, &mut r] {
        let actions = m.handle(2, map(2, &[2, 0], Vec::new()));
        common::carry(m, 2, actions);
    }
    assert!(p.is_active_primary(), "{}", p.describe());
    let disk = p.restart();
    assert_eq!(disk.primary_run, first_run, "no new activation in epoch 2");
    let lost = write_lost(&mut p, 3, 1, "a");
    assert_eq!((lost.epoch, lost.run()), (2, first_run.1));

    let mut p = restarted(&disk);
    peer(&mut p, &mut r, 4, map(2, &[2, 0], Vec::new()));
    let made = write_lost(&mut p, 5, 2, "b");
    assert_eq!((made.epoch, made.seq()), (2, lost.seq()));
    assert_ne!(made, lost, "two writes, one version");
    assert!(made > lost);
}

#[test]
fn runs_start_again_once_a_later_interval_ended_the_earlier_run() {
    // osd.2 went active in run 3 of epoch 1; an interval recorded at epoch 3 (another
    // primary) ended that run. In epoch 4 its writes may use run 0 again.
    let log = carmine_pg::PgLog::new(64);
    let mut p = Member::restore(2, log, Default::default(), Default::default(), 1, (1, 3));
    p.set_incarnation(10);
    // osd.0 took that interval's activation.
    let replica = || {
        let log = carmine_pg::PgLog::new(64);
        Member::restore(0, log, Default::default(), Default::default(), 3, (3, 0))
    };
    let mut r = replica();
    let history = vec![
        Interval {
            epoch: 1,
            acting: vec![2, 0],
        },
        Interval {
            epoch: 3,
            acting: vec![0, 2],
        },
    ];
    peer(&mut p, &mut r, 1, map(4, &[2, 0], history.clone()));
    assert_eq!(p.primary_run, (4, 0), "{}", p.describe());
    // Without that interval, run 3 of epoch 1 may have gone on writing into epoch 4.
    let log = carmine_pg::PgLog::new(64);
    let mut p = Member::restore(2, log, Default::default(), Default::default(), 1, (1, 3));
    p.set_incarnation(10);
    let mut r = replica();
    peer(&mut p, &mut r, 1, map(4, &[2, 0], history[..1].to_vec()));
    assert_eq!(p.primary_run, (4, 4), "{}", p.describe());
}

#[test]
fn a_primary_whose_disk_is_new_learns_its_earlier_runs_from_its_members() {
    // osd.2 goes active in run 0 of epoch 1 and makes a write that reaches no member (a
    // backfill target may hold it). Its disk is replaced and it peers again in epoch 1: no
    // head it hears is of this epoch, but osd.0 took run 0's activation.
    let (mut p, mut r) = (Member::new(2, 64), Member::new(0, 64));
    p.set_incarnation(10);
    peer(&mut p, &mut r, 1, map(1, &[2, 0], Vec::new()));
    assert_eq!(
        r.primary_run, p.primary_run,
        "the member records its primary's run"
    );
    let lost = write_lost(&mut p, 2, 1, "a");

    let mut p = restarted(&Member::new(2, 64));
    peer(&mut p, &mut r, 3, map(1, &[2, 0], Vec::new()));
    assert_eq!(p.primary_run, (1, lost.run() + 1), "{}", p.describe());
    let made = write_lost(&mut p, 4, 2, "b");
    assert_eq!(made.seq(), lost.seq());
    assert_ne!(made, lost, "two writes, one version");
    assert!(made > lost);
}

#[test]
fn runs_do_not_climb_from_one_interval_to_the_next() {
    // osd.0 comes and goes: every epoch is a new interval with osd.2 its primary. Each
    // earlier run ended where the acting set changed, so each interval writes in run 0
    // (one run more per interval would use up the epoch's 65,536 after as many flaps).
    let (mut p, mut r) = (Member::new(2, 64), Member::new(0, 64));
    p.set_incarnation(10);
    let mut history = Vec::new();
    for epoch in 1..=8 {
        let acting: &[u32] = if epoch % 2 == 1 { &[2, 0] } else { &[2] };
        peer(
            &mut p,
            &mut r,
            epoch.into(),
            map(epoch, acting, history.clone()),
        );
        assert_eq!(p.primary_run, (epoch, 0), "{}", p.describe());
        write_lost(&mut p, epoch.into(), epoch.into(), "a");
        history.push(Interval {
            epoch,
            acting: acting.to_vec(),
        });
    }
}

#[test]
fn a_member_activated_again_later_in_the_interval_records_the_runs_own_epoch() {
    // osd.2 goes active in epoch 1; the interval goes on into epoch 2, where osd.0 restarts
    // and is activated again. It records epoch 1, the run's: the interval recorded there says
    // which acting set the run wrote with, so a later interval with another knows it ended
    // (with epoch 2 in the record, nothing was recorded at 2 and the next run was one up).
    let (mut p, mut r) = (Member::new(2, 64), Member::new(0, 64));
    p.set_incarnation(10);
    r.set_incarnation(10);
    peer(&mut p, &mut r, 1, map(1, &[2, 0], Vec::new()));
    for m in [&mut p, &mut r] {
        let actions = m.handle(2, map(2, &[2, 0], Vec::new()));
        common::carry(m, 2, actions);
    }
    let mut r = r.restart();
    r.set_incarnation(20);
    let actions = r.handle(3, map(2, &[2, 0], Vec::new()));
    common::carry(&mut r, 3, actions);
    // A write reaches the restarted member, which says it is not active; the primary
    // activates it again, in epoch 2.
    let actions = p.handle(
        4,
        Event::Write {
            req: ReqId { client: 1, tid: 1 },
            oid: "a".into(),
            kind: OpKind::Modify,
        },
    );
    let (sent, _) = common::carry(&mut p, 4, actions);
    exchange(
        &mut p,
        &mut r,
        4,
        sent.into_iter().map(|(d, m)| (2, d, m)).collect(),
    );
    for t in 5..30 {
        let actions = p.handle(t, Event::Tick);
        let (sent, _) = common::carry(&mut p, t, actions);
        exchange(
            &mut p,
            &mut r,
            t,
            sent.into_iter().map(|(d, m)| (2, d, m)).collect(),
        );
    }
    assert_eq!(r.les, 2, "activated again in epoch 2: {}", r.describe());
    assert_eq!(r.primary_run, (1, 0), "{}", r.describe());
    // It takes the write as part of the history: its host copies the object over.
    for (oid, version) in r.missing.clone() {
        let actions = r.handle(30, Event::Recovered { oid, version });
        common::carry(&mut r, 30, actions);
    }

    // osd.2's disk is replaced and epoch 3 serves from it alone: it must hear osd.0, the only
    // copy that vouches for epoch 1's interval, and its record of a run that ended.
    let mut p = restarted(&Member::new(2, 64));
    let history = vec![Interval {
        epoch: 1,
        acting: vec![2, 0],
    }];
    peer(&mut p, &mut r, 40, map(3, &[2], history));
    assert_eq!(p.primary_run, (3, 0), "{}", p.describe());
}

#[test]
fn a_primary_with_every_run_taken_waits_and_names_the_member_that_took_the_last() {
    // osd.0 reports run 65,535 of epoch 1 as one that may still write (a faulty peer: a
    // correct cluster needs 65,535 activations in one interval for it). osd.2, whose disk
    // is new, has no run left for new versions: it stays peering, and says who holds it.
    let (mut p, mut r) = (Member::new(2, 64), Member::new(0, 64));
    p.set_incarnation(10);
    r.primary_run = (1, carmine_pg::RUN_MAX);
    let ev = map(1, &[2, 0], Vec::new());
    let mut msgs = Vec::new();
    for (o, m) in [(2u32, &mut p), (0, &mut r)] {
        let actions = m.handle(1, ev.clone());
        let (sent, _) = common::carry(m, 1, actions);
        msgs.extend(sent.into_iter().map(|(dest, msg)| (o, dest, msg)));
    }
    exchange(&mut p, &mut r, 1, msgs);
    for t in 2..10 {
        let actions = p.handle(t, Event::Tick);
        let (sent, _) = common::carry(&mut p, t, actions);
        let sent = sent.into_iter().map(|(d, m)| (2, d, m)).collect();
        exchange(&mut p, &mut r, t, sent);
    }
    assert!(!p.is_active_primary(), "{}", p.describe());
    assert_eq!(p.runs_used_up_by(), &[0].into(), "{}", p.describe());
    assert!(p.describe().contains("every run taken"), "{}", p.describe());
    // The record mended (osd.0 replaced by a correct copy), the next epoch's peering of the
    // same primary goes active, and nothing is said any more.
    r.primary_run = (0, 0);
    peer(&mut p, &mut r, 20, map(2, &[2, 0], Vec::new()));
    assert!(p.is_active_primary(), "{}", p.describe());
    assert!(
        !p.describe().contains("every run taken"),
        "{}",
        p.describe()
    );
    assert!(p.runs_used_up_by().is_empty());
}
