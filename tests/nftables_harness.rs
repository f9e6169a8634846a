//! Harness self-test: the topology carries traffic without the proxy.
mod common;
use common::*;

#[test]
fn harness_direct_pod_traffic() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    t.add_pod("r", Where::Remote);
    let a = t.pod("a").clone();
    for v6 in [false, true] {
        for target in ["b", "r"] {
            let p = t.pod(target).clone();
            for proto in [Proto::Tcp, Proto::Udp] {
                let what = format!("a -> {target} {proto:?} v6={v6}");
                let rep = expect_ok(
                    &what,
                    request(&a.ns, proto, sa(p.ip(v6), 8080), OK_TIMEOUT),
                    &[target],
                );
                assert_eq!(rep.src, a.ip(v6), "{what}: source");
            }
            if t.sctp {
                let rep = expect_ok(
                    "sctp",
                    request(&a.ns, Proto::Sctp, sa(p.ip(v6), 8081), OK_TIMEOUT),
                    &[target],
                );
                assert_eq!(rep.src, a.ip(v6));
            }
        }
        // EXT reaches node IP; pod reaches remote node; closed port refused.
        let node = if v6 { ip("fd77::1") } else { ip("10.77.0.1") };
        expect_err(
            "closed port",
            tcp(&t.ext, sa(node, 1), OK_TIMEOUT),
            ConnErr::Refused,
        );
        // EXT has no route to the pod ranges (it is off-cluster).
        expect_err(
            "ext -> pod",
            tcp(&t.ext, sa(t.pod("r").ip(v6), 8080), OK_TIMEOUT),
            ConnErr::Unreachable,
        );
    }
    // Echo server keeps the connection open.
    let mut s = tcp_stream(&a.ns, sa(t.pod("r").v4, ECHO_PORT), OK_TIMEOUT).unwrap();
    let greet = read_line(&mut s).unwrap();
    assert!(greet.starts_with("r "), "{greet}");
    assert_eq!(echo_roundtrip(&mut s, "ping").unwrap(), "ping");
    assert_eq!(echo_roundtrip(&mut s, "pong").unwrap(), "pong");
    // Unused port on a pod: TCP refused, UDP refused (ICMP port unreachable).
    expect_err(
        "tcp closed",
        tcp(&a.ns, sa(t.pod("b").v4, 7), OK_TIMEOUT),
        ConnErr::Refused,
    );
    expect_err(
        "udp closed",
        udp(&a.ns, sa(t.pod("b").v4, 7), None, OK_TIMEOUT),
        ConnErr::Refused,
    );
    // A silently discarded address times out.
    ipn(&t.node, &["route", "add", "blackhole", "10.78.0.99/32"]);
    expect_err(
        "blackhole",
        tcp(&t.ext, sa(ip("10.78.0.99"), 80), DROP_TIMEOUT),
        ConnErr::Timeout,
    );
    // YAML builders produce something.
    let y = cluster(&[Svc::new(
        "s",
        "ClusterIP",
        &["10.96.0.10"],
        vec![port("http", "TCP", 80, 8080)],
    )
    .yaml()]);
    assert!(y.contains("kind: ServiceCIDR"));
    let names: Vec<String> = t.pods.iter().map(|p| p.ns.clone()).collect();
    drop(t);
    let list = sh(&["ip", "netns", "list"]);
    for n in names {
        assert!(
            !list
                .lines()
                .any(|l| l.split_whitespace().next() == Some(n.as_str())),
            "{n} leaked"
        );
    }
}
