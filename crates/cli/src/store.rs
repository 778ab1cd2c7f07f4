//! `carmine store`: format, check and inspect a native-store device offline.

use crate::size::parse_size;
use anyhow::{bail, Context, Result};
use carmine_nativestore::{
    fsck, mkfs, read_superblock, read_superblock_copies, upgrade, DeviceLock, FileDevice, SyncMode,
    DEFAULT_SEGMENT_SIZE, FORMAT_VERSION,
};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// Format a file or block device as a native store (destroys what it holds).
    Mkfs(MkfsArgs),
    /// Check every structure and every data block's checksum, offline.
    Fsck(DeviceArg),
    /// Print the superblock: format, geometry and shards.
    Stat(DeviceArg),
    /// Bring a store of an older format to this build's, offline, after checking that every
    /// shard reads. One-way: builds of the older format then refuse the store.
    Upgrade(DeviceArg),
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
    /// Format even when the device holds data (a store, or anything else): destroys it.
    #[arg(long)]
    pub force: bool,
}

/// Formats `a.device`, creating the file when a size is given. A device that holds
/// anything but zeros is formatted only with `force`.
pub fn format(a: &MkfsArgs) -> Result<()> {
    if a.device.exists() {
        let _lock = DeviceLock::acquire(&a.device)
            .with_context(|| format!("locking {}", a.device.display()))?;
        if !a.force && !is_blank(&a.device)? {
            let what = match shard_count(&a.device) {
                Ok(n) => format!("a Carmine native store with {n} shards"),
                Err(_) => "data (not a readable Carmine store)".to_string(),
            };
            bail!(
                "{} holds {what}; refusing to format it. Pass --force to destroy it",
                a.device.display()
            );
        }
    }
    if let Some(size) = a.size {
        allocate_file(&a.device, size)?;
    }
    let _lock = DeviceLock::acquire(&a.device)
        .with_context(|| format!("locking {}", a.device.display()))?;
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

/// True when `path` holds nothing: missing, empty, or zeros only. Holes of sparse files
/// are skipped (`SEEK_DATA`), so a fresh sparse file is checked at once.
pub fn is_blank(path: &Path) -> Result<bool> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    let len = {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::End(0))?
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut at: u64 = 0;
    while at < len {
        // SAFETY: plain syscall on an fd we own.
        let data = unsafe { libc::lseek(f.as_raw_fd(), at as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                return Ok(true); // only holes from here on
            }
            // No SEEK_DATA (a block device, some filesystems): read everything.
            if at == 0 {
                use std::io::Seek;
                f.seek(std::io::SeekFrom::Start(0))?;
            }
        } else {
            at = data as u64;
            use std::io::Seek;
            f.seek(std::io::SeekFrom::Start(at))?;
        }
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|b| *b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
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
            println!("format        {}", sb.version);
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
        StoreCommand::Upgrade(a) => upgrade_store(&a.device),
        StoreCommand::Fsck(a) => {
            let _lock = DeviceLock::acquire(&a.device)
                .with_context(|| format!("locking {}", a.device.display()))?;
            let copies = carmine_reactor::block_on(async {
                let dev = FileDevice::open(&a.device, SyncMode::Fdatasync).await?;
                read_superblock_copies(&dev)
                    .await
                    .map_err(std::io::Error::other)
            })
            .with_context(|| format!("reading the store on {}", a.device.display()))?;
            let shards = copies.superblock.shards.len() as u32;
            let mut bad = 0;
            if let Some(why) = &copies.primary_damaged {
                println!("  error: primary superblock damaged ({why}); the backup copy is good");
                bad += 1;
            }
            if let Some(why) = &copies.backup_problem {
                println!("  warning: {why}");
            }
            for shard in 0..shards {
                let report = carmine_reactor::block_on(async {
                    let dev = FileDevice::open(&a.device, SyncMode::Fdatasync).await?;
                    fsck(dev, shard).await.map_err(std::io::Error::other)
                })
                .with_context(|| format!("checking shard {shard}"))?;
                println!(
                    "shard {shard}: checkpoint generation {} ({} metadata tree nodes), {} \
                     journal records replayed, {} objects, {} blocks checked, {} errors",
                    report.mount.checkpoint_generation,
                    report.mount.metadata_nodes,
                    report.mount.records_replayed,
                    report.mount.objects,
                    report.blocks_checked,
                    report.errors.len()
                );
                if report.mount.damaged_blocks > 0 {
                    println!(
                        "  {} damaged data blocks found in the journal (they read as corrupt)",
                        report.mount.damaged_blocks
                    );
                }
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

/// `carmine store upgrade`: every shard must mount read-only (its checkpoint and journal
/// readable by this build) before the superblock changes.
fn upgrade_store(device: &Path) -> Result<()> {
    let _lock =
        DeviceLock::acquire(device).with_context(|| format!("locking {}", device.display()))?;
    let sb = carmine_reactor::block_on(async {
        let dev = FileDevice::open(device, SyncMode::Fdatasync).await?;
        read_superblock(&dev).await.map_err(std::io::Error::other)
    })
    .with_context(|| format!("reading the store on {}", device.display()))?;
    if sb.version == FORMAT_VERSION {
        println!("{} is already in format {FORMAT_VERSION}", device.display());
        return Ok(());
    }
    for shard in 0..sb.shards.len() as u32 {
        let report = carmine_reactor::block_on(async {
            let dev = FileDevice::open(device, SyncMode::Fdatasync).await?;
            fsck(dev, shard).await.map_err(std::io::Error::other)
        })
        .with_context(|| format!("reading shard {shard} before the upgrade; nothing changed"))?;
        if !report.errors.is_empty() {
            bail!(
                "shard {shard} has {} errors (see `carmine store fsck`); not upgrading",
                report.errors.len()
            );
        }
        // Refused now, while the current build can still free space: after the upgrade the
        // store could not be mounted for writing by either build.
        if let Some(why) = report.checkpoint_room {
            bail!(
                "shard {shard}: {why}; delete some data with the current build first \
                 (nothing changed)"
            );
        }
    }
    let old = carmine_reactor::block_on(async {
        let dev = FileDevice::open(device, SyncMode::Fdatasync).await?;
        upgrade(&dev).await.map_err(std::io::Error::other)
    })
    .with_context(|| format!("upgrading {}", device.display()))?;
    println!("{}: format {old} -> {FORMAT_VERSION}", device.display());
    Ok(())
}
