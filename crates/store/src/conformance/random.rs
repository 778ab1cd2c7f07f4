//! Randomised comparison of a backend against the reference model.
//!
//! Steps are generated over a deliberately small name space (four collections, three
//! objects, a few xattr names and omap keys, offsets below ~64 KiB) so that ops collide often:
//! overwrites, clones over existing objects, removals of what was just created. A small share
//! of ops is invalid (bad names, overflowing offsets, missing objects) so transactions fail
//! part way and rollback is exercised constantly.
//!
//! Runs are seeded: the seed comes from `CARMINE_SEED` or is random, and is printed, so a
//! failure reproduces with `CARMINE_SEED=<seed> cargo test <name>`. Proptest then shrinks the
//! failing sequence to a small one before reporting it.

use super::{diff, dump};
use crate::model::ModelStore;
use crate::{Expect, ObjectStore, Op, StoreError, StoreErrorKind, Transaction};
use bytes::Bytes;
use carmine_types::limits::{
    ATTR_NAME_LEN_MAX, OBJECT_NAME_LEN_MAX, OBJECT_SIZE_MAX, VALUE_LEN_MAX,
};
use carmine_types::{CollectionId, PgId};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use std::fmt;

/// One thing to do to both stores: a transaction, or a read whose result is compared.
#[derive(Clone)]
pub enum Step {
    Submit(Transaction),
    Read {
        cid: CollectionId,
        oid: String,
        off: u64,
        len: u64,
    },
    Readv {
        cid: CollectionId,
        oid: String,
        extents: Vec<(u64, u64)>,
    },
    GetAttr {
        cid: CollectionId,
        oid: String,
        name: String,
    },
    OmapGetValues {
        cid: CollectionId,
        oid: String,
        keys: Vec<Bytes>,
    },
    OmapIterate {
        cid: CollectionId,
        oid: String,
        start_after: Option<Bytes>,
        limit: usize,
    },
    ListObjects {
        cid: CollectionId,
        start_after: Option<String>,
        limit: usize,
    },
}

/// Payloads are shown by length only: shrunk failures stay readable.
struct Brief<'a>(&'a [u8]);
impl fmt::Debug for Brief<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.len() <= 8 {
            write!(f, "{:?}", Bytes::copy_from_slice(self.0))
        } else {
            write!(f, "<{} bytes>", self.0.len())
        }
    }
}

fn brief_name(s: &str) -> String {
    if s.len() > 16 {
        format!("<name of {} bytes>", s.len())
    } else {
        format!("{s:?}")
    }
}

struct BriefOp<'a>(&'a Op);
impl fmt::Debug for BriefOp<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Op::Write {
                cid,
                oid,
                off,
                data,
            } => {
                write!(
                    f,
                    "Write({cid}/{}, off {off}, {:?})",
                    brief_name(oid),
                    Brief(data)
                )
            }
            Op::SetAttrs { cid, oid, attrs } => {
                let attrs: Vec<_> = attrs
                    .iter()
                    .map(|(k, v)| (brief_name(k), Brief(v)))
                    .collect();
                write!(f, "SetAttrs({cid}/{}, {attrs:?})", brief_name(oid))
            }
            Op::OmapSetKeys { cid, oid, kvs } => {
                let kvs: Vec<_> = kvs.iter().map(|(k, v)| (Brief(k), Brief(v))).collect();
                write!(f, "OmapSetKeys({cid}/{}, {kvs:?})", brief_name(oid))
            }
            Op::OmapSetHeader { cid, oid, header } => {
                write!(
                    f,
                    "OmapSetHeader({cid}/{}, {:?})",
                    brief_name(oid),
                    Brief(header)
                )
            }
            other => {
                let text = format!("{other:?}");
                if text.len() > 200 {
                    write!(
                        f,
                        "{}…",
                        &text[..text.char_indices().nth(200).map_or(text.len(), |(i, _)| i)]
                    )
                } else {
                    f.write_str(&text)
                }
            }
        }
    }
}

impl fmt::Debug for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Submit(t) => f.debug_list().entries(t.ops.iter().map(BriefOp)).finish(),
            Step::Read { cid, oid, off, len } => {
                write!(f, "read({cid}/{}, {off}, {len})", brief_name(oid))
            }
            Step::Readv { cid, oid, extents } => {
                write!(f, "readv({cid}/{}, {extents:?})", brief_name(oid))
            }
            Step::GetAttr { cid, oid, name } => write!(
                f,
                "getattr({cid}/{}, {})",
                brief_name(oid),
                brief_name(name)
            ),
            Step::OmapGetValues { cid, oid, keys } => {
                let keys: Vec<_> = keys.iter().map(|k| Brief(k)).collect();
                write!(f, "omap_get_values({cid}/{}, {keys:?})", brief_name(oid))
            }
            Step::OmapIterate {
                cid,
                oid,
                start_after,
                limit,
            } => {
                write!(
                    f,
                    "omap_iterate({cid}/{}, {start_after:?}, {limit})",
                    brief_name(oid)
                )
            }
            Step::ListObjects {
                cid,
                start_after,
                limit,
            } => write!(f, "list_objects({cid}, {start_after:?}, {limit})"),
        }
    }
}

/// Collections 1.0 and 1.1 exist at the start of every run; 1.2 and 2.0 do not, so ops on
/// them mostly fail until a transaction creates them.
const INITIAL: [CollectionId; 2] = [PgId { pool: 1, seed: 0 }, PgId { pool: 1, seed: 1 }];

fn arb_cid() -> impl Strategy<Value = CollectionId> {
    prop_oneof![
        16 => Just(INITIAL[0]),
        8 => Just(INITIAL[1]),
        2 => Just(PgId { pool: 1, seed: 2 }),
        1 => Just(PgId { pool: 2, seed: 0 }),
    ]
}

fn arb_oid() -> impl Strategy<Value = String> {
    prop_oneof![
        120 => prop::sample::select(&["a", "b", "c"][..]).prop_map(String::from),
        1 => Just(String::new()),
        1 => Just("o".repeat(OBJECT_NAME_LEN_MAX + 1)),
    ]
}

/// Mostly small offsets, some page-aligned, a few at or past the limits.
fn arb_off() -> impl Strategy<Value = u64> {
    prop_oneof![
        40 => 0u64..64 * 1024,
        20 => (0u64..16).prop_map(|p| p * 4096),
        1 => Just(u64::MAX - 100),
        1 => Just(OBJECT_SIZE_MAX),
    ]
}

fn arb_len() -> impl Strategy<Value = u64> {
    prop_oneof![40 => 0u64..12 * 1024, 15 => (1u64..4).prop_map(|p| p * 4096), 3 => Just(0u64), 1 => Just(u64::MAX)]
}

/// Payload of `len` bytes: a cheap deterministic pattern rather than `len` random bytes,
/// so generation and shrinking stay fast. Sometimes all zeros, like a hole.
fn arb_data() -> impl Strategy<Value = Bytes> {
    let len =
        prop_oneof![8 => 0usize..10_000, 3 => (1usize..4).prop_map(|p| p * 4096), 1 => 0usize..8];
    (len, any::<u8>(), prop::bool::weighted(0.1)).prop_map(|(len, seed, zeros)| {
        if zeros {
            Bytes::from(vec![0; len])
        } else {
            (0..len)
                .map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed))
                .collect()
        }
    })
}

fn arb_attr_name() -> impl Strategy<Value = String> {
    prop_oneof![
        80 => prop::sample::select(&["_", "snapset", "user.a"][..]).prop_map(String::from),
        1 => Just(String::new()),
        1 => Just("x".repeat(ATTR_NAME_LEN_MAX + 1)),
    ]
}

fn arb_value() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        60 => (0usize..40, any::<u8>()).prop_map(|(len, b)| Bytes::from(vec![b; len])),
        // A small set, so compares that expect a value sometimes find it.
        20 => arb_small_value(),
        1 => Just(Bytes::from(vec![7; VALUE_LEN_MAX + 1])),
    ]
}

fn arb_small_value() -> impl Strategy<Value = Bytes> {
    const SMALL: [&[u8]; 3] = [b"", b"a", b"b"];
    prop::sample::select(&SMALL[..]).prop_map(Bytes::from_static)
}

fn arb_expect() -> impl Strategy<Value = Expect> {
    prop_oneof![
        2 => Just(Expect::Absent),
        3 => (arb_attr_name(), prop::option::of(arb_small_value()))
            .prop_map(|(name, value)| Expect::Xattr { name, value }),
        3 => (arb_key(), prop::option::of(arb_small_value()))
            .prop_map(|(key, value)| Expect::OmapKey { key, value }),
    ]
}

fn arb_compare() -> impl Strategy<Value = Op> {
    (arb_cid(), arb_oid(), arb_expect()).prop_map(|(cid, oid, expect)| Op::Compare {
        cid,
        oid,
        expect,
    })
}

fn arb_key() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        (0u8..6).prop_map(|i| Bytes::from(format!("k{i}"))),
        Just(Bytes::new())
    ]
}

fn arb_truncate_size() -> impl Strategy<Value = u64> {
    prop_oneof![30 => 0u64..80 * 1024, 10 => (0u64..20).prop_map(|p| p * 4096), 1 => Just(OBJECT_SIZE_MAX + 1)]
}

/// One op over the small name space; mostly valid.
pub fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Mostly where compares belong (see `arb_transaction`), sometimes misplaced here.
        1 => arb_compare(),
        2 => prop_oneof![3 => Just(PgId { pool: 1, seed: 2 }), 1 => Just(PgId { pool: 2, seed: 0 }), 1 => arb_cid()]
            .prop_map(|cid| Op::CreateCollection { cid }),
        1 => arb_cid().prop_map(|cid| Op::RemoveCollection { cid }),
        2 => (arb_cid(), arb_oid()).prop_map(|(cid, oid)| Op::Touch { cid, oid }),
        12 => (arb_cid(), arb_oid(), arb_off(), arb_data()).prop_map(|(cid, oid, off, data)| Op::Write { cid, oid, off, data }),
        3 => (arb_cid(), arb_oid(), arb_off(), arb_len()).prop_map(|(cid, oid, off, len)| Op::Zero { cid, oid, off, len }),
        3 => (arb_cid(), arb_oid(), arb_truncate_size()).prop_map(|(cid, oid, size)| Op::Truncate { cid, oid, size }),
        2 => (arb_cid(), arb_oid()).prop_map(|(cid, oid)| Op::Remove { cid, oid }),
        3 => (arb_cid(), arb_oid(), prop::collection::vec((arb_attr_name(), arb_value()), 0..3))
            .prop_map(|(cid, oid, attrs)| Op::SetAttrs { cid, oid, attrs }),
        2 => (arb_cid(), arb_oid(), arb_attr_name()).prop_map(|(cid, oid, name)| Op::RmAttr { cid, oid, name }),
        3 => (arb_cid(), arb_oid(), prop::collection::vec((arb_key(), arb_value()), 0..4))
            .prop_map(|(cid, oid, kvs)| Op::OmapSetKeys { cid, oid, kvs }),
        2 => (arb_cid(), arb_oid(), prop::collection::vec(arb_key(), 0..3))
            .prop_map(|(cid, oid, keys)| Op::OmapRmKeys { cid, oid, keys }),
        1 => (arb_cid(), arb_oid()).prop_map(|(cid, oid)| Op::OmapClear { cid, oid }),
        2 => (arb_cid(), arb_oid(), arb_value()).prop_map(|(cid, oid, header)| Op::OmapSetHeader { cid, oid, header }),
        3 => (arb_cid(), arb_oid(), arb_oid()).prop_map(|(cid, src, dst)| Op::Clone { cid, src, dst }),
        4 => (arb_cid(), arb_oid(), arb_oid(), arb_off(), arb_len(), arb_off())
            .prop_map(|(cid, src, dst, src_off, len, dst_off)| Op::CloneRange { cid, src, dst, src_off, len, dst_off }),
    ]
}

/// A transaction of one to four ops, led by compares one time in four.
pub fn arb_transaction() -> impl Strategy<Value = Transaction> {
    let guards = prop_oneof![3 => Just(vec![]), 1 => prop::collection::vec(arb_compare(), 1..=2)];
    (guards, prop::collection::vec(arb_op(), 1..=4)).prop_map(|(mut ops, rest)| {
        ops.extend(rest);
        Transaction { ops }
    })
}

/// A transaction (most of the time) or a read.
pub fn arb_step() -> impl Strategy<Value = Step> {
    let start_after = prop::option::of(arb_key());
    let limit = prop_oneof![1usize..5, Just(0usize), Just(100usize)];
    prop_oneof![
        24 => arb_transaction().prop_map(Step::Submit),
        2 => (arb_cid(), arb_oid(), arb_off(), arb_len()).prop_map(|(cid, oid, off, len)| Step::Read { cid, oid, off, len }),
        1 => (arb_cid(), arb_oid(), prop::collection::vec((arb_off(), arb_len()), 0..4))
            .prop_map(|(cid, oid, extents)| Step::Readv { cid, oid, extents }),
        1 => (arb_cid(), arb_oid(), arb_attr_name()).prop_map(|(cid, oid, name)| Step::GetAttr { cid, oid, name }),
        1 => (arb_cid(), arb_oid(), prop::collection::vec(arb_key(), 0..4))
            .prop_map(|(cid, oid, keys)| Step::OmapGetValues { cid, oid, keys }),
        1 => (arb_cid(), arb_oid(), start_after, limit.clone())
            .prop_map(|(cid, oid, start_after, limit)| Step::OmapIterate { cid, oid, start_after, limit }),
        1 => (arb_cid(), prop::option::of(arb_oid()), limit)
            .prop_map(|(cid, start_after, limit)| Step::ListObjects { cid, start_after, limit }),
    ]
}

fn kinds<T>(r: Result<T, StoreError>) -> Result<T, StoreErrorKind> {
    r.map_err(|e| e.kind)
}

/// Compares two results: values when both succeed, kinds when both fail.
fn same<T: PartialEq + fmt::Debug>(
    what: &str,
    store: Result<T, StoreError>,
    model: Result<T, StoreError>,
) -> Result<(), String> {
    let (s, m) = (kinds(store), kinds(model));
    if s == m {
        Ok(())
    } else {
        let show = |r: &Result<T, StoreErrorKind>| {
            let text = format!("{r:?}");
            if text.len() > 300 {
                format!("{}… ({} chars)", &text[..300], text.len())
            } else {
                text
            }
        };
        Err(format!(
            "{what}: store gave {}, model gave {}",
            show(&s),
            show(&m)
        ))
    }
}

/// Runs `steps` on `store` (which must be empty) and on a fresh model, comparing every result
/// and, after every transaction, the whole observable state. Returns the first divergence.
pub async fn check_steps_against_model<S: ObjectStore>(
    store: &S,
    steps: &[Step],
) -> Result<(), String> {
    let model = ModelStore::new();
    if !store
        .list_collections()
        .await
        .map_err(|e| e.to_string())?
        .is_empty()
    {
        return Err("the store under test is not empty".into());
    }
    let mut setup = Transaction::new();
    for cid in INITIAL {
        setup.create_collection(cid);
    }
    store
        .submit(setup.clone())
        .await
        .map_err(|e| format!("setup: {e}"))?;
    model
        .submit(setup)
        .await
        .map_err(|e| format!("setup: {e}"))?;
    for (i, step) in steps.iter().enumerate() {
        let at = format!("step {i} {step:?}");
        match step {
            Step::Submit(txn) => {
                let judged = if dry_runnable(txn) {
                    Some(kinds(crate::check_applies(store, txn).await))
                } else {
                    None
                };
                let done = store.submit(txn.clone()).await;
                let modelled = model.submit(txn.clone()).await;
                // A dry run foresees what the store's content decides, not a full device.
                let full = matches!(&done, Err(e) if e.kind == StoreErrorKind::NoSpace);
                if let Some(judged) = judged.filter(|_| !full) {
                    let wanted = kinds(modelled.clone());
                    if judged != wanted {
                        return Err(format!(
                            "{at}: a dry run said {judged:?}, the model {wanted:?}"
                        ));
                    }
                }
                same(&at, done, modelled)?;
                if let Some(d) = diff(&dump(store).await, &dump(&model).await) {
                    return Err(format!("{at}: state differs (store vs model): {d}"));
                }
            }
            Step::Read { cid, oid, off, len } => same(
                &at,
                store.read(*cid, oid, *off, *len).await,
                model.read(*cid, oid, *off, *len).await,
            )?,
            Step::Readv { cid, oid, extents } => same(
                &at,
                store.readv(*cid, oid, extents).await,
                model.readv(*cid, oid, extents).await,
            )?,
            Step::GetAttr { cid, oid, name } => same(
                &at,
                store.getattr(*cid, oid, name).await,
                model.getattr(*cid, oid, name).await,
            )?,
            Step::OmapGetValues { cid, oid, keys } => same(
                &at,
                store.omap_get_values(*cid, oid, keys).await,
                model.omap_get_values(*cid, oid, keys).await,
            )?,
            Step::OmapIterate {
                cid,
                oid,
                start_after,
                limit,
            } => same(
                &at,
                store
                    .omap_iterate(*cid, oid, start_after.as_deref(), *limit)
                    .await,
                model
                    .omap_iterate(*cid, oid, start_after.as_deref(), *limit)
                    .await,
            )?,
            Step::ListObjects {
                cid,
                start_after,
                limit,
            } => same(
                &at,
                store
                    .list_objects(*cid, start_after.as_deref(), *limit)
                    .await,
                model
                    .list_objects(*cid, start_after.as_deref(), *limit)
                    .await,
            )?,
        }
    }
    Ok(())
}

/// Whether `check_applies` judges `txn`: no collection ops, no clones.
fn dry_runnable(txn: &Transaction) -> bool {
    !txn.ops.iter().any(|op| {
        matches!(
            op,
            Op::CreateCollection { .. }
                | Op::RemoveCollection { .. }
                | Op::Clone { .. }
                | Op::CloneRange { .. }
        )
    })
}

/// The run's seed: `CARMINE_SEED` if set, else fresh. Printed so a failure can be replayed
/// (test output is shown for failing tests).
pub fn seed_from_env() -> u64 {
    let seed = match std::env::var("CARMINE_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("CARMINE_SEED={s:?} is not a u64")),
        Err(_) => {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
            );
            h.finish()
        }
    };
    eprintln!("CARMINE_SEED={seed}");
    seed
}

fn rng_for(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(
            &(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes(),
        );
    }
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// Runs `cases` random step sequences of up to `max_steps` through `check` (typically
/// `check_steps_against_model` on a fresh store under a `block_on`). On failure, shrinks to a
/// minimal sequence and panics with it and the seed. `CARMINE_CASES` overrides `cases`.
pub fn run_model_check(
    cases: u32,
    max_steps: usize,
    check: impl Fn(&[Step]) -> Result<(), String>,
) {
    let seed = seed_from_env();
    let cases = std::env::var("CARMINE_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, rng_for(seed));
    let strategy = prop::collection::vec(arb_step(), 1..=max_steps);
    match runner.run(&strategy, |steps| {
        check(&steps).map_err(TestCaseError::fail)
    }) {
        Ok(()) => {}
        Err(TestError::Fail(reason, steps)) => {
            panic!("store diverged from the model (CARMINE_SEED={seed}): {reason}\nminimal steps: {steps:#?}")
        }
        Err(TestError::Abort(reason)) => {
            panic!("model check aborted (CARMINE_SEED={seed}): {reason}")
        }
    }
}

/// Generates `steps` random steps from `seed` and checks them on `store` (which must be
/// empty) against the model, without shrinking: for long single runs, e.g. soak tests of a
/// backend instance built by hand. Panics with the seed on divergence.
pub async fn check_random_transactions_against_model<S: ObjectStore>(
    store: &S,
    seed: u64,
    steps: usize,
) {
    let mut runner = TestRunner::new_with_rng(Config::default(), rng_for(seed));
    let strategy = prop::collection::vec(arb_step(), steps);
    let steps = strategy
        .new_tree(&mut runner)
        .expect("step strategy never rejects")
        .current();
    if let Err(e) = check_steps_against_model(store, &steps).await {
        panic!("store diverged from the model (seed {seed}): {e}");
    }
}
