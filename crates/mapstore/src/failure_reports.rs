//! Failure reports: which other OSDs a running OSD waits on and cannot hear from. Liveness by
//! registration (a lease in etcd, a lock beside a map file) sees an OSD that is gone; it does
//! not see a link broken between two OSDs that both still reach the map store, nor, on one
//! host, an OSD that hangs while its process (and its lock) lives. Their peers do: each OSD
//! publishes what its PGs wait on past a grace period, and the managers judge the reports
//! (`carmine_manager::policy`).
//!
//! A report lives as long as its reporter's run: in etcd under the OSD's lease, beside a map
//! file as `DIR/reports/osd.<id>`, which names the run (pid, start) so that one left by an
//! earlier run is ignored.

use crate::etcd_client::{Etcd, Put};
use crate::membership::Registration;
use crate::{keys, MapStoreError};
use std::collections::BTreeMap;
use std::path::Path;

const REPORTS_DIR: &str = "reports";

/// What one OSD says it cannot hear from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FailureReport {
    pub reporter: u32,
    /// The reporter's run, as its registration says: a report of another run is not
    /// believed.
    pub pid: u32,
    pub started: u64,
    /// Each OSD it waits on without an answer, and for how long (ms) when it reported.
    pub silent_ms: BTreeMap<u32, u64>,
    /// The hold (`held_down_until` of the map) of the newest map this run took in which it
    /// is held down on reports: proof that it runs and follows the map, which a held OSD
    /// must give before the managers mark it up again (a hung one cannot). 0: none.
    #[serde(default)]
    pub held_seen: u64,
    /// When it was made (Unix seconds; a reporter that still hears nothing makes it again
    /// every [`REMADE_EVERY`]): a silence reported before its target's current run started
    /// is about an earlier run of the target, and is not believed. 0: made by an OSD older
    /// than this field, believed as before.
    #[serde(default)]
    pub made: u64,
    /// The reporter's peer grace (ms): how long a silence lasts before it is reported. 0:
    /// not said.
    #[serde(default)]
    pub grace_ms: u64,
}

/// The most two hosts' clocks may differ for a report's `made` to be compared with its
/// target's start: beyond it, reports are believed as they were before `made` existed.
pub const CLOCK_SKEW_MAX_SECS: u64 = 5;

/// How often a reporter that still cannot hear from some OSD makes its report again.
pub const REMADE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl FailureReport {
    pub fn new(
        reg: &Registration,
        silent_ms: BTreeMap<u32, u64>,
        held_seen: u64,
        grace: std::time::Duration,
    ) -> Self {
        FailureReport {
            reporter: reg.osd,
            pid: reg.pid,
            started: reg.started,
            silent_ms,
            held_seen,
            made: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            grace_ms: grace.as_millis() as u64,
        }
    }

    /// Whether its silence about `target` is about `target`'s current run, judged at `now`
    /// (Unix seconds, the judge's clock): made after that run started (in a later second:
    /// registrations say seconds), and silent for the reporter's grace since then — the
    /// silence a reporter measures runs from the last answer of the target's earlier run.
    /// A report without `made` (an older OSD), or one whose clocks disagree with `now` by
    /// more than [`CLOCK_SKEW_MAX_SECS`] (a reporter that re-makes its report every 2 s
    /// made it just now), is believed as before.
    pub fn about_run_of(&self, target: &Registration, now: u64) -> bool {
        let skew = CLOCK_SKEW_MAX_SECS;
        let remade = REMADE_EVERY.as_secs() + 1;
        if self.made == 0
            || target.started > now.saturating_add(skew)
            || self.made.saturating_add(remade + skew) < now
            || self.made > now.saturating_add(skew)
        {
            return true;
        }
        let Some(&silent_ms) = self.silent_ms.get(&target.osd) else {
            return false;
        };
        let since_start_ms = self
            .made
            .saturating_sub(target.started)
            .saturating_mul(1000);
        self.made > target.started && silent_ms.min(since_start_ms) >= self.grace_ms
    }

    /// Whether the reporter's current run made it.
    fn of_run(&self, reg: &Registration) -> bool {
        self.reporter == reg.osd && self.pid == reg.pid && self.started == reg.started
    }
}

/// The reports of OSDs registered now, made by their current runs, by reporter.
pub fn current(
    reports: BTreeMap<u32, FailureReport>,
    alive: &BTreeMap<u32, Registration>,
) -> BTreeMap<u32, FailureReport> {
    reports
        .into_iter()
        .filter(|(id, r)| alive.get(id).is_some_and(|reg| r.of_run(reg)))
        .collect()
}

/// Publishes `report` under `lease` (the reporter's own), or deletes its report (`None`).
pub fn publish_etcd(
    etcd: &Etcd,
    cluster: &str,
    osd: u32,
    lease: i64,
    report: Option<&FailureReport>,
) -> Result<(), MapStoreError> {
    let key = keys::failure_report(cluster, osd);
    let value = report.map(|r| serde_json::to_vec(r).expect("a report serializes"));
    let put = match &value {
        Some(v) => Put::Put {
            key: &key,
            value: v,
            lease,
        },
        None => Put::Delete(&key),
    };
    etcd.txn(&[], &[put]).map(|_| ())
}

/// Every report in etcd, by reporter (entries that do not decode are skipped and logged).
pub fn etcd_reports(
    etcd: &Etcd,
    cluster: &str,
) -> Result<BTreeMap<u32, FailureReport>, MapStoreError> {
    let mut out = BTreeMap::new();
    for kv in etcd.get_prefix(&keys::failure_reports_prefix(cluster))? {
        match serde_json::from_slice::<FailureReport>(&kv.value) {
            Ok(r) => {
                out.insert(r.reporter, r);
            }
            Err(e) => tracing::warn!("ignoring failure report {}: {e}", kv.key),
        }
    }
    Ok(out)
}

/// Writes `report` beside the map file in `dir` (whole, by rename), or removes this OSD's
/// report (`None`).
pub fn publish_local(
    dir: &Path,
    osd: u32,
    report: Option<&FailureReport>,
) -> Result<(), MapStoreError> {
    let reports = dir.join(REPORTS_DIR);
    let path = reports.join(format!("osd.{osd}"));
    let io =
        |p: &Path, e: std::io::Error| MapStoreError::Unavailable(format!("{}: {e}", p.display()));
    let Some(report) = report else {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&path, e)),
            _ => Ok(()),
        };
    };
    std::fs::create_dir_all(&reports).map_err(|e| io(&reports, e))?;
    let tmp = reports.join(format!(".osd.{osd}.{}", std::process::id()));
    std::fs::write(
        &tmp,
        serde_json::to_vec(report).expect("a report serializes"),
    )
    .map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
}

/// Every report beside the map file in `dir`, by reporter (files that do not decode are
/// skipped and logged).
pub fn local_reports(dir: &Path) -> Result<BTreeMap<u32, FailureReport>, MapStoreError> {
    let reports = dir.join(REPORTS_DIR);
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(&reports) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => {
            return Err(MapStoreError::Unavailable(format!(
                "{}: {e}",
                reports.display()
            )))
        }
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("osd.") {
            continue;
        }
        // A report removed between the listing and the read is simply gone.
        let Ok(text) = std::fs::read(e.path()) else {
            continue;
        };
        match serde_json::from_slice::<FailureReport>(&text) {
            Ok(r) => {
                out.insert(r.reporter, r);
            }
            Err(err) => tracing::warn!("ignoring failure report {name}: {err}"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(osd: u32, pid: u32) -> Registration {
        Registration {
            osd,
            host: "h".into(),
            pid,
            reactors: Vec::new(),
            started: 7,
            capacity: 0,
            pid_ns: 0,
            boot_id: String::new(),
        }
    }

    #[test]
    fn local_reports_round_trip_and_only_current_runs_count() {
        let dir = std::env::temp_dir().join(format!("carmine-reports-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let silent: BTreeMap<u32, u64> = [(2, 12_000)].into();
        publish_local(
            dir.as_path(),
            1,
            Some(&FailureReport::new(
                &reg(1, 50),
                silent,
                0,
                std::time::Duration::ZERO,
            )),
        )
        .unwrap();
        publish_local(
            dir.as_path(),
            3,
            Some(&FailureReport::new(
                &reg(3, 60),
                [(2, 9_000)].into(),
                0,
                std::time::Duration::ZERO,
            )),
        )
        .unwrap();
        let all = local_reports(dir.as_path()).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[&1].silent_ms[&2], 12_000);
        // osd.1 restarted (another pid) and osd.3 is not registered: neither report counts.
        let alive: BTreeMap<u32, Registration> = [(1, reg(1, 51))].into();
        assert!(current(all.clone(), &alive).is_empty());
        let alive: BTreeMap<u32, Registration> = [(1, reg(1, 50)), (3, reg(3, 60))].into();
        assert_eq!(current(all, &alive).len(), 2);
        // Withdrawn.
        publish_local(dir.as_path(), 1, None).unwrap();
        publish_local(dir.as_path(), 1, None).unwrap();
        assert_eq!(
            local_reports(dir.as_path())
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            vec![&3]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
