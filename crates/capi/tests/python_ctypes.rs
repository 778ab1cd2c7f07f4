//! libcarmine from Python's ctypes (`tests/py/smoke.py`): the library loads and works in
//! another language's process with no header, callbacks included.

mod common;

use common::{lib_dir, start_osd};
use std::process::Command;

#[test]
fn python_drives_the_library_through_ctypes() {
    let (osd, addr) = start_osd();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/smoke.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(lib_dir().join("libcarmine.so"))
        .arg(addr.to_string())
        .output()
        .expect("running python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "smoke.py failed: {stderr}{stdout}");
    assert!(stdout.contains("python smoke test passed"), "{stdout}");
    drop(osd);
}
