//! The library's reactors. A cluster handle runs its client either on reactor threads of
//! its own (`reactors` ≥ 1), each with a cluster client and the images opened on it, or
//! inline (`reactors` = 0) on the caller's thread, which then drives it (`carmine_run`, or
//! any call that waits) — no handoff between threads at all, as fio's own loop wants it.
//!
//! To a reactor thread, callers hand requests through a bounded lock-free queue and wake it
//! only when it sleeps (an atomic waker: no syscall while it is busy); a caller that finds the
//! queue full waits for room (the only lock, off the fast path).

use crate::completion::Completion;
use crate::config::Config;
use crate::error::{errno_of_client, errno_of_volume, Failure};
use bytes::Bytes;
use carmine_client::{Client, ClientConfig};
use carmine_reactor::{Doorbell, ReactorHandle};
use carmine_volume::{Image, LockOptions, Volumes};
use crossbeam_queue::ArrayQueue;
use futures::task::AtomicWaker;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::task::Poll;
use std::time::Duration;

/// A caller's destination buffer for a read, valid until the request completes.
pub struct ReadInto {
    pub ptr: *mut u8,
    pub len: usize,
}
// SAFETY: the caller promises the buffer stays valid and untouched until the completion fires;
// only the reactor writes it meanwhile.
unsafe impl Send for ReadInto {}

pub enum Op {
    Read { off: u64, into: ReadInto },
    Write { off: u64, data: Bytes },
    Discard { off: u64, len: u64 },
    WriteZeroes { off: u64, len: u64 },
    Flush,
}

/// What an open image is, as the caller's thread sees it.
pub struct Opened {
    pub slot: usize,
    pub size: u64,
    pub object_size: u64,
}

pub type Reply<T> = SyncSender<Result<T, Failure>>;

enum Job {
    Open {
        name: String,
        read_only: bool,
        reply: Reply<Opened>,
    },
    Io {
        slot: usize,
        op: Op,
        c: Arc<Completion>,
    },
    Close {
        slot: usize,
        reply: Reply<()>,
    },
    /// Answers once the image has no request in flight (it stays open).
    Drain {
        slot: usize,
        reply: Reply<()>,
    },
    /// An administrative call (create, remove an image), run as its own task.
    Admin(Box<dyn FnOnce(Volumes) -> AdminTask + Send>),
    Stop,
}

type AdminTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

struct Inbox {
    jobs: ArrayQueue<Job>,
    waker: AtomicWaker,
    stopped: AtomicBool,
    /// Callers waiting for room in `jobs`.
    waiting: AtomicUsize,
    room: (Mutex<()>, Condvar),
}

impl Inbox {
    /// Queues `job`, waiting while the queue is full. Gives it back once the reactor stopped.
    fn submit(&self, mut job: Job) -> Result<(), Job> {
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return Err(job);
            }
            match self.jobs.push(job) {
                Ok(()) => {
                    self.waker.wake();
                    // The reactor may have stopped (and its queue been emptied) between the
                    // check above and the push: then nobody else will answer what is queued.
                    if self.stopped.load(Ordering::Acquire) {
                        self.fail_queued();
                    }
                    return Ok(());
                }
                Err(back) => {
                    job = back;
                    let (lock, cv) = &self.room;
                    let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                    self.waiting.fetch_add(1, Ordering::AcqRel);
                    if self.jobs.is_full() && !self.stopped.load(Ordering::Acquire) {
                        // Timed: a wake-up between the check and the wait costs 1 ms at most.
                        let _ = cv.wait_timeout(guard, Duration::from_millis(1));
                    }
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// Fails every job still queued (the reactor has stopped): none is left unanswered.
    fn fail_queued(&self) {
        while let Some(job) = self.jobs.pop() {
            fail_job(job);
        }
    }

    async fn next(&self) -> Job {
        let job = std::future::poll_fn(|cx| {
            if let Some(j) = self.jobs.pop() {
                return Poll::Ready(j);
            }
            self.waker.register(cx.waker());
            match self.jobs.pop() {
                Some(j) => Poll::Ready(j),
                None => Poll::Pending,
            }
        })
        .await;
        if self.waiting.load(Ordering::Acquire) > 0 {
            let _guard = self.room.0.lock().unwrap_or_else(|p| p.into_inner());
            self.room.1.notify_all();
        }
        job
    }
}

struct Reactor {
    inbox: Arc<Inbox>,
    thread: Mutex<Option<ReactorHandle<()>>>,
}

/// The reactors of one connected cluster handle.
pub struct Runtime {
    reactors: Vec<Reactor>,
    next: AtomicUsize,
}

impl Runtime {
    /// Starts the reactors and connects each to the cluster; fails if any cannot connect.
    fn start(cfg: &Config) -> Result<Arc<Runtime>, Failure> {
        let mut reactors = Vec::with_capacity(cfg.reactors);
        let mut ready = Vec::new();
        for r in 0..cfg.reactors {
            let inbox = Arc::new(Inbox {
                jobs: ArrayQueue::new(cfg.queue_depth),
                waker: AtomicWaker::new(),
                stopped: AtomicBool::new(false),
                waiting: AtomicUsize::new(0),
                room: (Mutex::new(()), Condvar::new()),
            });
            let (tx, rx) = sync_channel(1);
            let (thread_cfg, thread_inbox) = (cfg.clone(), inbox.clone());
            let thread = carmine_reactor::spawn_reactor(
                format!("carmine-client-{r}"),
                cfg.reactor_cpus.get(r).copied(),
                move || reactor_main(thread_cfg, thread_inbox, tx),
            )
            .map_err(|e| Failure::new(libc::EAGAIN, format!("starting a reactor thread: {e}")))?;
            reactors.push(Reactor {
                inbox,
                thread: Mutex::new(Some(thread)),
            });
            ready.push(rx);
        }
        let rt = Arc::new(Runtime {
            reactors,
            next: AtomicUsize::new(0),
        });
        for rx in ready {
            let connected = rx.recv().unwrap_or_else(|_| {
                Err(Failure::new(
                    libc::EIO,
                    "a reactor thread died while connecting",
                ))
            });
            if let Err(e) = connected {
                rt.stop();
                return Err(e);
            }
        }
        Ok(rt)
    }

    /// The reactor the next image opens on.
    fn pick(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.reactors.len()
    }

    fn submit(&self, reactor: usize, job: Job) -> Result<(), Job> {
        self.reactors[reactor].inbox.submit(job)
    }

    /// Queues an I/O; `c` completes with its result (at once with -ESHUTDOWN if the reactor
    /// has stopped).
    fn io(&self, reactor: usize, slot: usize, op: Op, c: Arc<Completion>) {
        if let Err(Job::Io { c, .. }) = self.submit(reactor, Job::Io { slot, op, c }) {
            c.finish(-(libc::ESHUTDOWN as i64));
        }
    }

    /// Stops every reactor, closing the images still open (their locks are released), and
    /// waits for the threads. Idempotent.
    fn stop(&self) {
        for r in &self.reactors {
            if !r.inbox.stopped.load(Ordering::Acquire) {
                let _ = r.inbox.submit(Job::Stop);
            }
        }
        for r in &self.reactors {
            let thread = r.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(t) = thread {
                let _ = t.join();
            }
            r.inbox.stopped.store(true, Ordering::Release);
            // Requests still queued are failed, never dropped unanswered.
            r.inbox.fail_queued();
        }
    }
}

fn fail_job(job: Job) {
    match job {
        Job::Io { c, .. } => c.finish(-(libc::ESHUTDOWN as i64)),
        Job::Open { reply, .. } => {
            let _ = reply.send(Err(Failure::shut_down()));
        }
        Job::Close { reply, .. } | Job::Drain { reply, .. } => {
            let _ = reply.send(Err(Failure::shut_down()));
        }
        // Dropping it drops its reply sender: the caller gets "shut down".
        Job::Admin(_) | Job::Stop => {}
    }
}

/// An image open on this reactor, with its requests in flight (a close waits for them).
struct Slot {
    image: Image,
    inflight: Rc<Cell<usize>>,
    drained: Rc<Doorbell>,
}

async fn connect(cfg: &Config) -> Result<Client, Failure> {
    let mut ccfg = ClientConfig {
        retry_timeout: cfg.retry_timeout,
        ..ClientConfig::default()
    };
    if let Some(path) = &cfg.key_file {
        ccfg.key = Some(carmine_proto::auth::AuthKey::load(path).map_err(|e| {
            Failure::new(libc::EACCES, format!("key file {}: {e}", path.display()))
        })?);
    }
    match &cfg.cluster_dir {
        Some(dir) => carmine_localcluster::connect_with(dir, ccfg)
            .await
            .map_err(|e| Failure::new(libc::ENOTCONN, format!("{}: {e:#}", dir.display()))),
        None => Client::connect(&cfg.osds, ccfg)
            .await
            .map_err(|e| Failure::new(errno_of_client(&e), format!("connecting: {e}"))),
    }
}

/// What a reactor holds: its client's volumes and the images open on it.
struct Host {
    volumes: Volumes,
    slots: Rc<RefCell<Vec<Option<Slot>>>>,
    lock_lease: Duration,
}

impl Host {
    async fn connect(cfg: &Config) -> Result<Host, Failure> {
        let client = connect(cfg).await?;
        let pool = client
            .pool_id(&cfg.pool)
            .map_err(|e| Failure::new(libc::ENOENT, format!("pool {:?}: {e}", cfg.pool)))?;
        Ok(Host {
            volumes: Volumes::new(client, pool),
            slots: Rc::default(),
            lock_lease: cfg.lock_lease,
        })
    }

    /// Starts `job` (anything but `Stop`) as a task of the current runtime.
    fn handle(&self, job: Job) {
        match job {
            Job::Io { slot, op, c } => {
                let s = self.slots.borrow();
                let Some(Some(s)) = s.get(slot) else {
                    c.finish(-(libc::EBADF as i64));
                    return;
                };
                let (image, inflight, drained) =
                    (s.image.clone(), s.inflight.clone(), s.drained.clone());
                inflight.set(inflight.get() + 1);
                carmine_reactor::spawn(async move {
                    let result = execute(&image, op).await;
                    c.finish(result);
                    inflight.set(inflight.get() - 1);
                    if inflight.get() == 0 {
                        drained.ring();
                    }
                })
                .detach();
            }
            Job::Open {
                name,
                read_only,
                reply,
            } => {
                let (volumes, slots, lease) =
                    (self.volumes.clone(), self.slots.clone(), self.lock_lease);
                carmine_reactor::spawn(async move {
                    let _ = reply.send(open(&volumes, &slots, &name, read_only, lease).await);
                })
                .detach();
            }
            Job::Close { slot, reply } => {
                let taken = self.slots.borrow_mut().get_mut(slot).and_then(Option::take);
                carmine_reactor::spawn(async move {
                    let _ = reply.send(match taken {
                        Some(s) => close(s).await,
                        None => Err(Failure::new(libc::EBADF, "the image is not open")),
                    });
                })
                .detach();
            }
            Job::Drain { slot, reply } => {
                let inflight = self
                    .slots
                    .borrow()
                    .get(slot)
                    .and_then(|s| s.as_ref().map(|s| s.inflight.clone()));
                carmine_reactor::spawn(async move {
                    // Polled: the slot's doorbell has one waiter, its close.
                    while inflight.as_ref().is_some_and(|n| n.get() > 0) {
                        carmine_reactor::sleep(Duration::from_millis(1)).await;
                    }
                    let _ = reply.send(Ok(()));
                })
                .detach();
            }
            Job::Admin(f) => {
                carmine_reactor::spawn(f(self.volumes.clone())).detach();
            }
            Job::Stop => {}
        }
    }

    /// Closes every image still open (their locks are released).
    async fn close_all(&self) {
        let open: Vec<Slot> = self.slots.borrow_mut().drain(..).flatten().collect();
        for s in open {
            let _ = close(s).await;
        }
    }
}

async fn reactor_main(cfg: Config, inbox: Arc<Inbox>, ready: Reply<()>) {
    let host = match Host::connect(&cfg).await {
        Ok(h) => {
            let _ = ready.send(Ok(()));
            h
        }
        Err(e) => {
            inbox.stopped.store(true, Ordering::Release);
            let _ = ready.send(Err(e));
            return;
        }
    };
    loop {
        match inbox.next().await {
            Job::Stop => {
                inbox.stopped.store(true, Ordering::Release);
                host.close_all().await;
                return;
            }
            job => host.handle(job),
        }
    }
}

/// A client run on the caller's thread: only that thread may use it, and it makes progress
/// only while that thread is inside the library.
pub struct Inline {
    rt: compio::runtime::Runtime,
    host: Host,
    owner: std::thread::ThreadId,
}

thread_local! {
    /// The inline clients of this thread: what `carmine_aio_wait_for_complete` drives.
    static INLINE: RefCell<Vec<std::rc::Weak<Inline>>> = const { RefCell::new(Vec::new()) };
}

impl Inline {
    fn start(cfg: &Config) -> Result<Rc<Inline>, Failure> {
        let rt = carmine_reactor::new_runtime()
            .map_err(|e| Failure::new(libc::EAGAIN, format!("creating an io_uring: {e}")))?;
        let host = rt.block_on(Host::connect(cfg))?;
        let me = Rc::new(Inline {
            rt,
            host,
            owner: std::thread::current().id(),
        });
        INLINE.with(|l| l.borrow_mut().push(Rc::downgrade(&me)));
        Ok(me)
    }

    fn submit(&self, job: Job) {
        self.rt.enter(|| self.host.handle(job));
    }

    /// Runs what is ready, then waits up to `timeout` (`None`: until something happens) for
    /// I/O, then runs what that made ready.
    fn drive(&self, timeout: Option<Duration>) {
        self.rt.enter(|| {
            let fired = crate::completion::fired_here();
            let more = self.rt.run();
            // Something completed already (without I/O, as a flush does): no wait, or the
            // caller would sleep until the next timer with its answer in hand.
            let timeout = if more || crate::completion::fired_here() != fired {
                Some(Duration::ZERO)
            } else {
                match (timeout, self.rt.current_timeout()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            };
            self.rt.poll_with(timeout);
            self.rt.run();
        })
    }

    /// Drives this client until `done`. Other inline clients of the thread are driven too,
    /// in turns of a millisecond: waiting in one must not starve another (its lock renewals
    /// above all).
    fn wait_until(&self, mut done: impl FnMut() -> bool) {
        while !done() {
            let others: Vec<Rc<Inline>> = INLINE.with(|l| {
                l.borrow()
                    .iter()
                    .filter_map(std::rc::Weak::upgrade)
                    .filter(|o| !std::ptr::eq(Rc::as_ptr(o), self))
                    .collect()
            });
            if others.is_empty() {
                self.drive(None);
            } else {
                for o in &others {
                    o.drive(Some(Duration::ZERO));
                }
                self.drive(Some(Duration::from_millis(1)));
            }
        }
    }

    fn stop(&self) {
        self.rt.block_on(self.host.close_all());
        INLINE.with(|l| l.borrow_mut().retain(|w| w.strong_count() > 0));
    }
}

/// Waits for `c` on a thread that may be running inline clients: drives them meanwhile (the
/// request may be one of theirs), or sleeps on it if the thread runs none.
pub fn wait_here(c: &Completion) {
    let inline: Vec<Rc<Inline>> = INLINE.with(|l| {
        l.borrow()
            .iter()
            .filter_map(std::rc::Weak::upgrade)
            .collect()
    });
    if inline.is_empty() {
        return c.wait();
    }
    while !c.is_complete() {
        for i in &inline {
            i.drive(Some(Duration::from_millis(1)));
        }
    }
}

/// How a cluster handle runs its client: on reactor threads, or inline on the caller's.
#[derive(Clone)]
pub enum Driver {
    Threads(Arc<Runtime>),
    Inline(Rc<Inline>),
}

impl Driver {
    pub fn start(cfg: &Config) -> Result<Driver, Failure> {
        cfg.check().map_err(Failure::invalid)?;
        Ok(if cfg.reactors == 0 {
            Driver::Inline(Inline::start(cfg)?)
        } else {
            Driver::Threads(Runtime::start(cfg)?)
        })
    }

    /// An inline client serves only the thread that connected it.
    pub fn check_thread(&self) -> Result<(), Failure> {
        match self {
            Driver::Inline(i) if i.owner != std::thread::current().id() => Err(Failure::invalid(
                "this cluster handle runs inline (reactors=0): use it only from the thread \
                 that connected it",
            )),
            _ => Ok(()),
        }
    }

    pub fn pick(&self) -> usize {
        match self {
            Driver::Threads(rt) => rt.pick(),
            Driver::Inline(_) => 0,
        }
    }

    /// Hands `job` (made with its reply channel) over and waits for the answer.
    fn call<T>(&self, reactor: usize, job: impl FnOnce(Reply<T>) -> Job) -> Result<T, Failure> {
        self.check_thread()?;
        let (reply, rx) = sync_channel(1);
        match self {
            Driver::Threads(rt) => {
                rt.submit(reactor, job(reply))
                    .map_err(|_| Failure::shut_down())?;
                rx.recv().unwrap_or_else(|_| Err(Failure::shut_down()))
            }
            Driver::Inline(i) => {
                i.submit(job(reply));
                let mut answer = None;
                i.wait_until(|| {
                    if answer.is_none() {
                        answer = rx.try_recv().ok();
                    }
                    answer.is_some()
                });
                answer.expect("waited for it")
            }
        }
    }

    pub fn open(&self, reactor: usize, name: &str, read_only: bool) -> Result<Opened, Failure> {
        let name = name.to_owned();
        self.call(reactor, move |reply| Job::Open {
            name,
            read_only,
            reply,
        })
    }

    pub fn close(&self, reactor: usize, slot: usize) -> Result<(), Failure> {
        self.call(reactor, move |reply| Job::Close { slot, reply })
    }

    /// Waits until the image in `slot` has no request in flight.
    pub fn drain(&self, reactor: usize, slot: usize) -> Result<(), Failure> {
        self.call(reactor, move |reply| Job::Drain { slot, reply })
    }

    /// Runs `f` on a reactor with its volumes and waits for its answer.
    fn admin<T, F, Fut>(&self, reactor: usize, f: F) -> Result<T, Failure>
    where
        T: Send + 'static,
        F: FnOnce(Volumes) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, Failure>> + 'static,
    {
        self.call(reactor, move |reply| {
            Job::Admin(Box::new(move |v| {
                Box::pin(async move {
                    let _ = reply.send(f(v).await);
                })
            }))
        })
    }

    pub fn create(
        &self,
        reactor: usize,
        name: &str,
        size: u64,
        object_size: Option<u64>,
    ) -> Result<(), Failure> {
        let name = name.to_owned();
        self.admin(reactor, move |v| async move {
            v.create(&name, size, object_size).await?;
            Ok(())
        })
    }

    pub fn remove(&self, reactor: usize, name: &str) -> Result<(), Failure> {
        let name = name.to_owned();
        self.admin(reactor, move |v| async move { Ok(v.remove(&name).await?) })
    }

    /// Queues an I/O (the thread was checked); `c` completes with its result.
    pub fn io(&self, reactor: usize, slot: usize, op: Op, c: Arc<Completion>) {
        match self {
            Driver::Threads(rt) => rt.io(reactor, slot, op, c),
            Driver::Inline(i) => i.submit(Job::Io { slot, op, c }),
        }
    }

    /// Waits for `c`, driving an inline client meanwhile.
    pub fn wait(&self, c: &Completion) {
        match self {
            Driver::Threads(_) => c.wait(),
            Driver::Inline(i) => i.wait_until(|| c.is_complete()),
        }
    }

    /// Lets an inline client make progress for up to `timeout`; reactor threads need nothing.
    pub fn run(&self, timeout: Option<Duration>) -> Result<(), Failure> {
        self.check_thread()?;
        if let Driver::Inline(i) = self {
            i.drive(timeout);
        }
        Ok(())
    }

    pub fn stop(&self) {
        match self {
            Driver::Threads(rt) => rt.stop(),
            Driver::Inline(i) => i.stop(),
        }
    }
}

async fn open(
    volumes: &Volumes,
    slots: &RefCell<Vec<Option<Slot>>>,
    name: &str,
    read_only: bool,
    lock_lease: Duration,
) -> Result<Opened, Failure> {
    let image = if read_only {
        volumes.open_read_only(name).await
    } else {
        let lock = LockOptions {
            lease: lock_lease,
            holder: format!("libcarmine (pid {})", std::process::id()),
        };
        volumes.open_with(name, &lock).await
    }
    .map_err(|e| Failure::new(errno_of_volume(&e), format!("opening {name:?}: {e}")))?;
    let (size, object_size) = (image.size(), image.info().object_size);
    let slot = Slot {
        image,
        inflight: Rc::new(Cell::new(0)),
        drained: Rc::new(Doorbell::default()),
    };
    let mut slots = slots.borrow_mut();
    let index = match slots.iter().position(Option::is_none) {
        Some(i) => i,
        None => {
            slots.push(None);
            slots.len() - 1
        }
    };
    slots[index] = Some(slot);
    Ok(Opened {
        slot: index,
        size,
        object_size,
    })
}

/// Waits for the image's requests in flight, then gives its lock back.
async fn close(s: Slot) -> Result<(), Failure> {
    while s.inflight.get() > 0 {
        s.drained.wait().await;
    }
    s.image
        .close()
        .await
        .map_err(|e| Failure::new(errno_of_volume(&e), format!("closing: {e}")))
}

/// One request on the image: its result as the C API returns it.
async fn execute(image: &Image, op: Op) -> i64 {
    let res = match op {
        Op::Read { off, into } => match image.read(off, into.len as u64).await {
            Ok(data) if data.len() == into.len => {
                // SAFETY: the caller's buffer of `into.len` bytes, valid until completion.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), into.ptr, into.len) };
                Ok(into.len as u64)
            }
            Ok(data) => Err(Failure::new(
                libc::EIO,
                format!("short read: {} of {} bytes", data.len(), into.len),
            )),
            Err(e) => Err(Failure::new(errno_of_volume(&e), e.to_string())),
        },
        Op::Write { off, data } => {
            let len = data.len() as u64;
            image
                .write(off, data)
                .await
                .map(|_| len)
                .map_err(|e| e.into())
        }
        Op::Discard { off, len } => image
            .discard(off, len)
            .await
            .map(|_| 0)
            .map_err(|e| e.into()),
        Op::WriteZeroes { off, len } => image
            .write_zeroes(off, len)
            .await
            .map(|_| 0)
            .map_err(|e| e.into()),
        Op::Flush => image.flush().await.map(|_| 0).map_err(|e| e.into()),
    };
    match res {
        Ok(n) => n as i64,
        Err(e) => {
            tracing::debug!("libcarmine request failed: {}", e.message);
            -(e.errno as i64)
        }
    }
}
