//! The kube source end to end, with real packets: the binary (`run --source kube`)
//! runs in the node namespace against the fake API server of
//! `tests/common/apiserver.rs`, which listens on 127.0.0.1 inside that same
//! namespace. Checked:
//!
//! - objects created on the API are programmed and carry traffic (ClusterIP from a
//!   pod, NodePort from EXT), endpoint moves are followed, a deleted Service stops
//!   being served;
//! - no flap: a cut watch or a 410 relist of identical objects makes zero kernel
//!   writes while traffic keeps flowing; objects deleted while the watch was
//!   broken disappear after the relist;
//! - the first sync waits for every initial list;
//! - network programming latency over 100 EndpointSlice changes, from the
//!   `kubeproxy_network_programming_duration_seconds` histogram and from our own
//!   API-write → table-changed timing (printed, never asserted).
//!
//! Needs root (network namespaces, nftables). The tests of this file run one at a
//! time (a process-wide lock) so that the latency numbers are not skewed by the
//! others on a small machine.
mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::apiserver::{FakeApiServer, Resource};
use common::*;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
/// Ordinary "the proxy picked it up" bound.
const WAIT: Duration = Duration::from_secs(15);
/// Recovery paths go through kube's watcher backoff (0.8 s doubling, jitter).
const RECOVERY: Duration = Duration::from_secs(30);
/// Timeout of a request expected to be unserved.
const SHORT: Duration = Duration::from_millis(700);
/// How long to keep looking after an event for a sync it should not cause
/// (longer than the default --min-sync-period of 1 s).
const SETTLE: Duration = Duration::from_millis(1500);
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
const WEB_VIP: &str = "10.96.0.10";
const WEB_NODE_PORT: u16 = 30080;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------
// Objects
// ---------------------------------------------------------------------------

fn node_object() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {"addresses": [
            {"type": "InternalIP", "address": NODE_V4.to_string()},
            {"type": "Hostname", "address": NODE},
        ]},
    })
}

/// A NodePort Service: TCP and UDP port 80 → 8080, both on `node_port`.
fn service(name: &str, vip: &str, node_port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "type": "NodePort",
            "clusterIP": vip, "clusterIPs": [vip],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "ports": [
                {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": node_port},
                {"name": "dns", "protocol": "UDP", "port": 80, "targetPort": 8080, "nodePort": node_port},
            ],
        },
    })
}

/// The EndpointSlice `<svc>-1` of `svc` with the pods `eps` (ready), optionally
/// annotated with a last-change trigger time.
fn endpoint_slice(svc: &str, eps: &[&Pod], trigger: Option<&str>) -> Value {
    let endpoints: Vec<Value> = eps
        .iter()
        .map(|p| {
            json!({
                "addresses": [p.v4.to_string()],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": p.node_name(),
            })
        })
        .collect();
    let mut s = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{svc}-1"), "namespace": "default",
            "labels": {"kubernetes.io/service-name": svc},
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [
            {"name": "http", "protocol": "TCP", "port": 8080},
            {"name": "dns", "protocol": "UDP", "port": 8080},
        ],
    });
    if let Some(t) = trigger {
        s["metadata"]["annotations"] = json!({ TRIGGER_TIME: t });
    }
    s
}

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// Topology + API server in the node namespace + the binary pointed at it. Fields
/// drop in order: the proxy first, then the server, the namespaces last.
struct Cluster {
    proxy: Proxy,
    api: FakeApiServer,
    kubeconfig: PathBuf,
    t: Topo,
}

impl Cluster {
    /// Pods `client` (local), `a` (local), `b` (remote); the proxy is not started.
    fn new(extra_args: &[&str]) -> Cluster {
        let mut t = Topo::new();
        t.add_pod("client", Where::Local);
        t.add_pod("a", Where::Local);
        t.add_pod("b", Where::Remote);
        let api = FakeApiServer::start_in_netns(&t.node);
        let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique("knp-kube")));
        api.write_kubeconfig(&kubeconfig);
        let mut proxy = Proxy::new(&t, BIN).with_kube_source(&kubeconfig);
        proxy.args.extend(extra_args.iter().map(|s| s.to_string()));
        Cluster {
            proxy,
            api,
            kubeconfig,
            t,
        }
    }

    fn pod(&self, name: &str) -> Pod {
        self.t.pod(name).clone()
    }

    fn client(&self) -> String {
        self.t.pod("client").ns.clone()
    }

    /// Number of syncs that sent something to the kernel so far.
    fn commits(&self) -> usize {
        self.proxy.log().matches("sync: committed").count()
    }

    /// The "sync: committed" log lines after the first `skip`.
    fn commit_lines(&self, skip: usize) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains("sync: committed"))
            .skip(skip)
            .map(strip_ansi)
            .collect()
    }

    /// The proxy's log, for failure messages.
    fn log(&self) -> String {
        self.proxy.log()
    }

    /// Waits until `pod` answers on the web ClusterIP (TCP) from the client pod.
    fn wait_served_by(&self, vip: &str, pod: &str) {
        let client = self.client();
        let ok = eventually(WAIT, || {
            tcp(&client, sa(ip(vip), 80), SHORT).is_ok_and(|r| r.pod == pod)
        });
        assert!(ok, "{vip} never answered from {pod}; log:\n{}", self.log());
    }

    /// Syncs the daemon ran so far, with or without kernel writes
    /// (`kubeproxy_sync_proxy_rules_duration_seconds_count`).
    fn syncs(&self) -> u64 {
        let m = http_get(&self.t.node, sa(ip("127.0.0.1"), 10249), "/metrics")
            .unwrap_or_else(|e| panic!("metrics: {e}"));
        histogram(&m, "kubeproxy_sync_proxy_rules_duration_seconds").1
    }

    /// Watch requests per resource so far.
    fn watch_counts(&self) -> [usize; 3] {
        [
            self.api.watch_count(Resource::Services),
            self.api.watch_count(Resource::EndpointSlices),
            self.api.watch_count(Resource::Nodes),
        ]
    }

    /// List requests per resource so far.
    fn list_counts(&self) -> [usize; 3] {
        [
            self.api.list_count(Resource::Services),
            self.api.list_count(Resource::EndpointSlices),
            self.api.list_count(Resource::Nodes),
        ]
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// Drops ANSI escape sequences (the log is colored).
fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(ch);
        }
    }
    out
}

/// `nft monitor` in a namespace: every ruleset change the kernel makes there,
/// whatever its content (the oracle for "zero kernel writes").
struct NftMonitor {
    child: Child,
    out: PathBuf,
}

impl NftMonitor {
    fn start(ns: &str) -> NftMonitor {
        let out = std::env::temp_dir().join(format!("{}.nft-monitor", unique("knp")));
        let file = std::fs::File::create(&out).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "nft", "monitor"])
            .stdout(Stdio::from(file))
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nft monitor");
        // Give it time to subscribe before anything it must see happens.
        thread::sleep(Duration::from_millis(300));
        NftMonitor { child, out }
    }

    /// What it printed so far.
    fn events(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for NftMonitor {
    fn drop(&mut self) {
        // `ip netns exec` execs nft: the child's pid is nft's.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

/// A plain HTTP/1.1 GET from inside `ns`: the body of a 200 answer.
fn http_get(ns: &str, addr: SocketAddr, path: &str) -> Result<String, String> {
    match common::http_get(ns, addr, path)? {
        (200, body) => Ok(body),
        (code, body) => Err(format!("HTTP {code}: {body}")),
    }
}

/// The IPv4 series of a histogram from a Prometheus text exposition:
/// (cumulative buckets (le, count), count, sum).
fn histogram(metrics: &str, name: &str) -> (Vec<(f64, u64)>, u64, f64) {
    let family = r#"ip_family="IPv4""#;
    let mut buckets = Vec::new();
    let (mut count, mut sum) = (0, 0.0);
    for line in metrics.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if !series.contains(family) {
            continue;
        }
        if series.starts_with(&format!("{name}_bucket{{")) {
            let le = series
                .split("le=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .unwrap();
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            buckets.push((le, value.parse().unwrap()));
        } else if series.starts_with(&format!("{name}_count{{")) {
            count = value.parse().unwrap();
        } else if series.starts_with(&format!("{name}_sum{{")) {
            sum = value.parse().unwrap();
        }
    }
    (buckets, count, sum)
}

/// `histogram_quantile`: linear interpolation inside the bucket holding rank q·n.
fn bucket_quantile(q: f64, buckets: &[(f64, u64)]) -> f64 {
    let total = buckets.last().map_or(0, |b| b.1) as f64;
    let rank = q * total;
    let mut prev = (0.0, 0u64);
    for &(le, c) in buckets {
        if c as f64 >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            let in_bucket = (c - prev.1) as f64;
            if in_bucket == 0.0 {
                return le;
            }
            return prev.0 + (le - prev.0) * (rank - prev.1 as f64) / in_bucket;
        }
        prev = (le, c);
    }
    f64::NAN
}

/// Nearest-rank percentile of measured durations.
fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// Objects from the API carry traffic; endpoint moves and deletion are followed.
#[test]
fn api_objects_carry_traffic_and_follow_changes() {
    let _serial = serial();
    let mut c = Cluster::new(&[]);
    let (a, b) = (c.pod("a"), c.pod("b"));
    let client = c.client();
    let client_ip: IpAddr = c.pod("client").v4.into();
    c.api.create(node_object());
    c.api.create(service("web", WEB_VIP, WEB_NODE_PORT));
    c.api.create(endpoint_slice("web", &[&a], None));
    c.proxy.start();

    let vip = sa(ip(WEB_VIP), 80);
    let node_port = sa(NODE_V4, WEB_NODE_PORT);
    c.wait_served_by(WEB_VIP, "a");
    let r = expect_ok(
        "pod → ClusterIP (TCP)",
        tcp(&client, vip, OK_TIMEOUT),
        &["a"],
    );
    assert_eq!(
        r.src, client_ip,
        "a pod's ClusterIP connection is not masqueraded"
    );
    let r = expect_ok(
        "pod → ClusterIP (UDP)",
        udp(&client, vip, None, OK_TIMEOUT),
        &["a"],
    );
    assert_eq!(r.src, client_ip);
    let r = expect_ok(
        "EXT → NodePort",
        tcp(&c.t.ext, node_port, OK_TIMEOUT),
        &["a"],
    );
    assert!(
        Topo::node_addrs(false).contains(&r.src),
        "EXT → NodePort (eTP Cluster) must be masqueraded to the node, saw {}",
        r.src
    );
    let table = c.proxy.table().expect("table");
    assert!(table.contains(WEB_VIP), "table:\n{table}");

    // Move the endpoint to the remote pod.
    c.api.update(endpoint_slice("web", &[&b], None));
    c.wait_served_by(WEB_VIP, "b");
    let r = expect_ok("pod → ClusterIP → b", tcp(&client, vip, OK_TIMEOUT), &["b"]);
    assert_eq!(r.src, client_ip);
    let r = expect_ok(
        "pod → ClusterIP → b (UDP)",
        udp(&client, vip, None, OK_TIMEOUT),
        &["b"],
    );
    assert_eq!(r.src, client_ip);
    let r = expect_ok(
        "EXT → NodePort → b",
        tcp(&c.t.ext, node_port, OK_TIMEOUT),
        &["b"],
    );
    assert!(Topo::node_addrs(false).contains(&r.src), "saw {}", r.src);
    for _ in 0..5 {
        expect_ok("only b now", tcp(&client, vip, OK_TIMEOUT), &["b"]);
    }

    // No endpoints: the ClusterIP rejects.
    c.api.update(endpoint_slice("web", &[], None));
    let rejected = eventually(WAIT, || tcp(&client, vip, SHORT) == Err(ConnErr::Refused));
    assert!(rejected, "no reject without endpoints; log:\n{}", c.log());
    expect_fast_err(
        "EXT → NodePort without endpoints",
        || tcp(&c.t.ext, node_port, OK_TIMEOUT),
        ConnErr::Refused,
        fast(false),
    );

    // Back to a, then delete the Service (and its slice, as the controller would).
    c.api.update(endpoint_slice("web", &[&a], None));
    c.wait_served_by(WEB_VIP, "a");
    c.api.delete(&service("web", WEB_VIP, WEB_NODE_PORT));
    let gone = c
        .proxy
        .wait_table(WAIT, |t| !t.contains(WEB_VIP) && !t.contains("30080"));
    assert!(gone, "the Service stayed in the table; log:\n{}", c.log());
    c.api.delete(&endpoint_slice("web", &[], None));
    let r = tcp(&client, vip, SHORT);
    assert!(
        matches!(r, Err(ConnErr::Timeout | ConnErr::Refused)),
        "deleted ClusterIP still served: {r:?}"
    );
    // Nothing listens on the node itself: the NodePort now gets a RST.
    expect_err(
        "EXT → NodePort of a deleted Service",
        tcp(&c.t.ext, node_port, OK_TIMEOUT),
        ConnErr::Refused,
    );
    assert!(c.proxy.running(), "the proxy exited; log:\n{}", c.log());
}

/// Cut watches resume without a single kernel write while traffic flows: once
/// resuming at once, once with every reconnection failing twice (a real outage).
#[test]
fn dropped_watches_make_no_kernel_writes() {
    let _serial = serial();
    let mut c = Cluster::new(&[]);
    let (a, b) = (c.pod("a"), c.pod("b"));
    let client = c.client();
    let client_ip: IpAddr = c.pod("client").v4.into();
    c.api.create(node_object());
    c.api.create(service("web", WEB_VIP, WEB_NODE_PORT));
    c.api.create(endpoint_slice("web", &[&a], None));
    c.proxy.start();
    c.wait_served_by(WEB_VIP, "a");
    thread::sleep(SETTLE);

    let commits = c.commits();
    let table = c.proxy.table();
    let monitor = NftMonitor::start(&c.t.node);
    for failures in [0, 2] {
        let syncs = c.syncs();
        let watches = c.watch_counts();
        let lists = c.list_counts();
        let prober = Prober::start(&client, sa(ip(WEB_VIP), 80));
        thread::sleep(Duration::from_millis(300));
        for r in [
            Resource::Services,
            Resource::EndpointSlices,
            Resource::Nodes,
        ] {
            c.api.fail_next(r, 500, failures);
        }
        let dropped = Instant::now();
        c.api.drop_watches();
        let resumed = eventually(RECOVERY, || {
            // Every failure takes one request (list or watch), then one more watch.
            let (w, l) = (c.watch_counts(), c.list_counts());
            (0..3).all(|i| w[i] > watches[i] && w[i] + l[i] > watches[i] + lists[i] + failures)
                && c.api.open_watches() >= 4
        });
        assert!(resumed, "watches not re-established; log:\n{}", c.log());
        let outage = dropped.elapsed();
        thread::sleep(SETTLE);
        let n = prober.finish("traffic across the cut", "a", client_ip);
        eprintln!(
            "drop_watches ({failures} failed reconnections each): watching again after {outage:?}; \
             {n} requests all answered; lists {lists:?} -> {:?}; watches {watches:?} -> {:?}; \
             daemon syncs {syncs} -> {}",
            c.list_counts(),
            c.watch_counts(),
            c.syncs()
        );
        assert_eq!(
            c.commits(),
            commits,
            "a resumed watch wrote to the kernel; log:\n{}",
            c.log()
        );
        assert_eq!(c.proxy.table(), table, "the table changed across the cut");
        assert_eq!(monitor.events(), "", "nft monitor saw kernel writes");
    }

    // Later changes still apply (and the monitor does see writes).
    c.api.update(endpoint_slice("web", &[&b], None));
    c.wait_served_by(WEB_VIP, "b");
    // The log line follows the commit (and the conntrack cleanup after it).
    assert!(
        eventually(WAIT, || c.commits() == commits + 1),
        "{} commits after {commits}; log:\n{}",
        c.commits(),
        c.log()
    );
    assert!(
        eventually(WAIT, || !monitor.events().is_empty()),
        "nft monitor saw nothing of a real change"
    );
}

/// 410 Gone → relist of identical objects: no kernel write; objects deleted while
/// the watch was broken disappear after the relist.
#[test]
fn relist_after_410_makes_no_kernel_writes_and_drops_deleted_objects() {
    let _serial = serial();
    let mut c = Cluster::new(&[]);
    let a = c.pod("a");
    let client = c.client();
    let client_ip: IpAddr = c.pod("client").v4.into();
    const OLD_VIP: &str = "10.96.0.11";
    c.api.create(node_object());
    c.api.create(service("web", WEB_VIP, WEB_NODE_PORT));
    c.api.create(endpoint_slice("web", &[&a], None));
    c.api.create(service("old", OLD_VIP, 30081));
    c.api.create(endpoint_slice("old", &[&a], None));
    c.proxy.start();
    c.wait_served_by(WEB_VIP, "a");
    c.wait_served_by(OLD_VIP, "a");
    thread::sleep(SETTLE);

    // (1) Identical relist.
    let commits = c.commits();
    let table = c.proxy.table();
    let lists = c.list_counts();
    let syncs = c.syncs();
    let monitor = NftMonitor::start(&c.t.node);
    let prober = Prober::start(&client, sa(ip(WEB_VIP), 80));
    thread::sleep(Duration::from_millis(300));
    let expired = Instant::now();
    c.api.expire_history();
    let relisted = eventually(RECOVERY, || {
        let now = c.list_counts();
        (0..3).all(|i| now[i] > lists[i]) && c.api.open_watches() >= 4
    });
    assert!(relisted, "no relist after 410; log:\n{}", c.log());
    let took = expired.elapsed();
    thread::sleep(SETTLE);
    let n = prober.finish("traffic across the relist", "a", client_ip);
    eprintln!(
        "expire_history: relisted and watching after {took:?}; {n} requests all answered; \
         lists {lists:?} -> {:?}; daemon syncs {syncs} -> {}",
        c.list_counts(),
        c.syncs()
    );
    assert_eq!(monitor.events(), "", "nft monitor saw kernel writes");
    drop(monitor);
    assert_eq!(
        c.commits(),
        commits,
        "a relist of identical objects wrote to the kernel; log:\n{}",
        c.log()
    );
    assert_eq!(
        c.proxy.table(),
        table,
        "the table changed across the relist"
    );

    // (2) Deleted while the watch is broken: the Service/EndpointSlice watches are
    // cut and fail to come back (500) while `old` is deleted and the history that
    // recorded the deletion is forgotten; only the relist can tell.
    let lists = c.list_counts();
    let prober = Prober::start(&client, sa(ip(WEB_VIP), 80));
    c.api.fail_next(Resource::Services, 500, 2);
    c.api.fail_next(Resource::EndpointSlices, 500, 2);
    let broken = Instant::now();
    c.api.drop_watches();
    c.api.delete(&service("old", OLD_VIP, 30081));
    c.api.delete(&endpoint_slice("old", &[], None));
    c.api.expire_history();
    let gone = c.proxy.wait_table(RECOVERY, |t| !t.contains(OLD_VIP));
    assert!(
        gone,
        "the Service deleted during the outage stayed; log:\n{}",
        c.log()
    );
    let took = broken.elapsed();
    let at_removal = c.list_counts();
    assert!(
        at_removal[0] > lists[0],
        "removed without a Service relist? lists {lists:?} -> {at_removal:?}"
    );
    // The EndpointSlice watcher relists too (maybe later).
    let relisted = eventually(RECOVERY, || {
        let now = c.list_counts();
        (0..3).all(|i| now[i] > lists[i]) && c.api.open_watches() >= 4
    });
    assert!(relisted, "not every watcher relisted; log:\n{}", c.log());
    let now = c.list_counts();
    thread::sleep(SETTLE);
    let n = prober.finish("traffic while the watch was broken", "a", client_ip);
    let writes = c.commits() - commits;
    for l in c.commit_lines(commits) {
        eprintln!("  {l}");
    }
    eprintln!(
        "deleted while broken: gone from the table after {took:?} (lists then {at_removal:?}); \
         {writes} kernel write(s); {n} requests to the other service all answered; \
         lists {lists:?} -> {now:?}"
    );
    assert!(
        (1..=2).contains(&writes),
        "expected one write per relisted kind at most, got {writes}; log:\n{}",
        c.log()
    );
    let r = tcp(&client, sa(ip(OLD_VIP), 80), SHORT);
    assert!(
        matches!(r, Err(ConnErr::Timeout | ConnErr::Refused)),
        "deleted ClusterIP still served: {r:?}"
    );
    expect_ok(
        "the other service",
        tcp(&client, sa(ip(WEB_VIP), 80), OK_TIMEOUT),
        &["a"],
    );
}

/// No table before every initial list succeeded.
#[test]
fn first_sync_waits_for_every_initial_list() {
    let _serial = serial();
    let mut c = Cluster::new(&[]);
    let a = c.pod("a");
    c.api.create(node_object());
    c.api.create(service("web", WEB_VIP, WEB_NODE_PORT));
    c.api.create(endpoint_slice("web", &[&a], None));
    const FAILURES: usize = 3;
    c.api.fail_next(Resource::Nodes, 500, FAILURES);
    let started = Instant::now();
    c.proxy.start();

    // Until the Node list succeeds (request FAILURES + 1), there is no table. The
    // table is read before the count, so a table seen with the count still low
    // was made before the good list was even asked for.
    let mut checks = 0;
    loop {
        let table = c.proxy.table();
        let node_lists = c.api.list_count(Resource::Nodes);
        if node_lists > FAILURES {
            break;
        }
        assert!(
            table.is_none(),
            "table created after {node_lists} failed Node list(s):\n{}\nlog:\n{}",
            table.unwrap_or_default(),
            c.log()
        );
        assert_eq!(c.commits(), 0, "log:\n{}", c.log());
        checks += 1;
        assert!(
            started.elapsed() < RECOVERY,
            "the Node list was not retried enough; log:\n{}",
            c.log()
        );
        thread::sleep(Duration::from_millis(50));
    }
    let lists_done = started.elapsed();
    assert!(
        c.api.watch_count(Resource::Services) >= 1
            && c.api.watch_count(Resource::EndpointSlices) >= 1,
        "services and slices were listed while the Node list failed"
    );
    assert!(
        c.proxy.wait_table(WAIT, |t| t.contains(WEB_VIP)),
        "no table after the lists succeeded; log:\n{}",
        c.log()
    );
    let programmed = started.elapsed();
    eprintln!(
        "first sync: {checks} checks saw no table during {FAILURES} failed Node lists; \
         lists done at {lists_done:?}, table at {programmed:?}"
    );
    c.wait_served_by(WEB_VIP, "a");
}

/// 100 EndpointSlice changes: network programming latency from the histogram and
/// from API write → table changed.
#[test]
fn network_programming_latency() {
    let _serial = serial();
    // Each change is written once the previous one is in the kernel; with the
    // default --min-sync-period (1 s) every sync would wait for the rate limit,
    // which measures the limit, not the pipeline.
    // KNP_LATENCY_MIN_SYNC_PERIOD overrides it (e.g. `1s` to see the limiter).
    let min_sync = std::env::var("KNP_LATENCY_MIN_SYNC_PERIOD").unwrap_or_else(|_| "0".into());
    eprintln!("--min-sync-period {min_sync}");
    let mut c = Cluster::new(&["--min-sync-period", &min_sync]);
    let (a, b) = (c.pod("a"), c.pod("b"));
    let node_ns = c.t.node.clone();
    let metrics_addr = sa(ip("127.0.0.1"), 10249);
    c.api.create(node_object());
    c.api.create(service("web", WEB_VIP, WEB_NODE_PORT));
    c.api.create(endpoint_slice("web", &[&a], None));
    c.proxy.start();
    c.wait_served_by(WEB_VIP, "a");
    thread::sleep(SETTLE);

    const METRIC: &str = "kubeproxy_network_programming_duration_seconds";
    let before = http_get(&node_ns, metrics_addr, "/metrics").expect("metrics");
    let (buckets0, count0, sum0) = histogram(&before, METRIC);
    let commits0 = c.commits();

    const CHANGES: usize = 100;
    let mut e2e = Vec::with_capacity(CHANGES);
    let mut table = c.proxy.table().unwrap();
    for i in 0..CHANGES {
        let (to, from) = if i % 2 == 0 { (&b, &a) } else { (&a, &b) };
        let (want, unwant) = (to.v4.to_string(), from.v4.to_string());
        let written = Instant::now();
        c.api.update(endpoint_slice(
            "web",
            &[to],
            Some(&common::rfc3339(SystemTime::now())),
        ));
        loop {
            if let Some(t) = c.proxy.table()
                && t != table
                && t.contains(&want)
                && !t.contains(&unwant)
            {
                table = t;
                break;
            }
            assert!(
                written.elapsed() < WAIT,
                "change {i} never reached the table; log:\n{}",
                c.log()
            );
            thread::sleep(Duration::from_millis(2));
        }
        e2e.push(written.elapsed());
    }
    // Traffic follows the last state (change 99 moved the endpoint back to a).
    c.wait_served_by(WEB_VIP, "a");

    // The observation comes right after the commit: wait until all are counted.
    let mut after = String::new();
    let counted = eventually(WAIT, || {
        after = http_get(&node_ns, metrics_addr, "/metrics").unwrap_or_default();
        histogram(&after, METRIC).1 >= count0 + CHANGES as u64
    });
    let (buckets, count, sum) = histogram(&after, METRIC);
    let delta: Vec<(f64, u64)> = buckets
        .iter()
        .map(|&(le, n)| {
            let n0 = buckets0.iter().find(|b| b.0 == le).map_or(0, |b| b.1);
            (le, n - n0)
        })
        .collect();
    let observed = count - count0;
    let commits = c.commits() - commits0;

    // What one poll costs (spawning `ip netns exec … nft list table`): the
    // resolution of the end-to-end numbers.
    let mut polls: Vec<Duration> = (0..20)
        .map(|_| {
            let t = Instant::now();
            c.proxy.table();
            t.elapsed()
        })
        .collect();
    polls.sort();

    let mut sorted = e2e.clone();
    sorted.sort();
    let mean = sorted.iter().sum::<Duration>() / sorted.len() as u32;
    eprintln!("network programming latency over {CHANGES} EndpointSlice changes:");
    eprintln!(
        "  histogram {METRIC}{{ip_family=\"IPv4\"}}: {observed} observations, \
         exact mean {:.1} ms (sum/count); p50 {:.1} ms, p99 {:.1} ms by histogram_quantile \
         interpolation (buckets 0, 0.25 s, 0.5 s, 1 s, ...: below 250 ms the bucket \
         width, not the data, sets these)",
        (sum - sum0) / observed.max(1) as f64 * 1000.0,
        bucket_quantile(0.5, &delta) * 1000.0,
        bucket_quantile(0.99, &delta) * 1000.0,
    );
    let nonzero: Vec<String> = delta
        .iter()
        .scan(0, |prev, &(le, n)| {
            let here = n - *prev;
            *prev = n;
            Some((le, here))
        })
        .filter(|(_, n)| *n > 0)
        .map(|(le, n)| format!("le {le}: {n}"))
        .collect();
    eprintln!("  histogram buckets hit: {}", nonzero.join(", "));
    eprintln!(
        "  end to end (API write -> `nft list table` shows it, polled every ~2 ms + nft run time): \
         min {:.1} ms, p50 {:.1} ms, mean {:.1} ms, p99 {:.1} ms, max {:.1} ms; {commits} kernel commits",
        ms(sorted[0]),
        ms(percentile(&sorted, 0.5)),
        ms(mean),
        ms(percentile(&sorted, 0.99)),
        ms(*sorted.last().unwrap()),
    );
    eprintln!(
        "  one `nft list table` poll costs p50 {:.1} ms (max {:.1} ms)",
        ms(percentile(&polls, 0.5)),
        ms(*polls.last().unwrap())
    );
    eprintln!(
        "SUMMARY latency: histogram mean {:.1} ms, p50 {:.0} ms p99 {:.0} ms (interpolated, {observed} obs); \
         e2e p50 {:.1} ms p99 {:.1} ms ({CHANGES} changes)",
        (sum - sum0) / observed.max(1) as f64 * 1000.0,
        bucket_quantile(0.5, &delta) * 1000.0,
        bucket_quantile(0.99, &delta) * 1000.0,
        ms(percentile(&sorted, 0.5)),
        ms(percentile(&sorted, 0.99)),
    );
    assert!(
        counted,
        "only {observed} network programming observations for {CHANGES} changes"
    );
    assert!(observed >= CHANGES as u64);
    assert!(
        commits >= CHANGES,
        "{commits} commits for {CHANGES} changes"
    );
}

#[test]
fn rfc3339_formatting() {
    let at = |secs: u64, nanos: u32| {
        common::rfc3339(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(nanos.into()))
    };
    assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000000Z");
    assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.000000005Z");
    assert_eq!(
        at(1_767_225_599, 120_000_000),
        "2025-12-31T23:59:59.120000000Z"
    );
}
