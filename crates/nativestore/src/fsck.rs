//! Offline consistency check of one shard.

use crate::device::BlockDevice;
use crate::error::MountError;
use crate::index::BlockRef;
use crate::mount::MountReport;
use crate::segments::SegKind;
use crate::store::{NativeConfig, NativeStore};

/// What fsck found. `errors` empty means the shard is consistent.
#[derive(Clone, Debug, Default)]
pub struct FsckReport {
    pub mount: MountReport,
    pub blocks_checked: u64,
    pub errors: Vec<String>,
    /// Why a mount for writing would fail although the shard is consistent: its first
    /// checkpoint (a fresh metadata tree when the checkpoint is a blob of format 3) does not
    /// fit the free segments.
    pub checkpoint_room: Option<String>,
}

/// Loads shard `shard` read-only (checkpoint and journal, nothing written) and reads back
/// every mapped block against its checksum, and checks the space accounting.
pub async fn fsck<D: BlockDevice>(dev: D, shard: u32) -> Result<FsckReport, MountError> {
    fsck_with(dev, shard, NativeConfig::default()).await
}

/// As [`fsck`], with the caches of `config`: bodies beyond its object cache are read back
/// from the metadata tree one object at a time, so the check holds no more than a mount.
pub async fn fsck_with<D: BlockDevice>(
    dev: D,
    shard: u32,
    config: NativeConfig,
) -> Result<FsckReport, MountError> {
    let (store, mount) = NativeStore::open(dev, shard, config, false).await?;
    let mut report = FsckReport {
        mount,
        ..FsckReport::default()
    };
    {
        let st = store.st.borrow();
        // Mount opens a journal segment before its checkpoint.
        let free =
            (st.segments.free_count() as u64).saturating_sub(1) * (store.geo.segment_blocks - 1);
        let need = crate::metatree::fresh_tree_blocks(&st.index);
        if st.meta.tree.is_none() && free < need {
            report.checkpoint_room = Some(format!(
                "its first format {} checkpoint needs up to {need} metadata blocks and {free} \
                 are free",
                crate::FORMAT_VERSION
            ));
        }
    }
    // A mount pages out bodies beyond the object cache as it loads them: each is read back
    // from its record in the metadata tree (which checks the leaves it lies in), one object
    // at a time, and its blocks checked before the next.
    let names: Vec<(carmine_types::CollectionId, String)> = {
        let st = store.st.borrow();
        st.index
            .colls
            .iter()
            .flat_map(|(cid, coll)| coll.keys().map(|oid| (*cid, oid.clone())))
            .collect()
    };
    for (cid, oid) in names {
        let blocks: Vec<(u64, BlockRef)> = match store
            .with_body(cid, &oid, |_, b| Ok(b.blocks.iter().collect()))
            .await
        {
            Ok(blocks) => blocks,
            Err(e) => {
                report.errors.push(format!(
                    "{cid}/{oid}: its metadata cannot be read back: {e}"
                ));
                continue;
            }
        };
        let size = store
            .st
            .borrow()
            .index
            .object(cid, &oid)
            .map_or(0, |o| o.size);
        for (l, b) in blocks {
            report.blocks_checked += 1;
            if l * crate::BLOCK as u64 >= size {
                report.errors.push(format!(
                    "{cid}/{oid}: block {l} mapped past the object size {size}"
                ));
            }
            match store.geo.segment_of(b.paddr) {
                None => report.errors.push(format!(
                    "{cid}/{oid}: block {l} at {} outside every segment",
                    b.paddr
                )),
                Some(seg) => {
                    let kind = store.st.borrow().segments.get(seg).kind;
                    if kind != SegKind::Journal {
                        report.errors.push(format!(
                            "{cid}/{oid}: block {l} lives in segment {seg}, which is {kind:?}"
                        ));
                    }
                }
            }
            if let Err(e) = store.read_blocks(&[b]).await {
                report.errors.push(format!(
                    "{cid}/{oid}: block {l} at device block {}: {e}",
                    b.paddr
                ));
            }
        }
        // What was read back leaves again: nothing checkpoints here to do it.
        let mut st = store.st.borrow_mut();
        st.index.evict_to(config.object_cache_bytes);
        if let Some(t) = st.meta.tree.as_mut() {
            t.evict_to(config.metadata_cache_nodes());
        }
    }
    Ok(report)
}
