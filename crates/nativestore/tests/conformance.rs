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
