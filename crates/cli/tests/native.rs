//! End-to-end with the native store: real OSD processes on backing files, kill -9 in the
//! middle of a write load, restart, and every acknowledged write is there.

use bytes::Bytes;
use carmine_volume::Volumes;
use futures::stream::{FuturesUnordered, StreamExt};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

mod common;

use common::{alive, kill9, Cluster};

const BLOCK: u64 = 4096;
const BLOCKS: u64 = 256 * 1024; // a 1 GiB volume

fn block_data(l: u64) -> Bytes {
    let mut b = vec![0u8; BLOCK as usize];
    for (i, w) in b.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&((l * 4096 + i as u64 * 8) ^ 0xc0ffee).to_le_bytes());
    }
    Bytes::from(b)
}

#[test]
fn kill_nine_mid_write_load_loses_no_acknowledged_write() {
    let c = Cluster::up(
        "native-kill",
        &[
            "--store",
            "native",
            "--device-size",
            "3G",
            "--reactors",
            "2",
        ],
    );
    c.ok(&[
        "volume",
        "create",
        "vol",
        "--size",
        &(BLOCKS * BLOCK).to_string(),
    ]);
    let pids = c.osd_pids();
    assert_eq!(pids.len(), 1);
    let acked: Rc<RefCell<Vec<u64>>> = Rc::default();
    // Writers: 32 in flight over distinct blocks, until the OSD dies under them.
    let killer = {
        let pid = pids[0];
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            // Waits until the process is gone: SIGKILL is delivered, not done, when kill
            // returns (a process with much memory takes a while to tear down).
            kill9(pid);
        })
    };
    let dir = c.dir.clone();
    let acked_w = acked.clone();
    let cut_by_kill = carmine_reactor::block_on(async move {
        // No retrying across the kill: the load must see the OSD die (it stays dead).
        let cfg = carmine_client::ClientConfig {
            retry_timeout: Duration::ZERO,
            ..Default::default()
        };
        let client = carmine_localcluster::connect_with(&dir, cfg).await.unwrap();
        let pool = client.pool_id("rbd").unwrap();
        let image = Volumes::new(client, pool).open("vol").await.unwrap();
        let image = &image;
        let mut next = 0u64;
        let mut inflight = FuturesUnordered::new();
        let start = Instant::now();
        loop {
            while inflight.len() < 32 && next < BLOCKS {
                // Stride through the volume so writes land on many objects and PGs.
                let l = (next * 7919) % BLOCKS;
                next += 1;
                inflight.push(async move { (l, image.write(l * BLOCK, block_data(l)).await) });
            }
            match inflight.next().await {
                Some((l, Ok(()))) => acked_w.borrow_mut().push(l),
                Some((_, Err(_))) => break true,
                None => break false,
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "load never failed"
            );
        }
    });
    killer.join().unwrap();
    assert!(!alive(pids[0]));
    assert!(
        cut_by_kill,
        "the load finished before the kill: nothing was in flight"
    );
    let acked = acked.borrow().clone();
    assert!(
        acked.len() > 100,
        "only {} writes acknowledged before the kill",
        acked.len()
    );

    // Restart on the same backing file: mount replays the journal.
    c.ok(&["cluster", "down"]);
    c.ok(&[
        "cluster",
        "up",
        "--no-pin",
        "--store",
        "native",
        "--reactors",
        "2",
    ]);
    let dir = c.dir.clone();
    let lost = carmine_reactor::block_on(async move {
        let client = carmine_localcluster::connect(&dir).await.unwrap();
        let pool = client.pool_id("rbd").unwrap();
        let image = Volumes::new(client, pool).open("vol").await.unwrap();
        let mut lost = Vec::new();
        for &l in &acked {
            let got = image.read(l * BLOCK, BLOCK).await.unwrap();
            if got != block_data(l) {
                lost.push(l);
            }
        }
        lost
    });
    assert!(
        lost.is_empty(),
        "acknowledged blocks lost after kill -9: {lost:?}"
    );
    let fsck = c.run(&["cluster", "down"]);
    assert!(fsck.status.success());
    let out = c.ok(&[
        "store",
        "fsck",
        "--device",
        c.dir.join("osd.0.store").to_str().unwrap(),
    ]);
    assert!(out.contains("clean"), "{out}");
}
