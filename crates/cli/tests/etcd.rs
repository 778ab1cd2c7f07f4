//! A cluster whose map lives in etcd (issue #11, first step): `cluster up --with-etcd` runs a
//! private etcd (Debian's etcd-server, installed by .ci/run) from the cluster directory.

mod common;

use common::{alive, Cluster};
use std::io::Write;
use std::process::Stdio;

fn etcd_pid(c: &Cluster) -> i32 {
    std::fs::read_to_string(c.dir.join("etcd.pid"))
        .expect("the private etcd's pid file")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_cluster_with_its_map_in_a_private_etcd_restarts_from_it() {
    let c = Cluster::up(
        "etcd-private",
        &["--with-etcd", "--store", "native", "--device-size", "512M"],
    );
    assert!(
        !c.dir.join("osdmap").exists(),
        "the map must live in etcd only"
    );
    let status = c.ok(&["cluster", "status"]);
    assert!(status.contains("map in etcd http://127.0.0.1:"), "{status}");
    assert!(
        status.contains("(private, in the cluster directory)"),
        "{status}"
    );

    c.ok(&["volume", "create", "v", "--size", "8M"]);
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 % 251) as u8).collect();
    let mut w = c
        .cmd(&["volume", "write", "v", "--file", "-", "-q"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    w.stdin.take().unwrap().write_all(&data).unwrap();
    assert!(w.wait().unwrap().success());

    // `down` stops the OSDs and the private etcd.
    let etcd = etcd_pid(&c);
    assert!(alive(etcd));
    let said = c.ok(&["cluster", "down"]);
    assert!(said.contains("and the private etcd"), "{said}");
    assert!(!alive(etcd), "the private etcd outlived `cluster down`");

    // Flags that contradict where the map is are refused, and change nothing.
    let err = c.fails(&["cluster", "up", "--etcd", "http://127.0.0.1:1"]);
    assert!(
        err.contains("--etcd http://127.0.0.1:1 (the map is in a private etcd)"),
        "{err}"
    );

    // `up` again: etcd is started on its data, the map read back, the data there.
    let said = c.ok(&["cluster", "up", "--no-pin"]);
    assert!(said.contains("restarting osd.0"), "{said}");
    assert!(said.contains("started the private etcd"), "{said}");
    let out = c.run(&["volume", "read", "v", "--length", "1M", "--file", "-", "-q"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == data, "data changed across the restart");
}

#[test]
fn a_file_map_cluster_refuses_to_move_its_map_to_etcd_on_restart() {
    let c = Cluster::up("etcd-refuse", &[]);
    c.ok(&["cluster", "down"]);
    let err = c.fails(&["cluster", "up", "--with-etcd"]);
    assert!(
        err.contains("--with-etcd (the map is in the file osdmap)"),
        "{err}"
    );
    assert!(!c.dir.join("etcd.data").exists(), "etcd was started anyway");
}
