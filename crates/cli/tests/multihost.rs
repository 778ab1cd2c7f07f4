//! Multi-host for real, on one machine: three network namespaces ("hosts") and a fourth for
//! the client, joined by veth pairs to a bridge, with real TCP between them. etcd, the
//! managers and osd.0 run on host 1; osd.1 and osd.2 join from hosts 2 and 3 (`osd add`, then
//! `carmine osd` there); the client reaches all of them by address. Cutting host 3's link
//! gets osd.2 marked down (its lease runs out); restoring it brings it back up. Needs root
//! (namespaces, veth); skipped with a note otherwise.

mod common;

use common::BIN;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const TTL: u64 = 2;

/// The namespaces and links of one test run; removed when dropped.
struct Net {
    tag: String,
}

impl Net {
    fn ns(&self, i: u32) -> String {
        format!("{}h{i}", self.tag)
    }
    fn veth(&self, i: u32) -> String {
        format!("{}v{i}", self.tag)
    }
    fn bridge(&self) -> String {
        format!("{}br", self.tag)
    }
    fn addr(i: u32) -> String {
        format!("10.77.{}.{i}", std::process::id() % 250)
    }
    fn set_link(&self, i: u32, up: bool) {
        ip(&["link", "set", &self.veth(i), if up { "up" } else { "down" }]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 1..=4 {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(i)])
                .output();
            let _ = Command::new("ip")
                .args(["link", "del", &self.veth(i)])
                .output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge()])
            .output();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn build_net() -> Net {
    let net = Net {
        tag: format!("cm{}", std::process::id() % 100_000),
    };
    ip(&["link", "add", &net.bridge(), "type", "bridge"]);
    ip(&["link", "set", &net.bridge(), "up"]);
    for i in 1..=4 {
        let (ns, v) = (net.ns(i), net.veth(i));
        let peer = format!("{v}p");
        ip(&["netns", "add", &ns]);
        ip(&["link", "add", &v, "type", "veth", "peer", "name", &peer]);
        ip(&["link", "set", &peer, "netns", &ns]);
        ip(&["link", "set", &v, "master", &net.bridge()]);
        ip(&["link", "set", &v, "up"]);
        let cidr = format!("{}/24", Net::addr(i));
        ip(&[
            "netns", "exec", &ns, "ip", "addr", "add", &cidr, "dev", &peer,
        ]);
        ip(&["netns", "exec", &ns, "ip", "link", "set", &peer, "up"]);
        ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
    }
    net
}

/// `carmine ARGS` inside namespace `ns`.
fn carmine_in(ns: &str, dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, BIN])
        .args(args)
        .env("CARMINE_DIR", dir)
        .env_remove("CARMINE_LOG");
    c
}

fn ok(mut c: Command) -> String {
    let out: Output = c.output().expect("running carmine");
    assert!(
        out.status.success(),
        "{c:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Cluster {
    dir: PathBuf,
    net: Net,
    remote: Vec<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.remote {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = carmine_in(&self.net.ns(1), &self.dir, &["cluster", "down"]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn map(dir: &Path) -> carmine_cluster::OsdMap {
    // The map is in etcd on host 1: read it from there.
    let out = ok({
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &format!("cm{}h1", std::process::id() % 100_000),
            BIN,
        ])
        .args(["osd", "tree"])
        .env("CARMINE_DIR", dir);
        c
    });
    let epoch: u32 = out
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("map epoch "))
        .and_then(|e| e.trim().parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    // Only what the test needs from the tree: epoch and each OSD's state.
    let mut m = carmine_cluster::OsdMap {
        epoch,
        osds: vec![],
        pools: vec![],
        upmaps: Default::default(),
    };
    for l in out.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() == 6 && f[1].starts_with("osd.") {
            let mut o = carmine_cluster::OsdInfo::new(
                f[0].parse().unwrap(),
                "",
                vec!["0.0.0.0:1".parse().unwrap()],
            );
            o.up = f[2] == "up";
            o.in_ = f[3] == "in";
            m.osds.push(o);
        }
    }
    m
}

fn wait_for(
    dir: &Path,
    what: &str,
    limit: Duration,
    done: impl Fn(&carmine_cluster::OsdMap) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let m = map(dir);
        if done(&m) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "{what}: not within {limit:?}; epoch {} {:?}",
            m.epoch,
            m.osds
                .iter()
                .map(|o| (o.id, o.up, o.in_))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn three_hosts_and_a_client_over_real_tcp_with_a_partition_and_its_healing() {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    if Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        panic!("this test needs etcd (Debian: apt-get install etcd-server; .ci/run installs it)");
    }
    let t0 = Instant::now();
    let phase = |what: &str| println!("{:>6.1} s  {what}", t0.elapsed().as_secs_f64());
    let net = build_net();
    let dir = std::env::temp_dir().join(format!("carmine-multihost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = Cluster {
        dir: dir.clone(),
        net,
        remote: Vec::new(),
    };
    let (h1, h4) = (c.net.ns(1), c.net.ns(4));

    // etcd on host 1, reachable by every host at its address.
    let a1 = Net::addr(1);
    let etcd_url = format!("http://{a1}:2379");
    let etcd_dir = dir.join("etcd.data");
    let etcd = Command::new("ip")
        .args(["netns", "exec", &h1, "etcd", "--name", "mh", "--data-dir"])
        .arg(&etcd_dir)
        .args([
            "--listen-client-urls",
            &etcd_url,
            "--advertise-client-urls",
            &etcd_url,
        ])
        .args(["--listen-peer-urls", &format!("http://{a1}:2380")])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://{a1}:2380"),
        ])
        .args(["--initial-cluster", &format!("mh=http://{a1}:2380")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("etcd.log")).unwrap())
        .spawn()
        .unwrap();
    c.remote.push(etcd);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !Command::new("ip")
        .args([
            "netns",
            "exec",
            &h1,
            "bash",
            "-c",
            &format!("echo > /dev/tcp/{a1}/2379"),
        ])
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(Instant::now() < deadline, "etcd did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }

    phase("etcd up");
    // The cluster: osd.0 and the managers on host 1, bound to host 1's address.
    ok(carmine_in(
        &h1,
        &dir,
        &[
            "cluster",
            "up",
            "--no-pin",
            "--memory-limit",
            "512M",
            "--etcd",
            &etcd_url,
            "--host",
            &a1,
            "--lease-ttl",
            &TTL.to_string(),
            "--pg-num",
            "32",
        ],
    ));
    // osd.1 and osd.2 on hosts 2 and 3: added to the map (in; nothing is stored yet, so no
    // data is stranded), then started there.
    for (id, host) in [(1u32, 2u32), (2, 3)] {
        let said = ok(carmine_in(
            &h1,
            &dir,
            &[
                "osd",
                "add",
                "--host",
                &Net::addr(host),
                "--host-name",
                &format!("host{host}"),
                "--in",
                "--allow-single-copy-moves",
            ],
        ));
        assert!(
            said.contains(&format!("added osd.{id} on host{host}")),
            "{said}"
        );
        let flags = said
            .lines()
            .find_map(|l| l.strip_prefix("start it on that host with: carmine "))
            .unwrap_or_else(|| panic!("{said}"))
            .to_owned();
        let args: Vec<&str> = flags.split_whitespace().collect();
        let child = carmine_in(&c.net.ns(host), &dir, &args)
            .stdout(std::fs::File::create(dir.join(format!("osd.{id}.remote.log"))).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        c.remote.push(child);
    }
    wait_for(&dir, "all three OSDs up", Duration::from_secs(20), |m| {
        m.osds.len() == 3 && m.osds.iter().all(|o| o.up && o.in_)
    });
    phase("three OSDs up");
    let tree = ok(carmine_in(&h1, &dir, &["osd", "tree"]));
    assert!(
        tree.contains("host host2") && tree.contains("host host3"),
        "{tree}"
    );

    // The client, on host 4, writes and reads through all three hosts.
    ok(carmine_in(
        &h4,
        &dir,
        &[
            "volume",
            "create",
            "v",
            "--size",
            "16M",
            "--object-size",
            "1M",
        ],
    ));
    let data: Vec<u8> = (0..16 << 20).map(|i: u32| (i * 31 % 251) as u8).collect();
    let file = dir.join("data");
    std::fs::write(&file, &data).unwrap();
    ok(carmine_in(
        &h4,
        &dir,
        &[
            "volume",
            "write",
            "v",
            "--file",
            file.to_str().unwrap(),
            "-q",
        ],
    ));
    let back = dir.join("back");
    ok(carmine_in(
        &h4,
        &dir,
        &[
            "volume",
            "read",
            "v",
            "--length",
            "16M",
            "--file",
            back.to_str().unwrap(),
            "-q",
        ],
    ));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "data read over the network differs"
    );
    let status = ok(carmine_in(&h4, &dir, &["cluster", "status"]));
    assert!(status.contains("HEALTH_OK"), "{status}");

    phase("client wrote and read 16 MiB");
    // Partition host 3: osd.2 cannot renew its lease; it is marked down.
    c.net.set_link(3, false);
    let took = wait_for(
        &dir,
        "osd.2 down after the partition",
        Duration::from_secs(TTL + 8),
        |m| m.osds.iter().any(|o| o.id == 2 && !o.up),
    );
    println!("osd.2 marked down {took:?} after its host was cut off (TTL {TTL} s)");
    let out = carmine_in(&h4, &dir, &["cluster", "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 osds down (osd.2)"), "{text}");

    phase("partitioned");
    // Healed: it registers again and is up in a new epoch; the data is all there.
    c.net.set_link(3, true);
    let took = wait_for(
        &dir,
        "osd.2 up after healing",
        Duration::from_secs(TTL + 10),
        |m| m.osds.iter().all(|o| o.up),
    );
    println!("osd.2 up again {took:?} after the link came back");
    let _ = std::fs::remove_file(&back);
    ok(carmine_in(
        &h4,
        &dir,
        &[
            "volume",
            "read",
            "v",
            "--length",
            "16M",
            "--file",
            back.to_str().unwrap(),
            "-q",
        ],
    ));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "data changed across the partition"
    );
}
