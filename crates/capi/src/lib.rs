//! libcarmine: Carmine's block-volume client as a C library, modelled on librbd's C API so
//! that fio, qemu and SPDK-style programs can use it in-process, without a gateway hop.
//! `include/carmine.h` is the contract (with the thread-safety rules); decision 0011 says why
//! it is built this way.
//!
//! Every entry point catches panics (none may unwind into C) and turns bad arguments into
//! `-EINVAL`, never a crash: null handles and null buffers are refused.

// The safety contract of every entry point (which pointers must stay valid, and for how long)
// is written once, in carmine.h, for the C callers it binds.
#![allow(clippy::missing_safety_doc)]

mod completion;
mod config;
mod error;
mod runtime;

use bytes::Bytes;
use completion::{Callback, Completion, Events};
use config::Config;
use error::{record, Failure};
use runtime::{Driver, Op, ReadInto};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub const VERSION: (c_int, c_int, c_int) = (0, 1, 0);

/// `carmine_cluster_t`.
pub struct ClusterHandle {
    cfg: Config,
    rt: Option<Driver>,
    /// Images open for writing through this handle, by name: further writable opens of one
    /// share it (its reactor slot and its exclusive lock, which goes with the last close).
    writers: Arc<Mutex<HashMap<String, SharedOpen>>>,
}

/// An image open for writing through one cluster handle, and how many image handles use it.
struct SharedOpen {
    reactor: usize,
    slot: usize,
    size: u64,
    object_size: u64,
    handles: usize,
}

/// `carmine_image_t`.
pub struct ImageHandle {
    rt: Driver,
    reactor: usize,
    slot: usize,
    size: u64,
    object_size: u64,
    read_only: bool,
    events: Arc<Events>,
    closed: AtomicBool,
    name: String,
    writers: Arc<Mutex<HashMap<String, SharedOpen>>>,
}

/// `carmine_image_info_t`.
#[repr(C)]
pub struct ImageInfo {
    pub size: u64,
    pub object_size: u64,
    pub num_objs: u64,
    pub read_only: u32,
    pub reserved: u32,
}

/// Runs `f`, turning a panic into -EIO with a message (a bug in the library, never the
/// caller's fault, and never an unwind through C frames).
fn guarded(f: impl FnOnce() -> Result<c_int, Failure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => record(e),
        Err(_) => record(Failure::new(
            libc::EIO,
            "internal error (a panic) in libcarmine",
        )),
    }
}

fn guarded_ssize(f: impl FnOnce() -> Result<isize, Failure>) -> isize {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => record(e) as isize,
        Err(_) => record(Failure::new(
            libc::EIO,
            "internal error (a panic) in libcarmine",
        )) as isize,
    }
}

/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if s.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    CStr::from_ptr(s)
        .to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// # Safety
/// `p` is null or a handle this library returned and the caller has not freed.
unsafe fn handle<'a, T>(p: *mut T, what: &str) -> Result<&'a T, Failure> {
    p.as_ref()
        .ok_or_else(|| Failure::invalid(format!("{what} is NULL")))
}

/// # Safety
/// `c` is null or a completion from `carmine_aio_create_completion`, not released.
unsafe fn completion(c: *mut c_void) -> Result<Arc<Completion>, Failure> {
    if c.is_null() {
        return Err(Failure::invalid("the completion is NULL"));
    }
    let c = c as *const Completion;
    Arc::increment_strong_count(c);
    Ok(Arc::from_raw(c))
}

#[no_mangle]
pub unsafe extern "C" fn carmine_version(major: *mut c_int, minor: *mut c_int, extra: *mut c_int) {
    for (p, v) in [(major, VERSION.0), (minor, VERSION.1), (extra, VERSION.2)] {
        if let Some(p) = p.as_mut() {
            *p = v;
        }
    }
}

#[no_mangle]
pub extern "C" fn carmine_strerror(err: c_int) -> *const c_char {
    error::describe(err).as_ptr()
}

#[no_mangle]
pub extern "C" fn carmine_last_error() -> *const c_char {
    error::last()
}

#[no_mangle]
pub unsafe extern "C" fn carmine_create(cluster: *mut *mut ClusterHandle) -> c_int {
    guarded(|| {
        let out = cluster
            .as_mut()
            .ok_or_else(|| Failure::invalid("cluster is NULL"))?;
        *out = Box::into_raw(Box::new(ClusterHandle {
            cfg: Config::default(),
            rt: None,
            writers: Arc::default(),
        }));
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_conf_set(
    cluster: *mut ClusterHandle,
    key: *const c_char,
    value: *const c_char,
) -> c_int {
    guarded(|| {
        let c = cluster
            .as_mut()
            .ok_or_else(|| Failure::invalid("cluster is NULL"))?;
        if c.rt.is_some() {
            return Err(Failure::invalid("options are set before carmine_connect"));
        }
        c.cfg
            .set(text(key, "key")?, text(value, "value")?)
            .map_err(Failure::invalid)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_connect(cluster: *mut ClusterHandle) -> c_int {
    guarded(|| {
        let c = cluster
            .as_mut()
            .ok_or_else(|| Failure::invalid("cluster is NULL"))?;
        if c.rt.is_some() {
            return Err(Failure::invalid("already connected"));
        }
        c.rt = Some(Driver::start(&c.cfg)?);
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_shutdown(cluster: *mut ClusterHandle) {
    let _ = guarded(|| {
        if !cluster.is_null() {
            let c = Box::from_raw(cluster);
            if let Some(rt) = &c.rt {
                if rt.check_thread().is_err() {
                    // An inline client may not even be dropped elsewhere: leaked, not broken.
                    std::mem::forget(c);
                    return Ok(0);
                }
                rt.stop();
            }
        }
        Ok(0)
    });
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn connected(c: &ClusterHandle) -> Result<&Driver, Failure> {
    c.rt.as_ref()
        .ok_or_else(|| Failure::new(libc::ENOTCONN, "not connected: call carmine_connect first"))
}

unsafe fn open(
    cluster: *mut ClusterHandle,
    name: *const c_char,
    image: *mut *mut ImageHandle,
    read_only: bool,
) -> c_int {
    guarded(|| {
        let cl = handle(cluster, "cluster")?;
        let rt = connected(cl)?;
        let name = text(name, "name")?;
        let out = image
            .as_mut()
            .ok_or_else(|| Failure::invalid("image is NULL"))?;
        let events = Events::new();
        // Held across the open: two threads opening one image share one open of it.
        let mut writers = lock(&cl.writers);
        let shared = match writers.get_mut(name).filter(|_| !read_only) {
            Some(open) => {
                open.handles += 1;
                (open.reactor, open.slot, open.size, open.object_size)
            }
            None => {
                let reactor = rt.pick();
                let opened = rt.open(reactor, name, read_only)?;
                if !read_only {
                    writers.insert(
                        name.to_owned(),
                        SharedOpen {
                            reactor,
                            slot: opened.slot,
                            size: opened.size,
                            object_size: opened.object_size,
                            handles: 1,
                        },
                    );
                }
                (reactor, opened.slot, opened.size, opened.object_size)
            }
        };
        drop(writers);
        let (reactor, slot, size, object_size) = shared;
        *out = Box::into_raw(Box::new(ImageHandle {
            rt: rt.clone(),
            reactor,
            slot,
            size,
            object_size,
            read_only,
            events,
            closed: AtomicBool::new(false),
            name: name.to_owned(),
            writers: cl.writers.clone(),
        }));
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_open(
    cluster: *mut ClusterHandle,
    name: *const c_char,
    image: *mut *mut ImageHandle,
) -> c_int {
    open(cluster, name, image, false)
}

#[no_mangle]
pub unsafe extern "C" fn carmine_open_read_only(
    cluster: *mut ClusterHandle,
    name: *const c_char,
    image: *mut *mut ImageHandle,
) -> c_int {
    open(cluster, name, image, true)
}

#[no_mangle]
pub unsafe extern "C" fn carmine_create_image(
    cluster: *mut ClusterHandle,
    name: *const c_char,
    size: u64,
    object_size: u64,
) -> c_int {
    guarded(|| {
        let rt = connected(handle(cluster, "cluster")?)?;
        let object_size = (object_size != 0).then_some(object_size);
        rt.create(rt.pick(), text(name, "name")?, size, object_size)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_remove_image(
    cluster: *mut ClusterHandle,
    name: *const c_char,
) -> c_int {
    guarded(|| {
        let rt = connected(handle(cluster, "cluster")?)?;
        rt.remove(rt.pick(), text(name, "name")?)?;
        Ok(0)
    })
}

/// Drives an inline cluster handle (reactors = 0) for up to `timeout_ms` (-1: until something
/// happens); with reactor threads there is nothing to drive and it returns at once.
#[no_mangle]
pub unsafe extern "C" fn carmine_run(cluster: *mut ClusterHandle, timeout_ms: c_int) -> c_int {
    guarded(|| {
        let rt = connected(handle(cluster, "cluster")?)?;
        let timeout =
            (timeout_ms >= 0).then(|| std::time::Duration::from_millis(timeout_ms as u64));
        rt.run(timeout)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_close(image: *mut ImageHandle) -> c_int {
    guarded(|| {
        if image.is_null() {
            return Err(Failure::invalid("image is NULL"));
        }
        let img = Box::from_raw(image);
        img.closed.store(true, Ordering::Release);
        if img.read_only {
            return img.rt.close(img.reactor, img.slot).map(|_| 0);
        }
        let mut writers = lock(&img.writers);
        let last = match writers.get_mut(&img.name) {
            Some(open) if open.handles > 1 => {
                open.handles -= 1;
                false
            }
            _ => {
                writers.remove(&img.name);
                true
            }
        };
        if last {
            // The last handle: requests in flight drain, then the lock goes.
            img.rt.close(img.reactor, img.slot)
        } else {
            // Others still use it: wait only for the requests in flight (theirs too), so
            // that none of this handle's can touch its caller's buffers after this returns.
            drop(writers);
            img.rt.drain(img.reactor, img.slot)
        }
        .map(|_| 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_get_size(image: *mut ImageHandle, size: *mut u64) -> c_int {
    guarded(|| {
        let img = handle(image, "image")?;
        *size
            .as_mut()
            .ok_or_else(|| Failure::invalid("size is NULL"))? = img.size;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_stat(
    image: *mut ImageHandle,
    info: *mut ImageInfo,
    infosize: usize,
) -> c_int {
    guarded(|| {
        let img = handle(image, "image")?;
        if info.is_null() || infosize < std::mem::size_of::<ImageInfo>() {
            return Err(Failure::invalid(
                "info is NULL or smaller than carmine_image_info_t",
            ));
        }
        *info = ImageInfo {
            size: img.size,
            object_size: img.object_size,
            num_objs: img.size.div_ceil(img.object_size.max(1)),
            read_only: img.read_only as u32,
            reserved: 0,
        };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_image_event_fd(image: *mut ImageHandle) -> c_int {
    guarded(|| {
        handle(image, "image")?
            .events
            .fd()
            .map_err(|e| Failure::new(libc::EMFILE, format!("eventfd: {e}")))
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_poll_io_events(
    image: *mut ImageHandle,
    comps: *mut *mut c_void,
    numcomp: c_int,
) -> c_int {
    guarded(|| {
        let img = handle(image, "image")?;
        if comps.is_null() || numcomp < 0 {
            return Err(Failure::invalid("comps is NULL or numcomp negative"));
        }
        let taken = img.events.take(numcomp as usize);
        for (i, c) in taken.iter().enumerate() {
            // The caller's own reference keeps it alive: it releases it once handled.
            *comps.add(i) = Arc::as_ptr(c) as *mut c_void;
        }
        Ok(taken.len() as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_create_completion(
    arg: *mut c_void,
    cb: Option<Callback>,
    c: *mut *mut c_void,
) -> c_int {
    guarded(|| {
        let out = c
            .as_mut()
            .ok_or_else(|| Failure::invalid("the completion pointer is NULL"))?;
        *out = Arc::into_raw(Completion::new(cb, arg)) as *mut c_void;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_release(c: *mut c_void) {
    if !c.is_null() {
        drop(Arc::from_raw(c as *const Completion));
    }
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_wait_for_complete(c: *mut c_void) -> c_int {
    guarded(|| {
        runtime::wait_here(&*completion(c)?);
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_is_complete(c: *mut c_void) -> c_int {
    guarded(|| Ok(completion(c)?.is_complete() as c_int))
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_get_return_value(c: *mut c_void) -> isize {
    guarded_ssize(|| Ok(completion(c)?.result() as isize))
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_get_arg(c: *mut c_void) -> *mut c_void {
    match completion(c) {
        Ok(c) => c.arg(),
        Err(_) => std::ptr::null_mut(),
    }
}

/// The caller's write buffer as the request's data: no copy. Dropped when the last piece of
/// the request that refers to it is gone, which lets the completion fire.
struct CallerBuffer {
    ptr: *const u8,
    len: usize,
    c: Arc<Completion>,
}

// SAFETY: the caller promises the buffer stays valid and unchanged until the completion
// fires, which waits for this to be dropped; reading it from any thread is fine meanwhile.
unsafe impl Send for CallerBuffer {}

impl AsRef<[u8]> for CallerBuffer {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see `Send` above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for CallerBuffer {
    fn drop(&mut self) {
        self.c.part_done();
    }
}

enum Request {
    Read {
        off: u64,
        len: usize,
        buf: *mut u8,
    },
    Write {
        off: u64,
        len: usize,
        buf: *const u8,
    },
    Discard {
        off: u64,
        len: u64,
    },
    WriteZeroes {
        off: u64,
        len: u64,
    },
    Flush,
}

/// Checks a request and queues it on the image's reactor; `c` completes with its result
/// (and, if `polled` and it has no callback, goes to the image's completion queue). An error
/// here means nothing was queued and `c` will not complete.
unsafe fn submit(
    img: &ImageHandle,
    req: Request,
    c: Arc<Completion>,
    polled: bool,
) -> Result<(), Failure> {
    if img.closed.load(Ordering::Acquire) {
        return Err(Failure::new(libc::EBADF, "the image is closed"));
    }
    img.rt.check_thread()?;
    let range = |off: u64, len: u64| -> Result<(), Failure> {
        match off.checked_add(len) {
            Some(end) if end <= img.size => Ok(()),
            _ => Err(Failure::invalid(format!(
                "offset {off} length {len} is beyond the end of the image ({} bytes)",
                img.size
            ))),
        }
    };
    let writes = !matches!(req, Request::Read { .. } | Request::Flush);
    if writes && img.read_only {
        return Err(Failure::new(libc::EROFS, "the image was opened read-only"));
    }
    let op = match req {
        Request::Read { off, len, buf } => {
            range(off, len as u64)?;
            if buf.is_null() && len > 0 {
                return Err(Failure::invalid("buf is NULL"));
            }
            Op::Read {
                off,
                into: ReadInto { ptr: buf, len },
            }
        }
        Request::Write { off, len, buf } => {
            range(off, len as u64)?;
            if buf.is_null() && len > 0 {
                return Err(Failure::invalid("buf is NULL"));
            }
            Op::Write {
                off,
                data: Bytes::new(),
            }
            .with_len(len, buf, &c)
        }
        Request::Discard { off, len } => {
            range(off, len)?;
            Op::Discard { off, len }
        }
        Request::WriteZeroes { off, len } => {
            range(off, len)?;
            Op::WriteZeroes { off, len }
        }
        Request::Flush => Op::Flush,
    };
    if !c.submit(polled.then_some(&img.events)) {
        return Err(Failure::invalid(
            "the completion was used for another request",
        ));
    }
    img.rt.io(img.reactor, img.slot, op, c);
    Ok(())
}

impl Op {
    /// A write's data: the caller's buffer, without a copy (empty: nothing to hold).
    fn with_len(self, len: usize, buf: *const u8, c: &Arc<Completion>) -> Op {
        match self {
            Op::Write { off, .. } if len > 0 => {
                c.add_part();
                Op::Write {
                    off,
                    data: Bytes::from_owner(CallerBuffer {
                        ptr: buf,
                        len,
                        c: c.clone(),
                    }),
                }
            }
            other => other,
        }
    }
}

unsafe fn aio(image: *mut ImageHandle, req: Request, c: *mut c_void) -> c_int {
    guarded(|| {
        let img = handle(image, "image")?;
        submit(img, req, completion(c)?, true)?;
        Ok(0)
    })
}

/// Runs a request and waits for it: the synchronous calls.
unsafe fn sync(image: *mut ImageHandle, req: Request) -> isize {
    guarded_ssize(|| {
        let img = handle(image, "image")?;
        let c = Completion::new(None, std::ptr::null_mut());
        // Waited for here: never in the image's queue of completions to poll.
        submit(img, req, c.clone(), false)?;
        img.rt.wait(&c);
        match c.result() {
            r if r < 0 => Err(Failure::new(
                -r as i32,
                error::describe(r as i32).to_string_lossy(),
            )),
            r => Ok(r as isize),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn carmine_read(
    image: *mut ImageHandle,
    off: u64,
    len: usize,
    buf: *mut c_char,
) -> isize {
    sync(
        image,
        Request::Read {
            off,
            len,
            buf: buf.cast(),
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn carmine_write(
    image: *mut ImageHandle,
    off: u64,
    len: usize,
    buf: *const c_char,
) -> isize {
    sync(
        image,
        Request::Write {
            off,
            len,
            buf: buf.cast(),
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn carmine_discard(image: *mut ImageHandle, off: u64, len: u64) -> c_int {
    sync(image, Request::Discard { off, len }) as c_int
}

#[no_mangle]
pub unsafe extern "C" fn carmine_write_zeroes(
    image: *mut ImageHandle,
    off: u64,
    len: u64,
) -> c_int {
    sync(image, Request::WriteZeroes { off, len }) as c_int
}

#[no_mangle]
pub unsafe extern "C" fn carmine_flush(image: *mut ImageHandle) -> c_int {
    sync(image, Request::Flush) as c_int
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_read(
    image: *mut ImageHandle,
    off: u64,
    len: usize,
    buf: *mut c_char,
    c: *mut c_void,
) -> c_int {
    aio(
        image,
        Request::Read {
            off,
            len,
            buf: buf.cast(),
        },
        c,
    )
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_write(
    image: *mut ImageHandle,
    off: u64,
    len: usize,
    buf: *const c_char,
    c: *mut c_void,
) -> c_int {
    aio(
        image,
        Request::Write {
            off,
            len,
            buf: buf.cast(),
        },
        c,
    )
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_discard(
    image: *mut ImageHandle,
    off: u64,
    len: u64,
    c: *mut c_void,
) -> c_int {
    aio(image, Request::Discard { off, len }, c)
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_write_zeroes(
    image: *mut ImageHandle,
    off: u64,
    len: u64,
    c: *mut c_void,
) -> c_int {
    aio(image, Request::WriteZeroes { off, len }, c)
}

#[no_mangle]
pub unsafe extern "C" fn carmine_aio_flush(image: *mut ImageHandle, c: *mut c_void) -> c_int {
    aio(image, Request::Flush, c)
}
