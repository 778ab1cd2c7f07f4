//! End-to-end: the real `carmine` binary, real OSD processes, real sockets.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

mod common;

use common::{alive, Cluster, BIN};

fn pattern_block(off: u64, buf: &mut [u8]) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        let v = (off + 8 * i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed;
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// Streams `size` bytes of a position-dependent pattern into `volume write` through stdin,
/// reads them back through `volume read` on stdout and compares every byte.
fn write_and_verify(c: &Cluster, volume: &str, size: u64) {
    const CHUNK: usize = 1 << 20;
    let mut writer = c
        .cmd(&["volume", "write", volume, "--quiet"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = writer.stdin.take().unwrap();
    let mut buf = vec![0u8; CHUNK];
    for off in (0..size).step_by(CHUNK) {
        pattern_block(off, &mut buf);
        stdin.write_all(&buf).unwrap();
    }
    drop(stdin);
    assert!(writer.wait().unwrap().success(), "volume write failed");

    let mut reader = c
        .cmd(&["volume", "read", volume, "--length", &size.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = reader.stdout.take().unwrap();
    let mut got = vec![0u8; CHUNK];
    for off in (0..size).step_by(CHUNK) {
        stdout.read_exact(&mut got).unwrap();
        pattern_block(off, &mut buf);
        if got != buf {
            let at = got.iter().zip(&buf).position(|(a, b)| a != b).unwrap();
            panic!("volume {volume}: mismatch at byte {}", off + at as u64);
        }
    }
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "read returned {} extra bytes", rest.len());
    assert!(reader.wait().unwrap().success());
}

#[test]
fn a_gibibyte_volume_written_through_osd_processes_reads_back_identically() {
    let c = Cluster::up("gib", &["--osds", "2", "--reactors", "2"]);
    c.ok(&["volume", "create", "big", "--size", "1G"]);
    write_and_verify(&c, "big", 1 << 30);
}

#[test]
fn cluster_down_leaves_no_process_behind() {
    let c = Cluster::up("down", &["--osds", "2", "--reactors", "2"]);
    assert_eq!(c.osd_pids().len(), 2);
    // Two OSDs and the two managers.
    let pids = c.pids();
    assert_eq!(pids.len(), 4);
    assert!(pids.iter().all(|p| alive(*p)));
    let status = c.ok(&["cluster", "status"]);
    assert!(
        status.contains("reactor 1") && status.contains("up"),
        "{status}"
    );
    c.ok(&["cluster", "down"]);
    for p in pids {
        assert!(!alive(p), "pid {p} survived cluster down");
    }
    assert!(c.pids().is_empty(), "pid files left behind");
    c.fails(&["cluster", "status"]);
}

#[test]
fn volume_commands_manage_images_and_report_errors_clearly() {
    let c = Cluster::up("vol", &[]);
    c.ok(&[
        "volume",
        "create",
        "a",
        "--size",
        "64M",
        "--object-size",
        "1M",
    ]);
    c.ok(&["volume", "create", "b", "--size", "1M"]);
    assert_eq!(c.ok(&["volume", "ls"]), "a\nb\n");
    let info = c.ok(&["volume", "info", "a"]);
    assert!(
        info.contains("size: 64 MiB") && info.contains("object_size: 1 MiB"),
        "{info}"
    );
    c.ok(&["volume", "resize", "a", "--size", "128M"]);
    assert!(c.ok(&["volume", "info", "a"]).contains("size: 128 MiB"));
    write_and_verify(&c, "a", 8 << 20);
    c.ok(&["volume", "rm", "a"]);
    assert_eq!(c.ok(&["volume", "ls"]), "b\n");

    assert!(c
        .fails(&["volume", "info", "nope"])
        .contains("no image named \"nope\""));
    assert!(c
        .fails(&["volume", "create", "b", "--size", "1M"])
        .contains("already exists"));
    assert!(c
        .fails(&["volume", "ls", "--pool", "nopool"])
        .contains("no pool named"));
    assert!(c
        .fails(&["volume", "read", "b", "--offset", "1M", "--length", "1"])
        .contains("beyond the end"));
    let out = c
        .cmd(&["volume", "write", "b", "--offset", "1048000"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = out;
    child.stdin.take().unwrap().write_all(&[1u8; 4096]).unwrap();
    let res = child.wait_with_output().unwrap();
    assert!(!res.status.success());
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(stderr.contains("beyond the end"), "{stderr}");
}

#[test]
fn a_second_cluster_up_in_the_same_directory_is_refused() {
    let c = Cluster::up("twice", &[]);
    let err = c.fails(&["cluster", "up", "--no-pin"]);
    assert!(err.contains("already running"), "{err}");
}

#[test]
fn status_reports_a_killed_osd() {
    let c = Cluster::up("kill", &["--osds", "2"]);
    let pid = std::fs::read_to_string(c.dir.join("osd.1.pid"))
        .unwrap()
        .trim()
        .parse::<i32>()
        .unwrap();
    // SAFETY: plain syscall on a pid this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = c.run(&["cluster", "status"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("osd.1: NOT RUNNING") && text.contains("DOWN"),
        "{text}"
    );
}

#[test]
fn demo_runs_end_to_end() {
    let dir = std::env::temp_dir().join(format!("carmine-e2e-demo-{}", std::process::id()));
    let out = Command::new(BIN)
        .args(["demo", "--size", "64M", "--step-secs", "0.3", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("read back and verified") && text.contains("demo passed"),
        "{text}"
    );
}

#[test]
fn osd_reactors_poll_by_default_only_on_cores_of_their_own() {
    let poll_line = |name: &str, extra: &[&str]| {
        let dir = std::env::temp_dir().join(format!("carmine-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = Cluster { dir };
        c.ok(&[
            &["cluster", "up", "--memory-limit", "256M", "--reactors", "1"],
            extra,
        ]
        .concat());
        let log = std::fs::read_to_string(c.dir.join("osd.0.log")).unwrap();
        log.lines()
            .find(|l| l.contains("idle poll"))
            .unwrap_or_else(|| panic!("no idle poll line in osd.0.log:\n{log}"))
            .to_string()
    };
    // Two OSDs pinned to one cpu: a poller would take turns from the other.
    let shared = poll_line("poll-shared", &["--osds", "2", "--cpu-set", "0"]);
    assert!(shared.contains("idle poll 0 µs"), "{shared}");
    // One OSD, one reactor, one cpu of its own.
    let own = poll_line("poll-own", &["--osds", "1", "--cpu-set", "0"]);
    assert!(own.contains("idle poll 50 µs"), "{own}");
    // Not pinned: the scheduler moves it, so it does not know whom it would slow down.
    let unpinned = poll_line("poll-unpinned", &["--osds", "1", "--no-pin"]);
    assert!(unpinned.contains("idle poll 0 µs"), "{unpinned}");
    // Pinned without a cpu set: placed on any core, beside clients and whatever else runs.
    let anywhere = poll_line("poll-anywhere", &["--osds", "1"]);
    assert!(anywhere.contains("idle poll 0 µs"), "{anywhere}");
    // Given, it is obeyed.
    let given = poll_line(
        "poll-given",
        &["--osds", "2", "--cpu-set", "0", "--idle-poll-us", "20"],
    );
    assert!(given.contains("idle poll 20 µs"), "{given}");
}
