//! Hostile and careless peers against an OSD (issue #10): a client that never reads its
//! replies, garbage after valid writes, idle and half-sent connections, ten thousand
//! connections. The OSD stays up, its memory stays bounded, other clients keep writing,
//! nothing acknowledged is lost.

use bytes::{Bytes, BytesMut};
use carmine_client::{Client, ClientConfig};
use carmine_cluster::OsdMap;
use carmine_nativestore::{FileDevice, NativeConfig, SyncMode};
use carmine_osd::{Osd, OsdConfig, StoreConfig, CONNECTIONS_MAX_DEFAULT, IDLE_TIMEOUT_DEFAULT};
use carmine_proto::{encode_request, try_decode_frame, ObjectRequest, OsdOp, Request};
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Native {
    osd: Option<Osd>,
    map: OsdMap,
    device: Option<PathBuf>,
}

impl Drop for Native {
    fn drop(&mut self) {
        if let Some(osd) = self.osd.take() {
            let _ = osd.shutdown();
        }
        if let Some(device) = &self.device {
            let _ = std::fs::remove_file(device);
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Store {
    /// Requests never suspend: the OSD serves each connection in one sequential loop.
    Memory,
    /// Requests suspend on the device: each connection keeps many in flight.
    Native,
}

fn free_addr() -> SocketAddr {
    carmine_testkit::free_addr()
}

fn start_native(name: &str) -> Native {
    start(
        name,
        Store::Native,
        free_addr(),
        CONNECTIONS_MAX_DEFAULT,
        Some(IDLE_TIMEOUT_DEFAULT),
    )
}

fn start(
    name: &str,
    store: Store,
    addr: SocketAddr,
    connections_max: u32,
    idle_timeout: Option<Duration>,
) -> Native {
    let device =
        std::env::temp_dir().join(format!("carmine-hostile-{name}-{}", std::process::id()));
    let store = match store {
        Store::Memory => StoreConfig::Memory {
            memory_limit_bytes: 64 << 20,
        },
        Store::Native => {
            let f = std::fs::File::create(&device).unwrap();
            f.set_len(512 << 20).unwrap();
            drop(f);
            carmine_reactor::block_on(async {
                let dev = FileDevice::open(&device, SyncMode::Fdatasync)
                    .await
                    .unwrap();
                carmine_nativestore::mkfs(&dev, 1, 32 << 20).await.unwrap();
            });
            StoreConfig::Native {
                device: device.clone(),
                config: NativeConfig::default(),
                sync: SyncMode::Fdatasync,
            }
        }
    };
    let device = matches!(store, StoreConfig::Native { .. }).then_some(device);
    let map = OsdMap::single_osd(vec![addr], 8);
    let osd = Osd::start(OsdConfig {
        id: 0,
        map: map.clone(),
        reactor_cpus: vec![None],
        store,
        connections_max,
        idle_timeout,
        auth_key: None,
        pg_history: None,
        temp_changer: None,
        scrub: Default::default(),
        recovery: Default::default(),
        read_lease: carmine_osd::READ_LEASE_DEFAULT,
        prior_read_lease: None,
        write_ack_wait: carmine_osd::WRITE_ACK_WAIT_DEFAULT,
        lease: None,
    })
    .unwrap();
    Native {
        osd: Some(osd),
        map,
        device,
    }
}

fn object_request(map: &OsdMap, oid: &str, ops: Vec<OsdOp>) -> Request {
    let pg = map.object_pg(map.pool(1).unwrap(), oid);
    Request::Object(ObjectRequest {
        pool: 1,
        pg_seed: pg.seed,
        epoch: 1,
        client: 0,
        tid: 0,
        oid: oid.into(),
        ops,
    })
}

/// Writes `n` 4 KiB blocks through a fresh client and returns how long that took.
fn timed_writes(map: &OsdMap, n: u64) -> Duration {
    let addrs = map.osds[0].reactors.clone();
    carmine_reactor::block_on(async move {
        let c = Client::connect(&addrs, ClientConfig::default())
            .await
            .unwrap();
        let t = Instant::now();
        let writes = async {
            for i in 0..n {
                let data = Bytes::from(vec![(i % 251) as u8; 4096]);
                c.write(1, &format!("polite-{}", i % 16), (i / 16) * 4096, data)
                    .await
                    .unwrap();
            }
        };
        // A wedged shard would hang here forever: fail instead.
        carmine_reactor::timeout(Duration::from_secs(30), writes)
            .await
            .expect("writes hung: the shard is wedged");
        t.elapsed()
    })
}

#[test]
fn a_client_that_never_reads_replies_does_not_stall_other_writers() {
    let n = start_native("noread");
    // Something to read: 4 MiB.
    let addrs = n.map.osds[0].reactors.clone();
    carmine_reactor::block_on(async {
        let c = Client::connect(&addrs, ClientConfig::default())
            .await
            .unwrap();
        c.write(1, "big", 0, Bytes::from(vec![1u8; 4 << 20]))
            .await
            .unwrap();
    });
    // The rude client: reads of 4 MiB and writes, interleaved and pipelined, and it never
    // reads a reply. Its socket fills, its connection cannot send.
    let mut rude = TcpStream::connect(addrs[0]).unwrap();
    rude.set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = BytesMut::new();
    for i in 0..200u64 {
        encode_request(
            &mut buf,
            2 * i + 1,
            &object_request(
                &n.map,
                "big",
                vec![OsdOp::Read {
                    off: 0,
                    len: 4 << 20,
                }],
            ),
        );
        encode_request(
            &mut buf,
            2 * i + 2,
            &object_request(
                &n.map,
                &format!("rude-{}", i % 8),
                vec![OsdOp::Write {
                    off: i * 4096,
                    data: Bytes::from(vec![2u8; 4096]),
                }],
            ),
        );
    }
    // It may block once the OSD stops reading (back-pressure): that is expected.
    let _ = rude.write_all(&buf);
    // A polite client still gets its writes acknowledged, at the device's pace.
    let took = timed_writes(&n.map, 200);
    assert!(
        took < Duration::from_secs(20),
        "polite writes took {took:?}"
    );
    drop(rude);
}

#[test]
fn garbage_after_valid_writes_ends_that_connection_after_its_writes_are_durable() {
    let n = start_native("garbage");
    let addrs = n.map.osds[0].reactors.clone();
    for round in 0..20u64 {
        let mut s = TcpStream::connect(addrs[0]).unwrap();
        let mut buf = BytesMut::new();
        for i in 0..16u64 {
            encode_request(
                &mut buf,
                i + 1,
                &object_request(
                    &n.map,
                    &format!("g-{round}"),
                    vec![OsdOp::Write {
                        off: i * 4096,
                        data: Bytes::from(vec![round as u8 + 1; 4096]),
                    }],
                ),
            );
        }
        buf.extend_from_slice(&[0xde; 100]);
        s.write_all(&buf).unwrap();
        drop(s);
    }
    // The shard is not wedged: new writes go through promptly.
    let took = timed_writes(&n.map, 100);
    assert!(
        took < Duration::from_secs(20),
        "writes after garbage took {took:?}"
    );
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn ping_frame(id: u64) -> BytesMut {
    let mut buf = BytesMut::new();
    let payload = Bytes::from_static(b"are you there?");
    encode_request(&mut buf, id, &Request::Ping { payload });
    buf
}

/// One ping round trip on a raw connection: false if the OSD closed it instead of answering.
fn ping(s: &mut TcpStream, id: u64) -> bool {
    if s.write_all(&ping_frame(id)).is_err() {
        return false;
    }
    let mut rbuf = BytesMut::new();
    let mut chunk = [0u8; 4096];
    // Each read waits at most the socket's read timeout; a reply is a few dozen bytes.
    for _ in 0..64 {
        if let Some(frame) = try_decode_frame(&mut rbuf).unwrap() {
            assert_eq!(frame.header.request_id, id);
            return true;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => rbuf.extend_from_slice(&chunk[..n]),
        }
    }
    panic!("no whole reply to a ping in 64 reads");
}

/// Sends all of a ping but its last byte: a frame that never completes (slowloris).
fn send_half_a_frame(s: &mut TcpStream) {
    let frame = ping_frame(u64::MAX);
    s.write_all(&frame[..frame.len() - 1]).unwrap();
}

/// Whether the OSD has closed `s`: waits up to `wait` for end-of-stream or a reset.
fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    match s.read(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => panic!("unexpected bytes from the OSD"),
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn idle_and_stalled_connections_are_closed(store: Store) {
    let n = start(
        &format!("idle-{store:?}"),
        store,
        free_addr(),
        CONNECTIONS_MAX_DEFAULT,
        Some(Duration::from_secs(1)),
    );
    let addr = n.map.osds[0].reactors[0];
    let opened = Instant::now();
    let mut silent = connect(addr);
    let mut used = connect(addr);
    if !ping(&mut used, 1) {
        // Closed before its first answer: as idle, only if the box stalled for the whole
        // timeout (CI flaked so once, on a loaded 2-core box); otherwise the OSD is wrong.
        let waited = opened.elapsed();
        assert!(
            waited >= Duration::from_millis(900),
            "{store:?}: a fresh connection was closed within {waited:?} (timeout 1 s)"
        );
        eprintln!("{store:?}: the first ping came {waited:?} after connecting, too late to tell");
        return;
    }
    let mut slowloris = connect(addr);
    send_half_a_frame(&mut slowloris);
    let mut active = connect(addr);
    // Half the timeout later all are open. (Only if it is still well within the timeout: on a
    // box stalled for most of a second here the check would say nothing about the OSD.)
    std::thread::sleep(Duration::from_millis(500));
    for (what, s) in [
        ("silent", &mut silent),
        ("used", &mut used),
        ("slowloris", &mut slowloris),
    ] {
        let quiet_for = opened.elapsed();
        if quiet_for > Duration::from_millis(800) {
            eprintln!("{store:?}: {what} checked after {quiet_for:?}, too late to tell");
            continue;
        }
        assert!(
            !closed_within(s, Duration::from_millis(10)),
            "{store:?}: the {what} connection closed within {quiet_for:?} (timeout 1 s)"
        );
    }
    // A connection that pings every 200 ms is kept for three timeouts and more...
    for i in 0..15 {
        assert!(
            ping(&mut active, 10 + i),
            "{store:?}: an active connection was closed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // ...while the others, quiet for 3.5 timeouts, are gone.
    for (what, s) in [
        ("silent", &mut silent),
        ("used", &mut used),
        ("slowloris", &mut slowloris),
    ] {
        assert!(
            closed_within(s, Duration::from_secs(2)),
            "{store:?}: the {what} connection outlived the idle timeout"
        );
    }
    // The closed ones cost nothing more: a new connection is served.
    assert!(ping(&mut connect(addr), 99));
}

#[test]
fn idle_and_half_frame_connections_are_closed_and_active_ones_kept_memory_store() {
    idle_and_stalled_connections_are_closed(Store::Memory);
}

#[test]
fn idle_and_half_frame_connections_are_closed_and_active_ones_kept_native_store() {
    idle_and_stalled_connections_are_closed(Store::Native);
}

fn a_peer_that_stops_reading_is_closed(store: Store) {
    let n = start(
        &format!("stall-{store:?}"),
        store,
        free_addr(),
        CONNECTIONS_MAX_DEFAULT,
        Some(Duration::from_secs(1)),
    );
    let addrs = n.map.osds[0].reactors.clone();
    carmine_reactor::block_on(async {
        let c = Client::connect(&addrs, ClientConfig::default())
            .await
            .unwrap();
        c.write(1, "big", 0, Bytes::from(vec![1u8; 4 << 20]))
            .await
            .unwrap();
    });
    // 64 reads of 4 MiB in one small burst, and not one reply byte read.
    let mut rude = connect(addrs[0]);
    let mut buf = BytesMut::new();
    for i in 0..64u64 {
        let read = OsdOp::Read {
            off: 0,
            len: 4 << 20,
        };
        encode_request(&mut buf, i + 1, &object_request(&n.map, "big", vec![read]));
    }
    rude.write_all(&buf).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    // Reading now gets what the socket buffers held, then the end: the OSD gave up on it
    // rather than wait (it would otherwise send all 256 MiB).
    rude.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut chunk = vec![0u8; 1 << 20];
    let mut received = 0usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    let ended = loop {
        if Instant::now() > deadline {
            break false;
        }
        match rude.read(&mut chunk) {
            Ok(0) => break true,
            Ok(k) => received += k,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false
            }
            Err(_) => break true,
        }
    };
    assert!(
        ended && received < 64 * (4 << 20),
        "{store:?}: a peer that took no reply for 3 s was kept ({received} bytes received)"
    );
    let took = timed_writes(&n.map, 50);
    assert!(
        took < Duration::from_secs(20),
        "{store:?}: writes took {took:?}"
    );
}

#[test]
fn a_peer_that_stops_reading_replies_is_closed_memory_store() {
    a_peer_that_stops_reading_is_closed(Store::Memory);
}

#[test]
fn a_peer_that_stops_reading_replies_is_closed_native_store() {
    a_peer_that_stops_reading_is_closed(Store::Native);
}

/// Set in the OSD process the many-connections test starts: "ADDR,CONNECTIONS_MAX".
const CHILD_ENV: &str = "CARMINE_HOSTILE_OSD_CHILD";
const MANY: &str = "ten_thousand_connections_leave_the_osd_up_bounded_and_serving";
/// Connections the test opens, if the descriptor limit allows.
const MANY_COUNT: usize = 10_000;
const RSS_BOUND_KIB: u64 = 256 << 10;

/// Raises this process's descriptor limit to its hard limit (inherited by children); returns it.
fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    lim.rlim_max
}

/// A `VmRSS:`-style line of /proc/PID/status, in KiB.
fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The OSD process: serves until its stdin closes.
fn serve_as_child(spec: &str) {
    let (addr, max) = spec.split_once(',').unwrap();
    let n = start(
        "many",
        Store::Native,
        addr.parse().unwrap(),
        max.parse().unwrap(),
        Some(IDLE_TIMEOUT_DEFAULT),
    );
    println!("OSD_READY");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(n);
}

/// Kills the OSD process if the test fails half way.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Round trips of a polite client (ping, 4 KiB write, 4 KiB read back) until `stop`: when
/// each started and how long it took.
fn polite_round_trips(
    map: OsdMap,
    connected: std::sync::mpsc::Sender<()>,
    stop: Arc<AtomicBool>,
) -> Vec<(Instant, Duration)> {
    carmine_reactor::block_on(async move {
        let addr = map.osds[0].reactors[0];
        let c = Client::connect(&[addr], ClientConfig::default())
            .await
            .unwrap();
        connected.send(()).unwrap();
        let mut took = Vec::new();
        for i in 0..1_000_000u64 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let start = Instant::now();
            let data = Bytes::from(vec![(i % 251) as u8; 4096]);
            let (oid, off) = (format!("polite-{}", i % 16), (i / 16 % 64) * 4096);
            let round = async {
                let payload = Bytes::from_static(b"ping");
                c.call(addr, &Request::Ping { payload }).await.unwrap();
                c.write(1, &oid, off, data.clone()).await.unwrap();
                assert_eq!(c.read(1, &oid, off, 4096).await.unwrap(), data);
            };
            carmine_reactor::timeout(Duration::from_secs(10), round)
                .await
                .expect("a polite round trip hung");
            took.push((start, start.elapsed()));
            // Leave the CPU to the flood too: this machine may have two cores.
            carmine_reactor::sleep(Duration::from_millis(5)).await;
        }
        took
    })
}

fn summary(took: &[Duration]) -> String {
    let mut v = took.to_vec();
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    format!(
        "{} round trips, p50 {:?}, p99 {:?}, max {:?}",
        v.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

/// Ten thousand connections to one reactor (as many as the descriptor limit allows) of which
/// the OSD takes `connections_max` and refuses the rest; a third of those it holds answered a
/// ping, a third sent half a frame, a third said nothing. The OSD (its own process, so its
/// memory can be measured) stays up and within bounds, and another client's round trips go
/// on meanwhile.
#[test]
fn ten_thousand_connections_leave_the_osd_up_bounded_and_serving() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return serve_as_child(&spec);
    }
    let hard = raise_fd_limit();
    let count = MANY_COUNT.min(hard.saturating_sub(512) as usize);
    if count < MANY_COUNT {
        println!("descriptor hard limit {hard}: opening {count} connections, not {MANY_COUNT}");
    }
    let max = count * 9 / 10;
    let addr = free_addr();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([MANY, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{addr},{max}"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let pid = child.0.id();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.ends_with("OSD_READY") {
                let _ = ready_tx.send(());
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the OSD process did not start");
    let rss_idle = proc_status_kib(pid, "VmRSS:");
    let map = OsdMap::single_osd(vec![addr], 8);
    // The polite client connects first: at the limit, a new connection is refused.
    let stop = Arc::new(AtomicBool::new(false));
    let (connected_tx, connected_rx) = std::sync::mpsc::channel();
    let polite = {
        let (map, stop) = (map.clone(), stop.clone());
        std::thread::spawn(move || polite_round_trips(map, connected_tx, stop))
    };
    connected_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let flood_start = Instant::now();
    let mut socks = Vec::with_capacity(count);
    let mut connect_errors = 0;
    for _ in 0..count {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(s) => socks.push(s),
            Err(_) => connect_errors += 1,
        }
        assert!(
            flood_start.elapsed() < Duration::from_secs(300),
            "connecting took too long"
        );
    }
    let rss_connected = proc_status_kib(pid, "VmRSS:");
    // Tell the connections the OSD holds from those it refused (closed at once).
    let still_open = |s: &mut TcpStream| {
        s.set_nonblocking(true).unwrap();
        matches!(s.read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let open = socks.iter_mut().map(still_open).filter(|&o| o).count();
        if open < max || Instant::now() > deadline {
            break;
        }
    }
    let mut held: Vec<TcpStream> = socks
        .into_iter()
        .filter_map(|mut s| still_open(&mut s).then_some(s))
        .collect();
    let refused = count - connect_errors - held.len();
    println!(
        "{count} connections: {} held, {refused} refused, {connect_errors} failed to connect \
         (connections_max {max}, one taken by the polite client)",
        held.len()
    );
    assert_eq!(
        held.len() + 1,
        max,
        "the OSD holds connections_max connections"
    );
    // Make the held connections cost what they can.
    for (i, s) in held.iter_mut().enumerate() {
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        match i % 3 {
            0 => assert!(ping(s, i as u64), "held connection {i} was closed"),
            1 => send_half_a_frame(s),
            _ => {}
        }
    }
    let flood_done = Instant::now();
    println!("connecting and pinging took {:?}", flood_done - flood_start);
    // The polite client goes on for a while with everything held.
    std::thread::sleep(Duration::from_secs(3));
    let rss_held = proc_status_kib(pid, "VmRSS:");
    let rss_peak = proc_status_kib(pid, "VmHWM:");
    stop.store(true, Ordering::Relaxed);
    let rounds = polite.join().unwrap();
    let during: Vec<Duration> = rounds
        .iter()
        .filter(|(at, _)| *at >= flood_start && *at < flood_done)
        .map(|r| r.1)
        .collect();
    let after: Vec<Duration> = rounds
        .iter()
        .filter(|(at, _)| *at >= flood_done)
        .map(|r| r.1)
        .collect();
    println!(
        "OSD RSS: {} MiB idle, {} MiB once connected, {} MiB with {} connections held \
         and used, peak {} MiB",
        rss_idle >> 10,
        rss_connected >> 10,
        rss_held >> 10,
        held.len(),
        rss_peak >> 10
    );
    println!("polite client while connecting: {}", summary(&during));
    println!("polite client with all held: {}", summary(&after));
    assert!(
        rss_peak < RSS_BOUND_KIB,
        "the OSD peaked at {rss_peak} KiB with {} connections",
        held.len()
    );
    assert!(after.len() >= 20, "only {} polite round trips", after.len());
    let slowest = rounds.iter().map(|r| r.1).max().unwrap();
    assert!(
        slowest < Duration::from_secs(2),
        "a polite round trip took {slowest:?}"
    );
    // Still up and serving the connections it holds.
    assert!(ping(&mut held[0], 1));
    drop(held);
    drop(child.0.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the OSD process did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "the OSD process failed: {status}");
}
