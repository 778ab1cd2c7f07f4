//! The cluster map: epoch, OSDs with their per-reactor endpoints, and pools.

use crate::placement::{
    object_to_pg_seed, pg_to_reactor_index, rendezvous_score, weighted_draw, WEIGHT_ONE,
};
use crate::temps::PgTemps;
use bytes::{Bytes, BytesMut};
use carmine_types::{crc32c, DecodeError, Decoder, Encoder, OsdId, PgId, PoolId};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use thiserror::Error;

const MAP_MAGIC: u32 = u32::from_le_bytes(*b"CMAP");
pub const MAP_FORMAT_VERSION: u16 = 9;
/// Maps written before OSDs had `in`, a host and a down stamp: still read (all OSDs in).
const MAP_FORMAT_V1: u16 = 1;
/// Maps written before placement exceptions (upmaps): still read (none).
const MAP_FORMAT_V2: u16 = 2;
/// Maps written before pools had `min_size`: still read (`min_size` 1, as they served).
const MAP_FORMAT_V3: u16 = 3;
/// Maps written before OSDs could be held down on their peers' reports: still read (none).
const MAP_FORMAT_V4: u16 = 4;
/// Maps written before OSDs could be declared lost: still read (none).
const MAP_FORMAT_V5: u16 = 5;
/// Maps written before temporary acting sets: still read (none).
const MAP_FORMAT_V6: u16 = 6;
/// Maps written before pools could be removed: still read (no id given beyond the pools').
const MAP_FORMAT_V7: u16 = 7;
/// Maps written before pools of one copy could be given copies in place: still read (none).
const MAP_FORMAT_V8: u16 = 8;
/// Placement exceptions per map: one per PG at most, and far fewer in practice (the balancer
/// moves a few PGs per OSD).
const UPMAPS_MAX: usize = 1 << 18;
const OSDS_MAX: usize = 4096;
const REACTORS_PER_OSD_MAX: usize = 256;
const POOLS_MAX: usize = 1024;
const NAME_LEN_MAX: usize = 128;
const ADDR_LEN_MAX: usize = 64;
const HOST_LEN_MAX: usize = 253;
const FLAG_UP: u8 = 1;
const FLAG_IN: u8 = 2;
const FLAG_AUTO_OUT: u8 = 4;
/// PGs per pool; 2^16 is far beyond what one map needs and keeps per-PG tables small.
pub const PG_NUM_MAX: u32 = 1 << 16;
pub const REPLICA_SIZE_MAX: u8 = 16;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MapError {
    #[error("cluster map: {0}")]
    Decode(#[from] DecodeError),
    #[error("cluster map: bad magic {found:#010x}")]
    BadMagic { found: u32 },
    #[error(
        "cluster map: unsupported format version {found} (this build reads {MAP_FORMAT_V1} to {MAP_FORMAT_VERSION})"
    )]
    BadVersion { found: u16 },
    #[error("cluster map: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("cluster map: invalid address {addr:?}")]
    BadAddress { addr: String },
    #[error("no pool named {0:?}")]
    NoSuchPool(String),
    #[error("no pool with id {0}")]
    NoSuchPoolId(PoolId),
    #[error("invalid map: {0}")]
    Invalid(String),
}

/// One OSD's entry. `up` and `in` are Ceph's two states: `up` says whether it runs and
/// serves (liveness), `in` whether placement gives it PGs. A down OSD that is still in keeps
/// its PGs, which wait for it (their data is there); only once it is out do they move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OsdInfo {
    pub id: OsdId,
    pub up: bool,
    pub in_: bool,
    /// Marked out by the manager after the down grace period (not by an operator): marked in
    /// again when it comes back up.
    pub auto_out: bool,
    /// When it was marked down (Unix seconds; 0 while up): the grace period runs from here,
    /// across manager failovers.
    pub down_since: u64,
    /// Marked down on its peers' failure reports (it was registered, but they could not hear
    /// from it): it stays down until then (Unix seconds), even while registered. Kept after
    /// it is up again, as when its last hold ended.
    pub held_down_until: u64,
    /// How many times in a row its peers' reports marked it down, each hold twice the one
    /// before (flap damping); a mark down long after the last hold ended counts from 1.
    pub report_markdowns: u16,
    /// The epoch in which an operator declared it lost (`osd lost`: its disk is gone for
    /// good), 0 if never: PGs stop waiting for its copies of the intervals before then.
    pub lost_at: u32,
    /// The host it runs on: the failure domain placement spreads copies over.
    pub host: String,
    /// Its share of PGs relative to the others (16.16 fixed point, `WEIGHT_ONE` = 1.0; by
    /// convention its capacity in TiB). 0 takes no PGs.
    pub weight: u32,
    /// One listening endpoint per reactor: reactor `r` serves the PGs that hash to it.
    pub reactors: Vec<SocketAddr>,
}

impl OsdInfo {
    /// An OSD that is up and in.
    pub fn new(id: OsdId, host: &str, reactors: Vec<SocketAddr>) -> Self {
        OsdInfo {
            id,
            up: true,
            in_: true,
            auto_out: false,
            down_since: 0,
            held_down_until: 0,
            report_markdowns: 0,
            lost_at: 0,
            host: host.into(),
            weight: WEIGHT_ONE,
            reactors,
        }
    }

    /// Down because its peers reported it (decision 0014), not because it went away: its
    /// last mark down came with a hold.
    pub fn down_on_reports(&self) -> bool {
        !self.up && self.down_since < self.held_down_until
    }

    fn flags(&self) -> u8 {
        (self.up as u8 * FLAG_UP)
            | (self.in_ as u8 * FLAG_IN)
            | (self.auto_out as u8 * FLAG_AUTO_OUT)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    pub id: PoolId,
    pub name: String,
    pub pg_num: u32,
    /// Copies of every object: placement gives each PG `size` OSDs on distinct hosts, and a
    /// PG of more than one copy replicates every write to the up ones (decision 0009).
    pub size: u8,
    /// Copies that must be up for a PG to take writes: with fewer, it waits rather than
    /// accept a write it could lose with one more failure.
    pub min_size: u8,
}

impl Pool {
    /// The pool's PGs, by seed.
    pub fn pgs(&self) -> impl Iterator<Item = PgId> + '_ {
        (0..self.pg_num).map(|seed| PgId {
            pool: self.id,
            seed,
        })
    }
}

/// PGs per OSD (see [`OsdMap::spread`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Spread {
    pub per_osd: Vec<(OsdId, usize)>,
    pub min: usize,
    pub max: usize,
    pub mean: f64,
}

impl Spread {
    /// The busiest OSD's share against a perfectly even one (1.0 is perfect).
    pub fn max_over_mean(&self) -> f64 {
        if self.mean == 0.0 {
            return 0.0;
        }
        self.max as f64 / self.mean
    }
}

/// Placement exceptions, as Ceph's `pg_upmap_items`: in a PG's placement, OSD `from` is
/// replaced by OSD `to` (pairs applied in order). The balancer writes them to even out what
/// hashing alone leaves uneven; an exception whose target is out is ignored.
pub type Upmaps = BTreeMap<PgId, Vec<(OsdId, OsdId)>>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OsdMap {
    pub epoch: u32,
    pub osds: Vec<OsdInfo>,
    pub pools: Vec<Pool>,
    pub upmaps: Upmaps,
    /// Temporary acting sets (format 7): a PG listed here is served by these OSDs (their up
    /// ones, primary first) instead of its placement, while a copy placement gives it is
    /// being filled (decision 0015).
    pub pg_temp: PgTemps,
    /// The highest pool id ever given (format 8), so that a removed pool's id is never given
    /// again: an OSD that still holds a removed pool's objects (it was down when the pool
    /// went) must never see them adopted by a new pool. May lag the pools' own ids (0 in a
    /// map built by hand): [`OsdMap::highest_pool_id`] is what counts.
    pub pool_max: PoolId,
    /// Pools of one copy given copies in place (format 9, `pool set --size`), each with the
    /// last epoch it had one: the OSD then holding each of its PGs takes the objects it stored
    /// into the PG's history (`carmine_osd`'s adoption), and only for these pools.
    pub given_copies: BTreeMap<PoolId, u32>,
}

impl OsdMap {
    /// The smallest cluster: epoch 1, osd.0 with one endpoint per reactor, and pool 1 "rbd"
    /// of `pg_num` PGs, one copy. For tests and tools that run one OSD in-process.
    pub fn single_osd(reactors: Vec<std::net::SocketAddr>, pg_num: u32) -> Self {
        OsdMap {
            epoch: 1,
            osds: vec![OsdInfo::new(0, "localhost", reactors)],
            pools: vec![Pool {
                id: 1,
                name: "rbd".into(),
                pg_num,
                size: 1,
                min_size: 1,
            }],
            upmaps: Upmaps::new(),
            pg_temp: PgTemps::new(),
            pool_max: 1,
            given_copies: BTreeMap::new(),
        }
    }

    /// The highest pool id this map or an earlier one gave.
    pub fn highest_pool_id(&self) -> PoolId {
        self.pools
            .iter()
            .map(|p| p.id)
            .fold(self.pool_max, PoolId::max)
    }

    /// Whether some pool was removed: an id up to the highest given is not in the map.
    pub fn any_pool_removed(&self) -> bool {
        (self.pools.len() as u64) < u64::from(self.highest_pool_id())
    }

    /// Whether `pool` is the id of a pool that was removed: given once, and no longer in the
    /// map. What an OSD holds of it is garbage (ids are never given twice).
    pub fn pool_removed(&self, pool: PoolId) -> bool {
        pool != 0 && pool <= self.highest_pool_id() && self.pool(pool).is_err()
    }

    /// Checks the invariants placement relies on. Called on every decoded map.
    pub fn validate(&self) -> Result<(), MapError> {
        let invalid = |s: String| Err(MapError::Invalid(s));
        // What decoding takes: a map stored past it could not be read back.
        if self.upmaps.len() > UPMAPS_MAX || self.pg_temp.len() > UPMAPS_MAX {
            return invalid(format!(
                "{} placement exceptions and {} temporary acting sets: at most {UPMAPS_MAX} \
                 of each",
                self.upmaps.len(),
                self.pg_temp.len()
            ));
        }
        for (i, o) in self.osds.iter().enumerate() {
            if o.reactors.is_empty() {
                return invalid(format!("osd.{} has no reactors", o.id));
            }
            if self.osds[..i].iter().any(|p| p.id == o.id) {
                return invalid(format!("osd.{} appears twice", o.id));
            }
            if o.auto_out && o.in_ {
                return invalid(format!("osd.{} is in but marked out automatically", o.id));
            }
            if o.lost_at > self.epoch {
                return invalid(format!(
                    "osd.{} declared lost in epoch {}, after the map's {}",
                    o.id, o.lost_at, self.epoch
                ));
            }
        }
        for (i, p) in self.pools.iter().enumerate() {
            if p.pg_num == 0 || p.pg_num > PG_NUM_MAX {
                return invalid(format!("pool {:?} has pg_num {}", p.name, p.pg_num));
            }
            if p.size == 0 || p.size > REPLICA_SIZE_MAX {
                return invalid(format!("pool {:?} has size {}", p.name, p.size));
            }
            if p.min_size == 0 || p.min_size > p.size {
                return invalid(format!(
                    "pool {:?} has min_size {} for size {}",
                    p.name, p.min_size, p.size
                ));
            }
            if self.pools[..i]
                .iter()
                .any(|q| q.id == p.id || q.name == p.name)
            {
                return invalid(format!("pool {:?} (id {}) is defined twice", p.name, p.id));
            }
        }
        for (pool, epoch) in &self.given_copies {
            match self.pools.iter().find(|p| p.id == *pool) {
                Some(p) if p.size > 1 && *epoch < self.epoch => {}
                _ => {
                    return invalid(format!(
                        "pool {pool} is said given copies after epoch {epoch}, but the map \
                         (epoch {}) has no such pool of copies",
                        self.epoch
                    ))
                }
            }
        }
        for (pg, items) in &self.upmaps {
            match self.pools.iter().find(|p| p.id == pg.pool) {
                Some(p) if pg.seed < p.pg_num => {}
                _ => return invalid(format!("an exception names pg {pg:?}, which no pool has")),
            }
            if items.is_empty() || items.len() > REPLICA_SIZE_MAX as usize {
                return invalid(format!("pg {pg:?} has {} exceptions", items.len()));
            }
            for (i, (from, to)) in items.iter().enumerate() {
                if from == to || items[..i].iter().any(|(f, t)| f == from || t == to) {
                    return invalid(format!("pg {pg:?} has contradicting exceptions {items:?}"));
                }
            }
        }
        self.validate_temps()
    }

    pub fn pool(&self, id: PoolId) -> Result<&Pool, MapError> {
        self.pools
            .iter()
            .find(|p| p.id == id)
            .ok_or(MapError::NoSuchPoolId(id))
    }

    pub fn pool_by_name(&self, name: &str) -> Result<&Pool, MapError> {
        self.pools
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| MapError::NoSuchPool(name.into()))
    }

    pub fn osd(&self, id: OsdId) -> Option<&OsdInfo> {
        self.osds.iter().find(|o| o.id == id)
    }

    /// The PG an object of `pool` lives in.
    pub fn object_pg(&self, pool: &Pool, oid: &str) -> PgId {
        PgId {
            pool: pool.id,
            seed: object_to_pg_seed(oid, pool.pg_num),
        }
    }

    /// The OSDs placement gives a PG, best first: among the OSDs that are in (up or not) with
    /// a weight, ranked by straw2's weighted draw (by the rendezvous score alone when all
    /// weights are equal, which ranks the same), the first `size` on distinct hosts; if there
    /// are fewer hosts than `size`, the rest in rank order. A down OSD keeps its place (its
    /// PGs wait for it) until it is out.
    pub fn pg_placement(&self, pg: PgId, size: u8) -> Vec<OsdId> {
        let mut chosen = self.raw_placement(pg, size);
        self.apply_upmaps(pg, &mut chosen);
        chosen
    }

    /// Placement by hashing alone, before the exceptions.
    pub(crate) fn raw_placement(&self, pg: PgId, size: u8) -> Vec<OsdId> {
        let candidates = self.osds.iter().filter(|o| o.in_ && o.weight > 0);
        let first_weight = self
            .osds
            .iter()
            .find(|o| o.in_ && o.weight > 0)
            .map(|o| o.weight);
        let equal = candidates.clone().all(|o| Some(o.weight) == first_weight);
        let mut ranked: Vec<(i128, u64, OsdId, &str)> = candidates
            .map(|o| {
                let score = rendezvous_score(pg, o.id);
                let draw = if equal {
                    0
                } else {
                    weighted_draw(score, o.weight)
                };
                (draw, score, o.id, o.host.as_str())
            })
            .collect();
        ranked.sort_unstable_by_key(|r| std::cmp::Reverse((r.0, r.1, r.2)));
        let size = size as usize;
        let mut chosen: Vec<OsdId> = Vec::with_capacity(size);
        let mut hosts: Vec<&str> = Vec::with_capacity(size);
        for (_, _, id, host) in &ranked {
            if chosen.len() == size {
                break;
            }
            if !hosts.contains(host) {
                chosen.push(*id);
                hosts.push(host);
            }
        }
        // Fewer hosts than copies: fill from the rest, in rank order.
        for (_, _, id, _) in &ranked {
            if chosen.len() == size {
                break;
            }
            if !chosen.contains(id) {
                chosen.push(*id);
            }
        }
        chosen
    }

    /// Applies the PG's exceptions to a placement; one whose target is out, has no weight, or
    /// is already placed is skipped (the balancer's own checks keep hosts distinct).
    fn apply_upmaps(&self, pg: PgId, chosen: &mut [OsdId]) {
        let Some(items) = self.upmaps.get(&pg) else {
            return;
        };
        for &(from, to) in items {
            let usable = self.osd(to).is_some_and(|o| o.in_ && o.weight > 0);
            if usable && !chosen.contains(&to) {
                if let Some(slot) = chosen.iter_mut().find(|c| **c == from) {
                    *slot = to;
                }
            }
        }
    }

    /// The primary OSD of a PG and the index of its reactor that owns the PG; `None` while
    /// no OSD placed for it is up (the PG is down: its requests wait).
    pub fn pg_primary(&self, pg: PgId) -> Option<(OsdId, u32)> {
        let size = self.pool(pg.pool).map_or(1, |p| p.size);
        let id = *self.pg_osds(pg, size).first()?;
        let osd = self.osd(id)?;
        Some((id, pg_to_reactor_index(pg, osd.reactors.len() as u32)))
    }

    /// How evenly placement spreads PGs: the first placed OSD of every PG (the primary once
    /// it is up), counted per OSD that is in.
    pub fn spread(&self) -> Spread {
        let mut per_osd: Vec<(OsdId, usize)> = self
            .osds
            .iter()
            .filter(|o| o.in_)
            .map(|o| (o.id, 0))
            .collect();
        for pg in self.all_pgs() {
            let size = self.pool(pg.pool).map_or(1, |p| p.size);
            if let Some(first) = self.pg_placement(pg, size).first() {
                if let Some(c) = per_osd.iter_mut().find(|(id, _)| id == first) {
                    c.1 += 1;
                }
            }
        }
        let total: usize = per_osd.iter().map(|(_, n)| n).sum();
        let mean = if per_osd.is_empty() {
            0.0
        } else {
            total as f64 / per_osd.len() as f64
        };
        let max = per_osd.iter().map(|(_, n)| *n).max().unwrap_or(0);
        let min = per_osd.iter().map(|(_, n)| *n).min().unwrap_or(0);
        Spread {
            per_osd,
            min,
            max,
            mean,
        }
    }

    /// PGs whose placement differs between this map and `other` (by this map's pools).
    pub fn moved_pgs(&self, other: &OsdMap) -> usize {
        self.all_pgs()
            .filter(|pg| {
                let size = self.pool(pg.pool).map_or(1, |p| p.size);
                self.pg_placement(*pg, size) != other.pg_placement(*pg, size)
            })
            .count()
    }

    /// Every PG of every pool.
    pub fn all_pgs(&self) -> impl Iterator<Item = PgId> + '_ {
        self.pools.iter().flat_map(Pool::pgs)
    }

    /// Every PG of the pools that keep one copy.
    pub fn single_copy_pgs(&self) -> impl Iterator<Item = PgId> + '_ {
        self.pools.iter().filter(|p| p.size < 2).flat_map(Pool::pgs)
    }

    /// The OSDs declared lost, each with the epoch it was declared in.
    pub fn lost(&self) -> BTreeMap<OsdId, u32> {
        self.osds
            .iter()
            .filter(|o| o.lost_at != 0)
            .map(|o| (o.id, o.lost_at))
            .collect()
    }

    /// Every PG whose primary is reactor `reactor` of `osd`, over all pools.
    pub fn pgs_of_reactor(&self, osd: OsdId, reactor: u32) -> Vec<PgId> {
        self.all_pgs()
            .filter(|pg| self.pg_primary(*pg) == Some((osd, reactor)))
            .collect()
    }

    /// The encoding in the oldest format that holds everything the map says: format 4 unless
    /// an OSD is held down on reports (5), declared lost (6), a PG has a temporary acting
    /// set (7), a pool was removed (8) or given copies in place (9), so that daemons of earlier releases still read the maps of a cluster being
    /// upgraded until it needs more.
    pub fn encode(&self) -> Bytes {
        let held = self
            .osds
            .iter()
            .any(|o| o.held_down_until != 0 || o.report_markdowns != 0);
        let lost = self.osds.iter().any(|o| o.lost_at != 0);
        let removed = self.pool_max > self.pools.iter().map(|p| p.id).max().unwrap_or(0);
        self.encode_as(if !self.given_copies.is_empty() {
            MAP_FORMAT_VERSION
        } else if removed {
            MAP_FORMAT_V8
        } else if !self.pg_temp.is_empty() {
            MAP_FORMAT_V7
        } else if lost {
            MAP_FORMAT_V6
        } else if held {
            MAP_FORMAT_V5
        } else {
            MAP_FORMAT_V4
        })
    }

    /// The encoding in format `version` (2 up to the current one; what an older format
    /// cannot hold is left out): the current one, or older ones for tests of the decoder.
    pub(crate) fn encode_as(&self, version: u16) -> Bytes {
        debug_assert!((MAP_FORMAT_V2..=MAP_FORMAT_VERSION).contains(&version));
        let mut out = BytesMut::new();
        let mut e = Encoder::new(&mut out);
        e.u32(MAP_MAGIC)
            .u16(version)
            .u32(self.epoch)
            .count(self.osds.len());
        for o in &self.osds {
            e.u32(o.id).u8(o.flags()).u32(o.weight).u64(o.down_since);
            if version > MAP_FORMAT_V4 {
                e.u64(o.held_down_until).u16(o.report_markdowns);
            }
            if version > MAP_FORMAT_V5 {
                e.u32(o.lost_at);
            }
            e.str(&o.host).count(o.reactors.len());
            for a in &o.reactors {
                e.str(&a.to_string());
            }
        }
        e.count(self.pools.len());
        for p in &self.pools {
            e.u32(p.id).str(&p.name).u32(p.pg_num).u8(p.size);
            if version > MAP_FORMAT_V3 {
                e.u8(p.min_size);
            }
        }
        if version > MAP_FORMAT_V2 {
            e.count(self.upmaps.len());
            for (pg, items) in &self.upmaps {
                e.u32(pg.pool).u32(pg.seed).count(items.len());
                for (from, to) in items {
                    e.u32(*from).u32(*to);
                }
            }
        }
        if version > MAP_FORMAT_V6 {
            e.count(self.pg_temp.len());
            for (pg, osds) in &self.pg_temp {
                e.u32(pg.pool).u32(pg.seed).count(osds.len());
                for id in osds {
                    e.u32(*id);
                }
            }
        }
        if version > MAP_FORMAT_V7 {
            e.u32(self.highest_pool_id());
        }
        if version > MAP_FORMAT_V8 {
            e.count(self.given_copies.len());
            for (pool, epoch) in &self.given_copies {
                e.u32(*pool).u32(*epoch);
            }
        }
        let crc = crc32c(&out);
        Encoder::new(&mut out).u32(crc);
        out.freeze()
    }

    pub fn decode(buf: Bytes) -> Result<Self, MapError> {
        if buf.len() < 4 {
            return Err(DecodeError::Truncated {
                what: "map checksum",
                needed: 4,
                available: buf.len(),
            }
            .into());
        }
        let body_len = buf.len() - 4;
        let stored = u32::from_le_bytes(buf[body_len..].try_into().expect("4 bytes"));
        let computed = crc32c(&buf[..body_len]);
        if stored != computed {
            return Err(MapError::Checksum { stored, computed });
        }
        let mut d = Decoder::new(buf.slice(..body_len));
        let magic = d.u32("map magic")?;
        if magic != MAP_MAGIC {
            return Err(MapError::BadMagic { found: magic });
        }
        let version = d.u16("map version")?;
        if !(MAP_FORMAT_V1..=MAP_FORMAT_VERSION).contains(&version) {
            return Err(MapError::BadVersion { found: version });
        }
        let epoch = d.u32("epoch")?;
        let n = d.count("osd count", OSDS_MAX)?;
        let mut osds = Vec::with_capacity(n);
        for _ in 0..n {
            let id = d.u32("osd id")?;
            let (flags, weight, down_since, held, lost_at, host) = if version == MAP_FORMAT_V1 {
                let up = d.bool("osd up")?;
                (
                    FLAG_IN | if up { FLAG_UP } else { 0 },
                    WEIGHT_ONE,
                    0,
                    (0, 0),
                    0,
                    String::new(),
                )
            } else {
                let flags = d.u8("osd flags")?;
                if flags & !(FLAG_UP | FLAG_IN | FLAG_AUTO_OUT) != 0 {
                    return Err(MapError::Invalid(format!(
                        "osd.{id} has unknown flags {flags:#04x}"
                    )));
                }
                (
                    flags,
                    d.u32("osd weight")?,
                    d.u64("osd down since")?,
                    if version > MAP_FORMAT_V4 {
                        (
                            d.u64("osd held down until")?,
                            d.u16("osd report markdowns")?,
                        )
                    } else {
                        (0, 0)
                    },
                    if version > MAP_FORMAT_V5 {
                        d.u32("osd lost at")?
                    } else {
                        0
                    },
                    d.string("osd host", HOST_LEN_MAX)?,
                )
            };
            let r = d.count("reactor count", REACTORS_PER_OSD_MAX)?;
            let mut reactors = Vec::with_capacity(r);
            for _ in 0..r {
                let addr = d.string("reactor address", ADDR_LEN_MAX)?;
                reactors.push(addr.parse().map_err(|_| MapError::BadAddress { addr })?);
            }
            osds.push(OsdInfo {
                id,
                up: flags & FLAG_UP != 0,
                in_: flags & FLAG_IN != 0,
                auto_out: flags & FLAG_AUTO_OUT != 0,
                down_since,
                held_down_until: held.0,
                report_markdowns: held.1,
                lost_at,
                host,
                weight,
                reactors,
            });
        }
        let n = d.count("pool count", POOLS_MAX)?;
        let mut pools = Vec::with_capacity(n);
        for _ in 0..n {
            pools.push(Pool {
                id: d.u32("pool id")?,
                name: d.string("pool name", NAME_LEN_MAX)?,
                pg_num: d.u32("pg_num")?,
                size: d.u8("pool size")?,
                min_size: if version > MAP_FORMAT_V3 {
                    d.u8("pool min_size")?
                } else {
                    1
                },
            });
        }
        let mut upmaps = Upmaps::new();
        if version > MAP_FORMAT_V2 {
            let n = d.count("exception count", UPMAPS_MAX)?;
            for _ in 0..n {
                let pg = PgId {
                    pool: d.u32("exception pool")?,
                    seed: d.u32("exception pg")?,
                };
                let k = d.count("exception pairs", REPLICA_SIZE_MAX as usize)?;
                let mut items = Vec::with_capacity(k);
                for _ in 0..k {
                    items.push((d.u32("exception from")?, d.u32("exception to")?));
                }
                if upmaps.insert(pg, items).is_some() {
                    return Err(MapError::Invalid(format!(
                        "pg {pg:?} has two exception lists"
                    )));
                }
            }
        }
        let mut pg_temp = PgTemps::new();
        if version > MAP_FORMAT_V6 {
            let n = d.count("temporary acting set count", UPMAPS_MAX)?;
            for _ in 0..n {
                let pg = PgId {
                    pool: d.u32("temporary acting set pool")?,
                    seed: d.u32("temporary acting set pg")?,
                };
                let k = d.count("temporary acting set size", REPLICA_SIZE_MAX as usize)?;
                let mut osds = Vec::with_capacity(k);
                for _ in 0..k {
                    osds.push(d.u32("temporary acting set osd")?);
                }
                if pg_temp.insert(pg, osds).is_some() {
                    return Err(MapError::Invalid(format!(
                        "pg {pg:?} has two temporary acting sets"
                    )));
                }
            }
        }
        let pool_max = if version > MAP_FORMAT_V7 {
            d.u32("highest pool id")?
        } else {
            pools.iter().map(|p| p.id).max().unwrap_or(0)
        };
        let mut given_copies = BTreeMap::new();
        if version > MAP_FORMAT_V8 {
            let n = d.count("pools given copies", POOLS_MAX)?;
            for _ in 0..n {
                let pool = d.u32("pool given copies")?;
                let epoch = d.u32("epoch of one copy")?;
                if given_copies.insert(pool, epoch).is_some() {
                    return Err(MapError::Invalid(format!(
                        "pool {pool} is given copies twice"
                    )));
                }
            }
        }
        d.finish("cluster map")?;
        let map = OsdMap {
            epoch,
            osds,
            pools,
            upmaps,
            pg_temp,
            pool_max,
            given_copies,
        };
        map.validate()?;
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_on_peers_reports_round_trips_and_older_formats_read_as_none() {
        let mut m = map(3, 2);
        m.osds[1].up = false;
        m.osds[1].down_since = 1_790_000_000;
        m.osds[1].held_down_until = 1_790_000_040;
        m.osds[1].report_markdowns = 3;
        let encoded = m.encode();
        assert_eq!(u16::from_le_bytes([encoded[4], encoded[5]]), MAP_FORMAT_V5);
        assert_eq!(OsdMap::decode(encoded).unwrap(), m);
        let old = OsdMap::decode(m.encode_as(MAP_FORMAT_V4)).unwrap();
        assert_eq!(
            (old.osds[1].held_down_until, old.osds[1].report_markdowns),
            (0, 0)
        );
        assert!(!old.osds[1].up);
        // Without a hold, the format the previous release reads.
        let plain = map(3, 2).encode();
        assert_eq!(u16::from_le_bytes([plain[4], plain[5]]), MAP_FORMAT_V4);
    }

    #[test]
    fn an_osd_declared_lost_round_trips_and_older_formats_read_as_never() {
        let mut m = map(3, 2);
        m.osds[2].up = false;
        m.osds[2].lost_at = 3;
        let encoded = m.encode();
        assert_eq!(u16::from_le_bytes([encoded[4], encoded[5]]), MAP_FORMAT_V6);
        assert_eq!(OsdMap::decode(encoded).unwrap(), m);
        let old = OsdMap::decode(m.encode_as(MAP_FORMAT_V5)).unwrap();
        assert_eq!(old.osds[2].lost_at, 0);
        // A declaration from the future is refused.
        m.osds[2].lost_at = 4;
        assert!(matches!(m.validate(), Err(MapError::Invalid(_))));
    }

    #[test]
    fn a_pool_given_copies_is_kept_in_format_9_and_only_for_a_pool_of_copies() {
        let mut m = map(3, 2);
        m.epoch = 5;
        m.pools[0].size = 3;
        m.pools[0].min_size = 1;
        m.given_copies.insert(1, 4);
        let encoded = m.encode();
        assert_eq!(
            u16::from_le_bytes([encoded[4], encoded[5]]),
            MAP_FORMAT_VERSION
        );
        assert_eq!(OsdMap::decode(encoded).unwrap(), m);
        // Nothing given: the format before.
        let mut plain = m.clone();
        plain.given_copies.clear();
        let encoded = plain.encode();
        assert!(u16::from_le_bytes([encoded[4], encoded[5]]) < MAP_FORMAT_VERSION);
        // Refused: a pool the map lacks, one of one copy, an epoch not before the map's.
        for (pool, size, epoch) in [(2, 3, 4), (1, 1, 4), (1, 3, 5)] {
            let mut bad = m.clone();
            bad.pools[0].size = size;
            bad.pools[0].min_size = 1;
            assert!(bad.validate().is_ok() || size == 1);
            bad.given_copies = BTreeMap::from([(pool, epoch)]);
            assert!(
                matches!(bad.validate(), Err(MapError::Invalid(_))),
                "{pool} {size} {epoch}"
            );
        }
    }

    #[test]
    fn a_removed_pools_id_is_kept_in_format_8_and_never_given_again() {
        let mut m = map(3, 2);
        m.pools.push(Pool {
            id: 2,
            name: "two".into(),
            pg_num: 8,
            size: 1,
            min_size: 1,
        });
        // Without a removal, the oldest format that holds the map, and the id follows.
        let encoded = m.encode();
        assert_eq!(u16::from_le_bytes([encoded[4], encoded[5]]), MAP_FORMAT_V4);
        let old = OsdMap::decode(encoded).unwrap();
        assert_eq!((old.pool_max, old.highest_pool_id()), (2, 2));
        assert!(!old.pool_removed(1) && !old.pool_removed(2) && !old.pool_removed(3));
        assert!(!old.any_pool_removed());
        // Pool 2 removed: format 8 keeps its id.
        m.pools.pop();
        m.pool_max = 2;
        let encoded = m.encode();
        assert_eq!(u16::from_le_bytes([encoded[4], encoded[5]]), MAP_FORMAT_V8);
        let new = OsdMap::decode(encoded).unwrap();
        assert_eq!(new, m);
        assert_eq!(new.highest_pool_id(), 2);
        assert!(new.pool_removed(2), "the removed id");
        assert!(new.any_pool_removed());
        assert!(!new.pool_removed(1), "a pool of the map");
        assert!(!new.pool_removed(3), "an id never given");
        assert!(!new.pool_removed(u32::MAX), "the OSDs' own collection");
        // A format 7 map (a temporary set, no removal) still reads, its ids as given.
        let mut t = map(3, 2);
        t.pools[0].size = 2;
        t.pg_temp.insert(PgId { pool: 1, seed: 0 }, vec![0, 1]);
        let encoded = t.encode();
        assert_eq!(u16::from_le_bytes([encoded[4], encoded[5]]), MAP_FORMAT_V7);
        assert_eq!(OsdMap::decode(encoded).unwrap(), t);
    }

    fn map(osds: u32, reactors: u16) -> OsdMap {
        OsdMap {
            epoch: 3,
            osds: (0..osds)
                .map(|id| {
                    OsdInfo::new(
                        id,
                        &format!("host{id}"),
                        (0..reactors)
                            .map(|r| {
                                SocketAddr::from(([127, 0, 0, 1], 6800 + (id * 16) as u16 + r))
                            })
                            .collect(),
                    )
                })
                .collect(),
            pools: vec![Pool {
                id: 1,
                name: "rbd".into(),
                pg_num: 64,
                size: 1,
                min_size: 1,
            }],
            upmaps: Default::default(),
            pg_temp: Default::default(),
            pool_max: 1,
            given_copies: Default::default(),
        }
    }

    #[test]
    fn map_round_trips_through_its_encoding() {
        let m = map(3, 2);
        assert_eq!(OsdMap::decode(m.encode()).unwrap(), m);
    }

    #[test]
    fn corrupted_map_is_rejected_by_checksum() {
        let mut raw = m_bytes();
        raw[10] ^= 0x40;
        assert!(matches!(
            OsdMap::decode(Bytes::from(raw)),
            Err(MapError::Checksum { .. })
        ));
    }

    fn m_bytes() -> Vec<u8> {
        map(2, 2).encode().to_vec()
    }

    #[test]
    fn every_pg_has_exactly_one_owning_reactor() {
        let m = map(3, 4);
        let mut owned = Vec::new();
        for o in &m.osds {
            for r in 0..4 {
                owned.extend(m.pgs_of_reactor(o.id, r));
            }
        }
        owned.sort();
        let all: Vec<PgId> = (0..64).map(|seed| PgId { pool: 1, seed }).collect();
        assert_eq!(owned, all);
    }

    #[test]
    fn pgs_spread_over_osds_and_reactors() {
        let m = map(4, 2);
        for o in &m.osds {
            for r in 0..2 {
                let n = m.pgs_of_reactor(o.id, r).len();
                assert!(
                    (2..=16).contains(&n),
                    "osd.{} reactor {r} owns {n} of 64 PGs",
                    o.id
                );
            }
        }
    }

    fn primaries(m: &OsdMap) -> Vec<Option<OsdId>> {
        (0..64)
            .map(|s| m.pg_primary(PgId { pool: 1, seed: s }).map(|p| p.0))
            .collect()
    }

    #[test]
    fn a_down_osd_keeps_its_pgs_and_they_wait_for_it() {
        let mut m = map(4, 1);
        let before = primaries(&m);
        m.osds[2].up = false;
        for (s, (was, now)) in before.iter().zip(primaries(&m)).enumerate() {
            if *was == Some(2) {
                assert_eq!(now, None, "pg {s} of the down osd.2 must wait for it");
            } else {
                assert_eq!(now, *was, "pg {s} moved though its OSD is up");
            }
        }
        assert!(before.contains(&Some(2)));
    }

    #[test]
    fn marking_an_osd_out_moves_only_its_pgs() {
        let mut m = map(4, 1);
        let before = primaries(&m);
        m.osds[2].up = false;
        m.osds[2].in_ = false;
        for (s, (was, now)) in before.iter().zip(primaries(&m)).enumerate() {
            let now = now.expect("every PG has an in, up OSD");
            assert!(
                *was == Some(2) || Some(now) == *was,
                "pg {s} moved from {was:?} to osd.{now}"
            );
            assert_ne!(now, 2);
        }
    }

    fn pool_map(osds: u32, pg_num: u32) -> OsdMap {
        let mut m = map(osds, 1);
        m.pools[0].pg_num = pg_num;
        m
    }

    /// Measured, not the goal: rendezvous hashing alone spreads 256 PGs over 8 OSDs with the
    /// busiest at about 1.2× the mean (issue #11 asks ≤ 1.10, which needs a balancer). The
    /// bound here catches a placement that got worse.
    #[test]
    fn spread_of_256_pgs_over_8_osds() {
        let s = pool_map(8, 256).spread();
        assert_eq!(s.per_osd.iter().map(|(_, n)| n).sum::<usize>(), 256);
        assert_eq!(s.mean, 32.0);
        println!(
            "256 PGs over 8 OSDs: min {} max {} mean {} max/mean {:.3}",
            s.min,
            s.max,
            s.mean,
            s.max_over_mean()
        );
        assert!(s.max_over_mean() <= 1.35, "{s:?}");
        // Over many PGs it evens out: the law of large numbers, not luck.
        let big = pool_map(8, 65536).spread();
        assert!(big.max_over_mean() < 1.03, "{big:?}");
    }

    /// Adding one OSD to N moves only PGs onto the new OSD, about 1/(N+1) of them.
    #[test]
    fn adding_one_osd_moves_about_one_in_n_plus_one_pgs_all_to_it() {
        for n in [2u32, 3, 4, 8, 16] {
            let before = pool_map(n, 4096);
            let mut after = pool_map(n + 1, 4096);
            after.epoch = before.epoch + 1;
            let moved = before.moved_pgs(&after);
            for pg in before.all_pgs() {
                let (b, a) = (before.pg_placement(pg, 1), after.pg_placement(pg, 1));
                assert!(
                    b == a || a == vec![n],
                    "pg {pg} moved {b:?} -> {a:?}, not to the new OSD"
                );
            }
            let frac = moved as f64 / 4096.0;
            let ideal = 1.0 / (n + 1) as f64;
            println!(
                "{n} -> {} OSDs: {moved} of 4096 PGs moved ({frac:.3}, ideal {ideal:.3})",
                n + 1
            );
            assert!((frac - ideal).abs() < 0.2 * ideal, "{n}: {frac} vs {ideal}");
        }
    }

    #[test]
    fn weights_share_pgs_in_proportion() {
        let mut m = pool_map(4, 65536);
        m.osds[3].weight = 2 * WEIGHT_ONE;
        let s = m.spread();
        let n = |id: u32| s.per_osd.iter().find(|(o, _)| *o == id).unwrap().1 as f64;
        // 1 : 1 : 1 : 2 of 65536.
        let ideal = 65536.0 / 5.0;
        for id in 0..3 {
            assert!((n(id) / ideal - 1.0).abs() < 0.03, "osd.{id}: {}", n(id));
        }
        assert!((n(3) / (2.0 * ideal) - 1.0).abs() < 0.03, "osd.3: {}", n(3));
        // Weight 0 takes nothing, like out.
        m.osds[3].weight = 0;
        assert!(m.all_pgs().all(|pg| m.pg_placement(pg, 1) != vec![3]));
    }

    #[test]
    fn equal_weights_place_exactly_as_plain_rendezvous() {
        let mut m = pool_map(5, 512);
        let before: Vec<_> = m.all_pgs().map(|pg| m.pg_placement(pg, 3)).collect();
        for o in &mut m.osds {
            o.weight = 7 * WEIGHT_ONE;
        }
        let after: Vec<_> = m.all_pgs().map(|pg| m.pg_placement(pg, 3)).collect();
        assert_eq!(before, after);
        // Plain rendezvous: the highest scores, in order.
        for (pg, placed) in m.all_pgs().zip(&before) {
            let mut ids: Vec<u32> = (0..5).collect();
            ids.sort_by_key(|id| std::cmp::Reverse((rendezvous_score(pg, *id), *id)));
            assert_eq!(&ids[..3], &placed[..]);
        }
    }

    #[test]
    fn copies_go_to_distinct_hosts_when_there_are_enough() {
        // Six OSDs on three hosts, two each.
        let mut m = pool_map(6, 256);
        for o in &mut m.osds {
            o.host = format!("h{}", o.id / 2);
        }
        for pg in m.all_pgs() {
            let p = m.pg_placement(pg, 3);
            let mut hosts: Vec<u32> = p.iter().map(|id| id / 2).collect();
            hosts.sort();
            hosts.dedup();
            assert_eq!(hosts.len(), 3, "pg {pg}: {p:?}");
        }
        // Two hosts for three copies: both hosts, then the best remaining OSD.
        let mut m = pool_map(4, 256);
        for o in &mut m.osds {
            o.host = format!("h{}", o.id % 2);
        }
        for pg in m.all_pgs() {
            let p = m.pg_placement(pg, 3);
            assert_eq!(p.len(), 3);
            assert_ne!(
                p[0] % 2,
                p[1] % 2,
                "pg {pg}: the first two must be on both hosts"
            );
        }
    }

    #[test]
    fn version_1_maps_are_still_read_with_every_osd_in() {
        // Format 1: magic, version, epoch, osds (id, up, reactors), pools, crc.
        let mut out = BytesMut::new();
        let mut e = Encoder::new(&mut out);
        e.u32(MAP_MAGIC).u16(1).u32(7).count(2);
        for (id, up) in [(0u32, true), (1, false)] {
            e.u32(id)
                .bool(up)
                .count(1)
                .str(&format!("127.0.0.1:{}", 6800 + id));
        }
        e.count(1).u32(1).str("rbd").u32(8).u8(1);
        let crc = crc32c(&out);
        Encoder::new(&mut out).u32(crc);
        let m = OsdMap::decode(out.freeze()).unwrap();
        assert_eq!(m.epoch, 7);
        assert!(m
            .osds
            .iter()
            .all(|o| o.in_ && !o.auto_out && o.down_since == 0));
        assert!(m.osds[0].up && !m.osds[1].up);
        // Written back, it is version 2 and round-trips.
        assert_eq!(OsdMap::decode(m.encode()).unwrap(), m);
    }

    #[test]
    fn unknown_osd_flags_are_refused() {
        let m = map(1, 1);
        let mut raw = m.encode().to_vec();
        // magic 4 + version 2 + epoch 4 + count 4 + id 4: the flags byte.
        raw[18] |= 0x80;
        let body = raw.len() - 4;
        let crc = crc32c(&raw[..body]);
        raw[body..].copy_from_slice(&crc.to_le_bytes());
        let err = OsdMap::decode(Bytes::from(raw)).unwrap_err().to_string();
        assert!(err.contains("unknown flags"), "{err}");
    }

    #[test]
    fn acting_set_has_distinct_osds_primary_first() {
        let m = map(5, 1);
        for s in 0..64 {
            let pg = PgId { pool: 1, seed: s };
            let set = m.pg_osds(pg, 3);
            assert_eq!(set.len(), 3);
            assert_eq!(set[0], m.pg_primary(pg).unwrap().0);
            assert!(set[0] != set[1] && set[1] != set[2] && set[0] != set[2]);
        }
    }

    #[test]
    fn invalid_maps_are_rejected() {
        let mut m = map(1, 1);
        m.pools[0].pg_num = 0;
        assert!(OsdMap::decode(m.encode()).is_err());
        let mut m = map(1, 1);
        m.osds[0].reactors.clear();
        assert!(m.validate().is_err());
    }

    #[test]
    fn unknown_pool_is_a_clear_error() {
        assert_eq!(
            map(1, 1).pool_by_name("nope").unwrap_err().to_string(),
            "no pool named \"nope\""
        );
    }
}
