//! Interface addresses over a blocking NETLINK_ROUTE socket (RTM_GETLINK +
//! RTM_GETADDR dumps).

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;

use netlink_sys::{Socket, protocols::NETLINK_ROUTE};
use rtnetlink::packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use rtnetlink::packet_route::{
    RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    link::{LinkAttribute, LinkMessage},
};

/// One address configured on an interface.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InterfaceAddress {
    /// Interface name (`IFLA_IFNAME`).
    pub ifname: String,
    /// Interface index.
    pub ifindex: u32,
    /// The address (`IFA_LOCAL` when present, else `IFA_ADDRESS`).
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix_len: u8,
}

/// Errors listing addresses.
#[derive(Debug, thiserror::Error)]
pub enum AddrError {
    /// Opening or binding the socket.
    #[error("opening NETLINK_ROUTE socket: {0}")]
    Socket(#[source] io::Error),
    /// Sending a dump request.
    #[error("sending rtnetlink dump request: {0}")]
    Send(#[source] io::Error),
    /// Receiving a reply.
    #[error("receiving rtnetlink reply: {0}")]
    Recv(#[source] io::Error),
    /// The kernel answered with an error.
    #[error("rtnetlink dump failed: {0}")]
    Dump(#[source] io::Error),
    /// A reply did not decode.
    #[error("decoding rtnetlink reply: {0}")]
    Decode(String),
}

fn dump(
    sock: &Socket,
    seq: u32,
    msg: RouteNetlinkMessage,
) -> Result<Vec<RouteNetlinkMessage>, AddrError> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = seq;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    req.finalize();
    let mut buf = vec![0u8; req.buffer_len()];
    req.serialize(&mut buf);
    sock.send(&buf, 0).map_err(AddrError::Send)?;

    let mut out = Vec::new();
    let mut rbuf: Vec<u8> = Vec::with_capacity(1 << 16);
    loop {
        rbuf.clear();
        sock.recv(&mut rbuf, 0).map_err(AddrError::Recv)?;
        let mut off = 0;
        while off < rbuf.len() {
            let bytes = &rbuf[off..];
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes)
                .map_err(|e| AddrError::Decode(e.to_string()))?;
            let len = msg.header.length as usize;
            if len == 0 {
                return Err(AddrError::Decode("zero-length netlink message".into()));
            }
            off += len.div_ceil(4) * 4;
            if msg.header.sequence_number != seq {
                continue;
            }
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => {
                    if let Some(code) = e.code {
                        return Err(AddrError::Dump(io::Error::from_raw_os_error(-code.get())));
                    }
                    return Ok(out);
                }
                NetlinkPayload::InnerMessage(m) => out.push(m),
                _ => {}
            }
        }
    }
}

/// All addresses of all interfaces in the calling thread's network namespace.
pub fn list_addresses() -> Result<Vec<InterfaceAddress>, AddrError> {
    let mut sock = Socket::new(NETLINK_ROUTE).map_err(AddrError::Socket)?;
    sock.bind_auto().map_err(AddrError::Socket)?;

    let mut names = HashMap::new();
    for m in dump(
        &sock,
        1,
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    )? {
        if let RouteNetlinkMessage::NewLink(link) = m {
            for a in &link.attributes {
                if let LinkAttribute::IfName(n) = a {
                    names.insert(link.header.index, n.clone());
                }
            }
        }
    }

    let mut out = Vec::new();
    for m in dump(
        &sock,
        2,
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
    )? {
        let RouteNetlinkMessage::NewAddress(a) = m else {
            continue;
        };
        let mut local = None;
        let mut address = None;
        for attr in &a.attributes {
            match attr {
                AddressAttribute::Local(ip) => local = Some(*ip),
                AddressAttribute::Address(ip) => address = Some(*ip),
                _ => {}
            }
        }
        if let Some(addr) = local.or(address) {
            out.push(InterfaceAddress {
                ifname: names.get(&a.header.index).cloned().unwrap_or_default(),
                ifindex: a.header.index,
                addr,
                prefix_len: a.header.prefix_len,
            });
        }
    }
    Ok(out)
}
