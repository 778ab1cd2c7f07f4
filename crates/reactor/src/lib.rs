//! The reactor layer: thread-per-core runtime, CPU placement, cross-core mailboxes.

pub mod cpu;
