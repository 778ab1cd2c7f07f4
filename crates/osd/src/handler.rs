//! Turning one request frame into one reply: validation, routing checks, store calls.

use crate::metrics::OpKind;
use crate::reactor::Shard;
use bytes::BytesMut;
use carmine_cluster::object_to_pg_seed;
use carmine_proto::{
    begin_data_reply, encode_error, encode_response, ErrorReply, Frame, ObjectRequest, OpOutput,
    OsdOp, Request, Response, Status,
};
use carmine_store::{Expect, ObjectStore, Op, StoreError, StoreErrorKind, Transaction};
use carmine_types::limits::LIST_LIMIT_MAX;
use carmine_types::PgId;

/// Who is at the other end of a connection, as its handshake proved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sender {
    /// The cluster has no key: nobody proves anything.
    Unauthenticated,
    Osd(carmine_types::OsdId),
    Client,
}

impl Sender {
    pub(crate) fn of(entity: &str) -> Sender {
        match entity.strip_prefix("osd.").and_then(|n| n.parse().ok()) {
            Some(id) => Sender::Osd(id),
            None => Sender::Client,
        }
    }

    /// May this sender speak for OSD `from` in a message between OSDs?
    pub(crate) fn may_speak_for(self, from: carmine_types::OsdId) -> bool {
        match self {
            Sender::Unauthenticated => true,
            Sender::Osd(id) => id == from,
            Sender::Client => false,
        }
    }
}

/// Handles one request and counts it: its kind, whether it failed, its time in the reactor
/// and its bytes in and out (two clock reads and a few relaxed adds).
pub(crate) async fn handle_frame<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    frame: Frame,
    out: &mut BytesMut,
    sender: Sender,
) {
    let started = std::time::Instant::now();
    let received = carmine_proto::FRAME_HEADER_LEN + frame.header.payload_len as usize;
    let kind = match frame.header.opcode {
        carmine_proto::Opcode::Object => OpKind::Read,
        _ => OpKind::Other,
    };
    if frame.header.opcode == carmine_proto::Opcode::Peer {
        // One way: answered, if at all, by a message of our own.
        crate::replication::on_peer(&shard.rc(), frame.payload, sender);
        return;
    }
    let before = out.len();
    let (kind, ok) = answer(shard, frame, out, kind).await;
    shard
        .metrics
        .request(kind, ok, started.elapsed(), received, out.len() - before);
}

/// Writes the reply to `out`; returns the request's kind and whether it succeeded.
async fn answer<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    frame: Frame,
    out: &mut BytesMut,
    mut kind: OpKind,
) -> (OpKind, bool) {
    let id = frame.header.request_id;
    let opcode = frame.header.opcode;
    let reply = match Request::decode(&frame) {
        Err(e) => Err(ErrorReply {
            status: Status::Malformed,
            op_index: None,
            message: e.to_string(),
        }),
        // A shard whose store failed is not healthy, and says so to whoever checks.
        Ok(Request::Ping { .. }) if shard.store.failure().is_some() => Err({
            let why = shard.store.failure().unwrap_or_default();
            shard.metrics.note_store_failure(why.clone());
            ErrorReply {
                status: Status::Io,
                op_index: None,
                message: format!("store shard failed: {why}"),
            }
        }),
        Ok(Request::Ping { payload }) => Ok(Response::Pong { payload }),
        Ok(Request::GetMap) => Ok(Response::Map {
            encoded: shard.view.borrow().encoded.clone(),
        }),
        Ok(Request::Fence { client }) => match shard.fences.fence(&shard.store, client).await {
            Ok(()) => {
                tracing::warn!(
                    osd = shard.osd,
                    reactor = shard.index,
                    client,
                    "client fenced"
                );
                Ok(Response::Fenced)
            }
            Err(e) => Err(reject(Status::Busy, e)),
        },
        Ok(Request::Scrub {
            pool,
            pg_seed,
            epoch,
            mode,
        }) => scrub_request(shard, pool, pg_seed, epoch, mode).await,
        Ok(Request::MarkUnfoundLost {
            pool,
            pg_seed,
            epoch,
        }) => mark_lost_request(shard, pool, pg_seed, epoch).await,
        // A client that knows a newer epoch than this reactor must not be served by the
        // older one: wait (briefly) for the newer map to arrive here.
        Ok(Request::Object(req)) if !caught_up(shard, req.epoch).await => Err(reject(
            Status::WrongTarget,
            format!(
                "osd.{} reactor {} is at map epoch {}, behind the client's {}",
                shard.osd,
                shard.index,
                shard.view.borrow().map.epoch,
                req.epoch
            ),
        )),
        Ok(Request::Object(req)) if is_single_read(&req) => {
            match read_straight_into_reply(shard, req, id, out).await {
                Ok(()) => return (kind, true),
                Err(e) => Err(e),
            }
        }
        Ok(Request::Object(req)) => {
            if req.ops.iter().any(OsdOp::is_write) {
                kind = OpKind::Write;
            }
            handle_object(shard, req)
                .await
                .map(|outputs| Response::Object { outputs })
        }
    };
    let ok = reply.is_ok();
    let start = out.len();
    match reply {
        Ok(resp) => encode_response(out, id, &resp),
        Err(err) => encode_error(out, id, opcode, &err),
    }
    // A reply no frame can carry (many large reads, a huge xattr set) would make the client
    // drop the connection: answer with an error it can act on instead.
    let payload = out.len() - start - carmine_proto::FRAME_HEADER_LEN;
    if payload > carmine_proto::FRAME_PAYLOAD_MAX as usize {
        out.truncate(start);
        encode_error(
            out,
            id,
            opcode,
            &ErrorReply {
                status: Status::InvalidArgument,
                op_index: None,
                message: format!(
                    "the reply would be {payload} bytes, more than a frame carries ({}): \
                     ask for less per request",
                    carmine_proto::FRAME_PAYLOAD_MAX
                ),
            },
        );
        return (kind, false);
    }
    (kind, ok)
}

fn is_single_read(req: &ObjectRequest) -> bool {
    matches!(req.ops[..], [OsdOp::Read { .. }])
}

/// The hot read path: the store copies the data straight into the send buffer behind the reply
/// header, instead of into a buffer that is then copied again by the encoder.
async fn read_straight_into_reply<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    req: ObjectRequest,
    id: u64,
    out: &mut BytesMut,
) -> Result<(), ErrorReply> {
    let pg = route(shard, &req)?;
    let _in_progress = admit(shard, &req, pg)?;
    // Writes to the object wait while it is held (a native store read that looks again,
    // because the block moved, must not meet a write that entered meanwhile).
    let mut turn = match replicated(shard, pg) {
        true => Some(crate::replication::ready_to_read(shard, pg, &req.oid).await?),
        false => None,
    };
    let [OsdOp::Read { off, len }] = req.ops[..] else {
        unreachable!("checked by is_single_read")
    };
    let mut repaired = false;
    loop {
        let reply = begin_data_reply(out, id);
        match shard
            .store
            .read_into(pg, &req.oid, off, len as u64, out)
            .await
        {
            Ok(_) => {
                reply.finish(out);
                return Ok(());
            }
            Err(e) => {
                reply.abandon(out);
                if !repaired && read_repairable(shard, pg, &e) {
                    drop(turn.take());
                    turn = Some(repair_for_read(shard, pg, &req.oid, &e).await?);
                    repaired = true;
                    continue;
                }
                return Err(from_store(e, Some(0)));
            }
        }
    }
}

/// True if a read of `pg` that failed with `e` may be healed from another copy: a bad local
/// copy of an object of a replicated PG.
fn read_repairable<S: ObjectStore>(shard: &Shard<S>, pg: PgId, e: &StoreError) -> bool {
    replicated(shard, pg) && local_copy_bad(shard, store_status(e.kind))
}

/// Whether a read that failed with `status` met a bad local copy, which a copy from another
/// member heals: a checksum mismatch, or a device read error (a bad sector) while the store
/// otherwise works — rewritten, the data goes to a new place on the device, as Ceph's OSD
/// recovers an object from a replica on EIO. A store that failed as a whole heals nothing.
fn local_copy_bad<S: ObjectStore>(shard: &Shard<S>, status: Status) -> bool {
    match status {
        Status::Corrupt => true,
        Status::Io => shard.store.failure().is_none(),
        _ => false,
    }
}

/// Rewrites the local copy of `oid` from another member after `e`, and takes a new turn to
/// read it (the caller gives its own up first: a write waiting for that turn would hold this
/// read's new one back until the write gave up);
/// the error to answer with if that fails.
async fn repair_for_read<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    pg: PgId,
    oid: &str,
    e: &dyn std::fmt::Display,
) -> Result<crate::replication::ReadTurn, ErrorReply> {
    crate::replication::repair_for_read(&shard.rc(), pg, oid)
        .await
        .map_err(|why| ErrorReply {
            status: Status::Corrupt,
            op_index: None,
            message: format!("{e}; and no repair from another copy: {why}"),
        })?;
    // Read again as any read: writes may have entered while the repair ran.
    crate::replication::ready_to_read(shard, pg, oid).await
}

/// An operator's scrub of one replicated PG, at its primary.
async fn scrub_request<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    pool: carmine_types::PoolId,
    seed: u32,
    epoch: u32,
    mode: carmine_proto::ScrubMode,
) -> Result<Response, ErrorReply> {
    let pg = operator_pg(shard, pool, seed, epoch, "there is nothing to compare").await?;
    crate::replication::scrub(&shard.rc(), pg, mode)
        .await
        .map(Response::Scrubbed)
}

/// An operator giving up a PG's unfound objects, at its primary.
async fn mark_lost_request<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    pool: carmine_types::PoolId,
    seed: u32,
    epoch: u32,
) -> Result<Response, ErrorReply> {
    let pg = operator_pg(shard, pool, seed, epoch, "no object can be unfound").await?;
    crate::replication::give_up_unfound(&shard.rc(), pg)
        .map(|objects| Response::MarkedLost { objects })
}

/// The replicated PG an operator's request names, if this reactor serves it in the
/// client's map epoch (or a newer one).
async fn operator_pg<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    pool: carmine_types::PoolId,
    seed: u32,
    epoch: u32,
    single_copy: &str,
) -> Result<PgId, ErrorReply> {
    if !caught_up(shard, epoch).await {
        return Err(reject(
            Status::WrongTarget,
            format!(
                "osd.{} is at map epoch {}, behind the client's {epoch}",
                shard.osd,
                shard.view.borrow().map.epoch
            ),
        ));
    }
    let pg = PgId { pool, seed };
    {
        let view = shard.view.borrow();
        let p = view
            .map
            .pool(pool)
            .map_err(|e| reject(Status::PoolNotFound, e.to_string()))?;
        if seed >= p.pg_num {
            return Err(reject(
                Status::InvalidArgument,
                format!("pg {pg} beyond pg_num {}", p.pg_num),
            ));
        }
        if p.size < 2 {
            return Err(reject(
                Status::InvalidArgument,
                format!("pool {} keeps one copy: {single_copy}", p.name),
            ));
        }
        if !view.owned.contains(&pg) {
            return Err(reject(
                Status::WrongTarget,
                format!(
                    "pg {pg} is not served by osd.{} reactor {}",
                    shard.osd, shard.index
                ),
            ));
        }
    }
    Ok(pg)
}

pub(crate) fn reject(status: Status, message: impl Into<String>) -> ErrorReply {
    ErrorReply {
        status,
        op_index: None,
        message: message.into(),
    }
}

fn store_status(kind: StoreErrorKind) -> Status {
    match kind {
        StoreErrorKind::CollectionNotFound => Status::CollectionNotFound,
        StoreErrorKind::CollectionExists => Status::Exists,
        StoreErrorKind::CollectionNotEmpty => Status::NotEmpty,
        StoreErrorKind::ObjectNotFound => Status::ObjectNotFound,
        StoreErrorKind::AttrNotFound => Status::AttrNotFound,
        StoreErrorKind::InvalidArgument => Status::InvalidArgument,
        StoreErrorKind::NoSpace => Status::NoSpace,
        StoreErrorKind::Io => Status::Io,
        StoreErrorKind::Corrupt => Status::Corrupt,
        StoreErrorKind::ObjectExists => Status::Exists,
        StoreErrorKind::CompareFailed => Status::CompareFailed,
        _ => Status::Internal,
    }
}

pub(crate) fn from_store(e: StoreError, op_index: Option<usize>) -> ErrorReply {
    ErrorReply {
        status: store_status(e.kind),
        op_index: op_index.map(|i| i as u16),
        message: e.to_string(),
    }
}

/// Refuses a fenced client, and any client of a PG of one copy while the OSD's lease in etcd
/// may have run out; otherwise counts the request in progress while the guard lives.
/// Replicated PGs are fenced by the read leases their copies grant instead (an outage of etcd
/// itself does not stop them; see `replication::check_readable`).
fn admit<'a, S>(
    shard: &'a Shard<S>,
    req: &ObjectRequest,
    pg: PgId,
) -> Result<crate::fence::InProgress<'a>, ErrorReply> {
    if let Some(why) = shard
        .lease
        .as_ref()
        .filter(|_| !replicated(shard, pg))
        .and_then(|l| l.refusal(shard.view.borrow().map.epoch))
    {
        shard.metrics.lease_refused();
        return Err(reject(
            Status::PgInactive,
            format!("osd.{} takes no requests: {why}", shard.osd),
        ));
    }
    shard.fences.admit(req.client).map_err(|()| {
        reject(
            Status::Fenced,
            format!(
                "client {:#x} is fenced: its image lock was broken by another client",
                req.client
            ),
        )
    })
}

/// How long a request from a client at a newer epoch waits for this reactor to get it (the
/// control thread hands new maps over within milliseconds of their commit).
const EPOCH_CATCH_UP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
const EPOCH_CATCH_UP_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// True once this reactor's map is at `epoch` or newer; false if it is still behind after
/// `EPOCH_CATCH_UP_WAIT`. The common case is two comparisons.
///
/// Requests that wait do so in line (`Shard::epoch_line`, first come, first served), and a
/// request that finds anyone in line joins it even if its own epoch is already here: requests
/// reach the store in the order they arrived, across an epoch change too. The line is left
/// when this returns, before the caller goes on to the store in the same poll.
async fn caught_up<S>(shard: &Shard<S>, epoch: u32) -> bool {
    if epoch <= shard.view.borrow().map.epoch && shard.epoch_line.is_idle() {
        return true;
    }
    let _turn = shard.epoch_line.lock().await;
    if epoch <= shard.view.borrow().map.epoch {
        return true;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < EPOCH_CATCH_UP_WAIT {
        carmine_reactor::sleep(EPOCH_CATCH_UP_POLL).await;
        if epoch <= shard.view.borrow().map.epoch {
            return true;
        }
    }
    false
}

/// True if `pg`'s pool keeps more than one copy (its writes are replicated).
fn replicated<S>(shard: &Shard<S>, pg: PgId) -> bool {
    shard
        .view
        .borrow()
        .map
        .pool(pg.pool)
        .is_ok_and(|p| p.size > 1)
}

/// Checks that the request is addressed to a PG this reactor owns in its map.
fn route<S>(shard: &Shard<S>, req: &ObjectRequest) -> Result<PgId, ErrorReply> {
    let view = shard.view.borrow();
    let pool = view
        .map
        .pool(req.pool)
        .map_err(|e| reject(Status::PoolNotFound, e.to_string()))?;
    if req.pg_seed >= pool.pg_num {
        return Err(reject(
            Status::InvalidArgument,
            format!("pg {} beyond pg_num {}", req.pg_seed, pool.pg_num),
        ));
    }
    let pg = PgId {
        pool: req.pool,
        seed: req.pg_seed,
    };
    if object_to_pg_seed(&req.oid, pool.pg_num) != req.pg_seed {
        return Err(reject(
            Status::InvalidArgument,
            format!("object {:?} does not belong to pg {pg}", req.oid),
        ));
    }
    if !view.owned.contains(&pg) {
        return Err(reject(
            Status::WrongTarget,
            format!(
                "pg {pg} is not served by osd.{} reactor {} at epoch {} (client epoch {})",
                shard.osd, shard.index, view.map.epoch, req.epoch
            ),
        ));
    }
    Ok(pg)
}

async fn handle_object<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    req: ObjectRequest,
) -> Result<Vec<OpOutput>, ErrorReply> {
    let pg = route(shard, &req)?;
    let _in_progress = admit(shard, &req, pg)?;
    if req.oid.is_empty() {
        return Err(reject(Status::InvalidArgument, "empty object name"));
    }
    let writes = req.ops.iter().filter(|op| op.is_write()).count();
    let replicated = replicated(shard, pg);
    match writes {
        0 if req.ops.is_empty() => Err(reject(Status::InvalidArgument, "request has no ops")),
        0 if replicated => {
            // Held across all the ops: no write to the object enters between two of them.
            let turn = crate::replication::ready_to_read(shard, pg, &req.oid).await?;
            match read_ops(shard, pg, &req).await {
                Err(e) if local_copy_bad(shard, e.status) => {
                    drop(turn);
                    let _turn = repair_for_read(shard, pg, &req.oid, &e).await?;
                    read_ops(shard, pg, &req).await
                }
                r => r,
            }
        }
        0 => read_ops(shard, pg, &req).await,
        n if n == req.ops.len() && replicated => {
            crate::replication::write(&shard.rc(), pg, req).await
        }
        n if n == req.ops.len() => write_ops(shard, pg, req).await,
        _ => Err(reject(
            Status::InvalidArgument,
            "a request mixes reads and writes",
        )),
    }
}

async fn read_ops<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    pg: PgId,
    req: &ObjectRequest,
) -> Result<Vec<OpOutput>, ErrorReply> {
    let store = &shard.store;
    let oid = req.oid.as_str();
    let mut outputs = Vec::with_capacity(req.ops.len());
    for (i, op) in req.ops.iter().enumerate() {
        let fail = |e| from_store(e, Some(i));
        let out = match op {
            OsdOp::Read { off, len } => {
                OpOutput::Data(store.read(pg, oid, *off, *len as u64).await.map_err(fail)?)
            }
            OsdOp::Stat => OpOutput::Stat {
                size: store.stat(pg, oid).await.map_err(fail)?.size,
            },
            OsdOp::GetXattr { name } => {
                OpOutput::Value(store.getattr(pg, oid, name).await.map_err(fail)?)
            }
            OsdOp::GetXattrs => OpOutput::Attrs(
                store
                    .getattrs(pg, oid)
                    .await
                    .map_err(fail)?
                    .into_iter()
                    .collect(),
            ),
            OsdOp::OmapGetHeader => {
                OpOutput::Value(store.omap_get_header(pg, oid).await.map_err(fail)?)
            }
            OsdOp::OmapGetVals { keys } => OpOutput::Omap {
                entries: store
                    .omap_get_values(pg, oid, keys)
                    .await
                    .map_err(fail)?
                    .into_iter()
                    .collect(),
                more: false,
            },
            OsdOp::OmapList { start_after, limit } => {
                let limit = (*limit).clamp(1, LIST_LIMIT_MAX) as usize;
                let page = store
                    .omap_iterate(pg, oid, start_after.as_deref(), limit)
                    .await
                    .map_err(fail)?;
                OpOutput::Omap {
                    entries: page.items,
                    more: page.next.is_some(),
                }
            }
            _ => unreachable!("write op in a read request"),
        };
        outputs.push(out);
    }
    Ok(outputs)
}

/// Translates write ops into one store transaction, so they apply all or nothing.
async fn write_ops<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    pg: PgId,
    req: ObjectRequest,
) -> Result<Vec<OpOutput>, ErrorReply> {
    let n = req.ops.len();
    let mut txn = Transaction::with_capacity(n + 1);
    add_ops(&mut txn, pg, &req.oid, req.ops)?;
    let _counted = shard
        .replication
        .unversioned_write(shard.view.borrow().map.epoch);
    shard
        .store
        .submit(txn)
        .await
        .map_err(|e| from_store(e, None))?;
    Ok(vec![OpOutput::None; n])
}

/// Adds a request's write ops on object `oid` to `txn`.
pub(crate) fn add_ops(
    txn: &mut Transaction,
    pg: PgId,
    oid: &str,
    ops: Vec<OsdOp>,
) -> Result<(), ErrorReply> {
    let first = txn.ops.len();
    for op in ops {
        match op {
            // Check and create in one step: a compare in the same transaction, so two
            // exclusive creates racing on one object never both succeed.
            OsdOp::Create { exclusive } => {
                if exclusive {
                    if txn.ops[first..]
                        .iter()
                        .any(|op| !matches!(op, Op::Compare { .. }))
                    {
                        return Err(reject(
                            Status::InvalidArgument,
                            "an exclusive create must come before every op but compares",
                        ));
                    }
                    txn.compare(pg, oid, Expect::Absent);
                }
                txn.touch(pg, oid);
            }
            OsdOp::CmpXattr { name, value } => {
                txn.compare(pg, oid, Expect::Xattr { name, value });
            }
            OsdOp::CmpOmap { key, value } => {
                txn.compare(pg, oid, Expect::OmapKey { key, value });
            }
            OsdOp::Write { off, data } => {
                txn.write(pg, oid, off, data);
            }
            OsdOp::WriteFull { data } => {
                txn.truncate(pg, oid, 0).write(pg, oid, 0, data);
            }
            OsdOp::Zero { off, len } => {
                txn.zero(pg, oid, off, len);
            }
            OsdOp::Truncate { size } => {
                txn.truncate(pg, oid, size);
            }
            OsdOp::Remove => {
                txn.remove(pg, oid);
            }
            OsdOp::SetXattr { name, value } => {
                txn.setattr(pg, oid, &name, value);
            }
            OsdOp::RmXattr { name } => {
                txn.rmattr(pg, oid, &name);
            }
            OsdOp::OmapSet { kvs } => {
                txn.omap_set(pg, oid, kvs);
            }
            OsdOp::OmapRm { keys } => {
                txn.omap_rm(pg, oid, keys);
            }
            OsdOp::OmapClear => {
                txn.omap_clear(pg, oid);
            }
            OsdOp::OmapSetHeader { data } => {
                txn.omap_set_header(pg, oid, data);
            }
            _ => unreachable!("read op in a write request"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use carmine_nativestore::{mkfs, NativeConfig, NativeStore, SimDevice};
    use carmine_proto::{encode_request, try_decode_frame};
    use std::cell::Cell;
    use std::collections::HashSet;

    fn frame(req: &Request) -> Frame {
        let mut b = BytesMut::new();
        encode_request(&mut b, 1, req);
        try_decode_frame(&mut b).unwrap().unwrap()
    }

    #[test]
    fn a_shard_whose_store_failed_answers_pings_with_the_failure() {
        futures::executor::block_on(async {
            let dev = SimDevice::new(16 << 20);
            mkfs(&dev, 1, 1 << 20).await.unwrap();
            let store = NativeStore::mount(dev.clone(), 0, NativeConfig::default())
                .await
                .unwrap();
            let pg = PgId { pool: 1, seed: 0 };
            let map = carmine_cluster::OsdMap {
                epoch: 1,
                osds: vec![],
                pools: vec![],
                upmaps: Default::default(),
                pg_temp: Default::default(),
                pool_max: 0,
                given_copies: Default::default(),
            };
            let shard = Shard {
                osd: 0,
                index: 0,
                view: std::cell::RefCell::new(std::rc::Rc::new(crate::reactor::MapView {
                    encoded: map.encode(),
                    map: std::sync::Arc::new(map),
                    owned: HashSet::from([pg]),
                    replicated: false,
                })),
                store,
                connections: Cell::new(0),
                fences: Default::default(),
                metrics: Default::default(),
                auth_key: None,
                handshaking: Cell::new(0),
                epoch_line: Default::default(),
                idle_timeout: None,
                lease: None,
                removed_pools: Default::default(),
                replication: crate::replication::Replication::new(
                    0,
                    None,
                    None,
                    Default::default(),
                    Default::default(),
                    crate::replication::Waits {
                        read_lease: crate::READ_LEASE_DEFAULT,
                        prior_read_lease: crate::READ_LEASE_DEFAULT,
                        ack_wait: crate::WRITE_ACK_WAIT_DEFAULT,
                    },
                ),
                me: std::rc::Weak::new(),
            };
            let ping = Request::Ping {
                payload: bytes::Bytes::new(),
            };
            let mut out = BytesMut::new();
            handle_frame(&shard, frame(&ping), &mut out, Sender::Unauthenticated).await;
            let reply = try_decode_frame(&mut out).unwrap().unwrap();
            assert!(matches!(
                Response::decode(&reply),
                Ok(Ok(Response::Pong { .. }))
            ));
            // While the store works, a device read error is a bad local copy (healed from
            // another member, like a checksum mismatch); other errors are not.
            assert!(local_copy_bad(&shard, Status::Io));
            assert!(local_copy_bad(&shard, Status::Corrupt));
            assert!(!local_copy_bad(&shard, Status::ObjectNotFound));

            // The next fdatasync fails: the shard stops, and its pings say so.
            dev.fail_sync_at(0);
            let mut t = Transaction::new();
            t.create_collection(pg);
            assert!(shard.store.submit(t).await.is_err());
            let mut out = BytesMut::new();
            handle_frame(&shard, frame(&ping), &mut out, Sender::Unauthenticated).await;
            let reply = try_decode_frame(&mut out).unwrap().unwrap();
            let err = Response::decode(&reply).unwrap().unwrap_err();
            assert_eq!(err.status, Status::Io);
            assert!(
                err.message.contains("store shard failed"),
                "{}",
                err.message
            );
            // A failed store's I/O errors are no bad copy: a rewrite could not land.
            assert!(!local_copy_bad(&shard, Status::Io));
            assert!(local_copy_bad(&shard, Status::Corrupt));
        });
    }
}
