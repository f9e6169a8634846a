//! A misconfigured node is loud: a WARN at start (and again while it lasts), a line
//! in `status`, the metric `kube_nlproxy_node_problems`, and the NodePorts that
//! cannot be served named; `--once` warns too. With real packets:
//! - `--hostname-override` matching no Node: the ClusterIP is served, and with no
//!   node IP known NodePorts listen on every local address;
//! - a Node without an IPv6 address: the IPv6 NodePort is named and not served,
//!   the IPv4 one is.
//!
//! Needs root. The tests of this file run one at a time (they share ports 10249,
//! 10256 of their own namespaces only, but keep the machine's load low).
mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const WAIT: Duration = Duration::from_secs(20);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `kube_nlproxy_node_problems` from the daemon's `/metrics`.
fn node_problems(p: &Proxy) -> String {
    let metrics = sa(ip("127.0.0.1"), 10249);
    let (_, text) = http_get(&p.ns, metrics, "/metrics").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("kube_nlproxy_node_problems "))
        .unwrap_or_else(|| panic!("no kube_nlproxy_node_problems in:\n{text}"))
        .trim()
        .to_string()
}

/// No `--node-ip`: the node's addresses come from its Node object.
const NO_NODE_IP: [&str; 4] = [
    "--cluster-cidr",
    "10.244.0.0/16,fd44::/16",
    "--detect-local-mode",
    "ClusterCIDR",
];

#[test]
fn a_node_name_that_matches_no_node_is_loud() {
    let _serial = serial();
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("a", Where::Local);
    let client = t.pod("client").ns.clone();
    let svc = Svc::new(
        "web",
        "NodePort",
        &["10.96.0.80"],
        vec![nport("http", "TCP", 80, 8080, 30080)],
    );
    let objects = cluster(&[
        svc.yaml(),
        slice(
            "web",
            "v4",
            false,
            &[("http", "TCP", 8080)],
            &t.eps(&["a"], false),
        ),
    ]);
    let mut args = NO_NODE_IP.to_vec();
    args.extend(["--hostname-override", "ghost"]);
    let mut p = Proxy::new(&t, BIN).with_args(&args);
    p.write(&objects);

    let out = p.once();
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("Node ghost not found"),
        "--once is silent about the missing Node:\n{text}"
    );

    p.start();
    assert!(
        eventually(WAIT, || p.log().contains("Node ghost not found")),
        "the daemon is silent about the missing Node:\n{}",
        p.log()
    );
    assert!(
        p.log()
            .contains("with no node IP known, NodePorts listen on every local address"),
        "{}",
        p.log()
    );
    let vip = sa(ip("10.96.0.80"), 80);
    let r = tcp(&client, vip, OK_TIMEOUT);
    assert!(matches!(&r, Ok(rep) if rep.pod == "a"), "ClusterIP: {r:?}");
    let r = tcp(&t.ext, sa(NODE_V4, 30080), OK_TIMEOUT);
    assert!(matches!(&r, Ok(rep) if rep.pod == "a"), "NodePort: {r:?}");
    assert_eq!(node_problems(&p), "1");
    let status = output_text(&p.command(&["status"], &[]));
    assert!(
        status.contains("node problem:") && status.contains("ghost"),
        "{status}"
    );
}

#[test]
fn a_node_without_an_ipv6_address_names_the_ipv6_node_ports() {
    let _serial = serial();
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    let node = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE}\nstatus:\n  addresses:\n  \
         - type: InternalIP\n    address: {NODE_V4}\n"
    );
    let web = Svc::new(
        "web",
        "NodePort",
        &["10.96.0.81", "fd96::81"],
        vec![nport("http", "TCP", 80, 8080, 30081)],
    );
    let objects = docs(&[
        node,
        service_cidr(),
        web.yaml(),
        slice(
            "web",
            "v4",
            false,
            &[("http", "TCP", 8080)],
            &t.eps(&["a"], false),
        ),
        slice(
            "web",
            "v6",
            true,
            &[("http", "TCP", 8080)],
            &t.eps(&["a"], true),
        ),
    ]);
    let mut p = Proxy::new(&t, BIN).with_args(&NO_NODE_IP);
    p.write(&objects);
    p.start();
    let want = "our Node has no IPv6 address: 1 IPv6 NodePort(s) not served: \
                default/web:http/tcp (30081)";
    assert!(
        eventually(WAIT, || p.log().contains(want)),
        "the IPv6 NodePort is not named:\n{}",
        p.log()
    );
    let r = tcp(&t.ext, sa(NODE_V4, 30081), OK_TIMEOUT);
    assert!(
        matches!(&r, Ok(rep) if rep.pod == "a"),
        "IPv4 NodePort: {r:?}"
    );
    let r = tcp(&t.ext, sa(NODE_V6, 30081), Duration::from_secs(1));
    assert!(r.is_err(), "the IPv6 NodePort answered: {r:?}");
    assert_eq!(node_problems(&p), "1");
}
