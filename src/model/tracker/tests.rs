use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

use super::*;
use crate::model::build;
use crate::source::Objects;

fn service(name: &str, ip: &str, ports: &[(&str, i32)]) -> Service {
    let ports: Vec<_> = ports
        .iter()
        .map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP", "targetPort": 8080}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": ports, "type": "ClusterIP"}
    }))
    .unwrap()
}

fn slice(name: &str, svc: &str, hosts: &[(&str, &str)]) -> EndpointSlice {
    let endpoints: Vec<_> = hosts
        .iter()
        .map(|(ip, node)| json!({"addresses": [ip], "nodeName": node}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "ns",
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    }))
    .unwrap()
}

fn node() -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "z1"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.77.0.1"}]}
    }))
    .unwrap()
}

fn opts() -> BuildOptions {
    BuildOptions {
        node_name: "node-a".into(),
        node_ips_override: vec![],
        primary_node_ip: None,
        ignore_external_ips: false,
    }
}

/// Applies `after` as changes from `before` and checks the tracker against a
/// fresh build.
fn step(tracker: &mut ModelTracker, before: &Objects, after: &Objects) -> ModelUpdate {
    let update = tracker.apply(ObjectChanges::between(before, after));
    let (fresh, _) = build(after, &opts());
    assert_eq!(tracker.state(), &fresh);
    update
}

fn names(update: &ModelUpdate) -> Vec<String> {
    update.changed.iter().map(|n| n.name.to_string()).collect()
}

#[test]
fn changes_rebuild_only_their_service_and_equal_a_fresh_build() {
    let mut tracker = ModelTracker::new(opts());
    let empty = Objects::default();
    let mut objects = Objects {
        services: vec![
            service("a", "10.96.0.1", &[("http", 80)]),
            service("b", "10.96.0.2", &[("http", 80)]),
        ],
        endpoint_slices: vec![
            slice("a-1", "a", &[("10.244.1.1", "node-a")]),
            slice("b-1", "b", &[("10.244.1.2", "node-b")]),
            slice("b-2", "b", &[("10.244.1.3", "node-a")]),
        ],
        nodes: vec![node()],
        service_cidrs: vec![],
    };
    let first = step(&mut tracker, &empty, &objects);
    assert_eq!(names(&first), vec!["a", "b"]);
    assert!(first.node_changed);

    // An endpoint of b moves: only b.
    let before = objects.clone();
    objects.endpoint_slices[2] = slice("b-2", "b", &[("10.244.1.4", "node-a")]);
    let update = step(&mut tracker, &before, &objects);
    assert_eq!(names(&update), vec!["b"]);
    assert!(!update.node_changed);
    assert_eq!(update.before.endpoints[&update.changed[0]].len(), 2);

    // A port added to a: only a.
    let before = objects.clone();
    objects.services[0] = service("a", "10.96.0.1", &[("http", 80), ("admin", 81)]);
    let update = step(&mut tracker, &before, &objects);
    assert_eq!(names(&update), vec!["a", "a"]);

    // A slice arrives before its service, then the service.
    let before = objects.clone();
    objects
        .endpoint_slices
        .push(slice("c-1", "c", &[("10.244.1.9", "node-a")]));
    let update = step(&mut tracker, &before, &objects);
    assert!(update.changed.is_empty());
    let before = objects.clone();
    objects
        .services
        .push(service("c", "10.96.0.3", &[("http", 80)]));
    let update = step(&mut tracker, &before, &objects);
    assert_eq!(names(&update), vec!["c"]);

    // The same address in two slices of b: the local one wins, as in build.
    let before = objects.clone();
    objects.endpoint_slices[1] = slice("b-1", "b", &[("10.244.1.4", "node-b")]);
    step(&mut tracker, &before, &objects);

    // b deleted, then its slices.
    let before = objects.clone();
    objects.services.remove(1);
    let update = step(&mut tracker, &before, &objects);
    assert_eq!(names(&update), vec!["b"]);
    assert_eq!(update.before.services.len(), 1);
    let before = objects.clone();
    objects
        .endpoint_slices
        .retain(|s| !s.metadata.name.as_deref().unwrap().starts_with("b-"));
    let update = step(&mut tracker, &before, &objects);
    assert!(update.changed.is_empty());

    // Nothing changed: nothing reported.
    let update = step(&mut tracker, &objects, &objects);
    assert!(update.changed.is_empty() && !update.node_changed);

    // The node's zone changes: node-level.
    let before = objects.clone();
    let mut n = node();
    n.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("topology.kubernetes.io/zone".into(), "z2".into());
    objects.nodes = vec![n];
    let update = step(&mut tracker, &before, &objects);
    assert!(update.node_changed);
}

#[test]
fn warnings_are_new_once() {
    let mut tracker = ModelTracker::new(opts());
    let mut bad = slice("x-1", "x", &[("not-an-ip", "node-a")]);
    let objects = Objects {
        endpoint_slices: vec![bad.clone()],
        ..Default::default()
    };
    let update = tracker.apply(ObjectChanges::between(&Objects::default(), &objects));
    assert_eq!(update.new_warnings.len(), 1, "{:?}", update.new_warnings);
    assert!(
        update.new_warnings[0]
            .to_string()
            .contains("EndpointSlice ns/x-1")
    );
    // The same object again: not new.
    bad.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
    let again = Objects {
        endpoint_slices: vec![bad],
        ..Default::default()
    };
    let update = tracker.apply(ObjectChanges::between(&objects, &again));
    assert!(update.new_warnings.is_empty());
    assert_eq!(tracker.warnings().count(), 1);
}
