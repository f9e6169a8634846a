//! Smoke test of the VM harness (`vm-tests/run-tests`): inside the guest booted by
//! `vm-tests/run`, the kernel has IPVS, the dummy driver, ipset and nf_tables, and the
//! oracle tools (`ip`, `ipvsadm`, `ipset`, `nft`, `conntrack`) work.
//!
//! On a host without IPVS (no `/proc/net/ip_vs`) and outside the VM it SKIPS — it
//! prints why and passes. Inside the VM (`KNP_VM=1`, set by `vm-tests/run`) it never
//! skips: a missing feature is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs a command, panics with its output unless it succeeds, returns stdout.
fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// None when the test should run; Some(reason) when it must be skipped (host only).
fn skip_reason() -> Option<String> {
    if std::env::var_os("KNP_VM").is_some() {
        return None;
    }
    if !Path::new("/proc/net/ip_vs").exists() {
        return Some(
            "no IPVS in this kernel (/proc/net/ip_vs absent); this test runs inside the VM: \
             vm-tests/run-tests vm_smoke"
                .into(),
        );
    }
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    // A host with IPVS: still do not touch the host's kube-ipvs0 / KUBE-* sets.
    Some("not inside the test VM (KNP_VM unset); run vm-tests/run-tests vm_smoke".into())
}

macro_rules! vm_only {
    ($test:expr) => {
        if let Some(why) = skip_reason() {
            // straight to fd 2 (libtest captures eprintln! of passing tests), in the
            // form scripts/test counts
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED vm_smoke::{}: {why}", $test);
            return;
        }
    };
}

/// The kube-nlproxy binary: `KUBE_NLPROXY_BIN` (set by vm-tests/run-tests) or cargo's
/// compile-time path (the repository is mounted at the same path in the guest).
fn kube_nlproxy_bin() -> PathBuf {
    std::env::var_os("KUBE_NLPROXY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kube-nlproxy")))
}

#[test]
fn ipvs_on_dummy_interface() {
    vm_only!("ipvs_on_dummy_interface");
    assert!(
        Path::new("/proc/net/ip_vs").exists(),
        "ip_vs not loaded in the guest"
    );
    run("ip", &["link", "add", "kube-ipvs0", "type", "dummy"]);
    run("ip", &["addr", "add", "10.96.0.10/32", "dev", "kube-ipvs0"]);
    let addrs = run("ip", &["-o", "addr", "show", "dev", "kube-ipvs0"]);
    assert!(addrs.contains("10.96.0.10/32"), "{addrs}");

    run("ipvsadm", &["-A", "-t", "10.96.0.10:80", "-s", "rr"]);
    run(
        "ipvsadm",
        &["-a", "-t", "10.96.0.10:80", "-r", "10.244.1.2:8080", "-m"],
    );
    run(
        "ipvsadm",
        &[
            "-a",
            "-t",
            "10.96.0.10:80",
            "-r",
            "10.244.1.3:8080",
            "-m",
            "-w",
            "0",
        ],
    );
    let table = run("ipvsadm", &["-Ln"]);
    println!("{table}");
    let words: Vec<String> = table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    for want in [
        "TCP 10.96.0.10:80 rr",
        "-> 10.244.1.2:8080 Masq 1 0 0",
        "-> 10.244.1.3:8080 Masq 0 0 0",
    ] {
        assert!(
            words.iter().any(|l| l == want),
            "no line {want:?} in:\n{table}"
        );
    }
    // every scheduler kube-proxy offers loads (autoload through /sbin/modprobe)
    for s in ["wrr", "lc", "wlc", "sh", "dh", "sed", "nq", "mh"] {
        run("ipvsadm", &["-E", "-t", "10.96.0.10:80", "-s", s]);
    }
    run("ipvsadm", &["-D", "-t", "10.96.0.10:80"]);
    run("ip", &["link", "del", "kube-ipvs0"]);
}

#[test]
fn ipset_types() {
    vm_only!("ipset_types");
    run("ipset", &["create", "KUBE-CLUSTER-IP", "hash:ip,port"]);
    run("ipset", &["add", "KUBE-CLUSTER-IP", "10.96.0.10,tcp:80"]);
    run("ipset", &["create", "KUBE-LOOP-BACK", "hash:ip,port,ip"]);
    run(
        "ipset",
        &[
            "create",
            "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            "hash:ip,port,net",
        ],
    );
    run(
        "ipset",
        &[
            "create",
            "KUBE-NODE-PORT-TCP",
            "bitmap:port",
            "range",
            "0-65535",
        ],
    );
    let list = run("ipset", &["list", "KUBE-CLUSTER-IP"]);
    assert!(list.contains("10.96.0.10,tcp:80"), "{list}");
    for s in [
        "KUBE-CLUSTER-IP",
        "KUBE-LOOP-BACK",
        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        "KUBE-NODE-PORT-TCP",
    ] {
        run("ipset", &["destroy", s]);
    }
}

#[test]
fn nftables_and_conntrack() {
    vm_only!("nftables_and_conntrack");
    run("nft", &["list", "ruleset"]);
    // expressions the nftables mode uses, autoloaded: nat, numgen, fib, ct, masquerade, reject
    let script = "table ip knp-smoke {
  chain pre {
    type nat hook prerouting priority dstnat;
    numgen random mod 2 vmap { 0 : jump a, 1 : jump a }
  }
  chain a {
    fib daddr type local ip daddr 10.0.0.1 tcp dport 80 dnat to 10.0.0.2:80
  }
  chain post {
    type nat hook postrouting priority srcnat;
    ct status dnat masquerade fully-random
  }
  chain f {
    type filter hook forward priority 0;
    ct state invalid drop
    meta l4proto tcp reject with tcp reset
  }
}
";
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("nft");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "nft -f failed for:\n{script}"
    );
    let rs = run("nft", &["list", "table", "ip", "knp-smoke"]);
    assert!(rs.contains("masquerade fully-random"), "{rs}");
    run("nft", &["delete", "table", "ip", "knp-smoke"]);
    run("conntrack", &["-L"]);
}

#[test]
fn namespace_and_veth() {
    vm_only!("namespace_and_veth");
    run("ip", &["netns", "add", "knp-smoke"]);
    run(
        "ip",
        &[
            "link",
            "add",
            "knp-v0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            "knp-smoke",
        ],
    );
    run("ip", &["addr", "add", "10.99.0.1/24", "dev", "knp-v0"]);
    run("ip", &["link", "set", "knp-v0", "up"]);
    run(
        "ip",
        &[
            "-n",
            "knp-smoke",
            "addr",
            "add",
            "10.99.0.2/24",
            "dev",
            "eth0",
        ],
    );
    run("ip", &["-n", "knp-smoke", "link", "set", "eth0", "up"]);
    run("ip", &["-n", "knp-smoke", "link", "set", "lo", "up"]);
    // a TCP connection from the host namespace into the netns
    let listener = std::net::TcpListener::bind("10.99.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            "knp-smoke",
            "nc",
            "-w",
            "2",
            "10.99.0.1",
            &port.to_string(),
        ])
        .stdin(std::process::Stdio::null())
        .spawn();
    drop(out);
    let (_conn, peer) = listener.accept().unwrap();
    assert_eq!(peer.ip().to_string(), "10.99.0.2");
    run("ip", &["netns", "del", "knp-smoke"]);
}

#[test]
fn kube_nlproxy_binary_runs_in_guest() {
    vm_only!("kube_nlproxy_binary_runs_in_guest");
    let bin = kube_nlproxy_bin();
    assert!(bin.exists(), "{} missing in the guest", bin.display());
    let out = Command::new(&bin)
        .arg("--help")
        .output()
        .expect("spawn kube-nlproxy");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{} --help: {}\n{text}",
        bin.display(),
        out.status
    );
}
