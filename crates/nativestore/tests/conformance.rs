//! The native store against the shared conformance suite, on the fault-injecting device.

use carmine_nativestore::{mkfs, NativeConfig, NativeStore, SimDevice};
use futures::executor::block_on;

/// A small formatted device: 38 segments of 1 MiB in one shard.
fn make_store() -> NativeStore<SimDevice> {
    let dev = SimDevice::new(40 << 20);
    block_on(async {
        mkfs(&dev, 1, 1 << 20).await.unwrap();
        NativeStore::mount(dev, 0, NativeConfig::default())
            .await
            .unwrap()
    })
}

carmine_store::conformance_tests!(make_store: make_store(), block_on: futures::executor::block_on);

/// The same suite with a checkpoint every few records and room for almost no object body
/// in memory: whatever a test does next finds its objects paged out and reads them back.
mod paged_out {
    use super::*;

    fn make_store() -> NativeStore<SimDevice> {
        let dev = SimDevice::new(40 << 20);
        let config = NativeConfig {
            checkpoint_interval_blocks: 4,
            object_cache_bytes: 1,
            metadata_cache_bytes: 8 << 10,
            ..NativeConfig::default()
        };
        block_on(async {
            mkfs(&dev, 1, 1 << 20).await.unwrap();
            NativeStore::mount(dev, 0, config).await.unwrap()
        })
    }

    carmine_store::conformance_tests!(make_store: make_store(), block_on: futures::executor::block_on);
}
