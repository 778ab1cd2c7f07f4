//! Hostile and careless peers against an OSD on the native store (issue #10): a client that
//! never reads its replies, garbage after valid writes, many connections. The OSD stays up,
//! other clients keep writing, nothing acknowledged is lost.

use bytes::{Bytes, BytesMut};
use carmine_client::{Client, ClientConfig};
use carmine_cluster::OsdMap;
use carmine_nativestore::{FileDevice, NativeConfig, SyncMode};
use carmine_osd::{Osd, OsdConfig, StoreConfig, CONNECTIONS_MAX_DEFAULT};
use carmine_proto::{encode_request, ObjectRequest, OsdOp, Request};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct Native {
    osd: Option<Osd>,
    map: OsdMap,
    device: PathBuf,
}

impl Drop for Native {
    fn drop(&mut self) {
        if let Some(osd) = self.osd.take() {
            let _ = osd.shutdown();
        }
        let _ = std::fs::remove_file(&self.device);
    }
}

fn start_native(name: &str) -> Native {
    let device =
        std::env::temp_dir().join(format!("carmine-hostile-{name}-{}", std::process::id()));
    let f = std::fs::File::create(&device).unwrap();
    f.set_len(512 << 20).unwrap();
    drop(f);
    carmine_reactor::block_on(async {
        let dev = FileDevice::open(&device, SyncMode::Fdatasync)
            .await
            .unwrap();
        carmine_nativestore::mkfs(&dev, 1, 32 << 20).await.unwrap();
    });
    let addr: SocketAddr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let map = OsdMap::single_osd(vec![addr], 8);
    let osd = Osd::start(OsdConfig {
        id: 0,
        map: map.clone(),
        reactor_cpus: vec![None],
        store: StoreConfig::Native {
            device: device.clone(),
            config: NativeConfig::default(),
            sync: SyncMode::Fdatasync,
        },
        connections_max: CONNECTIONS_MAX_DEFAULT,
    })
    .unwrap();
    Native {
        osd: Some(osd),
        map,
        device,
    }
}

fn object_request(map: &OsdMap, oid: &str, ops: Vec<OsdOp>) -> Request {
    let pg = map.object_pg(map.pool(1).unwrap(), oid);
    Request::Object(ObjectRequest {
        pool: 1,
        pg_seed: pg.seed,
        epoch: 1,
        client: 0,
        oid: oid.into(),
        ops,
    })
}

/// Writes `n` 4 KiB blocks through a fresh client and returns how long that took.
fn timed_writes(map: &OsdMap, n: u64) -> Duration {
    let addrs = map.osds[0].reactors.clone();
    carmine_reactor::block_on(async move {
        let c = Client::connect(&addrs, ClientConfig::default())
            .await
            .unwrap();
        let t = Instant::now();
        let writes = async {
            for i in 0..n {
                let data = Bytes::from(vec![(i % 251) as u8; 4096]);
                c.write(1, &format!("polite-{}", i % 16), (i / 16) * 4096, data)
                    .await
                    .unwrap();
            }
        };
        // A wedged shard would hang here forever: fail instead.
        carmine_reactor::timeout(Duration::from_secs(30), writes)
            .await
            .expect("writes hung: the shard is wedged");
        t.elapsed()
    })
}

#[test]
fn a_client_that_never_reads_replies_does_not_stall_other_writers() {
    let n = start_native("noread");
    // Something to read: 4 MiB.
    let addrs = n.map.osds[0].reactors.clone();
    carmine_reactor::block_on(async {
        let c = Client::connect(&addrs, ClientConfig::default())
            .await
            .unwrap();
        c.write(1, "big", 0, Bytes::from(vec![1u8; 4 << 20]))
            .await
            .unwrap();
    });
    // The rude client: reads of 4 MiB and writes, interleaved and pipelined, and it never
    // reads a reply. Its socket fills, its connection cannot send.
    let mut rude = TcpStream::connect(addrs[0]).unwrap();
    rude.set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = BytesMut::new();
    for i in 0..200u64 {
        encode_request(
            &mut buf,
            2 * i + 1,
            &object_request(
                &n.map,
                "big",
                vec![OsdOp::Read {
                    off: 0,
                    len: 4 << 20,
                }],
            ),
        );
        encode_request(
            &mut buf,
            2 * i + 2,
            &object_request(
                &n.map,
                &format!("rude-{}", i % 8),
                vec![OsdOp::Write {
                    off: i * 4096,
                    data: Bytes::from(vec![2u8; 4096]),
                }],
            ),
        );
    }
    // It may block once the OSD stops reading (back-pressure): that is expected.
    let _ = rude.write_all(&buf);
    // A polite client still gets its writes acknowledged, at the device's pace.
    let took = timed_writes(&n.map, 200);
    assert!(
        took < Duration::from_secs(20),
        "polite writes took {took:?}"
    );
    drop(rude);
}

#[test]
fn garbage_after_valid_writes_ends_that_connection_after_its_writes_are_durable() {
    let n = start_native("garbage");
    let addrs = n.map.osds[0].reactors.clone();
    for round in 0..20u64 {
        let mut s = TcpStream::connect(addrs[0]).unwrap();
        let mut buf = BytesMut::new();
        for i in 0..16u64 {
            encode_request(
                &mut buf,
                i + 1,
                &object_request(
                    &n.map,
                    &format!("g-{round}"),
                    vec![OsdOp::Write {
                        off: i * 4096,
                        data: Bytes::from(vec![round as u8 + 1; 4096]),
                    }],
                ),
            );
        }
        buf.extend_from_slice(&[0xde; 100]);
        s.write_all(&buf).unwrap();
        drop(s);
    }
    // The shard is not wedged: new writes go through promptly.
    let took = timed_writes(&n.map, 100);
    assert!(
        took < Duration::from_secs(20),
        "writes after garbage took {took:?}"
    );
}
