//! How busy a reactor is, from its own loop. The loop splits its wall time in two: running
//! tasks (outside the kernel wait) and inside io_uring's wait. The wait is not all idle: with
//! DEFER_TASKRUN the kernel does the ring's completion work (socket and file I/O processing)
//! inside that call, on this thread. So a snapshot also reads the thread's on-CPU time from
//! /proc/self/task/TID/schedstat (off the reactor: whoever asks pays), and
//! busy = on-CPU time less idle polling, idle = wall − on-CPU, tasks = time outside the wait
//! less polling, kernel = the rest of busy. Two monotonic clock reads per sleep, none per
//! task: no extra syscall on the reactor (an idle poll adds a few per turn, while idle).

use std::future::Future;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Counters one reactor publishes and anyone may read (relaxed: each is a running total).
#[derive(Debug, Default)]
pub struct ReactorLoad {
    busy_ns: AtomicU64,
    idle_ns: AtomicU64,
    sleeps: AtomicU64,
    /// Time in the turns of idle polls that found no work (see [`set_idle_poll`]): on CPU,
    /// waiting for work, not doing it.
    polled_ns: AtomicU64,
    /// The reactor thread's kernel id, for its schedstat (0 until the loop starts).
    tid: AtomicI32,
    /// When the current stretch began (ns since `epoch()`, shifted left by one) and whether
    /// it is asleep (low bit), so a snapshot taken mid-stretch counts it: a reactor asleep
    /// for seconds is idle now, not only once it wakes.
    stretch: AtomicU64,
}

/// The clock origin of every reactor's `stretch`.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn stretch_word(since: Instant, asleep: bool) -> u64 {
    ((since.saturating_duration_since(epoch()).as_nanos() as u64) << 1) | asleep as u64
}

/// A reading of [`ReactorLoad`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoadSnapshot {
    /// Wall time awake (outside the kernel wait): running tasks, or idle polling
    /// (`polled_ns`).
    pub busy_ns: u64,
    /// Wall time inside the kernel wait (sleeping, or doing the ring's completion work).
    pub idle_ns: u64,
    /// Times the reactor went to sleep in the kernel.
    pub sleeps: u64,
    /// The reactor thread's on-CPU time, user and kernel (0 if unreadable).
    #[serde(default)]
    pub cpu_ns: u64,
    /// Time in the turns of idle polls that found no work ([`set_idle_poll`]): wall time,
    /// which on a core of its own is the reactor's CPU time.
    #[serde(default)]
    pub polled_ns: u64,
}

/// A reactor's time between two snapshots, in percent of the wall time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadShare {
    /// On CPU doing work (tasks and kernel work), idle polling left out.
    pub busy_pct: f64,
    /// Running tasks.
    pub tasks_pct: f64,
    /// On CPU inside the kernel wait: the ring's completion work.
    pub kernel_pct: f64,
    /// On CPU polling for work while idle ([`set_idle_poll`]): capacity to spare, though the
    /// core is not asleep.
    pub polled_pct: f64,
    /// Off CPU.
    pub idle_pct: f64,
}

impl LoadSnapshot {
    /// How the time between `earlier` and `self` was spent.
    pub fn share_since(&self, earlier: &LoadSnapshot) -> LoadShare {
        let awake = self.busy_ns.saturating_sub(earlier.busy_ns) as f64;
        let wait = self.idle_ns.saturating_sub(earlier.idle_ns) as f64;
        let wall = (awake + wait).max(1.0);
        let cpu = self.cpu_ns.saturating_sub(earlier.cpu_ns) as f64;
        let polled = self.polled_ns.saturating_sub(earlier.polled_ns) as f64;
        // Without schedstat, the loop's own split is all there is.
        let on_cpu = if self.cpu_ns > 0 {
            cpu.min(wall)
        } else {
            awake
        };
        let polled = polled.min(on_cpu);
        let busy = on_cpu - polled;
        // The loop counts its polls as awake time.
        let tasks = (awake - polled).clamp(0.0, busy);
        LoadShare {
            busy_pct: 100.0 * busy / wall,
            tasks_pct: 100.0 * tasks / wall,
            kernel_pct: 100.0 * (busy - tasks) / wall,
            polled_pct: 100.0 * polled / wall,
            idle_pct: 100.0 * (wall - on_cpu) / wall,
        }
    }
}

/// On-CPU nanoseconds of thread `tid` of this process.
fn thread_cpu_ns(tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

impl ReactorLoad {
    /// The counters now; reads /proc for the thread's CPU time, so call it off the reactor.
    pub fn snapshot(&self) -> LoadSnapshot {
        let tid = self.tid.load(Ordering::Relaxed);
        let mut snap = LoadSnapshot {
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            idle_ns: self.idle_ns.load(Ordering::Relaxed),
            sleeps: self.sleeps.load(Ordering::Relaxed),
            cpu_ns: if tid > 0 { thread_cpu_ns(tid) } else { 0 },
            polled_ns: self.polled_ns.load(Ordering::Relaxed),
        };
        let word = self.stretch.load(Ordering::Relaxed);
        if tid > 0 {
            // The stretch in progress, not yet added by the loop.
            let since = epoch() + Duration::from_nanos(word >> 1);
            let ns = Instant::now().saturating_duration_since(since).as_nanos() as u64;
            if word & 1 == 1 {
                snap.idle_ns += ns;
            } else {
                snap.busy_ns += ns;
            }
        }
        snap
    }

    /// The loop (the only writer) goes to sleep at `at` after being awake for `busy`.
    fn going_to_sleep(&self, busy: Duration, at: Instant) {
        add(&self.busy_ns, busy);
        self.stretch
            .store(stretch_word(at, true), Ordering::Relaxed);
    }

    /// The loop spent `d` polling for work that did not come.
    fn polled(&self, d: Duration) {
        add(&self.polled_ns, d);
    }

    /// The loop woke at `at` after sleeping for `idle`.
    fn woke(&self, idle: Duration, at: Instant) {
        add(&self.idle_ns, idle);
        add(&self.sleeps, Duration::from_nanos(1));
        self.stretch
            .store(stretch_word(at, false), Ordering::Relaxed);
    }
}

/// A single writer's add (`d` in nanoseconds, or a count of 1 ns): a plain load and store,
/// no locked read-modify-write.
fn add(counter: &AtomicU64, d: Duration) {
    counter.store(
        counter.load(Ordering::Relaxed) + d.as_nanos() as u64,
        Ordering::Relaxed,
    );
}

/// How long an idle reactor polls for new completions before it sleeps, in nanoseconds (0:
/// sleep at once). Process-wide, set once at start-up ([`set_idle_poll`]).
static IDLE_POLL_NS: AtomicU64 = AtomicU64::new(0);

/// Makes idle reactors started from now on poll for `d` before they sleep in the kernel.
///
/// A sleeping reactor pays for its wake-up: on this VM a vCPU that halted takes ~14 µs more
/// per request-reply round trip (a depth-1 4 KiB write: 59 µs mean asleep, 45 µs with both
/// cores kept awake), and on slow-waking days far more. Polling a little longer than the
/// client's turn-around keeps a reactor that serves one request at a time awake between
/// them, at the cost of that much CPU per idle spell. Each turn of the poll yields the core
/// (`sched_yield`), so a thread that shares the core and has work gets it first — which still
/// does not make a poller a good neighbour: measured, a polling reactor on its client's core
/// halved the client's throughput (decision 0012, amendment), so OSDs poll by default only on
/// cores of their own. The turns that found nothing are counted apart
/// ([`LoadSnapshot::polled_ns`]), so a reactor's busy share stays its work.
pub fn set_idle_poll(d: Duration) {
    IDLE_POLL_NS.store(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
}

thread_local! {
    /// Socket reads and writes completed on this thread: what tells an idle poll that work
    /// arrived (a request, or the reply to a request this thread sent).
    static ACTIVITY: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts one completed socket read or write on this thread (see [`set_idle_poll`]).
pub(crate) fn note_activity() {
    ACTIVITY.with(|a| a.set(a.get().wrapping_add(1)));
}

fn activity() -> u64 {
    ACTIVITY.with(|a| a.get())
}

/// compio's `block_on` loop, with the time asleep in the kernel measured: run the ready tasks;
/// if some are still runnable, reap completions without waiting; otherwise poll for up to the
/// idle-poll time ([`set_idle_poll`]), then sleep until a completion, a timer or a wake-up.
/// Two clock reads per sleep, none per task.
///
/// With DEFER_TASKRUN a completion is posted only by an enter that asks for events, and
/// compio's poll does not ask when the runtime was woken since its last poll (it expects to
/// be called again at once). A reactor whose tasks keep waking each other never sleeps, so it
/// would never see a socket or file completion again: its timers fire, its connections go
/// silent. So every `FORCED_REAP_EVERY` turns of the loop (idle-poll turns included) it reaps
/// regardless ([`reap`]).
pub fn block_on_measured<F: Future>(
    rt: &compio::runtime::Runtime,
    fut: F,
    load: &ReactorLoad,
) -> F::Output {
    run_loop(rt, fut, load, IDLE_POLL_NS.load(Ordering::Relaxed))
}

/// [`block_on_measured`] for a reactor that must not poll whatever [`set_idle_poll`] says
/// (its pinning failed, so it may share a core).
pub(crate) fn block_on_measured_without_poll<F: Future>(
    rt: &compio::runtime::Runtime,
    fut: F,
    load: &ReactorLoad,
) -> F::Output {
    run_loop(rt, fut, load, 0)
}

/// Turns of the reactor loop between polls that surely reap completions (see
/// [`block_on_measured`]): one extra non-blocking enter per this many, a bound on how long a
/// busy reactor can go without seeing its I/O complete.
const FORCED_REAP_EVERY: u32 = 64;

/// A turn of an idle poll whose task run took longer than this ran tasks: its time is work,
/// not polling. (A run with nothing to do takes well under a microsecond.)
const RAN_TASKS: Duration = Duration::from_micros(2);

/// `IORING_ENTER_GETEVENTS`.
const ENTER_GETEVENTS: libc::c_uint = 1;

/// Counts one turn of the loop, reaping on every `FORCED_REAP_EVERY`th.
fn count_turn(rt: &compio::runtime::Runtime, turns: &mut u32) {
    *turns = turns.wrapping_add(1);
    if turns.is_multiple_of(FORCED_REAP_EVERY) {
        reap(rt);
    }
}

/// Has the kernel post the ring's completed work and takes it, whatever the runtime's wake-up
/// flag says: an enter that asks for events and waits for none, then a poll that does not
/// wait. (A second plain poll is not enough: a timer that fires at the end of one poll wakes a
/// task, which sets the flag that makes the next one skip asking.)
fn reap(rt: &compio::runtime::Runtime) {
    use std::os::fd::AsRawFd;
    // SAFETY: io_uring_enter on this thread's own ring (the single issuer), submitting
    // nothing, waiting for nothing, with no argument; an error (another driver's descriptor)
    // changes nothing and the poll below goes on as usual.
    unsafe {
        libc::syscall(
            libc::SYS_io_uring_enter,
            rt.as_raw_fd(),
            0 as libc::c_uint,
            0 as libc::c_uint,
            ENTER_GETEVENTS,
            std::ptr::null::<libc::c_void>(),
            0 as libc::size_t,
        );
    }
    rt.poll_with(Some(Duration::ZERO));
}

fn run_loop<F: Future>(
    rt: &compio::runtime::Runtime,
    fut: F,
    load: &ReactorLoad,
    idle_poll: u64,
) -> F::Output {
    // SAFETY: gettid has no preconditions.
    load.tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
    rt.enter(|| {
        let waker = rt.waker();
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(fut);
        let mut awake_since = Instant::now();
        load.stretch
            .store(stretch_word(awake_since, false), Ordering::Relaxed);
        let mut turns = 0u32;
        loop {
            count_turn(rt, &mut turns);
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                rt.run();
                return out;
            }
            if rt.run() {
                rt.poll_with(Some(Duration::ZERO));
                continue;
            }
            let mut runnable = false;
            if idle_poll > 0 {
                // Poll before sleeping; any socket I/O completed meanwhile starts the window
                // again, so a reactor that serves one request at a time stays awake.
                let mut seen = activity();
                let mut until = Instant::now() + Duration::from_nanos(idle_poll);
                let mut polled = Duration::ZERO;
                loop {
                    let turn = Instant::now();
                    if turn >= until {
                        break;
                    }
                    count_turn(rt, &mut turns);
                    rt.poll_with(Some(Duration::ZERO));
                    if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                        rt.run();
                        return out;
                    }
                    let ran = Instant::now();
                    runnable = rt.run();
                    let done = Instant::now();
                    if runnable {
                        break;
                    }
                    let now = activity();
                    let worked = now != seen || done - ran > RAN_TASKS;
                    if now != seen {
                        seen = now;
                        until = done + Duration::from_nanos(idle_poll);
                    }
                    // Another thread of this core with work to do goes first.
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                    if !worked {
                        // A yield that let another thread run is not this one's time.
                        let yielded = done.elapsed();
                        polled += (done - turn)
                            + if yielded < RAN_TASKS {
                                yielded
                            } else {
                                Duration::ZERO
                            };
                    }
                }
                load.polled(polled);
            }
            if !runnable {
                let asleep = Instant::now();
                load.going_to_sleep(asleep - awake_since, asleep);
                rt.poll();
                let woke = Instant::now();
                load.woke(woke - asleep, woke);
                awake_since = woke;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_poll_misses_no_completion_and_still_sleeps() {
        use compio::io::{AsyncReadExt, AsyncWriteExt};
        let rt = crate::new_runtime().unwrap();
        let load = ReactorLoad::default();
        let rounds = run_loop(
            &rt,
            async {
                let listener = compio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                let echo = compio::runtime::spawn(async move {
                    let (mut b, _) = listener.accept().await.unwrap();
                    loop {
                        let (res, buf) =
                            crate::io::read_some(&mut b, bytes::BytesMut::new(), 64).await;
                        if res.unwrap() == 0 {
                            return;
                        }
                        let (res, _) = crate::io::write_all(&mut b, buf).await;
                        res.unwrap();
                    }
                });
                let mut a = compio::net::TcpStream::connect(addr).await.unwrap();
                let mut rounds = 0;
                for i in 0..50u8 {
                    // Idle spells longer than the poll window: the reactor must sleep through
                    // them and still be woken by the timer.
                    compio::time::sleep(Duration::from_millis(2)).await;
                    let compio::BufResult(res, _) = a.write_all(vec![i; 8]).await;
                    res.unwrap();
                    let compio::BufResult(res, got) = a.read_exact(vec![0u8; 8]).await;
                    res.unwrap();
                    assert_eq!(got, vec![i; 8]);
                    rounds += 1;
                }
                drop(a);
                echo.await.unwrap();
                rounds
            },
            &load,
            Duration::from_micros(200).as_nanos() as u64,
        );
        assert_eq!(rounds, 50);
        let s = load.snapshot();
        assert!(s.sleeps >= 25, "the reactor never slept: {s:?}");
        // Each round trip is followed by a window of fruitless polling, counted apart (how
        // much depends on how often the yields give the core away on a busy machine).
        assert!(s.polled_ns > 0 && s.polled_ns <= s.busy_ns, "{s:?}");
        let share = s.share_since(&LoadSnapshot::default());
        assert!(share.polled_pct > 0.0, "{share:?}");
        for pct in [
            share.busy_pct,
            share.tasks_pct,
            share.kernel_pct,
            share.idle_pct,
        ] {
            assert!(pct >= 0.0, "{share:?}");
        }
        assert!(
            (share.tasks_pct + share.kernel_pct - share.busy_pct).abs() < 0.01,
            "{share:?}"
        );
        assert!(
            s.idle_ns >= 40_000_000,
            "50 idle spells of 2 ms are idle: {s:?}"
        );
    }

    #[test]
    fn polling_is_counted_apart_from_work_and_from_idle() {
        let before = LoadSnapshot {
            busy_ns: 1_000,
            idle_ns: 1_000,
            sleeps: 0,
            cpu_ns: 1_000,
            polled_ns: 0,
        };
        // 200 ns of wall time: 100 awake (50 of it polling), 100 in the kernel wait, of which
        // 50 on CPU doing completion work.
        let after = LoadSnapshot {
            busy_ns: 1_100,
            idle_ns: 1_100,
            sleeps: 1,
            cpu_ns: 1_150,
            polled_ns: 50,
        };
        let s = after.share_since(&before);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(s.busy_pct, 50.0), "{s:?}");
        assert!(near(s.tasks_pct, 25.0), "{s:?}");
        assert!(near(s.kernel_pct, 25.0), "{s:?}");
        assert!(near(s.polled_pct, 25.0), "{s:?}");
        assert!(near(s.idle_pct, 25.0), "{s:?}");
    }

    #[test]
    fn sleeping_counts_as_idle_and_spinning_as_busy() {
        let rt = crate::new_runtime().unwrap();
        let load = ReactorLoad::default();
        block_on_measured(
            &rt,
            async {
                compio::time::sleep(Duration::from_millis(100)).await;
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(100) {
                    std::hint::spin_loop();
                }
                // A snapshot in the middle of a stretch counts it.
                let mid = load.snapshot();
                assert!(mid.busy_ns >= 95_000_000, "{mid:?}");
                compio::time::sleep(Duration::from_millis(1)).await;
            },
            &load,
        );
        let s = load.snapshot();
        let ms = |ns: u64| ns / 1_000_000;
        assert!(ms(s.idle_ns) >= 95, "{s:?}");
        assert!(ms(s.busy_ns) >= 95 && ms(s.busy_ns) < 150, "{s:?}");
        assert!(s.sleeps >= 2);
        assert!(s.cpu_ns >= 90_000_000, "spinning is on-CPU time: {s:?}");
        let zero = LoadSnapshot {
            cpu_ns: 0,
            ..Default::default()
        };
        let share = s.share_since(&zero);
        assert!((35.0..65.0).contains(&share.busy_pct), "{share:?}");
        assert!((35.0..65.0).contains(&share.idle_pct), "{share:?}");
        assert!(share.kernel_pct < 15.0, "{share:?}");
    }
}
