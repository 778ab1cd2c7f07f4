//! Mount's walk over the metadata tree: the whole tree read back into the index, depth first,
//! holding a path of nodes and the caches' worth of bodies, never the tree; every node checked
//! against its parent and every leaf against the bounds its route gives.

use crate::checkpoint::{read_nodes, READS_AT_ONCE};
use crate::device::BlockDevice;
use crate::index::{Geometry, Index};
use crate::metatree::{Loader, MetaTree};
use carmine_btree::{walk_node, Need, Tree, Visited};
use std::collections::VecDeque;

/// Mount: reads the whole tree whose root is at `root` (named by the slot of `generation`)
/// and rebuilds the index from it, holding no more than a path of nodes from the root (each
/// with the children still to visit), `bodies` record bytes of object bodies, and the bodies
/// of `needed` (which the journal replay changes). Depth first, so leaves come in key order;
/// the leaves under one node are read together. Nothing is kept in the tree: it starts with
/// nothing loaded.
///
/// Every node is checked against its parent (`walk_node`), and every leaf's keys against the
/// bounds its route gives: at or above its own route key, and below the next leaf's. So a
/// damaged tree whose blocks still pass their checksums is refused here, not met later as a
/// record a lookup cannot find. A node reached twice is refused: an inner one by its place,
/// a leaf by the key order (no leaf but the root is empty).
/// Errors say what is wrong with the tree (the caller refuses the mount).
pub(crate) async fn load_tree<D: BlockDevice>(
    dev: &D,
    base: u64,
    geo: Geometry,
    (root, generation): (u64, u64),
    bodies: u64,
    needed: crate::metatree::Names,
) -> std::result::Result<(Index, MetaTree), String> {
    /// An inner node on the walk's path: its level and generation, and the children not
    /// visited yet.
    struct Frame {
        level: u8,
        generation: u64,
        children: VecDeque<Need>,
    }
    let mut loader = Loader::paging(geo, bodies, needed);
    let mut meta = MetaTree::without_tree(geo.segments);
    let mut inner_seen = std::collections::HashSet::new();
    let mut leaves = LeafBounds::default();
    let root_need = Need {
        paddr: root,
        key: Vec::new(),
    };
    let mut stack: Vec<Frame> = Vec::new();
    let read = |batch: Vec<Need>| async move {
        let blocks = read_nodes(dev, base, &geo, &batch)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(batch.into_iter().zip(blocks))
    };
    for (n, b) in read(vec![root_need]).await? {
        meta.count_found(&geo, n.paddr)?;
        let w = walk_node(&n, b.full(), None, generation).map_err(|e| e.to_string())?;
        match w.visited {
            Visited::Leaf(entries) => leaves.take(&n, entries, true, &mut loader)?,
            Visited::Inner(children) => {
                inner_seen.insert(n.paddr);
                stack.push(Frame {
                    level: w.level,
                    generation: w.generation,
                    children: children.into(),
                });
            }
        }
    }
    while let Some(top) = stack.last_mut() {
        let (level, limit) = (top.level, top.generation);
        if level == 1 {
            // Its children are leaves: read them together, a batch at a time.
            let batch: Vec<Need> = top
                .children
                .drain(..top.children.len().min(READS_AT_ONCE))
                .collect();
            if top.children.is_empty() {
                stack.pop();
            }
            for (n, b) in read(batch).await? {
                meta.count_found(&geo, n.paddr)?;
                let w = walk_node(&n, b.full(), Some(0), limit).map_err(|e| e.to_string())?;
                let Visited::Leaf(entries) = w.visited else {
                    return Err(format!("tree node at block {} is not a leaf", n.paddr));
                };
                leaves.take(&n, entries, false, &mut loader)?;
            }
            continue;
        }
        let Some(n) = top.children.pop_front() else {
            stack.pop();
            continue;
        };
        if !inner_seen.insert(n.paddr) {
            return Err(format!("tree node at block {} is reached twice", n.paddr));
        }
        for (n, b) in read(vec![n]).await? {
            meta.count_found(&geo, n.paddr)?;
            let w = walk_node(&n, b.full(), Some(level - 1), limit).map_err(|e| e.to_string())?;
            let Visited::Inner(children) = w.visited else {
                return Err(format!(
                    "tree node at block {} is a leaf above level 0",
                    n.paddr
                ));
            };
            if children.is_empty() {
                return Err(format!("tree node at block {} has no children", n.paddr));
            }
            stack.push(Frame {
                level: w.level,
                generation: w.generation,
                children: children.into(),
            });
        }
    }
    let index = loader.finish().map_err(|e| format!("metadata tree: {e}"))?;
    meta.tree = Some(Tree::open_at(root, generation));
    Ok((index, meta))
}

/// The bounds a walk in key order holds each leaf to: its keys at or above its route key,
/// and the previous leaf's below it.
#[derive(Default)]
struct LeafBounds {
    /// The previous leaf's last key.
    last: Option<Vec<u8>>,
}

impl LeafBounds {
    fn take(
        &mut self,
        need: &Need,
        entries: Vec<(Vec<u8>, Vec<u8>)>,
        root: bool,
        loader: &mut Loader,
    ) -> std::result::Result<(), String> {
        let at = need.paddr;
        if self.last.as_ref().is_some_and(|l| *l >= need.key) {
            return Err(format!(
                "tree leaf at block {at} starts below keys the leaf before it holds"
            ));
        }
        let (Some((first, _)), Some((last, _))) = (entries.first(), entries.last()) else {
            return match root {
                true => Ok(()),
                false => Err(format!("tree leaf at block {at} is empty")),
            };
        };
        if *first < need.key {
            return Err(format!(
                "tree leaf at block {at} holds keys below the range its parent gives it"
            ));
        }
        self.last = Some(last.clone());
        for (k, v) in &entries {
            loader
                .push(k, v)
                .map_err(|e| format!("metadata tree: {e}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{AlignedBuf, BLOCK};
    use crate::index::Body;
    use crate::metatree::tests::GEO;
    use crate::metatree::{chunks, collection_key, object_key, object_record, Names};
    use crate::SimDevice;
    use carmine_btree::Builder;
    use futures::executor::block_on;
    /// A tree of `objects` empty objects written with the builder onto a device: the device,
    /// the root, and every node's place with its block, in the order written (leaves first
    /// within each level, in key order).
    fn built(objects: u64) -> (SimDevice, u64, Vec<(u64, Vec<u8>)>) {
        let cid = carmine_types::PgId { pool: 1, seed: 2 };
        let mut entries = vec![(collection_key(cid), Vec::new())];
        for id in 0..objects {
            // Long names: records of two pieces, two objects a leaf.
            let oid = format!("{id:0>1000}");
            let rec = object_record(cid, &oid, 0, &Body::default());
            for (i, c) in chunks(&rec).enumerate() {
                entries.push((object_key(id, i as u32), c.to_vec()));
            }
        }
        let mut b = Builder::new(3);
        let mut next = GEO.segment_start(1);
        let mut place = || {
            next += 1;
            next
        };
        let mut out = Vec::new();
        for (k, v) in &entries {
            b.push(k, v, &mut place, &mut out).unwrap();
        }
        let root = b.finish(&mut place, &mut out);
        let dev = SimDevice::new((GEO.segment_start(GEO.segments) * BLOCK as u64) as usize);
        write(&dev, &out);
        (dev, root, out)
    }

    fn write(dev: &SimDevice, blocks: &[(u64, Vec<u8>)]) {
        for (p, b) in blocks {
            let mut buf = AlignedBuf::new(BLOCK);
            buf.extend_from_slice(b);
            block_on(dev.write_at(buf, p * BLOCK as u64)).0.unwrap();
        }
    }

    fn load(dev: &SimDevice, root: u64) -> std::result::Result<u64, String> {
        block_on(load_tree(dev, 0, GEO, (root, 3), u64::MAX, Names::new()))
            .map(|(ix, _)| ix.objects)
    }

    #[test]
    fn a_mount_walk_refuses_leaves_out_of_their_place_even_with_good_checksums() {
        let (dev, root, blocks) = built(40);
        assert_eq!(load(&dev, root).unwrap(), 40);
        let leaves: Vec<&(u64, Vec<u8>)> = blocks.iter().filter(|(_, b)| b[6] == 0).collect();
        assert!(leaves.len() >= 4, "{} leaves", leaves.len());
        let (a, b) = (leaves[1], leaves[2]);
        // Two leaves swapped: each block is a good node, in the wrong place.
        write(&dev, &[(a.0, b.1.clone()), (b.0, a.1.clone())]);
        let err = load(&dev, root).unwrap_err();
        assert!(err.contains("leaf"), "{err}");
        // One leaf twice (the second copy where the next leaf was): refused as well.
        write(&dev, &[(a.0, a.1.clone()), (b.0, a.1.clone())]);
        let err = load(&dev, root).unwrap_err();
        assert!(err.contains("leaf"), "{err}");
        // Put back, it loads again.
        write(&dev, &[(b.0, b.1.clone())]);
        assert_eq!(load(&dev, root).unwrap(), 40);
    }
}
