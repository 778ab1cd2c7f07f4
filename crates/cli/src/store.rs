//! `carmine store`: format, check and inspect a native-store device offline.

use crate::size::parse_size;
use anyhow::{bail, Context, Result};
use carmine_nativestore::{
    fsck, mkfs, read_superblock, FileDevice, SyncMode, DEFAULT_SEGMENT_SIZE,
};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// Format a file or block device as a native store (destroys what it holds).
    Mkfs(MkfsArgs),
    /// Check every structure and every data block's checksum, offline.
    Fsck(DeviceArg),
    /// Print the superblock: geometry and shards.
    Stat(DeviceArg),
}

#[derive(Args, Debug)]
pub struct DeviceArg {
    /// The store's file or block device.
    #[arg(long)]
    pub device: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct MkfsArgs {
    /// The file or block device to format.
    #[arg(long)]
    pub device: PathBuf,
    /// Shards, one per OSD reactor.
    #[arg(long, default_value_t = 1)]
    pub shards: u32,
    /// Create (or grow) a regular file of this size first (e.g. 8G); sparse.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Segment size: the unit of log writing and cleaning.
    #[arg(long, default_value_t = DEFAULT_SEGMENT_SIZE as u64, value_parser = parse_size)]
    pub segment_size: u64,
}

/// Formats `a.device`, creating the file when a size is given.
pub fn format(a: &MkfsArgs) -> Result<()> {
    if let Some(size) = a.size {
        allocate_file(&a.device, size)?;
    }
    let segment = u32::try_from(a.segment_size).context("segment size too large")?;
    let sb = carmine_reactor::block_on(async {
        let dev = FileDevice::open(&a.device, SyncMode::Fdatasync).await?;
        mkfs(&dev, a.shards, segment)
            .await
            .map_err(std::io::Error::other)
    })
    .with_context(|| format!("formatting {}", a.device.display()))?;
    println!(
        "formatted {}: {} shards of {} segments of {} MiB (uuid {:032x})",
        a.device.display(),
        sb.shards.len(),
        sb.shards[0].segments,
        sb.segment_size >> 20,
        sb.uuid
    );
    Ok(())
}

/// Creates (or grows) a regular file of `size` bytes and writes zeros over the new part.
/// Why write rather than `set_len` or `fallocate`: a first write into a hole or an unwritten
/// extent makes ext4/xfs allocate or convert extents, and the `fdatasync` of every group
/// commit then waits for a filesystem journal commit. Written-once files behave like the
/// block device the store is designed for.
fn allocate_file(path: &Path, size: u64) -> Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    let have = f.metadata()?.len() / 4096 * 4096;
    if have >= size {
        return Ok(());
    }
    let chunk = carmine_nativestore::AlignedBuf::zeroed(8 << 20);
    f.seek(SeekFrom::Start(have))?;
    let mut at = have;
    while at < size {
        let n = ((size - at) as usize).min(chunk.len()).div_ceil(4096) * 4096;
        f.write_all(&chunk.as_slice()[..n])
            .with_context(|| format!("writing zeros to {}", path.display()))?;
        at += n as u64;
    }
    f.sync_all()?;
    Ok(())
}

/// Shards of an existing store, or an error naming what is wrong with it.
pub fn shard_count(device: &Path) -> Result<u32> {
    let sb = carmine_reactor::block_on(async {
        let dev = FileDevice::open(device, SyncMode::Fdatasync).await?;
        read_superblock(&dev).await.map_err(std::io::Error::other)
    })
    .with_context(|| format!("reading the store on {}", device.display()))?;
    Ok(sb.shards.len() as u32)
}

pub fn run(c: StoreCommand) -> Result<()> {
    match c {
        StoreCommand::Mkfs(a) => format(&a),
        StoreCommand::Stat(a) => {
            let sb = carmine_reactor::block_on(async {
                let dev = FileDevice::open(&a.device, SyncMode::Fdatasync).await?;
                read_superblock(&dev).await.map_err(std::io::Error::other)
            })
            .with_context(|| format!("reading {}", a.device.display()))?;
            println!("uuid          {:032x}", sb.uuid);
            println!("segment size  {} bytes", sb.segment_size);
            for (i, s) in sb.shards.iter().enumerate() {
                println!(
                    "shard {i}: {} segments at byte {} ({} MiB)",
                    s.segments,
                    s.base,
                    (s.segments as u64 * sb.segment_size as u64) >> 20
                );
            }
            Ok(())
        }
        StoreCommand::Fsck(a) => {
            let shards = shard_count(&a.device)?;
            let mut bad = 0;
            for shard in 0..shards {
                let report = carmine_reactor::block_on(async {
                    let dev = FileDevice::open(&a.device, SyncMode::Fdatasync).await?;
                    fsck(dev, shard).await.map_err(std::io::Error::other)
                })
                .with_context(|| format!("checking shard {shard}"))?;
                println!(
                    "shard {shard}: checkpoint generation {}, {} journal records replayed, \
                     {} objects, {} blocks checked, {} errors",
                    report.mount.checkpoint_generation,
                    report.mount.records_replayed,
                    report.mount.objects,
                    report.blocks_checked,
                    report.errors.len()
                );
                for e in &report.errors {
                    println!("  error: {e}");
                }
                bad += report.errors.len();
            }
            if bad > 0 {
                bail!("{bad} errors found");
            }
            println!("clean");
            Ok(())
        }
    }
}
