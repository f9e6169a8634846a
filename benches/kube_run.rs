//! `run` on the kube source at scale: the real daemon (release build) in a node
//! network namespace against the test API server, N ClusterIP services × 2
//! endpoints. Measures the initial programming time, peak RSS, CPU per change,
//! and API write → kernel commit latency of one endpoint move (the commit is
//! seen by polling the nf_tables generation id from the node namespace,
//! 100 µs apart). No assertion on any time.
//!
//!   cargo bench --bench kube_run -- [N]... [--changes K]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::apiserver::FakeApiServer;
use common::{Proxy, Topo, status_kb, unique};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");

fn service(i: usize) -> Value {
    let ip = format!("10.96.{}.{}", i / 250, 1 + i % 250);
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
            {"addresses": [format!("10.64.{}.{}", i / 250, 1 + i % 250)], "conditions": {"ready": true}},
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

fn run(n: usize, changes: usize) {
    let t = Topo::new();
    let api = FakeApiServer::start_in_netns(&t.node);
    for i in 0..n {
        api.create(service(i));
        api.create(slice(i, &format!("10.65.{}.{}", i / 250, 1 + i % 250)));
    }
    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique("knp-bench")));
    api.write_kubeconfig(&kubeconfig);
    // Syncs as soon as a change arrives (the default 1 s minimum between
    // syncs would measure the rate limit, not the proxy).
    let mut proxy = Proxy::new(&t, BIN)
        .with_kube_source(&kubeconfig)
        .with_args(&["--min-sync-period", "0s"]);
    let node = t.node.clone();
    let generation = move || {
        common::in_ns(&node, || {
            kube_nlproxy_netlink::nft::NftSocket::new()
                .and_then(|mut s| s.generation())
                .unwrap_or(0)
        })
    };
    let g0 = generation();
    let started = Instant::now();
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
    let initial = started.elapsed();
    assert!(generation() != g0);
    let rss_initial = status_kb(pid, "VmHWM:");

    // One endpoint moved per change; the commit is seen as a new generation.
    let node = t.node.clone();
    let mut latencies = Vec::new();
    let cpu_before = cpu_seconds(pid);
    for k in 0..changes {
        let i = (k * 7919) % n;
        let before = generation();
        let wrote = Instant::now();
        api.update(slice(i, &format!("10.99.{}.{}", k / 250, 1 + k % 250)));
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
    proxy.stop();
    let _ = std::fs::remove_file(&kubeconfig);
}

fn main() {
    let mut scales = Vec::new();
    let mut changes = 50;
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
    for n in scales {
        run(n, changes);
    }
}
