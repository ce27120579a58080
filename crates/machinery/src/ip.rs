//! IP and CIDR rules shared by every kind that carries addresses (Services, Endpoints): 1.36's
//! strict parse, upstream's legacy ("sloppy") parse, the special-address check, and the ≥1.33
//! canonical-form warnings.

use std::net::IpAddr;

use ipnet::IpNet;

/// The detail for a value that is not an IP address at all.
pub const INVALID_IP: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";

/// A dotted quad whose parts may have leading zeros (`010.1.1.1`), as Go's pre-1.17 parser
/// read them.
fn leading_zero_v4(text: &str) -> Option<IpAddr> {
    let parts: Option<Vec<u8>> = text
        .split('.')
        .map(|p| {
            (!p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse::<u8>().ok())
                .flatten()
        })
        .collect();
    let parts = parts.filter(|p| p.len() == 4)?;
    Some(IpAddr::from([parts[0], parts[1], parts[2], parts[3]]))
}

/// Upstream's legacy parse: also accepts IPv4 parts with leading zeros.
pub fn parse_sloppy(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>()
        .ok()
        .or_else(|| leading_zero_v4(text))
}

/// 1.36's strict check: what is wrong with `text` as an IP, if anything.
pub fn strict_problem(text: &str) -> Option<&'static str> {
    match text.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_some() => {
            Some("must not be an IPv4-mapped IPv6 address")
        }
        Ok(_) => None,
        Err(_) if leading_zero_v4(text).is_some() => Some("must not have leading 0s"),
        Err(_) => Some(INVALID_IP),
    }
}

/// `ValidateNonSpecialIP`: the detail when an address may not be used (unspecified, loopback,
/// link-local unicast or link-local multicast).
pub fn special_problem(addr: IpAddr, text: &str) -> Option<String> {
    if addr.is_unspecified() {
        return Some(format!("may not be unspecified ({text})"));
    }
    if addr.is_loopback() {
        return Some("may not be in the loopback range (127.0.0.0/8, ::1/128)".into());
    }
    let link_local_unicast = match addr {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    };
    if link_local_unicast {
        return Some("may not be in the link-local range (169.254.0.0/16, fe80::/10)".into());
    }
    let link_local_multicast = match addr {
        IpAddr::V4(a) => a.octets()[..3] == [224, 0, 0],
        IpAddr::V6(a) => (a.segments()[0] & 0xff0f) == 0xff02,
    };
    if link_local_multicast {
        return Some(
            "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)".into(),
        );
    }
    None
}

/// Parses a CIDR as upstream's legacy parser does (IPv4 parts may have leading zeros; the
/// prefix is plain digits), into an `ipnet` network that keeps the address as written.
pub fn parse_cidr(text: &str) -> Option<IpNet> {
    let (address, prefix) = text.split_once('/')?;
    let address = parse_sloppy(address)?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    IpNet::new(address, prefix.parse::<u8>().ok()?).ok()
}

/// The ≥1.33 warning for an IPv6 address not in RFC 5952 canonical form.
pub fn canonical_ip_warning(path: &str, text: &str) -> Option<String> {
    match text.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) if v6.to_string() != text => Some(format!(
            "{path}: IPv6 address {text:?} should be in RFC 5952 canonical format ({:?})",
            v6.to_string()
        )),
        _ => None,
    }
}

/// The ≥1.33 warnings for a CIDR that is valid but not canonical.
pub fn cidr_warning(path: &str, text: &str) -> Option<String> {
    let cidr = parse_cidr(text)?;
    let (address, bits, network) = (cidr.addr(), cidr.prefix_len(), cidr.network());
    let canonical = format!("{address}/{bits}");
    if network != address {
        let host_bits = if address.is_ipv4() { 32 } else { 128 };
        return Some(format!(
            "{path}: CIDR value {text:?} is ambiguous in this context (should be \"{network}/{bits}\" or \"{address}/{host_bits}\"?)"
        ));
    }
    if canonical != text {
        return Some(if address.is_ipv4() {
            format!(
                "{path}: non-standard CIDR value {text:?} will be considered invalid in a future Kubernetes release: use {canonical:?}"
            )
        } else {
            format!(
                "{path}: IPv6 CIDR value {text:?} should be in RFC 5952 canonical format ({canonical:?})"
            )
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_and_sloppy_parses() {
        assert_eq!(strict_problem("10.96.0.10"), None);
        assert_eq!(
            strict_problem("010.96.0.10"),
            Some("must not have leading 0s")
        );
        assert_eq!(
            strict_problem("::ffff:10.0.0.1"),
            Some("must not be an IPv4-mapped IPv6 address")
        );
        assert_eq!(strict_problem("nope"), Some(INVALID_IP));
        assert_eq!(parse_sloppy("010.1.1.1"), Some(IpAddr::from([10, 1, 1, 1])));
        assert_eq!(
            canonical_ip_warning("spec.clusterIPs[1]", "FD00:10:96::A"),
            Some("spec.clusterIPs[1]: IPv6 address \"FD00:10:96::A\" should be in RFC 5952 canonical format (\"fd00:10:96::a\")".into())
        );
        assert_eq!(parse_cidr("1.2.3.4/33"), None);
        assert_eq!(parse_cidr("0.0.0.0/0").map(|c| c.prefix_len()), Some(0));
        assert_eq!(
            parse_cidr("010.0.0.0/8").map(|c| c.to_string()),
            Some("10.0.0.0/8".into())
        );
    }

    #[test]
    fn special_addresses() {
        let check = |t: &str| special_problem(t.parse().expect("ip"), t);
        assert!(check("127.0.0.1").is_some_and(|m| m.contains("loopback")));
        assert!(check("0.0.0.0").is_some_and(|m| m.contains("unspecified (0.0.0.0)")));
        assert!(check("169.254.1.1").is_some());
        assert!(check("224.0.0.5").is_some());
        assert_eq!(check("239.1.1.1"), None);
    }
}
