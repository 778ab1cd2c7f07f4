//! The `ObjectStore` interface, modelled on the RADOS ObjectStore, and the in-memory backend.
//!
//! Key decision: the interface is `async` and takes `&self`. A store shard belongs to exactly one
//! reactor thread, so it uses interior mutability (`RefCell`) instead of locks, and its futures
//! are not `Send`. The memory store completes at once; the native store (io_uring) suspends on
//! device I/O. Both pass the same conformance suite (`conformance` feature).
//!
//! Transactions apply wholly or not at all: a failing op leaves the store exactly as before.

pub mod checks;
mod dry_run;
mod error;
mod memory;
mod txn;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
#[cfg(any(test, feature = "conformance"))]
pub mod model;

pub use dry_run::check_applies;
pub use error::{StoreError, StoreErrorKind};
pub use memory::{MemStore, MemStoreConfig};
pub use txn::{Expect, Op, Transaction};

use bytes::Bytes;
use carmine_types::CollectionId;
use std::collections::BTreeMap;

pub type Result<T> = std::result::Result<T, StoreError>;

/// What `stat` reports about one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectStat {
    /// Logical size in bytes: one past the highest byte ever written (or set by truncate).
    pub size: u64,
}

/// Space accounting of one store shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StoreStatfs {
    pub bytes_total: u64,
    pub bytes_used: u64,
    pub objects: u64,
}

/// A number a store keeps about itself, for the OSD's metrics (`carmine_<name>`, per
/// reactor shard).
#[derive(Clone, Debug, PartialEq)]
pub struct StoreCounter {
    /// The metric's name less `carmine_`: `native_checkpoints_total`, say.
    pub name: &'static str,
    /// A gauge (a level now) rather than a counter (a running total).
    pub gauge: bool,
    pub help: &'static str,
    pub value: f64,
}

/// One page of an ordered listing. `next` is where the following page starts (exclusive), or
/// `None` when the listing is complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T, K> {
    pub items: Vec<T>,
    pub next: Option<K>,
}

impl<T, K> Page<T, K> {
    /// The first `limit` items of `iter` (an ordered range that starts after the cursor), with
    /// `next` set to the key of the last one when more remain.
    pub fn take_from(
        mut iter: impl Iterator<Item = T>,
        limit: usize,
        key: impl Fn(&T) -> K,
    ) -> Self {
        let items: Vec<T> = iter.by_ref().take(limit).collect();
        let next = match iter.next() {
            Some(_) => items.last().map(key),
            None => None,
        };
        Page { items, next }
    }
}

/// A store shard. Object names are UTF-8 strings ordered bytewise; omap keys are byte strings.
///
/// Read semantics shared by every backend:
/// - `read(off, len)` returns at most `len` bytes, fewer at end of object, none past it;
///   `len == 0` means "to the end of the object". Holes read as zeros.
/// - A missing collection is `CollectionNotFound`, a missing object `ObjectNotFound`, a missing
///   xattr `AttrNotFound`; omap reads of missing keys simply omit them.
#[allow(async_fn_in_trait)]
pub trait ObjectStore {
    /// True when no call ever suspends (the memory store): a server may then run requests
    /// one after another inline, with no per-request task or buffer.
    const NEVER_SUSPENDS: bool = false;

    /// Applies `txn` atomically. Returns once the transaction is visible to reads and, for a
    /// persistent store, durable.
    async fn submit(&self, txn: Transaction) -> Result<()>;

    async fn read(&self, cid: CollectionId, oid: &str, off: u64, len: u64) -> Result<Bytes>;
    /// `read`, appending the bytes to `out` instead of returning a buffer, so a server can read
    /// straight into its send buffer. Returns the number of bytes appended; on error `out` is
    /// unchanged.
    async fn read_into(
        &self,
        cid: CollectionId,
        oid: &str,
        off: u64,
        len: u64,
        out: &mut bytes::BytesMut,
    ) -> Result<usize> {
        let data = self.read(cid, oid, off, len).await?;
        out.extend_from_slice(&data);
        Ok(data.len())
    }
    /// Several extents of one object in one call; each follows `read`'s rules.
    async fn readv(
        &self,
        cid: CollectionId,
        oid: &str,
        extents: &[(u64, u64)],
    ) -> Result<Vec<Bytes>>;
    async fn stat(&self, cid: CollectionId, oid: &str) -> Result<ObjectStat>;
    async fn getattr(&self, cid: CollectionId, oid: &str, name: &str) -> Result<Bytes>;
    async fn getattrs(&self, cid: CollectionId, oid: &str) -> Result<BTreeMap<String, Bytes>>;
    async fn omap_get_header(&self, cid: CollectionId, oid: &str) -> Result<Bytes>;
    async fn omap_get_values(
        &self,
        cid: CollectionId,
        oid: &str,
        keys: &[Bytes],
    ) -> Result<BTreeMap<Bytes, Bytes>>;
    /// Omap entries with key strictly greater than `start_after` (all when `None`), in key
    /// order, at most `limit` of them.
    async fn omap_iterate(
        &self,
        cid: CollectionId,
        oid: &str,
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page<(Bytes, Bytes), Bytes>>;
    /// Object names strictly greater than `start_after`, in order, at most `limit`.
    async fn list_objects(
        &self,
        cid: CollectionId,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Page<String, String>>;
    async fn list_collections(&self) -> Result<Vec<CollectionId>>;
    async fn collection_exists(&self, cid: CollectionId) -> Result<bool>;
    /// Housekeeping a store wants to run beside the requests (checkpoints, space reclamation),
    /// spawned once per shard on its reactor. Returns when there is nothing (more) to do.
    async fn background(&self) {}
    /// Logs what the store counted about itself (at shutdown).
    fn report(&self) {}
    /// What the store counts about itself, for metrics; the same names every call. Read
    /// about once a second, not per request.
    fn counters(&self) -> Vec<StoreCounter> {
        Vec::new()
    }
    /// Why the store stopped serving (a failed device write or sync), or `None` while it is
    /// healthy. A failed store must not look healthy to anyone: the OSD answers pings with
    /// this error, and every request fails.
    fn failure(&self) -> Option<String> {
        None
    }
    /// Waits until everything submitted before is durable. A no-op for the memory store.
    async fn flush(&self) -> Result<()>;
    fn statfs(&self) -> StoreStatfs;
}
