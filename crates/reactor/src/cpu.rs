//! CPU topology and reactor placement, after Crimson's `vstart.sh --crimson-balance-cpu`.
//!
//! Every reactor is a busy, shared-nothing thread, so it gets a whole physical core: only the
//! first hardware thread of each core is ever handed out, and its SMT siblings stay idle (a
//! sibling would steal execution units from the reactor). The cores can further be restricted
//! to an allowed set (`--cpu-set`) so that the rest stay free for benchmark clients.
//!
//! Policies ([`CpuPolicy`]):
//! - `default`: reactors take the allowed cores in cpu order, OSD 0 first, contiguously;
//! - `osd`: all reactors of an OSD on one socket, OSD `i` on socket `i % sockets`;
//! - `socket`: each OSD's reactors split evenly over the sockets.
//!
//! On a machine with one socket the three policies give the same placement, and
//! [`Allocation::policies_coincide_note`] says so, so reports never invent differences.
//!
//! The module is pure logic over a [`CpuTopology`] (read from `/sys` or built synthetically),
//! plus thin `sched_{set,get}affinity` wrappers; it needs no runtime.

mod affinity;
mod grid;
mod list;
mod policy;
mod topology;

pub use affinity::{available_cpus, current_thread_affinity, pin_current_thread};
pub use list::{format_cpu_list, parse_cpu_list};
pub use policy::{allocate, Allocation, CpuPolicy};
pub use topology::{Cpu, CpuTopology};

use std::io;
use std::path::PathBuf;
use thiserror::Error;

/// Everything that can go wrong reading a topology or placing reactors. Each variant carries
/// enough context (file, content, numbers) to act on the message without a debugger.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CpuError {
    /// A cpulist string (user input such as `--cpu-set`) is malformed.
    #[error("invalid cpu list {input:?}: {reason}")]
    BadList { input: String, reason: &'static str },
    /// A sysfs file could not be read.
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    /// A sysfs file holds something the kernel never writes there.
    #[error("unexpected content {content:?} in {path}: {reason}")]
    BadSysfs {
        path: PathBuf,
        content: String,
        reason: &'static str,
    },
    /// A policy name other than `default`, `osd` or `socket`.
    #[error("unknown cpu policy {0:?} (expected default, osd or socket)")]
    BadPolicy(String),
    /// The allowed set names cpus the topology does not have (a typo in `--cpu-set`, or an
    /// offline cpu); refusing beats silently running on fewer cores than asked.
    #[error("the allowed cpu set names cpus {cpus} that are not online (online: {online})")]
    NotOnline { cpus: String, online: String },
    /// Too few physical cores for the request and oversubscription was not allowed.
    #[error(
        "not enough physical cores {scope}: {needed} needed, {available} available \
         (SMT siblings are never used)"
    )]
    NotEnoughCores {
        needed: u32,
        available: u32,
        scope: String,
    },
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod prop_tests;
