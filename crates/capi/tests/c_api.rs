//! The C API from C: `tests/c/api_test.c` is compiled against `include/carmine.h` and the
//! freshly built libcarmine.so, and run against a live OSD. It checks sync and async I/O,
//! callbacks, eventfd polling, errors (unknown image and pool, out of range, read-only, a
//! second writer, a dead cluster) and several threads sharing one image.

mod common;

use common::{lib_dir, start_osd};
use std::path::Path;
use std::process::Command;

/// Compiles `source` with the system C compiler against the header and the library.
fn compile(source: &str, out: &Path) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread", "-o",
        ])
        .arg(out)
        .arg(crate_dir.join(source))
        .arg(format!("-I{}", crate_dir.join("include").display()))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lcarmine")
        .status()
        .expect("running cc (the C compiler)");
    assert!(status.success(), "compiling {source} failed");
}

#[test]
fn the_c_api_works_from_a_c_program() {
    let (osd, addr) = start_osd();
    let dir = std::env::temp_dir().join(format!("carmine-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("api_test");
    compile("tests/c/api_test.c", &exe);
    // With a reactor thread, with two, and inline on the caller's thread.
    for reactors in ["1", "2", "0"] {
        let out = Command::new(&exe)
            // Cargo's library path may name a stale copy (see `lib_dir`): the rpath decides.
            .env_remove("LD_LIBRARY_PATH")
            .arg(addr.to_string())
            .arg(reactors)
            .output()
            .expect("running api_test");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("reactors={reactors}: {stdout}");
        eprintln!("{stderr}");
        assert!(
            out.status.success(),
            "api_test (reactors={reactors}) failed: {stderr}"
        );
        assert!(stdout.contains("checks passed"), "{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    drop(osd);
}
