//! What `benches/real_kube_proxy.rs` and `benches/fleet.rs` share: one real control
//! plane (`scripts/cluster`, in a network namespace of its own), the Services and
//! EndpointSlices they load into it, node namespaces reached from it over a veth,
//! the proxies under test (kube-nlproxy, the real kube-proxy in nftables and in
//! iptables mode) and the figures read from `/proc` and from `/metrics`.
//!
//! Addresses: the apiserver on `10.250.0.254` (lo of the control plane's
//! namespace); node `i`'s link to it `10.251.0.0/16`, a /30 each; node IPs
//! `10.77.0.0/16`; endpoints `100.64.0.0/11` (two per Service), moved endpoints
//! `100.96.0.0/12` (one per change), so 100k Services and a million changes fit.
//! ClusterIPs are allocated by the apiserver from `scripts/cluster`'s ServiceCIDR
//! (10.96.0.0/16); above 60k Services they are set from a second ServiceCIDR,
//! `100.112.0.0/12`.
//!
//! Used through `#[path]` by both benches, each with `mod common` (tests/common).
#![allow(dead_code)]

pub mod probe;

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::cluster::RealCluster;
use crate::common::{Netns, enter_ns, in_ns, ipn, rfc3339, unique};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
/// kube-apiserver's address (on lo of the control-plane namespace).
pub const API_ADDR: &str = "10.250.0.254";
/// The namespace of the bench's Services and EndpointSlices.
pub const NS: &str = "bench";
/// The pod ranges every proxy is given (ClusterCIDR local detection).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Concurrent API requests while creating the objects (`--concurrency C`).
pub const DEFAULT_CONCURRENCY: usize = 32;
/// The metric every proxy records at the end of a successful sync.
pub const LAST_SYNC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
/// The network-programming latency histogram (from the trigger-time annotation).
pub const NPL: &str = "kubeproxy_network_programming_duration_seconds";

/// A proxy process (`ip netns exec NS BIN ...`, which execs: same pid); SIGTERM on
/// drop, SIGKILL 5 s later.
pub struct Proc {
    pub child: Child,
    log: PathBuf,
}

impl Proc {
    pub fn spawn(ns: &str, bin: &str, args: &[String]) -> Proc {
        let log = std::env::temp_dir().join(format!("{}.log", unique("knp-kpbench")));
        let child = Command::new("ip")
            .args(["netns", "exec", ns, bin])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(fs::File::create(&log).unwrap()))
            .spawn()
            .expect("spawn proxy");
        Proc { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics with the log's tail when the process has exited.
    pub fn check_alive(&mut self, what: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{what} exited ({status}); log tail:\n{}", self.log_tail());
        }
    }

    /// Removes the log, unless `KNP_BENCH_KEEP_LOGS` is set (then says where it is).
    fn remove_log(&self) {
        if std::env::var_os("KNP_BENCH_KEEP_LOGS").is_some() {
            eprintln!("log kept: {}", self.log.display());
        } else {
            let _ = fs::remove_file(&self.log);
        }
    }

    pub fn log_tail(&self) -> String {
        let s = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                self.remove_log();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.remove_log();
    }
}

/// The proxy under test.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Ours,
    Nftables,
    Iptables,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ours => "kube-nlproxy",
            Kind::Nftables => "kube-proxy nftables",
            Kind::Iptables => "kube-proxy iptables",
        }
    }

    /// `ours`, `nftables`, `iptables` (the benches' `--kinds`).
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "ours" | "kube-nlproxy" => Some(Kind::Ours),
            "nftables" => Some(Kind::Nftables),
            "iptables" => Some(Kind::Iptables),
            _ => None,
        }
    }

    /// The part of the proxy's ruleset in `ns` that holds one entry per ClusterIP,
    /// as text (oracle: `nft` / `iptables`): our `cluster-ips` set, kube-proxy's
    /// `service-ips` map, the `KUBE-SERVICES` chain.
    pub fn cluster_ip_listing(self, ns: &str) -> String {
        let args: &[&str] = match self {
            Kind::Ours => &["nft", "list", "set", "ip", "kube-nlproxy", "cluster-ips"],
            Kind::Nftables => &["nft", "list", "map", "ip", "kube-proxy", "service-ips"],
            Kind::Iptables => &["iptables", "-t", "nat", "-S", "KUBE-SERVICES"],
        };
        let out = crate::common::nsexec(ns, args);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// How many of `cluster_ips` the proxy has programmed in `ns`.
    pub fn count_cluster_ips(self, ns: &str, cluster_ips: &HashSet<Ipv4Addr>) -> usize {
        addresses(&self.cluster_ip_listing(ns))
            .intersection(cluster_ips)
            .count()
    }
}

/// Every IPv4 address in `text` (an address is a maximal run of digits and dots).
pub fn addresses(text: &str) -> HashSet<Ipv4Addr> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// CPU time of `pid` (all threads) and of the children it has reaped, in seconds
/// (/proc/PID/stat utime + stime + cutime + cstime).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    if f.len() < 15 {
        return 0.0;
    }
    // rest[0] is field 3 (state): utime is field 14, cstime field 17.
    let ticks = f[11] + f[12] + f[13] + f[14];
    // SAFETY: sysconf reads a constant; no pointers.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Peak RSS of `pid` in KiB (`VmHWM`).
pub fn peak_rss_kb(pid: u32) -> u64 {
    crate::common::status_kb(pid, "VmHWM:")
}

/// Resets `pid`'s `VmHWM` to its current RSS (`echo 5 > /proc/PID/clear_refs`), so
/// that the next [`peak_rss_kb`] is the peak of what follows.
pub fn reset_peak_rss(pid: u32) {
    let _ = fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// GET http://127.0.0.1:10249/metrics from namespace `ns`.
pub fn metrics(ns: &str) -> Option<String> {
    in_ns(ns, || {
        let mut s =
            TcpStream::connect_timeout(&"127.0.0.1:10249".parse().unwrap(), Duration::from_secs(2))
                .ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok()?;
        Some(buf)
    })
}

/// A sample's labels, `(name, value)`.
type Labels<'a> = Vec<(&'a str, &'a str)>;

/// One sample line of the Prometheus text format: name, labels, value.
fn sample(line: &str) -> Option<(&str, Labels<'_>, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (head, value) = line.rsplit_once(' ')?;
    let value = value.trim().parse().ok()?;
    let Some((name, labels)) = head.split_once('{') else {
        return Some((head.trim(), Vec::new(), value));
    };
    let labels = labels.strip_suffix('}')?;
    let mut out = Vec::new();
    let mut rest = labels;
    while let Some((k, v)) = rest.split_once("=\"") {
        let end = v.find('"')?;
        out.push((k.trim_start_matches(',').trim(), &v[..end]));
        rest = &v[end + 1..];
    }
    Some((name, out, value))
}

fn label<'a>(labels: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    labels.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// The value of metric `name` (exact name): the series labelled
/// `ip_family="IPv4"` if there is one, else the one without `ip_family`.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut unlabelled = None;
    for (n, labels, v) in text.lines().filter_map(sample) {
        if n != name {
            continue;
        }
        match label(&labels, "ip_family") {
            Some("IPv4") => return Some(v),
            None => unlabelled = Some(v),
            Some(_) => {}
        }
    }
    unlabelled
}

/// The cumulative buckets (`le`, count) of histogram `name`, IPv4 or unlabelled
/// series (an IPv6 series is left out), `+Inf` as infinity.
pub fn buckets(text: &str, name: &str) -> BTreeMap<u64, f64> {
    let bucket = format!("{name}_bucket");
    let mut out = BTreeMap::new();
    for (n, labels, v) in text.lines().filter_map(sample) {
        if n != bucket || label(&labels, "ip_family").is_some_and(|f| f != "IPv4") {
            continue;
        }
        let Some(le) = label(&labels, "le") else {
            continue;
        };
        let le: f64 = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::INFINITY)
        };
        *out.entry(le.to_bits()).or_insert(0.0) += v;
    }
    out
}

/// The `q` quantile of merged cumulative `buckets` (keys: `f64::to_bits` of `le`):
/// the upper bound of the bucket it falls in (Prometheus' resolution; no
/// interpolation). `None` without observations.
pub fn bucket_quantile(buckets: &BTreeMap<u64, f64>, q: f64) -> Option<f64> {
    let mut les: Vec<(f64, f64)> = buckets
        .iter()
        .map(|(k, v)| (f64::from_bits(*k), *v))
        .collect();
    les.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = les.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    les.iter().find(|(_, c)| *c >= rank).map(|(le, _)| *le)
}

pub fn now_epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn v4_at(base: Ipv4Addr, offset: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + offset as u32)
}

/// Endpoint `which` (0, 1) of Service `i`: 100.64.0.0/11.
pub fn endpoint(i: usize, which: usize) -> Ipv4Addr {
    v4_at(Ipv4Addr::new(100, 64, 0, 1), 2 * i + which)
}

/// The address the `k`-th change (over the whole run) moves an endpoint to:
/// 100.96.0.0/12.
pub fn moved(k: usize) -> Ipv4Addr {
    v4_at(Ipv4Addr::new(100, 96, 0, 1), k)
}

/// Node `i`'s IP (eth0 of its namespace, its Node object's InternalIP).
pub fn node_ip(i: usize) -> Ipv4Addr {
    v4_at(Ipv4Addr::new(10, 77, 0, 1), i)
}

/// Service `i`; with `own_cidr`, its ClusterIP is set: address `i + 1` of
/// [`BENCH_SERVICE_CIDR`]. Otherwise the apiserver allocates one.
pub fn service(i: usize, own_cidr: bool) -> Service {
    let mut spec = json!({"type": "ClusterIP",
        "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080}]});
    if own_cidr {
        spec["clusterIP"] = v4_at(Ipv4Addr::new(100, 112, 0, 1), i).to_string().into();
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("s{i}"), "namespace": NS},
        "spec": spec,
    }))
    .unwrap()
}

/// A second ServiceCIDR (object `bench`) for runs with more Services than the
/// cluster's own 10.96.0.0/16 holds: 1M addresses, beside the endpoints'
/// 100.64.0.0/11 and the moved endpoints' 100.96.0.0/12.
pub const BENCH_SERVICE_CIDR: &str = "100.112.0.0/12";
/// Above this many Services (or with `KNP_BENCH_OWN_SERVICE_CIDR=1`) the Services
/// get their ClusterIPs from [`BENCH_SERVICE_CIDR`].
pub const OWN_SERVICE_CIDR_ABOVE: usize = 60_000;

pub fn slice_endpoints(i: usize, second: Ipv4Addr) -> Value {
    json!([
        {"addresses": [endpoint(i, 0).to_string()], "conditions": {"ready": true}},
        {"addresses": [second.to_string()], "conditions": {"ready": true}}
    ])
}

pub fn slice(i: usize) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("s{i}-x"), "namespace": NS,
                     "labels": {"kubernetes.io/service-name": format!("s{i}"),
                                "endpointslice.kubernetes.io/managed-by": "bench"}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
        "endpoints": slice_endpoints(i, endpoint(i, 1)),
    }))
    .unwrap()
}

/// `cargo bench` passes `--bench`; the value of `--concurrency C` etc.
pub fn parse_value<T: std::str::FromStr>(flag: &str, v: Option<String>) -> T {
    v.and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{flag} needs a value"))
}

/// A control plane in a namespace of its own, with an API client on the calling
/// thread (which moves into that namespace). Dropped: the cluster stopped, then
/// the namespace deleted (field order).
pub struct ControlPlane {
    pub cluster: RealCluster,
    pub api: Netns,
    /// The folder of the built components (kube-proxy, kubectl).
    pub bins: String,
    pub rt: tokio::runtime::Runtime,
    pub client: kube::Client,
    /// Node links made so far (each node namespace gets the next /30).
    links: usize,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager in a new namespace
    /// (no endpoint reconciler: the `kubernetes` Service is not what is measured),
    /// creates the namespace [`NS`], and moves the calling thread into the control
    /// plane's namespace for its API client.
    pub fn up() -> ControlPlane {
        let api = Netns::new(unique("knp-kpapi"));
        ipn(
            &api.0,
            &["addr", "add", &format!("{API_ADDR}/32"), "dev", "lo"],
        );
        let cluster = RealCluster::up(&api.0, API_ADDR, &["--endpoint-reconciler-type=none"]);
        let bins = RealCluster::components_dir();
        cluster.kubectl(&["create", "namespace", NS]);
        enter_ns(&api.0).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let kubeconfig = cluster.dir.join("admin.kubeconfig");
        let client = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            kube::Client::try_from(config).unwrap()
        });
        ControlPlane {
            cluster,
            api,
            bins,
            rt,
            client,
            links: 0,
        }
    }

    /// A Node object `name` with InternalIP `ip` (what kube-proxy reads for its
    /// node IP and both proxies for their topology labels).
    pub fn add_node(&self, name: &str, ip: Ipv4Addr) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}))
        .unwrap();
        let status = json!({"status": {"addresses": [
            {"type": "InternalIP", "address": ip.to_string()},
            {"type": "Hostname", "address": name}]}});
        self.rt.block_on(async {
            nodes
                .create(&PostParams::default(), &node)
                .await
                .expect("create Node");
            nodes
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .expect("patch Node status");
        });
    }

    /// Creates `n` Services, then their `n` EndpointSlices, `concurrency` requests
    /// at a time; returns the ClusterIPs and how long it took. Above
    /// [`OWN_SERVICE_CIDR_ABOVE`] Services, first the ServiceCIDR `bench`
    /// ([`BENCH_SERVICE_CIDR`], not in the time), and each Service asks for its
    /// ClusterIP there.
    pub fn create_objects(&self, n: usize, concurrency: usize) -> (HashSet<Ipv4Addr>, Duration) {
        let own_cidr = n > OWN_SERVICE_CIDR_ABOVE
            || std::env::var_os("KNP_BENCH_OWN_SERVICE_CIDR").is_some_and(|v| v == "1");
        if own_cidr {
            self.cluster.apply(
                &json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
                    "metadata": {"name": "bench"}, "spec": {"cidrs": [BENCH_SERVICE_CIDR]}})
                .to_string(),
            );
            self.cluster.kubectl(&[
                "wait",
                "--for=condition=Ready",
                "servicecidr/bench",
                "--timeout=60s",
            ]);
        }
        let created = Instant::now();
        let services: Api<Service> = Api::namespaced(self.client.clone(), NS);
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), NS);
        let ips = self.rt.block_on(async {
            let pp = PostParams::default();
            let ips: HashSet<Ipv4Addr> = futures::stream::iter(0..n)
                .map(|i| {
                    let (services, pp) = (&services, &pp);
                    async move {
                        let s = services
                            .create(pp, &service(i, own_cidr))
                            .await
                            .expect("create Service");
                        s.spec
                            .unwrap()
                            .cluster_ip
                            .unwrap()
                            .parse::<Ipv4Addr>()
                            .unwrap()
                    }
                })
                .buffer_unordered(concurrency.max(1))
                .collect()
                .await;
            futures::stream::iter(0..n)
                .map(|i| {
                    let (slices, pp) = (&slices, &pp);
                    async move {
                        slices
                            .create(pp, &slice(i))
                            .await
                            .expect("create EndpointSlice");
                    }
                })
                .buffer_unordered(concurrency.max(1))
                .collect::<Vec<()>>()
                .await;
            ips
        });
        (ips, created.elapsed())
    }

    /// Moves endpoint 1 of Service `i`'s slice to `addr` (merge patch), the slice
    /// annotated with `endpoints.kubernetes.io/last-change-trigger-time` = now.
    pub fn move_endpoint(&self, i: usize, addr: Ipv4Addr) {
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), NS);
        let patch = json!({
            "metadata": {"annotations": {
                "endpoints.kubernetes.io/last-change-trigger-time": rfc3339(SystemTime::now())}},
            "endpoints": slice_endpoints(i, addr),
        });
        self.rt
            .block_on(slices.patch(
                &format!("s{i}-x"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ))
            .expect("patch EndpointSlice");
    }

    /// A namespace for one node: `ip` on eth0 (a veth pair inside the namespace:
    /// this kernel has no dummy links) and a veth to the control plane's namespace,
    /// with a route to the apiserver.
    pub fn node_ns(&mut self, ip: Ipv4Addr) -> Netns {
        self.links += 1;
        let i = self.links;
        let ns = Netns::new(unique("knp-kpnode"));
        ipn(
            &ns.0,
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
            ],
        );
        ipn(&ns.0, &["link", "set", "eth0p", "up"]);
        ipn(&ns.0, &["addr", "add", &format!("{ip}/16"), "dev", "eth0"]);
        ipn(&ns.0, &["link", "set", "eth0", "up"]);
        let base = Ipv4Addr::new(10, 251, 0, 0);
        let (node_a, api_a) = (v4_at(base, 4 * i + 1), v4_at(base, 4 * i + 2));
        let api_if = format!("n{i}");
        ipn(
            &self.api.0,
            &[
                "link", "add", &api_if, "type", "veth", "peer", "name", "api0", "netns", &ns.0,
            ],
        );
        ipn(
            &self.api.0,
            &["addr", "add", &format!("{api_a}/30"), "dev", &api_if],
        );
        ipn(&self.api.0, &["link", "set", &api_if, "up"]);
        ipn(
            &ns.0,
            &["addr", "add", &format!("{node_a}/30"), "dev", "api0"],
        );
        ipn(&ns.0, &["link", "set", "api0", "up"]);
        ipn(
            &ns.0,
            &[
                "route",
                "add",
                &format!("{API_ADDR}/32"),
                "via",
                &api_a.to_string(),
            ],
        );
        ns
    }

    /// The program and arguments of proxy `kind` on node `node` (`ip`): minimum
    /// sync period 0, metrics on 127.0.0.1:10249, healthz on 127.0.0.1:10256.
    pub fn args(&self, kind: Kind, node: &str, ip: Ipv4Addr) -> (String, Vec<String>) {
        match kind {
            Kind::Ours => (
                BIN.to_string(),
                [
                    "run",
                    "--source",
                    "kube",
                    "--kubeconfig",
                    &self.cluster.nlproxy_kubeconfig().display().to_string(),
                    "--hostname-override",
                    node,
                    "--node-ip",
                    &ip.to_string(),
                    "--cluster-cidr",
                    CLUSTER_CIDR,
                    "--detect-local-mode",
                    "ClusterCIDR",
                    "--min-sync-period",
                    "0s",
                    "--metrics-bind-address",
                    "127.0.0.1:10249",
                    "--healthz-bind-address",
                    "127.0.0.1:10256",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ),
            Kind::Nftables | Kind::Iptables => (
                format!("{}/kube-proxy", self.bins),
                self.cluster.kube_proxy_args_on(
                    if kind == Kind::Nftables {
                        "nftables"
                    } else {
                        "iptables"
                    },
                    CLUSTER_CIDR,
                    node,
                ),
            ),
        }
    }

    /// The pid of `etcd` or `kube-apiserver`.
    pub fn pid(&self, component: &str) -> u32 {
        self.cluster
            .pid(component)
            .unwrap_or_else(|| panic!("{component} is not running"))
    }

    /// The apiserver's own `/metrics` (as admin).
    pub fn apiserver_metrics(&self) -> ApiMetrics {
        let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
        let text = self
            .rt
            .block_on(self.client.request_text(req))
            .expect("GET /metrics");
        ApiMetrics::parse(&text)
    }

    /// The control plane's figures now: apiserver's metrics, CPU-seconds of
    /// kube-apiserver and etcd.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            metrics: self.apiserver_metrics(),
            cpu_apiserver: cpu_seconds(self.pid("kube-apiserver")),
            cpu_etcd: cpu_seconds(self.pid("etcd")),
        }
    }

    /// Resets kube-apiserver's and etcd's `VmHWM` (before a phase).
    pub fn reset_peaks(&self) {
        reset_peak_rss(self.pid("kube-apiserver"));
        reset_peak_rss(self.pid("etcd"));
    }

    /// kube-apiserver's and etcd's `VmHWM` in KiB.
    pub fn peaks(&self) -> (u64, u64) {
        (
            peak_rss_kb(self.pid("kube-apiserver")),
            peak_rss_kb(self.pid("etcd")),
        )
    }
}

/// What the apiserver says about itself.
#[derive(Default, Clone)]
pub struct ApiMetrics {
    /// `apiserver_request_duration_seconds_count` summed by (verb, resource).
    pub requests: BTreeMap<(String, String), f64>,
    /// `apiserver_watch_events_total` summed by resource kind.
    pub watch_events: BTreeMap<String, f64>,
    /// `process_resident_memory_bytes`.
    pub rss_bytes: f64,
    /// `apiserver_longrunning_requests` with verb WATCH (open watches).
    pub open_watches: f64,
}

impl ApiMetrics {
    pub fn parse(text: &str) -> ApiMetrics {
        let mut m = ApiMetrics::default();
        for (name, labels, v) in text.lines().filter_map(sample) {
            match name {
                "apiserver_request_duration_seconds_count" => {
                    let verb = label(&labels, "verb").unwrap_or("").to_string();
                    let mut res = label(&labels, "resource").unwrap_or("").to_string();
                    if let Some(sub) = label(&labels, "subresource").filter(|s| !s.is_empty()) {
                        res = format!("{res}/{sub}");
                    }
                    *m.requests.entry((verb, res)).or_insert(0.0) += v;
                }
                "apiserver_watch_events_total" => {
                    let kind = label(&labels, "kind")
                        .or(label(&labels, "resource"))
                        .unwrap_or("")
                        .to_string();
                    *m.watch_events.entry(kind).or_insert(0.0) += v;
                }
                "process_resident_memory_bytes" => m.rss_bytes = v,
                "apiserver_longrunning_requests" if label(&labels, "verb") == Some("WATCH") => {
                    m.open_watches += v
                }
                _ => {}
            }
        }
        m
    }
}

/// The control plane's figures at one moment.
#[derive(Clone)]
pub struct Snapshot {
    pub metrics: ApiMetrics,
    pub cpu_apiserver: f64,
    pub cpu_etcd: f64,
}

/// Markdown lines: the apiserver's requests (by verb and resource) and watch events
/// (by kind) between `a` and `b`, largest first, the `top` largest of each.
pub fn api_deltas(a: &ApiMetrics, b: &ApiMetrics, top: usize) -> Vec<String> {
    let mut req: Vec<(String, f64)> = b
        .requests
        .iter()
        .map(|(k, v)| {
            (
                format!("{} {}", k.0, k.1),
                v - a.requests.get(k).copied().unwrap_or(0.0),
            )
        })
        .filter(|(_, d)| *d > 0.0)
        .collect();
    req.sort_by(|x, y| y.1.total_cmp(&x.1));
    let mut ev: Vec<(String, f64)> = b
        .watch_events
        .iter()
        .map(|(k, v)| (k.clone(), v - a.watch_events.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    ev.sort_by(|x, y| y.1.total_cmp(&x.1));
    let join = |v: &[(String, f64)]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.iter()
                .take(top)
                .map(|(k, d)| format!("{k} {d:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    vec![
        format!("requests (verb resource count): {}", join(&req)),
        format!("watch events (kind count): {}", join(&ev)),
    ]
}
