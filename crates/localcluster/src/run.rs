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
    pub recovery_max_active: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill_min_objects: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_poll_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_writes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_cache: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_cache: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleaner_rate: Option<u64>,
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

    /// These settings as `a`'s flags change them (over the defaults with
    /// `--reset-osd-settings`), and each change in words.
    pub fn with_flags(&self, a: &UpArgs) -> (OsdRun, Vec<String>) {
        let kept = match a.reset_osd_settings {
            true => OsdRun::default(),
            false => self.clone(),
        };
        let mut now = kept.clone();
        now.memory_limit = a.memory_limit.or(kept.memory_limit);
        now.cpu_policy = a
            .cpu_policy
            .map(|p| p.to_string())
            .or(kept.cpu_policy.clone());
        now.cpu_set = a.cpu_set.clone().or(kept.cpu_set.clone());
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
        now.recovery_rate_mib = a.recovery_rate_mib.or(kept.recovery_rate_mib);
        now.recovery_busy_rate_mib = a.recovery_busy_rate_mib.or(kept.recovery_busy_rate_mib);
        now.recovery_max_active = a.recovery_max_active.or(kept.recovery_max_active);
        now.backfill_min_objects = a.backfill_min_objects.or(kept.backfill_min_objects);
        now.idle_poll_us = a.idle_poll_us.or(kept.idle_poll_us);
        now.journal_writes = a.journal_writes.or(kept.journal_writes);
        now.object_cache = a.object_cache.or(kept.object_cache);
        now.metadata_cache = a.metadata_cache.or(kept.metadata_cache);
        now.cleaner_rate = a.cleaner_rate.or(kept.cleaner_rate);
        let changes = self.changes_to(&now);
        (now, changes)
    }

    /// Each setting as `up` names it, and its value in words.
    fn described(&self) -> [(&'static str, String); 14] {
        let or = |v: Option<String>, none: &str| v.unwrap_or_else(|| none.into());
        let num = |v: Option<u64>| or(v.map(|v| v.to_string()), "default");
        [
            ("memory limit", self.memory_limit().to_string()),
            ("cpu policy", self.cpu_policy().to_string()),
            ("cpu set", or(self.cpu_set.clone(), "all")),
            ("pinning", if self.no_pin { "off" } else { "on" }.into()),
            ("durability", or(self.durability.clone(), "fsync")),
            ("recovery rate MiB/s", num(self.recovery_rate_mib)),
            (
                "recovery rate MiB/s while busy",
                num(self.recovery_busy_rate_mib),
            ),
            (
                "objects recovered at once",
                num(self.recovery_max_active.map(|v| v as u64)),
            ),
            (
                "backfill min objects",
                num(self.backfill_min_objects.map(|v| v as u64)),
            ),
            ("idle poll µs", num(self.idle_poll_us)),
            ("journal writes", num(self.journal_writes.map(u64::from))),
            ("object cache bytes", num(self.object_cache)),
            ("metadata cache bytes", num(self.metadata_cache)),
            ("cleaner rate bytes/s", num(self.cleaner_rate)),
        ]
    }

    /// What differs from `self` in `now`, one line per setting.
    fn changes_to(&self, now: &OsdRun) -> Vec<String> {
        let mut out: Vec<String> = self
            .described()
            .into_iter()
            .zip(now.described())
            .filter(|((_, old), (_, new))| old != new)
            .map(|((what, old), (_, new))| {
                format!("OSD setting changed for this and later restarts: {what} {old} -> {new}")
            })
            .collect();
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
        opt(
            "--recovery-max-active",
            self.recovery_max_active.map(|v| v.to_string()),
        );
        opt(
            "--backfill-min-objects",
            self.backfill_min_objects.map(|v| v.to_string()),
        );
        opt("--idle-poll-us", self.idle_poll_us.map(|v| v.to_string()));
        opt(
            "--journal-writes",
            self.journal_writes.map(|v| v.to_string()),
        );
        if native {
            opt("--object-cache", self.object_cache.map(|v| v.to_string()));
            opt(
                "--metadata-cache",
                self.metadata_cache.map(|v| v.to_string()),
            );
            opt("--cleaner-rate", self.cleaner_rate.map(|v| v.to_string()));
        }
        if self.no_pin {
            args.push("--no-pin".into());
        }
        args
    }
}
