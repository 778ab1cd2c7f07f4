//! The kernel's cpulist format (`0-3,8,10-11`), used by sysfs and by `--cpu-set`.

use super::CpuError;

/// Largest cpu id accepted in a cpu list: far above any machine, small enough that a typo
/// such as `0-4000000000` cannot allocate gigabytes.
pub(crate) const CPU_ID_MAX: u32 = 1 << 16;

/// Parses a cpulist such as `0-3,8,10-11` into sorted, unique cpu ids.
///
/// Whitespace around the list and its elements is ignored (sysfs files end in a newline).
/// An empty list is an error: for user input it is almost certainly a mistake, and the one
/// sysfs file that may legitimately be empty (a memory-only NUMA node) is checked by its reader.
pub fn parse_cpu_list(s: &str) -> Result<Vec<u32>, CpuError> {
    let bad = |reason: &'static str| CpuError::BadList {
        input: s.to_string(),
        reason,
    };
    let trimmed = s.trim();
    if trimmed.is_empty() {
        return Err(bad("empty list"));
    }
    let mut out = Vec::new();
    for part in trimmed.split(',').map(str::trim) {
        let (lo, hi) = parse_element(part).map_err(bad)?;
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// One element: `N` or `N-M`, both bounds inclusive.
fn parse_element(part: &str) -> Result<(u32, u32), &'static str> {
    if part.is_empty() {
        return Err("empty element");
    }
    let (lo, hi) = match part.split_once('-') {
        Some((a, b)) => (parse_id(a.trim())?, parse_id(b.trim())?),
        None => {
            let id = parse_id(part)?;
            (id, id)
        }
    };
    if lo > hi {
        return Err("range is reversed");
    }
    Ok((lo, hi))
}

/// A cpu id: decimal digits only (no sign, no hex), at most [`CPU_ID_MAX`].
fn parse_id(s: &str) -> Result<u32, &'static str> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a cpu number");
    }
    match s.parse::<u32>() {
        Ok(id) if id <= CPU_ID_MAX => Ok(id),
        _ => Err("cpu number too large"),
    }
}

/// The compact cpulist form of `cpus` (in any order, duplicates allowed): `0-3,8,10-11`.
/// The inverse of [`parse_cpu_list`], so placements can be printed the way `taskset -c` and
/// sysfs show them.
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j].saturating_add(1) {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    parts.join(",")
}
