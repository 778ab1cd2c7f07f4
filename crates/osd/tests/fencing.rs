//! Compare ops and client fencing against a real OSD on the native store (issue #10, item 11):
//! what volumes build their exclusive create, header updates and image lock on.

use bytes::Bytes;
use carmine_client::{Client, ClientConfig, ClientError};
use carmine_cluster::OsdMap;
use carmine_nativestore::{FileDevice, NativeConfig, SyncMode};
use carmine_osd::{Osd, OsdConfig, StoreConfig, CONNECTIONS_MAX_DEFAULT};
use carmine_proto::{OpOutput, OsdOp, Status};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// An OSD with two reactors on one native store device, restartable on the same device.
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

const REACTORS: usize = 2;

impl Native {
    fn start(name: &str) -> Native {
        let device =
            std::env::temp_dir().join(format!("carmine-fencing-{name}-{}", std::process::id()));
        let f = std::fs::File::create(&device).unwrap();
        f.set_len(256 << 20).unwrap();
        drop(f);
        carmine_reactor::block_on(async {
            let dev = FileDevice::open(&device, SyncMode::Fdatasync)
                .await
                .unwrap();
            carmine_nativestore::mkfs(&dev, REACTORS as u32, 8 << 20)
                .await
                .unwrap();
        });
        let addrs: Vec<SocketAddr> = (0..REACTORS)
            .map(|_| carmine_testkit::free_addr())
            .collect();
        let mut n = Native {
            osd: None,
            map: OsdMap::single_osd(addrs, 8),
            device,
        };
        n.restart();
        n
    }

    /// Stops the OSD (if running) and starts it again on the same device and map.
    fn restart(&mut self) {
        if let Some(osd) = self.osd.take() {
            osd.shutdown().unwrap();
        }
        self.osd = Some(
            Osd::start(OsdConfig {
                id: 0,
                map: self.map.clone(),
                reactor_cpus: vec![None; REACTORS],
                store: StoreConfig::Native {
                    device: self.device.clone(),
                    config: NativeConfig::default(),
                    sync: SyncMode::Fdatasync,
                },
                connections_max: CONNECTIONS_MAX_DEFAULT,
                idle_timeout: Some(carmine_osd::IDLE_TIMEOUT_DEFAULT),
                auth_key: None,
                pg_history: None,
                temp_changer: None,
                scrub: Default::default(),
                recovery: Default::default(),
                read_lease: carmine_osd::READ_LEASE_DEFAULT,
                prior_read_lease: None,
                write_ack_wait: carmine_osd::WRITE_ACK_WAIT_DEFAULT,
                lease: None,
            })
            .unwrap(),
        );
    }

    async fn client(&self) -> Client {
        let cfg = ClientConfig {
            retry_timeout: Duration::from_secs(10),
            ..ClientConfig::default()
        };
        Client::connect(&self.map.osds[0].reactors, cfg)
            .await
            .unwrap()
    }
}

fn status<T: std::fmt::Debug>(r: Result<T, ClientError>) -> Status {
    r.expect_err("expected the request to be refused")
        .status()
        .expect("expected an answer from the OSD")
}

async fn xattr(c: &Client, oid: &str, name: &str) -> Bytes {
    let out = c
        .execute(1, oid, vec![OsdOp::GetXattr { name: name.into() }])
        .await
        .unwrap();
    match &out[..] {
        [OpOutput::Value(v)] => v.clone(),
        other => panic!("unexpected reply {other:?}"),
    }
}

#[test]
fn a_compare_guards_the_whole_request() {
    let n = Native::start("compare");
    carmine_reactor::block_on(async {
        let c = n.client().await;
        let set = |v: &'static [u8]| OsdOp::SetXattr {
            name: "gen".into(),
            value: Bytes::from_static(v),
        };
        c.execute(1, "obj", vec![set(b"1")]).await.unwrap();
        // Holds: the write and the new xattr apply.
        c.execute(
            1,
            "obj",
            vec![
                OsdOp::CmpXattr {
                    name: "gen".into(),
                    value: Some(Bytes::from_static(b"1")),
                },
                OsdOp::Write {
                    off: 0,
                    data: Bytes::from_static(b"first"),
                },
                set(b"2"),
            ],
        )
        .await
        .unwrap();
        // Stale: nothing applies, neither the write nor the omap nor the xattr.
        let stale = c
            .execute(
                1,
                "obj",
                vec![
                    OsdOp::CmpXattr {
                        name: "gen".into(),
                        value: Some(Bytes::from_static(b"1")),
                    },
                    OsdOp::Write {
                        off: 0,
                        data: Bytes::from_static(b"SECOND"),
                    },
                    OsdOp::OmapSet {
                        kvs: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
                    },
                    set(b"3"),
                ],
            )
            .await;
        assert_eq!(status(stale), Status::CompareFailed);
        assert_eq!(&xattr(&c, "obj", "gen").await[..], b"2");
        assert_eq!(&c.read(1, "obj", 0, 0).await.unwrap()[..], b"first");
        let omap = c
            .execute(
                1,
                "obj",
                vec![OsdOp::OmapGetVals {
                    keys: vec![Bytes::from_static(b"k")],
                }],
            )
            .await
            .unwrap();
        assert!(
            matches!(&omap[..], [OpOutput::Omap { entries, .. }] if entries.is_empty()),
            "{omap:?}"
        );
        // An omap guard: a key that must be absent, then one that must hold a value.
        let absent = OsdOp::CmpOmap {
            key: Bytes::from_static(b"name"),
            value: None,
        };
        let claim = OsdOp::OmapSet {
            kvs: vec![(Bytes::from_static(b"name"), Bytes::from_static(b"id-1"))],
        };
        c.execute(1, "dir", vec![absent.clone(), claim.clone()])
            .await
            .unwrap();
        assert_eq!(
            status(c.execute(1, "dir", vec![absent, claim]).await),
            Status::CompareFailed
        );
        let wrong_owner = OsdOp::CmpOmap {
            key: Bytes::from_static(b"name"),
            value: Some(Bytes::from_static(b"id-2")),
        };
        assert_eq!(
            status(c.execute(1, "dir", vec![wrong_owner, OsdOp::Remove]).await),
            Status::CompareFailed
        );
        // A compare after a write is refused: guards lead the request.
        let late = c
            .execute(
                1,
                "dir",
                vec![
                    OsdOp::Remove,
                    OsdOp::CmpOmap {
                        key: Bytes::from_static(b"name"),
                        value: None,
                    },
                ],
            )
            .await;
        assert_eq!(status(late), Status::InvalidArgument);
        assert_eq!(c.stat(1, "dir").await.unwrap(), 0, "dir must still exist");
    });
}

#[test]
fn of_racing_exclusive_creates_exactly_one_wins() {
    let n = Native::start("excl");
    carmine_reactor::block_on(async {
        // Separate clients, so the creates race on separate connections.
        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(n.client().await);
        }
        for round in 0..20 {
            let oid = format!("contended-{round}");
            let attempts = clients.iter().enumerate().map(|(i, c)| {
                let oid = oid.clone();
                async move {
                    c.execute(
                        1,
                        &oid,
                        vec![
                            OsdOp::Create { exclusive: true },
                            OsdOp::WriteFull {
                                data: Bytes::from(vec![i as u8; 64]),
                            },
                        ],
                    )
                    .await
                }
            });
            let results = futures::future::join_all(attempts).await;
            let winners: Vec<usize> = results
                .iter()
                .enumerate()
                .filter(|(_, r)| r.is_ok())
                .map(|(i, _)| i)
                .collect();
            assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
            for r in results.into_iter().filter(|r| r.is_err()) {
                assert_eq!(status(r), Status::Exists);
            }
            let data = clients[0].read(1, &oid, 0, 0).await.unwrap();
            assert_eq!(&data[..], &vec![winners[0] as u8; 64][..], "round {round}");
        }
    });
}

#[test]
fn a_fenced_client_is_refused_everywhere_and_after_a_restart() {
    let mut n = Native::start("fence");
    let (a_instance, objects) = carmine_reactor::block_on(async {
        let a = n.client().await;
        let b = n.client().await;
        assert_ne!(a.instance(), b.instance());
        // Objects on both reactors, so the fence must have reached both.
        let objects: Vec<String> = (0..16).map(|i| format!("img.{i}")).collect();
        let reactors: std::collections::HashSet<u32> = objects
            .iter()
            .map(|o| {
                let pg = n.map.object_pg(n.map.pool(1).unwrap(), o);
                n.map.pg_primary(pg).unwrap().1
            })
            .collect();
        assert_eq!(reactors.len(), REACTORS, "objects must span every reactor");
        for o in &objects {
            a.write(1, o, 0, Bytes::from_static(b"from a"))
                .await
                .unwrap();
        }
        b.fence(a.instance()).await.unwrap();
        // Fencing twice is harmless.
        b.fence(a.instance()).await.unwrap();
        for o in &objects {
            let w = a.write(1, o, 0, Bytes::from_static(b"late a")).await;
            assert_eq!(status(w), Status::Fenced, "{o}");
            assert_eq!(status(a.read(1, o, 0, 0).await), Status::Fenced, "{o}");
            assert_eq!(status(a.stat(1, o).await), Status::Fenced, "{o}");
            assert_eq!(&b.read(1, o, 0, 0).await.unwrap()[..], b"from a");
            b.write(1, o, 0, Bytes::from_static(b"from b"))
                .await
                .unwrap();
        }
        (a.instance(), objects)
    });
    n.restart();
    carmine_reactor::block_on(async {
        // The fenced instance, reconnecting after the restart (same id, as a paused process
        // that wakes up would have), is still refused.
        let a = n.client().await;
        let oid = &objects[0];
        let raw = carmine_proto::Request::Object(carmine_proto::ObjectRequest {
            pool: 1,
            pg_seed: n.map.object_pg(n.map.pool(1).unwrap(), oid).seed,
            epoch: 1,
            client: a_instance,
            tid: 0,
            oid: oid.clone(),
            ops: vec![OsdOp::Write {
                off: 0,
                data: Bytes::from_static(b"zombie"),
            }],
        });
        let pg = n.map.object_pg(n.map.pool(1).unwrap(), oid);
        let addr = n.map.osds[0].reactors[n.map.pg_primary(pg).unwrap().1 as usize];
        assert_eq!(
            status(a.call(addr, &raw).await),
            Status::Fenced,
            "a restart forgot the fence"
        );
        // Other clients are unaffected.
        let c = n.client().await;
        for o in &objects {
            assert_eq!(&c.read(1, o, 0, 0).await.unwrap()[..], b"from b");
        }
    });
}
