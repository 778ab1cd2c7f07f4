//! What `carmine_conf_set` takes: where the cluster is, which pool, and how the library's
//! reactors run. Checked when set, so a typo fails at the call that made it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// A cluster directory (`carmine cluster up --dir`): its map and key.
    pub cluster_dir: Option<PathBuf>,
    /// Or OSD endpoints to fetch the map from (with `key_file` if the cluster authenticates).
    pub osds: Vec<SocketAddr>,
    pub key_file: Option<PathBuf>,
    pub pool: String,
    /// Reactor threads; images are spread over them in the order they are opened.
    pub reactors: usize,
    /// CPUs to pin the reactors to, one per reactor (empty: unpinned).
    pub reactor_cpus: Vec<u32>,
    /// Requests queued to one reactor, not yet taken by it; a caller beyond it waits.
    pub queue_depth: usize,
    pub retry_timeout: Duration,
    /// Lease of the exclusive lock a writable open takes.
    pub lock_lease: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cluster_dir: None,
            osds: Vec::new(),
            key_file: None,
            pool: "rbd".into(),
            reactors: 1,
            reactor_cpus: Vec::new(),
            queue_depth: 4096,
            retry_timeout: carmine_client::RETRY_TIMEOUT_DEFAULT,
            lock_lease: Duration::from_secs(10),
        }
    }
}

/// The keys `carmine_conf_set` knows, for its error message.
pub(crate) const KEYS: &str = "cluster_dir, osds, key_file, pool, reactors, reactor_cpus, \
                               queue_depth, retry_timeout_ms, lock_lease_ms";

impl Config {
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let number = |max: u64| -> Result<u64, String> {
            match value.trim().parse::<u64>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(format!(
                    "{key} must be a number from 1 to {max}, not {value:?}"
                )),
            }
        };
        match key {
            "cluster_dir" => self.cluster_dir = Some(PathBuf::from(value)),
            "osds" => {
                self.osds = value
                    .split(',')
                    .map(|a| {
                        a.trim().parse().map_err(|_| {
                            format!("osds: {a:?} is not an address like 127.0.0.1:6800")
                        })
                    })
                    .collect::<Result<_, _>>()?
            }
            "key_file" => self.key_file = Some(PathBuf::from(value)),
            "pool" if value.is_empty() => return Err("pool must not be empty".into()),
            "pool" => self.pool = value.to_owned(),
            // 0: inline, on the caller's thread.
            "reactors" => {
                self.reactors = match value.trim() {
                    "0" => 0,
                    _ => number(64)? as usize,
                }
            }
            "reactor_cpus" => {
                self.reactor_cpus = value
                    .split(',')
                    .map(|c| {
                        c.trim()
                            .parse()
                            .map_err(|_| format!("reactor_cpus: {c:?} is not a CPU number"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "queue_depth" => self.queue_depth = number(1 << 20)? as usize,
            "retry_timeout_ms" => self.retry_timeout = Duration::from_millis(number(3_600_000)?),
            "lock_lease_ms" => self.lock_lease = Duration::from_millis(number(3_600_000)?),
            _ => return Err(format!("unknown option {key:?}; known: {KEYS}")),
        }
        Ok(())
    }

    /// Refuses a configuration that cannot connect.
    pub fn check(&self) -> Result<(), String> {
        if self.cluster_dir.is_none() && self.osds.is_empty() {
            return Err("set cluster_dir (a cluster directory) or osds (OSD endpoints)".into());
        }
        if self.reactors == 0 && !self.reactor_cpus.is_empty() {
            return Err(
                "reactor_cpus: an inline client (reactors=0) runs on the caller's thread".into(),
            );
        }
        if !self.reactor_cpus.is_empty() && self.reactor_cpus.len() != self.reactors {
            return Err(format!(
                "reactor_cpus names {} CPUs for {} reactors",
                self.reactor_cpus.len(),
                self.reactors
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_when_set() {
        let mut c = Config::default();
        c.set("osds", "127.0.0.1:6800, 127.0.0.1:6801").unwrap();
        assert_eq!(c.osds.len(), 2);
        assert!(c
            .set("osds", "localhost")
            .unwrap_err()
            .contains("not an address"));
        assert!(c.set("reactors", "-1").is_err());
        assert!(c.set("reactors", "two").is_err());
        c.set("reactors", "2").unwrap();
        c.set("reactor_cpus", "1").unwrap();
        assert!(c.check().unwrap_err().contains("1 CPUs for 2 reactors"));
        c.set("reactor_cpus", "0,1").unwrap();
        c.check().unwrap();
        assert!(c
            .set("colour", "red")
            .unwrap_err()
            .contains("known: cluster_dir"));
        assert!(c.set("pool", "").is_err());
        assert!(Config::default().check().is_err());
    }
}
