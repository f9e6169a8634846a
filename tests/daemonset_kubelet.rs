//! deploy/kube-nlproxy.yaml's DaemonSet under a real kubelet and container runtime
//! (testenv/'s kubelet and kube-scheduler, Debian's containerd and runc), against
//! the real control plane of `scripts/cluster` in the LAN namespace. The image is
//! the Containerfile's final stage (`FROM scratch`, the static binary, its
//! ENTRYPOINT) around scripts/test's static musl build (`KNP_IMAGE_BIN`), imported
//! without a registry. Checks:
//! - the pod starts and becomes Ready (the kubelet's readiness probe, /healthz on
//!   10256); the kubelet's readiness and liveness (/livez) probes are answered,
//!   as the daemon's probe counters show; a ClusterIP and a NodePort lead to the
//!   backends;
//! - a rollout to a new image tag fails no connection;
//! - a node reboot (kubelet and containers killed, our nft table flushed): the
//!   restarted pod reaches the API at deploy/'s control-plane endpoint (the
//!   `kubernetes` ClusterIP leads nowhere until it has synced) and programs the
//!   node again.
//!
//! Needs root.
mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::{RealCluster, kubernetes_livez};
use common::kubelet::{self, Image, KubeletNode, PAUSE_IMAGE};
use common::*;

const API_ADDR: &str = "10.77.0.254";
const DEPLOY: &str = include_str!("../deploy/kube-nlproxy.yaml");
const CONTAINERFILE: &str = include_str!("../Containerfile");
const IMAGE_V1: &str = "docker.io/local/kube-nlproxy:1";
const IMAGE_V2: &str = "docker.io/local/kube-nlproxy:2";
const WEB_VIP: &str = "10.96.0.80";
const NODE_PORT: u16 = 30080;
/// Image pull is local; the readiness probe runs every 10 s.
const READY: Duration = Duration::from_secs(180);

/// The static binary the image holds: `$KNP_IMAGE_BIN` (scripts/test builds it as
/// the Containerfile's build stage does), else where that build puts it.
fn image_bin() -> PathBuf {
    let path = std::env::var_os("KNP_IMAGE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("target/x86_64-unknown-linux-musl/dist/kube-nlproxy")
        });
    assert!(
        path.is_file(),
        "no static kube-nlproxy at {} (KNP_IMAGE_BIN): scripts/test builds it",
        path.display()
    );
    path
}

/// Whether this machine's root holds CAP_SYS_RESOURCE in its bounding set (bit 24
/// of `CapBnd`). Where it does not (this sandbox), runc cannot give it to a
/// container: `unable to apply caps: operation not permitted`.
fn host_has_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let bnd = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap();
    const CAP_SYS_RESOURCE: u32 = 24;
    bnd & (1 << CAP_SYS_RESOURCE) != 0
}

/// deploy/'s manifests as JSON documents, with what a cluster sets: the
/// control-plane endpoint (the one value to set), and the image, here the
/// locally imported one (`imagePullPolicy: Never`: there is no registry). On a
/// machine whose root lacks CAP_SYS_RESOURCE, the container does not ask for it
/// (the daemon then warns that it cannot lower oom_score_adj, and runs).
fn manifests(endpoint: &str, image: &str) -> Vec<serde_json::Value> {
    let mut docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(DEPLOY).unwrap();
    for d in &mut docs {
        match d["kind"].as_str() {
            Some("ConfigMap") => {
                let kc = d["data"]["kubeconfig.conf"].as_str().unwrap();
                assert!(kc.contains("https://control-plane.example:6443"));
                d["data"]["kubeconfig.conf"] = kc
                    .replace("https://control-plane.example:6443", endpoint)
                    .into();
            }
            Some("DaemonSet") => {
                let c = &mut d["spec"]["template"]["spec"]["containers"][0];
                c["image"] = image.into();
                c["imagePullPolicy"] = "Never".into();
                if !host_has_sys_resource() {
                    let add = c["securityContext"]["capabilities"]["add"]
                        .as_array_mut()
                        .unwrap();
                    let before = add.len();
                    add.retain(|cap| cap != "SYS_RESOURCE");
                    assert_eq!(add.len() + 1, before, "deploy/ adds SYS_RESOURCE");
                    eprintln!(
                        "this machine's root has no CAP_SYS_RESOURCE: the container \
                         does not add it"
                    );
                }
            }
            _ => {}
        }
    }
    docs
}

/// The DaemonSet's pods as JSON (`kubectl get pods -o json`).
fn ds_pods(k: &RealCluster) -> Vec<serde_json::Value> {
    let out = k.kubectl(&[
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        "k8s-app=kube-nlproxy",
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["items"].as_array().cloned().unwrap_or_default()
}

fn ready(pod: &serde_json::Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn restarts(pod: &serde_json::Value) -> u64 {
    pod["status"]["containerStatuses"][0]["restartCount"]
        .as_u64()
        .unwrap_or(0)
}

/// The one Ready pod of the DaemonSet running `image`, if there is exactly one
/// pod and it is that.
fn ready_pod(k: &RealCluster, image: &str) -> Option<serde_json::Value> {
    let pods = ds_pods(k);
    match pods.as_slice() {
        [p] if ready(p)
            && p["spec"]["containers"][0]["image"] == image
            && p["metadata"]["deletionTimestamp"].is_null() =>
        {
            Some(p.clone())
        }
        _ => None,
    }
}

fn diagnostics(k: &RealCluster, node: &KubeletNode) -> String {
    let pods = k.kubectl_in(&["get", "pods", "-A", "-o", "wide", "--show-labels"], "");
    let events = k.kubectl_in(&["get", "events", "-A"], "");
    format!(
        "pods:\n{}\nevents:\n{}\n--- kubelet.log\n{}\n--- containerd.log\n{}\n{}",
        String::from_utf8_lossy(&pods.stdout),
        String::from_utf8_lossy(&events.stdout),
        node.log_tail("kubelet.log", 40),
        node.log_tail("containerd.log", 20),
        k.logs()
    )
}

/// A connection from the external client answered by one of the backends.
fn answered(t: &Topo, dst: SocketAddr) -> bool {
    matches!(tcp(&t.ext, dst, OK_TIMEOUT), Ok(r) if r.pod.starts_with("web"))
}

#[test]
fn daemonset_runs_under_a_real_kubelet_rolls_out_and_survives_a_reboot() {
    let components = RealCluster::components_dir();
    for b in ["kubelet", "kube-scheduler", "pause"] {
        assert!(
            std::path::Path::new(&components).join(b).is_file(),
            "{components}/{b} missing: testenv/build builds it"
        );
    }
    let bin = image_bin();

    // The image: the Containerfile's final stage around the static binary.
    let stage = kubelet::final_stage(CONTAINERFILE);
    assert_eq!(stage.from, "scratch", "{stage:?}");
    assert_eq!(
        stage.entrypoint,
        std::slice::from_ref(&stage.dest),
        "{stage:?}"
    );

    let mut t = Topo::new();
    ipn(
        &t.lan,
        &["addr", "add", &format!("{API_ADDR}/24"), "dev", "br0"],
    );
    let k = RealCluster::up(&t.lan, API_ADDR, &[]);
    let endpoint = format!("https://{API_ADDR}:{}", k.port("apiserver"));

    // Backends: two pods on node-b (no kubelet there: their readiness is set by
    // hand, as the other real-cluster tests do), a NodePort Service in front.
    k.create_node(REMOTE, REMOTE_V4, REMOTE_V6, None);
    let web1 = t.add_pod("web1", Where::Remote);
    let web2 = t.add_pod("web2", Where::Remote);
    k.create_pod(&web1);
    k.create_pod(&web2);
    k.apply(
        &serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "type": "NodePort",
                "clusterIP": WEB_VIP,
                "selector": {"app": "web"},
                "ports": [{"name": "http", "protocol": "TCP", "port": 80,
                           "targetPort": PORTS[0], "nodePort": NODE_PORT}],
            },
        })
        .to_string(),
    );
    let vip = sa(ip(WEB_VIP), 80);
    let node_port = sa(NODE_V4, NODE_PORT);
    // Nothing leads to the Service yet.
    assert!(!answered(&t, vip));

    // The node: containerd, the images, the kubelet.
    let mut node = KubeletNode::start_runtime(&t.node, NODE, &NODE_V4.to_string(), &k);
    let pause_bin = PathBuf::from(&components).join("pause");
    let pause_entry = vec!["/pause".to_string()];
    let tarball = kubelet::oci_tarball(
        &node.dir,
        &[
            Image {
                name: IMAGE_V1,
                file: &bin,
                dest: &stage.dest,
                entrypoint: &stage.entrypoint,
            },
            Image {
                name: IMAGE_V2,
                file: &bin,
                dest: &stage.dest,
                entrypoint: &stage.entrypoint,
            },
            Image {
                name: PAUSE_IMAGE,
                file: &pause_bin,
                dest: "/pause",
                entrypoint: &pause_entry,
            },
        ],
    );
    node.import(&tarball);
    node.start_kubelet(&components);
    assert!(
        eventually(Duration::from_secs(90), || k
            .kubectl_in(&["get", "node", NODE], "")
            .status
            .success()),
        "the kubelet did not register {NODE}:\n{}",
        diagnostics(&k, &node)
    );

    // (a) The DaemonSet's pod starts, passes its readiness probe, programs the node.
    let applied = Instant::now();
    for d in manifests(&endpoint, IMAGE_V1) {
        k.apply(&d.to_string());
    }
    assert!(
        eventually(READY, || ready_pod(&k, IMAGE_V1).is_some()),
        "the DaemonSet's pod is not Ready:\n{}",
        diagnostics(&k, &node)
    );
    let ready_after = applied.elapsed();
    eprintln!("daemonset pod Ready {ready_after:.1?} after kubectl apply");
    let pod = ready_pod(&k, IMAGE_V1).unwrap();
    assert_eq!(pod["spec"]["nodeName"], NODE, "{pod}");
    assert_eq!(pod["spec"]["hostNetwork"], true);
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez", "{c}");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], 10256, "{c}");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/healthz", "{c}");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], 10256, "{c}");
    assert_eq!(restarts(&pod), 0, "{pod}");
    // The probes' endpoints, as the kubelet sees them from the node.
    let health = sa(NODE_V4, 10256);
    assert_eq!(http_get(&t.node, health, "/healthz").map(|r| r.0), Ok(200));
    assert_eq!(http_get(&t.node, health, "/livez").map(|r| r.0), Ok(200));
    // The kubelet's own probes reach our endpoints: the daemon counts every
    // answer (kube-proxy's probe counters), beyond the one GET of each above.
    let probes = |path: &str| -> u64 {
        let metrics = sa(ip("127.0.0.1"), 10249);
        let text = http_get(&t.node, metrics, "/metrics").map_or(String::new(), |r| r.1);
        let name = format!("kubeproxy_proxy_{path}_total{{code=\"200\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(
        eventually(Duration::from_secs(40), || probes("livez") >= 2
            && probes("healthz") >= 2),
        "the kubelet's probes did not reach /livez and /healthz: livez {}, healthz {}",
        probes("livez"),
        probes("healthz")
    );
    assert!(
        eventually(Duration::from_secs(30), || answered(&t, vip)),
        "ClusterIP {vip} does not reach the backends:\n{}",
        nft_tables(&t.node)
    );
    assert!(
        eventually(Duration::from_secs(30), || answered(&t, node_port)),
        "NodePort {node_port} does not reach the backends:\n{}",
        nft_tables(&t.node)
    );
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        if let Ok(r) = tcp(&t.ext, vip, OK_TIMEOUT) {
            seen.insert(r.pod);
        }
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["web1", "web2"],
        "both backends answer through the ClusterIP"
    );

    // (b) A rollout to a new image tag: a client opens new connections all along.
    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        let ext = t.ext.clone();
        thread::spawn(move || {
            let (mut total, mut failed) = (0usize, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                for dst in [vip, node_port] {
                    total += 1;
                    match tcp(&ext, dst, OK_TIMEOUT) {
                        Ok(r) if r.pod.starts_with("web") => {}
                        other => failed.push(format!("{dst}: {other:?}")),
                    }
                }
                thread::sleep(Duration::from_millis(50));
            }
            (total, failed)
        })
    };
    let old_uid = pod["metadata"]["uid"].clone();
    let rollout = Instant::now();
    k.kubectl(&[
        "set",
        "image",
        "-n",
        "kube-system",
        "daemonset/kube-nlproxy",
        &format!("kube-nlproxy={IMAGE_V2}"),
    ]);
    let rolled = eventually(READY, || {
        ready_pod(&k, IMAGE_V2).is_some_and(|p| p["metadata"]["uid"] != old_uid)
    });
    // A few more connections with the new pod in place.
    thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let (total, failed) = client.join().unwrap();
    assert!(
        rolled,
        "the rollout to {IMAGE_V2} did not finish:\n{}",
        diagnostics(&k, &node)
    );
    eprintln!(
        "rollout {IMAGE_V1} -> {IMAGE_V2}: new pod Ready after {:.1?}; {} of {total} \
         connections failed",
        rollout.elapsed(),
        failed.len()
    );
    assert!(total > 0);
    assert!(
        failed.is_empty(),
        "{} of {total} connections failed during the rollout:\n  {}",
        failed.len(),
        failed.join("\n  ")
    );
    let pod = ready_pod(&k, IMAGE_V2).unwrap();
    assert_eq!(restarts(&pod), 0, "the liveness probe restarted it: {pod}");

    // (c) Reboot: the kubelet and every container die, the node's state is gone.
    let kubernetes_ip = k.kubernetes_cluster_ip();
    assert!(kubernetes_livez(&t.node, &kubernetes_ip).is_some());
    node.kill_kubelet();
    node.kill_containers();
    for family in ["ip", "ip6"] {
        let _ = nsexec(&t.node, &["nft", "delete", "table", family, "kube-nlproxy"]);
    }
    assert_eq!(nft_table(&t.node, "ip", "kube-nlproxy"), None);
    assert!(
        kubernetes_livez(&t.node, &kubernetes_ip).is_none(),
        "the kubernetes ClusterIP answers with nothing programmed"
    );
    assert!(!answered(&t, vip));
    let boot = Instant::now();
    node.start_kubelet(&components);
    let programmed = eventually(READY, || {
        kubernetes_livez(&t.node, &kubernetes_ip).is_some() && answered(&t, vip)
    });
    assert!(
        programmed,
        "the node is not programmed again after the reboot:\n{}",
        diagnostics(&k, &node)
    );
    let programmed_after = boot.elapsed();
    assert!(
        eventually(READY, || ready_pod(&k, IMAGE_V2)
            .is_some_and(
                |p| restarts(&p) >= 1 || p["metadata"]["uid"] != pod["metadata"]["uid"]
            )),
        "the pod did not restart Ready:\n{}",
        diagnostics(&k, &node)
    );
    eprintln!(
        "reboot: node programmed {programmed_after:.1?} after the kubelet started, pod Ready \
         {:.1?} after",
        boot.elapsed()
    );
    assert!(answered(&t, node_port));
}
