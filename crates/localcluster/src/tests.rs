//! What `up` decides from a directory and its flags, without starting processes.

use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    up: UpArgs,
}

fn args(dir: &Path, extra: &[&str]) -> UpArgs {
    let dir = dir.to_str().unwrap();
    Cli::parse_from([&["up", "--dir", dir][..], extra].concat()).up
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "carmine-localcluster-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_new_cluster_is_restarted_as_it_is_and_contradicting_flags_change_nothing() {
    let d = TempDir::new("restart");
    let (map, store, _) = new_cluster(
        &d.0,
        &args(&d.0, &["--osds", "2", "--reactors", "2", "--pg-num", "16"]),
        None,
    )
    .unwrap();
    assert_eq!(store, "memory");
    assert_eq!(map.osds.len(), 2);
    let written = std::fs::read(map_path(&d.0)).unwrap();

    // No flags: the same map, same epoch, and a plain word about the memory store.
    let (again, store, notes) = existing_cluster(&d.0, &args(&d.0, &[]), None).unwrap();
    assert_eq!(again.encode(), map.encode());
    assert_eq!(store, "memory");
    assert!(notes
        .iter()
        .any(|n| n.contains("data written before the restart is gone")));
    // Flags that agree are fine.
    existing_cluster(&d.0, &args(&d.0, &["--osds", "2", "--pool", "rbd"]), None).unwrap();

    // Each contradiction is named; the map file is untouched.
    let err = existing_cluster(
        &d.0,
        &args(
            &d.0,
            &["--osds", "1", "--store", "native", "--pg-num", "64"],
        ),
        None,
    )
    .unwrap_err()
    .to_string();
    for want in [
        "--osds 1 (the cluster has 2)",
        "--store native (the cluster has memory)",
        "--pg-num 64 (the cluster has 16)",
        "the OSDs of a cluster are fixed",
    ] {
        assert!(err.contains(want), "{want:?} missing from: {err}");
    }
    assert_eq!(std::fs::read(map_path(&d.0)).unwrap(), written);
    assert_eq!(store_kind(&d.0).as_deref(), Some("memory"));
}

#[test]
fn native_stores_are_never_formatted_over_or_started_empty() {
    let d = TempDir::new("native");
    // A store file left from a cluster whose map is gone: a new cluster must not take it.
    std::fs::write(store_path(&d.0, 0), b"someone's data").unwrap();
    let err = new_cluster(&d.0, &args(&d.0, &["--store", "native"]), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds no cluster map"), "{err}");
    assert!(!map_path(&d.0).exists(), "a refused create wrote a map");
    assert_eq!(
        std::fs::read(store_path(&d.0, 0)).unwrap(),
        b"someone's data"
    );

    // An empty file is no data: fine.
    std::fs::write(store_path(&d.0, 0), b"").unwrap();
    new_cluster(&d.0, &args(&d.0, &["--store", "native"]), None).unwrap();
    assert_eq!(store_kind(&d.0).as_deref(), Some("native"));
    let (_, store, notes) =
        existing_cluster(&d.0, &args(&d.0, &["--device-size", "1G"]), None).unwrap();
    assert_eq!(store, "native");
    assert!(notes
        .iter()
        .any(|n| n.contains("--device-size applies to new stores only")));

    // Its store gone: refuse, rather than start osd.0 empty with PGs in the map.
    std::fs::remove_file(store_path(&d.0, 0)).unwrap();
    let err = existing_cluster(&d.0, &args(&d.0, &[]), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("osd.0's store") && err.contains("is missing"),
        "{err}"
    );
}

#[test]
fn unknown_stores_and_zero_counts_are_refused() {
    let d = TempDir::new("bad-flags");
    assert!(new_cluster(&d.0, &args(&d.0, &["--store", "bluestore"]), None).is_err());
    assert!(new_cluster(&d.0, &args(&d.0, &["--osds", "0"]), None).is_err());
    assert!(new_cluster(&d.0, &args(&d.0, &["--reactors", "0"]), None).is_err());
    assert!(!map_path(&d.0).exists());
}

#[test]
fn a_taken_port_moves_its_endpoint_in_a_new_epoch() {
    let d = TempDir::new("ports");
    let (map, _, _) = new_cluster(&d.0, &args(&d.0, &["--reactors", "2"]), None).unwrap();
    let taken = map.osds[0].reactors[1];
    let _squatter = TcpListener::bind(taken).unwrap();
    let (moved, _, notes) = existing_cluster(&d.0, &args(&d.0, &[]), None).unwrap();
    assert_eq!(moved.epoch, map.epoch + 1);
    assert_eq!(moved.osds[0].reactors[0], map.osds[0].reactors[0]);
    assert_ne!(moved.osds[0].reactors[1], taken);
    assert!(notes.iter().any(|n| n.contains("is taken; moving to")));
    // What a restart reads is the new map.
    assert_eq!(read_map(&d.0).unwrap().encode(), moved.encode());
}

#[test]
fn a_damaged_map_is_an_error_not_a_new_cluster() {
    let d = TempDir::new("damaged");
    new_cluster(&d.0, &args(&d.0, &[]), None).unwrap();
    let mut raw = std::fs::read(map_path(&d.0)).unwrap();
    let mid = raw.len() / 2;
    raw[mid] ^= 0x40;
    std::fs::write(map_path(&d.0), &raw).unwrap();
    assert!(read_map(&d.0).is_err());
    assert!(existing_cluster(&d.0, &args(&d.0, &[]), None).is_err());
    assert_eq!(std::fs::read(map_path(&d.0)).unwrap(), raw, "rewritten");
    assert!(read_map(&d.0.join("nowhere")).is_err());
}

#[test]
fn down_without_running_osds_clears_stale_pid_files() {
    let d = TempDir::new("down");
    new_cluster(&d.0, &args(&d.0, &[]), None).unwrap();
    // A pid that is surely not one of our OSDs (pid 1 is init).
    std::fs::write(pid_file(&d.0, 0), "1").unwrap();
    let summary = down(&d.0).unwrap();
    assert!(summary.contains("stopped 0 OSD(s)"), "{summary}");
    assert!(!pid_file(&d.0, 0).exists());
    assert!(down(&d.0.join("nowhere")).is_err());
}

#[test]
fn sizes_parse_with_binary_units_and_refuse_nonsense() {
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("64K"), Ok(64 << 10));
    assert_eq!(parse_size("256MiB"), Ok(256 << 20));
    assert_eq!(parse_size(" 4g "), Ok(4 << 30));
    assert_eq!(parse_size("1T"), Ok(1 << 40));
    assert!(parse_size("4X").is_err());
    assert!(parse_size("").is_err());
    assert!(parse_size("-1").is_err());
    assert!(parse_size("99999999999T").is_err());
}

#[test]
fn a_cleaner_rate_is_zero_or_at_least_a_mebibyte_per_second() {
    assert_eq!(parse_cleaner_rate("0"), Ok(0));
    assert_eq!(parse_cleaner_rate("1M"), Ok(1 << 20));
    assert_eq!(parse_cleaner_rate("128M"), Ok(128 << 20));
    assert!(parse_cleaner_rate("100").is_err());
    assert!(parse_cleaner_rate("512K").is_err());
}

#[test]
fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
    let addrs = ports::free_addrs("127.0.0.1".parse().unwrap(), 32).unwrap();
    assert_eq!(addrs.len(), 32);
    for (i, a) in addrs.iter().enumerate() {
        assert!((10_000..32_000).contains(&a.port()), "{a}");
        assert!(!addrs[..i].contains(a), "{a} picked twice");
    }
}

#[test]
fn how_osds_run_is_kept_with_the_cluster_and_changed_only_by_flags_given() {
    let d = TempDir::new("osd-run");
    new_cluster(
        &d.0,
        &args(
            &d.0,
            &["--no-pin", "--cpu-policy", "osd", "--memory-limit", "1G"],
        ),
        None,
    )
    .unwrap();
    let kept = read_cluster_file(&d.0).unwrap().unwrap().osd_run;
    assert!(kept.no_pin);
    assert_eq!(kept.cpu_policy(), CpuPolicy::Osd);
    assert_eq!(kept.memory_limit(), 1 << 30);
    assert_eq!(kept.durability, None);

    // A restart with no flags: as it was, nothing said.
    let (same, said) = kept.with_flags(&args(&d.0, &[]));
    assert_eq!(same, kept);
    assert!(said.is_empty(), "{said:?}");
    let osd = same.osd_args(true);
    for want in ["--no-pin", "osd", &(1u64 << 30).to_string()] {
        assert!(osd.iter().any(|a| a == want), "{want} not in {osd:?}");
    }
    assert!(!osd.iter().any(|a| a == "--durability"), "{osd:?}");

    // Flags given change what they name, each change said; weaker durability is warned of.
    let (now, said) = kept.with_flags(&args(&d.0, &["--pin", "--no-fsync"]));
    assert!(!now.no_pin);
    assert_eq!(now.cpu_policy(), CpuPolicy::Osd);
    assert_eq!(now.durability.as_deref(), Some("process-crash"));
    let said = said.join("\n");
    for want in [
        "pinning off -> on",
        "durability fsync -> process-crash",
        "not a power loss",
    ] {
        assert!(said.contains(want), "{want:?} missing from: {said}");
    }
    assert!(now
        .osd_args(true)
        .windows(2)
        .any(|w| w[0] == "--durability" && w[1] == "process-crash"));
    // A memory store has no durability to set.
    assert!(!now.osd_args(false).iter().any(|a| a == "--durability"));
    let (back, said) = now.with_flags(&args(&d.0, &["--fsync"]));
    assert_eq!(back.durability, None);
    assert_eq!(said.len(), 1, "{said:?}");

    // Settings set once go back to the defaults only when asked, the flags given still
    // applying on top.
    let (tuned, _) = back.with_flags(&args(
        &d.0,
        &[
            "--cpu-set",
            "1",
            "--idle-poll-us",
            "50",
            "--recovery-rate-mib",
            "8",
            "--cleaner-rate",
            "16M",
        ],
    ));
    assert_eq!(tuned.cleaner_rate, Some(16 << 20));
    let (kept_tuned, said) = tuned.with_flags(&args(&d.0, &[]));
    assert_eq!(kept_tuned, tuned);
    assert!(said.is_empty(), "{said:?}");
    let (reset, said) = tuned.with_flags(&args(&d.0, &["--reset-osd-settings", "--no-pin"]));
    assert_eq!(
        reset,
        run::OsdRun {
            no_pin: true,
            ..run::OsdRun::default()
        }
    );
    let said = said.join("\n");
    for want in [
        "cpu set 1 -> all",
        "idle poll µs 50 -> default",
        "recovery rate MiB/s 8 -> default",
        "cleaner rate bytes/s 16777216 -> default",
        "cpu policy osd -> default",
        "memory limit 1073741824 -> 2147483648",
        // (--pin above had turned it on; the flag given applies over the defaults.)
        "pinning on -> off",
    ] {
        assert!(said.contains(want), "{want:?} missing from: {said}");
    }

    // Contradicting flags are refused by the parser.
    for bad in [
        &["--pin", "--no-pin"][..],
        &["--fsync", "--dsync"],
        &["--no-fsync", "--dsync"],
        // A cleaner paced below 1 MiB/s would hold housekeeping for minutes per victim.
        &["--cleaner-rate", "512K"],
    ] {
        let dir = d.0.to_str().unwrap();
        assert!(Cli::try_parse_from([&["up", "--dir", dir][..], bad].concat()).is_err());
    }
}
