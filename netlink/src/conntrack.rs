//! Conntrack cleanup over ctnetlink (`NFNL_SUBSYS_CTNETLINK`), with
//! netlink-packet-netfilter's conntrack message types: dump, filter client-side,
//! delete each match by its exact original tuple (and `CTA_ID`, so an entry that
//! was replaced in between is left alone).
//!
//! The dump is streamed, never collected: each datagram's entries are judged as
//! it arrives, and the matches go out on a second socket in pipelined batches of
//! at most [`DELETE_BATCH`] while the dump waits (the kernel fills the next
//! datagram only when it is read). A cleanup's memory is one datagram and one
//! batch, whatever the size of the table (`conntrack -D` also deletes from a
//! second handle while it dumps).
//!
//! [`ConntrackHandle`] is the `conntrack -L` / `conntrack -D` equivalent.

use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use netlink_packet_core::{DefaultNla, Nla};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

use crate::sock::{NlSocket, SockError};

/// `CTA_ID` (be32): the conntrack entry id.
pub const CTA_ID: u16 = 12;
/// `CTA_ZONE` (be16).
pub const CTA_ZONE: u16 = 18;
/// Deletes in flight at most while a dump waits for them: the bound on a
/// cleanup's memory besides the dump's one datagram.
pub const DELETE_BATCH: usize = 256;
/// Dumps the kernel flags as interrupted are redone this often.
const DUMP_RETRIES: usize = 5;

/// Errors of conntrack requests, named by phase.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// Opening the socket.
    #[error("opening ctnetlink socket: {0}")]
    Open(String),
    /// Dumping the table.
    #[error("dumping conntrack table: {0}")]
    Dump(String),
    /// Deleting an entry failed (other than it being gone already).
    #[error("deleting conntrack entry {entry}: {} (errno {errno})", io::Error::from_raw_os_error(*errno))]
    Delete {
        /// The entry, rendered like `conntrack -L`.
        entry: String,
        /// Positive errno.
        errno: i32,
    },
}

/// Transport protocol of the entries to delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum L4Proto {
    /// `IPPROTO_TCP`
    Tcp,
    /// `IPPROTO_UDP`
    Udp,
    /// `IPPROTO_SCTP`
    Sctp,
}

impl L4Proto {
    /// The `IPPROTO_*` number.
    pub fn number(self) -> u8 {
        match self {
            L4Proto::Tcp => libc::IPPROTO_TCP as u8,
            L4Proto::Udp => libc::IPPROTO_UDP as u8,
            L4Proto::Sctp => libc::IPPROTO_SCTP as u8,
        }
    }
}

/// One direction of a conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtTuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// `IPPROTO_*`.
    pub proto: u8,
    /// Source port (0 for port-less protocols).
    pub sport: u16,
    /// Destination port (0 for port-less protocols).
    pub dport: u16,
}

/// A conntrack entry as dumped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackEntry {
    /// Original direction.
    pub orig: CtTuple,
    /// Reply direction (after NAT: `reply.src` is the DNAT target).
    pub reply: CtTuple,
    /// `CTA_ID`.
    pub id: Option<u32>,
    /// `CTA_ZONE`.
    pub zone: Option<u16>,
    /// The original tuple attributes exactly as dumped, sent back on delete.
    pub raw_orig: Vec<Tuple>,
}

fn proto_number(p: &Protocol) -> u8 {
    u8::from(*p)
}

fn parse_tuple(t: &[Tuple]) -> Option<CtTuple> {
    let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, 0, 0);
    for part in t {
        match part {
            Tuple::Ip(ips) => {
                for i in ips {
                    match i {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(p) => proto = Some(proto_number(p)),
                        ProtoTuple::SourcePort(v) => sport = *v,
                        ProtoTuple::DestinationPort(v) => dport = *v,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(CtTuple {
        src: src?,
        dst: dst?,
        proto: proto?,
        sport,
        dport,
    })
}

fn be_value(n: &DefaultNla) -> Vec<u8> {
    let mut v = vec![0u8; n.value_len()];
    n.emit_value(&mut v);
    v
}

/// Type one `IPCTNL_MSG_CT_NEW` dump reply; `None` if it lacks tuples.
pub fn parse_entry(attrs: &[ConntrackAttribute]) -> Option<ConntrackEntry> {
    let (mut orig, mut reply, mut id, mut zone) = (None, None, None, None);
    for a in attrs {
        match a {
            ConntrackAttribute::CtaTupleOrig(t) => orig = Some(t.clone()),
            ConntrackAttribute::CtaTupleReply(t) => reply = parse_tuple(t),
            ConntrackAttribute::Other(n) if n.kind() & 0x3fff == CTA_ID => {
                id = be_value(n).try_into().ok().map(u32::from_be_bytes)
            }
            ConntrackAttribute::Other(n) if n.kind() & 0x3fff == CTA_ZONE => {
                zone = be_value(n).try_into().ok().map(u16::from_be_bytes)
            }
            _ => {}
        }
    }
    let raw_orig = orig?;
    Some(ConntrackEntry {
        orig: parse_tuple(&raw_orig)?,
        reply: reply?,
        id,
        zone,
        raw_orig,
    })
}

/// The `IPCTNL_MSG_CT_DELETE` attributes for `e`: its original tuple, zone and id.
pub fn delete_attrs(e: &ConntrackEntry) -> Vec<ConntrackAttribute> {
    let mut v = vec![ConntrackAttribute::CtaTupleOrig(e.raw_orig.clone())];
    if let Some(z) = e.zone {
        v.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            z.to_be_bytes().to_vec(),
        )));
    }
    if let Some(id) = e.id {
        v.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ID,
            id.to_be_bytes().to_vec(),
        )));
    }
    v
}

fn family_of(a: &IpAddr) -> NetfilterProtoFamily {
    if a.is_ipv4() {
        NetfilterProtoFamily::IPv4
    } else {
        NetfilterProtoFamily::IPv6
    }
}

fn ct_message(family: NetfilterProtoFamily, m: ConntrackMessage) -> NetfilterMessage {
    NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), m)
}

fn render(orig: &CtTuple, reply: &CtTuple) -> String {
    format!(
        "proto={} src={} dst={} sport={} dport={} | src={} dst={} sport={} dport={}",
        orig.proto,
        orig.src,
        orig.dst,
        orig.sport,
        orig.dport,
        reply.src,
        reply.dst,
        reply.sport,
        reply.dport
    )
}

/// Deletes waiting to be sent: each message with the tuples that name it in an error.
type DeleteBatch = Vec<(NetfilterMessage, (CtTuple, CtTuple))>;

/// Handle to the conntrack table of the netns it was opened in: one socket for
/// dumps, one for the deletes sent while a dump runs. Cloning shares both.
#[derive(Debug, Clone)]
pub struct ConntrackHandle {
    dumps: Arc<Mutex<NlSocket>>,
    requests: Arc<Mutex<NlSocket>>,
}

fn lock(sock: &Mutex<NlSocket>) -> std::sync::MutexGuard<'_, NlSocket> {
    sock.lock().unwrap_or_else(|p| p.into_inner())
}

impl ConntrackHandle {
    /// Open two NETLINK_NETFILTER sockets in the calling thread's netns.
    pub fn new() -> Result<Self, ConntrackError> {
        let open = || {
            NlSocket::open(NETLINK_NETFILTER)
                .map(|s| Arc::new(Mutex::new(s)))
                .map_err(|e| ConntrackError::Open(e.to_string()))
        };
        Ok(ConntrackHandle {
            dumps: open()?,
            requests: open()?,
        })
    }

    /// One dump of `ipv6`'s family, each entry handed to `each` as its datagram
    /// arrives; the first error of `each` ends it. Returns whether the kernel
    /// flagged the dump as interrupted.
    fn stream(
        &self,
        ipv6: bool,
        mut each: impl FnMut(ConntrackEntry) -> Result<(), ConntrackError>,
    ) -> Result<bool, ConntrackError> {
        let family = if ipv6 {
            NetfilterProtoFamily::IPv6
        } else {
            NetfilterProtoFamily::IPv4
        };
        lock(&self.dumps)
            .dump_each(
                ct_message(family, ConntrackMessage::Get(vec![])),
                |m| match &m.inner {
                    NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) => {
                        match parse_entry(attrs) {
                            Some(e) => each(e),
                            None => Ok(()),
                        }
                    }
                    _ => Ok(()),
                },
            )
            .map_err(|e| ConntrackError::Dump(e.to_string()))?
    }

    /// All entries of one family: `conntrack -L -f ipv4|ipv6`.
    pub fn list(&self, ipv6: bool) -> Result<Vec<ConntrackEntry>, ConntrackError> {
        for _ in 0..DUMP_RETRIES {
            let mut out = Vec::new();
            let interrupted = self.stream(ipv6, |e| {
                out.push(e);
                Ok(())
            })?;
            if !interrupted {
                return Ok(out);
            }
        }
        Err(ConntrackError::Dump("dump interrupted repeatedly".into()))
    }

    /// Sends the deletes of `batch` (emptied), pipelined; returns how many
    /// deleted an entry (one gone already is not counted and not an error).
    fn send_deletes(&self, batch: &mut DeleteBatch) -> Result<usize, ConntrackError> {
        if batch.is_empty() {
            return Ok(0);
        }
        let (msgs, tuples): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
        let results = lock(&self.requests).request_pipelined(0, msgs, DELETE_BATCH);
        let mut deleted = 0;
        for (result, (orig, reply)) in results.into_iter().zip(tuples) {
            match result {
                Ok(()) => deleted += 1,
                Err(SockError::Kernel { errno, .. }) if errno == libc::ENOENT => {}
                Err(SockError::Kernel { errno, .. }) => {
                    return Err(ConntrackError::Delete {
                        entry: render(&orig, &reply),
                        errno,
                    });
                }
                Err(e) => {
                    return Err(ConntrackError::Delete {
                        entry: format!("{} ({e})", render(&orig, &reply)),
                        errno: libc::EIO,
                    });
                }
            }
        }
        Ok(deleted)
    }

    /// Delete every entry of `ipv6`'s family matching `pred`; returns how many were
    /// deleted (entries gone in between are not counted and not errors). Streamed:
    /// the matches of each dumped datagram are deleted in batches of at most
    /// [`DELETE_BATCH`] as the dump goes.
    pub fn delete_matching(
        &self,
        ipv6: bool,
        pred: impl Fn(&ConntrackEntry) -> bool,
    ) -> Result<usize, ConntrackError> {
        let mut deleted = 0;
        let mut batch = DeleteBatch::with_capacity(DELETE_BATCH);
        for _ in 0..DUMP_RETRIES {
            let interrupted = self.stream(ipv6, |e| {
                if pred(&e) {
                    let msg = ct_message(
                        family_of(&e.orig.src),
                        ConntrackMessage::Delete(delete_attrs(&e)),
                    );
                    batch.push((msg, (e.orig, e.reply)));
                    if batch.len() >= DELETE_BATCH {
                        deleted += self.send_deletes(&mut batch)?;
                    }
                }
                Ok(())
            })?;
            deleted += self.send_deletes(&mut batch)?;
            // An interrupted dump may have skipped entries: the next one finds
            // them (the ones deleted already are gone from it).
            if !interrupted {
                return Ok(deleted);
            }
        }
        Err(ConntrackError::Dump("dump interrupted repeatedly".into()))
    }
    /// Delete entries whose original destination is `orig_dst` (a service VIP)
    /// and, if given, port `dst_port`, for `proto`:
    /// `conntrack -D -p udp --orig-dst VIP [--dport PORT]`.
    pub fn delete_udp_to(
        &self,
        orig_dst: IpAddr,
        dst_port: Option<u16>,
        proto: L4Proto,
    ) -> Result<usize, ConntrackError> {
        let p = proto.number();
        self.delete_matching(orig_dst.is_ipv6(), |e| {
            e.orig.proto == p
                && e.orig.dst == orig_dst
                && dst_port.is_none_or(|port| e.orig.dport == port)
        })
    }

    /// Delete entries DNATed to `endpoint:port` (reply source = endpoint), for
    /// `proto`: `conntrack -D -p udp --reply-src ENDPOINT --reply-port-src PORT`.
    pub fn delete_by_reply_src(
        &self,
        endpoint: IpAddr,
        port: u16,
        proto: L4Proto,
    ) -> Result<usize, ConntrackError> {
        let p = proto.number();
        self.delete_matching(endpoint.is_ipv6(), |e| {
            e.reply.proto == p && e.reply.src == endpoint && e.reply.sport == port
        })
    }
}
