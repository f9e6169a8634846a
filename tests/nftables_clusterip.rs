//! ClusterIP scenarios: TCP/UDP both families, multi-port, load spread,
//! reject for no endpoints / unknown port, drop for unallocated service IPs,
//! session affinity and hairpin.
mod common;
use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");

fn both(svc: &str, ports: &[(&str, &str, u16)], t: &Topo, pods: &[&str]) -> Vec<String> {
    vec![
        slice(svc, "v4", false, ports, &t.eps(pods, false)),
        slice(svc, "v6", true, ports, &t.eps(pods, true)),
    ]
}

fn manifests(t: &Topo) -> String {
    let web_ports = [
        ("http", "TCP", 8080),
        ("dns", "UDP", 8080),
        ("alt", "TCP", 8081),
    ];
    let mut objs = vec![
        Svc::new(
            "web",
            "ClusterIP",
            &["10.96.0.10", "fd96::10"],
            vec![
                port("http", "TCP", 80, 8080),
                port("dns", "UDP", 53, 8080),
                port("alt", "TCP", 81, 8081),
            ],
        )
        .yaml(),
        Svc::new(
            "solo",
            "ClusterIP",
            &["10.96.0.11", "fd96::11"],
            vec![port("http", "TCP", 80, 8080), port("dns", "UDP", 53, 8080)],
        )
        .yaml(),
        Svc::new(
            "empty",
            "ClusterIP",
            &["10.96.0.12", "fd96::12"],
            vec![port("http", "TCP", 80, 8080), port("dns", "UDP", 53, 8080)],
        )
        .yaml(),
        Svc {
            affinity: true,
            ..Svc::new(
                "sticky",
                "ClusterIP",
                &["10.96.0.13", "fd96::13"],
                vec![port("http", "TCP", 80, 8080)],
            )
        }
        .yaml(),
        Svc::new(
            "hairpin",
            "ClusterIP",
            &["10.96.0.14", "fd96::14"],
            vec![port("http", "TCP", 80, 8080)],
        )
        .yaml(),
    ];
    objs.extend(both("web", &web_ports, t, &["b", "r"]));
    objs.extend(both(
        "solo",
        &[("http", "TCP", 8080), ("dns", "UDP", 8080)],
        t,
        &["b"],
    ));
    objs.extend(both(
        "empty",
        &[("http", "TCP", 8080), ("dns", "UDP", 8080)],
        t,
        &[],
    ));
    objs.extend(both("sticky", &[("http", "TCP", 8080)], t, &["b", "r"]));
    objs.extend(both("hairpin", &[("http", "TCP", 8080)], t, &["a"]));
    cluster(&objs)
}

#[test]
fn clusterip_scenarios() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    t.add_pod("r", Where::Remote);
    let a = t.pod("a").clone();
    let p = Proxy::new(&t, BIN);
    p.write(&manifests(&t));
    p.sync();
    // Oracle read-back: the tables exist and have chains.
    let tab = p
        .table()
        .expect("table ip kube-nlproxy missing after --once");
    assert!(tab.contains("chain"), "no chains in table:\n{tab}");
    assert!(p.table6().is_some(), "table ip6 kube-nlproxy missing");

    let mut c = Checks::default();
    for v6 in [false, true] {
        let f = if v6 { "v6" } else { "v4" };
        let (solo, web, empty, sticky, hair, unalloc) = if v6 {
            (
                ip("fd96::11"),
                ip("fd96::10"),
                ip("fd96::12"),
                ip("fd96::13"),
                ip("fd96::14"),
                ip("fd96::99"),
            )
        } else {
            (
                ip("10.96.0.11"),
                ip("10.96.0.10"),
                ip("10.96.0.12"),
                ip("10.96.0.13"),
                ip("10.96.0.14"),
                ip("10.96.0.99"),
            )
        };
        let a = &a;
        c.run(
            &format!("{f} ClusterIP TCP+UDP from pod, not masqueraded"),
            || {
                let r = expect_ok(
                    &format!("{f} clusterip tcp"),
                    tcp(&a.ns, sa(solo, 80), OK_TIMEOUT),
                    &["b"],
                );
                assert_eq!(
                    r.src,
                    a.ip(v6),
                    "{f} tcp: pod source must not be masqueraded"
                );
                let r = expect_ok(
                    &format!("{f} clusterip udp"),
                    udp(&a.ns, sa(solo, 53), None, OK_TIMEOUT),
                    &["b"],
                );
                assert_eq!(
                    r.src,
                    a.ip(v6),
                    "{f} udp: pod source must not be masqueraded"
                );
            },
        );
        c.run(&format!("{f} multi-port service"), || {
            expect_ok(
                &format!("{f} multiport alt"),
                tcp(&a.ns, sa(web, 81), OK_TIMEOUT),
                &["b", "r"],
            );
            let r = expect_ok(
                &format!("{f} multiport udp"),
                udp(&a.ns, sa(web, 53), None, OK_TIMEOUT),
                &["b", "r"],
            );
            assert_eq!(r.src, a.ip(v6));
        });
        c.run(&format!("{f} load spread over 2 backends"), || {
            let (pods, srcs) =
                spread(&a.ns, sa(web, 80), 20).unwrap_or_else(|e| panic!("{f} spread: {e}"));
            assert_eq!(pods.len(), 2, "{f} spread: only {pods:?} answered");
            assert_eq!(
                srcs.into_iter().collect::<Vec<_>>(),
                vec![a.ip(v6)],
                "{f} spread: sources"
            );
        });
        c.run(
            &format!("{f} no endpoints -> refused fast (TCP, UDP)"),
            || {
                expect_fast_err(
                    &format!("{f} no endpoints tcp"),
                    || tcp(&a.ns, sa(empty, 80), OK_TIMEOUT),
                    ConnErr::Refused,
                    fast(v6),
                );
                expect_fast_err(
                    &format!("{f} no endpoints udp"),
                    || udp(&a.ns, sa(empty, 53), None, OK_TIMEOUT),
                    ConnErr::Refused,
                    fast(v6),
                );
            },
        );
        c.run(
            &format!("{f} known ClusterIP, unknown port -> refused"),
            || {
                expect_fast_err(
                    &format!("{f} unknown port"),
                    || tcp(&a.ns, sa(solo, 9999), OK_TIMEOUT),
                    ConnErr::Refused,
                    fast(v6),
                );
            },
        );
        c.run(
            &format!("{f} unallocated IP in ServiceCIDR -> timeout"),
            || {
                expect_err(
                    &format!("{f} unallocated"),
                    tcp(&a.ns, sa(unalloc, 80), DROP_TIMEOUT),
                    ConnErr::Timeout,
                );
            },
        );
        c.run(&format!("{f} sessionAffinity ClientIP"), || {
            let (pods, _) =
                spread(&a.ns, sa(sticky, 80), 15).unwrap_or_else(|e| panic!("{f} affinity: {e}"));
            assert_eq!(pods.len(), 1, "{f} affinity: hit {pods:?}");
        });
        c.run(&format!("{f} hairpin sees node bridge address"), || {
            let r = expect_ok(
                &format!("{f} hairpin"),
                tcp(&a.ns, sa(hair, 80), OK_TIMEOUT),
                &["a"],
            );
            let want = if v6 {
                IpAddr::from(NODE_BR_V6)
            } else {
                IpAddr::from(NODE_BR_V4)
            };
            assert_eq!(r.src, want, "{f} hairpin source");
        });
    }
    c.finish();
}

use std::net::IpAddr;
