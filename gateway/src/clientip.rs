//! The fan's IP address for per-IP rate limits.
//!
//! Behind a load balancer or CDN every connection comes from the balancer, so per-IP limits
//! would throttle the whole crowd as one client. `X-Forwarded-For` is believed only when the
//! connection comes from a configured trusted proxy (`gateway.trusted_proxies`, CIDRs), and
//! then read from the right: each hop appends the address it saw, so the rightmost address
//! that is not one of our proxies is the client. Anything a client wrote further left is
//! ignored, so a fan cannot pick the address they are limited as. Garbage in the header
//! falls back to the connecting address.

use ipnet::IpNet;
use std::net::IpAddr;

#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// Parses CIDRs (`10.0.0.0/8`) or single addresses (`192.0.2.7`).
    pub fn parse(items: &[String]) -> anyhow::Result<Self> {
        let nets = items
            .iter()
            .map(|s| {
                let s = s.trim();
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        anyhow::anyhow!("gateway.trusted_proxies: {s:?} is not a CIDR or IP")
                    })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { nets })
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// The client address for a connection from `peer` carrying these `X-Forwarded-For`
    /// header values (in order of appearance).
    pub fn client<'a>(
        &self,
        peer: Option<IpAddr>,
        forwarded_for: impl DoubleEndedIterator<Item = &'a [u8]>,
    ) -> Option<IpAddr> {
        let peer = peer?;
        if self.nets.is_empty() || !self.trusts(peer) {
            return Some(peer);
        }
        let mut client = peer;
        for value in forwarded_for.rev() {
            let Ok(value) = std::str::from_utf8(value) else {
                return Some(client);
            };
            for hop in value.rsplit(',') {
                let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                    return Some(client);
                };
                client = ip;
                if !self.trusts(ip) {
                    return Some(ip);
                }
            }
        }
        Some(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn client(t: &TrustedProxies, peer: &str, xff: &[&str]) -> IpAddr {
        t.client(Some(ip(peer)), xff.iter().map(|s| s.as_bytes()))
            .expect("an address")
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let t = TrustedProxies::parse(&["10.0.0.0/8".into(), "192.0.2.7".into()]).expect("valid");
        // No trusted proxies configured: the connecting address, header ignored.
        let none = TrustedProxies::default();
        assert_eq!(client(&none, "10.1.1.1", &["203.0.113.9"]), ip("10.1.1.1"));
        // A fan connecting directly cannot choose their address.
        assert_eq!(
            client(&t, "198.51.100.4", &["203.0.113.9"]),
            ip("198.51.100.4")
        );
        // Through our balancer: the address it saw.
        assert_eq!(client(&t, "10.1.1.1", &["203.0.113.9"]), ip("203.0.113.9"));
        // A client-written entry on the left is ignored; the rightmost untrusted hop wins.
        assert_eq!(
            client(&t, "10.1.1.1", &["6.6.6.6, 203.0.113.9, 10.2.2.2"]),
            ip("203.0.113.9")
        );
        // Several header lines are one list, in order.
        assert_eq!(
            client(&t, "10.1.1.1", &["6.6.6.6", "203.0.113.9", "192.0.2.7"]),
            ip("203.0.113.9")
        );
        // Garbage stops the walk at the last good hop.
        assert_eq!(client(&t, "10.1.1.1", &["not-an-ip"]), ip("10.1.1.1"));
        assert_eq!(
            client(&t, "10.1.1.1", &["junk, 203.0.113.9"]),
            ip("203.0.113.9")
        );
        // Only proxies in the chain: the leftmost of them.
        assert_eq!(client(&t, "10.1.1.1", &["10.3.3.3"]), ip("10.3.3.3"));
        // IPv4-mapped IPv6 peers are matched as IPv4.
        assert_eq!(
            client(&t, "::ffff:10.1.1.1", &["2001:db8::1"]),
            ip("2001:db8::1")
        );
        assert!(TrustedProxies::parse(&["10.0.0.0/33".into()]).is_err());
        assert!(TrustedProxies::parse(&["proxy.local".into()]).is_err());
    }
}
