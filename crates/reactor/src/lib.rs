//! The reactor layer: one pinned, single-threaded io_uring runtime per core, CPU placement
//! policies, and the explicit cross-thread messages (mailboxes) that are the only way reactors
//! and the control thread talk to each other.
//!
//! Key decision (docs/decisions/0001-runtime.md): the runtime is compio. Every other crate uses
//! the runtime only through this module, so swapping it touches one crate.

pub mod cpu;
mod fifo;
pub mod io;
mod load;
mod mailbox;
mod notify;
pub mod perf;
mod thread;
mod watchdog;

pub use fifo::{FifoGuard, FifoLock};
pub use load::{block_on_measured, set_idle_poll, LoadShare, LoadSnapshot, ReactorLoad};
pub use mailbox::{mailbox, Mailbox, MailboxSender};
pub use notify::{Doorbell, WakeAll};
pub use thread::{spawn_reactor, spawn_reactor_in, ReactorHandle};
pub use watchdog::Watchdog;

pub use compio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
pub use compio::runtime::spawn;
pub use compio::time::{sleep, timeout};
pub use io::Socket;

/// Runs `fut` to completion on a fresh runtime on the current thread (tools, the NBD gateway,
/// tests), polling before it sleeps if an idle poll is set ([`set_idle_poll`]).
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let rt = new_runtime().expect("cannot create an io_uring runtime");
    block_on_measured(&rt, fut, &ReactorLoad::default())
}

/// A runtime for the current thread. Idle reactors sleep in the kernel, after polling for the
/// idle-poll time if one is set ([`set_idle_poll`]; none by default).
///
/// The ring is set up for exactly one submitting thread: SINGLE_ISSUER, DEFER_TASKRUN
/// (completion work runs only when the reactor waits for it, not as interrupts in the middle of
/// its work) and COOP_TASKRUN. On this machine that took 4 KiB writes at depth 64 from 219K to
/// 363K requests/s on the same server code (docs/decisions/0001-runtime.md). Kernels older
/// than 6.1 lack DEFER_TASKRUN: the runtime then falls back to a default ring.
///
/// Not TASKRUN_FLAG: it lets every non-blocking submit run the ring's completion work, which cost
/// ~12% of replicated 4 KiB writes at depth 16 here (docs/decisions/0001-runtime.md); the loop
/// asks for completions itself instead ([`block_on_measured`]).
pub fn new_runtime() -> std::io::Result<compio::runtime::Runtime> {
    let mut proactor = compio::driver::ProactorBuilder::new();
    proactor
        .single_issuer(true)
        .defer_taskrun(true)
        .coop_taskrun(true);
    compio::runtime::RuntimeBuilder::new()
        .with_proactor(proactor)
        .build()
        .or_else(|e| {
            tracing::warn!("io_uring ring flags unsupported ({e}); using a default ring");
            compio::runtime::RuntimeBuilder::new().build()
        })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Tasks that are always runnable (one wakes itself at every poll, as a livelock would;
    /// another sleeps a microsecond at a time) must not keep the reactor's sockets from
    /// completing.
    #[test]
    fn sockets_complete_while_a_task_never_stops_waking_itself() {
        let stop = std::rc::Rc::new(std::cell::Cell::new(false));
        let echoed = crate::block_on({
            let stop = stop.clone();
            async move {
                let spinner = crate::spawn({
                    let stop = stop.clone();
                    std::future::poll_fn(move |cx| {
                        if stop.get() {
                            return std::task::Poll::Ready(());
                        }
                        cx.waker().wake_by_ref();
                        std::task::Poll::Pending
                    })
                });
                // And one whose timers keep firing: a timer that fires wakes its task, which
                // tells the runtime's next poll not to ask for events.
                let sleeper = crate::spawn({
                    let stop = stop.clone();
                    async move {
                        while !stop.get() {
                            crate::sleep(Duration::from_micros(1)).await;
                        }
                    }
                });
                // Let it start spinning before any socket exists.
                crate::sleep(Duration::from_millis(10)).await;
                let listener = crate::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                let round_trip = async {
                    let (accepted, connected) =
                        futures::join!(listener.accept(), crate::TcpStream::connect(addr));
                    let (mut b, _) = accepted.unwrap();
                    let mut a = connected.unwrap();
                    let (res, _) =
                        crate::io::write_all(&mut a, bytes::BytesMut::from(&b"ping"[..])).await;
                    res.unwrap();
                    let (res, got) = crate::io::read_some(&mut b, bytes::BytesMut::new(), 4).await;
                    res.unwrap();
                    got
                };
                let got = crate::timeout(Duration::from_secs(5), round_trip).await;
                stop.set(true);
                spinner.await.unwrap();
                sleeper.await.unwrap();
                got.ok()
            }
        });
        assert_eq!(
            echoed.as_deref(),
            Some(&b"ping"[..]),
            "no socket completed in 5 s while a task kept waking itself"
        );
    }
}
