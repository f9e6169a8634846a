//! kube-nlproxy demo: builds a two-node "cluster" out of network namespaces,
//! programs it with the release binary from the manifests in
//! `examples/demo/`, sends requests through a ClusterIP (from a pod) and a
//! NodePort (from an external client), prints who answered, cleans up.
//!
//! Run as root: `cargo build --release && cargo run --release --example demo`
#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use std::path::PathBuf;
use std::process::ExitCode;

const MANIFESTS: [&str; 3] = [
    include_str!("demo/00-nodes.yaml"),
    include_str!("demo/10-web-clusterip.yaml"),
    include_str!("demo/20-web-nodeport.yaml"),
];

fn binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/examples/demo -> target/<profile>/kube-nlproxy
    let bin = exe
        .parent()
        .and_then(|p| p.parent())
        .ok_or("cannot locate target dir")?
        .join("kube-nlproxy");
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} not found: run `cargo build --release` first",
            bin.display()
        ))
    }
}

fn run() -> Result<(), String> {
    if unsafe { libc::geteuid() } != 0 {
        return Err("the demo needs root (network namespaces, nf_tables)".into());
    }
    let bin = binary()?;
    println!("kube-nlproxy demo\n  binary: {}", bin.display());
    println!(
        "  building topology: LAN bridge, node-a (10.77.0.1), node-b (10.77.0.2), external client (10.77.0.100)"
    );
    let mut t = Topo::new();
    // Creation order fixes the addresses used in examples/demo/*.yaml.
    let client = t.add_pod("client", Where::Local); // 10.244.1.10
    let web1 = t.add_pod("web-1", Where::Local); // 10.244.1.11
    let web2 = t.add_pod("web-2", Where::Remote); // 10.244.2.10
    for p in [&client, &web1, &web2] {
        println!("  pod {:<7} {:<12} on {}", p.name, p.v4, p.node_name());
    }
    let p = Proxy::new(&t, &bin);
    p.write(&MANIFESTS.join("---\n"));
    println!(
        "  running: ip netns exec <node-a> kube-nlproxy run --source file:<dir> --hostname-override node-a --once"
    );
    let out = p.once();
    if !out.status.success() {
        return Err(format!(
            "kube-nlproxy --once failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let chains = p.table().map(|t| t.matches("chain ").count()).unwrap_or(0);
    println!("  synced: table ip kube-nlproxy has {chains} chains\n");

    // What explain predicts, read from the kernel, before the requests.
    for (target, from) in [
        ("10.96.0.10:80/tcp", client.v4.to_string()),
        ("10.77.0.1:30080/tcp", "10.77.0.100".to_string()),
    ] {
        println!("  $ kube-nlproxy explain {target} --from {from}");
        let out = p.command(&["explain"], &[target, "--from", &from]);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            println!("    {line}");
        }
        if out.status.code() != Some(0) {
            return Err(format!(
                "explain {target} exited {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    println!();

    let mut ok = true;
    let mut backends = std::collections::BTreeSet::new();
    println!(
        "  {:<44} {:>3}  {:<8} {:<15} result",
        "path", "#", "backend", "source seen"
    );
    println!("  {}", "-".repeat(87));
    let paths = [
        (
            "pod client -> ClusterIP 10.96.0.10:80",
            client.ns.clone(),
            sa(ip("10.96.0.10"), 80),
        ),
        (
            "EXT 10.77.0.100 -> NodePort 10.77.0.1:30080",
            t.ext.clone(),
            sa(NODE_V4, 30080),
        ),
    ];
    for (label, ns, dst) in &paths {
        for i in 1..=6 {
            match tcp(ns, *dst, OK_TIMEOUT) {
                Ok(r) => {
                    println!(
                        "  {label:<44} {i:>3}  {:<8} {:<15} ok",
                        r.pod,
                        r.src.to_string()
                    );
                    backends.insert(r.pod);
                }
                Err(e) => {
                    println!("  {label:<44} {i:>3}  {:<8} {:<15} FAILED: {e}", "-", "-");
                    ok = false;
                }
            }
        }
    }
    println!();
    println!("  ClusterIP from a pod keeps the pod's source (10.244.1.10);");
    println!("  NodePort traffic from outside is masqueraded to a node address.");
    println!("  backends that answered: {backends:?}");
    let out = p.cleanup();
    let cleaned = out.status.success() && p.table().is_none() && p.table6().is_none();
    println!(
        "  cleanup: {}",
        if cleaned {
            "tables ip/ip6 kube-nlproxy removed"
        } else {
            "FAILED"
        }
    );
    if !cleaned {
        ok = false;
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    drop(p);
    drop(t);
    println!("  namespaces deleted");
    if !ok {
        return Err("some requests failed".into());
    }
    if backends.len() < 2 {
        return Err(format!(
            "expected both backends to answer, got {backends:?}"
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("\nDEMO OK");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nDEMO FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
