//! Completions: how a caller learns that an asynchronous request finished. A reactor finishes
//! it; the caller waits on it (a futex, slept on only when the request is not done yet),
//! gets a callback on the reactor thread, or polls a per-image queue whose eventfd says when
//! there is something to poll.
//!
//! A write's data is the caller's buffer, handed to the request without a copy: the
//! completion fires only once the request is done *and* the last reference to that buffer is
//! gone, so a caller that reuses the buffer after the completion can never race a send.

use crossbeam_queue::SegQueue;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// `void (*)(carmine_completion_t *c, void *arg)`.
pub type Callback = unsafe extern "C" fn(c: *mut c_void, arg: *mut c_void);

thread_local! {
    /// Requests this thread completed: an inline client's driver stops waiting for I/O once
    /// a turn of its tasks completed one (a flush, say, completes without any I/O).
    static FIRED_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many requests this thread has completed so far.
pub fn fired_here() -> u64 {
    FIRED_HERE.with(|n| n.get())
}

const PENDING: u32 = 0;
const DONE: u32 = 1;
/// Pending, and a caller sleeps on it: the finisher must wake it.
const WAITED: u32 = 2;

pub struct Completion {
    state: AtomicU32,
    /// What must still happen before it fires: the result, and for a write the release of
    /// the caller's buffer.
    parts: AtomicU32,
    result: AtomicI64,
    callback: Option<Callback>,
    arg: usize,
    /// Set when submitted: the image whose event queue takes it (no callback, asynchronous).
    events: OnceLock<Arc<Events>>,
    submitted: AtomicBool,
}

impl Completion {
    pub fn new(callback: Option<Callback>, arg: *mut c_void) -> Arc<Self> {
        Arc::new(Completion {
            state: AtomicU32::new(PENDING),
            parts: AtomicU32::new(1),
            result: AtomicI64::new(0),
            callback,
            arg: arg as usize,
            events: OnceLock::new(),
            submitted: AtomicBool::new(false),
        })
    }

    /// Marks it submitted (a completion serves one request); `events` receives it when done
    /// if it has no callback. False if it was submitted before.
    pub fn submit(&self, events: Option<&Arc<Events>>) -> bool {
        if self.submitted.swap(true, Ordering::AcqRel) {
            return false;
        }
        if let (None, Some(e)) = (self.callback, events) {
            let _ = self.events.set(e.clone());
        }
        true
    }

    /// One more part to wait for (a buffer handed to the request).
    pub fn add_part(&self) {
        self.parts.fetch_add(1, Ordering::AcqRel);
    }

    pub fn arg(&self) -> *mut c_void {
        self.arg as *mut c_void
    }

    /// The request's result: bytes read or written, 0, or a negative errno.
    pub fn finish(self: &Arc<Self>, result: i64) {
        self.result.store(result, Ordering::Release);
        self.part_done();
    }

    pub fn part_done(self: &Arc<Self>) {
        if self.parts.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.fire();
        }
    }

    /// As librbd does: the callback runs before the request counts as complete, so a waiter
    /// returns only once the callback is done (the callback may release the completion: the
    /// library holds its own reference until this returns).
    fn fire(self: &Arc<Self>) {
        FIRED_HERE.with(|n| n.set(n.get() + 1));
        if let Some(cb) = self.callback {
            // SAFETY: the caller gave the callback and its argument for this completion, and
            // the pointer stays valid while `self` lives.
            unsafe { cb(Arc::as_ptr(self) as *mut c_void, self.arg()) };
        }
        if self.state.swap(DONE, Ordering::AcqRel) == WAITED {
            atomic_wait::wake_all(&self.state);
        }
        if let (None, Some(events)) = (self.callback, self.events.get()) {
            events.push(self.clone());
        }
    }

    pub fn is_complete(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }

    /// The result once complete (before, 0: `carmine_aio_get_return_value` is meant for a
    /// completed request).
    pub fn result(&self) -> i64 {
        self.result.load(Ordering::Acquire)
    }

    /// Blocks until complete.
    pub fn wait(&self) {
        loop {
            match self
                .state
                .compare_exchange(PENDING, WAITED, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) | Err(WAITED) => atomic_wait::wait(&self.state, WAITED),
                Err(_) => return,
            }
        }
    }
}

/// An image's completed requests that had no callback, for `carmine_poll_io_events`, and the
/// eventfd that becomes readable when the queue goes from empty to not empty. The eventfd is
/// made when first asked for: a caller that never waits on it (an inline client's, which
/// polls after `carmine_run`) pays no syscall per completion for it.
pub struct Events {
    queue: SegQueue<Arc<Completion>>,
    queued: AtomicUsize,
    fd: OnceLock<OwnedFd>,
}

impl Events {
    pub fn new() -> Arc<Self> {
        Arc::new(Events {
            queue: SegQueue::new(),
            queued: AtomicUsize::new(0),
            fd: OnceLock::new(),
        })
    }

    /// The eventfd, made now if it was not; readable at once if completions are waiting.
    pub fn fd(&self) -> std::io::Result<i32> {
        if let Some(fd) = self.fd.get() {
            return Ok(fd.as_raw_fd());
        }
        // SAFETY: plain syscall; the fd is owned from here on.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let fd = self.fd.get_or_init(|| fd).as_raw_fd();
        if self.queued.load(Ordering::Acquire) > 0 {
            self.ring();
        }
        Ok(fd)
    }

    /// Counted before it is queued, so a taker never subtracts what was not counted.
    fn push(&self, c: Arc<Completion>) {
        let was_empty = self.queued.fetch_add(1, Ordering::AcqRel) == 0;
        self.queue.push(c);
        if was_empty {
            self.ring();
        }
    }

    fn ring(&self) {
        if let Some(fd) = self.fd.get() {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd. It cannot block
            // (non-blocking, and the counter is far from overflowing).
            unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
        }
    }

    /// Takes up to `max` completed requests (also clearing the eventfd's count).
    pub fn take(&self, max: usize) -> Vec<Arc<Completion>> {
        if let Some(fd) = self.fd.get() {
            let mut count = 0u64;
            // SAFETY: reads 8 bytes into a live u64; EAGAIN (nothing to read) leaves it 0.
            unsafe { libc::read(fd.as_raw_fd(), (&raw mut count).cast(), 8) };
        }
        let mut out = Vec::new();
        while out.len() < max {
            match self.queue.pop() {
                Some(c) => out.push(c),
                None => break,
            }
        }
        // Anything left (more than `max`, or pushed meanwhile) rings again: a caller that
        // waits for the fd after every poll never misses a completion.
        let left = self.queued.fetch_sub(out.len(), Ordering::AcqRel) - out.len();
        if left > 0 {
            self.ring();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_completes_only_once_its_buffer_is_released() {
        let c = Completion::new(None, std::ptr::null_mut());
        assert!(c.submit(None));
        assert!(!c.submit(None), "a completion serves one request");
        c.add_part();
        c.finish(4096);
        assert!(!c.is_complete(), "the buffer is still referenced");
        c.part_done();
        assert!(c.is_complete());
        assert_eq!(c.result(), 4096);
        c.wait();
    }

    #[test]
    fn a_waiter_returns_only_once_the_callback_has_run() {
        static RAN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        unsafe extern "C" fn slow(_c: *mut c_void, _arg: *mut c_void) {
            std::thread::sleep(std::time::Duration::from_millis(30));
            RAN.store(true, Ordering::SeqCst);
        }
        let c = Completion::new(Some(slow), std::ptr::null_mut());
        let d = c.clone();
        let t = std::thread::spawn(move || d.finish(0));
        c.wait();
        assert!(
            RAN.load(Ordering::SeqCst),
            "the wait returned before the callback finished"
        );
        t.join().unwrap();
    }

    #[test]
    fn a_waiter_is_woken_from_another_thread() {
        let c = Completion::new(None, std::ptr::null_mut());
        let d = c.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            d.finish(-5);
        });
        c.wait();
        assert_eq!(c.result(), -5);
        t.join().unwrap();
    }

    #[test]
    fn the_eventfd_rings_when_the_queue_goes_from_empty_to_not_empty() {
        let e = Events::new();
        let readable = |e: &Events| {
            let mut p = libc::pollfd {
                fd: e.fd().unwrap(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        assert!(!readable(&e));
        for r in 0..3 {
            let c = Completion::new(None, std::ptr::null_mut());
            c.submit(Some(&e));
            c.finish(r);
        }
        assert!(readable(&e));
        let got = e.take(2);
        assert_eq!(
            got.iter().map(|c| c.result()).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert!(readable(&e), "one is left: the fd says so");
        assert_eq!(e.take(8).len(), 1, "what was left is still there to poll");
        assert!(!readable(&e), "taking all clears the count");
        let c = Completion::new(None, std::ptr::null_mut());
        c.submit(Some(&e));
        c.finish(7);
        assert!(readable(&e), "empty again, so the next one rings");

        // An eventfd made after completions queued is readable at once.
        let late = Events::new();
        let c = Completion::new(None, std::ptr::null_mut());
        c.submit(Some(&late));
        c.finish(1);
        assert!(readable(&late));
        assert_eq!(late.take(8).len(), 1);
    }
}
