//! Argument checks shared by every backend, so all of them reject the same requests with the
//! same error kinds, in the same order.

use crate::{Expect, Op, Result, StoreError, StoreErrorKind, Transaction};
use bytes::Bytes;
use carmine_types::limits::{
    ATTR_NAME_LEN_MAX, IO_LEN_MAX, LIST_LIMIT_MAX, OBJECT_NAME_LEN_MAX, OBJECT_SIZE_MAX,
    VALUE_LEN_MAX,
};
use carmine_types::CollectionId;

pub fn error(
    kind: StoreErrorKind,
    cid: CollectionId,
    oid: &str,
    detail: impl Into<String>,
) -> StoreError {
    StoreError::new(kind, cid, oid, detail)
}

pub fn invalid(cid: CollectionId, oid: &str, detail: impl Into<String>) -> StoreError {
    error(StoreErrorKind::InvalidArgument, cid, oid, detail)
}

pub fn check_oid(cid: CollectionId, oid: &str) -> Result<()> {
    if oid.is_empty() {
        return Err(invalid(cid, oid, "empty object name"));
    }
    if oid.len() > OBJECT_NAME_LEN_MAX {
        // The error carries a prefix only: the name may be arbitrarily long.
        let prefix: String = oid.chars().take(32).collect();
        let detail = format!(
            "object name of {} bytes exceeds {OBJECT_NAME_LEN_MAX}",
            oid.len()
        );
        return Err(invalid(cid, &prefix, detail));
    }
    Ok(())
}

pub fn check_attr_name(cid: CollectionId, oid: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > ATTR_NAME_LEN_MAX {
        return Err(invalid(
            cid,
            oid,
            format!(
                "xattr name of {} bytes, must be 1..={ATTR_NAME_LEN_MAX}",
                name.len()
            ),
        ));
    }
    Ok(())
}

pub fn check_value(cid: CollectionId, oid: &str, what: &str, len: usize) -> Result<()> {
    if len > VALUE_LEN_MAX {
        return Err(invalid(
            cid,
            oid,
            format!("{what} of {len} bytes exceeds {VALUE_LEN_MAX}"),
        ));
    }
    Ok(())
}

/// `[off, off + len)` must end within the object size limit. Checked with `checked_add` so a
/// hostile offset cannot wrap around into range.
pub fn check_extent(cid: CollectionId, oid: &str, off: u64, len: u64) -> Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= OBJECT_SIZE_MAX => Ok(()),
        _ => Err(invalid(
            cid,
            oid,
            format!("extent {off}+{len} ends past the object size limit {OBJECT_SIZE_MAX}"),
        )),
    }
}

pub fn check_io_len(cid: CollectionId, oid: &str, len: u64) -> Result<()> {
    if len > IO_LEN_MAX as u64 {
        return Err(invalid(
            cid,
            oid,
            format!("{len} bytes in one read or write, more than {IO_LEN_MAX}"),
        ));
    }
    Ok(())
}

pub fn check_list_limit(cid: CollectionId, oid: &str, limit: usize) -> Result<usize> {
    if limit == 0 {
        return Err(invalid(cid, oid, "listing limit of 0"));
    }
    Ok(limit.min(LIST_LIMIT_MAX as usize))
}

/// Compares lead a transaction: one after any other op makes the whole transaction invalid,
/// checked before anything else so every backend refuses it the same way.
pub fn check_compares_lead(txn: &Transaction) -> Result<()> {
    let first_other = txn
        .ops
        .iter()
        .position(|op| !matches!(op, Op::Compare { .. }));
    if let Some(first) = first_other {
        if let Some(Op::Compare { cid, oid, .. }) = txn.ops[first..]
            .iter()
            .find(|op| matches!(op, Op::Compare { .. }))
        {
            return Err(invalid(
                *cid,
                oid,
                "a compare must come before every other op of its transaction",
            ));
        }
    }
    Ok(())
}

/// The arguments of a compare: the same limits as the ops that set what it compares.
pub fn check_expect(cid: CollectionId, oid: &str, expect: &Expect) -> Result<()> {
    check_oid(cid, oid)?;
    match expect {
        Expect::Absent => Ok(()),
        Expect::Xattr { name, value } => {
            check_attr_name(cid, oid, name)?;
            check_value(
                cid,
                oid,
                "xattr value",
                value.as_ref().map_or(0, Bytes::len),
            )
        }
        Expect::OmapKey { key, value } => {
            check_value(cid, oid, "omap key", key.len())?;
            check_value(cid, oid, "omap value", value.as_ref().map_or(0, Bytes::len))
        }
    }
}

/// Judges a compare: `exists` says whether the object is there, `found` is the xattr or omap
/// value it compares (`None` when absent, and always for a missing object).
pub fn judge_expect(
    cid: CollectionId,
    oid: &str,
    expect: &Expect,
    exists: bool,
    found: Option<&Bytes>,
) -> Result<()> {
    let (what, wanted) = match expect {
        Expect::Absent if exists => {
            return Err(error(
                StoreErrorKind::ObjectExists,
                cid,
                oid,
                "object exists",
            ))
        }
        Expect::Absent => return Ok(()),
        Expect::Xattr { name, value } => (format!("xattr {name:?}"), value),
        Expect::OmapKey { key, value } => (format!("omap key {key:?}"), value),
    };
    if found == wanted.as_ref() {
        return Ok(());
    }
    let show = |v: Option<&Bytes>| match v {
        None => "absent".to_string(),
        Some(b) => format!("{} bytes", b.len()),
    };
    Err(error(
        StoreErrorKind::CompareFailed,
        cid,
        oid,
        format!(
            "{what} is {}, expected {}",
            show(found),
            show(wanted.as_ref())
        ),
    ))
}

/// The value a compare looks at, from an object's xattrs and omap.
pub fn compared_value<'a>(
    expect: &Expect,
    attr: impl FnOnce(&str) -> Option<&'a Bytes>,
    omap: impl FnOnce(&[u8]) -> Option<&'a Bytes>,
) -> Option<&'a Bytes> {
    match expect {
        Expect::Absent => None,
        Expect::Xattr { name, .. } => attr(name),
        Expect::OmapKey { key, .. } => omap(key),
    }
}
