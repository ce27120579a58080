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

/// The detail for a value that is not a CIDR at all.
pub const INVALID_CIDR: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";

/// The address and prefix texts of a CIDR, when they parse strictly (no leading zeros in
/// either, as Go's `netip.ParsePrefix`).
fn strict_cidr(text: &str) -> bool {
    text.split_once('/').is_some_and(|(address, prefix)| {
        address.parse::<IpAddr>().is_ok() && !(prefix.len() > 1 && prefix.starts_with('0'))
    })
}

fn is_4in6(addr: IpAddr) -> bool {
    matches!(addr, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some())
}

/// 1.36's strict CIDR check (`parseCIDR` with `StrictIPCIDRValidation`, beta and on in 1.36):
/// what is wrong with `text` as a CIDR, if anything.
pub fn strict_cidr_problem(text: &str) -> Option<&'static str> {
    let cidr = parse_cidr(text)?;
    if !strict_cidr(text) {
        Some("must not have leading 0s in IP or prefix length")
    } else if is_4in6(cidr.addr()) {
        Some("must not have an IPv4-mapped IPv6 address")
    } else if cidr.addr() != cidr.network() {
        Some("must not have bits set beyond the prefix length")
    } else {
        None
    }
}

/// `IsValidCIDRForLegacyField`: what is wrong with a CIDR, unless the old object held it.
pub fn legacy_cidr_problem(text: &str, existing: &[String]) -> Option<&'static str> {
    if existing.iter().any(|old| old == text) {
        return None;
    }
    match parse_cidr(text) {
        None => Some(INVALID_CIDR),
        Some(_) => strict_cidr_problem(text),
    }
}

/// `IsValidIPForLegacyField`: what is wrong with an IP, unless the old object held it.
pub fn legacy_ip_problem(text: &str, existing: &[String]) -> Option<&'static str> {
    if existing.iter().any(|old| old == text) {
        return None;
    }
    strict_problem(text)
}

/// `GetWarningsForIP`: a legacy value kept from an old object, or an IPv6 address not in
/// RFC 5952 canonical form.
pub fn ip_warnings(path: &str, text: &str) -> Option<String> {
    let sloppy = parse_sloppy(text)?;
    match text.parse::<IpAddr>() {
        Ok(addr) if !is_4in6(addr) => match addr {
            IpAddr::V6(v6) if v6.to_string() != text => Some(format!(
                "{path}: IPv6 address {text:?} should be in RFC 5952 canonical format ({:?})",
                v6.to_string()
            )),
            _ => None,
        },
        _ => {
            let preferred = match sloppy {
                IpAddr::V6(v6) => v6
                    .to_ipv4_mapped()
                    .map_or_else(|| v6.to_string(), |v4| v4.to_string()),
                v4 => v4.to_string(),
            };
            Some(format!(
                "{path}: non-standard IP address {text:?} is invalid: use {preferred:?}"
            ))
        }
    }
}

/// `GetWarningsForCIDR`: an ambiguous host-bits value, a legacy form, or an IPv6 CIDR not in
/// RFC 5952 canonical form (only when nothing else is wrong).
pub fn cidr_warnings(path: &str, text: &str) -> Vec<String> {
    let Some(cidr) = parse_cidr(text) else {
        return Vec::new();
    };
    let (address, bits, network) = (cidr.addr(), cidr.prefix_len(), cidr.network());
    let mut warnings = Vec::new();
    if network != address {
        let host_bits = if address.is_ipv4() { 32 } else { 128 };
        warnings.push(format!(
            "{path}: CIDR value {text:?} is ambiguous in this context (should be \"{network}/{bits}\" or \"{address}/{host_bits}\"?)"
        ));
    }
    if !strict_cidr(text) || is_4in6(address) {
        warnings.push(format!(
            "{path}: non-standard CIDR value {text:?} is invalid: use \"{network}/{bits}\""
        ));
    }
    let canonical = format!("{address}/{bits}");
    if warnings.is_empty() && address.is_ipv6() && canonical != text {
        warnings.push(format!(
            "{path}: IPv6 CIDR value {text:?} should be in RFC 5952 canonical format ({canonical:?})"
        ));
    }
    warnings
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
            ip_warnings("spec.clusterIPs[1]", "FD00:10:96::A"),
            Some("spec.clusterIPs[1]: IPv6 address \"FD00:10:96::A\" should be in RFC 5952 canonical format (\"fd00:10:96::a\")".into())
        );
        assert_eq!(
            ip_warnings("spec.externalIPs[0]", "010.1.1.1"),
            Some("spec.externalIPs[0]: non-standard IP address \"010.1.1.1\" is invalid: use \"10.1.1.1\"".into())
        );
        assert_eq!(ip_warnings("spec.externalIPs[0]", "10.1.1.1"), None);
        assert_eq!(parse_cidr("1.2.3.4/33"), None);
        assert_eq!(parse_cidr("0.0.0.0/0").map(|c| c.prefix_len()), Some(0));
        assert_eq!(
            parse_cidr("010.0.0.0/8").map(|c| c.to_string()),
            Some("10.0.0.0/8".into())
        );
    }

    #[test]
    fn strict_cidrs() {
        assert_eq!(strict_cidr_problem("10.0.0.0/8"), None);
        assert_eq!(
            strict_cidr_problem("010.0.0.0/8"),
            Some("must not have leading 0s in IP or prefix length")
        );
        assert_eq!(
            strict_cidr_problem("10.0.0.0/08"),
            Some("must not have leading 0s in IP or prefix length")
        );
        assert_eq!(
            strict_cidr_problem("::ffff:10.0.0.0/104"),
            Some("must not have an IPv4-mapped IPv6 address")
        );
        assert_eq!(
            strict_cidr_problem("10.1.2.3/8"),
            Some("must not have bits set beyond the prefix length")
        );
        assert_eq!(
            legacy_cidr_problem("10.1.2.3/8", &["10.1.2.3/8".into()]),
            None
        );
        assert_eq!(legacy_cidr_problem("nope", &[]), Some(INVALID_CIDR));
        assert_eq!(
            cidr_warnings("p", "010.1.2.3/8"),
            vec![
                "p: CIDR value \"010.1.2.3/8\" is ambiguous in this context (should be \"10.0.0.0/8\" or \"10.1.2.3/32\"?)".to_string(),
                "p: non-standard CIDR value \"010.1.2.3/8\" is invalid: use \"10.0.0.0/8\"".to_string(),
            ]
        );
        assert_eq!(
            cidr_warnings("p", "FD00::/64"),
            vec!["p: IPv6 CIDR value \"FD00::/64\" should be in RFC 5952 canonical format (\"fd00::/64\")".to_string()]
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
