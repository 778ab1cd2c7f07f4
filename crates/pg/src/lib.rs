//! The replication protocol's core, without I/O (decision 0009): versions, the per-PG log, and
//! the decisions peering makes — which member's history is authoritative, what each member
//! must drop and fetch, and whether the PG may go active at all. Everything here is a plain
//! function of its inputs, so the OSD and the deterministic simulator drive the same code, and
//! property tests check it against histories generated at random.

pub mod envelope;
mod history;
mod log;
mod member;
mod peering;
pub mod scrub;
mod version;
pub mod wire;

pub use history::{History, HistoryError, HISTORY_FORMAT_VERSION, HISTORY_INTERVALS_MAX};
pub use log::{Entry, LogError, OpKind, PgLog, ReqId, LOG_ENTRIES_DEFAULT};
pub use member::{Action, Event, Member, Msg, Persisting, BACKFILL_LACKS};
pub use peering::{
    all_answered, answered, choose_authoritative, plan_member, uncovered_intervals, Interval,
    MemberPlan, Need, PeerInfo,
};
pub use version::{Version, RUN_MAX};
