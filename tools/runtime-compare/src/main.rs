//! Runs the OSD's request path (frame decode → memory store → reply encode, replies batched per
//! read) on two thread-per-core io_uring runtimes, one server thread each pinned to cpu 1, and
//! drives both with the same pipelined client pinned to cpu 0. Both servers read into a fixed
//! buffer and append to the frame buffer, so the only difference is the runtime.

use bytes::{Bytes, BytesMut};
use carmine_bench::workload::{closed_loop, StepStats};
use carmine_client::Connection;
use carmine_proto::{
    encode_error, encode_response, try_decode_frame, ErrorReply, Frame, ObjectRequest, OpOutput, OsdOp, Request,
    Response, Status,
};
use carmine_store::{MemStore, MemStoreConfig, ObjectStore, Transaction};
use carmine_types::PgId;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PG: PgId = PgId { pool: 1, seed: 0 };
const READ_CHUNK: usize = 256 * 1024;
const OBJECTS: usize = 64;
const OBJECT_SIZE: u64 = 4 << 20;
const BS: u64 = 4096;

async fn handle(store: &MemStore, frame: Frame, out: &mut BytesMut) {
    let id = frame.header.request_id;
    let reply = match Request::decode(&frame) {
        Ok(Request::Ping { payload }) => Ok(Response::Pong { payload }),
        Ok(Request::Object(ObjectRequest { oid, ops, .. })) => match ops.into_iter().next() {
            Some(OsdOp::Read { off, len }) => store
                .read(PG, &oid, off, len as u64)
                .await
                .map(|d| Response::Object { outputs: vec![OpOutput::Data(d)] }),
            Some(OsdOp::Write { off, data }) => {
                let mut t = Transaction::new();
                t.write(PG, &oid, off, data);
                store.submit(t).await.map(|_| Response::Object { outputs: vec![OpOutput::None] })
            }
            _ => Ok(Response::Object { outputs: vec![] }),
        }
        .map_err(|e| ErrorReply { status: Status::Io, op_index: None, message: e.to_string() }),
        _ => Err(ErrorReply { status: Status::Unsupported, op_index: None, message: String::new() }),
    };
    match reply {
        Ok(r) => encode_response(out, id, &r),
        Err(e) => encode_error(out, id, frame.header.opcode, &e),
    }
}

fn new_store() -> MemStore {
    let store = MemStore::new(MemStoreConfig { memory_limit_bytes: 1 << 30 });
    let mut t = Transaction::new();
    t.create_collection(PG);
    futures_lite_block_on(store.submit(t)).expect("create collection");
    store
}

/// The store never suspends, so polling once completes it.
fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = std::task::Waker::noop();
    match f.as_mut().poll(&mut std::task::Context::from_waker(waker)) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => unreachable!("memory store suspended"),
    }
}

fn pin(cpu: u32) {
    carmine_reactor::cpu::pin_current_thread(cpu).expect("pin");
}

fn thread_cpu_secs(tid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0) + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn start_compio(listener: std::net::TcpListener, tid: Arc<AtomicI32>) {
    start_compio_with(listener, tid, false)
}

/// compio with the io_uring setup flags a single-threaded reactor allows: SINGLE_ISSUER,
/// DEFER_TASKRUN (completions run only when the reactor asks) and COOP_TASKRUN.
fn start_compio_tuned(listener: std::net::TcpListener, tid: Arc<AtomicI32>) {
    start_compio_with(listener, tid, true)
}

fn start_compio_with(listener: std::net::TcpListener, tid: Arc<AtomicI32>, tuned: bool) {
    std::thread::spawn(move || {
        pin(1);
        // SAFETY: gettid has no preconditions.
        tid.store(unsafe { libc::gettid() }, Ordering::SeqCst);
        let mut proactor = compio::driver::ProactorBuilder::new();
        if tuned {
            proactor.single_issuer(true).defer_taskrun(true).coop_taskrun(true);
        }
        let rt = compio::runtime::RuntimeBuilder::new().with_proactor(proactor).build().unwrap();
        rt.block_on(async move {
            let store = std::rc::Rc::new(new_store());
            let listener = compio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((mut s, _)) = listener.accept().await {
                let _ = s.set_nodelay(true);
                let store = store.clone();
                compio::runtime::spawn(async move {
                    use compio::io::{AsyncRead, AsyncWriteExt};
                    let mut chunk = Vec::with_capacity(READ_CHUNK);
                    let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
                    let mut wbuf = Vec::with_capacity(READ_CHUNK);
                    loop {
                        let mut out = BytesMut::new();
                        while let Ok(Some(f)) = try_decode_frame(&mut rbuf) {
                            handle(&store, f, &mut out).await;
                        }
                        if !out.is_empty() {
                            wbuf.clear();
                            wbuf.extend_from_slice(&out);
                            let compio::buf::BufResult(r, b) = s.write_all(wbuf).await;
                            wbuf = b;
                            if r.is_err() {
                                return;
                            }
                        }
                        chunk.clear();
                        let compio::buf::BufResult(r, c) = s.read(chunk).await;
                        chunk = c;
                        match r {
                            Ok(n) if n > 0 => rbuf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    }
                })
                .detach();
            }
        });
    });
}

fn start_monoio(listener: std::net::TcpListener, tid: Arc<AtomicI32>) {
    std::thread::spawn(move || {
        pin(1);
        // SAFETY: gettid has no preconditions.
        tid.store(unsafe { libc::gettid() }, Ordering::SeqCst);
        let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().build().unwrap();
        rt.block_on(async move {
            let store = std::rc::Rc::new(new_store());
            let listener = monoio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((mut s, _)) = listener.accept().await {
                let _ = s.set_nodelay(true);
                let store = store.clone();
                monoio::spawn(async move {
                    use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
                    let mut chunk = Vec::with_capacity(READ_CHUNK);
                    let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
                    let mut wbuf = Vec::with_capacity(READ_CHUNK);
                    loop {
                        let mut out = BytesMut::new();
                        while let Ok(Some(f)) = try_decode_frame(&mut rbuf) {
                            handle(&store, f, &mut out).await;
                        }
                        if !out.is_empty() {
                            wbuf.clear();
                            wbuf.extend_from_slice(&out);
                            let (r, b) = s.write_all(wbuf).await;
                            wbuf = b;
                            if r.is_err() {
                                return;
                            }
                        }
                        chunk.clear();
                        let (r, c) = s.read(chunk).await;
                        chunk = c;
                        match r {
                            Ok(n) if n > 0 => rbuf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    }
                });
            }
        });
    });
}

fn object_request(oid: String, op: OsdOp) -> Request {
    Request::Object(ObjectRequest { pool: 1, pg_seed: 0, epoch: 1, client: 0, oid, ops: vec![op] })
}

async fn step(addr: SocketAddr, write: bool, depth: usize, ramp: Duration, run: Duration) -> StepStats {
    let conn = Connection::open(addr, depth).await.unwrap();
    let data = Bytes::from(vec![0x5a; BS as usize]);
    let names: Vec<String> = (0..OBJECTS).map(|i| format!("obj{i}")).collect();
    let stats = closed_loop(depth, ramp, run, BS, |w, i| {
        let off = (i.wrapping_mul(2_654_435_761).wrapping_add(w as u64 * 977) % (OBJECT_SIZE / BS)) * BS;
        let oid = names[(w + i as usize) % OBJECTS].clone();
        let req = if write {
            object_request(oid, OsdOp::Write { off, data: data.clone() })
        } else {
            object_request(oid, OsdOp::Read { off, len: BS as u32 })
        };
        let conn = &conn;
        async move { conn.call(&req).await.is_ok() }
    })
    .await;
    conn.close();
    stats
}

async fn prefill(addr: SocketAddr) {
    let conn = Connection::open(addr, 16).await.unwrap();
    let chunk = Bytes::from(vec![0xa5u8; 1 << 20]);
    for i in 0..OBJECTS {
        for off in (0..OBJECT_SIZE).step_by(1 << 20) {
            conn.call(&object_request(format!("obj{i}"), OsdOp::Write { off, data: chunk.clone() })).await.unwrap();
        }
    }
    conn.close();
}

fn main() {
    let secs: f64 = std::env::var("STEP_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(3.0);
    let reps: usize = std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let mut servers = Vec::new();
    for (name, start) in [
        ("compio", start_compio as fn(_, _)),
        ("compio-tuned", start_compio_tuned as fn(_, _)),
        ("monoio", start_monoio as fn(_, _)),
    ] {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let tid = Arc::new(AtomicI32::new(0));
        start(l, tid.clone());
        servers.push((name, addr, tid));
    }
    pin(0);
    let rt = compio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for (_, addr, _) in &servers {
            prefill(*addr).await;
        }
        println!("runtime,workload,depth,rep,iops,mean_us,p99_us,server_cpu_us_per_io");
        for write in [false, true] {
            for depth in [1usize, 16, 64] {
                for rep in 0..reps {
                    for (name, addr, tid) in &servers {
                        let cpu0 = thread_cpu_secs(tid.load(Ordering::SeqCst));
                        let t0 = std::time::Instant::now();
                        let s = step(*addr, write, depth, Duration::from_millis(500), Duration::from_secs_f64(secs)).await;
                        let cores = (thread_cpu_secs(tid.load(Ordering::SeqCst)) - cpu0) / t0.elapsed().as_secs_f64();
                        println!(
                            "{name},{},{depth},{rep},{:.0},{:.1},{:.1},{:.2}",
                            if write { "randwrite4k" } else { "randread4k" },
                            s.iops,
                            s.lat_mean_us,
                            s.lat_p99_us,
                            cores * 1e6 / s.iops.max(1.0)
                        );
                    }
                }
            }
        }
    });
}
