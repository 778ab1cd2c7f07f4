//! Recovery's data path: a member that lacks an object asks the member that has it for the
//! whole object (`Pull`), and gets it back as one message (`Pulled`): data, attributes, omap.
//! Requests and answers travel on the ordinary one-way peer connections; a pull that gets no
//! answer in time is asked again by its caller.

use super::{send, Body, ObjectCopy};
use crate::reactor::Shard;
use carmine_pg::Version;
use carmine_store::{ObjectStore, StoreErrorKind};
use carmine_types::{OsdId, PgId};
use futures::channel::oneshot;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// How long a pull waits for its answer before its caller asks again.
const PULL_TIMEOUT: Duration = Duration::from_secs(3);
/// Omap entries read per call when copying an object.
const OMAP_PAGE: usize = 1024;
/// Room a copy leaves in its message for names and framing.
const COPY_OVERHEAD_MAX: usize = 256 * 1024;

/// Pulls waiting for their answer, by PG and object.
pub(crate) type Waiting = HashMap<(PgId, String), Vec<oneshot::Sender<Pulled>>>;

/// A pull's answer: the version the sender holds the object at, and the object (`None`: it
/// has no such object).
pub(crate) type Pulled = (Version, Option<ObjectCopy>);

/// Asks `from` for object `oid` of `pg`: its answer, or `None` if none came in time.
pub(super) async fn fetch<S>(shard: &Shard<S>, pg: PgId, from: OsdId, oid: &str) -> Option<Pulled> {
    let (tx, rx) = oneshot::channel();
    shard
        .replication
        .pulls
        .borrow_mut()
        .entry((pg, oid.to_string()))
        .or_default()
        .push(tx);
    send(shard, from, pg, Body::Pull { oid: oid.into() });
    let got = carmine_reactor::timeout(PULL_TIMEOUT, rx).await;
    if got.is_err() {
        // Forget this caller's slot (and any others abandoned the same way).
        let mut pulls = shard.replication.pulls.borrow_mut();
        if let Some(w) = pulls.get_mut(&(pg, oid.to_string())) {
            w.retain(|s| !s.is_canceled());
            if w.is_empty() {
                pulls.remove(&(pg, oid.to_string()));
            }
        }
    }
    got.ok()?.ok()
}

/// An answer to a pull: every caller waiting for that object gets it.
pub(super) fn arrived<S>(
    shard: &Shard<S>,
    pg: PgId,
    oid: String,
    version: Version,
    copy: Option<ObjectCopy>,
) {
    let Some(waiters) = shard.replication.pulls.borrow_mut().remove(&(pg, oid)) else {
        return;
    };
    for w in waiters {
        let _ = w.send((version, copy.clone()));
    }
}

/// Answers another member's pull with this copy's object.
pub(super) fn serve<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    from: OsdId,
    pg: PgId,
    oid: String,
) {
    let shard = shard.clone();
    carmine_reactor::spawn(async move {
        // The version the store holds, not the one the member's history names: a member
        // that took a history may still be fetching the object. Read on both sides of the
        // copy, so a write landing meanwhile never gets another version's label.
        let held = || {
            shard
                .replication
                .pg(pg)
                .and_then(|p| p.held.borrow().get(&oid).copied())
                .unwrap_or(Version::ZERO)
        };
        let version = held();
        match read_copy(&shard.store, pg, &oid).await {
            Ok(copy) if held() == version => {
                send(&shard, from, pg, Body::Pulled { oid, version, copy })
            }
            // Changed under the copy: no answer, the puller asks again.
            Ok(_) => {}
            // No answer: the puller asks again, and a store that cannot read says so here.
            Err(e) => tracing::warn!(%pg, oid, "cannot copy the object for osd.{from}: {e}"),
        }
    })
    .detach();
}

pub(super) async fn read_copy<S: ObjectStore>(
    store: &S,
    pg: PgId,
    oid: &str,
) -> Result<Option<ObjectCopy>, String> {
    let stat = match store.stat(pg, oid).await {
        Ok(s) => s,
        Err(e) if e.kind == StoreErrorKind::ObjectNotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    if stat.size > super::write::REPLICATED_OBJECT_SIZE_MAX {
        return Err(format!(
            "{} bytes: larger than one recovery message carries",
            stat.size
        ));
    }
    let data = store
        .read(pg, oid, 0, stat.size)
        .await
        .map_err(|e| e.to_string())?;
    let attrs: Vec<_> = store
        .getattrs(pg, oid)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
    let omap_header = store
        .omap_get_header(pg, oid)
        .await
        .map_err(|e| e.to_string())?;
    let mut omap = Vec::new();
    let mut after: Option<bytes::Bytes> = None;
    loop {
        let page = store
            .omap_iterate(pg, oid, after.as_deref(), OMAP_PAGE)
            .await
            .map_err(|e| e.to_string())?;
        omap.extend(page.items);
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let size = data.len()
        + attrs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
        + omap_header.len()
        + omap.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if size + COPY_OVERHEAD_MAX > carmine_proto::peer_parts::PEER_MESSAGE_MAX {
        return Err(format!(
            "{size} bytes with its metadata: more than one recovery message carries"
        ));
    }
    Ok(Some(ObjectCopy {
        data,
        attrs,
        omap_header,
        omap,
    }))
}
