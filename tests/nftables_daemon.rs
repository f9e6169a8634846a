//! The daemon's side channels with real traffic: stale UDP conntrack entries are
//! cleared when a backend is replaced, /healthz, /livez and /metrics answer in the
//! node's namespace, and a health-check node port follows the local endpoints.
mod common;
use common::*;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const WAIT: Duration = Duration::from_secs(10);
const SHORT: Duration = Duration::from_millis(700);

fn udp_service(t: &Topo, backend: &str) -> Vec<String> {
    vec![
        Svc::new(
            "dns",
            "ClusterIP",
            &["10.96.0.53"],
            vec![port("dns", "UDP", 53, 8080)],
        )
        .yaml(),
        slice(
            "dns",
            "v4",
            false,
            &[("dns", "UDP", 8080)],
            &t.eps(&[backend], false),
        ),
    ]
}

#[test]
fn udp_flow_follows_a_replaced_backend_at_once() {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("old", Where::Local);
    t.add_pod("new", Where::Remote);
    let client = t.pod("client").ns.clone();
    let vip = sa(ip("10.96.0.53"), 53);
    let mut p = Proxy::new(&t, BIN);
    p.write(&cluster(&udp_service(&t, "old")));
    p.start();
    // One client socket port for the whole test: the same conntrack entry.
    const SRC_PORT: u16 = 40053;
    let first = eventually(WAIT, || udp(&client, vip, Some(SRC_PORT), SHORT).is_ok());
    assert!(first, "the service never answered; log:\n{}", p.log());
    let r = udp(&client, vip, Some(SRC_PORT), SHORT).unwrap();
    assert_eq!(r.pod, "old");

    // Replace the backend; the old pod keeps running, so only a conntrack cleanup
    // can move this flow.
    let before = p.table();
    p.write(&cluster(&udp_service(&t, "new")));
    assert!(
        p.wait_table_change(&before, WAIT),
        "no sync; log:\n{}",
        p.log()
    );
    let moved = eventually(Duration::from_secs(3), || {
        udp(&client, vip, Some(SRC_PORT), SHORT).is_ok_and(|r| r.pod == "new")
    });
    assert!(
        moved,
        "the UDP flow kept its old backend after the sync; log:\n{}",
        p.log()
    );
    assert!(p.log().contains("stale conntrack"), "log:\n{}", p.log());
}

#[test]
fn health_metrics_and_health_check_node_port() {
    let mut t = Topo::new();
    t.add_pod("l", Where::Local);
    t.add_pod("r", Where::Remote);
    let node_ns = t.node.clone();
    let ext = t.ext.clone();
    let lb = |eps: &[&str]| {
        let mut svc = Svc::new(
            "lb",
            "LoadBalancer",
            &["10.96.0.70"],
            vec![nport("http", "TCP", 80, 8080, 30070)],
        );
        svc.etp = "Local".into();
        let yaml = svc.yaml().replace(
            "  type: LoadBalancer\n",
            "  type: LoadBalancer\n  healthCheckNodePort: 32070\n",
        );
        vec![
            yaml,
            slice(
                "lb",
                "v4",
                false,
                &[("http", "TCP", 8080)],
                &t.eps(eps, false),
            ),
        ]
    };
    let mut p = Proxy::new(&t, BIN);
    p.write(&cluster(&lb(&["l", "r"])));
    p.start();
    let health = sa(ip("127.0.0.1"), 10256);
    let up = eventually(WAIT, || {
        http_get(&node_ns, health, "/healthz").is_ok_and(|(c, _)| c == 200)
    });
    assert!(up, "no healthy /healthz; log:\n{}", p.log());
    let (code, body) = http_get(&node_ns, health, "/healthz").unwrap();
    assert_eq!(code, 200);
    for field in [
        "\"lastUpdated\"",
        "\"currentTime\"",
        "\"nodeEligible\":true",
        "\"healthy\":true",
    ] {
        assert!(body.contains(field), "{field} missing in {body}");
    }
    let (code, body) = http_get(&node_ns, health, "/livez").unwrap();
    assert_eq!(code, 200);
    assert!(!body.contains("nodeEligible"), "{body}");

    let metrics = sa(ip("127.0.0.1"), 10249);
    let (code, text) = http_get(&node_ns, metrics, "/metrics").unwrap();
    assert_eq!(code, 200);
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_network_programming_duration_seconds",
        "kubeproxy_proxy_healthz_total",
        "kube_nlproxy_netlink_messages_total{kind=\"nftables\"}",
        "kube_nlproxy_sync_operations{op=\"add-rule\"}",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
    let (_, mode) = http_get(&node_ns, metrics, "/proxyMode").unwrap();
    assert_eq!(mode.trim(), "nftables");

    // The health-check node port, from outside: one local endpoint -> 200.
    let hc = sa(ip("10.77.0.1"), 32070);
    let ok = eventually(WAIT, || {
        http_get(&ext, hc, "/").is_ok_and(|(c, _)| c == 200)
    });
    assert!(
        ok,
        "health-check node port not answering 200; log:\n{}",
        p.log()
    );
    let (_, body) = http_get(&ext, hc, "/anything").unwrap();
    assert!(body.contains("\"localEndpoints\": 1"), "{body}");
    assert!(body.contains("\"name\": \"lb\""), "{body}");

    // Only a remote endpoint left -> 503 with weight 0.
    p.write(&cluster(&lb(&["r"])));
    let gone = eventually(WAIT, || {
        http_get(&ext, hc, "/").is_ok_and(|(c, _)| c == 503)
    });
    assert!(
        gone,
        "health-check node port still 200 without local endpoints"
    );
    let (_, body) = http_get(&ext, hc, "/").unwrap();
    assert!(body.contains("\"localEndpoints\": 0"), "{body}");

    // Service gone -> the port closes.
    p.write(&cluster(&[]));
    let closed = eventually(WAIT, || http_get(&ext, hc, "/").is_err());
    assert!(
        closed,
        "health-check node port still open after the service left"
    );
}

/// `--once` clears stale UDP flows too, judged by the new state alone.
#[test]
fn udp_flow_follows_a_replaced_backend_with_once() {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("old", Where::Local);
    t.add_pod("new", Where::Remote);
    let client = t.pod("client").ns.clone();
    let vip = sa(ip("10.96.0.53"), 53);
    let p = Proxy::new(&t, BIN);
    p.write(&cluster(&udp_service(&t, "old")));
    p.sync();
    const SRC_PORT: u16 = 40054;
    let r = udp(&client, vip, Some(SRC_PORT), SHORT).expect("service answers");
    assert_eq!(r.pod, "old");
    // The old pod keeps running: only a conntrack cleanup moves this flow.
    p.write(&cluster(&udp_service(&t, "new")));
    p.sync();
    let r = udp(&client, vip, Some(SRC_PORT), SHORT).expect("service answers after --once");
    assert_eq!(
        r.pod, "new",
        "the UDP flow kept its old backend after --once"
    );
}
