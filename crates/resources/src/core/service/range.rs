//! The ranges Services are given addresses and ports from: the service CIDRs
//! (`--service-cluster-ip-range`) and the node port range (`--service-node-port-range`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// A service CIDR (`--service-cluster-ip-range`), parsed by upstream's legacy rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpRange {
    net: IpNet,
    text: String,
}

fn as_number(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

impl IpRange {
    /// Parses `10.96.0.0/12` or `fd00::/108`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let net = capstan_machinery::ip::parse_cidr(text)
            .ok_or_else(|| format!("invalid CIDR address: {text}"))?;
        let host_bits = net.max_prefix_len() - net.prefix_len();
        if host_bits > 20 {
            return Err(if net.max_prefix_len() == 32 {
                "specified --service-cluster-ip-range is too large; for 32-bit addresses, the mask must be >= 12"
            } else {
                "specified --service-cluster-ip-range is too large; for 128-bit addresses, the mask must be >= 108"
            }
            .into());
        }
        Ok(IpRange {
            net: net.trunc(),
            text: text.to_string(),
        })
    }

    /// `IPv4` or `IPv6`.
    pub fn family(&self) -> &'static str {
        match self.net {
            IpNet::V4(_) => "IPv4",
            IpNet::V6(_) => "IPv6",
        }
    }

    fn host_bits(&self) -> u8 {
        self.net.max_prefix_len() - self.net.prefix_len()
    }

    fn size(&self) -> u128 {
        1u128 << self.host_bits()
    }

    fn base(&self) -> u128 {
        as_number(self.net.network())
    }

    /// Usable offsets: 1 ..= last (IPv4 broadcast excluded, IPv6 capped at 65535).
    pub(super) fn usable(&self) -> u128 {
        match self.net {
            IpNet::V4(_) => self.size().saturating_sub(2),
            IpNet::V6(_) => (self.size() - 1).min(65535),
        }
    }

    /// The address `offset` into the range (0 is the network address).
    pub(super) fn address(&self, offset: u128) -> String {
        let value = self.base() + offset;
        match self.net {
            IpNet::V4(_) => Ipv4Addr::from(u32::try_from(value).unwrap_or(u32::MAX)).to_string(),
            IpNet::V6(_) => Ipv6Addr::from(value).to_string(),
        }
    }

    /// The first host address (held by the `kubernetes` Service).
    pub fn first_host(&self) -> String {
        self.address(1)
    }

    /// The usable offset of `ip`, if it is a usable address of this range.
    pub(super) fn offset_of(&self, ip: &str) -> Option<u128> {
        let parsed: IpAddr = ip.parse().ok()?;
        if !self.net.contains(&parsed) {
            return None;
        }
        let offset = as_number(parsed) - self.base();
        (offset >= 1 && offset <= self.usable()).then_some(offset)
    }

    /// Whether `ip` is inside the CIDR at all (usable or not).
    pub(super) fn contains_network(&self, ip: &str) -> bool {
        ip.parse::<IpAddr>().is_ok_and(|ip| self.net.contains(&ip))
    }

    /// The low band reserved for requested addresses (upstream's static/dynamic split).
    pub(super) fn static_band(&self) -> u128 {
        let size = self.size();
        if size < 16 {
            0
        } else {
            (size / 16).clamp(16, 256)
        }
    }
}

impl std::fmt::Display for IpRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// The node port range (`--service-node-port-range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    /// First port.
    pub base: u16,
    /// Number of ports.
    pub size: u16,
}

impl PortRange {
    /// Parses `30000-32767` or `30000+2767`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("invalid port range: {text:?}");
        if let Some((a, b)) = text.split_once('-') {
            let a: u16 = a.trim().parse().map_err(|_| bad())?;
            let b: u16 = b.trim().parse().map_err(|_| bad())?;
            if b < a {
                return Err(bad());
            }
            return Ok(PortRange {
                base: a,
                size: b - a + 1,
            });
        }
        if let Some((a, n)) = text.split_once('+') {
            let a: u16 = a.trim().parse().map_err(|_| bad())?;
            let n: u16 = n.trim().parse().map_err(|_| bad())?;
            a.checked_add(n).ok_or_else(bad)?;
            return Ok(PortRange {
                base: a,
                size: n + 1,
            });
        }
        Err(bad())
    }

    /// Whether `port` is in the range.
    pub fn contains(&self, port: i32) -> bool {
        port >= i32::from(self.base) && port < i32::from(self.base) + i32::from(self.size)
    }

    /// The offset of a port in the range (the caller checked [`PortRange::contains`]).
    pub(super) fn offset(&self, port: i32) -> usize {
        usize::try_from(port - i32::from(self.base)).unwrap_or(0)
    }

    /// The port at an offset.
    pub(super) fn port(&self, offset: usize) -> i32 {
        i32::from(self.base) + i32::try_from(offset).unwrap_or(0)
    }

    fn last(&self) -> i32 {
        i32::from(self.base) + i32::from(self.size) - 1
    }

    /// The low band reserved for requested ports.
    pub(super) fn static_band(&self) -> u16 {
        if self.size <= 16 {
            0
        } else {
            (self.size / 32).clamp(16, 128)
        }
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.base, self.last())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_bound_addresses() {
        let range = IpRange::parse("10.96.0.0/16").expect("parses");
        assert_eq!(range.first_host(), "10.96.0.1");
        assert_eq!(range.static_band(), 256);
        assert!(range.offset_of("10.96.255.255").is_none());
        assert!(range.offset_of("10.96.0.0").is_none());
        assert!(range.offset_of("10.96.3.4").is_some());
        assert!(range.contains_network("10.96.255.255"));
        assert!(!range.contains_network("10.97.0.1"));
        assert!(IpRange::parse("10.0.0.0/8").is_err());
        assert_eq!(
            IpRange::parse("fd00:10:96::/108").map(|r| r.family()),
            Ok("IPv6")
        );
    }

    #[test]
    fn port_ranges_parse_both_forms() {
        assert_eq!(
            PortRange::parse("30000-32767"),
            Ok(PortRange {
                base: 30000,
                size: 2768
            })
        );
        assert_eq!(PortRange::parse("30000+10").map(|r| r.size), Ok(11));
        assert_eq!(
            PortRange::parse("30000-32767").map(|r| r.static_band()),
            Ok(86)
        );
    }
}
