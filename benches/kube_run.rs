//! `run` on the kube source at scale: the real daemon (release build) in a node
//! network namespace against the test API server, N ClusterIP services × 2
//! endpoints. Measures the initial programming time, peak RSS, CPU per change,
//! and API write → kernel commit latency of one endpoint move (the commit is
//! seen by polling the nf_tables generation id from the node namespace,
//! 100 µs apart). No assertion on any time.
//!
//! The cold start's wall-clock time is split from the daemon's log: process
//! start → the source's initial state in (the lists streamed into the model),
//! then the first sync's model, render and commit phases (`sync: committed`).
//!
//! Then, with real TCP from a pod namespace (`--connects C` rounds, default
//! 20): a Service added with its EndpointSlice, and an endpoint of it moved to
//! another pod, each timed from the API write to the first connection answered
//! by the new backend. The client tries every millisecond (each attempt with
//! a 20 ms connect timeout), so the figure is the proxy's, not a retry
//! interval's; the nf_tables commits in between are counted.
//!
//!   cargo bench --bench kube_run -- [N]... [--changes K] [--connects C] [--watch-list]
//!
//! `--watch-list`: the test API server streams lists (`sendInitialEvents`), so
//! the daemon takes its initial state from watches; without it the server
//! refuses them (422, a WatchList feature gate off) and the daemon lists.
//!
//! `KNP_BENCH_PROXY_ARGS="--kube-api-qps 50"` adds flags to the daemon's command
//! line. `KUBE_NLPROXY_BIN=PATH` runs that binary instead of cargo's, e.g. the shipped
//! build: `cargo build --profile dist --bin kube-nlproxy` then
//! `KUBE_NLPROXY_BIN=target/dist/kube-nlproxy`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::apiserver::{FakeApiServer, Options};
use common::{Proxy, Topo, Where, status_kb, unique};
use serde_json::{Value, json};

/// The `i`th address after `base` (10.x.0.1 + i: 100k Services fit in a /15).
fn nth(base: [u8; 4], i: usize) -> String {
    Ipv4Addr::from(u32::from(Ipv4Addr::from(base)) + 1 + i as u32).to_string()
}

fn service(i: usize) -> Value {
    let ip = nth([10, 96, 0, 0], i);
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("s{i}"), "namespace": "bench"},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
    })
}

fn slice(i: usize, second: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("s{i}-x"), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": format!("s{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [nth([10, 128, 0, 0], i)], "conditions": {"ready": true}},
            {"addresses": [second], "conditions": {"ready": true}}
        ]
    })
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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// One scale: prints the row of the main table; returns the cold start's row
/// and the connect rounds' row.
fn run(n: usize, changes: usize, rounds: usize, watch_list: bool) -> (String, Option<String>) {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    let api = FakeApiServer::start_in_netns_with(
        &t.node,
        Options {
            watch_list,
            ..Options::default()
        },
    );
    for i in 0..n {
        api.create(service(i));
        api.create(slice(i, &nth([10, 160, 0, 0], i)));
    }
    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique("knp-bench")));
    api.write_kubeconfig(&kubeconfig);
    // Syncs as soon as a change arrives (the default 1 s minimum between
    // syncs would measure the rate limit, not the proxy).
    let extra = std::env::var("KNP_BENCH_PROXY_ARGS").unwrap_or_default();
    let mut args = vec!["--min-sync-period", "0s"];
    args.extend(extra.split_whitespace());
    let mut proxy = Proxy::new(&t, common::proxy_bin())
        .with_kube_source(&kubeconfig)
        .with_args(&args);
    let node = t.node.clone();
    let generation = move || {
        common::in_ns(&node, || {
            kube_nlproxy_netlink::nft::NftSocket::new()
                .and_then(|mut s| s.generation())
                .unwrap_or(0)
        })
    };
    let g0 = generation();
    let started_at = SystemTime::now();
    // KNP_BENCH_WRAPPER="heaptrack -o /tmp/knp" profiles the daemon (RSS and
    // CPU figures then include the wrapper's cost).
    match std::env::var("KNP_BENCH_WRAPPER") {
        Ok(wrapper) if !wrapper.trim().is_empty() => {
            proxy.start_wrapped(&wrapper.split_whitespace().collect::<Vec<_>>())
        }
        _ => proxy.start(),
    }
    let pid = proxy.pid().expect("running");
    let programmed = common::eventually(Duration::from_secs(300), || {
        proxy.log().contains("sync: committed")
    });
    assert!(programmed, "never programmed; log:\n{}", proxy.log());
    assert!(generation() != g0);
    let rss_initial = status_kb(pid, "VmHWM:");
    let phases = StartPhases::from_log(&proxy.log(), started_at);
    let initial = phases.programmed;

    // One endpoint moved per change; the commit is seen as a new generation.
    let node = t.node.clone();
    let mut latencies = Vec::new();
    let cpu_before = cpu_seconds(pid);
    for k in 0..changes {
        let i = (k * 7919) % n;
        let before = generation();
        let wrote = Instant::now();
        api.update(slice(i, &nth([10, 200, 0, 0], k)));
        let node = node.clone();
        let seen = common::in_ns(&node, move || {
            let mut s = kube_nlproxy_netlink::nft::NftSocket::new().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if s.generation().unwrap_or(before) != before {
                    return Some(Instant::now());
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            None
        });
        latencies.push(seen.expect("the change was never committed") - wrote);
        // Let the sync loop settle (min-sync-period) before the next write.
        std::thread::sleep(Duration::from_millis(20));
    }
    let cpu_per_change = (cpu_seconds(pid) - cpu_before) / changes as f64;
    let rss_peak = status_kb(pid, "VmHWM:");
    let rss_now = status_kb(pid, "VmRSS:");
    latencies.sort();
    println!(
        "| {n} × 2 | {:.2} s | {} MiB | {} MiB | {} MiB | {:.2} ms | {} | {} | {} |",
        initial.as_secs_f64(),
        rss_initial / 1024,
        rss_peak / 1024,
        rss_now / 1024,
        cpu_per_change * 1e3,
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.9)),
        ms(*latencies.last().unwrap()),
    );
    let connected = (rounds > 0).then(|| connects(n, &t, &api, rounds));
    proxy.stop();
    let _ = std::fs::remove_file(&kubeconfig);
    (phases.row(n), connected)
}

/// Where the cold start's wall-clock time went, from the daemon's log: its
/// lines' timestamps and the phases of the first `sync: committed` line.
struct StartPhases {
    /// Process start → first commit logged (the table's "initial programming").
    programmed: Duration,
    /// Process start → the source's initial state in (client, discovery and the
    /// lists, streamed into the model as they arrive).
    lists: Duration,
    model: Duration,
    render: Duration,
    commit: Duration,
    /// The whole first sync, as the daemon timed it.
    sync: Duration,
}

impl StartPhases {
    fn from_log(log: &str, started_at: SystemTime) -> StartPhases {
        let line = |msg: &str| {
            log.lines()
                .find(|l| l.contains(msg))
                .unwrap_or_else(|| panic!("no {msg:?} line in the log:\n{log}"))
        };
        let committed = line("\"sync: committed\"");
        let ready = line("\"source: initial state in; first sync next\"");
        let start = time_of_day(started_at);
        let after_start = |l: &str| {
            let t = log_time_of_day(l).expect("a klog header");
            Duration::from_secs_f64((t - start).rem_euclid(86_400.0))
        };
        let field = |key: &str| {
            log_duration(committed, key).unwrap_or_else(|| panic!("no {key} in {committed}"))
        };
        StartPhases {
            programmed: after_start(committed),
            lists: after_start(ready),
            model: field("model"),
            render: field("render"),
            commit: field("commit"),
            sync: field("elapsed"),
        }
    }

    /// One row of the cold-start table.
    fn row(&self, n: usize) -> String {
        let s = |d: Duration| format!("{:.3} s", d.as_secs_f64());
        let rest = self.programmed.saturating_sub(self.lists + self.sync);
        format!(
            "| {n} × 2 | {} | {} | {} | {} | {} | {} | {} |",
            s(self.lists),
            s(self.model),
            s(self.render),
            s(self.commit),
            s(self.sync),
            s(rest),
            s(self.programmed),
        )
    }
}

/// Seconds since midnight UTC.
fn time_of_day(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        % 86_400.0
}

/// The time of day of a klog text line (`I1203 12:34:56.789012 ...`).
fn log_time_of_day(line: &str) -> Option<f64> {
    let hms = line.split_whitespace().nth(1)?;
    let mut parts = hms.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// A `key=1.2ms` (Rust `Debug` of a `Duration`, quoted or not) of a log line.
fn log_duration(line: &str, key: &str) -> Option<Duration> {
    let value = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))?
        .trim_matches('"');
    let split = value.find(|c: char| c.is_alphabetic() || c == 'µ')?;
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => number,
        "ms" => number / 1e3,
        "µs" | "us" => number / 1e6,
        "ns" => number / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

/// The pod-side service of the connect rounds: `name` at `vip`, port 80 →
/// 8080 of `pod`.
fn probed_service(name: &str, vip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "probe"},
        "spec": {"type": "ClusterIP", "clusterIP": vip, "clusterIPs": [vip],
                 "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
    })
}

fn probed_slice(name: &str, pod: &common::Pod) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-x"), "namespace": "probe",
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [pod.v4.to_string()], "conditions": {"ready": true},
                       "nodeName": pod.node_name()}]
    })
}

/// How a round's client got to the new backend.
struct Answer {
    /// From the write to the new backend's answer.
    after: Duration,
    /// Connection attempts, the answered one included.
    attempts: usize,
    /// What the first attempt got: the old backend's name, or the error.
    first: String,
}

/// Connects from `client` to `vip`:80 every millisecond until `pod` answers.
fn first_answer_from(client: &str, vip: &str, pod: &str, since: Instant) -> Answer {
    let dst = common::sa(common::ip(vip), 80);
    let mut first = None;
    for attempts in 1.. {
        let got = common::tcp(client, dst, Duration::from_millis(20));
        let answered = got.as_ref().is_ok_and(|r| r.pod == pod);
        first.get_or_insert_with(|| match &got {
            Ok(r) => r.pod.clone(),
            Err(e) => e.to_string(),
        });
        if answered {
            return Answer {
                after: since.elapsed(),
                attempts,
                first: first.unwrap_or_default(),
            };
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "{vip} never reached {pod}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    unreachable!("the loop returns or panics")
}

/// Records when the nf_tables generation of `ns` moves, every 100 µs, until
/// the flag is set.
fn commit_recorder(
    ns: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<Instant>> {
    std::thread::spawn(move || {
        common::in_ns(&ns, move || {
            let mut s = kube_nlproxy_netlink::nft::NftSocket::new().unwrap();
            let mut last = s.generation().unwrap_or(0);
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let g = s.generation().unwrap_or(last);
                if g != last {
                    seen.push(Instant::now());
                    last = g;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            seen
        })
    })
}

/// The connect rounds at `n` services: one row of their table.
fn connects(n: usize, t: &Topo, api: &FakeApiServer, rounds: usize) -> String {
    let client = t.pod("client").ns.clone();
    let (a, b) = (t.pod("a").clone(), t.pod("b").clone());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let recorder = commit_recorder(t.node.clone(), stop.clone());
    let (mut added, mut moved): (Vec<Answer>, Vec<Answer>) = (Vec::new(), Vec::new());
    let mut writes = Vec::new();
    let mut steady_cost = Vec::new();
    for k in 0..rounds {
        let name = format!("probe{k}");
        let vip = nth([10, 250, 0, 0], k);
        let wrote = Instant::now();
        api.create(probed_service(&name, &vip));
        api.create(probed_slice(&name, &a));
        let to_a = first_answer_from(&client, &vip, "a", wrote);
        let wrote_a = (wrote, wrote + to_a.after);
        std::thread::sleep(Duration::from_millis(20));
        let moving = Instant::now();
        api.update(probed_slice(&name, &b));
        let to_b = first_answer_from(&client, &vip, "b", moving);
        writes.push((wrote_a, (moving, moving + to_b.after)));
        // A steady connection's cost: the resolution of these figures.
        let steady = Instant::now();
        steady_cost.push(first_answer_from(&client, &vip, "b", steady).after);
        added.push(to_a);
        moved.push(to_b);
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let commits = recorder.join().expect("recorder");
    // For each round: the commits between the write and the answer, and when
    // the first one came.
    let within = |(from, to): (Instant, Instant)| -> (usize, Option<Duration>) {
        let mut c = commits.iter().filter(|c| **c >= from && **c <= to);
        let first = c.next().map(|c| *c - from);
        (first.map_or(0, |_| 1) + c.count(), first)
    };
    let (mut add_commits, mut add_first, mut move_commits, mut move_first) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (add, mv) in writes {
        let (n_add, f_add) = within(add);
        let (n_move, f_move) = within(mv);
        add_commits.push(n_add);
        move_commits.push(n_move);
        add_first.extend(f_add);
        move_first.extend(f_move);
    }
    for v in [&mut add_first, &mut move_first, &mut steady_cost] {
        v.sort();
    }
    let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len().max(1) as f64;
    // Per kind: answer p50 / p90, first commit p50, commits, attempts, and what
    // first attempts got.
    let describe = |answers: &[Answer], first_commits: &[Duration], commits: &[usize]| {
        let mut after: Vec<Duration> = answers.iter().map(|a| a.after).collect();
        after.sort();
        let attempts: Vec<usize> = answers.iter().map(|a| a.attempts).collect();
        let mut firsts = std::collections::BTreeMap::<&str, usize>::new();
        for a in answers {
            *firsts.entry(a.first.as_str()).or_default() += 1;
        }
        let firsts: Vec<String> = firsts.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
        format!(
            "{} | {} | {} | {:.1} | {:.1} | {}",
            ms(percentile(&after, 0.5)),
            ms(percentile(&after, 0.9)),
            first_commits
                .first()
                .map_or("-".into(), |_| ms(percentile(first_commits, 0.5))),
            mean(commits),
            mean(&attempts),
            firsts.join(", "),
        )
    };
    format!(
        "| {n} × 2 | {} | {} | {} |",
        describe(&added, &add_first, &add_commits),
        describe(&moved, &move_first, &move_commits),
        ms(percentile(&steady_cost, 0.5)),
    )
}

fn main() {
    let mut scales = Vec::new();
    let mut changes = 50;
    let mut rounds = 20;
    let mut watch_list = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--watch-list" => watch_list = true,
            "--changes" => {
                changes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--changes K")
            }
            "--connects" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--connects C")
            }
            v => scales.push(v.parse::<usize>().expect("N")),
        }
    }
    if scales.is_empty() {
        scales = vec![100, 1_000];
    }
    println!(
        "| services | initial programming (start → first commit) | peak RSS after it | peak RSS after {changes} changes | RSS then | CPU per change | API write → commit p50 | p90 | max |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let (cold_starts, connected): (Vec<String>, Vec<Option<String>>) = scales
        .iter()
        .map(|n| run(*n, changes, rounds, watch_list))
        .unzip();
    println!(
        "\n| services | start → initial state in (lists streamed into the model) | first sync: model | render | commit (diff, encode, kernel) | sync total | other | start → programmed |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for row in cold_starts {
        println!("{row}");
    }
    let connected: Vec<String> = connected.into_iter().flatten().collect();
    if !connected.is_empty() {
        println!(
            "\n| services | Service + slice added → connection p50 | p90 | → first commit p50 | commits | attempts | first attempt got | endpoint moved → connection p50 | p90 | → first commit p50 | commits | attempts | first attempt got | one answered connection p50 |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for row in connected {
            println!("{row}");
        }
    }
}
