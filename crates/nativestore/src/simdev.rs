//! A fault-injecting in-memory device for crash and corruption tests.
//!
//! It models a volatile write cache: a write is visible to reads at once but durable only after
//! `sync`. A crash keeps the durable image plus, independently for every write not yet synced,
//! all of it, none of it, or a prefix torn at a 512-byte sector boundary — the worst a real
//! device with a volatile cache may do. It can also die at the Nth write (that write and every
//! later I/O fail) and flip bits.

use crate::device::{check_io, AlignedBuf, BlockDevice};
use rand::Rng;
use std::cell::RefCell;
use std::io;
use std::rc::Rc;

const SECTOR: usize = 512;

#[derive(Default)]
struct State {
    /// What reads see.
    current: Vec<u8>,
    /// What a crash keeps for sure.
    durable: Vec<u8>,
    /// Writes since the last sync, oldest first.
    unsynced: Vec<(u64, Vec<u8>)>,
    /// Writes still allowed before the device dies; `None` for never.
    writes_left: Option<u64>,
    /// Syncs still allowed before one fails (once, without the device dying); `None`: never.
    syncs_left: Option<u64>,
    dead: bool,
    /// Reads suspend once too (by default they complete at once).
    slow_reads: bool,
    writes: u64,
    syncs: u64,
    bytes_written: u64,
    /// The longest single write so far, in bytes.
    largest_write: usize,
    bytes_read: u64,
    /// Pauses asked for, summed (they complete at once).
    paused: std::time::Duration,
}

/// A cloneable handle: the store owns one, the test keeps another to inject faults.
#[derive(Clone)]
pub struct SimDevice {
    state: Rc<RefCell<State>>,
}

/// What a crash left: an image to build a new device from.
pub struct CrashImage(pub Vec<u8>);

impl SimDevice {
    pub fn new(size: usize) -> Self {
        Self::from_image(vec![0; size])
    }
    pub fn from_image(image: Vec<u8>) -> Self {
        Self {
            state: Rc::new(RefCell::new(State {
                current: image.clone(),
                durable: image,
                ..State::default()
            })),
        }
    }
    /// The device dies when it receives its `n`th write from now (0: the very next one).
    pub fn die_at_write(&self, n: u64) {
        self.state.borrow_mut().writes_left = Some(n);
    }
    /// The `n`th sync from now fails with EIO, once; the device lives on, and the writes it
    /// should have made durable stay volatile (as Linux may drop them after a failed fsync).
    pub fn fail_sync_at(&self, n: u64) {
        self.state.borrow_mut().syncs_left = Some(n);
    }
    /// Makes every later read suspend once before completing, as a real device's do, so
    /// that other tasks run while a read is in flight.
    pub fn slow_reads(&self) {
        self.state.borrow_mut().slow_reads = true;
    }
    pub fn is_dead(&self) -> bool {
        self.state.borrow().dead
    }
    /// Count of writes, syncs and bytes written so far.
    pub fn counters(&self) -> (u64, u64, u64) {
        let s = self.state.borrow();
        (s.writes, s.syncs, s.bytes_written)
    }
    /// The pauses asked for so far, summed: the simulated device does not wait.
    pub fn paused(&self) -> std::time::Duration {
        self.state.borrow().paused
    }
    /// The longest single write so far, in bytes.
    pub fn largest_write(&self) -> usize {
        self.state.borrow().largest_write
    }
    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.state.borrow().bytes_read
    }
    /// The image after a crash now: durable data plus a random fate for each unsynced write.
    pub fn crash(&self, rng: &mut impl Rng) -> CrashImage {
        let s = self.state.borrow();
        let mut image = s.durable.clone();
        for (off, data) in &s.unsynced {
            let off = *off as usize;
            match rng.random_range(0..3) {
                0 => {}
                1 => image[off..off + data.len()].copy_from_slice(data),
                _ => {
                    let sectors = data.len() / SECTOR;
                    let keep = rng.random_range(0..=sectors) * SECTOR;
                    image[off..off + keep].copy_from_slice(&data[..keep]);
                }
            }
        }
        CrashImage(image)
    }
    /// The image as reads see it now (a clean shutdown).
    pub fn image(&self) -> Vec<u8> {
        self.state.borrow().current.clone()
    }
    /// Flips one bit, durably.
    pub fn flip_bit(&self, byte: u64, bit: u8) {
        let mut s = self.state.borrow_mut();
        s.current[byte as usize] ^= 1 << bit;
        s.durable[byte as usize] ^= 1 << bit;
    }
}

/// Suspends once, like a real device completing later: lets concurrent transactions pile
/// up behind a write in flight, as they do on io_uring. Tests use it to let other tasks run.
pub async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

fn dead() -> io::Error {
    io::Error::other("simulated device failure")
}

impl BlockDevice for SimDevice {
    async fn read_at(&self, mut buf: AlignedBuf, off: u64) -> (io::Result<()>, AlignedBuf) {
        if self.state.borrow().slow_reads {
            yield_once().await;
        }
        let mut s = self.state.borrow_mut();
        if s.dead {
            return (Err(dead()), buf);
        }
        let len = buf.capacity();
        if let Err(e) = check_io(off, len, s.current.len() as u64) {
            return (Err(e), buf);
        }
        s.bytes_read += len as u64;
        buf.set_len(len);
        buf.full_mut()
            .copy_from_slice(&s.current[off as usize..off as usize + len]);
        (Ok(()), buf)
    }

    async fn write_at(&self, buf: AlignedBuf, off: u64) -> (io::Result<()>, AlignedBuf) {
        yield_once().await;
        let mut s = self.state.borrow_mut();
        if s.dead {
            return (Err(dead()), buf);
        }
        if let Err(e) = check_io(off, buf.len(), s.current.len() as u64) {
            return (Err(e), buf);
        }
        let data = buf.as_slice().to_vec();
        if let Some(left) = s.writes_left.as_mut() {
            if *left == 0 {
                // The dying write may still reach the cache, whole or torn: a crash decides.
                s.dead = true;
                s.unsynced.push((off, data));
                return (Err(dead()), buf);
            }
            *left -= 1;
        }
        let o = off as usize;
        s.current[o..o + data.len()].copy_from_slice(&data);
        s.writes += 1;
        s.bytes_written += data.len() as u64;
        s.largest_write = s.largest_write.max(data.len());
        s.unsynced.push((off, data));
        (Ok(()), buf)
    }

    async fn sync(&self) -> io::Result<()> {
        yield_once().await;
        let mut s = self.state.borrow_mut();
        if s.dead {
            return Err(dead());
        }
        if let Some(left) = s.syncs_left.as_mut() {
            if *left == 0 {
                s.syncs_left = None;
                return Err(io::Error::other("simulated fdatasync failure"));
            }
            *left -= 1;
        }
        let State {
            durable, unsynced, ..
        } = &mut *s;
        for (off, data) in unsynced.drain(..) {
            let o = off as usize;
            durable[o..o + data.len()].copy_from_slice(&data);
        }
        s.syncs += 1;
        Ok(())
    }

    fn size(&self) -> u64 {
        self.state.borrow().current.len() as u64
    }

    async fn pause(&self, d: std::time::Duration) {
        self.state.borrow_mut().paused += d;
        // Other tasks run meanwhile, as they would during a real pause.
        yield_once().await;
    }
}
