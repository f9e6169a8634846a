//! Two claims that `FakeKernel` alone cannot prove, checked on the real kernel
//! through the real driver and syncer (`NetlinkDataplane`, `KernelHost`), with
//! the objects going the daemon's way (manifests parsed as the file source
//! parses them, `Driver::sync_once`):
//!
//! - a change sends a constant number of messages: one endpoint change costs
//!   the same netlink messages and bytes at 1k and at 10k Services;
//! - a kernel fault leaves the table as it was: a cold start of several
//!   transactions rejected in its middle (an injected fault on the real
//!   socket) leaves every Service whole or absent, as `nft -j list table`
//!   and real TCP connections see it; the daemon counts the failure and its
//!   next sync completes the table to what a clean cold start gives.
mod common;
use common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kube_nlproxy::config::{self, Config};
use kube_nlproxy::daemon::{self, SideChannels};
use kube_nlproxy::driver::nftables::NftablesMode;
use kube_nlproxy::driver::{Driver, KernelHost, Mode};
use kube_nlproxy::source::file::parse_manifests;
use kube_nlproxy::source::{ObjectChanges, ObjectSource, Objects};
use kube_nlproxy::sync::{Dataplane, NetlinkDataplane, SyncError, TableSnapshot};
use kube_nlproxy_netlink::nft::{Element, Family, InjectedFault, Set};
use serde_json::Value;

/// The Service that the endpoint-change test changes (the same name length at
/// every scale: names are zero-padded).
const CHANGED: usize = 777;

/// Service `i`: `default/svc-NNNNN`.
fn name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// Service `i`'s ClusterIP (10.96.0.0/16, the cluster's ServiceCIDR).
fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, (i / 250) as u8, 1 + (i % 250) as u8)
}

/// Service `i`'s NodePort: 30000 + i while there are ports left.
fn node_port(i: usize) -> Option<u16> {
    (i < 2_768).then(|| 30_000 + i as u16)
}

/// The manifests of Service `i`: a NodePort Service (ClusterIP when no port is
/// left) on port 80 → 8080 and its EndpointSlice with `eps`.
fn service_yaml(i: usize, eps: &[Ep]) -> [String; 2] {
    let svc = match node_port(i) {
        Some(np) => Svc::new(
            &name(i),
            "NodePort",
            &[&vip(i).to_string()],
            vec![nport("http", "TCP", 80, PORTS[0], np)],
        ),
        None => Svc::new(
            &name(i),
            "ClusterIP",
            &[&vip(i).to_string()],
            vec![port("http", "TCP", 80, PORTS[0])],
        ),
    };
    [
        svc.yaml(),
        slice(&name(i), "a", false, &[("http", "TCP", PORTS[0])], eps),
    ]
}

/// Parses manifests as the file source does; every document must be taken.
fn parse(yaml: &str) -> Objects {
    let (objects, warnings) = parse_manifests(yaml, "test");
    assert!(warnings.is_empty(), "{warnings:?}");
    objects
}

/// `n` Services (with the Nodes and the ServiceCIDR), each with the endpoints
/// `eps(i)`.
fn cluster_of(n: usize, eps: impl Fn(usize) -> Vec<Ep>) -> Objects {
    let docs: Vec<String> = (0..n).flat_map(|i| service_yaml(i, &eps(i))).collect();
    parse(&cluster(&docs))
}

/// A local endpoint at `ip`.
fn ep(ip: &str) -> Ep {
    Ep {
        ip: ip.into(),
        node: NODE.into(),
        ready: true,
    }
}

/// Service `i`'s EndpointSlice now holds `eps`: one changed object.
fn slice_change(i: usize, eps: &[Ep]) -> ObjectChanges {
    let mut objects = parse(&service_yaml(i, eps)[1]);
    let slice = objects.endpoint_slices.pop().expect("one slice");
    ObjectChanges {
        endpoint_slices: vec![(("default".into(), format!("{}-a", name(i))), Some(slice))],
        ..ObjectChanges::default()
    }
}

/// The daemon's configuration, from the flags the other netns tests give it;
/// no HTTP servers.
fn config() -> Config {
    let mut args = vec!["--hostname-override".to_string(), NODE.to_string()];
    args.extend(default_args());
    let mut cfg = config::parse_args(args).expect("flags parse");
    cfg.healthz_bind_address = String::new();
    cfg.metrics_bind_address = String::new();
    cfg
}

// ---------------------------------------------------------------------------
// A change sends a constant number of messages

/// What one endpoint change cost on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ChangeCost {
    /// Operations by kind.
    ops: BTreeMap<&'static str, usize>,
    /// Every netlink message the sync sent (its batch and its requests).
    messages: u64,
    /// Messages of the one batch (markers included).
    batch_messages: usize,
    /// Bytes of that batch.
    batch_bytes: usize,
}

/// Cold-starts `n` Services with two endpoints each in a fresh netns, then
/// moves one endpoint of Service [`CHANGED`]: what that change sent.
fn endpoint_change_cost(n: usize) -> ChangeCost {
    let ns = Netns::new(unique("knp-kproof"));
    let two = |i: usize| {
        vec![
            ep(&format!("10.244.{}.{}", 10 + i / 250, 1 + i % 250)),
            ep(&format!("10.245.{}.{}", 10 + i / 250, 1 + i % 250)),
        ]
    };
    let objects = cluster_of(n, two);
    let cfg = config();
    in_ns(&ns.0, move || {
        let mode = NftablesMode::new(NetlinkDataplane::new().expect("nf_tables socket"));
        let mut driver = Driver::new(&cfg, mode, KernelHost::new());
        let first = driver
            .sync_once(ObjectChanges::everything(objects))
            .expect("cold start");
        assert!(first.report.full);
        let before = driver.mode().messages_sent();
        let mut eps = two(CHANGED);
        eps[1] = ep("10.246.0.7");
        let synced = driver
            .sync_once(slice_change(CHANGED, &eps))
            .expect("endpoint change");
        assert!(!synced.report.full, "an incremental sync");
        assert_eq!(synced.changed.len(), 1, "{:?}", synced.changed);
        let stats = driver.mode().dataplane().socket().last_apply_stats();
        let cost = ChangeCost {
            ops: synced.report.ops,
            messages: driver.mode().messages_sent() - before,
            batch_messages: stats.messages,
            batch_bytes: stats.bytes,
        };
        // The kernel took it: the read-back matches the desired state.
        assert_eq!(driver.verify().expect("read back"), Vec::<String>::new());
        cost
    })
}

#[test]
fn one_endpoint_change_sends_the_same_messages_and_bytes_at_1k_and_10k_services() {
    let small = endpoint_change_cost(1_000);
    let large = endpoint_change_cost(10_000);
    eprintln!("one endpoint change, 1k services:  {small:?}");
    eprintln!("one endpoint change, 10k services: {large:?}");
    assert!(
        small.batch_messages > 2,
        "the batch holds changes: {small:?}"
    );
    // Bytes too: the batch names only Service CHANGED (the same name at both
    // scales) and its endpoints, whose addresses and ports go as fixed-size
    // binary keys; nothing in it grows with the other Services.
    assert_eq!(small, large);
}

// ---------------------------------------------------------------------------
// A kernel fault leaves the table as it was

/// Services of the cold start: at about nine elements each (two endpoints
/// and a NodePort), four transactions of at most `COLD_START_BATCH_ELEMENTS`
/// (5 000) beside the first one of chains, sets and rules.
const SERVICES: usize = 2_000;
// Every Service of the cold start has a NodePort.
const _: () = assert!(SERVICES <= 2_768);

/// The cold start's transactions let through before the fault: the first one
/// (table, chains, sets, rules) and one of whole Services.
const PASSED: u32 = 2;

/// The daemon's view of the kernel, shared with the test: the outcome of
/// every transaction, and a gate that holds the daemon at its first request
/// after a failed one until the test opens it, so the test reads the kernel
/// as the fault left it.
#[derive(Debug, Default)]
struct Gate {
    log: Mutex<GateLog>,
    moved: Condvar,
}

#[derive(Debug, Default, Clone)]
struct GateLog {
    /// Whether each transaction was committed, in order.
    applied: Vec<bool>,
    /// The daemon waits at the gate.
    holding: bool,
    /// The test opened the gate.
    open: bool,
}

impl Gate {
    /// Waits until `f` holds for the log; panics after two minutes.
    fn wait_until(&self, what: &str, f: impl Fn(&GateLog) -> bool) -> GateLog {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut log = self.log.lock().unwrap();
        while !f(&log) {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("timed out waiting for {what}: {log:?}"));
            log = self.moved.wait_timeout(log, left).unwrap().0;
        }
        log.clone()
    }

    /// Lets the daemon on.
    fn open(&self) {
        self.log.lock().unwrap().open = true;
        self.moved.notify_all();
    }
}

/// `NetlinkDataplane` (the daemon's, unchanged), its transactions logged in a
/// [`Gate`] that holds every request after a failed transaction until opened.
#[derive(Debug)]
struct GatedDataplane {
    inner: NetlinkDataplane,
    gate: Arc<Gate>,
}

impl GatedDataplane {
    fn new(gate: Arc<Gate>) -> Self {
        GatedDataplane {
            inner: NetlinkDataplane::new().expect("nf_tables socket"),
            gate,
        }
    }

    /// Holds the caller while a transaction failed and the gate is shut.
    fn pass(&self) {
        let mut log = self.gate.log.lock().unwrap();
        if log.applied.contains(&false) && !log.open {
            log.holding = true;
            self.gate.moved.notify_all();
            while !log.open {
                log = self.gate.moved.wait(log).unwrap();
            }
            log.holding = false;
        }
    }
}

impl Dataplane for GatedDataplane {
    fn dump(&mut self, family: Family, table: &str) -> Result<Option<TableSnapshot>, SyncError> {
        self.pass();
        self.inner.dump(family, table)
    }

    fn apply(&mut self, ops: &[kube_nlproxy_netlink::nft::Op]) -> Result<(), SyncError> {
        self.pass();
        let result = self.inner.apply(ops);
        self.gate.log.lock().unwrap().applied.push(result.is_ok());
        self.gate.moved.notify_all();
        result
    }

    fn dump_set_elements(
        &mut self,
        family: Family,
        set: &Set,
    ) -> Result<Option<Vec<Element>>, SyncError> {
        self.pass();
        self.inner.dump_set_elements(family, set)
    }

    fn messages_sent(&self) -> u64 {
        self.inner.messages_sent()
    }

    fn generation(&mut self) -> Result<u32, SyncError> {
        self.pass();
        self.inner.generation()
    }

    fn dump_skeleton(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<TableSnapshot>, SyncError> {
        self.pass();
        self.inner.dump_skeleton(family, table)
    }

    fn find_unheld_element(
        &mut self,
        family: Family,
        set: &Set,
        elements: &[&Element],
    ) -> Result<Option<usize>, SyncError> {
        self.pass();
        self.inner.find_unheld_element(family, set, elements)
    }
}

/// A source that hands the daemon's loop `objects` at its first sync and no
/// change after; [`end`](Self::end) ends the loop.
struct OneShotSource {
    sender: Mutex<Option<tokio::sync::watch::Sender<u64>>>,
    receiver: tokio::sync::watch::Receiver<u64>,
    objects: Mutex<Option<Objects>>,
}

impl OneShotSource {
    fn new(objects: Objects) -> Self {
        let (sender, receiver) = tokio::sync::watch::channel(1);
        OneShotSource {
            sender: Mutex::new(Some(sender)),
            receiver,
            objects: Mutex::new(Some(objects)),
        }
    }

    /// The source is gone: the daemon's loop returns.
    fn end(&self) {
        self.sender.lock().unwrap().take();
    }
}

impl ObjectSource for OneShotSource {
    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.receiver.clone()
    }

    fn snapshot(&self) -> Objects {
        Objects::default()
    }

    fn take_changes(&self) -> Option<ObjectChanges> {
        Some(match self.objects.lock().unwrap().take() {
            Some(objects) => ObjectChanges::everything(objects),
            None => ObjectChanges::default(),
        })
    }
}

/// `nft -j list table FAMILY kube-nlproxy` in `ns`, without handles and with
/// every set's elements sorted (their order in a dump is the kernel's hash
/// order); empty when the table does not exist.
fn nft_json(ns: &str, family: &str) -> Vec<Value> {
    let out = nsexec(ns, &["nft", "-j", "list", "table", family, "kube-nlproxy"]);
    if !out.status.success() {
        return Vec::new();
    }
    let v: Value = serde_json::from_slice(&out.stdout).expect("nft -j prints JSON");
    let mut objects: Vec<Value> = v["nftables"]
        .as_array()
        .expect("an nftables array")
        .iter()
        .filter(|o| o.get("metainfo").is_none())
        .cloned()
        .collect();
    for o in &mut objects {
        normalize(o);
    }
    objects
}

/// Drops `handle`s and sorts `elem` lists, at every depth of `v`.
fn normalize(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove("handle");
            if let Some(Value::Array(elems)) = map.get_mut("elem") {
                elems.sort_by_key(|e| e.to_string());
            }
            map.values_mut().for_each(normalize);
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

/// Both of our tables as `nft -j` shows them, normalized.
fn our_tables(ns: &str) -> [Vec<Value>; 2] {
    [nft_json(ns, "ip"), nft_json(ns, "ip6")]
}

/// The first `comment` anywhere in `v`.
fn comment_of(v: &Value) -> Option<&str> {
    match v {
        Value::Object(map) => map
            .get("comment")
            .and_then(Value::as_str)
            .or_else(|| map.values().find_map(comment_of)),
        Value::Array(items) => items.iter().find_map(comment_of),
        _ => None,
    }
}

/// A Service's elements: `(set, element)` as `nft -j` prints them.
type ServiceParts = BTreeSet<(String, String)>;

/// The set and map elements of `tables` by the Service their comment names
/// (`ns/name`), and the tables without them (chains, rules, sets, node-wide
/// elements).
fn split_by_service(tables: &[Vec<Value>; 2]) -> (BTreeMap<String, ServiceParts>, Vec<Value>) {
    let mut services: BTreeMap<String, ServiceParts> = BTreeMap::new();
    let mut rest = Vec::new();
    for object in tables.iter().flatten() {
        let mut object = object.clone();
        for kind in ["set", "map"] {
            let Some(set) = object.get_mut(kind) else {
                continue;
            };
            let name = set["name"].as_str().unwrap_or_default().to_string();
            let Some(Value::Array(elems)) = set.get_mut("elem") else {
                continue;
            };
            elems.retain(|e| {
                let service = comment_of(e)
                    .map(|c| c.split(':').next().unwrap_or(c))
                    .filter(|c| c.contains('/'));
                match service {
                    Some(service) => {
                        services
                            .entry(service.to_string())
                            .or_default()
                            .insert((name.clone(), e.to_string()));
                        false
                    }
                    None => true,
                }
            });
        }
        rest.push(object);
    }
    (services, rest)
}

/// What a connection from `ext` to Service `i` (ClusterIP, then NodePort)
/// got: the answering pod, or why not.
fn connect(ext: &str, i: usize, expect_answer: bool) -> [Res; 2] {
    let timeout = if expect_answer {
        OK_TIMEOUT
    } else {
        DROP_TIMEOUT
    };
    let np = node_port(i).expect("every Service of this test has a NodePort");
    [
        tcp(ext, sa(vip(i), 80), timeout),
        tcp(ext, sa(NODE_V4, np), timeout),
    ]
}

/// Up to `k` of `items`, spread evenly, always with the first and the last.
fn spread_sample(items: &[usize], k: usize) -> Vec<usize> {
    if items.len() <= k {
        return items.to_vec();
    }
    (0..k)
        .map(|j| items[j * (items.len() - 1) / (k - 1)])
        .collect()
}

#[test]
fn a_cold_start_failed_in_its_middle_leaves_each_service_whole_or_absent_and_the_next_sync_completes_it()
 {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Local);
    let eps = t.eps(&["a", "b"], false);
    let objects = cluster_of(SERVICES, |_| eps.clone());
    let cfg = config();

    // The oracle: a clean cold start of the same objects in a namespace of its
    // own, as `nft -j` lists it.
    let clean = Netns::new(unique("knp-kproof-clean"));
    let clean_gate = Arc::new(Gate::default());
    {
        let (objects, cfg, gate) = (objects.clone(), cfg.clone(), clean_gate.clone());
        in_ns(&clean.0, move || {
            let mode = NftablesMode::new(GatedDataplane::new(gate));
            let mut driver = Driver::new(&cfg, mode, KernelHost::new());
            driver
                .sync_once(ObjectChanges::everything(objects))
                .expect("a clean cold start");
        });
    }
    let transactions = clean_gate.log.lock().unwrap().applied.clone();
    eprintln!(
        "a clean cold start of {SERVICES} services: {} transactions",
        transactions.len()
    );
    assert!(transactions.iter().all(|ok| *ok));
    assert!(
        transactions.len() > PASSED as usize + 1,
        "the fault must land in the middle: {} transactions",
        transactions.len()
    );
    let reference = our_tables(&clean.0);
    let (reference_services, reference_rest) = split_by_service(&reference);
    assert_eq!(reference_services.len(), SERVICES);

    // The daemon's loop on the node, its socket set to reject the cold start's
    // transaction PASSED + 1.
    let gate = Arc::new(Gate::default());
    let source = Arc::new(OneShotSource::new(objects));
    let (metrics_tx, metrics_rx) = std::sync::mpsc::channel();
    let daemon = {
        let (node, gate, source, cfg) = (t.node.clone(), gate.clone(), source.clone(), cfg.clone());
        std::thread::spawn(move || -> String {
            enter_ns(&node).expect("enter the node namespace");
            let mut dataplane = GatedDataplane::new(gate);
            dataplane
                .inner
                .socket_mut()
                .inject_fault(InjectedFault::BatchAfter {
                    pass: PASSED,
                    errno: libc::ENOMEM,
                });
            let mut driver = Driver::new(&cfg, NftablesMode::new(dataplane), KernelHost::new());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let side = SideChannels::start(&cfg, "nftables")
                    .await
                    .expect("no servers to bind");
                metrics_tx.send(side.metrics.clone()).unwrap();
                match daemon::run(&cfg, source.as_ref(), &mut driver, side).await {
                    Ok(()) => "stopped".to_string(),
                    Err(e) => e.to_string(),
                }
            })
        })
    };
    let metrics = metrics_rx.recv().expect("the daemon started");
    let failures = || {
        metrics
            .render()
            .lines()
            .find(|l| {
                l.starts_with(
                    r#"kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"}"#,
                )
            })
            .map(str::to_string)
            .unwrap_or_default()
    };

    // (1) The fault: the daemon holds after it.
    let log = gate.wait_until("the failed cold start", |log| log.holding);
    let expected: Vec<bool> = (0..PASSED).map(|_| true).chain([false]).collect();
    assert_eq!(log.applied, expected, "transaction {} failed", PASSED + 1);
    assert_eq!(
        failures(),
        r#"kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 1"#,
        "the daemon counted the failed sync"
    );
    let faulted = our_tables(&t.node);
    let (faulted_services, faulted_rest) = split_by_service(&faulted);
    assert_eq!(
        faulted_rest, reference_rest,
        "the first transaction (chains, sets, rules) is in whole"
    );
    let mut present = Vec::new();
    let mut absent = Vec::new();
    for (i, (service, parts)) in reference_services.iter().enumerate() {
        assert_eq!(*service, format!("default/{}", name(i)));
        match faulted_services.get(service) {
            None => absent.push(i),
            Some(got) if got == parts => present.push(i),
            Some(got) => panic!(
                "{service} is half-programmed: has {got:?}, a clean cold start has {parts:?}"
            ),
        }
    }
    assert_eq!(
        faulted_services.len(),
        present.len(),
        "no elements of unknown Services"
    );
    eprintln!(
        "after the fault at transaction {} of {}: {} services present, {} absent",
        PASSED + 1,
        transactions.len(),
        present.len(),
        absent.len()
    );
    assert!(
        !present.is_empty() && !absent.is_empty(),
        "a fault in the middle"
    );

    let mut tried = Vec::new();
    for i in spread_sample(&present, 6) {
        let got = connect(&t.ext, i, true);
        for r in &got {
            let reply = r
                .as_ref()
                .unwrap_or_else(|e| panic!("{} present: {e}", name(i)));
            assert!(["a", "b"].contains(&reply.pod.as_str()), "{reply:?}");
        }
        tried.push((i, "present", got));
    }
    for i in spread_sample(&absent, 6) {
        let got = connect(&t.ext, i, false);
        for r in &got {
            assert!(r.is_err(), "{} absent but answered: {r:?}", name(i));
        }
        tried.push((i, "absent", got));
    }
    for (i, what, got) in &tried {
        eprintln!(
            "after the fault, {} ({what}): ClusterIP {:?}, NodePort {:?}",
            name(*i),
            got[0],
            got[1]
        );
    }

    // (2) The next sync completes the table: what a clean cold start gives,
    // and every sampled Service answers.
    gate.open();
    let log = gate.wait_until("the next sync", |log| log.applied.len() > expected.len());
    assert_eq!(
        log.applied[expected.len()..],
        [true],
        "one repairing transaction"
    );
    assert!(
        eventually(Duration::from_secs(30), || our_tables(&t.node) == reference),
        "the table equals a clean cold start's"
    );
    for (i, _, _) in &tried {
        for r in connect(&t.ext, *i, true) {
            let reply = r.unwrap_or_else(|e| panic!("{} after the repair: {e}", name(*i)));
            assert!(["a", "b"].contains(&reply.pod.as_str()), "{reply:?}");
        }
    }
    // (3) Counted once: the repair is no failure.
    assert_eq!(
        failures(),
        r#"kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 1"#
    );

    source.end();
    let ended = daemon.join().expect("the daemon's thread");
    assert!(ended.contains("source"), "{ended}");
}
