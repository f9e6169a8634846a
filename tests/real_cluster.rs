//! kube-nlproxy against a real Kubernetes control plane: etcd, kube-apiserver and
//! kube-controller-manager (the real EndpointSlice controller) built from the Go
//! module proxy (`testenv/`), started by `scripts/cluster up` in the LAN namespace
//! of the test topology (kube-apiserver on 10.77.0.254, an address of the LAN
//! bridge, so the node namespace reaches it directly). The proxy (`run --source
//! kube`) runs in the node namespace with the kubeconfig of the `kube-nlproxy`
//! ServiceAccount, which has exactly the RBAC of `deploy/kube-nlproxy.yaml`.
//!
//! Objects go in through the API only: Services (ClusterIPs, NodePorts and
//! defaults from the apiserver, dual-stack), Nodes with zone labels, Pods with
//! `nodeName` whose status is patched Ready with the addresses of the test pods
//! (there is no kubelet); the EndpointSlices are the controller's. Checked with
//! real TCP/UDP from pods and from EXT: which backend answered, the source seen.
//!
//! The first run on a machine builds the components (see testenv/README.md).
//! Needs root. The tests of this file run one at a time (a process-wide lock).
mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::RealCluster;
use common::*;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
/// kube-apiserver's address: on the LAN bridge, inside the LAN namespace.
const API_ADDR: &str = "10.77.0.254";
/// API write → controller → watch → kernel.
const WAIT: Duration = Duration::from_secs(30);
/// Recovery through the watcher's backoff and a token reload (kube-rs re-reads a
/// token file at most once a minute).
const RECOVERY: Duration = Duration::from_secs(120);
const SHORT: Duration = Duration::from_millis(700);

/// kube-apiserver flags for the restart test: no endpoint reconciler, so that
/// the apiserver does not take its own address out of the `kubernetes` Service's
/// endpoints when it stops (a real change, which the test would count as a write).
const APISERVER_STILL: &[&str] = &["--endpoint-reconciler-type=none"];

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Topology, control plane and proxy; fields drop in this order: the proxy first,
/// then the control plane, the namespaces last.
struct Env {
    proxy: Proxy,
    k: RealCluster,
    t: Topo,
}

impl Env {
    /// The topology with `pods`, a control plane in the LAN namespace, the two
    /// Nodes (zones `zone-a`, `zone-b`) created; the proxy is not started.
    fn new(pods: &[(&str, Where)], apiserver_args: &[&str]) -> Env {
        let mut t = Topo::new();
        for (name, at) in pods {
            t.add_pod(name, *at);
        }
        ipn(
            &t.lan,
            &["addr", "add", &format!("{API_ADDR}/24"), "dev", "br0"],
        );
        let k = RealCluster::up(&t.lan, API_ADDR, apiserver_args);
        k.create_node(NODE, NODE_V4, NODE_V6, Some("zone-a"));
        k.create_node(REMOTE, REMOTE_V4, REMOTE_V6, Some("zone-b"));
        let proxy = Proxy::new(&t, BIN).with_kube_source(&k.nlproxy_kubeconfig());
        Env { proxy, k, t }
    }

    fn client(&self) -> String {
        self.t.pod("client").ns.clone()
    }

    fn log(&self) -> String {
        format!("proxy log:\n{}\n{}", self.proxy.log(), self.k.logs())
    }

    /// Syncs that wrote to the kernel so far.
    fn commits(&self) -> usize {
        self.proxy.log().matches("sync: committed").count()
    }

    /// A Pod object for the test pod `name` (label app=web, on its node), its
    /// status patched Running and Ready with the pod's addresses.
    fn create_pod(&self, name: &str) {
        self.k.create_pod(self.t.pod(name));
    }

    /// Patches the Pod's status: Running, Ready `ready`, the pod's two addresses.
    fn set_ready(&self, name: &str, ready: bool) {
        self.k.set_pod_ready(self.t.pod(name), ready);
    }

    /// Deletes a Pod: with a grace period (it stays, terminating, as there is no
    /// kubelet to confirm) or at once.
    fn delete_pod(&self, name: &str, graceful: bool) {
        if graceful {
            self.k
                .kubectl(&["delete", "pod", name, "--grace-period=600", "--wait=false"]);
        } else {
            self.k
                .kubectl(&["delete", "pod", name, "--grace-period=0", "--force"]);
        }
    }

    /// The Service `name` as the apiserver holds it.
    fn service(&self, name: &str) -> Value {
        serde_json::from_str(&self.k.kubectl(&["get", "service", name, "-o", "json"])).unwrap()
    }

    /// The EndpointSlices of Service `name` (the controller's).
    fn slices(&self, name: &str) -> Vec<Value> {
        let out = self.k.kubectl(&[
            "get",
            "endpointslices",
            "-l",
            &format!("kubernetes.io/service-name={name}"),
            "-o",
            "json",
        ]);
        let v: Value = serde_json::from_str(&out).unwrap();
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until `n` requests from `ns` to `dst` (TCP) are answered by exactly
    /// the backends `want` (every request answered, each of `want` seen).
    #[track_caller]
    fn wait_backends(&self, what: &str, ns: &str, dst: SocketAddr, want: &[&str]) {
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        let n = 8 * want.len().max(1);
        let mut last = None;
        let ok = eventually(WAIT, || {
            let r = spread(ns, dst, n).map(|(pods, _)| pods);
            let ok = r.as_ref().is_ok_and(|p| *p == want);
            last = Some(r);
            ok
        });
        assert!(
            ok,
            "{what}: {dst} never answered by exactly {want:?} (last: {last:?}); {}",
            self.log()
        );
    }
}

/// The ClusterIPs of a Service as the apiserver allocated them.
fn cluster_ips(svc: &Value) -> Vec<IpAddr> {
    svc["spec"]["clusterIPs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| ip(v.as_str().unwrap()))
        .collect()
}

/// Service `web`: selector app=web, TCP 80 → 8080 and UDP 81 → 8081, of `kind`,
/// with `extra` merged into the spec.
fn web(kind: &str, extra: Value) -> String {
    let mut spec = json!({
        "type": kind,
        "selector": {"app": "web"},
        "ports": [
            {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
            {"name": "dns", "protocol": "UDP", "port": 81, "targetPort": 8081},
        ],
    });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": spec,
    })
    .to_string()
}

/// A dual-stack NodePort Service and its endpoints as the real EndpointSlice
/// controller makes them from Pods: no endpoints (reject), one, scaled up to
/// three, down to two, not-ready, terminating (ready ones preferred, then the
/// serving-terminating fallback), all gone; from a pod (no masquerade) and from
/// EXT through the allocated NodePort (masqueraded).
#[test]
fn services_and_endpoints_from_the_real_control_plane() {
    let _serial = serial();
    let started = Instant::now();
    let mut e = Env::new(
        &[
            ("client", Where::Local),
            ("a", Where::Local),
            ("b", Where::Remote),
            ("c", Where::Remote),
        ],
        &[],
    );
    eprintln!("control plane up after {:?}", started.elapsed());
    e.proxy.start();
    e.k.apply(&web(
        "NodePort",
        json!({"ipFamilyPolicy": "RequireDualStack"}),
    ));

    // The apiserver allocated and defaulted.
    let svc = e.service("web");
    let ips = cluster_ips(&svc);
    assert_eq!(ips.len(), 2, "dual-stack ClusterIPs: {svc}");
    let (v4, v6) = (ips[0], ips[1]);
    assert!(v4.is_ipv4() && v4.to_string().starts_with("10.96."), "{v4}");
    assert!(v6.is_ipv6() && v6.to_string().starts_with("fd96::"), "{v6}");
    let node_port = svc["spec"]["ports"][0]["nodePort"].as_u64().unwrap() as u16;
    assert!((30000..=32767).contains(&node_port), "{node_port}");
    assert_eq!(svc["spec"]["externalTrafficPolicy"], "Cluster");
    assert_eq!(svc["spec"]["sessionAffinity"], "None");
    eprintln!("allocated: {v4}, {v6}, nodePort {node_port}");
    let client = e.client();
    let client_pod = e.t.pod("client").clone();
    let (http4, http6) = (sa(v4, 80), sa(v6, 80));

    // No endpoints yet: programmed, rejected.
    assert!(
        e.proxy.wait_table(WAIT, |t| t.contains(&v4.to_string())),
        "the Service was never programmed; {}",
        e.log()
    );
    // v1.37.2 streams lists (WatchList): the initial state came from watches.
    assert!(
        e.proxy
            .log()
            .contains("initial lists: streamed from the API server's watch cache"),
        "the initial state was not streamed; {}",
        e.log()
    );
    let ok = eventually(WAIT, || tcp(&client, http4, SHORT) == Err(ConnErr::Refused));
    assert!(
        ok,
        "no-endpoint Service not rejected: {:?}",
        tcp(&client, http4, SHORT)
    );

    // One Ready pod.
    e.create_pod("a");
    e.wait_backends("one pod, IPv4", &client, http4, &["a"]);
    e.wait_backends("one pod, IPv6", &client, http6, &["a"]);
    let r = expect_ok("from a pod, IPv4", tcp(&client, http4, OK_TIMEOUT), &["a"]);
    assert_eq!(
        r.src,
        IpAddr::from(client_pod.v4),
        "pod-to-service is not masqueraded"
    );
    let r = expect_ok("from a pod, IPv6", tcp(&client, http6, OK_TIMEOUT), &["a"]);
    assert_eq!(r.src, IpAddr::from(client_pod.v6));
    expect_ok("UDP", udp(&client, sa(v4, 81), None, OK_TIMEOUT), &["a"]);

    // Scaled up to three: local and remote pods.
    e.create_pod("b");
    e.create_pod("c");
    e.wait_backends("three pods", &client, http4, &["a", "b", "c"]);
    e.wait_backends("three pods, IPv6", &client, http6, &["a", "b", "c"]);
    // From EXT through the NodePort the apiserver chose: masqueraded to the node.
    let ext = e.t.ext.clone();
    e.wait_backends("NodePort", &ext, sa(NODE_V4, node_port), &["a", "b", "c"]);
    for _ in 0..10 {
        let r = tcp(&ext, sa(NODE_V4, node_port), OK_TIMEOUT).expect("NodePort");
        assert!(
            Topo::node_addrs(false).contains(&r.src),
            "NodePort traffic from EXT not masqueraded: {r:?}"
        );
    }

    // Scaled down.
    e.delete_pod("c", false);
    e.wait_backends("scaled down", &client, http4, &["a", "b"]);

    // Not ready: out.
    e.set_ready("b", false);
    e.wait_backends("b not ready", &client, http4, &["a"]);
    e.set_ready("b", true);
    e.wait_backends("b ready again", &client, http4, &["a", "b"]);

    // Terminating: a goes (b is ready), then b too: both terminating and still
    // serving, so the fallback serves both.
    e.delete_pod("a", true);
    e.wait_backends("a terminating", &client, http4, &["b"]);
    let terminating = e.slices("web").iter().any(|s| {
        s["endpoints"].as_array().is_some_and(|eps| {
            eps.iter().any(|ep| {
                ep["conditions"]["terminating"] == true && ep["conditions"]["serving"] == true
            })
        })
    });
    assert!(
        terminating,
        "the controller wrote no serving+terminating endpoint"
    );
    e.delete_pod("b", true);
    e.wait_backends("all terminating", &client, http4, &["a", "b"]);
    e.wait_backends("all terminating, IPv6", &client, http6, &["a", "b"]);

    // Gone: rejected again.
    e.delete_pod("a", false);
    e.delete_pod("b", false);
    let ok = eventually(WAIT, || tcp(&client, http4, SHORT) == Err(ConnErr::Refused));
    assert!(ok, "no endpoints left, not rejected; {}", e.log());

    // The Service deleted: no longer programmed.
    e.k.kubectl(&["delete", "service", "web"]);
    assert!(
        e.proxy.wait_table(WAIT, |t| !t.contains(&v4.to_string())),
        "deleted Service still programmed; {}",
        e.log()
    );
    eprintln!("took {:?}", started.elapsed());
}

/// Topology from Node zone labels: with `trafficDistribution: PreferClose` the
/// controller hints each endpoint for its zone and node-a serves only the
/// endpoints of zone-a; with none left there, all of them.
#[test]
fn topology_hints_from_node_zone_labels() {
    let _serial = serial();
    let started = Instant::now();
    let mut e = Env::new(
        &[
            ("client", Where::Local),
            ("a", Where::Local),
            ("b", Where::Remote),
        ],
        &[],
    );
    e.proxy.start();
    e.k.apply(&web(
        "ClusterIP",
        json!({"trafficDistribution": "PreferClose"}),
    ));
    let v4 = cluster_ips(&e.service("web"))[0];
    let client = e.client();
    e.create_pod("a");
    e.create_pod("b");
    let hinted = eventually(WAIT, || {
        let zones: BTreeSet<String> = e
            .slices("web")
            .iter()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .filter_map(|ep| {
                ep["hints"]["forZones"][0]["name"]
                    .as_str()
                    .map(String::from)
            })
            .collect();
        zones == BTreeSet::from(["zone-a".to_string(), "zone-b".to_string()])
    });
    assert!(
        hinted,
        "no zone hints from the controller: {:?}",
        e.slices("web")
    );
    e.wait_backends("same zone only", &client, sa(v4, 80), &["a"]);
    for _ in 0..20 {
        expect_ok("same zone", tcp(&client, sa(v4, 80), OK_TIMEOUT), &["a"]);
    }
    e.delete_pod("a", false);
    e.wait_backends("no endpoint in our zone", &client, sa(v4, 80), &["b"]);
    eprintln!("took {:?}", started.elapsed());
}

/// kube-apiserver restarted after etcd was compacted past every revision the
/// proxy's watches had seen: the resumed watches get a real 410 Gone, the
/// watchers relist, and the relist of identical objects changes nothing in the
/// kernel while traffic flows; a change made afterwards is followed.
#[test]
fn apiserver_restart_and_etcd_compaction_without_a_flap() {
    let _serial = serial();
    let started = Instant::now();
    let mut e = Env::new(
        &[
            ("client", Where::Local),
            ("a", Where::Local),
            ("b", Where::Remote),
        ],
        APISERVER_STILL,
    );
    e.proxy.start();
    e.k.apply(&web("ClusterIP", json!({})));
    let v4 = cluster_ips(&e.service("web"))[0];
    let client = e.client();
    let client_ip: IpAddr = e.t.pod("client").v4.into();
    e.create_pod("a");
    e.wait_backends("before", &client, sa(v4, 80), &["a"]);
    thread::sleep(Duration::from_secs(2));
    let old_rv = e.service("web")["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let commits = e.commits();
    let table = e.proxy.table();
    let gone_before = gone_lines(&e.proxy.log());

    let prober = Prober::start(&client, sa(v4, 80));
    // Revisions the proxy does not watch, then etcd compacted to the newest.
    for i in 0..20 {
        e.k.kubectl(&["create", "configmap", &format!("filler-{i}")]);
    }
    let etcd = format!("http://127.0.0.1:{}", e.k.port("etcd_client"));
    let curl = |path: &str, body: &str| -> Value {
        let out = nsexec(
            &e.k.netns,
            &[
                "curl",
                "-fsS",
                "-X",
                "POST",
                &format!("{etcd}{path}"),
                "-d",
                body,
            ],
        );
        assert!(out.status.success(), "etcd {path}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let rev = curl("/v3/kv/range", r#"{"key":"AA=="}"#)["header"]["revision"]
        .as_str()
        .unwrap()
        .to_string();
    curl(
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{rev}","physical":true}}"#),
    );
    e.k.stop("kube-apiserver");
    let down = Instant::now();
    e.k.start(APISERVER_STILL);
    eprintln!("kube-apiserver down and back in {:?}", down.elapsed());

    // The apiserver answers a watch from the proxy's last revision with 410.
    let watch = e.k.kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/services?watch=1&resourceVersion={old_rv}&timeoutSeconds=1"),
    ]);
    assert!(
        watch.contains("\"code\":410"),
        "a watch from revision {old_rv} after compaction to {rev}: {watch}"
    );
    // The proxy's watchers got it too (and relisted, see the commits below).
    let relisted = eventually(RECOVERY, || gone_lines(&e.proxy.log()) > gone_before);
    assert!(relisted, "the proxy never saw 410 Gone; {}", e.log());
    thread::sleep(Duration::from_secs(3));
    let n = prober.finish("traffic across restart and relist", "a", client_ip);
    assert_eq!(
        e.commits(),
        commits,
        "restart + relist of identical objects wrote to the kernel; {}",
        e.log()
    );
    assert_eq!(
        e.proxy.table(),
        table,
        "the table changed across the relist"
    );
    eprintln!("{n} requests across the restart all answered by a");

    // Still following changes.
    e.create_pod("b");
    e.wait_backends("after the relist", &client, sa(v4, 80), &["a", "b"]);
    eprintln!("took {:?}", started.elapsed());
}

/// The ServiceAccount token rotated: the proxy reads its kubeconfig's token file;
/// the old token is revoked (its bound Secret deleted, so the apiserver answers
/// 401 to it) and the apiserver restarted to cut the open watches; the proxy
/// reconnects with the new token from the file and follows the next change, with
/// no interruption of traffic.
#[test]
fn service_account_token_rotated_and_revoked() {
    let _serial = serial();
    let started = Instant::now();
    let mut e = Env::new(
        &[
            ("client", Where::Local),
            ("a", Where::Local),
            ("b", Where::Remote),
        ],
        &[],
    );
    let bound = |n: &str| -> String {
        e.k.kubectl(&["create", "secret", "generic", n, "-n", "kube-system"]);
        e.k.token(&["--bound-object-kind", "Secret", "--bound-object-name", n])
    };
    let write_token = |t: &str| {
        let file = e.k.nlproxy_token_file();
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, t).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    let api = format!("https://{API_ADDR}:{}", e.k.port("apiserver"));
    let status_with = |t: &str| -> String {
        let out = nsexec(
            &e.k.netns,
            &[
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--cacert",
                &e.k.dir.join("pki/ca.crt").display().to_string(),
                "-H",
                &format!("Authorization: Bearer {t}"),
                &format!("{api}/api/v1/services"),
            ],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let old = bound("knp-token-1");
    write_token(&old);
    assert_eq!(status_with(&old), "200");
    e.proxy.start();
    e.k.apply(&web("ClusterIP", json!({})));
    let v4 = cluster_ips(&e.service("web"))[0];
    let client = e.client();
    let client_ip: IpAddr = e.t.pod("client").v4.into();
    e.create_pod("a");
    e.wait_backends("with the first token", &client, sa(v4, 80), &["a"]);

    let prober = Prober::start(&client, sa(v4, 80));
    let new = bound("knp-token-2");
    write_token(&new);
    e.k.kubectl(&["delete", "secret", "knp-token-1", "-n", "kube-system"]);
    let revoked = eventually(WAIT, || status_with(&old) == "401");
    assert!(revoked, "the old token still works: {}", status_with(&old));
    assert_eq!(status_with(&new), "200");
    e.k.stop("kube-apiserver");
    e.k.start(&[]);
    let restarted = Instant::now();
    thread::sleep(Duration::from_secs(3));
    let n = prober.finish("traffic across the rotation", "a", client_ip);
    eprintln!("{n} requests across the rotation and restart all answered by a");
    e.create_pod("b");
    e.wait_backends_for(RECOVERY, &client, sa(v4, 80), &["a", "b"]);
    eprintln!(
        "with the rotated token: following changes {:?} after the restart",
        restarted.elapsed()
    );
    e.delete_pod("b", false);
    e.wait_backends("b gone", &client, sa(v4, 80), &["a"]);
    let unauthorized = e.proxy.log().matches("401").count();
    eprintln!("proxy log lines mentioning 401: {unauthorized}");
    eprintln!("took {:?}", started.elapsed());
}

/// Lines of the proxy's log where a watch failed with 410 Gone (kube-rs prints
/// the apiserver's Status as "{message}: {reason}", reason `Expired` for 410).
fn gone_lines(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("watch failed"))
        .filter(|l| l.contains("too old") || l.contains(": Expired"))
        .count()
}

impl Env {
    /// [`Env::wait_backends`] with its own bound.
    #[track_caller]
    fn wait_backends_for(&self, timeout: Duration, ns: &str, dst: SocketAddr, want: &[&str]) {
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        let ok = eventually(timeout, || {
            spread(ns, dst, 16).is_ok_and(|(pods, _)| pods == want)
        });
        assert!(
            ok,
            "{dst} never answered by exactly {want:?}; {}",
            self.log()
        );
    }
}
