//! What the tests of the C API share: a live OSD, and the library's location.

use carmine_cluster::OsdMap;
use carmine_osd::{Osd, OsdConfig};
use std::net::SocketAddr;
use std::path::PathBuf;

pub fn start_osd() -> (Osd, SocketAddr) {
    let addr = carmine_testkit::free_addr();
    let map = OsdMap::single_osd(vec![addr], 8);
    let osd = Osd::start(OsdConfig::in_memory(0, map, 256 << 20)).unwrap();
    (osd, addr)
}

/// Where cargo put the libcarmine.so built with this test: in the `deps` directory the test
/// runs from (`cargo build` also copies it one level up, but `cargo test` does not, so that
/// copy may be stale).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(
        dir.join("libcarmine.so").exists(),
        "no libcarmine.so in {}",
        dir.display()
    );
    dir
}
