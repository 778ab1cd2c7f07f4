//! The block device under a store: a trait, the aligned buffer O_DIRECT needs, and the
//! io_uring-backed file device.
//!
//! Every offset and length is a multiple of [`BLOCK`]; the device never sees anything else.
//! Why a trait: the crash tests run the very same store code on [`crate::SimDevice`], which
//! can lose unflushed writes, tear them, or flip bits.

use compio::buf::{IoBuf, IoBufMut, SetLen};
use compio::io::{AsyncReadAt, AsyncWriteAt};
use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::io;
use std::mem::MaybeUninit;
use std::path::Path;

/// The unit of every device I/O and of data placement.
pub const BLOCK: usize = 4096;

/// A device the store writes blocks to. Futures are not `Send`: a device handle belongs to one
/// reactor.
#[allow(async_fn_in_trait)]
pub trait BlockDevice {
    /// Fills `buf` (all of its capacity) from `off`. The buffer comes back in every case.
    async fn read_at(&self, buf: AlignedBuf, off: u64) -> (io::Result<()>, AlignedBuf);
    /// Writes `buf` (its initialised length) at `off`.
    async fn write_at(&self, buf: AlignedBuf, off: u64) -> (io::Result<()>, AlignedBuf);
    /// Makes every completed write durable.
    async fn sync(&self) -> io::Result<()>;
    /// Writes `buf` at `off` and makes it durable, with every write completed before it: as
    /// `write_at` then `sync`, which is what this does unless the device has a cheaper way
    /// (one `O_DSYNC` write instead of a write and an `fdatasync`).
    async fn write_durable_at(&self, buf: AlignedBuf, off: u64) -> (io::Result<()>, AlignedBuf) {
        let (res, buf) = self.write_at(buf, off).await;
        if res.is_err() {
            return (res, buf);
        }
        (self.sync().await, buf)
    }
    /// Usable size in bytes.
    fn size(&self) -> u64;
    /// Waits `d` by the device's clock. The cleaner paces itself with it; it is the device's
    /// because the tests' simulated device has no time of its own: it only counts the wait.
    async fn pause(&self, d: std::time::Duration);
}

/// A heap buffer aligned to [`BLOCK`], zero-initialised, with a length (the bytes that count)
/// up to a fixed capacity.
pub struct AlignedBuf {
    ptr: *mut u8,
    cap: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `cap` bytes (rounded up to a block) and length 0.
    pub fn new(cap: usize) -> Self {
        Self::allocate(cap, true)
    }

    /// `cap` bytes (rounded up to a block), aligned, length 0; zeroed unless `zeroed` is
    /// false, when the caller must write every byte before anything reads it.
    fn allocate(cap: usize, zeroed: bool) -> Self {
        let cap = cap.max(BLOCK).div_ceil(BLOCK) * BLOCK;
        let layout = Layout::from_size_align(cap, BLOCK).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe {
            match zeroed {
                true => alloc_zeroed(layout),
                false => alloc(layout),
            }
        };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Self { ptr, cap, len: 0 }
    }
    /// A buffer of `len` bytes (rounded up to a block), its length its capacity, filled front
    /// to back by `fill` and with zeros after what `fill` appended. Every byte is written
    /// once: a journal record's data blocks are not zeroed first only to be overwritten (a
    /// 64 KiB write's record spent 7% of the OSD core in that memset).
    pub fn assemble(len: usize, fill: impl FnOnce(&mut Assembly<'_>)) -> Self {
        // Not initialised: until the end of this function only `Assembly` writes it, front
        // to back, and nothing reads it; the rest is zeroed below, before it is handed out.
        let mut buf = Self::allocate(len, false);
        fill(&mut Assembly { buf: &mut buf });
        // SAFETY: `len <= cap` (kept by `Assembly`); the bytes from `len` on are in the
        // allocation.
        unsafe { buf.ptr.add(buf.len).write_bytes(0, buf.cap - buf.len) };
        buf.len = buf.cap;
        buf
    }
    /// A zeroed buffer whose length is its full capacity.
    pub fn zeroed(len: usize) -> Self {
        let mut b = Self::new(len);
        b.len = b.cap;
        b
    }
    pub fn capacity(&self) -> usize {
        self.cap
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Sets the length; the bytes up to `len` are whatever the buffer holds (always
    /// initialised: the allocation was zeroed).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "length {len} beyond capacity {}", self.cap);
        self.len = len;
    }
    pub fn clear(&mut self) {
        self.len = 0;
    }
    /// Appends `data`; panics past the capacity (callers size buffers from their layout).
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        let end = self.len + data.len();
        assert!(end <= self.cap, "append of {} past capacity", data.len());
        let start = self.len;
        self.full_mut()[start..end].copy_from_slice(data);
        self.len = end;
    }
    /// Pads with zeros up to the next block boundary.
    pub fn pad_to_block(&mut self) {
        let end = self.len.div_ceil(BLOCK) * BLOCK;
        assert!(end <= self.cap);
        let start = self.len;
        self.full_mut()[start..end].fill(0);
        self.len = end;
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation is initialised (zeroed) and at least `len` long.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// The whole capacity, regardless of length.
    pub fn full(&self) -> &[u8] {
        // SAFETY: as above, for the capacity.
        unsafe { std::slice::from_raw_parts(self.ptr, self.cap) }
    }
    pub fn full_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.cap) }
    }
}

/// Appends to a buffer being assembled (`AlignedBuf::assemble`); it can only write.
pub struct Assembly<'a> {
    buf: &'a mut AlignedBuf,
}

impl Assembly<'_> {
    /// Appends `data`; panics past the capacity (callers size buffers from their layout).
    pub fn put(&mut self, data: &[u8]) {
        let end = self.buf.len + data.len();
        assert!(
            end <= self.buf.cap,
            "append of {} past capacity",
            data.len()
        );
        // SAFETY: `[len, end)` is inside the allocation and does not overlap `data` (the
        // buffer is not reachable from outside while it is assembled).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.buf.ptr.add(self.buf.len), data.len())
        };
        self.buf.len = end;
    }
    /// Appends zeros up to `pos` bytes from the start (nothing if already there).
    pub fn zeros_to(&mut self, pos: usize) {
        assert!(pos <= self.buf.cap, "zeros to {pos} past capacity");
        if pos > self.buf.len {
            // SAFETY: `[len, pos)` is inside the allocation.
            unsafe {
                self.buf
                    .ptr
                    .add(self.buf.len)
                    .write_bytes(0, pos - self.buf.len)
            };
            self.buf.len = pos;
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, BLOCK).expect("valid layout");
        // SAFETY: allocated in `new` with this very layout.
        unsafe { dealloc(self.ptr, layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({}/{})", self.len, self.cap)
    }
}

impl IoBuf for AlignedBuf {
    fn as_init(&self) -> &[u8] {
        self.as_slice()
    }
}

impl SetLen for AlignedBuf {
    unsafe fn set_len(&mut self, len: usize) {
        AlignedBuf::set_len(self, len)
    }
}

impl IoBufMut for AlignedBuf {
    fn as_uninit(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: u8 and MaybeUninit<u8> have the same layout; the memory is initialised.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut MaybeUninit<u8>, self.cap) }
    }
}

/// How writes are made durable before a transaction is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// `fdatasync` after each group-commit write: survives power loss.
    Fdatasync,
    /// The device is opened `O_DSYNC`: each write is durable when it completes (FUA where the
    /// device has it), so no separate sync is issued. Survives power loss.
    Dsync,
    /// Rely on O_DIRECT completion only: survives a crash of the process, not of the machine.
    /// For benchmarks that want to see the store rather than the device's cache flush.
    ProcessCrashOnly,
}

/// A regular file or block device opened with O_DIRECT; all I/O through the reactor's
/// io_uring (compio).
pub struct FileDevice {
    file: compio::fs::File,
    /// In `Fdatasync` mode, the same file opened `O_DSYNC` as well, for `write_durable_at`.
    durable: Option<compio::fs::File>,
    size: u64,
    sync: SyncMode,
}

impl FileDevice {
    /// Opens `path` (which must exist and be at least `BLOCK` long) for direct I/O. Must be
    /// called on a compio runtime.
    pub async fn open(path: &Path, sync: SyncMode) -> io::Result<Self> {
        let mut opts = compio::fs::OpenOptions::new();
        let dsync = if sync == SyncMode::Dsync {
            libc::O_DSYNC
        } else {
            0
        };
        opts.read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | dsync);
        let file = opts.open(path).await?;
        let durable = match sync {
            SyncMode::Fdatasync => {
                let mut opts = compio::fs::OpenOptions::new();
                opts.read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT | libc::O_DSYNC);
                Some(opts.open(path).await?)
            }
            SyncMode::Dsync | SyncMode::ProcessCrashOnly => None,
        };
        let meta = file.metadata().await?;
        let size = if meta.file_type().is_block_device() {
            block_device_size(path)?
        } else {
            meta.len()
        };
        let size = size / BLOCK as u64 * BLOCK as u64;
        if size < BLOCK as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is only {size} bytes", path.display()),
            ));
        }
        Ok(Self {
            file,
            durable,
            size,
            sync,
        })
    }
}

/// An exclusive advisory lock (`flock`) on a store's device, held for as long as this lives.
/// Every OSD and every offline tool that writes takes it first, so two of them never open
/// one live device; the kernel drops it when the process dies, so a crash leaves no stale
/// lock behind.
#[derive(Debug)]
pub struct DeviceLock {
    _file: std::fs::File,
}

impl DeviceLock {
    /// Takes the lock or fails at once (never waits) with an error naming the device.
    pub fn acquire(path: &Path) -> io::Result<Self> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path)?;
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is in use by another process (a running OSD or store command)",
                        path.display()
                    ),
                )
            } else {
                e
            });
        }
        Ok(Self { _file: file })
    }
}

fn block_device_size(path: &Path) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    std::fs::File::open(path)?.seek(SeekFrom::End(0))
}

pub(crate) fn check_io(off: u64, len: usize, size: u64) -> io::Result<()> {
    if !off.is_multiple_of(BLOCK as u64) || !len.is_multiple_of(BLOCK) || off + len as u64 > size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("I/O {off}+{len} unaligned or past the device end {size}"),
        ));
    }
    Ok(())
}

impl BlockDevice for FileDevice {
    async fn read_at(&self, mut buf: AlignedBuf, off: u64) -> (io::Result<()>, AlignedBuf) {
        let want = buf.capacity();
        if let Err(e) = check_io(off, want, self.size) {
            return (Err(e), buf);
        }
        buf.clear();
        let compio::BufResult(res, buf) = self.file.read_at(buf, off).await;
        match res {
            Ok(n) if n == want => (Ok(()), buf),
            Ok(n) => (
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short read of {n}/{want} bytes at {off}"),
                )),
                buf,
            ),
            Err(e) => (Err(e), buf),
        }
    }

    async fn write_at(&self, buf: AlignedBuf, off: u64) -> (io::Result<()>, AlignedBuf) {
        write_through(&self.file, buf, off, self.size).await
    }

    async fn write_durable_at(&self, buf: AlignedBuf, off: u64) -> (io::Result<()>, AlignedBuf) {
        match &self.durable {
            Some(dsync) => write_through(dsync, buf, off, self.size).await,
            // O_DSYNC already, or durability not asked for: a write is all it takes.
            None => self.write_at(buf, off).await,
        }
    }

    async fn sync(&self) -> io::Result<()> {
        match self.sync {
            SyncMode::Fdatasync => self.file.sync_data().await,
            SyncMode::Dsync | SyncMode::ProcessCrashOnly => Ok(()),
        }
    }

    fn size(&self) -> u64 {
        self.size
    }

    async fn pause(&self, d: std::time::Duration) {
        carmine_reactor::sleep(d).await;
    }
}

async fn write_through(
    mut file: &compio::fs::File,
    buf: AlignedBuf,
    off: u64,
    size: u64,
) -> (io::Result<()>, AlignedBuf) {
    let want = buf.len();
    if let Err(e) = check_io(off, want, size) {
        return (Err(e), buf);
    }
    let compio::BufResult(res, buf) = file.write_at(buf, off).await;
    match res {
        Ok(n) if n == want => (Ok(()), buf),
        Ok(n) => (
            Err(io::Error::other(format!(
                "short write of {n}/{want} bytes at {off}"
            ))),
            buf,
        ),
        Err(e) => (Err(e), buf),
    }
}

use std::os::unix::fs::FileTypeExt;
