//! mkfs, mount (checkpoint load + journal replay) and fsck.

use crate::cache::BlockCache;
use crate::delta::Delta;
use crate::device::{AlignedBuf, BlockDevice, BLOCK};
use crate::error::{JournalError, MountError};
use crate::format::{
    CheckpointSlot, FormatError, JournalPos, RecordHeader, SegmentHeader, SegmentKind, Superblock,
    FORMAT_VERSION, SHARD_ALIGN, SHARD_HEADER_BLOCKS, SUPER_BACKUP_OFFSET,
};
use crate::index::{Geometry, Index};
use crate::journal::JournalState;
use crate::journal::{self, parse_record, Notify};
use crate::metatree::MetaTree;
use crate::segments::{Seg, SegKind, SegmentTable};
use crate::store::{NativeConfig, NativeStats, NativeStore, State};
use bytes::Bytes;
use carmine_types::{crc32c, Decoder};
use std::cell::RefCell;
use std::collections::BTreeSet;

/// What mount found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountReport {
    pub checkpoint_generation: u64,
    /// Nodes of the checkpoint's metadata tree (0: the checkpoint was a blob, format 3).
    pub metadata_nodes: u64,
    /// Record bytes of the object bodies held in memory once the checkpoint was loaded (up
    /// to the object cache, and those the replay changes), and the bodies paged out then.
    pub bodies_loaded_bytes: u64,
    pub bodies_paged_out_at_load: u64,
    pub records_replayed: u64,
    pub journal_segments_replayed: u32,
    pub objects: u64,
    pub live_blocks: u64,
    /// Data blocks of acknowledged records found damaged during replay (they read as
    /// corrupt; everything else is intact).
    pub damaged_blocks: u64,
}

fn io_err(what: &'static str, offset: u64) -> impl FnOnce(std::io::Error) -> MountError {
    move |source| MountError::Io {
        what,
        offset,
        source,
    }
}

async fn read_at<D: BlockDevice>(
    dev: &D,
    len: usize,
    off: u64,
    what: &'static str,
) -> Result<AlignedBuf, MountError> {
    let (res, buf) = dev.read_at(AlignedBuf::new(len), off).await;
    res.map_err(io_err(what, off))?;
    Ok(buf)
}

async fn read_block<D: BlockDevice>(dev: &D, off: u64) -> Result<AlignedBuf, MountError> {
    read_at(dev, BLOCK, off, "reading a block").await
}

async fn write_block<D: BlockDevice>(dev: &D, off: u64, data: &[u8]) -> Result<(), MountError> {
    let mut buf = AlignedBuf::new(BLOCK);
    buf.extend_from_slice(data);
    buf.pad_to_block();
    let (res, _) = dev.write_at(buf, off).await;
    res.map_err(io_err("writing a block", off))
}

/// The superblock, from the primary copy or, when that one is damaged, from the backup
/// (with a warning). A superblock of a newer format is refused, never bypassed.
pub async fn read_superblock<D: BlockDevice>(dev: &D) -> Result<Superblock, MountError> {
    Ok(read_superblock_copies(dev).await?.superblock)
}

/// Brings a store of an older format to this build's, in place, and returns the version it
/// had. Every structure of the older versions stays readable, so only the superblock copies
/// change, both rewritten from the one a mount would use: the backup first, then the
/// primary, each synced (a crash in between leaves a primary of the old version, which
/// mount refuses and a rerun finishes).
pub async fn upgrade<D: BlockDevice>(dev: &D) -> Result<u32, MountError> {
    let copies = read_superblock_copies(dev).await?;
    let old = copies.superblock.version;
    if old == FORMAT_VERSION && copies.primary_damaged.is_none() && copies.backup_problem.is_none()
    {
        return Ok(old);
    }
    let sb = Superblock {
        version: FORMAT_VERSION,
        ..copies.superblock
    };
    for at in [SUPER_BACKUP_OFFSET, 0] {
        write_block(dev, at, &sb.encode()).await?;
        dev.sync()
            .await
            .map_err(io_err("syncing the superblock", at))?;
    }
    Ok(old)
}

/// What the two superblock copies hold.
#[derive(Clone, Debug)]
pub struct SuperblockCopies {
    pub superblock: Superblock,
    /// Why the primary copy could not be used (the backup was), if it could not.
    pub primary_damaged: Option<String>,
    /// Why the backup does not match the primary, if it does not (version 1 stores have
    /// none).
    pub backup_problem: Option<String>,
}

pub async fn read_superblock_copies<D: BlockDevice>(
    dev: &D,
) -> Result<SuperblockCopies, MountError> {
    if dev.size() < SHARD_ALIGN {
        return Err(MountError::DeviceTooSmall { size: dev.size() });
    }
    let primary = Superblock::decode(read_block(dev, 0).await?.full());
    let backup = Superblock::decode(read_block(dev, SUPER_BACKUP_OFFSET).await?.full());
    let copies = match (primary, backup) {
        // A newer format is a reason to stop, not to look elsewhere.
        (Err(e @ FormatError::Version { .. }), _) => return Err(MountError::NewerFormat(e)),
        (Ok(sb), backup) => {
            let backup_problem = match backup {
                Ok(b) if b == sb => None,
                Ok(_) => Some("the backup superblock differs from the primary".to_string()),
                Err(e) => Some(format!("backup superblock: {e}")),
            };
            SuperblockCopies {
                superblock: sb,
                primary_damaged: None,
                backup_problem,
            }
        }
        (Err(e), Ok(sb)) => {
            tracing::warn!("primary superblock unusable ({e}); mounting from the backup copy");
            SuperblockCopies {
                superblock: sb,
                primary_damaged: Some(e.to_string()),
                backup_problem: None,
            }
        }
        (Err(FormatError::Magic(_)), Err(FormatError::Magic(_))) => {
            return Err(MountError::NotAStore)
        }
        (Err(primary), Err(backup)) => {
            return Err(MountError::SuperblockDamaged { primary, backup })
        }
    };
    let sb = &copies.superblock;
    for (i, s) in sb.shards.iter().enumerate() {
        let end = (s.segments as u64)
            .checked_mul(sb.segment_size as u64)
            .and_then(|b| b.checked_add(SHARD_HEADER_BLOCKS * BLOCK as u64))
            .and_then(|b| b.checked_add(s.base));
        if s.base < SHARD_ALIGN || end.is_none_or(|end| end > dev.size()) {
            return Err(MountError::Layout(format!(
                "shard {i} (at byte {}, {} segments) does not fit the device's {} bytes",
                s.base,
                s.segments,
                dev.size()
            )));
        }
        if s.segments < crate::format::SEGMENTS_MIN {
            return Err(MountError::Layout(format!(
                "shard {i} has only {} segments",
                s.segments
            )));
        }
    }
    Ok(copies)
}

/// Formats `dev` with `shards` shards of `segment_size`-byte segments, each with an empty
/// checkpoint. Everything of an earlier format is ignored from then on (new uuid).
pub async fn mkfs<D: BlockDevice>(
    dev: &D,
    shards: u32,
    segment_size: u32,
) -> Result<Superblock, MountError> {
    let sb = Superblock::layout(dev.size(), shards, segment_size, rand::random())
        .map_err(MountError::Layout)?;
    // Invalidate both old superblock copies first, so a crash mid-mkfs leaves no half-new
    // store (and no old backup that would describe overwritten shards).
    write_block(dev, 0, &[0u8; BLOCK]).await?;
    write_block(dev, SUPER_BACKUP_OFFSET, &[0u8; BLOCK]).await?;
    dev.sync().await.map_err(io_err("syncing the device", 0))?;
    for (i, layout) in sb.shards.iter().enumerate() {
        let geo = Geometry {
            first_block: SHARD_HEADER_BLOCKS,
            segment_blocks: segment_size as u64 / BLOCK as u64,
            segments: layout.segments,
        };
        let blob = Index::new(geo).encode();
        let header = SegmentHeader {
            uuid: sb.uuid,
            shard: i as u32,
            kind: SegmentKind::Checkpoint,
            seq: 1,
            nonce: rand::random(),
        };
        let mut buf = AlignedBuf::new(BLOCK + blob.len());
        buf.extend_from_slice(&header.encode());
        buf.pad_to_block();
        buf.extend_from_slice(&blob);
        buf.pad_to_block();
        let seg0 = layout.base + geo.segment_start(0) * BLOCK as u64;
        let (res, _) = dev.write_at(buf, seg0).await;
        res.map_err(io_err("writing the initial checkpoint", seg0))?;
        let slot = CheckpointSlot {
            shard: i as u32,
            uuid: sb.uuid,
            generation: 1,
            journal: JournalPos {
                segment: 1,
                segment_seq: 2,
                block: 1,
                record_seq: 1,
            },
            segment_seq_max: 2,
            blob_len: blob.len() as u64,
            blob_crc: crc32c(&blob),
            segments: vec![0],
            tree_root: None,
        };
        write_block(dev, layout.base + BLOCK as u64, &slot.encode()).await?;
        write_block(dev, layout.base, &[0u8; BLOCK]).await?;
    }
    dev.sync().await.map_err(io_err("syncing the device", 0))?;
    write_block(dev, SUPER_BACKUP_OFFSET, &sb.encode()).await?;
    write_block(dev, 0, &sb.encode()).await?;
    dev.sync().await.map_err(io_err("syncing the device", 0))?;
    Ok(sb)
}

impl<D: BlockDevice> NativeStore<D> {
    /// Mounts shard `shard` of a formatted device: loads the newest checkpoint, replays the
    /// journal after it, then writes a fresh checkpoint so the next mount starts from here.
    pub async fn mount(dev: D, shard: u32, config: NativeConfig) -> Result<Self, MountError> {
        Ok(Self::open(dev, shard, config, true).await?.0)
    }

    /// As [`NativeStore::mount`], with what the mount found and held.
    pub async fn mount_reporting(
        dev: D,
        shard: u32,
        config: NativeConfig,
    ) -> Result<(Self, MountReport), MountError> {
        Self::open(dev, shard, config, true).await
    }

    pub(crate) async fn open(
        dev: D,
        shard: u32,
        config: NativeConfig,
        writable: bool,
    ) -> Result<(Self, MountReport), MountError> {
        let sb = read_superblock(&dev).await?;
        if writable && sb.version < FORMAT_VERSION {
            return Err(MountError::OlderFormat { found: sb.version });
        }
        let layout = *sb
            .shards
            .get(shard as usize)
            .ok_or(MountError::NoSuchShard {
                shard,
                shards: sb.shards.len(),
            })?;
        let geo = Geometry {
            first_block: SHARD_HEADER_BLOCKS,
            segment_blocks: sb.segment_size as u64 / BLOCK as u64,
            segments: layout.segments,
        };
        let base = layout.base;
        let seg_off = |s: u32| base + geo.segment_start(s) * BLOCK as u64;

        let mut slot: Option<CheckpointSlot> = None;
        for i in 0..2 {
            let block = read_block(&dev, base + i * BLOCK as u64).await?;
            if let Ok(s) = CheckpointSlot::decode(block.full()) {
                if s.uuid == sb.uuid
                    && s.shard == shard
                    && slot.as_ref().is_none_or(|b| s.generation > b.generation)
                {
                    slot = Some(s);
                }
            }
        }
        let slot = slot.ok_or(MountError::NoCheckpoint { shard })?;
        let bad_checkpoint = |detail: String| MountError::Checkpoint {
            generation: slot.generation,
            detail,
        };

        let per_seg = (geo.segment_blocks as usize - 1) * BLOCK;
        // Validate before allocating or indexing: the slot is checksummed, not trusted.
        if let Some(&s) = slot.segments.iter().find(|&&s| s >= geo.segments) {
            return Err(bad_checkpoint(format!(
                "names segment {s}; the shard has {}",
                geo.segments
            )));
        }
        if slot.blob_len > (slot.segments.len() * per_seg) as u64 {
            return Err(bad_checkpoint(format!(
                "claims {} bytes in {} segments",
                slot.blob_len,
                slot.segments.len()
            )));
        }
        if slot.journal.segment >= geo.segments
            || slot.journal.block == 0
            || slot.journal.block as u64 > geo.segment_blocks
            || slot.journal.record_seq == 0
        {
            return Err(bad_checkpoint(format!(
                "impossible journal position {:?}",
                slot.journal
            )));
        }
        let mut headers: Vec<Option<SegmentHeader>> = Vec::with_capacity(geo.segments as usize);
        // Written segments whose header fails its checks (not another store's or shard's: a
        // device formatted over an old store keeps the old headers until the cleaner reuses
        // their segments).
        let mut damaged: Vec<u32> = Vec::new();
        for s in 0..geo.segments {
            let block = read_block(&dev, seg_off(s)).await?;
            let decoded = SegmentHeader::decode(block.full());
            if decoded.is_err() && block.full().iter().any(|&b| b != 0) {
                damaged.push(s);
            }
            headers.push(
                decoded
                    .ok()
                    .filter(|h| h.uuid == sb.uuid && h.shard == shard),
            );
        }
        let seq_max = headers
            .iter()
            .flatten()
            .map(|h| h.seq)
            .max()
            .unwrap_or(0)
            .max(slot.segment_seq_max);

        // Journal segments from the checkpoint's on, in the order they were written.
        let mut journal: Vec<(u64, u32, u64)> = headers
            .iter()
            .enumerate()
            .filter_map(|(s, h)| match h {
                Some(h) if h.kind == SegmentKind::Journal && h.seq >= slot.journal.segment_seq => {
                    Some((h.seq, s as u32, h.nonce))
                }
                _ => None,
            })
            .collect();
        journal.sort_unstable();
        let mut report = MountReport {
            checkpoint_generation: slot.generation,
            ..MountReport::default()
        };
        let Replay {
            records,
            next_record: expected,
            segments: replayed,
            durable_mark,
        } = read_journal(&dev, shard, geo, &slot, &journal, &seg_off, &mut report).await?;
        let mut needed = crate::metatree::Names::new();
        for (cid, oid) in records.iter().flat_map(|(_, d)| d).flat_map(Delta::objects) {
            needed.entry(cid).or_default().insert(oid.to_owned());
        }
        let (mut index, meta) = match slot.tree_root {
            Some(root) => crate::mount_walk::load_tree(
                &dev,
                base,
                geo,
                (root, slot.generation),
                config.object_cache_bytes,
                needed,
            )
            .await
            .map_err(bad_checkpoint)?,
            None => (
                load_blob(&dev, &slot, geo, sb.uuid, &seg_off)
                    .await
                    .map_err(|e| match e {
                        BlobError::Mount(e) => e,
                        BlobError::Bad(detail) => bad_checkpoint(detail),
                    })?,
                MetaTree::without_tree(geo.segments),
            ),
        };

        report.metadata_nodes = meta.nodes;
        report.bodies_loaded_bytes = index.residency.resident_bytes;
        report.bodies_paged_out_at_load = index.residency.paged_out;
        for (record, deltas) in records {
            for delta in &deltas {
                index.apply(delta).map_err(|e| MountError::Journal {
                    record,
                    source: JournalError::Index(e),
                })?;
            }
            index.take_freed().for_each(drop);
        }
        if expected <= durable_mark {
            return Err(MountError::AcknowledgedRecordLost {
                record: expected,
                durable_mark,
            });
        }
        // A segment whose header fails its checksum is left out of the journal above, yet
        // only a crash that tore the header's first write is harmless (nothing in it was
        // acknowledged then). A bit flipped since would drop every acknowledged record in it,
        // and after it, without a trace: its records' own durable marks tell the two apart.
        for s in damaged {
            if slot.segments.contains(&s) || meta.live_in(s) > 0 {
                continue;
            }
            let len = geo.segment_blocks as usize * BLOCK;
            let area = read_at(
                &dev,
                len,
                seg_off(s),
                "reading a segment with a damaged header",
            )
            .await?;
            let mark = records_mark(area.full(), expected);
            if mark >= expected {
                return Err(MountError::DamagedSegmentHeader {
                    segment: s,
                    record: expected,
                    durable_mark: mark,
                });
            }
        }
        report.journal_segments_replayed = replayed.len() as u32;
        report.objects = index.objects;
        report.live_blocks = index.live_blocks;

        let mut segs = Vec::with_capacity(geo.segments as usize);
        for s in 0..geo.segments {
            let live = index.segment_live[s as usize];
            let h = headers[s as usize];
            let kind = if slot.segments.contains(&s) || meta.live_in(s) > 0 {
                if live > 0 {
                    return Err(MountError::LiveBlocksOutsideJournal {
                        segment: s,
                        live,
                        detail: format!("it holds checkpoint metadata too; checkpoint {slot:?}"),
                    });
                }
                SegKind::Checkpoint
            } else if live > 0 || replayed.contains(&s) {
                if live > 0 && h.is_none_or(|h| h.kind != SegmentKind::Journal) {
                    return Err(MountError::LiveBlocksOutsideJournal {
                        segment: s,
                        live,
                        detail: format!("header {h:?}, checkpoint {slot:?}, journal {journal:?}"),
                    });
                }
                SegKind::Journal
            } else {
                SegKind::Free
            };
            segs.push(Seg {
                kind,
                seq: h.map_or(0, |h| h.seq),
            });
        }
        let reserve_segments = reserve_for(geo.segments, config.throttle_pct);
        let store = NativeStore {
            dev,
            shard,
            uuid: sb.uuid,
            base,
            geo,
            config,
            reserve_segments,
            apply_lock: carmine_reactor::FifoLock::default(),
            st: RefCell::new(State {
                index,
                segments: SegmentTable::new(segs, seq_max),
                journal: JournalState::after_replay(
                    slot.journal.segment,
                    slot.journal.segment_seq,
                    expected,
                ),
                cache: BlockCache::new(config.cache_bytes),
                slot,
                meta,
                failed: None,
                stats: NativeStats::default(),
            }),
            changed: Notify::default(),
            commit_wanted: Notify::default(),
            client_ops: std::cell::Cell::new(0),
        };
        if writable {
            {
                let mut st = store.st.borrow_mut();
                store
                    .roll_segment(&mut st)
                    .map_err(|source| MountError::Store {
                        what: "opening the journal",
                        source,
                    })?;
            }
            store
                .checkpoint()
                .await
                .map_err(|source| MountError::Store {
                    what: "post-mount checkpoint",
                    source,
                })?;
            store
                .restore_reserve()
                .await
                .map_err(|source| MountError::Store {
                    what: "post-mount cleaning",
                    source,
                })?;
        }
        tracing::info!(shard, ?report, "native store shard mounted");
        Ok((store, report))
    }

    /// Checkpoints and waits for everything; the shard can then be dropped and remounted
    /// without replay.
    pub async fn close(&self) -> carmine_store::Result<()> {
        self.check_failed()?;
        let _guard = self.apply_lock.lock().await;
        self.checkpoint().await
    }

    /// Forces a checkpoint now (normally the journal length triggers one).
    pub async fn checkpoint_now(&self) -> carmine_store::Result<()> {
        self.check_failed()?;
        let _guard = self.apply_lock.lock().await;
        self.checkpoint().await
    }
}

enum BlobError {
    Mount(MountError),
    /// What is wrong with the checkpoint.
    Bad(String),
}

/// Reads a checkpoint blob (formats 1 to 3) and decodes it. The slot's segments and length
/// were checked against the geometry.
async fn load_blob<D: BlockDevice>(
    dev: &D,
    slot: &CheckpointSlot,
    geo: Geometry,
    uuid: u128,
    seg_off: &impl Fn(u32) -> u64,
) -> Result<Index, BlobError> {
    let per_seg = (geo.segment_blocks as usize - 1) * BLOCK;
    let mut blob = Vec::with_capacity(slot.blob_len as usize);
    for &s in &slot.segments {
        let chunk = (slot.blob_len as usize - blob.len()).min(per_seg);
        let buf = read_at(
            dev,
            BLOCK + chunk,
            seg_off(s),
            "reading a checkpoint segment",
        )
        .await
        .map_err(BlobError::Mount)?;
        let h = SegmentHeader::decode(&buf.full()[..BLOCK])
            .map_err(|e| BlobError::Bad(format!("segment {s}: {e}")))?;
        if h.kind != SegmentKind::Checkpoint || h.uuid != uuid {
            return Err(BlobError::Bad(format!(
                "segment {s} is not a checkpoint of this store"
            )));
        }
        blob.extend_from_slice(&buf.full()[BLOCK..BLOCK + chunk]);
    }
    if blob.len() as u64 != slot.blob_len || crc32c(&blob) != slot.blob_crc {
        return Err(BlobError::Bad("fails its checksum".into()));
    }
    Index::decode(Bytes::from(blob), geo).map_err(|e| BlobError::Bad(e.to_string()))
}

/// The journal after a checkpoint, parsed: what a mount replays.
struct Replay {
    /// Records to replay, in order: sequence number and deltas.
    records: Vec<(u64, Vec<Delta>)>,
    /// The sequence number the next record takes.
    next_record: u64,
    /// Journal segments the replay went through: the first, and each later one that
    /// continued the journal; never one in which a damaged record ends it.
    segments: BTreeSet<u32>,
    /// Every record up to it was acknowledged, as later records say.
    durable_mark: u64,
}

/// Reads the journal from the checkpoint's position on (`journal`: its segments in the order
/// they were written), one segment in memory at a time: records are parsed (their data
/// checked) as they come, and every block is looked at for a record header whose durable
/// mark says how far records were acknowledged. A record with damaged data blocks ends the
/// journal — the torn tail of a crash — unless that mark covers it (acknowledged, the
/// blocks went bad since: they will read as corrupt); so records after a damaged one are
/// kept only until the whole journal has been read and the mark is known.
async fn read_journal<D: BlockDevice>(
    dev: &D,
    shard: u32,
    geo: Geometry,
    slot: &CheckpointSlot,
    journal: &[(u64, u32, u64)],
    seg_off: &dyn Fn(u32) -> u64,
    report: &mut MountReport,
) -> Result<Replay, MountError> {
    let mut durable_mark = 0;
    let mut expected = slot.journal.record_seq;
    let mut records: Vec<(u64, Vec<Delta>)> = Vec::new();
    // Records with damaged data blocks: index in `records`, and the blocks.
    let mut damaged: Vec<(usize, Vec<u64>)> = Vec::new();
    // A record whose checksummed metadata does not decode, and what its position in
    // `records` would have been: an error unless the journal ends before it.
    let mut undecodable: Option<(usize, MountError)> = None;
    // Per segment parsed: the segment, whether it continued the journal, and how many
    // records there were once it was done.
    let mut parsed: Vec<(u32, bool, usize)> = Vec::new();
    let mut chain = true;
    for (k, &(seq, s, nonce)) in journal.iter().enumerate() {
        let first_block = if k == 0 {
            if seq != slot.journal.segment_seq || s != slot.journal.segment {
                break;
            }
            slot.journal.block as u64
        } else {
            1
        };
        let len = (geo.segment_blocks - first_block) as usize * BLOCK;
        let off = seg_off(s) + first_block * BLOCK as u64;
        let buf = read_at(dev, len, off, "reading a journal segment").await?;
        let area = buf.full();
        // A damaged record at or below the mark is corruption, not the torn tail of a crash.
        durable_mark = area
            .chunks_exact(BLOCK)
            .filter_map(|b| journal::parse_header(b, nonce))
            .filter(|h| h.seq >= slot.journal.record_seq)
            .map(|h| h.durable_seq)
            .fold(durable_mark, u64::max);
        if !chain {
            continue;
        }
        let mut at = 0;
        let mut any = false;
        while let Some(rec) = parse_record(&area[at..], expected, nonce) {
            let deltas = match decode_deltas(rec.meta) {
                Ok(d) => d,
                Err(e) => {
                    let error = MountError::Journal {
                        record: expected,
                        source: JournalError::Decode(e),
                    };
                    undecodable = Some((records.len(), error));
                    chain = false;
                    break;
                }
            };
            let rec_block = first_block + (at / BLOCK) as u64;
            let rec_paddr = geo.segment_start(s) + rec_block;
            let bad = bad_data_blocks(&deltas, rec_paddr, rec.data);
            if !bad.is_empty() {
                damaged.push((records.len(), bad));
            }
            records.push((expected, deltas));
            at += rec.header.total_blocks as usize * BLOCK;
            expected += 1;
            any = true;
        }
        parsed.push((s, any || k == 0, records.len()));
        if !chain {
            continue;
        }
        if !any && k > 0 {
            // The next segment does not continue the journal: the tail ends here.
            chain = false;
        }
    }
    // The first damaged record the mark does not cover ends the journal; the segment it
    // is in does not count as replayed (its records before it still apply).
    let end = damaged
        .iter()
        .find(|(i, _)| records[*i].0 > durable_mark)
        .map(|(i, _)| *i);
    if let Some((_, error)) = undecodable.filter(|_| end.is_none()) {
        return Err(error);
    }
    let mut segments = BTreeSet::new();
    let mut before = 0;
    for &(s, continued, done) in &parsed {
        if end.is_some_and(|e| e < done) {
            break;
        }
        if continued {
            segments.insert(s);
        }
        before = done;
    }
    debug_assert!(end.is_none_or(|e| e >= before));
    if let Some(e) = end {
        expected = records[e].0;
        records.truncate(e);
    }
    report.records_replayed += records.len() as u64;
    for (i, bad) in damaged.iter().filter(|(i, _)| *i < records.len()) {
        // Acknowledged, and one of its blocks went bad since: the record is kept; reads of
        // those blocks fail their checksum, the rest is intact.
        tracing::error!(
            shard,
            record = records[*i].0,
            ?bad,
            "journal record has damaged data blocks; they will read as corrupt"
        );
        report.damaged_blocks += bad.len() as u64;
    }
    Ok(Replay {
        records,
        next_record: expected,
        segments,
        durable_mark,
    })
}

/// A record's metadata as deltas, back to back to the last byte.
pub(crate) fn decode_deltas(meta: Vec<u8>) -> Result<Vec<Delta>, carmine_types::DecodeError> {
    let mut deltas = Vec::new();
    let mut d = Decoder::new(Bytes::from(meta));
    while d.remaining() > 0 {
        deltas.push(Delta::decode(&mut d)?);
    }
    Ok(deltas)
}

/// The highest durable mark of the records a segment holds from its block 1 on, walked record
/// by record (their data blocks are never taken for headers) while each is valid and of the
/// first one's nonce — if one of them is record `expected`, where the journal read ended (the
/// segment continues this journal); 0 otherwise (none valid, or an old store's records).
fn records_mark(segment: &[u8], expected: u64) -> u64 {
    let (mut at, mut mark, mut nonce, mut continues) = (BLOCK, 0, None, false);
    while at + BLOCK <= segment.len() {
        let Some(h) = RecordHeader::decode(&segment[at..at + BLOCK]) else {
            break;
        };
        if h.total_blocks == 0 || nonce.is_some_and(|n| n != h.nonce) {
            break;
        }
        nonce = Some(h.nonce);
        continues |= h.seq == expected;
        mark = mark.max(h.durable_seq);
        at += h.total_blocks as usize * BLOCK;
    }
    if continues {
        mark
    } else {
        0
    }
}

/// The data blocks of the record at `rec_paddr` whose contents fail the checksum their
/// `SetExtent` delta carries, by device block.
fn bad_data_blocks(deltas: &[Delta], rec_paddr: u64, data: &[u8]) -> Vec<u64> {
    let blocks = (data.len() / BLOCK) as u64;
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::SetExtent { extent, .. } => Some(extent.blocks()),
            _ => None,
        })
        .flatten()
        .map(|b| (b.paddr, b.crc))
        .filter(|(paddr, _)| paddr.wrapping_sub(rec_paddr + 1) < blocks)
        .filter(|(paddr, crc)| {
            let i = (paddr - rec_paddr - 1) as usize;
            crc32c(&data[i * BLOCK..(i + 1) * BLOCK]) != *crc
        })
        .map(|(paddr, _)| paddr)
        .collect()
}

/// Segments held back from user data: the throttle share, and at least four.
pub(crate) fn reserve_for(segments: u32, throttle_pct: u32) -> u32 {
    let pct = (segments as u64 * throttle_pct as u64).div_ceil(100) as u32;
    (pct + segments.div_ceil(100) + 2).max(4).min(segments - 1)
}
