//! The tree against `BTreeMap`, through random inserts, removes, lookups and range scans,
//! with flushes to a simulated device, evictions and reopenings in between: every answer must
//! be the model's, every node must be loaded on demand from what a flush wrote, and the places
//! a flush frees must be exactly the written ones the new root no longer reaches.

use carmine_btree::{Paddr, Tree, TreeError, KEY_MAX, NODE_SIZE, VALUE_MAX};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
    Get(Vec<u8>),
    Range(Vec<u8>, usize),
    Flush,
    Evict,
    EvictTo(usize),
    Reopen,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    // A small alphabet and short keys collide often; a few long keys force splits early.
    prop_oneof![
        4 => proptest::collection::vec(b'a'..b'e', 1..6),
        1 => proptest::collection::vec(b'a'..b'e', 100..300),
        1 => proptest::collection::vec(b'a'..b'e', KEY_MAX - 12..=KEY_MAX),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    // Now and then the largest values, so that a node splits around entries of ~1.5 KB.
    prop_oneof![
        6 => proptest::collection::vec(any::<u8>(), 0..400),
        1 => proptest::collection::vec(any::<u8>(), VALUE_MAX - 40..=VALUE_MAX),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (key(), value()).prop_map(|(k, v)| Op::Insert(k, v)),
        4 => key().prop_map(Op::Remove),
        3 => key().prop_map(Op::Get),
        2 => (key(), 1usize..50).prop_map(|(k, n)| Op::Range(k, n)),
        1 => Just(Op::Flush),
        1 => Just(Op::Evict),
        1 => (0usize..6).prop_map(Op::EvictTo),
        1 => Just(Op::Reopen),
    ]
}

struct Device {
    blocks: HashMap<Paddr, Vec<u8>>,
    next: Paddr,
    /// Every place ever written, and every place freed.
    written: BTreeSet<Paddr>,
    freed: BTreeSet<Paddr>,
}

impl Device {
    fn flush(&mut self, t: &mut Tree) -> Paddr {
        let mut next = self.next;
        let f = t.flush(&mut || {
            next += 1;
            next
        });
        self.next = next;
        for (p, b) in f.writes {
            assert_eq!(b.len(), NODE_SIZE);
            assert!(self.written.insert(p), "place {p} written twice");
            self.blocks.insert(p, b);
        }
        for p in f.freed {
            assert!(self.written.contains(&p), "freed {p}, never written");
            assert!(self.freed.insert(p), "freed {p} twice");
        }
        // What the new root reaches is exactly what was written and not freed.
        let reachable = reach(&self.blocks, f.root);
        let live: BTreeSet<Paddr> = self.written.difference(&self.freed).copied().collect();
        assert_eq!(reachable, live, "flush leaked or freed a live node");
        f.root
    }
}

/// The places reachable from `root`, by decoding the blocks with a throw-away tree.
fn reach(blocks: &HashMap<Paddr, Vec<u8>>, root: Paddr) -> BTreeSet<Paddr> {
    let mut t = Tree::open(root);
    let mut seen = BTreeSet::new();
    // A full scan loads every node; each load names a place.
    loop {
        match t.range(b"", None, usize::MAX) {
            Ok(_) => break,
            Err(TreeError::Need(n)) => {
                seen.insert(n.paddr);
                t.load(&n, &blocks[&n.paddr]).expect("a written node loads");
            }
            Err(e) => panic!("{e}"),
        }
    }
    if seen.is_empty() {
        seen.insert(root);
    }
    seen
}

/// Runs `f` on the tree, loading whatever it needs from the device, until it answers.
fn with_loads<T>(
    t: &mut Tree,
    dev: &Device,
    mut f: impl FnMut(&mut Tree) -> Result<T, TreeError>,
) -> T {
    for _ in 0..10_000 {
        match f(t) {
            Ok(v) => return v,
            Err(TreeError::Need(n)) => {
                let block = dev.blocks.get(&n.paddr).expect("needed node was written");
                t.load(&n, block).expect("a written node loads");
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("no answer after 10,000 loads");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_tree_answers_as_the_model(ops in proptest::collection::vec(op(), 1..600)) {
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut dev = Device { blocks: HashMap::new(), next: 0, written: BTreeSet::new(), freed: BTreeSet::new() };
        let mut t = Tree::new();
        for op in ops {
            match op {
                Op::Insert(k, v) => {
                    let got = with_loads(&mut t, &dev, |t| t.insert(&k, &v));
                    prop_assert_eq!(got, model.insert(k, v));
                }
                Op::Remove(k) => {
                    let got = with_loads(&mut t, &dev, |t| t.remove(&k));
                    prop_assert_eq!(got, model.remove(&k));
                }
                Op::Get(k) => {
                    let got = with_loads(&mut t, &dev, |t| t.get(&k).map(|v| v.map(<[u8]>::to_vec)));
                    prop_assert_eq!(got, model.get(&k).cloned());
                }
                Op::Range(from, n) => {
                    let got = with_loads(&mut t, &dev, |t| t.range(&from, None, n));
                    let want: Vec<_> = model.range(from..).take(n).map(|(k, v)| (k.clone(), v.clone())).collect();
                    prop_assert_eq!(got, want);
                }
                Op::Flush => {
                    dev.flush(&mut t);
                    prop_assert!(!t.is_dirty());
                }
                Op::Evict => {
                    dev.flush(&mut t);
                    t.evict_clean();
                }
                Op::EvictTo(n) => {
                    dev.flush(&mut t);
                    t.evict_to(n);
                    // All clean: only the root may stay beyond the budget.
                    prop_assert!(t.loaded() <= n.max(1), "{} loaded, budget {n}", t.loaded());
                }
                Op::Reopen => {
                    let root = dev.flush(&mut t);
                    t = Tree::open(root);
                }
            }
        }
        // Everything the model holds, in one scan, after a last flush and reopening.
        let root = dev.flush(&mut t);
        let mut t = Tree::open(root);
        let all = with_loads(&mut t, &dev, |t| t.range(b"", None, usize::MAX));
        let want: Vec<_> = model.into_iter().collect();
        prop_assert_eq!(all, want);
    }
}

#[test]
fn a_range_scan_stops_at_its_end_key() {
    let mut t = Tree::new();
    for i in 0..500u32 {
        t.insert(format!("{i:05}").as_bytes(), b"v").unwrap();
    }
    let got = t.range(b"00100", Some(b"00110"), usize::MAX).unwrap();
    let keys: Vec<String> = got
        .into_iter()
        .map(|(k, _)| String::from_utf8(k).unwrap())
        .collect();
    assert_eq!(
        keys,
        (100..110).map(|i| format!("{i:05}")).collect::<Vec<_>>()
    );
}

#[test]
fn oversized_keys_and_values_are_refused() {
    let mut t = Tree::new();
    assert_eq!(t.insert(&[0; 513], b""), Err(TreeError::KeyTooLong(513)));
    assert_eq!(
        t.insert(b"k", &[0; VALUE_MAX + 1]),
        Err(TreeError::ValueTooLong(VALUE_MAX + 1))
    );
    assert!(!t.is_dirty() || t.get(b"k").unwrap().is_none());
}
