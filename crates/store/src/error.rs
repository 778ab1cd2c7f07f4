use carmine_types::CollectionId;
use thiserror::Error;

/// What went wrong, without the context. Maps one to one onto wire status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    CollectionNotFound,
    CollectionExists,
    CollectionNotEmpty,
    ObjectNotFound,
    AttrNotFound,
    InvalidArgument,
    /// The store (or its memory budget) is full. Reads and deletes keep working.
    NoSpace,
    Io,
    /// Stored data failed its checksum: reported, never returned as data.
    Corrupt,
    /// An `Expect::Absent` compare found the object.
    ObjectExists,
    /// An xattr or omap compare found another value: nothing was changed.
    CompareFailed,
}

/// A store error with the object and operation it concerns.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{kind:?} in collection {cid} object {oid:?}: {detail}")]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub cid: CollectionId,
    pub oid: String,
    pub detail: String,
}

impl StoreError {
    pub fn new(
        kind: StoreErrorKind,
        cid: CollectionId,
        oid: &str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            cid,
            oid: oid.to_owned(),
            detail: detail.into(),
        }
    }
}
