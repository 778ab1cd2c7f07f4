//! A private, single-member etcd started from `PATH` inside a directory (data, log), on free
//! loopback ports: what `cluster up --with-etcd` and the tests use, the way Ceph's vstart
//! starts its monitors.

use crate::MapStoreError;
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
}

fn free_port() -> Result<u16, MapStoreError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| MapStoreError::Unavailable(format!("finding a free port: {e}")))
}

impl PrivateEtcd {
    /// Starts `etcd` with its data in `dir/etcd.data` and its log in `dir/etcd.log`.
    pub fn start(dir: &Path) -> Result<Self, MapStoreError> {
        let unavailable = |what: String| MapStoreError::Unavailable(what);
        std::fs::create_dir_all(dir)
            .map_err(|e| unavailable(format!("creating {}: {e}", dir.display())))?;
        let (client, peer) = (free_port()?, free_port()?);
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log"))
            .map_err(|e| unavailable(format!("creating etcd.log: {e}")))?;
        let child = Command::new("etcd")
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
        };
        etcd.wait_healthy()?;
        Ok(etcd)
    }

    fn wait_healthy(&mut self) -> Result<(), MapStoreError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let url = format!("{}/health", self.endpoint);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(MapStoreError::Unavailable(format!(
                    "etcd exited at start ({status}); see {}",
                    self.dir.join("etcd.log").display()
                )));
            }
            let healthy = ureq::get(&url)
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
