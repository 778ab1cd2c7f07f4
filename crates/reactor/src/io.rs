//! Owned-buffer socket I/O helpers over the runtime's completion-based API.

use bytes::BytesMut;
use compio::buf::{BufResult, IntoInner, IoBufMut};
use compio::io::{AsyncRead, AsyncWriteExt};
use compio::net::TcpStream;
use std::io;

/// Reads whatever is available into the spare capacity of `buf` (reserving `min_spare` first),
/// appending to its contents. Returns the number of bytes read; 0 means the peer closed.
pub async fn read_some(
    stream: &mut TcpStream,
    mut buf: BytesMut,
    min_spare: usize,
) -> (io::Result<usize>, BytesMut) {
    if buf.capacity() - buf.len() < min_spare {
        buf.reserve(min_spare);
    }
    let BufResult(res, uninit) = stream.read(buf.uninit()).await;
    (res, uninit.into_inner())
}

/// Writes all of `buf`, then hands it back cleared for reuse.
pub async fn write_all(stream: &mut TcpStream, buf: BytesMut) -> (io::Result<()>, BytesMut) {
    let BufResult(res, mut buf) = stream.write_all(buf).await;
    buf.clear();
    (res, buf)
}

/// Half-closes the stream: the peer reads end-of-stream once pending data is consumed.
pub async fn shutdown_write(stream: &mut TcpStream) -> io::Result<()> {
    compio::io::AsyncWrite::shutdown(stream).await
}
