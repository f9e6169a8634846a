use super::*;
use proptest::prelude::*;
use std::net::IpAddr;

fn ep(ip: &str) -> Endpoint {
    Endpoint {
        ip: ip.parse().unwrap(),
        port: 8080,
        ready: true,
        serving: true,
        terminating: false,
        is_local: false,
        zone: None,
        zone_hints: vec![],
        node_hints: vec![],
    }
}

fn terminating(mut e: Endpoint, serving: bool) -> Endpoint {
    e.ready = false;
    e.serving = serving;
    e.terminating = true;
    e
}

fn local(mut e: Endpoint) -> Endpoint {
    e.is_local = true;
    e
}

fn zone_hint(mut e: Endpoint, z: &str) -> Endpoint {
    e.zone_hints = vec![z.into()];
    e
}

fn node_hint(mut e: Endpoint, n: &str) -> Endpoint {
    e.node_hints = vec![n.into()];
    e
}

fn svc(family: IpFamily) -> ServicePort {
    ServicePort {
        name: ServicePortName {
            namespace: "ns".into(),
            name: "s".into(),
            port_name: "".into(),
            protocol: Protocol::Tcp,
        },
        family,
        cluster_ip: Some(match family {
            IpFamily::V4 => "10.0.0.1".parse().unwrap(),
            IpFamily::V6 => "fd00::1".parse().unwrap(),
        }),
        port: 80,
        node_port: None,
        external_ips: vec![],
        load_balancer_ips: vec![],
        load_balancer_source_ranges: vec![],
        external_policy: TrafficPolicy::Cluster,
        internal_policy: TrafficPolicy::Cluster,
        affinity_timeout_seconds: None,
        health_check_node_port: None,
        traffic_distribution: TrafficDistribution::Unset,
        ipvs_scheduler: None,
    }
}

fn node(zone: Option<&str>) -> NodeInfo {
    NodeInfo {
        name: "node-a".into(),
        zone: zone.map(Into::into),
        ips: vec![],
        pod_cidrs: vec![],
    }
}

fn ips(v: &[Endpoint]) -> Vec<String> {
    let mut v: Vec<_> = v.iter().map(|e| e.ip.to_string()).collect();
    v.sort();
    v
}

#[test]
fn empty() {
    let c = categorize_endpoints(&[], &svc(IpFamily::V4), &node(None));
    assert_eq!(c, Categorized::default());
}

#[test]
fn family_filter_and_ready() {
    let eps = [
        ep("10.1.0.1"),
        ep("fd00::5"),
        terminating(ep("10.1.0.2"), true),
    ];
    let c = categorize_endpoints(&eps, &svc(IpFamily::V4), &node(None));
    assert_eq!(ips(&c.cluster), ["10.1.0.1"]);
    assert!(c.reasons.is_empty(), "{:?}", c.reasons);
    assert!(c.local.is_empty());
    assert_eq!(c.all_reachable, c.cluster);
    assert!(c.has_any_endpoints);
    let c = categorize_endpoints(&eps, &svc(IpFamily::V6), &node(None));
    assert_eq!(ips(&c.cluster), ["fd00::5"]);
}

#[test]
fn fallback_to_serving_terminating() {
    let eps = [
        terminating(ep("10.1.0.1"), true),
        terminating(ep("10.1.0.2"), false),
        {
            let mut e = ep("10.1.0.3");
            e.ready = false;
            e
        },
    ];
    let c = categorize_endpoints(&eps, &svc(IpFamily::V4), &node(None));
    assert_eq!(ips(&c.cluster), ["10.1.0.1"]);
    assert!(c.has_any_endpoints);
    assert_eq!(
        c.reasons,
        [
            "no endpoint is ready: the 1 serving, terminating ones take new connections (terminating fallback)"
        ]
    );
    // Only non-ready, non-terminating endpoints: nothing usable anywhere.
    let c = categorize_endpoints(&eps[1..], &svc(IpFamily::V4), &node(None));
    assert!(c.cluster.is_empty() && c.all_reachable.is_empty());
    assert!(!c.has_any_endpoints);
}

#[test]
fn internal_local() {
    let mut s = svc(IpFamily::V4);
    s.internal_policy = TrafficPolicy::Local;
    let eps = [ep("10.1.0.1"), local(ep("10.1.0.2"))];
    let c = categorize_endpoints(&eps, &s, &node(None));
    assert!(c.cluster.is_empty());
    assert_eq!(ips(&c.local), ["10.1.0.2"]);
    assert_eq!(ips(&c.all_reachable), ["10.1.0.2"]);
    assert!(c.has_any_endpoints);
    // No local endpoint: nothing reachable, but endpoints exist elsewhere.
    let c = categorize_endpoints(&eps[..1], &s, &node(None));
    assert!(c.local.is_empty() && c.all_reachable.is_empty());
    assert!(c.has_any_endpoints);
    // Local fallback to serving-terminating.
    let eps = [ep("10.1.0.1"), local(terminating(ep("10.1.0.3"), true))];
    let c = categorize_endpoints(&eps, &s, &node(None));
    assert_eq!(ips(&c.local), ["10.1.0.3"]);
    assert!(
        c.reasons[0].contains("no endpoint on this node is ready"),
        "{:?}",
        c.reasons
    );
}

#[test]
fn external_local_uses_both() {
    let mut s = svc(IpFamily::V4);
    s.external_policy = TrafficPolicy::Local;
    s.node_port = Some(30000);
    assert!(s.uses_cluster_endpoints() && s.uses_local_endpoints());
    let eps = [ep("10.1.0.1"), local(ep("10.1.0.2"))];
    let c = categorize_endpoints(&eps, &s, &node(None));
    assert_eq!(ips(&c.cluster), ["10.1.0.1", "10.1.0.2"]);
    assert_eq!(ips(&c.local), ["10.1.0.2"]);
    assert_eq!(ips(&c.all_reachable), ["10.1.0.1", "10.1.0.2"]);
    // Local serving-terminating endpoint is reachable though not in cluster set.
    let eps = [ep("10.1.0.1"), local(terminating(ep("10.1.0.3"), true))];
    let c = categorize_endpoints(&eps, &s, &node(None));
    assert_eq!(ips(&c.cluster), ["10.1.0.1"]);
    assert_eq!(ips(&c.local), ["10.1.0.3"]);
    assert_eq!(ips(&c.all_reachable), ["10.1.0.1", "10.1.0.3"]);
    // Without external addresses eTP Local is meaningless.
    s.node_port = None;
    assert!(!s.uses_local_endpoints());
}

#[test]
fn zone_hints_all_or_nothing() {
    let s = svc(IpFamily::V4);
    let eps = [
        zone_hint(ep("10.1.0.1"), "z1"),
        zone_hint(ep("10.1.0.2"), "z2"),
    ];
    let c = categorize_endpoints(&eps, &s, &node(Some("z1")));
    assert_eq!(ips(&c.cluster), ["10.1.0.1"]);
    assert_eq!(
        c.reasons,
        ["topology: only the endpoints hinted for zone z1 (1 of 2 ready)"]
    );
    // Node without a zone: hints ignored.
    let c = categorize_endpoints(&eps, &s, &node(None));
    assert_eq!(c.cluster.len(), 2);
    assert!(c.reasons.is_empty(), "{:?}", c.reasons);
    // No endpoint hinted for our zone: hints ignored.
    let c = categorize_endpoints(&eps, &s, &node(Some("z3")));
    assert_eq!(c.cluster.len(), 2);
    // One ready endpoint without hints: hints ignored.
    let eps2 = [eps[0].clone(), eps[1].clone(), ep("10.1.0.3")];
    let c = categorize_endpoints(&eps2, &s, &node(Some("z1")));
    assert_eq!(c.cluster.len(), 3);
    // A non-ready endpoint without hints does not matter.
    let eps3 = [
        eps[0].clone(),
        eps[1].clone(),
        terminating(ep("10.1.0.4"), true),
    ];
    let c = categorize_endpoints(&eps3, &s, &node(Some("z1")));
    assert_eq!(ips(&c.cluster), ["10.1.0.1"]);
}

#[test]
fn topology_with_local_policy_merges() {
    let mut s = svc(IpFamily::V4);
    s.external_policy = TrafficPolicy::Local;
    s.external_ips = vec!["1.2.3.4".parse().unwrap()];
    let eps = [
        zone_hint(ep("10.1.0.1"), "z1"),
        local(zone_hint(ep("10.1.0.2"), "z2")),
    ];
    let c = categorize_endpoints(&eps, &s, &node(Some("z1")));
    assert_eq!(ips(&c.cluster), ["10.1.0.1"]);
    assert_eq!(ips(&c.local), ["10.1.0.2"]);
    assert_eq!(ips(&c.all_reachable), ["10.1.0.1", "10.1.0.2"]);
}

#[test]
fn prefer_same_node() {
    let s = svc(IpFamily::V4);
    let eps = [
        zone_hint(node_hint(ep("10.1.0.1"), "node-a"), "z1"),
        zone_hint(node_hint(ep("10.1.0.2"), "node-b"), "z1"),
        zone_hint(node_hint(ep("10.1.0.3"), "node-c"), "z2"),
    ];
    let c = categorize_endpoints(&eps, &s, &node(Some("z1")));
    assert_eq!(ips(&c.cluster), ["10.1.0.1"]);
    // No endpoint for our node: fall back to zone hints.
    let c = categorize_endpoints(&eps[1..], &s, &node(Some("z1")));
    assert_eq!(ips(&c.cluster), ["10.1.0.2"]);
    // One endpoint lacks node hints: zone hints.
    let mut eps2 = eps.to_vec();
    eps2[1].node_hints.clear();
    let c = categorize_endpoints(&eps2, &s, &node(Some("z1")));
    assert_eq!(ips(&c.cluster), ["10.1.0.1", "10.1.0.2"]);
}

fn arb_endpoint() -> impl Strategy<Value = Endpoint> {
    (
        any::<bool>(),
        0u8..4,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(0u8..3),
        prop::option::of(0u8..3),
    )
        .prop_map(|(v6, n, ready, serving, term, is_local, zh, nh)| {
            let ip: IpAddr = if v6 {
                format!("fd00::{}", n + 1).parse().unwrap()
            } else {
                format!("10.1.0.{}", n + 1).parse().unwrap()
            };
            Endpoint {
                ip,
                port: 8080,
                ready,
                serving,
                terminating: term,
                is_local,
                zone: None,
                zone_hints: zh.map(|z| vec![format!("z{z}")]).unwrap_or_default(),
                node_hints: nh
                    .map(|n| vec![format!("node-{}", (b'a' + n) as char)])
                    .unwrap_or_default(),
            }
        })
}

proptest! {
    #[test]
    fn categorize_invariants(
        eps in prop::collection::vec(arb_endpoint(), 0..10),
        v6 in any::<bool>(),
        itp_local in any::<bool>(),
        etp_local in any::<bool>(),
        node_port in any::<bool>(),
        zone in prop::option::of(0u8..3),
    ) {
        // build() never yields two endpoints with the same ip:port.
        let mut eps = eps;
        let mut seen = std::collections::HashSet::new();
        eps.retain(|e| seen.insert(e.ip));
        let mut s = svc(if v6 { IpFamily::V6 } else { IpFamily::V4 });
        if itp_local { s.internal_policy = TrafficPolicy::Local; }
        if etp_local { s.external_policy = TrafficPolicy::Local; }
        if node_port { s.node_port = Some(30000); }
        let n = node(zone.map(|z| format!("z{z}")).as_deref());
        let c = categorize_endpoints(&eps, &s, &n);
        for e in c.cluster.iter().chain(&c.local).chain(&c.all_reachable) {
            prop_assert_eq!(IpFamily::of(&e.ip), s.family);
            prop_assert!(eps.contains(e));
            prop_assert!(e.ready || (e.serving && e.terminating));
        }
        for e in &c.local {
            prop_assert!(e.is_local);
        }
        for e in c.cluster.iter().chain(&c.local) {
            prop_assert!(c.all_reachable.contains(e));
        }
        if !c.all_reachable.is_empty() || !c.cluster.is_empty() {
            prop_assert!(c.has_any_endpoints);
        }
        // A ready endpoint of the family exists and cluster policy in use => cluster non-empty.
        let any_ready = eps.iter().any(|e| e.ready && IpFamily::of(&e.ip) == s.family);
        if any_ready && s.uses_cluster_endpoints() {
            prop_assert!(!c.cluster.is_empty());
            prop_assert!(c.cluster.iter().all(|e| e.ready));
        }
    }
}
