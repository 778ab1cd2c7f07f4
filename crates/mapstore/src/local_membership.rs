//! Liveness on one host, for clusters whose map is a file: the same roles as
//! [`crate::membership`] without etcd. A running OSD holds a lock on its registration file
//! `<dir>/alive/osd.N`, and the leading manager one on `<dir>/mgr.lock`. They are
//! open-file-description locks (`F_OFD_SETLK`): the kernel drops them the moment the process
//! dies, `kill -9` included, so nothing expires on a timer and a death is seen at once. A
//! process that is alive but stuck (stopped, hung) keeps its locks: on one host that is a hung
//! OSD, not a partition, and it stays up in the map as Ceph's would until its peers report it
//! (failure reports, `crate::failure_reports`, decision 0014).

use crate::membership::{host_name, Registration};
use crate::MapStoreError;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ALIVE_DIR: &str = "alive";
const LEADER_LOCK: &str = "mgr.lock";

fn io_err(what: &Path, e: std::io::Error) -> MapStoreError {
    MapStoreError::Unavailable(format!("{}: {e}", what.display()))
}

/// Locks all of `f` for writing, without waiting: false if another open file holds a lock.
fn try_lock(f: &File) -> std::io::Result<bool> {
    let mut fl = whole_file_write_lock();
    // SAFETY: plain fcntl on an open descriptor with a properly initialised flock struct.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Whether another open file holds a lock on `f` (asks; takes nothing).
fn locked_by_other(f: &File) -> std::io::Result<bool> {
    let mut fl = whole_file_write_lock();
    // SAFETY: as in `try_lock`; F_OFD_GETLK only fills in `fl`.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn whole_file_write_lock() -> libc::flock {
    // SAFETY: an all-zero flock is valid (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl
}

/// `flock` on the alive directory while a registration is checked and put in place, so two
/// OSDs with one id starting together cannot both register. Held until dropped (closing the
/// file releases it).
struct DirGuard {
    _file: File,
}

impl DirGuard {
    fn take(dir: &Path) -> Result<Self, MapStoreError> {
        Ok(DirGuard {
            _file: crate::lockfile::lock_exclusive(&dir.join(".lock"))?,
        })
    }
}

/// An OSD's registration, held while it runs (the lock goes with the process).
#[derive(Debug)]
pub struct LocalOsdLock {
    _file: File,
    path: PathBuf,
}

impl LocalOsdLock {
    /// Registers `reg` in `dir/alive`. Refused, with who holds it, while another live process
    /// has registered the same OSD id.
    pub fn register(dir: &Path, reg: &Registration) -> Result<Self, MapStoreError> {
        let alive = dir.join(ALIVE_DIR);
        std::fs::create_dir_all(&alive).map_err(|e| io_err(&alive, e))?;
        let _guard = DirGuard::take(&alive)?;
        let path = alive.join(format!("osd.{}", reg.osd));
        if let Some(holder) = live_holder(&path)? {
            return Err(MapStoreError::Invalid(match holder {
                Some(h) => format!(
                    "osd.{} is already running: pid {} on {} holds its registration",
                    reg.osd, h.pid, h.host
                ),
                None => format!("osd.{} is already registered", reg.osd),
            }));
        }
        // Written whole and locked before it takes the name: a reader never sees a locked
        // file without its registration, nor a half-written one.
        let tmp = alive.join(format!(".osd.{}.{}", reg.osd, std::process::id()));
        let mut f = File::options()
            .create(true)
            .truncate(true)
            .write(true)
            .read(true)
            .open(&tmp)
            .map_err(|e| io_err(&tmp, e))?;
        let json = serde_json::to_vec(reg).expect("a registration serializes");
        f.write_all(&json).map_err(|e| io_err(&tmp, e))?;
        if !try_lock(&f).map_err(|e| io_err(&tmp, e))? {
            return Err(MapStoreError::Invalid(format!(
                "{} is locked by another process",
                tmp.display()
            )));
        }
        std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, e))?;
        Ok(LocalOsdLock { _file: f, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `Some(registration)` if a live process holds `path` (`Some(None)` if its content does not
/// decode); `None` if nobody does or it does not exist.
fn read_if_locked(path: &Path) -> Result<Option<Option<Registration>>, MapStoreError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path, e)),
    };
    if !locked_by_other(&f).map_err(|e| io_err(path, e))? {
        return Ok(None);
    }
    let mut text = Vec::new();
    f.read_to_end(&mut text).map_err(|e| io_err(path, e))?;
    Ok(Some(serde_json::from_slice(&text).ok()))
}

/// Like [`read_if_locked`], but a holder registered on this host whose process is gone is
/// waited for (up to a few seconds) instead of reported: the lock goes with the last
/// reference to its open file, which the kernel may drop a moment after a killed process is
/// gone, and a restart in that moment must not be refused as a second OSD (seen in CI: a
/// kill -9 and an immediate restart).
fn live_holder(path: &Path) -> Result<Option<Option<Registration>>, MapStoreError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let holder = read_if_locked(path)?;
        let gone = matches!(&holder, Some(Some(h)) if h.host == host_name() && !pid_alive(h.pid));
        if !gone || Instant::now() >= deadline {
            return Ok(holder);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` of this host runs (a zombie, already exited, does not).
pub(crate) fn pid_alive(pid: u32) -> bool {
    // SAFETY: plain syscall; signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // The state follows the parenthesised command name in /proc/PID/stat.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
}

/// The registration of OSD `osd` in `dir`, if a live process holds it: lets a second process
/// with the same id stop before it touches the store or the ports (the exclusive check is
/// [`LocalOsdLock::register`]).
pub fn local_holder(dir: &Path, osd: u32) -> Result<Option<Registration>, MapStoreError> {
    let path = dir.join(ALIVE_DIR).join(format!("osd.{osd}"));
    Ok(live_holder(&path)?.flatten())
}

/// The OSDs registered now in `dir/alive`, by id: those whose process still holds its lock.
pub fn local_registered(dir: &Path) -> Result<BTreeMap<u32, Registration>, MapStoreError> {
    let alive = dir.join(ALIVE_DIR);
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(&alive) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io_err(&alive, e)),
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("osd.") {
            continue;
        }
        match read_if_locked(&e.path())? {
            Some(Some(r)) => {
                out.insert(r.osd, r);
            }
            Some(None) => tracing::warn!("ignoring registration {name}: it does not decode"),
            None => {}
        }
    }
    Ok(out)
}

/// The manager leadership of the cluster in a directory, while held.
#[derive(Debug)]
pub struct LocalLeadership {
    _file: File,
    name: String,
}

impl LocalLeadership {
    /// Becomes leader if nobody is: `None` while another live manager holds the lock.
    pub fn campaign(dir: &Path, name: &str) -> Result<Option<Self>, MapStoreError> {
        let path = dir.join(LEADER_LOCK);
        let mut f = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        if !try_lock(&f).map_err(|e| io_err(&path, e))? {
            return Ok(None);
        }
        // The leader's name, for `cluster status`.
        f.set_len(0)
            .and_then(|_| f.rewind())
            .and_then(|_| f.write_all(name.as_bytes()))
            .map_err(|e| io_err(&path, e))?;
        Ok(Some(LocalLeadership {
            _file: f,
            name: name.to_owned(),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The leading manager's name, if one leads the cluster in `dir`.
pub fn local_leader(dir: &Path) -> Result<Option<String>, MapStoreError> {
    let path = dir.join(LEADER_LOCK);
    let mut f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&path, e)),
    };
    if !locked_by_other(&f).map_err(|e| io_err(&path, e))? {
        return Ok(None);
    }
    let mut name = String::new();
    f.read_to_string(&mut name).map_err(|e| io_err(&path, e))?;
    Ok(Some(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(osd: u32) -> Registration {
        Registration {
            osd,
            host: "h".into(),
            pid: std::process::id(),
            reactors: vec!["127.0.0.1:1".parse().unwrap()],
            started: 1,
            capacity: 0,
            pid_ns: 0,
            boot_id: String::new(),
        }
    }

    fn temp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("carmine-local-live-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_registration_lasts_as_long_as_its_holder_and_is_exclusive() {
        let d = temp("osd");
        assert!(local_registered(&d).unwrap().is_empty());
        let held = LocalOsdLock::register(&d, &reg(3)).unwrap();
        assert_eq!(local_registered(&d).unwrap().get(&3), Some(&reg(3)));
        let e = LocalOsdLock::register(&d, &reg(3)).unwrap_err().to_string();
        assert!(e.contains("already running"), "{e}");
        let other = LocalOsdLock::register(&d, &reg(4)).unwrap();
        assert_eq!(local_registered(&d).unwrap().len(), 2);
        drop(held);
        // Gone with its holder (a crash closes the file the same way).
        assert_eq!(
            local_registered(&d).unwrap().keys().collect::<Vec<_>>(),
            vec![&4]
        );
        let again = LocalOsdLock::register(&d, &reg(3)).unwrap();
        assert_eq!(local_registered(&d).unwrap().len(), 2);
        drop((again, other));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A killed OSD's lock can outlive its process by a moment: a restart then waits for it
    /// instead of being refused as a second OSD; a live holder is still refused at once.
    #[test]
    fn a_lock_left_by_a_process_that_is_gone_is_waited_for_not_refused() {
        let d = temp("gone");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let dead = Registration {
            host: host_name(),
            pid: dead_pid,
            ..reg(5)
        };
        // The dead process's registration, its lock still held (here, by this process).
        let held = LocalOsdLock::register(&d, &dead).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let started = Instant::now();
        let again = LocalOsdLock::register(&d, &reg(5)).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(250));
        release.join().unwrap();
        // A holder whose process runs (this one) is refused without waiting.
        let started = Instant::now();
        let e = LocalOsdLock::register(&d, &reg(5)).unwrap_err().to_string();
        assert!(e.contains("already running"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(again);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn one_manager_leads_until_it_goes() {
        let d = temp("mgr");
        assert_eq!(local_leader(&d).unwrap(), None);
        let a = LocalLeadership::campaign(&d, "mgr.a").unwrap().unwrap();
        assert!(LocalLeadership::campaign(&d, "mgr.b").unwrap().is_none());
        assert_eq!(local_leader(&d).unwrap().as_deref(), Some("mgr.a"));
        drop(a);
        assert_eq!(local_leader(&d).unwrap(), None);
        let b = LocalLeadership::campaign(&d, "mgr.b").unwrap().unwrap();
        assert_eq!(local_leader(&d).unwrap().as_deref(), Some(b.name()));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
