//! What the tests of replicated pools share: a cluster of OSDs in this process, on memory or
//! native stores, with PG histories in a directory; publishing maps and waiting for PGs to
//! settle; a client; and scrubs that expect findings.
#![allow(dead_code)] // Each test binary uses its own part.

use bytes::Bytes;
use carmine_client::{Client, ClientConfig, ClientError, Connection};
use carmine_cluster::{OsdInfo, OsdMap, Pool};
use carmine_mapstore::{LocalPgHistory, PgHistoryStore};
use carmine_osd::{Osd, OsdConfig, RecoveryConfig, ScrubSchedule};
use carmine_proto::auth::AuthKey;
use carmine_proto::{OpOutput, OsdOp, Request, Response, ScrubMode, ScrubReport};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A directory for the PG histories, removed at the end.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("carmine-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The tests of this file run one at a time: each picks free ports by binding and releasing
/// them, and two clusters started at once could be handed the same one.
pub static ONE_CLUSTER_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A port nothing listens on, never one handed out before in this process (the kernel may
/// give a just-released port again).
pub fn free_addr() -> SocketAddr {
    static GIVEN: std::sync::Mutex<Vec<SocketAddr>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let a = carmine_testkit::free_addr();
        if !given.contains(&a) {
            given.push(a);
            return a;
        }
    }
}

pub fn three_osd_map(reactors: usize) -> OsdMap {
    OsdMap {
        epoch: 1,
        osds: (0..3)
            .map(|id| {
                OsdInfo::new(
                    id,
                    &format!("host{id}"),
                    (0..reactors).map(|_| free_addr()).collect(),
                )
            })
            .collect(),
        pools: vec![Pool {
            id: 1,
            name: "rbd".into(),
            pg_num: 8,
            size: 3,
            min_size: 2,
        }],
        upmaps: Default::default(),
        pg_temp: Default::default(),
        pool_max: 1,
        given_copies: Default::default(),
    }
}

pub fn start(id: u32, map: &OsdMap, histories: &Path) -> Osd {
    start_keyed(id, map, histories, None)
}

/// Every OSD of `map` started on memory stores, once each PG settled on its acting set.
pub fn start_all_settled(map: &OsdMap, histories: &Path) -> Vec<Osd> {
    let osds = map
        .osds
        .iter()
        .map(|o| start(o.id, map, histories))
        .collect();
    wait_settled(map, histories);
    osds
}

pub fn start_keyed(id: u32, map: &OsdMap, histories: &Path, auth_key: Option<AuthKey>) -> Osd {
    start_with(id, map, histories, auth_key, Default::default())
}

pub fn start_with(
    id: u32,
    map: &OsdMap,
    histories: &Path,
    auth_key: Option<AuthKey>,
    scrub: ScrubSchedule,
) -> Osd {
    start_recovering(id, map, histories, auth_key, scrub, Default::default())
}

pub fn start_recovering(
    id: u32,
    map: &OsdMap,
    histories: &Path,
    auth_key: Option<AuthKey>,
    scrub: ScrubSchedule,
    recovery: RecoveryConfig,
) -> Osd {
    Osd::start(OsdConfig {
        reactor_cpus: vec![None; map.osds[0].reactors.len()],
        auth_key,
        pg_history: Some(Arc::new(LocalPgHistory::new(histories))),
        scrub,
        recovery,
        ..OsdConfig::in_memory(id, map.clone(), 256 << 20)
    })
    .unwrap()
}

pub fn data(i: usize, round: u8) -> Bytes {
    Bytes::from(vec![i as u8 ^ round.wrapping_mul(37); 4096 + i])
}

pub fn bootstrap(map: &OsdMap) -> Vec<SocketAddr> {
    map.osds.iter().flat_map(|o| o.reactors.clone()).collect()
}

pub async fn client(map: &OsdMap, retry: Duration) -> Client {
    keyed_client(map, retry, None).await
}

pub async fn keyed_client(map: &OsdMap, retry: Duration, key: Option<AuthKey>) -> Client {
    Client::connect(
        &bootstrap(map),
        ClientConfig {
            retry_timeout: retry,
            key,
            ..ClientConfig::default()
        },
    )
    .await
    .unwrap()
}

pub async fn write(c: &Client, i: usize, round: u8) -> Result<(), ClientError> {
    c.execute(
        1,
        &format!("obj{i}"),
        vec![OsdOp::WriteFull {
            data: data(i, round),
        }],
    )
    .await
    .map(|_| ())
}

pub async fn check(c: &Client, i: usize, round: u8) {
    let out = c
        .execute(1, &format!("obj{i}"), vec![OsdOp::Read { off: 0, len: 0 }])
        .await
        .unwrap_or_else(|e| panic!("reading obj{i}: {e}"));
    match &out[..] {
        [OpOutput::Data(d)] => assert_eq!(d, &data(i, round), "obj{i} of round {round}"),
        other => panic!("{other:?}"),
    }
}

/// Hands `map` to every running OSD, and waits until every PG with enough copies up went
/// active in it with all of them and is clean (its recorded history settled to that one
/// interval): only then may the next OSD fail without the PG having to wait for one that is
/// gone.
pub fn publish(osds: &mut [Option<Osd>], map: &OsdMap, histories: &Path) {
    hand_out(osds, map);
    wait_settled(map, histories);
}

/// Hands `map` to every running OSD and waits until each of their reactors serves it.
pub fn hand_out(osds: &mut [Option<Osd>], map: &OsdMap) {
    for o in osds.iter_mut().flatten() {
        o.apply_map(map.clone()).unwrap();
    }
    // Every reactor of a running OSD serves the new epoch.
    let running: Vec<SocketAddr> = osds
        .iter()
        .flatten()
        .flat_map(|o| map.osd(o.id()).unwrap().reactors.clone())
        .collect();
    carmine_reactor::block_on(async {
        for addr in running {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                // A connection made while a restarted OSD comes up may be reset: ask again.
                let ask = async {
                    let conn = Connection::open(addr, 4).await.ok()?;
                    match conn.call(&Request::GetMap).await {
                        Ok(Response::Map { encoded }) => {
                            Some(OsdMap::decode(encoded).unwrap().epoch)
                        }
                        Ok(other) => panic!("{other:?}"),
                        Err(_) => None,
                    }
                };
                // (A bounded wait: a reply that never comes must fail the test, not hang it.)
                let served = match carmine_reactor::timeout(Duration::from_secs(1), ask).await {
                    Ok(epoch) => epoch.unwrap_or(0),
                    Err(_) => {
                        eprintln!("{addr} did not answer GetMap within 1 s; asking again");
                        0
                    }
                };
                if served >= map.epoch {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{addr} never took epoch {}",
                    map.epoch
                );
                carmine_reactor::sleep(Duration::from_millis(5)).await;
            }
        }
    });
}

pub fn wait_settled(map: &OsdMap, histories: &Path) {
    let store = LocalPgHistory::new(histories);
    let pool = &map.pools[0];
    let deadline = Instant::now() + Duration::from_secs(30);
    for pg in map.all_pgs() {
        let acting = map.pg_osds(pg, pool.size);
        if acting.len() < pool.min_size as usize {
            continue;
        }
        loop {
            let h = store.get(pg).unwrap();
            if matches!(&h.intervals[..], [i] if i.acting == acting && i.epoch == map.epoch) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "pg {pg} never settled in epoch {}: {h:?}",
                map.epoch
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn next(map: &mut OsdMap, change: impl FnOnce(&mut OsdMap)) {
    map.epoch += 1;
    change(map);
}

/// osd.0 goes with its memory (its PGs settle on the other two) and comes back empty, as
/// `start` makes it; its new map is handed out, not waited for (recovery may take a while).
pub fn osd0_comes_back_empty(
    osds: &mut [Option<Osd>],
    map: &mut OsdMap,
    histories: &Path,
    start: impl FnOnce(&OsdMap) -> Osd,
) {
    osds[0].take().unwrap().shutdown().unwrap();
    next(map, |m| m.osds[0].up = false);
    publish(osds, map, histories);
    osds[0] = Some(start(map));
    next(map, |m| m.osds[0].up = true);
    hand_out(osds, map);
}

/// osd.1 and osd.2 go; osd.0 serves alone (min_size 1), with what it holds.
pub fn only_osd0_left(osds: &mut [Option<Osd>], map: &mut OsdMap, histories: &Path) {
    for id in [1, 2] {
        osds[id].take().unwrap().shutdown().unwrap();
    }
    next(map, |m| {
        m.osds[1].up = false;
        m.osds[2].up = false;
        m.pools[0].min_size = 1;
    });
    publish(osds, map, histories);
}

/// With RUST_LOG set, the OSDs' logs go to the test's output.
pub fn log_if_asked() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// Deep-scrubs `seed` until it reports `n` findings (the forged pushes apply in the
/// background).
pub async fn findings(c: &Client, seed: u32, n: u64) -> ScrubReport {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c.scrub(1, seed, ScrubMode::Deep).await.unwrap();
        if r.findings_total >= n {
            assert_eq!(r.findings_total, n, "{r:#?}");
            assert_eq!(r.unrepaired(), n, "a deep scrub repairs nothing: {r:#?}");
            return r;
        }
        assert!(Instant::now() < deadline, "{n} findings never came: {r:#?}");
        carmine_reactor::sleep(Duration::from_millis(50)).await;
    }
}

/// The sum over `osds`' reactors of one of their metrics.
pub fn total<'a>(
    osds: impl IntoIterator<Item = &'a Osd>,
    counter: impl Fn(&carmine_osd::ReactorMetrics) -> u64,
) -> u64 {
    osds.into_iter()
        .flat_map(|o| o.metrics_sources())
        .map(|r| counter(&r.metrics))
        .sum()
}

/// Three in-memory OSDs of `map` with their PG histories in `histories`, each configured by
/// `tune` (not waited for).
pub fn start_tuned(
    map: &OsdMap,
    histories: &Path,
    tune: impl Fn(OsdConfig) -> OsdConfig,
) -> Vec<Option<Osd>> {
    (0..3)
        .map(|id| {
            let base = OsdConfig {
                pg_history: Some(Arc::new(LocalPgHistory::new(histories))),
                ..OsdConfig::in_memory(id, map.clone(), 256 << 20)
            };
            Some(Osd::start(tune(base)).unwrap())
        })
        .collect()
}

/// An object of the first pool, named `prefix` and a number, whose primary is not `osd`.
pub fn object_not_led_by(map: &OsdMap, osd: u32, prefix: &str) -> String {
    let pool = &map.pools[0];
    (0..1000)
        .map(|i| format!("{prefix}{i}"))
        .find(|oid| map.pg_primary(map.object_pg(pool, oid)).map(|p| p.0) != Some(osd))
        .expect("an object led by another OSD")
}
