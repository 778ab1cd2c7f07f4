//! Bounded cross-thread message queues. A reactor owns its receiving end; senders get
//! back-pressure (they wait) when the mailbox is full, so no queue grows without bound.

use futures::channel::mpsc;
use futures::StreamExt;

/// Creates a mailbox holding at most `capacity` undelivered messages per sender.
pub fn mailbox<T>(capacity: usize) -> (MailboxSender<T>, Mailbox<T>) {
    let (tx, rx) = mpsc::channel(capacity);
    (MailboxSender(tx), Mailbox(rx))
}

pub struct MailboxSender<T>(mpsc::Sender<T>);

impl<T> Clone for MailboxSender<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> MailboxSender<T> {
    /// Delivers `msg`, waiting while the mailbox is full. Fails if the receiver is gone.
    pub async fn send(&mut self, msg: T) -> Result<(), T> {
        let mut msg = Some(msg);
        futures::future::poll_fn(|cx| self.0.poll_ready(cx))
            .await
            .map_err(|_| msg.take().expect("unsent"))?;
        self.0
            .try_send(msg.take().expect("unsent"))
            .map_err(|e| e.into_inner())
    }

    /// Delivers `msg` from a plain (non-reactor) thread, blocking while the mailbox is full.
    pub fn send_blocking(&mut self, msg: T) -> Result<(), T> {
        futures::executor::block_on(self.send(msg))
    }
}

pub struct Mailbox<T>(mpsc::Receiver<T>);

impl<T> Mailbox<T> {
    /// The next message, or `None` once every sender is gone.
    pub async fn recv(&mut self) -> Option<T> {
        self.0.next().await
    }
}
