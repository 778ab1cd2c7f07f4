//! Driving the real `fio` (Debian package) and reading its JSON into the same step records the
//! built-in load generator produces.

use crate::workload::{StepStats, Workload};
use crate::BenchArgs;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

fn fio_rw(wl: Workload) -> &'static str {
    match wl {
        Workload::Randread => "randread",
        Workload::Randwrite => "randwrite",
        Workload::Randrw => "randrw",
        Workload::Seqread => "read",
        Workload::Seqwrite => "write",
    }
}

/// fio with one engine's options (which device or image it drives).
pub struct Fio {
    engine: Vec<String>,
    env: Vec<(String, String)>,
}

impl Fio {
    /// The nbd engine against an NBD URI (Carmine's gateway).
    pub fn nbd(uri: &str) -> Self {
        Fio {
            engine: vec!["--ioengine=nbd".into(), format!("--uri={uri}")],
            env: Vec::new(),
        }
    }

    /// fio-carmine (libcarmine in fio's process) on volume `image` of the cluster in `dir`.
    pub fn carmine(engine: &std::path::Path, dir: &std::path::Path, image: &str) -> Self {
        Fio {
            engine: vec![
                format!("--ioengine=external:{}", engine.display()),
                format!("--cluster_dir={}", dir.display()),
                format!("--volume={image}"),
            ],
            env: Vec::new(),
        }
    }

    /// The rbd engine (librbd) against `pool/image` of the Ceph cluster `conf` describes.
    pub fn rbd(conf: &std::path::Path, pool: &str, image: &str) -> Self {
        Fio {
            engine: vec![
                "--ioengine=rbd".into(),
                "--clientname=admin".into(),
                format!("--pool={pool}"),
                format!("--rbdname={image}"),
            ],
            env: vec![("CEPH_CONF".into(), conf.display().to_string())],
        }
    }

    fn run(&self, args: &[String]) -> Result<String> {
        let out = Command::new("fio")
            .args(&self.engine)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .context("running fio (Debian package fio)")?;
        if !out.status.success() {
            bail!(
                "fio failed: {}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Writes the whole device once (1 MiB writes, 8 in flight) so reads see real data.
    pub fn prefill(&self, size: u64) -> Result<()> {
        self.run(&[
            "--name=prefill".into(),
            "--rw=write".into(),
            "--bs=1M".into(),
            "--iodepth=8".into(),
            format!("--size={size}"),
        ])?;
        Ok(())
    }

    /// One measured step of the run `a` describes, converted to the built-in generator's
    /// records.
    pub fn step(&self, a: &BenchArgs, wl: Workload, bs: u64, depth: usize) -> Result<StepStats> {
        let (size, mix, jobs) = (a.volume_size, a.mix(), a.jobs_per_volume);
        let ramp = Duration::from_secs_f64(a.ramp_secs);
        let step = Duration::from_secs_f64(a.step_secs);
        let mut args = vec![
            format!("--numjobs={jobs}"),
            "--group_reporting".into(),
            "--name=carmine".to_string(),
            format!("--rw={}", fio_rw(wl)),
            format!("--bs={bs}"),
            format!("--iodepth={depth}"),
            format!("--size={size}"),
            "--time_based".into(),
            format!("--runtime={}ms", step.as_millis().max(1)),
            format!("--ramp_time={}ms", ramp.as_millis()),
            "--output-format=json".into(),
        ];
        if let Some(pct) = mix.read_pct_of(wl) {
            args.push(format!("--rwmixread={pct}"));
        }
        if let Some(dist) = mix.distribution.fio_arg() {
            args.push(format!("--random_distribution={dist}"));
        }
        let text = self.run(&args)?;
        // fio's nbd engine prints a line before the JSON document.
        let json = text
            .find('{')
            .map(|i| &text[i..])
            .context("fio printed no JSON")?;
        parse_report(json, wl, bs)
    }
}

/// `fio --version`, for the run's record.
pub fn version() -> Option<String> {
    let out = Command::new("fio").arg("--version").output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A fio JSON report's first job as step statistics: the read or the write side, or for a
/// mixed workload both combined (exact counts, mean and stdev; the percentiles are the worse
/// side's, since fio reports them per side).
pub fn parse_report(json: &str, wl: Workload, bs: u64) -> Result<StepStats> {
    let v: Value = serde_json::from_str(json).context("parsing fio JSON")?;
    let job = &v["jobs"][0];
    if job.is_null() {
        bail!("fio's report has no job");
    }
    let sides: Vec<StepStats> = match wl {
        Workload::Randrw => vec![side(&job["read"], bs), side(&job["write"], bs)],
        wl if wl.is_write() => vec![side(&job["write"], bs)],
        _ => vec![side(&job["read"], bs)],
    };
    let mut s = combine(&sides);
    s.errors = job["error"].as_u64().unwrap_or(0);
    if let [r, w] = &sides[..] {
        s.reads = Some(r.as_side());
        s.writes = Some(w.as_side());
    }
    Ok(s)
}

fn side(v: &Value, bs: u64) -> StepStats {
    let num = |x: &Value| x.as_f64().unwrap_or(0.0);
    let clat = &v["clat_ns"];
    let pct = |p: &str| num(&clat["percentile"][p]) / 1000.0;
    let iops = num(&v["iops"]);
    StepStats {
        ios: num(&v["total_ios"]) as u64,
        errors: 0,
        seconds: num(&v["runtime"]) / 1000.0,
        iops,
        mib_s: iops * bs as f64 / (1 << 20) as f64,
        lat_mean_us: num(&clat["mean"]) / 1000.0,
        lat_stdev_us: num(&clat["stddev"]) / 1000.0,
        lat_p50_us: pct("50.000000"),
        lat_p99_us: pct("99.000000"),
        lat_p999_us: pct("99.900000"),
        lat_max_us: num(&clat["max"]) / 1000.0,
        verify_errors: 0,
        reads: None,
        writes: None,
    }
}

/// Sides of one step as one: counts and rates add; mean and stdev pool exactly.
fn combine(sides: &[StepStats]) -> StepStats {
    let n: f64 = sides.iter().map(|s| s.ios as f64).sum();
    let mean = if n > 0.0 {
        sides
            .iter()
            .map(|s| s.ios as f64 * s.lat_mean_us)
            .sum::<f64>()
            / n
    } else {
        0.0
    };
    let second_moment = if n > 0.0 {
        sides
            .iter()
            .map(|s| s.ios as f64 * (s.lat_stdev_us.powi(2) + s.lat_mean_us.powi(2)))
            .sum::<f64>()
            / n
    } else {
        0.0
    };
    let worst = |f: fn(&StepStats) -> f64| sides.iter().map(f).fold(0.0, f64::max);
    StepStats {
        ios: sides.iter().map(|s| s.ios).sum(),
        errors: 0,
        seconds: worst(|s| s.seconds),
        iops: sides.iter().map(|s| s.iops).sum(),
        mib_s: sides.iter().map(|s| s.mib_s).sum(),
        lat_mean_us: mean,
        lat_stdev_us: (second_moment - mean * mean).max(0.0).sqrt(),
        lat_p50_us: worst(|s| s.lat_p50_us),
        lat_p99_us: worst(|s| s.lat_p99_us),
        lat_p999_us: worst(|s| s.lat_p999_us),
        lat_max_us: worst(|s| s.lat_max_us),
        verify_errors: 0,
        reads: None,
        writes: None,
    }
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
        let s = parse_report(json, Workload::Randread, 4096).unwrap();
        assert_eq!((s.ios, s.errors), (1000, 0));
        assert_eq!(s.iops, 500.0);
        assert_eq!(
            (s.lat_mean_us, s.lat_p99_us, s.lat_p999_us),
            (2.0, 5.0, 8.0)
        );
        assert!((s.mib_s - 500.0 * 4096.0 / 1048576.0).abs() < 1e-9);
        assert!(parse_report("not json", Workload::Randread, 1).is_err());
        assert!(parse_report("{}", Workload::Randread, 1).is_err());
    }

    #[test]
    fn mixed_sides_pool_exactly() {
        // Reads: 300 at 100 us (stdev 0); writes: 100 at 500 us (stdev 0).
        let json = r#"{"jobs":[{"error":0,
            "read":{"total_ios":300,"runtime":1000,"iops":300.0,"clat_ns":{"mean":100000.0,"stddev":0.0,"max":100000.0,"percentile":{"99.000000":100000}}},
            "write":{"total_ios":100,"runtime":1000,"iops":100.0,"clat_ns":{"mean":500000.0,"stddev":0.0,"max":500000.0,"percentile":{"99.000000":500000}}}}]}"#;
        let s = parse_report(json, Workload::Randrw, 4096).unwrap();
        assert_eq!((s.ios, s.iops), (400, 400.0));
        assert!((s.lat_mean_us - 200.0).abs() < 1e-9);
        // Values are 100 (x3) and 500 (x1): variance = 0.75*100^2 + 0.25*500^2 - 200^2 = 30000.
        assert!((s.lat_stdev_us - 30000f64.sqrt()).abs() < 1e-6);
        assert_eq!(s.lat_p99_us, 500.0);
        // And each side as fio gave it.
        let (r, w) = (s.reads.unwrap(), s.writes.unwrap());
        assert_eq!((r.ios, r.lat_mean_us, r.lat_p99_us), (300, 100.0, 100.0));
        assert_eq!((w.ios, w.lat_mean_us, w.lat_p99_us), (100, 500.0, 500.0));
    }
}
