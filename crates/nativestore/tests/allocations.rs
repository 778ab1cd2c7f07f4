//! Heap allocations on the store's hot path, counted: a guard for "no allocation per I/O
//! beyond what the design needs" (a regression shows as a count that grew, not as a timing).

use bytes::Bytes;
use carmine_nativestore::{mkfs, NativeConfig, NativeStore, SimDevice};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::PgId;
use futures::executor::block_on;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call goes to the system allocator with the same arguments.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Allocations per call of `f`, over `n` calls.
fn per_call(n: usize, mut f: impl FnMut(usize)) -> f64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for i in 0..n {
        f(i);
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / n as f64
}

#[test]
fn a_4k_write_and_a_4k_read_allocate_what_the_design_needs_and_no_more() {
    let c = PgId { pool: 1, seed: 0 };
    let dev = SimDevice::new(256 << 20);
    block_on(mkfs(&dev, 1, 1 << 20)).unwrap();
    let store = block_on(NativeStore::mount(dev, 0, NativeConfig::default())).unwrap();
    let mut t = Transaction::new();
    t.create_collection(c);
    block_on(store.submit(t)).unwrap();
    let names: Vec<String> = (0..64).map(|i| format!("obj{i}")).collect();
    for name in &names {
        let mut t = Transaction::new();
        t.write(c, name, 0, Bytes::from(vec![1u8; 65536]));
        block_on(store.submit(t)).unwrap();
    }
    let data: Vec<Bytes> = (0..1000)
        .map(|i| Bytes::from(vec![i as u8; 4096]))
        .collect();
    let at = |i: usize| ((i * 7) % 16 * 4096) as u64;
    // One transaction at a time, so each is a record of its own (the most per write).
    let writes = per_call(1000, |i| {
        let mut t = Transaction::with_capacity(1);
        t.write(c, &names[i % 64], at(i), data[i].clone());
        block_on(store.submit(t)).unwrap();
    });
    let reads = per_call(1000, |i| {
        let r = block_on(store.read(c, &names[i % 64], at(i), 4096)).unwrap();
        assert_eq!(r.len(), 4096);
    });
    eprintln!("allocations: {writes:.1} per 4 KiB write, {reads:.1} per 4 KiB read");
    // A write (measured 12): the record buffer, its batch's block list and the writer's list
    // of batches, the extent's checksum list, the deltas' buffer, the index change, the
    // clean cache's copy of the block, the submit's pins, the test device's copy of the
    // record. Through the OSD the per-record ones are shared by the writes of a group commit.
    assert!(writes <= 12.5, "{writes} allocations per 4 KiB write");
    // A read: the aligned device buffer and the returned bytes.
    assert!(reads <= 2.5, "{reads} allocations per 4 KiB read");
}
