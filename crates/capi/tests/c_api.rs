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

#[test]
fn the_installed_library_builds_with_pkg_config() {
    let prefix = std::env::temp_dir().join(format!("carmine-prefix-{}", std::process::id()));
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("bash")
        .arg(crate_dir.join("install.sh"))
        .arg(&prefix)
        .arg(lib_dir())
        .status()
        .expect("running install.sh");
    assert!(status.success(), "install.sh failed");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "carmine"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("running pkg-config");
    assert!(flags.status.success(), "pkg-config does not know carmine");
    let flags = String::from_utf8(flags.stdout).unwrap();
    assert!(flags.contains("-lcarmine"), "{flags}");
    let source = prefix.join("hello.c");
    std::fs::write(
        &source,
        "#include <carmine.h>\n#include <stdio.h>\n#include <errno.h>\n\
         int main(void) { int a, b, c; carmine_version(&a, &b, &c);\n\
         printf(\"%d.%d.%d %s\\n\", a, b, c, carmine_strerror(-EBUSY)); return 0; }\n",
    )
    .unwrap();
    let exe = prefix.join("hello");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-Wall")
        .arg("-Werror")
        .arg("-o")
        .arg(&exe)
        .arg(&source)
        .args(flags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "compiling against the installed library failed"
    );
    let out = Command::new(&exe)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("0.1.0 image is locked"), "{text}");
    let _ = std::fs::remove_dir_all(&prefix);
}
