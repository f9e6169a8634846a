//! The bad objects of `tests/bad_input.rs`, through the kube source: the test
//! API server (which, unlike a real one, validates nothing) serves them beside
//! good ones to the real daemon in a node namespace. Each bad object or field is
//! one warning naming it; every good Service (and the good part of a half-bad
//! one) is served with real packets; the daemon keeps running.
mod common;

use std::time::Duration;

use common::apiserver::FakeApiServer;
use common::*;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const SHORT: Duration = Duration::from_millis(700);

fn service(name: &str, ip: &str, ports: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "bad"},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ports": ports}
    })
}

fn slice(name: &str, service: Option<&str>, port: Value, addresses: &[String]) -> Value {
    let labels = match service {
        Some(s) => json!({"kubernetes.io/service-name": s}),
        None => json!({}),
    };
    let endpoints: Vec<Value> = addresses
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "bad", "labels": labels},
        "addressType": "IPv4",
        "ports": [port],
        "endpoints": endpoints
    })
}

#[test]
fn bad_objects_through_the_kube_source_are_warnings_and_the_rest_is_served() {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("web", Where::Local);
    let client = t.pod("client").ns.clone();
    let web = t.pod("web").v4.to_string();
    let api = FakeApiServer::start_in_netns(&t.node);
    let http = json!([{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]);
    let http_ep = json!({"name": "http", "port": 8080, "protocol": "TCP"});
    // Good: one Service whose slice's name is at the 253-character limit.
    api.create(service("good", "10.96.5.1", http.clone()));
    let long = format!("good-{}", "x".repeat(248));
    api.create(slice(
        &long,
        Some("good"),
        http_ep.clone(),
        std::slice::from_ref(&web),
    ));
    // Half bad: its NodePort is out of range; the ClusterIP still serves.
    api.create(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "np", "namespace": "bad"},
        "spec": {"type": "NodePort", "clusterIP": "10.96.5.2", "clusterIPs": ["10.96.5.2"],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080,
                            "nodePort": 99999}]}
    }));
    api.create(slice(
        "np-1",
        Some("np"),
        http_ep.clone(),
        std::slice::from_ref(&web),
    ));
    // Bad fields, each one warning.
    api.create(service(
        "zero",
        "10.96.5.3",
        json!([{"name": "http", "port": 0, "protocol": "TCP"}]),
    ));
    api.create(service(
        "dup",
        "10.96.5.4",
        json!([{"name": "a", "port": 80, "protocol": "TCP"},
               {"name": "a", "port": 81, "protocol": "TCP"}]),
    ));
    api.create(service("badip", "10.96.5.300", http.clone()));
    // Of the wrong type: a real API server refuses it, kube decodes a list as a
    // whole; it must not stop the other Services.
    api.create(service(
        "typo",
        "10.96.5.5",
        json!([{"name": "http", "port": "eighty"}]),
    ));
    api.create(slice(
        "orphan-1",
        None,
        http_ep.clone(),
        std::slice::from_ref(&web),
    ));
    api.create(slice(
        "good-badaddr",
        Some("good"),
        http_ep.clone(),
        &["10.244.999.1".to_string()],
    ));
    // A slice port that matches no Service port: nothing, no crash.
    api.create(slice(
        "good-other",
        Some("good"),
        json!({"name": "nope", "port": 9999, "protocol": "TCP"}),
        std::slice::from_ref(&web),
    ));
    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique("knp-bad")));
    api.write_kubeconfig(&kubeconfig);
    let mut p = Proxy::new(&t, BIN).with_kube_source(&kubeconfig);
    p.start();

    let served = |vip: &str| tcp(&client, sa(ip(vip), 80), SHORT).is_ok_and(|r| r.pod == "web");
    let mut c = Checks::default();
    c.run("the good Service is served", || {
        assert!(
            eventually(Duration::from_secs(15), || served("10.96.5.1")),
            "log:\n{}",
            p.log()
        );
    });
    c.run("the half-bad Service keeps its ClusterIP", || {
        assert!(served("10.96.5.2"), "log:\n{}", p.log());
    });
    c.run("one warning per bad object or field, naming both", || {
        let log = p.log();
        for (object, field) in [
            ("Service bad/np", "spec.ports[0].nodePort"),
            ("Service bad/zero", "spec.ports[0].port"),
            ("Service bad/dup", "spec.ports[1].name"),
            ("Service bad/badip", "spec.clusterIP"),
            ("Service bad/typo", "spec.ports[0].port"),
            (
                "EndpointSlice bad/orphan-1",
                "metadata.labels[kubernetes.io/service-name]",
            ),
            (
                "EndpointSlice bad/good-badaddr",
                "endpoints[0].addresses[0]",
            ),
        ] {
            let hits = log
                .lines()
                .filter(|l| l.contains(&format!("{object}: {field}")))
                .count();
            assert_eq!(hits, 1, "{object} {field}: {hits} warnings in\n{log}");
        }
    });
    c.run("a good version of the malformed one is served", || {
        api.update(service("typo", "10.96.5.5", http.clone()));
        api.create(slice(
            "typo-1",
            Some("typo"),
            http_ep.clone(),
            std::slice::from_ref(&web),
        ));
        assert!(
            eventually(Duration::from_secs(10), || served("10.96.5.5")),
            "log:\n{}",
            p.log()
        );
    });
    c.run("a later good change still syncs, the daemon runs", || {
        api.create(service("late", "10.96.5.9", http.clone()));
        api.create(slice(
            "late-1",
            Some("late"),
            http_ep.clone(),
            std::slice::from_ref(&web),
        ));
        assert!(
            eventually(Duration::from_secs(10), || served("10.96.5.9")),
            "log:\n{}",
            p.log()
        );
        assert!(p.running(), "{}", p.log());
    });
    p.stop();
    let _ = std::fs::remove_file(&kubeconfig);
    c.finish();
}
