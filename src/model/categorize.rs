//! Upstream kube-proxy's `CategorizeEndpoints` (pkg/proxy/topology.go): which
//! endpoints a service port uses for Cluster and Local traffic policy on this node.

use super::types::*;

/// The endpoints of one service port, as the dataplane uses them on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Categorized {
    /// Usable endpoints for Cluster traffic policy: ready endpoints after topology
    /// (hint) filtering, else serving+terminating ones. Empty when the service port
    /// never uses Cluster policy (internal Local and not externally accessible).
    pub cluster: Vec<Endpoint>,
    /// Usable endpoints for Local traffic policy: local ready endpoints, else local
    /// serving+terminating ones. Empty when the service port never uses Local policy.
    pub local: Vec<Endpoint>,
    /// Union of `cluster` and `local`: every endpoint this node may send traffic to
    /// (each needs its DNAT rule / real server).
    pub all_reachable: Vec<Endpoint>,
    /// Whether the service port has usable (ready, or serving+terminating)
    /// endpoints anywhere in the cluster, even if none is reachable from here.
    /// When false the service "has no endpoints" (reject).
    pub has_any_endpoints: bool,
    /// Why the endpoints are not simply the ready ones, for a person
    /// (`explain`): topology hints that narrowed them, a terminating fallback.
    /// Empty in the common case.
    pub reasons: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Topology {
    None,
    SameZone,
    SameNode,
}

fn topology_mode(endpoints: &[&Endpoint], node: &NodeInfo) -> Topology {
    let zone = node.zone.as_deref();
    let mut has_ready = false;
    let mut all_node_hints = true;
    let mut for_node = false;
    let mut all_zone_hints = true;
    let mut for_zone = false;
    for ep in endpoints.iter().filter(|e| e.ready) {
        has_ready = true;
        if ep.node_hints.is_empty() {
            all_node_hints = false;
        } else if ep.node_hints.contains(&node.name) {
            for_node = true;
        }
        if ep.zone_hints.is_empty() {
            all_zone_hints = false;
        } else if zone.is_some_and(|z| ep.zone_hints.iter().any(|h| h == z)) {
            for_zone = true;
        }
    }
    if !has_ready {
        Topology::None
    } else if all_node_hints && for_node {
        Topology::SameNode
    } else if all_zone_hints && for_zone {
        Topology::SameZone
    } else {
        Topology::None
    }
}

fn available_for_topology(ep: &Endpoint, mode: Topology, node: &NodeInfo) -> bool {
    match mode {
        Topology::None => true,
        Topology::SameNode => ep.node_hints.contains(&node.name),
        Topology::SameZone => node
            .zone
            .as_deref()
            .is_some_and(|z| ep.zone_hints.iter().any(|h| h == z)),
    }
}

/// Categorize the endpoints of `svc` (only those of `svc.family` are considered),
/// exactly like upstream's `CategorizeEndpoints`.
pub fn categorize_endpoints(
    endpoints: &[Endpoint],
    svc: &ServicePort,
    node: &NodeInfo,
) -> Categorized {
    let eps: Vec<&Endpoint> = endpoints
        .iter()
        .filter(|e| IpFamily::of(&e.ip) == svc.family)
        .collect();
    let mut out = Categorized::default();
    if eps.is_empty() {
        return out;
    }
    let collect = |pred: &dyn Fn(&Endpoint) -> bool| -> Vec<Endpoint> {
        eps.iter()
            .filter(|e| pred(e))
            .map(|e| (*e).clone())
            .collect()
    };

    let uses_cluster = svc.uses_cluster_endpoints();
    let mut mode = Topology::None;
    if uses_cluster {
        mode = topology_mode(&eps, node);
        out.cluster = collect(&|e| e.ready && available_for_topology(e, mode, node));
        if mode != Topology::None {
            let ready = eps.iter().filter(|e| e.ready).count();
            let hinted_for = match mode {
                Topology::SameNode => format!("node {}", node.name),
                _ => format!("zone {}", node.zone.as_deref().unwrap_or_default()),
            };
            out.reasons.push(format!(
                "topology: only the endpoints hinted for {hinted_for} ({} of {ready} ready)",
                out.cluster.len()
            ));
        }
        if out.cluster.is_empty() {
            out.cluster = collect(&|e| e.serving && e.terminating);
            if !out.cluster.is_empty() {
                out.reasons.push(format!(
                    "no endpoint is ready: the {} serving, terminating ones take new connections (terminating fallback)",
                    out.cluster.len()
                ));
            }
        }
        out.has_any_endpoints = !out.cluster.is_empty();
    }

    if !svc.uses_local_endpoints() {
        out.all_reachable = out.cluster.clone();
        return out;
    }

    let mut local_ready = false;
    let mut local_serving_terminating = false;
    for e in &eps {
        if e.ready {
            out.has_any_endpoints = true;
            local_ready |= e.is_local;
        } else if e.serving && e.terminating {
            out.has_any_endpoints = true;
            local_serving_terminating |= e.is_local;
        }
    }
    let mut use_serving_terminating = false;
    if local_ready {
        out.local = collect(&|e| e.is_local && e.ready);
    } else if local_serving_terminating {
        use_serving_terminating = true;
        out.local = collect(&|e| e.is_local && e.serving && e.terminating);
        out.reasons.push(format!(
            "no endpoint on this node is ready: its {} serving, terminating ones take new connections (terminating fallback)",
            out.local.len()
        ));
    }

    if !uses_cluster {
        out.all_reachable = out.local.clone();
        return out;
    }
    if mode == Topology::None && !use_serving_terminating {
        out.all_reachable = out.cluster.clone();
        return out;
    }
    let mut all = out.cluster.clone();
    let mut seen: std::collections::HashSet<(std::net::IpAddr, u16)> =
        all.iter().map(|a| (a.ip, a.port)).collect();
    for e in &out.local {
        if seen.insert((e.ip, e.port)) {
            all.push(e.clone());
        }
    }
    out.all_reachable = all;
    out
}

#[cfg(test)]
mod tests;
