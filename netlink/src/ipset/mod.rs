//! ipset over nfnetlink (`NFNL_SUBSYS_IPSET`): create/destroy/flush/swap sets,
//! add/del/test members (bulk adds pack thousands of members per message), and
//! list sets back with typed members.
//!
//! [`IpsetHandle`] is the `ipset` CLI equivalent; [`codec`] holds the wire codec.

pub mod codec;

use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use netlink_packet_core::{DecodeError, Emitable, NLM_F_CREATE, NLM_F_EXCL};
use netlink_sys::protocols::NETLINK_NETFILTER;

use self::codec::*;
use crate::sock::{NlSocket, SockError};

/// Default `hashsize` of hash sets, as the `ipset` CLI.
pub const DEFAULT_HASHSIZE: u32 = 1024;
/// Default `maxelem` of hash sets, as the `ipset` CLI.
pub const DEFAULT_MAXELEM: u32 = 65536;
/// Budget for the `IPSET_ATTR_ADT` nest of one bulk message (attribute lengths
/// are u16, so one nest must stay below 64 KiB).
const ADT_BUDGET: usize = 60 * 1024;

/// Errors of ipset requests, named by phase.
#[derive(Debug, thiserror::Error)]
pub enum IpsetError {
    /// Opening the socket or negotiating the protocol.
    #[error("opening ipset netlink socket: {0}")]
    Open(String),
    /// The kernel rejected a request.
    #[error("ipset {what} failed: {} (errno {errno}){}",
        ipset_strerror(*errno).map(str::to_string).unwrap_or_else(|| io::Error::from_raw_os_error(*errno).to_string()),
        message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Kernel {
        /// What was requested (`"add 3 members to kube-svc"`).
        what: String,
        /// Positive errno (`IPSET_ERR_*` values are > 4096).
        errno: i32,
        /// Extended ack text.
        message: Option<String>,
    },
    /// I/O or a reply that did not decode.
    #[error("ipset {what}: {detail}")]
    Transport {
        /// What was requested.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// A listed set could not be typed.
    #[error("decoding ipset {what}: {source}")]
    Decode {
        /// What was decoded.
        what: String,
        /// Why.
        #[source]
        source: DecodeError,
    },
    /// A request we refuse to send.
    #[error("invalid ipset request: {0}")]
    Invalid(String),
}

impl IpsetError {
    /// The kernel errno, if the kernel rejected the request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            IpsetError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

fn sock_err(what: &str, e: SockError) -> IpsetError {
    match e {
        SockError::Kernel { errno, message } => IpsetError::Kernel {
            what: what.to_string(),
            errno,
            message,
        },
        e => IpsetError::Transport {
            what: what.to_string(),
            detail: e.to_string(),
        },
    }
}

/// Set types we create and type members for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IpsetType {
    /// `hash:ip`
    HashIp,
    /// `hash:ip,port`
    HashIpPort,
    /// `hash:ip,port,ip`
    HashIpPortIp,
    /// `hash:ip,port,net`
    HashIpPortNet,
    /// `hash:net`
    HashNet,
    /// `bitmap:port` (needs a port range)
    BitmapPort,
}

impl IpsetType {
    /// The kernel type name.
    pub fn name(self) -> &'static str {
        match self {
            IpsetType::HashIp => "hash:ip",
            IpsetType::HashIpPort => "hash:ip,port",
            IpsetType::HashIpPortIp => "hash:ip,port,ip",
            IpsetType::HashIpPortNet => "hash:ip,port,net",
            IpsetType::HashNet => "hash:net",
            IpsetType::BitmapPort => "bitmap:port",
        }
    }

    /// From a kernel type name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "hash:ip" => IpsetType::HashIp,
            "hash:ip,port" => IpsetType::HashIpPort,
            "hash:ip,port,ip" => IpsetType::HashIpPortIp,
            "hash:ip,port,net" => IpsetType::HashIpPortNet,
            "hash:net" => IpsetType::HashNet,
            "bitmap:port" => IpsetType::BitmapPort,
            _ => return None,
        })
    }

    fn is_hash(self) -> bool {
        !matches!(self, IpsetType::BitmapPort)
    }
}

/// Address family of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpsetFamily {
    /// `family inet` (`NFPROTO_IPV4`)
    Inet,
    /// `family inet6` (`NFPROTO_IPV6`)
    Inet6,
    /// No family (`bitmap:port`)
    Unspec,
}

impl IpsetFamily {
    /// The `NFPROTO_*` value.
    pub fn nfproto(self) -> u8 {
        match self {
            IpsetFamily::Inet => NFPROTO_IPV4,
            IpsetFamily::Inet6 => NFPROTO_IPV6,
            IpsetFamily::Unspec => NFPROTO_UNSPEC,
        }
    }

    /// From an `NFPROTO_*` value.
    pub fn from_nfproto(v: u8) -> Option<Self> {
        Some(match v {
            NFPROTO_IPV4 => IpsetFamily::Inet,
            NFPROTO_IPV6 => IpsetFamily::Inet6,
            NFPROTO_UNSPEC => IpsetFamily::Unspec,
            _ => return None,
        })
    }
}

/// How to create a set (`ipset create NAME TYPE …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpsetCreate {
    /// Set name (at most 31 bytes).
    pub name: String,
    /// Set type.
    pub kind: IpsetType,
    /// Family; `bitmap:port` is always [`IpsetFamily::Unspec`].
    pub family: IpsetFamily,
    /// `hashsize` (hash types).
    pub hashsize: u32,
    /// `maxelem` (hash types).
    pub maxelem: u32,
    /// `range FROM-TO` (bitmap:port).
    pub port_range: Option<(u16, u16)>,
}

impl IpsetCreate {
    /// A hash set with the CLI's defaults.
    pub fn hash(name: &str, kind: IpsetType, family: IpsetFamily) -> Self {
        IpsetCreate {
            name: name.to_string(),
            kind,
            family,
            hashsize: DEFAULT_HASHSIZE,
            maxelem: DEFAULT_MAXELEM,
            port_range: None,
        }
    }

    /// A `bitmap:port` set over `from..=to`.
    pub fn bitmap_port(name: &str, from: u16, to: u16) -> Self {
        IpsetCreate {
            name: name.to_string(),
            kind: IpsetType::BitmapPort,
            family: IpsetFamily::Unspec,
            hashsize: 0,
            maxelem: 0,
            port_range: Some((from, to)),
        }
    }

    /// Set `maxelem`.
    #[must_use]
    pub fn maxelem(mut self, maxelem: u32) -> Self {
        self.maxelem = maxelem;
        self
    }

    /// The `IPSET_ATTR_DATA` of the CREATE request.
    pub fn header_attrs(&self) -> Vec<HeaderAttr> {
        match (self.kind.is_hash(), self.port_range) {
            (false, Some((from, to))) => vec![HeaderAttr::Port(from), HeaderAttr::PortTo(to)],
            (false, None) => vec![],
            (true, _) => vec![
                HeaderAttr::HashSize(self.hashsize),
                HeaderAttr::MaxElem(self.maxelem),
            ],
        }
    }
}

/// One member of a set, by set type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum IpsetMember {
    /// `hash:ip`: `IP`
    Ip(IpAddr),
    /// `hash:ip,port`: `IP,PROTO:PORT`
    IpPort {
        /// Address.
        ip: IpAddr,
        /// `IPPROTO_*`.
        proto: u8,
        /// Port.
        port: u16,
    },
    /// `hash:ip,port,ip`: `IP,PROTO:PORT,IP2`
    IpPortIp {
        /// First address.
        ip: IpAddr,
        /// `IPPROTO_*`.
        proto: u8,
        /// Port.
        port: u16,
        /// Second address.
        ip2: IpAddr,
    },
    /// `hash:ip,port,net`: `IP,PROTO:PORT,NET/CIDR`
    IpPortNet {
        /// Address.
        ip: IpAddr,
        /// `IPPROTO_*`.
        proto: u8,
        /// Port.
        port: u16,
        /// Network address.
        net: IpAddr,
        /// Prefix length.
        cidr: u8,
    },
    /// `hash:net`: `NET/CIDR`
    Net {
        /// Network address.
        addr: IpAddr,
        /// Prefix length.
        cidr: u8,
    },
    /// `bitmap:port`: `PORT`
    Port(u16),
}

impl IpsetMember {
    /// The element attributes of this member.
    pub fn to_attrs(&self) -> Vec<ElemAttr> {
        match self {
            IpsetMember::Ip(ip) => vec![ElemAttr::Ip(*ip)],
            IpsetMember::IpPort { ip, proto, port } => vec![
                ElemAttr::Ip(*ip),
                ElemAttr::Port(*port),
                ElemAttr::Proto(*proto),
            ],
            IpsetMember::IpPortIp {
                ip,
                proto,
                port,
                ip2,
            } => vec![
                ElemAttr::Ip(*ip),
                ElemAttr::Port(*port),
                ElemAttr::Proto(*proto),
                ElemAttr::Ip2(*ip2),
            ],
            IpsetMember::IpPortNet {
                ip,
                proto,
                port,
                net,
                cidr,
            } => vec![
                ElemAttr::Ip(*ip),
                ElemAttr::Port(*port),
                ElemAttr::Proto(*proto),
                ElemAttr::Ip2(*net),
                ElemAttr::Cidr2(*cidr),
            ],
            IpsetMember::Net { addr, cidr } => vec![ElemAttr::Ip(*addr), ElemAttr::Cidr(*cidr)],
            IpsetMember::Port(p) => vec![ElemAttr::Port(*p)],
        }
    }

    /// Type the element attributes of a set of type `kind`.
    pub fn from_attrs(kind: IpsetType, attrs: &[ElemAttr]) -> Result<Self, DecodeError> {
        let (mut ip, mut ip2, mut cidr, mut cidr2, mut port, mut proto) =
            (None, None, None, None, None, None);
        for a in attrs {
            match a {
                ElemAttr::Ip(v) => ip = Some(*v),
                ElemAttr::Ip2(v) => ip2 = Some(*v),
                ElemAttr::Cidr(v) => cidr = Some(*v),
                ElemAttr::Cidr2(v) => cidr2 = Some(*v),
                ElemAttr::Port(v) => port = Some(*v),
                ElemAttr::Proto(v) => proto = Some(*v),
                _ => {}
            }
        }
        let need = |what: &str| DecodeError::from(format!("{} member without {what}", kind.name()));
        let ip = || ip.ok_or_else(|| need("IPSET_ATTR_IP"));
        let port = || port.ok_or_else(|| need("IPSET_ATTR_PORT"));
        let proto = || proto.ok_or_else(|| need("IPSET_ATTR_PROTO"));
        let ip2 = || ip2.ok_or_else(|| need("IPSET_ATTR_IP2"));
        Ok(match kind {
            IpsetType::HashIp => IpsetMember::Ip(ip()?),
            IpsetType::HashIpPort => IpsetMember::IpPort {
                ip: ip()?,
                proto: proto()?,
                port: port()?,
            },
            IpsetType::HashIpPortIp => IpsetMember::IpPortIp {
                ip: ip()?,
                proto: proto()?,
                port: port()?,
                ip2: ip2()?,
            },
            IpsetType::HashIpPortNet => {
                let net = ip2()?;
                IpsetMember::IpPortNet {
                    ip: ip()?,
                    proto: proto()?,
                    port: port()?,
                    net,
                    cidr: cidr2.unwrap_or(if net.is_ipv4() { 32 } else { 128 }),
                }
            }
            IpsetType::HashNet => {
                let addr = ip()?;
                IpsetMember::Net {
                    addr,
                    cidr: cidr.unwrap_or(if addr.is_ipv4() { 32 } else { 128 }),
                }
            }
            IpsetType::BitmapPort => IpsetMember::Port(port()?),
        })
    }
}

/// A set as listed by the kernel (`ipset list NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpsetListing {
    /// Set name.
    pub name: String,
    /// Kernel type name (`hash:ip`).
    pub type_name: String,
    /// Type revision in use.
    pub revision: u8,
    /// Family.
    pub family: u8,
    /// Header attributes (hashsize, maxelem, references, elements, …).
    pub header: Vec<HeaderAttr>,
    /// Raw element attributes, in kernel order.
    pub entries: Vec<Vec<ElemAttr>>,
}

impl IpsetListing {
    /// Members typed by the set type; `None` for types we do not model.
    pub fn members(&self) -> Option<Result<Vec<IpsetMember>, DecodeError>> {
        let kind = IpsetType::from_name(&self.type_name)?;
        Some(
            self.entries
                .iter()
                .map(|e| IpsetMember::from_attrs(kind, e))
                .collect(),
        )
    }

    /// `IPSET_ATTR_ELEMENTS` of the header.
    pub fn element_count(&self) -> Option<u32> {
        self.header.iter().find_map(|h| match h {
            HeaderAttr::Elements(n) => Some(*n),
            _ => None,
        })
    }

    /// `IPSET_ATTR_MAXELEM` / `IPSET_ATTR_HASHSIZE` of the header.
    pub fn hash_params(&self) -> (Option<u32>, Option<u32>) {
        let mut hs = None;
        let mut me = None;
        for h in &self.header {
            match h {
                HeaderAttr::HashSize(v) => hs = Some(*v),
                HeaderAttr::MaxElem(v) => me = Some(*v),
                _ => {}
            }
        }
        (hs, me)
    }
}

/// Merge `IPSET_CMD_LIST` dump messages (a large set spans several messages with
/// the same set name; only the first carries type and header) into listings.
pub fn parse_listings(msgs: &[IpsetMessage]) -> Vec<IpsetListing> {
    let mut out: Vec<IpsetListing> = Vec::new();
    for m in msgs {
        let Some(name) = m.attributes.iter().find_map(|a| match a {
            IpsetAttr::SetName(n) => Some(n.clone()),
            _ => None,
        }) else {
            continue;
        };
        if out.last().is_none_or(|l| l.name != name) {
            out.push(IpsetListing {
                name,
                type_name: String::new(),
                revision: 0,
                family: 0,
                header: vec![],
                entries: vec![],
            });
        }
        let l = out.last_mut().expect("pushed above");
        for a in &m.attributes {
            match a {
                IpsetAttr::TypeName(t) => l.type_name = t.clone(),
                IpsetAttr::Revision(r) => l.revision = *r,
                IpsetAttr::Family(f) => l.family = *f,
                IpsetAttr::Header(h) => l.header = h.clone(),
                IpsetAttr::Adt(entries) => l.entries.extend(entries.iter().map(|e| e.0.clone())),
                _ => {}
            }
        }
    }
    out
}

/// Split `members` into `IPSET_ATTR_ADT` batches that fit one message.
pub fn adt_batches(members: &[IpsetMember]) -> Vec<Vec<AdtEntry>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut size = 0;
    for m in members {
        let e = AdtEntry(m.to_attrs());
        let len = e.buffer_len();
        if size + len > ADT_BUDGET && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
            size = 0;
        }
        size += len;
        cur.push(e);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[derive(Debug)]
struct Conn {
    sock: NlSocket,
    protocol: u8,
}

/// Handle to ipset in the network namespace it was opened in: the `ipset` CLI
/// equivalent. Cloning shares one socket.
#[derive(Debug, Clone)]
pub struct IpsetHandle {
    conn: Arc<Mutex<Conn>>,
}

fn check_name(name: &str) -> Result<(), IpsetError> {
    if name.is_empty() || name.len() >= IPSET_MAXNAMELEN || name.contains('\0') {
        return Err(IpsetError::Invalid(format!(
            "set name {name:?} must be 1..{} bytes",
            IPSET_MAXNAMELEN - 1
        )));
    }
    Ok(())
}

impl IpsetHandle {
    /// Open a NETLINK_NETFILTER socket in the calling thread's netns and
    /// negotiate the protocol (`IPSET_CMD_PROTOCOL`): the highest version both
    /// sides speak.
    pub fn new() -> Result<Self, IpsetError> {
        let mut sock =
            NlSocket::open(NETLINK_NETFILTER).map_err(|e| IpsetError::Open(e.to_string()))?;
        let req = IpsetMessage::new(
            IPSET_CMD_PROTOCOL,
            vec![IpsetAttr::Protocol(IPSET_PROTOCOL)],
        );
        let replies = sock
            .request(0, req)
            .map_err(|e| IpsetError::Open(format!("IPSET_CMD_PROTOCOL: {e}")))?;
        let mut kmax = None;
        let mut kmin = IPSET_PROTOCOL_MIN;
        for r in &replies {
            for a in &r.attributes {
                match a {
                    IpsetAttr::Protocol(p) => kmax = Some(*p),
                    IpsetAttr::ProtocolMin(p) => kmin = *p,
                    _ => {}
                }
            }
        }
        let kmax =
            kmax.ok_or_else(|| IpsetError::Open("no IPSET_ATTR_PROTOCOL in reply".into()))?;
        let protocol = kmax.min(IPSET_PROTOCOL);
        if protocol < IPSET_PROTOCOL_MIN || protocol < kmin {
            return Err(IpsetError::Open(format!(
                "kernel speaks ipset protocol {kmin}..={kmax}, we speak {IPSET_PROTOCOL_MIN}..={IPSET_PROTOCOL}"
            )));
        }
        Ok(IpsetHandle {
            conn: Arc::new(Mutex::new(Conn { sock, protocol })),
        })
    }

    /// The negotiated protocol version.
    pub fn protocol(&self) -> u8 {
        self.lock().protocol
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn call(
        &self,
        what: &str,
        cmd: u8,
        flags: u16,
        mut attrs: Vec<IpsetAttr>,
    ) -> Result<Vec<IpsetMessage>, IpsetError> {
        let mut c = self.lock();
        attrs.insert(0, IpsetAttr::Protocol(c.protocol));
        c.sock
            .request(flags, IpsetMessage::new(cmd, attrs))
            .map_err(|e| sock_err(what, e))
    }

    /// Supported revisions `(min, max)` of a set type: `IPSET_CMD_TYPE`.
    pub fn type_revisions(
        &self,
        kind: IpsetType,
        family: IpsetFamily,
    ) -> Result<(u8, u8), IpsetError> {
        let what = format!("type lookup {}", kind.name());
        let replies = self.call(
            &what,
            IPSET_CMD_TYPE,
            0,
            vec![
                IpsetAttr::TypeName(kind.name().into()),
                IpsetAttr::Family(family.nfproto()),
            ],
        )?;
        let mut max = None;
        let mut min = 0;
        for a in replies.iter().flat_map(|r| &r.attributes) {
            match a {
                IpsetAttr::Revision(r) => max = Some(*r),
                IpsetAttr::ProtocolMin(r) => min = *r,
                _ => {}
            }
        }
        let max = max.ok_or_else(|| IpsetError::Transport {
            what,
            detail: "no IPSET_ATTR_REVISION in reply".into(),
        })?;
        Ok((min, max))
    }

    /// Create a set at the highest revision the kernel supports:
    /// `ipset create NAME TYPE family inet hashsize 1024 maxelem 65536 [-exist]`
    /// (`bitmap:port`: `ipset create NAME bitmap:port range FROM-TO`). With
    /// `exist_ok` an identical existing set is not an error.
    pub fn create(&self, c: &IpsetCreate, exist_ok: bool) -> Result<(), IpsetError> {
        check_name(&c.name)?;
        let family = if c.kind.is_hash() {
            if c.family == IpsetFamily::Unspec {
                return Err(IpsetError::Invalid(format!(
                    "{} needs a family",
                    c.kind.name()
                )));
            }
            c.family
        } else {
            if c.port_range.is_none() {
                return Err(IpsetError::Invalid("bitmap:port needs a port range".into()));
            }
            IpsetFamily::Unspec
        };
        let (_, revision) = self.type_revisions(c.kind, family)?;
        let flags = NLM_F_CREATE | if exist_ok { 0 } else { NLM_F_EXCL };
        self.call(
            &format!("create {} {}", c.name, c.kind.name()),
            IPSET_CMD_CREATE,
            flags,
            vec![
                IpsetAttr::SetName(c.name.clone()),
                IpsetAttr::TypeName(c.kind.name().into()),
                IpsetAttr::Revision(revision),
                IpsetAttr::Family(family.nfproto()),
                IpsetAttr::Header(c.header_attrs()),
            ],
        )
        .map(drop)
    }

    /// Destroy one set: `ipset destroy NAME`. (Never all sets.)
    pub fn destroy(&self, name: &str) -> Result<(), IpsetError> {
        check_name(name)?;
        self.call(
            &format!("destroy {name}"),
            IPSET_CMD_DESTROY,
            0,
            vec![IpsetAttr::SetName(name.into())],
        )
        .map(drop)
    }

    /// Remove all members of one set: `ipset flush NAME`. (Never all sets.)
    pub fn flush(&self, name: &str) -> Result<(), IpsetError> {
        check_name(name)?;
        self.call(
            &format!("flush {name}"),
            IPSET_CMD_FLUSH,
            0,
            vec![IpsetAttr::SetName(name.into())],
        )
        .map(drop)
    }

    /// Exchange the contents of two sets of compatible types: `ipset swap A B`.
    pub fn swap(&self, a: &str, b: &str) -> Result<(), IpsetError> {
        check_name(a)?;
        check_name(b)?;
        self.call(
            &format!("swap {a} {b}"),
            IPSET_CMD_SWAP,
            0,
            vec![IpsetAttr::SetName(a.into()), IpsetAttr::TypeName(b.into())],
        )
        .map(drop)
    }

    fn adt(
        &self,
        cmd: u8,
        verb: &str,
        name: &str,
        members: &[IpsetMember],
        tolerant: bool,
    ) -> Result<(), IpsetError> {
        check_name(name)?;
        let flags = if tolerant { 0 } else { NLM_F_EXCL };
        let mut done = 0;
        for batch in adt_batches(members) {
            let n = batch.len();
            let what = format!(
                "{verb} members {}..{} of {} in {name}",
                done,
                done + n,
                members.len()
            );
            self.call(
                &what,
                cmd,
                flags,
                // The kernel requires IPSET_ATTR_LINENO next to IPSET_ATTR_ADT.
                vec![
                    IpsetAttr::SetName(name.into()),
                    IpsetAttr::LineNo(0),
                    IpsetAttr::Adt(batch),
                ],
            )?;
            done += n;
        }
        Ok(())
    }

    /// Add members, many per message: `ipset add NAME M [-exist]` / `ipset
    /// restore`. With `exist_ok` members already present are not an error;
    /// without, the first duplicate fails its batch (members before it in the
    /// batch stay added, as with `ipset restore`).
    pub fn add(
        &self,
        name: &str,
        members: &[IpsetMember],
        exist_ok: bool,
    ) -> Result<(), IpsetError> {
        self.adt(IPSET_CMD_ADD, "add", name, members, exist_ok)
    }

    /// Delete members, many per message: `ipset del NAME M [-exist]`. With
    /// `missing_ok` absent members are not an error.
    pub fn del(
        &self,
        name: &str,
        members: &[IpsetMember],
        missing_ok: bool,
    ) -> Result<(), IpsetError> {
        self.adt(IPSET_CMD_DEL, "delete", name, members, missing_ok)
    }

    /// Whether `member` is in the set: `ipset test NAME M`.
    pub fn test(&self, name: &str, member: &IpsetMember) -> Result<bool, IpsetError> {
        check_name(name)?;
        match self.call(
            &format!("test {name}"),
            IPSET_CMD_TEST,
            0,
            vec![
                IpsetAttr::SetName(name.into()),
                IpsetAttr::Elem(member.to_attrs()),
            ],
        ) {
            Ok(_) => Ok(true),
            Err(IpsetError::Kernel { errno, .. }) if errno == IPSET_ERR_EXIST => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn list_dump(
        &self,
        what: &str,
        attrs: Vec<IpsetAttr>,
    ) -> Result<Vec<IpsetListing>, IpsetError> {
        let mut c = self.lock();
        let mut a = vec![IpsetAttr::Protocol(c.protocol)];
        a.extend(attrs);
        let msgs = c
            .sock
            .dump(IpsetMessage::new(IPSET_CMD_LIST, a))
            .map_err(|e| sock_err(what, e))?;
        Ok(parse_listings(&msgs))
    }

    /// One set with header and members: `ipset list NAME`.
    pub fn list(&self, name: &str) -> Result<IpsetListing, IpsetError> {
        check_name(name)?;
        let what = format!("list {name}");
        self.list_dump(&what, vec![IpsetAttr::SetName(name.into())])?
            .into_iter()
            .find(|l| l.name == name)
            .ok_or_else(|| IpsetError::Transport {
                what,
                detail: "set missing from the dump".into(),
            })
    }

    /// One set's members, typed: `ipset list NAME` (members part).
    pub fn members(&self, name: &str) -> Result<Vec<IpsetMember>, IpsetError> {
        let l = self.list(name)?;
        match l.members() {
            Some(r) => r.map_err(|source| IpsetError::Decode {
                what: format!("members of {name} ({})", l.type_name),
                source,
            }),
            None => Err(IpsetError::Invalid(format!(
                "set {name} has type {} that we do not model",
                l.type_name
            ))),
        }
    }

    /// Names of all sets: `ipset list -n`.
    pub fn list_names(&self) -> Result<Vec<String>, IpsetError> {
        Ok(self
            .list_dump("list -n", vec![IpsetAttr::Flags(IPSET_FLAG_LIST_SETNAME)])?
            .into_iter()
            .map(|l| l.name)
            .collect())
    }
}
