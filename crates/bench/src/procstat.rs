//! CPU time of processes from /proc/PID/stat (utime + stime).

/// Clock ticks (utime + stime) per pid; missing processes count as zero.
pub fn cpu_ticks(pids: &[i32]) -> Vec<u64> {
    pids.iter().map(|p| ticks(*p).unwrap_or(0)).collect()
}

fn ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// CPU seconds used by `pids` since `before` was sampled.
pub fn cpu_seconds_since(pids: &[i32], before: &[u64]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let after = cpu_ticks(pids);
    after
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b))
        .sum::<u64>() as f64
        / hz
}
