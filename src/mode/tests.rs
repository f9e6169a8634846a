use std::net::IpAddr;

use kube_nlproxy_netlink::nft::{Element, Expr, KeyValue, Verdict};

use crate::mode::nftables::{
    LocalDetector, NftablesOptions, NodePortAddresses, TableSpec, desired_table,
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

fn table(svc: ServicePort, endpoints: Vec<Endpoint>) -> TableSpec {
    let mut state = ClusterState {
        node: NodeInfo {
            name: "node-a".into(),
            ips: vec![ip("10.77.0.1")],
            ..Default::default()
        },
        ..Default::default()
    };
    state.endpoints.insert(svc.name.clone(), endpoints);
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

fn chain_starting(t: &TableSpec, prefix: &str) -> Vec<String> {
    t.chains
        .keys()
        .filter(|n| n.starts_with(prefix) && n.contains("/web/"))
        .cloned()
        .collect()
}

#[test]
fn no_endpoints_rejects_at_every_entry_point() {
    let t = table(svc(), vec![]);
    let reject = Some(Verdict::Goto("reject-chain".into()));
    assert_eq!(
        element(&t, "no-endpoint-services", &cip_key())
            .unwrap()
            .verdict,
        reject
    );
    let np = [KeyValue::Proto(6), KeyValue::Port(30080)];
    assert_eq!(
        element(&t, "no-endpoint-nodeports", &np).unwrap().verdict,
        reject
    );
    assert!(t.sets["service-ips"].elements.is_empty());
    assert!(chain_starting(&t, "service-").is_empty());
    // The ClusterIP is still known, so other ports on it are rejected too.
    assert!(element(&t, "cluster-ips", &[KeyValue::Addr(ip("10.96.0.10"))]).is_some());
}

#[test]
fn internal_local_without_local_endpoints_drops() {
    let mut s = svc();
    s.internal_policy = TrafficPolicy::Local;
    s.node_port = None;
    let t = table(s, vec![ep("10.244.2.2", false)]);
    assert_eq!(
        element(&t, "no-endpoint-services", &cip_key())
            .unwrap()
            .verdict,
        Some(Verdict::Drop)
    );
}

#[test]
fn endpoints_are_chosen_by_a_chain_of_plain_numgen_rules() {
    let t = table(
        svc(),
        vec![
            ep("10.244.1.2", true),
            ep("10.244.1.3", true),
            ep("10.244.2.2", false),
        ],
    );
    let chain = &chain_starting(&t, "service-")[0];
    let moduli: Vec<Option<u32>> = t.chains[chain]
        .rules
        .iter()
        .filter(|r| r.comment.is_none())
        .map(|r| {
            r.exprs.iter().find_map(|e| match e {
                Expr::NumgenRandom { modulus, .. } => Some(*modulus),
                _ => None,
            })
        })
        .collect();
    assert_eq!(moduli, vec![Some(3), Some(2), None]);
    assert_eq!(chain_starting(&t, "endpoint-").len(), 3);
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
    let ext = &chain_starting(&t, "external-")[0];
    let comments: Vec<_> = t.chains[ext]
        .rules
        .iter()
        .map(|r| r.comment.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        comments,
        vec![
            "short-circuit pod traffic",
            "masquerade local traffic",
            "short-circuit local traffic",
            ""
        ]
    );
    let local = &chain_starting(&t, "local-")[0];
    assert_eq!(
        t.chains[local].rules.len(),
        1,
        "one local endpoint: one goto"
    );
    // No local endpoint: external traffic is dropped, the ClusterIP still works.
    let t = table(s, vec![ep("10.244.2.2", false)]);
    let np = [KeyValue::Proto(6), KeyValue::Port(30080)];
    assert_eq!(
        element(&t, "no-endpoint-nodeports", &np).unwrap().verdict,
        Some(Verdict::Drop)
    );
    assert!(element(&t, "service-ips", &cip_key()).is_some());
}

#[test]
fn source_ranges_make_a_firewall_chain_for_lb_ips_only() {
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
    let chain = &chain_starting(&t, "firewall-")[0];
    let rules = &t.chains[chain].rules;
    // allowed range, the LB IP itself (the node 10.77.0.1 is inside the range), drop
    assert_eq!(rules.len(), 3);
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
            .insert(s.name.clone(), vec![ep("10.244.1.2", true)]);
        state.services.insert((s.name.clone(), IpFamily::V4), s);
    }
    let opts = NftablesOptions {
        masquerade_all: true,
        local_detector: LocalDetector::None,
        nodeport_addresses: NodePortAddresses::All,
        masquerade_mark: 0x4000,
    };
    let t = desired_table(&state, &opts, IpFamily::V4);
    assert_eq!(t.conflicts.len(), 2, "{:?}", t.conflicts); // external IP and node port
}
