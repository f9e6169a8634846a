//! Replacing the real kube-proxy (v1.37.2, `testenv/`) on a live node, and rolling
//! back, with real connections throughout: in nftables mode, and in iptables mode
//! over iptables-nft and over iptables-legacy.
//!
//! kube-proxy serves a ClusterIP and a NodePort; a client pod opens a new TCP
//! connection to the ClusterIP every 50 ms, an external client does the same to the
//! NodePort, and one long-lived connection stays open. kube-proxy is stopped as a
//! DaemonSet rollout stops it (SIGTERM, no cleanup) and kube-nlproxy starts. Then:
//! - no new connection failed during the switch (the counts are printed);
//! - the long-lived connection still answers;
//! - kube-proxy's state is gone after our first sync, and everything else in its
//!   tables is still there;
//! - an endpoint moves: no new connection reaches the old one;
//! - rollback: kube-proxy starts again (it serves, its chains registered last), we
//!   stop, `kube-nlproxy cleanup` removes ours, and no new connection failed.
//!
//! Needs root. The tests of this file run one at a time.
mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::cluster::{IptablesBackend, RealCluster, RealKubeProxy};
use common::*;
use kube_nlproxy_netlink::xtables::is_kube_proxy_chain;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const API_ADDR: &str = "10.77.0.254";
const CLUSTER_CIDR: &str = "10.244.0.0/16,fd44::/16";
const NODE_PORT: u16 = 30080;
const READY: Duration = Duration::from_secs(90);
/// A rule of someone else's in kube-proxy's iptables tables: it must survive.
const OTHER_CHAIN: &str = "OTHER-FW";

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum KubeProxyMode {
    Nftables,
    Iptables(IptablesBackend),
}

impl KubeProxyMode {
    fn flag(self) -> &'static str {
        match self {
            KubeProxyMode::Nftables => "nftables",
            KubeProxyMode::Iptables(_) => "iptables",
        }
    }

    fn backend(self) -> Option<IptablesBackend> {
        match self {
            KubeProxyMode::Nftables => None,
            KubeProxyMode::Iptables(b) => Some(b),
        }
    }

    /// kube-proxy's objects in the node namespace, as the oracle (`nft`,
    /// `iptables-*-save`) prints them: its tables, or its chains.
    fn state(self, node: &str) -> Vec<String> {
        match self {
            KubeProxyMode::Nftables => {
                let out = output_text(&nsexec(node, &["nft", "list", "tables"]));
                out.lines()
                    .filter(|l| l.ends_with(" kube-proxy"))
                    .map(str::to_string)
                    .collect()
            }
            KubeProxyMode::Iptables(backend) => {
                let save = self.save(node, backend);
                save.lines()
                    .filter_map(|l| l.strip_prefix(':'))
                    .filter_map(|l| l.split_whitespace().next())
                    .filter(|c| is_kube_proxy_chain(c))
                    .map(str::to_string)
                    .collect()
            }
        }
    }

    /// `iptables-{nft,legacy}-save` and the ip6 one, concatenated.
    fn save(self, node: &str, backend: IptablesBackend) -> String {
        let b = match backend {
            IptablesBackend::Nft => "nft",
            IptablesBackend::Legacy => "legacy",
        };
        let mut s = String::new();
        for base in ["iptables", "ip6tables"] {
            s += &output_text(&nsexec(node, &[&format!("{base}-{b}-save")]));
        }
        s
    }
}

/// New TCP connections from `ns` to `dst` every 50 ms until stopped: which pod
/// answered each, or the error.
struct Traffic {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<(Duration, Res)>>,
}

impl Traffic {
    fn start(ns: &str, dst: SocketAddr) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let ns = ns.to_string();
        let handle = thread::spawn(move || {
            let start = Instant::now();
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                out.push((start.elapsed(), tcp(&ns, dst, Duration::from_secs(1))));
                if let Some(rest) = Duration::from_millis(50).checked_sub(t.elapsed()) {
                    thread::sleep(rest);
                }
            }
            out
        });
        Traffic { stop, handle }
    }

    /// Stops; the answers per pod and the failures.
    fn finish(self) -> (BTreeMap<String, usize>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let results = self.handle.join().expect("traffic thread");
        let mut by_pod = BTreeMap::new();
        let mut failed = Vec::new();
        for (at, r) in results {
            match r {
                Ok(reply) => *by_pod.entry(reply.pod).or_insert(0) += 1,
                Err(e) => failed.push(format!("at {at:?}: {e:?}")),
            }
        }
        (by_pod, failed)
    }
}

fn web_service() -> String {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "type": "NodePort",
            "selector": {"app": "web"},
            "ports": [
                {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080,
                 "nodePort": NODE_PORT},
                {"name": "echo", "protocol": "TCP", "port": 9000, "targetPort": ECHO_PORT},
            ],
        },
    })
    .to_string()
}

/// Our proxy, its servers on ports kube-proxy does not use (both run at once
/// during the rollback).
fn nlproxy(t: &Topo, k: &RealCluster) -> Proxy {
    let mut p = Proxy::new(t, BIN).with_kube_source(&k.nlproxy_kubeconfig());
    p.args = [
        "--cluster-cidr",
        CLUSTER_CIDR,
        "--detect-local-mode",
        "ClusterCIDR",
        "--healthz-bind-address",
        "127.0.0.1:10266",
        "--metrics-bind-address",
        "127.0.0.1:10259",
    ]
    .map(String::from)
    .to_vec();
    p
}

fn answered_by(ns: &str, dst: SocketAddr, pod: &str) -> bool {
    matches!(tcp(ns, dst, Duration::from_secs(1)), Ok(r) if r.pod == pod)
}

fn takeover(mode: KubeProxyMode) {
    let _serial = serial();
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Remote);
    ipn(
        &t.lan,
        &["addr", "add", &format!("{API_ADDR}/24"), "dev", "br0"],
    );
    let k = RealCluster::up(&t.lan, API_ADDR, &[]);
    k.create_node(NODE, NODE_V4, NODE_V6, None);
    k.create_node(REMOTE, REMOTE_V4, REMOTE_V6, None);
    k.apply(&web_service());
    k.create_pod(t.pod("a"));
    let cluster_ip: IpAddr = k
        .kubectl(&["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"])
        .trim()
        .parse()
        .unwrap();
    let client = t.pod("client").ns.clone();
    let cluster = SocketAddr::new(cluster_ip, 80);
    let node_port = SocketAddr::new(NODE_V4.into(), NODE_PORT);
    let bins = RealCluster::components_dir();

    // Someone else's rule in kube-proxy's iptables tables: it must stay.
    if let KubeProxyMode::Iptables(backend) = mode {
        let cmd = match backend {
            IptablesBackend::Nft => "iptables-nft",
            IptablesBackend::Legacy => "iptables-legacy",
        };
        for args in [
            vec![cmd, "-t", "filter", "-N", OTHER_CHAIN],
            vec![
                cmd,
                "-t",
                "filter",
                "-A",
                OTHER_CHAIN,
                "-s",
                "192.0.2.1",
                "-j",
                "DROP",
            ],
            vec![cmd, "-t", "filter", "-A", "INPUT", "-j", OTHER_CHAIN],
        ] {
            let out = nsexec(&t.node, &args);
            assert!(out.status.success(), "{args:?}: {out:?}");
        }
    }

    // kube-proxy serves.
    let mut kube_proxy = RealKubeProxy::start(
        &bins,
        &t.node,
        &k.kube_proxy_args(mode.flag(), CLUSTER_CIDR),
        mode.backend(),
    );
    assert!(
        eventually(READY, || answered_by(&client, cluster, "a")
            && answered_by(&t.ext, node_port, "a")),
        "kube-proxy ({mode:?}) does not serve the ClusterIP and the NodePort; its log:\n{}",
        kube_proxy.log()
    );
    assert!(
        !mode.state(&t.node).is_empty(),
        "no kube-proxy state to take over"
    );
    let mut long_lived = tcp_stream(&client, SocketAddr::new(cluster_ip, 9000), OK_TIMEOUT)
        .expect("long-lived connection");
    let greeting = read_line(&mut long_lived).expect("the echo server's greeting");
    assert!(greeting.starts_with("a "), "{greeting}");
    // Long enough for the switch and the rollback.
    long_lived.set_read_timeout(Some(OK_TIMEOUT)).unwrap();
    assert_eq!(echo_roundtrip(&mut long_lived, "before").unwrap(), "before");

    // The switch, under traffic: SIGTERM as a rollout stops it, then we start.
    let inside = Traffic::start(&client, cluster);
    let outside = Traffic::start(&t.ext, node_port);
    thread::sleep(Duration::from_millis(500));
    kube_proxy.terminate();
    let mut ours = nlproxy(&t, &k);
    ours.start();
    assert!(
        eventually(READY, || ours.log().contains("sync: committed")),
        "no first sync; log:\n{}",
        ours.log()
    );
    assert!(
        eventually(Duration::from_secs(10), || mode.state(&t.node).is_empty()),
        "kube-proxy's state is still there after our first sync: {:?}\nlog:\n{}",
        mode.state(&t.node),
        ours.log()
    );
    thread::sleep(Duration::from_secs(2));
    let (inside_ok, inside_failed) = inside.finish();
    let (outside_ok, outside_failed) = outside.finish();
    println!(
        "takeover from kube-proxy {mode:?}: ClusterIP {inside_ok:?}, {} failed; \
         NodePort {outside_ok:?}, {} failed",
        inside_failed.len(),
        outside_failed.len()
    );
    assert!(
        inside_failed.is_empty() && outside_failed.is_empty(),
        "connections failed during the switch:\n  ClusterIP: {inside_failed:?}\n  \
         NodePort: {outside_failed:?}\nlog:\n{}",
        ours.log()
    );
    assert!(
        inside_ok.values().sum::<usize>() >= 20,
        "too few connections"
    );
    assert_eq!(
        echo_roundtrip(&mut long_lived, "after").expect("the long-lived connection"),
        "after"
    );
    assert!(
        ours.log().contains("removed kube-proxy's state"),
        "no removal logged:\n{}",
        ours.log()
    );
    if let KubeProxyMode::Iptables(backend) = mode {
        let save = mode.save(&t.node, backend);
        assert!(
            save.contains(&format!("-A INPUT -j {OTHER_CHAIN}"))
                && save.contains(&format!("-A {OTHER_CHAIN} -s 192.0.2.1/32 -j DROP")),
            "someone else's rules went too:\n{save}"
        );
    }

    // An endpoint moves: no new connection reaches the old one.
    k.create_pod(t.pod("b"));
    k.set_pod_ready(t.pod("a"), false);
    // Settled when ten new connections in a row reach b (a is not ready, b is).
    assert!(
        eventually(Duration::from_secs(30), || (0..10).all(|_| {
            answered_by(&client, cluster, "b") && answered_by(&t.ext, node_port, "b")
        })),
        "the endpoint did not move; log:\n{}",
        ours.log()
    );
    for _ in 0..20 {
        for (ns, dst) in [(&client, cluster), (&t.ext, node_port)] {
            let r = tcp(ns, dst, OK_TIMEOUT);
            assert!(matches!(&r, Ok(rep) if rep.pod == "b"), "{dst}: {r:?}");
        }
    }

    // Rollback: kube-proxy again (its chains registered after ours run first),
    // then we stop and remove ours.
    let inside = Traffic::start(&client, cluster);
    let outside = Traffic::start(&t.ext, node_port);
    let kube_proxy = RealKubeProxy::start(
        &bins,
        &t.node,
        &k.kube_proxy_args(mode.flag(), CLUSTER_CIDR),
        mode.backend(),
    );
    // kube-proxy's /healthz is 200 before its first sync: what says it has
    // programmed the node is its last-sync timestamp (docs/migration.md).
    let metrics: SocketAddr = "127.0.0.1:10249".parse().unwrap();
    assert!(
        eventually(READY, || http_get(&t.node, metrics, "/metrics").is_ok_and(
            |(_, text)| text.lines().any(|l| {
                l.starts_with("kubeproxy_sync_proxy_rules_last_timestamp_seconds")
                    && l.rsplit(' ').next().is_some_and(|v| v != "0")
            })
        )),
        "kube-proxy has not synced again; its log:\n{}",
        kube_proxy.log()
    );
    // A kube-proxy beside us is reported as soon as the nf_tables generation
    // moves (iptables-legacy has none: the periodic sync finds it).
    if mode != KubeProxyMode::Iptables(IptablesBackend::Legacy) {
        assert!(
            eventually(Duration::from_secs(5), || ours
                .log()
                .contains("kube-proxy's state appeared")),
            "a kube-proxy running beside us is not reported; log:\n{}",
            ours.log()
        );
    }
    ours.stop();
    let out = ours.cleanup();
    assert!(out.status.success(), "cleanup: {out:?}");
    assert!(ours.table().is_none(), "our table is still there");
    thread::sleep(Duration::from_secs(2));
    let (inside_ok, inside_failed) = inside.finish();
    let (outside_ok, outside_failed) = outside.finish();
    println!(
        "rollback to kube-proxy {mode:?}: ClusterIP {inside_ok:?}, {} failed; \
         NodePort {outside_ok:?}, {} failed",
        inside_failed.len(),
        outside_failed.len()
    );
    assert!(
        inside_failed.is_empty() && outside_failed.is_empty(),
        "connections failed during the rollback:\n  ClusterIP: {inside_failed:?}\n  \
         NodePort: {outside_failed:?}\nkube-proxy's log:\n{}",
        kube_proxy.log()
    );
    assert!(answered_by(&client, cluster, "b") && answered_by(&t.ext, node_port, "b"));
    assert_eq!(
        echo_roundtrip(&mut long_lived, "rolled back").unwrap(),
        "rolled back"
    );
    drop(kube_proxy);
}

#[test]
fn takeover_from_kube_proxy_nftables_mode() {
    takeover(KubeProxyMode::Nftables);
}

#[test]
fn takeover_from_kube_proxy_iptables_mode_over_iptables_nft() {
    takeover(KubeProxyMode::Iptables(IptablesBackend::Nft));
}

#[test]
fn takeover_from_kube_proxy_iptables_mode_over_iptables_legacy() {
    takeover(KubeProxyMode::Iptables(IptablesBackend::Legacy));
}
