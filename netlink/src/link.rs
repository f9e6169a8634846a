//! Links and addresses over a blocking NETLINK_ROUTE socket, with
//! `rtnetlink::packet_route` messages: the dummy interface IPVS binds service
//! addresses to, and the addresses on it.
//!
//! [`LinkHandle`] is the `ip link` / `ip addr` equivalent.

use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_sys::protocols::NETLINK_ROUTE;
use rtnetlink::packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage, AddressScope},
    link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
};

use crate::sock::{NlSocket, SockError};

/// Errors of link and address requests, named by phase.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Opening the socket.
    #[error("opening NETLINK_ROUTE socket: {0}")]
    Open(String),
    /// The kernel cannot create `dummy` links: the driver is not built or loadable.
    #[error("cannot create dummy link {name}: dummy driver missing (CONFIG_DUMMY / modprobe dummy){}",
        message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    DummyDriverMissing {
        /// The link we wanted.
        name: String,
        /// Extended ack text.
        message: Option<String>,
    },
    /// A link of that name exists but is not a dummy.
    #[error("link {name} exists with kind {kind:?}, not dummy")]
    NotDummy {
        /// Link name.
        name: String,
        /// Its `IFLA_INFO_KIND`, if any.
        kind: Option<String>,
    },
    /// The kernel rejected a request.
    #[error("{what} failed: {} (errno {errno}){}",
        io::Error::from_raw_os_error(*errno),
        message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Kernel {
        /// What was requested.
        what: String,
        /// Positive errno.
        errno: i32,
        /// Extended ack text.
        message: Option<String>,
    },
    /// I/O or a reply that did not decode.
    #[error("{what}: {detail}")]
    Transport {
        /// What was requested.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// A request we refuse to send.
    #[error("invalid request: {0}")]
    Invalid(String),
}

fn sock_err(what: &str, e: SockError) -> LinkError {
    match e {
        SockError::Kernel { errno, message } => LinkError::Kernel {
            what: what.to_string(),
            errno,
            message,
        },
        e => LinkError::Transport {
            what: what.to_string(),
            detail: e.to_string(),
        },
    }
}

/// Handle to links and addresses in the netns it was opened in. Cloning shares
/// one socket.
#[derive(Debug, Clone)]
pub struct LinkHandle {
    sock: Arc<Mutex<NlSocket>>,
}

fn link_by_name(name: &str) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(name.to_string()));
    m
}

/// The `IFLA_INFO_KIND` of a `RTM_NEWLINK` reply.
pub(crate) fn link_kind(m: &LinkMessage) -> Option<InfoKind> {
    m.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
            LinkInfo::Kind(k) => Some(k.clone()),
            _ => None,
        }),
        _ => None,
    })
}

fn address_message(ifindex: u32, addr: IpAddr, prefix_len: u8) -> AddressMessage {
    let mut m = AddressMessage::default();
    m.header.family = match addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    m.header.prefix_len = prefix_len;
    m.header.index = ifindex;
    m.header.scope = AddressScope::Universe;
    m.attributes.push(AddressAttribute::Local(addr));
    m.attributes.push(AddressAttribute::Address(addr));
    m
}

/// The address of a `RTM_NEWADDR` reply (`IFA_LOCAL`, else `IFA_ADDRESS`) and its
/// prefix length.
pub(crate) fn address_of(a: &AddressMessage) -> Option<(IpAddr, u8)> {
    let mut local = None;
    let mut address = None;
    for attr in &a.attributes {
        match attr {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            _ => {}
        }
    }
    local.or(address).map(|ip| (ip, a.header.prefix_len))
}

impl LinkHandle {
    /// Open a NETLINK_ROUTE socket in the calling thread's netns.
    pub fn new() -> Result<Self, LinkError> {
        let sock = NlSocket::open(NETLINK_ROUTE).map_err(|e| LinkError::Open(e.to_string()))?;
        Ok(LinkHandle {
            sock: Arc::new(Mutex::new(sock)),
        })
    }

    fn call(
        &self,
        flags: u16,
        msg: RouteNetlinkMessage,
    ) -> Result<Vec<RouteNetlinkMessage>, SockError> {
        self.sock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .request(flags, msg)
    }

    fn get_link(&self, name: &str) -> Result<Option<LinkMessage>, LinkError> {
        let what = format!("ip link show {name}");
        match self.call(0, RouteNetlinkMessage::GetLink(link_by_name(name))) {
            Ok(replies) => Ok(replies.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(l),
                _ => None,
            })),
            Err(SockError::Kernel { errno, .. }) if errno == libc::ENODEV => Ok(None),
            Err(e) => Err(sock_err(&what, e)),
        }
    }

    /// The index of link `name`, `None` if there is none: `ip link show NAME`.
    pub fn link_index(&self, name: &str) -> Result<Option<u32>, LinkError> {
        Ok(self.get_link(name)?.map(|l| l.header.index))
    }

    /// Create dummy link `name` unless it exists (left down), and return its
    /// index: `ip link add NAME type dummy`. Fails with
    /// [`LinkError::DummyDriverMissing`] when the kernel has no dummy driver and
    /// [`LinkError::NotDummy`] when `name` is another kind of link.
    pub fn ensure_dummy(&self, name: &str) -> Result<u32, LinkError> {
        if name.is_empty() || name.len() > 15 {
            return Err(LinkError::Invalid(format!(
                "link name {name:?} must be 1..=15 bytes"
            )));
        }
        if let Some(l) = self.get_link(name)? {
            return match link_kind(&l) {
                Some(InfoKind::Dummy) => Ok(l.header.index),
                k => Err(LinkError::NotDummy {
                    name: name.into(),
                    kind: k.map(|k| k.to_string()),
                }),
            };
        }
        let mut m = link_by_name(name);
        m.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Dummy,
            )]));
        let what = format!("ip link add {name} type dummy");
        match self.call(NLM_F_CREATE | NLM_F_EXCL, RouteNetlinkMessage::NewLink(m)) {
            Ok(_) => {}
            // Lost a race with another creator: fine if it is a dummy (checked below).
            Err(SockError::Kernel { errno, .. }) if errno == libc::EEXIST => {}
            Err(SockError::Kernel { errno, message }) if errno == libc::EOPNOTSUPP => {
                return Err(LinkError::DummyDriverMissing {
                    name: name.into(),
                    message,
                });
            }
            Err(e) => return Err(sock_err(&what, e)),
        }
        match self.get_link(name)? {
            Some(l) if link_kind(&l) == Some(InfoKind::Dummy) => Ok(l.header.index),
            Some(l) => Err(LinkError::NotDummy {
                name: name.into(),
                kind: link_kind(&l).map(|k| k.to_string()),
            }),
            None => Err(LinkError::Transport {
                what,
                detail: "link missing right after creation".into(),
            }),
        }
    }

    /// Bring link `name` up; `false` if there is no such link: `ip link set NAME up`.
    pub fn set_up(&self, name: &str) -> Result<bool, LinkError> {
        let what = format!("ip link set {name} up");
        // One request: the kernel finds the link by its name (IFLA_IFNAME).
        let mut m = link_by_name(name);
        m.header.flags = LinkFlags::Up;
        m.header.change_mask = LinkFlags::Up;
        match self.call(0, RouteNetlinkMessage::SetLink(m)) {
            Ok(_) => Ok(true),
            Err(SockError::Kernel { errno, .. }) if errno == libc::ENODEV => Ok(false),
            Err(e) => Err(sock_err(&what, e)),
        }
    }

    /// Whether link `name` is administratively up; `None` if there is no such link.
    pub fn is_up(&self, name: &str) -> Result<Option<bool>, LinkError> {
        Ok(self
            .get_link(name)?
            .map(|l| l.header.flags.contains(LinkFlags::Up)))
    }

    /// Delete link `name`; `false` if it did not exist: `ip link del NAME`.
    pub fn delete_link(&self, name: &str) -> Result<bool, LinkError> {
        let what = format!("ip link del {name}");
        match self.call(0, RouteNetlinkMessage::DelLink(link_by_name(name))) {
            Ok(_) => Ok(true),
            Err(SockError::Kernel { errno, .. }) if errno == libc::ENODEV => Ok(false),
            Err(e) => Err(sock_err(&what, e)),
        }
    }

    /// Add `addr/prefix_len` to link `ifindex`; `false` if it was already there:
    /// `ip addr add ADDR/PREFIX dev IF`.
    pub fn add_address(
        &self,
        ifindex: u32,
        addr: IpAddr,
        prefix_len: u8,
    ) -> Result<bool, LinkError> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(LinkError::Invalid(format!(
                "prefix length {prefix_len} > {max}"
            )));
        }
        let what = format!("ip addr add {addr}/{prefix_len} dev #{ifindex}");
        let m = address_message(ifindex, addr, prefix_len);
        match self.call(
            NLM_F_CREATE | NLM_F_EXCL,
            RouteNetlinkMessage::NewAddress(m),
        ) {
            Ok(_) => Ok(true),
            Err(SockError::Kernel { errno, .. }) if errno == libc::EEXIST => Ok(false),
            Err(e) => Err(sock_err(&what, e)),
        }
    }

    /// Remove `addr/prefix_len` from link `ifindex`; `false` if it was not there:
    /// `ip addr del ADDR/PREFIX dev IF`.
    pub fn del_address(
        &self,
        ifindex: u32,
        addr: IpAddr,
        prefix_len: u8,
    ) -> Result<bool, LinkError> {
        let what = format!("ip addr del {addr}/{prefix_len} dev #{ifindex}");
        let m = address_message(ifindex, addr, prefix_len);
        match self.call(0, RouteNetlinkMessage::DelAddress(m)) {
            Ok(_) => Ok(true),
            Err(SockError::Kernel { errno, .. }) if errno == libc::EADDRNOTAVAIL => Ok(false),
            Err(e) => Err(sock_err(&what, e)),
        }
    }

    /// Addresses of link `ifindex` with their prefix lengths: `ip addr show dev IF`.
    pub fn list_addresses(&self, ifindex: u32) -> Result<Vec<(IpAddr, u8)>, LinkError> {
        let mut req = AddressMessage::default();
        req.header.index = ifindex;
        let msgs = self
            .sock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .dump(RouteNetlinkMessage::GetAddress(req))
            .map_err(|e| sock_err("ip addr show", e))?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewAddress(a) = m else {
                continue;
            };
            if a.header.index != ifindex {
                continue;
            }
            out.extend(address_of(&a));
        }
        Ok(out)
    }
}
