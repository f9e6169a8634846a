//! Scale benchmark: N ClusterIP services × 2 endpoints.
//!
//! Measures, in a private network namespace per run:
//! - our full initial sync (build + diff + one netlink batch),
//! - an incremental sync after one endpoint of one service changes,
//! - a no-op sync, and a restart's read-back (dump + diff),
//!
//! and the exec baselines in the same run:
//! - upstream kube-proxy's nftables layout loaded with `nft -f` (per-service
//!   anonymous `numgen … vmap { … }`),
//! - `nft --json list table` of that table (what upstream reads back),
//! - a one-service `nft -f` transaction (the cheapest exec-based incremental sync).
//!
//! Usage: `cargo bench --bench scale -- 1000 10000` (default: 1000).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube_nlproxy::mode::nftables::{
    LocalDetector, NftablesOptions, NodePortAddresses, desired_tables,
};
use kube_nlproxy::model::{
    ClusterState, Endpoint, IpFamily, NodeInfo, Protocol, ServicePort, ServicePortName,
};
use kube_nlproxy::sync::{NetlinkDataplane, Syncer};

fn in_private_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare(CLONE_NEWNET) changes only this thread's network namespace;
        // children it forks (nft) inherit it.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("bench thread")
}

fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 96 + (i >> 16) as u8, (i >> 8) as u8, i as u8)
}

fn endpoint_ip(i: usize, j: usize) -> Ipv4Addr {
    let n = i * 2 + j;
    Ipv4Addr::new(10, 128 + (n >> 16) as u8, (n >> 8) as u8, n as u8)
}

fn state(n: usize, changed: Option<usize>) -> ClusterState {
    let mut st = ClusterState {
        node: NodeInfo {
            name: "node-a".into(),
            ips: vec![IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1))],
            ..Default::default()
        },
        ..Default::default()
    };
    for i in 0..n {
        let name = ServicePortName {
            namespace: "bench".into(),
            name: format!("svc-{i}"),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
        };
        st.services.insert(
            (name.clone(), IpFamily::V4),
            ServicePort::new(
                name.clone(),
                IpFamily::V4,
                Some(IpAddr::V4(cluster_ip(i))),
                80,
            ),
        );
        let eps = (0..2)
            .map(|j| {
                let mut ip = endpoint_ip(i, j);
                if changed == Some(i) && j == 1 {
                    ip = Ipv4Addr::new(10, 250, 0, 1);
                }
                Endpoint::ready(IpAddr::V4(ip), 8080, false)
            })
            .collect();
        st.endpoints.insert(name, eps);
    }
    st
}

/// Upstream kube-proxy's nftables layout for the same services (the relevant part).
fn upstream_ruleset(n: usize) -> String {
    let mut s = String::from(
        "add table ip kube-proxy\n\
         add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
         add chain ip kube-proxy services\n\
         add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority dstnat ; }\n\
         add rule ip kube-proxy nat-prerouting jump services\n\
         add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add chain ip kube-proxy mark-for-masquerade\n\
         add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000\n",
    );
    for i in 0..n {
        let svc = format!("service-{i:08}-bench/svc-{i}/tcp/http");
        let _ = writeln!(s, "add chain ip kube-proxy {svc}");
        let mut vmap = Vec::new();
        for j in 0..2 {
            let ep = endpoint_ip(i, j);
            let chain = format!("endpoint-{i:08}-{j}-bench/svc-{i}/tcp/http__{ep}/8080");
            let _ = writeln!(s, "add chain ip kube-proxy {chain}");
            let _ = writeln!(
                s,
                "add rule ip kube-proxy {chain} ip saddr {ep} jump mark-for-masquerade"
            );
            let _ = writeln!(
                s,
                "add rule ip kube-proxy {chain} meta l4proto tcp dnat to {ep}:8080"
            );
            vmap.push(format!("{j} : goto {chain}"));
        }
        let _ = writeln!(
            s,
            "add rule ip kube-proxy {svc} numgen random mod 2 vmap {{ {} }}",
            vmap.join(" , ")
        );
        let _ = writeln!(
            s,
            "add element ip kube-proxy service-ips {{ {} . tcp . 80 : goto {svc} }}",
            cluster_ip(i)
        );
    }
    s
}

fn nft_stdin(script: &str) -> Duration {
    use std::io::Write;
    let started = Instant::now();
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("run nft");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "nft -f failed");
    started.elapsed()
}

fn nft_json_list() -> Duration {
    let started = Instant::now();
    let out = Command::new("nft")
        .args(["--json", "list", "table", "ip", "kube-proxy"])
        .stdout(Stdio::piped())
        .output()
        .expect("run nft");
    assert!(out.status.success());
    started.elapsed()
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

fn bench(n: usize) {
    println!("\n== {n} ClusterIP services x 2 endpoints ==");
    let (build, full, incr, incr_ops, noop, restart, counts) = in_private_netns(move || {
        let opts = NftablesOptions {
            masquerade_all: false,
            local_detector: LocalDetector::Cidrs(vec!["10.128.0.0/9".parse().unwrap()]),
            nodeport_addresses: NodePortAddresses::Ips(vec!["10.77.0.1".parse().unwrap()]),
            masquerade_mark: 0x4000,
        };
        let started = Instant::now();
        let desired = desired_tables(&state(n, None), &opts);
        let build = started.elapsed();
        let counts = format!(
            "{} chains, {} rules",
            desired.iter().map(|t| t.chains.len()).sum::<usize>(),
            desired.iter().map(|t| t.rule_count()).sum::<usize>()
        );
        let mut syncer = Syncer::new(NetlinkDataplane::new().unwrap());
        let started = Instant::now();
        syncer.sync_owned(desired).unwrap();
        let full = started.elapsed();

        let changed = desired_tables(&state(n, Some(n / 2)), &opts);
        let owned = changed.clone();
        let started = Instant::now();
        let outcome = syncer.sync_owned(owned).unwrap();
        let incr = started.elapsed();
        let incr_ops: usize = outcome.ops.values().sum();

        let owned = changed.clone();
        let started = Instant::now();
        let outcome = syncer.sync_owned(owned).unwrap();
        let noop = started.elapsed();
        assert!(outcome.ops.is_empty());

        let started = Instant::now();
        let mut restarted = Syncer::new(NetlinkDataplane::new().unwrap());
        assert!(restarted.plan(&changed).unwrap().is_empty());
        let restart = started.elapsed();
        (build, full, incr, incr_ops, noop, restart, counts)
    });
    let (upstream_load, upstream_list, upstream_one) = in_private_netns(move || {
        let load = nft_stdin(&upstream_ruleset(n));
        let list = nft_json_list();
        let i = n / 2;
        let one = format!(
            "flush chain ip kube-proxy service-{i:08}-bench/svc-{i}/tcp/http\n\
             add rule ip kube-proxy service-{i:08}-bench/svc-{i}/tcp/http numgen random mod 2 vmap {{ 0 : goto endpoint-{i:08}-0-bench/svc-{i}/tcp/http__{}/8080 , 1 : goto endpoint-{i:08}-1-bench/svc-{i}/tcp/http__{}/8080 }}\n",
            endpoint_ip(i, 0),
            endpoint_ip(i, 1)
        );
        let one = nft_stdin(&one);
        (load, list, one)
    });
    println!("kube-nlproxy layout: {counts}");
    println!("{:<58} {:>10}", "measurement", "time");
    println!(
        "{:<58} {:>10}",
        "kube-nlproxy: build desired tables (pure)",
        secs(build)
    );
    println!(
        "{:<58} {:>10}",
        "kube-nlproxy: full initial sync (one netlink batch)",
        secs(full)
    );
    println!(
        "{:<58} {:>10}",
        format!("kube-nlproxy: one endpoint changed ({incr_ops} ops)"),
        secs(incr)
    );
    println!(
        "{:<58} {:>10}",
        "kube-nlproxy: no-op sync (nothing sent)",
        secs(noop)
    );
    println!(
        "{:<58} {:>10}",
        "kube-nlproxy: restart read-back (dump + diff)",
        secs(restart)
    );
    println!(
        "{:<58} {:>10}",
        "upstream layout via `nft -f` (exec baseline)",
        secs(upstream_load)
    );
    println!(
        "{:<58} {:>10}",
        "upstream read-back `nft --json list table`",
        secs(upstream_list)
    );
    println!(
        "{:<58} {:>10}",
        "one-service change via `nft -f`",
        secs(upstream_one)
    );
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    println!(
        "ratios: full load {:.1}x faster, incremental {:.1}x faster, read-back {:.1}x faster",
        ratio(upstream_load, build + full),
        ratio(upstream_one, incr),
        ratio(upstream_list, restart)
    );
}

fn main() {
    let scales: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .filter_map(|a| a.parse().ok())
        .collect();
    let scales = if scales.is_empty() {
        vec![1000]
    } else {
        scales
    };
    for n in scales {
        bench(n);
    }
}
