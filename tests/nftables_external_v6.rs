//! IPv6 versions of the external-path semantics: LoadBalancer IPs with
//! loadBalancerSourceRanges, externalTrafficPolicy Local and internalTrafficPolicy
//! Local (the v4 ones are in nftables_external.rs).
mod common;
use common::*;
use std::net::IpAddr;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");

fn v6_slice(svc: &str, t: &Topo, pods: &[&str]) -> String {
    slice(
        svc,
        "v6",
        true,
        &[("http", "TCP", 8080)],
        &t.eps(pods, true),
    )
}

fn manifests(t: &Topo) -> String {
    let http = |np: u16| vec![nport("http", "TCP", 80, 8080, np)];
    let clusterip = |name: &str, cip: &str| {
        Svc::new(
            name,
            "ClusterIP",
            &[cip],
            vec![port("http", "TCP", 80, 8080)],
        )
    };
    let objs = vec![
        Svc {
            lb_ips: vec!["fd78::100".into()],
            lb_source_ranges: vec!["fd77::100/128".into(), "2001:db8::/64".into()],
            ..Svc::new("lb6", "LoadBalancer", &["fd96::42"], http(31082))
        }
        .yaml(),
        Svc {
            lb_ips: vec!["fd78::101".into()],
            lb_source_ranges: vec!["2001:db8::/64".into()],
            ..Svc::new("lbdeny6", "LoadBalancer", &["fd96::43"], http(31083))
        }
        .yaml(),
        Svc {
            etp: "Local".into(),
            ..Svc::new("etp6", "NodePort", &["fd96::44"], http(31084))
        }
        .yaml(),
        Svc {
            etp: "Local".into(),
            external_ips: vec!["fd78::5".into()],
            ..Svc::new("etpnone6", "NodePort", &["fd96::45"], http(31085))
        }
        .yaml(),
        Svc {
            itp: "Local".into(),
            ..clusterip("itp6", "fd96::46")
        }
        .yaml(),
        Svc {
            itp: "Local".into(),
            ..clusterip("itpnone6", "fd96::47")
        }
        .yaml(),
        v6_slice("lb6", t, &["b"]),
        v6_slice("lbdeny6", t, &["b"]),
        v6_slice("etp6", t, &["b", "r"]),
        v6_slice("etpnone6", t, &["r"]),
        v6_slice("itp6", t, &["b", "r"]),
        v6_slice("itpnone6", t, &["r"]),
    ];
    cluster(&objs)
}

#[test]
fn external_scenarios_v6() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    t.add_pod("r", Where::Remote);
    let a = t.pod("a").clone();
    let ext = t.ext.clone();
    let p = Proxy::new(&t, BIN);
    p.write(&manifests(&t));
    p.sync();
    let mut c = Checks::default();
    c.run("v6 LB IP from EXT, source range allows EXT", || {
        expect_ok(
            "lb6",
            tcp(&ext, sa(ip("fd78::100"), 80), OK_TIMEOUT),
            &["b"],
        );
    });
    c.run(
        "v6 LB IP from EXT, source range excludes EXT -> drop",
        || {
            expect_err(
                "lbdeny6",
                tcp(&ext, sa(ip("fd78::101"), 80), DROP_TIMEOUT),
                ConnErr::Timeout,
            );
        },
    );
    c.run(
        "v6 eTP Local: EXT only local backend, client IP preserved",
        || {
            for _ in 0..10 {
                let r = expect_ok("etp6", tcp(&ext, sa(NODE_V6, 31084), OK_TIMEOUT), &["b"]);
                assert_eq!(r.src, IpAddr::from(EXT_V6), "client IP not preserved");
            }
        },
    );
    c.run("v6 eTP Local, no local endpoint: EXT dropped", || {
        expect_err(
            "etpnone6 ext",
            tcp(&ext, sa(NODE_V6, 31085), DROP_TIMEOUT),
            ConnErr::Timeout,
        );
    });
    c.run(
        "v6 eTP Local, no local endpoint: pod reaches remote endpoint (ClusterIP and NodePort)",
        || {
            expect_ok(
                "etpnone6 pod clusterip",
                tcp(&a.ns, sa(ip("fd96::45"), 80), OK_TIMEOUT),
                &["r"],
            );
            expect_ok(
                "etpnone6 pod nodeport",
                tcp(&a.ns, sa(NODE_V6, 31085), OK_TIMEOUT),
                &["r"],
            );
        },
    );
    c.run(
        "v6 eTP Local, no local endpoint: the node itself reaches the remote endpoint, masqueraded",
        || {
            for dst in [sa(ip("fd78::5"), 80), sa(NODE_V6, 31085)] {
                let r = expect_ok(
                    "etpnone6 from the node",
                    tcp(&t.node, dst, OK_TIMEOUT),
                    &["r"],
                );
                assert!(
                    Topo::node_addrs(true).contains(&r.src),
                    "{dst}: source {} is not a node address",
                    r.src
                );
            }
            expect_err(
                "etpnone6 externalIP from EXT",
                tcp(&ext, sa(ip("fd78::5"), 80), DROP_TIMEOUT),
                ConnErr::Timeout,
            );
        },
    );
    c.run("v6 iTP Local: pod reaches only the local endpoint", || {
        for _ in 0..10 {
            let r = expect_ok(
                "itp6",
                tcp(&a.ns, sa(ip("fd96::46"), 80), OK_TIMEOUT),
                &["b"],
            );
            assert_eq!(r.src, a.ip(true));
        }
    });
    c.run("v6 iTP Local, no local endpoint: drop", || {
        expect_err(
            "itpnone6",
            tcp(&a.ns, sa(ip("fd96::47"), 80), DROP_TIMEOUT),
            ConnErr::Timeout,
        );
    });
    c.finish();
}

#[test]
fn masquerade_v6() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    let a = t.pod("a").clone();
    let mut p = Proxy::new(&t, BIN);
    p.write(&cluster(&[
        Svc::new(
            "local6",
            "ClusterIP",
            &["fd96::30"],
            vec![port("http", "TCP", 80, 8080)],
        )
        .yaml(),
        v6_slice("local6", &t, &["b"]),
    ]));
    let vip = sa(ip("fd96::30"), 80);
    let node = Topo::node_addrs(true);
    let mut c = Checks::default();
    p.args = [
        "--cluster-cidr",
        "10.244.0.0/16,fd44::/16",
        "--detect-local-mode",
        "ClusterCIDR",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    p.sync();
    c.run(
        "v6 ClusterCIDR: pod not masqueraded, EXT masqueraded",
        || {
            let r = expect_ok("pod", tcp(&a.ns, vip, OK_TIMEOUT), &["b"]);
            assert_eq!(r.src, a.ip(true));
            let r = expect_ok("EXT", tcp(&t.ext, vip, OK_TIMEOUT), &["b"]);
            assert!(
                node.contains(&r.src),
                "EXT source {} not masqueraded",
                r.src
            );
        },
    );
    p.args.push("--masquerade-all".into());
    p.sync();
    c.run(
        "v6 --masquerade-all: pod connection arrives from a node address",
        || {
            let r = expect_ok("pod", tcp(&a.ns, vip, OK_TIMEOUT), &["b"]);
            assert!(
                node.contains(&r.src),
                "source {} is not a node address",
                r.src
            );
        },
    );
    c.finish();
}
