//! A node's keys (or a leaf's values) as one byte buffer and their end offsets: two
//! allocations each instead of one per entry. A 4 KiB leaf of ~120 small entries held as
//! `Vec<Vec<u8>>` took ~13 KB of heap, so a cache counted in nodes of 4 KiB held three times
//! its budget, and a checkpoint that rewrote most leaves held the tree three times over.

use std::ops::Index;

/// Byte strings in order, packed: item `i` is `bytes[end(i - 1)..end(i)]`.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Packed {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Packed {
    pub fn with_capacity(items: usize, bytes: usize) -> Self {
        Packed {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(items),
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Gives back the room a decoder reserved beyond what it filled (glibc shrinks in
    /// place, without a copy).
    pub fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
    }

    /// The bytes of all items together.
    pub fn bytes_len(&self) -> usize {
        self.bytes.len()
    }

    fn start(&self, i: usize) -> usize {
        match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        }
    }

    pub fn get(&self, i: usize) -> Option<&[u8]> {
        (i < self.len()).then(|| &self[i])
    }

    pub fn first(&self) -> Option<&[u8]> {
        self.get(0)
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| &self[i])
    }

    pub fn push(&mut self, item: &[u8]) {
        self.bytes.extend_from_slice(item);
        self.ends.push(end_offset(self.bytes.len()));
    }

    pub fn insert(&mut self, i: usize, item: &[u8]) {
        let at = self.start(i);
        self.bytes.splice(at..at, item.iter().copied());
        let grow = end_offset(item.len());
        for e in &mut self.ends[i..] {
            *e += grow;
        }
        self.ends.insert(i, end_offset(at + item.len()));
    }

    pub fn remove(&mut self, i: usize) -> Vec<u8> {
        let (a, b) = (self.start(i), self.ends[i] as usize);
        let item: Vec<u8> = self.bytes.drain(a..b).collect();
        self.ends.remove(i);
        let shrink = end_offset(b - a);
        for e in &mut self.ends[i..] {
            *e -= shrink;
        }
        item
    }

    /// Puts `item` in place of item `i`; returns the one it replaced.
    pub fn replace(&mut self, i: usize, item: &[u8]) -> Vec<u8> {
        let old = self.remove(i);
        self.insert(i, item);
        old
    }

    /// Items `at..`, moved out.
    pub fn split_off(&mut self, at: usize) -> Packed {
        let from = self.start(at);
        let bytes = self.bytes.split_off(from);
        let mut ends = self.ends.split_off(at);
        let shift = end_offset(from);
        for e in &mut ends {
            *e -= shift;
        }
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
        Packed { bytes, ends }
    }

    pub fn binary_search(&self, key: &[u8]) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self[mid].cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// The number of items for which `pred` holds, `pred` holding for a prefix.
    pub fn partition_point(&self, pred: impl Fn(&[u8]) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if pred(&self[mid]) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Heap bytes it holds.
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * 4
    }
}

impl Index<usize> for Packed {
    type Output = [u8];
    fn index(&self, i: usize) -> &[u8] {
        &self.bytes[self.start(i)..self.ends[i] as usize]
    }
}

fn end_offset(n: usize) -> u32 {
    u32::try_from(n).expect("a node's entries fit in 4 GiB")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Push(Vec<u8>),
        Insert(usize, Vec<u8>),
        Remove(usize),
        Replace(usize, Vec<u8>),
        SplitOff(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let item = || proptest::collection::vec(any::<u8>(), 0..20);
        prop_oneof![
            item().prop_map(Op::Push),
            (any::<usize>(), item()).prop_map(|(i, v)| Op::Insert(i, v)),
            any::<usize>().prop_map(Op::Remove),
            (any::<usize>(), item()).prop_map(|(i, v)| Op::Replace(i, v)),
            any::<usize>().prop_map(Op::SplitOff),
        ]
    }

    proptest! {
        #[test]
        fn packed_items_behave_as_a_vector_of_vectors(ops in proptest::collection::vec(op(), 0..80)) {
            let (mut p, mut m) = (Packed::default(), Vec::<Vec<u8>>::new());
            for op in ops {
                match op {
                    Op::Push(v) => {
                        p.push(&v);
                        m.push(v);
                    }
                    Op::Insert(i, v) => {
                        let i = i % (m.len() + 1);
                        p.insert(i, &v);
                        m.insert(i, v);
                    }
                    Op::Remove(i) if !m.is_empty() => {
                        let i = i % m.len();
                        prop_assert_eq!(p.remove(i), m.remove(i));
                    }
                    Op::Replace(i, v) if !m.is_empty() => {
                        let i = i % m.len();
                        prop_assert_eq!(p.replace(i, &v), std::mem::replace(&mut m[i], v));
                    }
                    Op::SplitOff(i) => {
                        let i = i % (m.len() + 1);
                        let (pr, mr) = (p.split_off(i), m.split_off(i));
                        prop_assert_eq!(pr.iter().collect::<Vec<_>>(), mr.iter().map(Vec::as_slice).collect::<Vec<_>>());
                    }
                    _ => {}
                }
                prop_assert_eq!(p.len(), m.len());
                prop_assert_eq!(p.iter().collect::<Vec<_>>(), m.iter().map(Vec::as_slice).collect::<Vec<_>>());
                let mut sorted = m.clone();
                sorted.sort();
                let mut s = Packed::default();
                for v in &sorted {
                    s.push(v);
                }
                for probe in m.iter().chain([&vec![], &vec![255; 3]]) {
                    let want = sorted.binary_search(probe).map_err(|_| sorted.partition_point(|x| x < probe));
                    // Equal items may be found at any of their places, as for slices.
                    match (s.binary_search(probe), want) {
                        (Ok(i), Ok(_)) => prop_assert_eq!(&s[i], probe.as_slice()),
                        (got, want) => prop_assert_eq!(got, want),
                    }
                    prop_assert_eq!(s.partition_point(|x| x < probe.as_slice()), sorted.partition_point(|x| x < probe));
                }
            }
        }
    }
}
