//! Driving the real `fio` (Debian package) and reading its JSON into the same step records the
//! built-in load generator produces.

use crate::workload::{StepStats, Workload};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

fn fio_rw(wl: Workload) -> &'static str {
    match wl {
        Workload::Randread => "randread",
        Workload::Randwrite => "randwrite",
        Workload::Seqread => "read",
        Workload::Seqwrite => "write",
    }
}

/// Runs one fio step with the nbd engine against `uri` and converts its report.
pub fn run_nbd(
    uri: &str,
    size: u64,
    wl: Workload,
    bs: u64,
    depth: usize,
    ramp: Duration,
    step: Duration,
) -> Result<StepStats> {
    let out = Command::new("fio")
        .args([
            "--name=carmine",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={}", fio_rw(wl)),
            &format!("--bs={bs}"),
            &format!("--iodepth={depth}"),
            &format!("--size={size}"),
            "--time_based",
            &format!("--runtime={}ms", step.as_millis().max(1)),
            &format!("--ramp_time={}ms", ramp.as_millis()),
            "--output-format=json",
        ])
        .output()
        .context("running fio (Debian package fio)")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // fio's nbd engine prints a line before the JSON document.
    let json = text
        .find('{')
        .map(|i| &text[i..])
        .context("fio printed no JSON")?;
    parse_report(json, wl.is_write(), bs)
}

/// One job's read or write side of a fio JSON report as step statistics.
pub fn parse_report(json: &str, write: bool, bs: u64) -> Result<StepStats> {
    let v: Value = serde_json::from_str(json).context("parsing fio JSON")?;
    let job = &v["jobs"][0];
    let side = &job[if write { "write" } else { "read" }];
    let num = |x: &Value| x.as_f64().unwrap_or(0.0);
    let clat = &side["clat_ns"];
    let pct = |p: &str| num(&clat["percentile"][p]) / 1000.0;
    let ios = num(&side["total_ios"]) as u64;
    let seconds = num(&side["runtime"]) / 1000.0;
    let iops = num(&side["iops"]);
    Ok(StepStats {
        ios,
        errors: num(&job["error"]) as u64,
        seconds,
        iops,
        mib_s: iops * bs as f64 / (1 << 20) as f64,
        lat_mean_us: num(&clat["mean"]) / 1000.0,
        lat_stdev_us: num(&clat["stddev"]) / 1000.0,
        lat_p50_us: pct("50.000000"),
        lat_p99_us: pct("99.000000"),
        lat_p999_us: pct("99.900000"),
        lat_max_us: num(&clat["max"]) / 1000.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_json_side_is_converted() {
        let json = r#"{"jobs":[{"error":0,"read":{"total_ios":1000,"runtime":2000,"iops":500.0,
            "clat_ns":{"mean":2000.0,"stddev":100.0,"max":9000.0,
            "percentile":{"50.000000":1900,"99.000000":5000,"99.900000":8000}}},
            "write":{"total_ios":0,"runtime":0,"iops":0.0,"clat_ns":{}}}]}"#;
        let s = parse_report(json, false, 4096).unwrap();
        assert_eq!((s.ios, s.errors), (1000, 0));
        assert_eq!(s.iops, 500.0);
        assert_eq!(
            (s.lat_mean_us, s.lat_p99_us, s.lat_p999_us),
            (2.0, 5.0, 8.0)
        );
        assert!((s.mib_s - 500.0 * 4096.0 / 1048576.0).abs() < 1e-9);
        assert!(parse_report("not json", false, 1).is_err());
    }
}
