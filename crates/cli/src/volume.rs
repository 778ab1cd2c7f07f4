//! `carmine volume …`: image management and scriptable data transfer.

use crate::size::{format_size, parse_size};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use carmine_localcluster::{connect, DirArg};
use carmine_volume::{Image, Volumes};
use clap::{Args, Subcommand};
use futures::stream::{self, StreamExt, TryStreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{Read, Write};

/// Bytes moved per request by `volume write|read`, and how many are in flight.
const TRANSFER_CHUNK: u64 = 4 << 20;
const TRANSFER_DEPTH: usize = 8;

#[derive(Args, Debug, Clone)]
pub struct Target {
    #[command(flatten)]
    pub dir: DirArg,
    /// Pool holding the volumes.
    #[arg(long, default_value = "rbd")]
    pub pool: String,
}

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Create a volume.
    Create {
        name: String,
        /// Size, e.g. 10G.
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Bytes per data object (power of two, 4K..16M).
        #[arg(long, value_parser = parse_size)]
        object_size: Option<u64>,
        #[command(flatten)]
        target: Target,
    },
    /// List volumes.
    Ls {
        #[command(flatten)]
        target: Target,
    },
    /// Show a volume's size, object size and id.
    Info {
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Grow or shrink a volume; shrinking discards the data past the new end.
    Resize {
        name: String,
        #[arg(long, value_parser = parse_size)]
        size: u64,
        #[command(flatten)]
        target: Target,
    },
    /// Remove a volume and its data.
    Rm {
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Show or break a volume's exclusive lock.
    #[command(subcommand)]
    Lock(LockCommand),
    /// Copy a volume into a new one, in this pool or --to-pool (e.g. from a pool of one copy
    /// into a pool of copies). The source is locked meanwhile (stop its clients first);
    /// holes stay holes.
    Copy {
        name: String,
        /// The new volume's name [the source's: then give --to-pool].
        to_name: Option<String>,
        /// Pool of the new volume [the source's].
        #[arg(long)]
        to_pool: Option<String>,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Write a file (or stdin with "-") into a volume at --offset.
    Write(TransferArgs),
    /// Read from a volume into a file (or stdout with "-").
    Read(TransferArgs),
}

#[derive(Subcommand)]
pub enum LockCommand {
    /// Who holds the volume's exclusive lock.
    Show {
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Break the lock now: the holder is fenced (every later request of it is refused by the
    /// OSDs) and the lock removed. Only for a holder known to be gone: a live one loses the
    /// volume mid-write.
    Break {
        name: String,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Args, Debug)]
pub struct TransferArgs {
    pub name: String,
    /// File to read from (write) or write to (read); "-" for stdin/stdout.
    #[arg(long, short, default_value = "-")]
    pub file: String,
    /// Byte offset in the volume.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub offset: u64,
    /// Bytes to read (default: to the end of the volume).
    #[arg(long, value_parser = parse_size)]
    pub length: Option<u64>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    #[command(flatten)]
    pub target: Target,
}

async fn volumes(t: &Target) -> Result<Volumes> {
    let client = connect(&t.dir.dir).await?;
    let pool = client.pool_id(&t.pool)?;
    Ok(Volumes::new(client, pool))
}

pub fn run(cmd: VolumeCommand) -> Result<()> {
    carmine_reactor::block_on(async move {
        match cmd {
            VolumeCommand::Create {
                name,
                size,
                object_size,
                target,
            } => {
                let info = volumes(&target)
                    .await?
                    .create(&name, size, object_size)
                    .await?;
                println!(
                    "created {} ({}, objects of {})",
                    info.name,
                    format_size(info.size),
                    format_size(info.object_size)
                );
            }
            VolumeCommand::Ls { target } => {
                for n in volumes(&target).await?.list().await? {
                    println!("{n}");
                }
            }
            VolumeCommand::Info { name, target } => {
                let volumes = volumes(&target).await?;
                let i = volumes.info(&name).await?;
                println!("name: {}\nid: {}\nsize: {} ({} bytes)\nobject_size: {}\nobjects: {}\nfeatures: {:#x}",
                    i.name, i.id, format_size(i.size), i.size, format_size(i.object_size), i.object_count(), i.features);
                if i.is_incomplete() {
                    println!("state: incomplete copy (being copied, or the copy was cut short): it opens only once removed and copied again");
                }
                println!("lock: {}", describe_lock(volumes.lock_holder(&name).await?));
            }
            VolumeCommand::Resize { name, size, target } => {
                let i = volumes(&target).await?.resize(&name, size).await?;
                println!("resized {} to {}", i.name, format_size(i.size));
            }
            VolumeCommand::Rm { name, target } => {
                volumes(&target).await?.remove(&name).await?;
                println!("removed {name}");
            }
            VolumeCommand::Lock(LockCommand::Show { name, target }) => {
                let holder = volumes(&target).await?.lock_holder(&name).await?;
                println!("{}", describe_lock(holder));
            }
            VolumeCommand::Lock(LockCommand::Break { name, target }) => {
                match volumes(&target).await?.break_lock(&name).await? {
                    Some(l) => println!(
                        "broke the lock of {name}: {} (client {:#x}) is fenced",
                        l.holder, l.owner
                    ),
                    None => println!(
                        "{name} was not locked (or its lock record was damaged and is removed)"
                    ),
                }
            }
            VolumeCommand::Copy {
                name,
                to_name,
                to_pool,
                quiet,
                target,
            } => copy(&name, to_name, to_pool, quiet, &target).await?,
            VolumeCommand::Write(a) => write(a).await?,
            VolumeCommand::Read(a) => read(a).await?,
        }
        Ok(())
    })
}

fn describe_lock(l: Option<carmine_volume::LockInfo>) -> String {
    match l {
        Some(l) => format!(
            "held by {} (client {:#x}, lease {:?}, renewed {} times)",
            l.holder, l.owner, l.lease, l.renewals
        ),
        None => "none".into(),
    }
}

pub fn progress(total: Option<u64>, quiet: bool, what: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = match total {
        Some(t) => ProgressBar::new(t).with_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{msg} {spinner} {bytes} {bytes_per_sec}")
                .expect("valid template"),
        ),
    };
    pb.set_message(what.to_string());
    pb
}

async fn copy(
    name: &str,
    to_name: Option<String>,
    to_pool: Option<String>,
    quiet: bool,
    target: &Target,
) -> Result<()> {
    let pool = to_pool.unwrap_or_else(|| target.pool.clone());
    let to_name = to_name.unwrap_or_else(|| name.to_string());
    if pool == target.pool && to_name == name {
        bail!("copying {name} onto itself: give another name, or --to-pool");
    }
    let from = volumes(target).await?;
    let to = Volumes::new(from.client().clone(), from.client().pool_id(&pool)?);
    let size = from.info(name).await?.size;
    let pb = progress(Some(size), quiet, &format!("copying {name}"));
    let copied = from
        .copy_to(name, &to, &to_name, TRANSFER_DEPTH, |n| pb.inc(n))
        .await?;
    pb.finish_and_clear();
    println!(
        "copied {}/{name} to {pool}/{to_name}: {} objects, {} ({} holes left as holes)",
        target.pool,
        copied.objects,
        format_size(copied.bytes),
        copied.holes
    );
    Ok(())
}

/// Reads from `input` into chunks and keeps `TRANSFER_DEPTH` chunk writes in flight.
async fn write(a: TransferArgs) -> Result<()> {
    let image = volumes(&a.target).await?.open(&a.name).await?;
    let res = write_into(&image, &a).await;
    // Unlock even after a failure, so the next writer need not wait out the lease.
    let closed = image.close().await;
    res?;
    Ok(closed?)
}

async fn write_into(image: &Image, a: &TransferArgs) -> Result<()> {
    let (mut input, total): (Box<dyn Read>, Option<u64>) = if a.file == "-" {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let f = std::fs::File::open(&a.file).with_context(|| format!("opening {}", a.file))?;
        let len = f.metadata()?.len();
        (Box::new(f), Some(len))
    };
    if let Some(t) = total {
        if a.offset.saturating_add(t) > image.size() {
            bail!(
                "{} bytes at offset {} do not fit in {} ({} bytes)",
                t,
                a.offset,
                a.name,
                image.size()
            );
        }
    }
    let pb = progress(total, a.quiet, &format!("writing {}", a.name));
    let mut off = a.offset;
    let chunks = std::iter::from_fn(|| {
        let mut buf = vec![0u8; TRANSFER_CHUNK as usize];
        match read_full(&mut input, &mut buf) {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                let at = off;
                off += n as u64;
                Some(Ok((at, Bytes::from(buf))))
            }
            Err(e) => Some(Err(anyhow::Error::from(e).context("reading input"))),
        }
    });
    let written: u64 = stream::iter(chunks)
        .map(|c| {
            let image = image.clone();
            let pb = pb.clone();
            async move {
                let (at, data) = c?;
                let n = data.len() as u64;
                image.write(at, data).await?;
                pb.inc(n);
                Ok::<u64, anyhow::Error>(n)
            }
        })
        .buffer_unordered(TRANSFER_DEPTH)
        .try_fold(0, |acc, n| async move { Ok(acc + n) })
        .await?;
    image.flush().await?;
    pb.finish_and_clear();
    eprintln!("wrote {written} bytes to {} at offset {}", a.name, a.offset);
    Ok(())
}

fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Reads keep `TRANSFER_DEPTH` chunks in flight; output stays in order.
async fn read(a: TransferArgs) -> Result<()> {
    let image: Image = volumes(&a.target).await?.open_read_only(&a.name).await?;
    let end = match a.length {
        Some(l) => a
            .offset
            .checked_add(l)
            .context("offset + length overflows")?,
        None => image.size(),
    };
    if a.offset > end || end > image.size() {
        bail!(
            "range {}..{} is beyond the end of {} ({} bytes)",
            a.offset,
            end,
            a.name,
            image.size()
        );
    }
    let mut out: Box<dyn Write> = if a.file == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(&a.file).with_context(|| format!("creating {}", a.file))?)
    };
    let pb = progress(
        Some(end - a.offset),
        a.quiet || a.file == "-",
        &format!("reading {}", a.name),
    );
    let offsets = (a.offset..end).step_by(TRANSFER_CHUNK as usize);
    let mut chunks = stream::iter(offsets)
        .map(|at| {
            let image = image.clone();
            async move { image.read(at, TRANSFER_CHUNK.min(end - at)).await }
        })
        .buffered(TRANSFER_DEPTH);
    while let Some(data) = chunks.next().await {
        let data = data?;
        out.write_all(&data).context("writing output")?;
        pb.inc(data.len() as u64);
    }
    out.flush()?;
    pb.finish_and_clear();
    Ok(())
}
