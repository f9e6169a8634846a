use std::net::IpAddr;

use kube_nlproxy_netlink::ipset::IpsetMember;

use super::*;
use crate::model::{NodeInfo, TrafficDistribution, TrafficPolicy};
use crate::source::file::parse_manifests;

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(crate) fn name(n: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "ns".into(),
        name: n.into(),
        port_name: "p".into(),
        protocol,
    }
}

pub(crate) fn svc(n: &str, cip: &str) -> ServicePort {
    let cip = ip(cip);
    ServicePort {
        name: name(n, Protocol::Tcp),
        family: IpFamily::of(&cip),
        cluster_ip: Some(cip),
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

pub(crate) fn ep(addr: &str, local: bool) -> Endpoint {
    Endpoint {
        ip: ip(addr),
        port: 8080,
        ready: true,
        serving: true,
        terminating: false,
        is_local: local,
        zone: None,
        zone_hints: vec![],
        node_hints: vec![],
    }
}

pub(crate) fn opts() -> IpvsOptions {
    IpvsOptions {
        scheduler: "rr".into(),
        nodeport_ips: vec![ip("192.168.1.10"), ip("192.168.2.10"), ip("fd00::10")],
        masquerade_all: false,
        local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        masquerade_mark: 0x4000,
        exclude_cidrs: vec![],
    }
}

pub(crate) fn state(services: Vec<(ServicePort, Vec<Endpoint>)>) -> ClusterState {
    let mut s = ClusterState {
        node: NodeInfo {
            name: "node-a".into(),
            ips: vec![ip("192.168.1.10")],
            ..NodeInfo::default()
        },
        ..ClusterState::default()
    };
    for (svc, eps) in services {
        if !eps.is_empty() {
            s.endpoints
                .insert(svc.name.clone(), std::sync::Arc::new(eps));
        }
        s.services.insert((svc.name.clone(), svc.family), svc);
    }
    s
}

fn key(addr: &str, port: u16) -> VsKey {
    let addr = ip(addr);
    VsKey {
        family: IpFamily::of(&addr),
        protocol: Protocol::Tcp,
        addr,
        port,
    }
}

fn rs(d: &IpvsDesired, addr: &str, port: u16) -> Vec<String> {
    d.virtual_servers[&key(addr, port)]
        .real_servers
        .iter()
        .map(|r| format!("{}:{}", r.addr, r.port))
        .collect()
}

fn members(d: &IpvsDesired, set: &str) -> Vec<IpsetMember> {
    d.ipsets[set].members.iter().cloned().collect()
}

fn ipp(a: &str, port: u16) -> IpsetMember {
    IpsetMember::IpPort {
        ip: ip(a),
        proto: 6,
        port,
    }
}

#[test]
fn cluster_ip_service() {
    let d = desired_ipvs(
        &state(vec![(
            svc("web", "10.96.0.10"),
            vec![ep("10.244.1.5", false), ep("10.244.2.6", true)],
        )]),
        &opts(),
    );
    assert_eq!(d.virtual_servers.len(), 1);
    let vs = &d.virtual_servers[&key("10.96.0.10", 80)];
    assert_eq!(vs.scheduler, "rr");
    assert_eq!(vs.persistence_timeout, None);
    assert_eq!(vs.kind, VsKind::ClusterIp);
    assert_eq!(
        rs(&d, "10.96.0.10", 80),
        ["10.244.1.5:8080", "10.244.2.6:8080"]
    );
    assert_eq!(
        d.bound_addrs.iter().copied().collect::<Vec<_>>(),
        [ip("10.96.0.10")]
    );
    assert_eq!(members(&d, CLUSTER_IP), [ipp("10.96.0.10", 80)]);
    assert_eq!(members(&d, IPVS_IPS), [IpsetMember::Ip(ip("10.96.0.10"))]);
    // Hairpin only for the local endpoint.
    assert_eq!(
        members(&d, LOOP_BACK),
        [IpsetMember::IpPortIp {
            ip: ip("10.244.2.6"),
            proto: 6,
            port: 8080,
            ip2: ip("10.244.2.6")
        }]
    );
    // Every ipset of both families exists, v6 ones with upstream's KUBE-6- prefix.
    assert_eq!(d.ipsets.len(), 34);
    assert!(d.ipsets.contains_key("KUBE-6-CLUSTER-IP"));
    // 32 bytes with the v6 prefix: cut at 31 like upstream.
    assert!(d.ipsets.contains_key("KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"));
    assert!(d.ipsets.keys().all(|n| n.len() <= 31));
}

#[test]
fn nodeport_on_each_node_ip_of_the_family() {
    let mut s = svc("web", "10.96.0.10");
    s.node_port = Some(30080);
    let d = desired_ipvs(&state(vec![(s, vec![ep("10.244.1.5", false)])]), &opts());
    let keys: Vec<String> = d.virtual_servers.keys().map(|k| k.to_string()).collect();
    assert_eq!(
        keys,
        [
            "tcp:10.96.0.10:80",
            "tcp:192.168.1.10:30080",
            "tcp:192.168.2.10:30080"
        ]
    );
    assert_eq!(rs(&d, "192.168.2.10", 30080), ["10.244.1.5:8080"]);
    assert_eq!(members(&d, NODE_PORT_TCP), [IpsetMember::Port(30080)]);
    assert!(members(&d, NODE_PORT_LOCAL_TCP).is_empty());
    // NodePort addresses are not bound on kube-ipvs0.
    assert!(!d.bound_addrs.contains(&ip("192.168.1.10")));
}

#[test]
fn sctp_and_udp_nodeports_use_their_sets() {
    let mut u = svc("dns", "10.96.0.11");
    u.name.protocol = Protocol::Udp;
    u.node_port = Some(30053);
    let mut sc = svc("sig", "10.96.0.12");
    sc.name.protocol = Protocol::Sctp;
    sc.node_port = Some(30132);
    let d = desired_ipvs(&state(vec![(u, vec![]), (sc, vec![])]), &opts());
    assert_eq!(members(&d, NODE_PORT_UDP), [IpsetMember::Port(30053)]);
    assert_eq!(
        members(&d, NODE_PORT_SCTP),
        [
            IpsetMember::IpPort {
                ip: ip("192.168.1.10"),
                proto: 132,
                port: 30132
            },
            IpsetMember::IpPort {
                ip: ip("192.168.2.10"),
                proto: 132,
                port: 30132
            }
        ]
    );
}

#[test]
fn external_ip_and_etp_local() {
    let mut s = svc("web", "10.96.0.10");
    s.external_ips = vec![ip("203.0.113.7")];
    s.node_port = Some(30080);
    s.external_policy = TrafficPolicy::Local;
    let d = desired_ipvs(
        &state(vec![(
            s,
            vec![ep("10.244.1.5", false), ep("10.244.2.6", true)],
        )]),
        &opts(),
    );
    // ClusterIP uses the cluster set, external VSs only the local endpoint.
    assert_eq!(rs(&d, "10.96.0.10", 80).len(), 2);
    assert_eq!(rs(&d, "203.0.113.7", 80), ["10.244.2.6:8080"]);
    assert_eq!(rs(&d, "192.168.1.10", 30080), ["10.244.2.6:8080"]);
    assert!(d.bound_addrs.contains(&ip("203.0.113.7")));
    assert_eq!(members(&d, EXTERNAL_IP), [ipp("203.0.113.7", 80)]);
    assert_eq!(members(&d, EXTERNAL_IP_LOCAL), [ipp("203.0.113.7", 80)]);
    assert_eq!(members(&d, NODE_PORT_LOCAL_TCP), [IpsetMember::Port(30080)]);
}

#[test]
fn etp_local_without_local_endpoints_gives_empty_external_vs() {
    let mut s = svc("web", "10.96.0.10");
    s.load_balancer_ips = vec![ip("198.51.100.1")];
    s.node_port = Some(30080);
    s.external_policy = TrafficPolicy::Local;
    s.health_check_node_port = Some(32000);
    let d = desired_ipvs(&state(vec![(s, vec![ep("10.244.1.5", false)])]), &opts());
    assert_eq!(rs(&d, "10.96.0.10", 80), ["10.244.1.5:8080"]);
    assert!(rs(&d, "198.51.100.1", 80).is_empty());
    assert!(rs(&d, "192.168.1.10", 30080).is_empty());
    assert_eq!(members(&d, LOAD_BALANCER_LOCAL), [ipp("198.51.100.1", 80)]);
    assert_eq!(
        members(&d, HEALTH_CHECK_NODE_PORT),
        [IpsetMember::Port(32000)]
    );
}

#[test]
fn itp_local_cluster_ip_uses_local_endpoints() {
    let mut s = svc("web", "10.96.0.10");
    s.internal_policy = TrafficPolicy::Local;
    let d = desired_ipvs(
        &state(vec![(
            s,
            vec![ep("10.244.1.5", false), ep("10.244.2.6", true)],
        )]),
        &opts(),
    );
    assert_eq!(rs(&d, "10.96.0.10", 80), ["10.244.2.6:8080"]);
}

#[test]
fn load_balancer_with_source_ranges() {
    let mut s = svc("web", "10.96.0.10");
    s.load_balancer_ips = vec![ip("198.51.100.1")];
    s.load_balancer_source_ranges = vec![
        "203.0.113.0/24".parse().unwrap(),
        "192.168.1.0/24".parse().unwrap(),
    ];
    let d = desired_ipvs(&state(vec![(s, vec![ep("10.244.1.5", false)])]), &opts());
    assert_eq!(rs(&d, "198.51.100.1", 80), ["10.244.1.5:8080"]);
    assert!(d.bound_addrs.contains(&ip("198.51.100.1")));
    assert_eq!(members(&d, LOAD_BALANCER), [ipp("198.51.100.1", 80)]);
    assert_eq!(members(&d, LOAD_BALANCER_FW), [ipp("198.51.100.1", 80)]);
    assert_eq!(members(&d, LOAD_BALANCER_SOURCE_CIDR).len(), 2);
    // The node IP is inside a range: the LB IP itself is an allowed source.
    assert_eq!(
        members(&d, LOAD_BALANCER_SOURCE_IP),
        [IpsetMember::IpPortIp {
            ip: ip("198.51.100.1"),
            proto: 6,
            port: 80,
            ip2: ip("198.51.100.1")
        }]
    );
    // One CIDR rule for the prefix length in use (/24).
    let fw = &d.tables[0].chains[FIREWALL_CHECK];
    assert_eq!(fw.rules.len(), 4);
}

#[test]
fn zero_source_range_is_not_firewalled() {
    let mut s = svc("web", "10.96.0.10");
    s.load_balancer_ips = vec![ip("198.51.100.1")];
    s.load_balancer_source_ranges = vec!["0.0.0.0/0".parse().unwrap()];
    let d = desired_ipvs(&state(vec![(s, vec![])]), &opts());
    assert!(members(&d, LOAD_BALANCER_FW).is_empty());
}

#[test]
fn affinity_gives_persistence() {
    let mut s = svc("web", "10.96.0.10");
    s.affinity_timeout_seconds = Some(600);
    let d = desired_ipvs(&state(vec![(s, vec![])]), &opts());
    assert_eq!(
        d.virtual_servers[&key("10.96.0.10", 80)].persistence_timeout,
        Some(600)
    );
}

#[test]
fn scheduler_flag_and_annotation() {
    let mut o = opts();
    o.scheduler = "wlc".into();
    let mut a = svc("a", "10.96.0.10");
    a.ipvs_scheduler = Some("sh".into());
    let b = svc("b", "10.96.0.11");
    let d = desired_ipvs(&state(vec![(a, vec![]), (b, vec![])]), &o);
    assert_eq!(d.virtual_servers[&key("10.96.0.10", 80)].scheduler, "sh");
    assert_eq!(d.virtual_servers[&key("10.96.0.11", 80)].scheduler, "wlc");
}

#[test]
fn scheduler_annotation_is_validated_with_a_warning() {
    let yaml = r#"
apiVersion: v1
kind: Service
metadata:
  name: good
  namespace: ns
  annotations: {kube-nlproxy.io/ipvs-scheduler: mh}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata:
  name: bad
  namespace: ns
  annotations: {kube-nlproxy.io/ipvs-scheduler: fastest}
spec: {clusterIP: 10.96.0.11, ports: [{port: 80}]}
"#;
    let (objects, w) = parse_manifests(yaml, "test");
    assert!(w.is_empty());
    let (st, warnings) = crate::model::build(
        &objects,
        &crate::model::BuildOptions {
            node_name: "node-a".into(),
            node_ips_override: vec![],
            primary_node_ip: None,
            ignore_external_ips: false,
        },
    );
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].object, "Service ns/bad");
    assert_eq!(
        warnings[0].field,
        "metadata.annotations[kube-nlproxy.io/ipvs-scheduler]"
    );
    assert!(warnings[0].message.contains("fastest"));
    let d = desired_ipvs(&st, &opts());
    assert_eq!(d.virtual_servers[&key("10.96.0.10", 80)].scheduler, "mh");
    assert_eq!(d.virtual_servers[&key("10.96.0.11", 80)].scheduler, "rr");
}

#[test]
fn no_endpoints_gives_vs_without_real_servers() {
    let d = desired_ipvs(&state(vec![(svc("web", "10.96.0.10"), vec![])]), &opts());
    assert!(rs(&d, "10.96.0.10", 80).is_empty());
    assert!(d.bound_addrs.contains(&ip("10.96.0.10")));
}

#[test]
fn ipv6_service() {
    let mut s = svc("web6", "fd00:96::10");
    s.node_port = Some(30080);
    let d = desired_ipvs(&state(vec![(s, vec![ep("fd00:244::5", false)])]), &opts());
    assert_eq!(rs(&d, "fd00:96::10", 80), ["fd00:244::5:8080"]);
    assert_eq!(rs(&d, "fd00::10", 30080), ["fd00:244::5:8080"]);
    assert_eq!(members(&d, "KUBE-6-CLUSTER-IP"), [ipp("fd00:96::10", 80)]);
    assert_eq!(
        members(&d, "KUBE-6-NODE-PORT-TCP"),
        [IpsetMember::Port(30080)]
    );
    assert!(members(&d, CLUSTER_IP).is_empty());
}

#[test]
fn conflicting_virtual_servers_keep_the_first() {
    let mut a = svc("a", "10.96.0.10");
    a.external_ips = vec![ip("203.0.113.7")];
    let mut b = svc("b", "10.96.0.11");
    b.external_ips = vec![ip("203.0.113.7")];
    let d = desired_ipvs(&state(vec![(a, vec![]), (b, vec![])]), &opts());
    assert_eq!(d.conflicts.len(), 1);
    assert_eq!(
        d.virtual_servers[&key("203.0.113.7", 80)].service.name,
        "a".into()
    );
}

#[test]
fn nft_sets_mirror_the_ipsets() {
    let mut s = svc("web", "10.96.0.10");
    s.node_port = Some(30080);
    s.load_balancer_ips = vec![ip("198.51.100.1")];
    s.load_balancer_source_ranges = vec![
        "203.0.113.0/24".parse().unwrap(),
        "10.77.0.0/30".parse().unwrap(),
        "192.0.2.0/24".parse().unwrap(),
    ];
    let d = desired_ipvs(&state(vec![(s, vec![ep("10.244.1.5", true)])]), &opts());
    for t in &d.tables {
        let fam = match t.family {
            kube_nlproxy_netlink::nft::Family::Ipv4 => IpFamily::V4,
            kube_nlproxy_netlink::nft::Family::Ipv6 => IpFamily::V6,
        };
        for spec in d.ipsets.values().filter(|s| s.family == fam) {
            if spec.kind == IpsetType::HashIpPortNet {
                // Mirrored as one set per prefix length.
                continue;
            }
            let set = &t.sets[&spec.name];
            assert_eq!(set.elements.len(), spec.members.len(), "{}", spec.name);
        }
    }
    // A /30 entry must not sit in the /24 rule's set (it would admit the whole /24).
    let v4 = &d.tables[0];
    assert_eq!(
        v4.sets[&source_cidr_set(IpFamily::V4, 24)].elements.len(),
        2
    );
    assert_eq!(
        v4.sets[&source_cidr_set(IpFamily::V4, 30)].elements.len(),
        1
    );
    assert!(!v4.sets.contains_key(LOAD_BALANCER_SOURCE_CIDR));
}

fn many(n: usize) -> ClusterState {
    let mut services = Vec::new();
    for i in 0..n {
        let a = (i / 250) as u8;
        let b = (i % 250) as u8;
        let mut s = svc(&format!("s{i}"), &format!("10.96.{a}.{b}"));
        s.node_port = Some(30000 + i as u16);
        s.external_ips = vec![ip(&format!("203.0.{a}.{b}"))];
        s.load_balancer_ips = vec![ip(&format!("198.51.{a}.{b}"))];
        s.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
        if i % 2 == 0 {
            s.external_policy = TrafficPolicy::Local;
        }
        let mut v6 = svc(&format!("s{i}"), &format!("fd00:96::{i:x}"));
        v6.load_balancer_ips = vec![ip(&format!("fd00:198::{i:x}"))];
        v6.load_balancer_source_ranges = vec!["fd00:1::/64".parse().unwrap()];
        services.push((
            s,
            vec![
                ep(&format!("10.244.{a}.{b}"), true),
                ep(&format!("10.245.{a}.{b}"), false),
            ],
        ));
        services.push((v6, vec![ep(&format!("fd00:244::{i:x}"), true)]));
    }
    state(services)
}

#[test]
fn rule_count_does_not_depend_on_the_number_of_services() {
    let small = desired_ipvs(&many(10), &opts());
    let large = desired_ipvs(&many(10_000), &opts());
    assert_eq!(large.virtual_servers.len(), 10_000 * (3 + 2) + 10_000 * 2);
    let (a, b) = (small.rule_count(), large.rule_count());
    eprintln!("ipvs mode nft rules: 10 services -> {a}, 10000 services -> {b}");
    assert_eq!(a, b);
    let chains = |d: &IpvsDesired| d.tables.iter().map(|t| t.chains.len()).sum::<usize>();
    assert_eq!(chains(&small), chains(&large));
}

#[test]
fn masquerade_all_and_no_detector() {
    let mut o = opts();
    o.local_detector = LocalDetector::None;
    let none = desired_ipvs(&ClusterState::default(), &o);
    o.masquerade_all = true;
    let all = desired_ipvs(&ClusterState::default(), &o);
    // The ClusterIP masquerade rule exists only with a detector or masquerade-all.
    assert_eq!(all.rule_count(), none.rule_count() + 2);
}

fn short_circuit(d: &IpvsDesired, family: IpFamily) -> Vec<(Vec<KeyValue>, Vec<KeyValue>)> {
    d.nft_elements
        .get(&(family, SHORT_CIRCUIT.to_string()))
        .map(|m| {
            m.values()
                .map(|e| (e.key.clone(), e.data.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn no_local(d: &IpvsDesired, family: IpFamily) -> Vec<Vec<KeyValue>> {
    d.nft_elements
        .get(&(family, NO_LOCAL_ENDPOINTS.to_string()))
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn k3(addr: &str, port: u16) -> Vec<KeyValue> {
    vec![
        KeyValue::Addr(ip(addr)),
        KeyValue::Proto(6),
        KeyValue::Port(port),
    ]
}

#[test]
fn etp_local_short_circuits_every_external_entry_point_to_the_cluster_ip() {
    let mut s = svc("web", "10.96.0.10");
    s.external_ips = vec![ip("203.0.113.7")];
    s.load_balancer_ips = vec![ip("198.51.100.1")];
    s.node_port = Some(30080);
    s.external_policy = TrafficPolicy::Local;
    let with_local = state(vec![(
        s.clone(),
        vec![ep("10.244.1.5", false), ep("10.244.2.6", true)],
    )]);
    let d = desired_ipvs(&with_local, &opts());
    let to_cip = vec![KeyValue::Addr(ip("10.96.0.10")), KeyValue::Port(80)];
    let mut want: Vec<_> = [
        k3("203.0.113.7", 80),
        k3("198.51.100.1", 80),
        k3("192.168.1.10", 30080),
        k3("192.168.2.10", 30080),
    ]
    .into_iter()
    .map(|k| (k, to_cip.clone()))
    .collect();
    want.sort();
    assert_eq!(short_circuit(&d, IpFamily::V4), want);
    assert!(no_local(&d, IpFamily::V4).is_empty());
    let v4 = &d.tables[0];
    assert_eq!(v4.sets[SHORT_CIRCUIT].elements.len(), 4);
    assert_eq!(v4.sets[SHORT_CIRCUIT].set.data.len(), 2);

    // Without a local endpoint: outside traffic to the same entry points is dropped.
    let without = state(vec![(s.clone(), vec![ep("10.244.1.5", false)])]);
    let d = desired_ipvs(&without, &opts());
    assert_eq!(short_circuit(&d, IpFamily::V4).len(), 4);
    assert_eq!(no_local(&d, IpFamily::V4).len(), 4);
    // Without any endpoint the VSs refuse (as for eTP Cluster): no drop.
    let d = desired_ipvs(&state(vec![(s.clone(), vec![])]), &opts());
    assert!(no_local(&d, IpFamily::V4).is_empty());

    // eTP Cluster: nothing to short-circuit.
    s.external_policy = TrafficPolicy::Cluster;
    let d = desired_ipvs(&state(vec![(s, vec![ep("10.244.1.5", false)])]), &opts());
    assert!(short_circuit(&d, IpFamily::V4).is_empty());
    assert!(no_local(&d, IpFamily::V4).is_empty());
}

#[test]
fn etp_local_short_circuit_ipv6() {
    let mut s = svc("web", "fd00:96::10");
    s.load_balancer_ips = vec![ip("fd00:198::1")];
    s.node_port = Some(30080);
    s.external_policy = TrafficPolicy::Local;
    let d = desired_ipvs(&state(vec![(s, vec![ep("fd00:244::5", false)])]), &opts());
    assert_eq!(
        short_circuit(&d, IpFamily::V6),
        [
            (
                k3("fd00::10", 30080),
                vec![KeyValue::Addr(ip("fd00:96::10")), KeyValue::Port(80)]
            ),
            (
                k3("fd00:198::1", 80),
                vec![KeyValue::Addr(ip("fd00:96::10")), KeyValue::Port(80)]
            ),
        ]
    );
    assert_eq!(no_local(&d, IpFamily::V6).len(), 2);
    assert!(short_circuit(&d, IpFamily::V4).is_empty());
    assert_eq!(d.tables[1].sets[SHORT_CIRCUIT].elements.len(), 2);
}

/// The short-circuit is set lookups: the rule count stays the same from 1 000 to
/// 10 000 eTP Local services; only elements grow.
#[test]
fn short_circuit_rule_count_at_1k_and_10k_etp_local_services() {
    let all_local = |n: usize| {
        let mut s = many(n);
        for svc in s.services.values_mut() {
            svc.external_policy = TrafficPolicy::Local;
            svc.node_port = svc.node_port.or(Some(31000));
        }
        s
    };
    let (s1, s10) = (all_local(1_000), all_local(10_000));
    let (d1, d10) = (desired_ipvs(&s1, &opts()), desired_ipvs(&s10, &opts()));
    let elements = |d: &IpvsDesired| {
        d.tables
            .iter()
            .map(|t| t.sets[SHORT_CIRCUIT].elements.len())
            .sum::<usize>()
    };
    eprintln!(
        "ipvs mode, eTP Local: 1000 services -> {} nft rules, {} short-circuit elements; \
         10000 services -> {} nft rules, {} short-circuit elements",
        d1.rule_count(),
        elements(&d1),
        d10.rule_count(),
        elements(&d10)
    );
    assert_eq!(d1.rule_count(), d10.rule_count());
    assert!(elements(&d10) >= 10 * elements(&d1) - 10);
    assert!(elements(&d1) > 1_000);
}

#[test]
fn short_circuit_changes_are_element_deltas() {
    let mut s = svc("web", "10.96.0.10");
    s.load_balancer_ips = vec![ip("198.51.100.1")];
    s.external_policy = TrafficPolicy::Local;
    let mut state1 = many(1_000);
    state1
        .services
        .insert((s.name.clone(), IpFamily::V4), s.clone());
    state1
        .endpoints
        .insert(s.name.clone(), vec![ep("10.244.9.9", true)].into());
    let mut r = IpvsRenderer::default();
    r.update(&state1, &opts());
    // The local endpoint goes: one drop element added (and its hairpin member
    // gone), no rule, the short-circuit untouched.
    state1
        .endpoints
        .insert(s.name.clone(), vec![ep("10.244.9.9", false)].into());
    let u = r.update_changed(&state1, &opts(), &[s.name.clone()]);
    assert_eq!(u.rendered, 1);
    assert_eq!(u.nft.len(), 1);
    let delta = &u.nft[0];
    assert!(delta.chains.is_empty());
    assert_eq!(
        delta.delete_elements.keys().collect::<Vec<_>>(),
        [LOOP_BACK]
    );
    assert_eq!(
        delta.add_elements.keys().collect::<Vec<_>>(),
        [NO_LOCAL_ENDPOINTS]
    );
    assert_eq!(delta.add_elements[NO_LOCAL_ENDPOINTS].len(), 1);
    // The service goes to eTP Cluster: its short-circuit and drop elements go.
    state1
        .services
        .get_mut(&(s.name.clone(), IpFamily::V4))
        .unwrap()
        .external_policy = TrafficPolicy::Cluster;
    let u = r.update_changed(&state1, &opts(), &[s.name.clone()]);
    let delta = &u.nft[0];
    assert!(delta.chains.is_empty());
    assert_eq!(delta.delete_elements[SHORT_CIRCUIT].len(), 1);
    assert_eq!(delta.delete_elements[NO_LOCAL_ENDPOINTS].len(), 1);
    assert_eq!(
        r.desired().nft_elements,
        desired_ipvs(&state1, &opts()).nft_elements
    );
}

#[test]
fn itp_local_without_local_endpoint_is_dropped() {
    let mut s = svc("web", "10.96.0.10");
    s.internal_policy = TrafficPolicy::Local;
    let set = |d: &IpvsDesired| {
        d.nft_elements
            .get(&(IpFamily::V4, INTERNAL_NO_LOCAL_ENDPOINTS.to_string()))
            .map(|m| m.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let d = desired_ipvs(
        &state(vec![(s.clone(), vec![ep("10.244.1.5", false)])]),
        &opts(),
    );
    assert_eq!(set(&d), [k3("10.96.0.10", 80)]);
    assert_eq!(
        d.tables[0].sets[INTERNAL_NO_LOCAL_ENDPOINTS].elements.len(),
        1
    );
    let d = desired_ipvs(
        &state(vec![(s.clone(), vec![ep("10.244.1.5", true)])]),
        &opts(),
    );
    assert!(set(&d).is_empty());
    // No endpoint at all: refused by the empty VS, as for any service.
    let d = desired_ipvs(&state(vec![(s, vec![])]), &opts());
    assert!(set(&d).is_empty());
}
