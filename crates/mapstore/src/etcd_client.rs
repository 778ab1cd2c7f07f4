//! The few etcd v3 calls Carmine needs, through etcd's JSON gateway (`/v3/...`, etcd ≥ 3.4)
//! with a blocking HTTP client: ranges, transactions, leases and watches. Keys and values
//! travel base64-encoded; 64-bit integers travel as strings. Endpoints are tried in order, so
//! any member of an etcd cluster will do. Decision 0006 says why not gRPC. Endpoints may be
//! `https://` and etcd may have auth enabled ([`EtcdAccess`]): the client then authenticates
//! once, sends the token with every call, and authenticates again when etcd says the token
//! expired.

use crate::access::{Credentials, EtcdAccess};
use crate::MapStoreError;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

/// One request to etcd, watches aside.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Etcd {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    /// How long one call may take on one endpoint.
    timeout: Duration,
    /// The endpoint that answered last: tried first, so a dead member costs one timeout
    /// once, not on every call.
    preferred: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    credentials: Option<Credentials>,
    /// etcd's auth token for `credentials`, shared by the clones (one authentication per
    /// process, not per thread).
    token: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

/// A key-value pair as a range returns it.
#[derive(Clone, Debug)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The lease it is attached to (0: none).
    pub lease: i64,
    /// The revision of its last change (0: not said).
    pub mod_revision: i64,
}

/// One side of a transaction's compare.
#[derive(Clone, Copy)]
pub enum Compare<'a> {
    /// The key does not exist.
    Absent(&'a str),
    /// The key holds exactly this value.
    Value(&'a str, &'a [u8]),
}

/// A write of a transaction's success branch.
pub enum Put<'a> {
    Put {
        key: &'a str,
        value: &'a [u8],
        lease: i64,
    },
    Delete(&'a str),
}

impl Etcd {
    /// A client of the etcd at `endpoints`, plain HTTP and without auth.
    pub fn new(endpoints: &[String]) -> Result<Self, MapStoreError> {
        Self::with_access(endpoints, &EtcdAccess::default())
    }

    /// A client of the etcd at `endpoints` (`http://` or `https://`), with TLS files and
    /// credentials from `access`.
    pub fn with_access(endpoints: &[String], access: &EtcdAccess) -> Result<Self, MapStoreError> {
        if endpoints.is_empty() {
            return Err(MapStoreError::Invalid("no etcd endpoint given".into()));
        }
        if let Some(bad) = endpoints
            .iter()
            .find(|e| !e.starts_with("http://") && !e.starts_with("https://"))
        {
            return Err(MapStoreError::Invalid(format!(
                "etcd endpoint {bad:?}: give http://host:port or https://host:port"
            )));
        }
        Ok(Self {
            endpoints: endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_owned())
                .collect(),
            agent: access.agent()?,
            timeout: REQUEST_TIMEOUT,
            preferred: Default::default(),
            credentials: access.credentials()?,
            token: Default::default(),
        })
    }

    /// The auth token to send (authenticating first if there is none yet); `None` without
    /// credentials.
    fn token(&self, ep: &str) -> Result<Option<String>, MapStoreError> {
        let Some(c) = &self.credentials else {
            return Ok(None);
        };
        if let Some(t) = self.token.lock().expect("token lock").clone() {
            return Ok(Some(t));
        }
        let body = json!({ "name": c.user, "password": c.password });
        let res = self
            .agent
            .post(&format!("{ep}/v3/auth/authenticate"))
            .timeout(self.timeout)
            .send_string(&body.to_string());
        let reply: Value = match res {
            Ok(r) => serde_json::from_str(&r.into_string().unwrap_or_default()).unwrap_or_default(),
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                return Err(MapStoreError::Unavailable(format!(
                    "{ep}: etcd refused user {:?}: HTTP {code}: {}",
                    c.user,
                    text.trim()
                )));
            }
            Err(e) => return Err(MapStoreError::Unavailable(format!("{ep}: {e}"))),
        };
        let token = reply["token"]
            .as_str()
            .ok_or_else(|| bad_reply("an auth token", &reply))?
            .to_owned();
        *self.token.lock().expect("token lock") = Some(token.clone());
        Ok(Some(token))
    }

    /// A request to `path` on `ep`, with the auth token if there are credentials.
    fn request(
        &self,
        ep: &str,
        path: &str,
        timeout: Duration,
    ) -> Result<ureq::Request, MapStoreError> {
        let req = self.agent.post(&format!("{ep}{path}")).timeout(timeout);
        Ok(match self.token(ep)? {
            Some(t) => req.set("Authorization", &t),
            None => req,
        })
    }

    /// Whether etcd refused the call for its token (expired, or etcd restarted): the token
    /// is dropped so the next call authenticates again.
    fn token_refused(&self, code: u16, text: &str) -> bool {
        let refused =
            self.credentials.is_some() && (code == 401 || text.contains("invalid auth token"));
        if refused {
            *self.token.lock().expect("token lock") = None;
        }
        refused
    }

    /// The same client with a per-call timeout of `timeout`: lease keepers use a fraction of
    /// their TTL, so a renewal fails over to another member before the lease runs out.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(100));
        self
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// POSTs `body` to `path` on the first endpoint that answers, starting with the one that
    /// answered last. A member that fails (no answer, or a 5xx) passes the call to the next.
    fn post(&self, path: &str, body: &Value) -> Result<Value, MapStoreError> {
        use std::sync::atomic::Ordering;
        let mut last = String::new();
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        for i in (0..n).map(|k| (first + k) % n) {
            let ep = &self.endpoints[i];
            // One more try with a fresh token if etcd refused the one we had.
            for fresh_token in [false, true] {
                let res = match self.request(ep, path, self.timeout) {
                    Ok(req) => req.send_string(&body.to_string()),
                    Err(e) => {
                        last = e.to_string();
                        break;
                    }
                };
                match res {
                    Err(ureq::Error::Status(code, r)) if code >= 500 => {
                        last =
                            format!("{ep}: HTTP {code}: {}", r.into_string().unwrap_or_default());
                        break;
                    }
                    Ok(r) => {
                        self.preferred.store(i, Ordering::Relaxed);
                        let text = r.into_string().map_err(|e| {
                            MapStoreError::Unavailable(format!(
                                "{ep}{path}: reading the reply: {e}"
                            ))
                        })?;
                        return serde_json::from_str(&text).map_err(|e| {
                            MapStoreError::Unavailable(format!(
                                "{ep}{path}: bad reply {text:?}: {e}"
                            ))
                        });
                    }
                    Err(ureq::Error::Status(code, r)) => {
                        let text = r.into_string().unwrap_or_default();
                        if !fresh_token && self.token_refused(code, &text) {
                            continue;
                        }
                        return Err(MapStoreError::Unavailable(format!(
                            "{ep}{path}: HTTP {code}: {}",
                            text.trim()
                        )));
                    }
                    Err(e) => {
                        last = format!("{ep}: {e}");
                        break;
                    }
                }
            }
        }
        Err(MapStoreError::Unavailable(format!(
            "no etcd endpoint answered (last: {last})"
        )))
    }

    /// Turns etcd's auth on with user `root` (role `root`) and `password`; steps already
    /// done (a retry after a crash) are skipped. Called on an etcd without auth.
    pub fn enable_auth(&self, password: &str) -> Result<(), MapStoreError> {
        let steps = [
            (
                "/v3/auth/user/add",
                json!({ "name": "root", "password": password }),
            ),
            ("/v3/auth/role/add", json!({ "name": "root" })),
            (
                "/v3/auth/user/grant",
                json!({ "user": "root", "role": "root" }),
            ),
            ("/v3/auth/enable", json!({})),
        ];
        for (path, body) in steps {
            match self.post(path, &body) {
                Ok(_) => {}
                Err(e) if e.to_string().contains("already") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Turns etcd's auth off (needs root's credentials). Every token issued so far dies.
    pub fn disable_auth(&self) -> Result<(), MapStoreError> {
        self.post("/v3/auth/disable", &json!({})).map(drop)
    }

    /// The value of `key` and the store's revision at the time of reading.
    pub fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, i64), MapStoreError> {
        let (kv, revision) = self.get_kv(key)?;
        Ok((kv.map(|kv| kv.value), revision))
    }

    /// The pair under `key`, if any (with its last change's revision), and the store's
    /// revision.
    pub fn get_kv(&self, key: &str) -> Result<(Option<KeyValue>, i64), MapStoreError> {
        let reply = self.post("/v3/kv/range", &json!({ "key": B64.encode(key) }))?;
        let revision = revision_of(&reply)?;
        let kvs = kvs_of(&reply)?;
        Ok((kvs.into_iter().next(), revision))
    }

    /// Every key that starts with `prefix`, in key order.
    pub fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, MapStoreError> {
        let reply = self.post(
            "/v3/kv/range",
            &json!({ "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)) }),
        )?;
        kvs_of(&reply)
    }

    /// Deletes every key under `prefix`; returns how many there were.
    pub fn delete_prefix(&self, prefix: &str) -> Result<u64, MapStoreError> {
        let reply = self.post(
            "/v3/kv/deleterange",
            &json!({ "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)) }),
        )?;
        if reply.get("header").is_none() {
            return Err(bad_reply("a header", &reply));
        }
        // int64 comes as a string in the JSON gateway, and is left out when 0.
        Ok(reply["deleted"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0))
    }

    /// Applies `puts` if every compare holds. Returns whether it did.
    pub fn txn(&self, compares: &[Compare<'_>], puts: &[Put<'_>]) -> Result<bool, MapStoreError> {
        let compare: Vec<Value> = compares
            .iter()
            .map(|c| match c {
                Compare::Absent(k) => json!({"key": B64.encode(k), "result": "EQUAL",
                    "target": "CREATE", "create_revision": "0"}),
                Compare::Value(k, v) => json!({"key": B64.encode(k), "result": "EQUAL",
                    "target": "VALUE", "value": B64.encode(v)}),
            })
            .collect();
        let success: Vec<Value> = puts
            .iter()
            .map(|p| match p {
                Put::Put { key, value, lease } => json!({"request_put": {
                    "key": B64.encode(key), "value": B64.encode(value), "lease": lease.to_string()}}),
                Put::Delete(k) => json!({"request_delete_range": {"key": B64.encode(k)}}),
            })
            .collect();
        let reply = self.post(
            "/v3/kv/txn",
            &json!({"compare": compare, "success": success}),
        )?;
        if reply.get("header").is_none() {
            return Err(bad_reply("a header", &reply));
        }
        // `succeeded` is left out when false.
        Ok(reply["succeeded"].as_bool() == Some(true))
    }

    /// A new lease of `ttl`; keys put with it vanish once it is neither renewed nor revoked
    /// for that long.
    pub fn grant(&self, ttl: Duration) -> Result<i64, MapStoreError> {
        let secs = ttl.as_secs().max(1);
        let reply = self.post("/v3/lease/grant", &json!({ "TTL": secs.to_string() }))?;
        if let Some(e) = reply["error"].as_str() {
            return Err(MapStoreError::Unavailable(format!("lease grant: {e}")));
        }
        int_of(&reply["ID"]).ok_or_else(|| bad_reply("a lease id", &reply))
    }

    /// Renews `lease`; false if it has expired (or was revoked). An error reply is an error,
    /// not an expiry: the caller retries rather than re-registering.
    pub fn keep_alive(&self, lease: i64) -> Result<bool, MapStoreError> {
        let reply = self.post("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))?;
        if let Some(e) = reply["error"].as_str() {
            return Err(MapStoreError::Unavailable(format!("lease keepalive: {e}")));
        }
        if reply["result"].is_null() {
            return Err(bad_reply("a keepalive result", &reply));
        }
        // A lease that is gone comes back without a TTL.
        Ok(int_of(&reply["result"]["TTL"]).is_some_and(|t| t > 0))
    }

    /// Ends `lease` now, deleting its keys. A lease that is already gone is not an error
    /// (etcd answers that one with a 404 through the gateway).
    pub fn revoke(&self, lease: i64) -> Result<(), MapStoreError> {
        match self.post("/v3/lease/revoke", &json!({ "ID": lease.to_string() })) {
            Err(e) if e.to_string().contains("not found") => Ok(()),
            Err(e) => Err(e),
            Ok(reply) => match reply["error"].as_str() {
                Some(e) if !e.contains("not found") => {
                    Err(MapStoreError::Unavailable(format!("lease revoke: {e}")))
                }
                _ => Ok(()),
            },
        }
    }

    /// Waits up to `timeout` for changes to `key` (or, with `prefix`, to every key under it)
    /// after `revision`, and returns the first batch: each changed key with its new value
    /// (empty when deleted). Empty if nothing changed in time.
    pub fn watch(
        &self,
        key: &str,
        prefix: bool,
        revision: i64,
        timeout: Duration,
    ) -> Result<Vec<KeyValue>, MapStoreError> {
        let start = Instant::now();
        let mut req = json!({
            "key": B64.encode(key),
            "start_revision": (revision + 1).to_string(),
        });
        if prefix {
            req["range_end"] = json!(B64.encode(prefix_end(key)));
        }
        let create = json!({ "create_request": req });
        let mut last = String::new();
        for ep in &self.endpoints {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            let res = self.request(ep, "/v3/watch", left).and_then(|req| {
                req.send_string(&create.to_string())
                    .map_err(|e| MapStoreError::Unavailable(e.to_string()))
            });
            let body = match res {
                Ok(r) => BufReader::new(r.into_reader()),
                Err(e) => {
                    last = format!("{ep}: {e}");
                    continue;
                }
            };
            // One JSON object per line; the stream ends at the timeout.
            for line in body.lines() {
                let Ok(line) = line else {
                    return Ok(Vec::new());
                };
                let msg: Value = serde_json::from_str(&line).map_err(|e| {
                    MapStoreError::Unavailable(format!("bad watch message {line:?}: {e}"))
                })?;
                if msg["result"]["canceled"].as_bool() == Some(true) {
                    // A start revision etcd compacted away, for one.
                    return Err(MapStoreError::Unavailable(format!(
                        "etcd canceled the watch of {key:?}: {}",
                        msg["result"]
                    )));
                }
                let Some(events) = msg["result"]["events"].as_array() else {
                    continue;
                };
                let changed: Result<Vec<KeyValue>, _> =
                    events.iter().map(|ev| kv_of(&ev["kv"])).collect();
                let changed = changed?;
                if !changed.is_empty() {
                    return Ok(changed);
                }
            }
            return Ok(Vec::new());
        }
        Err(MapStoreError::Unavailable(format!(
            "no etcd endpoint answered the watch (last: {last})"
        )))
    }
}

/// The end of the range of keys starting with `prefix`: the prefix with its last byte
/// incremented (keys here are ASCII, so no byte is 0xff).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

pub(crate) fn bad_reply(what: &str, reply: &Value) -> MapStoreError {
    MapStoreError::Unavailable(format!("etcd reply without {what}: {reply}"))
}

/// etcd's JSON encodes 64-bit integers as strings.
fn int_of(v: &Value) -> Option<i64> {
    v.as_str().and_then(|s| s.parse().ok())
}

fn revision_of(reply: &Value) -> Result<i64, MapStoreError> {
    int_of(&reply["header"]["revision"]).ok_or_else(|| bad_reply("a header revision", reply))
}

fn b64(v: &Value, what: &str) -> Result<Vec<u8>, MapStoreError> {
    // Empty values and keys are left out of the JSON.
    B64.decode(v.as_str().unwrap_or(""))
        .map_err(|e| MapStoreError::Unavailable(format!("etcd {what} is not base64: {e}")))
}

fn kv_of(kv: &Value) -> Result<KeyValue, MapStoreError> {
    Ok(KeyValue {
        key: String::from_utf8_lossy(&b64(&kv["key"], "key")?).into_owned(),
        value: b64(&kv["value"], "value")?,
        lease: int_of(&kv["lease"]).unwrap_or(0),
        mod_revision: int_of(&kv["mod_revision"]).unwrap_or(0),
    })
}

/// The pairs of a range reply (`kvs` is left out when empty).
pub(crate) fn kvs_of(range: &Value) -> Result<Vec<KeyValue>, MapStoreError> {
    match range["kvs"].as_array() {
        None => Ok(Vec::new()),
        Some(kvs) => kvs.iter().map(kv_of).collect(),
    }
}
