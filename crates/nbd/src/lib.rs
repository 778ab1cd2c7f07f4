//! NBD gateway: exports Carmine volumes over the Network Block Device protocol (fixed newstyle
//! handshake), so qemu, libnbd tools, fio's nbd engine and — through nbdfuse and a loop device —
//! a real filesystem can use them.
//!
//! Key decisions: one server task per connection reads requests and starts each one as its own
//! task (bounded by `inflight_max`, so a client cannot queue unbounded work), which passes the
//! client's queue depth straight through to the volume layer's pipelining; replies are appended
//! to one send buffer and flushed by a writer task, in completion order (NBD matches replies by
//! cookie). Writes are acknowledged only once the store acknowledged them, so FLUSH and FUA have
//! nothing left to wait for, and any write completed on one connection is visible on all:
//! `CAN_MULTI_CONN` is true.

#[doc(hidden)]
pub mod fuzzing {
    //! Entry points for the fuzz targets in `fuzz/`; not a supported API. The handshake and
    //! request loops read from a socket, so only the pure parsers they call are exposed.
    pub use crate::protocol::{
        parse_info_request, parse_option_header, parse_request, OptionHeader, Request, CMD_DISC,
        CMD_READ, CMD_WRITE, FLAG_C_FIXED_NEWSTYLE, IHAVEOPT, OPTION_HEADER_LEN, OPTION_LEN_MAX,
        OPT_ABORT, OPT_EXPORT_NAME, OPT_GO, OPT_INFO, PAYLOAD_LEN_MAX, REQUEST_HEADER_LEN,
        REQUEST_MAGIC,
    };
}
mod protocol;
mod server;

pub use protocol::ProtocolError;
pub use server::{
    serve, serve_connection, serve_handed, serve_unix, Accepted, Export, NbdConfig, NbdStats,
    Spread,
};
