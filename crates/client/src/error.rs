use carmine_cluster::MapError;
use carmine_proto::{ErrorReply, Response, Status};
use carmine_types::PgId;
use std::net::SocketAddr;
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The connection failed. With `in_doubt`, the request had been handed to it and may or
    /// may not have been applied; without, it was never sent.
    #[error("connection to {addr} lost: {reason}")]
    Disconnected {
        addr: SocketAddr,
        reason: String,
        in_doubt: bool,
    },
    /// The OSD serving the request stayed unreachable for `waited` (`ClientConfig::retry_timeout`);
    /// `last` is the failure of the last attempt.
    #[error("gave up after {waited:?} without a usable connection: {last}")]
    Unavailable {
        waited: Duration,
        last: Box<ClientError>,
    },
    /// The request was sent and the OSD, still up in the map, has answered nothing on its
    /// connection for `waited`: the client closed it. The request may still be applied there
    /// later, so it is not resent: the caller decides.
    #[error("no reply from {addr} for {waited:?} although it is up in the map; the request may still be applied there")]
    TimedOut { addr: SocketAddr, waited: Duration },
    /// The connection handshake failed: a wrong or missing key on either side.
    #[error("authentication with {addr} failed: {detail}")]
    Auth { addr: SocketAddr, detail: String },
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
    #[error("invalid client configuration: {0}")]
    Config(String),
}

impl ClientError {
    /// The server's status code, when the server answered with an error.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientError::Server(r) => Some(r.status),
            _ => None,
        }
    }

    /// True if the request failed because no connection to its OSD could be used: the OSD may
    /// be restarting, so the request can be tried again (see [`ClientError::in_doubt`]).
    pub fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. } | ClientError::Disconnected { .. }
        )
    }

    /// True if the request may have been applied although it failed: it was sent, then the
    /// connection broke before the reply came back.
    pub fn in_doubt(&self) -> bool {
        matches!(
            self,
            ClientError::Disconnected { in_doubt: true, .. } | ClientError::TimedOut { .. }
        )
    }

    pub(crate) fn unexpected(addr: SocketAddr, resp: &Response) -> Self {
        let kind = match resp {
            Response::Pong { .. } => "pong",
            Response::Map { .. } => "map",
            Response::Object { .. } => "object reply",
            Response::Fenced => "fence confirmation",
            Response::Scrubbed(_) => "scrub report",
            Response::MarkedLost { .. } => "count of objects given up",
        };
        ClientError::Unexpected {
            detail: format!("{addr} answered with a {kind}"),
        }
    }
}
