//! The NBD gateway against real NBD clients from Debian's qemu-utils (installed by .ci/run).

mod common;

use common::Cluster;
use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

struct Gateway {
    child: Child,
    port: u16,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(c: &Cluster, exports: &str, extra: &[&str]) -> Gateway {
    let port = carmine_testkit::free_addr().port();
    let listen = format!("127.0.0.1:{port}");
    let child = c
        .cmd(
            &[
                &["nbd", "serve", "--export", exports, "--listen", &listen],
                extra,
            ]
            .concat(),
        )
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&listen).is_err() {
        assert!(
            Instant::now() < deadline,
            "nbd gateway did not start listening"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Gateway { child, port }
}

fn tool(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} is required (Debian package qemu-utils): {e}"))
}

fn ok(program: &str, args: &[&str]) -> String {
    let out = tool(program, args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program} {args:?} failed:\n{text}");
    text
}

fn url(g: &Gateway, export: &str) -> String {
    format!("nbd://127.0.0.1:{}/{export}", g.port)
}

#[test]
fn qemu_img_sees_the_volume_and_copies_data_in_and_out_identically() {
    let c = Cluster::up("nbd-qemu-img", &["--reactors", "2"]);
    c.ok(&["volume", "create", "disk", "--size", "64M"]);
    let g = serve(&c, "disk", &[]);
    let info = ok("qemu-img", &["info", &url(&g, "disk")]);
    assert!(
        info.contains("virtual size: 64 MiB (67108864 bytes)"),
        "{info}"
    );

    let dir = std::env::temp_dir().join(format!("carmine-nbd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("src.raw");
    let mut f = std::fs::File::create(&src).unwrap();
    let data: Vec<u8> = (0..(64u32 << 20))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    f.write_all(&data).unwrap();
    drop(f);
    let src = src.to_str().unwrap();
    ok(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src,
            &url(&g, "disk"),
        ],
    );
    let cmp = ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", src, &url(&g, "disk")],
    );
    assert!(cmp.contains("Images are identical"), "{cmp}");
    let back = dir.join("back.raw");
    ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &url(&g, "disk"),
            back.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "data copied out differs from data copied in"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn qemu_io_reads_writes_discards_and_zeroes_with_verification() {
    let c = Cluster::up("nbd-qemu-io", &[]);
    c.ok(&[
        "volume",
        "create",
        "disk",
        "--size",
        "16M",
        "--object-size",
        "1M",
    ]);
    let g = serve(&c, "disk", &[]);
    let cmds = [
        "write -P 0xab 1M 64k",
        "read -P 0xab 1M 64k",
        "write -P 0x11 1020k 8k",
        "read -P 0x11 1020k 8k",
        "aio_write -P 0x22 4M 4k",
        "aio_write -P 0x23 5M 4k",
        "aio_flush",
        "read -P 0x22 4M 4k",
        "read -P 0x23 5M 4k",
        "write -P 0x33 6M 2M",
        "discard 6M 1536k",
        "read -P 0 6M 1536k",
        "read -P 0x33 7680k 512k",
        "write -z 8M 64k",
        "read -P 0 8M 64k",
        "write -P 0x44 -f 9M 4k",
        "flush",
        "read -P 0 10M 1M",
    ];
    let mut args = vec!["-f", "raw"];
    for c in &cmds {
        args.extend(["-c", c]);
    }
    let u = url(&g, "disk");
    args.push(&u);
    let out = ok("qemu-io", &args);
    assert!(
        !out.contains("Pattern verification failed") && !out.contains("failed"),
        "{out}"
    );
    assert_eq!(
        out.matches("bytes at offset").count(),
        cmds.len() - 2,
        "{out}"
    );
}

#[test]
fn unknown_export_is_refused_and_read_only_exports_refuse_writes() {
    let c = Cluster::up("nbd-errors", &[]);
    c.ok(&["volume", "create", "disk", "--size", "8M"]);
    let g = serve(&c, "disk", &["--read-only"]);
    let out = tool("qemu-img", &["info", &url(&g, "nope")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no export named \"nope\""));
    let out = tool(
        "qemu-io",
        &["-r", "-f", "raw", "-c", "read -P 0 0 4k", &url(&g, "disk")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // qemu opens a read-only export read-only, so force a write through and expect a refusal.
    let out = tool(
        "qemu-io",
        &["-f", "raw", "-c", "write 0 4k", &url(&g, "disk")],
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() || text.contains("failed"),
        "a write to a read-only export succeeded: {text}"
    );
    assert!(
        text.contains("Permission denied") || text.contains("Operation not permitted"),
        "{text}"
    );
    // The gateway keeps serving after all of that.
    ok("qemu-img", &["info", &url(&g, "disk")]);
}

/// One writer per volume: a second gateway is refused while the first one serves; after the
/// first is killed -9, the next one waits out its lease, fences it and serves the same data.
#[test]
fn a_second_gateway_is_refused_and_a_dead_ones_lock_is_taken_over() {
    let c = Cluster::up("nbd-lock", &[]);
    c.ok(&["volume", "create", "disk", "--size", "8M"]);
    let mut first = serve(&c, "disk", &["--lock-lease", "1s"]);
    ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 0 64k",
            &url(&first, "disk"),
        ],
    );
    let out = c.run(&[
        "nbd",
        "serve",
        "--export",
        "disk",
        "--listen",
        "127.0.0.1:0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second writer gateway started");
    assert!(
        err.contains("is in use: locked by carmine nbd serve on 127.0.0.1"),
        "{err}"
    );
    assert!(c
        .ok(&["volume", "info", "disk"])
        .contains("lock: held by carmine nbd serve"));
    assert!(c.fails(&["volume", "rm", "disk"]).contains("in use"));
    // A reader needs no lock.
    let ro = serve(&c, "disk", &["--read-only"]);
    ok(
        "qemu-io",
        &[
            "-r",
            "-f",
            "raw",
            "-c",
            "read -P 0x5a 0 64k",
            &url(&ro, "disk"),
        ],
    );
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let t = Instant::now();
    let second = serve(&c, "disk", &[]);
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "took over a lease that had not run out: {:?}",
        t.elapsed()
    );
    ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x5a 0 64k",
            "-c",
            "write -P 0x6b 64k 64k",
            &url(&second, "disk"),
        ],
    );
}

/// A gateway stopped by SIGTERM hands its lock back (after fencing its own late requests), so
/// the next one starts at once instead of waiting out the 10 s lease.
#[test]
fn a_gateway_stopped_by_sigterm_releases_its_lock() {
    let c = Cluster::up("nbd-sigterm", &[]);
    c.ok(&["volume", "create", "disk", "--size", "8M"]);
    let mut first = serve(&c, "disk", &[]);
    ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x3c 0 128k",
            &url(&first, "disk"),
        ],
    );
    let pid = first.child.id().to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(kill.success());
    let status = first.child.wait().unwrap();
    assert!(status.success(), "gateway exit on SIGTERM: {status}");
    assert!(
        c.ok(&["volume", "info", "disk"]).contains("lock: none"),
        "the lock was not released"
    );
    let t = Instant::now();
    let second = serve(&c, "disk", &[]);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the next gateway waited {:?}",
        t.elapsed()
    );
    ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x3c 0 128k",
            &url(&second, "disk"),
        ],
    );
}

#[test]
fn a_serve_of_a_missing_volume_fails_clearly() {
    let c = Cluster::up("nbd-missing", &[]);
    let out = c.run(&[
        "nbd",
        "serve",
        "--export",
        "ghost",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no image named \"ghost\""));
}

#[test]
fn nbdinfo_lists_exports_and_nbdcopy_round_trips_a_file() {
    let c = Cluster::up("nbd-libnbd", &["--reactors", "2"]);
    c.ok(&["volume", "create", "disk", "--size", "32M"]);
    c.ok(&["volume", "create", "spare", "--size", "4M"]);
    let g = serve(&c, "disk,spare", &[]);
    let info = ok("nbdinfo", &[&url(&g, "disk")]);
    assert!(
        info.contains("export-size: 33554432") && info.contains("can_multi_conn: true"),
        "{info}"
    );
    let list = ok(
        "nbdinfo",
        &["--list", &format!("nbd://127.0.0.1:{}", g.port)],
    );
    assert!(
        list.contains("export=\"disk\"") && list.contains("export=\"spare\""),
        "{list}"
    );

    let dir = std::env::temp_dir().join(format!("carmine-nbdcopy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, back) = (dir.join("src"), dir.join("back"));
    let data: Vec<u8> = (0..(32u32 << 20))
        .map(|i| (i.wrapping_mul(0x9e37_79b9) >> 11) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    // nbdcopy uses several connections at once (multi-conn) and many requests in flight.
    ok("nbdcopy", &[src.to_str().unwrap(), &url(&g, "disk")]);
    ok("nbdcopy", &[&url(&g, "disk"), back.to_str().unwrap()]);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "nbdcopy out differs from nbdcopy in"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fio_nbd_engine_verifies_crc32c_over_random_writes() {
    let c = Cluster::up("nbd-fio", &[]);
    c.ok(&["volume", "create", "disk", "--size", "64M"]);
    let g = serve(&c, "disk", &[]);
    let u = url(&g, "disk");
    let uri = format!("--uri={u}");
    let out = ok(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--size=32M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--output-format=json",
        ],
    );
    let json_start = out.find('{').expect("fio printed JSON");
    let report = &out[json_start..];
    assert!(
        report.contains("\"error\" : 0"),
        "fio reported an error:\n{report}"
    );
    assert!(!report.contains("verify failed"), "{report}");
}

/// Removes what the filesystem test set up, even when it fails halfway.
struct FsCleanup {
    fuse_dir: std::path::PathBuf,
    fs_dir: std::path::PathBuf,
    loop_dev: Option<String>,
    nbdfuse: Option<Child>,
}

impl Drop for FsCleanup {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.fs_dir).output();
        if let Some(l) = &self.loop_dev {
            let _ = Command::new("losetup").args(["-d", l]).output();
        }
        // Unmounting the FUSE directory makes nbdfuse exit; kill it if it does not.
        let _ = Command::new("umount").arg(&self.fuse_dir).output();
        if let Some(mut c) = self.nbdfuse.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.fuse_dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.fuse_dir);
        let _ = std::fs::remove_dir_all(&self.fs_dir);
    }
}

/// mkfs.ext4 on the volume through nbdfuse and a loop device, mount, write, remount, read,
/// fsck. Needs root (loop devices and mounts); CI runs as root.
#[test]
fn a_real_ext4_filesystem_lives_on_a_volume() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED a_real_ext4_filesystem_lives_on_a_volume: needs root for loop devices and mount");
        return;
    }
    let c = Cluster::up("nbd-ext4", &["--reactors", "2"]);
    c.ok(&["volume", "create", "fs", "--size", "256M"]);
    let g = serve(&c, "fs", &[]);
    let base = std::env::temp_dir().join(format!("carmine-ext4-{}", std::process::id()));
    let mut cleanup = FsCleanup {
        fuse_dir: base.join("fuse"),
        fs_dir: base.join("mnt"),
        loop_dev: None,
        nbdfuse: None,
    };
    std::fs::create_dir_all(&cleanup.fuse_dir).unwrap();
    std::fs::create_dir_all(&cleanup.fs_dir).unwrap();
    cleanup.nbdfuse = Some(
        Command::new("nbdfuse")
            .arg(&cleanup.fuse_dir)
            .arg(url(&g, "fs"))
            .spawn()
            .expect("nbdfuse (Debian package nbdfuse)"),
    );
    let image = cleanup.fuse_dir.join("nbd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&image).map(|m| m.len()).unwrap_or(0) != 256 << 20 {
        assert!(
            Instant::now() < deadline,
            "nbdfuse did not expose the volume"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let l = ok("losetup", &["-f", "--show", image.to_str().unwrap()])
        .trim()
        .to_string();
    cleanup.loop_dev = Some(l.clone());
    let mnt = cleanup.fs_dir.to_str().unwrap().to_string();
    ok("mkfs.ext4", &["-q", "-F", &l]);
    ok("mount", &[&l, &mnt]);
    let payload: Vec<u8> = (0..(8u32 << 20))
        .map(|i| (i.wrapping_mul(2_246_822_519) >> 7) as u8)
        .collect();
    std::fs::write(cleanup.fs_dir.join("data.bin"), &payload).unwrap();
    std::fs::create_dir(cleanup.fs_dir.join("dir")).unwrap();
    std::fs::write(cleanup.fs_dir.join("dir/hello.txt"), b"hello carmine\n").unwrap();
    ok("umount", &[&mnt]);
    ok("mount", &[&l, &mnt]);
    assert!(
        std::fs::read(cleanup.fs_dir.join("data.bin")).unwrap() == payload,
        "file changed across remount"
    );
    assert_eq!(
        std::fs::read(cleanup.fs_dir.join("dir/hello.txt")).unwrap(),
        b"hello carmine\n"
    );
    ok("umount", &[&mnt]);
    let fsck = ok("fsck.ext4", &["-f", "-n", &l]);
    assert!(fsck.contains("Pass 5"), "{fsck}");
}

#[test]
fn exports_are_reachable_over_a_unix_socket_too() {
    let c = Cluster::up("nbd-unix", &[]);
    c.ok(&["volume", "create", "disk", "--size", "16M"]);
    let sock = c.dir.join("nbd.sock");
    let sock_s = sock.to_str().unwrap().to_string();
    let g = serve(&c, "disk", &["--unix", &sock_s]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "unix socket not created");
        std::thread::sleep(Duration::from_millis(20));
    }
    let unix_url = format!("nbd+unix:///disk?socket={sock_s}");
    let info = ok("nbdinfo", &[&unix_url]);
    assert!(info.contains("export-size: 16777216"), "{info}");
    let out = ok(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x5c 64k 64k", &unix_url],
    );
    assert!(out.contains("wrote 65536/65536"), "{out}");
    // The same data through TCP: both listeners serve the same volume.
    let out = ok(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x5c 64k 64k", &url(&g, "disk")],
    );
    assert!(!out.contains("failed"), "{out}");
}

/// An OSD of a cluster directory killed with SIGKILL and started again with the command line it
/// ran with, as an operator (or a supervisor) would after a crash. Dropping it stops the new
/// process.
struct RestartedOsd {
    child: Child,
}

impl Drop for RestartedOsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kill_and_restart_osd(c: &Cluster, id: u32) -> RestartedOsd {
    use std::os::unix::process::CommandExt;
    let pid_file = c.dir.join(format!("osd.{id}.pid"));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8(a.to_vec()).unwrap())
        .collect();
    assert!(
        argv.iter().any(|a| a == "osd"),
        "pid {pid} is not an OSD: {argv:?}"
    );
    // SAFETY: plain syscall on a pid just checked to be the cluster's OSD.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::alive(pid) {
        assert!(Instant::now() < deadline, "osd.{id} survived SIGKILL");
        std::thread::sleep(Duration::from_millis(10));
    }
    let log_path = c.dir.join(format!("osd.{id}.log"));
    loop {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&log_path)
            .unwrap();
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .process_group(0)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        std::fs::write(&pid_file, child.id().to_string()).unwrap();
        let ready = format!("osd.{id} ready (pid {})", child.id());
        loop {
            if std::fs::read_to_string(&log_path).unwrap().contains(&ready) {
                return RestartedOsd { child };
            }
            if child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "osd.{id} did not come back");
            std::thread::sleep(Duration::from_millis(10));
        }
        // The port the OSD listens on is in the ephemeral range, so an outgoing connection can
        // hold it for a moment while the OSD is down; try again until the deadline.
        let log = std::fs::read_to_string(&log_path).unwrap();
        assert!(
            log.contains("Address already in use") && Instant::now() < deadline,
            "osd.{id} failed to restart:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue #10: a guest writing through the gateway sees a stall, not an error, while the OSD
/// is killed and restarted, and every block it wrote verifies afterwards. Writes in flight when
/// the OSD died are in doubt and resent, which is safe: the same data at the same offset.
#[test]
fn fio_verifies_across_an_osd_killed_and_restarted_mid_run() {
    let c = Cluster::up(
        "nbd-osd-restart",
        &["--store", "native", "--device-size", "512M"],
    );
    c.ok(&["volume", "create", "disk", "--size", "64M"]);
    let g = serve(&c, "disk", &["--retry-timeout", "20s"]);
    // The store file is written in full when it is formatted; a new modification time means
    // new writes reached it.
    let store = c.dir.join("osd.0.store");
    let modified = || std::fs::metadata(&store).unwrap().modified().unwrap();
    let before = modified();
    let uri = format!("--uri={}", url(&g, "disk"));
    // Rate-limited so the write phase lasts a few seconds and the kill lands inside it.
    let mut fio = Command::new("fio")
        .args([
            "--name=restart",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--size=16M",
            "--iodepth=8",
            "--rate_iops=1500",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            // No verify state file left in the working directory.
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fio (Debian package fio)");
    struct Reap<'a>(&'a mut Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let fio = Reap(&mut fio);
    // Mid-run: once some of fio's writes reached the store.
    let deadline = Instant::now() + Duration::from_secs(30);
    while modified() == before {
        assert!(
            fio.0.try_wait().unwrap().is_none(),
            "fio ended before any write reached the store"
        );
        assert!(
            Instant::now() < deadline,
            "fio's writes never reached the store"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let _osd = kill_and_restart_osd(&c, 0);
    assert!(
        fio.0.try_wait().unwrap().is_none(),
        "fio finished before the OSD came back: nothing was tested"
    );
    while fio.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "fio did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::new();
    std::io::Read::read_to_string(fio.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(fio.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    let status = fio.0.wait().unwrap();
    assert!(status.success(), "fio failed:\n{err}\n{out}");
    let report = &out[out.find('{').expect("fio printed JSON")..];
    assert!(
        report.contains("\"error\" : 0") && !report.contains("verify failed"),
        "fio reported an error:\n{err}\n{report}"
    );
}

/// A `qemu-io` that stays connected and runs one command at a time: a client whose
/// connection outlives whatever happens to the gateway between its commands.
struct QemuIo {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl QemuIo {
    fn open(url: &str) -> QemuIo {
        let mut child = Command::new("qemu-io")
            .args(["-f", "raw", url])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("qemu-io (Debian package qemu-utils)");
        let stdin = child.stdin.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in std::io::BufRead::lines(std::io::BufReader::new(out)) {
                    let Ok(line) = line else { return };
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        QemuIo {
            child,
            stdin,
            lines,
        }
    }

    /// Runs `command` and returns the line that tells how it ended.
    fn run(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("qemu-io did not finish {command:?}"));
            if ["wrote", "read ", "failed", "error", "Pattern verification"]
                .iter()
                .any(|w| line.contains(w))
            {
                return line;
            }
        }
    }
}

impl Drop for QemuIo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--reactors 2`: connections go to both reactors in turn, each reactor sees the other's
/// writes, and both write as the one client instance that holds the volume's lock. When a
/// second gateway breaks that lock, the connections of *both* reactors are refused, not only
/// the one whose client took the lock.
#[test]
fn a_gateway_on_two_reactors_spreads_connections_and_loses_its_lock_on_both() {
    use std::io::BufRead;
    let c = Cluster::up("nbd-reactors", &[]);
    c.ok(&["volume", "create", "disk", "--size", "8M"]);
    let port = carmine_testkit::free_addr().port();
    let listen = format!("127.0.0.1:{port}");
    let mut first = Gateway {
        child: c
            .cmd(&[
                "nbd",
                "serve",
                "--export",
                "disk",
                "--listen",
                &listen,
                "--reactors",
                "2",
                "--lock-lease",
                "1s",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        port,
    };
    let mut said = std::io::BufReader::new(first.child.stdout.take().unwrap()).lines();
    loop {
        let line = said.next().expect("the gateway ended").unwrap();
        if line.contains("serving disk") {
            assert!(line.contains("2 reactors"), "{line}");
            break;
        }
    }
    // Consecutive connections land on different reactors.
    let mut one = QemuIo::open(&url(&first, "disk"));
    let mut two = QemuIo::open(&url(&first, "disk"));
    assert!(one.run("write -P 0x11 0 4k").contains("wrote"));
    assert!(two.run("write -P 0x22 4k 4k").contains("wrote"));
    assert!(one.run("read -P 0x22 4k 4k").contains("read "));
    assert!(two.run("read -P 0x11 0 4k").contains("read "));

    // The first gateway hangs; the second takes the lock over once the lease ran out, which
    // fences the first's client instance.
    let pid = first.child.id() as i32;
    // SAFETY: plain syscalls on the gateway this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let second = serve(&c, "disk", &[]);
    ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x33 0 8k",
            &url(&second, "disk"),
        ],
    );
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    for (client, at) in [(&mut one, 0), (&mut two, 4096)] {
        let out = client.run(&format!("write -P 0x44 {at} 4k"));
        assert!(
            out.contains("failed"),
            "a write through the gateway whose lock was broken: {out}"
        );
    }
    ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x33 0 8k",
            &url(&second, "disk"),
        ],
    );
    drop((one, two));
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let rest: Vec<String> = said.map_while(Result::ok).collect();
    assert!(first.child.wait().unwrap().success(), "{rest:?}");
    assert!(
        rest.iter()
            .any(|l| l.contains("connections per reactor: 1, 1")),
        "{rest:?}"
    );
}
