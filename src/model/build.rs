//! API objects -> [`ClusterState`], with upstream kube-proxy's semantics
//! (`pkg/proxy/servicechangetracker`, `serviceport.go`, `endpointslicecache.go`).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::parse::{parse_cidr_sloppy, parse_ip_sloppy};
use super::types::*;
use crate::source::Objects;

/// Label marking a Service handled by another proxy.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label marking a headless Service.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Label on an EndpointSlice naming its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Node zone label.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Annotation choosing the IPVS scheduler of one Service (ipvs mode).
pub const ANNOTATION_IPVS_SCHEDULER: &str = "kube-nlproxy.io/ipvs-scheduler";
/// The IPVS schedulers `--ipvs-scheduler` and [`ANNOTATION_IPVS_SCHEDULER`] accept.
pub const IPVS_SCHEDULERS: [&str; 11] = [
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh",
];
/// Default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10800;

/// Inputs of [`build`] that do not come from API objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildOptions {
    /// Our node name (`--hostname-override` or the host name).
    pub node_name: String,
    /// `--node-ip`; when non-empty it replaces the Node object's addresses.
    pub node_ips_override: Vec<IpAddr>,
    /// `--bind-address` / `bindAddress` when not `0.0.0.0`/`::`: the node's
    /// primary IP, replacing the Node object's address of its family (as
    /// kube-proxy reads it); `--node-ip` wins over it.
    pub primary_node_ip: Option<IpAddr>,
    /// `--ignore-external-ips`: every Service is built as if its
    /// `spec.externalIPs` were empty.
    pub ignore_external_ips: bool,
}

/// Something in an object that was ignored or skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// `Kind namespace/name`, e.g. `Service default/web`.
    pub object: String,
    /// The field, e.g. `spec.clusterIPs[0]`.
    pub field: String,
    /// What is wrong and what was done about it.
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.field, self.message)
    }
}

fn warn(
    warnings: &mut Vec<Warning>,
    object: &str,
    field: impl Into<String>,
    message: impl Into<String>,
) {
    warnings.push(Warning {
        object: object.to_owned(),
        field: field.into(),
        message: message.into(),
    });
}

/// Parse an API protocol string; unset means TCP.
fn parse_protocol(p: Option<&str>) -> Option<Protocol> {
    match p {
        None | Some("TCP") => Some(Protocol::Tcp),
        Some("UDP") => Some(Protocol::Udp),
        Some("SCTP") => Some(Protocol::Sctp),
        Some(_) => None,
    }
}

fn port_u16(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|p| *p != 0)
}

/// An optional port field (`nodePort`, `healthCheckNodePort`): unset or 0 means none;
/// out of 1..=65535 is a warning (`what` says what is lost) and none.
fn optional_port(
    value: Option<i32>,
    warnings: &mut Vec<Warning>,
    object: &str,
    field: impl Into<String>,
    what: &str,
) -> Option<u16> {
    match value {
        None | Some(0) => None,
        Some(p) => {
            let port = port_u16(p);
            if port.is_none() {
                warn(
                    warnings,
                    object,
                    field,
                    format!("invalid port {p} (must be 1-65535), {what}"),
                );
            }
            port
        }
    }
}

/// Build the cluster state from API objects. Never fails: invalid objects or fields
/// are skipped and reported as warnings.
pub fn build(objects: &Objects, opts: &BuildOptions) -> (ClusterState, Vec<Warning>) {
    let mut warnings = Vec::new();
    let mut state = ClusterState::default();

    for svc in &objects.services {
        for sp in service_ports(svc, opts, &mut warnings) {
            state.services.insert((sp.name.clone(), sp.family), sp);
        }
    }

    state.endpoints = endpoints(&objects.endpoint_slices, &opts.node_name, &mut warnings)
        .into_iter()
        .map(|(name, eps)| (name, Arc::new(eps)))
        .collect();
    // Keep only endpoints of service ports we serve.
    let known: std::collections::HashSet<&ServicePortName> =
        state.services.keys().map(|(n, _)| n).collect();
    state.endpoints.retain(|name, _| known.contains(name));

    state.node = node_info(&objects.nodes, opts, &mut warnings);
    state.service_cidrs = service_cidrs(&objects.service_cidrs, &mut warnings);
    (state, warnings)
}

/// `spec.cidrs` of every ServiceCIDR.
pub(super) fn service_cidrs(
    objects: &[k8s_openapi::api::networking::v1::ServiceCIDR],
    warnings: &mut Vec<Warning>,
) -> Vec<ipnet::IpNet> {
    let mut out = Vec::new();
    for cidr in objects {
        let object = format!(
            "ServiceCIDR {}",
            cidr.metadata.name.as_deref().unwrap_or("")
        );
        let cidrs = cidr.spec.as_ref().and_then(|s| s.cidrs.as_ref());
        for (i, c) in cidrs.into_iter().flatten().enumerate() {
            match parse_cidr_sloppy(c) {
                Some(net) => out.push(net),
                None => warn(
                    warnings,
                    &object,
                    format!("spec.cidrs[{i}]"),
                    format!("invalid CIDR {c:?}, ignored"),
                ),
            }
        }
    }
    out
}

/// Upstream `GetClusterIPByFamily` + `ShouldSkipService`, with warnings.
/// Returns the cluster IPs, at most one per family, or `None` when the service is
/// skipped.
fn cluster_ips(svc: &Service, object: &str, warnings: &mut Vec<Warning>) -> Option<Vec<IpAddr>> {
    let spec = svc.spec.as_ref()?;
    let primary = spec.cluster_ip.as_deref().unwrap_or("");
    let list: Vec<(String, &str)> = match spec.cluster_ips.as_deref() {
        Some(ips) if !ips.is_empty() => ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip.as_str()))
            .collect(),
        _ => vec![("spec.clusterIP".to_owned(), primary)],
    };
    if list
        .first()
        .is_none_or(|(_, ip)| ip.is_empty() || *ip == "None")
    {
        // Not allocated or headless: nothing to proxy.
        return None;
    }
    let mut out: Vec<IpAddr> = Vec::new();
    for (field, s) in list {
        match parse_ip_sloppy(s) {
            Some(ip) => {
                if out.iter().all(|o| IpFamily::of(o) != IpFamily::of(&ip)) {
                    out.push(ip);
                }
            }
            None => {
                warn(
                    warnings,
                    object,
                    field,
                    format!("invalid cluster IP {s:?}, service skipped"),
                );
                return None;
            }
        }
    }
    Some(out)
}

/// All service ports of one Service (one per port and family).
pub(super) fn service_ports(
    svc: &Service,
    opts: &BuildOptions,
    warnings: &mut Vec<Warning>,
) -> Vec<ServicePort> {
    let namespace: Arc<str> = svc
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default")
        .into();
    let name: Arc<str> = svc.metadata.name.as_deref().unwrap_or_default().into();
    let object = format!("Service {namespace}/{name}");
    let ignored_by_label = svc.metadata.labels.as_ref().is_some_and(|labels| {
        labels.contains_key(LABEL_SERVICE_PROXY_NAME) || labels.contains_key(LABEL_HEADLESS)
    });
    if ignored_by_label {
        return Vec::new();
    }
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    if type_ == "ExternalName" {
        return Vec::new();
    }
    let Some(cluster_ips) = cluster_ips(svc, &object, warnings) else {
        return Vec::new();
    };
    let node_port_type = type_ == "NodePort" || type_ == "LoadBalancer";

    let spec_external_ips: &[String] = match &spec.external_ips {
        Some(ips) if !opts.ignore_external_ips => ips,
        _ => &[],
    };
    let mut external_ips = Vec::new();
    for (i, s) in spec_external_ips.iter().enumerate() {
        match parse_ip_sloppy(s) {
            Some(ip) => external_ips.push(ip),
            None => warn(
                warnings,
                &object,
                format!("spec.externalIPs[{i}]"),
                format!("invalid IP {s:?}, ignored"),
            ),
        }
    }
    let mut lb_ips = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        let Some(s) = ing.ip.as_deref().filter(|s| !s.is_empty()) else {
            continue;
        };
        if ing.ip_mode.as_deref() == Some("Proxy") {
            continue;
        }
        match parse_ip_sloppy(s) {
            Some(ip) => lb_ips.push(ip),
            None => warn(
                warnings,
                &object,
                format!("status.loadBalancer.ingress[{i}].ip"),
                format!("invalid IP {s:?}, ignored"),
            ),
        }
    }
    let mut source_ranges: Vec<IpNet> = Vec::new();
    for (i, s) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        match parse_cidr_sloppy(s) {
            Some(net) => source_ranges.push(net),
            None => warn(
                warnings,
                &object,
                format!("spec.loadBalancerSourceRanges[{i}]"),
                format!("invalid CIDR {s:?}, ignored"),
            ),
        }
    }

    // Upstream apiservice.ExternalPolicyLocal: only meaningful for services reachable
    // from outside.
    let externally_reachable_type = node_port_type || !spec_external_ips.is_empty();
    let external_policy = match spec.external_traffic_policy.as_deref() {
        Some("Local") if externally_reachable_type => TrafficPolicy::Local,
        _ => TrafficPolicy::Cluster,
    };
    let internal_policy = match spec.internal_traffic_policy.as_deref() {
        Some("Local") => TrafficPolicy::Local,
        _ => TrafficPolicy::Cluster,
    };
    let affinity_timeout_seconds =
        (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .filter(|t| *t > 0)
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_SECONDS)
        });
    let health_check_node_port =
        if type_ == "LoadBalancer" && spec.external_traffic_policy.as_deref() == Some("Local") {
            optional_port(
                spec.health_check_node_port,
                warnings,
                &object,
                "spec.healthCheckNodePort",
                "no health check server for it",
            )
        } else {
            None
        };
    let traffic_distribution = match spec.traffic_distribution.as_deref() {
        Some("PreferClose" | "PreferSameZone") => TrafficDistribution::PreferSameZone,
        Some("PreferSameNode") => TrafficDistribution::PreferSameNode,
        _ => TrafficDistribution::Unset,
    };

    let ipvs_scheduler = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_IPVS_SCHEDULER))
        .and_then(|value| {
            let v = value.trim();
            if IPVS_SCHEDULERS.contains(&v) {
                Some(v.to_owned())
            } else {
                warn(
                    warnings,
                    &object,
                    format!("metadata.annotations[{ANNOTATION_IPVS_SCHEDULER}]"),
                    format!(
                        "unknown IPVS scheduler {value:?} (expected one of {}), using --ipvs-scheduler",
                        IPVS_SCHEDULERS.join(", ")
                    ),
                );
                None
            }
        });

    let mut out = Vec::new();
    // The apiserver rejects a whole Service with a duplicate port name or a port
    // number out of range, so upstream kube-proxy never sees one. From a file we
    // keep what can be served: the bad port is skipped, or only its nodePort, and
    // the rest of the Service is programmed. Names are unique among the ports kept
    // (the first wins), whatever their protocol, as the apiserver requires.
    let mut port_names: HashMap<&str, usize> = HashMap::new();
    for (i, port) in spec.ports.iter().flatten().enumerate() {
        let Some(protocol) = parse_protocol(port.protocol.as_deref()) else {
            warn(
                warnings,
                &object,
                format!("spec.ports[{i}].protocol"),
                format!(
                    "unknown protocol {:?}, port skipped",
                    port.protocol.as_deref().unwrap_or("")
                ),
            );
            continue;
        };
        let Some(port_number) = port_u16(port.port) else {
            warn(
                warnings,
                &object,
                format!("spec.ports[{i}].port"),
                format!("invalid port {} (must be 1-65535), port skipped", port.port),
            );
            continue;
        };
        let port_name = port.name.as_deref().unwrap_or("");
        if let Some(first) = port_names.get(port_name) {
            warn(
                warnings,
                &object,
                format!("spec.ports[{i}].name"),
                if port_name.is_empty() {
                    format!(
                        "a second unnamed port (also spec.ports[{first}]); ports must be named when there are several, port skipped"
                    )
                } else {
                    format!(
                        "duplicate port name {port_name:?} (also spec.ports[{first}]), port skipped"
                    )
                },
            );
            continue;
        }
        port_names.insert(port_name, i);
        // Unset or 0 is "no node port" (`allocateLoadBalancerNodePorts: false`). One
        // out of range loses only the node port: the cluster IP, external IPs and
        // load balancer IPs of this port still work.
        let node_port = if node_port_type {
            optional_port(
                port.node_port,
                warnings,
                &object,
                format!("spec.ports[{i}].nodePort"),
                "node port not served",
            )
        } else {
            None
        };
        let spn = ServicePortName {
            namespace: namespace.clone(),
            name: name.clone(),
            port_name: port.name.as_deref().unwrap_or_default().into(),
            protocol,
        };
        for cluster_ip in &cluster_ips {
            let family = IpFamily::of(cluster_ip);
            let of_family = |ip: &&IpAddr| IpFamily::of(ip) == family;
            out.push(ServicePort {
                name: spn.clone(),
                family,
                cluster_ip: Some(*cluster_ip),
                port: port_number,
                node_port,
                external_ips: external_ips.iter().filter(of_family).copied().collect(),
                load_balancer_ips: lb_ips.iter().filter(of_family).copied().collect(),
                load_balancer_source_ranges: source_ranges
                    .iter()
                    .filter(|n| IpFamily::of(&n.addr()) == family)
                    .copied()
                    .collect(),
                external_policy,
                internal_policy,
                affinity_timeout_seconds,
                health_check_node_port,
                traffic_distribution,
                ipvs_scheduler: ipvs_scheduler.clone(),
            });
        }
    }
    out
}

/// Merge all EndpointSlices into endpoints per service port name, like upstream's
/// endpointslicecache: the key uses the slice port's name and protocol, the first
/// endpoint for an `ip:port` wins unless a later one is local.
pub(super) fn endpoints(
    slices: &[EndpointSlice],
    node_name: &str,
    warnings: &mut Vec<Warning>,
) -> BTreeMap<ServicePortName, Vec<Endpoint>> {
    // Deterministic order: by namespace, service, slice name.
    let mut ordered: Vec<(&str, &str, IpFamily, &EndpointSlice)> = Vec::new();
    for slice in slices {
        let ns = slice.metadata.namespace.as_deref().unwrap_or("default");
        let slice_name = slice.metadata.name.as_deref().unwrap_or("");
        let family = match slice.address_type.as_str() {
            "IPv4" => IpFamily::V4,
            "IPv6" => IpFamily::V6,
            // Not proxied, as upstream.
            "FQDN" => continue,
            other => {
                warn(
                    warnings,
                    &format!("EndpointSlice {ns}/{slice_name}"),
                    "addressType",
                    format!("unknown address type {other:?} (IPv4, IPv6 or FQDN), slice ignored"),
                );
                continue;
            }
        };
        let svc = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SERVICE_NAME))
            .map(String::as_str)
            .filter(|s| !s.is_empty());
        let Some(svc) = svc else {
            warn(
                warnings,
                &format!("EndpointSlice {ns}/{slice_name}"),
                format!("metadata.labels[{LABEL_SERVICE_NAME}]"),
                "missing service name label, slice ignored",
            );
            continue;
        };
        ordered.push((ns, svc, family, slice));
    }
    ordered.sort_by(|a, b| {
        (a.0, a.1, a.3.metadata.name.as_deref()).cmp(&(b.0, b.1, b.3.metadata.name.as_deref()))
    });

    let mut out: BTreeMap<ServicePortName, Vec<Endpoint>> = BTreeMap::new();
    let mut index: HashMap<ServicePortName, HashMap<(IpAddr, u16), usize>> = HashMap::new();
    for (ns, svc, family, slice) in ordered {
        let object = format!(
            "EndpointSlice {ns}/{}",
            slice.metadata.name.as_deref().unwrap_or("")
        );
        // Each endpoint's address, checked once for all ports. Upstream's apiserver
        // rejects a slice with an invalid address or one of the other family, and
        // upstream's proxier of one family never sees the other family's slices;
        // here only the bad endpoint is dropped.
        let mut ips = Vec::with_capacity(slice.endpoints.len());
        for (ei, ep) in slice.endpoints.iter().enumerate() {
            let field = || format!("endpoints[{ei}].addresses[0]");
            let ip = match ep.addresses.first() {
                None => None,
                Some(addr) => match parse_ip_sloppy(addr) {
                    Some(ip) if IpFamily::of(&ip) == family => Some(ip),
                    Some(_) => {
                        warn(
                            warnings,
                            &object,
                            field(),
                            format!(
                                "address {addr:?} is not of the slice's addressType {}, endpoint ignored",
                                slice.address_type
                            ),
                        );
                        None
                    }
                    None => {
                        warn(
                            warnings,
                            &object,
                            field(),
                            format!("invalid IP {addr:?}, endpoint ignored"),
                        );
                        None
                    }
                },
            };
            ips.push(ip);
        }
        let (shared_ns, shared_svc): (Arc<str>, Arc<str>) = (ns.into(), svc.into());
        for (pi, port) in slice.ports.iter().flatten().enumerate() {
            let Some(port_number) = port.port else {
                continue;
            };
            let Some(port_number) = port_u16(port_number) else {
                warn(
                    warnings,
                    &object,
                    format!("ports[{pi}].port"),
                    format!("invalid port {port_number} (must be 1-65535), ignored"),
                );
                continue;
            };
            let Some(protocol) = parse_protocol(port.protocol.as_deref()) else {
                warn(
                    warnings,
                    &object,
                    format!("ports[{pi}].protocol"),
                    format!(
                        "unknown protocol {:?}, ignored",
                        port.protocol.as_deref().unwrap_or("")
                    ),
                );
                continue;
            };
            let spn = ServicePortName {
                namespace: shared_ns.clone(),
                name: shared_svc.clone(),
                port_name: port.name.as_deref().unwrap_or_default().into(),
                protocol,
            };
            let list = out.entry(spn.clone()).or_default();
            let seen = index.entry(spn).or_default();
            for (ep, ip) in slice.endpoints.iter().zip(&ips) {
                let Some(ip) = *ip else {
                    continue;
                };
                let cond = ep.conditions.as_ref();
                let hints = ep.hints.as_ref();
                let is_local = ep.node_name.as_deref().is_some_and(|n| n == node_name);
                let endpoint = Endpoint {
                    ip,
                    port: port_number,
                    ready: cond.and_then(|c| c.ready).unwrap_or(true),
                    serving: cond.and_then(|c| c.serving).unwrap_or(true),
                    terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
                    is_local,
                    zone: ep.zone.clone(),
                    zone_hints: hints
                        .and_then(|h| h.for_zones.as_ref())
                        .map(|z| z.iter().map(|z| z.name.clone()).collect())
                        .unwrap_or_default(),
                    node_hints: hints
                        .and_then(|h| h.for_nodes.as_ref())
                        .map(|n| n.iter().map(|n| n.name.clone()).collect())
                        .unwrap_or_default(),
                };
                match seen.get(&(ip, port_number)) {
                    None => {
                        seen.insert((ip, port_number), list.len());
                        list.push(endpoint);
                    }
                    Some(&i) if is_local => list[i] = endpoint,
                    Some(_) => {}
                }
            }
        }
    }
    // Kept for as long as the service is: no spare capacity.
    out.retain(|_, v| {
        v.shrink_to_fit();
        !v.is_empty()
    });
    out
}

/// Upstream `GetNodeHostIPs`: the first InternalIP (else ExternalIP), plus the first
/// address of the other family from the same ordered list.
fn node_host_ips(node: &Node) -> Vec<IpAddr> {
    let addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut all = Vec::new();
    for kind in ["InternalIP", "ExternalIP"] {
        for a in addresses.iter().filter(|a| a.type_ == kind) {
            if let Some(ip) = parse_ip_sloppy(&a.address) {
                all.push(ip);
            }
        }
    }
    let Some(first) = all.first().copied() else {
        return Vec::new();
    };
    let mut out = vec![first];
    if let Some(other) = all
        .iter()
        .find(|ip| IpFamily::of(ip) != IpFamily::of(&first))
    {
        out.push(*other);
    }
    out
}

pub(super) fn node_info(
    nodes: &[Node],
    opts: &BuildOptions,
    warnings: &mut Vec<Warning>,
) -> NodeInfo {
    let mut info = NodeInfo {
        name: opts.node_name.clone(),
        ..NodeInfo::default()
    };
    if let Some(node) = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(opts.node_name.as_str()))
    {
        let object = format!("Node {}", opts.node_name);
        info.zone = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_ZONE))
            .filter(|z| !z.is_empty())
            .cloned();
        info.ips = node_host_ips(node);
        if let Some(spec) = &node.spec {
            let (field, cidrs): (&str, Vec<&String>) = match &spec.pod_cidrs {
                Some(c) if !c.is_empty() => ("spec.podCIDRs", c.iter().collect()),
                _ => ("spec.podCIDR", spec.pod_cidr.iter().collect()),
            };
            for (i, c) in cidrs.into_iter().enumerate() {
                match parse_cidr_sloppy(c) {
                    Some(net) => info.pod_cidrs.push(net),
                    None => warn(
                        warnings,
                        &object,
                        format!("{field}[{i}]"),
                        format!("invalid CIDR {c:?}, ignored"),
                    ),
                }
            }
        }
    }
    if !opts.node_ips_override.is_empty() {
        info.ips = opts.node_ips_override.clone();
    } else if let Some(primary) = opts.primary_node_ip {
        info.ips.retain(|ip| ip.is_ipv4() != primary.is_ipv4());
        info.ips.insert(0, primary);
    }
    info
}

#[cfg(test)]
mod tests;
