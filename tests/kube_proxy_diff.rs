//! Differential test against the real kube-proxy (`--proxy-mode nftables`, v1.37.2
//! from `testenv/`): two identical topologies (same addresses, separate
//! namespaces), kube-nlproxy on the node of one, kube-proxy on the node of the
//! other, both watching one real control plane (in a namespace of its own, reached
//! from each node over a veth). Seeded cluster states go in through the API:
//! Service type (ClusterIP, NodePort, LoadBalancer with its ingress IPs, `ipMode`
//! VIP or Proxy, set through the status subresource), IP families (IPv4, IPv6
//! or dual-stack; the flows go to each family the Service has), `externalIPs`,
//! `loadBalancerSourceRanges`, external and internal traffic policy, ClientIP
//! affinity, `trafficDistribution`, target port, and each backend pod absent,
//! ready, not ready or terminating. The same flows (TCP and UDP; SCTP is not in
//! the host kernel) go through both nodes, from a pod, the node, a pod of the
//! other node and two clients outside the cluster (one of them outside some
//! source ranges); the outcome of each flow (backends seen, sources seen,
//! refused, dropped) must be equal. `KNP_DIFF_SEED` and `KNP_DIFF_STATES` choose
//! the run (defaults: a fixed seed, 16 states). The run must compare something:
//! both proxies ready first, at least 200 flows (for 16 states), half of them
//! served on both sides, and a flow is the same only when most of its looks
//! agree. It ends with endpoint changes under traffic: once settled, no
//! connection reaches a removed endpoint on either side.
//!
//! Known, accepted differences are listed in docs/differences-from-kube-proxy.md.
mod common;

use std::collections::BTreeSet;

use std::net::{IpAddr, SocketAddr};

use std::time::{Duration, Instant};

use common::cluster::{RealCluster, RealKubeProxy};
use common::*;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
/// kube-apiserver's address (on lo of the control-plane namespace).
const API_ADDR: &str = "10.250.0.254";
const REQUESTS: usize = 12;
/// The pod ranges of both nodes (ClusterCIDR local detection on both sides).
const CLUSTER_CIDR: &str = "10.244.0.0/16,fd44::/16";
const SHORT: Duration = Duration::from_millis(800);
/// The second external client (not in every `loadBalancerSourceRanges`).
const EXT2_V4: &str = "10.77.0.101";

/// xorshift64*: a seeded generator, the same states for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[(self.next() % v.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Condition of one backend pod in a state.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cond {
    Absent,
    Ready,
    NotReady,
    /// Deleted with a grace period, still Ready (serving + terminating).
    Terminating,
}

/// One generated cluster state.
#[derive(Debug, Clone)]
struct State {
    kind: &'static str,
    /// `spec.ipFamilies` (single-stack IPv4 or IPv6, or PreferDualStack).
    families: &'static [&'static str],
    /// `spec.externalIPs` (one address of the external range).
    external_ip: bool,
    /// The LB ingress has `ipMode: Proxy` (LoadBalancer only).
    ip_mode_proxy: bool,
    /// `spec.loadBalancerSourceRanges` (LoadBalancer only).
    source_ranges: &'static [&'static str],
    etp: &'static str,
    itp: &'static str,
    affinity: bool,
    prefer_close: bool,
    target: u16,
    pods: Vec<(&'static str, Cond)>,
}

impl State {
    /// Whether the Service has external entry points (and so an eTP).
    fn external(&self) -> bool {
        self.kind != "ClusterIP" || self.external_ip
    }
}

const BACKENDS: [&str; 3] = ["a", "b", "c"];

/// The choices of `loadBalancerSourceRanges`: EXT only; EXT and the pods; the
/// whole LAN (EXT, EXT2 and the node).
const RANGES: [&[&str]; 3] = [
    &["10.77.0.100/32"],
    &["10.77.0.100/32", "10.244.0.0/16"],
    &["10.77.0.0/24"],
];

fn generate(rng: &mut Rng) -> State {
    let kind = rng.pick(&["ClusterIP", "NodePort", "LoadBalancer", "LoadBalancer"]);
    let lb = kind == "LoadBalancer";
    let mut s = State {
        kind,
        families: rng.pick(&[
            &["IPv4"][..],
            &["IPv4"],
            &["IPv4", "IPv6"],
            &["IPv4", "IPv6"],
            &["IPv6"],
        ]),
        external_ip: rng.chance(40),
        ip_mode_proxy: lb && rng.chance(15),
        source_ranges: if lb && rng.chance(50) {
            rng.pick(&RANGES)
        } else {
            &[]
        },
        etp: "Cluster",
        itp: rng.pick(&["Cluster", "Cluster", "Local"]),
        affinity: rng.chance(25),
        prefer_close: rng.chance(30),
        target: rng.pick(&[8080, 8081]),
        pods: BACKENDS
            .iter()
            .map(|p| {
                (
                    *p,
                    rng.pick(&[
                        Cond::Ready,
                        Cond::Ready,
                        Cond::Absent,
                        Cond::NotReady,
                        Cond::Terminating,
                    ]),
                )
            })
            .collect(),
    };
    if s.external() {
        s.etp = rng.pick(&["Cluster", "Local"]);
    }
    s
}

/// What a flow saw: the backends and sources of its answered requests, and how
/// the others failed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    backends: BTreeSet<String>,
    sources: BTreeSet<IpAddr>,
    failures: BTreeSet<String>,
}

/// `REQUESTS` requests of `proto` from `ns` to `dst`, at once (a failure costs
/// one timeout, not twelve); with `sticky` (ClientIP affinity) the first one
/// alone, so that the others find its affinity entry.
fn flow(ns: &str, proto: Proto, dst: SocketAddr, sticky: bool) -> Outcome {
    let mut o = Outcome {
        backends: BTreeSet::new(),
        sources: BTreeSet::new(),
        failures: BTreeSet::new(),
    };
    let mut results = Vec::with_capacity(REQUESTS);
    let first = if sticky {
        results.push(request(ns, proto, dst, SHORT));
        1
    } else {
        0
    };
    std::thread::scope(|sc| {
        let handles: Vec<_> = (first..REQUESTS)
            .map(|_| sc.spawn(|| request(ns, proto, dst, SHORT)))
            .collect();
        results.extend(handles.into_iter().map(|h| h.join().unwrap()));
    });
    for r in results {
        match r {
            Ok(r) => {
                o.backends.insert(r.pod);
                o.sources.insert(r.src);
            }
            Err(e) => {
                o.failures.insert(format!("{e:?}"));
            }
        }
    }
    o
}

/// The addresses of one state's Service.
#[derive(Debug, Clone, Copy)]
struct Addrs {
    cluster_ip: IpAddr,
    node_port: Option<u16>,
    health_check_node_port: Option<u16>,
    lb_ip: Option<IpAddr>,
    external_ip: Option<IpAddr>,
}

/// One flow: its name, the namespace it starts in, protocol, destination; or,
/// with `http`, one GET of a healthCheckNodePort.
struct Flow {
    name: String,
    ns: String,
    proto: Proto,
    dst: SocketAddr,
    http: bool,
}

impl Flow {
    fn run(&self, sticky: bool) -> Outcome {
        if !self.http {
            return flow(&self.ns, self.proto, self.dst, sticky);
        }
        // The status and the body (JSON: the service, its local endpoints).
        let mut o = Outcome {
            backends: BTreeSet::new(),
            sources: BTreeSet::new(),
            failures: BTreeSet::new(),
        };
        match http_get(&self.ns, self.dst, "/") {
            Ok((code, body)) => {
                let body = serde_json::from_str::<Value>(&body)
                    .map(|v| v.to_string())
                    .unwrap_or(body);
                o.backends.insert(format!("HTTP {code} {body}"));
            }
            Err(e) => {
                o.failures.insert(e);
            }
        }
        o
    }
}

/// The flows of state `s` with addresses `a`, for topology `t` (`ext2`: a second
/// client outside the cluster).
fn flows(t: &Topo, ext2: &str, s: &State, a: Addrs) -> Vec<Flow> {
    let client = t.pod("client").ns.clone();
    let v6 = a.cluster_ip.is_ipv6();
    let node: IpAddr = if v6 { NODE_V6.into() } else { NODE_V4.into() };
    let mut v = Vec::new();
    let mut add = |name: &str, ns: &str, proto: Proto, dst: SocketAddr| {
        v.push(Flow {
            name: if v6 {
                format!("{name} (IPv6)")
            } else {
                name.to_string()
            },
            ns: ns.to_string(),
            proto,
            dst,
            http: name.contains("healthCheckNodePort"),
        })
    };
    let vip = a.cluster_ip;
    add("pod→ClusterIP tcp", &client, Proto::Tcp, sa(vip, 80));
    add("pod→ClusterIP udp", &client, Proto::Udp, sa(vip, 81));
    add(
        "pod→ClusterIP unknown port",
        &client,
        Proto::Tcp,
        sa(vip, 82),
    );
    add("node→ClusterIP tcp", &t.node, Proto::Tcp, sa(vip, 80));
    add(
        "remote pod→ClusterIP tcp",
        &t.pod("rclient").ns,
        Proto::Tcp,
        sa(vip, 80),
    );
    add("EXT→ClusterIP tcp", &t.ext, Proto::Tcp, sa(vip, 80));
    if let Some(np) = a.node_port {
        add("EXT→NodePort tcp", &t.ext, Proto::Tcp, sa(node, np));
        add("EXT→NodePort udp", &t.ext, Proto::Udp, sa(node, np + 1));
        add("pod→NodePort tcp", &client, Proto::Tcp, sa(node, np));
        add("node→NodePort tcp", &t.node, Proto::Tcp, sa(node, np));
    }
    if let Some(hc) = a.health_check_node_port {
        add("EXT→healthCheckNodePort", &t.ext, Proto::Tcp, sa(node, hc));
    }
    if let Some(lb) = a.lb_ip {
        add("EXT→LB tcp", &t.ext, Proto::Tcp, sa(lb, 80));
        add("EXT→LB udp", &t.ext, Proto::Udp, sa(lb, 81));
        add("pod→LB tcp", &client, Proto::Tcp, sa(lb, 80));
        add("node→LB tcp", &t.node, Proto::Tcp, sa(lb, 80));
        if !s.source_ranges.is_empty() {
            add("EXT2→LB tcp", ext2, Proto::Tcp, sa(lb, 80));
            add("EXT2→LB udp", ext2, Proto::Udp, sa(lb, 81));
        }
    }
    if let Some(eip) = a.external_ip {
        add("EXT→externalIP tcp", &t.ext, Proto::Tcp, sa(eip, 80));
        add("EXT→externalIP udp", &t.ext, Proto::Udp, sa(eip, 81));
        add("pod→externalIP tcp", &client, Proto::Tcp, sa(eip, 80));
        add("node→externalIP tcp", &t.node, Proto::Tcp, sa(eip, 80));
    }
    v
}

/// A second client outside the cluster on the LAN of `t` (10.77.0.101), reaching
/// the external range through the node, as EXT does.
fn add_ext2(t: &Topo) -> Netns {
    let ns = Netns::new(unique("knp-ext2"));
    ipn(
        &t.lan,
        &[
            "link", "add", "pe2", "type", "veth", "peer", "name", "eth0", "netns", &ns.0,
        ],
    );
    ipn(&t.lan, &["link", "set", "pe2", "master", "br0", "up"]);
    ipn(
        &ns.0,
        &["addr", "add", &format!("{EXT2_V4}/24"), "dev", "eth0"],
    );
    ipn(&ns.0, &["link", "set", "eth0", "up"]);
    ipn(
        &ns.0,
        &["addr", "add", "fd77::101/64", "dev", "eth0", "nodad"],
    );
    ipn(&ns.0, &["route", "add", "10.78.0.0/24", "via", "10.77.0.1"]);
    ipn(
        &ns.0,
        &["-6", "route", "add", "fd78::/64", "via", "fd77::1"],
    );
    ns
}

#[test]
fn same_outcomes_as_kube_proxy_nftables() {
    let started = Instant::now();
    let seed: u64 = std::env::var("KNP_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6b6e_7031);
    let states: usize = std::env::var("KNP_DIFF_STATES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    eprintln!("seed {seed}, {states} states");

    // Two identical topologies: ours (t1) and kube-proxy's (t2).
    let mut t1 = Topo::new();
    let mut t2 = Topo::new();
    for t in [&mut t1, &mut t2] {
        t.add_pod("client", Where::Local);
        t.add_pod("a", Where::Local);
        t.add_pod("b", Where::Remote);
        t.add_pod("c", Where::Remote);
        t.add_pod("rclient", Where::Remote);
    }
    let ext2 = [add_ext2(&t1), add_ext2(&t2)];
    // The control plane's namespace, a veth to each node.
    let api = Netns::new(unique("knp-api"));
    ipn(
        &api.0,
        &["addr", "add", &format!("{API_ADDR}/32"), "dev", "lo"],
    );
    for (i, t) in [&t1, &t2].iter().enumerate() {
        let (node_a, api_a) = (format!("10.250.{}.1", i + 1), format!("10.250.{}.2", i + 1));
        let api_if = format!("n{}", i + 1);
        ipn(
            &api.0,
            &[
                "link", "add", &api_if, "type", "veth", "peer", "name", "api0", "netns", &t.node,
            ],
        );
        ipn(
            &api.0,
            &["addr", "add", &format!("{api_a}/30"), "dev", &api_if],
        );
        ipn(&api.0, &["link", "set", &api_if, "up"]);
        ipn(
            &t.node,
            &["addr", "add", &format!("{node_a}/30"), "dev", "api0"],
        );
        ipn(&t.node, &["link", "set", "api0", "up"]);
        ipn(
            &t.node,
            &["route", "add", &format!("{API_ADDR}/32"), "via", &api_a],
        );
    }
    let k = RealCluster::up(&api.0, API_ADDR, &["--endpoint-reconciler-type=none"]);
    let bins = RealCluster::components_dir();
    for (name, zone, a4, a6) in [
        (NODE, "zone-a", NODE_V4, NODE_V6),
        (REMOTE, "zone-b", REMOTE_V4, REMOTE_V6),
    ] {
        k.apply(
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
                "topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name}}})
            .to_string(),
        );
        let status = json!({"status": {"addresses": [
            {"type": "InternalIP", "address": a4.to_string()},
            {"type": "InternalIP", "address": a6.to_string()},
            {"type": "Hostname", "address": name}]}});
        k.kubectl(&[
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
    }
    let mut ours = Proxy::new(&t1, BIN).with_kube_source(&k.nlproxy_kubeconfig());
    // `KNP_DIFF_OUR_CLUSTER_CIDR`: a wrong value on our side only, to see the
    // comparison report divergences (a check of the test itself).
    let our_cidr = std::env::var("KNP_DIFF_OUR_CLUSTER_CIDR").unwrap_or(CLUSTER_CIDR.into());
    ours.args = vec![
        "--cluster-cidr".into(),
        our_cidr,
        "--detect-local-mode".into(),
        "ClusterCIDR".into(),
    ];
    ours.start();
    let upstream = RealKubeProxy::start(
        &bins,
        &t2.node,
        &k.kube_proxy_args("nftables", CLUSTER_CIDR),
        None,
    );

    // Both proxies ready before any flow: ours answers /healthz 200 only after
    // its first sync; kube-proxy's /healthz is 200 before it, its last-sync
    // timestamp is not.
    let ready = Duration::from_secs(60);
    assert!(
        eventually(ready, || http_get(&t1.node, sa(NODE_V4, 10256), "/healthz")
            .is_ok_and(|(code, _)| code == 200)),
        "kube-nlproxy never became healthy; log:\n{}",
        ours.log()
    );
    let kp_metrics: SocketAddr = "127.0.0.1:10249".parse().unwrap();
    assert!(
        eventually(ready, || http_get(&t2.node, kp_metrics, "/metrics")
            .is_ok_and(|(_, text)| text.lines().any(|l| {
                l.starts_with("kubeproxy_sync_proxy_rules_last_timestamp_seconds")
                    && l.rsplit(' ').next().is_some_and(|v| v != "0")
            }))),
        "kube-proxy never synced; its log:\n{}",
        upstream.log()
    );

    let mut rng = Rng(seed);
    let mut diffs = Vec::new();
    let mut flows_run = 0;
    // Flows whose requests reached a backend on both sides (health-check
    // flows aside), of the flows compared.
    let (mut reached_both, mut packet_flows) = (0, 0);
    for i in 0..states {
        let s = generate(&mut rng);
        eprintln!("state {i}: {s:?}");
        apply_state(&k, &t1, &s, i);
        let svc: Value =
            serde_json::from_str(&k.kubectl(&["get", "service", "web", "-o", "json"])).unwrap();
        // The addresses of each family the Service has.
        let of = |v: &Value, v6: bool| -> Option<IpAddr> {
            v.as_array()?
                .iter()
                .filter_map(|x| x.as_str().or_else(|| x["ip"].as_str()))
                .map(ip)
                .find(|a| a.is_ipv6() == v6)
        };
        let addrs: Vec<Addrs> = [false, true]
            .into_iter()
            .filter_map(|v6| {
                Some(Addrs {
                    cluster_ip: of(&svc["spec"]["clusterIPs"], v6)?,
                    node_port: svc["spec"]["ports"][0]["nodePort"]
                        .as_u64()
                        .map(|p| p as u16),
                    health_check_node_port: svc["spec"]["healthCheckNodePort"]
                        .as_u64()
                        .map(|p| p as u16),
                    lb_ip: of(&svc["status"]["loadBalancer"]["ingress"], v6),
                    external_ip: of(&svc["spec"]["externalIPs"], v6),
                })
            })
            .collect();
        // Both programmed: a pause longer than both min-sync periods and
        // kube-proxy's EndpointSlice round trip.
        std::thread::sleep(Duration::from_secs(4));
        let pairs: Vec<(Flow, Flow)> = addrs
            .iter()
            .flat_map(|a| {
                flows(&t1, &ext2[0].0, &s, *a)
                    .into_iter()
                    .zip(flows(&t2, &ext2[1].0, &s, *a))
            })
            .collect();
        for (f1, f2) in pairs {
            let name = &f1.name;
            if s.affinity && name.starts_with("remote") {
                // Works only when the sticky backend is on another node than the
                // client (the reply bypasses node-a otherwise): chance, per side.
                continue;
            }
            // Up to three looks (each side may still be syncing the state);
            // the flow is the same only when most of them agree: two looks
            // that agree, or two that differ, decide it.
            let (mut agree, mut differ) = (0, 0);
            let mut last = None;
            while agree < 2 && differ < 2 {
                let (mut o1, mut o2) = std::thread::scope(|sc| {
                    let h1 = sc.spawn(|| f1.run(s.affinity));
                    let h2 = sc.spawn(|| f2.run(s.affinity));
                    (h1.join().unwrap(), h2.join().unwrap())
                });
                if s.affinity && !f1.http {
                    // ClientIP affinity: one backend, which one is chance, and so
                    // is the source seen (the node's address towards that backend).
                    for o in [&mut o1, &mut o2] {
                        o.backends = BTreeSet::from([format!("{} backend(s)", o.backends.len())]);
                        o.sources = BTreeSet::new();
                    }
                }
                if o1 == o2 {
                    agree += 1;
                } else {
                    differ += 1;
                    std::thread::sleep(Duration::from_secs(2));
                }
                last = Some((o1, o2));
            }
            let same = agree >= 2;
            let (o1, o2) = last.unwrap();
            if !f1.http {
                packet_flows += 1;
                if !o1.backends.is_empty() && !o2.backends.is_empty() {
                    reached_both += 1;
                }
            }
            flows_run += 1;
            if same {
                eprintln!("  same  {name}: {o1:?}");
            } else {
                eprintln!("  DIFF  {name}: kube-nlproxy {o1:?} / kube-proxy {o2:?}");
                diffs.push(format!(
                    "state {i} {s:?} {name}: kube-nlproxy {o1:?}, kube-proxy {o2:?}"
                ));
            }
        }
    }
    // Transitions under traffic, then what each side serves once settled.
    let transition = transitions_under_traffic(&k, [&t1, &t2]);
    eprintln!(
        "{states} states, {flows_run} flows ({reached_both} of {packet_flows} packet flows \
         reached a backend on both sides), {} divergence(s) in {:?}; {transition}",
        diffs.len(),
        started.elapsed()
    );
    // The comparison compared something: enough flows, most of them served.
    let min_flows = 200 * states / 16;
    assert!(
        flows_run >= min_flows,
        "only {flows_run} flows compared (at least {min_flows} for {states} states)"
    );
    assert!(
        2 * reached_both >= packet_flows,
        "only {reached_both} of {packet_flows} flows reached a backend on both sides"
    );
    assert!(
        diffs.is_empty(),
        "{} divergence(s) from kube-proxy:\n  {}\nkube-proxy log tail:\n{}",
        diffs.len(),
        diffs.join("\n  "),
        upstream
            .log()
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n"),
    );
}

/// Puts state `s` into the API: the Service `web` replaced (its LB ingress set
/// through the status subresource), the pods recreated with their conditions.
fn apply_state(k: &RealCluster, t: &Topo, s: &State, i: usize) {
    let _ = k.kubectl_in(&["delete", "service", "web", "--ignore-not-found"], "");
    let _ = k.kubectl_in(
        &["delete", "pods", "--all", "--grace-period=0", "--force"],
        "",
    );
    let mut spec = json!({
        "type": s.kind,
        "selector": {"app": "web"},
        "ports": [
            {"name": "http", "protocol": "TCP", "port": 80, "targetPort": s.target},
            {"name": "dns", "protocol": "UDP", "port": 81, "targetPort": s.target},
        ],
        "internalTrafficPolicy": s.itp,
        "ipFamilies": s.families,
        "ipFamilyPolicy": if s.families.len() == 2 { "PreferDualStack" } else { "SingleStack" },
    });
    if s.kind != "ClusterIP" {
        let np = 30100 + 2 * i as u16;
        spec["ports"][0]["nodePort"] = json!(np);
        spec["ports"][1]["nodePort"] = json!(np + 1);
    }
    if s.external() {
        spec["externalTrafficPolicy"] = json!(s.etp);
    }
    if s.external_ip {
        spec["externalIPs"] = json!([
            format!("10.78.0.{}", 10 + i % 80),
            format!("fd78::{:x}", 10 + i % 80)
        ]);
    }
    if !s.source_ranges.is_empty() {
        spec["loadBalancerSourceRanges"] = json!(s.source_ranges);
    }
    if s.affinity {
        spec["sessionAffinity"] = json!("ClientIP");
    }
    if s.prefer_close {
        spec["trafficDistribution"] = json!("PreferClose");
    }
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"}, "spec": spec})
        .to_string(),
    );
    if s.kind == "LoadBalancer" {
        // No cloud controller: the test is the load balancer's provider.
        let mode = if s.ip_mode_proxy { "Proxy" } else { "VIP" };
        let status = json!({"status": {"loadBalancer": {"ingress": [
            {"ip": format!("10.78.0.{}", 100 + i % 80), "ipMode": mode},
            {"ip": format!("fd78::{:x}", 100 + i % 80), "ipMode": mode}]}}});
        k.kubectl(&[
            "patch",
            "service",
            "web",
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
    }
    for (name, cond) in &s.pods {
        if *cond == Cond::Absent {
            continue;
        }
        let p = t.pod(name);
        k.apply(
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
                "spec": {"nodeName": p.node_name(), "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 600,
                    "containers": [{"name": "c", "image": "none"}]}})
            .to_string(),
        );
        let ready = if *cond == Cond::NotReady {
            "False"
        } else {
            "True"
        };
        let status = json!({"status": {"phase": "Running", "podIP": p.v4.to_string(),
            "podIPs": [{"ip": p.v4.to_string()}, {"ip": p.v6.to_string()}],
            "conditions": [{"type": "Ready", "status": ready}]}});
        k.kubectl(&[
            "patch",
            "pod",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
        if *cond == Cond::Terminating {
            k.kubectl(&["delete", "pod", name, "--grace-period=600", "--wait=false"]);
        }
    }
}

/// A ClusterIP Service served by a, b and c; clients on both topologies open
/// TCP connections continuously while b turns NotReady and c is deleted. Once
/// both proxies have settled, no connection may reach b or c, on either side.
/// Returns what the clients saw, for the log.
fn transitions_under_traffic(k: &RealCluster, topos: [&Topo; 2]) -> String {
    let s = State {
        kind: "ClusterIP",
        families: &["IPv4"],
        external_ip: false,
        ip_mode_proxy: false,
        source_ranges: &[],
        etp: "Cluster",
        itp: "Cluster",
        affinity: false,
        prefer_close: false,
        target: 8080,
        pods: BACKENDS.iter().map(|p| (*p, Cond::Ready)).collect(),
    };
    apply_state(k, topos[0], &s, 99);
    let svc: Value =
        serde_json::from_str(&k.kubectl(&["get", "service", "web", "-o", "json"])).unwrap();
    let vip = SocketAddr::new(
        ip(svc["spec"]["clusterIP"].as_str().expect("clusterIP")),
        80,
    );
    let serves_all = |t: &Topo| {
        let seen: BTreeSet<String> = (0..30)
            .filter_map(|_| tcp(&t.pod("client").ns, vip, SHORT).ok().map(|r| r.pod))
            .collect();
        seen.len() == 3
    };
    for t in topos {
        assert!(
            eventually(Duration::from_secs(20), || serves_all(t)),
            "{vip} is not served by a, b and c"
        );
    }
    // Traffic on both sides while the endpoints change.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let settle_at = std::sync::Mutex::new(None::<Instant>);
    let report = std::thread::scope(|sc| {
        let clients: Vec<_> = topos
            .iter()
            .map(|t| {
                let (stop, settle_at) = (&stop, &settle_at);
                let ns = t.pod("client").ns.clone();
                sc.spawn(move || {
                    let (mut ok, mut failed, mut gone_after_settle) = (0, 0, Vec::new());
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let settled = settle_at
                            .lock()
                            .unwrap()
                            .is_some_and(|at| Instant::now() >= at);
                        match tcp(&ns, vip, SHORT) {
                            Ok(r) => {
                                ok += 1;
                                if settled && r.pod != "a" {
                                    gone_after_settle.push(r.pod);
                                }
                            }
                            Err(_) => failed += 1,
                        }
                    }
                    (ok, failed, gone_after_settle)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(1));
        k.kubectl(&[
            "patch",
            "pod",
            "b",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[{"type":"Ready","status":"False"}]}}"#,
        ]);
        k.kubectl(&["delete", "pod", "c", "--grace-period=0", "--force"]);
        // Both proxies' min-sync periods and the EndpointSlice round trip.
        *settle_at.lock().unwrap() = Some(Instant::now() + Duration::from_secs(4));
        std::thread::sleep(Duration::from_secs(7));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        clients
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (side, (_, _, gone)) in ["kube-nlproxy", "kube-proxy"].iter().zip(&report) {
        assert!(
            gone.is_empty(),
            "{side}: connections reached removed endpoints after settling: {gone:?}"
        );
    }
    report
        .iter()
        .zip(["kube-nlproxy", "kube-proxy"])
        .map(|((ok, failed, _), side)| {
            format!("transition: {side} {ok} connections answered, {failed} failed")
        })
        .collect::<Vec<_>>()
        .join(", ")
}
