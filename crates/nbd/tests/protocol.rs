//! The NBD server against a hand-driven client over a raw socket: handshake edge cases, bad
//! requests, pipelining, and a client that vanishes mid-write.

use carmine_client::{Client, ClientConfig};
use carmine_cluster::OsdMap;
use carmine_nbd::{Export, NbdConfig, NbdStats};
use carmine_osd::{Osd, OsdConfig};
use carmine_volume::Volumes;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const SIZE: u64 = 8 << 20;

/// An OSD and an NBD server (on their own threads) exporting one 8 MiB volume named "vol".
fn start() -> (Osd, SocketAddr) {
    let (osd, addr, _) = start_with(NbdConfig::default());
    (osd, addr)
}

fn start_with(cfg: NbdConfig) -> (Osd, SocketAddr, Arc<NbdStats>) {
    let stats = cfg.stats.clone();
    let osd_addr = carmine_testkit::free_addr();
    let map = OsdMap::single_osd(vec![osd_addr], 8);
    let osd = Osd::start(OsdConfig::in_memory(0, map, 64 << 20)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        carmine_reactor::block_on(async move {
            let client = Client::connect(&[osd_addr], ClientConfig::default())
                .await
                .unwrap();
            let volumes = Volumes::new(client, 1);
            volumes.create("vol", SIZE, Some(1 << 20)).await.unwrap();
            let image = volumes.open("vol").await.unwrap();
            let exports = Rc::new(vec![Export {
                name: "vol".into(),
                image,
                read_only: false,
            }]);
            let l = carmine_reactor::TcpListener::from_std(listener).unwrap();
            let _ = carmine_nbd::serve(l, exports, cfg, carmine_nbd::Spread::local()).await;
        })
    });
    (osd, addr, stats)
}

/// Waits until `cond` holds, failing the test after 10 s.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    for _ in 0..200 {
        if let Ok(s) = TcpStream::connect(addr) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            return s;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("nbd server did not start");
}

fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// Greeting + client flags; returns the stream ready for options.
fn hello(addr: SocketAddr) -> TcpStream {
    let mut s = connect(addr);
    let greeting = read_n(&mut s, 18);
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    s.write_all(&3u32.to_be_bytes()).unwrap(); // FIXED_NEWSTYLE | NO_ZEROES
    s
}

fn send_option(s: &mut TcpStream, option: u32, data: &[u8]) {
    let mut b = Vec::new();
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
}

/// Reads one option reply: (reply type, data).
fn option_reply(s: &mut TcpStream) -> (u32, Vec<u8>) {
    let h = read_n(s, 20);
    assert_eq!(u64::from_be_bytes(h[..8].try_into().unwrap()), REPLY_MAGIC);
    let len = u32_at(&h, 16) as usize;
    (u32_at(&h, 12), read_n(s, len))
}

fn go(s: &mut TcpStream, name: &str) -> u32 {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    send_option(s, 7, &d);
    loop {
        let (kind, _) = option_reply(s);
        if kind != 3 {
            return kind; // ACK (1) or an error
        }
    }
}

fn request(s: &mut TcpStream, cmd: u16, cookie: u64, offset: u64, len: u32, data: &[u8]) {
    let mut b = Vec::with_capacity(28 + data.len());
    b.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&cmd.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
}

/// (error, cookie) of one simple reply, then `data_len` bytes of data if it succeeded.
fn reply(s: &mut TcpStream, data_len: usize) -> (u32, u64, Vec<u8>) {
    let h = read_n(s, 16);
    assert_eq!(u32_at(&h, 0), 0x6744_6698);
    let (err, cookie) = (
        u32_at(&h, 4),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
    );
    let data = if err == 0 {
        read_n(s, data_len)
    } else {
        vec![]
    };
    (err, cookie, data)
}

fn closed(s: &mut TcpStream) -> bool {
    matches!(s.read(&mut [0u8; 1]), Ok(0) | Err(_))
}

#[test]
fn unknown_options_are_refused_and_negotiation_continues() {
    let (osd, addr) = start();
    let mut s = hello(addr);
    send_option(&mut s, 5, &[]); // STARTTLS: not offered
    assert_eq!(option_reply(&mut s).0, (1 << 31) | 1);
    send_option(&mut s, 3, b"junk"); // LIST with data is invalid
    assert_eq!(option_reply(&mut s).0, (1 << 31) | 3);
    assert_eq!(go(&mut s, "nope"), (1 << 31) | 6);
    assert_eq!(go(&mut s, "vol"), 1);
    request(&mut s, 0, 1, 0, 4096, &[]);
    assert_eq!(reply(&mut s, 4096), (0, 1, vec![0u8; 4096]));
    drop(s);
    osd.shutdown().unwrap();
}

#[test]
fn a_client_without_fixed_newstyle_is_disconnected() {
    let (osd, addr) = start();
    let mut s = connect(addr);
    read_n(&mut s, 18);
    s.write_all(&0u32.to_be_bytes()).unwrap();
    assert!(closed(&mut s));
    osd.shutdown().unwrap();
}

#[test]
fn out_of_range_requests_get_einval_and_the_connection_lives_on() {
    let (osd, addr) = start();
    let mut s = hello(addr);
    assert_eq!(go(&mut s, "vol"), 1);
    request(&mut s, 1, 7, SIZE - 100, 4096, &[1u8; 4096]);
    assert_eq!(reply(&mut s, 0).0, 22);
    request(&mut s, 0, 8, SIZE, 1, &[]);
    assert_eq!(reply(&mut s, 0).0, 22);
    request(&mut s, 4, 9, u64::MAX - 10, 4096, &[]);
    assert_eq!(reply(&mut s, 0).0, 22);
    request(&mut s, 0, 10, SIZE - 4096, 4096, &[]);
    assert_eq!(reply(&mut s, 4096).0, 0);
    osd.shutdown().unwrap();
}

#[test]
fn pipelined_requests_all_complete_with_their_own_data() {
    let (osd, addr) = start();
    let mut s = hello(addr);
    assert_eq!(go(&mut s, "vol"), 1);
    for i in 0..64u64 {
        request(&mut s, 1, i, i * 65536 + 512, 4096, &[i as u8; 4096]);
    }
    let mut done: Vec<u64> = (0..64)
        .map(|_| reply(&mut s, 0))
        .map(|(e, c, _)| {
            assert_eq!(e, 0);
            c
        })
        .collect();
    done.sort();
    assert_eq!(done, (0..64).collect::<Vec<_>>());
    for i in 0..64u64 {
        request(&mut s, 0, 1000 + i, i * 65536 + 512, 4096, &[]);
    }
    for _ in 0..64 {
        let (e, c, data) = reply(&mut s, 4096);
        assert_eq!(e, 0);
        assert_eq!(
            data,
            vec![(c - 1000) as u8; 4096],
            "read {c} returned another request's data"
        );
    }
    request(&mut s, 2, 0, 0, 0, &[]); // DISC
    assert!(closed(&mut s));
    osd.shutdown().unwrap();
}

#[test]
fn a_write_cut_off_mid_payload_is_never_applied() {
    let (osd, addr, stats) = start_with(NbdConfig::default());
    let mut s = hello(addr);
    assert_eq!(go(&mut s, "vol"), 1);
    // Header promises 64 KiB; only 1000 bytes arrive before the client vanishes.
    let mut b = Vec::new();
    b.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    b.extend_from_slice(&[0, 0, 0, 1]);
    b.extend_from_slice(&5u64.to_be_bytes());
    b.extend_from_slice(&0u64.to_be_bytes());
    b.extend_from_slice(&65536u32.to_be_bytes());
    b.extend_from_slice(&[0xee; 1000]);
    s.write_all(&b).unwrap();
    drop(s);
    // The server is done with that connection (it saw the cut), however long that takes.
    wait_for("the cut-off connection to close", || {
        stats.connections_closed.load(Ordering::Relaxed) >= 1
    });
    let mut s = hello(addr);
    assert_eq!(go(&mut s, "vol"), 1);
    request(&mut s, 0, 1, 0, 65536, &[]);
    assert_eq!(
        reply(&mut s, 65536),
        (0, 1, vec![0u8; 65536]),
        "a partial write was applied"
    );
    osd.shutdown().unwrap();
}

#[test]
fn bad_request_magic_and_oversized_writes_end_only_that_connection() {
    let (osd, addr) = start();
    let mut s = hello(addr);
    assert_eq!(go(&mut s, "vol"), 1);
    s.write_all(&[0u8; 28]).unwrap();
    assert!(closed(&mut s));
    let mut s = hello(addr);
    assert_eq!(go(&mut s, "vol"), 1);
    request(&mut s, 1, 1, 0, u32::MAX, &[]);
    assert!(closed(&mut s));
    let mut s = hello(addr);
    assert_eq!(go(&mut s, "vol"), 1);
    request(&mut s, 0, 2, 0, 512, &[]);
    assert_eq!(reply(&mut s, 512).0, 0);
    osd.shutdown().unwrap();
}

#[test]
fn with_structured_replies_reads_come_back_as_data_and_error_chunks() {
    let (osd, addr) = start();
    let mut s = hello(addr);
    send_option(&mut s, 8, &[]);
    assert_eq!(option_reply(&mut s).0, 1);
    assert_eq!(go(&mut s, "vol"), 1);
    request(&mut s, 1, 1, 8192, 4, b"wxyz");
    assert_eq!(
        reply(&mut s, 0),
        (0, 1, vec![]),
        "writes keep simple replies"
    );
    request(&mut s, 0, 2, 8190, 8, &[]);
    let h = read_n(&mut s, 20);
    assert_eq!(u32_at(&h, 0), 0x668e_33ef);
    assert_eq!(&h[4..8], &[0, 1, 0, 1], "flags DONE, type OFFSET_DATA");
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), 2);
    assert_eq!(u32_at(&h, 16), 16);
    let body = read_n(&mut s, 16);
    assert_eq!(u64::from_be_bytes(body[..8].try_into().unwrap()), 8190);
    assert_eq!(&body[8..], &[0, 0, b'w', b'x', b'y', b'z', 0, 0]);
    request(&mut s, 0, 3, SIZE, 8, &[]);
    let h = read_n(&mut s, 20);
    assert_eq!(&h[4..8], &[0, 1, 0x80, 1], "flags DONE, type ERROR");
    assert_eq!(u32_at(&h, 16), 6);
    let body = read_n(&mut s, 6);
    assert_eq!(u32_at(&body, 0), 22);
    osd.shutdown().unwrap();
}

/// Sends `n` READ requests of `len` bytes at offset 0 (cookies from 1), without reading.
fn send_reads(s: &mut TcpStream, n: u64, len: u32) {
    let mut b = Vec::new();
    for cookie in 1..=n {
        b.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        b.extend_from_slice(&[0, 0, 0, 0]);
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&0u64.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
    }
    s.write_all(&b).unwrap();
}

#[test]
fn a_client_that_never_reads_replies_holds_a_bounded_amount_and_others_go_on() {
    let cfg = NbdConfig {
        connection_bytes_max: 4 << 20,
        ..NbdConfig::default()
    };
    let (osd, addr, stats) = start_with(cfg);
    let mut greedy = hello(addr);
    assert_eq!(go(&mut greedy, "vol"), 1);
    // 2000 reads of 1 MiB (2 GiB of replies) in 56 KB of requests, never read.
    send_reads(&mut greedy, 2000, 1 << 20);
    // Another client is served meanwhile, and its replies are right.
    let mut other = hello(addr);
    assert_eq!(go(&mut other, "vol"), 1);
    for cookie in 0..20 {
        request(&mut other, 0, cookie, 0, 4096, &[]);
        assert_eq!(reply(&mut other, 4096).0, 0);
    }
    // Once the greedy client reads, it gets every reply, in full: back-pressure delayed
    // them, it lost nothing. The gateway never held more than the budget meanwhile: its
    // replies come out only as fast as they are read.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..2000 {
        let (e, cookie, data) = reply(&mut greedy, 1 << 20);
        assert_eq!((e, data.len()), (0, 1 << 20));
        seen.insert(cookie);
    }
    assert_eq!(seen.len(), 2000);
    let held = stats.held_bytes_max.load(Ordering::Relaxed);
    assert!(
        held <= (4 << 20) + (1 << 20) + 64,
        "a connection held {held} bytes with a 4 MiB budget"
    );
    osd.shutdown().unwrap();
}

#[test]
fn connections_beyond_the_limit_are_refused_and_the_rest_are_served() {
    let cfg = NbdConfig {
        connections_max: 4,
        ..NbdConfig::default()
    };
    let (osd, addr, stats) = start_with(cfg);
    let mut open: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = hello(addr);
            assert_eq!(go(&mut s, "vol"), 1);
            s
        })
        .collect();
    let mut extra = connect(addr);
    assert!(closed(&mut extra), "a fifth connection was served");
    assert_eq!(stats.connections_refused.load(Ordering::Relaxed), 1);
    request(&mut open[0], 0, 7, 0, 4096, &[]);
    assert_eq!(reply(&mut open[0], 4096).0, 0);
    drop(open.pop());
    wait_for("the dropped connection to close", || {
        stats.connections_closed.load(Ordering::Relaxed) >= 1
    });
    let mut again = hello(addr);
    assert_eq!(go(&mut again, "vol"), 1);
    osd.shutdown().unwrap();
}

#[test]
fn a_client_that_never_finishes_the_handshake_is_dropped() {
    let cfg = NbdConfig {
        handshake_timeout: Duration::from_millis(200),
        ..NbdConfig::default()
    };
    let (osd, addr, _stats) = start_with(cfg);
    let mut s = connect(addr);
    // Read the greeting, then say nothing.
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    assert!(closed(&mut s), "a silent client kept its connection");
    osd.shutdown().unwrap();
}

/// Whether the server closes `s` within `wait` (end of stream or a reset, not a timeout).
fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let closed = match s.read(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => panic!("unexpected bytes from the server"),
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    closed
}

#[test]
fn a_client_stalled_mid_request_or_not_reading_is_dropped_but_an_idle_one_is_kept() {
    let cfg = NbdConfig {
        handshake_timeout: Duration::from_millis(500),
        ..NbdConfig::default()
    };
    let (osd, addr, _stats) = start_with(cfg);
    // Half a request header, then nothing.
    let mut half = hello(addr);
    assert_eq!(go(&mut half, "vol"), 1);
    half.write_all(&0x2560_9513u32.to_be_bytes()).unwrap();
    // A write header and half its payload, then nothing.
    let mut partial = hello(addr);
    assert_eq!(go(&mut partial, "vol"), 1);
    request(&mut partial, 1, 1, 0, 8192, &[7u8; 4096]);
    // 512 MiB of reads whose replies it never takes.
    let mut deaf = hello(addr);
    assert_eq!(go(&mut deaf, "vol"), 1);
    send_reads(&mut deaf, 512, 1 << 20);
    // Silent between requests: legitimate (the kernel keeps such connections for hours).
    let mut idle = hello(addr);
    assert_eq!(go(&mut idle, "vol"), 1);
    assert!(closed_within(&mut half, Duration::from_secs(5)));
    assert!(closed_within(&mut partial, Duration::from_secs(5)));
    // Well past the stall timeout, the deaf client gets what the socket buffers held, then
    // the end.
    std::thread::sleep(Duration::from_secs(2));
    deaf.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut received = 0usize;
    let mut chunk = vec![0u8; 1 << 20];
    let mut ended = false;
    for _ in 0..10_000 {
        match deaf.read(&mut chunk) {
            Ok(0) => ended = true,
            Ok(n) => received += n,
            Err(e) => {
                ended = !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
                break;
            }
        }
        if ended {
            break;
        }
    }
    assert!(
        ended && received < 512 << 20,
        "a client that took no reply was kept ({received} bytes received)"
    );
    assert!(!closed_within(&mut idle, Duration::from_millis(100)));
    request(&mut idle, 0, 9, 0, 4096, &[]);
    assert_eq!(reply(&mut idle, 4096).0, 0);
    osd.shutdown().unwrap();
}

#[test]
fn with_an_idle_timeout_idle_clients_are_dropped_and_busy_ones_kept() {
    let cfg = NbdConfig {
        idle_timeout: Some(Duration::from_millis(500)),
        ..NbdConfig::default()
    };
    let (osd, addr, _stats) = start_with(cfg);
    let mut idle = hello(addr);
    assert_eq!(go(&mut idle, "vol"), 1);
    let mut busy = hello(addr);
    assert_eq!(go(&mut busy, "vol"), 1);
    for cookie in 0..20 {
        request(&mut busy, 0, cookie, 0, 4096, &[]);
        assert_eq!(reply(&mut busy, 4096).0, 0, "a busy client was dropped");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(closed_within(&mut idle, Duration::from_secs(2)));
    osd.shutdown().unwrap();
}
