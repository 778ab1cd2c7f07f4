//! A private, single-member etcd started from `PATH` inside a directory (data, log), on free
//! loopback ports: what `cluster up --with-etcd` and the tests use, the way Ceph's vstart
//! starts its monitors.

use crate::tls_material::TlsMaterial;
use crate::{EtcdAccess, MapStoreError};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a starting etcd may take to answer `/health`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running private etcd; stopped (and reaped) when dropped.
pub struct PrivateEtcd {
    child: Child,
    endpoint: String,
    dir: PathBuf,
    /// How clients reach it: nothing for a plain one; TLS files and root's credentials for a
    /// secured one.
    access: EtcdAccess,
}

/// How many times a start is retried when etcd lost a race for its port.
const START_ATTEMPTS: u32 = 6;

/// A loopback port that is free now, taken below the kernel's ephemeral range (32768 and
/// up by default): a port from that range can be given to some other process's outgoing
/// connection between this check and etcd's bind, which happened in CI with several etcds
/// and their clients starting at once.
fn free_port() -> Result<u16, MapStoreError> {
    for _ in 0..64 {
        let port = rand::random_range(10_000..32_000);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| MapStoreError::Unavailable(format!("finding a free port: {e}")))
}

/// Whether etcd's log says it could not bind (another process took the port first).
fn lost_port_race(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|l| l.contains("address already in use"))
}

impl PrivateEtcd {
    /// Starts `etcd` with its data in `dir/etcd.data` and its log in `dir/etcd.log`. A start
    /// that lost its port to another process is retried on other ports (a data directory
    /// that the failed start created is removed first, so the retry starts clean).
    pub fn start(dir: &Path) -> Result<Self, MapStoreError> {
        Self::start_with(dir, false)
    }

    /// Like [`PrivateEtcd::start`], secured: clients must present a certificate signed by the
    /// etcd's own CA (TLS both ways), and etcd auth is on, with a root password. The material
    /// is made once in `dir/etcd-tls` and reused by restarts; [`PrivateEtcd::access`] says
    /// how to connect.
    pub fn start_secure(dir: &Path) -> Result<Self, MapStoreError> {
        Self::start_with(dir, true)
    }

    fn start_with(dir: &Path, secure: bool) -> Result<Self, MapStoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| MapStoreError::Unavailable(format!("creating {}: {e}", dir.display())))?;
        let tls = if secure {
            Some(TlsMaterial::ensure(dir)?)
        } else {
            None
        };
        let data = dir.join("etcd.data");
        let had_data = data.exists();
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(dir, tls.as_ref()) {
                Err(e) if attempt < START_ATTEMPTS && lost_port_race(&dir.join("etcd.log")) => {
                    tracing::warn!("private etcd lost its port at start, retrying: {e}");
                    if !had_data {
                        let _ = std::fs::remove_dir_all(&data);
                    }
                }
                Err(e) => return Err(e),
                Ok(etcd) => {
                    if secure {
                        etcd.ensure_auth()?;
                    }
                    return Ok(etcd);
                }
            }
        }
    }

    /// Turns etcd auth on the first time a secured etcd starts (a marker file says it is done).
    fn ensure_auth(&self) -> Result<(), MapStoreError> {
        let marker = self.dir.join("etcd-tls").join("auth-enabled");
        if marker.exists() {
            return Ok(());
        }
        let without_user = EtcdAccess {
            user: None,
            password_file: None,
            ..self.access.clone()
        };
        let password = self
            .access
            .credentials()?
            .map(|c| c.password)
            .expect("a secured etcd has credentials");
        crate::etcd_client::Etcd::with_access(std::slice::from_ref(&self.endpoint), &without_user)?
            .enable_auth(&password)?;
        std::fs::write(&marker, b"")
            .map_err(|e| MapStoreError::Unavailable(format!("{}: {e}", marker.display())))
    }

    fn start_once(dir: &Path, tls: Option<&TlsMaterial>) -> Result<Self, MapStoreError> {
        let unavailable = |what: String| MapStoreError::Unavailable(what);
        let client = free_port()?;
        let peer = loop {
            let p = free_port()?;
            if p != client {
                break p;
            }
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://127.0.0.1:{client}");
        // One member on loopback: its peer port carries no traffic, so stays plain.
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log"))
            .map_err(|e| unavailable(format!("creating etcd.log: {e}")))?;
        let mut cmd = Command::new("etcd");
        if let Some(t) = tls {
            cmd.arg("--cert-file")
                .arg(&t.server_cert)
                .arg("--key-file")
                .arg(&t.server_key)
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg("--name")
            .arg("carmine")
            .arg("--data-dir")
            .arg(dir.join("etcd.data"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("carmine={peer_url}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| unavailable(e.to_string()))?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    unavailable(
                        "the `etcd` binary is not on PATH: install it (Debian: apt-get install \
                         etcd-server) or give the endpoints of an existing etcd"
                            .into(),
                    )
                } else {
                    unavailable(format!("starting etcd: {e}"))
                }
            })?;
        let mut etcd = PrivateEtcd {
            child,
            endpoint,
            dir: dir.to_owned(),
            access: tls.map(|t| t.client.clone()).unwrap_or_default(),
        };
        etcd.wait_healthy()?;
        Ok(etcd)
    }

    fn wait_healthy(&mut self) -> Result<(), MapStoreError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let url = format!("{}/health", self.endpoint);
        let agent = self.access.agent()?;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(MapStoreError::Unavailable(format!(
                    "etcd exited at start ({status}); see {}",
                    self.dir.join("etcd.log").display()
                )));
            }
            let healthy = agent
                .get(&url)
                .timeout(Duration::from_secs(1))
                .call()
                .ok()
                .and_then(|r| r.into_string().ok())
                .is_some_and(|body| body.contains("\"true\""));
            if healthy {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(MapStoreError::Unavailable(format!(
                    "etcd did not become healthy in {START_TIMEOUT:?}; see {}",
                    self.dir.join("etcd.log").display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client URL, for [`crate::EtcdMapStore::new`].
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// How clients connect (TLS files and credentials of a secured etcd; empty otherwise).
    pub fn access(&self) -> &EtcdAccess {
        &self.access
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Leaves etcd running past this handle (a daemon that `cluster down` stops by pid);
    /// returns its pid.
    pub fn detach(self) -> u32 {
        let me = std::mem::ManuallyDrop::new(self);
        // The handle is never dropped: the process is left running, and its `Child` (a pid
        // and closed pipes) is simply forgotten.
        me.child.id()
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_picked_below_the_ephemeral_range_and_are_bindable() {
        for _ in 0..20 {
            let p = free_port().unwrap();
            assert!((10_000..32_000).contains(&p), "{p}");
        }
    }

    #[test]
    fn a_bind_failure_in_the_log_is_a_lost_race_and_other_failures_are_not() {
        let dir = std::env::temp_dir().join(format!("carmine-etcd-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("etcd.log");
        std::fs::write(
            &log,
            "C | etcdmain: listen tcp 127.0.0.1:38981: bind: address already in use\n",
        )
        .unwrap();
        assert!(lost_port_race(&log));
        std::fs::write(
            &log,
            "C | etcdmain: cannot access data directory: permission denied\n",
        )
        .unwrap();
        assert!(!lost_port_race(&log));
        assert!(!lost_port_race(&dir.join("absent.log")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
