//! I/O on an open image.

use crate::lock::{HeldLock, LockShare};
use crate::striping::{extents, Extent};
use crate::{data_oid, ignore_missing, ImageInfo, VolumeError};
use bytes::{Bytes, BytesMut};
use carmine_client::{Client, ClientError};
use carmine_proto::{OsdOp, Status};
use carmine_types::PoolId;
use futures::future::try_join_all;
use std::rc::Rc;

/// An open image. Cloning is cheap; all clones share the client's connections and the
/// image's exclusive lock (`None`: opened read-only).
#[derive(Clone)]
pub struct Image {
    client: Client,
    pool: PoolId,
    info: ImageInfo,
    lock: Option<ImageLock>,
}

/// How a writable image handle has the exclusive lock.
#[derive(Clone)]
pub(crate) enum ImageLock {
    /// It took the lock and renews it.
    Held(Rc<HeldLock>),
    /// Another reactor thread of this process holds it for the same client instance.
    Shared(LockShare),
}

impl ImageLock {
    fn check(&self) -> Result<(), VolumeError> {
        match self {
            ImageLock::Held(l) => l.check(),
            ImageLock::Shared(l) => l.check(),
        }
    }

    fn note_fenced(&self) {
        match self {
            ImageLock::Held(l) => l.note_fenced(),
            ImageLock::Shared(l) => l.note_fenced(),
        }
    }
}

impl Image {
    pub(crate) fn new(
        client: Client,
        pool: PoolId,
        info: ImageInfo,
        lock: Option<ImageLock>,
    ) -> Self {
        Self {
            client,
            pool,
            info,
            lock,
        }
    }

    /// False if opened read-only.
    pub fn is_writable(&self) -> bool {
        self.lock.is_some()
    }

    /// Writes go out only while this handle holds the image's exclusive lock.
    fn writable(&self) -> Result<(), VolumeError> {
        match &self.lock {
            Some(lock) => lock.check(),
            None => Err(VolumeError::ReadOnly {
                name: self.info.name.clone(),
            }),
        }
    }

    /// An OSD that answers `Fenced` tells us another client broke our lock.
    fn failed(&self, e: ClientError) -> VolumeError {
        if e.status() == Some(Status::Fenced) {
            if let Some(lock) = &self.lock {
                lock.note_fenced();
                if let Err(lost) = lock.check() {
                    return lost;
                }
            }
        }
        e.into()
    }

    /// The lock record this handle holds (`None`: read-only, lost, or a shared lock held
    /// by another thread): what [`crate::Volumes::release_lock_record`] takes to release it
    /// from another client.
    pub fn lock_record(&self) -> Option<Bytes> {
        let Some(ImageLock::Held(lock)) = &self.lock else {
            return None;
        };
        lock.check().ok()?;
        Some(lock.record())
    }

    /// The lock this handle took, for clients of the same instance on other reactor threads
    /// ([`crate::Volumes::open_shared`]). `None` if it took none (read-only, or itself
    /// opened on a share).
    pub fn lock_share(&self) -> Option<LockShare> {
        match &self.lock {
            Some(ImageLock::Held(lock)) => Some(lock.share()),
            _ => None,
        }
    }

    /// Gives up the exclusive lock (for this handle, all its clones and every handle opened
    /// on its share), so the next opener need not wait for the lease to run out. Dropping an
    /// image without closing it leaves the lock to expire. A handle opened on a share gives
    /// nothing up: its holder does.
    ///
    /// Writes of other threads already past their lock check may still be on their way when
    /// the record goes: a holder with shares fences its own instance first
    /// (`Client::fence`), then releases the record, as `nbd serve` does.
    pub async fn close(self) -> Result<(), VolumeError> {
        match &self.lock {
            Some(ImageLock::Held(lock)) => lock.release().await,
            _ => Ok(()),
        }
    }

    pub fn info(&self) -> &ImageInfo {
        &self.info
    }

    pub fn size(&self) -> u64 {
        self.info.size
    }

    fn check_range(&self, off: u64, len: u64) -> Result<(), VolumeError> {
        match off.checked_add(len) {
            Some(end) if end <= self.info.size => Ok(()),
            _ => Err(VolumeError::OutOfRange {
                off,
                len,
                size: self.info.size,
            }),
        }
    }

    fn oid(&self, e: &Extent) -> String {
        data_oid(&self.info.id, e.objno)
    }

    /// Reads `len` bytes at `off`. Never-written ranges read as zeros.
    pub async fn read(&self, off: u64, len: u64) -> Result<Bytes, VolumeError> {
        self.check_range(off, len)?;
        let pieces: Vec<Extent> = extents(off, len, self.info.object_size).collect();
        if let [e] = pieces[..] {
            // The common small read: hand back the reply buffer itself when it is complete.
            let data = self.read_extent(&e).await?;
            if data.len() as u64 == e.len {
                return Ok(data);
            }
            let mut out = BytesMut::zeroed(len as usize);
            out[..data.len()].copy_from_slice(&data);
            return Ok(out.freeze());
        }
        let parts = try_join_all(pieces.iter().map(|e| self.read_extent(e))).await?;
        let mut out = BytesMut::zeroed(len as usize);
        for (e, data) in pieces.iter().zip(parts) {
            let at = e.buf_off as usize;
            out[at..at + data.len()].copy_from_slice(&data);
        }
        Ok(out.freeze())
    }

    /// One object's share of a read; shorter than asked where the object ends early.
    async fn read_extent(&self, e: &Extent) -> Result<Bytes, VolumeError> {
        let op = OsdOp::Read {
            off: e.obj_off,
            len: e.len as u32,
        };
        match self.client.execute(self.pool, self.oid(e), vec![op]).await {
            Ok(mut outs) => match outs.pop() {
                Some(carmine_proto::OpOutput::Data(d)) if d.len() as u64 <= e.len => Ok(d),
                _ => Err(VolumeError::Client(
                    carmine_client::ClientError::Unexpected {
                        detail: format!("read of {} returned a malformed reply", self.oid(e)),
                    },
                )),
            },
            Err(err) if err.status() == Some(Status::ObjectNotFound) => Ok(Bytes::new()),
            Err(err) => Err(self.failed(err)),
        }
    }

    /// Writes `data` at `off`. Returns once every object the range touches acknowledged.
    pub async fn write(&self, off: u64, data: Bytes) -> Result<(), VolumeError> {
        self.check_range(off, data.len() as u64)?;
        self.writable()?;
        let mut pieces = extents(off, data.len() as u64, self.info.object_size).peekable();
        let first = pieces.next();
        if let (Some(e), None) = (first, pieces.peek()) {
            // The common small write: one object, no join machinery.
            return self
                .client
                .write(self.pool, self.oid(&e), e.obj_off, data)
                .await
                .map_err(|err| self.failed(err));
        }
        try_join_all(first.into_iter().chain(pieces).map(|e| {
            let slice = data.slice(e.buf_off as usize..(e.buf_off + e.len) as usize);
            let oid = self.oid(&e);
            async move { self.client.write(self.pool, &oid, e.obj_off, slice).await }
        }))
        .await
        .map_err(|err| self.failed(err))?;
        Ok(())
    }

    /// Deallocates `[off, off+len)`; it reads as zeros afterwards. Whole objects are removed.
    pub async fn discard(&self, off: u64, len: u64) -> Result<(), VolumeError> {
        self.check_range(off, len)?;
        self.writable()?;
        let object_size = self.info.object_size;
        try_join_all(extents(off, len, object_size).map(|e| async move {
            let oid = self.oid(&e);
            let res = if e.obj_off == 0 && e.len == object_size {
                self.client.remove(self.pool, &oid).await
            } else {
                let op = OsdOp::Zero {
                    off: e.obj_off,
                    len: e.len,
                };
                self.client
                    .execute(self.pool, &oid, vec![op])
                    .await
                    .map(drop)
            };
            match res {
                Err(err) if err.status() == Some(Status::Fenced) => Err(self.failed(err)),
                other => ignore_missing(other),
            }
        }))
        .await?;
        Ok(())
    }

    /// Makes `[off, off+len)` read as zeros. Same as `discard`: zeros are never stored.
    pub async fn write_zeroes(&self, off: u64, len: u64) -> Result<(), VolumeError> {
        self.discard(off, len).await
    }

    /// Every write acknowledged before this call is durable when it returns. Writes are only
    /// acknowledged once the store made them durable, so there is nothing left to wait for;
    /// the call exists so callers state their intent and so a future write-back cache has its
    /// barrier.
    pub async fn flush(&self) -> Result<(), VolumeError> {
        // A flush after the lock was lost must not report success for writes that failed.
        match &self.lock {
            Some(lock) => lock.check(),
            None => Ok(()),
        }
    }
}
