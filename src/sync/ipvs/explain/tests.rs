use kube_nlproxy_netlink::ipvs::{IpvsDestination, IpvsProtocol};

use super::*;
use crate::mode::ipvs::tests::{ep, ip, opts, state, svc};
use crate::mode::ipvs::{IpvsDesired, desired_ipvs};
use crate::model::{ServicePort, TrafficPolicy};
use crate::sync::explain::render_text;
use crate::sync::ipvs::{FakeIpvs, IpvsDataplane, IpvsOp, IpvsSyncer};

fn desired(services: Vec<(ServicePort, Vec<crate::model::Endpoint>)>) -> IpvsDesired {
    desired_ipvs(&state(services), &opts())
}

/// The cluster of these tests: `web` (ClusterIP 10.96.0.10:80, NodePort
/// 30080, two endpoints), `empty` (no endpoint), `local` (eTP Local, NodePort
/// 30090, only a remote endpoint), `sticky` (ClientIP affinity).
fn cluster() -> IpvsDesired {
    let mut web = svc("web", "10.96.0.10");
    web.node_port = Some(30080);
    let empty = svc("empty", "10.96.0.11");
    let mut local = svc("local", "10.96.0.12");
    local.node_port = Some(30090);
    local.external_policy = TrafficPolicy::Local;
    let mut sticky = svc("sticky", "10.96.0.13");
    sticky.affinity_timeout_seconds = Some(10800);
    desired(vec![
        (web, vec![ep("10.244.1.5", true), ep("10.244.2.5", false)]),
        (empty, vec![]),
        (local, vec![ep("10.244.2.6", false)]),
        (sticky, vec![ep("10.244.1.7", true)]),
    ])
}

/// The kernel after a sync of `d` (IPVS through `FakeIpvs`, the table as
/// rendered).
fn kernel(d: &IpvsDesired) -> (FakeIpvs, IpvsView) {
    let mut s = IpvsSyncer::new(FakeIpvs::default());
    s.sync(d).unwrap();
    let f = s.dataplane().clone();
    let v = view_of(&f, d);
    (f, v)
}

fn view_of(f: &FakeIpvs, d: &IpvsDesired) -> IpvsView {
    let mut v = IpvsView::from_kernel(&f.state, None);
    v.table = Some(TableView::from_spec(&d.tables[0]));
    v
}

fn query(target: &str, from: Option<&str>) -> Query {
    let (daddr, proto, dport) = crate::proxier::parse_target(target).unwrap();
    Query {
        daddr,
        proto,
        dport,
        saddr: from.map(ip),
        local_addresses: vec![ip("192.168.1.10"), ip("127.0.0.1")],
        nodeport_all: false,
        local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        masquerade_all: false,
    }
}

fn endpoints(ex: &Explanation) -> Vec<(String, Option<u32>)> {
    ex.candidates
        .iter()
        .map(|c| (c.endpoint.clone(), c.weight))
        .collect()
}

#[test]
fn cluster_ip_from_a_pod_is_served_without_masquerade() {
    let (_, v) = kernel(&cluster());
    let ex = explain_ipvs(&v, &query("10.96.0.10:80/tcp", Some("10.244.1.9")));
    assert_eq!(ex.outcome, Outcome::Served, "{ex:#?}");
    assert_eq!(ex.matched_by.as_deref(), Some("ClusterIP"));
    assert_eq!(
        ex.service.as_deref(),
        Some("IPVS virtual server tcp:10.96.0.10:80"),
        "the kernel has no names"
    );
    assert_eq!(
        endpoints(&ex),
        vec![
            ("10.244.1.5:8080".to_string(), Some(1)),
            ("10.244.2.5:8080".to_string(), Some(1))
        ]
    );
    assert_eq!(ex.masquerade, Some(false));
    assert!(ex.problems.is_empty(), "{:?}", ex.problems);
    // From outside the cluster: masqueraded.
    let ex = explain_ipvs(&v, &query("10.96.0.10:80", Some("192.168.9.9")));
    assert_eq!(ex.masquerade, Some(true), "{ex:#?}");
    // Without --from it depends.
    let ex = explain_ipvs(&v, &query("10.96.0.10:80", None));
    assert_eq!(ex.masquerade, None);
    assert!(render_text(&query("10.96.0.10:80", None), &ex, None).contains("(weight 1)"));
}

#[test]
fn names_come_from_the_desired_state() {
    let d = cluster();
    let (_, mut v) = kernel(&d);
    v.names = IpvsView::names_of(&d);
    let ex = explain_ipvs(&v, &query("10.96.0.10:80/tcp", Some("10.244.1.9")));
    assert_eq!(ex.service.as_deref(), Some("ns/web:p"));
}

#[test]
fn node_port_from_outside_is_masqueraded() {
    let (_, v) = kernel(&cluster());
    let ex = explain_ipvs(&v, &query("192.168.1.10:30080/tcp", Some("192.168.9.9")));
    assert_eq!(ex.outcome, Outcome::Served, "{ex:#?}");
    assert_eq!(ex.matched_by.as_deref(), Some("NodePort"));
    assert_eq!(ex.candidates.len(), 2);
    assert_eq!(ex.masquerade, Some(true));
}

#[test]
fn no_endpoints_is_rejected_by_the_virtual_server() {
    let (_, v) = kernel(&cluster());
    let q = query("10.96.0.11:80/tcp", Some("10.244.1.9"));
    let ex = explain_ipvs(&v, &q);
    assert_eq!(ex.outcome, Outcome::Rejected, "{ex:#?}");
    assert_eq!(ex.outcome.exit_code(), 3);
    assert!(
        ex.decided_by
            .as_deref()
            .unwrap()
            .contains("tcp:10.96.0.11:80"),
        "{ex:#?}"
    );
    assert!(render_text(&q, &ex, None).contains("REJECTED"));
}

#[test]
fn unknown_port_of_a_service_ip_is_rejected() {
    let (_, v) = kernel(&cluster());
    let ex = explain_ipvs(&v, &query("10.96.0.10:81/tcp", Some("10.244.1.9")));
    assert_eq!(ex.outcome, Outcome::Rejected, "{ex:#?}");
    assert!(
        ex.decided_by
            .as_deref()
            .unwrap()
            .contains("service-ports-check")
    );
}

#[test]
fn etp_local_without_local_endpoint_is_dropped_from_outside_only() {
    let (_, v) = kernel(&cluster());
    let ex = explain_ipvs(&v, &query("192.168.1.10:30090/tcp", Some("192.168.9.9")));
    assert_eq!(ex.outcome, Outcome::Dropped, "{ex:#?}");
    assert_eq!(ex.outcome.exit_code(), 4);
    assert_eq!(
        ex.decided_by.as_deref(),
        Some("@external-local-no-endpoints 192.168.1.10 . tcp . 30090")
    );
    // The node itself: short-circuited to the ClusterIP's virtual server.
    let ex = explain_ipvs(&v, &query("192.168.1.10:30090/tcp", Some("192.168.1.10")));
    assert_eq!(ex.outcome, Outcome::Served, "{ex:#?}");
    assert_eq!(ex.matched_by.as_deref(), Some("ClusterIP"));
    assert_eq!(ex.masquerade, Some(true));
    assert_eq!(endpoints(&ex), vec![("10.244.2.6:8080".into(), Some(1))]);
}

#[test]
fn not_a_service() {
    let (_, v) = kernel(&cluster());
    let ex = explain_ipvs(&v, &query("10.1.2.3:80/tcp", Some("10.244.1.9")));
    assert_eq!(ex.outcome, Outcome::NotAService, "{ex:#?}");
    assert_eq!(ex.outcome.exit_code(), 5);
    let ex = explain_ipvs(&v, &query("10.96.0.10:80/udp", Some("10.244.1.9")));
    assert_eq!(
        ex.outcome,
        Outcome::Rejected,
        "a service IP, no UDP port: {ex:#?}"
    );
}

#[test]
fn affinity_shows_the_clients_persistence_template() {
    let (_, mut v) = kernel(&cluster());
    let q = query("10.96.0.13:80/tcp", Some("10.244.1.9"));
    // Templates not read: the persistence alone.
    let ex = explain_ipvs(&v, &q);
    assert_eq!(ex.outcome, Outcome::Served, "{ex:#?}");
    let a = ex.affinity.unwrap();
    assert!(a.contains("persistence 10800s"), "{a}");
    assert!(a.contains("not read"), "{a}");
    // Read, none for this client yet.
    v.templates = Some(Vec::new());
    let a = explain_ipvs(&v, &q).affinity.unwrap();
    assert!(a.contains("no template for 10.244.1.9 yet"), "{a}");
    // Its template (another client's and another service's do not count).
    let template = |client: &str, vaddr: &str, dest: &str| PersistenceTemplate {
        proto: 6,
        client: ip(client),
        vaddr: ip(vaddr),
        vport: 80,
        dest: ip(dest),
        dport: 8080,
        expires: 100,
    };
    v.templates = Some(vec![
        template("10.244.1.8", "10.96.0.13", "10.244.9.9"),
        template("10.244.1.9", "10.96.0.10", "10.244.9.9"),
        template("10.244.1.9", "10.96.0.13", "10.244.1.7"),
    ]);
    let ex = explain_ipvs(&v, &q);
    assert_eq!(
        ex.affinity.as_deref(),
        Some("10.244.1.9 -> 10.244.1.7:8080 (IPVS persistence template, 100s left)")
    );
    assert!(!ex.steps.iter().any(|s| s.contains("draining")), "{ex:#?}");
    // A template to a real server that is gone: IPVS still follows it.
    v.templates = Some(vec![template("10.244.1.9", "10.96.0.13", "10.244.9.9")]);
    let ex = explain_ipvs(&v, &q);
    assert!(
        ex.steps.iter().any(|s| s.contains("draining or gone")),
        "{ex:#?}"
    );
}

#[test]
fn draining_real_server_is_shown_and_agrees_with_the_desired_state() {
    let d = cluster();
    let (mut s, _) = kernel(&d);
    let svc = IpvsService::new(IpvsProtocol::Tcp, ip("10.96.0.10"), 80);
    let drained = IpvsDestination::new(ip("10.244.2.5"), 8080).weight(0);
    s.apply(&IpvsOp::UpdateDest(svc, drained)).unwrap();
    let v = view_of(&s, &d);
    let q = query("10.96.0.10:80/tcp", Some("10.244.1.9"));
    let ex = explain_ipvs(&v, &q);
    assert_eq!(ex.outcome, Outcome::Served);
    assert!(endpoints(&ex).contains(&("10.244.2.5:8080".into(), Some(0))));
    assert!(render_text(&q, &ex, None).contains("weight 0: draining"));
    // The endpoint is gone from the desired state; the kernel drains it.
    let mut gone = d.clone();
    for vs in gone.virtual_servers.values_mut() {
        vs.real_servers.retain(|r| r.addr != ip("10.244.2.5"));
    }
    let mut want = IpvsView::from_desired(&gone, &gone.tables, IpFamily::V4);
    want.names.clear();
    let desired = explain_ipvs(&want, &q);
    assert_eq!(disagreements_ipvs(&ex, &desired), Vec::<String>::new());
}

#[test]
fn a_real_server_deleted_behind_our_back_is_a_disagreement() {
    let d = cluster();
    let (mut s, _) = kernel(&d);
    let svc = IpvsService::new(IpvsProtocol::Tcp, ip("10.96.0.10"), 80);
    s.apply(&IpvsOp::DelDest(
        svc,
        IpvsDestination::new(ip("10.244.2.5"), 8080),
    ))
    .unwrap();
    let mut v = view_of(&s, &d);
    v.names = IpvsView::names_of(&d);
    let q = query("10.96.0.10:80/tcp", Some("10.244.1.9"));
    let kernel = explain_ipvs(&v, &q);
    let desired = explain_ipvs(&IpvsView::from_desired(&d, &d.tables, IpFamily::V4), &q);
    assert_eq!(desired.candidates.len(), 2);
    let diff = disagreements_ipvs(&kernel, &desired);
    assert_eq!(diff.len(), 1, "{diff:?}");
    assert!(diff[0].starts_with("endpoints:"), "{diff:?}");
    let text = render_text(&q, &kernel, Some(&diff));
    assert!(
        text.contains("kernel differs from the desired state"),
        "{text}"
    );

    // The empty service in the desired state agrees with itself.
    let q = query("10.96.0.11:80/tcp", None);
    let k = explain_ipvs(&v, &q);
    let d = explain_ipvs(&IpvsView::from_desired(&d, &d.tables, IpFamily::V4), &q);
    assert_eq!(disagreements_ipvs(&k, &d), Vec::<String>::new());
}

#[test]
fn a_deleted_virtual_server_is_a_disagreement() {
    let d = cluster();
    let (mut s, _) = kernel(&d);
    let svc = IpvsService::new(IpvsProtocol::Tcp, ip("10.96.0.10"), 80);
    s.apply(&IpvsOp::DelService(svc)).unwrap();
    let v = view_of(&s, &d);
    let q = query("10.96.0.10:80/tcp", Some("10.244.1.9"));
    let kernel = explain_ipvs(&v, &q);
    assert_eq!(kernel.outcome, Outcome::Rejected, "{kernel:#?}");
    assert!(
        kernel
            .problems
            .iter()
            .any(|p| p.contains("no virtual server")),
        "{:?}",
        kernel.problems
    );
    let desired = explain_ipvs(&IpvsView::from_desired(&d, &d.tables, IpFamily::V4), &q);
    let diff = disagreements_ipvs(&kernel, &desired);
    assert!(diff.iter().any(|x| x.starts_with("outcome:")), "{diff:?}");
}

#[test]
fn an_ipset_that_disagrees_with_its_mirror_is_reported() {
    let d = cluster();
    let (_, mut v) = kernel(&d);
    v.ipsets
        .get_mut(CLUSTER_IP)
        .unwrap()
        .remove(&IpsetMember::IpPort {
            ip: ip("10.96.0.10"),
            proto: 6,
            port: 80,
        });
    let ex = explain_ipvs(&v, &query("10.96.0.10:80/tcp", Some("10.244.1.9")));
    assert_eq!(ex.outcome, Outcome::Served);
    assert!(
        ex.problems.iter().any(|p| p.contains("KUBE-CLUSTER-IP")),
        "{:?}",
        ex.problems
    );
}
