//! A text grid of a placement, like the figures of the seed blog (and Crimson's
//! `tasksetcpu.py`): one row per socket, one column per physical core.
//!
//! ```text
//! cpu policy osd: 2 OSDs x 2 reactors; cell = osd.reactor, . = free
//! socket 0 | 0.0 0.1   .   .
//!      cpu |   0   1   2   3
//! socket 1 | 1.0 1.1   .   .
//!      cpu |   4   5   6   7
//! ```

use super::{Allocation, CpuTopology};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Cores per printed row: a 56-core socket wraps into two rows of about 140 columns.
const CORES_PER_ROW: usize = 28;

/// Renders `alloc` over every physical core of `topo`.
pub(super) fn render(alloc: &Allocation, topo: &CpuTopology) -> String {
    let cells = cells(alloc, topo);
    let rows = topo.physical_cores(None);
    let width = rows
        .values()
        .flatten()
        .map(|c| cells.get(c).map_or(0, String::len).max(c.to_string().len()))
        .max()
        .unwrap_or(0)
        .max(3);
    let mut out = header(alloc, topo);
    for (socket, cores) in &rows {
        for (i, chunk) in cores.chunks(CORES_PER_ROW).enumerate() {
            let label = if i == 0 {
                format!("socket {socket}")
            } else {
                String::new()
            };
            push_row(&mut out, &label, chunk, width, |c| {
                cells.get(c).cloned().unwrap_or_else(|| ".".to_string())
            });
            push_row(&mut out, "cpu", chunk, width, u32::to_string);
        }
    }
    out
}

/// The policy, the request and a legend, plus the oversubscription and coincidence notes.
fn header(alloc: &Allocation, topo: &CpuTopology) -> String {
    let mut s = format!(
        "cpu policy {}: {} OSDs x {} reactors; cell = osd.reactor, . = free",
        alloc.policy,
        alloc.osds(),
        alloc.reactors_per_osd()
    );
    if restricted(alloc, topo) {
        s.push_str(", - = outside the allowed cpu set");
    }
    if alloc.oversubscribed {
        s.push_str(", +N = N more reactors on that core");
        s.push_str("\nOVERSUBSCRIBED: too few physical cores, some run several reactors");
    }
    s.push('\n');
    if let Some(note) = alloc.policies_coincide_note() {
        s.push_str(note);
        s.push('\n');
    }
    s
}

/// Whether some physical core of the machine was outside the allowed set.
fn restricted(alloc: &Allocation, topo: &CpuTopology) -> bool {
    let all = topo
        .physical_cores(None)
        .values()
        .map(Vec::len)
        .sum::<usize>();
    all != alloc.usable_cores().len()
}

/// The text of every non-free cell: `o.r`, `o.r+N` when N more reactors share the core, or
/// `-` for cores outside the allowed set.
fn cells(alloc: &Allocation, topo: &CpuTopology) -> BTreeMap<u32, String> {
    let mut owners: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for (o, cpus) in alloc.iter() {
        for (r, c) in cpus.iter().enumerate() {
            owners.entry(*c).or_default().push(format!("{o}.{r}"));
        }
    }
    let usable: BTreeSet<u32> = alloc.usable_cores().iter().copied().collect();
    let mut out: BTreeMap<u32, String> = topo
        .physical_cores(None)
        .values()
        .flatten()
        .filter(|c| !usable.contains(c))
        .map(|c| (*c, "-".to_string()))
        .collect();
    for (cpu, names) in owners {
        let more = names.len() - 1;
        let first = names.into_iter().next().unwrap_or_default();
        let text = if more == 0 {
            first
        } else {
            format!("{first}+{more}")
        };
        out.insert(cpu, text);
    }
    out
}

fn push_row(
    out: &mut String,
    label: &str,
    cores: &[u32],
    width: usize,
    cell: impl Fn(&u32) -> String,
) {
    let _ = write!(out, "{label:>8} |");
    for c in cores {
        let _ = write!(out, " {:>width$}", cell(c));
    }
    out.push('\n');
}
