//! Entry points for the fuzz targets in `fuzz/` and the arbitrary-reply tests: each
//! takes the bytes of one netlink message payload as the kernel sends it (after
//! `struct nlmsghdr`), frames it the way the reply loop sees it, and runs every
//! parser a dump or request runs on it. Where we also emit the parsed value, the
//! re-emitted bytes must parse back to the same value (panics on mismatch).
//!
//! Not API: hidden from the docs, used only by `fuzz/` and `tests/`.

use netlink_packet_core::{
    Emitable, NetlinkHeader, NetlinkMessage, NetlinkPayload, Parseable, ParseableParametrized,
};
use netlink_packet_netfilter::conntrack::{ConntrackAttribute, ConntrackMessage};
use netlink_packet_netfilter::nftables::NfTablesMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterMessageInner};
use rtnetlink::packet_route::RouteNetlinkMessage;

use crate::conntrack::{ConntrackEntry, delete_attrs, parse_entry};
use crate::ipset::codec::IpsetMessage;
use crate::ipset::parse_listings;
use crate::ipvs::codec::{IpvsCmdAttr, IpvsMessage};
use crate::ipvs::{IpvsDestination, IpvsFamily, IpvsService, parse_services, parse_timeouts};
use crate::link::{address_of, link_kind};
use crate::nft::codec::{
    ParsedSet, element_messages, new_chain, new_set, nft_request, parse_chain, parse_comment,
    parse_elements, parse_gen, parse_rule, parse_set, parse_table_name, serialize_into,
};
use crate::nft::socket::split_msgs;
use crate::nft::{Element, KeyType};

const NETLINK_HEADER_LEN: usize = 16;
const NLM_F_MULTI: u16 = 2;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const IPCTNL_MSG_CT_NEW: u16 = 0;

/// `NFT_MSG_NEWTABLE`.
pub const NFT_MSG_NEWTABLE: u8 = 0;
/// `NFT_MSG_NEWCHAIN`.
pub const NFT_MSG_NEWCHAIN: u8 = 3;
/// `NFT_MSG_NEWRULE`.
pub const NFT_MSG_NEWRULE: u8 = 6;
/// `NFT_MSG_NEWSET`.
pub const NFT_MSG_NEWSET: u8 = 9;
/// `NFT_MSG_NEWSETELEM`.
pub const NFT_MSG_NEWSETELEM: u8 = 12;
/// `NFT_MSG_NEWGEN`.
pub const NFT_MSG_NEWGEN: u8 = 15;

/// `RTM_NEWLINK`.
pub const RTM_NEWLINK: u16 = 16;
/// `RTM_NEWADDR`.
pub const RTM_NEWADDR: u16 = 20;

/// A fuzz target's entry point: the input bytes, no result (it panics on a bug).
pub type Target = fn(&[u8]);

/// The netlink fuzz targets (`fuzz/fuzz_targets/<name>.rs`) and the function each
/// feeds its input to; the stable tests run the same table over the corpus.
pub const TARGETS: &[(&str, Target)] = &[
    ("nft_table", |b| nft_message(NFT_MSG_NEWTABLE, b)),
    ("nft_chain", |b| nft_message(NFT_MSG_NEWCHAIN, b)),
    ("nft_set", |b| nft_message(NFT_MSG_NEWSET, b)),
    ("nft_setelem", |b| nft_message(NFT_MSG_NEWSETELEM, b)),
    ("nft_rule", |b| nft_message(NFT_MSG_NEWRULE, b)),
    ("nft_datagram", nft_datagram),
    ("ipvs", ipvs_message),
    ("ipset", ipset_input),
    ("rtnl_link", rtnl_link),
    ("rtnl_addr", rtnl_addr),
    ("ctnetlink", ctnetlink_message),
];

/// Run the netlink fuzz target `name` on `data` (panics on an unknown name).
pub fn run(name: &str, data: &[u8]) {
    let (_, f) = TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no fuzz target {name}"));
    f(data)
}

/// `nlmsghdr` of `message_type` + `payload`, as one message of a dump reply.
pub fn frame(message_type: u16, payload: &[u8]) -> Vec<u8> {
    let len = NETLINK_HEADER_LEN + payload.len();
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&(len as u32).to_ne_bytes());
    b.extend_from_slice(&message_type.to_ne_bytes());
    b.extend_from_slice(&NLM_F_MULTI.to_ne_bytes());
    b.extend_from_slice(&1u32.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(payload);
    b
}

/// The key and data layouts a set of ours can have: every element payload is
/// decoded with each of them.
const LAYOUTS: &[(&[KeyType], &[KeyType])] = {
    use KeyType::*;
    &[
        (&[Ipv4Addr], &[]),
        (&[Ipv6Addr], &[]),
        (&[Mark], &[]),
        (&[InetService], &[]),
        (&[Ipv4Addr, InetProto, InetService], &[]),
        (&[Ipv6Addr, InetProto, InetService], &[]),
        (
            &[Ipv4Addr, InetProto, InetService],
            &[Ipv4Addr, InetService],
        ),
        (&[Ipv4Addr], &[Mark]),
    ]
};

/// A whole nf_tables reply datagram (several messages): the splitter, the
/// decoder and the parser of each message's kind.
pub fn nft_datagram(bytes: &[u8]) {
    let Ok(msgs) = split_msgs(bytes) else {
        return;
    };
    for m in msgs {
        if let Ok(NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::NfTables(t),
            ..
        })) = m.decode("fuzz")
        {
            nft_parsed(&t);
        }
    }
}

/// One nf_tables message of type `NFT_MSG_*` `msg_type` (`nfgenmsg` + attributes).
pub fn nft_message(msg_type: u8, payload: &[u8]) {
    nft_datagram(&frame(
        (NFNL_SUBSYS_NFTABLES << 8) | u16::from(msg_type),
        payload,
    ));
}

/// Serialize `msg` as a request and decode it back through the reply path.
fn nft_reencode(msg: NfTablesMessage) -> NfTablesMessage {
    let mut buf = Vec::new();
    serialize_into(&mut buf, &nft_request(2, 0, 0, 1, msg));
    let msgs = split_msgs(&buf).expect("re-emitted message splits");
    assert_eq!(msgs.len(), 1, "one re-emitted message");
    match msgs[0].decode("re-emitted") {
        Ok(NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::NfTables(t),
            ..
        })) => t,
        other => panic!("re-emitted message does not decode: {other:?}"),
    }
}

fn nft_parsed(t: &NfTablesMessage) {
    match t {
        NfTablesMessage::NewTable(m) => {
            let _ = parse_table_name(m);
        }
        NfTablesMessage::NewGen(m) => {
            let _ = parse_gen(m);
        }
        NfTablesMessage::NewChain(m) => {
            if let Some((table, chain)) = parse_chain(m) {
                let NfTablesMessage::NewChain(back) = nft_reencode(new_chain(&table, &chain))
                else {
                    panic!("NEWCHAIN re-emitted as another kind");
                };
                assert_eq!(parse_chain(&back), Some((table, chain)), "chain round trip");
            }
        }
        NfTablesMessage::NewSet(m) => {
            if let Some(ParsedSet::Set(table, set)) = parse_set(m) {
                let NfTablesMessage::NewSet(back) = nft_reencode(new_set(&table, &set, 1)) else {
                    panic!("NEWSET re-emitted as another kind");
                };
                match parse_set(&back) {
                    Some(ParsedSet::Set(t2, s2)) => {
                        assert_eq!((t2, s2), (table, set), "set round trip")
                    }
                    _ => panic!("re-emitted set {set:?} does not parse"),
                }
            }
        }
        NfTablesMessage::NewSetElement(m) => {
            for (key, data) in LAYOUTS {
                let mut elems = Vec::new();
                parse_elements(m, key, data, &mut elems);
                elements_round_trip(key, data, elems);
            }
        }
        NfTablesMessage::NewRule(m) => {
            if let Some(r) = parse_rule(m) {
                let _ = parse_comment(&r.comment);
            }
        }
        _ => {}
    }
}

/// Elements we re-emit unchanged: the comment fits (longer ones are cut on
/// emit) and a verdict is not mixed with data values (only one is sent).
fn re_emits_unchanged(e: &Element, data: &[KeyType]) -> bool {
    e.comment
        .as_ref()
        .is_none_or(|c| c.len() < crate::nft::codec::MAX_COMMENT_LEN && !c.contains('\0'))
        && (e.verdict.is_none() || data.is_empty())
}

fn elements_round_trip(key: &[KeyType], data: &[KeyType], mut elems: Vec<Element>) {
    elems.retain(|e| re_emits_unchanged(e, data));
    if elems.is_empty() {
        return;
    }
    let mut back = Vec::new();
    for msg in element_messages("t", "s", &elems, true) {
        let NfTablesMessage::NewSetElement(m) = nft_reencode(msg) else {
            panic!("NEWSETELEM re-emitted as another kind");
        };
        assert_eq!(parse_elements(&m, key, data, &mut back), 0, "skipped");
    }
    assert_eq!(back, elems, "element round trip ({key:?} : {data:?})");
}

fn emit(m: &impl Emitable) -> Vec<u8> {
    let mut buf = vec![0; m.buffer_len()];
    m.emit(&mut buf);
    buf
}

/// One IPVS generic-netlink message (`genlmsghdr` + attributes) of a reply: the
/// codec, services and destinations of both families, timeouts; the parsed
/// message re-emits to the same value.
pub fn ipvs_message(payload: &[u8]) {
    let Ok(NetlinkMessage {
        payload: NetlinkPayload::InnerMessage(g),
        ..
    }) =
        NetlinkMessage::<crate::ipvs::codec::Genl<IpvsMessage>>::deserialize(&frame(0x20, payload))
    else {
        return;
    };
    let m = g.msg;
    // Emitting normalizes the flag bits of unknown attribute kinds (the generic
    // `Nla` emit of netlink-packet-core), so the property is: what we emit parses,
    // and parsing and emitting that again changes nothing.
    let again = IpvsMessage::parse(&emit(&m)).expect("re-emitted IPVS message parses");
    assert_eq!(
        IpvsMessage::parse(&emit(&again)).as_ref().ok(),
        Some(&again),
        "IPVS message round trip"
    );
    let _ = parse_timeouts(&m);
    if let Ok(services) = parse_services(std::slice::from_ref(&m)) {
        for s in services {
            assert_eq!(
                IpvsService::from_attrs(&s.to_attrs()).ok(),
                Some(s),
                "service round trip"
            );
        }
    }
    for a in &m.attributes {
        if let IpvsCmdAttr::Dest(attrs) = a {
            for family in [IpvsFamily::V4, IpvsFamily::V6] {
                let _ = IpvsDestination::from_attrs(attrs, family);
            }
        }
    }
}

/// One ipset message of command `cmd` (`nfgenmsg` + attributes): the codec, the
/// listing merge and the typed members; the parsed message re-emits to the same
/// value.
pub fn ipset_message(cmd: u8, payload: &[u8]) {
    let Ok(m) = IpsetMessage::parse_with_param(payload, cmd) else {
        return;
    };
    // As for IPVS: what we emit parses, and is a fixed point from then on.
    let again = IpsetMessage::parse_with_param(&emit(&m)[..], cmd)
        .expect("re-emitted ipset message parses");
    assert_eq!(
        IpsetMessage::parse_with_param(&emit(&again)[..], cmd)
            .as_ref()
            .ok(),
        Some(&again),
        "ipset message round trip"
    );
    for l in parse_listings(std::slice::from_ref(&m)) {
        let _ = l.members();
        let _ = l.element_count();
        let _ = l.hash_params();
    }
}

/// An ipset fuzz input: the `IPSET_CMD_*` byte, then the payload.
pub fn ipset_input(data: &[u8]) {
    if let Some((&cmd, payload)) = data.split_first() {
        ipset_message(cmd, payload);
    }
}

fn route_message(message_type: u16, payload: &[u8]) -> Option<RouteNetlinkMessage> {
    match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&frame(message_type, payload)) {
        Ok(NetlinkMessage {
            payload: NetlinkPayload::InnerMessage(m),
            ..
        }) => Some(m),
        _ => None,
    }
}

/// One `RTM_NEWLINK` reply (`ifinfomsg` + attributes): decode and the link kind.
pub fn rtnl_link(payload: &[u8]) {
    if let Some(RouteNetlinkMessage::NewLink(l)) = route_message(RTM_NEWLINK, payload) {
        let _ = link_kind(&l);
    }
}

/// One `RTM_NEWADDR` reply (`ifaddrmsg` + attributes): decode and the address.
pub fn rtnl_addr(payload: &[u8]) {
    if let Some(RouteNetlinkMessage::NewAddress(a)) = route_message(RTM_NEWADDR, payload) {
        let _ = address_of(&a);
    }
}

/// One `IPCTNL_MSG_CT_NEW` dump reply (`nfgenmsg` + attributes): decode and type
/// the entry; the delete request built from it carries the same original tuple,
/// zone and id.
pub fn ctnetlink_message(payload: &[u8]) {
    let Ok(NetlinkMessage {
        payload: NetlinkPayload::InnerMessage(m),
        ..
    }) = NetlinkMessage::<NetfilterMessage>::deserialize(&frame(
        (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW,
        payload,
    ))
    else {
        return;
    };
    let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = &m.inner else {
        return;
    };
    let Some(e) = parse_entry(attrs) else {
        return;
    };
    // The delete request, with the dumped reply tuple added back, types the same.
    let mut del = delete_attrs(&e);
    // (the last one, as `parse_entry` reads it)
    let reply = attrs.iter().rev().find_map(|a| match a {
        ConntrackAttribute::CtaTupleReply(t) => Some(t.clone()),
        _ => None,
    });
    del.extend(reply.map(ConntrackAttribute::CtaTupleReply));
    let msg = NetfilterMessage::new(
        NetfilterHeader::new(m.header.family, 0, 0),
        ConntrackMessage::New(del),
    );
    let mut nl = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(msg));
    nl.finalize();
    let mut buf = vec![0; nl.buffer_len()];
    nl.serialize(&mut buf);
    let back = match NetlinkMessage::<NetfilterMessage>::deserialize(&buf) {
        Ok(NetlinkMessage {
            payload:
                NetlinkPayload::InnerMessage(NetfilterMessage {
                    inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(a)),
                    ..
                }),
            ..
        }) => a,
        other => panic!("re-emitted conntrack entry does not decode: {other:?}"),
    };
    // `raw_orig` is compared typed: emitting normalizes the flag bits of unknown
    // attribute kinds in it (netlink-packet-core's generic `Nla` emit).
    let typed = |e: &ConntrackEntry| (e.orig, e.reply, e.id, e.zone);
    assert_eq!(
        parse_entry(&back).as_ref().map(typed),
        Some(typed(&e)),
        "conntrack entry round trip"
    );
}

/// One change to a seed input, for the stable tests that mutate the fuzz corpus.
/// Positions are taken modulo the input length (plus one), so any value applies.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Flip bit `n`.
    FlipBit(usize),
    /// Overwrite one byte.
    SetByte(usize, u8),
    /// Overwrite two bytes (an attribute length or type) in native order.
    SetU16(usize, u16),
    /// Cut the input at a position.
    Truncate(usize),
    /// Insert bytes at a position.
    Insert(usize, Vec<u8>),
    /// Remove up to `n` bytes at a position.
    Remove(usize, usize),
    /// Keep the input up to a position, then another seed (by index) from a
    /// position of it.
    Splice(usize, usize, usize),
}

/// `seed` with `mutations` applied in order; `others` are the seeds a splice
/// takes its tail from.
pub fn mutate(seed: &[u8], others: &[Vec<u8>], mutations: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for m in mutations {
        let at = |p: usize, len: usize| p % (len + 1);
        match m {
            Mutation::FlipBit(n) if !b.is_empty() => {
                let n = n % (b.len() * 8);
                b[n / 8] ^= 1 << (n % 8);
            }
            Mutation::SetByte(p, v) if !b.is_empty() => {
                let p = p % b.len();
                b[p] = *v;
            }
            Mutation::SetU16(p, v) if b.len() >= 2 => {
                let p = p % (b.len() - 1);
                b[p..p + 2].copy_from_slice(&v.to_ne_bytes());
            }
            Mutation::Truncate(p) => b.truncate(at(*p, b.len())),
            Mutation::Insert(p, bytes) => {
                let p = at(*p, b.len());
                b.splice(p..p, bytes.iter().copied());
            }
            Mutation::Remove(p, n) => {
                let p = at(*p, b.len());
                let end = (p + n).min(b.len());
                b.drain(p..end);
            }
            Mutation::Splice(p, other, from) if !others.is_empty() => {
                let o = &others[other % others.len()];
                b.truncate(at(*p, b.len()));
                b.extend_from_slice(&o[at(*from, o.len())..]);
            }
            _ => {}
        }
    }
    b
}

/// The seed files of fuzz target `target` under `corpus` (`fuzz/corpus`), sorted
/// by name. Panics when there are none, so a test never runs on an empty corpus.
pub fn seeds(corpus: &std::path::Path, target: &str) -> Vec<Vec<u8>> {
    let dir = corpus.join(target);
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    paths.sort();
    let seeds: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}
