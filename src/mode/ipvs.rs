//! PURE: the desired dataplane of `--proxy-mode ipvs`, after upstream kube-proxy's
//! IPVS mode (`pkg/proxy/ipvs/proxier.go`, `ipset.go`).
//!
//! * One IPVS virtual server (VS) per ClusterIP:port, externalIP:port, LB ingress
//!   IP:port and, per NodePort address, node IP:nodePort. Real servers are the
//!   categorized endpoints ([`categorize_endpoints`], shared with the nftables mode):
//!   the ClusterIP VS takes the internal-policy set, every other VS the
//!   external-policy set. eTP Local without local endpoints gives a VS without real
//!   servers, like upstream.
//! * ClusterIPs, externalIPs and LB ingress IPs are bound on the dummy link
//!   `kube-ipvs0` (upstream binds the same three kinds; NodePort VSs use addresses the
//!   node already has).
//! * The KUBE-* ipsets carry upstream's names, types and members. IPv6 sets take
//!   upstream's dual-stack naming: the `KUBE-` prefix becomes `KUBE-6-`
//!   (`KUBE-6-CLUSTER-IP`), so a node moving from kube-proxy finds the names it knows.
//! * Packet filtering and NAT is one nftables table `kube-nlproxy` per family with a
//!   constant handful of chains and rules (masquerade, hairpin, NodePort, LB source
//!   ranges, eTP Local, reject on unknown ports of service IPs).
//! * **eTP Local short-circuit** (upstream's iptables/nftables behaviour, which its
//!   IPVS mode lacks): the external VSs of an eTP Local service keep only local
//!   endpoints, for traffic from outside. Pods' (local-traffic detector) and the
//!   node's own new connections to those external addresses are DNATed in
//!   `nat-prerouting` / `nat-output`, before IPVS sees them, to the ClusterIP's VS
//!   (every endpoint) through the map [`SHORT_CIRCUIT`]; the node's own are marked
//!   for masquerade. Outside traffic to an eTP Local entry point without a local
//!   endpoint is dropped through the set [`NO_LOCAL_ENDPOINTS`]. Both hold one
//!   element per entry point, so the rules stay constant and a change is element
//!   deltas.
//!
//! **Why the rules match nft sets, not the ipsets.** Matching an ipset from
//! nftables needs nft_compat's xtables `set` match, which takes the set's kernel
//! INDEX, obtainable only through the non-netlink `getsockopt(SO_IP_SET,
//! IP_SET_OP_GET_BYNAME)` interface, plus xtables' binary match structs. Instead
//! each KUBE-* ipset is mirrored as an nft set of the same name and members in our
//! table, updated in the same nf_tables transaction as the rules. The ipsets
//! themselves are still maintained member by member — operators' tools
//! (`ipset list`) and a migration from kube-proxy rely on them, and the sync uses the
//! NodePort sets as the record of which NodePort VSs it owns.
//!
//! `hash:ip,port,net` (LB source CIDRs) has no exact nft counterpart without
//! interval sets, so it is mirrored as one set per distinct prefix length in use
//! (`KUBE-LOAD-BALANCER-SOURCE-CIDR-24`: `lb . proto . port . network`) with one
//! rule each (`ip saddr & mask`): at most 32 (v4) / 128 (v6) rules, independent of
//! the number of services. (A single set would let a /30 entry match every source
//! of its /24 under the /24 rule's mask.)

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kube_nlproxy_netlink::ipset::{IpsetMember, IpsetType};
use kube_nlproxy_netlink::nft::{
    ChainType, Element, Hook, KeyType, KeyValue, Reg, SetFlags, Verdict,
};

use crate::mode::nftables::{LocalDetector, TableSpec, family_of, local_source_into};
use crate::mode::rules::{KeyField, RuleBuilder};
use crate::model::{
    ClusterState, Endpoint, IpFamily, Protocol, ServicePort, ServicePortName, categorize_endpoints,
};

/// The dummy link service VIPs are bound to.
pub const DUMMY_LINK: &str = "kube-ipvs0";
/// Weight of every real server we program (0 means "draining").
pub const REAL_SERVER_WEIGHT: u32 = 1;

/// `KUBE-LOOP-BACK` (`hash:ip,port,ip`): local endpoint, port, endpoint → hairpin.
pub const LOOP_BACK: &str = "KUBE-LOOP-BACK";
/// `KUBE-CLUSTER-IP` (`hash:ip,port`)
pub const CLUSTER_IP: &str = "KUBE-CLUSTER-IP";
/// `KUBE-EXTERNAL-IP` (`hash:ip,port`)
pub const EXTERNAL_IP: &str = "KUBE-EXTERNAL-IP";
/// `KUBE-EXTERNAL-IP-LOCAL` (`hash:ip,port`): eTP Local external IPs.
pub const EXTERNAL_IP_LOCAL: &str = "KUBE-EXTERNAL-IP-LOCAL";
/// `KUBE-LOAD-BALANCER` (`hash:ip,port`)
pub const LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
/// `KUBE-LOAD-BALANCER-FW` (`hash:ip,port`): LB IPs with source ranges.
pub const LOAD_BALANCER_FW: &str = "KUBE-LOAD-BALANCER-FW";
/// `KUBE-LOAD-BALANCER-LOCAL` (`hash:ip,port`): eTP Local LB IPs.
pub const LOAD_BALANCER_LOCAL: &str = "KUBE-LOAD-BALANCER-LOCAL";
/// `KUBE-LOAD-BALANCER-SOURCE-IP` (`hash:ip,port,ip`)
pub const LOAD_BALANCER_SOURCE_IP: &str = "KUBE-LOAD-BALANCER-SOURCE-IP";
/// `KUBE-LOAD-BALANCER-SOURCE-CIDR` (`hash:ip,port,net`)
pub const LOAD_BALANCER_SOURCE_CIDR: &str = "KUBE-LOAD-BALANCER-SOURCE-CIDR";
/// `KUBE-NODE-PORT-TCP` (`bitmap:port`)
pub const NODE_PORT_TCP: &str = "KUBE-NODE-PORT-TCP";
/// `KUBE-NODE-PORT-LOCAL-TCP` (`bitmap:port`)
pub const NODE_PORT_LOCAL_TCP: &str = "KUBE-NODE-PORT-LOCAL-TCP";
/// `KUBE-NODE-PORT-UDP` (`bitmap:port`)
pub const NODE_PORT_UDP: &str = "KUBE-NODE-PORT-UDP";
/// `KUBE-NODE-PORT-LOCAL-UDP` (`bitmap:port`)
pub const NODE_PORT_LOCAL_UDP: &str = "KUBE-NODE-PORT-LOCAL-UDP";
/// `KUBE-NODE-PORT-SCTP-HASH` (`hash:ip,port`)
pub const NODE_PORT_SCTP: &str = "KUBE-NODE-PORT-SCTP-HASH";
/// `KUBE-NODE-PORT-LOCAL-SCTP-HASH` (`hash:ip,port`)
pub const NODE_PORT_LOCAL_SCTP: &str = "KUBE-NODE-PORT-LOCAL-SCTP-HASH";
/// `KUBE-HEALTH-CHECK-NODE-PORT` (`bitmap:port`)
pub const HEALTH_CHECK_NODE_PORT: &str = "KUBE-HEALTH-CHECK-NODE-PORT";
/// `KUBE-IPVS-IPS` (`hash:ip`): every address bound on `kube-ipvs0`.
pub const IPVS_IPS: &str = "KUBE-IPVS-IPS";

/// nft map of the mode's table (not an ipset): external address . protocol .
/// port of an `externalTrafficPolicy: Local` service → its ClusterIP . port.
/// Pods' and the node's own new connections to those addresses are DNATed to the
/// ClusterIP's virtual server, which has every endpoint (the short-circuit of
/// upstream's iptables and nftables modes); the node's own are masqueraded.
pub const SHORT_CIRCUIT: &str = "external-local-short-circuit";
/// nft set of the mode's table (not an ipset): external address . protocol .
/// port of `externalTrafficPolicy: Local` services that have endpoints but no
/// local one. Traffic from outside the cluster to them is dropped, like upstream's
/// iptables and nftables modes (IPVS would answer with a port unreachable).
pub const NO_LOCAL_ENDPOINTS: &str = "external-local-no-endpoints";

/// nft set of the mode's table (not an ipset): ClusterIP . protocol . port of
/// `internalTrafficPolicy: Local` services that have endpoints but no local one.
/// Traffic to them is dropped, like upstream's iptables and nftables modes (the
/// ClusterIP's VS, without real servers, would answer with a port unreachable).
pub const INTERNAL_NO_LOCAL_ENDPOINTS: &str = "internal-local-no-endpoints";

/// Every ipset of the mode with its type (IPv4 names; see [`ipset_name`]).
pub const IPSETS: [(&str, IpsetType); 17] = [
    (LOOP_BACK, IpsetType::HashIpPortIp),
    (CLUSTER_IP, IpsetType::HashIpPort),
    (EXTERNAL_IP, IpsetType::HashIpPort),
    (EXTERNAL_IP_LOCAL, IpsetType::HashIpPort),
    (LOAD_BALANCER, IpsetType::HashIpPort),
    (LOAD_BALANCER_FW, IpsetType::HashIpPort),
    (LOAD_BALANCER_LOCAL, IpsetType::HashIpPort),
    (LOAD_BALANCER_SOURCE_IP, IpsetType::HashIpPortIp),
    (LOAD_BALANCER_SOURCE_CIDR, IpsetType::HashIpPortNet),
    (NODE_PORT_TCP, IpsetType::BitmapPort),
    (NODE_PORT_LOCAL_TCP, IpsetType::BitmapPort),
    (NODE_PORT_UDP, IpsetType::BitmapPort),
    (NODE_PORT_LOCAL_UDP, IpsetType::BitmapPort),
    (NODE_PORT_SCTP, IpsetType::HashIpPort),
    (NODE_PORT_LOCAL_SCTP, IpsetType::HashIpPort),
    (HEALTH_CHECK_NODE_PORT, IpsetType::BitmapPort),
    (IPVS_IPS, IpsetType::HashIp),
];

/// The name of an ipset in `family`: IPv4 keeps `name`; IPv6 replaces the `KUBE-`
/// prefix by `KUBE-6-` (upstream's dual-stack naming), cut at 31 bytes.
pub fn ipset_name(name: &str, family: IpFamily) -> String {
    match family {
        IpFamily::V4 => name.to_string(),
        IpFamily::V6 => {
            let mut n = match name.strip_prefix("KUBE-") {
                Some(rest) => format!("KUBE-6-{rest}"),
                None => name.to_string(),
            };
            n.truncate(31);
            n
        }
    }
}

/// Options of the ipvs mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsOptions {
    /// `--ipvs-scheduler` (validated by config; `rr` by default).
    pub scheduler: String,
    /// Addresses NodePort VSs are created on (resolved `--nodeport-addresses`,
    /// both families mixed).
    pub nodeport_ips: Vec<IpAddr>,
    /// `--masquerade-all`
    pub masquerade_all: bool,
    /// `--detect-local-mode` resolved
    pub local_detector: LocalDetector,
    /// The packet-mark bit asking for masquerade (`1 << masqueradeBit`).
    pub masquerade_mark: u32,
    /// `--ipvs-exclude-cidrs`: virtual and real servers there are never deleted.
    pub exclude_cidrs: Vec<IpNet>,
}

/// Identity of a virtual server, as IPVS keys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VsKey {
    /// Family of `addr`.
    pub family: IpFamily,
    /// Protocol.
    pub protocol: Protocol,
    /// Virtual address.
    pub addr: IpAddr,
    /// Virtual port.
    pub port: u16,
}

impl std::fmt::Display for VsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{}:{a}:{}", self.protocol.name(), self.port),
            IpAddr::V6(a) => write!(f, "{}:[{a}]:{}", self.protocol.name(), self.port),
        }
    }
}

/// Why a virtual server exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VsKind {
    /// ClusterIP:port (internal policy)
    ClusterIp,
    /// externalIP:port (external policy)
    ExternalIp,
    /// LB ingress IP:port (external policy)
    LoadBalancer,
    /// node IP:nodePort (external policy)
    NodePort,
}

/// A real server: endpoint address and target port (weight [`REAL_SERVER_WEIGHT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RealServer {
    /// Endpoint address.
    pub addr: IpAddr,
    /// Target port.
    pub port: u16,
}

/// One desired virtual server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    /// The service port it serves (for logs).
    pub service: ServicePortName,
    /// Why it exists.
    pub kind: VsKind,
    /// IPVS scheduler: the Service's annotation, else `--ipvs-scheduler`.
    pub scheduler: String,
    /// `sessionAffinity: ClientIP` timeout → IPVS persistence (`-p`), seconds.
    pub persistence_timeout: Option<u32>,
    /// Real servers.
    pub real_servers: BTreeSet<RealServer>,
}

/// One KUBE-* ipset with the members it should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpsetSpec {
    /// Set name (family-specific, see [`ipset_name`]).
    pub name: String,
    /// Set type.
    pub kind: IpsetType,
    /// Family of the members (ignored by `bitmap:port`).
    pub family: IpFamily,
    /// Members.
    pub members: BTreeSet<IpsetMember>,
}

/// Everything the ipvs mode wants the kernel to hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpvsDesired {
    /// Virtual servers.
    pub virtual_servers: BTreeMap<VsKey, VirtualServer>,
    /// Addresses bound on `kube-ipvs0` (ClusterIPs, externalIPs, LB IPs).
    pub bound_addrs: BTreeSet<IpAddr>,
    /// The KUBE-* ipsets of both families, by name (always all of them).
    pub ipsets: BTreeMap<String, IpsetSpec>,
    /// The nftables table of each family (v4 first).
    pub tables: Vec<TableSpec>,
    /// The addresses NodePort VSs use (for the ownership of NodePort VSs).
    pub nodeport_ips: BTreeSet<IpAddr>,
    /// VS keys claimed by two service ports (the first in name order keeps it).
    pub conflicts: Vec<String>,
    /// `--ipvs-exclude-cidrs`: virtual and real servers there are never deleted.
    pub exclude_cidrs: Vec<IpNet>,
    /// Elements of the table's own sets and maps ([`SHORT_CIRCUIT`],
    /// [`NO_LOCAL_ENDPOINTS`]), per family and set, by key (the first service
    /// port in name order keeps a key).
    pub nft_elements: BTreeMap<(IpFamily, String), BTreeMap<Vec<KeyValue>, Element>>,
}

impl IpvsDesired {
    /// Number of nftables rules over both tables.
    pub fn rule_count(&self) -> usize {
        self.tables.iter().map(TableSpec::rule_count).sum()
    }
}

fn ip_port(ip: IpAddr, proto: Protocol, port: u16) -> IpsetMember {
    IpsetMember::IpPort {
        ip,
        proto: proto.number(),
        port,
    }
}

fn ip_port_ip(ip: IpAddr, proto: Protocol, port: u16, ip2: IpAddr) -> IpsetMember {
    IpsetMember::IpPortIp {
        ip,
        proto: proto.number(),
        port,
        ip2,
    }
}

/// Builds the desired IPVS dataplane.
pub fn desired_ipvs(state: &ClusterState, opts: &IpvsOptions) -> IpvsDesired {
    let mut d = renderer::empty_desired(opts);
    for ((_, family), svc) in &state.services {
        let endpoints = state
            .endpoints
            .get(&svc.name)
            .map(|eps| eps.as_slice())
            .unwrap_or(&[]);
        service_port(&mut d, svc, *family, endpoints, state, opts);
    }
    d.tables = IpFamily::ALL.iter().map(|f| table(*f, &d, opts)).collect();
    d
}

fn real_servers(eps: &[Endpoint]) -> BTreeSet<RealServer> {
    eps.iter()
        .map(|e| RealServer {
            addr: e.ip,
            port: e.port,
        })
        .collect()
}

fn service_port(
    d: &mut IpvsDesired,
    svc: &ServicePort,
    family: IpFamily,
    endpoints: &[Endpoint],
    state: &ClusterState,
    opts: &IpvsOptions,
) {
    let cat = categorize_endpoints(endpoints, svc, &state.node);
    let internal = if svc.internal_policy == crate::model::TrafficPolicy::Local {
        real_servers(&cat.local)
    } else {
        real_servers(&cat.cluster)
    };
    let etp_local = svc.external_policy_local();
    let external = if etp_local {
        real_servers(&cat.local)
    } else {
        real_servers(&cat.cluster)
    };
    let proto = svc.name.protocol;
    let port = svc.port;
    let scheduler = svc
        .ipvs_scheduler
        .clone()
        .unwrap_or_else(|| opts.scheduler.clone());
    let add_vs = |d: &mut IpvsDesired, addr: IpAddr, port: u16, kind: VsKind| {
        let key = VsKey {
            family,
            protocol: proto,
            addr,
            port,
        };
        if let Some(existing) = d.virtual_servers.get(&key) {
            d.conflicts.push(format!(
                "virtual server {key} is claimed by {} and {}; keeping the first",
                existing.service, svc.name
            ));
            return;
        }
        let real_servers = if kind == VsKind::ClusterIp {
            internal.clone()
        } else {
            external.clone()
        };
        d.virtual_servers.insert(
            key,
            VirtualServer {
                service: svc.name.clone(),
                kind,
                scheduler: scheduler.clone(),
                persistence_timeout: svc.affinity_timeout_seconds,
                real_servers,
            },
        );
    };
    let member = |d: &mut IpvsDesired, set: &str, m: IpsetMember| {
        d.ipsets
            .get_mut(&ipset_name(set, family))
            .expect("every ipset is declared")
            .members
            .insert(m);
    };

    if let Some(cip) = svc.cluster_ip {
        if svc.internal_policy == crate::model::TrafficPolicy::Local
            && internal.is_empty()
            && cat.has_any_endpoints
        {
            let key = vec![
                KeyValue::Addr(cip),
                KeyValue::Proto(proto.number()),
                KeyValue::Port(port),
            ];
            nft_element_into(d, family, INTERNAL_NO_LOCAL_ENDPOINTS, Element::new(key));
        }
        add_vs(d, cip, port, VsKind::ClusterIp);
        d.bound_addrs.insert(cip);
        member(d, CLUSTER_IP, ip_port(cip, proto, port));
        member(d, IPVS_IPS, IpsetMember::Ip(cip));
    }
    for ip in &svc.external_ips {
        add_vs(d, *ip, port, VsKind::ExternalIp);
        d.bound_addrs.insert(*ip);
        member(d, EXTERNAL_IP, ip_port(*ip, proto, port));
        if etp_local {
            member(d, EXTERNAL_IP_LOCAL, ip_port(*ip, proto, port));
        }
        member(d, IPVS_IPS, IpsetMember::Ip(*ip));
    }
    // A /0 source range allows everyone: the service is not firewalled at all
    // (ipset refuses a zero prefix in hash:…,net anyway).
    let ranges: Vec<IpNet> = svc.load_balancer_source_ranges.clone();
    let firewalled = !ranges.is_empty() && ranges.iter().all(|r| r.prefix_len() > 0);
    let node_allowed = state
        .node
        .ips
        .iter()
        .any(|ip| ranges.iter().any(|r| r.contains(ip)));
    for lb in &svc.load_balancer_ips {
        add_vs(d, *lb, port, VsKind::LoadBalancer);
        d.bound_addrs.insert(*lb);
        member(d, LOAD_BALANCER, ip_port(*lb, proto, port));
        member(d, IPVS_IPS, IpsetMember::Ip(*lb));
        if etp_local {
            member(d, LOAD_BALANCER_LOCAL, ip_port(*lb, proto, port));
        }
        if firewalled {
            member(d, LOAD_BALANCER_FW, ip_port(*lb, proto, port));
            for r in &ranges {
                member(
                    d,
                    LOAD_BALANCER_SOURCE_CIDR,
                    IpsetMember::IpPortNet {
                        ip: *lb,
                        proto: proto.number(),
                        port,
                        net: r.network(),
                        cidr: r.prefix_len(),
                    },
                );
            }
            // The node reaching its own LB IP: the source is the LB IP itself
            // (bound on kube-ipvs0), or a cloud LB SNATs to it.
            if node_allowed {
                member(
                    d,
                    LOAD_BALANCER_SOURCE_IP,
                    ip_port_ip(*lb, proto, port, *lb),
                );
            }
        }
    }
    if let Some(np) = svc.node_port {
        let node_ips: Vec<IpAddr> = opts
            .nodeport_ips
            .iter()
            .filter(|ip| IpFamily::of(ip) == family)
            .copied()
            .collect();
        for ip in &node_ips {
            add_vs(d, *ip, np, VsKind::NodePort);
        }
        match proto {
            Protocol::Tcp | Protocol::Udp => {
                let (all, local) = if proto == Protocol::Tcp {
                    (NODE_PORT_TCP, NODE_PORT_LOCAL_TCP)
                } else {
                    (NODE_PORT_UDP, NODE_PORT_LOCAL_UDP)
                };
                member(d, all, IpsetMember::Port(np));
                if etp_local {
                    member(d, local, IpsetMember::Port(np));
                }
            }
            Protocol::Sctp => {
                for ip in &node_ips {
                    member(d, NODE_PORT_SCTP, ip_port(*ip, proto, np));
                    if etp_local {
                        member(d, NODE_PORT_LOCAL_SCTP, ip_port(*ip, proto, np));
                    }
                }
            }
        }
    }
    if let Some(hc) = svc.health_check_node_port.filter(|_| etp_local) {
        member(d, HEALTH_CHECK_NODE_PORT, IpsetMember::Port(hc));
    }
    for ep in cat.all_reachable.iter().filter(|e| e.is_local) {
        member(d, LOOP_BACK, ip_port_ip(ep.ip, proto, ep.port, ep.ip));
    }

    // eTP Local: the external entry points (externalIPs, LB IPs, the NodePort on
    // every NodePort address) short-circuited for pods and the node itself to
    // the ClusterIP's virtual server; dropped from outside without a local
    // endpoint.
    if etp_local {
        let mut entries: Vec<(IpAddr, u16)> = svc
            .external_ips
            .iter()
            .chain(&svc.load_balancer_ips)
            .map(|a| (*a, port))
            .collect();
        if let Some(np) = svc.node_port {
            entries.extend(
                opts.nodeport_ips
                    .iter()
                    .filter(|ip| IpFamily::of(ip) == family)
                    .map(|ip| (*ip, np)),
            );
        }
        let no_local = cat.has_any_endpoints && cat.local.is_empty();
        for (addr, p) in entries {
            let key = vec![
                KeyValue::Addr(addr),
                KeyValue::Proto(proto.number()),
                KeyValue::Port(p),
            ];
            if let Some(cip) = svc.cluster_ip {
                let e = Element::new(key.clone())
                    .with_data(vec![KeyValue::Addr(cip), KeyValue::Port(port)]);
                nft_element_into(d, family, SHORT_CIRCUIT, e);
            }
            if no_local {
                nft_element_into(d, family, NO_LOCAL_ENDPOINTS, Element::new(key));
            }
        }
    }
}

/// Adds an element of the table's own sets; a key already there keeps its
/// first element.
fn nft_element_into(d: &mut IpvsDesired, family: IpFamily, set: &str, e: Element) {
    d.nft_elements
        .entry((family, set.to_string()))
        .or_default()
        .entry(e.key.clone())
        .or_insert(e);
}

/// nft key of an ipset type, and the element of a member.
fn nft_key(kind: IpsetType, family: IpFamily) -> Vec<KeyType> {
    let addr = KeyType::addr(family_of(family));
    match kind {
        IpsetType::HashIp => vec![addr],
        IpsetType::HashIpPort => vec![addr, KeyType::InetProto, KeyType::InetService],
        IpsetType::HashIpPortIp | IpsetType::HashIpPortNet => {
            vec![addr, KeyType::InetProto, KeyType::InetService, addr]
        }
        // Not a lone `inet_service`: a single-field key of 2 bytes is stored padded
        // to 4 and `nft list` then shows the ports as 32-bit numbers. The protocol
        // in front (fixed per set, see [`port_set_protocol`]) keeps it readable.
        _ => vec![KeyType::InetProto, KeyType::InetService],
    }
}

/// The protocol of the members of a `bitmap:port` set's mirror.
pub(crate) fn port_set_protocol(set: &str) -> u8 {
    if set.contains("-UDP") {
        Protocol::Udp.number()
    } else {
        Protocol::Tcp.number()
    }
}

pub(crate) fn nft_element(m: &IpsetMember, port_proto: u8) -> Vec<KeyValue> {
    match m {
        IpsetMember::Ip(ip) => vec![KeyValue::Addr(*ip)],
        IpsetMember::IpPort { ip, proto, port } => vec![
            KeyValue::Addr(*ip),
            KeyValue::Proto(*proto),
            KeyValue::Port(*port),
        ],
        IpsetMember::IpPortIp {
            ip,
            proto,
            port,
            ip2,
        } => vec![
            KeyValue::Addr(*ip),
            KeyValue::Proto(*proto),
            KeyValue::Port(*port),
            KeyValue::Addr(*ip2),
        ],
        IpsetMember::IpPortNet {
            ip,
            proto,
            port,
            net,
            ..
        } => vec![
            KeyValue::Addr(*ip),
            KeyValue::Proto(*proto),
            KeyValue::Port(*port),
            KeyValue::Addr(*net),
        ],
        IpsetMember::Port(p) => vec![KeyValue::Proto(port_proto), KeyValue::Port(*p)],
        IpsetMember::Net { addr, .. } => vec![KeyValue::Addr(*addr)],
        _ => Vec::new(),
    }
}

/// The nft set mirroring the `KUBE-LOAD-BALANCER-SOURCE-CIDR` members of one
/// prefix length (`KUBE-LOAD-BALANCER-SOURCE-CIDR-24`, `KUBE-6-…-64`).
pub fn source_cidr_set(family: IpFamily, prefix: u8) -> String {
    format!("{}-{prefix}", ipset_name(LOAD_BALANCER_SOURCE_CIDR, family))
}

const SERVICES: &str = "services";
const LB_CHAIN: &str = "load-balancer";
const NODE_PORT_CHAIN: &str = "node-port";
const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
const MASQUERADING: &str = "masquerading";
const FIREWALL_CHECK: &str = "firewall-check";
const SERVICE_PORTS_CHECK: &str = "service-ports-check";

/// The constant table of one family: the ipset mirrors plus the rules.
fn table(family: IpFamily, d: &IpvsDesired, opts: &IpvsOptions) -> TableSpec {
    use ChainType::{Filter, Nat};
    let ipsets = &d.ipsets;
    let nf = family_of(family);
    let mut t = TableSpec::new(nf);
    let addr_key = KeyType::addr(nf);
    for (name, data) in [
        (SHORT_CIRCUIT, vec![addr_key, KeyType::InetService]),
        (NO_LOCAL_ENDPOINTS, vec![]),
        (INTERNAL_NO_LOCAL_ENDPOINTS, vec![]),
    ] {
        t.set(
            name,
            vec![addr_key, KeyType::InetProto, KeyType::InetService],
            false,
            SetFlags::default(),
        );
        let spec = t.sets.get_mut(name).expect("declared above");
        spec.set.data = data;
        if let Some(elements) = d.nft_elements.get(&(family, name.to_string())) {
            spec.elements.extend(elements.values().cloned());
        }
    }
    let n = |name: &str| ipset_name(name, family);
    // hash:ip,port,net members by prefix length: one nft set (and one rule) per
    // length, or a /30 entry would match every source of its /24 under the /24
    // rule's mask.
    let mut by_prefix: BTreeMap<u8, Vec<&IpsetMember>> = BTreeMap::new();
    for spec in ipsets.values().filter(|s| s.family == family) {
        if spec.kind == IpsetType::HashIpPortNet {
            for m in &spec.members {
                if let IpsetMember::IpPortNet { cidr, .. } = m {
                    by_prefix.entry(*cidr).or_default().push(m);
                }
            }
            continue;
        }
        t.set(
            &spec.name,
            nft_key(spec.kind, family),
            false,
            SetFlags::default(),
        );
        for m in &spec.members {
            t.element(
                &spec.name,
                nft_element(m, port_set_protocol(&spec.name)),
                None,
                None,
            );
        }
    }
    for (prefix, members) in &by_prefix {
        let name = source_cidr_set(family, *prefix);
        t.set(
            &name,
            nft_key(IpsetType::HashIpPortNet, family),
            false,
            SetFlags::default(),
        );
        for m in members {
            t.element(&name, nft_element(m, 0), None, None);
        }
    }

    t.base_chain("nat-prerouting", Nat, Hook::Prerouting, -100);
    t.base_chain("nat-output", Nat, Hook::Output, -100);
    t.base_chain("nat-postrouting", Nat, Hook::Postrouting, 100);
    t.base_chain("filter-prerouting", Filter, Hook::Prerouting, -110);
    t.base_chain("filter-output", Filter, Hook::Output, -110);
    t.base_chain("filter-input", Filter, Hook::Input, -110);

    let b = || RuleBuilder::new(nf);
    let jump = |c: &str| Verdict::Jump(c.to_string());
    let dst = [KeyField::Daddr, KeyField::L4Proto, KeyField::Dport];
    let dst_src = [
        KeyField::Daddr,
        KeyField::L4Proto,
        KeyField::Dport,
        KeyField::Saddr,
    ];

    // From outside the cluster: neither the node itself nor a local pod.
    let outside = {
        let rule = b().fib_saddr_not_local();
        local_source_into(
            rule.clone(),
            nf,
            &opts.local_detector,
            &Default::default(),
            true,
        )
        .unwrap_or(rule)
    };
    t.rule(
        "filter-prerouting",
        outside
            .in_set(&dst, NO_LOCAL_ENDPOINTS, false)
            .verdict(Verdict::Drop),
        Some("external traffic to externalTrafficPolicy Local without a local endpoint"),
    );
    for chain in ["filter-prerouting", "filter-output"] {
        t.rule(
            chain,
            b().in_set(&dst, INTERNAL_NO_LOCAL_ENDPOINTS, false)
                .verdict(Verdict::Drop),
            Some("internalTrafficPolicy Local without a local endpoint"),
        );
    }
    t.rule("nat-prerouting", b().verdict(jump(SERVICES)), None);
    t.rule("nat-output", b().verdict(jump(SERVICES)), None);
    t.rule("nat-postrouting", b().verdict(jump(MASQUERADING)), None);
    t.rule(
        "filter-prerouting",
        b().ct_state_new().verdict(jump(FIREWALL_CHECK)),
        None,
    );
    t.rule(
        "filter-output",
        b().ct_state_new().verdict(jump(FIREWALL_CHECK)),
        None,
    );
    t.rule(
        "filter-input",
        b().ct_state_new()
            .in_set(&[KeyField::Daddr], &n(IPVS_IPS), false)
            .verdict(jump(SERVICE_PORTS_CHECK)),
        Some("traffic to a service IP"),
    );

    // services (nat prerouting/output): decide about masquerade; IPVS does the DNAT.
    // First the eTP Local short-circuit: the key in the registers from r32 4 on,
    // the ClusterIP . port after it, clear of NFT_REG_1 (r32 0-3) that the mark
    // statement uses.
    let a = nf.addr_len() / 4;
    let (key_at, data_at) = (4, 4 + a + 2);
    let short_circuit = |rule: RuleBuilder| {
        rule.load_at(&dst, key_at).lookup_reg(
            SHORT_CIRCUIT,
            Reg::r32(key_at),
            Some(Reg::r32(data_at)),
        )
    };
    t.rule(
        SERVICES,
        short_circuit(b().fib_saddr_local())
            .mark_set_or(opts.masquerade_mark)
            .dnat_regs(Reg::r32(data_at), Reg::r32(data_at + a)),
        Some("the node's own traffic to externalTrafficPolicy Local: every endpoint, masqueraded"),
    );
    if let Some(pods) = local_source_into(b(), nf, &opts.local_detector, &Default::default(), false)
    {
        t.rule(
            SERVICES,
            short_circuit(pods).dnat_regs(Reg::r32(data_at), Reg::r32(data_at + a)),
            Some("pods' traffic to externalTrafficPolicy Local: every endpoint"),
        );
    }
    t.rule(
        SERVICES,
        b().in_set(&dst, &n(LOAD_BALANCER), false)
            .verdict(Verdict::Goto(LB_CHAIN.into())),
        Some("LoadBalancer ingress IPs"),
    );
    let cluster_masq = if opts.masquerade_all {
        Some(b())
    } else {
        local_source_into(b(), nf, &opts.local_detector, &Default::default(), true)
    };
    if let Some(rule) = cluster_masq {
        t.rule(
            SERVICES,
            rule.in_set(&dst, &n(CLUSTER_IP), false)
                .verdict(jump(MARK_FOR_MASQUERADE)),
            Some("masquerade traffic to ClusterIPs from outside the cluster"),
        );
    }
    t.rule(
        SERVICES,
        b().in_set(&dst, &n(CLUSTER_IP), false)
            .verdict(Verdict::Return),
        None,
    );
    t.rule(
        SERVICES,
        b().in_set(&dst, &n(EXTERNAL_IP_LOCAL), false)
            .verdict(Verdict::Return),
        Some("externalTrafficPolicy Local: keep the client address"),
    );
    t.rule(
        SERVICES,
        b().in_set(&dst, &n(EXTERNAL_IP), false)
            .verdict(jump(MARK_FOR_MASQUERADE)),
        Some("masquerade traffic to external IPs"),
    );
    t.rule(
        SERVICES,
        b().in_set(&dst, &n(EXTERNAL_IP), false)
            .verdict(Verdict::Return),
        None,
    );
    t.rule(
        SERVICES,
        b().fib_daddr_local()
            .in_set(&[KeyField::Daddr], &n(IPVS_IPS), true)
            .verdict(Verdict::Goto(NODE_PORT_CHAIN.into())),
        Some("NodePorts"),
    );

    t.rule(
        LB_CHAIN,
        b().in_set(&dst, &n(LOAD_BALANCER_LOCAL), false)
            .verdict(Verdict::Return),
        Some("externalTrafficPolicy Local: keep the client address"),
    );
    t.rule(LB_CHAIN, b().verdict(jump(MARK_FOR_MASQUERADE)), None);

    for (all, local) in [
        (NODE_PORT_TCP, NODE_PORT_LOCAL_TCP),
        (NODE_PORT_UDP, NODE_PORT_LOCAL_UDP),
    ] {
        let proto_port = [KeyField::L4Proto, KeyField::Dport];
        t.rule(
            NODE_PORT_CHAIN,
            b().in_set(&proto_port, &n(local), false)
                .verdict(Verdict::Return),
            Some("externalTrafficPolicy Local: keep the client address"),
        );
        t.rule(
            NODE_PORT_CHAIN,
            b().in_set(&proto_port, &n(all), false)
                .verdict(jump(MARK_FOR_MASQUERADE)),
            None,
        );
    }
    t.rule(
        NODE_PORT_CHAIN,
        b().in_set(&dst, &n(NODE_PORT_LOCAL_SCTP), false)
            .verdict(Verdict::Return),
        Some("externalTrafficPolicy Local: keep the client address"),
    );
    t.rule(
        NODE_PORT_CHAIN,
        b().in_set(&dst, &n(NODE_PORT_SCTP), false)
            .verdict(jump(MARK_FOR_MASQUERADE)),
        None,
    );

    t.rule(
        MARK_FOR_MASQUERADE,
        b().mark_set_or(opts.masquerade_mark),
        None,
    );
    t.rule(
        MASQUERADING,
        b().in_set(&dst_src, &n(LOOP_BACK), false)
            .masquerade_fully_random(),
        Some("hairpin: a pod reaching itself through a service"),
    );
    t.rule(
        MASQUERADING,
        b().mark_bits_clear(opts.masquerade_mark)
            .verdict(Verdict::Return),
        None,
    );
    t.rule(MASQUERADING, b().mark_set_xor(opts.masquerade_mark), None);
    t.rule(MASQUERADING, b().masquerade_fully_random(), None);

    // loadBalancerSourceRanges.
    t.rule(
        FIREWALL_CHECK,
        b().in_set(&dst, &n(LOAD_BALANCER_FW), true)
            .verdict(Verdict::Return),
        None,
    );
    t.rule(
        FIREWALL_CHECK,
        b().in_set(&dst_src, &n(LOAD_BALANCER_SOURCE_IP), false)
            .verdict(Verdict::Return),
        None,
    );
    for prefix in by_prefix.keys().copied() {
        t.rule(
            FIREWALL_CHECK,
            b().in_set(
                &[
                    KeyField::Daddr,
                    KeyField::L4Proto,
                    KeyField::Dport,
                    KeyField::SaddrMasked(prefix),
                ],
                &source_cidr_set(family, prefix),
                false,
            )
            .verdict(Verdict::Return),
            Some("allowed by loadBalancerSourceRanges"),
        );
    }
    t.rule(
        FIREWALL_CHECK,
        b().verdict(Verdict::Drop),
        Some("source not in loadBalancerSourceRanges"),
    );

    // Service IPs are local addresses: anything but a service port is rejected.
    for set in [CLUSTER_IP, EXTERNAL_IP, LOAD_BALANCER] {
        t.rule(
            SERVICE_PORTS_CHECK,
            b().in_set(&dst, &n(set), false).verdict(Verdict::Return),
            None,
        );
    }
    t.rule(
        SERVICE_PORTS_CHECK,
        b().reject(),
        Some("reject traffic to unknown ports of service IPs"),
    );
    t
}

mod renderer;
pub use renderer::{IpvsRenderer, IpvsTouched, IpvsUpdate};

#[cfg(test)]
pub(crate) mod tests;
