//! A churn soak of `run` on the kube source: the real daemon (release build)
//! in a node network namespace against the test API server (as
//! `benches/kube_run.rs` runs it), N ClusterIP services with 1–3 endpoints each,
//! then random writes at a fixed rate for a long time:
//!
//! - add: a new Service and its EndpointSlice (a free ClusterIP);
//! - change: the endpoints of a live Service replaced (1–3 new addresses);
//! - delete: a live Service and its EndpointSlice.
//!
//! Half of the writes are changes, a quarter adds, a quarter deletes, drawn
//! from a seeded RNG: one seed, one sequence of writes.
//!
//! Reports, with no assertion on any time:
//! - the daemon's RSS (VmRSS and RssAnon) and CPU every sample period, and the
//!   max/min ratio of VmRSS after the warm-up;
//! - sync failures and drift repairs, read from the daemon's `/status` and
//!   `/metrics` (`kubeproxy_sync_proxy_rules_nftables_sync_failures_total`);
//! - at the end, once the daemon is idle, its kernel tables against those of
//!   a fresh daemon (`run --once`) in a second, identical topology whose API
//!   server holds only the final objects: `nft -j list table` of both,
//!   handles dropped, elements of each set and map compared as sets, rules of
//!   each chain compared in order.
//!
//! Exits 1 when a sync failed or the tables differ (RSS is only printed).
//!
//!   cargo bench --bench churn_soak
//!
//! Environment (defaults in brackets): `KNP_SOAK_SECS` churn duration [1800],
//! `KNP_SOAK_RATE` writes per second [20], `KNP_SOAK_SERVICES` services at start
//! [10000], `KNP_SOAK_SEED` [1], `KNP_SOAK_SAMPLE_SECS` RSS sample period [30],
//! `KNP_SOAK_WARMUP_SECS` churn time before the RSS ratio counts [a quarter
//! of the run, at most 300]. `KUBE_NLPROXY_BIN=PATH` runs that binary instead
//! of cargo's.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::apiserver::FakeApiServer;
use common::{Proxy, Topo, status_kb, unique};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};

/// The soak's knobs, from the environment.
#[derive(Debug)]
struct Settings {
    /// How long the writes go on.
    churn: Duration,
    /// Writes per second.
    rate: f64,
    /// Services at start; the population walks around it.
    services: usize,
    /// The RNG's seed.
    seed: u64,
    /// Time between RSS samples.
    sample: Duration,
    /// Churn time before the RSS samples count for the max/min ratio.
    warmup: Duration,
}

impl Settings {
    fn from_env() -> Settings {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
            match std::env::var(name) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v:?}: not a number")),
                Err(_) => default,
            }
        }
        let secs: u64 = var("KNP_SOAK_SECS", 1800);
        let rate: f64 = var("KNP_SOAK_RATE", 20.0);
        assert!(rate > 0.0, "KNP_SOAK_RATE must be positive");
        Settings {
            churn: Duration::from_secs(secs),
            rate,
            services: var("KNP_SOAK_SERVICES", 10_000),
            seed: var("KNP_SOAK_SEED", 1),
            sample: Duration::from_secs(var("KNP_SOAK_SAMPLE_SECS", 30).max(1)),
            warmup: Duration::from_secs(var("KNP_SOAK_WARMUP_SECS", (secs / 4).min(300))),
        }
    }
}

/// Service `s{slot}` of namespace `soak`: ClusterIP port 80 → 8080.
fn service(slot: usize) -> Value {
    let ip = cluster_ip(slot);
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("s{slot}"), "namespace": "soak"},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
    })
}

/// The ClusterIP of a slot: 10.96.0.0/16 holds 250 × 256 of them.
fn cluster_ip(slot: usize) -> String {
    format!("10.96.{}.{}", slot / 250, 1 + slot % 250)
}

/// The EndpointSlice of `s{slot}` with ready `endpoints`.
fn slice(slot: usize, endpoints: &[Ipv4Addr]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|a| json!({"addresses": [a.to_string()], "conditions": {"ready": true}}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("s{slot}-x"), "namespace": "soak",
                     "labels": {"kubernetes.io/service-name": format!("s{slot}")}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    })
}

/// One write of the churn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Add,
    Change,
    Delete,
}

/// The objects the API server holds, and the seeded draw of the next write.
/// Services live in slots (slot `i`: `s{i}` at [`cluster_ip`]`(i)`); twice
/// the starting count of slots leaves room for adds.
struct Cluster {
    rng: StdRng,
    /// Endpoints of the Service in each slot, `None` for a free slot.
    endpoints: Vec<Option<Vec<Ipv4Addr>>>,
    /// Slots with a Service, in no order (picked by index).
    live: Vec<usize>,
    /// Slots without one.
    free: Vec<usize>,
}

impl Cluster {
    /// `services` live in slots `0..services`, each with random endpoints.
    fn new(services: usize, seed: u64) -> Cluster {
        let slots = (services * 2).max(2);
        assert!(slots <= 250 * 256, "at most {} services", 250 * 128);
        let mut c = Cluster {
            rng: StdRng::seed_from_u64(seed),
            endpoints: vec![None; slots],
            live: (0..services).collect(),
            free: (services..slots).rev().collect(),
        };
        for slot in 0..services {
            c.endpoints[slot] = Some(c.draw_endpoints());
        }
        c
    }

    /// 1–3 distinct pod addresses in 10.64.0.0/12.
    fn draw_endpoints(&mut self) -> Vec<Ipv4Addr> {
        let n = self.rng.random_range(1..=3);
        let base = u32::from(Ipv4Addr::new(10, 64, 0, 0));
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let a = Ipv4Addr::from(base + self.rng.random_range(1..(1u32 << 20)));
            if !v.contains(&a) {
                v.push(a);
            }
        }
        v
    }

    /// Draws the next write, applies it here and returns it with its slot.
    fn next(&mut self) -> (Op, usize) {
        let roll = self.rng.random_range(0..4);
        let op = match roll {
            _ if self.live.is_empty() => Op::Add,
            0 if !self.free.is_empty() => Op::Add,
            1 => Op::Delete,
            _ => Op::Change,
        };
        match op {
            Op::Add => {
                let i = self.rng.random_range(0..self.free.len());
                let slot = self.free.swap_remove(i);
                self.endpoints[slot] = Some(self.draw_endpoints());
                self.live.push(slot);
                (op, slot)
            }
            Op::Change => {
                let slot = self.live[self.rng.random_range(0..self.live.len())];
                self.endpoints[slot] = Some(self.draw_endpoints());
                (op, slot)
            }
            Op::Delete => {
                let i = self.rng.random_range(0..self.live.len());
                let slot = self.live.swap_remove(i);
                self.endpoints[slot] = None;
                self.free.push(slot);
                (op, slot)
            }
        }
    }

    /// The slice of a live slot.
    fn slice(&self, slot: usize) -> Value {
        slice(slot, self.endpoints[slot].as_deref().unwrap_or_default())
    }

    /// Creates every live Service and slice on `api`.
    fn create_all(&self, api: &FakeApiServer) {
        for slot in 0..self.endpoints.len() {
            if self.endpoints[slot].is_some() {
                api.create(service(slot));
                api.create(self.slice(slot));
            }
        }
    }

    /// Sends a write drawn by [`Cluster::next`] to `api`.
    fn send(&self, api: &FakeApiServer, (op, slot): (Op, usize)) {
        match op {
            Op::Add => {
                api.create(service(slot));
                api.create(self.slice(slot));
            }
            Op::Change => {
                api.update(self.slice(slot));
            }
            Op::Delete => {
                api.delete(&slice(slot, &[]));
                api.delete(&service(slot));
            }
        }
    }
}

/// CPU time of every thread of `pid` so far, in seconds (schedstat: ns).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum::<u64>() as f64
        / 1e9
}

/// What the daemon says about its syncs: `/status` and `/metrics` on its
/// metrics address (127.0.0.1:10249 in the node namespace).
#[derive(Debug, Default)]
struct Health {
    syncs: u64,
    /// `/status` `sync_failures`.
    failures: u64,
    /// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`, all families.
    metric_failures: u64,
    drift_repairs: u64,
    last_error: Option<String>,
    /// Service and endpoint changes the daemon has not synced yet.
    pending: u64,
}

fn health(ns: &str) -> Result<Health, String> {
    let addr = common::sa(common::ip("127.0.0.1"), 10249);
    let (code, status) = common::http_get(ns, addr, "/status")?;
    if code != 200 {
        return Err(format!("/status: HTTP {code}"));
    }
    let status: Value = serde_json::from_str(&status).map_err(|e| format!("/status: {e}"))?;
    let (code, metrics) = common::http_get(ns, addr, "/metrics")?;
    if code != 200 {
        return Err(format!("/metrics: HTTP {code}"));
    }
    let sum = |prefix: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    Ok(Health {
        syncs: status["syncs"].as_u64().unwrap_or(0),
        failures: status["sync_failures"].as_u64().unwrap_or(0),
        metric_failures: sum("kubeproxy_sync_proxy_rules_nftables_sync_failures_total"),
        drift_repairs: status["drift_repairs"].as_u64().unwrap_or(0),
        last_error: status["last_error"].as_str().map(str::to_string),
        pending: sum("kubeproxy_sync_proxy_rules_service_changes_pending")
            + sum("kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
    })
}

/// The nf_tables generation id of namespace `ns`.
fn generation(ns: &str) -> u32 {
    common::in_ns(ns, || {
        kube_nlproxy_netlink::nft::NftSocket::new()
            .and_then(|mut s| s.generation())
            .unwrap_or(0)
    })
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// One table of ours as `nft -j list table` shows it, normalized so two
/// kernels that hold the same objects compare equal: no handles, no
/// `expires`, counters at zero, the elements of each set or map sorted.
#[derive(Debug, Default, PartialEq)]
struct Dump {
    /// Tables, chains, sets, maps and any other named object, by
    /// `kind family table name`, without their elements.
    objects: BTreeMap<String, Value>,
    /// The elements of each set and map, sorted (as JSON text).
    elements: BTreeMap<String, Vec<String>>,
    /// The rules of each chain, in order (as JSON text).
    rules: BTreeMap<String, Vec<String>>,
}

/// Drops what differs between equal kernels: `expires` of elements, and the
/// packet and byte counts of counters.
fn scrub(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("expires");
            if let Some(Value::Object(c)) = m.get_mut("counter") {
                for k in ["packets", "bytes"] {
                    if c.contains_key(k) {
                        c.insert(k.into(), json!(0));
                    }
                }
            }
            m.values_mut().for_each(scrub);
        }
        Value::Array(a) => a.iter_mut().for_each(scrub),
        _ => {}
    }
}

impl Dump {
    /// `nft -j list table FAMILY kube-nlproxy` in `ns`; `None` when the table
    /// is not there.
    fn read(ns: &str, family: &str) -> Option<Dump> {
        let out = common::nsexec(ns, &["nft", "-j", "list", "table", family, "kube-nlproxy"]);
        if !out.status.success() {
            return None;
        }
        let all: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("nft -j list table {family} kube-nlproxy: {e}"));
        let mut d = Dump::default();
        for item in all["nftables"].as_array().into_iter().flatten() {
            let Some((kind, body)) = item.as_object().and_then(|o| o.iter().next()) else {
                continue;
            };
            if kind == "metainfo" {
                continue;
            }
            let mut body = body.clone();
            scrub(&mut body);
            let Some(o) = body.as_object_mut() else {
                continue;
            };
            o.remove("handle");
            let s = |k: &str| o.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            if kind == "rule" {
                let chain = format!("{} {} {}", s("family"), s("table"), s("chain"));
                d.rules.entry(chain).or_default().push(body.to_string());
                continue;
            }
            let key = match kind.as_str() {
                "table" => format!("table {} {}", s("family"), s("name")),
                _ => format!("{kind} {} {} {}", s("family"), s("table"), s("name")),
            };
            if let Some(elem) = o.remove("elem") {
                let mut e: Vec<String> = elem
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(Value::to_string)
                    .collect();
                e.sort();
                d.elements.insert(key.clone(), e);
            }
            if kind == "chain" {
                d.rules.entry(key.replacen("chain ", "", 1)).or_default();
            }
            d.objects.insert(key, body);
        }
        Some(d)
    }

    fn count(&self) -> String {
        format!(
            "{} objects ({} chains, {} sets/maps), {} rules, {} elements",
            self.objects.len(),
            self.objects
                .keys()
                .filter(|k| k.starts_with("chain "))
                .count(),
            self.objects
                .keys()
                .filter(|k| k.starts_with("set ") || k.starts_with("map "))
                .count(),
            self.rules.values().map(Vec::len).sum::<usize>(),
            self.elements.values().map(Vec::len).sum::<usize>(),
        )
    }

    /// What differs between `self` (the soaked kernel) and `fresh`, one
    /// line each.
    fn differences(&self, fresh: &Dump) -> Vec<String> {
        let mut out = Vec::new();
        for (k, v) in &self.objects {
            match fresh.objects.get(k) {
                None => out.push(format!("only soaked: {k}")),
                Some(f) if f != v => out.push(format!("{k}: soaked {v}, fresh {f}")),
                _ => {}
            }
        }
        for k in fresh.objects.keys() {
            if !self.objects.contains_key(k) {
                out.push(format!("only fresh: {k}"));
            }
        }
        let empty = Vec::new();
        let side = |a: &[String], b: &[String]| -> Vec<String> {
            a.iter()
                .filter(|x| b.binary_search(x).is_err())
                .cloned()
                .collect()
        };
        let keys: std::collections::BTreeSet<&String> =
            self.elements.keys().chain(fresh.elements.keys()).collect();
        for k in keys {
            let (a, b) = (
                self.elements.get(k).unwrap_or(&empty),
                fresh.elements.get(k).unwrap_or(&empty),
            );
            if a != b {
                let (only_a, only_b) = (side(a, b), side(b, a));
                out.push(format!(
                    "{k}: {} elements only soaked (first {:?}), {} only fresh (first {:?})",
                    only_a.len(),
                    only_a.first(),
                    only_b.len(),
                    only_b.first()
                ));
            }
        }
        let keys: std::collections::BTreeSet<&String> =
            self.rules.keys().chain(fresh.rules.keys()).collect();
        for k in keys {
            let (a, b) = (
                self.rules.get(k).unwrap_or(&empty),
                fresh.rules.get(k).unwrap_or(&empty),
            );
            if a != b {
                let (mut sa, mut sb) = (a.clone(), b.clone());
                sa.sort();
                sb.sort();
                if sa == sb {
                    out.push(format!("chain {k}: same {} rules, other order", a.len()));
                } else {
                    let (only_a, only_b) = (side(&sa, &sb), side(&sb, &sa));
                    out.push(format!(
                        "chain {k}: {} rules only soaked (first {:?}), {} only fresh (first {:?})",
                        only_a.len(),
                        only_a.first(),
                        only_b.len(),
                        only_b.first()
                    ));
                }
            }
        }
        out
    }
}

/// One RSS sample.
struct Sample {
    /// Churn time when it was taken.
    at: Duration,
    rss_kb: u64,
}

/// The daemon's flags: those of `benches/kube_run.rs` (a sync as soon as a
/// change arrives).
const ARGS: [&str; 2] = ["--min-sync-period", "0s"];

/// Runs the soak; true when no sync failed and the tables are equal.
fn soak(s: &Settings) -> bool {
    let t = Topo::new();
    let api = FakeApiServer::start_in_netns(&t.node);
    let mut cluster = Cluster::new(s.services, s.seed);
    cluster.create_all(&api);
    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique("knp-soak")));
    api.write_kubeconfig(&kubeconfig);
    let mut proxy = Proxy::new(&t, common::proxy_bin())
        .with_kube_source(&kubeconfig)
        .with_args(&ARGS);
    let started = Instant::now();
    proxy.start();
    let pid = proxy.pid().expect("running");
    let programmed = common::eventually(Duration::from_secs(300), || {
        proxy.log().contains("sync: committed")
    });
    assert!(programmed, "never programmed; log:\n{}", proxy.log());
    println!(
        "{} services programmed in {:.2} s; churn {} s at {}/s (seed {}), RSS every {} s, warm-up {} s",
        s.services,
        started.elapsed().as_secs_f64(),
        s.churn.as_secs(),
        s.rate,
        s.seed,
        s.sample.as_secs(),
        s.warmup.as_secs(),
    );
    println!(
        "\n| churn time | writes | services | VmRSS | RssAnon | VmHWM | CPU since last | syncs | sync failures | drift repairs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");

    let mut samples = Vec::new();
    let mut ops: BTreeMap<Op, usize> = BTreeMap::new();
    let mut written = 0u64;
    let mut max_lag = Duration::ZERO;
    let mut cpu_last = (Instant::now(), cpu_seconds(pid));
    let mut record = |at: Duration, written: u64, live: usize| {
        let h = health(&t.node).unwrap_or_else(|e| {
            println!("(health: {e})");
            Health::default()
        });
        let rss = status_kb(pid, "VmRSS:");
        let now = (Instant::now(), cpu_seconds(pid));
        let cpu = (now.1 - cpu_last.1) / (now.0 - cpu_last.0).as_secs_f64().max(1e-9);
        cpu_last = now;
        println!(
            "| {:.0} s | {written} | {live} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.0}% | {} | {} | {} |",
            at.as_secs_f64(),
            mib(rss),
            mib(status_kb(pid, "RssAnon:")),
            mib(status_kb(pid, "VmHWM:")),
            cpu * 100.0,
            h.syncs,
            h.failures,
            h.drift_repairs,
        );
        samples.push(Sample { at, rss_kb: rss });
    };
    record(Duration::ZERO, 0, cluster.live.len());

    let churn_start = Instant::now();
    let mut next_sample = s.sample;
    loop {
        let at = churn_start.elapsed();
        if at >= next_sample {
            record(next_sample, written, cluster.live.len());
            next_sample += s.sample;
            continue;
        }
        if at >= s.churn {
            break;
        }
        // Write k is due at k / rate; late writes catch up at once.
        let due = Duration::from_secs_f64(written as f64 / s.rate);
        if due > at {
            std::thread::sleep((due - at).min(next_sample - at));
            continue;
        }
        max_lag = max_lag.max(at - due);
        let op = cluster.next();
        cluster.send(&api, op);
        *ops.entry(op.0).or_default() += 1;
        written += 1;
    }
    let churned = churn_start.elapsed();
    println!(
        "\n{written} writes in {:.1} s ({:.2}/s; add {}, change {}, delete {}), each write at most {:.0} ms behind its schedule; {} services at the end",
        churned.as_secs_f64(),
        written as f64 / churned.as_secs_f64(),
        ops.get(&Op::Add).unwrap_or(&0),
        ops.get(&Op::Change).unwrap_or(&0),
        ops.get(&Op::Delete).unwrap_or(&0),
        max_lag.as_secs_f64() * 1e3,
        cluster.live.len(),
    );

    // Idle: nothing pending and no commit for 3 s.
    let idle_since = Instant::now();
    let mut last = (generation(&t.node), Instant::now());
    let idle = common::eventually(Duration::from_secs(300), || {
        let g = generation(&t.node);
        if g != last.0 {
            last = (g, Instant::now());
        }
        last.1.elapsed() >= Duration::from_secs(3) && health(&t.node).is_ok_and(|h| h.pending == 0)
    });
    println!(
        "daemon idle after {:.1} s{}",
        idle_since.elapsed().as_secs_f64(),
        if idle { "" } else { " (NOT idle after 300 s)" }
    );
    let end = health(&t.node).unwrap_or_else(|e| panic!("health at the end: {e}"));
    let rss_end = status_kb(pid, "VmRSS:");
    let after: Vec<u64> = samples
        .iter()
        .filter(|x| x.at >= s.warmup)
        .map(|x| x.rss_kb)
        .collect();
    let (lo, hi) = (
        after.iter().copied().min().unwrap_or(0),
        after.iter().copied().max().unwrap_or(0),
    );
    println!(
        "VmRSS after warm-up ({} samples from {} s): min {:.1} MiB, max {:.1} MiB, max/min {:.3}; at the end {:.1} MiB",
        after.len(),
        s.warmup.as_secs(),
        mib(lo),
        mib(hi),
        hi as f64 / lo.max(1) as f64,
        mib(rss_end),
    );
    println!(
        "syncs {}, sync failures {} (/status) / {} (/metrics), drift repairs {}, last error {:?}",
        end.syncs, end.failures, end.metric_failures, end.drift_repairs, end.last_error
    );

    // The final objects, rendered fresh: a second topology and API server,
    // `run --once` with the same flags.
    let t2 = Topo::new();
    let api2 = FakeApiServer::start_in_netns(&t2.node);
    cluster.create_all(&api2);
    let kubeconfig2 = std::env::temp_dir().join(format!("{}.kubeconfig", unique("knp-soak")));
    api2.write_kubeconfig(&kubeconfig2);
    let fresh = Proxy::new(&t2, common::proxy_bin())
        .with_kube_source(&kubeconfig2)
        .with_args(&ARGS);
    let took = Instant::now();
    let out = fresh.once();
    println!(
        "fresh daemon (run --once, final objects, second topology): {} in {:.2} s",
        out.status,
        took.elapsed().as_secs_f64()
    );
    let mut equal = out.status.success();
    if !equal {
        println!("{}", common::output_text(&out));
    }
    for family in ["ip", "ip6"] {
        let (soaked, renewed) = (Dump::read(&t.node, family), Dump::read(&t2.node, family));
        match (soaked, renewed) {
            (None, None) => println!("table {family} kube-nlproxy: in neither kernel"),
            (Some(a), Some(b)) => {
                let diff = a.differences(&b);
                println!(
                    "table {family} kube-nlproxy: soaked {}; fresh {}: {}",
                    a.count(),
                    b.count(),
                    if diff.is_empty() {
                        "equal".to_string()
                    } else {
                        format!("{} DIFFERENCES", diff.len())
                    }
                );
                for d in diff.iter().take(20) {
                    println!("  {d}");
                }
                equal &= diff.is_empty();
            }
            (a, b) => {
                println!(
                    "table {family} kube-nlproxy: soaked {}, fresh {}: DIFFER",
                    a.map_or("absent".into(), |d| d.count()),
                    b.map_or("absent".into(), |d| d.count()),
                );
                equal = false;
            }
        }
    }
    proxy.stop();
    let _ = std::fs::remove_file(&kubeconfig);
    let _ = std::fs::remove_file(&kubeconfig2);
    let ok = equal && end.failures == 0 && end.metric_failures == 0 && idle;
    println!(
        "\nresult: sync failures {}, tables {}: {}",
        end.failures.max(end.metric_failures),
        if equal { "equal" } else { "DIFFER" },
        if ok { "PASS" } else { "FAIL" }
    );
    ok
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken from the command line.
    let settings = Settings::from_env();
    let ok = soak(&settings);
    std::process::exit(if ok { 0 } else { 1 });
}
