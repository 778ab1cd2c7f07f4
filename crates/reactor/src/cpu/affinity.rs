//! Thin wrappers over `sched_setaffinity` / `sched_getaffinity`.
//!
//! They use the fixed-size `cpu_set_t` (1024 cpus), which covers every machine this project
//! targets; larger cpu ids are rejected rather than silently ignored.

use std::io;
use std::mem::size_of;

const SET_SIZE: usize = libc::CPU_SETSIZE as usize;

/// Pins the calling thread to `cpu`, so a reactor never migrates and its caches stay warm.
pub fn pin_current_thread(cpu: u32) -> io::Result<()> {
    let index = cpu as usize;
    if index >= SET_SIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} is beyond the {SET_SIZE}-cpu affinity mask"),
        ));
    }
    // SAFETY: cpu_set_t is plain data and all-zero is the empty set; `index` is in range;
    // the kernel only reads `size_of::<cpu_set_t>()` bytes from `set`.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(index, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The cpus the calling thread may run on, ascending.
pub fn current_thread_affinity() -> io::Result<Vec<u32>> {
    affinity_of(0)
}

/// The cpus this process may run on (the main thread's mask, as `taskset -p` shows it),
/// ascending: the cpus a `--cpu-set` or container limit left us. Falls back to the calling
/// thread's mask, and is empty only if the kernel refuses both queries.
pub fn available_cpus() -> Vec<u32> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    affinity_of(pid)
        .or_else(|_| affinity_of(0))
        .unwrap_or_default()
}

/// The affinity mask of thread `tid` (0 = the calling thread).
fn affinity_of(tid: libc::pid_t) -> io::Result<Vec<u32>> {
    // SAFETY: as in `pin_current_thread`; the kernel writes at most `size_of` bytes into `set`,
    // and CPU_ISSET is only called with indices below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..SET_SIZE)
            .filter(|c| libc::CPU_ISSET(*c, &set))
            .filter_map(|c| u32::try_from(c).ok())
            .collect())
    }
}
