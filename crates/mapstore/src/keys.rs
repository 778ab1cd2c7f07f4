//! Where a cluster's state lives in etcd (docs/format/etcd-keys.md). Everything of cluster
//! `c` is under `/carmine/<c>/`, so clusters sharing one etcd never collide.

/// The encoded cluster map.
pub fn map(cluster: &str) -> String {
    format!("/carmine/{cluster}/osdmap")
}

/// The registrations of running OSDs, one key each, attached to that OSD's lease.
pub fn alive_prefix(cluster: &str) -> String {
    format!("/carmine/{cluster}/alive/")
}

pub fn alive(cluster: &str, osd: u32) -> String {
    format!("{}osd.{osd}", alive_prefix(cluster))
}

/// The manager leader's identity, attached to its lease.
pub fn leader(cluster: &str) -> String {
    format!("/carmine/{cluster}/manager/leader")
}

/// The cluster's authentication key (hex), kept in etcd only when etcd is reached over TLS
/// or with etcd auth, so OSDs on other hosts need no copy of the file.
pub fn cluster_key(cluster: &str) -> String {
    format!("/carmine/{cluster}/auth/key")
}

/// A PG's recorded history (decision 0009): the intervals that went active since it was last
/// clean.
pub fn pg_history(cluster: &str, pg: carmine_types::PgId) -> String {
    format!("/carmine/{cluster}/pg/{}.{}/history", pg.pool, pg.seed)
}

/// The prefix of the recorded histories of every PG of `pool` (a removed pool's go with it).
pub fn pg_histories_of_pool(cluster: &str, pool: u32) -> String {
    format!("/carmine/{cluster}/pg/{pool}.")
}

/// The longest read lease an OSD's recent runs granted (nanoseconds, decimal).
pub fn read_lease(cluster: &str, osd: u32) -> String {
    format!("/carmine/{cluster}/osd/{osd}/read-lease")
}

/// Failure reports: the OSDs one OSD cannot hear from, attached to the reporter's lease.
pub fn failure_reports_prefix(cluster: &str) -> String {
    format!("/carmine/{cluster}/reports/")
}

pub fn failure_report(cluster: &str, osd: u32) -> String {
    format!("{}osd.{osd}", failure_reports_prefix(cluster))
}
