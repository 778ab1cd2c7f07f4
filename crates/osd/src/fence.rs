//! Fenced clients: the instances whose image lock was broken, refused by this reactor.
//!
//! When a client takes over a lock whose holder stopped renewing it, the holder may still be
//! alive (paused, partitioned) with writes in flight or queued for a retry. Before the new
//! holder writes, it fences the old instance on every reactor (`Request::Fence`): from then
//! on each reactor answers that instance's object requests with `Status::Fenced`, so a broken
//! lock can never end in a silent overwrite. This is what Ceph's OSD blocklist does for RBD's
//! exclusive lock.
//!
//! Each reactor keeps its own list (shared nothing) and persists it in its own store shard,
//! in the omap of one object in a reserved collection, so a restart does not forget a fence
//! while the fenced client may still retry. Entries expire after [`FENCE_TTL`], long past
//! any client's retry window; at most [`FENCES_MAX`] are kept.

use bytes::Bytes;
use carmine_store::{ObjectStore, Transaction};
use carmine_types::PgId;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The reserved collection of a reactor's own metadata; no pool has this id.
pub(crate) const META_COLLECTION: PgId = PgId {
    pool: u32::MAX,
    seed: 0,
};
const FENCE_OID: &str = "fenced_clients";
/// How long a fence lasts: far beyond any client's retry timeout.
pub(crate) const FENCE_TTL: Duration = Duration::from_secs(24 * 3600);
/// Fences one reactor keeps; more is refused (`Busy`) rather than forgetting one.
pub(crate) const FENCES_MAX: usize = 4096;
/// While a fence waits for the fenced client's requests in progress to finish.
const DRAIN_POLL: Duration = Duration::from_millis(1);

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[derive(Default)]
pub(crate) struct Fences {
    /// Fenced instance → expiry (seconds since the epoch).
    until: RefCell<HashMap<u64, u64>>,
    /// Requests admitted and still being applied, by the parity of the generation they were
    /// admitted in. A fence flips the generation and waits for the old parity to drain: every
    /// request admitted before the fence has then finished. Two counters instead of a count
    /// per client keep admission at a counter bump, with no hashing per request.
    in_progress: [Cell<usize>; 2],
    generation: Cell<usize>,
    /// A fence is draining; the next one waits for it (so a parity is empty when reused).
    draining: Cell<bool>,
}

/// Counts one admitted request as in progress while it lives.
pub(crate) struct InProgress<'a> {
    fences: &'a Fences,
    parity: usize,
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        let n = &self.fences.in_progress[self.parity];
        n.set(n.get() - 1);
    }
}

/// Clears `draining` however the fence's future ends, dropped mid-wait included.
struct Draining<'a>(&'a Cell<bool>);

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

impl Fences {
    /// Loads the persisted fences, dropping the expired ones.
    pub async fn load<S: ObjectStore>(store: &S) -> Result<Self, String> {
        let now = now_secs();
        let fences = Fences::default();
        let mut start: Option<Bytes> = None;
        loop {
            let page = match store
                .omap_iterate(META_COLLECTION, FENCE_OID, start.as_deref(), 1024)
                .await
            {
                Ok(p) => p,
                Err(e) if e.kind == carmine_store::StoreErrorKind::ObjectNotFound => break,
                Err(e) => return Err(format!("loading fenced clients: {e}")),
            };
            for (k, v) in &page.items {
                let (Ok(k), Ok(v)) = (<[u8; 8]>::try_from(&k[..]), <[u8; 8]>::try_from(&v[..]))
                else {
                    return Err(format!("fenced client entry {k:?} is malformed"));
                };
                let until = u64::from_le_bytes(v);
                if until > now {
                    fences
                        .until
                        .borrow_mut()
                        .insert(u64::from_be_bytes(k), until);
                }
            }
            match page.next {
                Some(next) => start = Some(next),
                None => break,
            }
        }
        Ok(fences)
    }

    pub fn len(&self) -> usize {
        self.until.borrow().len()
    }

    /// Checks a request of `client` (0: anonymous, never fenced) and counts it in progress.
    pub fn admit(&self, client: u64) -> Result<InProgress<'_>, ()> {
        let fenced = self.until.borrow();
        if client != 0 && !fenced.is_empty() {
            if let Some(until) = fenced.get(&client) {
                if *until > now_secs() {
                    return Err(());
                }
            }
        }
        let parity = self.generation.get() & 1;
        let n = &self.in_progress[parity];
        n.set(n.get() + 1);
        Ok(InProgress {
            fences: self,
            parity,
        })
    }

    /// Fences `client`: refused from now on, persisted, and answered only once none of its
    /// requests is still being applied here.
    pub async fn fence<S: ObjectStore>(&self, store: &S, client: u64) -> Result<(), String> {
        let until = now_secs() + FENCE_TTL.as_secs();
        let mut txn = Transaction::new();
        {
            let mut m = self.until.borrow_mut();
            let now = now_secs();
            let expired: Vec<u64> = m
                .iter()
                .filter(|(_, u)| **u <= now)
                .map(|(c, _)| *c)
                .collect();
            if !expired.is_empty() {
                for c in &expired {
                    m.remove(c);
                }
                let keys = expired.iter().map(|c| key(*c)).collect();
                txn.omap_rm(META_COLLECTION, FENCE_OID, keys);
            }
            if !m.contains_key(&client) && m.len() >= FENCES_MAX {
                return Err(format!(
                    "{FENCES_MAX} clients are fenced already; try again once some expire"
                ));
            }
            // Refused from this moment, before the await below.
            m.insert(client, until);
        }
        txn.omap_set(
            META_COLLECTION,
            FENCE_OID,
            vec![(key(client), Bytes::copy_from_slice(&until.to_le_bytes()))],
        );
        store
            .submit(txn)
            .await
            .map_err(|e| format!("persisting the fence: {e}"))?;
        // Wait for every request admitted before the fence (a superset of the fenced
        // client's) to finish.
        while self.draining.get() {
            carmine_reactor::sleep(DRAIN_POLL).await;
        }
        self.draining.set(true);
        let _draining = Draining(&self.draining);
        let old = self.generation.get() & 1;
        self.generation.set(self.generation.get() + 1);
        while self.in_progress[old].get() > 0 {
            carmine_reactor::sleep(DRAIN_POLL).await;
        }
        Ok(())
    }
}

fn key(client: u64) -> Bytes {
    Bytes::copy_from_slice(&client.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use carmine_store::{MemStore, MemStoreConfig};
    use futures::FutureExt;

    #[test]
    fn a_fence_waits_for_requests_admitted_before_it_and_only_those() {
        carmine_reactor::block_on(async {
            let store = MemStore::new(MemStoreConfig::default());
            let mut t = Transaction::new();
            t.create_collection(META_COLLECTION);
            store.submit(t).await.unwrap();
            let fences = Fences::default();
            let before = fences.admit(5).unwrap();
            let mut fence = std::pin::pin!(fences.fence(&store, 5).fuse());
            // Refused at once, while the fence still waits for the earlier request.
            let mut after = None;
            for _ in 0..20 {
                futures::select! {
                    r = fence => panic!("the fence did not wait: {r:?}"),
                    () = carmine_reactor::sleep(Duration::from_millis(2)).fuse() => {}
                }
                assert!(fences.admit(5).is_err(), "a fenced client was admitted");
                after.get_or_insert_with(|| fences.admit(7).unwrap());
            }
            drop(before);
            // A request admitted after the fence does not hold it up.
            fence.await.unwrap();
            assert!(after.is_some());
            assert!(
                fences.admit(0).is_ok(),
                "the anonymous client is never fenced"
            );
            // Persisted: a reactor restarted on this store still refuses it.
            let reloaded = Fences::load(&store).await.unwrap();
            assert_eq!(reloaded.len(), 1);
            assert!(reloaded.admit(5).is_err());
            assert!(reloaded.admit(7).is_ok());
        });
    }

    #[test]
    fn a_fence_dropped_while_draining_does_not_block_the_next() {
        carmine_reactor::block_on(async {
            let store = MemStore::new(MemStoreConfig::default());
            let mut t = Transaction::new();
            t.create_collection(META_COLLECTION);
            store.submit(t).await.unwrap();
            let fences = Fences::default();
            let held = fences.admit(1).unwrap();
            {
                let mut first = std::pin::pin!(fences.fence(&store, 1).fuse());
                futures::select! {
                    r = first => panic!("did not wait for the request in progress: {r:?}"),
                    () = carmine_reactor::sleep(Duration::from_millis(5)).fuse() => {}
                }
            }
            drop(held);
            carmine_reactor::timeout(Duration::from_secs(5), fences.fence(&store, 2))
                .await
                .expect("a dropped fence wedged the next one")
                .unwrap();
        });
    }
}
