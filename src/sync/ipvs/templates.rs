//! IPVS persistence templates: a ClientIP service's "this client goes to that
//! real server" entries. IPVS keeps them as connection entries, and its generic
//! netlink interface has no connection dump, so they are read from
//! `/proc/net/ip_vs_conn` (the calling process's network namespace), a line at
//! a time, keeping only the client asked about.
//!
//! The format is `ip_vs_conn_seq_show` in `net/netfilter/ipvs/ip_vs_conn.c`:
//! `Pro FromIP FPrt ToIP TPrt DestIP DPrt State Expires …`, IPv4 addresses as
//! 8 hex digits (host order of the printed number), IPv6 ones as `%pI6`, ports
//! as 4 hex digits. A template is an entry with client port 0.

use std::io::BufRead;
use std::net::{IpAddr, Ipv4Addr};

/// Where the kernel lists IPVS connections and templates.
pub const IP_VS_CONN: &str = "/proc/net/ip_vs_conn";

/// One persistence template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistenceTemplate {
    /// IP protocol number.
    pub proto: u8,
    /// The client (masked by the service's persistence netmask; kube-proxy and
    /// we use the full address).
    pub client: IpAddr,
    /// The virtual server's address and port.
    pub vaddr: IpAddr,
    /// Virtual port.
    pub vport: u16,
    /// The real server the client sticks to.
    pub dest: IpAddr,
    /// Real server port.
    pub dport: u16,
    /// Seconds until it expires (it is renewed while connections it
    /// controls live).
    pub expires: u32,
}

/// Parses one line of `/proc/net/ip_vs_conn`: `Some` for a template.
pub fn parse_template(line: &str) -> Option<PersistenceTemplate> {
    let mut f = line.split_whitespace();
    let proto = match f.next()? {
        "TCP" => 6,
        "UDP" => 17,
        "SCTP" => 132,
        _ => return None,
    };
    let client = addr(f.next()?)?;
    let cport = port(f.next()?)?;
    let vaddr = addr(f.next()?)?;
    let vport = port(f.next()?)?;
    let dest = addr(f.next()?)?;
    let dport = port(f.next()?)?;
    let _state = f.next()?;
    let expires = f.next()?.parse().ok()?;
    (cport == 0).then_some(PersistenceTemplate {
        proto,
        client,
        vaddr,
        vport,
        dest,
        dport,
        expires,
    })
}

fn addr(s: &str) -> Option<IpAddr> {
    if s.contains(':') {
        s.parse().ok()
    } else if s.len() == 8 {
        u32::from_str_radix(s, 16)
            .ok()
            .map(|v| IpAddr::V4(Ipv4Addr::from(v)))
    } else {
        None
    }
}

fn port(s: &str) -> Option<u16> {
    (s.len() == 4).then(|| u16::from_str_radix(s, 16).ok())?
}

/// The templates of `client` in `text` (lines of `/proc/net/ip_vs_conn`).
pub fn templates_of(client: IpAddr, lines: impl BufRead) -> Vec<PersistenceTemplate> {
    lines
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| parse_template(&l))
        .filter(|t| t.client == client)
        .collect()
}

/// The templates of `client` in this network namespace (`Ok(empty)` when IPVS
/// is not loaded and the file does not exist).
pub fn read_templates_of(client: IpAddr) -> std::io::Result<Vec<PersistenceTemplate>> {
    match std::fs::File::open(IP_VS_CONN) {
        Ok(f) => Ok(templates_of(client, std::io::BufReader::new(f))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as `ip_vs_conn_seq_show` prints them (a template, a connection
    /// it controls, an IPv6 template, the header).
    const TEXT: &str = "\
Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
TCP 0AF40102 0000 0A60000A 0050 0AF40205 1F90 NONE            178
TCP 0AF40102 B5A2 0A60000A 0050 0AF40205 1F90 TIME_WAIT       118
UDP fd44:0001:0000:0000:0000:0000:0000:0002 0000 fd96:0000:0000:0000:0000:0000:0000:000a 0035 fd44:0002:0000:0000:0000:0000:0000:0005 0035 UDP              42
";

    #[test]
    fn templates_are_the_entries_with_client_port_0() {
        let v4 = templates_of("10.244.1.2".parse().unwrap(), TEXT.as_bytes());
        assert_eq!(
            v4,
            [PersistenceTemplate {
                proto: 6,
                client: "10.244.1.2".parse().unwrap(),
                vaddr: "10.96.0.10".parse().unwrap(),
                vport: 80,
                dest: "10.244.2.5".parse().unwrap(),
                dport: 8080,
                expires: 178,
            }]
        );
        let v6 = templates_of("fd44:1::2".parse().unwrap(), TEXT.as_bytes());
        assert_eq!(v6.len(), 1);
        assert_eq!(v6[0].dest, "fd44:2::5".parse::<IpAddr>().unwrap());
        assert_eq!((v6[0].proto, v6[0].vport, v6[0].expires), (17, 53, 42));
        assert!(templates_of("10.0.0.9".parse().unwrap(), TEXT.as_bytes()).is_empty());
        // Garbage is skipped, not a panic.
        for bad in ["", "TCP", "TCP zz 0000 a b c d e f", "ICMP 0AF40102 0000"] {
            assert_eq!(parse_template(bad), None, "{bad:?}");
        }
    }
}
