//! Carmine's wire protocol: framing and messages, with no I/O.
//!
//! Every frame is a fixed 32-byte header followed by a payload. The header carries a magic, a
//! version, the request id used to match pipelined responses, the payload length and two
//! CRC-32C values (payload, then header including the payload CRC). The decoder validates the
//! header before trusting the length, bounds the length before buffering, and verifies both
//! checksums before a message is decoded, so a corrupt or hostile stream costs one connection,
//! never a panic or an unbounded allocation. The byte layout is in `docs/format/wire.md`.

pub mod auth;
mod frame;
mod message;
pub mod peer_parts;
mod scrub;

pub use frame::{begin_frame, peek_frame_header, try_decode_frame, Frame, OpenFrame};
pub use frame::{
    encode_frame, FrameError, FrameHeader, FrameKind, Opcode, FRAME_HEADER_LEN, FRAME_MAGIC,
    FRAME_PAYLOAD_MAX, PROTOCOL_VERSION,
};
pub use message::{
    begin_data_reply, encode_error, encode_request, encode_response, DataReply, ErrorReply,
    ObjectRequest, OpOutput, OsdOp, ProtoError, Request, Response, Status,
};
pub use scrub::{ScrubFinding, ScrubMode, ScrubReport, SCRUB_FINDINGS_MAX};
