//! Where a local cluster keeps its map: the file `osdmap` in its directory (the default), or
//! etcd — an existing one (`cluster up --etcd URL,…`) or a private one that the cluster
//! directory holds (`--with-etcd`: data, log and pid there, started by `up`, stopped by
//! `down`), the way vstart runs monitors.

use anyhow::{Context, Result};
use carmine_mapstore::etcd_client::Etcd;
use carmine_mapstore::{EtcdAccess, EtcdMapStore, LocalMapStore, MapStore, PrivateEtcd};
use std::path::Path;
use std::time::{Duration, Instant};

const ETCD_PID: &str = "etcd.pid";
/// How long `down` waits for the private etcd to exit after SIGTERM.
const ETCD_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The etcd a cluster's map lives in.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct EtcdSettings {
    pub endpoints: Vec<String>,
    /// Run by the cluster directory (`--with-etcd`), rather than someone else's.
    pub private: bool,
    /// The cluster's name in etcd: its map is `/carmine/<name>/osdmap`.
    pub cluster: String,
    /// Manager processes `up` runs (one leads).
    #[serde(default = "managers_default")]
    pub managers: u32,
    /// TTL of the OSDs' and managers' leases: how soon a dead one is noticed.
    #[serde(default = "lease_ttl_default")]
    pub lease_ttl_secs: u64,
    /// How long an OSD stays down before it is marked out.
    #[serde(default = "grace_default")]
    pub down_out_grace_secs: u64,
    /// The private etcd runs secured (TLS both ways, etcd auth): every new one does; one
    /// made before this existed stays plain.
    #[serde(default)]
    pub secure: bool,
    /// TLS files and credentials for reaching etcd (the private one's, or those given with
    /// `--etcd`).
    #[serde(default, skip_serializing_if = "EtcdAccess::is_empty")]
    pub access: EtcdAccess,
}

fn managers_default() -> u32 {
    crate::managers::MANAGERS_DEFAULT
}
pub(crate) fn lease_ttl_default() -> u64 {
    5
}
pub(crate) fn grace_default() -> u64 {
    600
}

impl EtcdSettings {
    /// These settings with the tunables `up` was given.
    pub fn with_flags(&self, a: &crate::UpArgs) -> Self {
        EtcdSettings {
            managers: a.managers.unwrap_or(self.managers),
            lease_ttl_secs: a.lease_ttl.unwrap_or(self.lease_ttl_secs).max(1),
            down_out_grace_secs: a.down_out_grace.unwrap_or(self.down_out_grace_secs),
            ..self.clone()
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "etcd {}{}{} key /carmine/{}/osdmap",
            self.endpoints.join(","),
            if self.private {
                " (private, in the cluster directory)"
            } else {
                ""
            },
            match (&self.access.ca, &self.access.user) {
                (Some(_), Some(u)) => format!(" over TLS as {u}"),
                (Some(_), None) => " over TLS".into(),
                (None, Some(u)) => format!(" as {u}"),
                (None, None) => String::new(),
            },
            self.cluster
        )
    }

    /// A client of this etcd.
    pub fn client(&self) -> Result<Etcd> {
        Ok(Etcd::with_access(&self.endpoints, &self.access)?)
    }

    /// The flags that reach this etcd: endpoints, cluster name and access.
    pub fn osd_args(&self) -> Vec<String> {
        let mut v = vec![
            "--etcd".to_owned(),
            self.endpoints.join(","),
            "--cluster-name".into(),
            self.cluster.clone(),
        ];
        v.extend(self.access.to_args());
        v
    }
}

/// Puts the cluster key in etcd for OSDs on other hosts, when etcd authenticates its clients
/// (otherwise anyone reaching etcd's port could read it, and the key file is copied by hand).
/// Returns whether etcd holds this key now.
pub(crate) fn publish_key(e: &EtcdSettings, key: &carmine_proto::auth::AuthKey) -> Result<bool> {
    if !e.access.authenticates() {
        return Ok(false);
    }
    let store = EtcdMapStore::with_access(&e.endpoints, &e.access, &e.cluster)?;
    if !store.publish_key(&key.to_hex())? {
        anyhow::bail!(
            "etcd holds another key for cluster {} than this directory's cluster.key: \
             refusing to start OSDs that would not let each other's clients in",
            e.cluster
        );
    }
    Ok(true)
}

/// Whether etcd holds the cluster's key (so an OSD started with `--etcd` fetches it).
pub(crate) fn key_in_etcd(e: &EtcdSettings) -> bool {
    e.access.authenticates()
        && EtcdMapStore::with_access(&e.endpoints, &e.access, &e.cluster)
            .and_then(|s| s.stored_key())
            .is_ok_and(|k| k.is_some())
}

/// The map store of the cluster in `dir`.
pub(crate) fn open(dir: &Path, etcd: Option<&EtcdSettings>) -> Result<Box<dyn MapStore>> {
    Ok(match etcd {
        None => Box::new(LocalMapStore::new(crate::map_path(dir))),
        Some(e) => Box::new(EtcdMapStore::with_access(
            &e.endpoints,
            &e.access,
            &e.cluster,
        )?),
    })
}

/// The private etcd's pid, if it runs (a recycled pid is not taken for it).
pub(crate) fn private_pid(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join(ETCD_PID))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let data = dir.join("etcd.data");
    let ours = cmdline
        .split(|b| *b == 0)
        .any(|a| Path::new(std::str::from_utf8(a).unwrap_or("")) == data);
    (ours && !crate::is_zombie(pid)).then_some(pid)
}

/// Starts the private etcd of `dir` unless it runs; returns the settings with its endpoint
/// (the port may change between runs; the data stays).
pub(crate) fn ensure_private(dir: &Path, e: &EtcdSettings) -> Result<(EtcdSettings, bool)> {
    if private_pid(dir).is_some() {
        return Ok((e.clone(), false));
    }
    let etcd = if e.secure {
        PrivateEtcd::start_secure(dir)?
    } else {
        PrivateEtcd::start(dir)?
    };
    let endpoint = etcd.endpoint().to_owned();
    let access = etcd.access().clone();
    let pid = etcd.detach();
    std::fs::write(dir.join(ETCD_PID), pid.to_string())
        .with_context(|| format!("writing {}", dir.join(ETCD_PID).display()))?;
    Ok((
        EtcdSettings {
            endpoints: vec![endpoint],
            access,
            ..e.clone()
        },
        true,
    ))
}

/// Stops the private etcd of `dir`, if it runs; true if it did.
pub(crate) fn stop_private(dir: &Path) -> Result<bool> {
    let Some(pid) = private_pid(dir) else {
        let _ = std::fs::remove_file(dir.join(ETCD_PID));
        return Ok(false);
    };
    // SAFETY: plain syscall; the pid was just checked to be this directory's etcd.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + ETCD_STOP_TIMEOUT;
    while private_pid(dir).is_some() {
        if Instant::now() > deadline {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_file(dir.join(ETCD_PID))?;
    Ok(true)
}

/// Forgets the private etcd's data (for `forget`).
pub(crate) fn remove_private(dir: &Path) -> Result<()> {
    stop_private(dir)?;
    for d in ["etcd.data", "etcd-tls"] {
        let data = dir.join(d);
        if data.exists() {
            std::fs::remove_dir_all(&data)
                .with_context(|| format!("removing {}", data.display()))?;
        }
    }
    Ok(())
}

/// A name for a new cluster's key in etcd: unique, so clusters sharing an etcd never collide.
pub(crate) fn new_cluster_name() -> String {
    let mut b = [0u8; 6];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    let n = b.iter().fold(0u64, |n, x| n << 8 | *x as u64) ^ std::process::id() as u64;
    format!("c{n:012x}")
}
