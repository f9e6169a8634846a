//! A fleet of proxies against one real control plane (`scripts/cluster`: etcd,
//! kube-apiserver, kube-controller-manager v1.37.2 from `testenv/`, in a network
//! namespace of its own). S selector-less ClusterIP Services × 2 endpoints (one
//! EndpointSlice each, managed by "bench") exist before any proxy starts, and one
//! Node object per node (`node-I`, InternalIP 10.77.x.y). Then, for each kind of
//! proxy (kube-nlproxy, kube-proxy nftables, kube-proxy iptables), in fresh node
//! namespaces (one per node, reached from the control plane over a veth):
//!
//! 1. **rollout**: all `nodes` proxies started at once; per node, from the spawn to
//!    the proxy's own `kubeproxy_sync_proxy_rules_last_timestamp_seconds` after
//!    which all S ClusterIPs are in that node's kernel; the apiserver's and etcd's
//!    CPU-seconds (/proc/PID/stat) and peak RSS (`VmHWM`, reset before the phase
//!    with `echo 5 > /proc/PID/clear_refs`) over the phase;
//! 2. **churn**: `churn-rate` endpoint moves per second for `churn-secs` (each
//!    slice annotated with `endpoints.kubernetes.io/last-change-trigger-time`):
//!    apiserver and etcd CPU, the proxies' summed CPU, the network-programming
//!    latency from every proxy's `kubeproxy_network_programming_duration_seconds`
//!    histogram (buckets merged across nodes; p50 and p99 are bucket bounds) and
//!    end to end (API write → in the kernel) from `real_control_plane/probe.rs` on
//!    the first `probe-nodes` nodes;
//! 3. **restart**: node 0's proxy stopped and started again: the apiserver's and
//!    etcd's CPU-seconds and the apiserver's requests during its relist.
//!
//! Before and after each phase the bench reads the apiserver's own `/metrics`
//! (`apiserver_request_duration_seconds_count` by verb and resource,
//! `apiserver_watch_events_total`, `process_resident_memory_bytes`) and prints the
//! deltas. No assertion on any time.
//!
//!   cargo bench --bench fleet -- [--nodes 50] [--services 10000] [--churn-rate 10]
//!       [--churn-secs 120] [--kinds ours,nftables] [--timeout S] [--concurrency C]
//!       [--probe-nodes P]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "real_control_plane/mod.rs"]
mod real_control_plane;

use std::collections::{BTreeMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Netns;
use real_control_plane::probe::{Pending, Probe, service_chains};
use real_control_plane::{
    ApiMetrics, ControlPlane, DEFAULT_CONCURRENCY, Kind, LAST_SYNC, NPL, Proc, Snapshot,
    api_deltas, bucket_quantile, buckets, cpu_seconds, metric, metrics, moved, node_ip, now_epoch,
    parse_value, peak_rss_kb, percentile,
};

struct Config {
    nodes: usize,
    services: usize,
    churn_rate: f64,
    churn_secs: f64,
    kinds: Vec<Kind>,
    timeout: Duration,
    concurrency: usize,
    probe_nodes: usize,
}

/// The control plane's figures over one phase.
struct Phase {
    before: Snapshot,
    after: Snapshot,
    /// kube-apiserver's and etcd's `VmHWM` at the end of the phase (KiB).
    peaks: (u64, u64),
    secs: f64,
}

impl Phase {
    fn cpu_apiserver(&self) -> f64 {
        self.after.cpu_apiserver - self.before.cpu_apiserver
    }

    fn cpu_etcd(&self) -> f64 {
        self.after.cpu_etcd - self.before.cpu_etcd
    }

    fn deltas(&self) -> Vec<String> {
        let (a, b): (&ApiMetrics, &ApiMetrics) = (&self.before.metrics, &self.after.metrics);
        let mut v = api_deltas(a, b, 10);
        v.push(format!(
            "apiserver process_resident_memory_bytes {:.0} → {:.0} MiB; open watches {:.0} → {:.0}",
            a.rss_bytes / 1048576.0,
            b.rss_bytes / 1048576.0,
            a.open_watches,
            b.open_watches
        ));
        v
    }
}

/// What one kind of proxy did.
struct KindResult {
    kind: Kind,
    /// Per node: start → programmed (seconds), `None` if not in the time limit.
    programmed: Vec<Option<f64>>,
    rollout: Phase,
    /// The proxies' summed CPU when the rollout ended, and their largest `VmHWM`.
    proxies_cpu_rollout: f64,
    proxies_peak_kb: u64,
    churn: Option<Churn>,
    restart: Option<(Option<f64>, Phase)>,
}

struct Churn {
    changes: usize,
    phase: Phase,
    proxies_cpu: f64,
    /// Merged histogram deltas over all nodes; observations, sum.
    npl: BTreeMap<u64, f64>,
    npl_count: f64,
    npl_sum: f64,
    e2e: Vec<Duration>,
    e2e_missed: usize,
    probe_nodes: usize,
    checks: Vec<Duration>,
}

/// Waits until the proxy in `ns` (spawned at `start_epoch`) reports a sync after
/// which all `cluster_ips` are in its kernel; `None` after `limit`.
fn wait_programmed(
    kind: Kind,
    ns: &str,
    p: &mut Proc,
    start_epoch: f64,
    checked: &mut f64,
    cluster_ips: &HashSet<Ipv4Addr>,
) -> Option<f64> {
    p.check_alive(kind.name());
    let m = metrics(ns)?;
    let last = metric(&m, LAST_SYNC)?;
    if last < start_epoch || last == *checked {
        return None;
    }
    *checked = last;
    (kind.count_cluster_ips(ns, cluster_ips) >= cluster_ips.len()).then_some(last - start_epoch)
}

struct Nodes {
    /// Proxies first: they stop before their namespaces go.
    procs: Vec<Option<Proc>>,
    nss: Vec<Netns>,
}

impl Nodes {
    fn cpu(&self) -> f64 {
        self.procs
            .iter()
            .flatten()
            .map(|p| cpu_seconds(p.pid()))
            .sum()
    }

    fn npl(&self) -> Vec<(BTreeMap<u64, f64>, f64, f64)> {
        self.nss
            .iter()
            .map(|ns| {
                let m = metrics(&ns.0).unwrap_or_default();
                (
                    buckets(&m, NPL),
                    metric(&m, &format!("{NPL}_count")).unwrap_or(0.0),
                    metric(&m, &format!("{NPL}_sum")).unwrap_or(0.0),
                )
            })
            .collect()
    }
}

fn run_kind(
    cp: &mut ControlPlane,
    cfg: &Config,
    kind: Kind,
    cluster_ips: &HashSet<Ipv4Addr>,
    moves: &mut usize,
) -> KindResult {
    let nss: Vec<Netns> = (0..cfg.nodes).map(|i| cp.node_ns(node_ip(i))).collect();
    let node = |i: usize| format!("node-{i}");

    // 1. Rollout: every proxy at once.
    cp.reset_peaks();
    let before = cp.snapshot();
    let started = Instant::now();
    let start_epoch = now_epoch();
    let mut nodes = Nodes {
        procs: (0..cfg.nodes)
            .map(|i| {
                let (bin, args) = cp.args(kind, &node(i), node_ip(i));
                Some(Proc::spawn(&nss[i].0, &bin, &args))
            })
            .collect(),
        nss,
    };
    let mut programmed = vec![None; cfg.nodes];
    let mut checked = vec![0.0; cfg.nodes];
    while programmed.iter().any(Option::is_none) && started.elapsed() < cfg.timeout {
        std::thread::sleep(Duration::from_millis(100));
        for i in 0..cfg.nodes {
            if programmed[i].is_some() {
                continue;
            }
            let p = nodes.procs[i].as_mut().unwrap();
            programmed[i] = wait_programmed(
                kind,
                &nodes.nss[i].0,
                p,
                start_epoch,
                &mut checked[i],
                cluster_ips,
            );
        }
    }
    let rollout = Phase {
        before,
        after: cp.snapshot(),
        peaks: cp.peaks(),
        secs: started.elapsed().as_secs_f64(),
    };
    let done = programmed.iter().flatten().count();
    eprintln!(
        "{}: {done}/{} nodes programmed in {:.1} s",
        kind.name(),
        cfg.nodes,
        rollout.secs
    );
    let proxies_cpu_rollout = nodes.cpu();
    let proxies_peak_kb = nodes
        .procs
        .iter()
        .flatten()
        .map(|p| peak_rss_kb(p.pid()))
        .max()
        .unwrap_or(0);
    let mut r = KindResult {
        kind,
        programmed,
        rollout,
        proxies_cpu_rollout,
        proxies_peak_kb,
        churn: None,
        restart: None,
    };
    if done < cfg.nodes {
        return r;
    }

    // 2. Churn.
    std::thread::sleep(Duration::from_secs(2));
    let chains = Arc::new(service_chains(kind, &nodes.nss[0].0));
    let sample = cfg.probe_nodes.min(cfg.nodes);
    let probes: Vec<Probe> = (0..sample)
        .map(|i| Probe::start(&nodes.nss[i].0, kind, chains.clone()))
        .collect();
    let npl0 = nodes.npl();
    let cpu0 = nodes.cpu();
    let before = cp.snapshot();
    let started = Instant::now();
    let total = (cfg.churn_rate * cfg.churn_secs).round() as usize;
    for k in 0..total {
        let at = started + Duration::from_secs_f64(k as f64 / cfg.churn_rate);
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let i = (*moves * 7919) % cfg.services;
        let addr = moved(*moves);
        *moves += 1;
        let wrote = Instant::now();
        for p in &probes {
            p.expect(Pending {
                service: i,
                addr,
                wrote,
            });
        }
        cp.move_endpoint(i, addr);
    }
    // The last changes' syncs, and their observations.
    std::thread::sleep(Duration::from_secs(2));
    let phase = Phase {
        before,
        after: cp.snapshot(),
        peaks: cp.peaks(),
        secs: started.elapsed().as_secs_f64(),
    };
    let proxies_cpu = nodes.cpu() - cpu0;
    let mut e2e = Vec::new();
    let mut e2e_missed = 0;
    let mut checks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    for p in probes {
        let seen = p.finish(deadline);
        e2e.extend(seen.latencies);
        e2e_missed += seen.missed;
        checks.extend(seen.checks);
    }
    e2e.sort();
    checks.sort();
    let npl1 = nodes.npl();
    let mut npl = BTreeMap::new();
    let (mut npl_count, mut npl_sum) = (0.0, 0.0);
    for ((b0, c0, s0), (b1, c1, s1)) in npl0.iter().zip(&npl1) {
        for (le, v) in b1 {
            *npl.entry(*le).or_insert(0.0) += v - b0.get(le).copied().unwrap_or(0.0);
        }
        npl_count += c1 - c0;
        npl_sum += s1 - s0;
    }
    r.churn = Some(Churn {
        changes: total,
        phase,
        proxies_cpu,
        npl,
        npl_count,
        npl_sum,
        e2e,
        e2e_missed,
        probe_nodes: sample,
        checks,
    });

    // 3. One proxy restarted: its relist.
    std::thread::sleep(Duration::from_secs(1));
    let before = cp.snapshot();
    let started = Instant::now();
    drop(nodes.procs[0].take());
    let start_epoch = now_epoch();
    let (bin, args) = cp.args(kind, &node(0), node_ip(0));
    let mut p = Proc::spawn(&nodes.nss[0].0, &bin, &args);
    let mut checked = 0.0;
    let mut again = None;
    while again.is_none() && started.elapsed() < cfg.timeout {
        std::thread::sleep(Duration::from_millis(50));
        again = wait_programmed(
            kind,
            &nodes.nss[0].0,
            &mut p,
            start_epoch,
            &mut checked,
            cluster_ips,
        );
    }
    nodes.procs[0] = Some(p);
    let phase = Phase {
        before,
        after: cp.snapshot(),
        peaks: cp.peaks(),
        secs: started.elapsed().as_secs_f64(),
    };
    r.restart = Some((again, phase));
    drop(nodes);
    r
}

fn print_tables(cfg: &Config, creation: Duration, results: &[KindResult]) {
    let secs = |v: f64| format!("{v:.2} s");
    let ms = |v: f64| format!("{:.1} ms", v * 1e3);
    let mib = |kb: u64| format!("{:.0} MiB", kb as f64 / 1024.0);
    println!();
    println!(
        "### {} nodes, {} services × 2 endpoints ({} Services + {} EndpointSlices created in {:.1} s, {} concurrent requests)",
        cfg.nodes,
        cfg.services,
        cfg.services,
        cfg.services,
        creation.as_secs_f64(),
        cfg.concurrency
    );
    println!();
    let mut head = "| |".to_string();
    let mut rule = "|---|".to_string();
    for r in results {
        head += &format!(" {} |", r.kind.name());
        rule += "---|";
    }
    println!("{head}\n{rule}");
    let row = |label: &str, f: &dyn Fn(&KindResult) -> Option<String>| {
        let mut line = format!("| {label} |");
        for r in results {
            line += &format!(" {} |", f(r).unwrap_or_else(|| "—".to_string()));
        }
        println!("{line}");
    };
    let sorted = |r: &KindResult| {
        let mut v: Vec<f64> = r.programmed.iter().flatten().copied().collect();
        v.sort_by(f64::total_cmp);
        v
    };
    row("**rollout**: nodes programmed", &|r| {
        Some(format!(
            "{} of {}",
            r.programmed.iter().flatten().count(),
            cfg.nodes
        ))
    });
    row("start → every node programmed", &|r| {
        let v = sorted(r);
        (v.len() == cfg.nodes).then(|| secs(*v.last().unwrap()))
    });
    row("start → node programmed, p50 of nodes", &|r| {
        let v = sorted(r);
        (!v.is_empty()).then(|| secs(v[(v.len() - 1) / 2]))
    });
    row("proxies' CPU until then (sum)", &|r| {
        Some(secs(r.proxies_cpu_rollout))
    });
    row("proxy peak RSS (largest node)", &|r| {
        Some(mib(r.proxies_peak_kb))
    });
    row("kube-apiserver CPU during the rollout", &|r| {
        Some(secs(r.rollout.cpu_apiserver()))
    });
    row("etcd CPU during the rollout", &|r| {
        Some(secs(r.rollout.cpu_etcd()))
    });
    row("kube-apiserver peak RSS (VmHWM) during the rollout", &|r| {
        Some(mib(r.rollout.peaks.0))
    });
    row("etcd peak RSS (VmHWM) during the rollout", &|r| {
        Some(mib(r.rollout.peaks.1))
    });
    row("**churn**: endpoint moves written", &|r| {
        r.churn.as_ref().map(|c| {
            format!(
                "{} in {:.0} s ({:.1}/s)",
                c.changes,
                cfg.churn_secs,
                c.changes as f64 / cfg.churn_secs
            )
        })
    });
    row("kube-apiserver CPU during the churn (+2 s)", &|r| {
        r.churn.as_ref().map(|c| secs(c.phase.cpu_apiserver()))
    });
    row("etcd CPU during the churn (+2 s)", &|r| {
        r.churn.as_ref().map(|c| secs(c.phase.cpu_etcd()))
    });
    row("proxies' CPU during the churn (sum of nodes)", &|r| {
        r.churn.as_ref().map(|c| secs(c.proxies_cpu))
    });
    row("proxies' CPU per move per node", &|r| {
        r.churn
            .as_ref()
            .map(|c| ms(c.proxies_cpu / (c.changes.max(1) * cfg.nodes) as f64))
    });
    row("own network-programming observations (all nodes)", &|r| {
        r.churn.as_ref().map(|c| format!("{:.0}", c.npl_count))
    });
    row("own network-programming latency, mean", &|r| {
        r.churn
            .as_ref()
            .filter(|c| c.npl_count > 0.0)
            .map(|c| ms(c.npl_sum / c.npl_count))
    });
    for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
        row(
            &format!("own network-programming latency, {name} (bucket bound)"),
            &|r| {
                r.churn
                    .as_ref()
                    .and_then(|c| bucket_quantile(&c.npl, q))
                    .map(|v| format!("≤ {}", ms(v)))
            },
        );
    }
    row("API write → in the kernel (probe nodes), p50", &|r| {
        r.churn
            .as_ref()
            .filter(|c| !c.e2e.is_empty())
            .map(|c| ms(percentile(&c.e2e, 0.5).as_secs_f64()))
    });
    row("API write → in the kernel (probe nodes), p99", &|r| {
        r.churn
            .as_ref()
            .filter(|c| !c.e2e.is_empty())
            .map(|c| ms(percentile(&c.e2e, 0.99).as_secs_f64()))
    });
    row("API write → in the kernel (probe nodes), max", &|r| {
        r.churn
            .as_ref()
            .and_then(|c| c.e2e.last())
            .map(|d| ms(d.as_secs_f64()))
    });
    row("**restart** of one proxy: start → programmed", &|r| {
        r.restart
            .as_ref()
            .map(|(t, _)| t.map_or("did not finish".to_string(), secs))
    });
    row("kube-apiserver CPU during the relist", &|r| {
        r.restart.as_ref().map(|(_, p)| secs(p.cpu_apiserver()))
    });
    row("etcd CPU during the relist", &|r| {
        r.restart.as_ref().map(|(_, p)| secs(p.cpu_etcd()))
    });
    println!();
    for r in results {
        println!("- {}:", r.kind.name());
        println!("  - rollout ({:.1} s):", r.rollout.secs);
        for l in r.rollout.deltas() {
            println!("    - {l}");
        }
        if let Some(c) = &r.churn {
            println!(
                "  - churn ({:.1} s): {} of {} ({} moves × {} probe nodes) seen in the kernel ({} not within 30 s after the churn); {} narrow checks by the probes (p50 {}, max {})",
                c.phase.secs,
                c.e2e.len(),
                c.changes * c.probe_nodes,
                c.changes,
                c.probe_nodes,
                c.e2e_missed,
                c.checks.len(),
                c.checks
                    .get(c.checks.len() / 2)
                    .map_or("—".to_string(), |d| ms(d.as_secs_f64())),
                c.checks
                    .last()
                    .map_or("—".to_string(), |d| ms(d.as_secs_f64())),
            );
            for l in c.phase.deltas() {
                println!("    - {l}");
            }
        }
        if let Some((_, p)) = &r.restart {
            println!("  - restart of node-0's proxy ({:.1} s):", p.secs);
            for l in p.deltas() {
                println!("    - {l}");
            }
        }
    }
}

fn main() {
    let mut cfg = Config {
        nodes: 50,
        services: 10_000,
        churn_rate: 10.0,
        churn_secs: 120.0,
        kinds: vec![Kind::Ours, Kind::Nftables],
        timeout: Duration::from_secs(600),
        concurrency: DEFAULT_CONCURRENCY,
        probe_nodes: 3,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--nodes" => cfg.nodes = parse_value("--nodes N", args.next()),
            "--services" => cfg.services = parse_value("--services S", args.next()),
            "--churn-rate" => cfg.churn_rate = parse_value("--churn-rate R", args.next()),
            "--churn-secs" => cfg.churn_secs = parse_value("--churn-secs T", args.next()),
            "--timeout" => {
                cfg.timeout = Duration::from_secs(parse_value("--timeout S", args.next()))
            }
            "--concurrency" => cfg.concurrency = parse_value("--concurrency C", args.next()),
            "--probe-nodes" => cfg.probe_nodes = parse_value("--probe-nodes P", args.next()),
            "--kinds" => {
                let v: String = parse_value("--kinds ours,nftables,iptables", args.next());
                cfg.kinds = v
                    .split(',')
                    .map(|k| Kind::parse(k).unwrap_or_else(|| panic!("unknown kind {k}")))
                    .collect();
            }
            v => panic!("unknown argument {v}"),
        }
    }
    assert!(
        cfg.nodes >= 1 && cfg.services >= 1 && cfg.churn_rate > 0.0,
        "--nodes, --services and --churn-rate must be positive"
    );

    let mut cp = ControlPlane::up();
    for i in 0..cfg.nodes {
        cp.add_node(&format!("node-{i}"), node_ip(i));
    }
    let (cluster_ips, creation) = cp.create_objects(cfg.services, cfg.concurrency);
    eprintln!(
        "{n} Services + {n} EndpointSlices created in {:.2} s ({} concurrent requests)",
        creation.as_secs_f64(),
        cfg.concurrency,
        n = cfg.services
    );
    let mut moves = 0;
    let results: Vec<KindResult> = cfg
        .kinds
        .iter()
        .map(|&k| run_kind(&mut cp, &cfg, k, &cluster_ips, &mut moves))
        .collect();
    print_tables(&cfg, creation, &results);
    drop(cp);
}
