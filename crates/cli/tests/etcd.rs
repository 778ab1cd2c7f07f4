//! A cluster whose map lives in etcd (issue #11, first step): `cluster up --with-etcd` runs a
//! private etcd (Debian's etcd-server, installed by .ci/run) from the cluster directory.

mod common;

use common::{alive, Cluster};

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
    // Secured: TLS both ways and etcd auth, with material of its own made at `up`.
    assert!(
        status.contains("map in etcd https://127.0.0.1:"),
        "{status}"
    );
    assert!(status.contains("over TLS as root"), "{status}");
    use std::os::unix::fs::PermissionsExt;
    for f in ["server.key", "client.key", "root.password"] {
        let mode = std::fs::metadata(c.dir.join("etcd-tls").join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    let endpoint = status
        .split("map in etcd ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap()
        .to_owned();
    // Without the cluster's certificate and password, etcd gives nothing away.
    use carmine_mapstore::MapStore;
    let bare = carmine_mapstore::EtcdMapStore::new(&[endpoint.replace("https", "http")], "x")
        .unwrap()
        .get();
    assert!(bare.is_err(), "{bare:?}");
    assert!(
        status.contains("(private, in the cluster directory)"),
        "{status}"
    );

    c.ok(&["volume", "create", "v", "--size", "8M"]);
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 % 251) as u8).collect();
    c.write_volume("v", &data);

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

/// Someone else's etcd, secured (TLS with client certificates, etcd auth): `cluster up --etcd`
/// with the CA, certificate and password reaches it, and so do the OSDs and managers it
/// starts; without them `up` fails with the reason and leaves nothing behind.
#[test]
fn a_cluster_uses_a_secured_etcd_given_its_certificates_and_password() {
    let etcd_dir = std::env::temp_dir().join(format!("carmine-e2e-theirs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&etcd_dir);
    let etcd = carmine_mapstore::PrivateEtcd::start_secure(&etcd_dir).unwrap();
    let a = etcd.access().clone();
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().unwrap().display().to_string();
    let (ca, cert, key, pw) = (
        path(&a.ca),
        path(&a.cert),
        path(&a.key),
        path(&a.password_file),
    );
    let ep = etcd.endpoint().to_owned();

    // Without the password: refused, and no cluster is left in the directory.
    let dir = std::env::temp_dir().join(format!("carmine-e2e-secured-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = std::process::Command::new(common::BIN)
        .args([
            "cluster",
            "up",
            "--no-pin",
            "--memory-limit",
            "256M",
            "--etcd",
            &ep,
        ])
        .args(["--etcd-ca", &ca, "--etcd-cert", &cert, "--etcd-key", &key])
        .env("CARMINE_DIR", &dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("user name is empty") || err.contains("HTTP 4"),
        "{err}"
    );
    assert!(
        !dir.join("cluster.json").exists(),
        "a refused up left its settings"
    );

    let c = Cluster::up(
        "secured",
        &[
            "--osds",
            "2",
            "--lease-ttl",
            "2",
            "--etcd",
            &ep,
            "--etcd-ca",
            &ca,
            "--etcd-cert",
            &cert,
            "--etcd-key",
            &key,
            "--etcd-user",
            "root",
            "--etcd-password-file",
            &pw,
        ],
    );
    let status = c.ok(&["cluster", "status"]);
    assert!(status.contains("HEALTH_OK"), "{status}");
    assert!(status.contains("over TLS as root"), "{status}");
    assert!(
        status.contains("leads"),
        "a manager leads through the secured etcd: {status}"
    );
    // The managers see an OSD die through it too.
    let pid: i32 = std::fs::read_to_string(c.dir.join("osd.1.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let m = carmine_localcluster::read_map(&c.dir).unwrap();
        if !m.osd(1).unwrap().up {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "osd.1 never marked down"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // An OSD for another host needs no copy of the key file: etcd (which authenticates its
    // clients) holds the key, and the OSD takes it from there.
    let free = carmine_testkit::free_addr().port();
    let said = c.ok(&[
        "osd",
        "add",
        "--host",
        "127.0.0.1",
        "--port-base",
        &(free - 32).to_string(),
        "--in",
        "--allow-single-copy-moves",
    ]);
    let flags = said
        .lines()
        .find_map(|l| l.strip_prefix("start it on that host with: carmine "))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(!flags.contains("--key-file"), "{flags}");
    let args: Vec<&str> = flags.split_whitespace().collect();
    let mut osd2 = std::process::Command::new(common::BIN)
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let m = loop {
        let m = carmine_localcluster::read_map(&c.dir).unwrap();
        if m.osd(2).is_some_and(|o| o.up) {
            break m;
        }
        assert!(std::time::Instant::now() < deadline, "osd.2 never came up");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    // It authenticates its peers with the cluster's key: none is refused, the key is let in.
    let addr = m.osd(2).unwrap().reactors[0];
    let key = carmine_localcluster::read_key(&c.dir).unwrap();
    carmine_reactor::block_on(async move {
        use carmine_proto::{Request, Status};
        let bare = carmine_client::Connection::open(addr, 1).await.unwrap();
        let err = bare.call(&Request::GetMap).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::AuthFailed), "{err}");
        let keyed = carmine_client::Connection::open_with(addr, 1, key.as_ref())
            .await
            .unwrap();
        keyed.call(&Request::GetMap).await.unwrap();
    });
    let _ = osd2.kill();
    let _ = osd2.wait();
    drop(c);
    drop(etcd);
    let _ = std::fs::remove_dir_all(&etcd_dir);
    let _ = std::fs::remove_dir_all(&dir);
}
