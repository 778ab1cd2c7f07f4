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
    assert!(report.contains("| randread | 4K | 1 |"), "{report}");
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
    }
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
