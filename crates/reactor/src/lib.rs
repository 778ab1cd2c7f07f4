//! The reactor layer: one pinned, single-threaded io_uring runtime per core, CPU placement
//! policies, and the explicit cross-thread messages (mailboxes) that are the only way reactors
//! and the control thread talk to each other.
//!
//! Key decision (docs/decisions/0001-runtime.md): the runtime is compio. Every other crate uses
//! the runtime only through this module, so swapping it touches one crate.

pub mod cpu;
pub mod io;
mod mailbox;
mod thread;

pub use mailbox::{mailbox, Mailbox, MailboxSender};
pub use thread::{spawn_reactor, ReactorHandle};

pub use compio::net::{TcpListener, TcpStream};
pub use compio::runtime::spawn;
pub use compio::time::{sleep, timeout};

/// Runs `fut` to completion on a fresh runtime on the current thread (for tools and tests).
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let rt = new_runtime().expect("cannot create an io_uring runtime");
    rt.block_on(fut)
}

/// A runtime for the current thread. Idle reactors sleep in the kernel (no busy polling).
pub fn new_runtime() -> std::io::Result<compio::runtime::Runtime> {
    compio::runtime::RuntimeBuilder::new().build()
}
