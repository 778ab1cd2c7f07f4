//! `carmine bench` end to end: a real cluster, real load, a report that says what it measured.

mod common;

use common::BIN;
use std::process::Command;

fn bench(name: &str, args: &[&str]) -> serde_json::Value {
    let out_dir = std::env::temp_dir().join(format!("carmine-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let out = Command::new(BIN)
        .args(["bench", "--quick", "--no-early-exit", "--output"])
        .arg(&out_dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(report.contains("| 4K | 1 |"), "{report}");
    // Every chart the report links exists as a real PNG, with its SVG beside it.
    let charts: Vec<&str> = report
        .lines()
        .filter_map(|l| l.strip_prefix("![")?.split_once("](")?.1.strip_suffix(')'))
        .collect();
    assert!(charts.contains(&"osd-usage.png"), "{report}");
    assert!(charts.len() >= 2, "{report}");
    for c in charts {
        let png = std::fs::read(out_dir.join(c)).unwrap();
        assert_eq!(&png[1..4], b"PNG", "{c}");
        assert!(out_dir.join(c).with_extension("svg").exists(), "{c}");
    }
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("results.json")).unwrap())
            .unwrap();
    std::fs::remove_dir_all(&out_dir).unwrap();
    results
}

fn check_rows(results: &serde_json::Value, expect_rows: usize, ceiling: bool) {
    let rows = results["rows"].as_array().unwrap();
    assert_eq!(rows.len(), expect_rows);
    for r in rows {
        let c = &r["carmine"];
        assert!(c["iops"].as_f64().unwrap() > 100.0, "{r}");
        assert_eq!(c["errors"].as_u64(), Some(0), "{r}");
        assert!(
            c["lat_p99_us"].as_f64().unwrap() >= c["lat_p50_us"].as_f64().unwrap(),
            "{r}"
        );
        assert_eq!(r["ceiling"].is_object(), ceiling, "{r}");
        assert!(
            r["osd_cpu_us_per_io"].as_f64().unwrap() > 0.0,
            "OSD CPU was not sampled: {r}"
        );
        let u = &r["usage"];
        assert!(
            u["client_usr_pct"].as_f64().unwrap() + u["client_sys_pct"].as_f64().unwrap() > 1.0,
            "the client side's CPU (fio included) was not sampled: {r}"
        );
        // The reactor's own accounting, from its perf socket.
        let busy = r["reactor_busy"].as_array().unwrap();
        assert_eq!(busy.len(), 1, "{r}");
        let pct = busy[0]["busy_pct"].as_f64().unwrap();
        assert!(pct > 1.0 && pct <= 100.0, "{r}");
    }
    assert!(
        results["timeline"].as_array().unwrap().len() >= 2,
        "the run's timeline was not sampled"
    );
}

#[test]
fn bench_quick_measures_carmine_next_to_the_rpc_ceiling() {
    let results = bench(
        "builtin",
        &[
            "--workloads",
            "randread,seqwrite",
            "--depths",
            "1,8",
            "--volume-size",
            "16M",
        ],
    );
    check_rows(&results, 4, true);
    assert_eq!(results["target"], "carmine");
}

#[test]
fn bench_drives_fio_through_the_nbd_gateway() {
    let results = bench(
        "fio",
        &[
            "--target",
            "fio-nbd",
            "--workloads",
            "randread",
            "--depths",
            "1,4",
            "--volume-size",
            "16M",
        ],
    );
    check_rows(&results, 2, false);
    assert_eq!(results["target"], "fio-nbd");
}

#[test]
fn bench_verifies_mixed_skewed_load_over_several_volumes() {
    let results = bench(
        "verify",
        &[
            "--verify",
            "--workloads",
            "randrw,seqwrite,randread",
            "--distribution",
            "zipf:1.1",
            "--volumes",
            "2",
            "--jobs-per-volume",
            "2",
            "--depths",
            "1,8",
            "--volume-size",
            "8M",
            "--no-ceiling",
        ],
    );
    check_rows(&results, 6, false);
    assert_eq!(results["verify"], true);
    assert_eq!(results["volumes"], 2);
    assert_eq!(results["mix"]["distribution"]["zipf"], 1.1);
    for r in results["rows"].as_array().unwrap() {
        assert_eq!(r["carmine"]["verify_errors"], 0, "{r}");
    }
}

#[test]
fn bench_refuses_combinations_it_cannot_measure() {
    for args in [
        &["--target", "fio-nbd", "--verify"][..],
        &["--target", "fio-nbd", "--volumes", "2"][..],
        &["--verify", "--random-bs", "512"][..],
        &["--distribution", "pareto"][..],
    ] {
        let out = Command::new(BIN)
            .args(["bench", "--quick"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
    }
}
