//! Block volumes ("images") striped over objects, like librbd.
//!
//! Layout in a pool (see docs/format/volume.md):
//! - `carmine_directory`: omap `name_<image name>` → image id;
//! - `carmine_header.<id>`: xattr `image` holding the versioned, checksummed image header
//!   (size, object size, features, name), and xattr `lock`, the exclusive lock (see [`lock`]);
//! - `carmine_data.<id>.<object number, 16 hex digits>`: the data, object `n` holding bytes
//!   `[n × object_size, (n+1) × object_size)`. Objects are created on first write, so unwritten
//!   ranges cost nothing and read as zeros.
//!
//! An I/O spanning several objects is split and issued to all of them concurrently.
//!
//! Every change of the directory or a header is a compare-and-set (a `CmpOmap`/`CmpXattr`
//! guard in the same request), so racing creates, removals and resizes never interleave.

mod copy;
mod error;
mod header;
#[doc(hidden)]
pub mod fuzzing {
    //! Entry points for the fuzz targets in `fuzz/`; not a supported API.
    use crate::{ImageInfo, VolumeError};

    /// Decodes an image header as `Volumes::info` does, from the bytes of its xattr.
    pub fn decode_header(raw: &[u8]) -> Result<ImageInfo, VolumeError> {
        ImageInfo::decode("fuzz", bytes::Bytes::copy_from_slice(raw))
    }

    /// The bytes `Volumes::create` and `resize` store for `info`.
    pub fn encode_header(info: &ImageInfo) -> bytes::Bytes {
        info.encode()
    }

    /// Decodes an image lock record as a contender or `lock show` does.
    pub fn decode_lock(raw: &[u8]) -> Result<crate::LockInfo, VolumeError> {
        crate::LockInfo::decode("fuzz", &bytes::Bytes::copy_from_slice(raw))
    }

    /// The bytes a lock holder stores for `info`.
    pub fn encode_lock(info: &crate::LockInfo) -> bytes::Bytes {
        info.encode()
    }
}
mod image;
pub mod lock;
mod striping;

pub use copy::Copied;
pub use error::VolumeError;
pub use header::{
    ImageInfo, FEATURE_INCOMPLETE, OBJECT_SIZE_DEFAULT, OBJECT_SIZE_MAX, OBJECT_SIZE_MIN,
};
pub use image::Image;
use image::ImageLock;
pub use lock::{LockInfo, LockOptions, LockShare};

use bytes::Bytes;
use carmine_client::Client;
use carmine_proto::{OpOutput, OsdOp, Status};
use carmine_types::PoolId;
use futures::stream::{self, StreamExt, TryStreamExt};

pub const DIRECTORY_OID: &str = "carmine_directory";
const DIRECTORY_KEY_PREFIX: &str = "name_";
const HEADER_XATTR: &str = "image";
/// Directory keys of removals under way: `trash_<id>` → name. See [`Volumes::remove`].
const TRASH_KEY_PREFIX: &str = "trash_";
/// Objects removed concurrently when an image shrinks or is deleted.
const REMOVE_CONCURRENCY: usize = 32;
pub const IMAGE_NAME_LEN_MAX: usize = 96;

pub(crate) fn header_oid(id: &str) -> String {
    format!("carmine_header.{id}")
}

pub(crate) fn data_oid(id: &str, objno: u64) -> String {
    // By hand: this runs for every I/O, and `format!` with padding costs several times more.
    const PREFIX: &str = "carmine_data.";
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut oid = String::with_capacity(PREFIX.len() + id.len() + 17);
    oid.push_str(PREFIX);
    oid.push_str(id);
    oid.push('.');
    for nibble in (0..16).rev() {
        oid.push(HEX[(objno >> (nibble * 4)) as usize & 0xf] as char);
    }
    oid
}

/// The images of one pool.
#[derive(Clone)]
pub struct Volumes {
    client: Client,
    pool: PoolId,
}

fn directory_key(name: &str) -> Bytes {
    Bytes::from(format!("{DIRECTORY_KEY_PREFIX}{name}"))
}

fn validate_name(name: &str) -> Result<(), VolumeError> {
    let ok = !name.is_empty()
        && name.len() <= IMAGE_NAME_LEN_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(VolumeError::InvalidName { name: name.into() })
    }
}

impl Volumes {
    pub fn new(client: Client, pool: PoolId) -> Self {
        Self { client, pool }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn lookup_id(&self, name: &str) -> Result<String, VolumeError> {
        validate_name(name)?;
        let key = directory_key(name);
        let res = self
            .client
            .execute(
                self.pool,
                DIRECTORY_OID,
                vec![OsdOp::OmapGetVals { keys: vec![key] }],
            )
            .await;
        let outputs = match res {
            Err(e) if e.status() == Some(Status::ObjectNotFound) => vec![],
            other => other?,
        };
        match outputs.into_iter().next() {
            Some(OpOutput::Omap { entries, .. }) if !entries.is_empty() => {
                String::from_utf8(entries[0].1.to_vec()).map_err(|_| VolumeError::Corrupt {
                    name: name.into(),
                    detail: "directory entry is not UTF-8".into(),
                })
            }
            _ => Err(VolumeError::NotFound { name: name.into() }),
        }
    }

    /// Creates an image of `size` bytes. `object_size` defaults to 4 MiB.
    pub async fn create(
        &self,
        name: &str,
        size: u64,
        object_size: Option<u64>,
    ) -> Result<ImageInfo, VolumeError> {
        self.create_with(name, size, object_size, 0).await
    }

    /// [`Volumes::create`] with feature bits.
    pub(crate) async fn create_with(
        &self,
        name: &str,
        size: u64,
        object_size: Option<u64>,
        features: u64,
    ) -> Result<ImageInfo, VolumeError> {
        validate_name(name)?;
        let mut info = ImageInfo::new(
            name,
            random_id(),
            size,
            object_size.unwrap_or(OBJECT_SIZE_DEFAULT),
        )?;
        info.features = features;
        match self.lookup_id(name).await {
            Ok(_) => return Err(VolumeError::Exists { name: name.into() }),
            Err(VolumeError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        // Header first, directory entry last: a crash in between leaves an unlisted header,
        // never a listed image without one.
        let ops = vec![
            OsdOp::Create { exclusive: true },
            OsdOp::SetXattr {
                name: HEADER_XATTR.into(),
                value: info.encode(),
            },
        ];
        let header = header_oid(&info.id);
        self.client.execute(self.pool, &header, ops).await?;
        // The name is claimed only if still free: of two racing creates, one wins.
        let key = directory_key(name);
        let claim = vec![
            OsdOp::CmpOmap {
                key: key.clone(),
                value: None,
            },
            OsdOp::OmapSet {
                kvs: vec![(key, Bytes::from(info.id.clone()))],
            },
        ];
        match self.client.execute(self.pool, DIRECTORY_OID, claim).await {
            Ok(_) => Ok(info),
            Err(e) if e.status() == Some(Status::CompareFailed) => {
                if let Err(e) = ignore_missing(self.client.remove(self.pool, &header).await) {
                    tracing::warn!("removing the header of a create that lost a race: {e}");
                }
                Err(VolumeError::Exists { name: name.into() })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Image names in order.
    pub async fn list(&self) -> Result<Vec<String>, VolumeError> {
        Ok(self
            .directory_keys()
            .await?
            .into_iter()
            .filter_map(|k| k.strip_prefix(DIRECTORY_KEY_PREFIX).map(str::to_owned))
            .collect())
    }

    /// Every key of the directory object, in order.
    async fn directory_keys(&self) -> Result<Vec<String>, VolumeError> {
        let mut keys = Vec::new();
        let mut start_after: Option<Bytes> = None;
        loop {
            let op = OsdOp::OmapList {
                start_after: start_after.clone(),
                limit: 1024,
            };
            let outputs = match self
                .client
                .execute(self.pool, DIRECTORY_OID, vec![op])
                .await
            {
                Err(e) if e.status() == Some(Status::ObjectNotFound) => return Ok(keys),
                other => other?,
            };
            let Some(OpOutput::Omap { entries, more }) = outputs.into_iter().next() else {
                return Err(VolumeError::Client(
                    carmine_client::ClientError::Unexpected {
                        detail: "directory listing returned no entries".into(),
                    },
                ));
            };
            start_after = entries.last().map(|(k, _)| k.clone());
            keys.extend(
                entries
                    .into_iter()
                    .filter_map(|(k, _)| String::from_utf8(k.to_vec()).ok()),
            );
            if !more || start_after.is_none() {
                return Ok(keys);
            }
        }
    }

    pub async fn info(&self, name: &str) -> Result<ImageInfo, VolumeError> {
        let id = self.lookup_id(name).await?;
        self.read_header(name, &id).await
    }

    async fn read_header(&self, name: &str, id: &str) -> Result<ImageInfo, VolumeError> {
        let out = self
            .client
            .execute(
                self.pool,
                &header_oid(id),
                vec![OsdOp::GetXattr {
                    name: HEADER_XATTR.into(),
                }],
            )
            .await
            .map_err(|e| match e.status() {
                Some(Status::ObjectNotFound | Status::AttrNotFound) => VolumeError::Corrupt {
                    name: name.into(),
                    detail: format!("header of image id {id} is missing"),
                },
                _ => e.into(),
            })?;
        match out.into_iter().next() {
            Some(OpOutput::Value(v)) => ImageInfo::decode(name, v),
            _ => Err(VolumeError::Corrupt {
                name: name.into(),
                detail: "header read returned no value".into(),
            }),
        }
    }

    /// Who holds the image's exclusive lock, if anyone.
    pub async fn lock_holder(&self, name: &str) -> Result<Option<LockInfo>, VolumeError> {
        let id = self.lookup_id(name).await?;
        Ok(
            lock::read_lock(&self.client, self.pool, name, &header_oid(&id))
                .await?
                .map(|(_, info)| info),
        )
    }

    /// Breaks the image's lock at once, whoever holds it: fences the holder on every OSD,
    /// then removes the record. For an operator who knows the holder is gone, or whose lock
    /// record is damaged. Returns the holder, if the record was readable.
    pub async fn break_lock(&self, name: &str) -> Result<Option<LockInfo>, VolumeError> {
        let id = self.lookup_id(name).await?;
        let header = header_oid(&id);
        let (expect, info) = match lock::read_lock(&self.client, self.pool, name, &header).await {
            Ok(None) => return Ok(None),
            Ok(Some((raw, info))) => {
                self.client.fence(info.owner).await?;
                (raw, Some(info))
            }
            // Unreadable: nobody can be fenced by it, so nobody can use it either.
            Err(VolumeError::Corrupt { .. }) => {
                let out = self
                    .client
                    .execute(
                        self.pool,
                        &header,
                        vec![OsdOp::GetXattr {
                            name: lock::LOCK_XATTR.into(),
                        }],
                    )
                    .await?;
                let Some(OpOutput::Value(raw)) = out.into_iter().next() else {
                    return Ok(None);
                };
                (raw, None)
            }
            Err(e) => return Err(e),
        };
        let ops = vec![
            OsdOp::CmpXattr {
                name: lock::LOCK_XATTR.into(),
                value: Some(expect),
            },
            OsdOp::RmXattr {
                name: lock::LOCK_XATTR.into(),
            },
        ];
        match self.client.execute(self.pool, &header, ops).await {
            Ok(_) => Ok(info),
            Err(e) if e.status() == Some(Status::CompareFailed) => Err(VolumeError::Locked {
                name: name.into(),
                holder: "a new holder that took it meanwhile; run again to break that one".into(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens an image for reading and writing, taking its exclusive lock with the default
    /// lease. Fails with [`VolumeError::Locked`] while another client holds and renews it;
    /// a lock whose holder stopped renewing is broken (that holder fenced) after one lease.
    pub async fn open(&self, name: &str) -> Result<Image, VolumeError> {
        self.open_with(name, &LockOptions::default()).await
    }

    pub async fn open_with(&self, name: &str, opts: &LockOptions) -> Result<Image, VolumeError> {
        self.open_locked(name, opts, false).await
    }

    /// [`Volumes::open_with`]; an incomplete copy is refused unless `copying` (its copier).
    pub(crate) async fn open_locked(
        &self,
        name: &str,
        opts: &LockOptions,
        copying: bool,
    ) -> Result<Image, VolumeError> {
        let id = self.lookup_id(name).await?;
        // Refused before the lock is waited for: a copier killed half way holds it for a
        // lease still.
        if !copying {
            self.read_header(name, &id).await?.check_usable()?;
        }
        let record = lock::acquire(&self.client, self.pool, name, &id, opts).await?;
        let held = lock::hold(
            self.client.clone(),
            self.pool,
            name,
            &id,
            record,
            opts.lease,
        );
        // Read after locking: the size cannot change under us from here on.
        let usable = self
            .read_header(name, &id)
            .await
            .and_then(|info| match copying {
                true => Ok(info),
                false => info.check_usable().map(|()| info),
            });
        match usable {
            Ok(info) => Ok(Image::new(
                self.client.clone(),
                self.pool,
                info,
                Some(ImageLock::Held(held)),
            )),
            Err(e) => {
                let _ = held.release().await;
                Err(e)
            }
        }
    }

    /// Opens an image for reading and writing under a lock that a handle on another reactor
    /// thread of this process holds ([`Image::lock_share`]). This client must speak as the
    /// lock's instance (`ClientConfig::instance`): then a fence of the holder shuts it out
    /// too, and it stops writing when the holder loses or releases the lock.
    pub async fn open_shared(&self, name: &str, share: LockShare) -> Result<Image, VolumeError> {
        if self.client.instance() != share.owner || name != share.image {
            return Err(VolumeError::InvalidArgument(format!(
                "a share of the lock of {:?} held by client instance {:#x} was offered to \
                 client instance {:#x} opening {name:?}",
                share.image,
                share.owner,
                self.client.instance()
            )));
        }
        share.check()?;
        let info = self.complete_info(name).await?;
        Ok(Image::new(
            self.client.clone(),
            self.pool,
            info,
            Some(ImageLock::Shared(share)),
        ))
    }

    /// Opens an image for reading only, without its lock: writes are refused.
    pub async fn open_read_only(&self, name: &str) -> Result<Image, VolumeError> {
        Ok(Image::new(
            self.client.clone(),
            self.pool,
            self.complete_info(name).await?,
            None,
        ))
    }

    /// The image's header, refused if it is an incomplete copy (its data may be partial).
    async fn complete_info(&self, name: &str) -> Result<ImageInfo, VolumeError> {
        let info = self.info(name).await?;
        info.check_usable()?;
        Ok(info)
    }

    /// Takes the lock for an administrative change (resize, remove), unless this client
    /// instance holds it already (then the change is its own business). Returns the record
    /// written, to guard the change and to release after it.
    async fn admin_lock(&self, name: &str, id: &str) -> Result<Option<Bytes>, VolumeError> {
        let held = lock::read_lock(&self.client, self.pool, name, &header_oid(id)).await?;
        if matches!(&held, Some((_, info)) if info.owner == self.client.instance()) {
            return Ok(None);
        }
        let opts = LockOptions::default();
        Ok(Some(
            lock::acquire(&self.client, self.pool, name, id, &opts).await?,
        ))
    }

    /// Releases a lock taken by `admin_lock`, after a failed change.
    async fn admin_unlock(&self, id: &str, record: Option<Bytes>) {
        let Some(record) = record else { return };
        if let Err(e) = self.remove_lock_record(id, record).await {
            tracing::warn!("releasing the image lock: {e}");
        }
    }

    /// Removes image `name`'s lock if it still is `record` (`Image::lock_record`), on behalf
    /// of its holder. For a holder that fenced itself first, so that none of its requests
    /// still on the way can land after the next holder's (how `nbd serve` stops). False if
    /// the lock had changed meanwhile.
    pub async fn release_lock_record(
        &self,
        name: &str,
        record: Bytes,
    ) -> Result<bool, VolumeError> {
        let id = self.lookup_id(name).await?;
        self.remove_lock_record(&id, record).await
    }

    async fn remove_lock_record(&self, id: &str, record: Bytes) -> Result<bool, VolumeError> {
        let ops = vec![
            OsdOp::CmpXattr {
                name: lock::LOCK_XATTR.into(),
                value: Some(record),
            },
            OsdOp::RmXattr {
                name: lock::LOCK_XATTR.into(),
            },
        ];
        match self.client.execute(self.pool, &header_oid(id), ops).await {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(Status::CompareFailed) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Changes the size. Shrinking discards the data beyond the new end, so growing again
    /// later reads zeros there.
    /// Refused while another client holds the image's lock.
    pub async fn resize(&self, name: &str, new_size: u64) -> Result<ImageInfo, VolumeError> {
        let id = self.lookup_id(name).await?;
        // Refused before the lock is waited for (see `open_locked`); checked again under it.
        self.read_header(name, &id).await?.check_usable()?;
        let record = self.admin_lock(name, &id).await?;
        let res = self
            .resize_locked(name, &id, new_size, record.clone())
            .await;
        if res.is_err() {
            self.admin_unlock(&id, record).await;
        }
        res
    }

    async fn resize_locked(
        &self,
        name: &str,
        id: &str,
        new_size: u64,
        record: Option<Bytes>,
    ) -> Result<ImageInfo, VolumeError> {
        let old = self.read_header(name, id).await?;
        // A partial copy stays one: a resize must not make it look complete.
        old.check_usable()?;
        let mut new = ImageInfo::new(name, old.id.clone(), new_size, old.object_size)?;
        new.features = old.features;
        if new_size < old.size {
            // Zero the tail of the last kept object, remove the objects wholly past the end.
            let keep = new_size.div_ceil(old.object_size);
            if !new_size.is_multiple_of(old.object_size) {
                let objno = new_size / old.object_size;
                let op = OsdOp::Truncate {
                    size: new_size % old.object_size,
                };
                ignore_missing(
                    self.client
                        .execute(self.pool, &data_oid(&old.id, objno), vec![op])
                        .await
                        .map(drop),
                )?;
            }
            self.remove_objects(&old.id, keep..old.object_count())
                .await?;
        }
        self.replace_header(name, id, &old, new, record, "resize")
            .await
    }

    /// Replaces header `old` by `new` and releases the admin lock `record` (if taken), only
    /// if both are still as the caller left them.
    async fn replace_header(
        &self,
        name: &str,
        id: &str,
        old: &ImageInfo,
        new: ImageInfo,
        record: Option<Bytes>,
        what: &str,
    ) -> Result<ImageInfo, VolumeError> {
        let mut ops = Vec::with_capacity(4);
        if let Some(record) = &record {
            ops.push(OsdOp::CmpXattr {
                name: lock::LOCK_XATTR.into(),
                value: Some(record.clone()),
            });
        }
        ops.push(OsdOp::CmpXattr {
            name: HEADER_XATTR.into(),
            value: Some(old.encode()),
        });
        ops.push(OsdOp::SetXattr {
            name: HEADER_XATTR.into(),
            value: new.encode(),
        });
        if record.is_some() {
            ops.push(OsdOp::RmXattr {
                name: lock::LOCK_XATTR.into(),
            });
        }
        match self.client.execute(self.pool, &header_oid(id), ops).await {
            Ok(_) => Ok(new),
            Err(e) if e.status() == Some(Status::CompareFailed) => Err(VolumeError::LockLost {
                name: name.into(),
                reason: format!("the lock or the header changed during the {what}"),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Marks the copy `name` (image `id`, closed by its copier) complete: it may be opened.
    pub(crate) async fn finish_copy(&self, name: &str, id: &str) -> Result<(), VolumeError> {
        let record = self.admin_lock(name, id).await?;
        let res = async {
            let old = self.read_header(name, id).await?;
            let mut new = old.clone();
            new.features &= !FEATURE_INCOMPLETE;
            self.replace_header(name, id, &old, new, record.clone(), "copy")
                .await
        }
        .await;
        if res.is_err() {
            self.admin_unlock(id, record).await;
        }
        res.map(drop)
    }

    /// Removes an image and all its data, crash-safely: one directory transaction swaps the
    /// name's entry for a trash entry (the image disappears whole: never a listed image with
    /// data missing), then the data objects go, then the header (it says how many objects to
    /// look for, so it goes last), then the trash entry. A removal cut short by a crash is
    /// finished by the next `remove` or by [`Volumes::purge_trash`]; until then its objects
    /// only take space.
    ///
    /// Refused while another client holds the image's lock.
    pub async fn remove(&self, name: &str) -> Result<(), VolumeError> {
        let id = self.lookup_id(name).await?;
        let record = self.admin_lock(name, &id).await?;
        if let Err(e) = self.begin_remove(name, &id).await {
            self.admin_unlock(&id, record).await;
            return Err(e);
        }
        self.purge(&id).await?;
        // Removals an earlier crash cut short: finished now, best effort.
        if let Err(e) = self.purge_trash().await {
            tracing::warn!("finishing earlier removals: {e}");
        }
        Ok(())
    }

    /// The first, atomic step of [`Volumes::remove`]: the name goes, a trash entry comes,
    /// if the name still names image `id`.
    #[doc(hidden)]
    pub async fn begin_remove(&self, name: &str, id: &str) -> Result<(), VolumeError> {
        let key = directory_key(name);
        let trash = (
            Bytes::from(format!("{TRASH_KEY_PREFIX}{id}")),
            Bytes::from(name.to_owned()),
        );
        let ops = vec![
            OsdOp::CmpOmap {
                key: key.clone(),
                value: Some(Bytes::from(id.to_owned())),
            },
            OsdOp::OmapRm { keys: vec![key] },
            OsdOp::OmapSet { kvs: vec![trash] },
        ];
        match self.client.execute(self.pool, DIRECTORY_OID, ops).await {
            Ok(_) => Ok(()),
            // Removed (or removed and created again) by someone else meanwhile.
            Err(e) if e.status() == Some(Status::CompareFailed) => {
                Err(VolumeError::NotFound { name: name.into() })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Removes what is left of image `id` (data, header), then its trash entry.
    async fn purge(&self, id: &str) -> Result<(), VolumeError> {
        let header = self
            .client
            .execute(
                self.pool,
                &header_oid(id),
                vec![OsdOp::GetXattr {
                    name: HEADER_XATTR.into(),
                }],
            )
            .await;
        match header {
            Ok(outputs) => {
                let Some(OpOutput::Value(raw)) = outputs.into_iter().next() else {
                    return Err(VolumeError::Corrupt {
                        name: id.into(),
                        detail: "the header xattr read returned no value".into(),
                    });
                };
                let info = ImageInfo::decode(id, raw)?;
                self.remove_objects(id, 0..info.object_count()).await?;
                ignore_missing(self.client.remove(self.pool, &header_oid(id)).await)?;
            }
            // The header goes last: without it, the data is gone already.
            Err(e)
                if matches!(
                    e.status(),
                    Some(Status::ObjectNotFound | Status::AttrNotFound)
                ) => {}
            Err(e) => return Err(e.into()),
        }
        let key = Bytes::from(format!("{TRASH_KEY_PREFIX}{id}"));
        self.client
            .execute(
                self.pool,
                DIRECTORY_OID,
                vec![OsdOp::OmapRm { keys: vec![key] }],
            )
            .await?;
        Ok(())
    }

    /// Finishes every removal a crash cut short; returns how many there were.
    pub async fn purge_trash(&self) -> Result<usize, VolumeError> {
        let ids: Vec<String> = self
            .directory_keys()
            .await?
            .into_iter()
            .filter_map(|k| k.strip_prefix(TRASH_KEY_PREFIX).map(str::to_owned))
            .collect();
        // One that cannot be purged now does not hold up the others.
        let mut first_error = None;
        for id in &ids {
            if let Err(e) = self.purge(id).await {
                tracing::warn!("purging removed image {id}: {e}");
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(ids.len()),
        }
    }

    async fn remove_objects(
        &self,
        id: &str,
        objnos: std::ops::Range<u64>,
    ) -> Result<(), VolumeError> {
        stream::iter(objnos)
            .map(|n| async move {
                ignore_missing(self.client.remove(self.pool, &data_oid(id, n)).await)
            })
            .buffer_unordered(REMOVE_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }
}

/// Treats "object not found" as success: data objects exist only where data was written.
pub(crate) fn ignore_missing(
    res: Result<(), carmine_client::ClientError>,
) -> Result<(), VolumeError> {
    match res {
        Err(e) if e.status() == Some(Status::ObjectNotFound) => Ok(()),
        other => Ok(other?),
    }
}

fn random_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    #[test]
    fn data_object_names_keep_their_format() {
        // Objects already stored are found by these names: the hand-written formatter must
        // produce exactly what `format!` did.
        for (id, n) in [
            ("0123abcd", 0u64),
            ("x", 0xdead_beef),
            ("id", u64::MAX),
            ("", 17),
        ] {
            assert_eq!(
                super::data_oid(id, n),
                format!("carmine_data.{id}.{n:016x}")
            );
        }
    }
}
