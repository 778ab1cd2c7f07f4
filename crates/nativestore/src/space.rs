//! Space: checkpoints (which retire journal segments) and the segment cleaner (which moves
//! the live blocks out of mostly-dead segments). Both run in the shard's background task, and
//! inline, under the apply lock, in the submit path of a transaction that finds space short
//! or the background behind, so writers slow down as the store fills instead of failing.

use crate::delta::Delta;
use crate::device::BlockDevice;
use crate::extents::{Extent, EXTENT_BLOCKS_MAX};
use crate::paging::Pins;
use crate::segments::SegKind;
use crate::store::{io_error, NativeStore, State};
use crate::victim::{LiveBlock, Placed};
use bytes::Bytes;
use carmine_store::Result;
use carmine_types::crc32c;
use carmine_types::CollectionId;

/// The background cleaner's pause is taken in slices this long, so that a checkpoint that
/// falls due meanwhile waits no longer.
const PAUSE_SLICE: std::time::Duration = std::time::Duration::from_millis(50);

impl<D: BlockDevice> NativeStore<D> {
    fn free_below(&self, pct: u32) -> bool {
        let free = self.st.borrow().segments.free_count() as u64;
        free * 100 < self.geo.segments as u64 * pct as u64 || free < self.reserve_floor()
    }

    /// The fewest free segments user writes may leave: room for a checkpoint and a cleaning.
    pub(crate) fn reserve_floor(&self) -> u64 {
        self.checkpoint_segments_needed() + 2
    }

    /// Free segments the next checkpoint may need: a fresh tree (an incremental one uses
    /// more room only when there is more), and the metadata segment it may leave half used.
    pub(crate) fn checkpoint_segments_needed(&self) -> u64 {
        let blocks = crate::metatree::fresh_tree_blocks(&self.st.borrow().index);
        blocks.div_ceil(self.geo.segment_blocks - 1) + 1
    }

    /// Called with the apply lock held, before a transaction is planned. `grows`: the
    /// transaction may add data or metadata; one that only removes or shrinks may use the
    /// last reserve.
    pub(crate) async fn make_room(&self, grows: bool) -> Result<()> {
        // Back-pressure on memory: data not yet on the device is bounded.
        loop {
            let dirty = self.st.borrow().cache.dirty_bytes();
            if dirty <= self.config.dirty_bytes_max {
                break;
            }
            let id = self.st.borrow().journal.next_batch;
            self.wait_durable(id).await?;
        }
        // Checkpoints and cleaning normally happen in `run_background`; a store without it
        // (or one that fell behind) does them here, in the writer's time.
        if self.st.borrow().journal.blocks_since_checkpoint >= 2 * self.checkpoint_interval() {
            self.checkpoint().await?;
        }
        // Below the throttle line writers wait for the cleaner; give up only when it can
        // free nothing more (the capacity check then answers NoSpace where it must).
        // A couple of victims per transaction: writers slow down in proportion instead of
        // stalling for a whole catch-up.
        let mut rounds = 0;
        while self.free_below(self.config.throttle_pct) && rounds < 2 {
            if !self.clean_one(true).await? {
                break;
            }
            rounds += 1;
        }
        // Never let user data take the segments a checkpoint and a cleaning pass need: below
        // that floor, clean until above it; only when nothing more can be freed is it NoSpace.
        let floor = if grows {
            self.reserve_floor()
        } else {
            self.checkpoint_segments_needed() + 1
        };
        let mut tries = 0;
        loop {
            let free = self.st.borrow().segments.free_count() as u64;
            if free >= floor {
                break;
            }
            if tries > 4 * self.geo.segments || !self.clean_one(true).await? {
                return Err(carmine_store::StoreError::new(
                    carmine_store::StoreErrorKind::NoSpace,
                    crate::store::NO_CID,
                    "",
                    format!(
                        "store full: {free} free segments, {floor} kept for checkpoints and \
                         the cleaner, and nothing left to clean"
                    ),
                ));
            }
            tries += 1;
        }
        Ok(())
    }

    /// Cleans until the free segments are back at the reserve floor, as far as cleaning can
    /// get there. Mount calls it after its checkpoint: every mount takes a journal segment
    /// and, often, a metadata one, and writers restore the floor only once they write; crash
    /// after crash with little written between, a store would otherwise run out of room for
    /// the next mount's own checkpoint and could not be mounted at all.
    ///
    /// Best effort: a store full of live data gains nothing by cleaning (moving a victim
    /// takes about the segment it frees), so it stops after two passes that freed nothing,
    /// and a cleaning that fails without failing the shard (no room to move into) leaves the
    /// store mounted, refusing writes that grow it as before.
    pub(crate) async fn restore_reserve(&self) -> Result<()> {
        let free = || self.st.borrow().segments.free_count() as u64;
        let (mut best, mut idle) = (free(), 0);
        while free() < self.reserve_floor() && idle < 2 {
            match self.clean_one(true).await {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) if self.st.borrow().failed.is_some() => return Err(e),
                Err(e) => {
                    tracing::warn!(shard = self.shard, "cleaning at mount: {e}");
                    break;
                }
            }
            // (A pass that finds no victim checkpoints so that the journal's segments become
            // victims: it frees nothing itself.)
            if free() > best {
                best = free();
                idle = 0;
            } else {
                idle += 1;
            }
        }
        Ok(())
    }

    /// Picks a victim segment and moves its live blocks to the journal head. Returns whether
    /// a segment was freed. `locked`: the caller holds the apply lock (the throttled submit
    /// path); otherwise (the background task) the victim is read without it, so user I/O goes
    /// on meanwhile, and the lock is taken only to move what is still live.
    pub(crate) async fn clean_one(&self, locked: bool) -> Result<bool> {
        self.clean_counted(locked, &mut 0).await
    }

    /// As `clean_one`, adding to `cost` the blocks it read and moved.
    async fn clean_counted(&self, locked: bool, cost: &mut u64) -> Result<bool> {
        let victim = match self.pick_victim() {
            Some(v) => v,
            None => {
                // Segments written since the last checkpoint cannot be cleaned yet (replay
                // still needs their records): a checkpoint makes them eligible.
                if !self.has_journal_after_checkpoint() {
                    return Ok(false);
                }
                let _guard = match locked {
                    true => None,
                    false => Some(self.apply_lock.lock().await),
                };
                self.checkpoint().await?;
                return Ok(true);
            }
        };
        let picked_seq = self.st.borrow().segments.get(victim).seq;
        let still_victim = |st: &State| {
            let s = st.segments.get(victim);
            s.kind == SegKind::Journal
                && s.seq == picked_seq
                && s.seq < st.slot.journal.segment_seq
                && victim != st.journal.seg
        };
        if self.st.borrow().index.segment_live[victim as usize] == 0 {
            let _guard = match locked {
                true => None,
                false => Some(self.apply_lock.lock().await),
            };
            // Its blocks died in transactions that may not be durable yet: were the segment
            // reused before they are, a crash would bring back a map into overwritten data.
            self.drain().await?;
            let mut st = self.st.borrow_mut();
            if still_victim(&st) && st.index.segment_live[victim as usize] == 0 {
                st.segments.release(victim);
                st.stats.segments_cleaned += 1;
            }
            return Ok(true);
        }
        // Its records' headers and metadata, without the lock: a sealed segment's records do
        // not change, and sequence numbers only grow, so `still_victim` under the lock later
        // proves it was not released and reused meanwhile.
        let placed = match self.victim_records(victim, cost).await {
            Ok(placed) => placed,
            // Released and reused while it was read: not this victim's error.
            Err(_) if !still_victim(&self.st.borrow()) => return Ok(false),
            Err(e) => return Err(e),
        };
        // The guard first: dropped last, so pins always end while the lock is held.
        let (_guard, live, data, pins) = if locked {
            let Some((pins, live)) = self.live_now(&still_victim, victim, &placed).await? else {
                return Ok(false);
            };
            let data = self.read_live(&live, cost).await?;
            (None, live, data, pins)
        } else {
            // Which blocks are live, under the lock; their data read without it; then, under
            // the lock again, those still live. Blocks only die meanwhile: new data goes to
            // the journal's head, never into a sealed segment, and clones copy their data
            // (shared extents, decision 0013 point 8, will have to keep this true).
            let candidates = {
                let _guard = self.apply_lock.lock().await;
                match self.live_now(&still_victim, victim, &placed).await? {
                    Some((_pins, live)) => live,
                    None => return Ok(false),
                }
            };
            let read = self.read_live(&candidates, cost).await?;
            let guard = self.apply_lock.lock().await;
            let Some((pins, live)) = self.live_now(&still_victim, victim, &placed).await? else {
                return Ok(false);
            };
            let Some(data) = still_live_data(&candidates, read, &live) else {
                // Cannot happen (see above); if it did, a later pass tries again.
                debug_assert!(false, "a block of the cleaner's victim came alive");
                tracing::error!(
                    shard = self.shard,
                    victim,
                    "a block of the cleaner's victim came alive while it was read"
                );
                return Ok(false);
            };
            (Some(guard), live, data, pins)
        };
        assert_eq!(live.len(), data.len(), "a read for every live block");
        let bad: Vec<bool> = live
            .iter()
            .zip(&data)
            .map(|(b, d)| crc32c(d) != b.crc)
            .collect();
        // A block that fails its checksum moves as it is, with its original checksum: it
        // keeps reading as corrupt (so it is not cached), and the segment can be reclaimed.
        let mut bad_blocks = 0;
        for (b, _) in live.iter().zip(&bad).filter(|(_, bad)| **bad) {
            bad_blocks += 1;
            tracing::error!(
                shard = self.shard,
                paddr = b.paddr,
                victim,
                "cleaner moves a block that fails its checksum"
            );
        }
        self.st.borrow_mut().stats.checksum_errors += bad_blocks;
        let moved = live.len();
        *cost += moved as u64;
        // Block by block, so the moved blocks fill what is left of the journal's segment and
        // flow on into the next: one record per victim would need a whole fresh segment, and at
        // high fill cleaning would then free no more than it takes. Blocks that follow each
        // other in an object and land next to each other in one batch move as one extent.
        let mut batch = 0;
        let mut run: Option<Moved> = None;
        for ((block, data), bad) in live.into_iter().zip(data).zip(bad) {
            let mut st = self.st.borrow_mut();
            if let Some(r) = run.take() {
                let next = r.crcs.len() + 1;
                let open = st.journal.open.as_ref().expect("opened by the run");
                if r.continued_by(&block)
                    && open.fits(Delta::set_extent_len(block.oid.len(), next), 1)
                {
                    run = Some(r);
                } else {
                    r.map::<D>(&mut st)?;
                }
            }
            let pending = run.as_ref().map_or(0, |r| r.crcs.len());
            self.batch_for(
                &mut st,
                Delta::set_extent_len(block.oid.len(), pending + 1),
                1,
            )?;
            let b = st.journal.open.as_mut().expect("opened");
            let paddr = b.next_data_block();
            b.data.push(data.clone());
            batch = b.id;
            match bad {
                true => st.cache.add_dirty_unreadable(paddr),
                false => st.cache.add_dirty(paddr, data),
            }
            let r = run.get_or_insert_with(|| Moved {
                cid: block.cid,
                oid: block.oid,
                first: block.lblock,
                paddr,
                crcs: Vec::new(),
            });
            debug_assert_eq!(paddr, r.paddr + r.crcs.len() as u64);
            r.crcs.push(block.crc);
        }
        if let Some(r) = run {
            r.map::<D>(&mut self.st.borrow_mut())?;
        }
        drop(pins);
        if moved == 0 {
            // Every block died before it could move, in transactions that may not be durable
            // yet: as for a victim found empty, the segment waits for them before reuse.
            self.drain().await?;
        } else {
            // The moves' batch, and with it every earlier one (batches complete in order).
            self.wait_durable(batch).await?;
        }
        let mut st = self.st.borrow_mut();
        if st.index.segment_live[victim as usize] == 0 {
            st.segments.release(victim);
        }
        st.stats.segments_cleaned += 1;
        st.stats.blocks_relocated += moved as u64;
        Ok(true)
    }

    /// The shard's own work: the committer (every journal write) and housekeeping
    /// (checkpoints when the journal has grown, cleaning when free segments run low), off
    /// the submit path, so writers wait only when it falls behind. Runs until the shard
    /// fails; spawn it on the shard's reactor.
    pub async fn run_background(&self) {
        futures::future::join(self.run_committer(), self.run_housekeeping()).await;
    }

    async fn run_housekeeping(&self) {
        loop {
            let seen = self.changed.generation();
            if self.st.borrow().failed.is_some() {
                return;
            }
            let result = if self.checkpoint_due() {
                let _guard = self.apply_lock.lock().await;
                self.checkpoint().await.map(|_| true)
            } else if self.free_below(self.config.clean_start_pct) {
                self.clean_paced().await
            } else {
                Ok(false)
            };
            match result {
                Ok(true) => continue,
                Ok(false) => self.changed.wait(seen).await,
                Err(e) => {
                    tracing::error!(shard = self.shard, "background housekeeping: {e}");
                    self.changed.wait(seen).await;
                }
            }
        }
    }

    /// One background cleaning pass; then, if clients did I/O meanwhile and space is not
    /// tight, a pause long enough that what the pass read and moved keeps to
    /// `cleaner_busy_rate_bytes`. The pause is cut short when a checkpoint falls due or the
    /// shard fails, so housekeeping never sleeps through its other work.
    async fn clean_paced(&self) -> Result<bool> {
        let clients = self.client_ops.get();
        let started = std::time::Instant::now();
        let mut cost = 0;
        let freed = self.clean_counted(false, &mut cost).await?;
        if freed {
            self.st.borrow_mut().stats.segments_cleaned_background += 1;
        }
        let rate = self.config.cleaner_busy_rate_bytes;
        // Below the throttle line writers clean in their own path, holding the apply lock:
        // the background must not leave them more of it.
        if rate == 0
            || self.client_ops.get() == clients
            || self.free_below(self.config.throttle_pct)
        {
            return Ok(freed);
        }
        let bytes = cost as f64 * crate::device::BLOCK as f64;
        let due = std::time::Duration::from_secs_f64(bytes / rate as f64);
        let Some(mut wait) = due.checked_sub(started.elapsed()) else {
            return Ok(freed);
        };
        self.st.borrow_mut().stats.cleaner_paced_blocks += cost;
        while !wait.is_zero() {
            let more_due = self.st.borrow().failed.is_some() || self.checkpoint_due();
            if more_due {
                break;
            }
            let slice = wait.min(PAUSE_SLICE);
            self.dev.pause(slice).await;
            self.st.borrow_mut().stats.cleaner_paused_ns += slice.as_nanos() as u64;
            wait -= slice;
        }
        Ok(freed)
    }

    fn has_journal_after_checkpoint(&self) -> bool {
        let st = self.st.borrow();
        let after = st.slot.journal.segment_seq;
        let open = st.journal.seg;
        let any = st
            .segments
            .iter()
            .any(|(i, s)| s.kind == SegKind::Journal && s.seq >= after && i != open);
        any
    }

    /// If `victim` still is the cleaner's (`still_victim`), its live blocks, with the objects
    /// `placed` names pinned (whether a block is live is in its object's map, so those paged
    /// out are read back). Called with the apply lock held.
    async fn live_now(
        &self,
        still_victim: &dyn Fn(&State) -> bool,
        victim: u32,
        placed: &[Placed],
    ) -> Result<Option<(Pins<'_>, Vec<LiveBlock>)>> {
        if !still_victim(&self.st.borrow()) {
            return Ok(None);
        }
        let pins = self
            .pin_objects(|| placed.iter().map(|p| (p.cid, p.oid.as_str())))
            .await?;
        Ok(self.live_blocks(victim, placed).map(|live| (pins, live)))
    }

    /// The blocks of `placed` their objects' maps still point at, in place order; `None`
    /// (the victim kept) unless they are as many as the segment's live count says.
    /// With the apply lock held and the objects pinned.
    fn live_blocks(&self, victim: u32, placed: &[Placed]) -> Option<Vec<LiveBlock>> {
        let st = self.st.borrow();
        let mut live = Vec::new();
        for p in placed {
            let Some(object) = st.index.body_of(p.cid, &p.oid) else {
                continue;
            };
            for (k, b) in p.extent.blocks().enumerate() {
                let (lblock, paddr) = (p.lblock + k as u64, b.paddr);
                let in_record = paddr.wrapping_sub(p.rec_start + 1) < p.data_blocks;
                let still = object.blocks.get(lblock).is_some_and(|b| b.paddr == paddr);
                if in_record && still {
                    live.push(LiveBlock {
                        cid: p.cid,
                        oid: p.oid.clone(),
                        lblock,
                        paddr,
                        crc: b.crc,
                    });
                }
            }
        }
        // In place order; a block two maps point at (never, while clones copy) is moved for
        // each, as the count of live blocks counts it for each.
        live.sort_by_key(|b| b.paddr);
        let expected = st.index.segment_live[victim as usize] as usize;
        drop(st);
        if live.len() != expected {
            // Never free a segment whose live blocks we cannot all account for.
            tracing::error!(
                shard = self.shard,
                victim,
                found = live.len(),
                expected,
                "cleaner could not find every live block; segment kept"
            );
            self.keep_victim(victim);
            return None;
        }
        Some(live)
    }

    fn keep_victim(&self, victim: u32) {
        let mut st = self.st.borrow_mut();
        st.segments.keep(victim);
        st.stats.segments_kept += 1;
    }

    /// Cost-benefit choice among segments the journal no longer needs: the most free space
    /// for the least copying, favouring older segments; greedy (least live) on ties.
    fn pick_victim(&self) -> Option<u32> {
        let st = self.st.borrow();
        let cap = (self.geo.segment_blocks - 1) as f64;
        let mut best: Option<(f64, u32, u32)> = None;
        for (i, s) in st.segments.iter() {
            if s.kind != SegKind::Journal
                || s.seq >= st.slot.journal.segment_seq
                || i == st.journal.seg
                || st.segments.is_kept(i)
            {
                continue;
            }
            let live = st.index.segment_live[i as usize];
            let u = (live as f64 / cap).min(1.0);
            if u >= 1.0 {
                continue;
            }
            let age = (st.segments.seq_max() - s.seq) as f64 + 1.0;
            let score = (1.0 - u) * age / (1.0 + u);
            let better = match best {
                None => true,
                Some((bs, _, bl)) => score > bs || (score == bs && live < bl),
            };
            if better {
                best = Some((score, i, live));
            }
        }
        best.map(|(_, i, _)| i)
    }
}

/// Blocks the cleaner moved into the open batch, waiting to be mapped as one extent.
struct Moved {
    cid: CollectionId,
    oid: String,
    first: u64,
    paddr: u64,
    crcs: Vec<u32>,
}

impl Moved {
    fn continued_by(&self, b: &LiveBlock) -> bool {
        b.cid == self.cid
            && b.oid == self.oid
            && b.lblock == self.first + self.crcs.len() as u64
            && (self.crcs.len() as u64) < EXTENT_BLOCKS_MAX
    }

    /// Writes the run's delta into the open batch (which holds its blocks) and applies it.
    fn map<D: BlockDevice>(self, st: &mut State) -> Result<()> {
        let d = Delta::SetExtent {
            cid: self.cid,
            oid: self.oid,
            lblock: self.first,
            extent: Extent::new(self.paddr, &self.crcs),
        };
        let b = st.journal.open.as_mut().expect("the run's batch is open");
        d.encode(&mut b.meta);
        st.index
            .apply(&d)
            .map_err(|e| io_error(format!("internal: relocation: {e}")))?;
        NativeStore::<D>::invalidate_freed(st);
        Ok(())
    }
}

/// The data read for `candidates` (in place order) of the blocks in `live` (in place order,
/// found later); `None` if one of them was not a candidate.
fn still_live_data(
    candidates: &[LiveBlock],
    read: Vec<Bytes>,
    live: &[LiveBlock],
) -> Option<Vec<Bytes>> {
    let mut read = candidates.iter().zip(read);
    live.iter()
        .map(|b| read.find(|(c, _)| c.paddr == b.paddr).map(|(_, d)| d))
        .collect()
}
