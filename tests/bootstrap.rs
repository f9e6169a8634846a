//! A node's proxy bootstraps without the Service network, against the real control
//! plane of `testenv/` (`scripts/cluster`, kube-apiserver on 10.77.0.254 in the LAN
//! namespace):
//! - the API server is down when the proxy starts and comes up 20 s later: the
//!   proxy waits (it never exits; `/livez` 200, `/healthz` 503 meanwhile) and
//!   programs the node without a restart;
//! - with `deploy/`'s kubeconfig (the control-plane endpoint, the ServiceAccount's
//!   CA and token), on a node where the `kubernetes` Service's ClusterIP leads
//!   nowhere until a proxy programs it, the proxy programs it, and a connection to
//!   the ClusterIP reaches the API server.
//!
//! Needs root. The tests of this file run one at a time.
mod common;

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::{RealCluster, kubernetes_livez};
use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const API_ADDR: &str = "10.77.0.254";
/// The watcher's backoff (up to 30 s) and a full start.
const PROGRAMMED: Duration = Duration::from_secs(90);
const DEPLOY: &str = include_str!("../deploy/kube-nlproxy.yaml");

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The topology and a control plane in its LAN namespace, with our Node.
fn cluster() -> (RealCluster, Topo) {
    let t = Topo::new();
    ipn(
        &t.lan,
        &["addr", "add", &format!("{API_ADDR}/24"), "dev", "br0"],
    );
    let k = RealCluster::up(&t.lan, API_ADDR, &[]);
    k.create_node(NODE, NODE_V4, NODE_V6, None);
    (k, t)
}

fn health(node_ns: &str, path: &str) -> Option<u16> {
    let addr: SocketAddr = "127.0.0.1:10256".parse().unwrap();
    http_get(node_ns, addr, path).ok().map(|(code, _)| code)
}

#[test]
fn api_server_down_at_start_then_up_programs_the_node_without_a_restart() {
    let _serial = serial();
    let (k, t) = cluster();
    let cluster_ip = k.kubernetes_cluster_ip();
    k.stop("kube-apiserver");
    let mut proxy = Proxy::new(&t, BIN).with_kube_source(&k.nlproxy_kubeconfig());
    let started = Instant::now();
    proxy.start();
    let pid = proxy.pid().expect("started");

    // Waiting for the API server: alive, not ready, nothing programmed.
    assert!(
        eventually(Duration::from_secs(10), || health(&t.node, "/livez")
            == Some(200)),
        "/livez does not answer 200 while the API server is down; log:\n{}",
        proxy.log()
    );
    assert_eq!(health(&t.node, "/healthz"), Some(503), "{}", proxy.log());
    assert!(proxy.table().is_none(), "programmed before any sync");

    // The API server comes up 20 s after the proxy.
    thread::sleep(Duration::from_secs(20).saturating_sub(started.elapsed()));
    assert!(proxy.running(), "the proxy exited:\n{}", proxy.log());
    assert_eq!(health(&t.node, "/healthz"), Some(503));
    k.start(&[]);
    let up = Instant::now();
    assert!(
        eventually(PROGRAMMED, || kubernetes_livez(&t.node, &cluster_ip)
            .is_some()),
        "the kubernetes Service is not programmed {PROGRAMMED:?} after the API server \
         came up; log:\n{}\n{}",
        proxy.log(),
        k.logs()
    );
    println!("programmed {:?} after the API server came up", up.elapsed());
    assert_eq!(proxy.pid(), Some(pid), "the proxy restarted");
    assert!(proxy.running());
    assert!(
        eventually(Duration::from_secs(5), || health(&t.node, "/healthz")
            == Some(200)),
        "/healthz is not 200 after the first sync"
    );
    let log = proxy.log();
    assert!(
        log.contains("cannot reach the API server yet"),
        "no retry warning in the log:\n{log}"
    );
}

#[test]
fn deploy_kubeconfig_reaches_the_api_at_its_endpoint_and_programs_the_kubernetes_service() {
    let _serial = serial();
    let (k, t) = cluster();
    let cluster_ip = k.kubernetes_cluster_ip();
    // Nothing leads to the ClusterIP before a proxy programs it.
    assert_eq!(kubernetes_livez(&t.node, &cluster_ip), None);

    // deploy/'s kubeconfig.conf, with its one value to set (the endpoint) set, and
    // the ServiceAccount's files where this test keeps them instead of the pod's
    // /var/run/secrets/kubernetes.io/serviceaccount.
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(DEPLOY).unwrap();
    let configmap = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("deploy/ has a ConfigMap");
    let template = configmap["data"]["kubeconfig.conf"].as_str().unwrap();
    let endpoint = format!("https://{API_ADDR}:{}", k.port("apiserver"));
    let kubeconfig = template
        .replace("https://control-plane.example:6443", &endpoint)
        .replace(
            "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
            &k.dir.join("pki/ca.crt").display().to_string(),
        )
        .replace(
            "/var/run/secrets/kubernetes.io/serviceaccount/token",
            &k.nlproxy_token_file().display().to_string(),
        );
    assert!(
        kubeconfig.contains(&endpoint),
        "the endpoint value is gone:\n{template}"
    );
    let path = k.dir.join("deploy.kubeconfig");
    std::fs::write(&path, kubeconfig).unwrap();

    let mut proxy = Proxy::new(&t, BIN).with_kube_source(&path);
    proxy.start();
    assert!(
        eventually(PROGRAMMED, || kubernetes_livez(&t.node, &cluster_ip)
            .is_some()),
        "the kubernetes Service is not programmed; log:\n{}",
        proxy.log()
    );
    let code = kubernetes_livez(&t.node, &cluster_ip).unwrap();
    println!("https://{cluster_ip}:443/livez through our rules: HTTP {code}");
    assert!(proxy.running());
}
