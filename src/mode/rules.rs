//! A small builder that turns nft-like statements into kernel expressions, one
//! method per statement, so `mode/nftables.rs` reads like the ruleset it makes.

use std::net::IpAddr;

use ipnet::IpNet;
use kube_nlproxy_netlink::nft::{
    CmpOp, CtKey, DynsetOp, Expr, Family, FibAddr, FibResult, ImmediateData, MetaKey, PayloadBase,
    Reg, RejectKind, Rule, Verdict,
};

/// `ct state new` bit (`NF_CT_STATE_BIT(IP_CT_NEW)`).
const CT_STATE_NEW: u32 = 1 << 3;

/// `IPS_DST_NAT`, the conntrack status bit of a destination-NATed connection.
const IPS_DST_NAT: u32 = 1 << 5;

/// `RTN_LOCAL`, the address type of a local address.
const RTN_LOCAL: u32 = 2;

/// `NFT_REG_1`, the first 16-byte register; what `nft` uses for single loads.
const REG1: Reg = Reg(1);
/// `NFT_REG_2`.
const REG2: Reg = Reg(2);

/// Builds one rule.
#[derive(Debug, Clone)]
pub struct RuleBuilder {
    family: Family,
    exprs: Vec<Expr>,
}

/// One field of a concatenated key loaded from the packet or given as a constant.
#[derive(Debug, Clone, Copy)]
pub enum KeyField {
    /// `ip saddr`
    Saddr,
    /// `ip saddr & MASK` (the network of the source under a prefix length)
    SaddrMasked(u8),
    /// `ip daddr`
    Daddr,
    /// `meta l4proto`
    L4Proto,
    /// `th dport`
    Dport,
    /// a constant address
    Addr(IpAddr),
    /// a constant port (`inet_service`)
    Port(u16),
    /// a constant 32-bit value (`mark`)
    Mark(u32),
    /// `ct original ip daddr`: the destination before DNAT
    CtOriginalDaddr,
    /// `ct original proto-dst`: the destination port before DNAT
    CtOriginalDport,
}

impl RuleBuilder {
    /// Starts a rule for a table of `family`.
    pub fn new(family: Family) -> Self {
        RuleBuilder {
            family,
            exprs: Vec::new(),
        }
    }

    fn addr_offsets(&self) -> (u32, u32) {
        match self.family {
            Family::Ipv4 => (12, 16),
            Family::Ipv6 => (8, 24),
        }
    }

    fn load_addr(&mut self, source: bool, dreg: Reg) {
        let (saddr, daddr) = self.addr_offsets();
        self.exprs.push(Expr::Payload {
            base: PayloadBase::Network,
            offset: if source { saddr } else { daddr },
            len: self.family.addr_len(),
            dreg,
        });
    }

    fn match_addr(mut self, source: bool, net: &IpNet, op: CmpOp) -> Self {
        self.load_addr(source, REG1);
        let len = self.family.addr_len() as usize;
        if net.prefix_len() as usize != len * 8 {
            self.exprs.push(Expr::Bitwise {
                sreg: REG1,
                dreg: REG1,
                mask: ip_bytes(&net.netmask()),
                xor: vec![0; len],
            });
        }
        self.exprs.push(Expr::Cmp {
            sreg: REG1,
            op,
            data: ip_bytes(&net.network()),
        });
        self
    }

    /// `ip saddr NET`
    pub fn saddr_in(self, net: &IpNet) -> Self {
        self.match_addr(true, net, CmpOp::Eq)
    }

    /// `ip saddr != NET`
    pub fn saddr_not_in(self, net: &IpNet) -> Self {
        self.match_addr(true, net, CmpOp::Neq)
    }

    /// `ip daddr ADDR`
    pub fn daddr_eq(self, addr: IpAddr) -> Self {
        let net = IpNet::from(addr);
        self.match_addr(false, &net, CmpOp::Eq)
    }

    /// `ip daddr NET`
    pub fn daddr_in(self, net: &IpNet) -> Self {
        self.match_addr(false, net, CmpOp::Eq)
    }

    /// `ip daddr != NET`
    pub fn daddr_not_in(self, net: &IpNet) -> Self {
        self.match_addr(false, net, CmpOp::Neq)
    }

    /// `ip saddr ADDR`
    pub fn saddr_eq(self, addr: IpAddr) -> Self {
        let net = IpNet::from(addr);
        self.match_addr(true, &net, CmpOp::Eq)
    }

    /// `meta l4proto PROTO`
    pub fn l4proto(mut self, proto: u8) -> Self {
        self.exprs.push(Expr::Meta {
            key: MetaKey::L4Proto,
            dreg: REG1,
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG1,
            op: CmpOp::Eq,
            data: vec![proto],
        });
        self
    }

    /// `th dport PORT`
    pub fn dport(mut self, port: u16) -> Self {
        self.exprs.push(Expr::Payload {
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
            dreg: REG1,
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG1,
            op: CmpOp::Eq,
            data: port.to_be_bytes().to_vec(),
        });
        self
    }

    /// `ct KEY & BITS != 0`
    fn ct_bits_set(mut self, key: CtKey, bits: u32) -> Self {
        self.exprs.push(Expr::Ct { key, dreg: REG1 });
        self.exprs.push(Expr::Bitwise {
            sreg: REG1,
            dreg: REG1,
            mask: bits.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG1,
            op: CmpOp::Neq,
            data: vec![0; 4],
        });
        self
    }

    /// `ct state new`
    pub fn ct_state_new(self) -> Self {
        self.ct_bits_set(CtKey::State, CT_STATE_NEW)
    }

    /// `fib ADDR type local` (`op` Eq) or `type != local` (`op` Neq).
    fn fib_local(mut self, addr: FibAddr, op: CmpOp) -> Self {
        self.exprs.push(Expr::Fib {
            addr,
            result: FibResult::AddrType,
            dreg: REG1,
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG1,
            op,
            data: RTN_LOCAL.to_ne_bytes().to_vec(),
        });
        self
    }

    /// `fib saddr type local`
    pub fn fib_saddr_local(self) -> Self {
        self.fib_local(FibAddr::Source, CmpOp::Eq)
    }

    /// `fib daddr type local`
    pub fn fib_daddr_local(self) -> Self {
        self.fib_local(FibAddr::Destination, CmpOp::Eq)
    }

    fn ifname(mut self, name: &str, exact: bool, op: CmpOp) -> Self {
        self.exprs.push(Expr::Meta {
            key: MetaKey::IifName,
            dreg: REG1,
        });
        let mut data = name.as_bytes().to_vec();
        if exact {
            data.push(0);
        }
        self.exprs.push(Expr::Cmp {
            sreg: REG1,
            op,
            data,
        });
        self
    }

    /// `iifname NAME` (`negate`: `!=`)
    pub fn iifname(self, name: &str, negate: bool) -> Self {
        self.ifname(name, true, if negate { CmpOp::Neq } else { CmpOp::Eq })
    }

    /// `iifname PREFIX*` (`negate`: `!=`)
    pub fn iifname_prefix(self, prefix: &str, negate: bool) -> Self {
        self.ifname(prefix, false, if negate { CmpOp::Neq } else { CmpOp::Eq })
    }

    /// `meta mark & BITS == 0`
    pub fn mark_bits_clear(mut self, bits: u32) -> Self {
        self.exprs.push(Expr::Meta {
            key: MetaKey::Mark,
            dreg: REG1,
        });
        self.exprs.push(Expr::Bitwise {
            sreg: REG1,
            dreg: REG1,
            mask: bits.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG1,
            op: CmpOp::Eq,
            data: vec![0; 4],
        });
        self
    }

    /// `meta mark set meta mark | BITS`
    pub fn mark_set_or(self, bits: u32) -> Self {
        self.mark_set(!bits, bits)
    }

    /// `meta mark set meta mark ^ BITS`
    pub fn mark_set_xor(self, bits: u32) -> Self {
        self.mark_set(u32::MAX, bits)
    }

    fn mark_set(mut self, mask: u32, xor: u32) -> Self {
        self.exprs.push(Expr::Meta {
            key: MetaKey::Mark,
            dreg: REG1,
        });
        self.exprs.push(Expr::Bitwise {
            sreg: REG1,
            dreg: REG1,
            mask: mask.to_ne_bytes().to_vec(),
            xor: xor.to_ne_bytes().to_vec(),
        });
        self.exprs.push(Expr::MetaSet {
            key: MetaKey::Mark,
            sreg: REG1,
        });
        self
    }

    /// Loads a concatenation into consecutive 32-bit registers starting at
    /// `NFT_REG32_00`; returns the first register.
    fn load_concat(&mut self, fields: &[KeyField]) -> Reg {
        self.load_concat_at(fields, 0)
    }

    /// Loads a concatenation into consecutive 32-bit registers starting at
    /// `NFT_REG32_00 + start`; returns the first register.
    fn load_concat_at(&mut self, fields: &[KeyField], start: u32) -> Reg {
        let mut next = start;
        for field in fields {
            let reg = Reg::r32(next);
            let len = match *field {
                KeyField::Saddr | KeyField::Daddr => {
                    self.load_addr(matches!(field, KeyField::Saddr), reg);
                    self.family.addr_len()
                }
                KeyField::SaddrMasked(prefix) => {
                    self.load_addr(true, reg);
                    let len = self.family.addr_len();
                    let bits = u32::from(prefix).min(len * 8);
                    let mask: Vec<u8> = (0..len)
                        .map(|i| {
                            let on = bits.saturating_sub(i * 8).min(8);
                            if on == 0 { 0 } else { 0xffu8 << (8 - on) }
                        })
                        .collect();
                    self.exprs.push(Expr::Bitwise {
                        sreg: reg,
                        dreg: reg,
                        mask,
                        xor: vec![0; len as usize],
                    });
                    len
                }
                KeyField::L4Proto => {
                    self.exprs.push(Expr::Meta {
                        key: MetaKey::L4Proto,
                        dreg: reg,
                    });
                    1
                }
                KeyField::Dport => {
                    self.exprs.push(Expr::Payload {
                        base: PayloadBase::Transport,
                        offset: 2,
                        len: 2,
                        dreg: reg,
                    });
                    2
                }
                KeyField::Addr(addr) => {
                    let bytes = ip_bytes(&addr);
                    let len = bytes.len() as u32;
                    self.exprs.push(Expr::Immediate {
                        dreg: reg,
                        data: ImmediateData::Value(bytes),
                    });
                    len
                }
                KeyField::Port(port) => {
                    let mut bytes = port.to_be_bytes().to_vec();
                    bytes.extend([0, 0]);
                    self.exprs.push(Expr::Immediate {
                        dreg: reg,
                        data: ImmediateData::Value(bytes),
                    });
                    4
                }
                KeyField::CtOriginalDaddr => {
                    self.exprs.push(Expr::Ct {
                        key: match self.family {
                            Family::Ipv4 => CtKey::OriginalDstIp,
                            Family::Ipv6 => CtKey::OriginalDstIp6,
                        },
                        dreg: reg,
                    });
                    self.family.addr_len()
                }
                KeyField::CtOriginalDport => {
                    self.exprs.push(Expr::Ct {
                        key: CtKey::OriginalProtoDst,
                        dreg: reg,
                    });
                    2
                }
                KeyField::Mark(value) => {
                    self.exprs.push(Expr::Immediate {
                        dreg: reg,
                        data: ImmediateData::Value(value.to_ne_bytes().to_vec()),
                    });
                    4
                }
            };
            next += len.div_ceil(4);
        }
        Reg::r32(start)
    }

    /// Loads `fields` into the 32-bit registers from `NFT_REG32_00 + start` on, for
    /// a later [`lookup_reg`](Self::lookup_reg) or [`dynset_reg`](Self::dynset_reg).
    pub fn load_at(mut self, fields: &[KeyField], start: u32) -> Self {
        self.load_concat_at(fields, start);
        self
    }

    /// `FIELDS map @MAP` into the registers from `dreg` on (a data map lookup; the
    /// rule stops when the key is not in the map).
    pub fn map_lookup(mut self, fields: &[KeyField], map: &str, dreg: Reg) -> Self {
        let sreg = self.load_concat(fields);
        self.exprs.push(Expr::Lookup {
            set: map.to_string(),
            sreg,
            dreg: Some(dreg),
            invert: false,
        });
        self
    }

    /// A lookup of the key already in the registers from `sreg` on: membership
    /// (`dreg` None) or map data into `dreg`.
    pub fn lookup_reg(mut self, set: &str, sreg: Reg, dreg: Option<Reg>) -> Self {
        self.exprs.push(Expr::Lookup {
            set: set.to_string(),
            sreg,
            dreg,
            invert: false,
        });
        self
    }

    /// `REG == VALUE` for a 32-bit value in host order (a map's `mark` data).
    pub fn reg_eq(mut self, reg: Reg, value: u32) -> Self {
        self.exprs.push(Expr::Cmp {
            sreg: reg,
            op: CmpOp::Eq,
            data: value.to_ne_bytes().to_vec(),
        });
        self
    }

    /// A 32-bit constant (host order, a `mark` key field) into `dreg`.
    pub fn value_into(mut self, dreg: Reg, value: u32) -> Self {
        self.exprs.push(Expr::Immediate {
            dreg,
            data: ImmediateData::Value(value.to_ne_bytes().to_vec()),
        });
        self
    }

    /// `numgen random mod MODULUS` into `dreg`.
    pub fn numgen_into(mut self, dreg: Reg, modulus: u32) -> Self {
        self.exprs.push(Expr::NumgenRandom {
            dreg,
            modulus,
            offset: 0,
        });
        self
    }

    /// `add|update|delete @SET { KEY : DATA timeout T }` with key and data already
    /// in registers.
    pub fn dynset_reg(
        mut self,
        op: DynsetOp,
        set: &str,
        sreg_key: Reg,
        sreg_data: Option<Reg>,
        timeout_secs: Option<u32>,
    ) -> Self {
        self.exprs.push(Expr::Dynset {
            op,
            set: set.to_string(),
            sreg_key,
            sreg_data,
            timeout_ms: timeout_secs.map(|t| u64::from(t) * 1000),
        });
        self
    }

    /// `dnat to ADDR:PORT` with the address in `reg_addr` and the port in `reg_port`.
    pub fn dnat_regs(mut self, reg_addr: Reg, reg_port: Reg) -> Self {
        self.exprs.push(Expr::Dnat {
            family: self.family,
            reg_addr,
            reg_port: Some(reg_port),
        });
        self
    }

    /// `ct status dnat`
    pub fn ct_status_dnat(self) -> Self {
        self.ct_bits_set(CtKey::Status, IPS_DST_NAT)
    }

    /// `fib saddr type != local`
    pub fn fib_saddr_not_local(self) -> Self {
        self.fib_local(FibAddr::Source, CmpOp::Neq)
    }

    /// `FIELDS vmap @MAP`
    pub fn vmap(mut self, fields: &[KeyField], map: &str) -> Self {
        let sreg = self.load_concat(fields);
        self.exprs.push(Expr::Lookup {
            set: map.to_string(),
            sreg,
            dreg: Some(Reg::VERDICT),
            invert: false,
        });
        self
    }

    /// `FIELDS @SET` (or `!= @SET`)
    pub fn in_set(mut self, fields: &[KeyField], set: &str, invert: bool) -> Self {
        let sreg = self.load_concat(fields);
        self.exprs.push(Expr::Lookup {
            set: set.to_string(),
            sreg,
            dreg: None,
            invert,
        });
        self
    }

    /// `update @SET { FIELDS timeout Ns }`
    pub fn update_set(mut self, fields: &[KeyField], set: &str, timeout_secs: u32) -> Self {
        let sreg_key = self.load_concat(fields);
        self.exprs.push(Expr::Dynset {
            op: DynsetOp::Update,
            set: set.to_string(),
            sreg_key,
            sreg_data: None,
            timeout_ms: Some(u64::from(timeout_secs) * 1000),
        });
        self
    }

    /// `numgen random mod MODULUS == 0`
    pub fn numgen_zero(mut self, modulus: u32) -> Self {
        self.exprs.push(Expr::NumgenRandom {
            dreg: REG1,
            modulus,
            offset: 0,
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG1,
            op: CmpOp::Eq,
            data: vec![0; 4],
        });
        self
    }

    /// `dnat to ADDR:PORT` (the caller matches `meta l4proto` first, as nft requires).
    pub fn dnat(mut self, addr: IpAddr, port: u16) -> Self {
        self.exprs.push(Expr::Immediate {
            dreg: REG1,
            data: ImmediateData::Value(ip_bytes(&addr)),
        });
        self.exprs.push(Expr::Immediate {
            dreg: REG2,
            data: ImmediateData::Value(port.to_be_bytes().to_vec()),
        });
        self.exprs.push(Expr::Dnat {
            family: self.family,
            reg_addr: REG1,
            reg_port: Some(REG2),
        });
        self
    }

    /// `masquerade fully-random`
    pub fn masquerade_fully_random(mut self) -> Self {
        self.exprs.push(Expr::Masquerade { fully_random: true });
        self
    }

    /// `reject` (ICMP port unreachable of the family)
    pub fn reject(mut self) -> Self {
        let code = match self.family {
            Family::Ipv4 => 3,
            Family::Ipv6 => 4,
        };
        self.exprs.push(Expr::Reject(RejectKind::IcmpUnreach(code)));
        self
    }

    /// A final verdict: `accept`, `drop`, `return`, `jump C`, `goto C`.
    pub fn verdict(mut self, verdict: Verdict) -> Self {
        self.exprs.push(Expr::Immediate {
            dreg: Reg::VERDICT,
            data: ImmediateData::Verdict(verdict),
        });
        self
    }

    /// Finishes the rule in `chain`.
    pub fn build(self, chain: &str, comment: Option<&str>) -> Rule {
        Rule {
            chain: chain.to_string(),
            exprs: self.exprs,
            comment: comment.map(str::to_string),
        }
    }
}

fn ip_bytes(addr: &IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}
