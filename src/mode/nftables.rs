//! PURE: the nf_tables ruleset for a cluster state, per IP family.
//!
//! The layout follows upstream kube-proxy's nftables mode (KEP-3866) for its
//! semantics — `service-ips` / `service-nodeports` verdict maps, per-service chains,
//! per-endpoint chains doing the hairpin mark and DNAT, `no-endpoint-*` maps that
//! reject or drop, `cluster-ips` for unknown ports, `firewall-ips` for source ranges,
//! mark-for-masquerade + `masquerade fully-random` — with two changes measured to keep
//! the kernel's commit cost linear (DESIGN.md "Performance facts"):
//!
//! * endpoint selection is a chain of plain rules,
//!   `numgen random mod (N-i) == 0 goto endpoint-i`, instead of one anonymous
//!   `numgen … vmap { … }` set per service;
//! * session affinity uses ONE shared timeout set per family, keyed
//!   `client . endpoint address . endpoint port . service id`, instead of one set per
//!   endpoint; source ranges are plain rules in a per-service firewall chain.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kube_nlproxy_netlink::nft::{
    BaseChain, Chain, ChainType, Element, Family, Hook, KeyType, KeyValue, Rule, Set, SetFlags,
    Verdict,
};

use crate::mode::rules::{KeyField, RuleBuilder};
use crate::model::{
    ClusterState, Endpoint, IpFamily, ServicePort, ServicePortName, categorize_endpoints,
};

/// Name of both of our tables (`ip kube-nlproxy`, `ip6 kube-nlproxy`).
pub const TABLE: &str = "kube-nlproxy";

const SERVICE_IPS: &str = "service-ips";
const SERVICE_NODEPORTS: &str = "service-nodeports";
const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
const FIREWALL_IPS: &str = "firewall-ips";
const CLUSTER_IPS: &str = "cluster-ips";
const NODEPORT_IPS: &str = "nodeport-ips";
const AFFINITY: &str = "affinity";

const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
const MASQUERADING: &str = "masquerading";
const SERVICES: &str = "services";
const REJECT_CHAIN: &str = "reject-chain";
const FIREWALL_CHECK: &str = "firewall-check";
const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";

/// How the proxy tells traffic from local pods apart (`--detect-local-mode`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LocalDetector {
    /// No detector: off-cluster traffic to ClusterIPs is not masqueraded (unless
    /// `--masquerade-all`) and eTP Local cannot short-circuit pod traffic.
    #[default]
    None,
    /// `ClusterCIDR` / `NodeCIDR`: source address in one of these (per family).
    Cidrs(Vec<IpNet>),
    /// `BridgeInterface`: `iifname NAME`.
    BridgeInterface(String),
    /// `InterfaceNamePrefix`: `iifname PREFIX*`.
    InterfaceNamePrefix(String),
}

/// Which destination addresses NodePorts listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every local address except loopback (`fib daddr type local`).
    All,
    /// Only these addresses (both families mixed).
    Ips(Vec<IpAddr>),
}

/// Options of the nftables mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftablesOptions {
    /// `--masquerade-all`
    pub masquerade_all: bool,
    /// `--detect-local-mode` resolved
    pub local_detector: LocalDetector,
    /// `--nodeport-addresses` resolved
    pub nodeport_addresses: NodePortAddresses,
    /// The packet-mark bit asking for masquerade (`1 << masqueradeBit`, 0x4000).
    pub masquerade_mark: u32,
}

/// A chain with the rules it should hold, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    /// The chain.
    pub chain: Chain,
    /// Its rules.
    pub rules: Vec<Rule>,
}

/// A set with the elements it should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSpec {
    /// The set.
    pub set: Set,
    /// Its elements.
    pub elements: BTreeSet<Element>,
}

/// Everything one of our tables should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// `ip` or `ip6`.
    pub family: Family,
    /// Chains by name.
    pub chains: BTreeMap<String, ChainSpec>,
    /// Sets and maps by name.
    pub sets: BTreeMap<String, SetSpec>,
    /// Map keys claimed by two services (the first one in name order keeps it), as
    /// messages for the log.
    pub conflicts: Vec<String>,
    /// Verdict per (map, key), to find conflicts without scanning.
    claimed: BTreeMap<(String, Vec<KeyValue>), Option<Verdict>>,
}

impl TableSpec {
    pub(crate) fn new(family: Family) -> Self {
        TableSpec {
            family,
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
            conflicts: Vec::new(),
            claimed: BTreeMap::new(),
        }
    }

    pub(crate) fn chain(&mut self, name: &str) -> &mut Vec<Rule> {
        &mut self
            .chains
            .entry(name.to_string())
            .or_insert_with(|| ChainSpec {
                chain: Chain {
                    name: name.to_string(),
                    base: None,
                },
                rules: Vec::new(),
            })
            .rules
    }

    pub(crate) fn base_chain(&mut self, name: &str, kind: ChainType, hook: Hook, priority: i32) {
        self.chains.insert(
            name.to_string(),
            ChainSpec {
                chain: Chain {
                    name: name.to_string(),
                    base: Some(BaseChain {
                        kind,
                        hook,
                        priority,
                    }),
                },
                rules: Vec::new(),
            },
        );
    }

    pub(crate) fn set(
        &mut self,
        name: &str,
        key: Vec<KeyType>,
        verdict_map: bool,
        flags: SetFlags,
    ) {
        self.sets.insert(
            name.to_string(),
            SetSpec {
                set: Set {
                    name: name.to_string(),
                    key,
                    verdict_map,
                    flags,
                    timeout_ms: None,
                },
                elements: BTreeSet::new(),
            },
        );
    }

    pub(crate) fn element(&mut self, set: &str, key: Vec<KeyValue>, verdict: Option<Verdict>) {
        let spec = self.sets.get_mut(set).expect("set declared in skeleton");
        // A map holds one verdict per key: two services claiming the same
        // address/port keep the first (kube-proxy's behaviour is undefined here).
        if spec.set.verdict_map {
            let claim = (set.to_string(), key.clone());
            if let Some(existing) = self.claimed.get(&claim) {
                if *existing != verdict {
                    self.conflicts.push(format!(
                        "{set}: {key:?} is claimed by {existing:?} and {verdict:?}; keeping the first"
                    ));
                }
                return;
            }
            self.claimed.insert(claim, verdict.clone());
        }
        spec.elements.insert(Element { key, verdict });
    }

    pub(crate) fn rule(&mut self, chain: &str, builder: RuleBuilder, comment: Option<&str>) {
        let rule = builder.build(chain, comment);
        self.chain(chain).push(rule);
    }

    /// Number of rules over all chains.
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(|c| c.rules.len()).sum()
    }
}

pub(crate) fn family_of(f: IpFamily) -> Family {
    match f {
        IpFamily::V4 => Family::Ipv4,
        IpFamily::V6 => Family::Ipv6,
    }
}

/// Builds both tables (v4 first).
pub fn desired_tables(state: &ClusterState, opts: &NftablesOptions) -> Vec<TableSpec> {
    IpFamily::ALL
        .iter()
        .map(|f| desired_table(state, opts, *f))
        .collect()
}

/// Builds the table of one family.
pub fn desired_table(
    state: &ClusterState,
    opts: &NftablesOptions,
    ip_family: IpFamily,
) -> TableSpec {
    let family = family_of(ip_family);
    let mut t = skeleton(family, state, opts, ip_family);
    for ((_, f), svc) in &state.services {
        if *f != ip_family {
            continue;
        }
        let endpoints = state
            .endpoints
            .get(&svc.name)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        service_port(&mut t, svc, endpoints, state, opts);
    }
    t
}

/// Chains, sets and maps that exist whatever the services are.
fn skeleton(
    family: Family,
    state: &ClusterState,
    opts: &NftablesOptions,
    ip_family: IpFamily,
) -> TableSpec {
    use ChainType::{Filter, Nat};
    let mut t = TableSpec::new(family);
    let addr = KeyType::addr(family);
    let plain = SetFlags::default();

    t.set(CLUSTER_IPS, vec![addr], false, plain);
    t.set(NODEPORT_IPS, vec![addr], false, plain);
    let addr_proto_port = vec![addr, KeyType::InetProto, KeyType::InetService];
    let proto_port = vec![KeyType::InetProto, KeyType::InetService];
    t.set(SERVICE_IPS, addr_proto_port.clone(), true, plain);
    t.set(SERVICE_NODEPORTS, proto_port.clone(), true, plain);
    t.set(NO_ENDPOINT_SERVICES, addr_proto_port.clone(), true, plain);
    t.set(NO_ENDPOINT_NODEPORTS, proto_port, true, plain);
    t.set(FIREWALL_IPS, addr_proto_port, true, plain);
    t.set(
        AFFINITY,
        vec![addr, addr, KeyType::InetService, KeyType::Mark],
        false,
        SetFlags {
            timeout: true,
            dynamic: true,
        },
    );

    // Hooks, with upstream's priorities (filter at dstnat-10 / dstnat+10).
    t.base_chain("filter-prerouting", Filter, Hook::Prerouting, -110);
    t.base_chain("filter-input", Filter, Hook::Input, -110);
    t.base_chain("filter-forward", Filter, Hook::Forward, -110);
    t.base_chain("filter-output", Filter, Hook::Output, -110);
    t.base_chain("filter-output-post-dnat", Filter, Hook::Output, -90);
    t.base_chain("nat-prerouting", Nat, Hook::Prerouting, -100);
    t.base_chain("nat-output", Nat, Hook::Output, -100);
    t.base_chain("nat-postrouting", Nat, Hook::Postrouting, 100);

    let new = || RuleBuilder::new(family).ct_state_new();
    let jump = |c: &str| Verdict::Jump(c.to_string());
    t.rule(
        "filter-prerouting",
        new().verdict(jump(FIREWALL_CHECK)),
        None,
    );
    t.rule(
        "filter-input",
        new().verdict(jump(NODEPORT_ENDPOINTS_CHECK)),
        None,
    );
    t.rule(
        "filter-input",
        new().verdict(jump(SERVICE_ENDPOINTS_CHECK)),
        None,
    );
    t.rule(
        "filter-forward",
        new().verdict(jump(SERVICE_ENDPOINTS_CHECK)),
        None,
    );
    t.rule(
        "filter-forward",
        new().verdict(jump(CLUSTER_IPS_CHECK)),
        None,
    );
    t.rule(
        "filter-output",
        new().verdict(jump(SERVICE_ENDPOINTS_CHECK)),
        None,
    );
    t.rule("filter-output", new().verdict(jump(FIREWALL_CHECK)), None);
    t.rule(
        "filter-output-post-dnat",
        new().verdict(jump(CLUSTER_IPS_CHECK)),
        None,
    );
    t.rule(
        "nat-prerouting",
        RuleBuilder::new(family).verdict(jump(SERVICES)),
        None,
    );
    t.rule(
        "nat-output",
        RuleBuilder::new(family).verdict(jump(SERVICES)),
        None,
    );
    t.rule(
        "nat-postrouting",
        RuleBuilder::new(family).verdict(jump(MASQUERADING)),
        None,
    );

    let b = || RuleBuilder::new(family);
    t.rule(
        MARK_FOR_MASQUERADE,
        b().mark_set_or(opts.masquerade_mark),
        None,
    );
    t.rule(
        MASQUERADING,
        b().mark_bits_clear(opts.masquerade_mark)
            .verdict(Verdict::Return),
        None,
    );
    t.rule(MASQUERADING, b().mark_set_xor(opts.masquerade_mark), None);
    t.rule(MASQUERADING, b().masquerade_fully_random(), None);
    t.rule(REJECT_CHAIN, b().reject(), None);

    let addr_proto_port_fields = [KeyField::Daddr, KeyField::L4Proto, KeyField::Dport];
    let proto_port_fields = [KeyField::L4Proto, KeyField::Dport];
    t.rule(
        FIREWALL_CHECK,
        b().vmap(&addr_proto_port_fields, FIREWALL_IPS),
        Some("Filter traffic by loadBalancerSourceRanges"),
    );
    t.rule(
        SERVICE_ENDPOINTS_CHECK,
        b().vmap(&addr_proto_port_fields, NO_ENDPOINT_SERVICES),
        Some("Reject or drop traffic to services without usable endpoints"),
    );
    t.rule(
        SERVICES,
        b().vmap(&addr_proto_port_fields, SERVICE_IPS),
        Some("Service IPs"),
    );
    let loopback: IpNet = match family {
        Family::Ipv4 => "127.0.0.0/8".parse().expect("valid"),
        Family::Ipv6 => "::1/128".parse().expect("valid"),
    };
    let to_nodeport_addr = || match opts.nodeport_addresses {
        NodePortAddresses::All => RuleBuilder::new(family)
            .fib_daddr_local()
            .daddr_not_in(&loopback),
        NodePortAddresses::Ips(_) => {
            RuleBuilder::new(family).in_set(&[KeyField::Daddr], NODEPORT_IPS, false)
        }
    };
    t.rule(
        SERVICES,
        to_nodeport_addr().vmap(&proto_port_fields, SERVICE_NODEPORTS),
        Some("NodePorts"),
    );
    t.rule(
        NODEPORT_ENDPOINTS_CHECK,
        to_nodeport_addr().vmap(&proto_port_fields, NO_ENDPOINT_NODEPORTS),
        Some("Reject or drop NodePorts without usable endpoints"),
    );
    t.rule(
        CLUSTER_IPS_CHECK,
        b().in_set(&[KeyField::Daddr], CLUSTER_IPS, false).reject(),
        Some("Reject traffic to invalid ports of ClusterIPs"),
    );
    for cidr in state
        .service_cidrs
        .iter()
        .filter(|c| net_family(c) == ip_family)
    {
        t.rule(
            CLUSTER_IPS_CHECK,
            b().daddr_in(cidr).verdict(Verdict::Drop),
            Some("Drop traffic to unallocated ClusterIPs"),
        );
    }
    if let NodePortAddresses::Ips(ips) = &opts.nodeport_addresses {
        for ip in ips.iter().filter(|ip| IpFamily::of(ip) == ip_family) {
            t.element(NODEPORT_IPS, vec![KeyValue::Addr(*ip)], None);
        }
    }
    t
}

pub(crate) fn net_family(net: &IpNet) -> IpFamily {
    match net {
        IpNet::V4(_) => IpFamily::V4,
        IpNet::V6(_) => IpFamily::V6,
    }
}

/// The chain-name suffix upstream uses: `ns/name/proto/portname`, prefixed by a
/// short hash so different ports never share a chain even after truncation.
fn service_chain_id(name: &ServicePortName) -> String {
    let id = format!(
        "{}/{}/{}/{}",
        name.namespace,
        name.name,
        name.protocol.name(),
        name.port_name
    );
    format!("{}-{}", short_hash(&id), id)
}

fn endpoint_chain_name(svc: &ServicePortName, ep: &Endpoint) -> String {
    let ep_id = match ep.ip {
        IpAddr::V4(a) => format!("{a}/{}", ep.port),
        IpAddr::V6(a) => format!("[{a}]/{}", ep.port),
    };
    let full = format!("{}__{}", service_chain_id(svc), ep_id);
    truncate(format!("endpoint-{}-{}", short_hash(&full), &full[9..]))
}

fn truncate(mut name: String) -> String {
    // NFT_NAME_MAXLEN is 256 including the NUL; keep a margin and a char boundary.
    if name.len() > 200 {
        let mut cut = 200;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    name
}

/// 8 characters of base32 over an FNV-1a hash, stable across runs and versions.
fn short_hash(s: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let h = fnv1a(s.as_bytes());
    (0..8)
        .map(|i| ALPHABET[((h >> (i * 5)) & 31) as usize] as char)
        .collect()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A service port's id inside the shared affinity set.
fn affinity_id(name: &ServicePortName) -> u32 {
    let h = fnv1a(name.to_string().as_bytes());
    (h ^ (h >> 32)) as u32
}

/// Rules and elements of one service port.
fn service_port(
    t: &mut TableSpec,
    svc: &ServicePort,
    endpoints: &[Endpoint],
    state: &ClusterState,
    opts: &NftablesOptions,
) {
    let family = t.family;
    let cat = categorize_endpoints(endpoints, svc, &state.node);
    let id = service_chain_id(&svc.name);
    let cluster_chain = truncate(format!("service-{id}"));
    let local_chain = truncate(format!("local-{id}"));
    let external_chain = truncate(format!("external-{id}"));
    let firewall_chain = truncate(format!("firewall-{id}"));
    let proto = svc.name.protocol.number();

    let has_endpoints = cat.has_any_endpoints;
    let uses_cluster_chain = !cat.cluster.is_empty() && svc.uses_cluster_endpoints();
    let uses_local_chain = !cat.local.is_empty() && svc.uses_local_endpoints();

    let (internal_chain, has_internal) =
        if svc.internal_policy == crate::model::TrafficPolicy::Local {
            (&local_chain, has_endpoints && !cat.local.is_empty())
        } else {
            (&cluster_chain, has_endpoints)
        };
    let (external_policy_chain, has_external) = if svc.external_policy_local() {
        (&local_chain, has_endpoints && !cat.local.is_empty())
    } else {
        (&cluster_chain, has_endpoints)
    };
    // Where traffic goes that has no usable endpoint: reject when there is none at
    // all, drop when there are endpoints but none this traffic may use.
    let no_endpoint_verdict = |has_any: bool| {
        if has_any {
            Verdict::Drop
        } else {
            Verdict::Goto(REJECT_CHAIN.to_string())
        }
    };
    let port = svc.port;

    // ClusterIP.
    if let Some(cip) = svc.cluster_ip {
        t.element(CLUSTER_IPS, vec![KeyValue::Addr(cip)], None);
        let key = vec![
            KeyValue::Addr(cip),
            KeyValue::Proto(proto),
            KeyValue::Port(port),
        ];
        if has_internal {
            t.element(
                SERVICE_IPS,
                key,
                Some(Verdict::Goto(internal_chain.clone())),
            );
        } else {
            t.element(
                NO_ENDPOINT_SERVICES,
                key,
                Some(no_endpoint_verdict(has_endpoints)),
            );
        }
    }

    // External addresses: externalIPs and LB ingress IPs.
    let external_addrs: Vec<IpAddr> = svc
        .external_ips
        .iter()
        .chain(&svc.load_balancer_ips)
        .copied()
        .collect();
    // Entry points for external traffic: into the external chain whenever the
    // service has endpoints (pods and the node may still short-circuit), plus a
    // filter verdict when external traffic itself has nowhere to go: reject without
    // endpoints, drop when eTP Local finds none on this node.
    let uses_external_chain =
        has_endpoints && (!external_addrs.is_empty() || svc.node_port.is_some());
    for addr in &external_addrs {
        let key = vec![
            KeyValue::Addr(*addr),
            KeyValue::Proto(proto),
            KeyValue::Port(port),
        ];
        if has_endpoints {
            t.element(
                SERVICE_IPS,
                key.clone(),
                Some(Verdict::Goto(external_chain.clone())),
            );
        }
        if !has_external {
            t.element(
                NO_ENDPOINT_SERVICES,
                key,
                Some(no_endpoint_verdict(has_endpoints)),
            );
        }
    }
    if let Some(node_port) = svc.node_port {
        let key = vec![KeyValue::Proto(proto), KeyValue::Port(node_port)];
        if has_endpoints {
            t.element(
                SERVICE_NODEPORTS,
                key.clone(),
                Some(Verdict::Goto(external_chain.clone())),
            );
        }
        if !has_external {
            t.element(
                NO_ENDPOINT_NODEPORTS,
                key,
                Some(no_endpoint_verdict(has_endpoints)),
            );
        }
    }

    // Source ranges for LB IPs: a firewall chain of plain rules.
    if !svc.load_balancer_source_ranges.is_empty() && !svc.load_balancer_ips.is_empty() {
        for lb in &svc.load_balancer_ips {
            t.element(
                FIREWALL_IPS,
                vec![
                    KeyValue::Addr(*lb),
                    KeyValue::Proto(proto),
                    KeyValue::Port(port),
                ],
                Some(Verdict::Goto(firewall_chain.clone())),
            );
        }
        for range in &svc.load_balancer_source_ranges {
            t.rule(
                &firewall_chain,
                RuleBuilder::new(family)
                    .saddr_in(range)
                    .verdict(Verdict::Return),
                Some("allowed by loadBalancerSourceRanges"),
            );
        }
        // A node that connects to its own LB IP may be SNATed by the cloud LB to that
        // IP: allow the LB IPs as sources when a node IP is inside the ranges.
        let node_allowed = state.node.ips.iter().any(|ip| {
            svc.load_balancer_source_ranges
                .iter()
                .any(|r| r.contains(ip))
        });
        if node_allowed {
            for lb in &svc.load_balancer_ips {
                t.rule(
                    &firewall_chain,
                    RuleBuilder::new(family)
                        .saddr_eq(*lb)
                        .verdict(Verdict::Return),
                    Some("node traffic SNATed to the LB IP"),
                );
            }
        }
        t.rule(
            &firewall_chain,
            RuleBuilder::new(family).verdict(Verdict::Drop),
            Some("source not in loadBalancerSourceRanges"),
        );
    }

    // The external chain.
    if uses_external_chain {
        if !svc.external_policy_local() {
            t.rule(
                &external_chain,
                RuleBuilder::new(family).verdict(Verdict::Jump(MARK_FOR_MASQUERADE.into())),
                Some("masquerade traffic from outside the cluster"),
            );
        } else {
            if uses_cluster_chain {
                if let Some(b) = local_source(family, &opts.local_detector, &state.node, false) {
                    t.rule(
                        &external_chain,
                        b.verdict(Verdict::Goto(cluster_chain.clone())),
                        Some("short-circuit pod traffic"),
                    );
                }
                t.rule(
                    &external_chain,
                    RuleBuilder::new(family)
                        .fib_saddr_local()
                        .verdict(Verdict::Jump(MARK_FOR_MASQUERADE.into())),
                    Some("masquerade local traffic"),
                );
                t.rule(
                    &external_chain,
                    RuleBuilder::new(family)
                        .fib_saddr_local()
                        .verdict(Verdict::Goto(cluster_chain.clone())),
                    Some("short-circuit local traffic"),
                );
            }
        }
        if has_external {
            t.rule(
                &external_chain,
                RuleBuilder::new(family).verdict(Verdict::Goto(external_policy_chain.clone())),
                None,
            );
        }
    }

    // Masquerade ClusterIP traffic from outside the cluster network.
    let cluster_ip_masquerade = |t: &mut TableSpec, chain: &str| {
        let Some(cip) = svc.cluster_ip else { return };
        let base = RuleBuilder::new(family)
            .daddr_eq(cip)
            .l4proto(proto)
            .dport(port);
        let rule = if opts.masquerade_all {
            Some(base)
        } else {
            local_source_into(base, family, &opts.local_detector, &state.node, true)
        };
        if let Some(rule) = rule {
            t.rule(
                chain,
                rule.verdict(Verdict::Jump(MARK_FOR_MASQUERADE.into())),
                Some("masquerade traffic to the ClusterIP from outside the cluster"),
            );
        }
    };

    let affinity = svc.affinity_timeout_seconds;
    let aff_id = affinity_id(&svc.name);
    if has_internal {
        cluster_ip_masquerade(t, internal_chain);
    }
    if uses_cluster_chain {
        dispatch(t, &cluster_chain, &svc.name, &cat.cluster, affinity, aff_id);
    }
    if uses_local_chain {
        dispatch(t, &local_chain, &svc.name, &cat.local, affinity, aff_id);
    }

    // Endpoint chains.
    let mut done = BTreeSet::new();
    for ep in cat.cluster.iter().chain(&cat.local) {
        if !done.insert((ep.ip, ep.port)) {
            continue;
        }
        let chain = endpoint_chain_name(&svc.name, ep);
        t.rule(
            &chain,
            RuleBuilder::new(family)
                .saddr_eq(ep.ip)
                .verdict(Verdict::Jump(MARK_FOR_MASQUERADE.into())),
            Some("hairpin"),
        );
        if let Some(timeout) = affinity {
            t.rule(
                &chain,
                RuleBuilder::new(family).update_set(&affinity_key(ep, aff_id), AFFINITY, timeout),
                Some("session affinity"),
            );
        }
        t.rule(
            &chain,
            RuleBuilder::new(family).l4proto(proto).dnat(ep.ip, ep.port),
            None,
        );
    }
}

fn affinity_key(ep: &Endpoint, id: u32) -> [KeyField; 4] {
    [
        KeyField::Saddr,
        KeyField::Addr(ep.ip),
        KeyField::Port(ep.port),
        KeyField::Mark(id),
    ]
}

/// The rules that pick one endpoint: affinity lookups first, then
/// `numgen random mod (N-i) == 0 goto endpoint-i`, the last one unconditional.
fn dispatch(
    t: &mut TableSpec,
    chain: &str,
    svc: &ServicePortName,
    endpoints: &[Endpoint],
    affinity: Option<u32>,
    aff_id: u32,
) {
    let family = t.family;
    let mut endpoints = endpoints.to_vec();
    endpoints.sort();
    endpoints.dedup_by(|a, b| a.ip == b.ip && a.port == b.port);
    if affinity.is_some() {
        for ep in &endpoints {
            t.rule(
                chain,
                RuleBuilder::new(family)
                    .in_set(&affinity_key(ep, aff_id), AFFINITY, false)
                    .verdict(Verdict::Goto(endpoint_chain_name(svc, ep))),
                Some("session affinity"),
            );
        }
    }
    let n = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let goto = Verdict::Goto(endpoint_chain_name(svc, ep));
        let rule = if i + 1 < n {
            RuleBuilder::new(family)
                .numgen_zero((n - i) as u32)
                .verdict(goto)
        } else {
            RuleBuilder::new(family).verdict(goto)
        };
        t.rule(chain, rule, None);
    }
}

/// A rule that matches traffic from local pods (`negate`: from anywhere else), or
/// `None` when the detector has nothing for this family.
fn local_source(
    family: Family,
    detector: &LocalDetector,
    node: &crate::model::NodeInfo,
    negate: bool,
) -> Option<RuleBuilder> {
    local_source_into(RuleBuilder::new(family), family, detector, node, negate)
}

pub(crate) fn local_source_into(
    b: RuleBuilder,
    family: Family,
    detector: &LocalDetector,
    _node: &crate::model::NodeInfo,
    negate: bool,
) -> Option<RuleBuilder> {
    let ip_family = match family {
        Family::Ipv4 => IpFamily::V4,
        Family::Ipv6 => IpFamily::V6,
    };
    match detector {
        LocalDetector::None => None,
        LocalDetector::Cidrs(cidrs) => {
            let cidr = cidrs.iter().find(|c| net_family(c) == ip_family)?;
            Some(if negate {
                b.saddr_not_in(cidr)
            } else {
                b.saddr_in(cidr)
            })
        }
        LocalDetector::BridgeInterface(name) => Some(b.iifname(name, negate)),
        LocalDetector::InterfaceNamePrefix(prefix) => Some(b.iifname_prefix(prefix, negate)),
    }
}

/// Summary numbers of a desired table, for logs and benchmarks.
pub fn table_summary(t: &TableSpec) -> String {
    let elements: usize = t.sets.values().map(|s| s.elements.len()).sum();
    format!(
        "{} {TABLE}: {} chains, {} rules, {} sets, {} elements",
        t.family.nft_name(),
        t.chains.len(),
        t.rule_count(),
        t.sets.len(),
        elements
    )
}
