//! `--ignore-external-ips` with real packets: a Service's `spec.externalIPs` are
//! not served (from outside the node nor from a pod) while its ClusterIP is; the
//! same manifests without the flag serve the externalIP.
mod common;
use common::*;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const WAIT: Duration = Duration::from_secs(10);
const CLUSTER_IP: &str = "10.96.0.30";
const EXTERNAL_IP: &str = "10.78.0.30";

fn manifests(t: &Topo) -> String {
    cluster(&[
        Svc {
            external_ips: vec![EXTERNAL_IP.into()],
            ..Svc::new(
                "ext",
                "ClusterIP",
                &[CLUSTER_IP],
                vec![port("http", "TCP", 80, 8080)],
            )
        }
        .yaml(),
        slice(
            "ext",
            "v4",
            false,
            &[("http", "TCP", 8080)],
            &t.eps(&["b"], false),
        ),
    ])
}

fn topo() -> Topo {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    t
}

/// The externalIP is not answered, the ClusterIP is, and the table holds no
/// trace of the externalIP.
fn expect_ignored(t: &Topo, p: &Proxy) {
    let a = t.pod("a").ns.clone();
    expect_ok(
        "ClusterIP from a pod",
        tcp(&a, sa(ip(CLUSTER_IP), 80), OK_TIMEOUT),
        &["b"],
    );
    let eip = sa(ip(EXTERNAL_IP), 80);
    for (what, ns) in [("from EXT", t.ext.clone()), ("from a pod", a)] {
        let r = tcp(&ns, eip, Duration::from_secs(1));
        assert!(r.is_err(), "externalIP {what} answered: {r:?}");
    }
    let table = p.table().expect("our table exists");
    assert!(
        !table.contains(EXTERNAL_IP),
        "the externalIP is in the table:\n{table}"
    );
}

#[test]
fn the_daemon_with_the_flag_does_not_serve_external_ips() {
    let t = topo();
    let mut p = Proxy::new(&t, BIN);
    p.args.push("--ignore-external-ips".into());
    p.write(&manifests(&t));
    p.start();
    let a = t.pod("a").ns.clone();
    let synced = eventually(WAIT, || tcp(&a, sa(ip(CLUSTER_IP), 80), OK_TIMEOUT).is_ok());
    assert!(synced, "the ClusterIP never answered; log:\n{}", p.log());
    expect_ignored(&t, &p);
}

#[test]
fn once_with_the_flag_ignores_and_without_it_serves_the_external_ip() {
    let t = topo();
    let mut ignoring = Proxy::new(&t, BIN);
    ignoring.args.push("--ignore-external-ips".into());
    ignoring.write(&manifests(&t));
    ignoring.sync();
    expect_ignored(&t, &ignoring);

    // The same manifests without the flag: served from outside and from a pod.
    let serving = Proxy::new(&t, BIN);
    serving.write(&manifests(&t));
    serving.sync();
    let eip = sa(ip(EXTERNAL_IP), 80);
    expect_ok("externalIP from EXT", tcp(&t.ext, eip, OK_TIMEOUT), &["b"]);
    expect_ok(
        "externalIP from a pod",
        tcp(&t.pod("a").ns, eip, OK_TIMEOUT),
        &["b"],
    );
    assert!(serving.table().unwrap().contains(EXTERNAL_IP));
}
