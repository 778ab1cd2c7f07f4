//! Each OSD serves Prometheus metrics; `promtool check metrics` (Debian's `prometheus`
//! package, installed by .ci/run) accepts them, and the counters move with the I/O.

mod common;

use common::Cluster;
use std::io::{Read, Write};
use std::process::{Command, Stdio};

fn scrape(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    (head.to_owned(), body.to_owned())
}

/// Fails unless `promtool check metrics` finds nothing wrong with `text`.
fn promtool_accepts(text: &str) {
    let check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(|mut p| {
            p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
            p.wait_with_output().unwrap()
        })
        .expect(
            "this test needs promtool (Debian: apt-get install prometheus; .ci/run installs it)",
        );
    assert!(
        check.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}

/// The value of the sample with exactly these labels.
fn sample(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name_and_labels} in\n{text}"))
}

#[test]
fn osds_serve_prometheus_metrics_that_promtool_accepts_and_that_count_the_io() {
    let c = Cluster::up("metrics", &["--osds", "2", "--reactors", "2"]);
    let addr = std::fs::read_to_string(c.dir.join("osd.0.metrics"))
        .unwrap()
        .trim()
        .to_owned();
    let status = c.ok(&["cluster", "status"]);
    assert!(
        status.contains(&format!("metrics http://{addr}/metrics")),
        "{status}"
    );
    // Both OSDs: the few objects of a small volume may all land on one of them.
    let addrs: Vec<String> = (0..2)
        .map(|o| {
            std::fs::read_to_string(c.dir.join(format!("osd.{o}.metrics")))
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect();
    let all = |addrs: &[String]| -> Vec<String> {
        addrs.iter().map(|a| scrape(a, "/metrics").1).collect()
    };
    let before = all(&addrs);

    c.ok(&["volume", "create", "v", "--size", "16M"]);
    c.write_volume("v", &vec![7u8; 8 << 20]);
    c.ok(&[
        "volume",
        "read",
        "v",
        "--length",
        "8M",
        "--file",
        "/dev/null",
        "-q",
    ]);

    let (head, text) = scrape(&addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    promtool_accepts(&text);

    let total = |texts: &[String], kind: &str| -> f64 {
        texts
            .iter()
            .enumerate()
            .flat_map(|(o, t)| (0..2).map(move |r| (o, r, t)))
            .map(|(o, r, t)| {
                sample(
                    t,
                    &format!(
                        "carmine_osd_requests_total{{osd=\"{o}\",reactor=\"{r}\",kind=\"{kind}\"}}"
                    ),
                )
            })
            .sum()
    };
    let after = all(&addrs);
    assert!(
        total(&after, "write") > total(&before, "write"),
        "writes not counted"
    );
    assert!(
        total(&after, "read") > total(&before, "read"),
        "reads not counted"
    );
    let count = sample(
        &text,
        "carmine_osd_request_latency_seconds_count{osd=\"0\",reactor=\"0\",kind=\"write\"}",
    );
    let inf = sample(
        &text,
        "carmine_osd_request_latency_seconds_bucket{osd=\"0\",reactor=\"0\",kind=\"write\",le=\"+Inf\"}",
    );
    assert_eq!(count, inf);
    assert_eq!(
        count,
        sample(
            &text,
            "carmine_osd_requests_total{osd=\"0\",reactor=\"0\",kind=\"write\"}"
        )
    );
    assert!(
        sample(
            &text,
            "carmine_osd_received_bytes_total{osd=\"0\",reactor=\"0\"}"
        ) > 0.0
    );
    assert_eq!(
        sample(&text, "carmine_osd_map_epoch{osd=\"0\",reactor=\"1\"}"),
        1.0
    );
    assert!(
        sample(
            &text,
            "carmine_osd_reactor_cpu_seconds_total{osd=\"0\",reactor=\"0\"}"
        ) > 0.0
    );
    // The PGs of the two OSDs' four reactors add up to the pool's 64.
    let pgs: f64 = (0..2)
        .flat_map(|o| (0..2).map(move |r| (o, r)))
        .map(|(o, r)| {
            let a = std::fs::read_to_string(c.dir.join(format!("osd.{o}.metrics"))).unwrap();
            let (_, t) = scrape(a.trim(), "/metrics");
            sample(
                &t,
                &format!("carmine_osd_pgs{{osd=\"{o}\",reactor=\"{r}\"}}"),
            )
        })
        .sum();
    assert_eq!(pgs, 64.0);
    let (head, _) = scrape(&addr, "/other");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}

/// The store's space figures reach the metrics and `cluster status`, which warns as an OSD
/// fills up (Ceph's nearfull at 85%).
#[test]
fn space_used_shows_in_metrics_and_status_and_a_nearly_full_osd_warns() {
    // One OSD, one reactor, a 48 MiB memory store.
    let c = Cluster::up("metrics-space", &["--memory-limit", "48M"]);
    let addr = std::fs::read_to_string(c.dir.join("osd.0.metrics"))
        .unwrap()
        .trim()
        .to_owned();
    let capacity = "carmine_osd_store_capacity_bytes{osd=\"0\",reactor=\"0\"}";
    let used = "carmine_osd_store_used_bytes{osd=\"0\",reactor=\"0\"}";
    assert_eq!(
        sample(&scrape(&addr, "/metrics").1, capacity),
        (48 << 20) as f64
    );
    let status = c.ok(&["cluster", "status"]);
    assert!(
        status.contains("usage: 0.00 GiB used of 0.05 GiB"),
        "{status}"
    );

    c.ok(&[
        "volume",
        "create",
        "v",
        "--size",
        "64M",
        "--object-size",
        "1M",
    ]);
    c.write_volume("v", &vec![9u8; 44 << 20]);
    // Refreshed every second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while sample(&scrape(&addr, "/metrics").1, used) < (44 << 20) as f64 {
        assert!(
            std::time::Instant::now() < deadline,
            "used bytes never reached 44 MiB"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = c.run(&["cluster", "status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("HEALTH_WARN"), "{text}");
    assert!(text.contains("osd.0 is nearly full (9"), "{text}");
}

/// A native store's own counters (journal, checkpoints, cleaner, checksum errors, paging)
/// reach the OSD's metrics, per reactor shard, and move with the I/O.
#[test]
fn a_native_stores_own_counters_show_in_the_metrics() {
    let c = Cluster::up(
        "metrics-native",
        &["--store", "native", "--device-size", "512M"],
    );
    let addr = std::fs::read_to_string(c.dir.join("osd.0.metrics"))
        .unwrap()
        .trim()
        .to_owned();
    c.ok(&["volume", "create", "v", "--size", "16M"]);
    c.write_volume("v", &vec![5u8; 8 << 20]);
    let labels = "{osd=\"0\",reactor=\"0\"}";
    let written = format!("carmine_native_user_written_bytes_total{labels}");
    // Refreshed every second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let text = loop {
        let text = scrape(&addr, "/metrics").1;
        if sample(&text, &written) >= (8 << 20) as f64 {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the written bytes never reached 8 MiB"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    promtool_accepts(&text);
    assert!(text.contains("# TYPE carmine_native_checkpoints_total counter"));
    assert!(text.contains("# TYPE carmine_native_body_resident_bytes gauge"));
    assert!(sample(&text, &format!("carmine_native_transactions_total{labels}")) > 0.0);
    // The post-mount checkpoint, at least.
    assert!(sample(&text, &format!("carmine_native_checkpoints_total{labels}")) >= 1.0);
    assert_eq!(
        sample(
            &text,
            &format!("carmine_native_checksum_errors_total{labels}")
        ),
        0.0
    );
    assert!(
        sample(
            &text,
            &format!("carmine_native_journal_sync_seconds_total{labels}")
        ) >= 0.0
    );
}
