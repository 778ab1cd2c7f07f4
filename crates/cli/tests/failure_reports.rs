//! Failure reports with real processes (decision 0014): an OSD that hangs keeps its
//! registration (with a map file its lock lives as long as its process), so only its peers can
//! tell. They report it once it has not answered for the peer grace, the managers mark it
//! down and hold it down, the PGs peer without it and the clients' writes complete. Past the
//! hold it stays down while it cannot say that it runs; once it runs again it comes back up
//! and catches up.

mod common;

use common::{signal, stop, Cluster, Continue};
use std::time::{Duration, Instant};

/// The longest peer silence any reactor of OSD `id` reports in its metrics (seconds).
fn longest_silence(c: &Cluster, id: u32) -> f64 {
    use std::io::{Read, Write};
    let addr = std::fs::read_to_string(carmine_localcluster::metrics_path(&c.dir, id)).unwrap();
    let mut s = std::net::TcpStream::connect(addr.trim()).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
        .lines()
        .filter(|l| l.starts_with("carmine_osd_peer_silence_longest_seconds{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn osd_state(c: &Cluster, id: u32) -> carmine_cluster::OsdInfo {
    carmine_localcluster::read_map(&c.dir)
        .unwrap()
        .osd(id)
        .unwrap()
        .clone()
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

#[test]
fn a_hung_osd_is_reported_by_its_peers_marked_down_and_held_until_it_runs_again() {
    let c = Cluster::up(
        "reports",
        &[
            "--osds",
            "3",
            "--pg-num",
            "16",
            "--peer-grace",
            "4",
            "--report-hold",
            "6",
        ],
    );
    c.create_volume("v", "8M", "1M");
    let first = pattern(8 << 20, 1);
    c.write_volume("v", &first);
    let victim = c.osd_pid(2);
    let _cont = Continue(victim);
    stop(victim);
    let stopped = Instant::now();
    // Meanwhile the others' metrics say how long osd.2 has been silent to them.
    std::thread::sleep(Duration::from_secs(3));
    let silence: f64 = [0, 1]
        .iter()
        .map(|&o| longest_silence(&c, o))
        .fold(0.0, f64::max);
    assert!(silence >= 1.0, "longest peer silence {silence} s");
    // Writes to every object: those of PGs with osd.2 wait until the managers mark it down
    // on the others' reports, then complete in the next interval.
    let second = pattern(8 << 20, 2);
    c.write_volume("v", &second);
    let took = stopped.elapsed();
    let o = osd_state(&c, 2);
    assert!(!o.up && o.in_ && o.held_down_until > 0, "{o:?}");
    assert_eq!(o.report_markdowns, 1, "{o:?}");
    // The grace (4 s), a report, a manager tick, peering: well under the 30 s a client
    // waits for a PG before it gives up.
    assert!(took < Duration::from_secs(20), "writes waited {took:?}");
    let log = std::fs::read_to_string(c.dir.join("mgr.0.log")).unwrap_or_default()
        + &std::fs::read_to_string(c.dir.join("mgr.1.log")).unwrap_or_default();
    assert!(
        // By one of its peers or both, whichever reported first.
        log.contains("osd.2 down on failure reports (unreachable from osd."),
        "{log}"
    );
    let status = String::from_utf8_lossy(&c.run(&["cluster", "status"]).stdout).into_owned();
    assert!(
        status.contains("osd.2 is held down on its peers' failure reports"),
        "{status}"
    );
    // Still hung when its hold ends: registered, but it cannot say it runs, so it stays down.
    let held = Duration::from_secs(o.held_down_until)
        .saturating_sub(std::time::UNIX_EPOCH.elapsed().unwrap());
    std::thread::sleep(held + Duration::from_secs(2));
    let still = osd_state(&c, 2);
    assert!(!still.up && still.report_markdowns == 1, "{still:?}");
    let status = String::from_utf8_lossy(&c.run(&["cluster", "status"]).stdout).into_owned();
    assert!(
        status.contains("past its hold, until it says it runs"),
        "{status}"
    );
    // Running again, it takes the map, says so, comes back up, catches up and serves what
    // was written while it hung.
    signal(victim, libc::SIGCONT);
    let took_up = wait_for("osd.2 back up", Duration::from_secs(15), || {
        osd_state(&c, 2).up
    });
    eprintln!("osd.2 up {took_up:?} after it ran again");
    wait_for("HEALTH_OK", Duration::from_secs(30), || {
        c.run(&["cluster", "status"]).status.success()
    });
    let back = c
        .cmd(&["volume", "read", "v", "--file", "-", "-q"])
        .output()
        .unwrap();
    assert!(back.status.success());
    assert!(back.stdout == second, "the volume does not read back");
    // Nothing reports anything any more.
    let status = c.ok(&["cluster", "status"]);
    assert!(!status.contains("cannot hear"), "{status}");
    eprintln!("writes waited {took:?} for the hung osd.2 to be marked down");
}
