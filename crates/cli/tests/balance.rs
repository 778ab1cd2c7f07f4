//! The balancer end to end: a new cluster is balanced at birth, and `osd balance` evens out
//! what a membership change leaves uneven, refusing to move single-copy PGs unless told
//! (other changes keep them where their data is).

mod common;
use common::Cluster;

fn map(c: &Cluster) -> carmine_cluster::OsdMap {
    carmine_localcluster::read_map(&c.dir).expect("reading the map")
}

#[test]
fn clusters_start_balanced_and_osd_balance_evens_out_a_new_osd() {
    // One copy: what a change that moves PGs means for a pool that cannot recover them.
    let c = Cluster::up(
        "balance",
        &["--osds", "4", "--pg-num", "256", "--size", "1"],
    );
    let born = map(&c);
    let s = born.spread();
    assert!(
        s.max_over_mean() <= 1.10 && s.max <= 65 && s.min >= 63,
        "a new cluster must be balanced: {s:?}"
    );
    assert!(!born.upmaps.is_empty(), "hashing alone was already even?");
    let tree = c.ok(&["osd", "tree"]);
    assert!(tree.contains("placement exceptions"), "{tree}");
    // The OSDs serve what the exceptions place on them: one object in every PG is written
    // and read back through the client, which routes by the same exceptions.
    every_pg_serves(&c, &born);
    let said = c.ok(&["osd", "balance"]);
    assert!(
        said.contains("moved 0 PGs"),
        "nothing to do on a balanced map: {said}"
    );
    assert_eq!(
        map(&c).epoch,
        born.epoch,
        "a no-op balance committed an epoch"
    );

    // A fifth OSD (on a host that does not run it yet): hashing gives it about a fifth.
    c.ok(&[
        "osd",
        "add",
        "--host",
        "127.0.0.1",
        "--port-base",
        "31000",
        "--in",
        "--allow-single-copy-moves",
    ]);
    let before_balance = map(&c);
    // One copy per PG: the balancer moves none of them unless told (it may drop exceptions
    // the added OSD made stale, which moves nothing either).
    let said = c.ok(&["osd", "balance"]);
    assert!(said.contains("moved 0 PGs"), "{said}");
    let grown = map(&c);
    assert!(placements(&grown) == placements(&before_balance), "{said}");
    let dry = c.ok(&["osd", "balance", "--dry-run", "--allow-single-copy-moves"]);
    assert!(dry.contains("would move"), "{dry}");
    assert_eq!(map(&c), grown, "a dry run changed the map");
    let said = c.ok(&["osd", "balance", "--allow-single-copy-moves"]);
    let balanced = map(&c);
    assert_eq!(balanced.epoch, grown.epoch + 1, "{said}");
    let s = balanced.spread();
    // 256 / 5 = 51.2 per OSD.
    assert!(s.max <= 53 && s.min >= 50, "{said}\n{s:?}");
    let moved: usize = said
        .split("moved ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the number of PGs moved");
    assert_eq!(moved, grown.moved_pgs(&balanced), "{said}");
}

fn placements(m: &carmine_cluster::OsdMap) -> Vec<Vec<u32>> {
    m.all_pgs().map(|pg| m.pg_placement(pg, 1)).collect()
}

fn every_pg_serves(c: &Cluster, m: &carmine_cluster::OsdMap) {
    let pool = m.pools[0].clone();
    let mut names = std::collections::BTreeMap::new();
    for i in 0.. {
        let name = format!("obj-{i}");
        names.entry(m.object_pg(&pool, &name)).or_insert(name);
        if names.len() == pool.pg_num as usize {
            break;
        }
    }
    let moved: Vec<_> = m.upmaps.keys().collect();
    assert!(moved.iter().all(|pg| names.contains_key(pg)));
    let cfg = carmine_client::ClientConfig {
        key: carmine_localcluster::read_key(&c.dir).expect("the cluster key"),
        ..Default::default()
    };
    let addrs: Vec<_> = m.osds.iter().flat_map(|o| o.reactors.clone()).collect();
    carmine_reactor::block_on(async move {
        let client = carmine_client::Client::connect(&addrs, cfg).await.unwrap();
        for (pg, name) in &names {
            let data = bytes::Bytes::from(format!("{pg:?} {name}"));
            client.write(pool.id, name, 0, data.clone()).await.unwrap();
            let back = client
                .read(pool.id, name, 0, data.len() as u32)
                .await
                .unwrap();
            assert_eq!(back, data, "{pg:?}");
        }
    });
}

/// Weights are capacities in TiB: a new cluster's OSDs weigh what their stores hold, an OSD
/// added without a weight gets the mean, and `osd reweight-by-capacity` sets each registered
/// OSD's weight from the capacity it registered.
#[test]
fn weights_follow_capacity() {
    let c = Cluster::up(
        "weights",
        &["--osds", "2", "--reactors", "2", "--memory-limit", "512M"],
    );
    let m = map(&c);
    // 2 reactors x 512 MiB = 1 GiB = 64 / 65536 TiB.
    assert!(m.osds.iter().all(|o| o.weight == 64), "{:?}", m.osds);
    let said = c.ok(&["osd", "reweight-by-capacity"]);
    assert!(said.contains("already weighs its capacity"), "{said}");

    c.ok(&["osd", "reweight", "1", "1.0", "--allow-single-copy-moves"]);
    assert_eq!(map(&c).osd(1).unwrap().weight, carmine_cluster::WEIGHT_ONE);
    let before = map(&c);
    let dry = c.ok(&["osd", "reweight-by-capacity", "--dry-run"]);
    assert!(
        dry.contains("osd.1: 1.0 GiB registered, weight 1.0000 -> 0.0010"),
        "{dry}"
    );
    assert_eq!(map(&c), before, "a dry run changed the map");
    // One copy per PG: the weights change, and placement exceptions keep every PG on the
    // OSD that holds its only copy.
    let said = c.ok(&["osd", "reweight-by-capacity"]);
    assert!(said.contains("kept on the OSDs that hold them"), "{said}");
    let after = map(&c);
    assert!(after
        .all_pgs()
        .all(|pg| after.pg_placement(pg, 1) == before.pg_placement(pg, 1)));
    assert_eq!(after.epoch, before.epoch + 1);
    assert!(
        after.osds.iter().all(|o| o.weight == 64),
        "{:?}",
        after.osds
    );

    // Added without a weight: the mean of those in, not 1 TiB against 1 GiB ones.
    c.ok(&["osd", "add", "--host", "127.0.0.1", "--port-base", "31000"]);
    assert_eq!(map(&c).osd(2).unwrap().weight, 64);
}
