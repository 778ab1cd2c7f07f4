use carmine_cluster::MapError;
use carmine_proto::{ErrorReply, Response, Status};
use carmine_types::PgId;
use std::net::SocketAddr;
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("connection to {addr} lost: {reason}")]
    Disconnected { addr: SocketAddr, reason: String },
    #[error("protocol error from {addr}: {detail}")]
    Protocol { addr: SocketAddr, detail: String },
    #[error("server error: {0}")]
    Server(ErrorReply),
    #[error(transparent)]
    Map(MapError),
    #[error("no up OSD serves pg {pg}")]
    NoOsd { pg: PgId },
    #[error("no address to fetch the cluster map from")]
    NoAddress,
    #[error("unexpected reply: {detail}")]
    Unexpected { detail: String },
}

impl ClientError {
    /// The server's status code, when the server answered with an error.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientError::Server(r) => Some(r.status),
            _ => None,
        }
    }

    pub(crate) fn unexpected(addr: SocketAddr, resp: &Response) -> Self {
        let kind = match resp {
            Response::Pong { .. } => "pong",
            Response::Map { .. } => "map",
            Response::Object { .. } => "object reply",
        };
        ClientError::Unexpected {
            detail: format!("{addr} answered with a {kind}"),
        }
    }
}
