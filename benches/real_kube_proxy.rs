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
//!    in the kernel (our `cluster-ips` set, kube-proxy's `service-ips` map, the
//!    `KUBE-SERVICES` chain, in that namespace), and a sync that holds fewer than N
//!    is not counted as programmed;
//! 2. K changes, one endpoint moved each, the EndpointSlice annotated with
//!    `endpoints.kubernetes.io/last-change-trigger-time` = the write time: the
//!    proxy's own `kubeproxy_network_programming_duration_seconds` (mean of the K
//!    observations, from its histogram's sum and count), and end to end: from the
//!    API write to the first nf_tables generation change after which the new
//!    address is in the kernel (`real_control_plane/probe.rs`: the generation
//!    polled every 500 µs, then one narrow read of the changed service, no ruleset
//!    dump);
//! 3. CPU time (the process and the children it reaped, e.g. `nft`,
//!    `iptables-restore`: /proc/PID/stat) and peak RSS (VmHWM of the proxy
//!    process; children not included).
//!
//! All proxies run with `--min-sync-period 0s` (the rate limit is not measured).
//! No assertion on any time.
//!
//!   cargo bench --bench real_kube_proxy -- [N]... [--changes K] [--timeout S]
//!       [--concurrency C] [--no-iptables]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "real_control_plane/mod.rs"]
mod real_control_plane;

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::NODE;
use real_control_plane::probe::{Pending, Probe, service_chains};
use real_control_plane::{
    ControlPlane, DEFAULT_CONCURRENCY, Kind, LAST_SYNC, NPL, Proc, cpu_seconds, metric, metrics,
    moved, node_ip, now_epoch, parse_value, peak_rss_kb, percentile,
};

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
    /// How long each narrow check of the end-to-end probe took.
    checks: Vec<Duration>,
    cpu_per_change: f64,
    rss_peak: u64,
}

struct Bench {
    cp: ControlPlane,
    n: usize,
    cluster_ips: HashSet<Ipv4Addr>,
    changes: usize,
    timeout: Duration,
    /// Changes made so far (over all proxies: every moved address is new).
    moved: usize,
}

impl Bench {
    fn run(&mut self, kind: Kind) -> Result {
        let node = self.cp.node_ns(node_ip(0));
        let (bin, args) = self.cp.args(kind, NODE, node_ip(0));
        let mut r = Result::default();
        let start_epoch = now_epoch();
        let started = Instant::now();
        let mut p = Proc::spawn(&node.0, &bin, &args);
        let pid = p.pid();

        // 1. Start → programmed (the proxy's own last-sync timestamp; all N
        // ClusterIPs in the kernel).
        let mut checked_sync = 0.0;
        loop {
            p.check_alive(kind.name());
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
            let Some(last) = metric(&m, LAST_SYNC) else {
                continue;
            };
            if last < start_epoch || last == checked_sync {
                continue;
            }
            let cpu = cpu_seconds(pid);
            let rss = peak_rss_kb(pid);
            checked_sync = last;
            let counted = kind.count_cluster_ips(&node.0, &self.cluster_ips);
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
        let chains = Arc::new(service_chains(kind, &node.0));
        let m0 = metrics(&node.0).unwrap_or_default();
        let (sum0, count0) = (
            metric(&m0, &format!("{NPL}_sum")).unwrap_or(0.0),
            metric(&m0, &format!("{NPL}_count")).unwrap_or(0.0),
        );
        let cpu0 = cpu_seconds(pid);
        for k in 0..self.changes {
            let i = (k * 7919) % self.n;
            let addr = moved(self.moved);
            self.moved += 1;
            let probe = Probe::start(&node.0, kind, chains.clone());
            let wrote = Instant::now();
            probe.expect(Pending {
                service: i,
                addr,
                wrote,
            });
            self.cp.move_endpoint(i, addr);
            let seen = probe.finish(Instant::now() + Duration::from_secs(60));
            r.e2e.extend(seen.latencies);
            r.e2e_missed += seen.missed;
            r.checks.extend(seen.checks);
            std::thread::sleep(Duration::from_millis(100));
        }
        r.cpu_per_change = (cpu_seconds(pid) - cpu0) / self.changes as f64;
        r.rss_peak = peak_rss_kb(pid);
        // The last observation is recorded right after the sync's commit.
        std::thread::sleep(Duration::from_millis(500));
        let m1 = metrics(&node.0).unwrap_or_default();
        let (sum1, count1) = (
            metric(&m1, &format!("{NPL}_sum")).unwrap_or(0.0),
            metric(&m1, &format!("{NPL}_count")).unwrap_or(0.0),
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

fn run_scale(n: usize, changes: usize, timeout: Duration, concurrency: usize, kinds: &[Kind]) {
    let cp = ControlPlane::up();
    cp.add_node(NODE, node_ip(0));
    let (cluster_ips, creation) = cp.create_objects(n, concurrency);
    eprintln!(
        "{n} Services + {n} EndpointSlices created in {:.2} s ({concurrency} concurrent requests)",
        creation.as_secs_f64()
    );
    let mut b = Bench {
        cp,
        n,
        cluster_ips,
        changes,
        timeout,
        moved: 0,
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
            let mut checks = r.checks.clone();
            checks.sort();
            println!(
                "- {}: {} of {changes} changes seen in the kernel within 60 s; {} network-programming observations; {} ClusterIPs counted; {} narrow checks by the probe (p50 {:.1} ms, max {:.1} ms)",
                k.name(),
                r.e2e.len(),
                r.npl_count,
                r.counted,
                checks.len(),
                checks
                    .get(checks.len() / 2)
                    .map_or(0.0, |d| d.as_secs_f64() * 1e3),
                checks.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
            );
        }
    }
}

fn main() {
    let mut scales = Vec::new();
    let mut changes = 20;
    let mut timeout = Duration::from_secs(300);
    let mut concurrency = DEFAULT_CONCURRENCY;
    let mut kinds = vec![Kind::Ours, Kind::Nftables, Kind::Iptables];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--changes" => changes = parse_value("--changes K", args.next()),
            "--timeout" => timeout = Duration::from_secs(parse_value("--timeout S", args.next())),
            "--concurrency" => concurrency = parse_value("--concurrency C", args.next()),
            "--no-iptables" => kinds.retain(|k| *k != Kind::Iptables),
            v => scales.push(v.parse::<usize>().expect("N")),
        }
    }
    if scales.is_empty() {
        scales = vec![1_000];
    }
    for n in scales {
        run_scale(n, changes.max(1), timeout, concurrency, &kinds);
    }
}
