//! Run mode: incremental updates, restart under a live connection, cleanup.
mod common;
use common::*;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const WAIT: Duration = Duration::from_secs(10);
const SHORT: Duration = Duration::from_millis(700);

fn svc(name: &str, cip: &str, t: &Topo, eps: &[&str]) -> Vec<String> {
    vec![
        Svc::new(
            name,
            "ClusterIP",
            &[cip],
            vec![
                port("http", "TCP", 80, 8080),
                port("echo", "TCP", 90, ECHO_PORT),
            ],
        )
        .yaml(),
        slice(
            name,
            "v4",
            false,
            &[("http", "TCP", 8080), ("echo", "TCP", ECHO_PORT)],
            &t.eps(eps, false),
        ),
    ]
}

#[test]
fn run_mode_incremental_updates() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    t.add_pod("r", Where::Remote);
    let a = t.pod("a").ns.clone();
    let s1 = sa(ip("10.96.0.40"), 80);
    let s2 = sa(ip("10.96.0.41"), 80);
    let s3 = sa(ip("10.96.0.42"), 80);
    let mut p = Proxy::new(&t, BIN);
    p.write(&cluster(&svc("s1", "10.96.0.40", &t, &["b"])));
    p.start();
    let mut c = Checks::default();
    c.run("run mode: initial sync serves s1", || {
        assert!(
            eventually(WAIT, || tcp(&a, s1, SHORT).is_ok()),
            "s1 never worked; log:\n{}",
            p.log()
        );
    });
    let running = p.running();
    c.run("run mode: process stays up", || {
        assert!(running, "kube-nlproxy run exited; log:\n{}", p.log())
    });

    let mut objs = svc("s1", "10.96.0.40", &t, &["b"]);
    objs.extend(svc("s2", "10.96.0.41", &t, &["b"]));
    objs.extend(svc("s3", "10.96.0.42", &t, &[]));
    p.write(&cluster(&objs));
    c.run("run mode: add a service -> traffic starts", || {
        assert!(
            eventually(WAIT, || tcp(&a, s2, SHORT).is_ok()),
            "s2 never worked"
        );
        expect_err("s3 empty", tcp(&a, s3, OK_TIMEOUT), ConnErr::Refused);
    });

    let mut objs = svc("s1", "10.96.0.40", &t, &["r"]);
    objs.extend(svc("s2", "10.96.0.41", &t, &["b"]));
    objs.extend(svc("s3", "10.96.0.42", &t, &[]));
    p.write(&cluster(&objs));
    c.run("run mode: change endpoints -> traffic follows", || {
        assert!(
            eventually(WAIT, || (0..5)
                .all(|_| tcp(&a, s1, SHORT).is_ok_and(|r| r.pod == "r"))),
            "s1 never moved to r"
        );
    });

    let mut objs = svc("s1", "10.96.0.40", &t, &["r"]);
    objs.extend(svc("s3", "10.96.0.42", &t, &["b"]));
    p.write(&cluster(&objs));
    c.run("run mode: remove a service -> not served after", || {
        assert!(
            eventually(WAIT, || tcp(&a, s2, SHORT).is_err()),
            "s2 still served after removal"
        );
        // 10.96.0.41 is now an unallocated IP in the ServiceCIDR -> drop.
        let r = tcp(&a, s2, SHORT);
        assert!(
            matches!(r, Err(ConnErr::Timeout) | Err(ConnErr::Refused)),
            "{r:?}"
        );
    });
    c.run("run mode: 0 -> 1 endpoints (refused -> works)", || {
        assert!(
            eventually(WAIT, || tcp(&a, s3, SHORT).is_ok_and(|r| r.pod == "b")),
            "s3 never worked"
        );
    });
    c.run("run mode: still running at the end", || {
        assert!(p.running(), "exited; log:\n{}", p.log())
    });
    c.finish();
}

#[test]
fn restart_keeps_live_connection_and_cleanup() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("r", Where::Remote);
    let a = t.pod("a").clone();
    let mut p = Proxy::new(&t, BIN);
    let mut objs = svc("echo", "10.96.0.50", &t, &["r"]);
    objs.push(
        Svc::new(
            "v6",
            "ClusterIP",
            &["fd96::50"],
            vec![port("http", "TCP", 80, 8080)],
        )
        .yaml(),
    );
    objs.push(slice(
        "v6",
        "v6",
        true,
        &[("http", "TCP", 8080)],
        &t.eps(&["r"], true),
    ));
    p.write(&cluster(&objs));
    let mut c = Checks::default();
    p.start();
    c.run("restart: live TCP connection survives a restart", || {
        let dst = sa(ip("10.96.0.50"), 90);
        assert!(
            eventually(WAIT, || tcp(&a.ns, sa(ip("10.96.0.50"), 80), SHORT).is_ok()),
            "never served; log:\n{}",
            p.log()
        );
        let mut s = tcp_stream(&a.ns, dst, OK_TIMEOUT).expect("connect echo");
        let greet = read_line(&mut s).unwrap();
        assert!(greet.starts_with("r "), "{greet}");
        assert_eq!(echo_roundtrip(&mut s, "one").unwrap(), "one");
        p.stop();
        assert_eq!(echo_roundtrip(&mut s, "two").expect("after stop"), "two");
        p.start();
        // Let it sync (table present and services served), then talk again.
        assert!(
            eventually(WAIT, || tcp(&a.ns, sa(ip("10.96.0.50"), 80), SHORT).is_ok()),
            "not served after restart"
        );
        std::thread::sleep(Duration::from_millis(1000));
        assert_eq!(
            echo_roundtrip(&mut s, "three").expect("after restart"),
            "three"
        );
        p.stop();
        p.sync();
        assert_eq!(
            echo_roundtrip(&mut s, "four").expect("after --once"),
            "four"
        );
    });
    p.stop();
    c.run("cleanup removes both tables and nothing else", || {
        p.sync();
        sh(&[
            "ip", "netns", "exec", &t.node, "nft", "add", "table", "ip", "other",
        ]);
        sh(&[
            "ip", "netns", "exec", &t.node, "nft", "add", "chain", "ip", "other", "c",
        ]);
        assert!(
            p.table().is_some() && p.table6().is_some(),
            "tables missing before cleanup: {}",
            nft_tables(&t.node)
        );
        let out = p.cleanup();
        assert!(
            out.status.success(),
            "cleanup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(p.table().is_none(), "ip kube-nlproxy still present");
        assert!(p.table6().is_none(), "ip6 kube-nlproxy still present");
        let other = nft_table(&t.node, "ip", "other").expect("foreign table ip other was removed");
        assert!(other.contains("chain c"), "foreign chain gone: {other}");
        // And the service no longer works (no DNAT): the VIP is not answered.
        let r = tcp(&a.ns, sa(ip("10.96.0.50"), 80), SHORT);
        assert!(r.is_err(), "service still answered after cleanup: {r:?}");
    });
    c.finish();
}

fn sticky(t: &Topo, eps: &[&str]) -> Vec<String> {
    vec![
        Svc {
            affinity: true,
            ..Svc::new(
                "sticky",
                "ClusterIP",
                &["10.96.0.60"],
                vec![port("http", "TCP", 80, 8080)],
            )
        }
        .yaml(),
        slice(
            "sticky",
            "v4",
            false,
            &[("http", "TCP", 8080)],
            &t.eps(eps, false),
        ),
    ]
}

/// A client's affinity entry must never lead to an endpoint the service lost,
/// even while that pod still answers: the next connection picks a current one.
#[test]
fn affinity_follows_endpoint_removal() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    t.add_pod("r", Where::Remote);
    let a = t.pod("a").ns.clone();
    let dst = sa(ip("10.96.0.60"), 80);
    let mut p = Proxy::new(&t, BIN);
    p.write(&cluster(&sticky(&t, &["b", "r"])));
    p.start();
    let mut c = Checks::default();
    let mut first = String::new();
    c.run("affinity: 10 connects, one backend", || {
        assert!(
            eventually(WAIT, || tcp(&a, dst, SHORT).is_ok()),
            "never served; log:\n{}",
            p.log()
        );
        let (pods, _) = spread(&a, dst, 10).unwrap_or_else(|e| panic!("affinity: {e}"));
        assert_eq!(pods.len(), 1, "hit {pods:?}");
        first = pods.into_iter().next().unwrap();
    });
    let other = if first == "b" { "r" } else { "b" };
    p.write(&cluster(&sticky(&t, &[other])));
    c.run(
        "affinity: the chosen endpoint goes, the client moves on",
        || {
            assert!(
                eventually(WAIT, || tcp(&a, dst, SHORT).is_ok_and(|r| r.pod == other)),
                "never moved to {other}; log:\n{}",
                p.log()
            );
            let (pods, _) = spread(&a, dst, 10).unwrap_or_else(|e| panic!("affinity: {e}"));
            assert_eq!(
                pods.into_iter().collect::<Vec<_>>(),
                vec![other.to_string()],
                "a removed endpoint still gets traffic"
            );
        },
    );
    c.run(
        "affinity: the removed endpoint comes back, the client stays",
        || {
            p.write(&cluster(&sticky(&t, &["b", "r"])));
            std::thread::sleep(Duration::from_secs(2));
            let (pods, _) = spread(&a, dst, 10).unwrap_or_else(|e| panic!("affinity: {e}"));
            assert_eq!(
                pods.into_iter().collect::<Vec<_>>(),
                vec![other.to_string()]
            );
        },
    );
    c.finish();
}

/// A node upgraded from the chain layout of earlier versions (per-service chains
/// behind a `service-ips` verdict map) moves to the element layout in one
/// transaction: a live connection keeps flowing, new ones are served.
#[test]
fn upgrade_from_the_chain_layout_keeps_live_connections() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("r", Where::Remote);
    let a = t.pod("a").clone();
    let r = t.pod("r").v4;
    let old = format!(
        "table ip kube-nlproxy {{
  map service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict;
    elements = {{ 10.96.0.70 . tcp . 80 : goto service-echo, 10.96.0.70 . tcp . 90 : goto service-echo-90 }} }}
  chain services {{ ip daddr . meta l4proto . th dport vmap @service-ips; }}
  chain service-echo {{ goto endpoint-echo; }}
  chain service-echo-90 {{ goto endpoint-echo-90; }}
  chain endpoint-echo {{ meta l4proto tcp dnat to {r}:8080; }}
  chain endpoint-echo-90 {{ meta l4proto tcp dnat to {r}:{ECHO_PORT}; }}
  chain nat-prerouting {{ type nat hook prerouting priority dstnat; jump services; }}
  chain nat-output {{ type nat hook output priority -100; jump services; }}
}}
"
    );
    let file = std::env::temp_dir().join(format!("knp-old-layout-{}.nft", std::process::id()));
    std::fs::write(&file, old).unwrap();
    sh(&[
        "ip",
        "netns",
        "exec",
        &t.node,
        "nft",
        "-f",
        file.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&file);
    let mut c = Checks::default();
    let p = Proxy::new(&t, BIN);
    p.write(&cluster(&svc("echo", "10.96.0.70", &t, &["r"])));
    c.run(
        "upgrade: old layout serves, then the new one takes over",
        || {
            let mut s = tcp_stream(&a.ns, sa(ip("10.96.0.70"), 90), OK_TIMEOUT)
                .expect("connect through the old layout");
            let greet = read_line(&mut s).unwrap();
            assert!(greet.starts_with("r "), "{greet}");
            assert_eq!(echo_roundtrip(&mut s, "old").unwrap(), "old");
            p.sync();
            let table = p.table().expect("table after the upgrade");
            assert!(
                table.contains("classes-ips") && !table.contains("service-echo"),
                "not the element layout:\n{table}"
            );
            assert_eq!(
                echo_roundtrip(&mut s, "new").expect("live connection after the upgrade"),
                "new"
            );
            let reply = tcp(&a.ns, sa(ip("10.96.0.70"), 80), OK_TIMEOUT).expect("new connection");
            assert_eq!(reply.pod, "r");
        },
    );
    c.finish();
}

/// 1 100 services × 2 endpoints: the endpoint map holds more than
/// `LOOKUP_FROM` elements, so `--once` reads it back by looking each element
/// up (the kernel answers each), exits 0, and real connections reach both
/// backends of services across the table; a second `--once` over the
/// existing table changes nothing and reads back the same way.
#[test]
fn a_big_table_is_read_back_by_lookup() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    t.add_pod("r", Where::Remote);
    let a = t.pod("a").ns.clone();
    let cip = |i: usize| format!("10.96.{}.{}", 4 + i / 250, 1 + i % 250);
    let mut objs = Vec::new();
    for i in 0..1100 {
        objs.extend(svc(&format!("s{i}"), &cip(i), &t, &["b", "r"]));
    }
    let p = Proxy::new(&t, BIN);
    p.write(&cluster(&objs));
    let mut c = Checks::default();
    for round in ["cold start", "over the existing table"] {
        let out = p.once_logging("kube_nlproxy=debug");
        let log = String::from_utf8_lossy(&out.stderr);
        c.run(
            &format!("big table {round}: --once matches by lookup"),
            || {
                assert!(
                    out.status.success(),
                    "--once failed ({}):\n{log}",
                    out.status
                );
                assert!(
                    log.lines()
                        .any(|l| l.contains("read back by lookup") && l.contains("endpoints-ips")),
                    "no lookup read-back in the log:\n{log}"
                );
            },
        );
    }
    for i in [0, 549, 1099] {
        let vip = sa(ip(&cip(i)), 80);
        c.run(
            &format!("big table: service {i} reaches both backends"),
            || {
                let mut seen = std::collections::BTreeSet::new();
                for _ in 0..40 {
                    if let Ok(reply) = tcp(&a, vip, SHORT) {
                        seen.insert(reply.pod);
                    }
                    if seen.len() == 2 {
                        break;
                    }
                }
                assert_eq!(seen, ["b".to_string(), "r".to_string()].into(), "{vip}");
            },
        );
    }
    c.finish();
}
