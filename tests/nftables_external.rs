//! External paths: NodePort (v4/v6), externalIPs, LoadBalancer ingress IPs,
//! loadBalancerSourceRanges, externalTrafficPolicy / internalTrafficPolicy
//! Local, and reject for services without endpoints.
mod common;
use common::*;
use std::net::IpAddr;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");

fn both(svc: &str, t: &Topo, pods: &[&str]) -> Vec<String> {
    let ports = [("http", "TCP", 8080)];
    vec![
        slice(svc, "v4", false, &ports, &t.eps(pods, false)),
        slice(svc, "v6", true, &ports, &t.eps(pods, true)),
    ]
}

fn manifests(t: &Topo) -> String {
    let http = |np: u16| vec![nport("http", "TCP", 80, 8080, np)];
    let mut objs = vec![
        Svc::new("np", "NodePort", &["10.96.0.20", "fd96::20"], http(30080)).yaml(),
        Svc {
            external_ips: vec!["10.78.0.1".into(), "fd78::1".into()],
            ..Svc::new(
                "ext",
                "ClusterIP",
                &["10.96.0.21", "fd96::21"],
                vec![port("http", "TCP", 80, 8080)],
            )
        }
        .yaml(),
        Svc {
            lb_ips: vec!["10.78.0.100".into()],
            lb_source_ranges: vec!["10.77.0.100/32".into(), "192.0.2.0/24".into()],
            ..Svc::new("lb", "LoadBalancer", &["10.96.0.22"], http(30082))
        }
        .yaml(),
        Svc {
            lb_ips: vec!["10.78.0.101".into()],
            lb_source_ranges: vec!["192.0.2.0/24".into()],
            ..Svc::new("lbdeny", "LoadBalancer", &["10.96.0.23"], http(30083))
        }
        .yaml(),
        Svc {
            etp: "Local".into(),
            ..Svc::new("etp", "NodePort", &["10.96.0.24"], http(30084))
        }
        .yaml(),
        Svc {
            etp: "Local".into(),
            external_ips: vec!["10.78.0.5".into()],
            ..Svc::new("etpnone", "NodePort", &["10.96.0.25"], http(30085))
        }
        .yaml(),
        Svc {
            itp: "Local".into(),
            ..Svc::new(
                "itp",
                "ClusterIP",
                &["10.96.0.26"],
                vec![port("http", "TCP", 80, 8080)],
            )
        }
        .yaml(),
        Svc {
            itp: "Local".into(),
            ..Svc::new(
                "itpnone",
                "ClusterIP",
                &["10.96.0.27"],
                vec![port("http", "TCP", 80, 8080)],
            )
        }
        .yaml(),
        Svc {
            external_ips: vec!["10.78.0.2".into(), "fd78::2".into()],
            ..Svc::new(
                "npempty",
                "NodePort",
                &["10.96.0.28", "fd96::28"],
                http(30088),
            )
        }
        .yaml(),
    ];
    objs.extend(both("np", t, &["b", "r"]));
    objs.extend(both("ext", t, &["b"]));
    objs.extend(both("lb", t, &["b"]));
    objs.extend(both("lbdeny", t, &["b"]));
    objs.extend(both("etp", t, &["b", "r"]));
    objs.extend(both("etpnone", t, &["r"]));
    objs.extend(both("itp", t, &["b", "r"]));
    objs.extend(both("itpnone", t, &["r"]));
    objs.extend(both("npempty", t, &[]));
    cluster(&objs)
}

#[test]
fn external_scenarios() {
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

    for v6 in [false, true] {
        let node: IpAddr = if v6 { NODE_V6.into() } else { NODE_V4.into() };
        let f = if v6 { "v6" } else { "v4" };
        c.run(&format!("{f} nodeport from EXT (masqueraded)"), || {
            let (pods, srcs) = spread(&ext, sa(node, 30080), 20).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(pods.len(), 2, "backends {pods:?}");
            for s in &srcs {
                assert!(
                    Topo::node_addrs(v6).contains(s),
                    "source {s} is not a node address"
                );
            }
        });
        c.run(&format!("{f} nodeport from pod"), || {
            expect_ok(
                "nodeport from pod",
                tcp(&a.ns, sa(node, 30080), OK_TIMEOUT),
                &["b", "r"],
            );
        });
        c.run(&format!("{f} externalIP from EXT"), || {
            let eip = if v6 { ip("fd78::1") } else { ip("10.78.0.1") };
            expect_ok("externalIP", tcp(&ext, sa(eip, 80), OK_TIMEOUT), &["b"]);
        });
        c.run(
            &format!("{f} no endpoints: ClusterIP / NodePort / externalIP rejected fast"),
            || {
                let cip = if v6 { ip("fd96::28") } else { ip("10.96.0.28") };
                let eip = if v6 { ip("fd78::2") } else { ip("10.78.0.2") };
                expect_fast_err(
                    "clusterip",
                    || tcp(&a.ns, sa(cip, 80), OK_TIMEOUT),
                    ConnErr::Refused,
                    fast(v6),
                );
                expect_fast_err(
                    "nodeport",
                    || tcp(&ext, sa(node, 30088), OK_TIMEOUT),
                    ConnErr::Refused,
                    fast(v6),
                );
                expect_fast_err(
                    "externalIP",
                    || tcp(&ext, sa(eip, 80), OK_TIMEOUT),
                    ConnErr::Refused,
                    fast(v6),
                );
            },
        );
    }
    c.run("LB IP from EXT, source range allows EXT", || {
        expect_ok(
            "lb",
            tcp(&ext, sa(ip("10.78.0.100"), 80), OK_TIMEOUT),
            &["b"],
        );
    });
    c.run("LB IP from EXT, source range excludes EXT -> drop", || {
        expect_err(
            "lbdeny",
            tcp(&ext, sa(ip("10.78.0.101"), 80), DROP_TIMEOUT),
            ConnErr::Timeout,
        );
    });
    c.run(
        "eTP Local: EXT only local backend, client IP preserved",
        || {
            for _ in 0..10 {
                let r = expect_ok("etp", tcp(&ext, sa(NODE_V4, 30084), OK_TIMEOUT), &["b"]);
                assert_eq!(r.src, IpAddr::from(EXT_V4), "client IP not preserved");
            }
        },
    );
    c.run("eTP Local, no local endpoint: EXT dropped", || {
        expect_err(
            "etpnone ext",
            tcp(&ext, sa(NODE_V4, 30085), DROP_TIMEOUT),
            ConnErr::Timeout,
        );
    });
    c.run(
        "eTP Local, no local endpoint: pod reaches remote endpoint (ClusterIP and NodePort)",
        || {
            expect_ok(
                "etpnone pod clusterip",
                tcp(&a.ns, sa(ip("10.96.0.25"), 80), OK_TIMEOUT),
                &["r"],
            );
            expect_ok(
                "etpnone pod nodeport",
                tcp(&a.ns, sa(NODE_V4, 30085), OK_TIMEOUT),
                &["r"],
            );
        },
    );
    c.run(
        "eTP Local, no local endpoint: the node itself reaches the remote endpoint, masqueraded",
        || {
            for dst in [sa(ip("10.78.0.5"), 80), sa(NODE_V4, 30085)] {
                let r = expect_ok(
                    "etpnone from the node",
                    tcp(&t.node, dst, OK_TIMEOUT),
                    &["r"],
                );
                assert!(
                    Topo::node_addrs(false).contains(&r.src),
                    "{dst}: source {} is not a node address",
                    r.src
                );
            }
            expect_err(
                "etpnone externalIP from EXT",
                tcp(&ext, sa(ip("10.78.0.5"), 80), DROP_TIMEOUT),
                ConnErr::Timeout,
            );
        },
    );
    c.run("iTP Local: pod reaches only the local endpoint", || {
        for _ in 0..10 {
            let r = expect_ok(
                "itp",
                tcp(&a.ns, sa(ip("10.96.0.26"), 80), OK_TIMEOUT),
                &["b"],
            );
            assert_eq!(r.src, IpAddr::from(a.v4));
        }
    });
    c.run("iTP Local, no local endpoint: drop", || {
        expect_err(
            "itpnone",
            tcp(&a.ns, sa(ip("10.96.0.27"), 80), DROP_TIMEOUT),
            ConnErr::Timeout,
        );
    });
    c.finish();
}
