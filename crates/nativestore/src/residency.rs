//! Which object bodies (extent maps, xattrs, omap) are in memory (decision 0013, step 3).
//!
//! An object's name, size and tree id always are; its body may be paged out once it is clean
//! (its record in the metadata tree is current), and is read back from that record before
//! anything uses it (`paging.rs`). Clean resident bodies wait in a queue, in the order they
//! became clean or were read back; eviction walks it, giving a body used since it was queued
//! one more round (second chance), and skips what must stay:
//! - a dirty body (its record is stale until the next checkpoint writes it);
//! - a body the holder of the apply lock pinned (a transaction, or the cleaner, between
//!   making its objects resident and applying to them);
//! - a body a checkpoint still in flight marked clean: its record is in that checkpoint's
//!   changes, not yet in the tree a reader would read it back from.
//!
//! The budget counts checkpoint bytes (the encoded record), which the index already keeps
//! per object; memory is a small multiple of it.

use crate::index::{Body, Collection, Index, Onode};
use carmine_types::CollectionId;
use std::collections::{BTreeMap, VecDeque};

#[derive(Debug, Default)]
pub(crate) struct Residency {
    /// Checkpoint bytes of the resident bodies' objects, names included.
    pub resident_bytes: u64,
    /// Of those, the bytes of dirty objects: evictable only after a checkpoint.
    pub dirty_bytes: u64,
    /// Objects whose body is paged out.
    pub paged_out: u64,
    /// Clean resident objects in eviction order; each at most once (`Onode::queued`).
    queue: VecDeque<(CollectionId, String)>,
    /// Objects the holder of the apply lock needs resident until it is done carry this
    /// in `Onode::pinned_at` while `pinning` is set; ending the pins moves it on, which
    /// unpins them all at once without a list (nothing allocated per transaction).
    pub pin_epoch: u64,
    pub pinning: bool,
    /// The checkpoint taking changes now, or last (numbered from 1), and whether it is still
    /// in flight (between taking the changes and its slot being durable).
    pub checkpoint: u64,
    pub checkpoint_in_flight: bool,
    /// Objects with `Onode::queued` set: the rest of the queue's entries are stale (objects
    /// removed, or replaced by another of the same name), dropped when they outnumber these.
    queued_count: u64,
}

impl Residency {
    /// The residency of a freshly loaded index: every body resident, the clean ones (whose
    /// record the tree holds) queued for eviction.
    pub fn recount(colls: &mut BTreeMap<CollectionId, Collection>) -> Self {
        let mut r = Residency::default();
        for (cid, coll) in colls.iter_mut() {
            for (oid, o) in coll.iter_mut() {
                match o.body.is_some() {
                    true => r.resident_bytes += o.encoded,
                    false => r.paged_out += 1,
                }
                if o.dirty {
                    r.dirty_bytes += o.encoded;
                }
                o.queued = false;
                r.enqueue(*cid, oid, o);
            }
        }
        r
    }

    /// A dirty resident object changed length.
    pub fn resized(&mut self, before: u64, after: u64) {
        self.resident_bytes = self.resident_bytes - before + after;
        self.dirty_bytes = self.dirty_bytes - before + after;
    }

    /// An object left the index (its queue entry, if any, is skipped when met).
    pub fn removed(&mut self, o: &Onode) {
        if o.queued {
            self.queued_count -= 1;
        }
        match o.body.is_some() {
            true => self.resident_bytes -= o.encoded,
            false => self.paged_out -= 1,
        }
        if o.dirty {
            self.dirty_bytes -= o.encoded;
        }
    }

    /// A checkpoint begins taking changes.
    pub fn checkpoint_begins(&mut self) {
        self.checkpoint += 1;
        self.checkpoint_in_flight = true;
    }

    /// The checkpoint taking changes put the record of `o` in its changes: it is clean, and
    /// may be evicted once that checkpoint is durable.
    pub fn cleaned(&mut self, cid: CollectionId, oid: &str, o: &mut Onode) {
        if o.dirty {
            o.dirty = false;
            self.dirty_bytes -= o.encoded;
        }
        o.cleaned_in = self.checkpoint;
        self.enqueue(cid, oid, o);
    }

    fn enqueue(&mut self, cid: CollectionId, oid: &str, o: &mut Onode) {
        if !o.queued && !o.dirty && o.body.is_some() && o.stored_chunks > 0 {
            o.queued = true;
            self.queued_count += 1;
            self.queue.push_back((cid, oid.to_owned()));
        }
    }

    /// Queue entries, stale ones included.
    #[cfg(test)]
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }
}

impl Index {
    /// Pins `cid/oid` (if it exists) for the current pin holder; returns its tree id when
    /// its body is paged out (to be read back), `None` when resident or absent.
    pub(crate) fn pin(&mut self, cid: CollectionId, oid: &str) -> Option<(u64, u32)> {
        let o = self.colls.get_mut(&cid)?.get_mut(oid)?;
        debug_assert!(self.residency.pinning, "pins are taken inside a pin guard");
        o.pinned_at = self.residency.pin_epoch;
        o.body.is_none().then_some((o.id, o.stored_chunks))
    }

    /// Pages out clean, unpinned bodies, oldest first, until the resident ones take at most
    /// `budget` bytes or nothing more may go. Returns how many went.
    pub(crate) fn evict_to(&mut self, budget: u64) -> u64 {
        let r = &mut self.residency;
        let mut evicted = 0;
        // Each entry is met at most twice (a second chance puts it back once).
        let mut turns = 2 * r.queue.len();
        while r.resident_bytes > budget && turns > 0 {
            turns -= 1;
            let Some(key) = r.queue.pop_front() else {
                break;
            };
            let Some(o) = self.colls.get_mut(&key.0).and_then(|c| c.get_mut(&key.1)) else {
                continue;
            };
            if !o.queued {
                // A stale entry: the object of that name was queued again since (replaced).
                continue;
            }
            o.queued = false;
            r.queued_count -= 1;
            if o.dirty || o.body.is_none() || o.stored_chunks == 0 {
                // Queued again once clean (`cleaned`) or read back.
                continue;
            }
            let pinned = r.pinning && o.pinned_at == r.pin_epoch;
            let unwritten = r.checkpoint_in_flight && o.cleaned_in == r.checkpoint;
            if o.referenced.replace(false) || pinned || unwritten {
                r.queued_count += 1;
                o.queued = true;
                r.queue.push_back(key);
                continue;
            }
            o.body = None;
            r.resident_bytes -= o.encoded;
            r.paged_out += 1;
            evicted += 1;
        }
        evicted
    }

    /// Drops the queue's stale entries once they outnumber the live ones (objects created,
    /// checkpointed and removed under the budget would otherwise grow it without end).
    pub(crate) fn compact_clean_queue(&mut self) {
        let r = &mut self.residency;
        if (r.queue.len() as u64) < 2 * r.queued_count + 1024 {
            return;
        }
        // Keeps the first entry of each queued object: `queued` is cleared as it is kept, so
        // a later entry of the same name is dropped, then set again for all kept.
        let colls = &mut self.colls;
        r.queue.retain(|(cid, oid)| {
            colls
                .get_mut(cid)
                .and_then(|c| c.get_mut(oid))
                .is_some_and(|o| std::mem::replace(&mut o.queued, false))
        });
        for (cid, oid) in &r.queue {
            if let Some(o) = colls.get_mut(cid).and_then(|c| c.get_mut(oid)) {
                o.queued = true;
            }
        }
    }

    /// Puts back the body of object `id`, read from its record, then evicts down to
    /// `budget` (never that body: it is the newest). Returns false, changing nothing, when
    /// the object is no longer the one read (removed, or another of the same name) or is
    /// resident already; an error when the record disagrees with the index.
    pub(crate) fn install_body(
        &mut self,
        cid: CollectionId,
        oid: &str,
        id: u64,
        body: Body,
        extent_keys: bool,
        budget: u64,
    ) -> Result<bool, String> {
        let Some(o) = self.colls.get_mut(&cid).and_then(|c| c.get_mut(oid)) else {
            return Ok(false);
        };
        if o.id != id || o.body.is_some() {
            return Ok(false);
        }
        if extent_keys != o.extent_keys {
            return Err(format!(
                "the record of {cid}/{oid:?} (tree id {id}) is of another version than the \
                 one the mount read"
            ));
        }
        let len = body.encoded_len(oid);
        if len != o.encoded {
            // Reached only on damage or a bug: the caller stops the shard.
            return Err(format!(
                "the record of {cid}/{oid:?} (tree id {id}) takes {len} bytes, the index \
                 says {}",
                o.encoded
            ));
        }
        // Room first: the body just read must not be the one evicted, or its reader would
        // read it again and again.
        self.evict_to(budget.saturating_sub(len));
        let o = self
            .colls
            .get_mut(&cid)
            .and_then(|c| c.get_mut(oid))
            .expect("looked up above; eviction removes no object");
        o.body = Some(Box::new(body));
        o.referenced.set(true);
        let r = &mut self.residency;
        r.resident_bytes += len;
        r.paged_out -= 1;
        r.enqueue(cid, oid, o);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::Delta;
    use crate::index::Geometry;
    use carmine_types::PgId;

    const C: CollectionId = PgId { pool: 1, seed: 1 };
    const GEO: Geometry = Geometry {
        first_block: 2,
        segment_blocks: 64,
        segments: 8,
    };

    /// An index of `n` objects whose records a checkpoint just wrote (clean, queued).
    fn clean_index(n: usize) -> Index {
        let mut ix = Index::new(GEO);
        ix.apply(&Delta::CreateCollection(C)).unwrap();
        for i in 0..n {
            ix.apply(&Delta::Touch(C, format!("o{i}"))).unwrap();
        }
        for (cid, oid) in std::mem::take(&mut ix.dirty) {
            let o = ix.colls.get_mut(&cid).unwrap().get_mut(&oid).unwrap();
            o.stored_chunks = 1;
            ix.residency.cleaned(cid, &oid, o);
        }
        ix
    }

    fn resident(ix: &Index, i: usize) -> bool {
        ix.body_of(C, &format!("o{i}")).is_some()
    }

    #[test]
    fn eviction_skips_dirty_pinned_and_recently_used_bodies() {
        let mut ix = clean_index(6);
        let each = ix.object(C, "o0").unwrap().encoded;
        assert_eq!(ix.residency.resident_bytes, 6 * each);
        assert_eq!(ix.residency.dirty_bytes, 0);
        // o0 dirty again, o1 pinned, o2 used since it was queued.
        ix.apply(&Delta::SetSize(C, "o0".into(), 10)).unwrap();
        assert_eq!(ix.residency.dirty_bytes, each);
        ix.residency.pinning = true;
        assert_eq!(ix.pin(C, "o1"), None);
        ix.object(C, "o2").unwrap().referenced.set(true);
        // Room for three: the three others go, in queue order.
        assert_eq!(ix.evict_to(3 * each), 3);
        assert!(resident(&ix, 0) && resident(&ix, 1) && resident(&ix, 2));
        assert!(!resident(&ix, 3) && !resident(&ix, 4) && !resident(&ix, 5));
        assert_eq!(ix.residency.paged_out, 3);
        // The second chance is spent; pins end with their epoch.
        ix.residency.pinning = false;
        assert_eq!(ix.evict_to(0), 2);
        assert!(resident(&ix, 0) && !resident(&ix, 1) && !resident(&ix, 2));
        assert_eq!(ix.residency.resident_bytes, each);
        // A paged-out object cannot change, and says so.
        assert!(matches!(
            ix.apply(&Delta::SetSize(C, "o1".into(), 1)),
            Err(crate::error::IndexError::PagedOut { .. })
        ));
        assert!(matches!(
            ix.apply(&Delta::Remove(C, "o1".into())),
            Err(crate::error::IndexError::PagedOut { .. })
        ));
    }

    #[test]
    fn stale_queue_entries_are_dropped_once_they_outnumber_the_live_ones() {
        // Objects created, written to the tree and removed while under the budget leave
        // their entries behind.
        let mut ix = clean_index(2000);
        for i in 0..1990 {
            ix.apply(&Delta::Remove(C, format!("o{i}"))).unwrap();
        }
        // The name of a removed one, back and queued again: one entry of it stays.
        ix.apply(&Delta::Touch(C, "o5".into())).unwrap();
        ix.dirty.clear();
        let o = ix.colls.get_mut(&C).unwrap().get_mut("o5").unwrap();
        o.stored_chunks = 1;
        ix.residency.cleaned(C, "o5", o);
        assert_eq!(ix.residency.queue_len(), 2001);
        ix.compact_clean_queue();
        assert_eq!(ix.residency.queue_len(), 11);
        // What is left still evicts, each object once.
        assert_eq!(ix.evict_to(0), 11);
        assert_eq!(ix.residency.resident_bytes, 0);
        assert_eq!(ix.residency.queue_len(), 0);
    }

    #[test]
    fn a_body_read_back_is_never_the_one_its_own_install_evicts() {
        let mut ix = clean_index(3);
        let each = ix.object(C, "o0").unwrap().encoded;
        ix.evict_to(0);
        assert_eq!(ix.residency.paged_out, 3);
        let id = ix.object(C, "o1").unwrap().id;
        // A budget smaller than the body itself: the others go, it stays.
        assert_eq!(
            ix.install_body(C, "o1", id, Body::default(), false, 1),
            Ok(true)
        );
        assert!(resident(&ix, 1));
        assert_eq!(ix.residency.resident_bytes, each);
        // Another object of the name, or one resident already: nothing changes.
        assert_eq!(
            ix.install_body(C, "o1", id, Body::default(), false, 1),
            Ok(false)
        );
        assert_eq!(
            ix.install_body(C, "o2", id + 99, Body::default(), false, 1),
            Ok(false)
        );
        // A record whose length disagrees with the index is refused.
        let o2 = ix.object(C, "o2").unwrap().id;
        let mut big = Body::default();
        big.omap.insert("k".into(), "v".into());
        big.meta_bytes = big.recount_meta();
        assert!(ix.install_body(C, "o2", o2, big, false, 1).is_err());
        // Removing a paged-out object is refused (its blocks must be released), but once read
        // back it goes, and the counts follow.
        assert_eq!(
            ix.install_body(C, "o2", o2, Body::default(), false, u64::MAX),
            Ok(true)
        );
        ix.apply(&Delta::Remove(C, "o2".into())).unwrap();
        assert_eq!(ix.residency.resident_bytes, each);
        assert_eq!(ix.residency.paged_out, 1);
    }
}
