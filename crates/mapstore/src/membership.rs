//! Liveness in etcd: running OSDs register under a lease they renew, and managers elect one
//! leader the same way (a key created only if absent, attached to the creator's lease). A
//! process that dies or loses etcd for longer than its lease's TTL loses its key, and the
//! others see it go.

use crate::etcd_client::{Compare, Etcd, Put};
use crate::{keys, MapStoreError};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// This machine's name: the failure domain its OSDs share, and how a registration tells a
/// holder on this host (whose process can be checked) from one elsewhere.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// What a running OSD says about itself.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Registration {
    pub osd: u32,
    pub host: String,
    pub pid: u32,
    /// The endpoint each of its reactors listens on.
    pub reactors: Vec<SocketAddr>,
    /// When this incarnation started (Unix seconds).
    pub started: u64,
    /// Its store's capacity in bytes (0: not said, by an OSD older than this field).
    #[serde(default)]
    pub capacity: u64,
    /// The PID namespace its pid is in ([`pid_namespace`]; 0: not said): a pid names the same
    /// process only within one, so only there may a successor find it gone.
    #[serde(default)]
    pub pid_ns: u64,
    /// The boot of the machine it runs on ([`boot_id`]; empty: not said). Host names can
    /// repeat (cloned machines, `localhost`) and the first PID namespace's inode is the same
    /// on every machine: only the same boot makes a pid checkable here.
    #[serde(default)]
    pub boot_id: String,
}

/// This machine's current boot, random per boot (empty if unknown).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|b| b.trim().to_owned())
        .unwrap_or_default()
}

/// This process's PID namespace, as the inode of `/proc/self/ns/pid` (0 if unknown).
pub fn pid_namespace() -> u64 {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|p| {
            let p = p.to_string_lossy().into_owned();
            p.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
        })
        .unwrap_or(0)
}

/// An OSD's registration, held while it runs. Dropping it without [`OsdLease::release`]
/// leaves the key to expire with the lease (as a crash does).
#[derive(Debug)]
pub struct OsdLease {
    etcd: Etcd,
    reg: Registration,
    key: String,
    value: Vec<u8>,
    ttl: Duration,
    lease: i64,
}

impl OsdLease {
    /// Registers `reg` under a new lease of `ttl`. While another process holds the OSD's key
    /// (a second OSD with the same id, or a crashed one whose lease has not run out yet) it
    /// retries for up to `wait`, then refuses with who holds it.
    pub fn register(
        etcd: &Etcd,
        cluster: &str,
        reg: &Registration,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Self, MapStoreError> {
        let mut me = OsdLease {
            etcd: etcd.clone(),
            reg: reg.clone(),
            key: keys::alive(cluster, reg.osd),
            value: serde_json::to_vec(reg).expect("a registration serializes"),
            ttl,
            lease: 0,
        };
        let deadline = Instant::now() + wait;
        loop {
            if me.claim()? {
                return Ok(me);
            }
            if Instant::now() >= deadline {
                let holder = etcd
                    .get(&me.key)?
                    .0
                    .and_then(|v| serde_json::from_slice::<Registration>(&v).ok());
                return Err(MapStoreError::Invalid(match holder {
                    Some(h) => format!(
                        "osd.{} is already running: pid {} on {} registered it and keeps it alive",
                        reg.osd, h.pid, h.host
                    ),
                    None => format!("osd.{} is already registered", reg.osd),
                }));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// A fresh lease and the key under it, if the key is free — or holds this very
    /// registration (an earlier claim whose reply was lost after etcd applied it), or that of
    /// a predecessor whose process is gone ([`OsdLease::succeeds`]): then the key moves to
    /// the new lease.
    fn claim(&mut self) -> Result<bool, MapStoreError> {
        let lease = self.etcd.grant(self.ttl)?;
        let put = Put::Put {
            key: &self.key,
            value: &self.value,
            lease,
        };
        let won = self
            .etcd
            .txn(&[Compare::Absent(&self.key)], std::slice::from_ref(&put))
            .and_then(|won| match won {
                true => Ok(true),
                false => self.etcd.txn(
                    &[Compare::Value(&self.key, &self.value)],
                    std::slice::from_ref(&put),
                ),
            })
            .and_then(|won| match won {
                true => Ok(true),
                false => match self.etcd.get(&self.key)?.0 {
                    Some(held) if self.succeeds(&held) => self.etcd.txn(
                        &[Compare::Value(&self.key, &held)],
                        std::slice::from_ref(&put),
                    ),
                    _ => Ok(false),
                },
            });
        match won {
            Ok(true) => {
                self.lease = lease;
                Ok(true)
            }
            Ok(false) => {
                self.etcd.revoke(lease)?;
                Ok(false)
            }
            Err(e) => {
                // The lease would expire unused anyway; do not wait for it.
                let _ = self.etcd.revoke(lease);
                Err(e)
            }
        }
    }

    /// Whether registration `held` is of this OSD's predecessor whose process is gone: the
    /// same OSD, host, boot and PID namespace, and no live process with its pid. Its key would
    /// otherwise wait out its lease — the OSD's PGs stalled that long, and the managers,
    /// seeing it absent for a moment, marked it down and up again, two epochs of peering for
    /// a restart (a supervisor's, or `cluster up` after a crash).
    fn succeeds(&self, held: &[u8]) -> bool {
        let Ok(h) = serde_json::from_slice::<Registration>(held) else {
            return false;
        };
        let me = &self.reg;
        h.osd == me.osd
            && h.host == me.host
            && !me.boot_id.is_empty()
            && h.boot_id == me.boot_id
            && me.pid_ns != 0
            && h.pid_ns == me.pid_ns
            && h.pid != me.pid
            && !crate::local_membership::pid_alive(h.pid)
    }

    /// Renews the lease; call it a few times per TTL. If it had run out (etcd was unreachable
    /// for longer than the TTL, and the managers may have marked this OSD down), or the key
    /// was deleted by hand, registers again and returns false. Each renewal also checks that
    /// the key still holds this registration under this lease: a lease renewed says nothing
    /// about the key once another process took it over ([`OsdLease::succeeds`] judged this
    /// one gone), and then this one gets [`MapStoreError::Displaced`] and must stop serving.
    pub fn renew(&mut self) -> Result<bool, MapStoreError> {
        if !self.etcd.keep_alive(self.lease)? {
            if !self.claim()? {
                return Err(self.not_taken());
            }
            return Ok(false);
        }
        let held = self.etcd.get_kv(&self.key)?.0;
        let compare = match &held {
            Some(kv) if kv.value == self.value && kv.lease == self.lease => return Ok(true),
            Some(kv) if kv.value != self.value => return Err(self.displaced(&kv.value)),
            // Ours under another lease (an earlier attempt of this process whose reply was
            // lost), or deleted by hand: back under this lease.
            Some(_) => Compare::Value(&self.key, &self.value),
            None => Compare::Absent(&self.key),
        };
        let put = Put::Put {
            key: &self.key,
            value: &self.value,
            lease: self.lease,
        };
        if self.etcd.txn(&[compare], &[put])? {
            return Ok(false);
        }
        Err(self.not_taken())
    }

    /// Why the key could not be taken again: another registration holds it
    /// ([`MapStoreError::Displaced`]), or nothing that says so (it vanished meanwhile, or
    /// holds this one: a reply lost after etcd applied the change), which the next renewal
    /// tries again.
    fn not_taken(&self) -> MapStoreError {
        match self.etcd.get_kv(&self.key) {
            Ok((Some(kv), _)) if kv.value != self.value => self.displaced(&kv.value),
            Ok(_) => MapStoreError::Unavailable(format!(
                "{} could not be taken again; retrying",
                self.key
            )),
            Err(e) => e,
        }
    }

    fn displaced(&self, held: &[u8]) -> MapStoreError {
        let by = match serde_json::from_slice::<Registration>(held) {
            Ok(h) => format!("pid {} on {}", h.pid, h.host),
            Err(_) => "another process".to_string(),
        };
        MapStoreError::Displaced(format!(
            "osd.{}'s registration ({}) was taken over by {by}",
            self.reg.osd, self.key
        ))
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The lease the registration is attached to now (a new one after a lapse): what the
    /// OSD's failure report goes under.
    pub fn lease_id(&self) -> i64 {
        self.lease
    }

    /// Deregisters now (a clean stop): the managers see the OSD go at once.
    pub fn release(self) -> Result<(), MapStoreError> {
        self.etcd.revoke(self.lease)
    }
}

/// The OSDs registered now, by id. Entries that do not decode are skipped (and logged).
pub fn registered(
    etcd: &Etcd,
    cluster: &str,
) -> Result<BTreeMap<u32, Registration>, MapStoreError> {
    let mut out = BTreeMap::new();
    for kv in etcd.get_prefix(&keys::alive_prefix(cluster))? {
        match serde_json::from_slice::<Registration>(&kv.value) {
            Ok(r) => {
                out.insert(r.osd, r);
            }
            Err(e) => tracing::warn!("ignoring registration {}: {e}", kv.key),
        }
    }
    Ok(out)
}

/// The manager leadership of a cluster, while held.
#[derive(Debug)]
pub struct Leadership {
    etcd: Etcd,
    key: String,
    name: String,
    lease: i64,
}

impl Leadership {
    /// Becomes leader if nobody is: `None` if another manager holds the key. `name` must be
    /// unique to this process (it is what guarded writes compare).
    pub fn campaign(
        etcd: &Etcd,
        cluster: &str,
        name: &str,
        ttl: Duration,
    ) -> Result<Option<Self>, MapStoreError> {
        let key = keys::leader(cluster);
        let lease = etcd.grant(ttl)?;
        let put = Put::Put {
            key: &key,
            value: name.as_bytes(),
            lease,
        };
        if etcd.txn(&[Compare::Absent(&key)], &[put])? {
            return Ok(Some(Leadership {
                etcd: etcd.clone(),
                key,
                name: name.to_owned(),
                lease,
            }));
        }
        etcd.revoke(lease)?;
        Ok(None)
    }

    /// Renews the lease; false once it is lost (another manager may lead by now).
    pub fn renew(&self) -> Result<bool, MapStoreError> {
        self.etcd.keep_alive(self.lease)
    }

    /// The compare that makes a write conditional on still leading.
    pub fn guard(&self) -> Compare<'_> {
        Compare::Value(&self.key, self.name.as_bytes())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Steps down now, so another manager takes over without waiting for the TTL.
    pub fn resign(self) -> Result<(), MapStoreError> {
        self.etcd.revoke(self.lease)
    }
}

/// The current leader's name, if any manager leads.
pub fn leader(etcd: &Etcd, cluster: &str) -> Result<Option<String>, MapStoreError> {
    Ok(etcd
        .get(&keys::leader(cluster))?
        .0
        .map(|v| String::from_utf8_lossy(&v).into_owned()))
}
