//! fio-carmine: built by `fio/build.sh` against the installed fio's own source, then run by
//! that fio against a live OSD: random writes verified with crc32c (one job, and three jobs
//! sharing a volume), trims, several reading jobs sharing one volume, an unknown volume.

mod common;

use carmine_client::{Client, ClientConfig};
use carmine_volume::Volumes;
use common::{lib_dir, start_osd};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

fn create_volume(addr: SocketAddr, name: &str, size: u64) {
    carmine_reactor::block_on(async {
        let client = Client::connect(&[addr], ClientConfig::default())
            .await
            .unwrap();
        let pool = client.pool_id("rbd").unwrap();
        Volumes::new(client, pool)
            .create(name, size, Some(1 << 20))
            .await
            .unwrap();
    });
}

fn build_engine(out: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fio/build.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg(lib_dir())
        .arg(out)
        .status()
        .expect("running fio/build.sh");
    assert!(status.success(), "building fio-carmine failed");
    out.join("libfio_carmine.so")
}

/// Runs fio with `args` on the engine; returns its JSON report.
fn fio(engine: &Path, addr: SocketAddr, args: &[&str]) -> serde_json::Value {
    let out = Command::new("fio")
        .env_remove("LD_LIBRARY_PATH")
        .arg(format!("--ioengine=external:{}", engine.display()))
        .arg(format!("--osds={addr}"))
        // No verify state files left in the crate's directory.
        .args(["--output-format=json", "--bs=4k", "--verify_state_save=0"])
        .args(args)
        .output()
        .expect("running fio");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fio failed: {stderr}\n{stdout}");
    // fio prints engine messages before the JSON document.
    let json = &stdout[stdout
        .find('{')
        .unwrap_or_else(|| panic!("no JSON from fio: {stdout} {stderr}"))..];
    serde_json::from_str(json).unwrap_or_else(|e| panic!("fio's JSON: {e}: {json}"))
}

fn job_ios(job: &serde_json::Value, dir: &str) -> u64 {
    job[dir]["total_ios"].as_u64().unwrap_or(0)
}

#[test]
fn fio_runs_verified_random_writes_and_shared_reads_through_the_engine() {
    let (osd, addr) = start_osd();
    create_volume(addr, "fio0", 64 << 20);
    let dir = std::env::temp_dir().join(format!("carmine-fio-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let engine = build_engine(&dir);

    let report = fio(
        &engine,
        addr,
        &[
            "--name=verify",
            "--volume=fio0",
            "--rw=randwrite",
            "--iodepth=16",
            "--size=16M",
            "--verify=crc32c",
            "--do_verify=1",
        ],
    );
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    let (written, verified) = (job_ios(job, "write"), job_ios(job, "read"));
    println!("verify job: {written} writes, {verified} verifying reads");
    assert_eq!(written, 4096, "16 MiB in 4 KiB writes");
    assert_eq!(verified, 4096, "every block read back and checked");

    // Three writing jobs on one volume, each on its own 4 MiB, verified: they share one
    // cluster handle and the volume's lock, each with its own image handle.
    let report = fio(
        &engine,
        addr,
        &[
            "--name=writers",
            "--volume=fio0",
            "--rw=randwrite",
            "--iodepth=8",
            "--size=4M",
            "--offset_increment=4M",
            "--numjobs=3",
            "--verify=crc32c",
            "--do_verify=1",
        ],
    );
    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 3);
    for job in jobs {
        assert_eq!(job["error"], 0, "{job}");
        assert_eq!(job_ios(job, "write"), 1024, "{job}");
        assert_eq!(job_ios(job, "read"), 1024, "every block verified: {job}");
    }

    // Writes with a sync every 4, inline: a flush completes without I/O, and the client must
    // not then sleep until its next timer (it did, up to 0.5 s per sync: 360 of the 400
    // writes in 20 s; the runtime here is 5 s).
    let report = fio(
        &engine,
        addr,
        &[
            "--name=syncs",
            "--volume=fio0",
            "--rw=randwrite",
            "--iodepth=8",
            "--size=16M",
            "--number_ios=400",
            "--fsync=4",
            "--runtime=5",
        ],
    );
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    // fio counts a few of its syncs in number_ios (396 writes here).
    assert!(
        job_ios(job, "write") >= 390,
        "the writes did not finish within the runtime: {job}"
    );

    // Trims (discards) through the engine.
    let report = fio(
        &engine,
        addr,
        &[
            "--name=trim",
            "--volume=fio0",
            "--rw=randtrim",
            "--bs=64k",
            "--iodepth=4",
            "--size=16M",
            "--number_ios=64",
        ],
    );
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert_eq!(job_ios(job, "trim"), 64, "{job}");

    // Two reading jobs on the volume at once, bounded by count.
    let report = fio(
        &engine,
        addr,
        &[
            "--name=readers",
            "--volume=fio0",
            "--rw=randread",
            "--iodepth=8",
            "--size=16M",
            "--numjobs=2",
            "--number_ios=2000",
        ],
    );
    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    for job in jobs {
        assert_eq!(job["error"], 0, "{job}");
        assert_eq!(job_ios(job, "read"), 2000, "{job}");
    }

    // An unknown volume fails the job with ENOENT, and says why.
    let out = Command::new("fio")
        .env_remove("LD_LIBRARY_PATH")
        .arg(format!("--ioengine=external:{}", engine.display()))
        .arg(format!("--osds={addr}"))
        .args(["--name=missing", "--volume=nope", "--rw=read", "--size=1M"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("no image named \"nope\""), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
    drop(osd);
}
