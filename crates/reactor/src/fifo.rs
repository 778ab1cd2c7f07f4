//! A first-come, first-served async lock for one thread. The native store's transactions must
//! apply in the order they were submitted (that order is what the journal records and what a
//! crash keeps a prefix of), and requests that wait for a newer map epoch must reach the store
//! in the order they arrived; `async_lock::Mutex` lets a newcomer overtake a woken waiter,
//! this does not.
//! The place in line is taken at the first poll; a waiter dropped before its turn gives its
//! place up.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
pub struct FifoLock {
    next: Cell<u64>,
    serving: Cell<u64>,
    waiters: RefCell<BTreeMap<u64, Waker>>,
    abandoned: RefCell<BTreeSet<u64>>,
}

pub struct FifoGuard<'a> {
    lock: &'a FifoLock,
}

pub struct Acquire<'a> {
    lock: &'a FifoLock,
    ticket: Option<u64>,
    acquired: bool,
}

impl FifoLock {
    pub fn lock(&self) -> Acquire<'_> {
        Acquire {
            lock: self,
            ticket: None,
            acquired: false,
        }
    }

    /// True when nobody holds the lock or waits for it: a newcomer would not overtake anyone.
    pub fn is_idle(&self) -> bool {
        self.next.get() == self.serving.get()
    }

    fn release(&self) {
        let mut s = self.serving.get() + 1;
        let mut abandoned = self.abandoned.borrow_mut();
        while abandoned.remove(&s) {
            s += 1;
        }
        self.serving.set(s);
        if let Some(w) = self.waiters.borrow_mut().remove(&s) {
            w.wake();
        }
    }
}

impl<'a> Future for Acquire<'a> {
    type Output = FifoGuard<'a>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<FifoGuard<'a>> {
        let lock = self.lock;
        let ticket = *self.ticket.get_or_insert_with(|| {
            let t = lock.next.get();
            lock.next.set(t + 1);
            t
        });
        if lock.serving.get() == ticket {
            self.acquired = true;
            lock.waiters.borrow_mut().remove(&ticket);
            Poll::Ready(FifoGuard { lock })
        } else {
            lock.waiters.borrow_mut().insert(ticket, cx.waker().clone());
            Poll::Pending
        }
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket else { return };
        if self.acquired {
            return;
        }
        self.lock.waiters.borrow_mut().remove(&ticket);
        if self.lock.serving.get() == ticket {
            // Our turn came but we left: pass it on.
            self.lock.release();
        } else {
            self.lock.abandoned.borrow_mut().insert(ticket);
        }
    }
}

impl Drop for FifoGuard<'_> {
    fn drop(&mut self) {
        self.lock.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::task::noop_waker;

    fn poll<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        let waker = noop_waker();
        Pin::new(f).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn served_in_order_of_arrival_and_dropouts_are_skipped() {
        let lock = FifoLock::default();
        let g0 = match poll(&mut lock.lock()) {
            Poll::Ready(g) => g,
            Poll::Pending => panic!("free lock not granted"),
        };
        let (mut a, mut b, mut c) = (lock.lock(), lock.lock(), lock.lock());
        assert!(poll(&mut a).is_pending());
        assert!(poll(&mut b).is_pending());
        assert!(poll(&mut c).is_pending());
        drop(b);
        drop(g0);
        // c arrived after a: it must not overtake, even if polled first.
        assert!(poll(&mut c).is_pending());
        let ga = match poll(&mut a) {
            Poll::Ready(g) => g,
            Poll::Pending => panic!("first in line not granted"),
        };
        assert!(poll(&mut c).is_pending());
        drop(ga);
        assert!(
            poll(&mut c).is_ready(),
            "the abandoned place was not skipped"
        );
    }
}
