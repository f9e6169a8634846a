//! PURE: `kube-nlproxy explain`. Where a new connection to `IP:PORT/PROTO` would
//! go, read from the elements of our nftables table, the way the table's
//! constant rules look them up (see `mode::nftables`): source ranges, services
//! without usable endpoints, masquerade decisions, session affinity, the
//! random pick among the endpoints of the entry point.
//!
//! The same function explains the kernel's table (a dump) and the desired one
//! (the renderer's), so `explain --source` reports where they disagree.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use kube_nlproxy_netlink::nft::codec::{fmt_element, fmt_key_value};
use kube_nlproxy_netlink::nft::{Element, KeyValue, TableState};
use serde::Serialize;

use crate::mode::nftables::{Entry, EntryKind, LocalDetector, SetId, TableSpec};

/// What explain reads of one table: elements by set name, and what in the table
/// is not ours.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableView {
    /// Elements per set name.
    pub sets: BTreeMap<String, Vec<Element>>,
    /// Rules without our fingerprint (someone else's), as `chain: comment`.
    pub foreign_rules: Vec<String>,
    /// The ServiceCIDRs whose unallocated addresses are dropped (read from the
    /// comments of their rules in `cluster-ips-check`).
    pub service_cidrs: Vec<IpNet>,
}

/// The ServiceCIDR of a rule comment written by the nftables mode.
fn unallocated_cidr(comment: &str) -> Option<IpNet> {
    comment
        .strip_prefix(crate::mode::nftables::UNALLOCATED_COMMENT)?
        .parse()
        .ok()
}

impl TableView {
    /// From a kernel dump.
    pub fn from_kernel(state: &TableState) -> Self {
        let mut foreign_rules = Vec::new();
        for (chain, rules) in &state.rules {
            for r in rules.iter().filter(|r| r.fingerprint.is_none()) {
                let comment = match r.comment.as_str() {
                    "" => "no comment".to_string(),
                    c => format!("comment \"{c}\""),
                };
                foreign_rules.push(format!("chain {chain}, handle {}, {comment}", r.handle));
            }
        }
        let service_cidrs = state
            .rules
            .values()
            .flatten()
            .filter(|r| r.fingerprint.is_some())
            .filter_map(|r| unallocated_cidr(&r.comment))
            .collect();
        TableView {
            sets: state.elements.clone(),
            foreign_rules,
            service_cidrs,
        }
    }

    /// From the desired table.
    pub fn from_spec(spec: &TableSpec) -> Self {
        TableView {
            sets: spec
                .sets
                .iter()
                .map(|(n, s)| (n.clone(), s.elements.iter().cloned().collect()))
                .collect(),
            foreign_rules: Vec::new(),
            service_cidrs: spec
                .chains
                .values()
                .flat_map(|c| &c.rules)
                .filter_map(|r| unallocated_cidr(r.comment.as_deref()?))
                .collect(),
        }
    }

    fn elements(&self, set: SetId) -> &[Element] {
        self.sets.get(&set.name()).map(Vec::as_slice).unwrap_or(&[])
    }

    fn find(&self, set: SetId, key: &[KeyValue]) -> Option<&Element> {
        self.elements(set).iter().find(|e| e.key == key)
    }

    /// The element whose key starts with `prefix` (a class: `entry . N . T`).
    fn find_prefix(&self, set: SetId, prefix: &[KeyValue]) -> Option<&Element> {
        self.elements(set)
            .iter()
            .find(|e| e.key.len() > prefix.len() && e.key.starts_with(prefix))
    }
}

/// The connection to explain and the node's facts the rules consult.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// Destination address.
    pub daddr: IpAddr,
    /// IP protocol number (6, 17, 132).
    pub proto: u8,
    /// Destination port.
    pub dport: u16,
    /// `--from`: the client's address.
    pub saddr: Option<IpAddr>,
    /// The node's own addresses (`fib saddr type local`).
    pub local_addresses: Vec<IpAddr>,
    /// Whether NodePorts listen on every local address (`--nodeport-addresses`
    /// unset) rather than those in `nodeport-ips`.
    pub nodeport_all: bool,
    /// `--detect-local-mode` resolved (which sources are pods of this cluster).
    pub local_detector: LocalDetector,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
}

/// What happens to the new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// DNATed to one of the candidate endpoints.
    Served,
    /// Rejected (ICMP unreachable / TCP reset).
    Rejected,
    /// Dropped.
    Dropped,
    /// No Service is at this address and port: our table lets it pass.
    NotAService,
    /// Served, but not by every endpoint it should be: endpoint elements are
    /// missing from the kernel (changed behind our back, or not synced yet).
    Degraded,
}

impl Outcome {
    /// The exit status of `explain` (see `--help`).
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Served => 0,
            Outcome::Rejected => 3,
            Outcome::Dropped => 4,
            Outcome::NotAService => 5,
            Outcome::Degraded => 6,
        }
    }
}

/// An endpoint the connection may go to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// `address:port` the connection is DNATed to.
    pub endpoint: String,
    /// Its index in the entry point's endpoint list (`numgen random mod N`);
    /// nftables mode only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// The IPVS real server's weight (0: draining, takes no new connection);
    /// ipvs mode only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// The path of a new connection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// What happens.
    pub outcome: Outcome,
    /// The Service port matched (`ns/name:port`).
    pub service: Option<String>,
    /// How it matched: `ClusterIP`, `NodePort`, `external IP or LB IP`.
    pub matched_by: Option<String>,
    /// Which endpoints and why (policy).
    pub endpoints_from: Option<String>,
    /// The endpoints the connection may be DNATed to.
    pub candidates: Vec<Candidate>,
    /// The client's session-affinity entry, when it has one that is followed.
    pub affinity: Option<String>,
    /// Whether the connection is masqueraded (source NAT to the node), and why;
    /// `None` when it depends on an unknown source (no `--from`).
    pub masquerade: Option<bool>,
    /// Why it is (not) masqueraded, or what it depends on.
    pub masquerade_reason: String,
    /// The object that decides a reject or drop (set and element).
    pub decided_by: Option<String>,
    /// Steps in the order the packet meets them.
    pub steps: Vec<String>,
    /// Inconsistencies in the table: what our sync never writes (a class whose
    /// endpoints are missing, someone else's rules), i.e. changed behind our back.
    pub problems: Vec<String>,
}

fn key3(q: &Query, addr: IpAddr) -> Vec<KeyValue> {
    vec![
        KeyValue::Addr(addr),
        KeyValue::Proto(q.proto),
        KeyValue::Port(q.dport),
    ]
}

fn show(set: SetId, e: &Element) -> String {
    let c = e
        .comment
        .as_deref()
        .map(|c| format!("  # {c}"))
        .unwrap_or_default();
    format!("@{} {}{c}", set.name(), element_text(e))
}

/// An element as `key . key : data . data` (verdict maps: `: verdict`), counts
/// and indexes in decimal, without its comment.
pub fn element_text(e: &Element) -> String {
    let field = |k: &KeyValue| match k {
        KeyValue::Mark(n) => n.to_string(),
        other => fmt_key_value(other),
    };
    let key: Vec<String> = e.key.iter().map(field).collect();
    let mut out = key.join(" . ");
    if e.verdict.is_some() {
        let v = fmt_element(&Element {
            key: Vec::new(),
            comment: None,
            ..e.clone()
        });
        out.push_str(&v);
    } else if !e.data.is_empty() {
        let data: Vec<String> = e.data.iter().map(field).collect();
        out = format!("{out} : {}", data.join(" . "));
    }
    out
}

pub(crate) fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

/// Whether `saddr` is a pod of this cluster per the detector (`None`: cannot
/// tell).
pub(crate) fn from_pod(q: &Query, saddr: IpAddr) -> Option<bool> {
    match &q.local_detector {
        LocalDetector::None => Some(false),
        LocalDetector::Cidrs(cidrs) => Some(
            cidrs
                .iter()
                .filter(|c| c.addr().is_ipv4() == saddr.is_ipv4())
                .any(|c| c.contains(&saddr)),
        ),
        // An interface name: not known from an address.
        LocalDetector::BridgeInterface(_) | LocalDetector::InterfaceNamePrefix(_) => None,
    }
}

impl Explanation {
    /// Where every explanation starts: not a service, nothing decided, the
    /// rules in our table that are not ours as problems.
    pub(crate) fn start<'a>(foreign_rules: impl IntoIterator<Item = &'a String>) -> Self {
        Explanation {
            outcome: Outcome::NotAService,
            service: None,
            matched_by: None,
            endpoints_from: None,
            candidates: Vec::new(),
            affinity: None,
            masquerade: None,
            masquerade_reason: String::new(),
            decided_by: None,
            steps: Vec::new(),
            problems: foreign_rules
                .into_iter()
                .map(|r| format!("a rule that is not ours: {r}"))
                .collect(),
        }
    }
}

/// Explains a new connection `q` against `view`.
pub fn explain(view: &TableView, q: &Query) -> Explanation {
    let mut ex = Explanation::start(&view.foreign_rules);
    let k3 = key3(q, q.daddr);
    let k2 = vec![KeyValue::Proto(q.proto), KeyValue::Port(q.dport)];
    let src_local = q.saddr.map(|s| q.local_addresses.contains(&s));
    let nodeport_address = if q.nodeport_all {
        q.local_addresses.contains(&q.daddr) && !q.daddr.is_loopback()
    } else {
        view.find(SetId::NodeportIps, &[KeyValue::Addr(q.daddr)])
            .is_some()
    };
    let name_of = |e: &Element| e.comment.as_deref().map(str::to_string);

    // filter-prerouting / filter-output: loadBalancerSourceRanges.
    if let Some(fw) = view.find(SetId::FirewallIps, &k3) {
        ex.service = name_of(fw);
        ex.steps.push(format!(
            "firewall-check: {} is filtered by loadBalancerSourceRanges",
            show(SetId::FirewallIps, fw)
        ));
        match q.saddr {
            Some(s) => {
                let allowed = view.sets.keys().filter_map(|n| {
                    let p: u8 = n.strip_prefix("firewall-allow-")?.parse().ok()?;
                    let net = IpNet::new(s, p).ok()?.trunc().addr();
                    let mut k = k3.clone();
                    k.push(KeyValue::Addr(net));
                    view.find(SetId::FirewallAllow(p), &k)
                        .map(|e| show(SetId::FirewallAllow(p), e))
                });
                match allowed.into_iter().next() {
                    Some(e) => ex.steps.push(format!("firewall-check: {s} allowed by {e}")),
                    None => {
                        ex.outcome = Outcome::Dropped;
                        ex.decided_by = Some(format!(
                            "chain firewall-check: source {s} not in loadBalancerSourceRanges"
                        ));
                        return ex;
                    }
                }
            }
            None => ex
                .steps
                .push("firewall-check: the source decides (give --from to check it)".to_string()),
        }
    }

    // service-endpoints-check / nodeport-endpoints-check.
    let mut checks: Vec<(SetId, Vec<KeyValue>, Outcome, bool)> = vec![
        (
            SetId::NoEndpointReject(EntryKind::Ips),
            k3.clone(),
            Outcome::Rejected,
            false,
        ),
        (
            SetId::NoEndpointDrop(EntryKind::Ips),
            k3.clone(),
            Outcome::Dropped,
            false,
        ),
        (
            SetId::NoLocalEndpointDrop(EntryKind::Ips),
            k3.clone(),
            Outcome::Dropped,
            true,
        ),
    ];
    if nodeport_address {
        checks.extend([
            (
                SetId::NoEndpointReject(EntryKind::Nodeports),
                k2.clone(),
                Outcome::Rejected,
                false,
            ),
            (
                SetId::NoLocalEndpointDrop(EntryKind::Nodeports),
                k2.clone(),
                Outcome::Dropped,
                true,
            ),
            (
                SetId::NoEndpointDrop(EntryKind::Nodeports),
                k2.clone(),
                Outcome::Dropped,
                false,
            ),
        ]);
    }
    for (set, key, outcome, external_only) in checks {
        let Some(e) = view.find(set, &key) else {
            continue;
        };
        ex.service = name_of(e);
        ex.matched_by = Some(match set {
            SetId::NoEndpointReject(EntryKind::Nodeports)
            | SetId::NoEndpointDrop(EntryKind::Nodeports)
            | SetId::NoLocalEndpointDrop(EntryKind::Nodeports) => "NodePort".into(),
            _ if view
                .find(SetId::ClusterIps, &[KeyValue::Addr(q.daddr)])
                .is_some() =>
            {
                "ClusterIP".into()
            }
            _ => "external IP or LB IP".into(),
        });
        if external_only && src_local == Some(true) {
            ex.steps.push(format!(
                "{} applies only to traffic from outside the node",
                show(set, e)
            ));
            continue;
        }
        ex.outcome = outcome;
        let why = match set {
            SetId::NoEndpointReject(_) => "the service has no endpoints",
            SetId::NoEndpointDrop(_) => "its traffic policy finds no endpoint",
            _ => "externalTrafficPolicy Local and no endpoint on this node",
        };
        ex.decided_by = Some(show(set, e));
        ex.steps.push(format!(
            "{} {}: {why}",
            if outcome == Outcome::Rejected {
                "rejected by"
            } else {
                "dropped by"
            },
            show(set, e)
        ));
        if external_only && src_local.is_none() {
            ex.steps
                .push("(from this node itself it would go to the cluster endpoints)".into());
        }
        return ex;
    }

    // nat: masquerade decisions.
    let outside_cluster = q
        .saddr
        .map(|s| !q.local_addresses.contains(&s) && from_pod(q, s) != Some(true));
    let cluster_ip = view.find(SetId::ClusterIps, &[KeyValue::Addr(q.daddr)]);
    let mut masq: Option<(bool, String)> = None;
    if let Some(c) = cluster_ip {
        ex.service = ex.service.clone().or(name_of(c));
        if q.masquerade_all {
            masq = Some((true, "--masquerade-all".into()));
        } else if q.local_detector == LocalDetector::None {
            masq = Some((false, "ClusterIP, no local-traffic detector".into()));
        } else {
            masq = match q.saddr.map(|s| from_pod(q, s)) {
                Some(Some(true)) => Some((false, "ClusterIP from a pod of this cluster".into())),
                Some(Some(false)) => Some((
                    true,
                    "ClusterIP from outside the cluster (--detect-local-mode)".into(),
                )),
                _ => None,
            };
            if masq.is_none() {
                ex.masquerade_reason =
                    "ClusterIP: masqueraded when the client is outside the cluster".into();
            }
        }
    }
    let ext_cluster = view
        .find(SetId::ExternalCluster(EntryKind::Ips), &k3)
        .or_else(|| {
            nodeport_address
                .then(|| view.find(SetId::ExternalCluster(EntryKind::Nodeports), &k2))
                .flatten()
        });
    if ext_cluster.is_some() {
        masq = Some((
            true,
            "external traffic, externalTrafficPolicy Cluster".into(),
        ));
    }
    let ext_local_ips = view.find(SetId::ExternalLocal(EntryKind::Ips), &k3);
    let ext_local_np = nodeport_address
        .then(|| view.find(SetId::ExternalLocal(EntryKind::Nodeports), &k2))
        .flatten();
    let ext_local = ext_local_ips.is_some() || ext_local_np.is_some();
    if ext_local {
        masq = match src_local {
            Some(true) => Some((
                true,
                "the node's own traffic to externalTrafficPolicy Local".into(),
            )),
            Some(false) => Some((
                false,
                "externalTrafficPolicy Local keeps the client's address".into(),
            )),
            None => {
                ex.masquerade_reason = "externalTrafficPolicy Local: not masqueraded, \
                    except the node's own traffic"
                    .into();
                None
            }
        };
    }

    // Dispatch: which entry point, which endpoints.
    let local_path = ext_local && outside_cluster == Some(true);
    let mut entries: Vec<(Entry, Vec<KeyValue>, &str)> = Vec::new();
    if local_path {
        entries.push((
            Entry::Local(EntryKind::Ips),
            k3.clone(),
            "external IP or LB IP",
        ));
        if nodeport_address {
            entries.push((Entry::Local(EntryKind::Nodeports), k2.clone(), "NodePort"));
        }
    }
    entries.push((
        Entry::Main(EntryKind::Ips),
        k3.clone(),
        if cluster_ip.is_some() {
            "ClusterIP"
        } else {
            "external IP or LB IP"
        },
    ));
    if nodeport_address {
        entries.push((Entry::Main(EntryKind::Nodeports), k2.clone(), "NodePort"));
    }
    let mut missing_endpoints = false;
    for (entry, key, how) in entries {
        let Some(class) = view.find_prefix(SetId::Classes(entry), &key) else {
            continue;
        };
        ex.service = name_of(class).or(ex.service.clone());
        ex.matched_by = Some(how.to_string());
        let (n, timeout) = match class.key[key.len()..] {
            [KeyValue::Mark(n), KeyValue::Mark(t)] => (n, t),
            _ => {
                ex.problems.push(format!(
                    "undecodable class {}",
                    show(SetId::Classes(entry), class)
                ));
                continue;
            }
        };
        ex.endpoints_from = Some(match entry {
            Entry::Local(_) => {
                "this node's endpoints (externalTrafficPolicy Local, traffic from outside)".into()
            }
            Entry::Main(_) if ext_local => {
                "all endpoints (externalTrafficPolicy Local: traffic from pods or this node)".into()
            }
            Entry::Main(_) => {
                "the traffic policy's endpoints (cluster-wide, or this node's for Local)".into()
            }
        });
        ex.steps.push(format!(
            "matched {how} by {} ({n} endpoints{})",
            show(SetId::Classes(entry), class),
            if timeout > 0 {
                format!(", ClientIP affinity {timeout}s")
            } else {
                String::new()
            }
        ));
        for i in 0..n {
            let mut k = key.clone();
            k.push(KeyValue::Mark(i));
            match view.find(SetId::Endpoints(entry), &k) {
                Some(e) => match e.data.as_slice() {
                    [KeyValue::Addr(a), KeyValue::Port(p)] => ex.candidates.push(Candidate {
                        endpoint: match a {
                            IpAddr::V4(_) => format!("{a}:{p}"),
                            IpAddr::V6(_) => format!("[{a}]:{p}"),
                        },
                        index: Some(i),
                        weight: None,
                    }),
                    _ => ex.problems.push(format!(
                        "undecodable endpoint {}",
                        show(SetId::Endpoints(entry), e)
                    )),
                },
                None => {
                    missing_endpoints = true;
                    ex.problems.push(format!(
                        "endpoint {i} of {n} is missing from @{} (changed behind our back): \
                         connections that pick it are not DNATed",
                        SetId::Endpoints(entry).name()
                    ))
                }
            }
        }
        // Session affinity: followed by the address the client connected to.
        if timeout > 0
            && let Some(s) = q.saddr
        {
            let mut k = vec![KeyValue::Addr(s)];
            k.extend(key3(q, q.daddr));
            if let Some(a) = view.find(SetId::Affinity, &k) {
                let target = a
                    .data
                    .iter()
                    .map(fmt_key_value)
                    .collect::<Vec<_>>()
                    .join(":");
                ex.affinity = Some(format!("{s} -> {target} (@affinity)"));
                ex.steps
                    .push(format!("session affinity: {s} goes back to {target}"));
            } else {
                ex.steps.push(format!(
                    "session affinity: no entry for {s} yet (random pick)"
                ));
            }
        }
        ex.outcome = Outcome::Served;
        break;
    }

    if ex.outcome == Outcome::Served {
        if missing_endpoints {
            ex.outcome = Outcome::Degraded;
        }
        match masq {
            Some((m, why)) => {
                ex.masquerade = Some(m);
                ex.masquerade_reason = why;
            }
            None if ex.masquerade_reason.is_empty() => {
                ex.masquerade = Some(false);
                ex.masquerade_reason = "no masquerade rule matches".into();
            }
            None => {}
        }
        return ex;
    }

    // cluster-ips-check: a ClusterIP at a port no Service has.
    if let Some(c) = cluster_ip {
        ex.outcome = Outcome::Rejected;
        ex.matched_by = Some("ClusterIP".into());
        ex.decided_by = Some(format!(
            "{} (chain cluster-ips-check: reject traffic to invalid ports of ClusterIPs)",
            show(SetId::ClusterIps, c)
        ));
        ex.steps.push(format!(
            "{} has no port {}/{}: rejected",
            q.daddr,
            q.dport,
            proto_name(q.proto)
        ));
        return ex;
    }
    // cluster-ips-check: an address of a ServiceCIDR that no Service has.
    if let Some(cidr) = view.service_cidrs.iter().find(|c| c.contains(&q.daddr)) {
        ex.outcome = Outcome::Dropped;
        ex.decided_by = Some(format!(
            "dropped: unallocated address of ServiceCIDR {cidr} (chain cluster-ips-check)"
        ));
        ex.steps.push(format!(
            "{} is in ServiceCIDR {cidr} but no Service has it: dropped",
            q.daddr
        ));
        return ex;
    }
    ex.steps.push(format!(
        "no Service at {}:{}/{} in our table",
        q.daddr,
        q.dport,
        proto_name(q.proto)
    ));
    ex
}

/// How people say an outcome.
fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Served => "served",
        Outcome::Rejected => "rejected",
        Outcome::Dropped => "dropped",
        Outcome::NotAService => "not a service",
        Outcome::Degraded => "degraded",
    }
}

/// Where two explanations (the kernel's, the desired state's) disagree, in
/// words (no debug notation).
pub fn disagreements(kernel: &Explanation, desired: &Explanation) -> Vec<String> {
    let mut out = Vec::new();
    if kernel.outcome != desired.outcome {
        out.push(format!(
            "outcome: the kernel says {}, the desired state {}",
            outcome_name(kernel.outcome),
            outcome_name(desired.outcome)
        ));
    }
    let service = |s: &Option<String>| s.clone().unwrap_or_else(|| "no service".into());
    if kernel.service != desired.service {
        out.push(format!(
            "service: the kernel has {}, the desired state {}",
            service(&kernel.service),
            service(&desired.service)
        ));
    }
    let endpoints = |ex: &Explanation| {
        let list: Vec<&str> = ex.candidates.iter().map(|c| c.endpoint.as_str()).collect();
        if list.is_empty() {
            "none".to_string()
        } else {
            list.join(", ")
        }
    };
    let (ks, ds) = (endpoints(kernel), endpoints(desired));
    if ks != ds {
        out.push(format!(
            "endpoints: the kernel has {ks}, the desired state {ds}"
        ));
    }
    let masq = |m: Option<bool>| match m {
        Some(true) => "masqueraded",
        Some(false) => "not masqueraded",
        None => "depends on the source",
    };
    if kernel.masquerade != desired.masquerade {
        out.push(format!(
            "masquerade: the kernel says {}, the desired state {}",
            masq(kernel.masquerade),
            masq(desired.masquerade)
        ));
    }
    out
}

/// The explanation as text.
pub fn render_text(q: &Query, ex: &Explanation, disagree: Option<&[String]>) -> String {
    let mut out = format!(
        "{}:{}/{}{}: {}\n",
        q.daddr,
        q.dport,
        proto_name(q.proto),
        q.saddr.map(|s| format!(" from {s}")).unwrap_or_default(),
        match ex.outcome {
            Outcome::Served => "served",
            Outcome::Rejected => "REJECTED",
            Outcome::Dropped => "DROPPED",
            Outcome::NotAService => "not a service",
            Outcome::Degraded => "DEGRADED (served by fewer endpoints than it should be)",
        }
    );
    if let Some(s) = &ex.service {
        out.push_str(&format!(
            "  service:    {s}{}\n",
            ex.matched_by
                .as_deref()
                .map(|m| format!(" (by {m})"))
                .unwrap_or_default()
        ));
    }
    if let Some(e) = &ex.endpoints_from {
        out.push_str(&format!("  endpoints:  {e}\n"));
    }
    for c in &ex.candidates {
        let how = match (c.index, c.weight) {
            (Some(i), _) => format!("index {i}"),
            (None, Some(0)) => "weight 0: draining, no new connections".to_string(),
            (None, Some(w)) => format!("weight {w}"),
            (None, None) => String::new(),
        };
        out.push_str(&format!("    -> {} ({how})\n", c.endpoint));
    }
    if let Some(a) = &ex.affinity {
        out.push_str(&format!("  affinity:   {a}\n"));
    }
    if ex.outcome == Outcome::Served {
        let m = match ex.masquerade {
            Some(true) => "yes",
            Some(false) => "no",
            None => "depends on the source (give --from)",
        };
        out.push_str(&format!("  masquerade: {m}: {}\n", ex.masquerade_reason));
    }
    if let Some(d) = &ex.decided_by {
        out.push_str(&format!("  decided by: {d}\n"));
    }
    for s in &ex.steps {
        out.push_str(&format!("  - {s}\n"));
    }
    for p in &ex.problems {
        out.push_str(&format!("  ! kernel: {p}\n"));
    }
    match disagree {
        Some([]) => out.push_str("  kernel and desired state agree\n"),
        Some(d) => {
            for x in d {
                out.push_str(&format!("  ! kernel differs from the desired state: {x}\n"));
            }
        }
        None => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, IpFamily, Protocol, ServicePort, ServicePortName, TrafficPolicy};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn view(svc: ServicePort, eps: Vec<Endpoint>) -> TableView {
        TableView::from_spec(&crate::mode::tests::table(svc, eps))
    }

    fn detector() -> LocalDetector {
        LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()])
    }

    fn svc() -> ServicePort {
        let name = ServicePortName {
            namespace: "default".into(),
            name: "web".into(),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
        };
        ServicePort {
            node_port: Some(30080),
            ..ServicePort::new(name, IpFamily::V4, Some(ip("10.96.0.10")), 80)
        }
    }

    fn q(daddr: &str, dport: u16, from: Option<&str>) -> Query {
        Query {
            daddr: ip(daddr),
            proto: 6,
            dport,
            saddr: from.map(ip),
            local_addresses: vec![ip("10.77.0.1")],
            nodeport_all: false,
            local_detector: detector(),
            masquerade_all: false,
        }
    }

    fn two() -> Vec<Endpoint> {
        vec![
            Endpoint::ready(ip("10.244.1.5"), 8080, true),
            Endpoint::ready(ip("10.244.2.5"), 8080, false),
        ]
    }

    #[test]
    fn clusterip_from_a_pod_is_served_unmasqueraded() {
        let ex = explain(
            &view(svc(), two()),
            &q("10.96.0.10", 80, Some("10.244.1.9")),
        );
        assert_eq!(ex.outcome, Outcome::Served);
        assert_eq!(ex.service.as_deref(), Some("default/web:http"));
        assert_eq!(ex.matched_by.as_deref(), Some("ClusterIP"));
        let c: Vec<&str> = ex.candidates.iter().map(|c| c.endpoint.as_str()).collect();
        assert_eq!(c, ["10.244.1.5:8080", "10.244.2.5:8080"]);
        assert_eq!(ex.masquerade, Some(false));
        // From outside the cluster: masqueraded; without --from: it depends.
        let ex = explain(&view(svc(), two()), &q("10.96.0.10", 80, Some("192.0.2.1")));
        assert_eq!(ex.masquerade, Some(true));
        let ex = explain(&view(svc(), two()), &q("10.96.0.10", 80, None));
        assert_eq!(ex.masquerade, None);
        assert_eq!(ex.outcome.exit_code(), 0);
    }

    #[test]
    fn nodeport_from_outside_is_masqueraded() {
        let ex = explain(
            &view(svc(), two()),
            &q("10.77.0.1", 30080, Some("192.0.2.1")),
        );
        assert_eq!(ex.outcome, Outcome::Served);
        assert_eq!(ex.matched_by.as_deref(), Some("NodePort"));
        assert_eq!(ex.candidates.len(), 2);
        assert_eq!(ex.masquerade, Some(true));
        // Not a NodePort address: not a service.
        let ex = explain(&view(svc(), two()), &q("10.77.0.9", 30080, None));
        assert_eq!(ex.outcome, Outcome::NotAService);
        assert_eq!(ex.outcome.exit_code(), 5);
    }

    #[test]
    fn no_endpoints_rejects_unknown_port_rejects() {
        let ex = explain(&view(svc(), vec![]), &q("10.96.0.10", 80, None));
        assert_eq!(ex.outcome, Outcome::Rejected);
        assert!(ex.decided_by.unwrap().contains("no-endpoint-reject-ips"));
        let ex = explain(&view(svc(), two()), &q("10.96.0.10", 81, None));
        assert_eq!(ex.outcome, Outcome::Rejected);
        assert!(ex.decided_by.unwrap().contains("cluster-ips"));
        assert_eq!(Outcome::Rejected.exit_code(), 3);
    }

    #[test]
    fn external_local_without_local_endpoint_drops_outside_traffic_only() {
        let s = ServicePort {
            external_policy: TrafficPolicy::Local,
            ..svc()
        };
        let remote = vec![Endpoint::ready(ip("10.244.2.5"), 8080, false)];
        let ex = explain(
            &view(s.clone(), remote.clone()),
            &q("10.77.0.1", 30080, Some("192.0.2.1")),
        );
        assert_eq!(ex.outcome, Outcome::Dropped);
        assert_eq!(ex.outcome.exit_code(), 4);
        // The node itself is short-circuited to the cluster endpoints.
        let ex = explain(
            &view(s.clone(), remote),
            &q("10.77.0.1", 30080, Some("10.77.0.1")),
        );
        assert_eq!(ex.outcome, Outcome::Served);
        assert_eq!(ex.masquerade, Some(true));
        // With a local endpoint: outside traffic goes to it, unmasqueraded.
        let ex = explain(&view(s, two()), &q("10.77.0.1", 30080, Some("192.0.2.1")));
        assert_eq!(ex.outcome, Outcome::Served);
        let c: Vec<&str> = ex.candidates.iter().map(|c| c.endpoint.as_str()).collect();
        assert_eq!(c, ["10.244.1.5:8080"]);
        assert_eq!(ex.masquerade, Some(false));
        assert!(ex.endpoints_from.unwrap().contains("this node's endpoints"));
    }

    #[test]
    fn a_missing_endpoint_element_is_a_problem_and_a_disagreement() {
        let desired = view(svc(), two());
        let mut kernel = desired.clone();
        kernel
            .sets
            .get_mut("endpoints-ips")
            .unwrap()
            .retain(|e| e.key.last() != Some(&KeyValue::Mark(1)));
        let query = q("10.96.0.10", 80, Some("10.244.1.9"));
        let k = explain(&kernel, &query);
        assert!(
            k.problems
                .iter()
                .any(|p| p.contains("endpoint 1 of 2 is missing"))
        );
        assert_eq!(k.outcome, Outcome::Degraded);
        assert_eq!(k.outcome.exit_code(), 6);
        let d = disagreements(&k, &explain(&desired, &query));
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("outcome:") && d[1].starts_with("endpoints:"));
        assert!(disagreements(&explain(&desired, &query), &explain(&desired, &query)).is_empty());
    }

    #[test]
    fn source_ranges_drop_other_sources() {
        let s = ServicePort {
            load_balancer_ips: vec![ip("192.0.2.50")],
            load_balancer_source_ranges: vec!["198.51.100.0/24".parse().unwrap()],
            ..svc()
        };
        let v = view(s, two());
        let ex = explain(&v, &q("192.0.2.50", 80, Some("203.0.113.1")));
        assert_eq!(ex.outcome, Outcome::Dropped);
        assert!(ex.decided_by.unwrap().contains("loadBalancerSourceRanges"));
        let ex = explain(&v, &q("192.0.2.50", 80, Some("198.51.100.7")));
        assert_eq!(ex.outcome, Outcome::Served);
        assert_eq!(ex.matched_by.as_deref(), Some("external IP or LB IP"));
    }
}
