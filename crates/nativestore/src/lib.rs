//! Carmine's native object store: log-structured, crash-safe, on io_uring and O_DIRECT.
//!
//! A device is split into one partition per reactor shard; each shard is independent. Within
//! a shard everything — data blocks and metadata deltas — is appended to a journal of
//! segments as checksummed records, many transactions per record (group commit). The
//! metadata index lives in memory and is checkpointed now and then into a copy-on-write B+tree
//! whose changed nodes are appended to metadata segments; mount loads the newest checkpoint and
//! replays the records after it. A cleaner moves live blocks out of mostly-dead
//! segments. `ARCHITECTURE.md` and `docs/format/native-store.md` give the full design.

mod apply;
mod cache;
mod checkpoint;
mod delta;
mod device;
mod error;
mod extents;
mod format;
mod fsck;
#[doc(hidden)]
pub mod fuzzing;
mod index;
mod journal;
mod metatree;
mod mount;
mod mount_walk;
mod paging;
mod residency;
mod segments;
mod simdev;
mod space;
mod store;
mod victim;

pub use device::{AlignedBuf, BlockDevice, DeviceLock, FileDevice, SyncMode, BLOCK};
pub use error::{IndexError, JournalError, MountError, ShardFailure};
pub use format::{FormatError, Superblock, FORMAT_VERSION, SUPER_BACKUP_OFFSET};
pub use fsck::{fsck, fsck_with, FsckReport};
pub use mount::{
    mkfs, read_superblock, read_superblock_copies, upgrade, MountReport, SuperblockCopies,
};
pub use simdev::{yield_once, CrashImage, SimDevice};
pub use store::{NativeConfig, NativeStats, NativeStore, CLEANER_BUSY_RATE_DEFAULT};

/// Default segment size: large enough for the biggest single write (16 MiB) with its record.
pub const DEFAULT_SEGMENT_SIZE: u32 = 32 << 20;
