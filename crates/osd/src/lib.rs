//! The OSD daemon: N reactors, each pinned to a core, each owning a disjoint set of PGs and its
//! own store shard, each listening on its own endpoint.
//!
//! Key decision: per-reactor endpoints. The cluster map lists one address per reactor and the
//! client computes which reactor owns a PG, so a request reaches the core that owns its data
//! with zero cross-core hops and reactors share nothing. The only cross-thread traffic is
//! control messages (shutdown, later map updates) through bounded mailboxes.

mod auth;
mod daemon;
mod fence;
mod handler;
mod lease;
mod metrics;
mod reactor;
mod removed_pools;
mod replication;

pub use metrics::{serve_metrics, MetricsServer, ReactorMetrics, ReactorSource, LATENCY_BUCKETS};

pub use daemon::{
    Osd, OsdConfig, OsdError, StoreConfig, CONNECTIONS_MAX_DEFAULT, IDLE_TIMEOUT_DEFAULT,
};
pub use lease::{LeaseClock, LEASE_TRUSTED_SHARE};
pub use reactor::ControlMsg;
pub use replication::history::{ChangeTemps, SharedHistoryStore, TempChange, TempChanger};
pub use replication::{
    check_pg_state, RecoveryConfig, ScrubSchedule, BACKFILL_MIN_OBJECTS_DEFAULT,
    READ_LEASE_DEFAULT, READ_LEASE_MAX, RECOVERY_BUSY_RATE_DEFAULT, RECOVERY_MAX_ACTIVE_DEFAULT,
    RECOVERY_RATE_DEFAULT, WRITE_ACK_WAIT_DEFAULT,
};
