//! IPVS mode at scale, in the VM (the host has no IPVS): N ClusterIP services
//! × 10 endpoints through `IpvsMode` on the real kernel, against the exec
//! baseline for the same state (`ipset restore` + `ipvsadm -R` + `ip -batch`
//! for the VIPs), in the same guest. Prints the figures; asserts only what
//! the kernel holds (timings are never asserted). `ipvs_bench_1k` runs in CI;
//! `ipvs_bench_10k` is ignored, run it with
//! `KNP_VM_CARGO_PROFILE=release KNP_VM_TIMEOUT=1200 vm-tests/run-tests vm_ipvs_bench -- --ignored --nocapture`.

mod common;
use std::io::Write as _;

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube_nlproxy::driver::ipvs::IpvsMode;
use kube_nlproxy::driver::{Mode, NodeContext};
use kube_nlproxy::mode::nftables::{LocalDetector, NftablesOptions, NodePortAddresses};
use kube_nlproxy::model::{
    ClusterState, Endpoint, IpFamily, Protocol, ServicePort, ServicePortName,
};
use kube_nlproxy::sync::NetlinkDataplane;
use kube_nlproxy::sync::ipvs::NetlinkIpvs;

const ENDPOINTS: usize = 10;

fn skip(test: &str) -> bool {
    common::skip_outside_vm("vm_ipvs_bench", test)
}

fn name(i: usize) -> ServicePortName {
    ServicePortName {
        namespace: "bench".into(),
        name: format!("s{i}").into(),
        port_name: "p".into(),
        protocol: Protocol::Tcp,
    }
}

fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, (i >> 8) as u8, i as u8)
}

fn endpoint(i: usize, k: usize) -> Ipv4Addr {
    let n = i * ENDPOINTS + k;
    Ipv4Addr::new(10, 128 + (n >> 16) as u8, (n >> 8) as u8, n as u8)
}

fn state(n: usize) -> ClusterState {
    let mut s = ClusterState::default();
    s.node.name = "node-a".into();
    for i in 0..n {
        s.services.insert(
            (name(i), IpFamily::V4),
            ServicePort::new(name(i), IpFamily::V4, Some(IpAddr::V4(vip(i))), 80),
        );
        let eps = (0..ENDPOINTS)
            .map(|k| Endpoint::ready(IpAddr::V4(endpoint(i, k)), 8080, false))
            .collect();
        s.endpoints.insert(name(i), std::sync::Arc::new(eps));
    }
    s
}

fn node() -> NodeContext {
    NodeContext {
        options: NftablesOptions {
            masquerade_all: false,
            local_detector: LocalDetector::None,
            nodeport_addresses: NodePortAddresses::Ips(vec![]),
            masquerade_mark: 0x4000,
        },
        addresses: vec![],
    }
}

fn sh(cmd: &str, stdin: &str) -> Duration {
    let started = Instant::now();
    let mut child = Command::new("sh")
        .args(["-c", cmd])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "{cmd}");
    started.elapsed()
}

fn ipvs_services() -> usize {
    let out = Command::new("ipvsadm").arg("-Ln").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("TCP"))
        .count()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn bench(n: usize) {
    let mut state = state(n);
    let mut mode = IpvsMode::new(
        NetlinkIpvs::new().expect("IPVS"),
        NetlinkDataplane::new().unwrap(),
        "rr",
    );
    let started = Instant::now();
    mode.desired(&state, &node(), None).unwrap();
    let full = mode.sync().unwrap();
    let full_time = started.elapsed();
    assert_eq!(ipvs_services(), n);

    std::sync::Arc::make_mut(state.endpoints.get_mut(&name(n / 2)).unwrap())[3].ip =
        IpAddr::V4(Ipv4Addr::new(10, 250, 0, 1));
    let started = Instant::now();
    mode.desired(&state, &node(), Some(&[name(n / 2)])).unwrap();
    let change = mode.sync().unwrap();
    let change_time = started.elapsed();
    let started = Instant::now();
    mode.desired(&state, &node(), Some(&[])).unwrap();
    let noop = mode.sync().unwrap();
    let noop_time = started.elapsed();
    assert!(noop.ops.is_empty());
    assert_eq!(mode.verify().unwrap(), Vec::<String>::new());
    let cleaned = mode.cleanup(&[]).unwrap();
    assert!(cleaned > 0);
    assert_eq!(ipvs_services(), 0);

    // The exec baseline: the same state from text.
    let mut ipset = String::from("create BENCH-CLUSTER-IP hash:ip,port\n");
    let mut ipvsadm = String::new();
    let mut addrs = String::from("link add bench0 type dummy\n");
    for i in 0..n {
        ipset.push_str(&format!("add BENCH-CLUSTER-IP {},tcp:80\n", vip(i)));
        ipvsadm.push_str(&format!("-A -t {}:80 -s rr\n", vip(i)));
        for k in 0..ENDPOINTS {
            ipvsadm.push_str(&format!(
                "-a -t {}:80 -r {}:8080 -m -w 1\n",
                vip(i),
                endpoint(i, k)
            ));
        }
        addrs.push_str(&format!("address add {}/32 dev bench0\n", vip(i)));
    }
    let t_ipset = sh("ipset restore", &ipset);
    let t_ipvsadm = sh("ipvsadm -R", &ipvsadm);
    let t_ip = sh("ip -batch -", &addrs);
    assert_eq!(ipvs_services(), n);
    let one = format!(
        "ipvsadm -d -t {v}:80 -r {e}:8080 && ipvsadm -a -t {v}:80 -r 10.250.0.1:8080 -m -w 1",
        v = vip(n / 2),
        e = endpoint(n / 2, 3)
    );
    let t_one = sh(&one, "");
    sh(
        "ipvsadm -C; ipset destroy BENCH-CLUSTER-IP; ip link del bench0",
        "",
    );

    let ops = |o: &std::collections::BTreeMap<&'static str, usize>| o.values().sum::<usize>();
    println!("| {n} × {ENDPOINTS} (VM, TCG) | kube-nlproxy | baseline (exec) |");
    println!("|---|---|---|");
    println!(
        "| full sync | {} ({} operations) | {} (ipset restore {} + ipvsadm -R {} + ip -batch {}) |",
        ms(full_time),
        ops(&full.ops),
        ms(t_ipset + t_ipvsadm + t_ip),
        ms(t_ipset),
        ms(t_ipvsadm),
        ms(t_ip)
    );
    println!(
        "| one endpoint changed | {} ({} operations) | {} (ipvsadm -d + ipvsadm -a) |",
        ms(change_time),
        ops(&change.ops),
        ms(t_one)
    );
    println!("| no-op sync | {} (nothing sent) | — |", ms(noop_time));
}

#[test]
fn ipvs_bench_1k() {
    if skip("ipvs_bench_1k") {
        return;
    }
    bench(1_000);
}

#[test]
#[ignore = "minutes under TCG; run by hand, see the module docs"]
fn ipvs_bench_10k() {
    if skip("ipvs_bench_10k") {
        return;
    }
    bench(10_000);
}
