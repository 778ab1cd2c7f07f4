//! Identifiers of pools, placement groups, OSDs and store collections.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A pool: a namespace of objects with its own PG count and replica size.
pub type PoolId = u32;

/// An OSD daemon in the cluster map.
pub type OsdId = u32;

/// A placement group: the unit of placement, ownership (one reactor owns it) and, later,
/// replication and recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PgId {
    pub pool: PoolId,
    /// The PG's number inside its pool, `0..pg_num`.
    pub seed: u32,
}

impl fmt::Display for PgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:x}", self.pool, self.seed)
    }
}

/// A store collection. The OSD keeps one collection per PG, so a collection is named by its PG.
pub type CollectionId = PgId;
