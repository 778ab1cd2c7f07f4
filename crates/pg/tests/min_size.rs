//! A change of the pool's `min_size` starts a new interval, as a change of the acting set does
//! (Ceph's intervals do the same): writes in flight under the old rule end, their clients
//! retry, and the PG goes active again only with `min_size` members. Kept as the same
//! interval, a PG whose `min_size` was raised above its members went on taking writes with
//! fewer copies than its pool asks for.

mod common;

use carmine_pg::{Action, Event, Member, OpKind, ReqId};

fn map(epoch: u32, min_size: usize) -> Event {
    Event::Map {
        epoch,
        acting: vec![0, 1],
        targets: Vec::new(),
        history: Some(Vec::new()),
        min_size,
        lost: Default::default(),
    }
}

/// What the primary answered its clients.
#[derive(Default)]
struct Answers {
    refused: Vec<ReqId>,
    acked: Vec<ReqId>,
}

/// Hands each `(member, event)` over, then runs both members until nothing is in flight;
/// messages between them arrive only if `link`.
fn run(ms: &mut [Member], now: u64, inputs: Vec<(u32, Event)>, link: bool) -> Answers {
    let mut answers = Answers::default();
    let mut inbox: Vec<(u32, u32, Option<Event>)> = inputs
        .into_iter()
        .map(|(to, ev)| (to, to, Some(ev)))
        .collect();
    let mut messages = Vec::new();
    loop {
        let (from, to, ev) = if let Some(x) = inbox.pop() {
            x
        } else if let Some((from, to, msg)) = messages.pop() {
            if !link && from != to {
                continue;
            }
            (from, to, Some(Event::Msg { from, msg }))
        } else {
            return answers;
        };
        let _ = from;
        let m = &mut ms[to as usize];
        let actions = m.handle(now, ev.expect("an event"));
        if to == 0 {
            answers
                .refused
                .extend(actions.iter().filter_map(|a| match a {
                    Action::Refuse { req } => Some(*req),
                    _ => None,
                }));
        }
        let (sent, acked) = common::carry(m, now, actions);
        if to == 0 {
            answers.acked.extend(acked);
        }
        messages.extend(sent.into_iter().map(|(dest, msg)| (to, dest, msg)));
    }
}

fn both(ev: Event) -> Vec<(u32, Event)> {
    vec![(0, ev.clone()), (1, ev)]
}

fn write(tid: u64) -> (ReqId, Vec<(u32, Event)>) {
    let req = ReqId { client: 7, tid };
    let ev = Event::Write {
        req,
        oid: format!("o{tid}"),
        kind: OpKind::Modify,
    };
    (req, vec![(0, ev)])
}

#[test]
fn a_new_min_size_ends_the_interval_and_one_above_the_members_stops_writes() {
    let mut ms: Vec<Member> = (0..2).map(|o| Member::new(o, 16)).collect();
    run(&mut ms, 0, both(map(1, 1)), true);
    assert!(ms[0].is_active_primary(), "{}", ms[0].describe());
    let (w0, ev) = write(1);
    let a = run(&mut ms, 1, ev, true);
    assert_eq!(a.acked, vec![w0], "a write with both members up");

    // A write osd.1 never hears of waits for it...
    let (w1, ev) = write(2);
    let a = run(&mut ms, 2, ev, false);
    assert!(a.acked.is_empty() && a.refused.is_empty());
    assert_eq!(ms[0].writes_in_flight(), 1);
    // ...until min_size changes: its interval ends, its client hears so and retries, and
    // the PG peers again with both members.
    let a = run(&mut ms, 3, both(map(2, 2)), true);
    assert_eq!(a.refused, vec![w1], "the write in flight under min_size 1");
    assert_eq!(ms[0].interval_start(), 2);
    assert!(ms[0].is_active_primary(), "{}", ms[0].describe());
    let (w2, ev) = write(3);
    assert_eq!(run(&mut ms, 4, ev, true).acked, vec![w2]);

    // min_size 3 with two members: no write is taken.
    run(&mut ms, 5, both(map(3, 3)), true);
    assert!(!ms[0].is_active_primary(), "{}", ms[0].describe());
    let (w3, ev) = write(4);
    let a = run(&mut ms, 6, ev, true);
    assert_eq!((a.refused, a.acked), (vec![w3], vec![]));

    // Lowered again: active, writes go on.
    run(&mut ms, 7, both(map(4, 2)), true);
    assert!(ms[0].is_active_primary(), "{}", ms[0].describe());
    let (w4, ev) = write(5);
    assert_eq!(run(&mut ms, 8, ev, true).acked, vec![w4]);
}
