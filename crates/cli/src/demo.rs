//! `carmine demo`: the whole path in one command, on a throw-away cluster.

use crate::pattern;
use crate::size::{format_size, parse_size};
use crate::volume::progress;
use anyhow::{bail, Result};
use bytes::{Bytes, BytesMut};
use carmine_bench::workload::{run_on_image, Workload};
use carmine_localcluster::{DirArg, UpArgs};
use carmine_reactor::cpu::CpuPolicy;
use carmine_volume::{Image, Volumes};
use clap::Args;
use futures::stream::{self, StreamExt, TryStreamExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Bytes per request of the sequential pattern pass, and requests in flight.
const CHUNK: u64 = 4 << 20;
const DEPTH: usize = 8;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Volume size to write and verify.
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    pub size: u64,
    /// Reactors in the OSD.
    #[arg(long, default_value_t = 2)]
    pub reactors: u32,
    /// Seconds per random-I/O step.
    #[arg(long, default_value_t = 2.0)]
    pub step_secs: f64,
    /// Cluster directory (default: a fresh temporary directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

pub fn run(a: DemoArgs) -> Result<()> {
    let (dir, temporary) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("carmine-demo-{}", std::process::id())),
            true,
        ),
    };
    let up = UpArgs {
        dir: DirArg { dir: dir.clone() },
        osds: Some(1),
        reactors: Some(a.reactors),
        store: Some("memory".into()),
        memory_limit: Some(a.size.max(256 << 20) * 2 / a.reactors.max(1) as u64 + (256 << 20)),
        device_size: None,
        no_fsync: false,
        dsync: false,
        fsync: false,
        exe: None,
        cpu_policy: Some(CpuPolicy::Default),
        cpu_set: None,
        no_pin: false,
        pin: true,
        recovery_rate_mib: None,
        recovery_busy_rate_mib: None,
        recovery_max_active: None,
        backfill_min_objects: None,
        idle_poll_us: None,
        journal_writes: None,
        object_cache: None,
        metadata_cache: None,
        cleaner_rate: None,
        reset_osd_settings: false,
        pool: Some("rbd".into()),
        pg_num: Some(64),
        size: Some(1),
        min_size: None,
        host: [127, 0, 0, 1].into(),
        etcd: None,
        with_etcd: false,
        etcd_access: Default::default(),
        managers: None,
        lease_ttl: None,
        down_out_grace: None,
        peer_grace: None,
        report_hold: None,
    };
    let running = carmine_localcluster::up(&up)?;
    for line in &running.notes {
        println!("{line}");
    }
    let result = carmine_reactor::block_on(demo(&running.dir, &a));
    println!("{}", running.down()?);
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

async fn demo(dir: &std::path::Path, a: &DemoArgs) -> Result<()> {
    let client = carmine_localcluster::connect(dir).await?;
    let pool = client.pool_id("rbd")?;
    let volumes = Volumes::new(client, pool);
    let info = volumes.create("demo", a.size, None).await?;
    println!(
        "created volume {:?}: {} in objects of {}",
        info.name,
        format_size(info.size),
        format_size(info.object_size)
    );
    let image = volumes.open("demo").await?;
    let seed = 0x00c0_ffee;

    let t = Instant::now();
    let pb = progress(Some(a.size), false, "writing pattern");
    stream::iter((0..a.size).step_by(CHUNK as usize))
        .map(|off| {
            let (image, pb) = (&image, &pb);
            async move {
                let len = CHUNK.min(a.size - off);
                let mut buf = BytesMut::zeroed(len as usize);
                pattern::fill(&mut buf, off, seed);
                image.write(off, buf.freeze()).await?;
                pb.inc(len);
                Ok::<(), anyhow::Error>(())
            }
        })
        .buffer_unordered(DEPTH)
        .try_collect::<Vec<()>>()
        .await?;
    pb.finish_and_clear();
    let w = t.elapsed();
    println!(
        "wrote   {} in {:.2} s: {:.0} MiB/s",
        format_size(a.size),
        w.as_secs_f64(),
        mib_s(a.size, w)
    );

    let t = Instant::now();
    verify(&image, a.size, seed).await?;
    let r = t.elapsed();
    println!(
        "read back and verified {} in {:.2} s: {:.0} MiB/s",
        format_size(a.size),
        r.as_secs_f64(),
        mib_s(a.size, r)
    );

    let step = Duration::from_secs_f64(a.step_secs);
    for (wl, depth) in [
        (Workload::Randwrite, 1),
        (Workload::Randwrite, 16),
        (Workload::Randread, 1),
        (Workload::Randread, 16),
    ] {
        let s = run_on_image(&image, wl, 4096, depth, Duration::from_millis(200), step).await;
        println!(
            "{:>9} 4K qd{depth:<2}: {:>8.0} IOPS, latency mean {:>6.1} us, p99 {:>6.1} us{}",
            wl.name(),
            s.iops,
            s.lat_mean_us,
            s.lat_p99_us,
            if s.errors > 0 {
                format!(", {} ERRORS", s.errors)
            } else {
                String::new()
            }
        );
        if s.errors > 0 {
            bail!("{} I/O errors during {}", s.errors, wl.name());
        }
    }
    // The random writes wrote 0xa5 blocks over the pattern; rewrite one block and check it.
    let block = Bytes::from(vec![7u8; 4096]);
    image.write(4096, block.clone()).await?;
    if image.read(4096, 4096).await? != block {
        bail!("read-after-write mismatch at offset 4096");
    }
    volumes.remove("demo").await?;
    println!("removed volume; demo passed");
    Ok(())
}

async fn verify(image: &Image, size: u64, seed: u64) -> Result<()> {
    let pb = progress(Some(size), false, "verifying");
    let mut chunks = stream::iter((0..size).step_by(CHUNK as usize))
        .map(|off| async move {
            Ok::<_, anyhow::Error>((off, image.read(off, CHUNK.min(size - off)).await?))
        })
        .buffered(DEPTH);
    while let Some(res) = chunks.next().await {
        let (off, data) = res?;
        if let Some(at) = pattern::first_mismatch(&data, off, seed) {
            bail!("data mismatch at volume offset {}", off + at);
        }
        pb.inc(data.len() as u64);
    }
    pb.finish_and_clear();
    Ok(())
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64().max(1e-9)
}
