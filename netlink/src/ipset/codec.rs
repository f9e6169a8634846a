//! Wire codec for ipset over nfnetlink (`NFNL_SUBSYS_IPSET`,
//! `linux/netfilter/ipset/ip_set.h`). No I/O.
//!
//! ```text
//! nlmsg_type = NFNL_SUBSYS_IPSET << 8 | IPSET_CMD_*
//! +-----------+------------+----------------+
//! | family u8 | version u8 | res_id be16    |   struct nfgenmsg
//! +-----------+------------+----------------+
//! | IPSET_ATTR_* ...                        |   Vec<IpsetAttr>
//! +-----------------------------------------+
//! ```
//!
//! The kernel insists on `NLA_F_NESTED` for `IPSET_ATTR_DATA`, `IPSET_ATTR_ADT`
//! and address nests, and on `NLA_F_NET_BYTEORDER` for every u16/u32 and address;
//! the attribute types set those flags themselves. `IPSET_ATTR_DATA` means
//! different things per command (set header for CREATE/LIST, element for
//! ADD/DEL/TEST), and the create-only and element-only attribute numbers overlap,
//! so attributes are parsed with the command as parameter.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, ErrorContext, NetlinkDeserializable, NetlinkHeader,
    NetlinkSerializable, Nla, NlaBuffer, NlasIterator, Parseable, ParseableParametrized,
    emit_u16_be, emit_u32_be, parse_string, parse_u8, parse_u16_be, parse_u32_be,
};

/// `NFNL_SUBSYS_IPSET`
pub const NFNL_SUBSYS_IPSET: u8 = 6;
/// `IPSET_PROTOCOL`: the newest protocol we speak.
pub const IPSET_PROTOCOL: u8 = 7;
/// `IPSET_PROTOCOL_MIN`: the oldest protocol we speak.
pub const IPSET_PROTOCOL_MIN: u8 = 6;
/// `IPSET_MAXNAMELEN` (including the NUL).
pub const IPSET_MAXNAMELEN: usize = 32;
/// `NFNETLINK_V0`
pub const NFNETLINK_V0: u8 = 0;
/// `NFPROTO_UNSPEC`
pub const NFPROTO_UNSPEC: u8 = 0;
/// `NFPROTO_IPV4`
pub const NFPROTO_IPV4: u8 = 2;
/// `NFPROTO_IPV6`
pub const NFPROTO_IPV6: u8 = 10;

/// `IPSET_CMD_PROTOCOL`
pub const IPSET_CMD_PROTOCOL: u8 = 1;
/// `IPSET_CMD_CREATE`
pub const IPSET_CMD_CREATE: u8 = 2;
/// `IPSET_CMD_DESTROY`
pub const IPSET_CMD_DESTROY: u8 = 3;
/// `IPSET_CMD_FLUSH`
pub const IPSET_CMD_FLUSH: u8 = 4;
/// `IPSET_CMD_RENAME`
pub const IPSET_CMD_RENAME: u8 = 5;
/// `IPSET_CMD_SWAP`
pub const IPSET_CMD_SWAP: u8 = 6;
/// `IPSET_CMD_LIST`
pub const IPSET_CMD_LIST: u8 = 7;
/// `IPSET_CMD_SAVE`
pub const IPSET_CMD_SAVE: u8 = 8;
/// `IPSET_CMD_ADD`
pub const IPSET_CMD_ADD: u8 = 9;
/// `IPSET_CMD_DEL`
pub const IPSET_CMD_DEL: u8 = 10;
/// `IPSET_CMD_TEST`
pub const IPSET_CMD_TEST: u8 = 11;
/// `IPSET_CMD_HEADER`
pub const IPSET_CMD_HEADER: u8 = 12;
/// `IPSET_CMD_TYPE`
pub const IPSET_CMD_TYPE: u8 = 13;

/// `IPSET_ATTR_PROTOCOL` (u8)
pub const IPSET_ATTR_PROTOCOL: u16 = 1;
/// `IPSET_ATTR_SETNAME` (string)
pub const IPSET_ATTR_SETNAME: u16 = 2;
/// `IPSET_ATTR_TYPENAME` (string)
pub const IPSET_ATTR_TYPENAME: u16 = 3;
/// `IPSET_ATTR_SETNAME2` (string, same number as `TYPENAME`)
pub const IPSET_ATTR_SETNAME2: u16 = 3;
/// `IPSET_ATTR_REVISION` (u8)
pub const IPSET_ATTR_REVISION: u16 = 4;
/// `IPSET_ATTR_FAMILY` (u8)
pub const IPSET_ATTR_FAMILY: u16 = 5;
/// `IPSET_ATTR_FLAGS` (be32)
pub const IPSET_ATTR_FLAGS: u16 = 6;
/// `IPSET_ATTR_DATA` (nested)
pub const IPSET_ATTR_DATA: u16 = 7;
/// `IPSET_ATTR_ADT` (nested list of `DATA`)
pub const IPSET_ATTR_ADT: u16 = 8;
/// `IPSET_ATTR_LINENO` (be32)
pub const IPSET_ATTR_LINENO: u16 = 9;
/// `IPSET_ATTR_PROTOCOL_MIN` / `IPSET_ATTR_REVISION_MIN` (u8)
pub const IPSET_ATTR_PROTOCOL_MIN: u16 = 10;
/// `IPSET_ATTR_INDEX` (be16)
pub const IPSET_ATTR_INDEX: u16 = 11;

/// `IPSET_ATTR_IP` / `IPSET_ATTR_IP_FROM` (nested address)
pub const IPSET_ATTR_IP: u16 = 1;
/// `IPSET_ATTR_IP_TO` (nested address)
pub const IPSET_ATTR_IP_TO: u16 = 2;
/// `IPSET_ATTR_CIDR` (u8)
pub const IPSET_ATTR_CIDR: u16 = 3;
/// `IPSET_ATTR_PORT` / `IPSET_ATTR_PORT_FROM` (be16)
pub const IPSET_ATTR_PORT: u16 = 4;
/// `IPSET_ATTR_PORT_TO` (be16)
pub const IPSET_ATTR_PORT_TO: u16 = 5;
/// `IPSET_ATTR_TIMEOUT` (be32)
pub const IPSET_ATTR_TIMEOUT: u16 = 6;
/// `IPSET_ATTR_PROTO` (u8)
pub const IPSET_ATTR_PROTO: u16 = 7;
/// `IPSET_ATTR_CADT_FLAGS` (be32)
pub const IPSET_ATTR_CADT_FLAGS: u16 = 8;
/// `IPSET_ATTR_INITVAL` (be32, create only)
pub const IPSET_ATTR_INITVAL: u16 = 17;
/// `IPSET_ATTR_HASHSIZE` (be32, create only)
pub const IPSET_ATTR_HASHSIZE: u16 = 18;
/// `IPSET_ATTR_MAXELEM` (be32, create only)
pub const IPSET_ATTR_MAXELEM: u16 = 19;
/// `IPSET_ATTR_NETMASK` (u8, create only)
pub const IPSET_ATTR_NETMASK: u16 = 20;
/// `IPSET_ATTR_BUCKETSIZE` (u8, create only)
pub const IPSET_ATTR_BUCKETSIZE: u16 = 21;
/// `IPSET_ATTR_RESIZE` (u8, create only)
pub const IPSET_ATTR_RESIZE: u16 = 22;
/// `IPSET_ATTR_SIZE` (be32, create only)
pub const IPSET_ATTR_SIZE: u16 = 23;
/// `IPSET_ATTR_ELEMENTS` (be32, list header)
pub const IPSET_ATTR_ELEMENTS: u16 = 24;
/// `IPSET_ATTR_REFERENCES` (be32, list header)
pub const IPSET_ATTR_REFERENCES: u16 = 25;
/// `IPSET_ATTR_MEMSIZE` (be32, list header)
pub const IPSET_ATTR_MEMSIZE: u16 = 26;
/// `IPSET_ATTR_IP2` (nested address, element)
pub const IPSET_ATTR_IP2: u16 = 20;
/// `IPSET_ATTR_CIDR2` (u8, element)
pub const IPSET_ATTR_CIDR2: u16 = 21;
/// `IPSET_ATTR_COMMENT` (string, element)
pub const IPSET_ATTR_COMMENT: u16 = 26;
/// `IPSET_ATTR_IPADDR_IPV4` (inside an address nest)
pub const IPSET_ATTR_IPADDR_IPV4: u16 = 1;
/// `IPSET_ATTR_IPADDR_IPV6` (inside an address nest)
pub const IPSET_ATTR_IPADDR_IPV6: u16 = 2;

/// `IPSET_FLAG_LIST_SETNAME`: list names only.
pub const IPSET_FLAG_LIST_SETNAME: u32 = 1 << 1;
/// `IPSET_FLAG_LIST_HEADER`: list headers only.
pub const IPSET_FLAG_LIST_HEADER: u32 = 1 << 2;

/// `IPSET_ERR_PRIVATE`: first ipset-specific errno.
pub const IPSET_ERR_PRIVATE: i32 = 4096;
/// `IPSET_ERR_EXIST`: element/set exists (add, create) or is missing (del, test).
pub const IPSET_ERR_EXIST: i32 = 4103;

/// Text for an ipset-specific errno (`IPSET_ERR_*`), as the `ipset` CLI prints.
pub fn ipset_strerror(errno: i32) -> Option<&'static str> {
    Some(match errno {
        4097 => "protocol version not supported",
        4098 => "set type not supported (or revision)",
        4099 => "maximal number of sets reached",
        4100 => "set is in use by a kernel component",
        4101 => "second set does not exist",
        4102 => "sets to swap have incompatible types",
        4103 => "element or set already exists / does not exist",
        4104 => "invalid CIDR",
        4105 => "invalid netmask",
        4106 => "invalid protocol family",
        4107 => "timeout not supported by the set",
        4108 => "set is referenced and cannot be destroyed",
        4109 => "invalid IPv4 address",
        4110 => "invalid IPv6 address",
        4111 => "counters not supported by the set",
        4112 => "comment not supported by the set",
        4113 => "invalid markmask",
        4114 => "skbinfo not supported by the set",
        4352 => "hash is full / bitmap range error",
        4353 => "null-valued element / range size",
        4354 => "invalid protocol",
        4355 => "missing protocol",
        4356 => "range not supported",
        4357 => "invalid range",
        _ => return None,
    })
}

fn nla_kind_ok(nla: &NlaBuffer<&[u8]>) -> u16 {
    nla.kind()
}

fn be16(v: &[u8], what: &str) -> Result<u16, DecodeError> {
    parse_u16_be(v).with_context(|| format!("invalid {what}"))
}
fn be32(v: &[u8], what: &str) -> Result<u32, DecodeError> {
    parse_u32_be(v).with_context(|| format!("invalid {what}"))
}
fn u8_of(v: &[u8], what: &str) -> Result<u8, DecodeError> {
    parse_u8(v).with_context(|| format!("invalid {what}"))
}
fn string_len(s: &str) -> usize {
    s.len() + 1
}
fn emit_string(buf: &mut [u8], s: &str) {
    buf[..s.len()].copy_from_slice(s.as_bytes());
    buf[s.len()] = 0;
}

/// An address nest (`IPSET_ATTR_IP`, `IP_TO`, `IP2`): one
/// `IPSET_ATTR_IPADDR_IPV4|6` with `NLA_F_NET_BYTEORDER`.
fn addr_value_len(a: &IpAddr) -> usize {
    4 + if a.is_ipv4() { 4 } else { 16 }
}

fn emit_addr(buf: &mut [u8], a: &IpAddr) {
    let inner = AddrNla(*a);
    inner.emit(buf);
}

struct AddrNla(IpAddr);

impl Nla for AddrNla {
    fn value_len(&self) -> usize {
        if self.0.is_ipv4() { 4 } else { 16 }
    }
    fn kind(&self) -> u16 {
        if self.0.is_ipv4() {
            IPSET_ATTR_IPADDR_IPV4
        } else {
            IPSET_ATTR_IPADDR_IPV6
        }
    }
    fn is_network_byteorder(&self) -> bool {
        true
    }
    fn emit_value(&self, buf: &mut [u8]) {
        match self.0 {
            IpAddr::V4(a) => buf[..4].copy_from_slice(&a.octets()),
            IpAddr::V6(a) => buf[..16].copy_from_slice(&a.octets()),
        }
    }
}

fn parse_addr(v: &[u8], what: &str) -> Result<IpAddr, DecodeError> {
    for nla in NlasIterator::new(v) {
        let nla = nla.with_context(|| format!("invalid {what} nest"))?;
        let val = nla.value();
        match nla_kind_ok(&nla) {
            IPSET_ATTR_IPADDR_IPV4 if val.len() == 4 => {
                return Ok(Ipv4Addr::new(val[0], val[1], val[2], val[3]).into());
            }
            IPSET_ATTR_IPADDR_IPV6 if val.len() == 16 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(val);
                return Ok(Ipv6Addr::from(o).into());
            }
            _ => {}
        }
    }
    Err(format!("{what}: no IPv4/IPv6 address inside").into())
}

/// An attribute of a set header: `IPSET_ATTR_DATA` of CREATE and of LIST replies.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderAttr {
    /// `IPSET_ATTR_IP` (range start of bitmap:ip)
    Ip(IpAddr),
    /// `IPSET_ATTR_IP_TO`
    IpTo(IpAddr),
    /// `IPSET_ATTR_CIDR`
    Cidr(u8),
    /// `IPSET_ATTR_PORT` (bitmap:port range start)
    Port(u16),
    /// `IPSET_ATTR_PORT_TO` (bitmap:port range end)
    PortTo(u16),
    /// `IPSET_ATTR_TIMEOUT` (default element timeout)
    Timeout(u32),
    /// `IPSET_ATTR_CADT_FLAGS`
    CadtFlags(u32),
    /// `IPSET_ATTR_INITVAL`
    InitVal(u32),
    /// `IPSET_ATTR_HASHSIZE`
    HashSize(u32),
    /// `IPSET_ATTR_MAXELEM`
    MaxElem(u32),
    /// `IPSET_ATTR_NETMASK`
    Netmask(u8),
    /// `IPSET_ATTR_BUCKETSIZE`
    BucketSize(u8),
    /// `IPSET_ATTR_SIZE`
    Size(u32),
    /// `IPSET_ATTR_ELEMENTS`
    Elements(u32),
    /// `IPSET_ATTR_REFERENCES`
    References(u32),
    /// `IPSET_ATTR_MEMSIZE`
    MemSize(u32),
    /// Anything else.
    Other(DefaultNla),
}

impl Nla for HeaderAttr {
    fn value_len(&self) -> usize {
        match self {
            HeaderAttr::Ip(a) | HeaderAttr::IpTo(a) => addr_value_len(a),
            HeaderAttr::Cidr(_) | HeaderAttr::Netmask(_) | HeaderAttr::BucketSize(_) => 1,
            HeaderAttr::Port(_) | HeaderAttr::PortTo(_) => 2,
            HeaderAttr::Other(n) => n.value_len(),
            _ => 4,
        }
    }
    fn kind(&self) -> u16 {
        match self {
            HeaderAttr::Ip(_) => IPSET_ATTR_IP,
            HeaderAttr::IpTo(_) => IPSET_ATTR_IP_TO,
            HeaderAttr::Cidr(_) => IPSET_ATTR_CIDR,
            HeaderAttr::Port(_) => IPSET_ATTR_PORT,
            HeaderAttr::PortTo(_) => IPSET_ATTR_PORT_TO,
            HeaderAttr::Timeout(_) => IPSET_ATTR_TIMEOUT,
            HeaderAttr::CadtFlags(_) => IPSET_ATTR_CADT_FLAGS,
            HeaderAttr::InitVal(_) => IPSET_ATTR_INITVAL,
            HeaderAttr::HashSize(_) => IPSET_ATTR_HASHSIZE,
            HeaderAttr::MaxElem(_) => IPSET_ATTR_MAXELEM,
            HeaderAttr::Netmask(_) => IPSET_ATTR_NETMASK,
            HeaderAttr::BucketSize(_) => IPSET_ATTR_BUCKETSIZE,
            HeaderAttr::Size(_) => IPSET_ATTR_SIZE,
            HeaderAttr::Elements(_) => IPSET_ATTR_ELEMENTS,
            HeaderAttr::References(_) => IPSET_ATTR_REFERENCES,
            HeaderAttr::MemSize(_) => IPSET_ATTR_MEMSIZE,
            HeaderAttr::Other(n) => n.kind(),
        }
    }
    fn is_nested(&self) -> bool {
        match self {
            HeaderAttr::Ip(_) | HeaderAttr::IpTo(_) => true,
            HeaderAttr::Other(n) => n.is_nested(),
            _ => false,
        }
    }
    fn is_network_byteorder(&self) -> bool {
        match self {
            HeaderAttr::Cidr(_)
            | HeaderAttr::Netmask(_)
            | HeaderAttr::BucketSize(_)
            | HeaderAttr::Ip(_)
            | HeaderAttr::IpTo(_) => false,
            HeaderAttr::Other(n) => n.is_network_byteorder(),
            _ => true,
        }
    }
    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            HeaderAttr::Ip(a) | HeaderAttr::IpTo(a) => emit_addr(buf, a),
            HeaderAttr::Cidr(v) | HeaderAttr::Netmask(v) | HeaderAttr::BucketSize(v) => buf[0] = *v,
            HeaderAttr::Port(v) | HeaderAttr::PortTo(v) => emit_u16_be(buf, *v).unwrap(),
            HeaderAttr::Timeout(v)
            | HeaderAttr::CadtFlags(v)
            | HeaderAttr::InitVal(v)
            | HeaderAttr::HashSize(v)
            | HeaderAttr::MaxElem(v)
            | HeaderAttr::Size(v)
            | HeaderAttr::Elements(v)
            | HeaderAttr::References(v)
            | HeaderAttr::MemSize(v) => emit_u32_be(buf, *v).unwrap(),
            HeaderAttr::Other(n) => n.emit_value(buf),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for HeaderAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPSET_ATTR_IP => HeaderAttr::Ip(parse_addr(v, "IPSET_ATTR_IP")?),
            IPSET_ATTR_IP_TO => HeaderAttr::IpTo(parse_addr(v, "IPSET_ATTR_IP_TO")?),
            IPSET_ATTR_CIDR => HeaderAttr::Cidr(u8_of(v, "IPSET_ATTR_CIDR")?),
            IPSET_ATTR_PORT => HeaderAttr::Port(be16(v, "IPSET_ATTR_PORT")?),
            IPSET_ATTR_PORT_TO => HeaderAttr::PortTo(be16(v, "IPSET_ATTR_PORT_TO")?),
            IPSET_ATTR_TIMEOUT => HeaderAttr::Timeout(be32(v, "IPSET_ATTR_TIMEOUT")?),
            IPSET_ATTR_CADT_FLAGS => HeaderAttr::CadtFlags(be32(v, "IPSET_ATTR_CADT_FLAGS")?),
            IPSET_ATTR_INITVAL => HeaderAttr::InitVal(be32(v, "IPSET_ATTR_INITVAL")?),
            IPSET_ATTR_HASHSIZE => HeaderAttr::HashSize(be32(v, "IPSET_ATTR_HASHSIZE")?),
            IPSET_ATTR_MAXELEM => HeaderAttr::MaxElem(be32(v, "IPSET_ATTR_MAXELEM")?),
            IPSET_ATTR_NETMASK => HeaderAttr::Netmask(u8_of(v, "IPSET_ATTR_NETMASK")?),
            IPSET_ATTR_BUCKETSIZE => HeaderAttr::BucketSize(u8_of(v, "IPSET_ATTR_BUCKETSIZE")?),
            IPSET_ATTR_SIZE => HeaderAttr::Size(be32(v, "IPSET_ATTR_SIZE")?),
            IPSET_ATTR_ELEMENTS => HeaderAttr::Elements(be32(v, "IPSET_ATTR_ELEMENTS")?),
            IPSET_ATTR_REFERENCES => HeaderAttr::References(be32(v, "IPSET_ATTR_REFERENCES")?),
            IPSET_ATTR_MEMSIZE => HeaderAttr::MemSize(be32(v, "IPSET_ATTR_MEMSIZE")?),
            _ => HeaderAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// An attribute of one element: `IPSET_ATTR_DATA` of ADD/DEL/TEST and inside
/// `IPSET_ATTR_ADT`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ElemAttr {
    /// `IPSET_ATTR_IP`
    Ip(IpAddr),
    /// `IPSET_ATTR_IP_TO` (range add)
    IpTo(IpAddr),
    /// `IPSET_ATTR_CIDR`
    Cidr(u8),
    /// `IPSET_ATTR_PORT`
    Port(u16),
    /// `IPSET_ATTR_PORT_TO` (range add)
    PortTo(u16),
    /// `IPSET_ATTR_TIMEOUT`
    Timeout(u32),
    /// `IPSET_ATTR_PROTO`: `IPPROTO_*`.
    Proto(u8),
    /// `IPSET_ATTR_CADT_FLAGS` (e.g. nomatch)
    CadtFlags(u32),
    /// `IPSET_ATTR_LINENO`
    LineNo(u32),
    /// `IPSET_ATTR_IP2`
    Ip2(IpAddr),
    /// `IPSET_ATTR_CIDR2`
    Cidr2(u8),
    /// `IPSET_ATTR_COMMENT`
    Comment(String),
    /// Counters, skbinfo, anything else.
    Other(DefaultNla),
}

impl Nla for ElemAttr {
    fn value_len(&self) -> usize {
        match self {
            ElemAttr::Ip(a) | ElemAttr::IpTo(a) | ElemAttr::Ip2(a) => addr_value_len(a),
            ElemAttr::Cidr(_) | ElemAttr::Proto(_) | ElemAttr::Cidr2(_) => 1,
            ElemAttr::Port(_) | ElemAttr::PortTo(_) => 2,
            ElemAttr::Timeout(_) | ElemAttr::CadtFlags(_) | ElemAttr::LineNo(_) => 4,
            ElemAttr::Comment(s) => string_len(s),
            ElemAttr::Other(n) => n.value_len(),
        }
    }
    fn kind(&self) -> u16 {
        match self {
            ElemAttr::Ip(_) => IPSET_ATTR_IP,
            ElemAttr::IpTo(_) => IPSET_ATTR_IP_TO,
            ElemAttr::Cidr(_) => IPSET_ATTR_CIDR,
            ElemAttr::Port(_) => IPSET_ATTR_PORT,
            ElemAttr::PortTo(_) => IPSET_ATTR_PORT_TO,
            ElemAttr::Timeout(_) => IPSET_ATTR_TIMEOUT,
            ElemAttr::Proto(_) => IPSET_ATTR_PROTO,
            ElemAttr::CadtFlags(_) => IPSET_ATTR_CADT_FLAGS,
            ElemAttr::LineNo(_) => IPSET_ATTR_LINENO,
            ElemAttr::Ip2(_) => IPSET_ATTR_IP2,
            ElemAttr::Cidr2(_) => IPSET_ATTR_CIDR2,
            ElemAttr::Comment(_) => IPSET_ATTR_COMMENT,
            ElemAttr::Other(n) => n.kind(),
        }
    }
    fn is_nested(&self) -> bool {
        match self {
            ElemAttr::Ip(_) | ElemAttr::IpTo(_) | ElemAttr::Ip2(_) => true,
            ElemAttr::Other(n) => n.is_nested(),
            _ => false,
        }
    }
    fn is_network_byteorder(&self) -> bool {
        match self {
            ElemAttr::Port(_)
            | ElemAttr::PortTo(_)
            | ElemAttr::Timeout(_)
            | ElemAttr::CadtFlags(_)
            | ElemAttr::LineNo(_) => true,
            ElemAttr::Other(n) => n.is_network_byteorder(),
            _ => false,
        }
    }
    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            ElemAttr::Ip(a) | ElemAttr::IpTo(a) | ElemAttr::Ip2(a) => emit_addr(buf, a),
            ElemAttr::Cidr(v) | ElemAttr::Proto(v) | ElemAttr::Cidr2(v) => buf[0] = *v,
            ElemAttr::Port(v) | ElemAttr::PortTo(v) => emit_u16_be(buf, *v).unwrap(),
            ElemAttr::Timeout(v) | ElemAttr::CadtFlags(v) | ElemAttr::LineNo(v) => {
                emit_u32_be(buf, *v).unwrap()
            }
            ElemAttr::Comment(s) => emit_string(buf, s),
            ElemAttr::Other(n) => n.emit_value(buf),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for ElemAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPSET_ATTR_IP => ElemAttr::Ip(parse_addr(v, "IPSET_ATTR_IP")?),
            IPSET_ATTR_IP_TO => ElemAttr::IpTo(parse_addr(v, "IPSET_ATTR_IP_TO")?),
            IPSET_ATTR_CIDR => ElemAttr::Cidr(u8_of(v, "IPSET_ATTR_CIDR")?),
            IPSET_ATTR_PORT => ElemAttr::Port(be16(v, "IPSET_ATTR_PORT")?),
            IPSET_ATTR_PORT_TO => ElemAttr::PortTo(be16(v, "IPSET_ATTR_PORT_TO")?),
            IPSET_ATTR_TIMEOUT => ElemAttr::Timeout(be32(v, "IPSET_ATTR_TIMEOUT")?),
            IPSET_ATTR_PROTO => ElemAttr::Proto(u8_of(v, "IPSET_ATTR_PROTO")?),
            IPSET_ATTR_CADT_FLAGS => ElemAttr::CadtFlags(be32(v, "IPSET_ATTR_CADT_FLAGS")?),
            IPSET_ATTR_LINENO => ElemAttr::LineNo(be32(v, "IPSET_ATTR_LINENO")?),
            IPSET_ATTR_IP2 => ElemAttr::Ip2(parse_addr(v, "IPSET_ATTR_IP2")?),
            IPSET_ATTR_CIDR2 => ElemAttr::Cidr2(u8_of(v, "IPSET_ATTR_CIDR2")?),
            IPSET_ATTR_COMMENT => {
                ElemAttr::Comment(parse_string(v).context("invalid IPSET_ATTR_COMMENT")?)
            }
            _ => ElemAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// One element inside `IPSET_ATTR_ADT` (an `IPSET_ATTR_DATA` nest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdtEntry(pub Vec<ElemAttr>);

impl Nla for AdtEntry {
    fn value_len(&self) -> usize {
        self.0.as_slice().buffer_len()
    }
    fn kind(&self) -> u16 {
        IPSET_ATTR_DATA
    }
    fn is_nested(&self) -> bool {
        true
    }
    fn emit_value(&self, buf: &mut [u8]) {
        self.0.as_slice().emit(buf)
    }
}

/// A command-level ipset attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IpsetAttr {
    /// `IPSET_ATTR_PROTOCOL`
    Protocol(u8),
    /// `IPSET_ATTR_SETNAME`
    SetName(String),
    /// `IPSET_ATTR_TYPENAME`, which is also `IPSET_ATTR_SETNAME2` (swap, rename).
    TypeName(String),
    /// `IPSET_ATTR_REVISION`
    Revision(u8),
    /// `IPSET_ATTR_FAMILY`: `NFPROTO_*`.
    Family(u8),
    /// `IPSET_ATTR_FLAGS`: `IPSET_FLAG_*`.
    Flags(u32),
    /// `IPSET_ATTR_DATA` of CREATE / LIST / HEADER: the set header.
    Header(Vec<HeaderAttr>),
    /// `IPSET_ATTR_DATA` of ADD / DEL / TEST: one element.
    Elem(Vec<ElemAttr>),
    /// `IPSET_ATTR_ADT`: several elements.
    Adt(Vec<AdtEntry>),
    /// `IPSET_ATTR_LINENO`
    LineNo(u32),
    /// `IPSET_ATTR_PROTOCOL_MIN` / `IPSET_ATTR_REVISION_MIN`
    ProtocolMin(u8),
    /// `IPSET_ATTR_INDEX`
    Index(u16),
    /// Anything else.
    Other(DefaultNla),
}

impl Nla for IpsetAttr {
    fn value_len(&self) -> usize {
        match self {
            IpsetAttr::Protocol(_)
            | IpsetAttr::Revision(_)
            | IpsetAttr::Family(_)
            | IpsetAttr::ProtocolMin(_) => 1,
            IpsetAttr::SetName(s) | IpsetAttr::TypeName(s) => string_len(s),
            IpsetAttr::Flags(_) | IpsetAttr::LineNo(_) => 4,
            IpsetAttr::Index(_) => 2,
            IpsetAttr::Header(a) => a.as_slice().buffer_len(),
            IpsetAttr::Elem(a) => a.as_slice().buffer_len(),
            IpsetAttr::Adt(a) => a.as_slice().buffer_len(),
            IpsetAttr::Other(n) => n.value_len(),
        }
    }
    fn kind(&self) -> u16 {
        match self {
            IpsetAttr::Protocol(_) => IPSET_ATTR_PROTOCOL,
            IpsetAttr::SetName(_) => IPSET_ATTR_SETNAME,
            IpsetAttr::TypeName(_) => IPSET_ATTR_TYPENAME,
            IpsetAttr::Revision(_) => IPSET_ATTR_REVISION,
            IpsetAttr::Family(_) => IPSET_ATTR_FAMILY,
            IpsetAttr::Flags(_) => IPSET_ATTR_FLAGS,
            IpsetAttr::Header(_) | IpsetAttr::Elem(_) => IPSET_ATTR_DATA,
            IpsetAttr::Adt(_) => IPSET_ATTR_ADT,
            IpsetAttr::LineNo(_) => IPSET_ATTR_LINENO,
            IpsetAttr::ProtocolMin(_) => IPSET_ATTR_PROTOCOL_MIN,
            IpsetAttr::Index(_) => IPSET_ATTR_INDEX,
            IpsetAttr::Other(n) => n.kind(),
        }
    }
    fn is_nested(&self) -> bool {
        match self {
            IpsetAttr::Header(_) | IpsetAttr::Elem(_) | IpsetAttr::Adt(_) => true,
            IpsetAttr::Other(n) => n.is_nested(),
            _ => false,
        }
    }
    fn is_network_byteorder(&self) -> bool {
        match self {
            IpsetAttr::Flags(_) | IpsetAttr::LineNo(_) | IpsetAttr::Index(_) => true,
            IpsetAttr::Other(n) => n.is_network_byteorder(),
            _ => false,
        }
    }
    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            IpsetAttr::Protocol(v)
            | IpsetAttr::Revision(v)
            | IpsetAttr::Family(v)
            | IpsetAttr::ProtocolMin(v) => buf[0] = *v,
            IpsetAttr::SetName(s) | IpsetAttr::TypeName(s) => emit_string(buf, s),
            IpsetAttr::Flags(v) | IpsetAttr::LineNo(v) => emit_u32_be(buf, *v).unwrap(),
            IpsetAttr::Index(v) => emit_u16_be(buf, *v).unwrap(),
            IpsetAttr::Header(a) => a.as_slice().emit(buf),
            IpsetAttr::Elem(a) => a.as_slice().emit(buf),
            IpsetAttr::Adt(a) => a.as_slice().emit(buf),
            IpsetAttr::Other(n) => n.emit_value(buf),
        }
    }
}

fn parse_list<A>(v: &[u8], what: &str) -> Result<Vec<A>, DecodeError>
where
    A: for<'b> Parseable<NlaBuffer<&'b [u8]>>,
{
    let mut out = Vec::new();
    for nla in NlasIterator::new(v) {
        let nla = nla.with_context(|| format!("invalid attribute in {what}"))?;
        out.push(A::parse(&nla).with_context(|| format!("in {what}"))?);
    }
    Ok(out)
}

/// Whether `IPSET_ATTR_DATA` of `cmd` carries a set header (else an element).
fn data_is_header(cmd: u8) -> bool {
    !matches!(cmd, IPSET_CMD_ADD | IPSET_CMD_DEL | IPSET_CMD_TEST)
}

impl<'a, T: AsRef<[u8]> + ?Sized> ParseableParametrized<NlaBuffer<&'a T>, u8> for IpsetAttr {
    fn parse_with_param(buf: &NlaBuffer<&'a T>, cmd: u8) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPSET_ATTR_PROTOCOL => IpsetAttr::Protocol(u8_of(v, "IPSET_ATTR_PROTOCOL")?),
            IPSET_ATTR_SETNAME => {
                IpsetAttr::SetName(parse_string(v).context("invalid IPSET_ATTR_SETNAME")?)
            }
            IPSET_ATTR_TYPENAME => {
                IpsetAttr::TypeName(parse_string(v).context("invalid IPSET_ATTR_TYPENAME")?)
            }
            IPSET_ATTR_REVISION => IpsetAttr::Revision(u8_of(v, "IPSET_ATTR_REVISION")?),
            IPSET_ATTR_FAMILY => IpsetAttr::Family(u8_of(v, "IPSET_ATTR_FAMILY")?),
            IPSET_ATTR_FLAGS => IpsetAttr::Flags(be32(v, "IPSET_ATTR_FLAGS")?),
            IPSET_ATTR_DATA if data_is_header(cmd) => {
                IpsetAttr::Header(parse_list(v, "IPSET_ATTR_DATA (set header)")?)
            }
            IPSET_ATTR_DATA => IpsetAttr::Elem(parse_list(v, "IPSET_ATTR_DATA (element)")?),
            IPSET_ATTR_ADT => {
                let mut entries = Vec::new();
                for nla in NlasIterator::new(v) {
                    let nla = nla.context("invalid attribute in IPSET_ATTR_ADT")?;
                    if nla.kind() == IPSET_ATTR_DATA {
                        entries.push(AdtEntry(parse_list(nla.value(), "IPSET_ATTR_ADT element")?));
                    }
                }
                IpsetAttr::Adt(entries)
            }
            IPSET_ATTR_LINENO => IpsetAttr::LineNo(be32(v, "IPSET_ATTR_LINENO")?),
            IPSET_ATTR_PROTOCOL_MIN => IpsetAttr::ProtocolMin(u8_of(v, "IPSET_ATTR_PROTOCOL_MIN")?),
            IPSET_ATTR_INDEX => IpsetAttr::Index(be16(v, "IPSET_ATTR_INDEX")?),
            _ => IpsetAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// `struct nfgenmsg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NfGenHeader {
    /// `NFPROTO_*` (ipset ignores it; libipset sends `NFPROTO_IPV4`).
    pub family: u8,
    /// `NFNETLINK_V0`.
    pub version: u8,
    /// Resource id (0).
    pub res_id: u16,
}

/// Size of `struct nfgenmsg`.
pub const NFGENMSG_LEN: usize = 4;

/// One ipset message: command, nfgenmsg header and attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpsetMessage {
    /// `IPSET_CMD_*` (low byte of `nlmsg_type`).
    pub cmd: u8,
    /// nfgenmsg.
    pub header: NfGenHeader,
    /// Attributes.
    pub attributes: Vec<IpsetAttr>,
}

impl IpsetMessage {
    /// A request for `cmd` with the libipset header (`NFPROTO_IPV4`, v0).
    pub fn new(cmd: u8, attributes: Vec<IpsetAttr>) -> Self {
        IpsetMessage {
            cmd,
            header: NfGenHeader {
                family: NFPROTO_IPV4,
                version: NFNETLINK_V0,
                res_id: 0,
            },
            attributes,
        }
    }
}

impl Emitable for IpsetMessage {
    fn buffer_len(&self) -> usize {
        NFGENMSG_LEN + self.attributes.as_slice().buffer_len()
    }
    fn emit(&self, buf: &mut [u8]) {
        buf[0] = self.header.family;
        buf[1] = self.header.version;
        buf[2..4].copy_from_slice(&self.header.res_id.to_be_bytes());
        self.attributes.as_slice().emit(&mut buf[NFGENMSG_LEN..]);
    }
}

impl ParseableParametrized<[u8], u8> for IpsetMessage {
    fn parse_with_param(buf: &[u8], cmd: u8) -> Result<Self, DecodeError> {
        if buf.len() < NFGENMSG_LEN {
            return Err(DecodeError::buffer_too_small(buf.len(), NFGENMSG_LEN))
                .context("failed to parse nfgenmsg of ipset message");
        }
        let header = NfGenHeader {
            family: buf[0],
            version: buf[1],
            res_id: u16::from_be_bytes([buf[2], buf[3]]),
        };
        let mut attributes = Vec::new();
        for nla in NlasIterator::new(&buf[NFGENMSG_LEN..]) {
            let nla = nla.with_context(|| format!("invalid attribute in ipset command {cmd}"))?;
            attributes.push(
                IpsetAttr::parse_with_param(&nla, cmd)
                    .with_context(|| format!("failed to parse ipset command {cmd}"))?,
            );
        }
        Ok(IpsetMessage {
            cmd,
            header,
            attributes,
        })
    }
}

impl NetlinkSerializable for IpsetMessage {
    fn message_type(&self) -> u16 {
        ((NFNL_SUBSYS_IPSET as u16) << 8) | self.cmd as u16
    }
    fn buffer_len(&self) -> usize {
        Emitable::buffer_len(self)
    }
    fn serialize(&self, buf: &mut [u8]) {
        self.emit(buf)
    }
}

impl NetlinkDeserializable for IpsetMessage {
    type Error = DecodeError;
    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        let subsys = (header.message_type >> 8) as u8;
        if subsys != NFNL_SUBSYS_IPSET {
            return Err(format!("nfnetlink subsystem {subsys} is not ipset").into());
        }
        IpsetMessage::parse_with_param(payload, header.message_type as u8)
    }
}
