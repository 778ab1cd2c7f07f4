//! Restarts and careless operators (issue #10): a damaged superblock, a second `cluster up`,
//! a non-blank device and a closed stdout must never cost data or crash the CLI.

use std::process::{Command, Stdio};

mod common;

use common::{alive, Cluster, SmallFs, BIN};

const NATIVE: &[&str] = &["--store", "native", "--device-size", "512M"];

fn read_volume(c: &Cluster, name: &str, len: usize) -> Vec<u8> {
    let out = c.run(&[
        "volume",
        "read",
        name,
        "--length",
        &len.to_string(),
        "--file",
        "-",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn flip(path: &std::path::Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x10;
    f.write_all_at(&b, offset).unwrap();
    f.sync_all().unwrap();
}

fn digest(path: &std::path::Path) -> u32 {
    carmine_types::crc32c(&std::fs::read(path).unwrap())
}

fn kill_all(c: &Cluster) {
    for pid in c.pids() {
        // SAFETY: plain syscall on a pid this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while c.pids().iter().any(|p| alive(*p)) {
        assert!(std::time::Instant::now() < deadline, "OSDs did not die");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_damaged_superblock_never_reformats_the_store() {
    let c = Cluster::up("sb", NATIVE);
    c.ok(&["volume", "create", "v", "--size", "16M"]);
    let data = pattern(1 << 20, 7);
    c.write_volume("v", &data);
    c.ok(&["cluster", "down"]);
    let store = c.dir.join("osd.0.store");

    // One bad byte in the primary: the backup copy carries the mount, with a warning.
    flip(&store, 20);
    c.ok(&["cluster", "up", "--no-pin"]);
    assert_eq!(read_volume(&c, "v", data.len()), data);
    c.ok(&["cluster", "down"]);
    let fsck = c.run(&["store", "fsck", "--device", store.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&fsck.stdout);
    assert!(text.contains("primary superblock damaged"), "{text}");

    // Both copies bad: the OSD refuses, says why, and the file is left exactly as it was.
    flip(&store, carmine_nativestore::SUPER_BACKUP_OFFSET + 20);
    let before = digest(&store);
    let err = c.fails(&["cluster", "up", "--no-pin"]);
    assert!(err.contains("refusing to touch the device"), "{err}");
    assert_eq!(digest(&store), before, "a refused start changed the store");
}

#[test]
fn cluster_up_on_an_existing_directory_restarts_that_cluster() {
    let c = Cluster::up("restart", &[NATIVE, &["--osds", "2", "--dsync"]].concat());
    c.ok(&["volume", "create", "v", "--size", "64M"]);
    let data = pattern(4 << 20, 3);
    c.write_volume("v", &data);
    let epoch = carmine_localcluster::read_map(&c.dir).unwrap().epoch;
    kill_all(&c);

    // Flags that contradict the cluster are refused before anything starts.
    let err = c.fails(&["cluster", "up", "--no-pin", "--osds", "1"]);
    assert!(err.contains("--osds 1 (the cluster has 2)"), "{err}");
    let err = c.fails(&["cluster", "up", "--no-pin", "--store", "memory"]);
    assert!(err.contains("--store memory"), "{err}");

    let out = c.ok(&["cluster", "up", "--no-pin"]);
    assert!(out.contains("restarting osd.0, osd.1 from"), "{out}");
    let map = carmine_localcluster::read_map(&c.dir).unwrap();
    assert_eq!(map.osds.len(), 2);
    assert_eq!(map.epoch, epoch, "a restart changed the map");
    assert_eq!(read_volume(&c, "v", data.len()), data);

    // One OSD killed: `up` brings back just that one.
    let pid1: i32 = std::fs::read_to_string(c.dir.join("osd.1.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: plain syscall on a pid this test started.
    unsafe { libc::kill(pid1, libc::SIGKILL) };
    while alive(pid1) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // No flags this time: it runs as the cluster was made (unpinned, O_DSYNC, its budget).
    let out = c.ok(&["cluster", "up"]);
    assert!(out.contains("restarting osd.1 from"), "{out}");
    assert!(out.contains("already running: osd.0"), "{out}");
    assert!(!out.contains("setting changed"), "{out}");
    assert_eq!(read_volume(&c, "v", data.len()), data);
    let args = cmdline(&c, 1);
    for want in ["--no-pin", "power-loss-dsync", &(1536u64 << 20).to_string()] {
        assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
    }

    // A flag given changes the setting, says so, and is kept for the next restart.
    kill_osd(&c, 1);
    let out = c.ok(&["cluster", "up", "--fsync"]);
    assert!(
        out.contains(
            "setting changed for this and later restarts: durability power-loss-dsync -> fsync"
        ),
        "{out}"
    );
    assert!(!cmdline(&c, 1).iter().any(|a| a == "--durability"));
    kill_osd(&c, 1);
    let out = c.ok(&["cluster", "up"]);
    assert!(!out.contains("setting changed"), "{out}");
    let args = cmdline(&c, 1);
    assert!(!args.iter().any(|a| a == "--durability"), "{args:?}");
    assert!(args.iter().any(|a| a == "--no-pin"), "{args:?}");
    assert_eq!(read_volume(&c, "v", data.len()), data);

    // A refused `up` changes nothing: the next restart is as before.
    let err = c.fails(&["cluster", "up", "--no-fsync"]);
    assert!(err.contains("already running"), "{err}");
    kill_osd(&c, 1);
    let out = c.ok(&["cluster", "up"]);
    assert!(!out.contains("setting changed"), "{out}");
    assert!(!cmdline(&c, 1).iter().any(|a| a == "--durability"));
}

fn osd_pid(c: &Cluster, id: u32) -> i32 {
    std::fs::read_to_string(c.dir.join(format!("osd.{id}.pid")))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn kill_osd(c: &Cluster, id: u32) {
    common::kill9(osd_pid(c, id));
}

/// The command line osd.`id` runs with.
fn cmdline(c: &Cluster, id: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{}/cmdline", osd_pid(c, id))).unwrap();
    raw.split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

#[test]
fn a_missing_store_file_is_refused_not_recreated_empty() {
    let c = Cluster::up("missing", &[NATIVE, &["--osds", "2"]].concat());
    c.ok(&["cluster", "down"]);
    std::fs::rename(c.dir.join("osd.1.store"), c.dir.join("elsewhere")).unwrap();
    let err = c.fails(&["cluster", "up", "--no-pin"]);
    assert!(
        err.contains("osd.1's store") && err.contains("is missing"),
        "{err}"
    );
}

#[test]
fn the_osd_formats_only_a_blank_device_and_never_shares_one() {
    let c = Cluster::up("blank", &["--osds", "1"]);
    let map = c.dir.join("osdmap");
    let device = c.dir.join("not-a-store");
    let junk = pattern(2 << 20, 9);
    std::fs::write(&device, &junk).unwrap();
    c.ok(&["cluster", "down"]);
    let osd = |dev: &std::path::Path| {
        Command::new(BIN)
            .args([
                "osd", "--id", "0", "--no-pin", "--store", "native", "--mkfs",
            ])
            .arg("--map")
            .arg(&map)
            .arg("--device")
            .arg(dev)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let out = osd(&device).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("refusing to format it"), "{err}");
    assert_eq!(
        std::fs::read(&device).unwrap(),
        junk,
        "--mkfs formatted data"
    );
    // `store mkfs` over data needs --force.
    let err = c.fails(&["store", "mkfs", "--device", device.to_str().unwrap()]);
    assert!(err.contains("Pass --force"), "{err}");
    assert_eq!(std::fs::read(&device).unwrap(), junk);

    // A live OSD's device can be neither formatted nor opened by a second OSD.
    let store = c.dir.join("fresh.store");
    c.ok(&[
        "store",
        "mkfs",
        "--device",
        store.to_str().unwrap(),
        "--size",
        "512M",
    ]);
    let mut first = osd(&store);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let addr = carmine_localcluster::read_map(&c.dir).unwrap().osds[0].reactors[0];
    while carmine_localcluster::ping(addr, None).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the OSD did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let err = c.fails(&[
        "store",
        "mkfs",
        "--force",
        "--device",
        store.to_str().unwrap(),
    ]);
    assert!(err.contains("in use by another process"), "{err}");
    let err = c.fails(&["store", "fsck", "--device", store.to_str().unwrap()]);
    assert!(err.contains("in use by another process"), "{err}");
    first.kill().unwrap();
    first.wait().unwrap();
}

#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    let c = Cluster::up("pipe", &["--osds", "2", "--reactors", "2"]);
    let mut child = c
        .cmd(&["cluster", "status"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end at once, like `| head -0`.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

/// A disk too small for the store `cluster up` was asked to create: a clear error, and no
/// half-made cluster left behind to trip the next `up`.
#[test]
fn a_full_disk_at_cluster_creation_leaves_no_half_made_cluster() {
    let Some(fs) = SmallFs::mount("fullfs", "512M") else {
        return;
    };
    let dir = fs.mount.join("c");
    let up = |size: &str| {
        Command::new(BIN)
            .args(["cluster", "up", "--no-pin", "--memory-limit", "256M"])
            .args(["--store", "native", "--device-size", size, "--dir"])
            .arg(&dir)
            .output()
            .unwrap()
    };
    let out = up("1G");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("No space left on device"), "{err}");
    assert!(err.contains("did not come up and was removed"), "{err}");
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n == "osdmap" || n.ends_with(".store") || n == "cluster.json")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // The next `up`, with a size that fits, makes a working cluster there.
    let out = up("384M");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = Cluster { dir: dir.clone() };
    c.ok(&["volume", "create", "v", "--size", "8M"]);
    c.write_volume("v", &pattern(1 << 20, 9));
    assert_eq!(read_volume(&c, "v", 1 << 20), pattern(1 << 20, 9));
    c.ok(&["cluster", "down"]);
}

/// Another process may listen on an OSD's port after `up` checked it and before the OSD
/// binds it (a cluster starting beside this one that picked the same free port; seen in CI).
/// `up` then moves that OSD to new ports in a new epoch and starts it again, instead of
/// leaving it down.
#[test]
fn an_osd_whose_port_is_taken_as_it_starts_is_moved_and_started_again() {
    let c = Cluster::up("port-race", &[NATIVE, &["--osds", "2"]].concat());
    c.ok(&["volume", "create", "v", "--size", "16M"]);
    let data = pattern(4 << 20, 5);
    c.write_volume("v", &data);
    kill_osd(&c, 1);
    while alive(osd_pid(&c, 1)) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let before = carmine_localcluster::read_map(&c.dir).unwrap();
    let taken = before.osd(1).unwrap().reactors[0];

    // osd.1 starts only once this test listens on its port: the race, made certain.
    let (started, took) = (c.dir.join("osd1-started"), c.dir.join("port-taken"));
    let wrapper = c.dir.join("carmine-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" --id 1 \"*)\n  if [ ! -e {took} ]; then\n    : > \
             {started}; i=0\n    while [ ! -e {took} ] && [ $i -lt 400 ]; do sleep 0.05; \
             i=$((i+1)); done\n  fi;;\nesac\nexec {BIN} \"$@\"\n",
            took = took.display(),
            started = started.display(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let up_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let holder = {
        let up_done = up_done.clone();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while !started.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let listener = std::net::TcpListener::bind(taken).expect("osd.1's port is free");
            std::fs::write(&took, b"").unwrap();
            // Held until `up` is done, however long its waits for the port take (bounded).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            while !up_done.load(std::sync::atomic::Ordering::Relaxed)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            drop(listener);
        })
    };

    let out = c.ok(&["cluster", "up", "--exe", wrapper.to_str().unwrap()]);
    up_done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        out.contains(&format!(
            "osd.1: another process took {taken} before it could listen; moved to"
        )),
        "{out}"
    );
    let after = carmine_localcluster::read_map(&c.dir).unwrap();
    assert!(after.epoch > before.epoch, "{out}");
    assert_ne!(after.osd(1).unwrap().reactors[0], taken);
    assert_eq!(
        after.osd(0).unwrap().reactors,
        before.osd(0).unwrap().reactors
    );
    assert_eq!(read_volume(&c, "v", data.len()), data);
    holder.join().unwrap();
    c.ok(&["cluster", "down"]);
}
