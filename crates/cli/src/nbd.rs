//! `carmine nbd serve`: the NBD gateway in the foreground.

use crate::volume::Target;
use anyhow::{Context, Result};
use carmine_localcluster::connect;
use carmine_nbd::{Export, NbdConfig};
use carmine_volume::Volumes;
use clap::{Args, Subcommand};
use std::net::SocketAddr;
use std::rc::Rc;

#[derive(Subcommand)]
pub enum NbdCommand {
    /// Export volumes over NBD until killed (SIGTERM/SIGINT end it; acknowledged writes are
    /// already stored).
    Serve(ServeArgs),
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Volumes to export, by name (the export name is the volume name). Repeat or comma-separate.
    #[arg(long = "export", required = true, value_delimiter = ',')]
    pub exports: Vec<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: SocketAddr,
    /// Refuse writes, trims and zeroing on every export.
    #[arg(long)]
    pub read_only: bool,
    /// Requests per connection executing at once.
    #[arg(long, default_value_t = 256)]
    pub inflight_max: usize,
    #[command(flatten)]
    pub target: Target,
}

pub fn run(cmd: NbdCommand) -> Result<()> {
    let NbdCommand::Serve(a) = cmd;
    carmine_reactor::block_on(async move {
        let client = connect(&a.target.dir.dir).await?;
        let pool = client.pool_id(&a.target.pool)?;
        let volumes = Volumes::new(client, pool);
        let mut exports = Vec::with_capacity(a.exports.len());
        for name in &a.exports {
            let image = volumes
                .open(name)
                .await
                .with_context(|| format!("opening volume {name:?}"))?;
            exports.push(Export {
                name: name.clone(),
                image,
                read_only: a.read_only,
            });
        }
        let std_listener = std::net::TcpListener::bind(a.listen)
            .with_context(|| format!("listening on {}", a.listen))?;
        std_listener.set_nonblocking(true)?;
        let listener = carmine_reactor::TcpListener::from_std(std_listener)?;
        println!(
            "nbd: serving {} on nbd://{}/ ({})",
            a.exports.join(", "),
            a.listen,
            if a.read_only {
                "read-only"
            } else {
                "read-write"
            }
        );
        carmine_nbd::serve(
            listener,
            Rc::new(exports),
            NbdConfig {
                inflight_max: a.inflight_max,
            },
        )
        .await?;
        Ok(())
    })
}
