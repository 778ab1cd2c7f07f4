//! Test plans: a TOML file of common bench options and a matrix of stores × CPU policies ×
//! OSD counts × reactor counts. Each combination is one ordinary `carmine bench` run on a fresh
//! cluster; `plan.md` then puts them side by side (the `compare` table), and says so when the
//! machine cannot tell the CPU policies apart.

use crate::{compare, BenchArgs};
use anyhow::{bail, Context, Result};
use carmine_reactor::cpu::{allocate, parse_cpu_list, CpuPolicy, CpuTopology};
use clap::Parser;
use std::path::{Path, PathBuf};

/// What clap needs to parse one run's options from the argv a plan builds.
#[derive(Parser)]
struct PlanRun {
    #[command(flatten)]
    args: BenchArgs,
}

/// One TOML value as command-line text: lists comma-joined, booleans as flags.
fn flag(key: &str, v: &toml::Value) -> Result<Option<String>> {
    let key = key.replace('_', "-");
    Ok(match v {
        toml::Value::Boolean(true) => Some(format!("--{key}")),
        toml::Value::Boolean(false) => None,
        toml::Value::String(s) => Some(format!("--{key}={s}")),
        toml::Value::Integer(i) => Some(format!("--{key}={i}")),
        toml::Value::Float(f) => Some(format!("--{key}={f}")),
        toml::Value::Array(items) => {
            let parts: Vec<String> = items
                .iter()
                .map(|i| match i {
                    toml::Value::String(s) => Ok(s.clone()),
                    toml::Value::Integer(n) => Ok(n.to_string()),
                    toml::Value::Float(f) => Ok(f.to_string()),
                    other => bail!("{key}: unsupported list item {other}"),
                })
                .collect::<Result<_>>()?;
            Some(format!("--{key}={}", parts.join(",")))
        }
        other => bail!("{key}: unsupported value {other}"),
    })
}

/// One run's flags: the common ones plus the store. A `ceph-<objectstore>` store is a run
/// against a throw-away Ceph through fio-rbd, whatever target the Carmine runs use; a
/// `<store>@<target>` one runs that store with that target instead of the plan's (to put
/// fio-carmine and fio-nbd side by side in one plan).
fn run_flags(base: &[String], store: &str) -> Vec<String> {
    let without_target = || base.iter().filter(|f| !f.starts_with("--target=")).cloned();
    if let Some(objectstore) = store.strip_prefix("ceph-") {
        return without_target()
            .chain([
                "--target=fio-rbd".to_string(),
                format!("--ceph-store={objectstore}"),
            ])
            .collect();
    }
    match store.split_once('@') {
        Some((store, target)) => without_target()
            .chain([format!("--target={target}"), format!("--store={store}")])
            .collect(),
        None => base
            .iter()
            .cloned()
            .chain([format!("--store={store}")])
            .collect(),
    }
}

/// The values of one matrix axis as strings (a missing axis is its default).
fn axis(matrix: &toml::Table, key: &str, default: &str) -> Result<Vec<String>> {
    match matrix
        .get(key)
        .or_else(|| matrix.get(&key.replace('-', "_")))
    {
        None => Ok(vec![default.to_string()]),
        Some(toml::Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|i| match i {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(n) => Ok(n.to_string()),
                other => bail!("matrix.{key}: unsupported value {other}"),
            })
            .collect(),
        Some(other) => bail!("matrix.{key} must be a non-empty list, not {other}"),
    }
}

pub fn run_plan(file: &Path, output: Option<PathBuf>) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let plan: toml::Table = text
        .parse()
        .with_context(|| format!("parsing {}", file.display()))?;
    for key in plan.keys() {
        if key != "bench" && key != "matrix" {
            bail!(
                "{}: unknown section [{key}] (expected [bench] and [matrix])",
                file.display()
            );
        }
    }
    let empty = toml::Table::new();
    let common = plan
        .get("bench")
        .and_then(|v| v.as_table())
        .unwrap_or(&empty);
    let matrix = plan
        .get("matrix")
        .and_then(|v| v.as_table())
        .unwrap_or(&empty);
    for key in matrix.keys() {
        if !["store", "cpu-policy", "cpu_policy", "osds", "reactors"].contains(&key.as_str()) {
            bail!("matrix.{key}: the matrix varies store, cpu-policy, osds and reactors");
        }
    }
    let mut base = Vec::new();
    for (k, v) in common {
        if [
            "output",
            "store",
            "cpu-policy",
            "cpu_policy",
            "osds",
            "reactors",
        ]
        .contains(&k.as_str())
        {
            bail!("bench.{k}: set it in [matrix] (or not at all for output)");
        }
        base.extend(flag(k, v)?);
    }
    let out = output.unwrap_or_else(|| {
        PathBuf::from("carmine-bench").join(format!("plan-{}", crate::machine::timestamp()))
    });
    std::fs::create_dir_all(&out)?;
    let (stores, policies) = (
        axis(matrix, "store", "memory")?,
        axis(matrix, "cpu-policy", "default")?,
    );
    let (osds, reactors) = (axis(matrix, "osds", "1")?, axis(matrix, "reactors", "1")?);
    let mut runs = Vec::new();
    let mut failed = Vec::new();
    for store in &stores {
        for policy in &policies {
            for n in &osds {
                for r in &reactors {
                    // Ceph's shape is fixed (one classic OSD): one run, not one per
                    // Carmine cluster shape.
                    let ceph = store.starts_with("ceph-");
                    if ceph && (policy != &policies[0] || n != &osds[0] || r != &reactors[0]) {
                        continue;
                    }
                    let name = if ceph {
                        store.clone()
                    } else {
                        format!("{}-{policy}-{n}osd-{r}r", store.replace('@', "-"))
                    };
                    let dir = out.join(&name);
                    let mut argv = vec!["bench".to_string()];
                    argv.extend(run_flags(&base, store));
                    argv.extend([
                        format!("--cpu-policy={policy}"),
                        format!("--osds={n}"),
                        format!("--reactors={r}"),
                        format!("--output={}", dir.display()),
                    ]);
                    let args = PlanRun::try_parse_from(&argv)
                        .with_context(|| format!("plan run {name}: {}", argv.join(" ")))?
                        .args;
                    eprintln!("== plan run {name}");
                    match crate::run(args) {
                        Ok(()) => runs.push(dir),
                        Err(e) => {
                            eprintln!("== plan run {name} failed: {e:#}");
                            failed.push(format!("{name}: {e:#}"));
                            if dir.join("results.json").exists() {
                                runs.push(dir);
                            }
                        }
                    }
                }
            }
        }
    }
    let mut md = format!(
        "# carmine bench plan\n\nplan: {}  \nruns: {} (stores {:?} × cpu policies {:?} × osds {:?} × \
         reactors {:?}), each on a fresh cluster\n\n",
        file.display(),
        runs.len(),
        stores,
        policies,
        osds,
        reactors
    );
    md.push_str(&policy_note(common, &osds, &reactors));
    if !runs.is_empty() {
        md.push_str(&compare::compare(&runs)?);
        match compare::compare_charts(&out, &runs) {
            Ok(links) => md.push_str(&links),
            Err(e) => md.push_str(&format!("\nCharts not drawn: {e:#}\n")),
        }
    }
    if !failed.is_empty() {
        md.push_str("\n**Failed runs:**\n\n");
        for f in &failed {
            md.push_str(&format!("- {f}\n"));
        }
    }
    std::fs::write(out.join("plan.md"), &md)?;
    print!("{md}");
    eprintln!("plan report: {}", out.join("plan.md").display());
    if !failed.is_empty() {
        bail!("{} of the plan's runs failed", failed.len());
    }
    Ok(())
}

/// Whether the CPU policies place reactors differently on this machine, said plainly.
fn policy_note(common: &toml::Table, osds: &[String], reactors: &[String]) -> String {
    let Ok(topo) = CpuTopology::from_sys() else {
        return String::new();
    };
    let cpus = common
        .get("osd-cpu")
        .or_else(|| common.get("osd_cpu"))
        .and_then(|v| v.as_str())
        .unwrap_or("1");
    let allowed = parse_cpu_list(cpus).ok();
    let mut same = true;
    for n in osds {
        for r in reactors {
            let (Ok(n), Ok(r)) = (n.parse::<u32>(), r.parse::<u32>()) else {
                continue;
            };
            let placements: Vec<_> = [CpuPolicy::Default, CpuPolicy::Osd, CpuPolicy::Socket]
                .into_iter()
                .filter_map(|p| allocate(&topo, p, allowed.as_deref(), n, r, true).ok())
                .map(|a| (0..n).map(|o| a.cpus(o).to_vec()).collect::<Vec<_>>())
                .collect();
            same &= placements.windows(2).all(|w| w[0] == w[1]);
        }
    }
    if same {
        format!(
            "**CPU policies:** on this machine ({} socket(s), OSD cpus {cpus}) the default, osd \
             and socket policies give the same reactor placement for every OSD/reactor count in \
             this plan, so any difference between their columns below is noise, not policy.\n\n",
            topo.sockets().len()
        )
    } else {
        "**CPU policies:** the policies place reactors differently on this machine.\n\n".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn values_become_command_line_flags() {
        let t = table(
            "a_b = \"1G\"\nn = 3\nx = 0.5\nlist = [1, 16, 64]\nnames = [\"randread\", \"seqwrite\"]\non = true\noff = false",
        );
        let flags: Vec<String> = t.iter().filter_map(|(k, v)| flag(k, v).unwrap()).collect();
        assert!(flags.contains(&"--a-b=1G".to_string()));
        assert!(flags.contains(&"--n=3".to_string()));
        assert!(flags.contains(&"--x=0.5".to_string()));
        assert!(flags.contains(&"--list=1,16,64".to_string()));
        assert!(flags.contains(&"--names=randread,seqwrite".to_string()));
        assert!(flags.contains(&"--on".to_string()));
        assert_eq!(flags.len(), 6, "false flags are left out: {flags:?}");
        assert!(flag("t", &toml::Value::Table(toml::Table::new())).is_err());
    }

    #[test]
    fn matrix_axes_default_and_reject_bad_shapes() {
        let m = table("store = [\"memory\", \"native\"]\ncpu_policy = [\"osd\"]\nosds = []");
        assert_eq!(axis(&m, "store", "memory").unwrap(), ["memory", "native"]);
        assert_eq!(axis(&m, "cpu-policy", "default").unwrap(), ["osd"]);
        assert_eq!(axis(&m, "reactors", "1").unwrap(), ["1"]);
        assert!(axis(&m, "osds", "1").is_err(), "an empty axis is refused");
    }

    #[test]
    fn the_shipped_plan_parses_into_bench_options() {
        let text = include_str!("../../../bench/plans/policies.toml");
        let plan = table(text);
        let common = plan["bench"].as_table().unwrap();
        let mut argv = vec!["bench".to_string()];
        for (k, v) in common {
            argv.extend(flag(k, v).unwrap());
        }
        argv.push("--store=native".into());
        argv.push("--cpu-policy=socket".into());
        let args = PlanRun::try_parse_from(&argv).unwrap().args;
        assert_eq!(args.store, "native");
        assert_eq!(args.step_secs, 3.0);
        assert_eq!(args.depths, Some(vec![1, 16, 64]));
        assert!(args.no_early_exit);
    }

    #[test]
    fn ceph_stores_run_through_fio_rbd() {
        let base = vec!["--target=fio-nbd".to_string(), "--depths=1".to_string()];
        assert_eq!(
            run_flags(&base, "ceph-memstore"),
            ["--depths=1", "--target=fio-rbd", "--ceph-store=memstore"]
        );
        assert_eq!(
            run_flags(&base, "native"),
            ["--target=fio-nbd", "--depths=1", "--store=native"]
        );
        assert_eq!(
            run_flags(&base, "memory@fio-carmine"),
            ["--depths=1", "--target=fio-carmine", "--store=memory"]
        );
        let text = include_str!("../../../bench/plans/carmine-vs-ceph.toml");
        let plan = table(text);
        let mut argv = vec!["bench".to_string()];
        for (k, v) in plan["bench"].as_table().unwrap() {
            argv.extend(flag(k, v).unwrap());
        }
        let argv: Vec<String> = run_flags(&argv, "ceph-bluestore");
        let args = PlanRun::try_parse_from(&argv).unwrap().args;
        assert_eq!(args.target, crate::Target::FioRbd);
        assert_eq!(args.ceph_store, "bluestore");
    }

    #[test]
    fn unknown_sections_and_matrix_keys_are_refused() {
        let dir = std::env::temp_dir().join(format!("carmine-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "[matrix]\nwidth = [1]\n").unwrap();
        let e = run_plan(&bad, Some(dir.join("out"))).unwrap_err();
        assert!(e.to_string().contains("matrix.width"), "{e}");
        std::fs::write(&bad, "[extra]\n").unwrap();
        let e = run_plan(&bad, Some(dir.join("out"))).unwrap_err();
        assert!(e.to_string().contains("unknown section"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
