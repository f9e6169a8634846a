//! The programmed-probe of one node: when is a moved endpoint in the kernel?
//!
//! A thread in the node's namespace polls the nf_tables generation (every 500 µs,
//! one netlink request; iptables-nft commits bump it too). After each change it
//! checks only the pending endpoints written before that change, each with one
//! narrow `nft`/`iptables` read instead of a ruleset dump (a dump of 44k Services
//! takes seconds):
//!
//! - kube-nlproxy: `nft get element ip kube-nlproxy hairpin '{ A . A }'`: the
//!   hairpin set holds `endpoint . endpoint` for every endpoint address (the
//!   `endpoints-*` maps are keyed by group id and index, not by address);
//! - kube-proxy nftables: `nft list chain ip kube-proxy service-HASH-bench/sI/tcp/p`,
//!   which DNATs itself (v1.37.2, no session affinity: `dnat ip to numgen random
//!   mod 2 map { 0 : ADDR . PORT, … }`, no endpoint chains);
//! - kube-proxy iptables: `iptables -t nat -S KUBE-SVC-HASH`, whose rules carry the
//!   comment `bench/sI:p -> ADDR:PORT`.
//!
//! The figure is from the API write to the generation change after which the
//! address was found: the check's own time is not in it.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Kind, NS, addresses};
use crate::common::{enter_ns, nsexec};

/// Service index → the name of its kube-proxy chain (`service-…` in nftables mode,
/// `KUBE-SVC-…` in iptables mode). Empty for kube-nlproxy.
pub type ServiceChains = HashMap<usize, String>;

/// Reads the service chains' names once from node namespace `ns` (after the proxy
/// has programmed it): `nft list chains ip` / `iptables -t nat -S
/// KUBE-SERVICES`.
pub fn service_chains(kind: Kind, ns: &str) -> ServiceChains {
    let mut out = ServiceChains::new();
    let prefix = format!("-{NS}/s");
    match kind {
        Kind::Ours => {}
        Kind::Nftables => {
            // (nft 1.0.6 lists chains per family only; kube-proxy's is the one
            // `ip` table in a node namespace.)
            let o = nsexec(ns, &["nft", "list", "chains", "ip"]);
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                let Some(name) = line
                    .trim()
                    .strip_prefix("chain ")
                    .and_then(|l| l.strip_suffix(" {"))
                else {
                    continue;
                };
                // service-HASH-bench/sI/tcp/p
                if let Some(rest) = name.strip_prefix("service-")
                    && let Some((_, tail)) = rest.split_once(&prefix)
                    && let Some((i, _)) = tail.split_once('/')
                    && let Ok(i) = i.parse()
                {
                    out.insert(i, name.to_string());
                }
            }
        }
        Kind::Iptables => {
            let o = nsexec(ns, &["iptables", "-t", "nat", "-S", "KUBE-SERVICES"]);
            let comment = format!("\"{NS}/s");
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                // -A KUBE-SERVICES -d IP/32 -p tcp -m comment --comment "bench/sI:p cluster IP" ... -j KUBE-SVC-HASH
                if let Some((_, tail)) = line.split_once(&comment)
                    && let Some((i, _)) = tail.split_once(':')
                    && let Ok(i) = i.parse()
                    && let Some((_, chain)) = line.rsplit_once("-j ")
                    && chain.starts_with("KUBE-SVC-")
                {
                    out.insert(i, chain.trim().to_string());
                }
            }
        }
    }
    out
}

/// One endpoint move the probe waits for.
pub struct Pending {
    /// The Service whose slice was patched.
    pub service: usize,
    /// The endpoint's new address.
    pub addr: Ipv4Addr,
    /// Just before the API write.
    pub wrote: Instant,
}

/// What one probe saw.
#[derive(Default)]
pub struct ProbeResult {
    /// API write → the generation change after which the address was found.
    pub latencies: Vec<Duration>,
    /// Moves not found before the probe was finished.
    pub missed: usize,
    /// How long each narrow check took (exec included).
    pub checks: Vec<Duration>,
}

/// A probe thread in one node namespace.
pub struct Probe {
    tx: Sender<Pending>,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<ProbeResult>,
}

impl Probe {
    /// Starts the probe in `ns` for proxy `kind`; returns once it has read the
    /// current generation (a move registered after that is seen).
    pub fn start(ns: &str, kind: Kind, chains: Arc<ServiceChains>) -> Probe {
        let (tx, rx) = channel();
        let (ready_tx, ready_rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let ns = ns.to_string();
        let handle = std::thread::spawn(move || {
            enter_ns(&ns).unwrap_or_else(|e| panic!("setns {ns}: {e}"));
            run(kind, &chains, rx, &stop2, ready_tx)
        });
        ready_rx.recv().expect("probe thread started");
        Probe { tx, stop, handle }
    }

    /// Registers a move (call before the API write).
    pub fn expect(&self, p: Pending) {
        let _ = self.tx.send(p);
    }

    /// Waits until `deadline` at most for the pending moves, then stops the
    /// thread (probes of several nodes share one deadline).
    pub fn finish(self, deadline: Instant) -> ProbeResult {
        drop(self.tx);
        while !self.handle.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().expect("probe thread")
    }
}

fn run(
    kind: Kind,
    chains: &ServiceChains,
    rx: Receiver<Pending>,
    stop: &AtomicBool,
    ready: Sender<()>,
) -> ProbeResult {
    let mut s = kube_nlproxy_netlink::nft::NftSocket::new().expect("nft socket");
    let mut last = s.generation().expect("nf_tables generation");
    let _ = ready.send(());
    let mut r = ProbeResult::default();
    let mut pending: Vec<Pending> = Vec::new();
    let mut open = true;
    loop {
        loop {
            match rx.try_recv() {
                Ok(p) => pending.push(p),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if (!open && pending.is_empty()) || stop.load(Ordering::SeqCst) {
            break;
        }
        let g = s.generation().unwrap_or(last);
        if g == last {
            std::thread::sleep(Duration::from_micros(500));
            continue;
        }
        let seen = Instant::now();
        last = g;
        pending.retain(|p| {
            if p.wrote > seen {
                return true;
            }
            let t = Instant::now();
            let found = check(kind, chains, p);
            r.checks.push(t.elapsed());
            if found {
                r.latencies.push(seen - p.wrote);
            }
            !found
        });
    }
    r.missed = pending.len();
    r
}

/// Is `p.addr` programmed for `p.service`? Runs in the node's namespace (the
/// thread's; the child inherits it).
fn check(kind: Kind, chains: &ServiceChains, p: &Pending) -> bool {
    let a = p.addr.to_string();
    let out = match kind {
        Kind::Ours => {
            return Command::new("nft")
                .args([
                    "get",
                    "element",
                    "ip",
                    "kube-nlproxy",
                    "hairpin",
                    &format!("{{ {a} . {a} }}"),
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        }
        Kind::Nftables => {
            let Some(chain) = chains.get(&p.service) else {
                return false;
            };
            Command::new("nft")
                .args(["list", "chain", "ip", "kube-proxy", chain])
                .output()
        }
        Kind::Iptables => {
            let Some(chain) = chains.get(&p.service) else {
                return false;
            };
            Command::new("iptables")
                .args(["-t", "nat", "-S", chain])
                .output()
        }
    };
    out.is_ok_and(|o| addresses(&String::from_utf8_lossy(&o.stdout)).contains(&p.addr))
}
