//! `carmine mgr`: one manager in the foreground until SIGTERM or SIGINT (then it resigns, so
//! another takes over at once).

use anyhow::Result;
use carmine_manager::policy::Policy;
use carmine_manager::{Backend, ManagerConfig};
use clap::Args;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct MgrArgs {
    /// The etcd holding the cluster (http://host:port, comma-separated members).
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "map",
        conflicts_with = "map",
        requires = "cluster_name"
    )]
    pub etcd: Option<Vec<String>>,
    /// The cluster's name in etcd.
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// The cluster's map file (one host): OSDs register beside it, in `alive/`.
    #[arg(long)]
    pub map: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub etcd_access: carmine_localcluster::EtcdAccessArgs,
    /// This manager's name (made unique per process with its pid and a random tag).
    #[arg(long, default_value = "mgr")]
    pub name: String,
    /// TTL of the leader's lease: how long a dead leader holds up its successor.
    #[arg(long, default_value = "5", value_parser = crate::nbd::parse_duration)]
    pub lease_ttl: Duration,
    /// How long an OSD stays down before it is marked out and its PGs move ("10m", "90").
    #[arg(long, default_value = "600", value_parser = crate::nbd::parse_duration)]
    pub down_out_grace: Duration,
    /// How long an OSD that its peers report they cannot hear from stays down (registered or
    /// not); each further time in a row holds it twice as long ("20s", "1m").
    #[arg(long, default_value = "20s", value_parser = crate::nbd::parse_duration)]
    pub report_hold: Duration,
    /// How often the leader compares registrations with the map.
    #[arg(long, default_value = "250ms", value_parser = crate::nbd::parse_duration)]
    pub tick: Duration,
}

pub fn run(a: MgrArgs) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let tag: u32 = rand_tag();
    let backend = match (a.etcd, a.map) {
        (Some(endpoints), _) => Backend::Etcd {
            endpoints,
            access: a.etcd_access.access()?,
            cluster: a.cluster_name.unwrap_or_default(),
        },
        (None, Some(map)) => Backend::Local {
            map: std::path::absolute(map)?,
        },
        (None, None) => anyhow::bail!("give --etcd or --map"),
    };
    let cfg = ManagerConfig {
        backend,
        name: format!("{}#{}-{tag:08x}", a.name, std::process::id()),
        lease_ttl: a.lease_ttl,
        tick: a.tick,
        policy: Policy {
            down_out_grace: a.down_out_grace,
            report_hold: a.report_hold,
        },
    };
    println!(
        "{} started for {}, lease TTL {:?}, down→out grace {:?}",
        cfg.name,
        cfg.backend.describe(),
        cfg.lease_ttl,
        cfg.policy.down_out_grace
    );
    carmine_manager::run(&cfg, &stop)?;
    println!("{} stopped", cfg.name);
    Ok(())
}

fn rand_tag() -> u32 {
    let mut b = [0u8; 4];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    u32::from_le_bytes(b)
}
