use carmine_client::ClientError;
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum VolumeError {
    #[error("no image named {name:?}")]
    NotFound { name: String },
    #[error("an image named {name:?} already exists")]
    Exists { name: String },
    #[error("invalid image name {name:?}: use 1-96 characters of A-Z a-z 0-9 - _ .")]
    InvalidName { name: String },
    #[error("I/O at offset {off} length {len} is beyond the end of the image ({size} bytes)")]
    OutOfRange { off: u64, len: u64, size: u64 },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("image {name:?} is damaged: {detail}")]
    Corrupt { name: String, detail: String },
    /// Another client holds the image's exclusive lock and renews it.
    #[error("image {name:?} is in use: locked by {holder}")]
    Locked { name: String, holder: String },
    /// This image handle lost its exclusive lock (it was broken by another client, or the
    /// image was closed): it must not write any more.
    #[error("image {name:?}: exclusive lock lost ({reason}); writes are refused")]
    LockLost { name: String, reason: String },
    /// A copy made by `Volumes::copy_to` that did not complete (it still runs, or its
    /// copier was stopped): its data may be partial.
    #[error(
        "image {name:?} is an incomplete copy (being copied, or the copy was cut short): \
         remove it and copy again"
    )]
    Incomplete { name: String },
    #[error("image {name:?} was opened read-only")]
    ReadOnly { name: String },
    #[error(transparent)]
    Client(#[from] ClientError),
}
