//! The cluster map and placement: pure logic, no I/O.
//!
//! Key decision: placement is computed, not looked up. Every party holding the same map epoch
//! computes the same answer for object → PG (a stable hash and Ceph's `stable_mod`, so PG
//! counts can grow later without moving every object), PG → OSDs (rendezvous hashing over the
//! up OSDs, which moves only the PGs of an OSD that comes or goes) and PG → reactor inside the
//! OSD (a hash over the OSD's reactors). Clients connect straight to the owning reactor's
//! endpoint, so a request never hops between cores inside the OSD.

mod balance;
mod map;
mod placement;
mod temps;

pub use balance::Balanced;
pub use map::{
    MapError, OsdInfo, OsdMap, Pool, Spread, Upmaps, MAP_FORMAT_VERSION, PG_NUM_MAX,
    REPLICA_SIZE_MAX,
};
pub use placement::{
    object_to_pg_seed, pg_to_reactor_index, stable_mod, weight_of_capacity, WEIGHT_ONE,
};
pub use temps::PgTemps;
