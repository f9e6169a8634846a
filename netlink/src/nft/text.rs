//! A rule's expressions as `nft list ruleset` writes them: `ip daddr . meta
//! l4proto . th dport vmap @service-ips`, not `[ payload load 4b @ network
//! header + 16 => reg 1 ]`.
//!
//! The expressions are read as the kernel runs them: each load (payload, meta,
//! ct, fib, numgen, a map lookup) puts a value in a register; a comparison, a
//! set lookup or a statement takes the registers it reads and says what they
//! hold. Values are printed as the field's type reads (addresses, protocol and
//! interface names, ports, hexadecimal marks). What this reader does not know
//! stays visible in nft's raw syntax (`@nh,96,32`), never dropped.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::codec::fmt_verdict;
use super::types::{
    CmpOp, CtKey, DynsetOp, Expr, Family, FibAddr, ImmediateData, MetaKey, PayloadBase, Reg,
    RejectKind,
};

/// What type a loaded value has: how its bytes read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ipv4,
    Ipv6,
    /// An IP protocol number (`ip protocol`, `meta l4proto`).
    Protocol,
    /// A port, network byte order.
    Port,
    /// An interface name (NUL-padded).
    IfName,
    /// `meta nfproto`.
    NfProto,
    /// A host-order 32-bit value printed in hexadecimal (a mark).
    Hex32,
    /// `fib … type` (`RTN_*`, host order).
    AddrType,
    /// `ct state` (bitmask, host order).
    CtState,
    /// `ct status` (bitmask, host order).
    CtStatus,
    /// Anything else: hexadecimal bytes.
    Raw,
}

/// A register's content: its nft text and how to read values compared with it.
#[derive(Debug, Clone)]
struct Loaded {
    text: String,
    kind: Kind,
    /// Bytes loaded (how many registers the value spans).
    len: usize,
    /// Order of the load, to find the fields of a concatenation.
    seq: usize,
    /// An address under a prefix mask: the prefix length, and the mask as
    /// text (a comparison reads `ip saddr 10.0.0.0/8`).
    prefix: Option<(u32, String)>,
}

/// The register after a value of `len` bytes loaded at `reg`.
fn next_reg(reg: Reg, len: usize) -> Reg {
    if reg.0 >= 8 {
        Reg(reg.0 + len.div_ceil(4).max(1) as u32)
    } else {
        Reg(reg.0 + 1)
    }
}

fn payload_field(family: Family, base: PayloadBase, offset: u32, len: u32) -> (String, Kind) {
    let ip6 = family == Family::Ipv6;
    let known = match (base, ip6, offset, len) {
        (PayloadBase::Network, false, 9, 1) => Some(("ip protocol", Kind::Protocol)),
        (PayloadBase::Network, false, 12, 4) => Some(("ip saddr", Kind::Ipv4)),
        (PayloadBase::Network, false, 16, 4) => Some(("ip daddr", Kind::Ipv4)),
        (PayloadBase::Network, true, 6, 1) => Some(("ip6 nexthdr", Kind::Protocol)),
        (PayloadBase::Network, true, 8, 16) => Some(("ip6 saddr", Kind::Ipv6)),
        (PayloadBase::Network, true, 24, 16) => Some(("ip6 daddr", Kind::Ipv6)),
        (PayloadBase::Transport, _, 0, 2) => Some(("th sport", Kind::Port)),
        (PayloadBase::Transport, _, 2, 2) => Some(("th dport", Kind::Port)),
        _ => None,
    };
    match known {
        Some((t, k)) => (t.to_string(), k),
        None => {
            let b = match base {
                PayloadBase::LinkLayer => "ll",
                PayloadBase::Network => "nh",
                PayloadBase::Transport => "th",
            };
            (format!("@{b},{},{}", offset * 8, len * 8), Kind::Raw)
        }
    }
}

fn meta_field(key: MetaKey) -> (&'static str, Kind, usize) {
    match key {
        MetaKey::Mark => ("meta mark", Kind::Hex32, 4),
        MetaKey::IifName => ("iifname", Kind::IfName, 16),
        MetaKey::OifName => ("oifname", Kind::IfName, 16),
        MetaKey::NfProto => ("meta nfproto", Kind::NfProto, 1),
        MetaKey::L4Proto => ("meta l4proto", Kind::Protocol, 1),
    }
}

fn ct_field(key: CtKey) -> (&'static str, Kind, usize) {
    match key {
        CtKey::State => ("ct state", Kind::CtState, 4),
        CtKey::Status => ("ct status", Kind::CtStatus, 4),
        CtKey::OriginalDstIp => ("ct original ip daddr", Kind::Ipv4, 4),
        CtKey::OriginalDstIp6 => ("ct original ip6 daddr", Kind::Ipv6, 16),
        CtKey::OriginalProtoDst => ("ct original proto-dst", Kind::Port, 2),
    }
}

fn host_u32(data: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(..4)?.try_into().ok()?))
}

fn hex(data: &[u8]) -> String {
    let digits: String = data.iter().map(|b| format!("{b:02x}")).collect();
    format!("0x{digits}")
}

fn protocol_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "ipv6-icmp".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

fn flags(bits: u32, names: &[(u32, &str)]) -> String {
    let mut out: Vec<String> = names
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| n.to_string())
        .collect();
    let rest = names.iter().fold(bits, |r, (b, _)| r & !b);
    if rest != 0 || out.is_empty() {
        out.push(format!("0x{rest:x}"));
    }
    out.join(",")
}

const CT_STATES: &[(u32, &str)] = &[
    (1, "invalid"),
    (2, "established"),
    (4, "related"),
    (8, "new"),
    (64, "untracked"),
];

const CT_STATUS: &[(u32, &str)] = &[
    (0x1, "expected"),
    (0x2, "seen-reply"),
    (0x4, "assured"),
    (0x8, "confirmed"),
    (0x10, "snat"),
    (0x20, "dnat"),
    (0x200, "dying"),
];

/// A compared value, as the field's type reads.
fn value(kind: Kind, data: &[u8]) -> String {
    let fallback = || hex(data);
    match kind {
        Kind::Ipv4 => <[u8; 4]>::try_from(data)
            .map(|b| Ipv4Addr::from(b).to_string())
            .unwrap_or_else(|_| fallback()),
        Kind::Ipv6 => <[u8; 16]>::try_from(data)
            .map(|b| Ipv6Addr::from(b).to_string())
            .unwrap_or_else(|_| fallback()),
        Kind::Protocol => match data {
            [p] => protocol_name(*p),
            _ => fallback(),
        },
        Kind::Port => match data {
            [a, b] => u16::from_be_bytes([*a, *b]).to_string(),
            _ => fallback(),
        },
        Kind::IfName => {
            let name: Vec<u8> = data.iter().copied().take_while(|b| *b != 0).collect();
            let name = String::from_utf8_lossy(&name);
            // A comparison shorter than the name field, with no NUL: a prefix.
            if name.len() == data.len() && data.len() < 16 {
                format!("\"{name}*\"")
            } else {
                format!("\"{name}\"")
            }
        }
        Kind::NfProto => match data {
            [2] => "ipv4".into(),
            [10] => "ipv6".into(),
            _ => fallback(),
        },
        Kind::Hex32 => host_u32(data).map_or_else(fallback, |v| format!("0x{v:08x}")),
        Kind::AddrType => match host_u32(data) {
            Some(1) => "unicast".into(),
            Some(2) => "local".into(),
            Some(3) => "broadcast".into(),
            Some(5) => "multicast".into(),
            _ => fallback(),
        },
        Kind::CtState => host_u32(data).map_or_else(fallback, |v| flags(v, CT_STATES)),
        Kind::CtStatus => host_u32(data).map_or_else(fallback, |v| flags(v, CT_STATUS)),
        Kind::Raw => fallback(),
    }
}

/// A network prefix length, when `mask` is one (leading ones, then zeros).
fn prefix_len(mask: &[u8]) -> Option<u32> {
    if mask.len() > 16 {
        return None;
    }
    // Summed per byte, then checked against the mask of that many leading
    // ones: any other pattern is not a prefix.
    let ones: u32 = mask.iter().map(|b| b.leading_ones()).sum();
    let bits = mask
        .iter()
        .fold(0u128, |acc, b| (acc << 8) | u128::from(*b));
    let width = mask.len() as u32 * 8;
    let expect = if ones == 0 {
        0
    } else {
        (!0u128 << (128 - ones)) >> (128 - width)
    };
    (bits == expect && ones < width).then_some(ones)
}

fn cmp_op(op: CmpOp) -> &'static str {
    match op {
        CmpOp::Eq => "",
        CmpOp::Neq => "!= ",
        CmpOp::Lt => "< ",
        CmpOp::Lte => "<= ",
        CmpOp::Gt => "> ",
        CmpOp::Gte => ">= ",
    }
}

fn reject(family: Family, kind: &RejectKind) -> String {
    match kind {
        RejectKind::TcpRst => "reject with tcp reset".into(),
        RejectKind::IcmpUnreach(code) => {
            let name = match (family, code) {
                (Family::Ipv4, 0) => Some("net-unreachable"),
                (Family::Ipv4, 1) => Some("host-unreachable"),
                (Family::Ipv4, 3) => Some("port-unreachable"),
                (Family::Ipv4, 13) => Some("admin-prohibited"),
                (Family::Ipv6, 0) => Some("no-route"),
                (Family::Ipv6, 1) => Some("admin-prohibited"),
                (Family::Ipv6, 3) => Some("addr-unreachable"),
                (Family::Ipv6, 4) => Some("port-unreachable"),
                _ => None,
            };
            let proto = if family == Family::Ipv6 {
                "icmpv6"
            } else {
                "icmp"
            };
            match name {
                Some(n) => format!("reject with {proto} {n}"),
                None => format!("reject with {proto} code {code}"),
            }
        }
    }
}

/// Reads the expressions one by one, keeping what each register holds.
struct Reader {
    family: Family,
    regs: BTreeMap<u32, Loaded>,
    seq: usize,
    out: Vec<String>,
}

impl Reader {
    fn load(&mut self, reg: Reg, text: String, kind: Kind, len: usize) {
        self.load_prefix(reg, text, kind, len, None)
    }

    fn load_prefix(
        &mut self,
        reg: Reg,
        text: String,
        kind: Kind,
        len: usize,
        prefix: Option<(u32, String)>,
    ) {
        self.seq += 1;
        self.regs.insert(
            reg.0,
            Loaded {
                text,
                kind,
                len,
                seq: self.seq,
                prefix,
            },
        );
    }

    fn text_of(&self, reg: Reg) -> Loaded {
        self.regs.get(&reg.0).cloned().unwrap_or(Loaded {
            text: format!("reg {}", reg.0),
            kind: Kind::Raw,
            len: 4,
            seq: 0,
            prefix: None,
        })
    }

    /// The key a lookup or set statement reads from `reg`: the field there and
    /// the ones loaded after it into the next registers (a concatenation).
    fn key_at(&self, reg: Reg) -> String {
        let mut parts = Vec::new();
        let mut r = reg;
        let mut last_seq = 0;
        while let Some(l) = self.regs.get(&r.0) {
            if !parts.is_empty() && l.seq <= last_seq {
                break;
            }
            parts.push(match &l.prefix {
                Some((_, mask)) => format!("{} & {mask}", l.text),
                None => l.text.clone(),
            });
            last_seq = l.seq;
            r = next_reg(r, l.len);
        }
        if parts.is_empty() {
            format!("reg {}", reg.0)
        } else {
            parts.join(" . ")
        }
    }

    fn expr(&mut self, e: &Expr) {
        match e {
            Expr::Payload {
                base,
                offset,
                len,
                dreg,
            } => {
                let (text, kind) = payload_field(self.family, *base, *offset, *len);
                self.load(*dreg, text, kind, *len as usize);
            }
            Expr::Meta { key, dreg } => {
                let (text, kind, len) = meta_field(*key);
                self.load(*dreg, text.into(), kind, len);
            }
            Expr::Ct { key, dreg } => {
                let (text, kind, len) = ct_field(*key);
                self.load(*dreg, text.into(), kind, len);
            }
            Expr::Fib { addr, dreg, .. } => {
                let a = match addr {
                    FibAddr::Source => "saddr",
                    FibAddr::Destination => "daddr",
                };
                self.load(*dreg, format!("fib {a} type"), Kind::AddrType, 4);
            }
            Expr::NumgenRandom {
                dreg,
                modulus,
                offset,
            } => {
                let off = if *offset == 0 {
                    String::new()
                } else {
                    format!(" offset {offset}")
                };
                self.load(
                    *dreg,
                    format!("numgen random mod {modulus}{off}"),
                    Kind::Raw,
                    4,
                );
            }
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => {
                let src = self.text_of(*sreg);
                let zero = xor.iter().all(|b| *b == 0);
                let text = match (src.kind, prefix_len(mask)) {
                    // An address under a prefix mask: compared as a CIDR below.
                    (Kind::Ipv4 | Kind::Ipv6, Some(len)) if zero => {
                        let prefix = Some((len, value(src.kind, mask)));
                        self.load_prefix(*dreg, src.text, src.kind, src.len, prefix);
                        return;
                    }
                    _ if zero => format!("{} & {}", src.text, value(src.kind, mask)),
                    // mask all ones: flips the bits of xor.
                    _ if mask.iter().all(|b| *b == 0xff) => {
                        format!("{} ^ {}", src.text, value(src.kind, xor))
                    }
                    // mask ~x, xor x: sets the bits of x.
                    _ if mask.iter().zip(xor).all(|(m, x)| *m == !*x) => {
                        format!("{} | {}", src.text, value(src.kind, xor))
                    }
                    _ => format!(
                        "({} & {}) ^ {}",
                        src.text,
                        value(src.kind, mask),
                        value(src.kind, xor)
                    ),
                };
                self.load(*dreg, text, src.kind, src.len);
            }
            Expr::Cmp { sreg, op, data } => {
                let l = self.text_of(*sreg);
                let stmt = match &l.prefix {
                    Some((len, _)) => {
                        format!("{} {}{}/{len}", l.text, cmp_op(*op), value(l.kind, data))
                    }
                    None if l.text.contains(" & ") && data.iter().all(|b| *b == 0) => {
                        // `ct state & established != 0` reads `ct state established`.
                        let (field, bits) = l.text.split_once(" & ").unwrap_or((&l.text, ""));
                        match op {
                            CmpOp::Neq if matches!(l.kind, Kind::CtState | Kind::CtStatus) => {
                                format!("{field} {bits}")
                            }
                            CmpOp::Eq if matches!(l.kind, Kind::CtState | Kind::CtStatus) => {
                                format!("{field} != {bits}")
                            }
                            _ if *op == CmpOp::Eq => {
                                format!("{} == {}", l.text, value(l.kind, data))
                            }
                            _ => format!("{} {}{}", l.text, cmp_op(*op), value(l.kind, data)),
                        }
                    }
                    // After a binary operation nft writes `==` out.
                    None if *op == CmpOp::Eq
                        && [" & ", " | ", " ^ "].iter().any(|o| l.text.contains(o)) =>
                    {
                        format!("{} == {}", l.text, value(l.kind, data))
                    }
                    None => format!("{} {}{}", l.text, cmp_op(*op), value(l.kind, data)),
                };
                self.out.push(stmt);
            }
            Expr::Lookup {
                set,
                sreg,
                dreg,
                invert,
            } => {
                let key = self.key_at(*sreg);
                match dreg {
                    None => {
                        let not = if *invert { "!= " } else { "" };
                        self.out.push(format!("{key} {not}@{set}"));
                    }
                    Some(d) if *d == Reg::VERDICT => self.out.push(format!("{key} vmap @{set}")),
                    // A data map: its value is used by what follows (dnat).
                    Some(d) => self.load(*d, format!("{key} map @{set}"), Kind::Raw, 4),
                }
            }
            Expr::Immediate { dreg, data } => match data {
                ImmediateData::Verdict(v) => self.out.push(fmt_verdict(v)),
                ImmediateData::Value(b) => {
                    // Our rules load constants for marks and class numbers
                    // (host order); the reader cannot tell an address.
                    let kind = match b.len() {
                        4 => Kind::Hex32,
                        2 => Kind::Port,
                        _ => Kind::Raw,
                    };
                    self.load(*dreg, value(kind, b), kind, b.len());
                }
            },
            Expr::MetaSet { key, sreg } => {
                let (field, _, _) = meta_field(*key);
                let src = self.text_of(*sreg);
                self.out.push(format!("{field} set {}", src.text));
            }
            Expr::Dnat {
                family,
                reg_addr,
                reg_port,
            } => {
                let addr = self.text_of(*reg_addr);
                let f = family.nft_name();
                let stmt = match reg_port.map(|p| self.regs.get(&p.0).cloned()) {
                    // Address and port from one map lookup (its data spans
                    // both registers).
                    Some(_) if addr.text.contains(" map @") => {
                        format!("dnat {f} addr . port to {}", addr.text)
                    }
                    Some(port) => {
                        let port = port.map_or_else(|| "?".into(), |p| p.text);
                        if *family == Family::Ipv6 {
                            format!("dnat {f} to [{}]:{port}", addr.text)
                        } else {
                            format!("dnat {f} to {}:{port}", addr.text)
                        }
                    }
                    None => format!("dnat {f} to {}", addr.text),
                };
                self.out.push(stmt);
            }
            Expr::Masquerade { fully_random } => self.out.push(if *fully_random {
                "masquerade fully-random".into()
            } else {
                "masquerade".into()
            }),
            Expr::Reject(kind) => self.out.push(reject(self.family, kind)),
            Expr::Counter => self.out.push("counter".into()),
            Expr::Dynset {
                op,
                set,
                sreg_key,
                sreg_data,
                timeout_ms,
            } => {
                let o = match op {
                    DynsetOp::Add => "add",
                    DynsetOp::Update => "update",
                    DynsetOp::Delete => "delete",
                };
                let key = self.key_at(*sreg_key);
                let data = sreg_data
                    .map(|r| format!(" : {}", self.key_at(r)))
                    .unwrap_or_default();
                let t = timeout_ms
                    .map(|t| {
                        if t % 1000 == 0 {
                            format!(" timeout {}s", t / 1000)
                        } else {
                            format!(" timeout {t}ms")
                        }
                    })
                    .unwrap_or_default();
                self.out.push(format!("{o} @{set} {{ {key}{t}{data} }}"));
            }
        }
    }
}

/// The statements of a rule of `family`, as `nft list ruleset` writes them.
pub fn rule_text(family: Family, exprs: &[Expr]) -> String {
    let mut r = Reader {
        family,
        regs: BTreeMap::new(),
        seq: 0,
        out: Vec::new(),
    };
    for e in exprs {
        r.expr(e);
    }
    r.out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::Verdict;

    fn payload(base: PayloadBase, offset: u32, len: u32, dreg: Reg) -> Expr {
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        }
    }

    #[test]
    fn a_concatenated_verdict_map_lookup() {
        let exprs = [
            payload(PayloadBase::Network, 16, 4, Reg::r32(0)),
            Expr::Meta {
                key: MetaKey::L4Proto,
                dreg: Reg::r32(1),
            },
            payload(PayloadBase::Transport, 2, 2, Reg::r32(2)),
            Expr::Lookup {
                set: "service-ips".into(),
                sreg: Reg::r32(0),
                dreg: Some(Reg::VERDICT),
                invert: false,
            },
        ];
        assert_eq!(
            rule_text(Family::Ipv4, &exprs),
            "ip daddr . meta l4proto . th dport vmap @service-ips"
        );
    }

    #[test]
    fn prefixes_marks_interfaces_and_ct_state_read_as_nft_writes_them() {
        let exprs = [
            payload(PayloadBase::Network, 12, 4, Reg::r32(0)),
            Expr::Bitwise {
                sreg: Reg::r32(0),
                dreg: Reg::r32(0),
                mask: vec![255, 255, 0, 0],
                xor: vec![0; 4],
            },
            Expr::Cmp {
                sreg: Reg::r32(0),
                op: CmpOp::Neq,
                data: vec![10, 244, 0, 0],
            },
            Expr::Meta {
                key: MetaKey::IifName,
                dreg: Reg::r32(1),
            },
            Expr::Cmp {
                sreg: Reg::r32(1),
                op: CmpOp::Eq,
                data: b"veth".to_vec(),
            },
            Expr::Ct {
                key: CtKey::State,
                dreg: Reg::r32(2),
            },
            Expr::Bitwise {
                sreg: Reg::r32(2),
                dreg: Reg::r32(2),
                mask: 8u32.to_ne_bytes().to_vec(),
                xor: vec![0; 4],
            },
            Expr::Cmp {
                sreg: Reg::r32(2),
                op: CmpOp::Neq,
                data: vec![0; 4],
            },
            Expr::Meta {
                key: MetaKey::Mark,
                dreg: Reg::r32(3),
            },
            Expr::Bitwise {
                sreg: Reg::r32(3),
                dreg: Reg::r32(3),
                mask: (!0x4000u32).to_ne_bytes().to_vec(),
                xor: 0x4000u32.to_ne_bytes().to_vec(),
            },
            Expr::MetaSet {
                key: MetaKey::Mark,
                sreg: Reg::r32(3),
            },
            Expr::Immediate {
                dreg: Reg::VERDICT,
                data: ImmediateData::Verdict(Verdict::Jump("mark-for-masquerade".into())),
            },
        ];
        assert_eq!(
            rule_text(Family::Ipv4, &exprs),
            "ip saddr != 10.244.0.0/16 iifname \"veth*\" ct state new \
             meta mark set meta mark | 0x00004000 jump mark-for-masquerade"
        );
    }

    #[test]
    fn dnat_through_a_map_and_an_affinity_update() {
        let exprs = [
            payload(PayloadBase::Network, 8, 16, Reg::r32(0)),
            Expr::Dynset {
                op: DynsetOp::Update,
                set: "affinity-x".into(),
                sreg_key: Reg::r32(0),
                sreg_data: None,
                timeout_ms: Some(10_800_000),
            },
            Expr::NumgenRandom {
                dreg: Reg::r32(0),
                modulus: 2,
                offset: 0,
            },
            Expr::Lookup {
                set: "endpoints-x".into(),
                sreg: Reg::r32(0),
                dreg: Some(Reg::r32(1)),
                invert: false,
            },
            Expr::Dnat {
                family: Family::Ipv6,
                reg_addr: Reg::r32(1),
                reg_port: Some(Reg::r32(5)),
            },
            Expr::Reject(RejectKind::IcmpUnreach(1)),
        ];
        assert_eq!(
            rule_text(Family::Ipv6, &exprs),
            "update @affinity-x { ip6 saddr timeout 10800s } \
             dnat ip6 addr . port to numgen random mod 2 map @endpoints-x \
             reject with icmpv6 admin-prohibited"
        );
    }

    #[test]
    fn unknown_fields_stay_visible_in_raw_syntax() {
        let exprs = [
            payload(PayloadBase::Network, 0, 1, Reg::r32(0)),
            Expr::Cmp {
                sreg: Reg::r32(0),
                op: CmpOp::Eq,
                data: vec![0x45],
            },
        ];
        assert_eq!(rule_text(Family::Ipv4, &exprs), "@nh,0,8 0x45");
    }

    #[test]
    fn prefix_lengths() {
        assert_eq!(prefix_len(&[255, 255, 0, 0]), Some(16));
        assert_eq!(prefix_len(&[255, 255, 255, 128]), Some(25));
        assert_eq!(prefix_len(&[0, 0, 0, 0]), Some(0));
        assert_eq!(prefix_len(&[255, 0, 255, 0]), None);
        assert_eq!(prefix_len(&[255; 4]), None);
        assert_eq!(prefix_len(&[255; 20]), None);
        assert_eq!(prefix_len(&[0; 20]), None);
    }
}
