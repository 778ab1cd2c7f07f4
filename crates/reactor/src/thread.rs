//! Reactor threads: one OS thread per reactor, pinned before its runtime is created so the
//! io_uring instance and every allocation start on the right core.

use crate::ReactorLoad;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

/// A running reactor thread.
pub struct ReactorHandle<T> {
    pub name: String,
    pub cpu: Option<u32>,
    /// The reactor's busy and idle time, as its own loop measures it.
    pub load: Arc<ReactorLoad>,
    join: JoinHandle<T>,
}

impl<T> ReactorHandle<T> {
    /// Waits for the reactor to finish. A reactor that panicked is reported as an error.
    pub fn join(self) -> io::Result<T> {
        self.join
            .join()
            .map_err(|_| io::Error::other(format!("reactor {} panicked", self.name)))
    }

    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }
}

/// Starts a reactor thread pinned to `cpu` (unpinned when `None`) running `make()` to
/// completion on its own runtime. `make` runs on the new thread, so the future need not be
/// `Send`: everything a reactor owns stays on its core.
pub fn spawn_reactor<T, F, Fut>(
    name: String,
    cpu: Option<u32>,
    make: F,
) -> io::Result<ReactorHandle<T>>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    spawn_reactor_in(tracing::Span::none(), name, cpu, make)
}

/// Like [`spawn_reactor`], with `span` entered on the reactor thread for its whole life, so
/// every event of every task it runs carries the span's fields (which OSD and reactor). Every
/// task on a reactor thread is that reactor's, which is what makes one thread-wide span right.
pub fn spawn_reactor_in<T, F, Fut>(
    span: tracing::Span,
    name: String,
    cpu: Option<u32>,
    make: F,
) -> io::Result<ReactorHandle<T>>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    let load = Arc::new(ReactorLoad::default());
    let thread_load = load.clone();
    let join = std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let _entered = span.enter();
            let mut may_poll = true;
            if let Some(cpu) = cpu {
                if let Err(e) = crate::cpu::pin_current_thread(cpu) {
                    tracing::warn!("cannot pin reactor to cpu {cpu}: {e}; it does not poll");
                    // Its core is not its own after all.
                    may_poll = false;
                }
            }
            let rt = crate::new_runtime().expect("cannot create an io_uring runtime");
            // Like compio's own block_on: a panicking task's siblings are dropped only once
            // the unwind is over, then the panic carries on to `join`.
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if may_poll {
                    crate::block_on_measured(&rt, make(), &thread_load)
                } else {
                    crate::load::block_on_measured_without_poll(&rt, make(), &thread_load)
                }
            }));
            drop(rt);
            out.unwrap_or_else(|p| std::panic::resume_unwind(p))
        })?;
    Ok(ReactorHandle {
        name,
        cpu,
        load,
        join,
    })
}
