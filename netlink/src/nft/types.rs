//! The nf_tables object model we program: tables, chains, sets/maps, elements and
//! rules made of kernel expressions. Values only; encoding lives in `codec.rs`, the
//! socket in `socket.rs`.
//!
//! The expression enum mirrors the kernel's expression types one to one
//! (`linux/netfilter/nf_tables.h`), so what we send is exactly what `nft` would send
//! for the same rule.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// Table family (`nfgenmsg.nfgen_family`): `NFPROTO_IPV4` or `NFPROTO_IPV6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// `table ip …`
    Ipv4,
    /// `table ip6 …`
    Ipv6,
}

impl Family {
    /// The `NFPROTO_*` number.
    pub fn nfproto(self) -> u8 {
        match self {
            Family::Ipv4 => libc::NFPROTO_IPV4 as u8,
            Family::Ipv6 => libc::NFPROTO_IPV6 as u8,
        }
    }

    /// The family of an address.
    pub fn of(addr: &IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::Ipv4,
            IpAddr::V6(_) => Family::Ipv6,
        }
    }

    /// `ip` or `ip6`, as `nft` prints it.
    pub fn nft_name(self) -> &'static str {
        match self {
            Family::Ipv4 => "ip",
            Family::Ipv6 => "ip6",
        }
    }

    /// Address length in bytes.
    pub fn addr_len(self) -> u32 {
        match self {
            Family::Ipv4 => 4,
            Family::Ipv6 => 16,
        }
    }
}

/// Netfilter hook of a base chain (`NF_INET_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// `NF_INET_PRE_ROUTING`
    Prerouting,
    /// `NF_INET_LOCAL_IN`
    Input,
    /// `NF_INET_FORWARD`
    Forward,
    /// `NF_INET_LOCAL_OUT`
    Output,
    /// `NF_INET_POST_ROUTING`
    Postrouting,
}

impl Hook {
    /// The `NF_INET_*` number.
    pub fn number(self) -> u32 {
        match self {
            Hook::Prerouting => 0,
            Hook::Input => 1,
            Hook::Forward => 2,
            Hook::Output => 3,
            Hook::Postrouting => 4,
        }
    }

    /// Inverse of [`Hook::number`].
    pub fn from_number(n: u32) -> Option<Hook> {
        Some(match n {
            0 => Hook::Prerouting,
            1 => Hook::Input,
            2 => Hook::Forward,
            3 => Hook::Output,
            4 => Hook::Postrouting,
            _ => return None,
        })
    }
}

/// Base chain type (`NFTA_CHAIN_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainType {
    /// `type filter`
    Filter,
    /// `type nat`
    Nat,
}

impl ChainType {
    /// The kernel's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        }
    }
}

/// What makes a chain a base chain: attached to a hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseChain {
    /// `type filter|nat`
    pub kind: ChainType,
    /// `hook …`
    pub hook: Hook,
    /// `priority …` (e.g. -100 for dstnat, 100 for srcnat)
    pub priority: i32,
}

/// A chain; `base` is `None` for a regular chain reached by jump/goto.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    /// Chain name (≤ 255 bytes).
    pub name: String,
    /// Hook attachment, for base chains.
    pub base: Option<BaseChain>,
    /// Human comment, kept in the chain's userdata like `nft … { comment "…" }`.
    pub comment: Option<String>,
}

/// One field of a set key, with nft's datatype numbering (`TYPE_*` in nftables'
/// `datatype.h`) so `nft list` prints the set like one it made itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// `ipv4_addr` (4 bytes)
    Ipv4Addr,
    /// `ipv6_addr` (16 bytes)
    Ipv6Addr,
    /// `inet_proto` (1 byte, padded to 4 in registers)
    InetProto,
    /// `inet_service` (2 bytes big endian, padded to 4)
    InetService,
    /// `mark` (4 bytes host order)
    Mark,
}

impl KeyType {
    /// nft datatype number (`TYPE_IPADDR` = 7 …).
    pub fn nft_type(self) -> u32 {
        match self {
            KeyType::Ipv4Addr => 7,
            KeyType::Ipv6Addr => 8,
            KeyType::InetProto => 12,
            KeyType::InetService => 13,
            KeyType::Mark => 19,
        }
    }

    /// Unpadded length in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(self) -> u32 {
        match self {
            KeyType::Ipv4Addr => 4,
            KeyType::Ipv6Addr => 16,
            KeyType::InetProto => 1,
            KeyType::InetService => 2,
            KeyType::Mark => 4,
        }
    }

    /// Length rounded up to the 4-byte register size, as it sits in a concatenation.
    pub fn padded_len(self) -> u32 {
        self.len().div_ceil(4) * 4
    }

    /// The address key type of a family.
    pub fn addr(family: Family) -> KeyType {
        match family {
            Family::Ipv4 => KeyType::Ipv4Addr,
            Family::Ipv6 => KeyType::Ipv6Addr,
        }
    }
}

/// One field value of an element key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyValue {
    /// An IPv4 or IPv6 address.
    Addr(IpAddr),
    /// An IP protocol number (6 tcp, 17 udp, 132 sctp).
    Proto(u8),
    /// A transport port.
    Port(u16),
    /// A 32-bit mark / integer.
    Mark(u32),
}

impl KeyValue {
    /// Bytes as the kernel keeps them in a register (big endian for addresses and
    /// ports, zero padded to a multiple of 4).
    pub fn padded_bytes(&self) -> Vec<u8> {
        let mut v = match self {
            KeyValue::Addr(IpAddr::V4(a)) => a.octets().to_vec(),
            KeyValue::Addr(IpAddr::V6(a)) => a.octets().to_vec(),
            KeyValue::Proto(p) => vec![*p],
            KeyValue::Port(p) => p.to_be_bytes().to_vec(),
            KeyValue::Mark(m) => m.to_ne_bytes().to_vec(),
        };
        v.resize(v.len().div_ceil(4) * 4, 0);
        v
    }

    /// Decode one field of type `ty` from the front of `bytes` (padded layout).
    pub fn parse(ty: KeyType, bytes: &[u8]) -> Option<KeyValue> {
        let len = ty.len() as usize;
        if bytes.len() < len {
            return None;
        }
        Some(match ty {
            KeyType::Ipv4Addr => KeyValue::Addr(IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(&bytes[..4]).ok()?,
            ))),
            KeyType::Ipv6Addr => KeyValue::Addr(IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&bytes[..16]).ok()?,
            ))),
            KeyType::InetProto => KeyValue::Proto(bytes[0]),
            KeyType::InetService => KeyValue::Port(u16::from_be_bytes([bytes[0], bytes[1]])),
            KeyType::Mark => KeyValue::Mark(u32::from_ne_bytes(bytes[..4].try_into().ok()?)),
        })
    }
}

/// Set flags we use (`NFT_SET_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SetFlags {
    /// `NFT_SET_TIMEOUT`: elements may expire.
    pub timeout: bool,
    /// `NFT_SET_EVAL` (`dynamic`): the packet path may add elements (dynset).
    pub dynamic: bool,
}

/// A named set, or a map when `verdict_map` is set (`NFT_SET_MAP` with data type
/// verdict).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Set {
    /// Set name.
    pub name: String,
    /// Key fields; more than one makes a concatenation.
    pub key: Vec<KeyType>,
    /// `true` for `type … : verdict` maps.
    pub verdict_map: bool,
    /// Data fields of a data map (`type … : ipv4_addr . inet_service`); empty for
    /// sets and verdict maps. More than one field makes a concatenation.
    pub data: Vec<KeyType>,
    /// Flags.
    pub flags: SetFlags,
    /// Default element timeout in milliseconds (needs `flags.timeout`).
    pub timeout_ms: Option<u64>,
}

impl Set {
    /// Total key length in bytes (`NFTA_SET_KEY_LEN`).
    pub fn key_len(&self) -> u32 {
        self.key.iter().map(|k| k.padded_len()).sum()
    }

    /// Total data length in bytes of a data map (`NFTA_SET_DATA_LEN`).
    pub fn data_len(&self) -> u32 {
        self.data.iter().map(|k| k.padded_len()).sum()
    }

    /// Whether elements carry data (verdict or value): `NFT_SET_MAP`.
    pub fn is_map(&self) -> bool {
        self.verdict_map || !self.data.is_empty()
    }
}

/// A verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// `NF_ACCEPT`
    Accept,
    /// `NF_DROP`
    Drop,
    /// `NFT_RETURN`
    Return,
    /// `NFT_CONTINUE`
    Continue,
    /// `NFT_JUMP` to a chain
    Jump(String),
    /// `NFT_GOTO` a chain
    Goto(String),
}

impl Verdict {
    /// The chain this verdict references, if any.
    pub fn chain(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
            _ => None,
        }
    }
}

/// A set or map element.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    /// Key fields, one per [`Set::key`] entry.
    pub key: Vec<KeyValue>,
    /// Map data, for verdict maps.
    pub verdict: Option<Verdict>,
    /// Map data, for data maps: one value per [`Set::data`] field.
    pub data: Vec<KeyValue>,
    /// Human comment, kept in the element's userdata like `nft … comment "…"`.
    /// Shared: every element of a service port carries the same one.
    pub comment: Option<Arc<str>>,
}

impl Element {
    /// An element of a plain set.
    pub fn new(key: Vec<KeyValue>) -> Self {
        Element {
            key,
            verdict: None,
            data: Vec::new(),
            comment: None,
        }
    }

    /// A verdict-map element.
    pub fn with_verdict(mut self, verdict: Verdict) -> Self {
        self.verdict = Some(verdict);
        self
    }

    /// A data-map element.
    pub fn with_data(mut self, data: Vec<KeyValue>) -> Self {
        self.data = data;
        self
    }

    /// With a comment (`comment "…"`).
    pub fn with_comment(mut self, comment: impl Into<Arc<str>>) -> Self {
        self.comment = Some(comment.into());
        self
    }

    /// Data bytes in the kernel's padded, concatenated layout.
    pub fn data_bytes(&self) -> Vec<u8> {
        self.data.iter().flat_map(|k| k.padded_bytes()).collect()
    }

    /// Key bytes in the kernel's padded, concatenated layout.
    pub fn key_bytes(&self) -> Vec<u8> {
        self.key.iter().flat_map(|k| k.padded_bytes()).collect()
    }
}

/// A register. `Verdict` is register 0; the 32-bit registers are numbered as in
/// `enum nft_registers` (`NFT_REG32_00` = 8 … `NFT_REG32_15` = 23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reg(pub u32);

impl Reg {
    /// `NFT_REG_VERDICT`
    pub const VERDICT: Reg = Reg(0);

    /// `NFT_REG32_00 + n`
    pub const fn r32(n: u32) -> Reg {
        Reg(8 + n)
    }
}

/// `enum nft_payload_bases`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadBase {
    /// `NFT_PAYLOAD_LL_HEADER`
    LinkLayer,
    /// `NFT_PAYLOAD_NETWORK_HEADER`
    Network,
    /// `NFT_PAYLOAD_TRANSPORT_HEADER`
    Transport,
}

/// `enum nft_meta_keys` (the ones we use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaKey {
    /// `NFT_META_MARK`
    Mark,
    /// `NFT_META_IIFNAME`
    IifName,
    /// `NFT_META_OIFNAME`
    OifName,
    /// `NFT_META_NFPROTO`
    NfProto,
    /// `NFT_META_L4PROTO`
    L4Proto,
}

/// `enum nft_cmp_ops`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Neq,
    /// `<`
    Lt,
    /// `<=`
    Lte,
    /// `>`
    Gt,
    /// `>=`
    Gte,
}

/// `enum nft_ct_keys` (the ones we use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtKey {
    /// `NFT_CT_STATE` (bitmask: invalid 1, established 2, related 4, new 8, untracked 64)
    State,
    /// `NFT_CT_STATUS` (bitmask of `enum ip_conntrack_status`: `IPS_DST_NAT` = 0x20 …)
    Status,
    /// `ct original ip daddr` (`NFT_CT_DST_IP`, direction original)
    OriginalDstIp,
    /// `ct original ip6 daddr` (`NFT_CT_DST_IP6`, direction original)
    OriginalDstIp6,
    /// `ct original proto-dst` (`NFT_CT_PROTO_DST`, direction original)
    OriginalProtoDst,
}

/// Result of a `fib` lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FibResult {
    /// `NFT_FIB_RESULT_ADDRTYPE` (`RTN_LOCAL` = 2 …)
    AddrType,
}

/// Which address a `fib` lookup uses (`NFTA_FIB_F_SADDR` / `NFTA_FIB_F_DADDR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FibAddr {
    /// `fib saddr …`
    Source,
    /// `fib daddr …`
    Destination,
}

/// `reject` flavour (`enum nft_reject_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectKind {
    /// `NFT_REJECT_ICMP_UNREACH` with the family's code (`icmp port-unreachable` = 3,
    /// `icmpv6 port-unreachable` = 4).
    IcmpUnreach(u8),
    /// `NFT_REJECT_TCP_RST`
    TcpRst,
}

/// `enum nft_dynset_ops`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DynsetOp {
    /// `add @set { … }`
    Add,
    /// `update @set { … }` (refreshes the timeout)
    Update,
    /// `delete @set { … }`
    Delete,
}

/// One kernel expression, attributes as in `nf_tables.h`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `payload`: load `len` bytes at `offset` of a header into `dreg`.
    Payload {
        /// header
        base: PayloadBase,
        /// byte offset in the header
        offset: u32,
        /// length in bytes
        len: u32,
        /// destination register
        dreg: Reg,
    },
    /// `meta` load: `key` into `dreg`.
    Meta {
        /// key
        key: MetaKey,
        /// destination register
        dreg: Reg,
    },
    /// `meta` store: `meta key set` from `sreg`.
    MetaSet {
        /// key (only `Mark` makes sense here)
        key: MetaKey,
        /// source register
        sreg: Reg,
    },
    /// `cmp`: compare `sreg` with `data`; on mismatch the rule stops.
    Cmp {
        /// source register
        sreg: Reg,
        /// operator
        op: CmpOp,
        /// immediate data (its length is the compared length)
        data: Vec<u8>,
    },
    /// `bitwise` (mask/xor): `dreg = (sreg & mask) ^ xor`.
    Bitwise {
        /// source register
        sreg: Reg,
        /// destination register
        dreg: Reg,
        /// mask, `len` bytes
        mask: Vec<u8>,
        /// xor, `len` bytes
        xor: Vec<u8>,
    },
    /// `lookup`: key in `sreg` (set key length); with `dreg` a map lookup
    /// (`Reg::VERDICT` for verdict maps).
    Lookup {
        /// set name
        set: String,
        /// key register
        sreg: Reg,
        /// data register for maps
        dreg: Option<Reg>,
        /// `!=` lookup (`NFT_LOOKUP_F_INV`)
        invert: bool,
    },
    /// `immediate`: load a verdict (into `Reg::VERDICT`) or data.
    Immediate {
        /// destination register
        dreg: Reg,
        /// what to load
        data: ImmediateData,
    },
    /// `numgen random mod modulus offset offset` into `dreg`.
    NumgenRandom {
        /// destination register
        dreg: Reg,
        /// modulus
        modulus: u32,
        /// offset
        offset: u32,
    },
    /// `fib`: route lookup result into `dreg`.
    Fib {
        /// which address
        addr: FibAddr,
        /// what result
        result: FibResult,
        /// destination register
        dreg: Reg,
    },
    /// `ct` load.
    Ct {
        /// key
        key: CtKey,
        /// destination register
        dreg: Reg,
    },
    /// `dnat to <addr in reg_addr>[:<port in reg_port>]`.
    Dnat {
        /// family of the address
        family: Family,
        /// register holding the address
        reg_addr: Reg,
        /// register holding the port, if any
        reg_port: Option<Reg>,
    },
    /// `masquerade` (optionally `fully-random`).
    Masquerade {
        /// `NF_NAT_RANGE_PROTO_RANDOM_FULLY`
        fully_random: bool,
    },
    /// `reject`.
    Reject(RejectKind),
    /// `counter`.
    Counter,
    /// `dynset`: add/update the key in `sreg_key` to `set`, with a timeout.
    Dynset {
        /// operation
        op: DynsetOp,
        /// set name
        set: String,
        /// key register
        sreg_key: Reg,
        /// data register, for maps (`update @map { key : data }`)
        sreg_data: Option<Reg>,
        /// per-element timeout in milliseconds
        timeout_ms: Option<u64>,
    },
}

/// Data of an `immediate` expression.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ImmediateData {
    /// A verdict (with `Reg::VERDICT`).
    Verdict(Verdict),
    /// Raw bytes (with a data register).
    Value(Vec<u8>),
}

/// A rule: expressions evaluated in order in `chain`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Chain name.
    pub chain: String,
    /// Expressions.
    pub exprs: Vec<Expr>,
    /// Human comment, kept in the rule's userdata like `nft … comment "…"` does.
    pub comment: Option<String>,
}

/// A rule of a table we do not own (kube-proxy's, iptables-nft's), as far as
/// removing it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignRule {
    /// Table name.
    pub table: String,
    /// Chain name.
    pub chain: String,
    /// The kernel's handle (`nft -a`), to delete it by.
    pub handle: u64,
    /// The chains its verdicts jump to or go to.
    pub jumps_to: Vec<String>,
}

/// The chains and rules of a table we do not own, without its sets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ForeignTable {
    /// Chain names, in the kernel's order.
    pub chains: Vec<String>,
    /// Every rule, in the kernel's order.
    pub rules: Vec<ForeignRule>,
}
