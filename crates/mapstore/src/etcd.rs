//! The multi-host backend: the encoded map under one etcd key, changed by an etcd transaction
//! that compares the stored value (or its absence) and puts the new one. It speaks etcd's v3
//! JSON gateway (`/v3/kv/range`, `/v3/kv/txn`, `/v3/watch`, in etcd ≥ 3.4) over HTTP with a
//! blocking client; decision 0006 says why not gRPC. Endpoints are tried in order, so any
//! member of an etcd cluster will do.

use crate::{check_swap, decode, MapStore, MapStoreError};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use carmine_cluster::OsdMap;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

/// One request to etcd, watches aside.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct EtcdMapStore {
    endpoints: Vec<String>,
    key: String,
    agent: ureq::Agent,
}

impl std::fmt::Debug for EtcdMapStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMapStore")
            .field("endpoints", &self.endpoints)
            .field("key", &self.key)
            .finish()
    }
}

impl EtcdMapStore {
    /// The map of cluster `cluster` in the etcd reachable at `endpoints` (`http://host:port`).
    pub fn new(endpoints: &[String], cluster: &str) -> Result<Self, MapStoreError> {
        if endpoints.is_empty() {
            return Err(MapStoreError::Invalid("no etcd endpoint given".into()));
        }
        if let Some(bad) = endpoints.iter().find(|e| !e.starts_with("http://")) {
            return Err(MapStoreError::Invalid(format!(
                "etcd endpoint {bad:?}: only http:// is supported so far"
            )));
        }
        Ok(Self {
            endpoints: endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_owned())
                .collect(),
            key: format!("/carmine/{cluster}/osdmap"),
            agent: ureq::AgentBuilder::new().build(),
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// POSTs `body` to `path` on the first endpoint that answers.
    fn post(&self, path: &str, body: &Value) -> Result<Value, MapStoreError> {
        let mut last = String::new();
        for ep in &self.endpoints {
            let res = self
                .agent
                .post(&format!("{ep}{path}"))
                .timeout(REQUEST_TIMEOUT)
                .send_string(&body.to_string());
            match res {
                Ok(r) => {
                    let text = r.into_string().map_err(|e| {
                        MapStoreError::Unavailable(format!("{ep}{path}: reading the reply: {e}"))
                    })?;
                    return serde_json::from_str(&text).map_err(|e| {
                        MapStoreError::Unavailable(format!("{ep}{path}: bad reply {text:?}: {e}"))
                    });
                }
                Err(ureq::Error::Status(code, r)) => {
                    let text = r.into_string().unwrap_or_default();
                    return Err(MapStoreError::Unavailable(format!(
                        "{ep}{path}: HTTP {code}: {}",
                        text.trim()
                    )));
                }
                Err(e) => last = format!("{ep}: {e}"),
            }
        }
        Err(MapStoreError::Unavailable(format!(
            "no etcd endpoint answered (last: {last})"
        )))
    }

    /// The stored value and the store's revision at the time of reading.
    fn range(&self) -> Result<(Option<Vec<u8>>, i64), MapStoreError> {
        let reply = self.post("/v3/kv/range", &json!({ "key": B64.encode(&self.key) }))?;
        let revision = revision_of(&reply)?;
        Ok((first_value(&reply)?, revision))
    }
}

fn bad_reply(what: &str, reply: &Value) -> MapStoreError {
    MapStoreError::Unavailable(format!("etcd reply without {what}: {reply}"))
}

/// etcd's JSON encodes 64-bit integers as strings.
fn revision_of(reply: &Value) -> Result<i64, MapStoreError> {
    reply["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| bad_reply("a header revision", reply))
}

/// The value of the first key in a range reply (`kvs` is left out when empty).
fn first_value(range: &Value) -> Result<Option<Vec<u8>>, MapStoreError> {
    let Some(kv) = range["kvs"].as_array().and_then(|kvs| kvs.first()) else {
        return Ok(None);
    };
    // An empty value is left out too.
    let v = kv["value"].as_str().unwrap_or("");
    B64.decode(v)
        .map(Some)
        .map_err(|e| MapStoreError::Unavailable(format!("etcd value is not base64: {e}")))
}

impl MapStore for EtcdMapStore {
    fn get(&self) -> Result<Option<OsdMap>, MapStoreError> {
        self.range()?.0.map(decode).transpose()
    }

    fn swap(&self, expected: Option<&OsdMap>, new: &OsdMap) -> Result<(), MapStoreError> {
        check_swap(expected, new)?;
        let key = B64.encode(&self.key);
        let compare = match expected {
            None => {
                json!({"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": "0"})
            }
            Some(m) => {
                json!({"key": key, "result": "EQUAL", "target": "VALUE", "value": B64.encode(m.encode())})
            }
        };
        let txn = json!({
            "compare": [compare],
            "success": [{"request_put": {"key": key, "value": B64.encode(new.encode())}}],
            "failure": [{"request_range": {"key": key}}],
        });
        let reply = self.post("/v3/kv/txn", &txn)?;
        // `succeeded` is left out when false.
        if reply["succeeded"].as_bool() == Some(true) {
            return Ok(());
        }
        let range = &reply["responses"][0]["response_range"];
        if range.is_null() {
            return Err(bad_reply("the failed compare's range", &reply));
        }
        Err(MapStoreError::Conflict {
            current: first_value(range)?.map(decode).transpose()?.map(Box::new),
        })
    }

    fn wait_newer(&self, epoch: u32, timeout: Duration) -> Result<Option<OsdMap>, MapStoreError> {
        let start = Instant::now();
        let (raw, revision) = self.range()?;
        if let Some(m) = raw.map(decode).transpose()? {
            if m.epoch > epoch {
                return Ok(Some(m));
            }
        }
        // Watch from the next revision: no change between the read and the watch is missed.
        let create = json!({"create_request": {
            "key": B64.encode(&self.key),
            "start_revision": (revision + 1).to_string(),
        }});
        let mut last = String::new();
        for ep in &self.endpoints {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(None);
            }
            let res = self
                .agent
                .post(&format!("{ep}/v3/watch"))
                .timeout(left)
                .send_string(&create.to_string());
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
                    return Ok(None);
                };
                let msg: Value = serde_json::from_str(&line).map_err(|e| {
                    MapStoreError::Unavailable(format!("bad watch message {line:?}: {e}"))
                })?;
                let Some(events) = msg["result"]["events"].as_array() else {
                    continue;
                };
                for ev in events {
                    let v = ev["kv"]["value"].as_str().unwrap_or("");
                    let raw = B64.decode(v).map_err(|e| {
                        MapStoreError::Unavailable(format!("etcd value is not base64: {e}"))
                    })?;
                    // A deleted key carries no value: not a map, keep waiting.
                    if raw.is_empty() {
                        continue;
                    }
                    let m = decode(raw)?;
                    if m.epoch > epoch {
                        return Ok(Some(m));
                    }
                }
            }
            return Ok(None);
        }
        Err(MapStoreError::Unavailable(format!(
            "no etcd endpoint answered the watch (last: {last})"
        )))
    }
}
