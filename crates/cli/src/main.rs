//! `carmine`: the one binary. Each subcommand is a thin layer over a library crate; errors are
//! `anyhow` here and typed everywhere below.

mod cluster;
mod demo;
mod mgr;
mod nbd;
mod osd;
mod osd_admin;
mod osd_control;
mod pattern;
mod pg;
mod pool;
mod size;
mod store;
mod volume;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// glibc's malloc hands freed memory back to the kernel and faults it in again under a
/// steady churn of request and page buffers; mimalloc keeps it (decision 0010).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "carmine",
    version,
    about = "Carmine: shard-per-core distributed block storage"
)]
#[command(long_about = "Carmine: shard-per-core distributed block storage.\n\n\
Start a local cluster with `carmine cluster up`, create a volume with `carmine volume create`,\n\
and move data with `carmine volume write|read`. `carmine demo` does all of it in one go.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one OSD daemon in the foreground (normally started by `cluster up`), or change and
    /// show membership: `osd out|in|tree`.
    Osd(Box<osd::OsdCommand>),
    /// Run a manager in the foreground (normally started by `cluster up --with-etcd`): it
    /// marks OSDs up, down and out in new map epochs; one of several leads.
    Mgr(mgr::MgrArgs),
    /// Add and list pools: each has its own copies, min_size and PG count.
    #[command(subcommand)]
    Pool(pool::PoolCommand),
    /// Scrub a PG's copies against each other, and repair the bad ones.
    #[command(subcommand)]
    Pg(pg::PgCommand),
    /// Format, check and inspect native-store devices offline.
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// Start, stop and inspect a local cluster of OSD processes.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Create, list, inspect, resize, remove, write and read block volumes.
    #[command(subcommand)]
    Volume(volume::VolumeCommand),
    /// Export volumes to NBD clients (qemu, nbdinfo, nbdcopy, fio, nbdfuse).
    #[command(subcommand)]
    Nbd(nbd::NbdCommand),
    /// Start a throw-away cluster, write and verify a volume, report throughput and latency.
    Demo(demo::DemoArgs),
    /// Measure I/O through the client against a local cluster, next to the loopback RPC ceiling.
    Bench(Box<carmine_bench::BenchArgs>),
}

/// Output to a closed pipe (`carmine cluster status | head`) ends the process quietly, as in
/// every Unix tool, instead of a panic in `println!`. Rust ignores SIGPIPE by default; the
/// default action is restored only for commands that just print and exit. Daemons and
/// commands that own a cluster (osd, nbd, demo, bench) keep ignoring it, so a vanished
/// terminal never takes them down before they clean up. Sockets are unaffected either way:
/// they are written with MSG_NOSIGNAL.
fn quiet_on_closed_stdout() {
    // SAFETY: sets a signal disposition to its default; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CARMINE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Daemons log to files (osd.N.log): colour codes only on a terminal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Osd(_) | Command::Mgr(_) | Command::Nbd(_) | Command::Demo(_) | Command::Bench(_)
    ) {
        quiet_on_closed_stdout();
    }
    let result = match cli.command {
        Command::Osd(c) => match (c.admin, c.daemon, c.etcd_access) {
            (Some(admin), _, _) => osd_admin::run(admin),
            (None, Some(daemon), access) => osd::run(daemon, &access),
            (None, None, _) => Err(anyhow::anyhow!(
                "give --id … to run an OSD, or out|in|add|rm|reweight|balance|tree"
            )),
        },
        Command::Mgr(a) => mgr::run(a),
        Command::Pool(c) => pool::run(c),
        Command::Pg(c) => pg::run(c),
        Command::Store(c) => store::run(c),
        Command::Cluster(c) => cluster::run(c),
        Command::Volume(c) => volume::run(c),
        Command::Nbd(c) => nbd::run(c),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => carmine_bench::run(*a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
