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
use std::net::{IpAddr, Ipv4Addr};
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

type KernelDriver<D> = Driver<NftablesMode<D>, KernelHost>;

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
    assert!(small.batch_messages > 2, "the batch holds changes: {small:?}");
    // Bytes too: the batch names only Service CHANGED (the same name at both
    // scales) and its endpoints, whose addresses and ports go as fixed-size
    // binary keys; nothing in it grows with the other Services.
    assert_eq!(small, large);
}
