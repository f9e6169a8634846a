//! kube-nlproxy against the real kube-proxy (v1.37.2 from `testenv/`), nftables
//! and iptables modes, on one real control plane (`scripts/cluster`, in a network
//! namespace of its own). N selector-less ClusterIP Services × 2 endpoints (one
//! EndpointSlice each, created through the API, managed by "bench") exist before
//! any proxy starts. Then, one proxy at a time, each in a fresh node namespace
//! (reached from the control plane over a veth):
//!
//! 1. start → programmed: from the spawn to the proxy's own
//!    `kubeproxy_sync_proxy_rules_last_timestamp_seconds` (the end of its first
//!    successful sync), polled on its `/metrics`; then the N ClusterIPs are counted
//!    in the kernel (`nft list table` / `iptables-save -t nat` in that namespace),
//!    and a sync that holds fewer than N is not counted as programmed;
//! 2. K changes, one endpoint moved each, the EndpointSlice annotated with
//!    `endpoints.kubernetes.io/last-change-trigger-time` = the write time: the
//!    proxy's own `kubeproxy_network_programming_duration_seconds` (mean of the K
//!    observations, from its histogram's sum and count), and end to end: from the
//!    API write to the first nf_tables generation change after which the new
//!    address is in the kernel's ruleset (generation polled every 200 µs; the
//!    ruleset dump after each generation change can delay the figure by one dump);
//! 3. CPU time (the process and the children it reaped, e.g. `nft`,
//!    `iptables-restore`: /proc/PID/stat) and peak RSS (VmHWM of the proxy
//!    process; children not included).
//!
//! All proxies run with `--min-sync-period 0s` (the rate limit is not measured).
//! No assertion on any time.
//!
//!   cargo bench --bench real_kube_proxy -- [N]... [--changes K] [--timeout S]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::cluster::RealCluster;
use common::{NODE, Netns, enter_ns, in_ns, ipn, status_kb, unique};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
/// kube-apiserver's address (on lo of the control-plane namespace).
const API_ADDR: &str = "10.250.0.254";
const NODE_IP: &str = "10.77.0.1";
const NS: &str = "bench";
/// Concurrent API requests while creating the objects.
const CONCURRENCY: usize = 32;

/// A proxy process (`ip netns exec NS BIN ...`, which execs: same pid); killed on
/// drop.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(ns: &str, bin: &str, args: &[String]) -> Proc {
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

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Removes the log, unless `KNP_BENCH_KEEP_LOGS` is set (then says where it is).
    fn remove_log(&self) {
        if std::env::var_os("KNP_BENCH_KEEP_LOGS").is_some() {
            eprintln!("log kept: {}", self.log.display());
        } else {
            let _ = fs::remove_file(&self.log);
        }
    }

    fn log_tail(&self) -> String {
        let s = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
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

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Ours,
    Nftables,
    Iptables,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Ours => "kube-nlproxy",
            Kind::Nftables => "kube-proxy nftables",
            Kind::Iptables => "kube-proxy iptables",
        }
    }

    /// The proxy's ruleset in `ns`, as text (oracle: `nft` / `iptables-save`).
    fn dump(self, ns: &str) -> String {
        let args: &[&str] = match self {
            Kind::Ours => &["nft", "list", "table", "ip", "kube-nlproxy"],
            Kind::Nftables => &["nft", "list", "table", "ip", "kube-proxy"],
            Kind::Iptables => &["iptables-save", "-t", "nat"],
        };
        let out = common::nsexec(ns, args);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Every IPv4 address in `text` (an address is a maximal run of digits and dots).
fn addresses(text: &str) -> HashSet<Ipv4Addr> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// CPU time of `pid` (all threads) and of the children it has reaped, in seconds
/// (/proc/PID/stat utime + stime + cutime + cstime).
fn cpu_seconds(pid: u32) -> f64 {
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
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// GET http://127.0.0.1:10249/metrics from namespace `ns`.
fn metrics(ns: &str) -> Option<String> {
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

/// The value of metric `name` (exact name): the series labelled
/// `ip_family="IPv4"` if there is one, else the one without `ip_family`.
fn metric(text: &str, name: &str) -> Option<f64> {
    let mut unlabelled = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once('}') {
                Some((l, v)) => (l, v),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        if labels.contains("ip_family=\"IPv4\"") {
            return Some(v);
        }
        if !labels.contains("ip_family") {
            unlabelled = Some(v);
        }
    }
    unlabelled
}

fn now_epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `t` as RFC 3339 with nanoseconds, UTC (what the trigger-time annotation holds).
fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap();
    let secs = d.as_secs() as i64;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        d.subsec_nanos()
    )
}

fn service(i: usize) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("s{i}"), "namespace": NS},
        "spec": {"type": "ClusterIP",
                 "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
    }))
    .unwrap()
}

fn first_endpoint(i: usize) -> String {
    format!("10.64.{}.{}", i / 250, 1 + i % 250)
}

fn slice_endpoints(i: usize, second: &str) -> Value {
    json!([
        {"addresses": [first_endpoint(i)], "conditions": {"ready": true}},
        {"addresses": [second], "conditions": {"ready": true}}
    ])
}

fn slice(i: usize) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("s{i}-x"), "namespace": NS,
                     "labels": {"kubernetes.io/service-name": format!("s{i}"),
                                "endpointslice.kubernetes.io/managed-by": "bench"}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
        "endpoints": slice_endpoints(i, &format!("10.65.{}.{}", i / 250, 1 + i % 250)),
    }))
    .unwrap()
}

/// The address the `k`-th change (over the whole run) moves an endpoint to.
fn moved(k: usize) -> String {
    format!("10.99.{}.{}", k / 250, 1 + k % 250)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// What one proxy measured.
#[derive(Default)]
struct Result {
    /// Start → programmed, or `None` when it did not finish in the time limit.
    programmed: Option<Duration>,
    counted: usize,
    cpu_programmed: f64,
    rss_programmed: u64,
    /// Mean of the proxy's own network-programming observations, and their number.
    npl_mean: Option<f64>,
    npl_count: u64,
    e2e: Vec<Duration>,
    e2e_missed: usize,
    /// How long each ruleset dump of the end-to-end probe took.
    dumps: Vec<Duration>,
    cpu_per_change: f64,
    rss_peak: u64,
}

struct Bench {
    cluster: RealCluster,
    api: Netns,
    bins: String,
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    n: usize,
    cluster_ips: HashSet<Ipv4Addr>,
    changes: usize,
    timeout: Duration,
    /// Changes made so far (over all proxies: every moved address is new).
    moved: usize,
    node_ifs: usize,
}

impl Bench {
    /// A node namespace for one proxy: the node address on a veth, a veth to
    /// the control plane's namespace.
    fn node_ns(&mut self) -> Netns {
        self.node_ifs += 1;
        let i = self.node_ifs;
        let ns = Netns::new(unique("knp-kpnode"));
        // (The kernel here has no dummy links: a veth pair inside the namespace.)
        ipn(
            &ns.0,
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
            ],
        );
        ipn(&ns.0, &["link", "set", "eth0p", "up"]);
        ipn(
            &ns.0,
            &["addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"],
        );
        ipn(&ns.0, &["link", "set", "eth0", "up"]);
        let (node_a, api_a) = (format!("10.250.{i}.1"), format!("10.250.{i}.2"));
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
            &["route", "add", &format!("{API_ADDR}/32"), "via", &api_a],
        );
        ns
    }

    fn args(&self, kind: Kind) -> (String, Vec<String>) {
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
                    NODE,
                    "--node-ip",
                    NODE_IP,
                    "--cluster-cidr",
                    "10.244.0.0/16",
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
            Kind::Nftables => (
                format!("{}/kube-proxy", self.bins),
                self.cluster.kube_proxy_args("nftables", "10.244.0.0/16"),
            ),
            Kind::Iptables => (
                format!("{}/kube-proxy", self.bins),
                self.cluster.kube_proxy_args("iptables", "10.244.0.0/16"),
            ),
        }
    }

    fn run(&mut self, kind: Kind) -> Result {
        let node = self.node_ns();
        let (bin, args) = self.args(kind);
        let mut r = Result::default();
        let start_epoch = now_epoch();
        let started = Instant::now();
        let mut p = Proc::spawn(&node.0, &bin, &args);
        let pid = p.pid();

        // 1. Start → programmed (the proxy's own last-sync timestamp; all N
        // ClusterIPs in the kernel).
        let mut checked_sync = 0.0;
        loop {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!(
                    "{} exited ({status}); log tail:\n{}",
                    kind.name(),
                    p.log_tail()
                );
            }
            if started.elapsed() > self.timeout {
                eprintln!(
                    "{}: not programmed in {:?}; log tail:\n{}",
                    kind.name(),
                    self.timeout,
                    p.log_tail()
                );
                return r;
            }
            std::thread::sleep(Duration::from_millis(50));
            let Some(m) = metrics(&node.0) else { continue };
            let Some(last) = metric(&m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") else {
                continue;
            };
            if last < start_epoch || last == checked_sync {
                continue;
            }
            let cpu = cpu_seconds(pid);
            let rss = status_kb(pid, "VmHWM:");
            checked_sync = last;
            let counted = addresses(&kind.dump(&node.0))
                .intersection(&self.cluster_ips)
                .count();
            eprintln!(
                "{}: sync done {:.2} s after start, {counted}/{} ClusterIPs in the kernel",
                kind.name(),
                last - start_epoch,
                self.n
            );
            if counted >= self.n {
                r.programmed = Some(Duration::from_secs_f64(last - start_epoch));
                r.counted = counted;
                r.cpu_programmed = cpu;
                r.rss_programmed = rss;
                break;
            }
        }

        // 2. K changes, one endpoint moved each.
        std::thread::sleep(Duration::from_secs(2));
        let m0 = metrics(&node.0).unwrap_or_default();
        let h = "kubeproxy_network_programming_duration_seconds";
        let (sum0, count0) = (
            metric(&m0, &format!("{h}_sum")).unwrap_or(0.0),
            metric(&m0, &format!("{h}_count")).unwrap_or(0.0),
        );
        let cpu0 = cpu_seconds(pid);
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), NS);
        for k in 0..self.changes {
            let i = (k * 7919) % self.n;
            let addr = moved(self.moved);
            self.moved += 1;
            let (ready_tx, ready_rx) = mpsc::channel();
            let ns = node.0.clone();
            let want: Ipv4Addr = addr.parse().unwrap();
            let limit = Duration::from_secs(60);
            let poller = std::thread::spawn(move || {
                enter_ns(&ns).unwrap();
                let mut s = kube_nlproxy_netlink::nft::NftSocket::new().unwrap();
                let mut last = s.generation().unwrap();
                ready_tx.send(()).unwrap();
                let deadline = Instant::now() + limit;
                let mut dumps = Vec::new();
                while Instant::now() < deadline {
                    let g = s.generation().unwrap_or(last);
                    if g != last {
                        let seen = Instant::now();
                        last = g;
                        let found = addresses(&kind.dump(&ns)).contains(&want);
                        dumps.push(seen.elapsed());
                        if found {
                            return (Some(seen), dumps);
                        }
                        continue;
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                (None, dumps)
            });
            ready_rx.recv().unwrap();
            let wrote = Instant::now();
            let patch = json!({
                "metadata": {"annotations": {
                    "endpoints.kubernetes.io/last-change-trigger-time": rfc3339(SystemTime::now())}},
                "endpoints": slice_endpoints(i, &addr),
            });
            self.rt
                .block_on(slices.patch(
                    &format!("s{i}-x"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                ))
                .expect("patch EndpointSlice");
            let (seen, dumps) = poller.join().unwrap();
            r.dumps.extend(dumps);
            match seen {
                Some(seen) => r.e2e.push(seen - wrote),
                None => r.e2e_missed += 1,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        r.cpu_per_change = (cpu_seconds(pid) - cpu0) / self.changes as f64;
        r.rss_peak = status_kb(pid, "VmHWM:");
        // The last observation is recorded right after the sync's commit.
        std::thread::sleep(Duration::from_millis(500));
        let m1 = metrics(&node.0).unwrap_or_default();
        let (sum1, count1) = (
            metric(&m1, &format!("{h}_sum")).unwrap_or(0.0),
            metric(&m1, &format!("{h}_count")).unwrap_or(0.0),
        );
        r.npl_count = (count1 - count0) as u64;
        if count1 > count0 {
            r.npl_mean = Some((sum1 - sum0) / (count1 - count0));
        }
        r.e2e.sort();
        drop(p);
        r
    }
}

fn fmt_ratio(theirs: f64, ours: f64) -> String {
    if ours > 0.0 {
        format!("{:.1}×", theirs / ours)
    } else {
        "—".to_string()
    }
}

fn run_scale(n: usize, changes: usize, timeout: Duration, kinds: &[Kind]) {
    let api = Netns::new(unique("knp-kpapi"));
    ipn(
        &api.0,
        &["addr", "add", &format!("{API_ADDR}/32"), "dev", "lo"],
    );
    let cluster = RealCluster::up(&api.0, API_ADDR, &["--endpoint-reconciler-type=none"]);
    let bins = RealCluster::components_dir();
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE,
        "labels": {"kubernetes.io/hostname": NODE}}});
    cluster.apply(&node.to_string());
    let status = json!({"status": {"addresses": [
        {"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": NODE}]}});
    cluster.kubectl(&[
        "patch",
        "node",
        NODE,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
    cluster.kubectl(&["create", "namespace", NS]);

    // The API client runs on this thread, which moves into the control plane's
    // namespace (its sockets are made here).
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

    let created = Instant::now();
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let cluster_ips: HashSet<Ipv4Addr> = rt.block_on(async {
        let pp = PostParams::default();
        let ips: Vec<Ipv4Addr> = futures::stream::iter(0..n)
            .map(|i| {
                let (services, pp) = (&services, &pp);
                async move {
                    let s = services
                        .create(pp, &service(i))
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
            .buffer_unordered(CONCURRENCY)
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
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        ips.into_iter().collect()
    });
    let creation = created.elapsed();
    eprintln!(
        "{n} Services + {n} EndpointSlices created in {:.2} s ({CONCURRENCY} concurrent requests)",
        creation.as_secs_f64()
    );

    let mut b = Bench {
        cluster,
        api,
        bins,
        rt,
        client,
        n,
        cluster_ips,
        changes,
        timeout,
        moved: 0,
        node_ifs: 0,
    };
    let results: Vec<(Kind, Result)> = kinds.iter().map(|&k| (k, b.run(k))).collect();
    print_table(n, changes, timeout, creation, &results);
    drop(b);
}

fn print_table(
    n: usize,
    changes: usize,
    timeout: Duration,
    creation: Duration,
    results: &[(Kind, Result)],
) {
    let ours = results
        .iter()
        .find(|(k, _)| *k == Kind::Ours)
        .map(|(_, r)| r);
    println!();
    println!(
        "### {n} services × 2 endpoints ({n} Services + {n} EndpointSlices created in {:.1} s)",
        creation.as_secs_f64()
    );
    println!();
    let mut head = "| |".to_string();
    let mut rule = "|---|".to_string();
    for (k, _) in results {
        head += &format!(" {} |", k.name());
        rule += "---|";
        if *k != Kind::Ours && ours.is_some() {
            head += " ratio |";
            rule += "---|";
        }
    }
    println!("{head}\n{rule}");
    type Row<'a> = (
        &'a str,
        Box<dyn Fn(&Result) -> Option<f64>>,
        fn(f64) -> String,
    );
    let secs = |v: f64| format!("{v:.2} s");
    let msf = |v: f64| format!("{:.1} ms", v * 1e3);
    let mib = |v: f64| format!("{:.0} MiB", v / 1024.0);
    let rows: Vec<Row> = vec![
        (
            "start → programmed (own last-sync timestamp, all N ClusterIPs in the kernel)",
            Box::new(|r: &Result| r.programmed.map(|d| d.as_secs_f64())),
            secs,
        ),
        (
            "CPU until programmed (process + reaped children)",
            Box::new(|r: &Result| r.programmed.map(|_| r.cpu_programmed)),
            secs,
        ),
        (
            "peak RSS when programmed",
            Box::new(|r: &Result| r.programmed.map(|_| r.rss_programmed as f64)),
            mib,
        ),
        (
            "own network-programming latency, mean of the changes' observations",
            Box::new(|r: &Result| r.npl_mean),
            msf,
        ),
        (
            "API write → address in the kernel, p50",
            Box::new(|r: &Result| {
                (!r.e2e.is_empty()).then(|| percentile(&r.e2e, 0.5).as_secs_f64())
            }),
            msf,
        ),
        (
            "API write → address in the kernel, p90",
            Box::new(|r: &Result| {
                (!r.e2e.is_empty()).then(|| percentile(&r.e2e, 0.9).as_secs_f64())
            }),
            msf,
        ),
        (
            "API write → address in the kernel, max",
            Box::new(|r: &Result| r.e2e.last().map(|d| d.as_secs_f64())),
            msf,
        ),
        (
            "CPU per change (process + reaped children)",
            Box::new(|r: &Result| r.programmed.map(|_| r.cpu_per_change)),
            msf,
        ),
        (
            "peak RSS after the changes",
            Box::new(|r: &Result| r.programmed.map(|_| r.rss_peak as f64)),
            mib,
        ),
    ];
    for (label, get, fmt) in &rows {
        let mut line = format!("| {label} |");
        let base = ours.and_then(get);
        for (k, r) in results {
            let v = get(r);
            let cell = match v {
                Some(v) => fmt(v),
                None if r.programmed.is_none() => {
                    format!("did not finish in {} s", timeout.as_secs())
                }
                None => "—".to_string(),
            };
            line += &format!(" {cell} |");
            if *k != Kind::Ours && ours.is_some() {
                line += &match (v, base) {
                    (Some(v), Some(b)) => format!(" {} |", fmt_ratio(v, b)),
                    _ => " — |".to_string(),
                };
            }
        }
        println!("{line}");
    }
    println!();
    for (k, r) in results {
        if r.programmed.is_some() {
            let mut dumps = r.dumps.clone();
            dumps.sort();
            println!(
                "- {}: {} of {changes} changes seen in the kernel within 60 s; {} network-programming observations; {} ClusterIPs counted; {} ruleset dumps by the probe (p50 {:.1} ms, max {:.1} ms)",
                k.name(),
                r.e2e.len(),
                r.npl_count,
                r.counted,
                dumps.len(),
                dumps
                    .get(dumps.len() / 2)
                    .map_or(0.0, |d| d.as_secs_f64() * 1e3),
                dumps.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
            );
        }
    }
}

fn main() {
    let mut scales = Vec::new();
    let mut changes = 20;
    let mut timeout = Duration::from_secs(300);
    let mut kinds = vec![Kind::Ours, Kind::Nftables, Kind::Iptables];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--changes" => {
                changes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--changes K")
            }
            "--timeout" => {
                timeout = Duration::from_secs(
                    args.next()
                        .and_then(|v| v.parse().ok())
                        .expect("--timeout S"),
                )
            }
            "--no-iptables" => kinds.retain(|k| *k != Kind::Iptables),
            v => scales.push(v.parse::<usize>().expect("N")),
        }
    }
    if scales.is_empty() {
        scales = vec![1_000];
    }
    for n in scales {
        run_scale(n, changes.max(1), timeout, &kinds);
    }
}
