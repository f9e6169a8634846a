//! One scenario table, run by both modes: `--proxy-mode nftables` and
//! `--proxy-mode ipvs` must give the same answers to the same Services, with real
//! packets (VM harness: the guest kernel has IPVS, the dummy driver and SCTP).
//! Outside the VM (`KNP_VM` unset) every test writes a SKIPPED line and passes.
//!
//! Topology (tests/common): node N with local pods `a` (the client) and `b`,
//! remote node R with pod `r`, external client EXT on the LAN. Each row names a
//! client (pod `a`, the node itself, EXT), a destination, and what must happen:
//! which backends answer and which source address they see.
//!
//! * `parity_nftables`, `parity_ipvs`: externalTrafficPolicy Local with and without
//!   a local endpoint, from a pod, from the node and from outside, to the
//!   NodePort, a LoadBalancer IP and an externalIP, IPv4 and IPv6; internalTraffic
//!   Policy Local with and without a local endpoint; SCTP ClusterIP and NodePort.
//! * `ipvs_timeouts_and_affinity`: `--ipvs-*-timeout` set through the daemon,
//!   read back from the kernel (`ipvsadm -L --timeout`, IPVS_CMD_GET_CONFIG), and
//!   a ClientIP affinity of 3 s that expires after 3 s + the UDP timeout.

mod common;
use common::*;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

fn skip(test: &str) -> bool {
    skip_outside_vm("vm_parity", test)
}

const HTTP: [(&str, &str, u16); 1] = [("http", "TCP", 8080)];
const SCTP: [(&str, &str, u16); 1] = [("s", "SCTP", 8080)];

/// eTP Local with a local endpoint (b) and a remote one (r).
const ETP_CIP: [&str; 2] = ["10.96.0.40", "fd96::40"];
const ETP_EIP: [&str; 2] = ["10.78.0.40", "fd78::40"];
const ETP_LB: [&str; 2] = ["10.78.0.140", "fd78::140"];
const ETP_NP: u16 = 30140;
/// eTP Local with only a remote endpoint (r).
const NOLOCAL_CIP: [&str; 2] = ["10.96.0.41", "fd96::41"];
const NOLOCAL_EIP: [&str; 2] = ["10.78.0.41", "fd78::41"];
const NOLOCAL_LB: [&str; 2] = ["10.78.0.141", "fd78::141"];
const NOLOCAL_NP: u16 = 30141;
/// iTP Local (b local, r remote).
const ITP_CIP: [&str; 2] = ["10.96.0.42", "fd96::42"];
/// iTP Local without a local endpoint (r only).
const ITPNONE_CIP: [&str; 2] = ["10.96.0.44", "fd96::44"];
/// SCTP NodePort (b, r).
const SCTP_CIP: [&str; 2] = ["10.96.0.43", "fd96::43"];
const SCTP_NP: u16 = 30143;

fn manifests(t: &Topo) -> String {
    let lb = |name: &str, cips: [&str; 2], eips: [&str; 2], lbs: [&str; 2], np: u16| {
        Svc {
            etp: "Local".into(),
            external_ips: eips.iter().map(|s| s.to_string()).collect(),
            lb_ips: lbs.iter().map(|s| s.to_string()).collect(),
            ..Svc::new(
                name,
                "LoadBalancer",
                &cips,
                vec![nport("http", "TCP", 80, 8080, np)],
            )
        }
        .yaml()
    };
    let mut objs = vec![
        lb("etp", ETP_CIP, ETP_EIP, ETP_LB, ETP_NP),
        lb("nolocal", NOLOCAL_CIP, NOLOCAL_EIP, NOLOCAL_LB, NOLOCAL_NP),
        Svc {
            itp: "Local".into(),
            ..Svc::new(
                "itp",
                "ClusterIP",
                &ITP_CIP,
                vec![port("http", "TCP", 80, 8080)],
            )
        }
        .yaml(),
        Svc {
            itp: "Local".into(),
            ..Svc::new(
                "itpnone",
                "ClusterIP",
                &ITPNONE_CIP,
                vec![port("http", "TCP", 80, 8080)],
            )
        }
        .yaml(),
        Svc::new(
            "sctp",
            "NodePort",
            &SCTP_CIP,
            vec![nport("s", "SCTP", 80, 8080, SCTP_NP)],
        )
        .yaml(),
    ];
    for (svc, pods, ports) in [
        ("etp", &["b", "r"][..], &HTTP),
        ("nolocal", &["r"], &HTTP),
        ("itp", &["b", "r"], &HTTP),
        ("itpnone", &["r"], &HTTP),
        ("sctp", &["b", "r"], &SCTP),
    ] {
        objs.push(slice(svc, "v4", false, ports, &t.eps(pods, false)));
        objs.push(slice(svc, "v6", true, ports, &t.eps(pods, true)));
    }
    cluster(&objs)
}

/// Who sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum From {
    /// Local pod `a` (inside the cluster CIDR).
    Pod,
    /// The node's own network namespace.
    Node,
    /// EXT, outside the cluster.
    Outside,
}

/// The source address a backend must see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Src {
    /// The client's own address (not masqueraded).
    Client,
    /// One of the node's addresses (masqueraded).
    Node,
}

/// What must happen.
#[derive(Debug, Clone)]
enum Want {
    /// Answered, over several connections, by exactly these pods, each seeing `Src`.
    Answered(&'static [&'static str], Src),
    /// No answer (dropped).
    NoAnswer,
}

struct Row {
    name: String,
    from: From,
    proto: Proto,
    dst: SocketAddr,
    want: Want,
}

fn addr(pair: [&str; 2], v6: bool) -> IpAddr {
    ip(pair[usize::from(v6)])
}

fn node_ip(v6: bool) -> IpAddr {
    if v6 { NODE_V6.into() } else { NODE_V4.into() }
}

/// The scenario table: the same rows for both modes.
fn table() -> Vec<Row> {
    let mut rows = Vec::new();
    for v6 in [false, true] {
        let f = if v6 { "v6" } else { "v4" };
        let entries = |eip: [&str; 2], lb: [&str; 2], np: u16| {
            [
                ("NodePort", SocketAddr::new(node_ip(v6), np)),
                ("LB IP", SocketAddr::new(addr(lb, v6), 80)),
                ("externalIP", SocketAddr::new(addr(eip, v6), 80)),
            ]
        };
        for (entry, dst) in entries(ETP_EIP, ETP_LB, ETP_NP) {
            for (from, want) in [
                // Short-circuit: every endpoint, pods keep their address.
                (From::Pod, Want::Answered(&["b", "r"], Src::Client)),
                // Short-circuit: every endpoint, the node's own masqueraded.
                (From::Node, Want::Answered(&["b", "r"], Src::Node)),
                // From outside: the local endpoint only, client address kept.
                (From::Outside, Want::Answered(&["b"], Src::Client)),
            ] {
                rows.push(Row {
                    name: format!("{f} eTP Local {entry} from {from:?}"),
                    from,
                    proto: Proto::Tcp,
                    dst,
                    want,
                });
            }
        }
        for (entry, dst) in entries(NOLOCAL_EIP, NOLOCAL_LB, NOLOCAL_NP) {
            for (from, want) in [
                (From::Pod, Want::Answered(&["r"], Src::Client)),
                (From::Node, Want::Answered(&["r"], Src::Node)),
                (From::Outside, Want::NoAnswer),
            ] {
                rows.push(Row {
                    name: format!("{f} eTP Local, no local endpoint, {entry} from {from:?}"),
                    from,
                    proto: Proto::Tcp,
                    dst,
                    want,
                });
            }
        }
        rows.push(Row {
            name: format!("{f} iTP Local ClusterIP from Pod: the local endpoint only"),
            from: From::Pod,
            proto: Proto::Tcp,
            dst: SocketAddr::new(addr(ITP_CIP, v6), 80),
            want: Want::Answered(&["b"], Src::Client),
        });
        for from in [From::Pod, From::Node] {
            rows.push(Row {
                name: format!("{f} iTP Local ClusterIP, no local endpoint, from {from:?}: dropped"),
                from,
                proto: Proto::Tcp,
                dst: SocketAddr::new(addr(ITPNONE_CIP, v6), 80),
                want: Want::NoAnswer,
            });
        }
        rows.push(Row {
            name: format!("{f} SCTP ClusterIP from Pod"),
            from: From::Pod,
            proto: Proto::Sctp,
            dst: SocketAddr::new(addr(SCTP_CIP, v6), 80),
            want: Want::Answered(&["b", "r"], Src::Client),
        });
        rows.push(Row {
            name: format!("{f} SCTP NodePort from Outside (masqueraded)"),
            from: From::Outside,
            proto: Proto::Sctp,
            dst: SocketAddr::new(node_ip(v6), SCTP_NP),
            want: Want::Answered(&["b", "r"], Src::Node),
        });
    }
    rows
}

fn check(t: &Topo, row: &Row) {
    let v6 = row.dst.is_ipv6();
    let (ns, client) = match row.from {
        From::Pod => (t.pod("a").ns.clone(), Some(t.pod("a").ip(v6))),
        From::Node => (t.node.clone(), None),
        From::Outside => (
            t.ext.clone(),
            Some(if v6 { EXT_V6.into() } else { EXT_V4.into() }),
        ),
    };
    match &row.want {
        Want::NoAnswer => match request(&ns, row.proto, row.dst, DROP_TIMEOUT) {
            Err(ConnErr::Timeout) => {}
            other => panic!("expected no answer (dropped), got {other:?}"),
        },
        Want::Answered(pods, src) => {
            let mut seen = BTreeSet::new();
            // Enough tries that two backends both answer (rr: alternate;
            // nftables: random, 2^-11 to miss one).
            let tries = if pods.len() > 1 { 12 } else { 4 };
            for _ in 0..tries {
                let r = expect_ok(
                    &row.name,
                    request(&ns, row.proto, row.dst, OK_TIMEOUT),
                    pods,
                );
                match src {
                    Src::Client => assert_eq!(
                        Some(r.src),
                        client,
                        "backend {} saw {} (want the client's address)",
                        r.pod,
                        r.src
                    ),
                    Src::Node => assert!(
                        Topo::node_addrs(v6).contains(&r.src),
                        "backend {} saw {} (want a node address)",
                        r.pod,
                        r.src
                    ),
                }
                seen.insert(r.pod);
            }
            let want: BTreeSet<String> = pods.iter().map(|p| p.to_string()).collect();
            assert_eq!(seen, want, "backends that answered");
        }
    }
}

/// The log without terminal colour sequences (`ESC [ … m`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn topo() -> Topo {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    t.add_pod("r", Where::Remote);
    assert!(t.sctp, "the VM kernel has SCTP");
    t
}

fn run_table(mode: &str) {
    let t = topo();
    let mut args = default_args();
    args.extend(["--proxy-mode".to_string(), mode.to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = Proxy::new(&t, proxy_bin()).with_args(&args);
    p.write(&manifests(&t));
    p.sync();
    let started = Instant::now();
    let mut c = Checks::default();
    let rows = table();
    for row in &rows {
        c.run(&format!("{mode}: {}", row.name), || check(&t, row));
    }
    // Straight to stderr: libtest swallows eprintln! of passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "vm_parity {mode}: {} scenarios in {:.1} s (guest clock)",
        rows.len(),
        started.elapsed().as_secs_f64()
    );
    c.finish();
}

#[test]
fn parity_nftables() {
    if skip("parity_nftables") {
        return;
    }
    run_table("nftables");
}

#[test]
fn parity_ipvs() {
    if skip("parity_ipvs") {
        return;
    }
    run_table("ipvs");
}

/// Only the scenario table's shape (runs everywhere): both directions of every
/// eTP Local entry point, both families.
#[test]
fn table_covers_every_client_and_entry_point() {
    let rows = table();
    for v6 in [false, true] {
        for from in [From::Pod, From::Node, From::Outside] {
            let n = rows
                .iter()
                .filter(|r| r.dst.is_ipv6() == v6 && r.from == from && r.name.contains("eTP"))
                .count();
            assert_eq!(n, 6, "v6={v6} {from:?}: 3 entry points x 2 services");
        }
    }
}

#[test]
fn ipvs_timeouts_and_affinity() {
    if skip("ipvs_timeouts_and_affinity") {
        return;
    }
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    t.add_pod("r", Where::Remote);
    let mut args = default_args();
    args.extend(
        [
            "--proxy-mode",
            "ipvs",
            "--ipvs-tcp-timeout",
            "600s",
            "--ipvs-tcpfin-timeout=7s",
            "--ipvs-udp-timeout",
            "2s",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = Proxy::new(&t, proxy_bin()).with_args(&args);
    let aff = Svc {
        affinity: true,
        ..Svc::new(
            "aff",
            "ClusterIP",
            &["10.96.0.50"],
            vec![port("dns", "UDP", 53, 8080)],
        )
    }
    .yaml()
    .replace("timeoutSeconds: 10800", "timeoutSeconds: 3");
    p.write(&cluster(&[
        aff,
        slice(
            "aff",
            "v4",
            false,
            &[("dns", "UDP", 8080)],
            &t.eps(&["b", "r"], false),
        ),
    ]));
    let out = p.once();
    let log = strip_ansi(&String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{log}");
    let mut c = Checks::default();
    c.run("the daemon read the timeouts back (GET_CONFIG)", || {
        assert!(
            log.contains("\"IPVS connection timeouts set\" tcp=600 tcp_fin=7 udp=2"),
            "{log}"
        );
    });
    c.run("ipvsadm -L --timeout shows them", || {
        let o = nsexec(&t.node, &["ipvsadm", "-L", "--timeout"]);
        let s = String::from_utf8_lossy(&o.stdout);
        let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(s.contains("(tcp tcpfin udp): 600 7 2"), "{s}");
    });
    c.run("persistence 3 s on the VS", || {
        let o = nsexec(&t.node, &["ipvsadm", "-Ln"]);
        let s = String::from_utf8_lossy(&o.stdout);
        let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(s.contains("UDP 10.96.0.50:53 rr persistent 3"), "{s}");
    });
    let a = t.pod("a").clone();
    let vip = sa(ip("10.96.0.50"), 53);
    c.run(
        "affinity holds within 3 s, and expires after 3 s + the 2 s UDP timeout",
        || {
            let first = expect_ok("aff", udp(&a.ns, vip, None, OK_TIMEOUT), &["b", "r"]).pod;
            for _ in 0..5 {
                let r = expect_ok("aff", udp(&a.ns, vip, None, OK_TIMEOUT), &["b", "r"]);
                assert_eq!(r.pod, first, "affinity broken within its timeout");
            }
            // The template lives while a connection references it: the last
            // UDP "connection" expires 2 s after its packet, the template 3 s
            // after that at the latest; rr then picks the other backend.
            let expired = eventually(Duration::from_secs(12), || {
                std::thread::sleep(Duration::from_millis(500));
                let o = nsexec(&t.node, &["ipvsadm", "-Lnc"]);
                let s = String::from_utf8_lossy(&o.stdout);
                !s.contains("10.96.0.50:53")
            });
            assert!(expired, "IPVS connections and the template never expired");
            let after = expect_ok("aff", udp(&a.ns, vip, None, OK_TIMEOUT), &["b", "r"]).pod;
            assert_ne!(
                after, first,
                "a new client choice after the affinity expired"
            );
        },
    );
    c.finish();
}
