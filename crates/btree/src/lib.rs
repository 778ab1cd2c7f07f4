//! A copy-on-write B+tree of 4 KiB checksummed nodes, loaded on demand — the native store's
//! second-generation metadata (decision 0013, step 1). Pure code: no I/O.
//!
//! - Nodes live in memory while loaded; a node the tree needs but does not hold makes the
//!   operation fail with [`TreeError::Need`] *before anything changed*: the caller reads that
//!   block, hands it to [`Tree::load`] and tries again. So the tree never blocks and never
//!   does I/O, and the store decides where and when to read.
//! - Changing a node makes it and every node above it dirty. [`Tree::flush`] writes the dirty
//!   nodes bottom up, each to a new place the caller chooses (never over its old copy), and
//!   returns the new root, the blocks to write, and the places no longer referenced (to be
//!   reused once the new root is durable).
//! - [`Tree::evict_clean`] drops loaded nodes that equal their copy on the device.
//!
//! Deletion removes empty nodes but does not merge underfull siblings: a tree that shrinks
//! keeps some slack until its keys are written again. Keys and values have bounded sizes
//! ([`KEY_MAX`], [`VALUE_MAX`]) so any two entries fit a node.

mod build;
mod node;
mod packed;

pub use build::{Blocks, BuildError, Builder};

use node::{Body, Node, Ptr, ROOM};
pub use node::{NodeError, Paddr, GENERATION_MAX, KEY_MAX, NODE_SIZE, VALUE_MAX};
use packed::Packed;

/// A node an operation needs is on the device only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub paddr: Paddr,
    /// A key that leads to it from the root: what [`Tree::load`] follows.
    pub key: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("tree node at {} is not loaded", .0.paddr)]
    Need(Need),
    #[error("key of {0} bytes (at most {KEY_MAX})")]
    KeyTooLong(usize),
    #[error("value of {0} bytes (at most {VALUE_MAX})")]
    ValueTooLong(usize),
}

fn need(paddr: Paddr, key: &[u8]) -> TreeError {
    TreeError::Need(Need {
        paddr,
        key: key.to_vec(),
    })
}

/// Why [`Tree::load`] refused a block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("no unloaded node at {paddr} on the way to that key")]
    NotWanted { paddr: Paddr },
    #[error("node at {paddr} is at level {found}, its parent expects {expected}")]
    WrongLevel {
        paddr: Paddr,
        found: u8,
        expected: u8,
    },
    /// Written after the node (or the checkpoint) that points to it: the block was reused.
    #[error("node at {paddr} is of generation {found}, newer than the {limit} that points to it")]
    Newer {
        paddr: Paddr,
        found: u64,
        limit: u64,
    },
}

/// A node read on its own by [`walk_node`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walked {
    pub level: u8,
    pub generation: u64,
    pub visited: Visited,
}

/// What a node read on its own holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visited {
    /// An inner node: its children, in key order, each with a key that leads to it (a lower
    /// bound of the keys below it).
    Inner(Vec<Need>),
    /// A leaf: its entries, in key order.
    Leaf(Vec<(Vec<u8>, Vec<u8>)>),
}

/// Decodes the block of the node `need` names, for a walk over a whole tree that keeps
/// nothing in a [`Tree`] (a tree far larger than memory): checked as [`Tree::load`] checks
/// a node against its parent — `expected_level` one below the parent's (`None`: the root,
/// any level) and a generation no newer than `generation_limit` (the parent's, or for the
/// root the checkpoint's). The walker keeps the rest: visiting each node once, and keys in
/// the bounds their routes give.
pub fn walk_node(
    need: &Need,
    block: &[u8],
    expected_level: Option<u8>,
    generation_limit: u64,
) -> Result<Walked, LoadError> {
    let node = decode_checked(need, block, expected_level, generation_limit)?;
    Ok(Walked::of(node, need))
}

impl Walked {
    fn of(node: Node, need: &Need) -> Self {
        let visited = match node.body {
            Body::Leaf(vals) => Visited::Leaf(
                (node.keys.iter().map(<[u8]>::to_vec))
                    .zip(vals.iter().map(<[u8]>::to_vec))
                    .collect(),
            ),
            Body::Inner(_) => Visited::Inner(Tree::children_of(&node, need)),
        };
        Walked {
            level: node.level,
            generation: node.generation,
            visited,
        }
    }

    /// The child on the way to `key`, if this is an inner node (`key` at or after the key
    /// that led here).
    pub fn toward(&self, key: &[u8]) -> Option<&Need> {
        let Visited::Inner(children) = &self.visited else {
            return None;
        };
        let i = children
            .partition_point(|c| c.key.as_slice() <= key)
            .saturating_sub(1);
        children.get(i)
    }

    /// The route key of the child after the one on the way to `key`: the lowest key above
    /// that child's subtree, if this node holds it.
    pub fn bound_after(&self, key: &[u8]) -> Option<&[u8]> {
        let Visited::Inner(children) = &self.visited else {
            return None;
        };
        let i = children.partition_point(|c| c.key.as_slice() <= key);
        children.get(i.max(1)).map(|c| c.key.as_slice())
    }
}

/// Decodes a node and checks its level and generation against what its parent expects.
fn decode_checked(
    need: &Need,
    block: &[u8],
    expected_level: Option<u8>,
    generation_limit: u64,
) -> Result<Node, LoadError> {
    let node = Node::decode(need.paddr, block)?;
    if node.generation > generation_limit {
        return Err(LoadError::Newer {
            paddr: need.paddr,
            found: node.generation,
            limit: generation_limit,
        });
    }
    if let Some(expected) = expected_level {
        if node.level != expected {
            return Err(LoadError::WrongLevel {
                paddr: need.paddr,
                found: node.level,
                expected,
            });
        }
    }
    Ok(node)
}

/// What [`Tree::place_dirty_at`] did: the dirty nodes have their places and are clean, but
/// their blocks are encoded only when asked ([`Tree::encode_placed`]), so a large flush never
/// holds its nodes twice.
#[derive(Debug, Default)]
pub struct Placed {
    pub root: Paddr,
    /// The nodes to write (place, the node's handle), children before their parents.
    pub nodes: Vec<(Paddr, usize)>,
    /// As [`Flushed::freed`].
    pub freed: Vec<Paddr>,
}

/// What [`Tree::flush`] produced.
#[derive(Debug, Default)]
pub struct Flushed {
    pub root: Paddr,
    /// Blocks to write, children before their parents.
    pub writes: Vec<(Paddr, Vec<u8>)>,
    /// Places the tree no longer references once `root` is the root: free them only after
    /// the checkpoint naming `root` is durable.
    pub freed: Vec<Paddr>,
}

pub struct Tree {
    nodes: Vec<Option<Node>>,
    free_ids: Vec<usize>,
    root: Ptr,
    /// The level the root must have when it is loaded from the device (`None`: any).
    root_level: Option<u8>,
    /// The newest generation the root may have when it is loaded from the device.
    root_generation: u64,
    /// Device copies of nodes removed from the tree since the last flush.
    removed: Vec<Paddr>,
    /// Counts node visits, for least-recently-used eviction.
    clock: std::cell::Cell<u64>,
}

impl Default for Tree {
    fn default() -> Self {
        Self::new()
    }
}

impl Tree {
    /// An empty tree (one empty leaf, dirty).
    pub fn new() -> Self {
        Tree {
            nodes: vec![Some(Node::leaf())],
            free_ids: Vec::new(),
            root: Ptr::Mem(0),
            root_level: Some(0),
            root_generation: GENERATION_MAX,
            removed: Vec::new(),
            clock: Default::default(),
        }
    }

    /// The tree whose root node is at `root` on the device; nothing loaded yet.
    pub fn open(root: Paddr) -> Self {
        Self::open_at(root, GENERATION_MAX)
    }

    /// The tree whose root node is at `root`, written by a flush of generation `generation`
    /// (see [`Tree::flush_at`]): a node of a later generation met on the way is a block
    /// reused since, and refused by [`Tree::load`].
    pub fn open_at(root: Paddr, generation: u64) -> Self {
        Tree {
            nodes: Vec::new(),
            free_ids: Vec::new(),
            root: Ptr::Disk(root),
            root_level: None,
            root_generation: generation,
            removed: Vec::new(),
            clock: Default::default(),
        }
    }

    /// Nodes held in memory.
    pub fn loaded(&self) -> usize {
        self.nodes.len() - self.free_ids.len()
    }

    /// Whether anything changed since the last flush.
    pub fn is_dirty(&self) -> bool {
        match self.root {
            Ptr::Disk(_) => false,
            Ptr::Mem(id) => self.node(id).dirty,
        }
    }

    fn node(&self, id: usize) -> &Node {
        self.nodes[id].as_ref().expect("live node id")
    }

    /// Notes that an operation went through node `id`.
    fn touch(&self, id: usize) {
        let now = self.clock.get() + 1;
        self.clock.set(now);
        self.node(id).used.set(now);
    }

    fn node_mut(&mut self, id: usize) -> &mut Node {
        self.nodes[id].as_mut().expect("live node id")
    }

    fn alloc(&mut self, n: Node) -> usize {
        match self.free_ids.pop() {
            Some(id) => {
                self.nodes[id] = Some(n);
                id
            }
            None => {
                self.nodes.push(Some(n));
                self.nodes.len() - 1
            }
        }
    }

    fn release(&mut self, id: usize) {
        let n = self.nodes[id].take().expect("live node id");
        if let Some(p) = n.disk {
            self.removed.push(p);
        }
        self.free_ids.push(id);
    }

    /// The loaded nodes from the root to the leaf that holds `key`, each with the index of
    /// the child taken from it.
    fn descend(&self, key: &[u8]) -> Result<Vec<(usize, usize)>, TreeError> {
        let mut path = Vec::new();
        let mut ptr = self.root;
        loop {
            let id = match ptr {
                Ptr::Disk(paddr) => return Err(need(paddr, key)),
                Ptr::Mem(id) => id,
            };
            self.touch(id);
            let n = self.node(id);
            match &n.body {
                Body::Leaf(_) => {
                    path.push((id, 0));
                    return Ok(path);
                }
                Body::Inner(children) => {
                    let i = n.child_for(key);
                    path.push((id, i));
                    ptr = children[i];
                }
            }
        }
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<&[u8]>, TreeError> {
        let path = self.descend(key)?;
        let leaf = self.node(path.last().expect("a path ends in a leaf").0);
        let Body::Leaf(vals) = &leaf.body else {
            unreachable!("descend ends in a leaf")
        };
        Ok(leaf.keys.binary_search(key).ok().map(|i| &vals[i]))
    }

    fn make_dirty(&mut self, path: &[(usize, usize)]) {
        for &(id, _) in path {
            self.node_mut(id).dirty = true;
        }
    }

    /// Sets `key` to `value`; returns the value it replaced.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, TreeError> {
        if key.len() > KEY_MAX {
            return Err(TreeError::KeyTooLong(key.len()));
        }
        if value.len() > VALUE_MAX {
            return Err(TreeError::ValueTooLong(value.len()));
        }
        let path = self.descend(key)?;
        self.make_dirty(&path);
        // A key below an inner node's first bound goes to its first child: lower the bound,
        // so every bound stays at most every key below it (a split of that child must not
        // hand its parent a bound equal to, or below, the first one).
        for &(id, at) in &path[..path.len() - 1] {
            let n = self.node_mut(id);
            if at == 0 && key < &n.keys[0] {
                n.keys.replace(0, key);
            }
        }
        let leaf_id = path.last().expect("a path ends in a leaf").0;
        let leaf = self.node_mut(leaf_id);
        let Body::Leaf(vals) = &mut leaf.body else {
            unreachable!("descend ends in a leaf")
        };
        let (old, appended) = match leaf.keys.binary_search(key) {
            Ok(i) => (Some(vals.replace(i, value)), false),
            Err(i) => {
                leaf.keys.insert(i, key);
                vals.insert(i, value);
                (None, i + 1 == leaf.keys.len())
            }
        };
        self.split_overfull(&path, appended);
        Ok(old)
    }

    /// Splits the nodes of `path` that no longer fit, from the leaf up. `appended`: the new
    /// entry is the leaf's last. A node that overflows because an entry was added at its
    /// end keeps all the others (they fit before): keys that come in ascending order, as a
    /// checkpoint's new objects do, then fill nodes instead of leaving them half empty.
    /// Every node of the path is looked at, not only up to the first that fits: an inner
    /// node whose first bound was lowered to a longer key may overflow with nothing below.
    fn split_overfull(&mut self, path: &[(usize, usize)], mut appended: bool) {
        for depth in (0..path.len()).rev() {
            let (id, _) = path[depth];
            if self.node(id).used() <= ROOM {
                appended = false;
                continue;
            }
            let right = self.node_mut(id).split_off_upper(appended);
            let right_key = right.keys[0].to_vec();
            let rid = self.alloc(right);
            if depth == 0 {
                let left = self.node(id);
                let root = Node {
                    level: left.level + 1,
                    keys: {
                        let mut keys = Packed::default();
                        keys.push(&left.keys[0]);
                        keys.push(&right_key);
                        keys
                    },
                    body: Body::Inner(vec![Ptr::Mem(id), Ptr::Mem(rid)]),
                    disk: None,
                    dirty: true,
                    // Until it is flushed, it bounds its children as the node it grew
                    // from did (so does the split-off half).
                    generation: left.generation,
                    used: Default::default(),
                };
                let root_id = self.alloc(root);
                self.root = Ptr::Mem(root_id);
                self.root_level = None;
                return;
            }
            let (parent, at) = path[depth - 1];
            let p = self.node_mut(parent);
            p.keys.insert(at + 1, &right_key);
            appended = at + 2 == p.keys.len();
            let Body::Inner(children) = &mut p.body else {
                unreachable!("a parent is an inner node")
            };
            children.insert(at + 1, Ptr::Mem(rid));
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, TreeError> {
        let path = self.descend(key)?;
        let leaf_id = path.last().expect("a path ends in a leaf").0;
        let Ok(i) = self.node(leaf_id).keys.binary_search(key) else {
            return Ok(None);
        };
        self.make_dirty(&path);
        let leaf = self.node_mut(leaf_id);
        leaf.keys.remove(i);
        let Body::Leaf(vals) = &mut leaf.body else {
            unreachable!("descend ends in a leaf")
        };
        let old = vals.remove(i);
        // Empty nodes leave their parents, up to (not including) the root.
        for depth in (1..path.len()).rev() {
            let (id, _) = path[depth];
            if self.node(id).len() > 0 {
                break;
            }
            self.release(id);
            let (parent, at) = path[depth - 1];
            let p = self.node_mut(parent);
            p.keys.remove(at);
            let Body::Inner(children) = &mut p.body else {
                unreachable!("a parent is an inner node")
            };
            children.remove(at);
        }
        self.collapse_root();
        Ok(Some(old))
    }

    /// A root with one loaded child gives way to it; an inner root left without children
    /// becomes an empty leaf.
    fn collapse_root(&mut self) {
        while let Ptr::Mem(id) = self.root {
            let n = self.node(id);
            let Body::Inner(children) = &n.body else {
                return;
            };
            match children.as_slice() {
                [] => {
                    let mut leaf = Node::leaf();
                    leaf.disk = n.disk;
                    *self.node_mut(id) = leaf;
                    self.root_level = Some(0);
                    return;
                }
                [Ptr::Mem(child)] => {
                    let child = *child;
                    self.release(id);
                    self.node_mut(child).dirty = true;
                    self.root = Ptr::Mem(child);
                    self.root_level = None;
                }
                _ => return,
            }
        }
    }

    /// Up to `limit` entries with keys from `from` (inclusive) to `to` (exclusive; `None`:
    /// the end), in order.
    #[allow(clippy::type_complexity)]
    pub fn range(
        &self,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, TreeError> {
        let mut out = Vec::new();
        self.collect(self.root, from, from, to, limit, &mut out)?;
        Ok(out)
    }

    /// As [`Tree::range`], into `out`; on [`TreeError::Need`] the entries before the node
    /// it needs are in `out` already (a scan goes on from after the last of them).
    pub fn range_into(
        &self,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<(), TreeError> {
        let limit = out.len().saturating_add(limit);
        self.collect(self.root, from, from, to, limit, out)
    }

    /// The lowest key above the subtree that holds `key` as far down as the tree is in
    /// memory: the next sibling's route key at the deepest loaded node on the way that has
    /// one (`None`: nothing after it). A scan that read the node below without hanging it
    /// in the tree goes on from there.
    pub fn bound_after(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut bound = None;
        let mut ptr = self.root;
        while let Ptr::Mem(id) = ptr {
            let n = self.node(id);
            let Body::Inner(children) = &n.body else {
                break;
            };
            let i = n.child_for(key);
            if let Some(next) = n.keys.get(i + 1) {
                bound = Some(next.to_vec());
            }
            ptr = children[i];
        }
        bound
    }

    /// The first `count` nodes not in memory that a scan from `from` meets, in key order:
    /// what to read ahead, all at once, for it to go on. They are the next ones the scan
    /// reads: leaves, or one inner node (its children come after it is read), never leaves
    /// beyond an inner node still on the device.
    pub fn needs_from(&self, from: &[u8], count: usize) -> Vec<Need> {
        let mut out = Vec::new();
        if let Ptr::Disk(paddr) = self.root {
            out.push(Need {
                paddr,
                key: from.to_vec(),
            });
            return out;
        }
        self.gather_needs(self.root, from, from, count, &mut out);
        out
    }

    /// `needs_from` under loaded node `ptr`; false once it must stop (`count` reached, or
    /// an inner node on the device met).
    fn gather_needs(
        &self,
        ptr: Ptr,
        route: &[u8],
        from: &[u8],
        count: usize,
        out: &mut Vec<Need>,
    ) -> bool {
        let Ptr::Mem(id) = ptr else {
            unreachable!("only loaded nodes are walked")
        };
        let n = self.node(id);
        let Body::Inner(children) = &n.body else {
            return true;
        };
        let first = n.child_for(from);
        for (i, (k, child)) in n.keys.iter().zip(children).enumerate().skip(first) {
            if out.len() >= count {
                return false;
            }
            let route = if i == first { route } else { k };
            match child {
                Ptr::Disk(paddr) => {
                    out.push(Need {
                        paddr: *paddr,
                        key: route.to_vec(),
                    });
                    // Past an inner node on the device lie leaves the scan reaches only
                    // after that node's: read it first.
                    if n.level > 1 {
                        return false;
                    }
                }
                Ptr::Mem(_) => {
                    if !self.gather_needs(*child, route, from, count, out) {
                        return false;
                    }
                }
            }
        }
        true
    }

    fn collect(
        &self,
        ptr: Ptr,
        route: &[u8],
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<(), TreeError> {
        let id = match ptr {
            Ptr::Disk(paddr) => return Err(need(paddr, route)),
            Ptr::Mem(id) => id,
        };
        self.touch(id);
        let n = self.node(id);
        match &n.body {
            Body::Leaf(vals) => {
                let start = n.keys.partition_point(|k| k < from);
                for (k, v) in n.keys.iter().zip(vals.iter()).skip(start) {
                    if out.len() >= limit || to.is_some_and(|t| k >= t) {
                        break;
                    }
                    out.push((k.to_vec(), v.to_vec()));
                }
            }
            Body::Inner(children) => {
                let first = n.child_for(from);
                for (i, (k, child)) in n.keys.iter().zip(children).enumerate().skip(first) {
                    if out.len() >= limit || to.is_some_and(|t| k >= t) {
                        break;
                    }
                    // The route to a child: `from` for the first one visited (it holds
                    // `from`), else the child's own lower bound.
                    let route = if i == first { route } else { k };
                    self.collect(*child, route, from, to, limit, out)?;
                }
            }
        }
        Ok(())
    }

    /// The device places of the loaded nodes that have one.
    pub fn loaded_paddrs(&self) -> impl Iterator<Item = Paddr> + '_ {
        self.nodes.iter().flatten().filter_map(|n| n.disk)
    }

    /// Loaded nodes that differ from their device copy (or have none): what a flush writes.
    pub fn dirty_nodes(&self) -> usize {
        self.nodes.iter().flatten().filter(|n| n.dirty).count()
    }

    /// Decodes `block` as the node `need` names, checked as [`Tree::load`] checks it, and
    /// keeps nothing: for a reader that may not grow the tree (nodes below it are checked
    /// against it with [`walk_node`]).
    pub fn peek(&self, need: &Need, block: &[u8]) -> Result<Walked, LoadError> {
        let (node, _) = self.checked(need, block)?;
        Ok(Walked::of(node, need))
    }

    /// Takes the block of a node an operation needed (`need`, from a [`TreeError::Need`]):
    /// checks it and hangs it where the tree expects it. Returns its children, all on the
    /// device, each with a key that leads to it: loading them in turn brings the whole tree
    /// into memory, level by level, each node read once.
    pub fn load(&mut self, need: &Need, block: &[u8]) -> Result<Vec<Need>, LoadError> {
        let (node, parent) = self.checked(need, block)?;
        let children = Self::children_of(&node, need);
        self.attach(node, parent);
        Ok(children)
    }

    /// Decodes `block` as the node `need` names and checks it against the tree: it must be
    /// wanted there, no newer than its parent, and at the level below it. Returns it with
    /// where it hangs (parent node, child index; `None`: it is the root).
    #[allow(clippy::type_complexity)]
    fn checked(
        &self,
        need: &Need,
        block: &[u8],
    ) -> Result<(Node, Option<(usize, usize)>), LoadError> {
        let mut ptr = self.root;
        let mut parent: Option<(usize, usize)> = None;
        loop {
            match ptr {
                Ptr::Disk(p) if p == need.paddr => break,
                Ptr::Disk(p) => return Err(LoadError::NotWanted { paddr: p }),
                Ptr::Mem(id) => {
                    let n = self.node(id);
                    let Body::Inner(children) = &n.body else {
                        return Err(LoadError::NotWanted { paddr: need.paddr });
                    };
                    let i = n.child_for(&need.key);
                    parent = Some((id, i));
                    ptr = children[i];
                }
            }
        }
        let limit = match parent {
            Some((pid, _)) => self.node(pid).generation,
            None => self.root_generation,
        };
        let expected = match parent {
            Some((pid, _)) => Some(self.node(pid).level - 1),
            None => self.root_level,
        };
        let node = decode_checked(need, block, expected, limit)?;
        Ok((node, parent))
    }

    /// A decoded node's children (all on the device), each with a key that leads to it.
    fn children_of(node: &Node, need: &Need) -> Vec<Need> {
        match &node.body {
            Body::Leaf(_) => Vec::new(),
            Body::Inner(children) => node
                .keys
                .iter()
                .zip(children)
                .enumerate()
                .map(|(i, (k, c))| Need {
                    paddr: match c {
                        Ptr::Disk(p) => *p,
                        Ptr::Mem(_) => unreachable!("a decoded node points to the device"),
                    },
                    // The first child is reached by the node's own route, the others by
                    // their lower bound (as `range` does).
                    key: if i == 0 { need.key.clone() } else { k.to_vec() },
                })
                .collect(),
        }
    }

    /// Hangs a checked node where [`Tree::checked`] found its place.
    fn attach(&mut self, node: Node, parent: Option<(usize, usize)>) {
        let id = self.alloc(node);
        // Read because something wants it: the least recently used go first, not it.
        self.touch(id);
        match parent {
            None => {
                self.root = Ptr::Mem(id);
                self.root_level = None;
            }
            Some((pid, i)) => {
                let Body::Inner(children) = &mut self.node_mut(pid).body else {
                    unreachable!("checked: a parent is an inner node")
                };
                children[i] = Ptr::Mem(id);
            }
        }
    }

    /// Writes every dirty node to a new place from `place`, children first, as generation 0.
    pub fn flush(&mut self, place: &mut dyn FnMut() -> Paddr) -> Flushed {
        self.flush_at(0, place)
    }

    /// Writes every dirty node to a new place from `place`, children first, marked with
    /// `generation` (at most [`GENERATION_MAX`]; at least that of every earlier flush), so
    /// that a reader can tell a node from a later flush that took a freed place.
    pub fn flush_at(&mut self, generation: u64, place: &mut dyn FnMut() -> Paddr) -> Flushed {
        let placed = self.place_dirty_at(generation, place);
        let writes = (placed.nodes.iter())
            .map(|&(p, id)| (p, self.encode_placed(p, id).expect("placed just now")))
            .collect();
        Flushed {
            root: placed.root,
            writes,
            freed: placed.freed,
        }
    }

    /// As [`Tree::flush_at`], but the blocks are left to [`Tree::encode_placed`]: each must
    /// be encoded and written before the nodes placed are evicted (the caller keeps the
    /// tree from evicting until the new root is durable).
    pub fn place_dirty_at(&mut self, generation: u64, place: &mut dyn FnMut() -> Paddr) -> Placed {
        assert!(generation <= GENERATION_MAX, "generation {generation}");
        let mut out = Placed {
            freed: std::mem::take(&mut self.removed),
            ..Placed::default()
        };
        out.root = match self.root {
            Ptr::Disk(p) => p,
            Ptr::Mem(id) => self.flush_node(id, generation, place, &mut out),
        };
        out
    }

    /// The block of a node [`Tree::place_dirty_at`] placed at `paddr`; `None` if that node
    /// is no longer loaded as it was placed (evicted, or changed and placed again).
    pub fn encode_placed(&self, paddr: Paddr, id: usize) -> Option<Vec<u8>> {
        let n = self.nodes.get(id)?.as_ref()?;
        if n.disk != Some(paddr) || n.dirty {
            return None;
        }
        let child_place = |c: Ptr| match c {
            Ptr::Disk(p) => Some(p),
            Ptr::Mem(cid) => self.nodes.get(cid)?.as_ref()?.disk,
        };
        if let Body::Inner(children) = &n.body {
            if children.iter().any(|c| child_place(*c).is_none()) {
                return None;
            }
        }
        Some(n.encode(|c| child_place(c).expect("checked above")))
    }

    fn flush_node(
        &mut self,
        id: usize,
        generation: u64,
        place: &mut dyn FnMut() -> Paddr,
        out: &mut Placed,
    ) -> Paddr {
        let n = self.node(id);
        if !n.dirty {
            // Clean: so is everything loaded below it (changes dirty the whole path).
            return n.disk.expect("a clean node has a copy on the device");
        }
        if let Body::Inner(children) = &n.body {
            let loaded: Vec<usize> = children
                .iter()
                .filter_map(|c| match c {
                    Ptr::Mem(cid) => Some(*cid),
                    Ptr::Disk(_) => None,
                })
                .collect();
            for cid in loaded {
                self.flush_node(cid, generation, place, out);
            }
        }
        let new = place();
        let n = self.node_mut(id);
        n.generation = generation;
        out.freed.extend(n.disk);
        out.nodes.push((new, id));
        n.disk = Some(new);
        n.dirty = false;
        // Changes grew its buffers by doubling; clean, it may stay cached for long, counted
        // as one block.
        n.keys.shrink_to_fit();
        if let Body::Leaf(vals) = &mut n.body {
            vals.shrink_to_fit();
        }
        new
    }

    /// Drops loaded nodes, least recently used first, until at most `max_loaded` are held
    /// (or none can go: the root, dirty nodes and the nodes above them stay). A node goes
    /// only if it equals its copy on the device and none of its children is loaded. Returns
    /// how many were dropped.
    pub fn evict_to(&mut self, max_loaded: usize) -> usize {
        let mut dropped = 0;
        while self.loaded() > max_loaded {
            let Ptr::Mem(root) = self.root else {
                break;
            };
            // Candidates: (last use, parent, child index, child).
            let mut cands = Vec::new();
            let mut stack = vec![root];
            while let Some(id) = stack.pop() {
                let Body::Inner(children) = &self.node(id).body else {
                    continue;
                };
                for (i, c) in children.iter().enumerate() {
                    let Ptr::Mem(cid) = *c else { continue };
                    if !self.node(cid).dirty && self.childless(cid) {
                        cands.push((self.node(cid).used.get(), id, i, cid));
                    } else {
                        stack.push(cid);
                    }
                }
            }
            if cands.is_empty() {
                break;
            }
            cands.sort_unstable();
            let want = self.loaded() - max_loaded;
            for &(_, parent, i, cid) in cands.iter().take(want) {
                self.unload(parent, i, cid);
                dropped += 1;
            }
        }
        dropped
    }

    /// Whether loaded node `id` has no loaded child.
    fn childless(&self, id: usize) -> bool {
        match &self.node(id).body {
            Body::Leaf(_) => true,
            Body::Inner(cc) => cc.iter().all(|p| matches!(p, Ptr::Disk(_))),
        }
    }

    /// Drops clean node `cid`, child `i` of `parent`: the parent points to its device copy.
    fn unload(&mut self, parent: usize, i: usize, cid: usize) {
        let paddr = self
            .node(cid)
            .disk
            .expect("a clean node has a copy on the device");
        self.nodes[cid] = None;
        self.free_ids.push(cid);
        let Body::Inner(cs) = &mut self.node_mut(parent).body else {
            unreachable!("a parent is an inner node")
        };
        cs[i] = Ptr::Disk(paddr);
    }

    /// Drops the loaded nodes all of whose keys lie below `key` (a scan in key order has
    /// passed them) that equal their copy on the device, children first, so whole clean
    /// subtrees behind the scan go and nothing ahead of it does. Returns how many.
    pub fn evict_before(&mut self, key: &[u8]) -> usize {
        match self.root {
            Ptr::Mem(root) => self.evict_below(root, None, key),
            Ptr::Disk(_) => 0,
        }
    }

    /// `evict_before` under inner node `id`, whose keys lie below `upper` (`None`: no bound).
    fn evict_below(&mut self, id: usize, upper: Option<&[u8]>, key: &[u8]) -> usize {
        let n = self.node(id);
        let Body::Inner(children) = &n.body else {
            return 0;
        };
        // Children that start below `key`, each with its upper bound (the next one's key).
        let passed: Vec<(usize, usize, Option<Vec<u8>>)> = children
            .iter()
            .enumerate()
            .take_while(|(i, _)| *i == 0 || &n.keys[*i] < key)
            .filter_map(|(i, c)| match c {
                Ptr::Mem(cid) => Some((
                    i,
                    *cid,
                    n.keys
                        .get(i + 1)
                        .map(<[u8]>::to_vec)
                        .or_else(|| upper.map(<[u8]>::to_vec)),
                )),
                Ptr::Disk(_) => None,
            })
            .collect();
        let mut dropped = 0;
        for (i, cid, child_upper) in passed {
            dropped += self.evict_below(cid, child_upper.as_deref(), key);
            let behind = child_upper.as_deref().is_some_and(|u| u <= key);
            if behind && !self.node(cid).dirty && self.childless(cid) {
                self.unload(id, i, cid);
                dropped += 1;
            }
        }
        dropped
    }

    /// Drops every loaded node below the root that equals its copy on the device and has no
    /// loaded child: repeated, whole clean subtrees go. Returns how many were dropped.
    pub fn evict_clean(&mut self) -> usize {
        self.evict_to(0)
    }
}

/// For the fuzz target of the node decoder (`fuzz/fuzz_targets/tree_node.rs`).
#[doc(hidden)]
pub mod fuzzing {
    use crate::node::{Node, Ptr};

    /// Decodes `block` as the node at place 1 and, if it decodes, encodes it again.
    pub fn decode_and_reencode(block: &[u8]) -> Option<Vec<u8>> {
        let n = Node::decode(1, block).ok()?;
        Some(n.encode(|c| match c {
            Ptr::Disk(p) => p,
            Ptr::Mem(_) => unreachable!("a decoded node has only device children"),
        }))
    }

    /// Blocks of real nodes (a full leaf, an inner node, an empty leaf), for the fuzzer's
    /// seeds.
    pub fn sample_nodes() -> Vec<Vec<u8>> {
        let mut t = crate::Tree::new();
        for i in 0..120u32 {
            t.insert(format!("object-{i:04}").as_bytes(), &[i as u8; 48])
                .expect("small entries fit");
        }
        let mut next = 0;
        let mut writes = t
            .flush(&mut || {
                next += 1;
                next
            })
            .writes;
        // Children are written before their parents: the first is a leaf, the last the root.
        let root = writes.pop().expect("the root is written").1;
        let leaf = writes.swap_remove(0).1;
        let empty = crate::Tree::new().flush(&mut || 1).writes.remove(0).1;
        vec![leaf, root, empty]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn grows_splits_flushes_and_reloads() {
        let mut t = Tree::new();
        for i in 0..2000u32 {
            let k = format!("key-{i:06}");
            t.insert(k.as_bytes(), &[i as u8; 40]).unwrap();
        }
        let mut next = 100;
        let mut place = || {
            next += 1;
            next
        };
        let f = t.flush(&mut place);
        assert!(
            f.writes.len() > 20,
            "2,000 entries of ~50 bytes need many nodes"
        );
        let dev: HashMap<Paddr, Vec<u8>> = f.writes.into_iter().collect();
        let mut t = Tree::open(f.root);
        let mut loads = 0;
        let got = loop {
            match t.get(b"key-001234") {
                Ok(v) => break v.map(<[u8]>::to_vec),
                Err(TreeError::Need(n)) => {
                    t.load(&n, &dev[&n.paddr]).unwrap();
                    loads += 1;
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(got, Some(vec![1234u32 as u8; 40]));
        assert!(
            loads >= 2 && t.loaded() == loads,
            "only the path was loaded"
        );
    }

    /// Walks the tree at `root` depth first with `walk_node`: its entries, and the nodes
    /// read; the first error.
    #[allow(clippy::type_complexity)]
    fn walk(
        dev: &HashMap<Paddr, Vec<u8>>,
        root: Paddr,
        generation: u64,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, usize), LoadError> {
        let (mut entries, mut nodes) = (Vec::new(), 0);
        // (need, the level its parent expects, the parent's generation)
        let mut stack = vec![(
            Need {
                paddr: root,
                key: Vec::new(),
            },
            None,
            generation,
        )];
        while let Some((n, level, limit)) = stack.pop() {
            let w = walk_node(&n, &dev[&n.paddr], level, limit)?;
            nodes += 1;
            match w.visited {
                Visited::Inner(children) => {
                    for c in children.into_iter().rev() {
                        stack.push((c, Some(w.level - 1), w.generation));
                    }
                }
                Visited::Leaf(e) => entries.extend(e),
            }
        }
        Ok((entries, nodes))
    }

    #[test]
    fn a_walk_reads_every_entry_in_order_and_checks_each_node_against_its_parent() {
        let mut t = Tree::new();
        for i in 0..3000u32 {
            t.insert(format!("key-{i:06}").as_bytes(), &i.to_be_bytes())
                .unwrap();
        }
        let mut next = 0;
        let f = t.flush_at(5, &mut || {
            next += 1;
            next
        });
        let total = f.writes.len();
        let mut dev: HashMap<Paddr, Vec<u8>> = f.writes.into_iter().collect();
        let (entries, nodes) = walk(&dev, f.root, 5).unwrap();
        let want: Vec<_> = (0..3000u32)
            .map(|i| (format!("key-{i:06}").into_bytes(), i.to_be_bytes().to_vec()))
            .collect();
        assert_eq!(entries, want, "every entry once, in key order");
        assert_eq!(nodes, total);
        // A checkpoint older than the nodes refuses them.
        assert!(matches!(
            walk(&dev, f.root, 4),
            Err(LoadError::Newer { .. })
        ));
        // A node where its parent expects another level is refused.
        let (&leaf, _) = dev.iter().find(|(p, _)| **p != f.root).unwrap();
        let root_block = dev[&f.root].clone();
        dev.insert(leaf, root_block);
        assert!(matches!(
            walk(&dev, f.root, 5),
            Err(LoadError::WrongLevel { .. })
        ));
    }

    /// Every entry of `t`, faulting nodes in from `dev`.
    fn all_entries(t: &mut Tree, dev: &HashMap<Paddr, Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
        loop {
            match t.range(b"", None, usize::MAX) {
                Ok(e) => return e,
                Err(TreeError::Need(n)) => drop(t.load(&n, &dev[&n.paddr]).unwrap()),
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn an_inner_node_whose_first_bound_grows_past_its_room_is_split() {
        // Ascending inserts leave full inner nodes; a longest key below every other then
        // replaces the first bound of each inner node on its way, and the leaf it lands in
        // (emptied of its first entries) has room: the inner nodes alone overflow.
        let mut t = Tree::new();
        for i in 0..3000u32 {
            t.insert(format!("b-{i:06}").as_bytes(), &[1; 1000])
                .unwrap();
        }
        for i in 0..3u32 {
            t.remove(format!("b-{i:06}").as_bytes()).unwrap();
        }
        let low = vec![b'a'; KEY_MAX];
        t.insert(&low, &[2; 8]).unwrap();
        let mut next = 0;
        let f = t.flush(&mut || {
            next += 1;
            next
        });
        let dev: HashMap<Paddr, Vec<u8>> = f.writes.into_iter().collect();
        let mut t = Tree::open(f.root);
        let all = all_entries(&mut t, &dev);
        assert_eq!(all.len(), 2998);
        assert_eq!(all[0], (low, vec![2; 8]));
    }

    #[test]
    fn placed_nodes_encode_as_a_flush_writes_them_and_not_once_evicted() {
        let fill = |t: &mut Tree| {
            for i in 0..300u32 {
                t.insert(format!("key-{i:06}").as_bytes(), &[i as u8; 60])
                    .unwrap();
            }
        };
        let (mut a, mut b) = (Tree::new(), Tree::new());
        fill(&mut a);
        fill(&mut b);
        let (mut next_a, mut next_b) = (0, 0);
        let flushed = a.flush_at(3, &mut || {
            next_a += 1;
            next_a
        });
        let placed = b.place_dirty_at(3, &mut || {
            next_b += 1;
            next_b
        });
        assert_eq!((placed.root, &placed.freed), (flushed.root, &flushed.freed));
        let encoded: Vec<(Paddr, Vec<u8>)> = (placed.nodes.iter())
            .map(|&(p, id)| (p, b.encode_placed(p, id).unwrap()))
            .collect();
        assert_eq!(encoded, flushed.writes);
        // Evicted, a placed leaf has nothing to encode (its handle may be another node's by
        // then); its parent still encodes, pointing at the leaf's place.
        let (leaf_at, leaf) = placed.nodes[0];
        assert!(b.evict_to(1) > 0);
        assert_eq!(b.encode_placed(leaf_at, leaf), None);
        let &(root_at, root) = placed.nodes.last().unwrap();
        assert_eq!(
            b.encode_placed(root_at, root).as_ref(),
            flushed.writes.last().map(|w| &w.1)
        );
    }

    #[test]
    fn a_loaded_leaf_takes_little_more_memory_than_its_block() {
        // A leaf of the native store's smallest entries: 18-byte keys, 12-byte values.
        let mut t = Tree::new();
        for i in 0..2000u64 {
            let mut k = b"O".to_vec();
            k.extend_from_slice(&[0; 8]);
            k.push(0xFF);
            k.extend_from_slice(&i.to_be_bytes());
            t.insert(&k, &[7; 12]).unwrap();
        }
        let f = t.flush(&mut || 0);
        let (p, block) = &f.writes[0];
        let leaf = Node::decode(*p, block).unwrap();
        assert!(leaf.len() > 100, "{} entries", leaf.len());
        let Body::Leaf(vals) = &leaf.body else {
            panic!("a leaf is written first")
        };
        let heap = leaf.keys.heap_bytes() + vals.heap_bytes();
        // One heap item per key and value took ~13 KB for this block.
        assert!(
            heap <= NODE_SIZE * 5 / 4,
            "{heap} bytes for a {NODE_SIZE}-byte block"
        );
    }

    #[test]
    fn changed_leaves_give_back_their_spare_room_once_written() {
        // Leaves written full (a split leaves both halves tight), then a few entries added
        // to each, as a store's changes come: each addition may double a buffer.
        let mut t = Tree::new();
        for i in (0..4000u64).step_by(2) {
            t.insert(&i.to_be_bytes(), &[7; 24]).unwrap();
        }
        t.flush(&mut || 0);
        for i in (1..4000u64).step_by(50) {
            t.insert(&i.to_be_bytes(), &[8; 24]).unwrap();
        }
        t.flush(&mut || 0);
        let leaves: Vec<&Node> = t
            .nodes
            .iter()
            .flatten()
            .filter(|n| matches!(n.body, Body::Leaf(_)))
            .collect();
        assert!(leaves.len() > 10, "{} leaves", leaves.len());
        for n in leaves {
            let Body::Leaf(vals) = &n.body else {
                unreachable!()
            };
            let heap = n.keys.heap_bytes() + vals.heap_bytes();
            // What it holds: the bytes and an end offset per key and per value.
            let held = n.keys.bytes_len() + vals.bytes_len() + 8 * n.len();
            assert!(
                heap <= held + held / 8,
                "a written leaf of {} entries holds {held} bytes in {heap}",
                n.len()
            );
        }
    }

    #[test]
    fn a_large_entry_in_the_middle_of_a_split_leaf_leaves_both_halves_fitting() {
        // One leaf: 1,248 bytes of small entries, a largest entry, 1,056 bytes of small
        // ones; then a second largest entry among the last. Split at the middle by bytes
        // the first large entry would go right with the second: 4,168 bytes for 4,076.
        let small = |p: &str, i: u32| (format!("{p}-{i:06}").into_bytes(), vec![1u8; 84]);
        let large = |k: &str| {
            let mut key = k.as_bytes().to_vec();
            key.resize(KEY_MAX, b'.');
            (key, vec![2u8; VALUE_MAX])
        };
        let mut entries: Vec<(Vec<u8>, Vec<u8>)> = (0..13).map(|i| small("a", i)).collect();
        entries.push(large("m"));
        entries.extend((0..11).map(|i| small("p", i)));
        let mut t = Tree::new();
        for (k, v) in &entries {
            t.insert(k, v).unwrap();
        }
        let second = large("p-000005x");
        t.insert(&second.0, &second.1).unwrap();
        entries.push(second);
        entries.sort();
        let mut next = 0;
        let f = t.flush(&mut || {
            next += 1;
            next
        });
        let dev: HashMap<Paddr, Vec<u8>> = f.writes.into_iter().collect();
        for (p, block) in &dev {
            Node::decode(*p, block).unwrap();
        }
        let mut t = Tree::open(f.root);
        assert_eq!(all_entries(&mut t, &dev), entries);
    }

    #[test]
    fn a_built_tree_reads_back_as_inserting_in_order_gives_and_takes_changes() {
        // (entries, value bytes, key bytes): empty, one, full nodes, the largest entries,
        // and keys of the largest size, whose inner nodes hold 7 (a deep tree, and levels
        // that fill up as `finish` writes the ones below).
        for (count, value_len, key_len) in [
            (0, 0, 12),
            (1, 8, 12),
            (7, 1000, 12),
            (3000, 40, 12),
            (5000, 300, 12),
            (800, VALUE_MAX, 12),
            (2000, 8, KEY_MAX),
            (343, 1, KEY_MAX),
        ] {
            let entries: Vec<(Vec<u8>, Vec<u8>)> = (0..count)
                .map(|i: u32| {
                    let mut k = format!("key-{i:07}").into_bytes();
                    k.resize(key_len, b'.');
                    (k, vec![(i % 251) as u8; value_len])
                })
                .collect();
            let mut b = Builder::new(7);
            let (mut next, mut out) = (100, Vec::new());
            let mut place = || {
                next += 1;
                next
            };
            for (k, v) in &entries {
                b.push(k, v, &mut place, &mut out).unwrap();
            }
            let root = b.finish(&mut place, &mut out);
            let built = out.len();
            let mut dev: HashMap<Paddr, Vec<u8>> = out.into_iter().collect();
            assert_eq!(dev.len(), built, "each node placed once");
            // The same entries inserted in order into a tree in memory: no more nodes.
            let mut t = Tree::new();
            for (k, v) in &entries {
                t.insert(k, v).unwrap();
            }
            let inserted = t.flush(&mut || 1).writes.len();
            assert!(
                built <= inserted,
                "{count} entries: built {built}, inserted {inserted}"
            );
            let mut t = Tree::open_at(root, 7);
            assert_eq!(all_entries(&mut t, &dev), entries, "{count} entries");
            assert_eq!(t.loaded(), built, "every node reached once");
            // A checkpoint older than the nodes refuses them.
            let mut old = Tree::open_at(root, 6);
            let n = Need {
                paddr: root,
                key: Vec::new(),
            };
            assert!(matches!(
                old.load(&n, &dev[&root]),
                Err(LoadError::Newer { .. })
            ));
            // It takes changes and flushes like any tree.
            t.insert(b"key-0000003x", b"new").unwrap();
            if let Some((first, _)) = entries.first() {
                t.remove(first).unwrap();
            }
            let mut place = || {
                next += 1;
                next
            };
            let f = t.flush_at(8, &mut place);
            dev.extend(f.writes);
            let mut t = Tree::open_at(f.root, 8);
            let mut want: Vec<_> = entries.iter().skip(1).cloned().collect();
            want.push((b"key-0000003x".to_vec(), b"new".to_vec()));
            want.sort();
            assert_eq!(all_entries(&mut t, &dev), want, "{count} entries, changed");
        }
        let mut b = Builder::new(1);
        let (mut place, mut out) = (|| 1, Vec::new());
        b.push(b"b", b"", &mut place, &mut out).unwrap();
        assert_eq!(
            b.push(b"a", b"", &mut place, &mut out),
            Err(BuildError::OutOfOrder)
        );
        assert_eq!(
            b.push(b"b", b"", &mut place, &mut out),
            Err(BuildError::OutOfOrder)
        );
        let long = vec![0; VALUE_MAX + 1];
        assert!(b.push(b"c", &long, &mut place, &mut out).is_err());
    }

    /// A tree of `count` keys `key-NNNNNN` with `value`, flushed: its nodes by place, its
    /// root, and the tree opened on them with nothing loaded.
    fn on_device(count: u32, value: &[u8]) -> (HashMap<Paddr, Vec<u8>>, Tree) {
        let mut t = Tree::new();
        for i in 0..count {
            t.insert(format!("key-{i:06}").as_bytes(), value).unwrap();
        }
        let mut next = 0;
        let f = t.flush(&mut || {
            next += 1;
            next
        });
        let root = f.root;
        (f.writes.into_iter().collect(), Tree::open(root))
    }

    /// A reader that may not hang nodes in the tree scans a range leaf by leaf: each leaf
    /// read from the first node not in memory, and the next one found from the bounds the
    /// loaded nodes and the nodes it walked give.
    #[test]
    fn a_scan_without_loading_goes_leaf_to_leaf_by_the_bounds() {
        let (dev, mut t) = on_device(3_000, &[1; 60]);
        // The root in memory, the rest on the device.
        match t.get(b"key-000000") {
            Err(TreeError::Need(n)) => drop(t.load(&n, &dev[&n.paddr]).unwrap()),
            other => panic!("{other:?}"),
        }
        for (lo, hi) in [(0, 3_000), (17, 18), (100, 2_500), (2_999, 3_000), (40, 40)] {
            let to = format!("key-{hi:06}").into_bytes();
            let mut from = format!("key-{lo:06}").into_bytes();
            let mut got = Vec::new();
            let mut leaves = 0;
            loop {
                let need = match t.range_into(&from, Some(&to), usize::MAX, &mut got) {
                    Ok(()) => break,
                    Err(TreeError::Need(n)) => n,
                    Err(e) => panic!("{e}"),
                };
                if let Some((k, _)) = got.last() {
                    from = k.clone();
                    from.push(0);
                }
                let mut bound = t.bound_after(&from);
                let mut need = need;
                let mut level = None;
                let entries = loop {
                    let w = walk_node(&need, &dev[&need.paddr], level, GENERATION_MAX).unwrap();
                    if let Some(b) = w.bound_after(&from) {
                        bound = Some(b.to_vec());
                    }
                    match w.toward(&from) {
                        Some(child) => need = child.clone(),
                        None => match w.visited {
                            Visited::Leaf(e) => break e,
                            Visited::Inner(_) => panic!("an inner node without children"),
                        },
                    }
                    level = Some(w.level - 1);
                };
                leaves += 1;
                let past = entries.last().is_some_and(|(k, _)| *k >= to);
                got.extend(entries.into_iter().filter(|(k, _)| *k >= from && *k < to));
                match bound {
                    Some(b) if !past && b < to => from = b,
                    _ => break,
                }
            }
            let want: Vec<Vec<u8>> = (lo..hi)
                .map(|i| format!("key-{i:06}").into_bytes())
                .collect();
            let keys: Vec<Vec<u8>> = got.into_iter().map(|(k, _)| k).collect();
            assert_eq!(keys, want, "[{lo}, {hi})");
            // Each leaf read once (leaves here hold 27 keys or more).
            assert!(
                leaves <= (hi - lo) / 27 + 2,
                "{leaves} leaves for [{lo}, {hi})"
            );
        }
    }

    #[test]
    fn a_scan_reads_ahead_in_batches_and_holds_a_bounded_tree() {
        let mut t = Tree::new();
        for i in 0..20_000u32 {
            t.insert(format!("key-{i:06}").as_bytes(), &[(i % 7) as u8; 100])
                .unwrap();
        }
        let mut next = 0;
        let f = t.flush(&mut || {
            next += 1;
            next
        });
        let nodes = f.writes.len();
        let dev: HashMap<Paddr, Vec<u8>> = f.writes.into_iter().collect();
        let mut t = Tree::open(f.root);
        // A change in memory is part of the scan.
        loop {
            match t.insert(b"key-010000x", b"changed") {
                Ok(_) => break,
                Err(TreeError::Need(n)) => drop(t.load(&n, &dev[&n.paddr]).unwrap()),
                Err(e) => panic!("{e}"),
            }
        }
        let (mut from, mut got, mut rounds, mut most) = (Vec::new(), Vec::new(), 0, 0);
        loop {
            let mut page = Vec::new();
            let r = t.range_into(&from, None, 1000, &mut page);
            if let Some((k, _)) = page.last() {
                from = k.clone();
                from.push(0);
            }
            let short = page.len() < 1000;
            got.extend(page);
            match r {
                Ok(()) if short => break,
                Ok(()) => {}
                Err(TreeError::Need(n)) => {
                    // As a rewrite does: drop what the scan passed, then read ahead.
                    t.evict_before(&from);
                    let needs = t.needs_from(&from, 16);
                    assert_eq!(
                        needs[0], n,
                        "the first read ahead is the node the scan needs"
                    );
                    for n in &needs {
                        t.load(n, &dev[&n.paddr]).unwrap();
                    }
                    rounds += 1;
                    most = most.max(t.loaded());
                }
                Err(e) => panic!("{e}"),
            }
        }
        let mut want: Vec<(Vec<u8>, Vec<u8>)> = (0..20_000u32)
            .map(|i| (format!("key-{i:06}").into_bytes(), vec![(i % 7) as u8; 100]))
            .collect();
        want.push((b"key-010000x".to_vec(), b"changed".to_vec()));
        want.sort();
        assert_eq!(got, want);
        assert!(rounds * 8 < nodes, "{rounds} read rounds for {nodes} nodes");
        assert!(most <= 16 + 6, "at most {most} nodes held");
    }

    #[test]
    fn eviction_takes_the_least_recently_used_node_first() {
        let (dev, mut t) = on_device(2000, &[1; 40]);
        let get = |t: &mut Tree, k: &str| loop {
            match t.get(k.as_bytes()) {
                Ok(v) => return v.is_some(),
                Err(TreeError::Need(n)) => drop(t.load(&n, &dev[&n.paddr]).unwrap()),
                Err(e) => panic!("{e}"),
            }
        };
        // Two leaves far apart: "cold" first, then "hot".
        assert!(get(&mut t, "key-000010"));
        assert!(get(&mut t, "key-001990"));
        let loaded = t.loaded();
        assert_eq!(t.evict_to(loaded - 1), 1);
        // The hot leaf is still there: no load needed for it.
        assert!(t.get(b"key-001990").is_ok());
        assert!(matches!(t.get(b"key-000010"), Err(TreeError::Need(_))));
        // Down to the root alone once every clean node may go.
        t.evict_to(0);
        assert_eq!(t.loaded(), 1);
    }

    #[test]
    fn loading_the_children_load_names_brings_in_the_whole_tree() {
        let mut t = Tree::new();
        for i in 0..3000u32 {
            t.insert(format!("key-{i:06}").as_bytes(), &[i as u8; 60])
                .unwrap();
        }
        assert_eq!(t.dirty_nodes(), t.loaded());
        let mut next = 0;
        let f = t.flush(&mut || {
            next += 1;
            next
        });
        assert_eq!(t.dirty_nodes(), 0);
        let nodes = f.writes.len();
        let dev: HashMap<Paddr, Vec<u8>> = f.writes.into_iter().collect();
        let mut t = Tree::open(f.root);
        let Err(TreeError::Need(root)) = t.get(b"") else {
            panic!("nothing is loaded")
        };
        let mut queue = std::collections::VecDeque::from([root]);
        let mut reads = 0;
        while let Some(n) = queue.pop_front() {
            queue.extend(t.load(&n, &dev[&n.paddr]).unwrap());
            reads += 1;
        }
        assert_eq!((t.loaded(), reads), (nodes, nodes), "each node read once");
        let mut places: Vec<Paddr> = t.loaded_paddrs().collect();
        places.sort_unstable();
        assert_eq!(places, (1..=nodes as u64).collect::<Vec<_>>());
        let all = t.range(b"", None, usize::MAX).unwrap();
        assert_eq!(all.len(), 3000);
        assert_eq!(all[2999].1, vec![2999u32 as u8; 60]);
    }

    #[test]
    fn keys_in_ascending_order_fill_their_nodes() {
        let mut t = Tree::new();
        let entry: usize = 4 + 10 + 100;
        for i in 0..4000u32 {
            t.insert(format!("key-{i:06}").as_bytes(), &[7; 100])
                .unwrap();
        }
        let leaves_if_full = (4000 * entry).div_ceil(ROOM);
        let written = t.flush(&mut || 1).writes.len();
        // Halving splits would leave about twice as many leaves.
        assert!(
            written <= leaves_if_full + leaves_if_full / 20 + 2,
            "{written} nodes for {leaves_if_full} full leaves"
        );
    }

    #[test]
    fn a_node_newer_than_what_points_to_it_is_refused() {
        let mut t = Tree::new();
        for i in 0..500u32 {
            t.insert(format!("key-{i:06}").as_bytes(), &[1; 40])
                .unwrap();
        }
        let mut next = 0;
        let f = t.flush_at(5, &mut || {
            next += 1;
            next
        });
        let mut dev: HashMap<Paddr, Vec<u8>> = f.writes.into_iter().collect();
        // The root of generation 5 is refused by a reader of generation 4.
        let mut old = Tree::open_at(f.root, 4);
        let Err(TreeError::Need(n)) = old.get(b"key-000001") else {
            panic!("nothing is loaded")
        };
        assert!(matches!(
            old.load(&n, &dev[&n.paddr]),
            Err(LoadError::Newer {
                found: 5,
                limit: 4,
                ..
            })
        ));
        // A leaf's place reused by a later flush: a reader of the older tree meets a node of
        // generation 9 under a root of 5.
        let mut later = Tree::new();
        later.insert(b"other", b"x").unwrap();
        let reused = later.flush_at(9, &mut || 1).writes.remove(0).1;
        dev.insert(1, reused);
        let mut t = Tree::open_at(f.root, 5);
        let err = loop {
            match t.get(b"key-000000") {
                Err(TreeError::Need(n)) => {
                    if let Err(e) = t.load(&n, &dev[&n.paddr]) {
                        break e;
                    }
                }
                other => panic!("{other:?}"),
            }
        };
        assert!(
            matches!(
                err,
                LoadError::Newer {
                    found: 9,
                    limit: 5,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn nodes_split_before_a_flush_accept_their_loaded_children() {
        let mut t = Tree::new();
        for i in 0..20_000u32 {
            t.insert(format!("key-{i:06}").as_bytes(), &[1; 60])
                .unwrap();
        }
        let mut next = 0;
        let f = t.flush_at(7, &mut || {
            next += 1;
            next
        });
        let dev: HashMap<Paddr, Vec<u8>> = f.writes.into_iter().collect();
        let mut t = Tree::open_at(f.root, 7);
        let op = |t: &mut Tree, k: &str, insert: bool| loop {
            let r = match insert {
                true => t.insert(k.as_bytes(), &[2; 60]).map(drop),
                false => t.get(k.as_bytes()).map(drop),
            };
            match r {
                Ok(()) => return,
                Err(TreeError::Need(n)) => {
                    t.load(&n, &dev[&n.paddr]).unwrap();
                }
                Err(e) => panic!("{e}"),
            }
        };
        // Grow one range until its leaves and the inner node above them split, unflushed,
        // then reach nodes on the device through the halves.
        for i in 0..6000u32 {
            op(&mut t, &format!("key-000100-{i:04}"), true);
        }
        for i in (0..20_000u32).step_by(7) {
            op(&mut t, &format!("key-{i:06}"), false);
        }
    }

    #[test]
    fn a_damaged_node_is_refused() {
        let mut t = Tree::new();
        t.insert(b"a", b"1").unwrap();
        let f = t.flush(&mut || 7);
        let mut block = f.writes[0].1.clone();
        block[40] ^= 1;
        let mut t = Tree::open(7);
        let Err(TreeError::Need(n)) = t.get(b"a") else {
            panic!("the root is not loaded")
        };
        assert_eq!(
            t.load(&n, &block),
            Err(LoadError::Node(NodeError::Checksum { paddr: 7 }))
        );
        assert_eq!(t.loaded(), 0);
    }
}
