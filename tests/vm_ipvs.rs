//! Real-kernel tests of `--proxy-mode ipvs`, meant for the VM harness (vm-tests/),
//! where the kernel has IPVS and the dummy driver. On a kernel without them every
//! test prints a SKIP line and passes.
//!
//! Covered here: adoption of state created beforehand with ipvsadm/ipset/ip, a
//! foreign IPVS service left untouched, a ClusterIP + NodePort VS with real servers
//! programmed by `--once`, and `cleanup`. The packet-level scenarios (ClusterIP,
//! NodePort, ExternalIP, LB source ranges, eTP Local, affinity, refused without
//! endpoints, hairpin, IPv6, UDP, graceful termination with a live TCP connection,
//! mode switch both ways) are still to be written on top of tests/common.

use std::path::PathBuf;
use std::process::Command;

fn bin() -> PathBuf {
    std::env::var_os("KUBE_NLPROXY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kube-nlproxy")))
}

fn run(ns: &str, args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .expect("ip netns exec")
}

/// A private network namespace with IPVS and dummy usable, or `None` (SKIP).
fn netns(name: &str) -> Option<NsGuard> {
    let ok = Command::new("ip")
        .args(["netns", "add", name])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return None;
    }
    let guard = NsGuard(name.to_string());
    let dummy = run(name, &["ip", "link", "add", "probe0", "type", "dummy"]);
    let ipvs = run(name, &["ipvsadm", "-Ln"]);
    if !dummy.status.success() || !ipvs.status.success() {
        return None;
    }
    run(name, &["ip", "link", "del", "probe0"]);
    Some(guard)
}

struct NsGuard(String);

impl Drop for NsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

const MANIFEST: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: ns, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.1.5]
"#;

#[test]
fn vm_ipvs_adoption_foreign_vs_and_cleanup() {
    let ns = format!("nlp-ipvs-{}", std::process::id());
    let Some(_g) = netns(&ns) else {
        println!("SKIP vm_ipvs: no IPVS or dummy driver in this kernel (runs in vm-tests/)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("{ns}-manifests"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("web.yaml"), MANIFEST).unwrap();
    run(&ns, &["ip", "link", "set", "lo", "up"]);
    run(&ns, &["ip", "link", "add", "eth0", "type", "dummy"]);
    run(
        &ns,
        &["ip", "addr", "add", "192.168.1.10/24", "dev", "eth0"],
    );
    run(&ns, &["ip", "link", "set", "eth0", "up"]);
    // State as kube-proxy would have left it, plus a foreign VS.
    run(&ns, &["ip", "link", "add", "kube-ipvs0", "type", "dummy"]);
    run(
        &ns,
        &["ip", "addr", "add", "10.96.0.10/32", "dev", "kube-ipvs0"],
    );
    run(&ns, &["ipvsadm", "-A", "-t", "10.96.0.10:80", "-s", "rr"]);
    run(
        &ns,
        &[
            "ipvsadm",
            "-a",
            "-t",
            "10.96.0.10:80",
            "-r",
            "10.244.1.5:8080",
            "-m",
        ],
    );
    run(
        &ns,
        &["ipvsadm", "-A", "-t", "192.168.1.10:8443", "-s", "rr"],
    );
    let source = format!("file:{}", dir.display());
    let b = bin();
    let args = [
        b.to_str().unwrap(),
        "--proxy-mode",
        "ipvs",
        "--source",
        &source,
        "--hostname-override",
        "node-a",
        "--node-ip",
        "192.168.1.10",
        "--once",
    ];
    let out = run(&ns, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = String::from_utf8_lossy(&run(&ns, &["ipvsadm", "-Ln"]).stdout).to_string();
    assert!(list.contains("10.96.0.10:80"), "{list}");
    assert!(list.contains("192.168.1.10:30080"), "{list}");
    assert!(list.contains("192.168.1.10:8443"), "{list}");
    assert!(list.contains("10.244.1.5:8080"), "{list}");
    let sets = String::from_utf8_lossy(&run(&ns, &["ipset", "list", "KUBE-CLUSTER-IP"]).stdout)
        .to_string();
    assert!(sets.contains("10.96.0.10,tcp:80"), "{sets}");

    let out = run(&ns, &[b.to_str().unwrap(), "cleanup"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = String::from_utf8_lossy(&run(&ns, &["ipvsadm", "-Ln"]).stdout).to_string();
    assert!(!list.contains("10.96.0.10:80"), "{list}");
    assert!(!list.contains(":30080"), "{list}");
    assert!(
        list.contains("192.168.1.10:8443"),
        "foreign VS must stay: {list}"
    );
    assert!(
        !run(&ns, &["ip", "link", "show", "kube-ipvs0"])
            .status
            .success()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
