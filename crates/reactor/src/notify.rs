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

/// A wake-up for many tasks on one thread: each waits for the next [`WakeAll::wake_all`] after
/// it began waiting. No lock; a waker is kept per waiting task until the next wake (one of a
/// task that stopped waiting meanwhile costs that task one needless poll), in a vector whose
/// room is reused.
#[derive(Default)]
pub struct WakeAll {
    generation: Cell<u64>,
    waiters: std::cell::RefCell<Vec<Waker>>,
    spare: std::cell::RefCell<Vec<Waker>>,
}

impl WakeAll {
    pub fn wake_all(&self) {
        self.generation.set(self.generation.get() + 1);
        let mut woken = self.spare.take();
        std::mem::swap(&mut woken, &mut self.waiters.borrow_mut());
        for w in woken.drain(..) {
            w.wake();
        }
        *self.spare.borrow_mut() = woken;
    }

    /// Whether a task waits (a producer may skip the wake otherwise).
    pub fn has_waiters(&self) -> bool {
        !self.waiters.borrow().is_empty()
    }

    /// Resolves at the first `wake_all` after its first poll.
    pub async fn wait(&self) {
        let mut since = None;
        std::future::poll_fn(|cx| {
            let now = self.generation.get();
            if *since.get_or_insert(now) != now {
                return Poll::Ready(());
            }
            let mut waiters = self.waiters.borrow_mut();
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::Context;

    #[test]
    fn every_waiter_wakes_at_the_next_wake_and_not_at_an_earlier_one() {
        let all = WakeAll::default();
        all.wake_all();
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut a = Box::pin(all.wait());
        let mut b = Box::pin(all.wait());
        assert!(
            a.as_mut().poll(&mut cx).is_pending(),
            "woken by a wake before it waited"
        );
        assert!(b.as_mut().poll(&mut cx).is_pending());
        // Polled again without a wake: still waiting, its waker kept once.
        assert!(a.as_mut().poll(&mut cx).is_pending());
        assert!(all.has_waiters());
        all.wake_all();
        assert!(!all.has_waiters());
        assert!(a.as_mut().poll(&mut cx).is_ready());
        assert!(b.as_mut().poll(&mut cx).is_ready());
    }
}
