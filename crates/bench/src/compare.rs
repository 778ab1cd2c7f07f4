//! `carmine bench compare` and `carmine bench check`: runs read back from their results.json.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// (workload, block size, queue depth) → (IOPS, mean latency µs, p99 µs).
type Steps = BTreeMap<(String, u64, u64), (f64, f64, f64)>;

/// A run's results.json (given the run directory or the file itself).
pub fn load_json(run: &Path) -> Result<Value> {
    let file = if run.is_dir() {
        run.join("results.json")
    } else {
        run.to_path_buf()
    };
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))
}

/// How a run is named in tables and legends: its directory's name.
pub fn run_label(run: &Path) -> String {
    let dir = if run.is_dir() {
        run
    } else {
        run.parent().unwrap_or(run)
    };
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| run.display().to_string())
}

/// The overlaid IOPS-vs-latency charts of `runs` (one curve per run) in `dir`, and a
/// markdown section linking them.
pub fn compare_charts(dir: &Path, runs: &[impl AsRef<Path>]) -> Result<String> {
    let loaded: Vec<(String, Value)> = runs
        .iter()
        .map(|r| Ok((run_label(r.as_ref()), load_json(r.as_ref())?)))
        .collect::<Result<_>>()?;
    std::fs::create_dir_all(dir)?;
    let pngs = crate::charts::latency_charts(dir, &loaded)?;
    Ok(crate::charts::markdown_links(
        dir,
        &pngs,
        "One curve per run; SVG beside each PNG.",
    ))
}

fn load(run: &Path) -> Result<Steps> {
    let file = run.display();
    let v = load_json(run)?;
    let rows = v["rows"]
        .as_array()
        .with_context(|| format!("{file} has no rows"))?;
    let mut out = Steps::new();
    for r in rows {
        let key = (
            r["workload"].as_str().unwrap_or("?").to_string(),
            r["bs"].as_u64().unwrap_or(0),
            r["depth"].as_u64().unwrap_or(0),
        );
        let c = &r["carmine"];
        let num = |k: &str| c[k].as_f64().unwrap_or(0.0);
        out.insert(key, (num("iops"), num("lat_mean_us"), num("lat_p99_us")));
    }
    Ok(out)
}

/// A markdown table with one IOPS and mean-latency column pair per run, ratios to the first.
pub fn compare(runs: &[impl AsRef<Path>]) -> Result<String> {
    if runs.is_empty() {
        bail!("name at least one run directory");
    }
    let loaded: Vec<Steps> = runs
        .iter()
        .map(|r| load(r.as_ref()))
        .collect::<Result<_>>()?;
    let mut keys: Vec<&(String, u64, u64)> = loaded.iter().flat_map(|s| s.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut s = String::from("| workload | bs | qd |");
    for (i, r) in runs.iter().enumerate() {
        let name = run_label(r.as_ref());
        s.push_str(&format!(" #{} {name} IOPS | mean us |", i + 1));
        if i > 0 {
            s.push_str(&format!(" #{} / #1 |", i + 1));
        }
    }
    s.push('\n');
    s.push_str(&"|---".repeat(3 + 2 * runs.len() + runs.len().saturating_sub(1)));
    s.push_str("|\n");
    for k in keys {
        s.push_str(&format!("| {} | {}K | {} |", k.0, k.1 >> 10, k.2));
        let base = loaded[0].get(k).map(|v| v.0);
        for (i, steps) in loaded.iter().enumerate() {
            match steps.get(k) {
                Some((iops, mean, _)) => s.push_str(&format!(" {iops:.0} | {mean:.1} |")),
                None => s.push_str(" - | - |"),
            }
            if i > 0 {
                match (steps.get(k), base) {
                    (Some((iops, ..)), Some(b)) if b > 0.0 => {
                        s.push_str(&format!(" {:.2}x |", iops / b))
                    }
                    _ => s.push_str(" - |"),
                }
            }
        }
        s.push('\n');
    }
    Ok(s)
}

/// Every step of `run` that lost more than `tolerance_pct` of IOPS or gained more than that in
/// mean latency against the same step of `baseline`. Steps missing from either side are listed
/// too: a check that silently compares nothing is no check.
pub fn check(baseline: &Path, run: &Path, tolerance_pct: f64) -> Result<Vec<String>> {
    let (base, new) = (load(baseline)?, load(run)?);
    let tol = tolerance_pct / 100.0;
    let mut problems = Vec::new();
    for (k, (b_iops, b_mean, _)) in &base {
        let name = format!("{} {}K qd{}", k.0, k.1 >> 10, k.2);
        let Some((iops, mean, _)) = new.get(k) else {
            problems.push(format!("{name}: missing from the new run"));
            continue;
        };
        if *iops < b_iops * (1.0 - tol) {
            problems.push(format!(
                "{name}: IOPS {iops:.0} vs baseline {b_iops:.0} ({:+.1}%)",
                100.0 * (iops / b_iops - 1.0)
            ));
        }
        if *mean > b_mean * (1.0 + tol) {
            problems.push(format!(
                "{name}: mean latency {mean:.1} us vs baseline {b_mean:.1} us ({:+.1}%)",
                100.0 * (mean / b_mean - 1.0)
            ));
        }
    }
    if base.is_empty() {
        problems.push("the baseline has no steps".into());
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_run(dir: &Path, name: &str, iops: f64, mean: f64) -> std::path::PathBuf {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        let json = format!(
            r#"{{"rows":[{{"workload":"randread","bs":4096,"depth":16,"carmine":{{"iops":{iops},"lat_mean_us":{mean},"lat_p99_us":1.0}}}}]}}"#
        );
        std::fs::write(d.join("results.json"), json).unwrap();
        d
    }

    #[test]
    fn check_flags_throughput_drops_and_latency_rises_beyond_tolerance() {
        let dir = std::env::temp_dir().join(format!("carmine-check-{}", std::process::id()));
        let base = write_run(&dir, "base", 1000.0, 100.0);
        let same = write_run(&dir, "same", 960.0, 104.0);
        let slow = write_run(&dir, "slow", 900.0, 120.0);
        assert!(check(&base, &same, 5.0).unwrap().is_empty());
        let p = check(&base, &slow, 5.0).unwrap();
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("IOPS 900 vs baseline 1000"));
        let table = compare(&[&base, &slow]).unwrap();
        assert!(
            table.contains("| randread | 4K | 16 | 1000 | 100.0 | 900 | 120.0 | 0.90x |"),
            "{table}"
        );
        assert!(check(&base, &dir.join("missing"), 5.0).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
