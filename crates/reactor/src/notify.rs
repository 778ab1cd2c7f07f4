//! A single-waiter wake-up flag for tasks on one thread: a writer task waits on it, producers
//! ring it after queueing work. No lock, no allocation per ring.

use std::cell::Cell;
use std::task::{Poll, Waker};

#[derive(Default)]
pub struct Doorbell {
    rung: Cell<bool>,
    waiter: Cell<Option<Waker>>,
}

impl Doorbell {
    pub fn ring(&self) {
        self.rung.set(true);
        if let Some(w) = self.waiter.take() {
            w.wake();
        }
    }

    /// Waits until `ring` was called since the last wait returned.
    pub async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.rung.replace(false) {
                Poll::Ready(())
            } else {
                self.waiter.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}
