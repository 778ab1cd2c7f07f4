//! How a member's copy of a replicated PG lies in its store shard: the objects in the PG's
//! collection as always, and the PG's durable protocol state — log, object versions, last
//! active epoch — in the omap of one object per PG in the reactor's own collection
//! (`pg.<pool>.<seed>`). Every change to it goes in the same transaction as the write it
//! describes, so a log entry exists exactly when its write does (decision 0009, point 3).
//!
//! Omap keys: `m` → record version (u8: 3; 1 and 2 are read too), tail, head (version: epoch
//! u32, counter u64, big-endian) and les (u32); `l` + version → the encoded entry; `o` + object name
//! → the version of the object the store holds; `n` + object name → the version the PG's
//! history names for an object the store does not hold at that version yet (it is being
//! recovered; the store may hold an older version, under `o`, or none); `r` → the newest
//! (epoch, run) in which the member went active as primary (u8 record version 1, epoch u32,
//! run u32, big-endian), written with every history (decision 0009, "versions name one
//! write"). A store written before runs has none: its copy is taken to have gone active as
//! primary in run 0 of its last active epoch, as late as it can have (every counter such a
//! build wrote is one of run 0).
//!
//! A write adds its entry and its object's version in one omap change, and nothing else: the
//! `m` record is rewritten only when les moves or a batch of [`TRIM_BATCH`] entries has
//! fallen off the member's tail (they are removed then, and the stored tail moves). So the
//! head is the newer of `m`'s and the last entry's (record version 3; before, `m` was
//! rewritten with every write), and the stored log may hold up to a batch of entries the
//! member had trimmed (true history, trimmed again when loaded).

use crate::fence::META_COLLECTION;
use bytes::{BufMut, Bytes, BytesMut};
use carmine_pg::wire::{decode_entry, encode_entry};
use carmine_pg::{Entry, PgLog, Version};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::{Decoder, Encoder, PgId};
use std::collections::BTreeMap;

const META_PREFIX: &str = "pg.";
const KEY_META: &[u8] = b"m";
const KEY_LOG: u8 = b'l';
const KEY_OBJECT: u8 = b'o';
const KEY_MISSING: u8 = b'n';
const KEY_RUN: &[u8] = b"r";
const RUN_RECORD_VERSION: u8 = 1;
const META_RECORD_VERSION: u8 = 3;
/// Records of version 1 have no missing objects; they are read as they are. Records of
/// versions 1 and 2 have the head itself (a later entry never exists with them).
const META_RECORD_VERSIONS_READ: [u8; 3] = [1, 2, 3];
/// Log entries that fall off the member's tail are removed from the store this many at a
/// time, with the `m` record rewritten then: between, a write costs one omap change.
pub(crate) const TRIM_BATCH: usize = 32;
/// Omap entries read per call when loading a PG's state.
const LOAD_PAGE: usize = 1024;

pub(crate) fn meta_oid(pg: PgId) -> String {
    format!("{META_PREFIX}{}.{}", pg.pool, pg.seed)
}

fn parse_meta_oid(oid: &str) -> Option<PgId> {
    let (pool, seed) = oid.strip_prefix(META_PREFIX)?.split_once('.')?;
    Some(PgId {
        pool: pool.parse().ok()?,
        seed: seed.parse().ok()?,
    })
}

fn version_bytes(v: Version) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&v.epoch.to_be_bytes());
    b[4..].copy_from_slice(&v.v.to_be_bytes());
    b
}

/// A stored version; `None` if it is not 12 bytes or its counter is out of range (as on the
/// wire, `carmine_pg::wire::VERSION_COUNTER_MAX`).
fn version_from(b: &[u8]) -> Option<Version> {
    let b: &[u8; 12] = b.try_into().ok()?;
    let counter = u64::from_be_bytes(b[4..].try_into().ok()?);
    (counter <= carmine_pg::wire::VERSION_COUNTER_MAX).then(|| {
        Version::new(
            u32::from_be_bytes(b[..4].try_into().expect("4 bytes")),
            counter,
        )
    })
}

pub(crate) fn log_key(v: Version) -> Bytes {
    let mut k = BytesMut::with_capacity(13);
    k.put_u8(KEY_LOG);
    k.put_slice(&version_bytes(v));
    k.freeze()
}

pub(crate) fn object_key(oid: &str) -> Bytes {
    let mut k = BytesMut::with_capacity(1 + oid.len());
    k.put_u8(KEY_OBJECT);
    k.put_slice(oid.as_bytes());
    k.freeze()
}

pub(crate) fn missing_key(oid: &str) -> Bytes {
    let mut k = BytesMut::with_capacity(1 + oid.len());
    k.put_u8(KEY_MISSING);
    k.put_slice(oid.as_bytes());
    k.freeze()
}

pub(crate) fn meta_value(tail: Version, head: Version, les: u32) -> Bytes {
    let mut b = BytesMut::with_capacity(29);
    b.put_u8(META_RECORD_VERSION);
    b.put_slice(&version_bytes(tail));
    b.put_slice(&version_bytes(head));
    b.put_u32(les);
    b.freeze()
}

pub(crate) fn entry_value(e: &Entry) -> Bytes {
    let mut b = BytesMut::new();
    encode_entry(&mut Encoder::new(&mut b), e);
    b.freeze()
}

pub(crate) fn version_value(v: Version) -> Bytes {
    Bytes::copy_from_slice(&version_bytes(v))
}

/// Adds to `txn` what makes `entry` durable in the PG's state (the head it moves is read from
/// the entry itself). `lacking`: the store does not hold the object (it is being recovered),
/// so the write's data is not applied and the object stays missing, at the entry's version.
pub(crate) fn add_entry(txn: &mut Transaction, pg: PgId, entry: &Entry, lacking: bool) {
    let meta = meta_oid(pg);
    let mut kvs = vec![(log_key(entry.version), entry_value(entry))];
    match entry.kind {
        carmine_pg::OpKind::Modify if lacking => {
            kvs.push((missing_key(&entry.oid), version_value(entry.version)));
            txn.omap_set(META_COLLECTION, &meta, kvs);
        }
        carmine_pg::OpKind::Modify => {
            kvs.push((object_key(&entry.oid), version_value(entry.version)));
            txn.omap_set(META_COLLECTION, &meta, kvs);
        }
        carmine_pg::OpKind::Delete => {
            txn.omap_set(META_COLLECTION, &meta, kvs);
            txn.omap_rm(
                META_COLLECTION,
                &meta,
                vec![object_key(&entry.oid), missing_key(&entry.oid)],
            );
        }
    }
}

/// Removes the log entries of `trimmed` (they fell off the tail [`set_meta`] records in the
/// same transaction).
pub(crate) fn trim(txn: &mut Transaction, pg: PgId, trimmed: Vec<Bytes>) {
    if !trimmed.is_empty() {
        txn.omap_rm(META_COLLECTION, &meta_oid(pg), trimmed);
    }
}

/// The store now holds `oid` at the version its history names (a recovery copied it here):
/// it is no longer missing.
pub(crate) fn set_recovered(txn: &mut Transaction, pg: PgId, oid: &str, v: Version) {
    let meta = meta_oid(pg);
    txn.omap_set(
        META_COLLECTION,
        &meta,
        vec![(object_key(oid), version_value(v))],
    );
    txn.omap_rm(META_COLLECTION, &meta, vec![missing_key(oid)]);
}

/// Sets (or, with `None`, removes) the version the PG's state gives object `oid` (a repair
/// that rewrote the object's copy here).
pub(crate) fn set_object_version(txn: &mut Transaction, pg: PgId, oid: &str, v: Option<Version>) {
    let meta = meta_oid(pg);
    match v {
        Some(v) => txn.omap_set(
            META_COLLECTION,
            &meta,
            vec![(object_key(oid), version_value(v))],
        ),
        None => txn.omap_rm(META_COLLECTION, &meta, vec![object_key(oid)]),
    };
}

/// The log's tail and the last active epoch (and the head, as the entries of `txn` leave it).
pub(crate) fn set_meta(txn: &mut Transaction, pg: PgId, tail: Version, head: Version, les: u32) {
    txn.omap_set(
        META_COLLECTION,
        &meta_oid(pg),
        vec![(Bytes::from_static(KEY_META), meta_value(tail, head, les))],
    );
}

/// Replaces the PG's whole state (an activation that took another history): `held`, the
/// versions the store holds, and `missing`, those the history names that it does not hold.
pub(crate) fn replace_all(
    txn: &mut Transaction,
    pg: PgId,
    log: &PgLog,
    held: &BTreeMap<String, Version>,
    missing: &BTreeMap<String, Version>,
    marks: Marks,
) {
    let meta = meta_oid(pg);
    txn.touch(META_COLLECTION, &meta)
        .omap_clear(META_COLLECTION, &meta);
    let mut kvs: Vec<(Bytes, Bytes)> = log
        .entries()
        .map(|e| (log_key(e.version), entry_value(e)))
        .collect();
    kvs.extend(held.iter().map(|(o, v)| (object_key(o), version_value(*v))));
    kvs.extend(
        missing
            .iter()
            .map(|(o, v)| (missing_key(o), version_value(*v))),
    );
    kvs.push((
        Bytes::from_static(KEY_META),
        meta_value(log.tail(), log.head(), marks.les),
    ));
    kvs.push((Bytes::from_static(KEY_RUN), run_value(marks.primary_run)));
    txn.omap_set(META_COLLECTION, &meta, kvs);
}

/// What a history stores besides the log and objects: the member's last active epoch, and
/// the (epoch, primary's run) of the newest activation it took (see `Member::primary_run`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Marks {
    pub les: u32,
    pub primary_run: (u32, u32),
}

fn run_value((epoch, run): (u32, u32)) -> Bytes {
    let mut b = BytesMut::with_capacity(9);
    b.put_u8(RUN_RECORD_VERSION);
    b.put_u32(epoch);
    b.put_u32(run);
    b.freeze()
}

fn run_from(v: &[u8]) -> Option<(u32, u32)> {
    match v {
        [RUN_RECORD_VERSION, rest @ ..] if rest.len() == 8 => Some((
            u32::from_be_bytes(rest[..4].try_into().ok()?),
            u32::from_be_bytes(rest[4..].try_into().ok()?),
        )),
        _ => None,
    }
}

/// A PG's durable state as loaded from the store.
pub(crate) struct Loaded {
    pub pg: PgId,
    pub log: PgLog,
    /// The versions the store holds.
    pub held: BTreeMap<String, Version>,
    /// The versions the history names where the store does not hold them.
    pub missing: BTreeMap<String, Version>,
    pub les: u32,
    /// The (epoch, primary's run) of the newest activation this copy took.
    pub primary_run: (u32, u32),
    /// Every log entry the store holds, oldest first: `log`'s, and up to a trim batch of
    /// older ones, removed with the next batch.
    pub stored_log: Vec<Version>,
}

impl Loaded {
    /// The member of OSD `osd` this state restores, with what the store holds and the log
    /// entries it keeps.
    pub fn into_member(
        self,
        osd: u32,
    ) -> (carmine_pg::Member, BTreeMap<String, Version>, Vec<Version>) {
        let objects = self.objects();
        let m = carmine_pg::Member::restore(
            osd,
            self.log,
            objects,
            self.missing,
            self.les,
            self.primary_run,
        );
        (m, self.held, self.stored_log)
    }

    /// Each object's version as the history names it.
    pub fn objects(&self) -> BTreeMap<String, Version> {
        let mut o = self.held.clone();
        o.extend(self.missing.iter().map(|(k, v)| (k.clone(), *v)));
        o
    }
}

/// Every replicated PG state this shard holds. A record that does not decode fails the
/// reactor with a clear error: serving a PG whose history is unknown could lose writes.
pub(crate) async fn load_all<S: ObjectStore>(
    store: &S,
    log_max: usize,
) -> Result<Vec<Loaded>, String> {
    let mut out = Vec::new();
    let mut after: Option<String> = Some(META_PREFIX.to_string());
    loop {
        let page = store
            .list_objects(META_COLLECTION, after.as_deref(), LOAD_PAGE)
            .await
            .map_err(|e| format!("listing PG states: {e}"))?;
        for oid in &page.items {
            if !oid.starts_with(META_PREFIX) {
                return Ok(out);
            }
            let Some(pg) = parse_meta_oid(oid) else {
                return Err(format!("PG state object {oid:?} has no PG in its name"));
            };
            out.push(load_one(store, pg, log_max).await?);
        }
        match page.next {
            Some(n) => after = Some(n),
            None => return Ok(out),
        }
    }
}

/// The state of `pg` this shard holds, if any (a copy whose first history never reached the
/// store has none).
pub(crate) async fn load_pg<S: ObjectStore>(
    store: &S,
    pg: PgId,
    log_max: usize,
) -> Result<Option<Loaded>, String> {
    match store.stat(META_COLLECTION, &meta_oid(pg)).await {
        Ok(_) => load_one(store, pg, log_max).await.map(Some),
        Err(e) if e.kind == carmine_store::StoreErrorKind::ObjectNotFound => Ok(None),
        Err(e) => Err(format!("PG {}.{} state: {e}", pg.pool, pg.seed)),
    }
}

async fn load_one<S: ObjectStore>(store: &S, pg: PgId, log_max: usize) -> Result<Loaded, String> {
    let oid = meta_oid(pg);
    let mut pairs = Vec::new();
    let mut after: Option<Bytes> = None;
    loop {
        let page = store
            .omap_iterate(META_COLLECTION, &oid, after.as_deref(), LOAD_PAGE)
            .await
            .map_err(|e| format!("PG {}.{} state: reading it: {e}", pg.pool, pg.seed))?;
        pairs.extend(page.items);
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    decode_state(pg, &pairs, log_max)
}

/// Decodes the omap pairs of a PG's state object (in key order) as an OSD does when it
/// loads its PGs, and checks that the log reads back from what it decoded: the log's tail
/// and head, or why the state is refused. For the fuzz target `pg_state`.
pub fn check_pg_state(pairs: &[(Bytes, Bytes)]) -> Result<(Version, Version), String> {
    let l = decode_state(
        PgId { pool: 0, seed: 0 },
        pairs,
        carmine_pg::LOG_ENTRIES_DEFAULT,
    )?;
    assert!(
        l.log.tail() <= l.log.head(),
        "a loaded log ends before it starts"
    );
    assert!(
        l.missing.iter().all(|(o, v)| l.held.get(o) != Some(v)),
        "an object both held and missing at one version"
    );
    Ok((l.log.tail(), l.log.head()))
}

/// A PG's durable state from the omap pairs of its state object, in key order. Anything
/// that does not decode, or contradicts the rest, is a clear error naming the PG.
pub(crate) fn decode_state(
    pg: PgId,
    pairs: &[(Bytes, Bytes)],
    log_max: usize,
) -> Result<Loaded, String> {
    let bad = |what: &str| format!("PG {}.{} state: {what}", pg.pool, pg.seed);
    let mut entries = Vec::new();
    let mut held = BTreeMap::new();
    let mut missing = BTreeMap::new();
    let mut meta = None;
    let mut primary_run = None;
    for (k, v) in pairs {
        match k.first() {
            Some(&KEY_LOG) => {
                let e = decode_entry(&mut Decoder::new(v.clone()))
                    .map_err(|e| bad(&format!("a log entry: {e}")))?;
                if Some(e.version) != version_from(&k[1..]) {
                    return Err(bad("a log entry stored under another version"));
                }
                entries.push(e);
            }
            Some(&kind @ (KEY_OBJECT | KEY_MISSING)) => {
                let name = std::str::from_utf8(&k[1..])
                    .map_err(|_| bad("an object name that is not UTF-8"))?;
                let v = version_from(v).ok_or_else(|| bad("an object version"))?;
                match kind {
                    KEY_OBJECT => held.insert(name.to_string(), v),
                    _ => missing.insert(name.to_string(), v),
                };
            }
            _ if &k[..] == KEY_META => meta = Some(v.clone()),
            _ if &k[..] == KEY_RUN => {
                primary_run = Some(run_from(v).ok_or_else(|| {
                    bad(&format!(
                        "a primary run record of {} bytes, version {} (this build reads \
                         version {RUN_RECORD_VERSION}, 9 bytes)",
                        v.len(),
                        v.first().copied().unwrap_or(0)
                    ))
                })?);
            }
            _ => return Err(bad("an unknown key")),
        }
    }
    let meta = meta.ok_or_else(|| bad("no tail, head and last active epoch"))?;
    if meta.len() != 29 || !META_RECORD_VERSIONS_READ.contains(&meta[0]) {
        return Err(bad(&format!(
            "an unknown record version {} (this build reads {META_RECORD_VERSIONS_READ:?})",
            meta.first().copied().unwrap_or(0)
        )));
    }
    if meta[0] == 1 && !missing.is_empty() {
        return Err(bad("missing objects in a record of version 1"));
    }
    let tail = version_from(&meta[1..13]).ok_or_else(|| bad("a tail out of range"))?;
    // Entries written since the record was: the last one is the head.
    let head = version_from(&meta[13..25])
        .ok_or_else(|| bad("a head out of range"))?
        .max(entries.last().map_or(Version::ZERO, |e: &Entry| e.version));
    let les = u32::from_be_bytes(meta[25..29].try_into().expect("4 bytes"));
    let stored_log = entries.iter().map(|e| e.version).collect();
    let log = PgLog::from_parts(log_max, tail, head, entries).map_err(bad)?;
    // A missing object the store holds at that very version after all (a crash between
    // the two records cannot leave this, but a repair may): it is not missing.
    missing.retain(|o, v| held.get(o) != Some(v));
    Ok(Loaded {
        pg,
        log,
        held,
        missing,
        les,
        // A store written before runs: its copy was primary, or took an activation, in run 0
        // of its last active epoch at the latest (all runs were 0 then).
        primary_run: primary_run.unwrap_or((les, 0)),
        stored_log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use carmine_pg::{OpKind, ReqId};
    use carmine_store::{MemStore, MemStoreConfig};

    const PG: PgId = PgId { pool: 1, seed: 2 };

    fn marks(les: u32) -> Marks {
        Marks {
            les,
            primary_run: (0, 0),
        }
    }

    /// A store with the reactor's own collection, and a transaction that starts with it.
    fn store() -> (MemStore, Transaction) {
        let mut t = Transaction::new();
        t.create_collection(META_COLLECTION);
        (MemStore::new(MemStoreConfig::default()), t)
    }

    fn entry(v: u64, oid: &str) -> Entry {
        Entry {
            version: Version::new(2, v),
            oid: oid.into(),
            kind: OpKind::Modify,
            reqid: Some(ReqId { client: 1, tid: v }),
        }
    }

    /// The missing set survives a restart: a copy that took a history and crashed before
    /// fetching its objects still knows which it lacks (and at which version), and never
    /// takes the stale versions its store holds for the ones named.
    #[test]
    fn a_copys_missing_objects_are_stored_and_loaded_back_with_what_it_holds() {
        carmine_reactor::block_on(async {
            let (store, t) = store();
            let pg = PG;
            store.submit(t).await.unwrap();
            let mut log = PgLog::new(16);
            for v in 1..=3 {
                log.append(entry(v, &format!("o{v}"))).unwrap();
            }
            // Holds o1 at its version and o2 at an older one; lacks o2 (at 2'2) and o3.
            let held: BTreeMap<String, Version> = [
                ("o1".to_string(), Version::new(2, 1)),
                ("o2".to_string(), Version::new(1, 9)),
            ]
            .into();
            let missing: BTreeMap<String, Version> = [
                ("o2".to_string(), Version::new(2, 2)),
                ("o3".to_string(), Version::new(2, 3)),
            ]
            .into();
            let mut t = Transaction::new();
            let marks = Marks {
                les: 5,
                primary_run: (5, 3),
            };
            replace_all(&mut t, pg, &log, &held, &missing, marks);
            store.submit(t).await.unwrap();
            let loaded = load_all(&store, 16).await.unwrap();
            let [l] = &loaded[..] else { panic!("one PG") };
            assert_eq!(l.held, held);
            assert_eq!(l.missing, missing);
            assert_eq!(l.les, 5);
            assert_eq!(l.primary_run, (5, 3));
            assert_eq!(l.log.head(), Version::new(2, 3));
            assert_eq!(l.objects()["o2"], Version::new(2, 2), "named, not held");

            // A write to o3 while it is still lacked keeps it lacked, at the new version;
            // recovering o2 makes it held.
            let mut t = Transaction::new();
            let e = entry(4, "o3");
            add_entry(&mut t, pg, &e, true);
            set_recovered(&mut t, pg, "o2", Version::new(2, 2));
            store.submit(t).await.unwrap();
            let loaded = load_all(&store, 16).await.unwrap();
            let l = &loaded[0];
            assert_eq!(l.held.get("o2"), Some(&Version::new(2, 2)));
            assert!(!l.missing.contains_key("o2"));
            assert_eq!(l.missing.get("o3"), Some(&Version::new(2, 4)));
            assert!(!l.held.contains_key("o3"));
        });
    }

    /// A record of version 1 (before missing sets) still loads; one that names missing
    /// objects cannot be of version 1 and is refused rather than read half.
    #[test]
    fn a_version_1_record_loads_and_one_naming_missing_objects_is_refused() {
        carmine_reactor::block_on(async {
            for lacks in [false, true] {
                let (store, t) = store();
                store.submit(t).await.unwrap();
                let mut log = PgLog::new(16);
                log.append(entry(1, "o1")).unwrap();
                let held: BTreeMap<String, Version> =
                    [("o1".to_string(), Version::new(2, 1))].into();
                let missing: BTreeMap<String, Version> = if lacks {
                    [("o2".to_string(), Version::new(2, 2))].into()
                } else {
                    BTreeMap::new()
                };
                let mut t = Transaction::new();
                replace_all(&mut t, PG, &log, &held, &missing, marks(4));
                let mut meta = meta_value(log.tail(), log.head(), 4).to_vec();
                meta[0] = 1;
                t.omap_set(
                    META_COLLECTION,
                    &meta_oid(PG),
                    vec![(Bytes::from_static(KEY_META), Bytes::from(meta))],
                );
                store.submit(t).await.unwrap();
                match load_all(&store, 16).await {
                    Ok(loaded) => {
                        assert!(!lacks, "a version 1 record with missing objects was read");
                        assert_eq!(loaded[0].held, held);
                        assert!(loaded[0].missing.is_empty());
                        assert_eq!(loaded[0].les, 4);
                    }
                    Err(e) => {
                        assert!(lacks, "a plain version 1 record was refused: {e}");
                        assert!(e.contains("record of version 1"), "{e}");
                    }
                }
            }
        });
    }

    /// Writes add their entries alone; the record with the tail is rewritten a batch of trims
    /// later. What loads is the log as the member had it: the head is the last entry's, the
    /// entries the member had trimmed but the store still holds are cut to its bound (and
    /// listed, so the next batch removes them).
    #[test]
    fn entries_written_without_the_record_load_with_their_head_and_the_bound() {
        carmine_reactor::block_on(async {
            let (store, t) = store();
            store.submit(t).await.unwrap();
            let log = PgLog::new(4);
            let mut t = Transaction::new();
            replace_all(
                &mut t,
                PG,
                &log,
                &BTreeMap::new(),
                &BTreeMap::new(),
                marks(7),
            );
            store.submit(t).await.unwrap();
            for v in 1..=10 {
                let mut t = Transaction::new();
                add_entry(&mut t, PG, &entry(v, &format!("o{}", v % 3)), false);
                store.submit(t).await.unwrap();
            }
            let loaded = load_all(&store, 4).await.unwrap();
            let l = &loaded[0];
            assert_eq!(l.log.head(), Version::new(2, 10));
            assert_eq!(l.log.tail(), Version::new(2, 6), "cut to the bound of 4");
            let kept: Vec<Version> = l.log.entries().map(|e| e.version).collect();
            assert_eq!(
                kept,
                (7..=10).map(|v| Version::new(2, v)).collect::<Vec<_>>()
            );
            assert_eq!(l.stored_log.len(), 10, "every stored entry listed");
            assert_eq!(l.held.get("o1"), Some(&Version::new(2, 10)));
            assert_eq!(l.held.get("o0"), Some(&Version::new(2, 9)));
            assert_eq!(l.les, 7);

            // The batch trim: entries up to the tail go, the record says where it is.
            let mut t = Transaction::new();
            trim(
                &mut t,
                PG,
                (1..=6).map(|v| log_key(Version::new(2, v))).collect(),
            );
            set_meta(&mut t, PG, Version::new(2, 6), Version::new(2, 10), 8);
            store.submit(t).await.unwrap();
            let loaded = load_all(&store, 4).await.unwrap();
            let l = &loaded[0];
            assert_eq!(l.stored_log.len(), 4);
            assert_eq!(l.log.tail(), Version::new(2, 6));
            assert_eq!(l.log.head(), Version::new(2, 10));
            assert_eq!(l.les, 8);
        });
    }

    #[test]
    fn a_record_of_a_later_format_is_refused_with_its_version() {
        carmine_reactor::block_on(async {
            let (store, mut t) = store();
            let pg = PG;
            let mut meta = meta_value(Version::ZERO, Version::ZERO, 0).to_vec();
            meta[0] = 9;
            t.touch(META_COLLECTION, &meta_oid(pg)).omap_set(
                META_COLLECTION,
                &meta_oid(pg),
                vec![(Bytes::from_static(KEY_META), Bytes::from(meta))],
            );
            store.submit(t).await.unwrap();
            let err = load_all(&store, 16).await.err().expect("refused");
            assert!(err.contains("unknown record version 9"), "{err}");
        });
    }

    /// A store written before runs has no run record: it loads as run 0 of the last active
    /// epoch (every counter such a build wrote is of run 0). A run record of another version
    /// is refused, not read as none: a primary that took it for none could reuse a version.
    #[test]
    fn a_missing_run_record_loads_as_none_and_a_foreign_one_is_refused() {
        carmine_reactor::block_on(async {
            let (store, mut t) = store();
            let meta = meta_value(Version::ZERO, Version::new(3, 4), 3);
            t.touch(META_COLLECTION, &meta_oid(PG)).omap_set(
                META_COLLECTION,
                &meta_oid(PG),
                vec![(Bytes::from_static(KEY_META), meta)],
            );
            store.submit(t).await.unwrap();
            let loaded = load_all(&store, 16).await.unwrap();
            assert_eq!((loaded[0].les, loaded[0].primary_run), (3, (3, 0)));

            let mut t = Transaction::new();
            let mut run = run_value((3, 2)).to_vec();
            run[0] = 2;
            t.omap_set(
                META_COLLECTION,
                &meta_oid(PG),
                vec![(Bytes::from_static(KEY_RUN), Bytes::from(run))],
            );
            store.submit(t).await.unwrap();
            let err = load_all(&store, 16).await.err().expect("refused");
            assert!(
                err.contains("primary run record of 9 bytes, version 2"),
                "{err}"
            );
        });
    }

    /// Counters are bounded on disk as on the wire: one past the bound is refused with the
    /// record it is in, never loaded (it would make the PG's versions run out).
    #[test]
    fn a_stored_version_past_the_counter_bound_is_refused() {
        let meta = |head: Version| {
            (
                Bytes::from_static(KEY_META),
                meta_value(Version::ZERO, head, 1),
            )
        };
        let at_bound = Version::new(1, carmine_pg::wire::VERSION_COUNTER_MAX);
        assert!(decode_state(PG, &[meta(at_bound)], 16).is_ok());
        let past = Version::new(1, carmine_pg::wire::VERSION_COUNTER_MAX + 1);
        let err = decode_state(PG, &[meta(past)], 16).err().expect("refused");
        assert!(err.contains("a head out of range"), "{err}");
        let held = (object_key("o1"), version_value(past));
        let err = decode_state(PG, &[meta(at_bound), held], 16)
            .err()
            .expect("refused");
        assert!(err.contains("an object version"), "{err}");
    }
}
