//! Masquerading: --masquerade-all and the detect-local modes (ClusterCIDR,
//! NodeCIDR, BridgeInterface, InterfaceNamePrefix), each checked with one
//! off-node and one on-node connection.
mod common;
use common::*;
use std::net::IpAddr;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");

fn manifests(t: &Topo) -> String {
    let ports = [("http", "TCP", 8080)];
    cluster(&[
        Svc::new(
            "local",
            "ClusterIP",
            &["10.96.0.30"],
            vec![port("http", "TCP", 80, 8080)],
        )
        .yaml(),
        slice("local", "v4", false, &ports, &t.eps(&["b"], false)),
        Svc::new(
            "remote",
            "ClusterIP",
            &["10.96.0.31"],
            vec![port("http", "TCP", 80, 8080)],
        )
        .yaml(),
        slice("remote", "v4", false, &ports, &t.eps(&["r"], false)),
    ])
}

fn args(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "--node-ip",
        "10.77.0.1,fd77::1",
        "--cluster-cidr",
        "10.244.0.0/16,fd44::/16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

#[test]
fn masquerade_scenarios() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    t.add_routed_pod("v");
    t.add_pod("r", Where::Remote);
    t.add_pod("rc", Where::Remote);
    let (a, v, rc) = (t.pod("a").clone(), t.pod("v").clone(), t.pod("rc").clone());
    let local: IpAddr = ip("10.96.0.30");
    let remote: IpAddr = ip("10.96.0.31");
    let mut p = Proxy::new(&t, BIN);
    p.write(&manifests(&t));
    let node = Topo::node_addrs(false);
    let mut c = Checks::default();

    let modes: Vec<(&str, Vec<&str>, &Pod)> = vec![
        (
            "ClusterCIDR",
            vec!["--detect-local-mode", "ClusterCIDR"],
            &a,
        ),
        ("NodeCIDR", vec!["--detect-local-mode", "NodeCIDR"], &a),
        (
            "BridgeInterface",
            vec![
                "--detect-local-mode",
                "BridgeInterface",
                "--pod-bridge-interface",
                "cbr0",
            ],
            &a,
        ),
        (
            "InterfaceNamePrefix",
            vec![
                "--detect-local-mode",
                "InterfaceNamePrefix",
                "--pod-interface-name-prefix",
                "veth",
            ],
            &v,
        ),
    ];
    for (mode, extra, on_node) in &modes {
        p.args = args(extra);
        let out = p.once();
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            c.run(&format!("detect-local {mode}"), || {
                panic!("--once failed ({}): {err}", out.status)
            });
            continue;
        }
        c.run(
            &format!("detect-local {mode}: on-node pod not masqueraded"),
            || {
                // The routed pod is not on cbr0, so its backend is the remote
                // pod (a bridged backend would ARP for it on cbr0).
                let (svc, be) = if *mode == "InterfaceNamePrefix" {
                    (remote, "r")
                } else {
                    (local, "b")
                };
                let r = expect_ok("on-node", tcp(&on_node.ns, sa(svc, 80), OK_TIMEOUT), &[be]);
                assert_eq!(
                    r.src,
                    on_node.ip(false),
                    "on-node pod {} was masqueraded",
                    on_node.name
                );
            },
        );
        c.run(&format!("detect-local {mode}: off-node client"), || {
            // EXT is off-cluster in every mode -> masqueraded.
            let r = expect_ok("EXT", tcp(&t.ext, sa(local, 80), OK_TIMEOUT), &["b"]);
            assert!(
                node.contains(&r.src),
                "EXT source {} not masqueraded",
                r.src
            );
            // A pod on the other node is local only for ClusterCIDR.
            let r = expect_ok("remote pod", tcp(&rc.ns, sa(local, 80), OK_TIMEOUT), &["b"]);
            if *mode == "ClusterCIDR" {
                assert_eq!(
                    r.src,
                    rc.ip(false),
                    "remote pod masqueraded under ClusterCIDR"
                );
            } else {
                assert!(
                    node.contains(&r.src),
                    "remote pod source {} not masqueraded under {mode}",
                    r.src
                );
            }
        });
    }

    p.args = args(&["--detect-local-mode", "ClusterCIDR", "--masquerade-all"]);
    let out = p.once();
    c.run(
        "--masquerade-all: pod connection arrives from a node address",
        || {
            assert!(
                out.status.success(),
                "--once failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let r = expect_ok(
                "masq-all remote",
                tcp(&a.ns, sa(remote, 80), OK_TIMEOUT),
                &["r"],
            );
            assert!(
                node.contains(&r.src),
                "source {} is not a node address",
                r.src
            );
            let r = expect_ok(
                "masq-all local",
                tcp(&a.ns, sa(local, 80), OK_TIMEOUT),
                &["b"],
            );
            assert!(
                node.contains(&r.src),
                "source {} is not a node address",
                r.src
            );
        },
    );
    c.finish();
}
