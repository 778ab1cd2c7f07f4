//! Whether a transaction would apply, judged from what a store holds now, without changing it.
//!
//! A replicated PG's primary asks this before it gives a write that may fail (a compare, an
//! exclusive create, the removal of a missing object…) a version: only a write that will
//! succeed may enter the PG's log, and every copy, the primary's included, then applies it
//! with its compares dropped. The answer holds only while nothing else changes the objects
//! between the check and the apply; the caller arranges that.
//!
//! The rules are the store's (see `model`): arguments first, then the collection, then the
//! object, with the same error kinds. Only what depends on the store's content is read: whether
//! each object exists, and the xattrs and omap keys that compares look at (compares lead a
//! transaction, so they see the store's own values).

use crate::checks::{
    check_attr_name, check_compares_lead, check_expect, check_extent, check_io_len, check_oid,
    check_value, error, invalid, judge_expect,
};
use crate::{Expect, ObjectStore, Op, Result, StoreErrorKind, Transaction};
use bytes::Bytes;
use carmine_types::CollectionId;
use std::collections::HashMap;

/// `Ok` if `store.submit(txn)` would succeed now, else the error it would fail with — except
/// for errors of space (`NoSpace`) and of the device, which a dry run cannot foresee.
/// Collection ops and clones are not judged: they are refused as `InvalidArgument`.
pub async fn check_applies<S: ObjectStore + ?Sized>(store: &S, txn: &Transaction) -> Result<()> {
    check_compares_lead(txn)?;
    // Whether each object exists as the transaction has left it so far. Compares lead, so
    // they see the store's own values; after them only existence decides.
    let mut exists: HashMap<(CollectionId, &str), bool> = HashMap::new();
    for op in &txn.ops {
        check_arguments(op)?;
        let (cid, oid) = target(op)?;
        let there = match exists.get(&(cid, oid)) {
            Some(there) => *there,
            None => {
                let there = stored(store, cid, oid).await?;
                exists.insert((cid, oid), there);
                there
            }
        };
        let missing = || error(StoreErrorKind::ObjectNotFound, cid, oid, "no such object");
        match op {
            Op::Compare { expect, .. } => {
                let found = if there {
                    compared(store, cid, oid, expect).await?
                } else {
                    None
                };
                judge_expect(cid, oid, expect, there, found.as_ref())?;
            }
            Op::Touch { .. }
            | Op::Write { .. }
            | Op::Zero { .. }
            | Op::Truncate { .. }
            | Op::SetAttrs { .. }
            | Op::OmapSetKeys { .. }
            | Op::OmapSetHeader { .. } => {
                exists.insert((cid, oid), true);
            }
            Op::Remove { .. }
            | Op::RmAttr { .. }
            | Op::OmapRmKeys { .. }
            | Op::OmapClear { .. }
                if !there =>
            {
                return Err(missing())
            }
            Op::Remove { .. } => {
                exists.insert((cid, oid), false);
            }
            Op::RmAttr { .. } | Op::OmapRmKeys { .. } | Op::OmapClear { .. } => {}
            Op::CreateCollection { .. }
            | Op::RemoveCollection { .. }
            | Op::Clone { .. }
            | Op::CloneRange { .. } => unreachable!("refused by target()"),
        }
    }
    Ok(())
}

/// The op's own arguments, checked as every backend checks them before anything else.
fn check_arguments(op: &Op) -> Result<()> {
    match op {
        Op::Compare { cid, oid, expect } => check_expect(*cid, oid, expect),
        Op::Touch { cid, oid }
        | Op::Remove { cid, oid }
        | Op::OmapRmKeys { cid, oid, .. }
        | Op::OmapClear { cid, oid } => check_oid(*cid, oid),
        Op::Write {
            cid,
            oid,
            off,
            data,
        } => {
            check_oid(*cid, oid)?;
            check_io_len(*cid, oid, data.len() as u64)?;
            check_extent(*cid, oid, *off, data.len() as u64)
        }
        Op::Zero { cid, oid, off, len } => {
            check_oid(*cid, oid)?;
            check_extent(*cid, oid, *off, *len)
        }
        Op::Truncate { cid, oid, size } => {
            check_oid(*cid, oid)?;
            check_extent(*cid, oid, *size, 0)
        }
        Op::SetAttrs { cid, oid, attrs } => {
            check_oid(*cid, oid)?;
            for (name, value) in attrs {
                check_attr_name(*cid, oid, name)?;
                check_value(*cid, oid, "xattr value", value.len())?;
            }
            Ok(())
        }
        Op::RmAttr { cid, oid, name } => {
            check_oid(*cid, oid)?;
            check_attr_name(*cid, oid, name)
        }
        Op::OmapSetKeys { cid, oid, kvs } => {
            check_oid(*cid, oid)?;
            for (key, value) in kvs {
                check_value(*cid, oid, "omap key", key.len())?;
                check_value(*cid, oid, "omap value", value.len())?;
            }
            Ok(())
        }
        Op::OmapSetHeader { cid, oid, header } => {
            check_oid(*cid, oid)?;
            check_value(*cid, oid, "omap header", header.len())
        }
        Op::CreateCollection { .. }
        | Op::RemoveCollection { .. }
        | Op::Clone { .. }
        | Op::CloneRange { .. } => Ok(()),
    }
}

fn target(op: &Op) -> Result<(CollectionId, &str)> {
    match op {
        Op::Compare { cid, oid, .. }
        | Op::Touch { cid, oid }
        | Op::Write { cid, oid, .. }
        | Op::Zero { cid, oid, .. }
        | Op::Truncate { cid, oid, .. }
        | Op::Remove { cid, oid }
        | Op::SetAttrs { cid, oid, .. }
        | Op::RmAttr { cid, oid, .. }
        | Op::OmapSetKeys { cid, oid, .. }
        | Op::OmapRmKeys { cid, oid, .. }
        | Op::OmapClear { cid, oid }
        | Op::OmapSetHeader { cid, oid, .. } => Ok((*cid, oid)),
        Op::CreateCollection { cid } | Op::RemoveCollection { cid } => {
            Err(invalid(*cid, "", "a dry run does not judge collection ops"))
        }
        Op::Clone { cid, src, .. } | Op::CloneRange { cid, src, .. } => {
            Err(invalid(*cid, src, "a dry run does not judge clones"))
        }
    }
}

/// Whether the store holds `oid` now (a missing collection is the store's error).
async fn stored<S: ObjectStore + ?Sized>(store: &S, cid: CollectionId, oid: &str) -> Result<bool> {
    match store.stat(cid, oid).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind == StoreErrorKind::ObjectNotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The xattr or omap value `expect` compares, as the store holds it (the object exists).
async fn compared<S: ObjectStore + ?Sized>(
    store: &S,
    cid: CollectionId,
    oid: &str,
    expect: &Expect,
) -> Result<Option<Bytes>> {
    match expect {
        Expect::Absent => Ok(None),
        Expect::Xattr { name, .. } => match store.getattr(cid, oid, name).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind == StoreErrorKind::AttrNotFound => Ok(None),
            Err(e) => Err(e),
        },
        Expect::OmapKey { key, .. } => {
            let mut found = store
                .omap_get_values(cid, oid, std::slice::from_ref(key))
                .await?;
            Ok(found.remove(key))
        }
    }
}
