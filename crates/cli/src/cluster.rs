//! `carmine cluster up|down|status`.

use anyhow::Result;
use carmine_localcluster::{down, status, up, DirArg, UpArgs};
use clap::Subcommand;

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Start OSD processes and write the cluster map, pids and logs under --dir.
    Up(UpArgs),
    /// Stop exactly the OSD processes started by `up` in --dir.
    Down(DirArg),
    /// Show the map and whether each OSD process and reactor answers.
    Status(DirArg),
}

pub fn run(cmd: ClusterCommand) -> Result<()> {
    match cmd {
        ClusterCommand::Up(a) => up(&a).map(drop),
        ClusterCommand::Down(d) => down(&d.dir),
        ClusterCommand::Status(d) => status(&d.dir),
    }
}
