//! Noticing a connection that makes no progress, without touching a clock or the timer wheel on
//! the hot path.
//!
//! The connection counts progress (bytes read, reply bytes written, requests completed) in a
//! plain counter. A [`Watchdog`] looks at that counter a few times per timeout, on one timer
//! per connection that is re-armed only when it fires, and reports for how long the counter has
//! not moved. The connection decides from its own state whether that quiet means "idle" or
//! "stalled" and closes itself.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Checks per timeout: a quiet connection is noticed between 1 and 1 + 1/CHECKS timeouts
/// after its last progress.
const CHECKS: u32 = 4;

/// Watches a progress counter; see the module documentation.
pub struct Watchdog {
    period: Duration,
    timer: Option<Pin<Box<dyn Future<Output = ()>>>>,
    /// The counter at the last check.
    seen: u64,
    /// Consecutive checks that found the counter unchanged.
    quiet: u32,
}

impl Watchdog {
    /// A watchdog that can tell quiet spans of `shortest` (the smallest timeout its owner
    /// enforces) to within a quarter of it.
    pub fn new(shortest: Duration) -> Self {
        Self {
            period: (shortest / CHECKS).max(Duration::from_millis(1)),
            timer: None,
            seen: 0,
            quiet: 0,
        }
    }

    /// Ready at each check, with how long `progress` has certainly not moved (zero if it moved
    /// since the previous check). Pending between checks; keep polling it to keep it armed.
    pub fn poll_check(&mut self, cx: &mut Context<'_>, progress: u64) -> Poll<Duration> {
        let period = self.period;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(compio::time::sleep(period)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.timer = None;
        if progress != self.seen {
            self.seen = progress;
            self.quiet = 0;
        } else {
            self.quiet = self.quiet.saturating_add(1);
        }
        Poll::Ready(self.period * self.quiet)
    }
}
