//! Tolerant address parsing, as upstream's `netutils.ParseIPSloppy` /
//! `ParseCIDRSloppy`: IPv4 octets may carry leading zeros and are read as decimal
//! (`172.30.0.041` is `172.30.0.41`), IPv4-mapped IPv6 addresses are IPv4, and CIDRs
//! with host bits set are accepted (masked to the network).

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// Parse an IPv4 dotted quad whose octets may have leading zeros (decimal).
fn parse_ipv4_sloppy(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = part.trim_start_matches('0');
        if digits.len() > 3 {
            return None;
        }
        let v: u32 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        *octet = u8::try_from(v).ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(Ipv4Addr::from(octets))
}

/// Parse an IP address like upstream's `ParseIPSloppy`. IPv4-mapped IPv6 addresses
/// (`::ffff:1.2.3.4`) are returned as IPv4, as Go treats them.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if s.contains(':') {
        let v6: std::net::Ipv6Addr = s.parse().ok()?;
        return Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        });
    }
    parse_ipv4_sloppy(s).map(IpAddr::V4)
}

/// Parse a CIDR like upstream's `ParseCIDRSloppy`, after trimming surrounding
/// whitespace; host bits are masked off.
pub fn parse_cidr_sloppy(s: &str) -> Option<IpNet> {
    let s = s.trim();
    let (addr, len) = s.split_once('/')?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) || len.len() > 3 {
        return None;
    }
    let len: u8 = len.parse().ok()?;
    // A mapped address keeps its IPv6 prefix length in Go; keep it simple and only
    // accept the plain forms.
    let ip = if addr.contains(':') {
        IpAddr::V6(addr.parse().ok()?)
    } else {
        IpAddr::V4(parse_ipv4_sloppy(addr)?)
    };
    IpNet::new(ip, len).ok().map(|n| n.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zeros_are_decimal() {
        assert_eq!(
            parse_ip_sloppy("172.30.0.041"),
            Some("172.30.0.41".parse().unwrap())
        );
        assert_eq!(
            parse_ip_sloppy("010.000.0.1"),
            Some("10.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "1.2.3",
            "1.2.3.4.5",
            "256.0.0.1",
            "1.2.3.x",
            " 1.2.3.4",
            "1..2.3",
            "None",
        ] {
            assert_eq!(parse_ip_sloppy(s), None, "{s:?}");
        }
    }

    #[test]
    fn ipv6_and_mapped() {
        assert_eq!(parse_ip_sloppy("fd00::1"), Some("fd00::1".parse().unwrap()));
        assert_eq!(
            parse_ip_sloppy("::ffff:1.2.3.4"),
            Some("1.2.3.4".parse().unwrap())
        );
    }

    #[test]
    fn cidr_tolerant() {
        assert_eq!(
            parse_cidr_sloppy(" 10.0.0.0/8"),
            Some("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            parse_cidr_sloppy("10.1.2.3/8 "),
            Some("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            parse_cidr_sloppy("010.0.0.0/8"),
            Some("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            parse_cidr_sloppy("fd00::1/64"),
            Some("fd00::/64".parse().unwrap())
        );
        assert_eq!(parse_cidr_sloppy("10.0.0.0/33"), None);
        assert_eq!(parse_cidr_sloppy("10.0.0.0"), None);
        assert_eq!(parse_cidr_sloppy("10.0.0.0/"), None);
    }
}
