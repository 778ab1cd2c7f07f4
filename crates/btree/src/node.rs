//! One node: its in-memory form and its 4 KiB on-disk encoding.
//!
//! ```text
//! 0   4  magic "CRBT"
//! 4   2  format version (1)
//! 6   1  level (0: leaf)
//! 7   1  reserved, zero
//! 8   2  entries n
//! 10  6  generation: the checkpoint that wrote the node (u48; at most its parent's)
//! 16  …  n × entry — leaf: u16 key length, u16 value length, key, value
//!                   inner: u16 key length, key, u64 child paddr
//! …      zero padding
//! 4092 4 CRC-32C of bytes 0..4092
//! ```
//! An inner node's key `i` is the lowest key child `i` may hold (its first key is a lower
//! bound for the whole subtree, kept from when the node was made).

use crate::packed::Packed;
use carmine_types::crc32c;

/// Bytes of a node on the device.
pub const NODE_SIZE: usize = 4096;
const MAGIC: &[u8; 4] = b"CRBT";
const VERSION: u16 = 1;
const HEADER: usize = 16;
const TRAILER: usize = 4;
/// Bytes entries may take in one node.
pub(crate) const ROOM: usize = NODE_SIZE - HEADER - TRAILER;
/// Longest key. With [`VALUE_MAX`], any two entries fit a node, which is what splitting
/// by bytes needs to always find two halves that fit.
pub const KEY_MAX: usize = 512;
/// Longest value: room for a device address and 256 four-byte checksums (an extent of the
/// native store), with a little to spare.
pub const VALUE_MAX: usize = 1040;
// Any two entries of the largest size fit a node (`split_off_upper` relies on it).
const _: () = assert!(2 * (4 + KEY_MAX + VALUE_MAX) <= ROOM);
/// Largest generation a node header holds.
pub const GENERATION_MAX: u64 = (1 << 48) - 1;

/// Where a node lives on the device.
pub type Paddr = u64;

/// Why a block does not decode as a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error("node at {paddr}: not a tree node (bad magic)")]
    Magic { paddr: Paddr },
    #[error("node at {paddr}: checksum mismatch")]
    Checksum { paddr: Paddr },
    #[error("node at {paddr}: unsupported version {version}")]
    Version { paddr: Paddr, version: u16 },
    #[error("node at {paddr}: {detail}")]
    Malformed { paddr: Paddr, detail: String },
}

/// A child of an inner node: on the device only, or loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ptr {
    Disk(Paddr),
    Mem(usize),
}

#[derive(Debug, Clone)]
pub(crate) enum Body {
    Leaf(Packed),
    Inner(Vec<Ptr>),
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub level: u8,
    pub keys: Packed,
    pub body: Body,
    /// Its copy on the device, if it has one.
    pub disk: Option<Paddr>,
    /// Differs from its copy on the device (or has none).
    pub dirty: bool,
    /// The generation it was written with (0 before it is written).
    pub generation: u64,
    /// When an operation last went through it (the tree's clock): eviction takes the least
    /// recently used first.
    pub used: std::cell::Cell<u64>,
}

impl Node {
    pub fn leaf() -> Self {
        Node {
            level: 0,
            keys: Packed::default(),
            body: Body::Leaf(Packed::default()),
            disk: None,
            dirty: true,
            generation: 0,
            used: Default::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    fn entry_size(&self, i: usize) -> usize {
        match &self.body {
            Body::Leaf(vals) => 4 + self.keys[i].len() + vals[i].len(),
            Body::Inner(_) => 2 + self.keys[i].len() + 8,
        }
    }

    /// Bytes its entries take when encoded.
    pub fn used(&self) -> usize {
        match &self.body {
            Body::Leaf(vals) => 4 * self.len() + self.keys.bytes_len() + vals.bytes_len(),
            Body::Inner(_) => 10 * self.len() + self.keys.bytes_len(),
        }
    }

    /// Index of the child whose range holds `key` (inner nodes).
    pub fn child_for(&self, key: &[u8]) -> usize {
        self.keys.partition_point(|k| k <= key).saturating_sub(1)
    }

    /// Moves the upper part of its entries, by bytes, into a new node of the same level;
    /// only the last one if `last_only`.
    pub fn split_off_upper(&mut self, last_only: bool) -> Node {
        let total = self.used();
        let mut acc = 0;
        let mut at = 0;
        while at < self.len() && acc + self.entry_size(at) <= total / 2 {
            acc += self.entry_size(at);
            at += 1;
        }
        // The entry that crosses the middle goes right; but if the right then overflows
        // (a large entry just past a small half), it goes left, which then fits: a node
        // overflows by at most one entry (an inner node also by a first bound lowered to a
        // longer key, at most KEY_MAX more), and two largest entries fit a node.
        if at < self.len() && total - acc > ROOM {
            at += 1;
        }
        // Only the last goes when the others fit without it (an inner node whose first
        // bound grew may not).
        if last_only && total - self.entry_size(self.len() - 1) <= ROOM {
            at = self.len() - 1;
        }
        let at = at.clamp(1, self.len() - 1);
        let keys = self.keys.split_off(at);
        let body = match &mut self.body {
            Body::Leaf(vals) => Body::Leaf(vals.split_off(at)),
            Body::Inner(children) => Body::Inner(children.split_off(at)),
        };
        Node {
            level: self.level,
            keys,
            body,
            disk: None,
            dirty: true,
            generation: self.generation,
            used: Default::default(),
        }
    }

    /// The node's block. Every child must have a place on the device (`child_paddr`).
    pub fn encode(&self, child_paddr: impl Fn(Ptr) -> Paddr) -> Vec<u8> {
        // Past this the block would lose entries, which would show only at the next read.
        assert!(self.used() <= ROOM, "a node of {} bytes", self.used());
        let mut b = Vec::with_capacity(NODE_SIZE);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.push(self.level);
        b.push(0);
        b.extend_from_slice(&(self.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.generation.to_le_bytes()[..6]);
        for (i, k) in self.keys.iter().enumerate() {
            b.extend_from_slice(&(k.len() as u16).to_le_bytes());
            match &self.body {
                Body::Leaf(vals) => {
                    b.extend_from_slice(&(vals[i].len() as u16).to_le_bytes());
                    b.extend_from_slice(k);
                    b.extend_from_slice(&vals[i]);
                }
                Body::Inner(children) => {
                    b.extend_from_slice(k);
                    b.extend_from_slice(&child_paddr(children[i]).to_le_bytes());
                }
            }
        }
        b.resize(NODE_SIZE - TRAILER, 0);
        let crc = crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes the block read from `paddr`: checksum first, then every length against the
    /// block, so damage is an error, never a panic or a wrong node.
    pub fn decode(paddr: Paddr, block: &[u8]) -> Result<Node, NodeError> {
        if block.len() != NODE_SIZE || &block[..4] != MAGIC {
            return Err(NodeError::Magic { paddr });
        }
        let stored = u32::from_le_bytes(block[NODE_SIZE - TRAILER..].try_into().unwrap());
        if crc32c(&block[..NODE_SIZE - TRAILER]) != stored {
            return Err(NodeError::Checksum { paddr });
        }
        let version = u16::from_le_bytes([block[4], block[5]]);
        if version != VERSION {
            return Err(NodeError::Version { paddr, version });
        }
        let bad = |detail: String| NodeError::Malformed { paddr, detail };
        let level = block[6];
        let n = u16::from_le_bytes([block[8], block[9]]) as usize;
        let mut generation = [0u8; 8];
        generation[..6].copy_from_slice(&block[10..16]);
        let generation = u64::from_le_bytes(generation);
        let body_end = NODE_SIZE - TRAILER;
        let mut at = HEADER;
        let mut take = |len: usize, what: &str| -> Result<&[u8], NodeError> {
            if at + len > body_end {
                return Err(bad(format!("{what} runs past the node's end")));
            }
            let s = &block[at..at + len];
            at += len;
            Ok(s)
        };
        let u16_at = |s: &[u8]| u16::from_le_bytes([s[0], s[1]]) as usize;
        let mut keys = Packed::with_capacity(n, body_end - HEADER);
        let body = if level == 0 {
            let mut vals = Packed::with_capacity(n, body_end - HEADER);
            for _ in 0..n {
                let klen = u16_at(take(2, "key length")?);
                let vlen = u16_at(take(2, "value length")?);
                if klen > KEY_MAX || vlen > VALUE_MAX {
                    return Err(bad(format!("entry of {klen}+{vlen} bytes")));
                }
                keys.push(take(klen, "key")?);
                vals.push(take(vlen, "value")?);
            }
            vals.shrink_to_fit();
            Body::Leaf(vals)
        } else {
            let mut children = Vec::with_capacity(n);
            for _ in 0..n {
                let klen = u16_at(take(2, "key length")?);
                if klen > KEY_MAX {
                    return Err(bad(format!("key of {klen} bytes")));
                }
                keys.push(take(klen, "key")?);
                let p = take(8, "child")?;
                children.push(Ptr::Disk(u64::from_le_bytes(p.try_into().unwrap())));
            }
            if n == 0 {
                return Err(bad("inner node without children".into()));
            }
            Body::Inner(children)
        };
        keys.shrink_to_fit();
        if (1..keys.len()).any(|i| keys[i - 1] >= keys[i]) {
            return Err(bad("keys out of order".into()));
        }
        Ok(Node {
            level,
            keys,
            body,
            disk: Some(paddr),
            dirty: false,
            generation,
            used: Default::default(),
        })
    }
}
