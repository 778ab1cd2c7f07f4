//! How a member's copy of a replicated PG lies in its store shard: the objects in the PG's
//! collection as always, and the PG's durable protocol state — log, object versions, last
//! active epoch — in the omap of one object per PG in the reactor's own collection
//! (`pg.<pool>.<seed>`). Every change to it goes in the same transaction as the write it
//! describes, so a log entry exists exactly when its write does (decision 0009, point 3).
//!
//! Omap keys: `m` → tail, head (version: epoch u32, counter u64, big-endian) and les (u32);
//! `l` + version → the encoded entry; `o` + object name → the object's version.

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
const META_RECORD_VERSION: u8 = 1;
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

fn version_from(b: &[u8]) -> Option<Version> {
    let b: &[u8; 12] = b.try_into().ok()?;
    Some(Version::new(
        u32::from_be_bytes(b[..4].try_into().ok()?),
        u64::from_be_bytes(b[4..].try_into().ok()?),
    ))
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

/// Adds to `txn` what makes `entry` durable in the PG's state; `trimmed` are the log keys
/// that fell off the tail (the span itself goes in with [`set_meta`]).
pub(crate) fn add_entry(txn: &mut Transaction, pg: PgId, entry: &Entry, trimmed: Vec<Bytes>) {
    let meta = meta_oid(pg);
    let mut kvs = vec![(log_key(entry.version), entry_value(entry))];
    match entry.kind {
        carmine_pg::OpKind::Modify => {
            kvs.push((object_key(&entry.oid), version_value(entry.version)));
            txn.omap_set(META_COLLECTION, &meta, kvs);
        }
        carmine_pg::OpKind::Delete => {
            txn.omap_set(META_COLLECTION, &meta, kvs);
            txn.omap_rm(META_COLLECTION, &meta, vec![object_key(&entry.oid)]);
        }
    }
    if !trimmed.is_empty() {
        txn.omap_rm(META_COLLECTION, &meta, trimmed);
    }
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

/// The log's span and the last active epoch, as they are after the entries of `txn`.
pub(crate) fn set_meta(txn: &mut Transaction, pg: PgId, tail: Version, head: Version, les: u32) {
    txn.omap_set(
        META_COLLECTION,
        &meta_oid(pg),
        vec![(Bytes::from_static(KEY_META), meta_value(tail, head, les))],
    );
}

/// Replaces the PG's whole state (an activation that took another history).
pub(crate) fn replace_all(
    txn: &mut Transaction,
    pg: PgId,
    log: &PgLog,
    objects: &BTreeMap<String, Version>,
    les: u32,
) {
    let meta = meta_oid(pg);
    txn.touch(META_COLLECTION, &meta)
        .omap_clear(META_COLLECTION, &meta);
    let mut kvs: Vec<(Bytes, Bytes)> = log
        .entries()
        .map(|e| (log_key(e.version), entry_value(e)))
        .collect();
    kvs.extend(
        objects
            .iter()
            .map(|(o, v)| (object_key(o), version_value(*v))),
    );
    kvs.push((
        Bytes::from_static(KEY_META),
        meta_value(log.tail(), log.head(), les),
    ));
    txn.omap_set(META_COLLECTION, &meta, kvs);
}

/// A PG's durable state as loaded from the store.
pub(crate) struct Loaded {
    pub pg: PgId,
    pub log: PgLog,
    pub objects: BTreeMap<String, Version>,
    pub les: u32,
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

async fn load_one<S: ObjectStore>(store: &S, pg: PgId, log_max: usize) -> Result<Loaded, String> {
    let oid = meta_oid(pg);
    let bad = |what: &str| format!("PG {}.{} state: {what}", pg.pool, pg.seed);
    let mut entries = Vec::new();
    let mut objects = BTreeMap::new();
    let mut meta = None;
    let mut after: Option<Bytes> = None;
    loop {
        let page = store
            .omap_iterate(META_COLLECTION, &oid, after.as_deref(), LOAD_PAGE)
            .await
            .map_err(|e| bad(&format!("reading it: {e}")))?;
        for (k, v) in &page.items {
            match k.first() {
                Some(&KEY_LOG) => {
                    let e = decode_entry(&mut Decoder::new(v.clone()))
                        .map_err(|e| bad(&format!("a log entry: {e}")))?;
                    if Some(e.version) != version_from(&k[1..]) {
                        return Err(bad("a log entry stored under another version"));
                    }
                    entries.push(e);
                }
                Some(&KEY_OBJECT) => {
                    let name = std::str::from_utf8(&k[1..])
                        .map_err(|_| bad("an object name that is not UTF-8"))?;
                    let v = version_from(v).ok_or_else(|| bad("an object version"))?;
                    objects.insert(name.to_string(), v);
                }
                _ if &k[..] == KEY_META => meta = Some(v.clone()),
                _ => return Err(bad("an unknown key")),
            }
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let meta = meta.ok_or_else(|| bad("no tail, head and last active epoch"))?;
    if meta.len() != 29 || meta[0] != META_RECORD_VERSION {
        return Err(bad("an unknown record version"));
    }
    let tail = version_from(&meta[1..13]).expect("12 bytes");
    let head = version_from(&meta[13..25]).expect("12 bytes");
    let les = u32::from_be_bytes(meta[25..29].try_into().expect("4 bytes"));
    let log = PgLog::from_parts(log_max, tail, head, entries).map_err(bad)?;
    Ok(Loaded {
        pg,
        log,
        objects,
        les,
    })
}
