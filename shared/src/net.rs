//! Small network helpers.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// A free port for a listener that must be configured before it binds (pingora takes an
/// address, not a socket), for tests and benchmarks. Drawn *below* the kernel's ephemeral
/// range: a port from `bind(:0)` can be handed out again to any outgoing connection or
/// parallel test before the real listener binds it, while ports outside that range are only
/// ever taken by explicit listeners.
pub fn free_port_outside_ephemeral_range() -> std::io::Result<u16> {
    let lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = (10_000u16, lo.saturating_sub(1).max(10_001));
    for _ in 0..500 {
        let port = from + (random_u16() % (to - from));
        // Not one this process already handed out: its listener may not be bound yet (two
        // picks in a row for two children used to be able to collide).
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && first_pick(port) {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free port found in {from}..{to}"),
    ))
}

/// Records `port` as handed out; false if it already was.
fn first_pick(port: u16) -> bool {
    static PICKED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    PICKED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(port)
}

fn random_u16() -> u16 {
    // A fresh UUIDv4 tail is random enough to spread test ports; no extra dependency.
    let id = uuid::Uuid::new_v4();
    let b = id.as_bytes();
    u16::from_be_bytes([b[14], b[15]])
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_come_from_below_the_ephemeral_range_and_are_bindable() {
        let lo: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap_or(32768);
        for _ in 0..20 {
            let p = super::free_port_outside_ephemeral_range().expect("a port");
            assert!(p >= 10_000 && p < lo.max(10_001), "{p} not below {lo}");
            std::net::TcpListener::bind(("127.0.0.1", p)).expect("still free");
        }
    }

    #[test]
    fn a_port_is_handed_out_once_per_process() {
        let picks: Vec<u16> = (0..200)
            .map(|_| super::free_port_outside_ephemeral_range().expect("a port"))
            .collect();
        let distinct: std::collections::BTreeSet<u16> = picks.iter().copied().collect();
        assert_eq!(distinct.len(), picks.len(), "a port was handed out twice");
        assert!(
            !super::first_pick(picks[0]),
            "a handed-out port was offered again"
        );
    }
}
