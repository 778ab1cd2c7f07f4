//! The native store's own errors. At the `ObjectStore` boundary they become a `StoreError`
//! (a kind and a message); inside, callers and tests match on what went wrong, and an I/O
//! failure keeps its `io::Error` and the byte offset it happened at.

use crate::format::FormatError;
use carmine_store::StoreError;
use carmine_types::CollectionId;
use std::io;

/// Why a shard could not be mounted, formatted or checked. Mount writes nothing before it
/// has succeeded, so every one of these leaves the device as it was.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{what} at byte {offset}: {source}")]
    Io {
        what: &'static str,
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("the device has {size} bytes, less than a store's superblock area")]
    DeviceTooSmall { size: u64 },
    #[error("no Carmine native store here (no superblock, no backup)")]
    NotAStore,
    /// A newer format: a reason to stop, never to fall back on the backup copy.
    #[error("superblock: {0}")]
    NewerFormat(#[source] FormatError),
    /// An older format: readable (fsck), but written only once upgraded, so that a build
    /// of that format never meets records it cannot read after a downgrade.
    #[error(
        "the store is in format {found}; this build writes format {}: run `carmine store \
         upgrade --device PATH` first (one-way: builds older than format {} then refuse the \
         store), or keep using the older build",
        crate::FORMAT_VERSION,
        crate::FORMAT_VERSION
    )]
    OlderFormat { found: u32 },
    #[error(
        "superblock damaged ({primary}) and its backup too ({backup}); refusing to touch the \
         device"
    )]
    SuperblockDamaged {
        primary: FormatError,
        backup: FormatError,
    },
    /// The superblock's geometry does not fit the device, or a requested one is impossible.
    #[error("{0}")]
    Layout(String),
    #[error("shard {shard} requested, the store was made with {shards}")]
    NoSuchShard { shard: u32, shards: usize },
    #[error("shard {shard}: no valid checkpoint slot")]
    NoCheckpoint { shard: u32 },
    #[error("checkpoint generation {generation}: {detail}")]
    Checkpoint { generation: u64, detail: String },
    #[error("journal record {record}: {source}")]
    Journal {
        record: u64,
        #[source]
        source: JournalError,
    },
    #[error(
        "journal record {record} is missing or damaged, but later records show records up to \
         {durable_mark} were acknowledged: mounting would silently drop them; refusing (the \
         device is left as it is)"
    )]
    AcknowledgedRecordLost { record: u64, durable_mark: u64 },
    #[error(
        "segment {segment} has a damaged header, yet holds journal records that show records \
         up to {durable_mark} were acknowledged, past record {record} where the journal read \
         ends: mounting would silently drop them; refusing (the device is left as it is)"
    )]
    DamagedSegmentHeader {
        segment: u32,
        record: u64,
        durable_mark: u64,
    },
    #[error("segment {segment} holds {live} live blocks but no journal header ({detail})")]
    LiveBlocksOutsideJournal {
        segment: u32,
        live: u32,
        detail: String,
    },
    /// Mount's own first writes (opening the journal, the post-mount checkpoint, cleaning
    /// back to the reserve).
    #[error("{what}: {source}")]
    Store {
        what: &'static str,
        #[source]
        source: StoreError,
    },
}

/// What is wrong with one journal record's metadata.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{0}")]
    Decode(#[from] carmine_types::DecodeError),
    #[error("{0}")]
    Index(#[from] IndexError),
}

/// A delta that does not fit the index it is applied to: damage at replay, a bug at run
/// time (the shard then stops rather than let memory and disk disagree).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("{what} missing for delta on {cid}/{oid:?}")]
    Missing {
        what: &'static str,
        cid: CollectionId,
        oid: String,
    },
    #[error("removing non-empty collection {0}")]
    CollectionNotEmpty(CollectionId),
    #[error("block {0} outside every segment")]
    OutsideSegments(u64),
    /// The space accounting disagrees with the maps it counts: continuing could hand a
    /// segment with live data to the cleaner as empty.
    #[error("space accounting broken: {0}")]
    Accounting(String),
    /// A change to an object whose body is not in memory: its caller did not make it
    /// resident first (a bug; nothing changed).
    #[error("object {cid}/{oid:?} changed while its body is paged out")]
    PagedOut { cid: CollectionId, oid: String },
}

/// Why a running shard stopped taking work. Kept until it is remounted; every request is
/// answered with an I/O error naming it.
#[derive(Debug, thiserror::Error)]
pub enum ShardFailure {
    #[error("writing journal record {record} at byte {offset}: {source}")]
    JournalWrite {
        record: u64,
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("journal sync: {0}")]
    JournalSync(#[source] io::Error),
    #[error("writing a checkpoint: {0}")]
    Checkpoint(#[source] io::Error),
    #[error("transaction half applied: {0}")]
    HalfApplied(#[source] StoreError),
    #[error("internal: {0}")]
    Internal(&'static str),
    /// The metadata tree and the index disagree (a damaged node, or a bug).
    #[error("metadata: {0}")]
    Metadata(String),
}

/// A device read that did not produce good data.
#[derive(Debug)]
pub(crate) enum BlockReadError {
    Io { offset: u64, source: io::Error },
    Checksum(u64),
}

impl std::fmt::Display for BlockReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockReadError::Io { offset, source } => {
                write!(f, "reading at byte {offset}: {source}")
            }
            BlockReadError::Checksum(paddr) => write!(f, "checksum mismatch in block {paddr}"),
        }
    }
}
