//! The library's reactors: threads of their own, each with a cluster client and the images
//! opened on it. Callers hand requests over through a bounded lock-free queue and wake the
//! reactor only when it sleeps (an atomic waker: no syscall while it is busy); a caller that
//! finds the queue full waits for room (the only lock, off the fast path).

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
    pub fn start(cfg: &Config) -> Result<Arc<Runtime>, Failure> {
        cfg.check().map_err(Failure::invalid)?;
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
    pub fn pick(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.reactors.len()
    }

    fn submit(&self, reactor: usize, job: Job) -> Result<(), Job> {
        self.reactors[reactor].inbox.submit(job)
    }

    pub fn open(&self, reactor: usize, name: &str, read_only: bool) -> Result<Opened, Failure> {
        let (reply, rx) = sync_channel(1);
        let job = Job::Open {
            name: name.to_owned(),
            read_only,
            reply,
        };
        self.submit(reactor, job)
            .map_err(|_| Failure::shut_down())?;
        rx.recv().unwrap_or_else(|_| Err(Failure::shut_down()))
    }

    /// Runs `f` on a reactor with its volumes and waits for its answer.
    fn admin<T, F, Fut>(&self, reactor: usize, f: F) -> Result<T, Failure>
    where
        T: Send + 'static,
        F: FnOnce(Volumes) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, Failure>> + 'static,
    {
        let (reply, rx) = sync_channel(1);
        let job = Job::Admin(Box::new(move |v| {
            Box::pin(async move {
                let _ = reply.send(f(v).await);
            })
        }));
        self.submit(reactor, job)
            .map_err(|_| Failure::shut_down())?;
        rx.recv().unwrap_or_else(|_| Err(Failure::shut_down()))
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

    pub fn close(&self, reactor: usize, slot: usize) -> Result<(), Failure> {
        let (reply, rx) = sync_channel(1);
        self.submit(reactor, Job::Close { slot, reply })
            .map_err(|_| Failure::shut_down())?;
        rx.recv().unwrap_or_else(|_| Err(Failure::shut_down()))
    }

    /// Queues an I/O; `c` completes with its result (at once with -ESHUTDOWN if the reactor
    /// has stopped).
    pub fn io(&self, reactor: usize, slot: usize, op: Op, c: Arc<Completion>) {
        if let Err(Job::Io { c, .. }) = self.submit(reactor, Job::Io { slot, op, c }) {
            c.finish(-(libc::ESHUTDOWN as i64));
        }
    }

    /// Stops every reactor, closing the images still open (their locks are released), and
    /// waits for the threads. Idempotent.
    pub fn stop(&self) {
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
            while let Some(job) = r.inbox.jobs.pop() {
                fail_job(job);
            }
        }
    }
}

fn fail_job(job: Job) {
    match job {
        Job::Io { c, .. } => c.finish(-(libc::ESHUTDOWN as i64)),
        Job::Open { reply, .. } => {
            let _ = reply.send(Err(Failure::shut_down()));
        }
        Job::Close { reply, .. } => {
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

async fn reactor_main(cfg: Config, inbox: Arc<Inbox>, ready: Reply<()>) {
    let connected = connect(&cfg).await.and_then(|client| {
        let pool = client
            .pool_id(&cfg.pool)
            .map_err(|e| Failure::new(libc::ENOENT, format!("pool {:?}: {e}", cfg.pool)))?;
        Ok(Volumes::new(client, pool))
    });
    let volumes = match connected {
        Ok(v) => {
            let _ = ready.send(Ok(()));
            v
        }
        Err(e) => {
            inbox.stopped.store(true, Ordering::Release);
            let _ = ready.send(Err(e));
            return;
        }
    };
    let slots: Rc<RefCell<Vec<Option<Slot>>>> = Rc::default();
    loop {
        match inbox.next().await {
            Job::Io { slot, op, c } => {
                let s = slots.borrow();
                let Some(Some(s)) = s.get(slot) else {
                    c.finish(-(libc::EBADF as i64));
                    continue;
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
                let (volumes, slots, lock_lease) = (volumes.clone(), slots.clone(), cfg.lock_lease);
                carmine_reactor::spawn(async move {
                    let _ = reply.send(open(&volumes, &slots, &name, read_only, lock_lease).await);
                })
                .detach();
            }
            Job::Close { slot, reply } => {
                let taken = slots.borrow_mut().get_mut(slot).and_then(Option::take);
                carmine_reactor::spawn(async move {
                    let _ = reply.send(match taken {
                        Some(s) => close(s).await,
                        None => Err(Failure::new(libc::EBADF, "the image is not open")),
                    });
                })
                .detach();
            }
            Job::Admin(f) => {
                carmine_reactor::spawn(f(volumes.clone())).detach();
            }
            Job::Stop => {
                inbox.stopped.store(true, Ordering::Release);
                let open: Vec<Slot> = slots.borrow_mut().drain(..).flatten().collect();
                for s in open {
                    let _ = close(s).await;
                }
                return;
            }
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
    let opened = Opened {
        slot: 0,
        size: image.size(),
        object_size: image.info().object_size,
    };
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
        ..opened
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
