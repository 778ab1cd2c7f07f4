//! Shared by the end-to-end tests: a cluster of real OSD processes in a temporary directory.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_carmine");

pub struct Cluster {
    pub dir: PathBuf,
}

impl Cluster {
    pub fn up(name: &str, extra: &[&str]) -> Cluster {
        let dir = std::env::temp_dir().join(format!("carmine-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = Cluster { dir };
        // A memory budget that suits the test machine, unless the test sets its own.
        let budget: &[&str] = if extra.contains(&"--memory-limit") {
            &[]
        } else {
            &["--memory-limit", "1536M"]
        };
        let out = c.run(&[&["cluster", "up", "--no-pin"], budget, extra].concat());
        assert!(
            out.status.success(),
            "cluster up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args).env("CARMINE_DIR", &self.dir);
        // Daemons log at warn unless CARMINE_TEST_OSD_LOG says otherwise (for debugging).
        match std::env::var_os("CARMINE_TEST_OSD_LOG") {
            Some(filter) => c.env("CARMINE_LOG", filter),
            None => c.env_remove("CARMINE_LOG"),
        };
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("running carmine")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "carmine {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "carmine {args:?} should have failed");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Creates volume `name` of `size` in objects of `object_size` (sizes as the CLI takes them).
    pub fn create_volume(&self, name: &str, size: &str, object_size: &str) {
        self.ok(&[
            "volume",
            "create",
            name,
            "--size",
            size,
            "--object-size",
            object_size,
        ]);
    }

    /// Writes `data` at the start of volume `name` through `carmine volume write`.
    pub fn write_volume(&self, name: &str, data: &[u8]) {
        use std::io::Write;
        let mut w = self
            .cmd(&["volume", "write", name, "--file", "-", "-q"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        w.stdin.take().unwrap().write_all(data).unwrap();
        assert!(w.wait().unwrap().success(), "volume write {name} failed");
    }

    /// The pids recorded for every daemon of the cluster: OSDs and managers.
    pub fn pids(&self) -> Vec<i32> {
        self.pids_of("")
    }

    /// The pid recorded for OSD `id`.
    pub fn osd_pid(&self, id: u32) -> i32 {
        std::fs::read_to_string(self.dir.join(format!("osd.{id}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// The pids recorded for its OSDs.
    pub fn osd_pids(&self) -> Vec<i32> {
        self.pids_of("osd.")
    }

    fn pids_of(&self, prefix: &str) -> Vec<i32> {
        std::fs::read_dir(&self.dir)
            .unwrap()
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with(prefix) && n.ends_with(".pid")
            })
            .map(|e| {
                std::fs::read_to_string(e.path())
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap()
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.run(&["cluster", "down"]);
        if std::thread::panicking() && std::env::var_os("CARMINE_KEEP_FAILED").is_some() {
            // The logs of a failed test, for whoever debugs it.
            eprintln!("kept {} (CARMINE_KEEP_FAILED)", self.dir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Kills `pid` with SIGKILL and returns once it has exited: the signal is delivered
/// asynchronously, and a test that restarts the OSD at once must not find the old process
/// still holding its registration.
pub fn kill9(pid: i32) {
    // SAFETY: plain syscall on a pid this test's cluster started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "pid {pid} survived SIGKILL"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

pub fn alive(pid: i32) -> bool {
    // A zombie is not alive: it has exited and waits to be reaped by its parent.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// The sum of metric `name` over OSD `id`'s reactors.
pub fn metric(c: &Cluster, id: u32, name: &str) -> u64 {
    let addr = std::fs::read_to_string(carmine_localcluster::metrics_path(&c.dir, id)).unwrap();
    let text = ureq::get(&format!("http://{}/metrics", addr.trim()))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Sends `sig` to a process of the test's cluster.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: plain syscall on a pid this test's cluster started.
    unsafe { libc::kill(pid, sig) };
}

/// Stops a process of the test's cluster with SIGSTOP and returns once every one of its
/// threads has stopped. `kill` returns before that: one thread must first take the signal and
/// only then are the others told, so on a busy machine a reactor may still serve requests for
/// a while after `kill` returned.
pub fn stop(pid: i32) {
    signal(pid, libc::SIGSTOP);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
                    .collect()
            })
            .unwrap_or_default();
        // The state is the field after the command name, which is in parentheses.
        let stopped = |stat: &String| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|s| s == "T" || s == "t")
        };
        if !tasks.is_empty() && tasks.iter().all(stopped) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} did not stop within 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Continues a stopped OSD whatever happens to the test, so that `cluster down` can stop it.
pub struct Continue(pub i32);

impl Drop for Continue {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

/// A small filesystem, loop-mounted (needs root; skipped with a note otherwise).
pub struct SmallFs {
    pub image: std::path::PathBuf,
    pub mount: std::path::PathBuf,
}

impl SmallFs {
    pub fn mount(name: &str, size: &str) -> Option<SmallFs> {
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a loop filesystem needs root");
            return None;
        }
        let base = std::env::temp_dir().join(format!("carmine-{name}-{}", std::process::id()));
        let fs = SmallFs {
            image: base.with_extension("img"),
            mount: base.with_extension("mnt"),
        };
        std::fs::create_dir_all(&fs.mount).unwrap();
        let run = |cmd: &str, args: &[&std::ffi::OsStr]| {
            let st = Command::new(cmd).args(args).status().unwrap();
            assert!(st.success(), "{cmd} {args:?}");
        };
        run(
            "truncate",
            &["-s".as_ref(), size.as_ref(), fs.image.as_os_str()],
        );
        run("mkfs.ext4", &["-q".as_ref(), fs.image.as_os_str()]);
        let mounted = Command::new("mount")
            // An error turns it read-only, as a failing disk's filesystem does (`fail`).
            .args(["-o", "loop,errors=remount-ro"])
            .arg(&fs.image)
            .arg(&fs.mount)
            .status()
            .unwrap();
        if !mounted.success() {
            // Root without the right to mount (a container): nothing to test here.
            eprintln!("skipped: mounting a loop filesystem failed");
            let _ = std::fs::remove_dir(&fs.mount);
            let _ = std::fs::remove_file(&fs.image);
            return None;
        }
        Some(fs)
    }

    /// Where `fail` writes, if this kernel has it.
    fn error_trigger(&self) -> Option<String> {
        let out = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(&self.mount)
            .output()
            .ok()?;
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let path = format!("/sys/fs/ext4/{}/trigger_fs_error", dev.rsplit('/').next()?);
        std::path::Path::new(&path).exists().then_some(path)
    }

    /// Whether `fail` can work here (kernels without ext4's error trigger cannot).
    pub fn can_fail(&self) -> bool {
        let can = self.error_trigger().is_some();
        if !can {
            eprintln!("skipped: this kernel has no ext4 trigger_fs_error");
        }
        can
    }

    /// Makes the filesystem fail as on a disk error: every write to it from then on, through
    /// descriptors already open too, fails (EROFS here; on some kernels EIO, reads too).
    pub fn fail(&self) {
        let path = self.error_trigger().expect("checked by can_fail");
        std::fs::write(&path, "test\n").unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_file(&self.image);
    }
}
