//! PURE: `kube-nlproxy explain` in ipvs mode. Where a new connection to
//! `IP:PORT/PROTO` would go, read from the IPVS virtual servers and their real
//! servers, the KUBE-* ipsets and our ipvs-mode nftables table, in the order a
//! packet meets them (see `mode::ipvs`): the eTP/iTP Local drop sets, the
//! loadBalancerSourceRanges check, the eTP Local short-circuit, the masquerade
//! decision of chain `services`, IPVS's virtual server lookup, and
//! `service-ports-check` for unknown ports of service IPs.
//!
//! The rules match the nft mirrors of the ipsets (same names, same members), so
//! those decide; an ipset whose member disagrees with its mirror is reported.
//!
//! The same function explains the kernel ([`IpvsView::from_kernel`]) and the
//! desired state ([`IpvsView::from_desired`]), so `explain --source` reports
//! where they disagree.
//!
//! Session affinity: IPVS keeps a client's persistence template as a
//! connection entry, and IPVS's generic netlink family has no command that
//! dumps connections, so the kernel's view takes the client's templates from
//! `/proc/net/ip_vs_conn` ([`super::templates`]); the desired state has none.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kube_nlproxy_netlink::ipset::IpsetMember;
use kube_nlproxy_netlink::ipvs::codec::IP_VS_SVC_F_PERSISTENT;
use kube_nlproxy_netlink::ipvs::{IpvsDestination, IpvsService};
use kube_nlproxy_netlink::nft::{KeyValue, TableState};

use super::templates::PersistenceTemplate;
use super::{CurrentVs, IpvsCurrent, ipvs_service};
use crate::mode::ipvs::{
    CLUSTER_IP, EXTERNAL_IP, EXTERNAL_IP_LOCAL, INTERNAL_NO_LOCAL_ENDPOINTS, IPVS_IPS, IpvsDesired,
    LOAD_BALANCER, LOAD_BALANCER_FW, LOAD_BALANCER_LOCAL, LOAD_BALANCER_SOURCE_IP, LOOP_BACK,
    NO_LOCAL_ENDPOINTS, NODE_PORT_LOCAL_SCTP, NODE_PORT_LOCAL_TCP, NODE_PORT_LOCAL_UDP,
    NODE_PORT_SCTP, NODE_PORT_TCP, NODE_PORT_UDP, REAL_SERVER_WEIGHT, SHORT_CIRCUIT, VsKey,
    ipset_name, nft_element, port_set_protocol, source_cidr_set,
};
use crate::mode::nftables::{LocalDetector, TableSpec};
use crate::model::{IpFamily, Protocol};
use crate::sync::explain::{
    Candidate, Explanation, Outcome, Query, TableView, element_text, from_pod, proto_name,
};

/// What explain reads in ipvs mode, for one family.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IpvsView {
    /// IPVS virtual servers with their real servers, by key.
    pub services: BTreeMap<VsKey, CurrentVs>,
    /// Addresses on `kube-ipvs0`; `None` when the link does not exist.
    pub dummy: Option<BTreeSet<IpAddr>>,
    /// Members of our KUBE-* ipsets that exist, by name.
    pub ipsets: BTreeMap<String, BTreeSet<IpsetMember>>,
    /// Our ipvs-mode nftables table (`None`: absent).
    pub table: Option<TableView>,
    /// Service port names of virtual servers (the kernel has none: they come
    /// from the desired state when there is one).
    pub names: BTreeMap<VsKey, String>,
    /// The client's persistence templates, when they were read (the kernel's
    /// view with `--from`; `None` otherwise).
    pub templates: Option<Vec<PersistenceTemplate>>,
}

impl IpvsView {
    /// From the kernel: an IPVS-mode dump and our table of the family.
    pub fn from_kernel(current: &IpvsCurrent, table: Option<&TableState>) -> Self {
        IpvsView {
            services: current.services.clone(),
            dummy: current.dummy.clone(),
            ipsets: current
                .ipsets
                .iter()
                .map(|(n, s)| (n.clone(), s.members.clone()))
                .collect(),
            table: table.map(TableView::from_kernel),
            names: BTreeMap::new(),
            templates: None,
        }
    }

    /// From the desired state and its tables (`desired.tables` may be left
    /// empty by the renderer), for `family`'s table.
    pub fn from_desired(desired: &IpvsDesired, tables: &[TableSpec], family: IpFamily) -> Self {
        let nf = crate::mode::nftables::family_of(family);
        IpvsView {
            services: desired
                .virtual_servers
                .iter()
                .map(|(k, vs)| {
                    let dests = vs
                        .real_servers
                        .iter()
                        .map(|r| {
                            (
                                (r.addr, r.port),
                                IpvsDestination::new(r.addr, r.port).weight(REAL_SERVER_WEIGHT),
                            )
                        })
                        .collect();
                    (
                        *k,
                        CurrentVs {
                            service: ipvs_service(k, vs),
                            dests,
                        },
                    )
                })
                .collect(),
            dummy: Some(desired.bound_addrs.clone()),
            ipsets: desired
                .ipsets
                .iter()
                .map(|(n, s)| (n.clone(), s.members.clone()))
                .collect(),
            table: tables
                .iter()
                .find(|t| t.family == nf)
                .map(TableView::from_spec),
            names: Self::names_of(desired),
            templates: None,
        }
    }

    /// The service port of each desired virtual server, as `plan` and the
    /// nftables mode name it (`ns/name:port`).
    pub fn names_of(desired: &IpvsDesired) -> BTreeMap<VsKey, String> {
        desired
            .virtual_servers
            .iter()
            .map(|(k, vs)| {
                let n = &vs.service;
                let label = if n.port_name.is_empty() {
                    format!("{}/{}", n.namespace, n.name)
                } else {
                    format!("{}/{}:{}", n.namespace, n.name, n.port_name)
                };
                (*k, label)
            })
            .collect()
    }

    fn nft_has(&self, set: &str, key: &[KeyValue]) -> bool {
        self.table
            .as_ref()
            .and_then(|t| t.sets.get(set))
            .is_some_and(|els| els.iter().any(|e| e.key == key))
    }
}

fn protocol_of(p: u8) -> Option<Protocol> {
    match p {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

fn sock(a: IpAddr, p: u16) -> String {
    match a {
        IpAddr::V4(_) => format!("{a}:{p}"),
        IpAddr::V6(_) => format!("[{a}]:{p}"),
    }
}

/// Reads membership the way the rules do (the nft mirror), and notes where
/// the ipset of the same name says otherwise.
struct Sets<'a> {
    view: &'a IpvsView,
    family: IpFamily,
    problems: Vec<String>,
}

impl Sets<'_> {
    /// Whether `member` is in the KUBE-* set `base` (IPv4 name) of the family.
    fn has(&mut self, base: &str, member: IpsetMember) -> bool {
        let name = ipset_name(base, self.family);
        let key = nft_element(&member, port_set_protocol(&name));
        let mirror = self.view.nft_has(&name, &key);
        if let Some(members) = self.view.ipsets.get(&name)
            && members.contains(&member) != mirror
        {
            self.problems.push(format!(
                "ipset {name} {} {member:?} but its nft mirror (what the rules match) {}",
                if mirror { "lacks" } else { "has" },
                if mirror { "has it" } else { "does not" }
            ));
        }
        mirror
    }

    /// Whether the table's own set `set` has `key`.
    fn nft(&self, set: &str, key: &[KeyValue]) -> bool {
        self.view.nft_has(set, key)
    }
}

/// Explains a new connection `q` against `view` (ipvs mode).
pub fn explain_ipvs(view: &IpvsView, q: &Query) -> Explanation {
    let mut ex = Explanation::start(view.table.iter().flat_map(|t| &t.foreign_rules));
    let family = IpFamily::of(&q.daddr);
    let mut sets = Sets {
        view,
        family,
        problems: Vec::new(),
    };
    follow(view, q, &mut sets, &mut ex);
    ex.problems.append(&mut sets.problems);
    if view.table.is_none() {
        ex.problems.push(
            "our nftables table is absent: no masquerade, drop or reject rule applies".into(),
        );
    }
    if view.dummy.is_none() {
        ex.problems
            .push("kube-ipvs0 does not exist: service IPs are not local addresses".into());
    }
    ex
}

fn follow(view: &IpvsView, q: &Query, sets: &mut Sets<'_>, ex: &mut Explanation) -> Option<()> {
    let Some(protocol) = protocol_of(q.proto) else {
        ex.steps
            .push(format!("protocol {} is not TCP, UDP or SCTP", q.proto));
        return None;
    };
    let k3 = vec![
        KeyValue::Addr(q.daddr),
        KeyValue::Proto(q.proto),
        KeyValue::Port(q.dport),
    ];
    let ip_port = |ip: IpAddr, port: u16| IpsetMember::IpPort {
        ip,
        proto: q.proto,
        port,
    };
    let src_local = q.saddr.map(|s| q.local_addresses.contains(&s));
    let src_pod = q.saddr.and_then(|s| from_pod(q, s));
    // `fib saddr type local` or a pod of this cluster.
    let inside = match (src_local, src_pod) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        (Some(false), None) if q.local_detector == LocalDetector::None => Some(false),
        _ => None,
    };
    let show = |set: &str| {
        format!(
            "@{set} {}",
            element_text(&kube_nlproxy_netlink::nft::Element::new(k3.clone()))
        )
    };

    // filter-prerouting: eTP Local without a local endpoint, from outside.
    if sets.nft(NO_LOCAL_ENDPOINTS, &k3) {
        if inside == Some(true) {
            ex.steps.push(format!(
                "{} applies only to traffic from outside the cluster",
                show(NO_LOCAL_ENDPOINTS)
            ));
        } else {
            ex.outcome = Outcome::Dropped;
            ex.matched_by = Some("external IP, LB IP or NodePort".into());
            ex.decided_by = Some(show(NO_LOCAL_ENDPOINTS));
            ex.steps.push(format!(
                "dropped by {}: externalTrafficPolicy Local and no endpoint on this node",
                show(NO_LOCAL_ENDPOINTS)
            ));
            if inside.is_none() {
                ex.steps.push(
                    "(from a pod or this node itself it would go to the ClusterIP's endpoints)"
                        .into(),
                );
            }
            name_service(view, q, protocol, ex);
            return None;
        }
    }
    // filter-prerouting / filter-output: iTP Local without a local endpoint.
    if sets.nft(INTERNAL_NO_LOCAL_ENDPOINTS, &k3) {
        ex.outcome = Outcome::Dropped;
        ex.matched_by = Some("ClusterIP".into());
        ex.decided_by = Some(show(INTERNAL_NO_LOCAL_ENDPOINTS));
        ex.steps.push(format!(
            "dropped by {}: internalTrafficPolicy Local and no endpoint on this node",
            show(INTERNAL_NO_LOCAL_ENDPOINTS)
        ));
        name_service(view, q, protocol, ex);
        return None;
    }

    // firewall-check: loadBalancerSourceRanges.
    if sets.has(LOAD_BALANCER_FW, ip_port(q.daddr, q.dport)) {
        let fw = ipset_name(LOAD_BALANCER_FW, sets.family);
        ex.steps.push(format!(
            "firewall-check: {} is filtered by loadBalancerSourceRanges (@{fw})",
            sock(q.daddr, q.dport)
        ));
        match q.saddr {
            Some(s) => {
                let by_ip = sets.has(
                    LOAD_BALANCER_SOURCE_IP,
                    IpsetMember::IpPortIp {
                        ip: q.daddr,
                        proto: q.proto,
                        port: q.dport,
                        ip2: s,
                    },
                );
                let max = if s.is_ipv4() { 32 } else { 128 };
                let by_cidr = (1..=max).find_map(|p| {
                    let set = source_cidr_set(sets.family, p);
                    let net = IpNet::new(s, p).ok()?.trunc().addr();
                    let mut k = k3.clone();
                    k.push(KeyValue::Addr(net));
                    sets.nft(&set, &k).then(|| format!("@{set} {}/{p}", net))
                });
                match (by_ip, by_cidr) {
                    (true, _) => ex.steps.push(format!(
                        "firewall-check: {s} allowed by @{}",
                        ipset_name(LOAD_BALANCER_SOURCE_IP, sets.family)
                    )),
                    (false, Some(e)) => {
                        ex.steps.push(format!("firewall-check: {s} allowed by {e}"))
                    }
                    (false, None) => {
                        ex.outcome = Outcome::Dropped;
                        ex.matched_by = Some("LB IP".into());
                        ex.decided_by = Some(format!(
                            "chain firewall-check: source {s} not in loadBalancerSourceRanges (@{fw})"
                        ));
                        name_service(view, q, protocol, ex);
                        return None;
                    }
                }
            }
            None => ex
                .steps
                .push("firewall-check: the source decides (give --from to check it)".into()),
        }
    }

    // nat services: the eTP Local short-circuit for pods and the node itself.
    let mut target = (q.daddr, q.dport);
    let mut masq: Option<(bool, String)> = None;
    let short = view
        .table
        .as_ref()
        .and_then(|t| t.sets.get(SHORT_CIRCUIT))
        .and_then(|els| els.iter().find(|e| e.key == k3));
    let mut short_circuited = false;
    if let Some(e) = short
        && let [KeyValue::Addr(cip), KeyValue::Port(cport)] = e.data.as_slice()
    {
        let el = format!("@{SHORT_CIRCUIT} {}", element_text(e));
        match (src_local, src_pod) {
            (Some(true), _) => {
                target = (*cip, *cport);
                short_circuited = true;
                masq = Some((
                    true,
                    "the node's own traffic to externalTrafficPolicy Local".into(),
                ));
                ex.steps.push(format!(
                    "short-circuit {el}: the node's own connection goes to the ClusterIP's virtual server (every endpoint)"
                ));
            }
            (_, Some(true)) => {
                target = (*cip, *cport);
                short_circuited = true;
                masq = Some((
                    false,
                    "a pod's traffic to externalTrafficPolicy Local".into(),
                ));
                ex.steps.push(format!(
                    "short-circuit {el}: a pod's connection goes to the ClusterIP's virtual server (every endpoint)"
                ));
            }
            _ if inside.is_none() => ex.steps.push(format!(
                "{el}: from a pod or this node itself it would go to the ClusterIP's virtual server"
            )),
            _ => {}
        }
    }

    // What kind of entry point the address is, by the ipsets.
    let (taddr, tport) = target;
    let is_cluster_ip = sets.has(CLUSTER_IP, ip_port(taddr, tport));
    let is_external = !short_circuited && sets.has(EXTERNAL_IP, ip_port(taddr, tport));
    let is_lb = !short_circuited && sets.has(LOAD_BALANCER, ip_port(taddr, tport));
    let service_ip = sets.has(IPVS_IPS, IpsetMember::Ip(taddr));
    let (np_all, np_local) = match protocol {
        Protocol::Tcp => (NODE_PORT_TCP, NODE_PORT_LOCAL_TCP),
        Protocol::Udp => (NODE_PORT_UDP, NODE_PORT_LOCAL_UDP),
        Protocol::Sctp => (NODE_PORT_SCTP, NODE_PORT_LOCAL_SCTP),
    };
    let np_member = |port| match protocol {
        Protocol::Sctp => ip_port(q.daddr, port),
        _ => IpsetMember::Port(port),
    };
    let is_nodeport = !short_circuited
        && !service_ip
        && q.local_addresses.contains(&q.daddr)
        && sets.has(np_all, np_member(q.dport));
    let how = if is_cluster_ip {
        "ClusterIP"
    } else if is_lb {
        "LB IP"
    } else if is_external {
        "external IP"
    } else if is_nodeport {
        "NodePort"
    } else {
        "virtual server"
    };

    if masq.is_none() {
        masq = if is_lb {
            if sets.has(LOAD_BALANCER_LOCAL, ip_port(taddr, tport)) {
                Some((
                    false,
                    "externalTrafficPolicy Local keeps the client's address".into(),
                ))
            } else {
                Some((true, "LB IP, externalTrafficPolicy Cluster".into()))
            }
        } else if is_cluster_ip {
            if q.masquerade_all {
                Some((true, "--masquerade-all".into()))
            } else if q.local_detector == LocalDetector::None {
                Some((false, "ClusterIP, no local-traffic detector".into()))
            } else {
                match src_pod {
                    Some(true) => Some((false, "ClusterIP from a pod of this cluster".into())),
                    Some(false) => Some((
                        true,
                        "ClusterIP from outside the cluster (--detect-local-mode)".into(),
                    )),
                    None => {
                        ex.masquerade_reason =
                            "ClusterIP: masqueraded when the client is outside the cluster".into();
                        None
                    }
                }
            }
        } else if is_external {
            if sets.has(EXTERNAL_IP_LOCAL, ip_port(taddr, tport)) {
                Some((
                    false,
                    "externalTrafficPolicy Local keeps the client's address".into(),
                ))
            } else {
                Some((true, "external IP, externalTrafficPolicy Cluster".into()))
            }
        } else if is_nodeport {
            if sets.has(np_local, np_member(q.dport)) {
                Some((
                    false,
                    "externalTrafficPolicy Local keeps the client's address".into(),
                ))
            } else {
                Some((true, "NodePort, externalTrafficPolicy Cluster".into()))
            }
        } else {
            Some((false, "no masquerade rule matches".into()))
        };
    }

    // IPVS: the virtual server.
    let key = VsKey {
        family: sets.family,
        protocol,
        addr: taddr,
        port: tport,
    };
    let Some(vs) = view.services.get(&key) else {
        if service_ip || view.dummy.as_ref().is_some_and(|d| d.contains(&taddr)) {
            ex.outcome = Outcome::Rejected;
            ex.matched_by = Some(how.into());
            ex.decided_by = Some(format!(
                "chain service-ports-check: {} is a service IP (@{}) without a virtual server on port {}/{}",
                taddr,
                ipset_name(IPVS_IPS, sets.family),
                tport,
                proto_name(q.proto)
            ));
            ex.steps.push(format!(
                "no IPVS virtual server {key}: the service IP rejects unknown ports"
            ));
            if is_cluster_ip || is_external || is_lb {
                ex.problems.push(format!(
                    "the ipsets list {} but IPVS has no virtual server {key} (changed behind our back?)",
                    sock(taddr, tport)
                ));
            }
        } else {
            ex.steps.push(format!(
                "no IPVS virtual server {key} and not a service IP: not a service"
            ));
        }
        return None;
    };
    ex.matched_by = Some(how.into());
    name_service(view, q, protocol, ex);
    if let Some(n) = view.names.get(&key) {
        ex.service = Some(n.clone());
    }
    let on_dummy = view.dummy.as_ref().is_some_and(|d| d.contains(&taddr));
    if (is_cluster_ip || is_external || is_lb) && !on_dummy {
        ex.problems.push(format!(
            "{taddr} is not on kube-ipvs0: only this node's own connections reach its virtual server"
        ));
        if src_local == Some(false) {
            ex.outcome = Outcome::NotAService;
            ex.decided_by = Some(format!("{taddr} is not a local address of the node"));
            return None;
        }
    }
    ex.steps.push(format!(
        "matched {how} by IPVS virtual server {key} (scheduler {}, {} real servers{})",
        vs.service.scheduler,
        vs.dests.len(),
        persistence(&vs.service)
            .map(|t| format!(", persistence {t}s"))
            .unwrap_or_default()
    ));
    for d in vs.dests.values() {
        ex.candidates.push(Candidate {
            endpoint: sock(d.addr, d.port),
            index: None,
            weight: Some(d.weight),
        });
        if d.weight == 0 {
            ex.steps.push(format!(
                "{} has weight 0: terminating (draining), it keeps its {} active / {} inactive connections and takes no new one",
                sock(d.addr, d.port),
                d.active_conns,
                d.inact_conns
            ));
        }
    }
    ex.endpoints_from = Some(match how {
        "ClusterIP" if short_circuited => "the ClusterIP's real servers (every endpoint)".into(),
        "ClusterIP" => {
            "the internal traffic policy's endpoints (cluster-wide, or this node's for Local)"
                .into()
        }
        _ => "the external traffic policy's endpoints (cluster-wide, or this node's for Local)"
            .into(),
    });
    if !vs.dests.values().any(|d| d.weight > 0) {
        ex.outcome = Outcome::Rejected;
        ex.decided_by = Some(format!(
            "IPVS virtual server {key} has no real server with a weight above 0 (IPVS answers ICMP port unreachable)"
        ));
        ex.steps.push(if vs.dests.is_empty() {
            "the service has no endpoints: IPVS rejects".to_string()
        } else {
            "every real server is draining: IPVS rejects".to_string()
        });
        return None;
    }
    if let Some(t) = persistence(&vs.service) {
        let template = q.saddr.zip(view.templates.as_ref()).map(|(s, templates)| {
            templates.iter().find(|p| {
                p.client == s && p.proto == q.proto && p.vaddr == key.addr && p.vport == key.port
            })
        });
        ex.affinity = Some(match (q.saddr, template) {
            (Some(s), Some(Some(p))) => {
                let to = sock(p.dest, p.dport);
                let draining = vs
                    .dests
                    .get(&(p.dest, p.dport))
                    .is_none_or(|d| d.weight == 0);
                ex.steps.push(format!(
                    "session affinity: {s} goes back to {to} (IPVS persistence template, {}s left)",
                    p.expires
                ));
                if draining {
                    ex.steps.push(format!(
                        "{to} is draining or gone, but IPVS keeps sending {s} there while the template lives"
                    ));
                }
                format!(
                    "{s} -> {to} (IPVS persistence template, {}s left)",
                    p.expires
                )
            }
            (Some(s), Some(None)) => {
                ex.steps.push(format!(
                    "session affinity: no persistence template for {s} yet (the scheduler picks)"
                ));
                format!("ClientIP, IPVS persistence {t}s; no template for {s} yet")
            }
            (Some(s), None) => {
                format!("ClientIP, IPVS persistence {t}s; {s}'s template not read (desired state)")
            }
            (None, _) => format!("ClientIP, IPVS persistence {t}s"),
        });
    }
    // Hairpin: a pod reaching itself through the service.
    if let Some(s) = q.saddr
        && let Some(d) = vs.dests.values().find(|d| d.addr == s)
        && sets.has(
            LOOP_BACK,
            IpsetMember::IpPortIp {
                ip: d.addr,
                proto: q.proto,
                port: d.port,
                ip2: s,
            },
        )
    {
        ex.steps.push(format!(
            "hairpin: if {s} is picked it reaches itself and is masqueraded (@{})",
            ipset_name(LOOP_BACK, sets.family)
        ));
    }
    ex.outcome = Outcome::Served;
    if let Some((m, why)) = masq {
        ex.masquerade = Some(m);
        ex.masquerade_reason = why;
    }
    Some(())
}

/// The service port of the virtual server at the destination, when known.
fn name_service(view: &IpvsView, q: &Query, protocol: Protocol, ex: &mut Explanation) {
    let key = VsKey {
        family: IpFamily::of(&q.daddr),
        protocol,
        addr: q.daddr,
        port: q.dport,
    };
    ex.service = Some(
        view.names
            .get(&key)
            .cloned()
            .unwrap_or_else(|| format!("IPVS virtual server {key}")),
    );
}

fn persistence(s: &IpvsService) -> Option<u32> {
    (s.flags & IP_VS_SVC_F_PERSISTENT != 0).then_some(s.timeout)
}

/// Where the kernel's and the desired state's explanations disagree (ipvs
/// mode): as [`crate::sync::explain::disagreements`], leaving out the kernel's
/// draining real servers (weight 0), which graceful termination keeps on
/// purpose, and comparing what decides a reject or drop.
pub fn disagreements_ipvs(kernel: &Explanation, desired: &Explanation) -> Vec<String> {
    let serving = |e: &Explanation| Explanation {
        candidates: e
            .candidates
            .iter()
            .filter(|c| c.weight != Some(0))
            .cloned()
            .collect(),
        ..e.clone()
    };
    let mut out = crate::sync::explain::disagreements(&serving(kernel), &serving(desired));
    if kernel.decided_by != desired.decided_by {
        let rule = |d: &Option<String>| d.clone().unwrap_or_else(|| "no rule".into());
        out.push(format!(
            "decided by: the kernel {}, the desired state {}",
            rule(&kernel.decided_by),
            rule(&desired.decided_by)
        ));
    }
    out
}

#[cfg(test)]
mod tests;
