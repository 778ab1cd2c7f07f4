//! Depth-1 latency of what the journal does, on a file, pinned wherever you run it:
//! - `device`: the primitive — an 8 KiB `write_at` through `FileDevice` (compio io_uring,
//!   O_DIRECT), then its sync;
//! - `store`: 4 KiB write transactions straight into a native store shard (no network), which
//!   formats the file first.
//!
//! Usage: cargo run --release --example latency -- device|store FILE [ITERATIONS]
//!        [fsync|dsync|nofsync]   (DEFAULT_RING=1: compio's default ring instead of Carmine's)

use bytes::Bytes;
use carmine_nativestore::{
    mkfs, AlignedBuf, BlockDevice, FileDevice, NativeConfig, NativeStore, SyncMode,
};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::PgId;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).expect("device|store").clone();
    let path = std::path::PathBuf::from(args.get(2).expect("FILE"));
    let n: u64 = args.get(3).map_or(5000, |s| s.parse().unwrap());
    let sync = match args.get(4).map(String::as_str) {
        Some("nofsync") => SyncMode::ProcessCrashOnly,
        Some("dsync") => SyncMode::Dsync,
        _ => SyncMode::Fdatasync,
    };
    let rt = if std::env::var("DEFAULT_RING").is_ok() {
        compio::runtime::Runtime::new().unwrap()
    } else {
        carmine_reactor::new_runtime().unwrap()
    };
    rt.block_on(async {
        let dev = FileDevice::open(&path, sync).await.unwrap();
        match what.as_str() {
            "device" => device(dev, n, sync).await,
            _ => store(dev, n, sync).await,
        }
    });
}

async fn device(dev: FileDevice, n: u64, sync: SyncMode) {
    let blocks = dev.size() / 4096 - 2;
    let mut buf = AlignedBuf::zeroed(8192);
    let (mut w, mut s) = (0u128, 0u128);
    let start = Instant::now();
    for i in 0..n {
        let off = (i * 2 % blocks) * 4096;
        let t0 = Instant::now();
        let (res, b) = dev.write_at(buf, off).await;
        res.unwrap();
        buf = b;
        let t1 = Instant::now();
        dev.sync().await.unwrap();
        w += (t1 - t0).as_nanos();
        s += t1.elapsed().as_nanos();
    }
    let total = start.elapsed();
    println!(
        "{n} x (8 KiB write + {sync:?}): {:.0}/s, write {:.1} us, sync {:.1} us",
        n as f64 / total.as_secs_f64(),
        w as f64 / n as f64 / 1000.0,
        s as f64 / n as f64 / 1000.0
    );
}

async fn store(dev: FileDevice, n: u64, sync: SyncMode) {
    mkfs(&dev, 1, 32 << 20).await.unwrap();
    let store = NativeStore::mount(dev, 0, NativeConfig::default())
        .await
        .unwrap();
    let c = PgId { pool: 1, seed: 0 };
    let mut t = Transaction::new();
    t.create_collection(c);
    store.submit(t).await.unwrap();
    let data = Bytes::from(vec![7u8; 4096]);
    let start = Instant::now();
    for i in 0..n {
        let mut t = Transaction::new();
        t.write(c, "obj", (i * 7919 % 65536) * 4096, data.clone());
        store.submit(t).await.unwrap();
    }
    let total = start.elapsed();
    println!(
        "{n} x 4 KiB write transactions ({sync:?}): {:.0}/s, {:.1} us each",
        n as f64 / total.as_secs_f64(),
        total.as_secs_f64() * 1e6 / n as f64,
    );
}
