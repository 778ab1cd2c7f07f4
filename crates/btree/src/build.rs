//! Writing a tree afresh from entries in key order, bottom up, holding one node per level:
//! a tree far larger than memory is rewritten (compacted) in a single pass over the old one.
//!
//! Each node is filled until the next entry does not fit, then written; its first key and
//! place go up into the node above, which fills the same way. The result is the tree that
//! inserting the same entries in order into [`Tree::new`](crate::Tree::new) gives (splits at a
//! node's end keep the left node full), read back by [`Tree::open_at`](crate::Tree::open_at).

use crate::node::{Body, Node, Ptr, ROOM};
use crate::{Paddr, KEY_MAX, VALUE_MAX};

/// Why an entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("key of {0} bytes (at most {KEY_MAX})")]
    KeyTooLong(usize),
    #[error("value of {0} bytes (at most {VALUE_MAX})")]
    ValueTooLong(usize),
    #[error("keys out of order: each must be larger than the one before")]
    OutOfOrder,
}

/// Builds a tree of generation `generation` from entries pushed in increasing key order.
pub struct Builder {
    generation: u64,
    /// The node being filled at each level (0: the leaf), each holding at least one entry.
    open: Vec<Node>,
    last_key: Option<Vec<u8>>,
    /// Nodes written so far.
    written: u64,
}

/// Encoded nodes, with their places, for the caller to write.
pub type Blocks = Vec<(Paddr, Vec<u8>)>;

impl Builder {
    pub fn new(generation: u64) -> Self {
        assert!(
            generation <= crate::GENERATION_MAX,
            "generation {generation}"
        );
        Builder {
            generation,
            open: Vec::new(),
            last_key: None,
            written: 0,
        }
    }

    /// Nodes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Adds an entry; nodes that fill up are placed by `place` and appended to `out`.
    pub fn push(
        &mut self,
        key: &[u8],
        value: &[u8],
        place: &mut dyn FnMut() -> Paddr,
        out: &mut Blocks,
    ) -> Result<(), BuildError> {
        if key.len() > KEY_MAX {
            return Err(BuildError::KeyTooLong(key.len()));
        }
        if value.len() > VALUE_MAX {
            return Err(BuildError::ValueTooLong(value.len()));
        }
        if self.last_key.as_deref().is_some_and(|l| l >= key) {
            return Err(BuildError::OutOfOrder);
        }
        self.last_key = Some(key.to_vec());
        self.add(0, key.to_vec(), Entry::Value(value.to_vec()), place, out);
        Ok(())
    }

    /// Writes the nodes still open, bottom up; returns the root's place. An empty build
    /// gives an empty leaf.
    pub fn finish(mut self, place: &mut dyn FnMut() -> Paddr, out: &mut Blocks) -> Paddr {
        if self.open.is_empty() {
            self.open.push(Node::leaf());
        }
        let mut level = 0;
        loop {
            let top = level + 1 == self.open.len();
            let node = std::mem::replace(&mut self.open[level], Node::leaf());
            // A top node of one child adds nothing: that child is the root.
            if top && level > 0 && node.len() == 1 {
                let Body::Inner(children) = &node.body else {
                    unreachable!("levels above 0 are inner")
                };
                let Ptr::Disk(p) = children[0] else {
                    unreachable!("children are written first")
                };
                return p;
            }
            let first = node.keys.first().map(<[u8]>::to_vec).unwrap_or_default();
            let p = self.write(node, place, out);
            if top {
                return p;
            }
            // The level above takes it as any child: it may fill and be written itself,
            // its first key going further up; the loop meets each level once.
            self.add(level + 1, first, Entry::Child(p), place, out);
            level += 1;
        }
    }

    fn add(
        &mut self,
        level: usize,
        key: Vec<u8>,
        entry: Entry,
        place: &mut dyn FnMut() -> Paddr,
        out: &mut Blocks,
    ) {
        if self.open.len() == level {
            self.open.push(match entry {
                Entry::Value(_) => Node::leaf(),
                Entry::Child(_) => Node {
                    level: level as u8,
                    body: Body::Inner(Vec::new()),
                    ..Node::leaf()
                },
            });
        }
        let size = match &entry {
            Entry::Value(v) => 4 + key.len() + v.len(),
            Entry::Child(_) => 2 + key.len() + 8,
        };
        let node = &mut self.open[level];
        if !node.keys.is_empty() && node.used() + size > ROOM {
            let full = std::mem::replace(
                node,
                Node {
                    level: level as u8,
                    body: match &node.body {
                        Body::Leaf(_) => Body::Leaf(Default::default()),
                        Body::Inner(_) => Body::Inner(Vec::new()),
                    },
                    ..Node::leaf()
                },
            );
            let first = full.keys[0].to_vec();
            let p = self.write(full, place, out);
            self.add(level + 1, first, Entry::Child(p), place, out);
        }
        let node = &mut self.open[level];
        node.keys.push(&key);
        match (&mut node.body, entry) {
            (Body::Leaf(vals), Entry::Value(v)) => vals.push(&v),
            (Body::Inner(children), Entry::Child(p)) => children.push(Ptr::Disk(p)),
            _ => unreachable!("a level holds one kind of entry"),
        }
    }

    fn write(
        &mut self,
        mut node: Node,
        place: &mut dyn FnMut() -> Paddr,
        out: &mut Blocks,
    ) -> Paddr {
        node.generation = self.generation;
        let p = place();
        let block = node.encode(|c| match c {
            Ptr::Disk(p) => p,
            Ptr::Mem(_) => unreachable!("a built node's children are written first"),
        });
        out.push((p, block));
        self.written += 1;
        p
    }
}

enum Entry {
    Value(Vec<u8>),
    Child(Paddr),
}
