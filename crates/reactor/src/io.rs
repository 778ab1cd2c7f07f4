//! Owned-buffer socket I/O helpers over the runtime's completion-based API.

use bytes::BytesMut;
use compio::buf::{BufResult, IntoInner, IoBuf, IoBufMut};
use compio::io::AsyncWriteExt;
use compio::net::{TcpStream, UnixStream};
use std::cell::Cell;
use std::io;

/// A connected byte stream the reactor can serve: TCP or a Unix-domain socket.
pub trait Socket: compio::io::AsyncRead + compio::io::AsyncWrite + Sized + 'static {
    /// Two handles on the same socket, so one task can read while another writes.
    fn into_split(self) -> (Self, Self);
}

impl Socket for TcpStream {
    fn into_split(self) -> (Self, Self) {
        TcpStream::into_split(self)
    }
}

impl Socket for UnixStream {
    fn into_split(self) -> (Self, Self) {
        UnixStream::into_split(self)
    }
}

/// Reads whatever is available into the spare capacity of `buf` (reserving `min_spare` first),
/// appending to its contents. Returns the number of bytes read; 0 means the peer closed.
pub async fn read_some<S: Socket>(
    stream: &mut S,
    mut buf: BytesMut,
    min_spare: usize,
) -> (io::Result<usize>, BytesMut) {
    if buf.capacity() - buf.len() < min_spare {
        buf.reserve(min_spare);
    }
    let BufResult(res, uninit) = stream.read(buf.uninit()).await;
    crate::load::note_activity();
    (res, uninit.into_inner())
}

/// Writes all of `buf`, then hands it back cleared for reuse.
pub async fn write_all<S: Socket>(stream: &mut S, buf: BytesMut) -> (io::Result<()>, BytesMut) {
    let BufResult(res, mut buf) = stream.write_all(buf).await;
    crate::load::note_activity();
    buf.clear();
    (res, buf)
}

/// [`write_all`] that adds one to `progress` whenever some bytes went out, so a watchdog can
/// tell a peer that reads its data slowly from one that stopped reading.
pub async fn write_all_noting<S: Socket>(
    stream: &mut S,
    mut buf: BytesMut,
    progress: &Cell<u64>,
) -> (io::Result<()>, BytesMut) {
    let mut done = 0;
    let res = loop {
        if done == buf.len() {
            break Ok(());
        }
        let BufResult(res, slice) = stream.write(buf.slice(done..)).await;
        buf = slice.into_inner();
        match res {
            Ok(0) => break Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => {
                done += n;
                progress.set(progress.get() + 1);
                crate::load::note_activity();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    buf.clear();
    (res, buf)
}

/// Half-closes the stream: the peer reads end-of-stream once pending data is consumed.
pub async fn shutdown_write<S: Socket>(stream: &mut S) -> io::Result<()> {
    compio::io::AsyncWrite::shutdown(stream).await
}
