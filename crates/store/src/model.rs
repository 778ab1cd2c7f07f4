//! `ModelStore`: a deliberately naive store that serves as the executable specification.
//!
//! Every backend is checked op for op against it (see `conformance`), so it favours obvious
//! correctness over everything else: object data is one dense `Vec<u8>`, and a transaction is
//! applied to a full copy of the state that replaces the original only on success. Do not
//! optimise it; do not feed it huge offsets (a 1 TiB truncate really allocates 1 TiB).
//!
//! The rules it pins down, beyond those documented on `Op` and `ObjectStore`:
//! - Errors are checked in a fixed order: the op's own arguments (`InvalidArgument`), then the
//!   collection, then the objects, so every backend reports the same kind.
//! - Object names: 1..=`OBJECT_NAME_LEN_MAX` bytes. Xattr names: 1..=`ATTR_NAME_LEN_MAX`,
//!   checked wherever a name appears (`SetAttrs`, `RmAttr`, `getattr`). Xattr values, omap keys
//!   and values being set, and the omap header: at most `VALUE_LEN_MAX` bytes.
//! - Every extent `off + len` (and a truncate size) must be at most `OBJECT_SIZE_MAX`,
//!   including on reads; an overflowing sum is `InvalidArgument`.
//! - One write or read moves at most `IO_LEN_MAX` bytes: a longer write or read request, or a
//!   `len == 0` read whose result would be longer, is `InvalidArgument`.
//! - An empty range (`Write` of no bytes, `Zero`/`CloneRange` of length 0) creates the object
//!   as usual but does not change its size.
//! - `OmapClear` removes the omap header as well as the keys, as Ceph's `omap_clear` does.
//! - `Clone` onto itself is a no-op; `CloneRange` within one object behaves like `memmove`.
//! - Listings return at most `min(limit, LIST_LIMIT_MAX)` items; a limit of 0 is
//!   `InvalidArgument`. `next` is the last returned key when more remain, else `None`.
//! - `Compare` ops must all precede the other ops of a transaction (else `InvalidArgument`,
//!   before anything else is checked); each checks its arguments, then the collection, then
//!   the object. An absent object compares as having no xattrs and no omap keys.
//! - The model has no space limit; `statfs` reports `bytes_total = u64::MAX`.

use crate::{
    Expect, ObjectStat, ObjectStore, Op, Page, Result, StoreError, StoreErrorKind, StoreStatfs,
    Transaction,
};
use bytes::Bytes;
use carmine_types::limits::{
    ATTR_NAME_LEN_MAX, IO_LEN_MAX, LIST_LIMIT_MAX, OBJECT_NAME_LEN_MAX, OBJECT_SIZE_MAX,
    VALUE_LEN_MAX,
};
use carmine_types::CollectionId;
use std::cell::RefCell;
use std::collections::BTreeMap;
use StoreErrorKind::*;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ModelObject {
    data: Vec<u8>,
    attrs: BTreeMap<String, Bytes>,
    header: Bytes,
    omap: BTreeMap<Bytes, Bytes>,
}

type State = BTreeMap<CollectionId, BTreeMap<String, ModelObject>>;

/// The reference model. See the module documentation for the rules it fixes.
#[derive(Default)]
pub struct ModelStore {
    state: RefCell<State>,
}

fn fail<T>(kind: StoreErrorKind, cid: CollectionId, oid: &str, detail: &str) -> Result<T> {
    Err(StoreError::new(kind, cid, oid, detail))
}

fn name_ok(cid: CollectionId, oid: &str) -> Result<()> {
    if oid.is_empty() || oid.len() > OBJECT_NAME_LEN_MAX {
        return fail(InvalidArgument, cid, oid, "bad object name");
    }
    Ok(())
}

fn attr_name_ok(cid: CollectionId, oid: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > ATTR_NAME_LEN_MAX {
        return fail(InvalidArgument, cid, oid, "bad xattr name");
    }
    Ok(())
}

fn value_ok(cid: CollectionId, oid: &str, value: &[u8]) -> Result<()> {
    if value.len() > VALUE_LEN_MAX {
        return fail(InvalidArgument, cid, oid, "value too long");
    }
    Ok(())
}

fn extent_ok(cid: CollectionId, oid: &str, off: u64, len: u64) -> Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= OBJECT_SIZE_MAX => Ok(()),
        _ => fail(InvalidArgument, cid, oid, "extent past the size limit"),
    }
}

fn io_len_ok(cid: CollectionId, oid: &str, len: u64) -> Result<()> {
    if len > IO_LEN_MAX as u64 {
        return fail(
            InvalidArgument,
            cid,
            oid,
            "too many bytes for one read or write",
        );
    }
    Ok(())
}

fn limit_ok(cid: CollectionId, oid: &str, limit: usize) -> Result<usize> {
    if limit == 0 {
        return fail(InvalidArgument, cid, oid, "limit 0");
    }
    Ok(limit.min(LIST_LIMIT_MAX as usize))
}

fn collection<'a>(
    state: &'a mut State,
    cid: CollectionId,
    oid: &str,
) -> Result<&'a mut BTreeMap<String, ModelObject>> {
    match state.get_mut(&cid) {
        Some(c) => Ok(c),
        None => fail(CollectionNotFound, cid, oid, "no collection"),
    }
}

/// The object, created empty if missing.
fn object_or_new<'a>(
    state: &'a mut State,
    cid: CollectionId,
    oid: &str,
) -> Result<&'a mut ModelObject> {
    Ok(collection(state, cid, oid)?
        .entry(oid.to_owned())
        .or_default())
}

fn existing<'a>(state: &'a mut State, cid: CollectionId, oid: &str) -> Result<&'a mut ModelObject> {
    match collection(state, cid, oid)?.get_mut(oid) {
        Some(o) => Ok(o),
        None => fail(ObjectNotFound, cid, oid, "no object"),
    }
}

/// Writes `bytes` at `off`, growing the data; an empty write changes nothing.
fn write_bytes(obj: &mut ModelObject, off: u64, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let (off, end) = (off as usize, off as usize + bytes.len());
    if obj.data.len() < end {
        obj.data.resize(end, 0);
    }
    obj.data[off..end].copy_from_slice(bytes);
}

fn apply(state: &mut State, op: &Op) -> Result<()> {
    match op {
        Op::Compare { cid, oid, expect } => {
            name_ok(*cid, oid)?;
            let wanted = match expect {
                Expect::Absent => None,
                Expect::Xattr { name, value } => {
                    attr_name_ok(*cid, oid, name)?;
                    value_ok(*cid, oid, value.as_deref().unwrap_or_default())?;
                    Some(value)
                }
                Expect::OmapKey { key, value } => {
                    value_ok(*cid, oid, key)?;
                    value_ok(*cid, oid, value.as_deref().unwrap_or_default())?;
                    Some(value)
                }
            };
            let obj = collection(state, *cid, oid)?.get(oid);
            let holds = match (expect, obj) {
                (Expect::Absent, found) => {
                    if found.is_some() {
                        return fail(ObjectExists, *cid, oid, "object exists");
                    }
                    true
                }
                (Expect::Xattr { name, .. }, found) => {
                    found.and_then(|o| o.attrs.get(name)) == wanted.unwrap().as_ref()
                }
                (Expect::OmapKey { key, .. }, found) => {
                    found.and_then(|o| o.omap.get(key)) == wanted.unwrap().as_ref()
                }
            };
            if !holds {
                return fail(CompareFailed, *cid, oid, "compare failed");
            }
        }
        Op::CreateCollection { cid } => {
            if state.contains_key(cid) {
                return fail(CollectionExists, *cid, "", "exists");
            }
            state.insert(*cid, BTreeMap::new());
        }
        Op::RemoveCollection { cid } => {
            if !collection(state, *cid, "")?.is_empty() {
                return fail(CollectionNotEmpty, *cid, "", "not empty");
            }
            state.remove(cid);
        }
        Op::Touch { cid, oid } => {
            name_ok(*cid, oid)?;
            object_or_new(state, *cid, oid)?;
        }
        Op::Write {
            cid,
            oid,
            off,
            data,
        } => {
            name_ok(*cid, oid)?;
            io_len_ok(*cid, oid, data.len() as u64)?;
            extent_ok(*cid, oid, *off, data.len() as u64)?;
            write_bytes(object_or_new(state, *cid, oid)?, *off, data);
        }
        Op::Zero { cid, oid, off, len } => {
            name_ok(*cid, oid)?;
            extent_ok(*cid, oid, *off, *len)?;
            write_bytes(
                object_or_new(state, *cid, oid)?,
                *off,
                &vec![0; *len as usize],
            );
        }
        Op::Truncate { cid, oid, size } => {
            name_ok(*cid, oid)?;
            extent_ok(*cid, oid, *size, 0)?;
            object_or_new(state, *cid, oid)?
                .data
                .resize(*size as usize, 0);
        }
        Op::Remove { cid, oid } => {
            name_ok(*cid, oid)?;
            if collection(state, *cid, oid)?.remove(oid).is_none() {
                return fail(ObjectNotFound, *cid, oid, "no object");
            }
        }
        Op::SetAttrs { cid, oid, attrs } => {
            name_ok(*cid, oid)?;
            for (name, value) in attrs {
                attr_name_ok(*cid, oid, name)?;
                value_ok(*cid, oid, value)?;
            }
            let obj = object_or_new(state, *cid, oid)?;
            for (name, value) in attrs {
                obj.attrs.insert(name.clone(), value.clone());
            }
        }
        Op::RmAttr { cid, oid, name } => {
            name_ok(*cid, oid)?;
            attr_name_ok(*cid, oid, name)?;
            existing(state, *cid, oid)?.attrs.remove(name);
        }
        Op::OmapSetKeys { cid, oid, kvs } => {
            name_ok(*cid, oid)?;
            for (key, value) in kvs {
                value_ok(*cid, oid, key)?;
                value_ok(*cid, oid, value)?;
            }
            let obj = object_or_new(state, *cid, oid)?;
            for (key, value) in kvs {
                obj.omap.insert(key.clone(), value.clone());
            }
        }
        Op::OmapRmKeys { cid, oid, keys } => {
            name_ok(*cid, oid)?;
            let obj = existing(state, *cid, oid)?;
            for key in keys {
                obj.omap.remove(key);
            }
        }
        Op::OmapClear { cid, oid } => {
            name_ok(*cid, oid)?;
            let obj = existing(state, *cid, oid)?;
            obj.omap.clear();
            obj.header = Bytes::new();
        }
        Op::OmapSetHeader { cid, oid, header } => {
            name_ok(*cid, oid)?;
            value_ok(*cid, oid, header)?;
            object_or_new(state, *cid, oid)?.header = header.clone();
        }
        Op::Clone { cid, src, dst } => {
            name_ok(*cid, src)?;
            name_ok(*cid, dst)?;
            let copy = existing(state, *cid, src)?.clone();
            collection(state, *cid, dst)?.insert(dst.clone(), copy);
        }
        Op::CloneRange {
            cid,
            src,
            dst,
            src_off,
            len,
            dst_off,
        } => {
            name_ok(*cid, src)?;
            name_ok(*cid, dst)?;
            extent_ok(*cid, src, *src_off, *len)?;
            extent_ok(*cid, dst, *dst_off, *len)?;
            let source = &existing(state, *cid, src)?.data;
            let bytes: Vec<u8> = (*src_off..*src_off + *len)
                .map(|i| source.get(i as usize).copied().unwrap_or(0))
                .collect();
            write_bytes(object_or_new(state, *cid, dst)?, *dst_off, &bytes);
        }
    }
    Ok(())
}

impl ModelStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn with_object<T>(
        &self,
        cid: CollectionId,
        oid: &str,
        f: impl FnOnce(&ModelObject) -> Result<T>,
    ) -> Result<T> {
        let state = self.state.borrow();
        let Some(coll) = state.get(&cid) else {
            return fail(CollectionNotFound, cid, oid, "no collection");
        };
        let Some(obj) = coll.get(oid) else {
            return fail(ObjectNotFound, cid, oid, "no object");
        };
        f(obj)
    }
}

fn read_extent(
    cid: CollectionId,
    oid: &str,
    obj: &ModelObject,
    off: u64,
    len: u64,
) -> Result<Bytes> {
    let size = obj.data.len() as u64;
    let end = if len == 0 {
        size
    } else {
        (off + len).min(size)
    };
    if off >= end {
        return Ok(Bytes::new());
    }
    io_len_ok(cid, oid, end - off)?;
    Ok(Bytes::copy_from_slice(
        &obj.data[off as usize..end as usize],
    ))
}

impl ObjectStore for ModelStore {
    async fn submit(&self, txn: Transaction) -> Result<()> {
        // Compares are guards: all of them first, judged on the state before any change.
        let first_other = txn
            .ops
            .iter()
            .position(|op| !matches!(op, Op::Compare { .. }))
            .unwrap_or(txn.ops.len());
        if let Some(Op::Compare { cid, oid, .. }) = txn.ops[first_other..]
            .iter()
            .find(|op| matches!(op, Op::Compare { .. }))
        {
            return fail(InvalidArgument, *cid, oid, "compare after another op");
        }
        let mut scratch = self.state.borrow().clone();
        for op in &txn.ops {
            apply(&mut scratch, op)?;
        }
        *self.state.borrow_mut() = scratch;
        Ok(())
    }

    async fn read(&self, cid: CollectionId, oid: &str, off: u64, len: u64) -> Result<Bytes> {
        name_ok(cid, oid)?;
        extent_ok(cid, oid, off, len)?;
        io_len_ok(cid, oid, len)?;
        self.with_object(cid, oid, |obj| read_extent(cid, oid, obj, off, len))
    }

    async fn readv(
        &self,
        cid: CollectionId,
        oid: &str,
        extents: &[(u64, u64)],
    ) -> Result<Vec<Bytes>> {
        name_ok(cid, oid)?;
        for &(off, len) in extents {
            extent_ok(cid, oid, off, len)?;
            io_len_ok(cid, oid, len)?;
        }
        self.with_object(cid, oid, |obj| {
            extents
                .iter()
                .map(|&(o, l)| read_extent(cid, oid, obj, o, l))
                .collect()
        })
    }

    async fn stat(&self, cid: CollectionId, oid: &str) -> Result<ObjectStat> {
        name_ok(cid, oid)?;
        self.with_object(cid, oid, |obj| {
            Ok(ObjectStat {
                size: obj.data.len() as u64,
            })
        })
    }

    async fn getattr(&self, cid: CollectionId, oid: &str, name: &str) -> Result<Bytes> {
        name_ok(cid, oid)?;
        attr_name_ok(cid, oid, name)?;
        self.with_object(cid, oid, |obj| match obj.attrs.get(name) {
            Some(v) => Ok(v.clone()),
            None => fail(AttrNotFound, cid, oid, "no xattr"),
        })
    }

    async fn getattrs(&self, cid: CollectionId, oid: &str) -> Result<BTreeMap<String, Bytes>> {
        name_ok(cid, oid)?;
        self.with_object(cid, oid, |obj| Ok(obj.attrs.clone()))
    }

    async fn omap_get_header(&self, cid: CollectionId, oid: &str) -> Result<Bytes> {
        name_ok(cid, oid)?;
        self.with_object(cid, oid, |obj| Ok(obj.header.clone()))
    }

    async fn omap_get_values(
        &self,
        cid: CollectionId,
        oid: &str,
        keys: &[Bytes],
    ) -> Result<BTreeMap<Bytes, Bytes>> {
        name_ok(cid, oid)?;
        self.with_object(cid, oid, |obj| {
            Ok(keys
                .iter()
                .filter(|k| obj.omap.contains_key(*k))
                .map(|k| (k.clone(), obj.omap[k].clone()))
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
        name_ok(cid, oid)?;
        let limit = limit_ok(cid, oid, limit)?;
        self.with_object(cid, oid, |obj| {
            let after: Vec<_> = obj
                .omap
                .iter()
                .filter(|(k, _)| start_after.is_none_or(|s| k[..] > *s))
                .collect();
            let items: Vec<_> = after
                .iter()
                .take(limit)
                .map(|(k, v)| ((*k).clone(), (*v).clone()))
                .collect();
            let next = (after.len() > limit).then(|| items.last().unwrap().0.clone());
            Ok(Page { items, next })
        })
    }

    async fn list_objects(
        &self,
        cid: CollectionId,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Page<String, String>> {
        let limit = limit_ok(cid, "", limit)?;
        let state = self.state.borrow();
        let Some(coll) = state.get(&cid) else {
            return fail(CollectionNotFound, cid, "", "no collection");
        };
        let after: Vec<&String> = coll
            .keys()
            .filter(|k| start_after.is_none_or(|s| k.as_str() > s))
            .collect();
        let items: Vec<String> = after.iter().take(limit).map(|k| (*k).clone()).collect();
        let next = (after.len() > limit).then(|| items.last().unwrap().clone());
        Ok(Page { items, next })
    }

    async fn list_collections(&self) -> Result<Vec<CollectionId>> {
        Ok(self.state.borrow().keys().copied().collect())
    }

    async fn collection_exists(&self, cid: CollectionId) -> Result<bool> {
        Ok(self.state.borrow().contains_key(&cid))
    }

    async fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn statfs(&self) -> StoreStatfs {
        let state = self.state.borrow();
        let objects = state.values().map(|c| c.len() as u64).sum();
        let bytes_used = state
            .values()
            .flat_map(|c| c.values())
            .map(|o| {
                o.data.len()
                    + o.header.len()
                    + o.attrs
                        .iter()
                        .map(|(k, v)| k.len() + v.len())
                        .sum::<usize>()
                    + o.omap.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            })
            .sum::<usize>() as u64;
        StoreStatfs {
            bytes_total: u64::MAX,
            bytes_used,
            objects,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ModelStore;

    // The suite run against its own specification: checks the cases as much as the model.
    crate::conformance_tests!(make_store: ModelStore::new(), block_on: futures::executor::block_on);
}
