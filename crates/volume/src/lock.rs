//! The exclusive image lock: one writer per image, with a lease and fencing (as RBD's
//! exclusive-lock feature does with its OSD blocklist).
//!
//! The lock is the `lock` xattr of the image's header object, naming the holding client
//! instance. It is only ever changed by compare-and-set (a `CmpXattr` guard in the same request),
//! so two openers never both believe they hold it. The holder renews it (bumps `renewals`)
//! every third of its lease. A contender that finds it held watches it for a whole lease of
//! its own clock: a live holder renews within that time and the contender is refused; a
//! record that did not change belongs to a holder that died or hangs, so the contender
//! *fences* that client instance on every OSD reactor (`Client::fence`) and only then takes the
//! lock. Safety does not rest on clocks: whatever the old holder still sends after the fence is
//! refused by the OSDs, and the fence waited for its requests already being applied.
//!
//! A holder learns it lost the lock when a renewal finds another owner, or when an OSD
//! answers `Fenced`; from then on every write of its [`crate::Image`] fails.

use crate::{header_oid, VolumeError};
use bytes::{Bytes, BytesMut};
use carmine_client::Client;
use carmine_proto::{OpOutput, OsdOp, Status};
use carmine_types::{crc32c, Decoder, Encoder, PoolId};
use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) const LOCK_XATTR: &str = "lock";
const LOCK_MAGIC: u32 = u32::from_le_bytes(*b"CLCK");
const LOCK_VERSION: u16 = 1;
/// How long a lock outlives its last renewal before a contender may break it.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(10);
const LEASE_MIN: Duration = Duration::from_millis(100);
const LEASE_MAX: Duration = Duration::from_secs(3600);
/// Contention rounds before `acquire` gives up (each one is a failed compare-and-set).
const ACQUIRE_ROUNDS_MAX: usize = 16;

/// Who holds an image's lock, as recorded in its header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The holding client instance (`Client::instance`): what a breaker fences.
    pub owner: u64,
    /// Bumped by every renewal: a contender sees a live holder by this changing.
    pub renewals: u64,
    pub lease: Duration,
    /// Free text naming the holder for operators: program, host, pid.
    pub holder: String,
}

impl LockInfo {
    pub(crate) fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        Encoder::new(&mut out)
            .u32(LOCK_MAGIC)
            .u16(LOCK_VERSION)
            .u64(self.owner)
            .u64(self.renewals)
            .u64(self.lease.as_millis() as u64)
            .str(&self.holder);
        let crc = crc32c(&out);
        Encoder::new(&mut out).u32(crc);
        out.freeze()
    }

    pub(crate) fn decode(image: &str, raw: &Bytes) -> Result<Self, VolumeError> {
        let corrupt = |detail: String| VolumeError::Corrupt {
            name: image.into(),
            detail: format!("lock record: {detail} (`carmine volume lock break` removes it)"),
        };
        if raw.len() < 4 {
            return Err(corrupt("too short".into()));
        }
        let body = raw.len() - 4;
        let stored = u32::from_le_bytes(raw[body..].try_into().expect("4 bytes"));
        if crc32c(&raw[..body]) != stored {
            return Err(corrupt("checksum mismatch".into()));
        }
        let mut d = Decoder::new(raw.slice(..body));
        let parse = |d: &mut Decoder| -> Result<LockInfo, carmine_types::DecodeError> {
            let magic = d.u32("magic")?;
            let version = d.u16("version")?;
            if magic != LOCK_MAGIC || version != LOCK_VERSION {
                return Err(carmine_types::DecodeError::Invalid {
                    what: "lock magic/version",
                    found: version as u64,
                });
            }
            let owner = d.u64("owner")?;
            let renewals = d.u64("renewals")?;
            let lease_ms = d.u64("lease")?;
            let holder = d.string("holder", 256)?;
            d.finish("lock record")?;
            Ok(LockInfo {
                owner,
                renewals,
                lease: Duration::from_millis(lease_ms),
                holder,
            })
        };
        let info = parse(&mut d).map_err(|e| corrupt(e.to_string()))?;
        if !(LEASE_MIN..=LEASE_MAX).contains(&info.lease) {
            return Err(corrupt(format!("lease {:?} out of range", info.lease)));
        }
        Ok(info)
    }
}

/// How an image is locked when opened for writing.
#[derive(Clone, Debug)]
pub struct LockOptions {
    pub lease: Duration,
    /// Shown to operators and to refused contenders.
    pub holder: String,
}

impl Default for LockOptions {
    fn default() -> Self {
        let program = std::env::args()
            .next()
            .and_then(|p| {
                std::path::Path::new(&p)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "carmine".into());
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "?".into());
        LockOptions {
            lease: LEASE_DEFAULT,
            holder: format!("{program} pid {} on {host}", std::process::id()),
        }
    }
}

/// Whether a lock held by this process still is, shared by the handle that holds it and
/// renews it and the [`LockShare`]s of other reactor threads writing under it: whichever of
/// them learns the lock is lost (a renewal finds another owner, an OSD answers `Fenced`)
/// stops them all. Read with one atomic load per write.
#[derive(Debug, Default)]
struct LockState {
    /// Set once the lock is lost or released: `reason` says which.
    gone: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl LockState {
    fn check(&self, image: &str) -> Result<(), VolumeError> {
        if !self.gone.load(Ordering::Acquire) {
            return Ok(());
        }
        let reason = self
            .reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Err(VolumeError::LockLost {
            name: image.into(),
            reason: reason.unwrap_or_default(),
        })
    }

    /// Marks the lock gone for `reason`, unless it already was. True if this call did.
    fn end(&self, reason: impl FnOnce() -> String) -> bool {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_some() {
            return false;
        }
        *r = Some(reason());
        self.gone.store(true, Ordering::Release);
        true
    }

    fn note_fenced(&self) {
        self.end(|| "this client was fenced by one that broke the lock".into());
    }
}

/// A handle on a lock another thread of this process holds (see [`crate::Image::lock_share`]),
/// for a client of the same instance on another reactor thread: it writes under the lock
/// without renewing it, and stops when the holder loses or releases it.
#[derive(Clone, Debug)]
pub struct LockShare {
    pub(crate) owner: u64,
    pub(crate) image: String,
    state: Arc<LockState>,
}

impl LockShare {
    /// The client instance holding the lock: a client that writes under it must speak as
    /// that instance (`ClientConfig::instance`), so that a fence shuts it out too.
    pub fn owner(&self) -> u64 {
        self.owner
    }

    pub(crate) fn check(&self) -> Result<(), VolumeError> {
        self.state.check(&self.image)
    }

    pub(crate) fn note_fenced(&self) {
        self.state.note_fenced()
    }
}

/// The lock as this process holds it.
pub(crate) struct HeldLock {
    client: Client,
    pool: PoolId,
    image: String,
    header: String,
    /// The record last written by us (or by another opener of this same client instance).
    current: RefCell<Bytes>,
    state: Arc<LockState>,
    /// Renewals and the release, one at a time: a release that read `current` while a
    /// renewal was on its way compared against the record that renewal replaced, was refused,
    /// and left the lock held until its lease ran out.
    turn: carmine_reactor::FifoLock,
}

impl HeldLock {
    /// `Err` once the lock was lost or released: writes must not be sent.
    pub fn check(&self) -> Result<(), VolumeError> {
        self.state.check(&self.image)
    }

    pub fn record(&self) -> Bytes {
        self.current.borrow().clone()
    }

    /// Records that an OSD refused us as fenced: the lock was broken.
    pub fn note_fenced(&self) {
        self.state.note_fenced()
    }

    /// For a client of this same instance on another reactor thread.
    pub fn share(&self) -> LockShare {
        LockShare {
            owner: self.client.instance(),
            image: self.image.clone(),
            state: self.state.clone(),
        }
    }

    /// Gives the lock up, if it is still ours.
    pub async fn release(&self) -> Result<(), VolumeError> {
        if !self.state.end(|| "the image was closed".into()) {
            return Ok(());
        }
        let _turn = self.turn.lock().await;
        let current = self.current.borrow().clone();
        let ops = vec![
            OsdOp::CmpXattr {
                name: LOCK_XATTR.into(),
                value: Some(current),
            },
            OsdOp::RmXattr {
                name: LOCK_XATTR.into(),
            },
        ];
        match self.client.execute(self.pool, &self.header, ops).await {
            Ok(_) => Ok(()),
            // Renewed by another opener of this client, or taken: not ours to remove.
            Err(e) if e.status() == Some(Status::CompareFailed) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// One renewal: bumps the counter by compare-and-set.
    async fn renew(&self) {
        let _turn = self.turn.lock().await;
        if self.check().is_err() {
            // Released (or lost) while this renewal waited for its turn.
            return;
        }
        let current = self.current.borrow().clone();
        let Ok(mut info) = LockInfo::decode(&self.image, &current) else {
            unreachable!("we encoded it")
        };
        info.renewals += 1;
        let next = info.encode();
        let ops = vec![
            OsdOp::CmpXattr {
                name: LOCK_XATTR.into(),
                value: Some(current),
            },
            OsdOp::SetXattr {
                name: LOCK_XATTR.into(),
                value: next.clone(),
            },
        ];
        match self.client.execute(self.pool, &self.header, ops).await {
            Ok(_) => *self.current.borrow_mut() = next,
            Err(e) if e.status() == Some(Status::CompareFailed) => {
                match read_lock(&self.client, self.pool, &self.image, &self.header).await {
                    // Another opener in this same client instance renewed it: still ours.
                    Ok(Some((raw, now))) if now.owner == info.owner => {
                        *self.current.borrow_mut() = raw;
                    }
                    Ok(Some((_, now))) => self.lose(format!("taken over by {}", now.holder)),
                    Ok(None) => self.lose("broken by an operator or another client".into()),
                    Err(e) => tracing::warn!(image = self.image, "reading the lock: {e}"),
                }
            }
            Err(e) if e.status() == Some(Status::Fenced) => self.note_fenced(),
            Err(e) if e.status() == Some(Status::ObjectNotFound) => {
                self.lose("the image was removed".into())
            }
            // Unreachable OSD: keep trying. If someone breaks the lock meanwhile, the fence
            // refuses our writes, so nothing is lost by carrying on.
            Err(e) => tracing::warn!(image = self.image, "renewing the image lock: {e}"),
        }
    }

    fn lose(&self, reason: String) {
        tracing::error!(image = self.image, "image lock lost: {reason}");
        self.state.end(|| reason);
    }
}

impl Drop for HeldLock {
    /// The last handle on the lock is gone without `close`: renewals stop (the lock expires
    /// after its lease), and handles on other threads that share it stop writing now.
    fn drop(&mut self) {
        self.state
            .end(|| "the image holding the lock was dropped".into());
    }
}

/// Reads an image's lock record: `None` if nobody holds it.
pub(crate) async fn read_lock(
    client: &Client,
    pool: PoolId,
    image: &str,
    header: &str,
) -> Result<Option<(Bytes, LockInfo)>, VolumeError> {
    let res = client
        .execute(
            pool,
            header,
            vec![OsdOp::GetXattr {
                name: LOCK_XATTR.into(),
            }],
        )
        .await;
    match res {
        Ok(out) => match out.into_iter().next() {
            Some(OpOutput::Value(raw)) => {
                let info = LockInfo::decode(image, &raw)?;
                Ok(Some((raw, info)))
            }
            _ => Err(VolumeError::Corrupt {
                name: image.into(),
                detail: "lock read returned no value".into(),
            }),
        },
        Err(e) if e.status() == Some(Status::AttrNotFound) => Ok(None),
        Err(e) if e.status() == Some(Status::ObjectNotFound) => {
            Err(VolumeError::NotFound { name: image.into() })
        }
        Err(e) => Err(e.into()),
    }
}

/// Takes image `id`'s lock for `client`, breaking it if its holder stopped renewing it. Returns
/// the record written. A holder of this same client instance is simply taken over.
pub(crate) async fn acquire(
    client: &Client,
    pool: PoolId,
    image: &str,
    id: &str,
    opts: &LockOptions,
) -> Result<Bytes, VolumeError> {
    if !(LEASE_MIN..=LEASE_MAX).contains(&opts.lease) {
        return Err(VolumeError::InvalidArgument(format!(
            "lock lease {:?} must be from {LEASE_MIN:?} to {LEASE_MAX:?}",
            opts.lease
        )));
    }
    let header = header_oid(id);
    let mine = LockInfo {
        owner: client.instance(),
        renewals: 0,
        lease: opts.lease,
        holder: opts.holder.clone(),
    }
    .encode();
    for _ in 0..ACQUIRE_ROUNDS_MAX {
        let expect = match read_lock(client, pool, image, &header).await? {
            None => None,
            Some((raw, info)) if info.owner == client.instance() => Some(raw),
            Some((raw, info)) => match watch(client, pool, image, &header, &raw, &info).await? {
                Watch::Released => continue,
                Watch::Alive => {
                    return Err(VolumeError::Locked {
                        name: image.into(),
                        holder: info.holder,
                    })
                }
                Watch::Unchanged => {
                    tracing::warn!(
                        image,
                        holder = info.holder,
                        "image lock not renewed for a whole lease: fencing its holder"
                    );
                    client
                        .fence(info.owner)
                        .await
                        .map_err(|e| VolumeError::Locked {
                            name: image.into(),
                            holder: format!(
                                "{} (it stopped renewing, but fencing it failed: {e})",
                                info.holder
                            ),
                        })?;
                    Some(raw)
                }
            },
        };
        let ops = vec![
            OsdOp::CmpXattr {
                name: LOCK_XATTR.into(),
                value: expect,
            },
            OsdOp::SetXattr {
                name: LOCK_XATTR.into(),
                value: mine.clone(),
            },
        ];
        match client.execute(pool, &header, ops).await {
            Ok(_) => return Ok(mine),
            Err(e) if e.status() == Some(Status::CompareFailed) => continue,
            Err(e) if e.status() == Some(Status::ObjectNotFound) => {
                return Err(VolumeError::NotFound { name: image.into() })
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(VolumeError::Locked {
        name: image.into(),
        holder: "several clients at once (contention did not settle)".into(),
    })
}

enum Watch {
    /// The record did not change for a whole lease: its holder is dead or hung.
    Unchanged,
    /// Renewed, or taken by yet another client.
    Alive,
    Released,
}

/// Watches a lock record for one lease (plus a margin) of our own clock: a live holder renews
/// it meanwhile.
async fn watch(
    client: &Client,
    pool: PoolId,
    image: &str,
    header: &str,
    raw: &Bytes,
    info: &LockInfo,
) -> Result<Watch, VolumeError> {
    let wait = info.lease + info.lease / 4;
    let poll = (info.lease / 10).max(Duration::from_millis(20));
    tracing::info!(
        image,
        holder = info.holder,
        "image is locked; watching for up to {wait:?} whether its holder is alive"
    );
    let start = Instant::now();
    while start.elapsed() < wait {
        carmine_reactor::sleep(poll.min(wait.saturating_sub(start.elapsed()))).await;
        match read_lock(client, pool, image, header).await? {
            Some((now, _)) if now == *raw => {}
            Some(_) => return Ok(Watch::Alive),
            None => return Ok(Watch::Released),
        }
    }
    Ok(Watch::Unchanged)
}

/// Holds the lock for an open image, renewing it until the image is closed or dropped.
pub(crate) fn hold(
    client: Client,
    pool: PoolId,
    image: &str,
    id: &str,
    record: Bytes,
    lease: Duration,
) -> Rc<HeldLock> {
    let held = Rc::new(HeldLock {
        client,
        pool,
        image: image.into(),
        header: header_oid(id),
        current: RefCell::new(record),
        state: Arc::default(),
        turn: Default::default(),
    });
    let weak: Weak<HeldLock> = Rc::downgrade(&held);
    carmine_reactor::spawn(async move {
        loop {
            carmine_reactor::sleep(lease / 3).await;
            let Some(held) = weak.upgrade() else { return };
            if held.check().is_err() {
                return;
            }
            held.renew().await;
        }
    })
    .detach();
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_record_round_trips_and_damage_is_reported() {
        let info = LockInfo {
            owner: 0xfeed,
            renewals: 7,
            lease: Duration::from_secs(10),
            holder: "nbd pid 1 on host".into(),
        };
        let raw = info.encode();
        assert_eq!(LockInfo::decode("a", &raw).unwrap(), info);
        for i in 0..raw.len() {
            let mut bad = raw.to_vec();
            bad[i] ^= 0x20;
            assert!(
                LockInfo::decode("a", &Bytes::from(bad)).is_err(),
                "byte {i}"
            );
        }
        assert!(LockInfo::decode("a", &raw.slice(..3)).is_err());
    }
}
