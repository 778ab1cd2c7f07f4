//! Sparse, copy-on-write object data: fixed 4 KiB pages in an ordered map.
//!
//! Why pages and not one `Vec<u8>` per object: a write touches (and copies) only the pages it
//! covers, holes cost nothing, and cloning an object shares every page by reference count, so
//! snapshots and the transaction undo log are cheap. `Rc` (not `Arc`) because a shard never
//! leaves its thread.
//!
//! Invariants, relied upon by reads and checked by the tests:
//! - no page lies wholly at or beyond `size`, and the bytes of the last page past `size` are
//!   zero (truncate clears them), so a later extension reads zeros there;
//! - `Zero`, `Truncate` and `CloneRange` drop pages that end up all zero. `Write` keeps what it
//!   was given: scanning every written page for zeros would tax the hot path.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

pub(crate) const PAGE_SIZE: usize = 4096;
pub(crate) type Page = [u8; PAGE_SIZE];
const P: u64 = PAGE_SIZE as u64;

/// Previous contents of the pages one op changed, in the order it changed them (`None`: the
/// page was a hole). Restoring them in reverse undoes the op exactly.
pub(crate) type SavedPages = Vec<(u64, Option<Rc<Page>>)>;

#[derive(Clone, Debug, Default)]
pub(crate) struct Data {
    size: u64,
    pages: BTreeMap<u64, Rc<Page>>,
}

/// Byte range of page `idx` covered by `[from, to)`, as indices into the page.
fn in_page(idx: u64, from: u64, to: u64) -> std::ops::Range<usize> {
    let start = idx * P;
    (from.max(start) - start) as usize..(to.min(start + P) - start) as usize
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

impl Data {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Pages actually allocated: what the memory budget charges for data.
    pub fn page_count(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Copies `[off, off + buf.len())` into `buf`, which the caller has zeroed: holes and bytes
    /// past the end are left untouched. The caller guarantees the range does not overflow.
    pub fn read_into(&self, off: u64, buf: &mut [u8]) {
        let end = (off + buf.len() as u64).min(self.size);
        if off >= end {
            return;
        }
        let (first, last) = (off / P, (end - 1) / P);
        if first == last {
            // One page (every aligned 4 KiB read): a point lookup walks the tree once where a
            // range walks it twice, and with a large working set each walk is cache misses.
            if let Some(page) = self.pages.get(&first) {
                let src = in_page(first, off, end);
                buf[..src.len()].copy_from_slice(&page[src]);
            }
            return;
        }
        for (&idx, page) in self.pages.range(first..=last) {
            let src = in_page(idx, off, end);
            let dst_start = (idx * P + src.start as u64 - off) as usize;
            buf[dst_start..dst_start + src.len()].copy_from_slice(&page[src]);
        }
    }

    /// The pages overlapping `[off, off + len)` and the size, sharing every page: a stable
    /// source for `copy_from` even when the destination is this same object.
    pub fn snapshot(&self, off: u64, len: u64) -> Data {
        let end = (off + len).min(self.size);
        let pages = if off < end {
            self.pages
                .range(off / P..=(end - 1) / P)
                .map(|(&i, p)| (i, p.clone()))
                .collect()
        } else {
            BTreeMap::new()
        };
        Data {
            size: self.size,
            pages,
        }
    }

    /// Writable page `idx`, recording its previous state. A hole becomes a fresh zero page; a
    /// shared page is copied (that copy is the one allocation a partial-page write makes).
    fn page_mut(&mut self, idx: u64, saved: &mut SavedPages) -> &mut Page {
        match self.pages.entry(idx) {
            Entry::Occupied(e) => {
                saved.push((idx, Some(e.get().clone())));
                Rc::make_mut(e.into_mut())
            }
            Entry::Vacant(e) => {
                saved.push((idx, None));
                Rc::make_mut(e.insert(Rc::new([0; PAGE_SIZE])))
            }
        }
    }

    /// Replaces page `idx` (with a hole when `page` is `None`), recording its previous state.
    fn set_page(&mut self, idx: u64, page: Option<Rc<Page>>, saved: &mut SavedPages) {
        let old = match page {
            Some(p) => self.pages.insert(idx, p),
            None => self.pages.remove(&idx),
        };
        saved.push((idx, old));
    }

    /// Writes `data` at `off`; the caller checked that the range is within the size limit.
    /// A fully covered page is replaced by a new one without reading the old one.
    pub fn write(&mut self, off: u64, data: &[u8], saved: &mut SavedPages) {
        if data.is_empty() {
            return;
        }
        let end = off + data.len() as u64;
        for idx in off / P..=(end - 1) / P {
            let range = in_page(idx, off, end);
            let src_start = (idx * P + range.start as u64 - off) as usize;
            let src = &data[src_start..src_start + range.len()];
            if range.len() == PAGE_SIZE {
                // A whole-page write needs no zero fill first: the hot 4 KiB write path.
                let mut page = Rc::<[u8; PAGE_SIZE]>::new_uninit();
                let full: &[u8; PAGE_SIZE] = src.try_into().expect("range is one full page");
                Rc::get_mut(&mut page)
                    .expect("fresh page is unshared")
                    .write(*full);
                // SAFETY: the write above initialised every byte of the page.
                let page = unsafe { page.assume_init() };
                self.set_page(idx, Some(page), saved);
            } else {
                self.page_mut(idx, saved)[range].copy_from_slice(src);
            }
        }
        self.size = self.size.max(end);
    }

    /// Zeros `[off, off + len)` and extends the object to cover it. Only allocated pages are
    /// visited, so zeroing a huge sparse range costs nothing.
    pub fn zero(&mut self, off: u64, len: u64, saved: &mut SavedPages) {
        if len == 0 {
            return;
        }
        self.clear(off, off + len, saved);
        self.size = self.size.max(off + len);
    }

    /// Zeros `[from, to)` inside allocated pages. A page that would end up all zero is dropped
    /// without being copied, so clearing never needs memory (deletes must work when full).
    fn clear(&mut self, from: u64, to: u64, saved: &mut SavedPages) {
        if from >= to {
            return;
        }
        let touched: Vec<u64> = self
            .pages
            .range(from / P..=(to - 1) / P)
            .map(|(&i, _)| i)
            .collect();
        for idx in touched {
            let range = in_page(idx, from, to);
            let page = &self.pages[&idx];
            if is_zero(&page[..range.start]) && is_zero(&page[range.end..]) {
                self.set_page(idx, None, saved);
            } else {
                self.page_mut(idx, saved)[range].fill(0);
            }
        }
    }

    /// Sets the size. Shrinking frees the pages past the end and clears the tail of the last
    /// one, so growing again later reads zeros.
    pub fn truncate(&mut self, size: u64, saved: &mut SavedPages) {
        if size < self.size {
            let kept = size.div_ceil(P);
            let tail = self.pages.split_off(&kept);
            saved.extend(tail.into_iter().map(|(i, p)| (i, Some(p))));
            self.clear(size, kept * P, saved);
        }
        self.size = size;
    }

    /// Copies `[src_off, src_off + len)` of `src` to `dst_off`, zeros for bytes past `src`'s
    /// end, and extends this object to cover the destination range.
    ///
    /// Only pages holding data on either side are visited; the rest of the range is a hole in
    /// both and stays one. Whole pages at matching alignment are shared, not copied.
    pub fn copy_from(
        &mut self,
        src: &Data,
        src_off: u64,
        len: u64,
        dst_off: u64,
        saved: &mut SavedPages,
    ) {
        if len == 0 {
            return;
        }
        let dst_end = dst_off + len;
        let mut touched: BTreeSet<u64> = self
            .pages
            .range(dst_off / P..=(dst_end - 1) / P)
            .map(|(&i, _)| i)
            .collect();
        let src_end = (src_off + len).min(src.size);
        if src_off < src_end {
            for &sidx in src
                .pages
                .range(src_off / P..=(src_end - 1) / P)
                .map(|(i, _)| i)
            {
                let from = src_off.max(sidx * P) - src_off + dst_off;
                let to = src_end.min((sidx + 1) * P) - src_off + dst_off;
                touched.insert(from / P);
                touched.insert((to - 1) / P);
            }
        }
        for idx in touched {
            let range = in_page(idx, dst_off, dst_end);
            let src_pos = idx * P + range.start as u64 - dst_off + src_off;
            if range.len() == PAGE_SIZE && src_pos.is_multiple_of(P) {
                // No page lies past the source's end, so a miss here is a hole or EOF.
                let shared = src.pages.get(&(src_pos / P)).cloned();
                self.set_page(idx, shared, saved);
            } else {
                let page = self.page_mut(idx, saved);
                page[range.clone()].fill(0);
                src.read_into(src_pos, &mut page[range]);
                if is_zero(&page[..]) {
                    self.pages.remove(&idx);
                }
            }
        }
        self.size = self.size.max(dst_end);
    }

    /// Undoes the ops that recorded `saved`, given the size before them.
    pub fn restore(&mut self, size: u64, saved: SavedPages) {
        for (idx, page) in saved.into_iter().rev() {
            match page {
                Some(p) => self.pages.insert(idx, p),
                None => self.pages.remove(&idx),
            };
        }
        self.size = size;
    }

    /// Page `idx`, which must be allocated; for tests.
    #[cfg(test)]
    pub fn page(&self, idx: u64) -> Rc<Page> {
        self.pages[&idx].clone()
    }

    /// Checks the invariants in the module doc; for tests.
    #[cfg(test)]
    pub fn check_invariants(&self) {
        for (&idx, page) in &self.pages {
            assert!(
                idx * P < self.size,
                "page {idx} lies past size {}",
                self.size
            );
            if (idx + 1) * P > self.size {
                assert!(
                    is_zero(&page[(self.size - idx * P) as usize..]),
                    "page {idx} has data past the end"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(d: &Data, off: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        d.read_into(off, &mut buf);
        buf
    }

    #[test]
    fn aligned_page_write_allocates_one_page_and_shares_nothing_it_replaced() {
        let mut d = Data::default();
        let mut saved = Vec::new();
        d.write(8192, &[7; PAGE_SIZE], &mut saved);
        assert_eq!((d.page_count(), d.size()), (1, 3 * P));
        assert_eq!(saved.len(), 1);
        let before = d.clone();
        let mut saved = Vec::new();
        d.write(8192, &[9; PAGE_SIZE], &mut saved);
        assert_eq!(saved.len(), 1, "one page touched");
        assert_eq!(
            read(&before, 8192, 4)[..],
            [7; 4],
            "a clone keeps the old page"
        );
        assert_eq!(read(&d, 8192, 4)[..], [9; 4]);
    }

    #[test]
    fn zeroing_or_truncating_data_away_frees_its_pages() {
        let mut d = Data::default();
        let mut saved = Vec::new();
        d.write(100, &[1; 3 * PAGE_SIZE], &mut saved);
        assert_eq!(d.page_count(), 4);
        d.zero(0, 2 * P, &mut saved);
        assert_eq!(d.page_count(), 2);
        d.truncate(2 * P + 50, &mut saved);
        assert_eq!(d.page_count(), 1);
        d.check_invariants();
        d.truncate(2 * P, &mut saved);
        assert_eq!(d.page_count(), 0);
        d.truncate(10 * P, &mut saved);
        assert_eq!(read(&d, 0, 10 * PAGE_SIZE), vec![0; 10 * PAGE_SIZE]);
    }

    #[test]
    fn restore_undoes_a_sequence_of_ops_exactly() {
        let mut d = Data::default();
        d.write(0, &[3; 10_000], &mut Vec::new());
        let before = d.clone();
        let mut saved = Vec::new();
        d.write(5000, &[4; 9000], &mut saved);
        d.truncate(7000, &mut saved);
        d.zero(0, 4096, &mut saved);
        let snap = d.snapshot(0, 20_000);
        d.copy_from(&snap, 1, 6000, 3, &mut saved);
        d.restore(before.size(), saved);
        assert_eq!(d.size(), before.size());
        assert_eq!(read(&d, 0, 20_000), read(&before, 0, 20_000));
        assert_eq!(d.page_count(), before.page_count());
    }

    #[test]
    fn aligned_copy_shares_source_pages() {
        let mut src = Data::default();
        src.write(0, &[5; 2 * PAGE_SIZE], &mut Vec::new());
        let mut dst = Data::default();
        dst.copy_from(&src, 0, 2 * P, 4 * P, &mut Vec::new());
        assert!(Rc::ptr_eq(&src.pages[&0], &dst.pages[&4]));
        assert_eq!(dst.size(), 6 * P);
    }
}
