//! The daemon's side channels on the fakes: health follows sync failures.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

use super::*;
use crate::driver::FakeHost;
use crate::driver::nftables::NftablesMode;
use crate::serve::health::FakeClock;
use crate::sync::{FakeKernel, FaultPoint};

fn one_service() -> ObjectChanges {
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "type": "ClusterIP",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
    }))
    .unwrap();
    let node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}
    }))
    .unwrap();
    ObjectChanges::everything(Objects {
        services: vec![svc],
        nodes: vec![node],
        ..Objects::default()
    })
}

#[tokio::test]
async fn syncs_that_keep_failing_turn_healthz_503_and_a_good_one_turns_it_back() {
    let cfg = Config {
        hostname_override: Some("node-a".into()),
        ..Config::default()
    };
    let clock = Arc::new(FakeClock::new(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000),
    ));
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(30)).with_clock(clock.clone()));
    let metrics = Arc::new(Metrics::new());
    let mut driver = Driver::new(
        &cfg,
        NftablesMode::new(FakeKernel::default()),
        FakeHost::new("node-a", &[]),
    );
    let mut daemon = Daemon {
        driver: &mut driver,
        health: health.clone(),
        metrics: metrics.clone(),
        service_health: None,
        health_index: HealthIndex::default(),
        last_snapshot: None,
        netlink_messages: 0,
        node_check: NodeCheck::default(),
        last_sync_repaired: false,
    };
    health.updated();
    assert!(daemon.sync(one_service()).await);
    assert_eq!(health.healthz().code, 200);

    // Every periodic resync now fails, with no change queued.
    daemon
        .driver
        .mode_mut()
        .dataplane_mut()
        .fail_next(FaultPoint::Dump, libc::EPERM, 100);
    daemon.driver.mode_mut().request_full_sync();
    assert!(!daemon.sync(ObjectChanges::default()).await);
    assert_eq!(
        health.healthz().code,
        200,
        "one failure is not yet unhealthy"
    );
    clock.step(Duration::from_secs(61));
    daemon.driver.mode_mut().request_full_sync();
    assert!(!daemon.sync(ObjectChanges::default()).await);
    assert_eq!(health.healthz().code, 503, "{}", health.healthz().body);
    let failures = metrics
        .render()
        .lines()
        .filter(|l| {
            l.starts_with("kubeproxy_sync_proxy_rules_nftables_sync_failures_total")
                && l.contains("IPv4")
        })
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert_eq!(
        failures,
        [r#"kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 2"#]
    );

    // The kernel works again: the next sync is a full one and health is back.
    daemon.driver.mode_mut().dataplane_mut().faults.clear();
    assert!(daemon.sync(ObjectChanges::default()).await);
    assert_eq!(health.healthz().code, 200);
    assert_eq!(daemon.driver.verify().unwrap(), Vec::<String>::new());
}

/// The count of `kubeproxy_network_programming_duration_seconds` for `family`.
fn programming_count(metrics: &Metrics, family: &str) -> String {
    let prefix =
        format!("kubeproxy_network_programming_duration_seconds_count{{ip_family=\"{family}\"}} ");
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .unwrap_or_default()
}

/// An EndpointSlice of `ns/web` of `family` with a trigger time (in the past).
fn slice(name: &str, family: &str, address: &str) -> EndpointSlice {
    let trigger = "2026-01-01T00:00:00Z";
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "ns",
            "labels": {"kubernetes.io/service-name": "web"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": trigger}},
        "addressType": family,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}}]
    }))
    .unwrap()
}

#[tokio::test]
async fn network_programming_latency_is_observed_in_the_changed_slices_family_only() {
    let cfg = Config {
        hostname_override: Some("node-a".into()),
        ..Config::default()
    };
    let metrics = Arc::new(Metrics::new());
    let mut driver = Driver::new(
        &cfg,
        NftablesMode::new(FakeKernel::default()),
        FakeHost::new("node-a", &[]),
    );
    let mut daemon = Daemon {
        driver: &mut driver,
        health: Arc::new(ProxyHealth::new(Duration::from_secs(30))),
        metrics: metrics.clone(),
        service_health: None,
        health_index: HealthIndex::default(),
        last_snapshot: None,
        netlink_messages: 0,
        node_check: NodeCheck::default(),
        last_sync_repaired: false,
    };
    assert!(daemon.sync(one_service()).await);
    let key = |name: &str| ("ns".to_string(), name.to_string());

    // An IPv4 slice changes: the IPv4 series only (upstream: the IPv4 proxier's).
    let v4 = ObjectChanges {
        endpoint_slices: vec![(key("web-v4"), Some(slice("web-v4", "IPv4", "10.244.1.5")))],
        ..ObjectChanges::default()
    };
    assert!(daemon.sync(v4).await);
    assert_eq!(programming_count(&metrics, "IPv4"), "1");
    assert_eq!(programming_count(&metrics, "IPv6"), "0");

    // Then an IPv6 one: the IPv6 series only.
    let v6 = ObjectChanges {
        endpoint_slices: vec![(key("web-v6"), Some(slice("web-v6", "IPv6", "fd44:1::5")))],
        ..ObjectChanges::default()
    };
    assert!(daemon.sync(v6).await);
    assert_eq!(programming_count(&metrics, "IPv4"), "1");
    assert_eq!(programming_count(&metrics, "IPv6"), "1");

    // A deleted slice has no trigger time left: nothing is observed.
    let gone = ObjectChanges {
        endpoint_slices: vec![(key("web-v4"), None)],
        ..ObjectChanges::default()
    };
    assert!(daemon.sync(gone).await);
    assert_eq!(programming_count(&metrics, "IPv4"), "1");
    assert_eq!(programming_count(&metrics, "IPv6"), "1");
}

#[test]
fn the_changed_services_line_names_each_service_once_and_counts_the_rest() {
    use crate::model::Protocol;
    let port = |ns: &str, name: &str, port: &str| ServicePortName {
        namespace: ns.into(),
        name: name.into(),
        port_name: port.into(),
        protocol: Protocol::Tcp,
    };
    let changed = [
        port("default", "web", "http"),
        port("default", "web", "https"),
        port("kube-system", "dns", "dns"),
        port("a", "x", ""),
    ];
    assert_eq!(
        changed_services(&changed, 20),
        "a/x, default/web, kube-system/dns"
    );
    assert_eq!(
        changed_services(&changed, 2),
        "a/x, default/web, and 1 more"
    );
}
