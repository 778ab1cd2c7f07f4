//! `MemStore`: the in-memory backend (Crimson's CyanStore), for tests and for running OSDs
//! without a device. Its behaviour is pinned by the conformance suite and the reference model.
//!
//! Atomicity comes from an undo log: each op records just enough to revert itself (the pages
//! it replaced, the attribute values it overwrote, the object it removed) before mutating.
//! If any op fails, the log is replayed backwards and the store is exactly as before; nothing
//! is visible in between because a shard is single threaded and `submit` never suspends.
//!
//! Memory accounting is logical: an object is charged for every page it maps, even a page it
//! shares with a clone. That over-counts shared pages but means breaking the sharing later (a
//! write to a clone) never needs budget that was not already charged, and the usage figure
//! does not depend on history. Checked after every op, so a transaction can at most overshoot
//! the budget by one op before it is rolled back.

mod data;
mod object;

use crate::checks::{
    check_attr_name, check_compares_lead, check_expect, check_extent, check_io_len,
    check_list_limit, check_oid, check_value, compared_value, error, judge_expect,
};
use crate::{ObjectStat, ObjectStore, Op, Page, Result, StoreErrorKind, StoreStatfs, Transaction};
use bytes::{Bytes, BytesMut};
use carmine_types::CollectionId;
use data::{Data, SavedPages};
use object::{fixed_charge, Object, ObjectUndo};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Bound;

/// Configuration of a [`MemStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemStoreConfig {
    /// Transactions that would take the store's charged bytes past this fail with `NoSpace`.
    pub memory_limit_bytes: u64,
}

impl Default for MemStoreConfig {
    fn default() -> Self {
        Self {
            memory_limit_bytes: 1 << 30,
        }
    }
}

/// An object store shard held entirely in memory. Not `Sync`: it belongs to one reactor.
pub struct MemStore {
    config: MemStoreConfig,
    inner: RefCell<Inner>,
}

type Collection = BTreeMap<String, Object>;

#[derive(Default)]
struct Inner {
    colls: BTreeMap<CollectionId, Collection>,
    /// Sum of every object's fixed charge and charge.
    used: u64,
    objects: u64,
}

/// How to revert one op (or one part of it). Replayed newest first.
enum Undo {
    CollectionCreated(CollectionId),
    /// The collection was removed; it was empty.
    CollectionRemoved(CollectionId),
    ObjectCreated(CollectionId, String),
    /// The object was removed or replaced: put this back.
    Reinsert(CollectionId, String, Object),
    Object(CollectionId, String, ObjectUndo),
}

/// The collection and object an op is about, for error context.
fn op_subject(op: &Op) -> (CollectionId, &str) {
    match op {
        Op::CreateCollection { cid } | Op::RemoveCollection { cid } => (*cid, ""),
        Op::Compare { cid, oid, .. } => (*cid, oid),
        Op::Clone { cid, dst, .. } | Op::CloneRange { cid, dst, .. } => (*cid, dst),
        Op::Touch { cid, oid }
        | Op::Write { cid, oid, .. }
        | Op::Zero { cid, oid, .. }
        | Op::Truncate { cid, oid, .. }
        | Op::Remove { cid, oid }
        | Op::SetAttrs { cid, oid, .. }
        | Op::RmAttr { cid, oid, .. }
        | Op::OmapSetKeys { cid, oid, .. }
        | Op::OmapRmKeys { cid, oid, .. }
        | Op::OmapClear { cid, oid }
        | Op::OmapSetHeader { cid, oid, .. } => (*cid, oid),
    }
}

impl Inner {
    fn object(&self, cid: CollectionId, oid: &str) -> Result<&Object> {
        let coll = self.colls.get(&cid).ok_or_else(|| {
            error(
                StoreErrorKind::CollectionNotFound,
                cid,
                oid,
                "no such collection",
            )
        })?;
        coll.get(oid)
            .ok_or_else(|| error(StoreErrorKind::ObjectNotFound, cid, oid, "no such object"))
    }

    /// Runs `f` on an object (creating it first if `create`), records the undo entry it returns
    /// and recharges the object's change in size.
    fn mutate(
        &mut self,
        cid: CollectionId,
        oid: &str,
        create: bool,
        undo: &mut Vec<Undo>,
        f: impl FnOnce(&mut Object) -> Option<ObjectUndo>,
    ) -> Result<()> {
        let coll = self.colls.get_mut(&cid).ok_or_else(|| {
            error(
                StoreErrorKind::CollectionNotFound,
                cid,
                oid,
                "no such collection",
            )
        })?;
        if !coll.contains_key(oid) {
            if !create {
                return Err(error(
                    StoreErrorKind::ObjectNotFound,
                    cid,
                    oid,
                    "no such object",
                ));
            }
            coll.insert(oid.to_owned(), Object::default());
            undo.push(Undo::ObjectCreated(cid, oid.to_owned()));
            self.used += fixed_charge(oid);
            self.objects += 1;
        }
        let obj = coll.get_mut(oid).expect("present or just created");
        let before = obj.charge();
        if let Some(u) = f(obj) {
            undo.push(Undo::Object(cid, oid.to_owned(), u));
        }
        self.used = self.used - before + obj.charge();
        Ok(())
    }

    /// Changes the pages of one object with `f`, recording what it replaced.
    fn mutate_data(
        &mut self,
        cid: CollectionId,
        oid: &str,
        undo: &mut Vec<Undo>,
        f: impl FnOnce(&mut Data, &mut SavedPages),
    ) -> Result<()> {
        self.mutate(cid, oid, true, undo, |obj| {
            let size = obj.data.size();
            let mut pages = Vec::new();
            f(&mut obj.data, &mut pages);
            Some(ObjectUndo::Data { size, pages })
        })
    }

    /// Applies one op, validating its arguments first, then the collection, then the objects
    /// (the same order as the reference model, so both report the same error). Takes the op
    /// mutably only to move its keys and values into the store instead of copying them.
    fn apply(&mut self, op: &mut Op, undo: &mut Vec<Undo>) -> Result<()> {
        use StoreErrorKind::*;
        match op {
            Op::Compare { cid, oid, expect } => {
                check_expect(*cid, oid, expect)?;
                let coll = self
                    .colls
                    .get(cid)
                    .ok_or_else(|| error(CollectionNotFound, *cid, oid, "no such collection"))?;
                let obj = coll.get(oid.as_str());
                let found = obj
                    .and_then(|o| compared_value(expect, |n| o.xattrs.get(n), |k| o.omap.get(k)));
                judge_expect(*cid, oid, expect, obj.is_some(), found)?;
            }
            Op::CreateCollection { cid } => {
                if self.colls.contains_key(cid) {
                    return Err(error(
                        CollectionExists,
                        *cid,
                        "",
                        "collection already exists",
                    ));
                }
                self.colls.insert(*cid, Collection::new());
                undo.push(Undo::CollectionCreated(*cid));
            }
            Op::RemoveCollection { cid } => match self.colls.get(cid) {
                None => return Err(error(CollectionNotFound, *cid, "", "no such collection")),
                Some(c) if !c.is_empty() => {
                    return Err(error(
                        CollectionNotEmpty,
                        *cid,
                        "",
                        format!("collection holds {} objects", c.len()),
                    ))
                }
                Some(_) => {
                    self.colls.remove(cid);
                    undo.push(Undo::CollectionRemoved(*cid));
                }
            },
            Op::Touch { cid, oid } => {
                check_oid(*cid, oid)?;
                self.mutate(*cid, oid, true, undo, |_| None)?;
            }
            Op::Write {
                cid,
                oid,
                off,
                data,
            } => {
                check_oid(*cid, oid)?;
                check_io_len(*cid, oid, data.len() as u64)?;
                check_extent(*cid, oid, *off, data.len() as u64)?;
                self.mutate_data(*cid, oid, undo, |d, saved| d.write(*off, data, saved))?;
            }
            Op::Zero { cid, oid, off, len } => {
                check_oid(*cid, oid)?;
                check_extent(*cid, oid, *off, *len)?;
                self.mutate_data(*cid, oid, undo, |d, saved| d.zero(*off, *len, saved))?;
            }
            Op::Truncate { cid, oid, size } => {
                check_oid(*cid, oid)?;
                check_extent(*cid, oid, *size, 0)?;
                self.mutate_data(*cid, oid, undo, |d, saved| d.truncate(*size, saved))?;
            }
            Op::Remove { cid, oid } => {
                check_oid(*cid, oid)?;
                let coll = self
                    .colls
                    .get_mut(cid)
                    .ok_or_else(|| error(CollectionNotFound, *cid, oid, "no such collection"))?;
                let (name, old) = coll
                    .remove_entry(oid.as_str())
                    .ok_or_else(|| error(ObjectNotFound, *cid, oid, "no such object"))?;
                self.used -= fixed_charge(&name) + old.charge();
                self.objects -= 1;
                undo.push(Undo::Reinsert(*cid, name, old));
            }
            Op::SetAttrs { cid, oid, attrs } => {
                check_oid(*cid, oid)?;
                for (name, value) in attrs.iter() {
                    check_attr_name(*cid, oid, name)?;
                    check_value(*cid, oid, "xattr value", value.len())?;
                }
                let attrs = std::mem::take(attrs);
                self.mutate(*cid, oid, true, undo, |obj| {
                    let old = attrs
                        .into_iter()
                        .map(|(k, v)| (k.clone(), obj.set_attr(k, Some(v))))
                        .collect();
                    Some(ObjectUndo::Attrs(old))
                })?;
            }
            Op::RmAttr { cid, oid, name } => {
                check_oid(*cid, oid)?;
                check_attr_name(*cid, oid, name)?;
                let name = std::mem::take(name);
                self.mutate(*cid, oid, false, undo, |obj| {
                    let old = obj.set_attr(name.clone(), None)?;
                    Some(ObjectUndo::Attrs(vec![(name, Some(old))]))
                })?;
            }
            Op::OmapSetKeys { cid, oid, kvs } => {
                check_oid(*cid, oid)?;
                for (key, value) in kvs.iter() {
                    check_value(*cid, oid, "omap key", key.len())?;
                    check_value(*cid, oid, "omap value", value.len())?;
                }
                let kvs = std::mem::take(kvs);
                self.mutate(*cid, oid, true, undo, |obj| {
                    let old = kvs
                        .into_iter()
                        .map(|(k, v)| (k.clone(), obj.set_omap(k, Some(v))))
                        .collect();
                    Some(ObjectUndo::Omap(old))
                })?;
            }
            Op::OmapRmKeys { cid, oid, keys } => {
                check_oid(*cid, oid)?;
                let keys = std::mem::take(keys);
                self.mutate(*cid, oid, false, undo, |obj| {
                    let old: Vec<_> = keys
                        .into_iter()
                        .filter_map(|k| obj.set_omap(k.clone(), None).map(|v| (k, Some(v))))
                        .collect();
                    (!old.is_empty()).then_some(ObjectUndo::Omap(old))
                })?;
            }
            Op::OmapClear { cid, oid } => {
                check_oid(*cid, oid)?;
                self.mutate(*cid, oid, false, undo, |obj| {
                    let bytes = obj
                        .omap
                        .iter()
                        .map(|(k, v)| (k.len() + v.len()) as u64)
                        .sum::<u64>()
                        + obj.omap_header.len() as u64;
                    obj.meta_bytes -= bytes;
                    let omap = std::mem::take(&mut obj.omap);
                    let header = std::mem::take(&mut obj.omap_header);
                    Some(ObjectUndo::OmapCleared {
                        omap,
                        header,
                        bytes,
                    })
                })?;
            }
            Op::OmapSetHeader { cid, oid, header } => {
                check_oid(*cid, oid)?;
                check_value(*cid, oid, "omap header", header.len())?;
                let header = std::mem::take(header);
                self.mutate(*cid, oid, true, undo, |obj| {
                    Some(ObjectUndo::Header(obj.set_header(header)))
                })?;
            }
            Op::Clone { cid, src, dst } => {
                check_oid(*cid, src)?;
                check_oid(*cid, dst)?;
                let source = self.object(*cid, src)?;
                if src == dst {
                    return Ok(());
                }
                let copy = source.clone();
                let charge = copy.charge();
                let coll = self.colls.get_mut(cid).expect("checked by object()");
                match coll.insert(dst.clone(), copy) {
                    Some(old) => {
                        self.used -= old.charge();
                        undo.push(Undo::Reinsert(*cid, dst.clone(), old));
                    }
                    None => {
                        self.used += fixed_charge(dst);
                        self.objects += 1;
                        undo.push(Undo::ObjectCreated(*cid, dst.clone()));
                    }
                }
                self.used += charge;
            }
            Op::CloneRange {
                cid,
                src,
                dst,
                src_off,
                len,
                dst_off,
            } => {
                check_oid(*cid, src)?;
                check_oid(*cid, dst)?;
                check_extent(*cid, src, *src_off, *len)?;
                check_extent(*cid, dst, *dst_off, *len)?;
                let source = self.object(*cid, src)?.data.snapshot(*src_off, *len);
                self.mutate_data(*cid, dst, undo, |d, saved| {
                    d.copy_from(&source, *src_off, *len, *dst_off, saved)
                })?;
            }
        }
        Ok(())
    }

    /// Replays `undo` backwards. Every entry reverts exactly one change made after all the
    /// entries before it, so each finds the state its change left behind.
    fn rollback(&mut self, undo: Vec<Undo>, used: u64, objects: u64) {
        const SYNC: &str = "undo log out of step with the store";
        for entry in undo.into_iter().rev() {
            match entry {
                Undo::CollectionCreated(cid) => drop(self.colls.remove(&cid)),
                Undo::CollectionRemoved(cid) => drop(self.colls.insert(cid, Collection::new())),
                Undo::ObjectCreated(cid, oid) => {
                    drop(self.colls.get_mut(&cid).expect(SYNC).remove(&oid))
                }
                Undo::Reinsert(cid, oid, obj) => {
                    drop(self.colls.get_mut(&cid).expect(SYNC).insert(oid, obj))
                }
                Undo::Object(cid, oid, u) => u.revert(
                    self.colls
                        .get_mut(&cid)
                        .and_then(|c| c.get_mut(&oid))
                        .expect(SYNC),
                ),
            }
        }
        self.used = used;
        self.objects = objects;
    }

    /// Recomputes the charged bytes and object count from scratch; for tests.
    #[cfg(test)]
    fn recount(&self) -> (u64, u64) {
        let mut used = 0;
        let mut objects = 0;
        for (name, obj) in self.colls.values().flatten() {
            obj.data.check_invariants();
            let meta = obj
                .xattrs
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
                + obj
                    .omap
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
                + obj.omap_header.len();
            assert_eq!(obj.meta_bytes, meta as u64, "metadata charge of {name}");
            used += fixed_charge(name) + obj.charge();
            objects += 1;
        }
        (used, objects)
    }
}

impl MemStore {
    pub fn new(config: MemStoreConfig) -> Self {
        Self {
            config,
            inner: RefCell::new(Inner::default()),
        }
    }

    pub fn config(&self) -> MemStoreConfig {
        self.config
    }

    /// Runs `f` on an existing object. Callers validate their arguments first, name first,
    /// in the same order as the reference model.
    fn with_object<T>(
        &self,
        cid: CollectionId,
        oid: &str,
        f: impl FnOnce(&Object) -> Result<T>,
    ) -> Result<T> {
        f(self.inner.borrow().object(cid, oid)?)
    }

    /// `read`'s rules on an object already found, into a buffer of its own.
    fn read_object(
        cid: CollectionId,
        oid: &str,
        obj: &Object,
        off: u64,
        len: u64,
    ) -> Result<Bytes> {
        let mut out = BytesMut::new();
        Self::read_object_into(cid, oid, obj, off, len, &mut out)?;
        Ok(out.freeze())
    }

    /// `read`'s rules on an object already found, appending to `out`: holes are zeros, the
    /// pages are copied in, nothing is allocated beyond `out`'s growth.
    fn read_object_into(
        cid: CollectionId,
        oid: &str,
        obj: &Object,
        off: u64,
        len: u64,
        out: &mut BytesMut,
    ) -> Result<usize> {
        let size = obj.data.size();
        let end = if len == 0 {
            size
        } else {
            (off + len).min(size)
        };
        if off >= end {
            return Ok(0);
        }
        check_io_len(cid, oid, end - off)?;
        let n = (end - off) as usize;
        let start = out.len();
        out.resize(start + n, 0);
        obj.data.read_into(off, &mut out[start..]);
        Ok(n)
    }
}

impl ObjectStore for MemStore {
    const NEVER_SUSPENDS: bool = true;

    async fn submit(&self, txn: Transaction) -> Result<()> {
        check_compares_lead(&txn)?;
        let mut inner = self.inner.borrow_mut();
        let (used, objects) = (inner.used, inner.objects);
        let limit = self.config.memory_limit_bytes;
        let mut undo = Vec::new();
        for mut op in txn.ops {
            let mut result = inner.apply(&mut op, &mut undo);
            // Only growth past the limit fails, checked after each op so a transaction overshoots
            // by at most one op; shrinking ops (remove, truncate, zero) always fit.
            if result.is_ok() && inner.used > limit && inner.used > used {
                let (cid, oid) = op_subject(&op);
                let detail = format!(
                    "would use {} bytes of the {limit} byte memory limit",
                    inner.used
                );
                result = Err(error(StoreErrorKind::NoSpace, cid, oid, detail));
            }
            if let Err(e) = result {
                inner.rollback(undo, used, objects);
                return Err(e);
            }
        }
        Ok(())
    }

    async fn read(&self, cid: CollectionId, oid: &str, off: u64, len: u64) -> Result<Bytes> {
        check_oid(cid, oid)?;
        check_extent(cid, oid, off, len)?;
        check_io_len(cid, oid, len)?;
        self.with_object(cid, oid, |obj| Self::read_object(cid, oid, obj, off, len))
    }

    async fn read_into(
        &self,
        cid: CollectionId,
        oid: &str,
        off: u64,
        len: u64,
        out: &mut BytesMut,
    ) -> Result<usize> {
        check_oid(cid, oid)?;
        check_extent(cid, oid, off, len)?;
        check_io_len(cid, oid, len)?;
        self.with_object(cid, oid, |obj| {
            Self::read_object_into(cid, oid, obj, off, len, out)
        })
    }

    async fn readv(
        &self,
        cid: CollectionId,
        oid: &str,
        extents: &[(u64, u64)],
    ) -> Result<Vec<Bytes>> {
        check_oid(cid, oid)?;
        for &(off, len) in extents {
            check_extent(cid, oid, off, len)?;
            check_io_len(cid, oid, len)?;
        }
        self.with_object(cid, oid, |obj| {
            extents
                .iter()
                .map(|&(off, len)| Self::read_object(cid, oid, obj, off, len))
                .collect()
        })
    }

    async fn stat(&self, cid: CollectionId, oid: &str) -> Result<ObjectStat> {
        check_oid(cid, oid)?;
        self.with_object(cid, oid, |obj| {
            Ok(ObjectStat {
                size: obj.data.size(),
            })
        })
    }

    async fn getattr(&self, cid: CollectionId, oid: &str, name: &str) -> Result<Bytes> {
        check_oid(cid, oid)?;
        check_attr_name(cid, oid, name)?;
        self.with_object(cid, oid, |obj| {
            obj.xattrs.get(name).cloned().ok_or_else(|| {
                error(
                    StoreErrorKind::AttrNotFound,
                    cid,
                    oid,
                    format!("no xattr {name:?}"),
                )
            })
        })
    }

    async fn getattrs(&self, cid: CollectionId, oid: &str) -> Result<BTreeMap<String, Bytes>> {
        check_oid(cid, oid)?;
        self.with_object(cid, oid, |obj| Ok(obj.xattrs.clone()))
    }

    async fn omap_get_header(&self, cid: CollectionId, oid: &str) -> Result<Bytes> {
        check_oid(cid, oid)?;
        self.with_object(cid, oid, |obj| Ok(obj.omap_header.clone()))
    }

    async fn omap_get_values(
        &self,
        cid: CollectionId,
        oid: &str,
        keys: &[Bytes],
    ) -> Result<BTreeMap<Bytes, Bytes>> {
        check_oid(cid, oid)?;
        self.with_object(cid, oid, |obj| {
            Ok(keys
                .iter()
                .filter_map(|k| Some((k.clone(), obj.omap.get(k)?.clone())))
                .collect())
        })
    }

    async fn omap_iterate(
        &self,
        cid: CollectionId,
        oid: &str,
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page<(Bytes, Bytes), Bytes>> {
        check_oid(cid, oid)?;
        let limit = check_list_limit(cid, oid, limit)?;
        self.with_object(cid, oid, |obj| {
            let lower = start_after.map_or(Bound::Unbounded, Bound::Excluded);
            let iter = obj
                .omap
                .range::<[u8], _>((lower, Bound::Unbounded))
                .map(|(k, v)| (k.clone(), v.clone()));
            Ok(Page::take_from(iter, limit, |(k, _)| k.clone()))
        })
    }

    async fn list_objects(
        &self,
        cid: CollectionId,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Page<String, String>> {
        let limit = check_list_limit(cid, "", limit)?;
        let inner = self.inner.borrow();
        let coll = inner.colls.get(&cid).ok_or_else(|| {
            error(
                StoreErrorKind::CollectionNotFound,
                cid,
                "",
                "no such collection",
            )
        })?;
        let lower = start_after.map_or(Bound::Unbounded, Bound::Excluded);
        let iter = coll
            .range::<str, _>((lower, Bound::Unbounded))
            .map(|(k, _)| k.clone());
        Ok(Page::take_from(iter, limit, String::clone))
    }

    async fn list_collections(&self) -> Result<Vec<CollectionId>> {
        Ok(self.inner.borrow().colls.keys().copied().collect())
    }

    async fn collection_exists(&self, cid: CollectionId) -> Result<bool> {
        Ok(self.inner.borrow().colls.contains_key(&cid))
    }

    async fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn statfs(&self) -> StoreStatfs {
        let inner = self.inner.borrow();
        StoreStatfs {
            bytes_total: self.config.memory_limit_bytes,
            bytes_used: inner.used,
            objects: inner.objects,
        }
    }
}

#[cfg(test)]
mod tests;
