//! IPVS over generic netlink (family `"IPVS"`, resolved at runtime with
//! `CTRL_CMD_GETFAMILY`): virtual services, their real servers and the
//! connection timeouts. There is deliberately no flush.
//!
//! [`IpvsHandle`] is the `ipvsadm` equivalent; [`codec`] holds the wire codecs.

pub mod codec;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use netlink_packet_core::{DecodeError, NLM_F_ACK};
use netlink_sys::protocols::NETLINK_GENERIC;

use self::codec::*;
use crate::sock::{NlSocket, SockError};

/// `AF_INET`
pub const AF_INET: u16 = 2;
/// `AF_INET6`
pub const AF_INET6: u16 = 10;

/// Errors of IPVS requests, named by phase.
#[derive(Debug, thiserror::Error)]
pub enum IpvsError {
    /// The `IPVS` generic netlink family is not registered (no `ip_vs` module).
    #[error("generic netlink family \"IPVS\" not found: is the ip_vs module loaded?")]
    FamilyNotFound,
    /// Opening the socket or resolving the family.
    #[error("opening IPVS generic netlink socket: {0}")]
    Open(String),
    /// The kernel rejected a request.
    #[error("IPVS {what} failed: {} (errno {errno}){}",
        io::Error::from_raw_os_error(*errno),
        message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Kernel {
        /// What was requested (`"add service tcp/10.0.0.1:80"`).
        what: String,
        /// Positive errno.
        errno: i32,
        /// Extended ack text.
        message: Option<String>,
    },
    /// I/O or a reply that did not decode.
    #[error("IPVS {what}: {detail}")]
    Transport {
        /// What was requested.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// A dumped object lacks a required attribute or is malformed.
    #[error("decoding IPVS {what}: {source}")]
    Decode {
        /// What was decoded.
        what: String,
        /// Why.
        #[source]
        source: DecodeError,
    },
    /// A value we were asked to send is invalid.
    #[error("invalid IPVS request: {0}")]
    Invalid(String),
}

fn sock_err(what: &str, e: SockError) -> IpvsError {
    match e {
        SockError::Kernel { errno, message } => IpvsError::Kernel {
            what: what.to_string(),
            errno,
            message,
        },
        e => IpvsError::Transport {
            what: what.to_string(),
            detail: e.to_string(),
        },
    }
}

/// Transport protocol of a virtual service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum IpvsProtocol {
    /// `IPPROTO_TCP` (`ipvsadm -t`)
    Tcp,
    /// `IPPROTO_UDP` (`ipvsadm -u`)
    Udp,
    /// `IPPROTO_SCTP` (`ipvsadm --sctp-service`)
    Sctp,
    /// Any other protocol number.
    Other(u16),
}

impl IpvsProtocol {
    /// The `IPPROTO_*` number.
    pub fn number(self) -> u16 {
        match self {
            IpvsProtocol::Tcp => libc::IPPROTO_TCP as u16,
            IpvsProtocol::Udp => libc::IPPROTO_UDP as u16,
            IpvsProtocol::Sctp => libc::IPPROTO_SCTP as u16,
            IpvsProtocol::Other(n) => n,
        }
    }

    /// From an `IPPROTO_*` number.
    pub fn from_number(n: u16) -> Self {
        match n as i32 {
            libc::IPPROTO_TCP => IpvsProtocol::Tcp,
            libc::IPPROTO_UDP => IpvsProtocol::Udp,
            libc::IPPROTO_SCTP => IpvsProtocol::Sctp,
            _ => IpvsProtocol::Other(n),
        }
    }
}

/// Address family of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpvsFamily {
    /// `AF_INET`
    V4,
    /// `AF_INET6`
    V6,
}

impl IpvsFamily {
    /// `AF_INET` / `AF_INET6`.
    pub fn af(self) -> u16 {
        match self {
            IpvsFamily::V4 => AF_INET,
            IpvsFamily::V6 => AF_INET6,
        }
    }

    /// The family of `addr`.
    pub fn of(addr: &IpAddr) -> Self {
        if addr.is_ipv4() {
            IpvsFamily::V4
        } else {
            IpvsFamily::V6
        }
    }

    fn from_af(af: u16) -> Result<Self, DecodeError> {
        match af {
            AF_INET => Ok(IpvsFamily::V4),
            AF_INET6 => Ok(IpvsFamily::V6),
            _ => Err(format!("unknown address family {af}").into()),
        }
    }

    fn unspecified(self) -> IpAddr {
        match self {
            IpvsFamily::V4 => Ipv4Addr::UNSPECIFIED.into(),
            IpvsFamily::V6 => Ipv6Addr::UNSPECIFIED.into(),
        }
    }
}

fn to_inet_addr(addr: &IpAddr) -> [u8; NF_INET_ADDR_LEN] {
    let mut a = [0u8; NF_INET_ADDR_LEN];
    match addr {
        IpAddr::V4(v4) => a[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => a.copy_from_slice(&v6.octets()),
    }
    a
}

fn from_inet_addr(family: IpvsFamily, a: &[u8; NF_INET_ADDR_LEN]) -> IpAddr {
    match family {
        IpvsFamily::V4 => Ipv4Addr::new(a[0], a[1], a[2], a[3]).into(),
        IpvsFamily::V6 => Ipv6Addr::from(*a).into(),
    }
}

/// A virtual service (`ipvsadm -A`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpvsService {
    /// Address family.
    pub family: IpvsFamily,
    /// Protocol. For fwmark services the kernel reports TCP.
    pub protocol: IpvsProtocol,
    /// Virtual IP. Unspecified for fwmark services.
    pub addr: IpAddr,
    /// Virtual port. 0 for fwmark services.
    pub port: u16,
    /// Firewall mark: when set, the service is identified by it instead of
    /// protocol/addr/port (`ipvsadm -f`).
    pub fwmark: Option<u32>,
    /// Scheduler name (`rr`, `wrr`, `lc`, `sh`, …).
    pub scheduler: String,
    /// `IP_VS_SVC_F_*` flags, e.g. [`IP_VS_SVC_F_PERSISTENT`]. The kernel-only
    /// `IP_VS_SVC_F_HASHED` is dropped when parsing dumps.
    pub flags: u32,
    /// Persistence timeout in seconds (`ipvsadm -p`).
    pub timeout: u32,
    /// Persistence netmask (`ipvsadm -M`): for IPv4 a mask in host value
    /// (`0xffff_ffff` = /32, sent big-endian); for IPv6 a prefix length (1..=128).
    pub netmask: u32,
}

impl IpvsService {
    /// A TCP/UDP/SCTP service on `addr:port` with scheduler `rr`, not persistent,
    /// full-length netmask.
    pub fn new(protocol: IpvsProtocol, addr: IpAddr, port: u16) -> Self {
        let family = IpvsFamily::of(&addr);
        IpvsService {
            family,
            protocol,
            addr,
            port,
            fwmark: None,
            scheduler: "rr".into(),
            flags: 0,
            timeout: 0,
            netmask: match family {
                IpvsFamily::V4 => u32::MAX,
                IpvsFamily::V6 => 128,
            },
        }
    }

    /// Set the scheduler.
    #[must_use]
    pub fn scheduler(mut self, name: &str) -> Self {
        self.scheduler = name.to_string();
        self
    }

    /// Make the service persistent for `timeout` seconds (`ipvsadm -p`).
    #[must_use]
    pub fn persistent(mut self, timeout: u32) -> Self {
        self.flags |= IP_VS_SVC_F_PERSISTENT;
        self.timeout = timeout;
        self
    }

    fn netmask_bytes(&self) -> [u8; 4] {
        match self.family {
            IpvsFamily::V4 => self.netmask.to_be_bytes(),
            IpvsFamily::V6 => self.netmask.to_ne_bytes(),
        }
    }

    /// The attributes that identify the service (for DEL and as the parent of
    /// destination requests).
    pub fn id_attrs(&self) -> Vec<ServiceAttr> {
        let mut v = vec![ServiceAttr::Af(self.family.af())];
        match self.fwmark {
            Some(m) => v.push(ServiceAttr::Fwmark(m)),
            None => {
                v.push(ServiceAttr::Protocol(self.protocol.number()));
                v.push(ServiceAttr::Addr(to_inet_addr(&self.addr)));
                v.push(ServiceAttr::Port(self.port));
            }
        }
        v
    }

    /// All attributes, as sent by NEW/SET service.
    pub fn to_attrs(&self) -> Vec<ServiceAttr> {
        let mut v = self.id_attrs();
        v.push(ServiceAttr::SchedName(self.scheduler.clone()));
        v.push(ServiceAttr::Flags(IpvsFlags {
            flags: self.flags,
            mask: u32::MAX,
        }));
        v.push(ServiceAttr::Timeout(self.timeout));
        v.push(ServiceAttr::Netmask(self.netmask_bytes()));
        v
    }

    /// The typed service of a dumped `IPVS_CMD_ATTR_SERVICE`.
    pub fn from_attrs(attrs: &[ServiceAttr]) -> Result<Self, DecodeError> {
        let mut af = None;
        let mut protocol = None;
        let mut addr = None;
        let mut port = 0;
        let mut fwmark = None;
        let mut scheduler = String::new();
        let mut flags = 0;
        let mut timeout = 0;
        let mut netmask = [0u8; 4];
        for a in attrs {
            match a {
                ServiceAttr::Af(v) => af = Some(*v),
                ServiceAttr::Protocol(v) => protocol = Some(*v),
                ServiceAttr::Addr(v) => addr = Some(*v),
                ServiceAttr::Port(v) => port = *v,
                ServiceAttr::Fwmark(v) => fwmark = Some(*v),
                ServiceAttr::SchedName(v) => scheduler = v.clone(),
                ServiceAttr::Flags(f) => flags = f.flags & !IP_VS_SVC_F_HASHED,
                ServiceAttr::Timeout(v) => timeout = *v,
                ServiceAttr::Netmask(v) => netmask = *v,
                _ => {}
            }
        }
        let family = IpvsFamily::from_af(af.ok_or("service without IPVS_SVC_ATTR_AF")?)?;
        let fwmark = fwmark.filter(|m| *m != 0);
        let addr = match (fwmark, addr) {
            (None, Some(a)) => from_inet_addr(family, &a),
            (None, None) => return Err("service without IPVS_SVC_ATTR_ADDR or FWMARK".into()),
            (Some(_), _) => family.unspecified(),
        };
        let protocol = if fwmark.is_some() {
            IpvsProtocol::Tcp
        } else {
            IpvsProtocol::from_number(protocol.ok_or("service without IPVS_SVC_ATTR_PROTOCOL")?)
        };
        let netmask = match family {
            IpvsFamily::V4 => u32::from_be_bytes(netmask),
            IpvsFamily::V6 => u32::from_ne_bytes(netmask),
        };
        Ok(IpvsService {
            family,
            protocol,
            addr,
            port: if fwmark.is_some() { 0 } else { port },
            fwmark,
            scheduler,
            flags,
            timeout,
            netmask,
        })
    }

    fn describe(&self) -> String {
        match self.fwmark {
            Some(m) => format!("fwmark {m}"),
            None => match self.addr {
                IpAddr::V4(a) => format!("{:?} {a}:{}", self.protocol, self.port),
                IpAddr::V6(a) => format!("{:?} [{a}]:{}", self.protocol, self.port),
            },
        }
    }
}

/// How packets reach a real server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FwdMethod {
    /// `IP_VS_CONN_F_MASQ`: NAT (`ipvsadm -m`), what kube-proxy uses.
    Masq,
    /// `IP_VS_CONN_F_LOCALNODE`
    Local,
    /// `IP_VS_CONN_F_TUNNEL` (`ipvsadm -i`)
    Tunnel,
    /// `IP_VS_CONN_F_DROUTE` (`ipvsadm -g`)
    Route,
    /// Anything else.
    Other(u32),
}

impl FwdMethod {
    /// The `IP_VS_CONN_F_*` value.
    pub fn value(self) -> u32 {
        match self {
            FwdMethod::Masq => IP_VS_CONN_F_MASQ,
            FwdMethod::Local => IP_VS_CONN_F_LOCALNODE,
            FwdMethod::Tunnel => IP_VS_CONN_F_TUNNEL,
            FwdMethod::Route => IP_VS_CONN_F_DROUTE,
            FwdMethod::Other(v) => v,
        }
    }

    /// From an `IP_VS_CONN_F_*` value (only the forwarding bits).
    pub fn from_value(v: u32) -> Self {
        match v & 0x7 {
            IP_VS_CONN_F_MASQ => FwdMethod::Masq,
            IP_VS_CONN_F_LOCALNODE => FwdMethod::Local,
            IP_VS_CONN_F_TUNNEL => FwdMethod::Tunnel,
            IP_VS_CONN_F_DROUTE => FwdMethod::Route,
            _ => FwdMethod::Other(v),
        }
    }
}

/// A real server of a service (`ipvsadm -a`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpvsDestination {
    /// Real server address.
    pub addr: IpAddr,
    /// Real server port.
    pub port: u16,
    /// Forwarding method.
    pub fwd_method: FwdMethod,
    /// Weight (`-w`); 0 drains.
    pub weight: u32,
    /// Upper connection threshold (`-x`), 0 = none.
    pub upper_threshold: u32,
    /// Lower connection threshold (`-y`), 0 = none.
    pub lower_threshold: u32,
    /// Active connections (dump only, never sent).
    pub active_conns: u32,
    /// Inactive connections (dump only, never sent).
    pub inact_conns: u32,
    /// Persistent connection templates (dump only, never sent).
    pub persist_conns: u32,
}

impl IpvsDestination {
    /// A masquerading real server with weight 1.
    pub fn new(addr: IpAddr, port: u16) -> Self {
        IpvsDestination {
            addr,
            port,
            fwd_method: FwdMethod::Masq,
            weight: 1,
            upper_threshold: 0,
            lower_threshold: 0,
            active_conns: 0,
            inact_conns: 0,
            persist_conns: 0,
        }
    }

    /// Set the weight.
    #[must_use]
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The attributes that identify the destination within its service.
    pub fn id_attrs(&self) -> Vec<DestAttr> {
        vec![
            DestAttr::AddrFamily(IpvsFamily::of(&self.addr).af()),
            DestAttr::Addr(to_inet_addr(&self.addr)),
            DestAttr::Port(self.port),
        ]
    }

    /// All settable attributes, as sent by NEW/SET dest (no counters).
    pub fn to_attrs(&self) -> Vec<DestAttr> {
        let mut v = self.id_attrs();
        v.push(DestAttr::FwdMethod(self.fwd_method.value()));
        v.push(DestAttr::Weight(self.weight));
        v.push(DestAttr::UpperThreshold(self.upper_threshold));
        v.push(DestAttr::LowerThreshold(self.lower_threshold));
        v
    }

    /// The typed destination of a dumped `IPVS_CMD_ATTR_DEST`. `service_family`
    /// applies when the kernel omits `IPVS_DEST_ATTR_ADDR_FAMILY`.
    pub fn from_attrs(attrs: &[DestAttr], service_family: IpvsFamily) -> Result<Self, DecodeError> {
        let mut d = IpvsDestination::new(Ipv4Addr::UNSPECIFIED.into(), 0);
        let mut family = service_family;
        let mut addr = None;
        for a in attrs {
            match a {
                DestAttr::AddrFamily(af) => family = IpvsFamily::from_af(*af)?,
                DestAttr::Addr(v) => addr = Some(*v),
                DestAttr::Port(v) => d.port = *v,
                DestAttr::FwdMethod(v) => d.fwd_method = FwdMethod::from_value(*v),
                DestAttr::Weight(v) => d.weight = *v,
                DestAttr::UpperThreshold(v) => d.upper_threshold = *v,
                DestAttr::LowerThreshold(v) => d.lower_threshold = *v,
                DestAttr::ActiveConns(v) => d.active_conns = *v,
                DestAttr::InactConns(v) => d.inact_conns = *v,
                DestAttr::PersistConns(v) => d.persist_conns = *v,
                _ => {}
            }
        }
        d.addr = from_inet_addr(
            family,
            &addr.ok_or("destination without IPVS_DEST_ATTR_ADDR")?,
        );
        Ok(d)
    }
}

/// IPVS connection timeouts in seconds (`ipvsadm --set tcp tcpfin udp`). 0 in a
/// request leaves the value unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpvsTimeouts {
    /// Established TCP.
    pub tcp: u32,
    /// TCP after FIN.
    pub tcp_fin: u32,
    /// UDP.
    pub udp: u32,
}

/// Request messages, without the family id. Pure; used by the handle and the
/// codec tests.
pub mod request {
    use super::*;

    /// `IPVS_CMD_NEW_SERVICE` (`ipvsadm -A`).
    pub fn new_service(s: &IpvsService) -> IpvsMessage {
        IpvsMessage::new(
            IPVS_CMD_NEW_SERVICE,
            vec![IpvsCmdAttr::Service(s.to_attrs())],
        )
    }
    /// `IPVS_CMD_SET_SERVICE` (`ipvsadm -E`).
    pub fn set_service(s: &IpvsService) -> IpvsMessage {
        IpvsMessage::new(
            IPVS_CMD_SET_SERVICE,
            vec![IpvsCmdAttr::Service(s.to_attrs())],
        )
    }
    /// `IPVS_CMD_DEL_SERVICE` (`ipvsadm -D`).
    pub fn del_service(s: &IpvsService) -> IpvsMessage {
        IpvsMessage::new(
            IPVS_CMD_DEL_SERVICE,
            vec![IpvsCmdAttr::Service(s.id_attrs())],
        )
    }
    /// `IPVS_CMD_GET_SERVICE`, sent as a dump.
    pub fn get_services() -> IpvsMessage {
        IpvsMessage::new(IPVS_CMD_GET_SERVICE, vec![])
    }
    /// `IPVS_CMD_NEW_DEST` (`ipvsadm -a`).
    pub fn new_dest(s: &IpvsService, d: &IpvsDestination) -> IpvsMessage {
        IpvsMessage::new(
            IPVS_CMD_NEW_DEST,
            vec![
                IpvsCmdAttr::Service(s.id_attrs()),
                IpvsCmdAttr::Dest(d.to_attrs()),
            ],
        )
    }
    /// `IPVS_CMD_SET_DEST` (`ipvsadm -e`).
    pub fn set_dest(s: &IpvsService, d: &IpvsDestination) -> IpvsMessage {
        IpvsMessage::new(
            IPVS_CMD_SET_DEST,
            vec![
                IpvsCmdAttr::Service(s.id_attrs()),
                IpvsCmdAttr::Dest(d.to_attrs()),
            ],
        )
    }
    /// `IPVS_CMD_DEL_DEST` (`ipvsadm -d`).
    pub fn del_dest(s: &IpvsService, d: &IpvsDestination) -> IpvsMessage {
        IpvsMessage::new(
            IPVS_CMD_DEL_DEST,
            vec![
                IpvsCmdAttr::Service(s.id_attrs()),
                IpvsCmdAttr::Dest(d.id_attrs()),
            ],
        )
    }
    /// `IPVS_CMD_GET_DEST` for one service, sent as a dump.
    pub fn get_dests(s: &IpvsService) -> IpvsMessage {
        IpvsMessage::new(IPVS_CMD_GET_DEST, vec![IpvsCmdAttr::Service(s.id_attrs())])
    }
    /// `IPVS_CMD_GET_CONFIG`.
    pub fn get_config() -> IpvsMessage {
        IpvsMessage::new(IPVS_CMD_GET_CONFIG, vec![])
    }
    /// `IPVS_CMD_SET_CONFIG` with the three timeouts.
    pub fn set_config(t: &IpvsTimeouts) -> IpvsMessage {
        IpvsMessage::new(
            IPVS_CMD_SET_CONFIG,
            vec![
                IpvsCmdAttr::TimeoutTcp(t.tcp),
                IpvsCmdAttr::TimeoutTcpFin(t.tcp_fin),
                IpvsCmdAttr::TimeoutUdp(t.udp),
            ],
        )
    }
}

/// Parse the services of `IPVS_CMD_GET_SERVICE` dump replies.
pub fn parse_services(msgs: &[IpvsMessage]) -> Result<Vec<IpvsService>, DecodeError> {
    let mut out = Vec::new();
    for m in msgs {
        for a in &m.attributes {
            if let IpvsCmdAttr::Service(attrs) = a {
                out.push(IpvsService::from_attrs(attrs).context("IPVS_CMD_ATTR_SERVICE")?);
            }
        }
    }
    Ok(out)
}

/// Parse the timeouts of an `IPVS_CMD_GET_CONFIG` reply.
pub fn parse_timeouts(m: &IpvsMessage) -> IpvsTimeouts {
    let mut t = IpvsTimeouts::default();
    for a in &m.attributes {
        match a {
            IpvsCmdAttr::TimeoutTcp(v) => t.tcp = *v,
            IpvsCmdAttr::TimeoutTcpFin(v) => t.tcp_fin = *v,
            IpvsCmdAttr::TimeoutUdp(v) => t.udp = *v,
            _ => {}
        }
    }
    t
}

use netlink_packet_core::ErrorContext;

#[derive(Debug)]
struct Conn {
    sock: NlSocket,
    family_id: u16,
}

/// Requests [`IpvsHandle::apply_pipelined`] keeps in flight at once.
pub const PIPELINE_WINDOW: usize = 256;

/// One change of a pipelined batch ([`IpvsHandle::apply_pipelined`]).
#[derive(Debug, Clone, Copy)]
pub enum IpvsRequest<'a> {
    /// `ipvsadm -A`
    AddService(&'a IpvsService),
    /// `ipvsadm -E`
    UpdateService(&'a IpvsService),
    /// `ipvsadm -D`
    DelService(&'a IpvsService),
    /// `ipvsadm -a`
    AddDestination(&'a IpvsService, &'a IpvsDestination),
    /// `ipvsadm -e`
    UpdateDestination(&'a IpvsService, &'a IpvsDestination),
    /// `ipvsadm -d`
    DelDestination(&'a IpvsService, &'a IpvsDestination),
}

impl IpvsRequest<'_> {
    fn message(&self) -> IpvsMessage {
        match *self {
            IpvsRequest::AddService(s) => request::new_service(s),
            IpvsRequest::UpdateService(s) => request::set_service(s),
            IpvsRequest::DelService(s) => request::del_service(s),
            IpvsRequest::AddDestination(s, d) => request::new_dest(s, d),
            IpvsRequest::UpdateDestination(s, d) => request::set_dest(s, d),
            IpvsRequest::DelDestination(s, d) => request::del_dest(s, d),
        }
    }

    /// As the one-request methods name it in errors.
    fn describe(&self) -> String {
        match *self {
            IpvsRequest::AddService(s) => format!("add service {}", s.describe()),
            IpvsRequest::UpdateService(s) => format!("update service {}", s.describe()),
            IpvsRequest::DelService(s) => format!("delete service {}", s.describe()),
            IpvsRequest::AddDestination(s, d) => {
                format!("add destination {}:{} to {}", d.addr, d.port, s.describe())
            }
            IpvsRequest::UpdateDestination(s, d) => {
                format!(
                    "update destination {}:{} of {}",
                    d.addr,
                    d.port,
                    s.describe()
                )
            }
            IpvsRequest::DelDestination(s, d) => {
                format!(
                    "delete destination {}:{} of {}",
                    d.addr,
                    d.port,
                    s.describe()
                )
            }
        }
    }
}

/// Handle to IPVS in the network namespace it was opened in: the `ipvsadm`
/// equivalent. Cloning shares one socket.
#[derive(Debug, Clone)]
pub struct IpvsHandle {
    conn: Arc<Mutex<Conn>>,
}

impl IpvsHandle {
    /// Open a generic netlink socket in the calling thread's netns and resolve the
    /// `IPVS` family. [`IpvsError::FamilyNotFound`] when IPVS is not available.
    pub fn new() -> Result<Self, IpvsError> {
        let mut sock =
            NlSocket::open(NETLINK_GENERIC).map_err(|e| IpvsError::Open(e.to_string()))?;
        let req = Genl {
            family_id: GENL_ID_CTRL,
            msg: CtrlMessage::get_family(IPVS_GENL_NAME),
        };
        let replies = match sock.request(0, req) {
            Ok(r) => r,
            Err(SockError::Kernel { errno, .. }) if errno == libc::ENOENT => {
                return Err(IpvsError::FamilyNotFound);
            }
            Err(e) => return Err(IpvsError::Open(e.to_string())),
        };
        let family_id = replies
            .iter()
            .find_map(|r| r.msg.family_id())
            .ok_or(IpvsError::FamilyNotFound)?;
        Ok(IpvsHandle {
            conn: Arc::new(Mutex::new(Conn { sock, family_id })),
        })
    }

    /// The resolved generic netlink family id.
    pub fn family_id(&self) -> u16 {
        self.lock().family_id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn call(&self, what: &str, msg: IpvsMessage) -> Result<Vec<IpvsMessage>, IpvsError> {
        let mut c = self.lock();
        let family_id = c.family_id;
        let r = c
            .sock
            .request(NLM_F_ACK, Genl { family_id, msg })
            .map_err(|e| sock_err(what, e))?;
        Ok(r.into_iter().map(|g| g.msg).collect())
    }

    fn one(&self, r: IpvsRequest<'_>) -> Result<(), IpvsError> {
        self.call(&r.describe(), r.message()).map(drop)
    }

    fn dump(&self, what: &str, msg: IpvsMessage) -> Result<Vec<IpvsMessage>, IpvsError> {
        let mut c = self.lock();
        let family_id = c.family_id;
        let r = c
            .sock
            .dump(Genl { family_id, msg })
            .map_err(|e| sock_err(what, e))?;
        Ok(r.into_iter().map(|g| g.msg).collect())
    }

    fn check(s: &IpvsService) -> Result<(), IpvsError> {
        if s.scheduler.is_empty() || s.scheduler.len() >= IP_VS_SCHEDNAME_MAXLEN {
            return Err(IpvsError::Invalid(format!(
                "scheduler name {:?} must be 1..{} bytes",
                s.scheduler,
                IP_VS_SCHEDNAME_MAXLEN - 1
            )));
        }
        if s.fwmark.is_none() && IpvsFamily::of(&s.addr) != s.family {
            return Err(IpvsError::Invalid(format!(
                "service address {} is not {:?}",
                s.addr, s.family
            )));
        }
        Ok(())
    }

    /// Add a virtual service: `ipvsadm -A -t VIP:PORT -s SCHED [-p TIMEOUT]`.
    pub fn add_service(&self, s: &IpvsService) -> Result<(), IpvsError> {
        Self::check(s)?;
        self.one(IpvsRequest::AddService(s))
    }

    /// Change a virtual service: `ipvsadm -E …`.
    pub fn update_service(&self, s: &IpvsService) -> Result<(), IpvsError> {
        Self::check(s)?;
        self.one(IpvsRequest::UpdateService(s))
    }

    /// Delete a virtual service and its destinations: `ipvsadm -D -t VIP:PORT`.
    pub fn del_service(&self, s: &IpvsService) -> Result<(), IpvsError> {
        self.one(IpvsRequest::DelService(s))
    }

    /// Sends `requests` pipelined (up to [`PIPELINE_WINDOW`] in flight, in
    /// order) and returns each one's outcome: one round trip per window
    /// instead of one per request. A request may depend on an earlier one
    /// (a real server on the service added just before).
    pub fn apply_pipelined(&self, requests: &[IpvsRequest<'_>]) -> Vec<Result<(), IpvsError>> {
        let mut checked = Vec::with_capacity(requests.len());
        let mut msgs = Vec::with_capacity(requests.len());
        let family_id = self.lock().family_id;
        for r in requests {
            let invalid = match r {
                IpvsRequest::AddService(s) | IpvsRequest::UpdateService(s) => Self::check(s).err(),
                _ => None,
            };
            if invalid.is_none() {
                msgs.push(Genl {
                    family_id,
                    msg: r.message(),
                });
            }
            checked.push(invalid);
        }
        let mut sent = self
            .lock()
            .sock
            .request_pipelined(0, msgs, PIPELINE_WINDOW)
            .into_iter();
        requests
            .iter()
            .zip(checked)
            .map(|(r, invalid)| match invalid {
                Some(e) => Err(e),
                None => sent
                    .next()
                    .unwrap_or(Ok(()))
                    .map_err(|e| sock_err(&r.describe(), e)),
            })
            .collect()
    }

    /// All virtual services: `ipvsadm -Ln` (services only).
    pub fn list_services(&self) -> Result<Vec<IpvsService>, IpvsError> {
        let msgs = self.dump("list services", request::get_services())?;
        parse_services(&msgs).map_err(|source| IpvsError::Decode {
            what: "service dump".into(),
            source,
        })
    }

    /// Add a real server: `ipvsadm -a -t VIP:PORT -r RIP:RPORT -m -w W`.
    pub fn add_destination(&self, s: &IpvsService, d: &IpvsDestination) -> Result<(), IpvsError> {
        self.one(IpvsRequest::AddDestination(s, d))
    }

    /// Change a real server (weight, thresholds): `ipvsadm -e …`.
    pub fn update_destination(
        &self,
        s: &IpvsService,
        d: &IpvsDestination,
    ) -> Result<(), IpvsError> {
        self.one(IpvsRequest::UpdateDestination(s, d))
    }

    /// Remove a real server: `ipvsadm -d -t VIP:PORT -r RIP:RPORT`.
    pub fn del_destination(&self, s: &IpvsService, d: &IpvsDestination) -> Result<(), IpvsError> {
        self.one(IpvsRequest::DelDestination(s, d))
    }

    /// Real servers of one service with their connection counters:
    /// `ipvsadm -Ln -t VIP:PORT`.
    pub fn list_destinations(&self, s: &IpvsService) -> Result<Vec<IpvsDestination>, IpvsError> {
        let msgs = self.dump(
            &format!("list destinations of {}", s.describe()),
            request::get_dests(s),
        )?;
        let mut out = Vec::new();
        for m in &msgs {
            for a in &m.attributes {
                if let IpvsCmdAttr::Dest(attrs) = a {
                    out.push(
                        IpvsDestination::from_attrs(attrs, s.family).map_err(|source| {
                            IpvsError::Decode {
                                what: "destination dump".into(),
                                source,
                            }
                        })?,
                    );
                }
            }
        }
        Ok(out)
    }

    /// Connection timeouts: `ipvsadm -L --timeout`.
    pub fn timeouts(&self) -> Result<IpvsTimeouts, IpvsError> {
        let msgs = self.call("get timeouts", request::get_config())?;
        msgs.first()
            .map(parse_timeouts)
            .ok_or_else(|| IpvsError::Transport {
                what: "get timeouts".into(),
                detail: "no reply before the ack".into(),
            })
    }

    /// Set connection timeouts (0 = unchanged): `ipvsadm --set TCP TCPFIN UDP`.
    pub fn set_timeouts(&self, t: &IpvsTimeouts) -> Result<(), IpvsError> {
        self.call("set timeouts", request::set_config(t)).map(drop)
    }
}
