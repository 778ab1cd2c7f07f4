//! What the test suites share (a dev-dependency only): free ports that stay free.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// A loopback address whose port nothing listens on, below the kernel's ephemeral range.
///
/// A port from `bind(0)` is in that range, so between the moment a test drops its probe and
/// the moment a server binds the port, any outgoing connection on the machine (another test's
/// client, a reconnect) may take it as its source port, and the server fails with
/// `AddrInUse` (seen in CI). Below the range only an explicit bind takes a port; the start is
/// spread by process id and a counter so parallel tests rarely probe the same one.
pub fn free_addr() -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (first, span) = (10_000, low.saturating_sub(10_000).max(1));
    let start = std::process::id().wrapping_mul(7919);
    (0..span)
        .map(|i| first + (start.wrapping_add(NEXT.fetch_add(97, Ordering::Relaxed)) + i) % span)
        .find_map(|port| TcpListener::bind(("127.0.0.1", port as u16)).ok())
        .expect("a free port below the ephemeral range")
        .local_addr()
        .expect("a bound socket has an address")
}

/// [`free_addr`]'s port.
pub fn free_port() -> u16 {
    free_addr().port()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_are_free_and_below_the_ephemeral_range() {
        let a = super::free_addr();
        assert!(a.port() >= 10_000 && a.port() < 32_768, "{a}");
        std::net::TcpListener::bind(a).expect("still free");
        assert_ne!(super::free_addr(), super::free_addr());
    }
}
