//! Wire codecs for the IPVS generic netlink family (`linux/ip_vs.h`) and the
//! `nlctrl` family lookup (`linux/genetlink.h`). No I/O.
//!
//! ```text
//! IPVS message (after the 16-byte nlmsghdr, nlmsg_type = resolved family id):
//! +--------+---------+-------------+
//! | cmd u8 | ver u8  | reserved u16|   struct genlmsghdr
//! +--------+---------+-------------+
//! | IPVS_CMD_ATTR_* ...            |   Vec<IpvsCmdAttr>
//! +--------------------------------+
//! ```
//!
//! Nested attributes are emitted without `NLA_F_NESTED`, as libnl/ipvsadm and the
//! kernel's own dumps (`nla_nest_start_noflag`) do. Integers are host order except
//! ports (`__be16`) and the service netmask (`__be32`), exactly as in `ip_vs.h`.

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, ErrorContext, Nla, NlaBuffer, NlasIterator, Parseable,
    emit_u16, emit_u16_be, emit_u32, parse_string, parse_u16, parse_u16_be, parse_u32,
};

/// `GENL_HDRLEN`: size of `struct genlmsghdr`.
pub const GENL_HDRLEN: usize = 4;
/// `GENL_ID_CTRL`: the fixed id of the `nlctrl` family.
pub const GENL_ID_CTRL: u16 = 0x10;
/// `CTRL_CMD_NEWFAMILY`: reply to a family lookup.
pub const CTRL_CMD_NEWFAMILY: u8 = 1;
/// `CTRL_CMD_GETFAMILY`: look a family up by name.
pub const CTRL_CMD_GETFAMILY: u8 = 3;
/// `CTRL_ATTR_FAMILY_ID` (u16).
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
/// `CTRL_ATTR_FAMILY_NAME` (NUL-terminated string).
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// `IPVS_GENL_NAME`.
pub const IPVS_GENL_NAME: &str = "IPVS";
/// `IPVS_GENL_VERSION`.
pub const IPVS_GENL_VERSION: u8 = 1;

/// `IPVS_CMD_NEW_SERVICE`
pub const IPVS_CMD_NEW_SERVICE: u8 = 1;
/// `IPVS_CMD_SET_SERVICE`
pub const IPVS_CMD_SET_SERVICE: u8 = 2;
/// `IPVS_CMD_DEL_SERVICE`
pub const IPVS_CMD_DEL_SERVICE: u8 = 3;
/// `IPVS_CMD_GET_SERVICE`
pub const IPVS_CMD_GET_SERVICE: u8 = 4;
/// `IPVS_CMD_NEW_DEST`
pub const IPVS_CMD_NEW_DEST: u8 = 5;
/// `IPVS_CMD_SET_DEST`
pub const IPVS_CMD_SET_DEST: u8 = 6;
/// `IPVS_CMD_DEL_DEST`
pub const IPVS_CMD_DEL_DEST: u8 = 7;
/// `IPVS_CMD_GET_DEST`
pub const IPVS_CMD_GET_DEST: u8 = 8;
/// `IPVS_CMD_SET_CONFIG` (also the command of the `GET_CONFIG` reply)
pub const IPVS_CMD_SET_CONFIG: u8 = 12;
/// `IPVS_CMD_GET_CONFIG`
pub const IPVS_CMD_GET_CONFIG: u8 = 13;

/// `IPVS_CMD_ATTR_SERVICE` (nested)
pub const IPVS_CMD_ATTR_SERVICE: u16 = 1;
/// `IPVS_CMD_ATTR_DEST` (nested)
pub const IPVS_CMD_ATTR_DEST: u16 = 2;
/// `IPVS_CMD_ATTR_TIMEOUT_TCP` (u32)
pub const IPVS_CMD_ATTR_TIMEOUT_TCP: u16 = 4;
/// `IPVS_CMD_ATTR_TIMEOUT_TCP_FIN` (u32)
pub const IPVS_CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
/// `IPVS_CMD_ATTR_TIMEOUT_UDP` (u32)
pub const IPVS_CMD_ATTR_TIMEOUT_UDP: u16 = 6;

/// `IPVS_SVC_ATTR_AF` (u16)
pub const IPVS_SVC_ATTR_AF: u16 = 1;
/// `IPVS_SVC_ATTR_PROTOCOL` (u16)
pub const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
/// `IPVS_SVC_ATTR_ADDR` (`union nf_inet_addr`, 16 bytes)
pub const IPVS_SVC_ATTR_ADDR: u16 = 3;
/// `IPVS_SVC_ATTR_PORT` (`__be16`)
pub const IPVS_SVC_ATTR_PORT: u16 = 4;
/// `IPVS_SVC_ATTR_FWMARK` (u32)
pub const IPVS_SVC_ATTR_FWMARK: u16 = 5;
/// `IPVS_SVC_ATTR_SCHED_NAME` (string)
pub const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
/// `IPVS_SVC_ATTR_FLAGS` (`struct ip_vs_flags`)
pub const IPVS_SVC_ATTR_FLAGS: u16 = 7;
/// `IPVS_SVC_ATTR_TIMEOUT` (u32 seconds)
pub const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
/// `IPVS_SVC_ATTR_NETMASK` (`__be32`)
pub const IPVS_SVC_ATTR_NETMASK: u16 = 9;
/// `IPVS_SVC_ATTR_STATS` (nested, kept as `Other`)
pub const IPVS_SVC_ATTR_STATS: u16 = 10;
/// `IPVS_SVC_ATTR_PE_NAME` (string)
pub const IPVS_SVC_ATTR_PE_NAME: u16 = 11;

/// `IPVS_DEST_ATTR_ADDR` (`union nf_inet_addr`, 16 bytes)
pub const IPVS_DEST_ATTR_ADDR: u16 = 1;
/// `IPVS_DEST_ATTR_PORT` (`__be16`)
pub const IPVS_DEST_ATTR_PORT: u16 = 2;
/// `IPVS_DEST_ATTR_FWD_METHOD` (u32)
pub const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
/// `IPVS_DEST_ATTR_WEIGHT` (u32)
pub const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
/// `IPVS_DEST_ATTR_U_THRESH` (u32)
pub const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
/// `IPVS_DEST_ATTR_L_THRESH` (u32)
pub const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
/// `IPVS_DEST_ATTR_ACTIVE_CONNS` (u32, dump only)
pub const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
/// `IPVS_DEST_ATTR_INACT_CONNS` (u32, dump only)
pub const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
/// `IPVS_DEST_ATTR_PERSIST_CONNS` (u32, dump only)
pub const IPVS_DEST_ATTR_PERSIST_CONNS: u16 = 9;
/// `IPVS_DEST_ATTR_STATS` (nested, kept as `Other`)
pub const IPVS_DEST_ATTR_STATS: u16 = 10;
/// `IPVS_DEST_ATTR_ADDR_FAMILY` (u16)
pub const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;

/// `IP_VS_SVC_F_PERSISTENT`
pub const IP_VS_SVC_F_PERSISTENT: u32 = 0x0001;
/// `IP_VS_SVC_F_HASHED` (set by the kernel on every dumped service)
pub const IP_VS_SVC_F_HASHED: u32 = 0x0002;
/// `IP_VS_CONN_F_MASQ`: NAT forwarding.
pub const IP_VS_CONN_F_MASQ: u32 = 0;
/// `IP_VS_CONN_F_LOCALNODE`
pub const IP_VS_CONN_F_LOCALNODE: u32 = 1;
/// `IP_VS_CONN_F_TUNNEL`
pub const IP_VS_CONN_F_TUNNEL: u32 = 2;
/// `IP_VS_CONN_F_DROUTE`
pub const IP_VS_CONN_F_DROUTE: u32 = 3;
/// `IP_VS_SCHEDNAME_MAXLEN` (including the NUL)
pub const IP_VS_SCHEDNAME_MAXLEN: usize = 16;

/// Size of `union nf_inet_addr` as carried in `*_ATTR_ADDR`.
pub const NF_INET_ADDR_LEN: usize = 16;

/// `struct genlmsghdr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenlHeader {
    /// Command (`IPVS_CMD_*`, `CTRL_CMD_*`).
    pub cmd: u8,
    /// Family version (`IPVS_GENL_VERSION`).
    pub version: u8,
}

impl Emitable for GenlHeader {
    fn buffer_len(&self) -> usize {
        GENL_HDRLEN
    }
    fn emit(&self, buf: &mut [u8]) {
        buf[0] = self.cmd;
        buf[1] = self.version;
        buf[2] = 0;
        buf[3] = 0;
    }
}

impl Parseable<[u8]> for GenlHeader {
    fn parse(buf: &[u8]) -> Result<Self, DecodeError> {
        if buf.len() < GENL_HDRLEN {
            return Err(DecodeError::buffer_too_small(buf.len(), GENL_HDRLEN));
        }
        Ok(GenlHeader {
            cmd: buf[0],
            version: buf[1],
        })
    }
}

/// Parse all attributes of `buf` as `A`, with `what` as context.
pub(crate) fn parse_nlas<A>(buf: &[u8], what: &str) -> Result<Vec<A>, DecodeError>
where
    A: for<'a> Parseable<NlaBuffer<&'a [u8]>>,
{
    let mut out = Vec::new();
    for nla in NlasIterator::new(buf) {
        let nla = nla.with_context(|| format!("invalid attribute in {what}"))?;
        out.push(A::parse(&nla).with_context(|| format!("failed to parse {what} attribute"))?);
    }
    Ok(out)
}

fn emit_nested<A: Nla>(attrs: &[A], buf: &mut [u8]) {
    attrs.emit(buf)
}

fn addr16(payload: &[u8], what: &str) -> Result<[u8; NF_INET_ADDR_LEN], DecodeError> {
    let mut a = [0u8; NF_INET_ADDR_LEN];
    match payload.len() {
        4 | NF_INET_ADDR_LEN => {
            a[..payload.len()].copy_from_slice(payload);
            Ok(a)
        }
        n => Err(format!("{what}: address of {n} bytes").into()),
    }
}

fn u32_of(payload: &[u8], what: &str) -> Result<u32, DecodeError> {
    parse_u32(payload).with_context(|| format!("invalid {what}"))
}

// ---- nlctrl ----

/// An attribute of an `nlctrl` message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CtrlAttr {
    /// `CTRL_ATTR_FAMILY_ID`
    FamilyId(u16),
    /// `CTRL_ATTR_FAMILY_NAME`
    FamilyName(String),
    /// Anything else (ops, multicast groups, …).
    Other(DefaultNla),
}

impl Nla for CtrlAttr {
    fn value_len(&self) -> usize {
        match self {
            CtrlAttr::FamilyId(_) => 2,
            CtrlAttr::FamilyName(s) => s.len() + 1,
            CtrlAttr::Other(n) => n.value_len(),
        }
    }
    fn kind(&self) -> u16 {
        match self {
            CtrlAttr::FamilyId(_) => CTRL_ATTR_FAMILY_ID,
            CtrlAttr::FamilyName(_) => CTRL_ATTR_FAMILY_NAME,
            CtrlAttr::Other(n) => n.kind(),
        }
    }
    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            CtrlAttr::FamilyId(id) => emit_u16(buf, *id).unwrap(),
            CtrlAttr::FamilyName(s) => {
                buf[..s.len()].copy_from_slice(s.as_bytes());
                buf[s.len()] = 0;
            }
            CtrlAttr::Other(n) => n.emit_value(buf),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for CtrlAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            CTRL_ATTR_FAMILY_ID => {
                CtrlAttr::FamilyId(parse_u16(v).context("invalid CTRL_ATTR_FAMILY_ID")?)
            }
            CTRL_ATTR_FAMILY_NAME => {
                CtrlAttr::FamilyName(parse_string(v).context("invalid CTRL_ATTR_FAMILY_NAME")?)
            }
            _ => CtrlAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// An `nlctrl` message (family lookup request or reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlMessage {
    /// genl header (`CTRL_CMD_*`).
    pub header: GenlHeader,
    /// Attributes.
    pub attributes: Vec<CtrlAttr>,
}

impl CtrlMessage {
    /// `CTRL_CMD_GETFAMILY` for `name`.
    pub fn get_family(name: &str) -> Self {
        CtrlMessage {
            header: GenlHeader {
                cmd: CTRL_CMD_GETFAMILY,
                version: 1,
            },
            attributes: vec![CtrlAttr::FamilyName(name.to_string())],
        }
    }

    /// The `CTRL_ATTR_FAMILY_ID` of a reply.
    pub fn family_id(&self) -> Option<u16> {
        self.attributes.iter().find_map(|a| match a {
            CtrlAttr::FamilyId(id) => Some(*id),
            _ => None,
        })
    }
}

impl Emitable for CtrlMessage {
    fn buffer_len(&self) -> usize {
        GENL_HDRLEN + self.attributes.as_slice().buffer_len()
    }
    fn emit(&self, buf: &mut [u8]) {
        self.header.emit(buf);
        self.attributes.as_slice().emit(&mut buf[GENL_HDRLEN..]);
    }
}

impl Parseable<[u8]> for CtrlMessage {
    fn parse(buf: &[u8]) -> Result<Self, DecodeError> {
        let header = GenlHeader::parse(buf).context("failed to parse nlctrl genl header")?;
        Ok(CtrlMessage {
            header,
            attributes: parse_nlas(&buf[GENL_HDRLEN..], "nlctrl message")?,
        })
    }
}

// ---- IPVS ----

/// `struct ip_vs_flags`: flags and the mask of flags to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpvsFlags {
    /// `IP_VS_SVC_F_*` bits.
    pub flags: u32,
    /// Which bits of `flags` to apply.
    pub mask: u32,
}

/// An attribute nested in `IPVS_CMD_ATTR_SERVICE`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceAttr {
    /// `IPVS_SVC_ATTR_AF`: `AF_INET` or `AF_INET6`.
    Af(u16),
    /// `IPVS_SVC_ATTR_PROTOCOL`: `IPPROTO_TCP`/`UDP`/`SCTP`.
    Protocol(u16),
    /// `IPVS_SVC_ATTR_ADDR`: `union nf_inet_addr` (IPv4 in the first 4 bytes).
    Addr([u8; NF_INET_ADDR_LEN]),
    /// `IPVS_SVC_ATTR_PORT` (host value; `__be16` on the wire).
    Port(u16),
    /// `IPVS_SVC_ATTR_FWMARK`
    Fwmark(u32),
    /// `IPVS_SVC_ATTR_SCHED_NAME`
    SchedName(String),
    /// `IPVS_SVC_ATTR_FLAGS`
    Flags(IpvsFlags),
    /// `IPVS_SVC_ATTR_TIMEOUT`: persistence timeout in seconds.
    Timeout(u32),
    /// `IPVS_SVC_ATTR_NETMASK`: the raw `__be32` bytes (an IPv4 mask, or for
    /// IPv6 a prefix length the kernel compares in host order).
    Netmask([u8; 4]),
    /// `IPVS_SVC_ATTR_PE_NAME`
    PeName(String),
    /// Stats, stats64 and anything newer.
    Other(DefaultNla),
}

impl Nla for ServiceAttr {
    fn value_len(&self) -> usize {
        match self {
            ServiceAttr::Af(_) | ServiceAttr::Protocol(_) | ServiceAttr::Port(_) => 2,
            ServiceAttr::Addr(_) => NF_INET_ADDR_LEN,
            ServiceAttr::Fwmark(_) | ServiceAttr::Timeout(_) | ServiceAttr::Netmask(_) => 4,
            ServiceAttr::SchedName(s) | ServiceAttr::PeName(s) => s.len() + 1,
            ServiceAttr::Flags(_) => 8,
            ServiceAttr::Other(n) => n.value_len(),
        }
    }
    fn kind(&self) -> u16 {
        match self {
            ServiceAttr::Af(_) => IPVS_SVC_ATTR_AF,
            ServiceAttr::Protocol(_) => IPVS_SVC_ATTR_PROTOCOL,
            ServiceAttr::Addr(_) => IPVS_SVC_ATTR_ADDR,
            ServiceAttr::Port(_) => IPVS_SVC_ATTR_PORT,
            ServiceAttr::Fwmark(_) => IPVS_SVC_ATTR_FWMARK,
            ServiceAttr::SchedName(_) => IPVS_SVC_ATTR_SCHED_NAME,
            ServiceAttr::Flags(_) => IPVS_SVC_ATTR_FLAGS,
            ServiceAttr::Timeout(_) => IPVS_SVC_ATTR_TIMEOUT,
            ServiceAttr::Netmask(_) => IPVS_SVC_ATTR_NETMASK,
            ServiceAttr::PeName(_) => IPVS_SVC_ATTR_PE_NAME,
            ServiceAttr::Other(n) => n.kind(),
        }
    }
    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            ServiceAttr::Af(v) | ServiceAttr::Protocol(v) => emit_u16(buf, *v).unwrap(),
            ServiceAttr::Addr(a) => buf[..NF_INET_ADDR_LEN].copy_from_slice(a),
            ServiceAttr::Port(p) => emit_u16_be(buf, *p).unwrap(),
            ServiceAttr::Fwmark(v) | ServiceAttr::Timeout(v) => emit_u32(buf, *v).unwrap(),
            ServiceAttr::Netmask(m) => buf[..4].copy_from_slice(m),
            ServiceAttr::SchedName(s) | ServiceAttr::PeName(s) => {
                buf[..s.len()].copy_from_slice(s.as_bytes());
                buf[s.len()] = 0;
            }
            ServiceAttr::Flags(f) => {
                emit_u32(&mut buf[..4], f.flags).unwrap();
                emit_u32(&mut buf[4..8], f.mask).unwrap();
            }
            ServiceAttr::Other(n) => n.emit_value(buf),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for ServiceAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPVS_SVC_ATTR_AF => ServiceAttr::Af(parse_u16(v).context("invalid IPVS_SVC_ATTR_AF")?),
            IPVS_SVC_ATTR_PROTOCOL => {
                ServiceAttr::Protocol(parse_u16(v).context("invalid IPVS_SVC_ATTR_PROTOCOL")?)
            }
            IPVS_SVC_ATTR_ADDR => ServiceAttr::Addr(addr16(v, "IPVS_SVC_ATTR_ADDR")?),
            IPVS_SVC_ATTR_PORT => {
                ServiceAttr::Port(parse_u16_be(v).context("invalid IPVS_SVC_ATTR_PORT")?)
            }
            IPVS_SVC_ATTR_FWMARK => ServiceAttr::Fwmark(u32_of(v, "IPVS_SVC_ATTR_FWMARK")?),
            IPVS_SVC_ATTR_SCHED_NAME => {
                ServiceAttr::SchedName(parse_string(v).context("invalid IPVS_SVC_ATTR_SCHED_NAME")?)
            }
            IPVS_SVC_ATTR_FLAGS => {
                if v.len() < 8 {
                    return Err(DecodeError::buffer_too_small(v.len(), 8))
                        .context("invalid IPVS_SVC_ATTR_FLAGS");
                }
                ServiceAttr::Flags(IpvsFlags {
                    flags: u32_of(&v[..4], "IPVS_SVC_ATTR_FLAGS")?,
                    mask: u32_of(&v[4..8], "IPVS_SVC_ATTR_FLAGS mask")?,
                })
            }
            IPVS_SVC_ATTR_TIMEOUT => ServiceAttr::Timeout(u32_of(v, "IPVS_SVC_ATTR_TIMEOUT")?),
            IPVS_SVC_ATTR_NETMASK => ServiceAttr::Netmask(
                v.get(..4)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| DecodeError::from("invalid IPVS_SVC_ATTR_NETMASK"))?,
            ),
            IPVS_SVC_ATTR_PE_NAME => {
                ServiceAttr::PeName(parse_string(v).context("invalid IPVS_SVC_ATTR_PE_NAME")?)
            }
            _ => ServiceAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// An attribute nested in `IPVS_CMD_ATTR_DEST`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DestAttr {
    /// `IPVS_DEST_ATTR_ADDR`: `union nf_inet_addr`.
    Addr([u8; NF_INET_ADDR_LEN]),
    /// `IPVS_DEST_ATTR_PORT` (host value; `__be16` on the wire).
    Port(u16),
    /// `IPVS_DEST_ATTR_FWD_METHOD`: `IP_VS_CONN_F_*`.
    FwdMethod(u32),
    /// `IPVS_DEST_ATTR_WEIGHT`
    Weight(u32),
    /// `IPVS_DEST_ATTR_U_THRESH`
    UpperThreshold(u32),
    /// `IPVS_DEST_ATTR_L_THRESH`
    LowerThreshold(u32),
    /// `IPVS_DEST_ATTR_ACTIVE_CONNS`
    ActiveConns(u32),
    /// `IPVS_DEST_ATTR_INACT_CONNS`
    InactConns(u32),
    /// `IPVS_DEST_ATTR_PERSIST_CONNS`
    PersistConns(u32),
    /// `IPVS_DEST_ATTR_ADDR_FAMILY`
    AddrFamily(u16),
    /// Stats, stats64, tunnel attributes and anything newer.
    Other(DefaultNla),
}

impl Nla for DestAttr {
    fn value_len(&self) -> usize {
        match self {
            DestAttr::Addr(_) => NF_INET_ADDR_LEN,
            DestAttr::Port(_) | DestAttr::AddrFamily(_) => 2,
            DestAttr::Other(n) => n.value_len(),
            _ => 4,
        }
    }
    fn kind(&self) -> u16 {
        match self {
            DestAttr::Addr(_) => IPVS_DEST_ATTR_ADDR,
            DestAttr::Port(_) => IPVS_DEST_ATTR_PORT,
            DestAttr::FwdMethod(_) => IPVS_DEST_ATTR_FWD_METHOD,
            DestAttr::Weight(_) => IPVS_DEST_ATTR_WEIGHT,
            DestAttr::UpperThreshold(_) => IPVS_DEST_ATTR_U_THRESH,
            DestAttr::LowerThreshold(_) => IPVS_DEST_ATTR_L_THRESH,
            DestAttr::ActiveConns(_) => IPVS_DEST_ATTR_ACTIVE_CONNS,
            DestAttr::InactConns(_) => IPVS_DEST_ATTR_INACT_CONNS,
            DestAttr::PersistConns(_) => IPVS_DEST_ATTR_PERSIST_CONNS,
            DestAttr::AddrFamily(_) => IPVS_DEST_ATTR_ADDR_FAMILY,
            DestAttr::Other(n) => n.kind(),
        }
    }
    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            DestAttr::Addr(a) => buf[..NF_INET_ADDR_LEN].copy_from_slice(a),
            DestAttr::Port(p) => emit_u16_be(buf, *p).unwrap(),
            DestAttr::AddrFamily(f) => emit_u16(buf, *f).unwrap(),
            DestAttr::FwdMethod(v)
            | DestAttr::Weight(v)
            | DestAttr::UpperThreshold(v)
            | DestAttr::LowerThreshold(v)
            | DestAttr::ActiveConns(v)
            | DestAttr::InactConns(v)
            | DestAttr::PersistConns(v) => emit_u32(buf, *v).unwrap(),
            DestAttr::Other(n) => n.emit_value(buf),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for DestAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPVS_DEST_ATTR_ADDR => DestAttr::Addr(addr16(v, "IPVS_DEST_ATTR_ADDR")?),
            IPVS_DEST_ATTR_PORT => {
                DestAttr::Port(parse_u16_be(v).context("invalid IPVS_DEST_ATTR_PORT")?)
            }
            IPVS_DEST_ATTR_FWD_METHOD => {
                DestAttr::FwdMethod(u32_of(v, "IPVS_DEST_ATTR_FWD_METHOD")?)
            }
            IPVS_DEST_ATTR_WEIGHT => DestAttr::Weight(u32_of(v, "IPVS_DEST_ATTR_WEIGHT")?),
            IPVS_DEST_ATTR_U_THRESH => {
                DestAttr::UpperThreshold(u32_of(v, "IPVS_DEST_ATTR_U_THRESH")?)
            }
            IPVS_DEST_ATTR_L_THRESH => {
                DestAttr::LowerThreshold(u32_of(v, "IPVS_DEST_ATTR_L_THRESH")?)
            }
            IPVS_DEST_ATTR_ACTIVE_CONNS => {
                DestAttr::ActiveConns(u32_of(v, "IPVS_DEST_ATTR_ACTIVE_CONNS")?)
            }
            IPVS_DEST_ATTR_INACT_CONNS => {
                DestAttr::InactConns(u32_of(v, "IPVS_DEST_ATTR_INACT_CONNS")?)
            }
            IPVS_DEST_ATTR_PERSIST_CONNS => {
                DestAttr::PersistConns(u32_of(v, "IPVS_DEST_ATTR_PERSIST_CONNS")?)
            }
            IPVS_DEST_ATTR_ADDR_FAMILY => {
                DestAttr::AddrFamily(parse_u16(v).context("invalid IPVS_DEST_ATTR_ADDR_FAMILY")?)
            }
            _ => DestAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// A top-level IPVS attribute (`IPVS_CMD_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IpvsCmdAttr {
    /// `IPVS_CMD_ATTR_SERVICE`
    Service(Vec<ServiceAttr>),
    /// `IPVS_CMD_ATTR_DEST`
    Dest(Vec<DestAttr>),
    /// `IPVS_CMD_ATTR_TIMEOUT_TCP` (seconds)
    TimeoutTcp(u32),
    /// `IPVS_CMD_ATTR_TIMEOUT_TCP_FIN` (seconds)
    TimeoutTcpFin(u32),
    /// `IPVS_CMD_ATTR_TIMEOUT_UDP` (seconds)
    TimeoutUdp(u32),
    /// Daemon attributes and anything newer.
    Other(DefaultNla),
}

impl Nla for IpvsCmdAttr {
    fn value_len(&self) -> usize {
        match self {
            IpvsCmdAttr::Service(a) => a.as_slice().buffer_len(),
            IpvsCmdAttr::Dest(a) => a.as_slice().buffer_len(),
            IpvsCmdAttr::TimeoutTcp(_)
            | IpvsCmdAttr::TimeoutTcpFin(_)
            | IpvsCmdAttr::TimeoutUdp(_) => 4,
            IpvsCmdAttr::Other(n) => n.value_len(),
        }
    }
    fn kind(&self) -> u16 {
        match self {
            // Nested, flagged as such like ipvsadm (libnl) sends them.
            IpvsCmdAttr::Service(_) => IPVS_CMD_ATTR_SERVICE | netlink_packet_core::NLA_F_NESTED,
            IpvsCmdAttr::Dest(_) => IPVS_CMD_ATTR_DEST | netlink_packet_core::NLA_F_NESTED,
            IpvsCmdAttr::TimeoutTcp(_) => IPVS_CMD_ATTR_TIMEOUT_TCP,
            IpvsCmdAttr::TimeoutTcpFin(_) => IPVS_CMD_ATTR_TIMEOUT_TCP_FIN,
            IpvsCmdAttr::TimeoutUdp(_) => IPVS_CMD_ATTR_TIMEOUT_UDP,
            IpvsCmdAttr::Other(n) => n.kind(),
        }
    }
    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            IpvsCmdAttr::Service(a) => emit_nested(a, buf),
            IpvsCmdAttr::Dest(a) => emit_nested(a, buf),
            IpvsCmdAttr::TimeoutTcp(v)
            | IpvsCmdAttr::TimeoutTcpFin(v)
            | IpvsCmdAttr::TimeoutUdp(v) => emit_u32(buf, *v).unwrap(),
            IpvsCmdAttr::Other(n) => n.emit_value(buf),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for IpvsCmdAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPVS_CMD_ATTR_SERVICE => IpvsCmdAttr::Service(parse_nlas(v, "IPVS_CMD_ATTR_SERVICE")?),
            IPVS_CMD_ATTR_DEST => IpvsCmdAttr::Dest(parse_nlas(v, "IPVS_CMD_ATTR_DEST")?),
            IPVS_CMD_ATTR_TIMEOUT_TCP => {
                IpvsCmdAttr::TimeoutTcp(u32_of(v, "IPVS_CMD_ATTR_TIMEOUT_TCP")?)
            }
            IPVS_CMD_ATTR_TIMEOUT_TCP_FIN => {
                IpvsCmdAttr::TimeoutTcpFin(u32_of(v, "IPVS_CMD_ATTR_TIMEOUT_TCP_FIN")?)
            }
            IPVS_CMD_ATTR_TIMEOUT_UDP => {
                IpvsCmdAttr::TimeoutUdp(u32_of(v, "IPVS_CMD_ATTR_TIMEOUT_UDP")?)
            }
            _ => IpvsCmdAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// One IPVS generic netlink message: genl header + attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsMessage {
    /// genl header; `cmd` is an `IPVS_CMD_*`.
    pub header: GenlHeader,
    /// Attributes.
    pub attributes: Vec<IpvsCmdAttr>,
}

impl IpvsMessage {
    /// A message for `cmd` with `IPVS_GENL_VERSION`.
    pub fn new(cmd: u8, attributes: Vec<IpvsCmdAttr>) -> Self {
        IpvsMessage {
            header: GenlHeader {
                cmd,
                version: IPVS_GENL_VERSION,
            },
            attributes,
        }
    }
}

impl Emitable for IpvsMessage {
    fn buffer_len(&self) -> usize {
        GENL_HDRLEN + self.attributes.as_slice().buffer_len()
    }
    fn emit(&self, buf: &mut [u8]) {
        self.header.emit(buf);
        self.attributes.as_slice().emit(&mut buf[GENL_HDRLEN..]);
    }
}

impl Parseable<[u8]> for IpvsMessage {
    fn parse(buf: &[u8]) -> Result<Self, DecodeError> {
        let header = GenlHeader::parse(buf).context("failed to parse IPVS genl header")?;
        Ok(IpvsMessage {
            header,
            attributes: parse_nlas(&buf[GENL_HDRLEN..], "IPVS message")
                .with_context(|| format!("IPVS command {}", header.cmd))?,
        })
    }
}

/// A genl message of a given family id, for `NetlinkMessage` framing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Genl<M> {
    pub(crate) family_id: u16,
    pub(crate) msg: M,
}

impl<M: Emitable> netlink_packet_core::NetlinkSerializable for Genl<M> {
    fn message_type(&self) -> u16 {
        self.family_id
    }
    fn buffer_len(&self) -> usize {
        self.msg.buffer_len()
    }
    fn serialize(&self, buf: &mut [u8]) {
        self.msg.emit(buf)
    }
}

impl<M: Parseable<[u8]>> netlink_packet_core::NetlinkDeserializable for Genl<M> {
    type Error = DecodeError;
    fn deserialize(
        header: &netlink_packet_core::NetlinkHeader,
        payload: &[u8],
    ) -> Result<Self, DecodeError> {
        Ok(Genl {
            family_id: header.message_type,
            msg: M::parse(payload)?,
        })
    }
}
