//! A new cluster gets a key (mode 0600) and every daemon refuses peers without it; a key that
//! others can read is refused, not used.

mod common;

use carmine_proto::{Request, Status};
use common::Cluster;
use std::os::unix::fs::PermissionsExt;

#[test]
fn a_new_cluster_has_a_private_key_and_its_osds_refuse_peers_without_it() {
    let c = Cluster::up("auth", &["--osds", "2"]);
    let key = c.dir.join("cluster.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the key must be private");
    // The CLI authenticates (it reads the key from the cluster directory).
    c.ok(&["volume", "create", "v", "--size", "4M"]);
    // A peer without the key is refused by every OSD reactor, before any request is read.
    let map = carmine_localcluster::read_map(&c.dir).unwrap();
    for addr in map.osds.iter().flat_map(|o| o.reactors.clone()) {
        carmine_reactor::block_on(async move {
            let conn = carmine_client::Connection::open(addr, 1).await.unwrap();
            let err = conn.call(&Request::GetMap).await.unwrap_err();
            assert_eq!(err.status(), Some(Status::AuthFailed), "{addr}: {err}");
        });
    }
    // A careless chmod: the OSDs will not start with a key others can read.
    c.ok(&["cluster", "down"]);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = c.fails(&["cluster", "up", "--no-pin"]);
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    c.ok(&["cluster", "up", "--no-pin"]);
    // Memory store: the restart lost the volume, not the ability to authenticate.
    c.ok(&["volume", "create", "w", "--size", "4M"]);
}
