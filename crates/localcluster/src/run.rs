//! How a local cluster's OSD processes run: memory budget, cores and pinning, durability,
//! recovery pace. The `up` that makes a cluster chooses it and the cluster's settings file
//! keeps it, so that a later `up` (after a crash, a `down`, a killed OSD) restarts every OSD
//! as it ran. A flag given to that `up` changes the setting, for this and later restarts,
//! and says so.

use super::UpArgs;
use carmine_reactor::cpu::CpuPolicy;

/// What an OSD is started with beyond its id, map and store.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct OsdRun {
    /// Bytes per reactor shard; `None`: `MEMORY_LIMIT_DEFAULT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_set: Option<String>,
    #[serde(default)]
    pub no_pin: bool,
    /// The native store's durability as the OSD names it (`process-crash`,
    /// `power-loss-dsync`); `None`: the OSD's default, an fdatasync per journal write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_rate_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_busy_rate_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_poll_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_writes: Option<u32>,
}

/// A reactor shard's memory budget unless `--memory-limit` says otherwise.
pub(crate) const MEMORY_LIMIT_DEFAULT: u64 = 2 << 30;

impl OsdRun {
    pub fn memory_limit(&self) -> u64 {
        self.memory_limit.unwrap_or(MEMORY_LIMIT_DEFAULT)
    }

    pub fn cpu_policy(&self) -> CpuPolicy {
        self.cpu_policy
            .as_deref()
            .and_then(|p| p.parse().ok())
            .unwrap_or_default()
    }

    /// These settings as `a`'s flags change them, and each change in words.
    pub fn with_flags(&self, a: &UpArgs) -> (OsdRun, Vec<String>) {
        let mut now = self.clone();
        let given = |v: &Option<u64>, old: Option<u64>| v.or(old);
        now.memory_limit = given(&a.memory_limit, self.memory_limit);
        now.cpu_policy = a
            .cpu_policy
            .map(|p| p.to_string())
            .or(self.cpu_policy.clone());
        now.cpu_set = a.cpu_set.clone().or(self.cpu_set.clone());
        if a.no_pin {
            now.no_pin = true;
        } else if a.pin {
            now.no_pin = false;
        }
        if a.no_fsync {
            now.durability = Some("process-crash".into());
        } else if a.dsync {
            now.durability = Some("power-loss-dsync".into());
        } else if a.fsync {
            now.durability = None;
        }
        now.recovery_rate_mib = given(&a.recovery_rate_mib, self.recovery_rate_mib);
        now.recovery_busy_rate_mib = given(&a.recovery_busy_rate_mib, self.recovery_busy_rate_mib);
        now.idle_poll_us = given(&a.idle_poll_us, self.idle_poll_us);
        now.journal_writes = a.journal_writes.or(self.journal_writes);
        let changes = self.changes_to(&now);
        (now, changes)
    }

    /// What differs from `self` in `now`, one line per setting.
    fn changes_to(&self, now: &OsdRun) -> Vec<String> {
        let mut out = Vec::new();
        let mut diff = |what: &str, old: String, new: String| {
            if old != new {
                out.push(format!(
                    "OSD setting changed for this and later restarts: {what} {old} -> {new}"
                ));
            }
        };
        let opt = |v: &Option<String>, none: &str| v.clone().unwrap_or_else(|| none.into());
        let num = |v: Option<u64>, none: &str| v.map_or_else(|| none.into(), |v| v.to_string());
        diff(
            "memory limit",
            self.memory_limit().to_string(),
            now.memory_limit().to_string(),
        );
        diff(
            "cpu policy",
            self.cpu_policy().to_string(),
            now.cpu_policy().to_string(),
        );
        diff(
            "cpu set",
            opt(&self.cpu_set, "all"),
            opt(&now.cpu_set, "all"),
        );
        diff(
            "pinning",
            pinning(self.no_pin).into(),
            pinning(now.no_pin).into(),
        );
        diff(
            "durability",
            opt(&self.durability, "fsync"),
            opt(&now.durability, "fsync"),
        );
        diff(
            "recovery rate MiB/s",
            num(self.recovery_rate_mib, "default"),
            num(now.recovery_rate_mib, "default"),
        );
        diff(
            "recovery rate MiB/s while busy",
            num(self.recovery_busy_rate_mib, "default"),
            num(now.recovery_busy_rate_mib, "default"),
        );
        diff(
            "idle poll µs",
            num(self.idle_poll_us, "default"),
            num(now.idle_poll_us, "default"),
        );
        diff(
            "journal writes",
            num(self.journal_writes.map(u64::from), "default"),
            num(now.journal_writes.map(u64::from), "default"),
        );
        if now.durability.as_deref() == Some("process-crash")
            && self.durability.as_deref() != Some("process-crash")
        {
            out.push(
                "warning: native stores now acknowledge writes before they are synced: they \
                 survive a crash of the OSD process, not a power loss"
                    .into(),
            );
        }
        out
    }

    /// The OSD command line's flags for these settings (`native`: its store is).
    pub fn osd_args(&self, native: bool) -> Vec<String> {
        let mut args = vec![
            "--memory-limit".to_string(),
            self.memory_limit().to_string(),
            "--cpu-policy".into(),
            self.cpu_policy().to_string(),
        ];
        let mut opt = |flag: &str, v: Option<String>| {
            if let Some(v) = v {
                args.push(flag.into());
                args.push(v);
            }
        };
        opt("--cpu-set", self.cpu_set.clone());
        if native {
            opt("--durability", self.durability.clone());
        }
        opt(
            "--recovery-rate-mib",
            self.recovery_rate_mib.map(|v| v.to_string()),
        );
        opt(
            "--recovery-busy-rate-mib",
            self.recovery_busy_rate_mib.map(|v| v.to_string()),
        );
        opt("--idle-poll-us", self.idle_poll_us.map(|v| v.to_string()));
        opt(
            "--journal-writes",
            self.journal_writes.map(|v| v.to_string()),
        );
        if self.no_pin {
            args.push("--no-pin".into());
        }
        args
    }
}

fn pinning(no_pin: bool) -> &'static str {
    if no_pin {
        "off"
    } else {
        "on"
    }
}
