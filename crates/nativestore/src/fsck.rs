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
}

/// Loads shard `shard` read-only (checkpoint and journal, nothing written) and reads back
/// every mapped block against its checksum, and checks the space accounting.
pub async fn fsck<D: BlockDevice>(dev: D, shard: u32) -> Result<FsckReport, MountError> {
    let (store, mount) = NativeStore::open(dev, shard, NativeConfig::default(), false).await?;
    let mut report = FsckReport {
        mount,
        ..FsckReport::default()
    };
    type ObjectBlocks = (carmine_types::CollectionId, String, Vec<(u64, BlockRef)>);
    let objects: Vec<ObjectBlocks> = {
        let st = store.st.borrow();
        st.index
            .colls
            .iter()
            .flat_map(|(cid, coll)| {
                coll.iter()
                    .map(|(oid, o)| (*cid, oid.clone(), o.blocks.iter().collect()))
            })
            .collect()
    };
    for (cid, oid, blocks) in objects {
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
    }
    Ok(report)
}
