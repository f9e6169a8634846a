use std::net::IpAddr;

use kube_nlproxy_netlink::nft::{Element, Expr, KeyValue};

use crate::mode::nftables::{
    LocalDetector, NftablesOptions, NftablesRenderer, NodePortAddresses, TableDelta, TableSpec,
    desired_table, desired_tables,
};
use crate::model::{
    ClusterState, Endpoint, IpFamily, NodeInfo, Protocol, ServicePort, ServicePortName,
    TrafficPolicy,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn name() -> ServicePortName {
    ServicePortName {
        namespace: "ns".into(),
        name: "web".into(),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
    }
}

fn svc() -> ServicePort {
    ServicePort {
        node_port: Some(30080),
        ..ServicePort::new(name(), IpFamily::V4, Some(ip("10.96.0.10")), 80)
    }
}

fn ep(addr: &str, local: bool) -> Endpoint {
    Endpoint::ready(ip(addr), 8080, local)
}

/// The desired v4 table of `svc` and its endpoints on node-a (10.77.0.1, pods
/// 10.244.0.0/16); also what `sync::explain`'s tests explain.
pub(crate) fn table(svc: ServicePort, endpoints: Vec<Endpoint>) -> TableSpec {
    let mut state = ClusterState {
        node: NodeInfo {
            name: "node-a".into(),
            ips: vec![ip("10.77.0.1")],
            ..Default::default()
        },
        ..Default::default()
    };
    state
        .endpoints
        .insert(svc.name.clone(), std::sync::Arc::new(endpoints));
    state.services.insert((svc.name.clone(), IpFamily::V4), svc);
    let opts = NftablesOptions {
        masquerade_all: false,
        local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        nodeport_addresses: NodePortAddresses::Ips(vec![ip("10.77.0.1")]),
        masquerade_mark: 0x4000,
    };
    desired_table(&state, &opts, IpFamily::V4)
}

fn cip_key() -> Vec<KeyValue> {
    vec![
        KeyValue::Addr(ip("10.96.0.10")),
        KeyValue::Proto(6),
        KeyValue::Port(80),
    ]
}

fn element(t: &TableSpec, set: &str, key: &[KeyValue]) -> Option<Element> {
    t.sets[set].elements.iter().find(|e| e.key == key).cloned()
}

/// `key . count . timeout` in a classes set.
fn class(key: &[KeyValue], count: u32, timeout: u32) -> Vec<KeyValue> {
    let mut k = key.to_vec();
    k.extend([KeyValue::Mark(count), KeyValue::Mark(timeout)]);
    k
}

fn np_key() -> Vec<KeyValue> {
    vec![KeyValue::Proto(6), KeyValue::Port(30080)]
}

#[test]
fn no_endpoints_rejects_at_every_entry_point() {
    let t = table(svc(), vec![]);
    assert!(element(&t, "no-endpoint-reject-ips", &cip_key()).is_some());
    assert!(element(&t, "no-endpoint-reject-nodeports", &np_key()).is_some());
    for set in [
        "classes-ips",
        "classes-nodeports",
        "endpoints-ips",
        "endpoints-nodeports",
    ] {
        assert!(t.sets[set].elements.is_empty(), "{set}");
    }
    // The ClusterIP is still known, so other ports on it are rejected too.
    assert!(element(&t, "cluster-ips", &[KeyValue::Addr(ip("10.96.0.10"))]).is_some());
}

#[test]
fn internal_local_without_local_endpoints_drops() {
    let mut s = svc();
    s.internal_policy = TrafficPolicy::Local;
    s.node_port = None;
    let t = table(s, vec![ep("10.244.2.2", false)]);
    assert!(element(&t, "no-endpoint-drop-ips", &cip_key()).is_some());
    assert!(t.sets["classes-ips"].elements.is_empty());
}

#[test]
fn endpoints_are_elements_picked_by_one_numgen_rule_per_class() {
    let eps = vec![
        ep("10.244.1.2", true),
        ep("10.244.1.3", true),
        ep("10.244.2.2", false),
    ];
    let t = table(svc(), eps);
    assert!(element(&t, "classes-ips", &class(&cip_key(), 3, 0)).is_some());
    let mut targets: Vec<(KeyValue, Vec<KeyValue>)> = t.sets["endpoints-ips"]
        .elements
        .iter()
        .map(|e| (e.key[3], e.data.clone()))
        .collect();
    targets.sort();
    assert_eq!(
        targets,
        vec![
            (
                KeyValue::Mark(0),
                vec![KeyValue::Addr(ip("10.244.1.2")), KeyValue::Port(8080)]
            ),
            (
                KeyValue::Mark(1),
                vec![KeyValue::Addr(ip("10.244.1.3")), KeyValue::Port(8080)]
            ),
            (
                KeyValue::Mark(2),
                vec![KeyValue::Addr(ip("10.244.2.2")), KeyValue::Port(8080)]
            ),
        ]
    );
    // Elements name the service port they serve.
    assert!(
        t.sets["endpoints-ips"]
            .elements
            .iter()
            .all(|e| e.comment.as_deref() == Some("ns/web:http"))
    );
    let moduli: Vec<u32> = t.chains["dispatch-ips"]
        .rules
        .iter()
        .flat_map(|r| &r.exprs)
        .filter_map(|e| match e {
            Expr::NumgenRandom { modulus, .. } => Some(*modulus),
            _ => None,
        })
        .collect();
    assert_eq!(moduli, vec![3]);
    // No anonymous sets: every lookup names a set of the table.
    for rule in t.chains.values().flat_map(|c| &c.rules) {
        for e in &rule.exprs {
            if let Expr::Lookup { set, .. } | Expr::Dynset { set, .. } = e {
                assert!(t.sets.contains_key(set), "{set}");
            }
        }
    }
}

#[test]
fn external_local_goes_to_local_endpoints_and_short_circuits_pods_and_node() {
    let mut s = svc();
    s.external_policy = TrafficPolicy::Local;
    let t = table(
        s.clone(),
        vec![ep("10.244.1.2", true), ep("10.244.2.2", false)],
    );
    // Pods and the node: every endpoint; outside traffic: the local one.
    assert!(element(&t, "classes-nodeports", &class(&np_key(), 2, 0)).is_some());
    assert!(element(&t, "classes-nodeports-local", &class(&np_key(), 1, 0)).is_some());
    assert!(element(&t, "external-local-nodeports", &np_key()).is_some());
    assert!(element(&t, "external-cluster-nodeports", &np_key()).is_none());
    let comments: Vec<String> = t.chains["services"]
        .rules
        .iter()
        .map(|r| r.comment.clone().unwrap_or_default())
        .collect();
    assert!(
        comments
            .iter()
            .any(|c| c.contains("the node's own NodePort traffic")),
        "{comments:?}"
    );
    // No local endpoint: external traffic is dropped, the ClusterIP still works.
    let t = table(s, vec![ep("10.244.2.2", false)]);
    assert!(element(&t, "no-local-endpoint-drop-nodeports", &np_key()).is_some());
    assert!(t.sets["classes-nodeports-local"].elements.is_empty());
    assert!(element(&t, "classes-ips", &class(&cip_key(), 1, 0)).is_some());
}

#[test]
fn source_ranges_are_elements_per_prefix_length_for_lb_ips_only() {
    let mut s = svc();
    s.load_balancer_ips = vec![ip("10.78.0.5")];
    s.external_ips = vec![ip("10.78.0.6")];
    s.load_balancer_source_ranges = vec!["10.77.0.0/24".parse().unwrap()];
    let t = table(s, vec![ep("10.244.1.2", true)]);
    let fw: Vec<_> = t.sets["firewall-ips"]
        .elements
        .iter()
        .map(|e| e.key[0])
        .collect();
    assert_eq!(fw, vec![KeyValue::Addr(ip("10.78.0.5"))]);
    let lb = [
        KeyValue::Addr(ip("10.78.0.5")),
        KeyValue::Proto(6),
        KeyValue::Port(80),
    ];
    let with = |a: &str| {
        let mut k = lb.to_vec();
        k.push(KeyValue::Addr(ip(a)));
        k
    };
    assert!(element(&t, "firewall-allow-24", &with("10.77.0.0")).is_some());
    // The node 10.77.0.1 is inside the range: the LB IP itself is allowed too.
    assert!(element(&t, "firewall-allow-32", &with("10.78.0.5")).is_some());
    // One rule per prefix length in use, plus the first and the last.
    assert_eq!(t.chains["firewall-check"].rules.len(), 4);
}

#[test]
fn two_services_on_one_address_keep_the_first_and_report_it() {
    let mut a = svc();
    a.external_ips = vec![ip("10.78.0.6")];
    let mut b = a.clone();
    b.name.name = "other".into();
    b.cluster_ip = Some(ip("10.96.0.11"));
    let mut state = ClusterState::default();
    for s in [a, b] {
        state
            .endpoints
            .insert(s.name.clone(), vec![ep("10.244.1.2", true)].into());
        state.services.insert((s.name.clone(), IpFamily::V4), s);
    }
    let opts = NftablesOptions {
        masquerade_all: true,
        local_detector: LocalDetector::None,
        nodeport_addresses: NodePortAddresses::All,
        masquerade_mark: 0x4000,
    };
    let mut renderer = NftablesRenderer::default();
    let (_, stats) = renderer.update(&state, &opts);
    // external IP and node port
    assert_eq!(stats.conflicts.len(), 2, "{:?}", stats.conflicts);
    let t = &renderer.tables()[0];
    let np: Vec<_> = t.sets["classes-nodeports"].elements.iter().collect();
    assert_eq!(np.len(), 1);
    assert_eq!(
        np[0].comment.as_deref(),
        Some("ns/other:http"),
        "first in name order"
    );
}

/// The name of service `i` of [`many`].
fn many_name(i: usize) -> ServicePortName {
    ServicePortName {
        namespace: "ns".into(),
        name: format!("svc-{i}").into(),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
    }
}

fn many(n: usize) -> ClusterState {
    let mut state = ClusterState {
        node: NodeInfo {
            name: "node-a".into(),
            ips: vec![ip("10.77.0.1")],
            ..Default::default()
        },
        ..Default::default()
    };
    for i in 0..n {
        let name = many_name(i);
        let cip = std::net::Ipv4Addr::new(10, 96, (i >> 8) as u8, i as u8);
        let s = ServicePort::new(name.clone(), IpFamily::V4, Some(IpAddr::V4(cip)), 80);
        let eps = (0..2)
            .map(|j| {
                let e = std::net::Ipv4Addr::new(10, 244, (i >> 7) as u8, ((i * 2 + j) & 255) as u8);
                Endpoint::ready(IpAddr::V4(e), 8080, j == 0)
            })
            .collect();
        state
            .endpoints
            .insert(name.clone(), std::sync::Arc::new(eps));
        state.services.insert((name, IpFamily::V4), s);
    }
    state
}

fn opts() -> NftablesOptions {
    NftablesOptions {
        masquerade_all: false,
        local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        nodeport_addresses: NodePortAddresses::Ips(vec![ip("10.77.0.1")]),
        masquerade_mark: 0x4000,
    }
}

#[test]
fn chains_and_rules_do_not_grow_with_services() {
    let small = desired_table(&many(10), &opts(), IpFamily::V4);
    let big = desired_table(&many(5000), &opts(), IpFamily::V4);
    assert_eq!(small.chains.len(), big.chains.len());
    assert_eq!(small.rule_count(), big.rule_count());
    assert_eq!(
        small.chains.keys().collect::<Vec<_>>(),
        big.chains.keys().collect::<Vec<_>>()
    );
}

#[test]
fn one_endpoint_change_among_10k_renders_one_port_and_changes_only_elements() {
    let mut state = many(10_000);
    let mut renderer = NftablesRenderer::default();
    renderer.update(&state, &opts());
    let name = many_name(4242);
    std::sync::Arc::make_mut(state.endpoints.get_mut(&name).unwrap())[1].ip = ip("10.250.0.1");
    for (deltas, stats) in [
        renderer.update_changed(&state, &opts(), std::slice::from_ref(&name)),
        {
            std::sync::Arc::make_mut(state.endpoints.get_mut(&name).unwrap())[1].ip =
                ip("10.250.0.2");
            renderer.update(&state, &opts())
        },
    ] {
        assert_eq!(stats.rendered, 1);
        assert!(!stats.node_changed);
        let v4 = &deltas[0];
        assert!(v4.chains.is_empty() && v4.add_sets.is_empty() && v4.delete_sets.is_empty());
        let deleted: usize = v4.delete_elements.values().map(Vec::len).sum();
        let added: usize = v4.add_elements.values().map(Vec::len).sum();
        // The endpoint element changes, and so does the hairpin element of the
        // endpoint address.
        assert_eq!((deleted, added), (2, 2), "{v4:?}");
        assert!(deltas[1].is_empty());
    }
    // Nothing changed: nothing rendered, nothing to send.
    let (deltas, stats) = renderer.update(&state, &opts());
    assert_eq!(stats.rendered, 0);
    assert!(deltas.iter().all(TableDelta::is_empty));
    let (deltas, stats) = renderer.update_changed(&state, &opts(), &[]);
    assert_eq!(stats.rendered, 0);
    assert!(deltas.iter().all(TableDelta::is_empty));
}

#[test]
fn a_new_endpoint_count_adds_one_rule_per_dispatch_chain() {
    let mut state = many(100);
    let mut renderer = NftablesRenderer::default();
    renderer.update(&state, &opts());
    let name = many_name(7);
    std::sync::Arc::make_mut(state.endpoints.get_mut(&name).unwrap()).push(ep("10.250.0.3", false));
    let (deltas, stats) = renderer.update_changed(&state, &opts(), &[name]);
    assert_eq!(stats.rendered, 1);
    let rewritten: Vec<&str> = deltas[0]
        .chains
        .iter()
        .map(|c| c.chain.name.as_str())
        .collect();
    assert_eq!(
        rewritten,
        vec![
            "dispatch-ips",
            "dispatch-ips-local",
            "dispatch-nodeports",
            "dispatch-nodeports-local"
        ]
    );
}

#[test]
fn incremental_updates_equal_a_fresh_build() {
    let mut renderer = NftablesRenderer::default();
    let mut state = many(50);
    renderer.update(&state, &opts());
    // Remove one, change one's policy and affinity, add one with an external IP.
    let names: Vec<ServicePortName> = state.services.keys().map(|(n, _)| n.clone()).collect();
    state.services.remove(&(names[3].clone(), IpFamily::V4));
    state.endpoints.remove(&names[3]);
    let s = state
        .services
        .get_mut(&(names[4].clone(), IpFamily::V4))
        .unwrap();
    s.internal_policy = TrafficPolicy::Local;
    s.affinity_timeout_seconds = Some(30);
    let mut added = svc();
    added.external_ips = vec![ip("10.78.0.9")];
    added.external_policy = TrafficPolicy::Local;
    state
        .endpoints
        .insert(added.name.clone(), vec![ep("10.244.9.9", true)].into());
    state
        .services
        .insert((added.name.clone(), IpFamily::V4), added.clone());
    renderer.update_changed(
        &state,
        &opts(),
        &[names[3].clone(), names[4].clone(), added.name.clone()],
    );
    assert_eq!(renderer.tables(), desired_tables(&state, &opts()));
}
