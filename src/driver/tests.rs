//! The whole sync — source changes, model, mode, kernel, conntrack — in memory:
//! both modes on `FakeKernel` / `FakeIpvs` with a [`FakeHost`], counted, not
//! timed.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube_nlproxy_netlink::conntrack::CtTuple;
use serde_json::json;

use super::ipvs::IpvsMode;
use super::nftables::NftablesMode;
use super::*;
use crate::config::Config;
use crate::sync::ipvs::FakeIpvs;
use crate::sync::{FakeKernel, FaultPoint};

fn service(i: usize, proto: &str) -> Service {
    let ip = cluster_ip(i);
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": "ns"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                 "ports": [{"name": "p", "port": 80, "protocol": proto, "targetPort": 8080}]}
    }))
    .unwrap()
}

fn cluster_ip(i: usize) -> String {
    format!("10.96.{}.{}", i / 250, 1 + i % 250)
}

fn endpoint_ip(i: usize, k: usize) -> String {
    format!("10.{}.{}.{}", 64 + k, i / 250, 1 + i % 250)
}

fn slice(i: usize, proto: &str, endpoints: &[String]) -> EndpointSlice {
    let endpoints: Vec<_> = endpoints
        .iter()
        .map(|ip| json!({"addresses": [ip], "nodeName": "node-b", "conditions": {"ready": true}}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-abc"), "namespace": "ns",
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": 8080, "protocol": proto}],
        "endpoints": endpoints
    }))
    .unwrap()
}

fn node() -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.7.1"}]}
    }))
    .unwrap()
}

/// `n` services with two endpoints each.
fn cluster(n: usize, proto: &str) -> ObjectChanges {
    let mut objects = crate::source::Objects::default();
    for i in 0..n {
        objects.services.push(service(i, proto));
        objects
            .endpoint_slices
            .push(slice(i, proto, &[endpoint_ip(i, 0), endpoint_ip(i, 1)]));
    }
    objects.nodes.push(node());
    ObjectChanges::everything(objects)
}

/// Service `i`'s slice now holds `endpoints`.
fn endpoints_of(i: usize, proto: &str, endpoints: &[String]) -> ObjectChanges {
    ObjectChanges {
        endpoint_slices: vec![(
            ("ns".into(), format!("svc-{i}-abc")),
            Some(slice(i, proto, endpoints)),
        )],
        ..ObjectChanges::default()
    }
}

fn config() -> Config {
    Config {
        hostname_override: Some("node-a".into()),
        ..Config::default()
    }
}

fn host() -> FakeHost {
    FakeHost::new("ignored", &["192.168.7.1".parse().unwrap()])
}

fn nft_driver() -> Driver<NftablesMode<FakeKernel>, FakeHost> {
    Driver::new(&config(), NftablesMode::new(FakeKernel::default()), host())
}

fn ipvs_driver() -> Driver<IpvsMode<FakeIpvs, FakeKernel>, FakeHost> {
    let mode = IpvsMode::new(FakeIpvs::default(), FakeKernel::default(), "rr");
    Driver::new(&config(), mode, host())
}

#[test]
fn nftables_one_endpoint_change_among_10k_sends_a_constant_handful_and_a_noop_nothing() {
    let mut driver = nft_driver();
    let first = driver.sync_once(cluster(10_000, "TCP")).unwrap();
    assert!(first.report.full);
    assert_eq!(driver.verify().unwrap(), Vec::<String>::new());
    let commits = driver.mode().dataplane().commits;
    let messages = driver.mode().messages_sent();

    let synced = driver
        .sync_once(endpoints_of(
            4321,
            "TCP",
            &[endpoint_ip(4321, 0), "10.99.0.7".into()],
        ))
        .unwrap();
    assert!(!synced.report.full);
    assert_eq!(synced.changed.len(), 1, "{:?}", synced.changed);
    assert_eq!(driver.mode().dataplane().commits, commits + 1);
    // One endpoint element out, one in (and its hairpin element): a handful
    // of operations in one batch, whatever the number of services.
    let sent = driver.mode().messages_sent() - messages;
    assert!(sent <= 8, "{sent} messages for one endpoint");
    assert_eq!(driver.verify().unwrap(), Vec::<String>::new());

    let messages = driver.mode().messages_sent();
    let noop = driver.sync_once(ObjectChanges::default()).unwrap();
    assert!(noop.report.ops.is_empty());
    assert_eq!(
        driver.mode().messages_sent(),
        messages,
        "a no-op sends nothing"
    );
    assert_eq!(driver.mode().dataplane().commits, commits + 1);
}

#[test]
fn ipvs_mode_syncs_through_the_same_driver_and_verifies_the_kernel() {
    let mut driver = ipvs_driver();
    driver.sync_once(cluster(50, "TCP")).unwrap();
    assert_eq!(driver.verify().unwrap(), Vec::<String>::new());
    assert_eq!(driver.mode().ipvs_dataplane().state.services.len(), 50);

    let before = driver.mode().ipvs_dataplane().log.len();
    let synced = driver
        .sync_once(endpoints_of(7, "TCP", &[endpoint_ip(7, 0)]))
        .unwrap();
    assert_eq!(synced.changed.len(), 1);
    let log = &driver.mode().ipvs_dataplane().log[before..];
    assert!(
        log.iter()
            .all(|op| op.to_string().contains(&endpoint_ip(7, 1))
                || op.to_string().contains(&cluster_ip(7))),
        "only service 7's real server changes: {log:?}"
    );
    assert!(!log.is_empty());

    // Something else deletes a virtual server: verify says so, a full sync
    // puts it back.
    let key = *driver
        .mode()
        .desired_state()
        .virtual_servers
        .keys()
        .next()
        .unwrap();
    let mut ipvs = driver.mode().ipvs_dataplane().clone();
    ipvs.state.services.remove(&key);
    let mut driver2 = {
        let mode = IpvsMode::new(ipvs, FakeKernel::default(), "rr");
        Driver::new(&config(), mode, host())
    };
    driver2.prepare(cluster(50, "TCP")).unwrap();
    assert!(!driver2.verify().unwrap().is_empty());
    driver2.sync_once(ObjectChanges::default()).unwrap();
    assert_eq!(driver2.verify().unwrap(), Vec::<String>::new());
}

fn udp_flow(client: &str, vip: &str, backend: &str) -> (CtTuple, CtTuple) {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    (
        CtTuple {
            src: ip(client),
            dst: ip(vip),
            proto: 17,
            sport: 40000,
            dport: 80,
        },
        CtTuple {
            src: ip(backend),
            dst: ip(client),
            proto: 17,
            sport: 8080,
            dport: 40000,
        },
    )
}

/// A UDP service loses an endpoint: the sync deletes the flows DNATed to it,
/// and only those.
fn stale_udp_flows_go_with_their_endpoint<M: Mode>(mut driver: Driver<M, FakeHost>) {
    let flows = vec![
        udp_flow("10.244.0.5", &cluster_ip(1), &endpoint_ip(1, 0)),
        udp_flow("10.244.0.5", &cluster_ip(1), &endpoint_ip(1, 1)),
        udp_flow("10.244.0.6", &cluster_ip(2), &endpoint_ip(2, 0)),
    ];
    driver.host_mut().flows = flows.clone();
    let first = driver.sync_once(cluster(3, "UDP")).unwrap();
    assert_eq!(first.conntrack_deleted, [0, 0], "every flow is valid");
    let synced = driver
        .sync_once(endpoints_of(1, "UDP", &[endpoint_ip(1, 1)]))
        .unwrap();
    assert_eq!(synced.conntrack_deleted, [1, 0]);
    assert_eq!(driver.host().flows, flows[1..].to_vec());
}

#[test]
fn udp_flows_to_a_removed_endpoint_are_deleted_by_the_sync_that_removes_it() {
    stale_udp_flows_go_with_their_endpoint(nft_driver());
    stale_udp_flows_go_with_their_endpoint(ipvs_driver());
}

#[test]
fn a_restart_judges_flows_by_the_state_alone() {
    let mut driver = nft_driver();
    // Left from before the restart: a flow to an endpoint the service lost
    // while we were down.
    driver.host_mut().flows = vec![
        udp_flow("10.244.0.5", &cluster_ip(0), "10.200.0.1"),
        udp_flow("10.244.0.5", &cluster_ip(0), &endpoint_ip(0, 0)),
    ];
    let first = driver.sync_once(cluster(1, "UDP")).unwrap();
    assert_eq!(first.conntrack_deleted, [1, 0]);
    assert_eq!(driver.host().flows.len(), 1);
}

#[test]
fn a_refused_sync_loses_nothing_and_the_next_one_reads_the_kernel_back() {
    let mut driver = nft_driver();
    driver.sync_once(cluster(20, "TCP")).unwrap();
    driver
        .mode_mut()
        .dataplane_mut()
        .fail_next(FaultPoint::Apply, libc::ENOBUFS, 1);
    let err = driver
        .sync_once(endpoints_of(3, "TCP", &[endpoint_ip(3, 0)]))
        .unwrap_err();
    let chain = crate::ErrorChain(&err).to_string();
    assert!(chain.contains("No buffer space"), "{chain}");
    assert!(!driver.verify().unwrap().is_empty(), "nothing was applied");
    // A read-back that fails (EINTR mid-dump) keeps the change pending too.
    driver
        .mode_mut()
        .dataplane_mut()
        .fail_next(FaultPoint::Dump, libc::EINTR, 1);
    assert!(driver.sync_once(ObjectChanges::default()).is_err());
    // No new change: the next sync still sends the one that failed.
    let synced = driver.sync_once(ObjectChanges::default()).unwrap();
    assert!(synced.report.full);
    assert_eq!(synced.changed.len(), 1);
    assert_eq!(driver.verify().unwrap(), Vec::<String>::new());
}

#[test]
fn node_addresses_are_listed_only_when_a_flag_needs_them() {
    let mut driver = nft_driver();
    driver.sync_once(cluster(2, "TCP")).unwrap();
    driver.sync_once(ObjectChanges::default()).unwrap();
    assert_eq!(driver.host().address_listings, 0);

    let cfg = Config {
        nodeport_addresses: crate::config::NodePortAddressesFlag::Cidrs(vec![
            "192.168.7.0/24".parse().unwrap(),
        ]),
        ..config()
    };
    let mut driver = Driver::new(&cfg, NftablesMode::new(FakeKernel::default()), host());
    driver.sync_once(cluster(2, "TCP")).unwrap();
    assert_eq!(driver.host().address_listings, 1);
    assert_eq!(
        driver.node_context().unwrap().options.nodeport_addresses,
        NodePortAddresses::Ips(vec!["192.168.7.1".parse().unwrap()])
    );
}

#[test]
fn drift_in_our_table_is_found_cheaply_and_a_foreign_commit_is_not_drift() {
    use crate::sync::Dataplane;
    use kube_nlproxy_netlink::nft::{Family, Op};
    let mut driver = nft_driver();
    driver.sync_once(cluster(100, "TCP")).unwrap();
    assert!(!driver.check_drift().unwrap());
    // Another program's table: the generation moves, our skeleton does not.
    let foreign = [Op::AddTable {
        family: Family::Ipv4,
        name: "foreign".into(),
    }];
    driver.mode_mut().dataplane_mut().apply(&foreign).unwrap();
    let messages = driver.mode().messages_sent();
    assert!(!driver.check_drift().unwrap());
    let skeleton_dumps = driver.mode().messages_sent() - messages;
    assert!(skeleton_dumps <= 3, "{skeleton_dumps} requests");
    // Nothing moved since: one request.
    let messages = driver.mode().messages_sent();
    assert!(!driver.check_drift().unwrap());
    assert_eq!(driver.mode().messages_sent() - messages, 1);

    // Someone deletes our table: found, and the next sync rebuilds it.
    let ours = [Op::DeleteTable {
        family: Family::Ipv4,
        name: crate::mode::nftables::TABLE.into(),
    }];
    driver.mode_mut().dataplane_mut().apply(&ours).unwrap();
    assert!(driver.check_drift().unwrap());
    let synced = driver.sync_once(ObjectChanges::default()).unwrap();
    assert!(synced.report.full);
    assert_eq!(driver.verify().unwrap(), Vec::<String>::new());
    assert!(!driver.check_drift().unwrap());
    // The foreign table is still there.
    let mut kernel = driver.mode().dataplane().clone();
    assert!(kernel.dump(Family::Ipv4, "foreign").unwrap().is_some());
}

#[test]
fn ipvs_timeouts_are_set_once_before_the_first_sync() {
    use std::time::Duration;
    let mode = IpvsMode::new(FakeIpvs::default(), FakeKernel::default(), "rr").timeouts([
        Duration::from_secs(60),
        Duration::from_secs(2),
        Duration::ZERO,
    ]);
    let mut driver = Driver::new(&config(), mode, host());
    assert_eq!(driver.mode().ipvs_dataplane().timeouts, None);
    driver.sync_once(cluster(3, "TCP")).unwrap();
    let want = kube_nlproxy_netlink::ipvs::IpvsTimeouts {
        tcp: 60,
        tcp_fin: 2,
        udp: 300,
    };
    assert_eq!(driver.mode().ipvs_dataplane().timeouts, Some(want));
    assert_eq!(driver.mode().applied_timeouts(), Some(want));
    // Zero everywhere (the default) sends nothing.
    let mut plain = ipvs_driver();
    plain.sync_once(cluster(3, "TCP")).unwrap();
    assert_eq!(plain.mode().ipvs_dataplane().timeouts, None);
}

#[test]
fn a_first_list_absorbed_in_pieces_syncs_as_one() {
    let whole = {
        let mut driver = nft_driver();
        driver.sync_once(cluster(20, "TCP")).unwrap();
        driver.state().clone()
    };
    let mut driver = nft_driver();
    let mut all = cluster(20, "TCP");
    // Slices first, then the services, then the node, as a streamed list may.
    let slices = std::mem::take(&mut all.endpoint_slices);
    let services = std::mem::take(&mut all.services);
    for chunk in slices.chunks(7) {
        driver.absorb(ObjectChanges {
            endpoint_slices: chunk.to_vec(),
            ..ObjectChanges::default()
        });
    }
    driver.absorb(ObjectChanges {
        services,
        ..ObjectChanges::default()
    });
    assert_eq!(driver.mode().dataplane().commits, 0, "absorb sends nothing");
    let synced = driver.sync_once(all).unwrap();
    assert!(synced.report.full);
    // Everything was rendered; the names absorbed before were not kept.
    assert!(synced.node_changed);
    assert!(synced.changed.is_empty(), "{:?}", synced.changed);
    assert_eq!(driver.state(), &whole);
    assert_eq!(driver.mode().dataplane().commits, 1);
    // What the kernel holds is what that state renders.
    assert_eq!(driver.verify().unwrap(), Vec::<String>::new());
}

/// The periodic read-back while nothing else has committed reads the kernel
/// by lookup, and the sync after it stays incremental. An element gone
/// without the generation moving (a transaction of ours gone wrong) still
/// makes it a full sync that puts the element back; so does anyone's commit.
#[test]
fn the_periodic_read_back_reads_by_lookup_while_the_generation_is_ours() {
    use crate::sync::Dataplane;
    use kube_nlproxy_netlink::nft::{Element, Family, Op};
    let table = crate::mode::nftables::TABLE;
    let mut driver = nft_driver();
    driver.sync_once(cluster(1100, "TCP")).unwrap();
    driver.mode_mut().periodic_read_back();
    let synced = driver.sync_once(ObjectChanges::default()).unwrap();
    assert!(!synced.report.full);

    let kernel = driver.mode_mut().dataplane_mut();
    let endpoints = kernel.dump(Family::Ipv4, table).unwrap().unwrap().sets["endpoints-ips"]
        .elements
        .clone();
    assert!(endpoints.len() > crate::sync::LOOKUP_FROM);
    let gone = endpoints.iter().nth(777).unwrap();
    kernel
        .apply(&[Op::DeleteElements {
            family: Family::Ipv4,
            table: table.into(),
            set: "endpoints-ips".into(),
            elements: vec![Element::new(gone.key.clone())],
        }])
        .unwrap();
    kernel.generation -= 1;
    driver.mode_mut().periodic_read_back();
    let synced = driver.sync_once(ObjectChanges::default()).unwrap();
    assert!(synced.report.full);
    assert_eq!(synced.report.ops.get("add-element"), Some(&1));
    assert_eq!(driver.verify().unwrap(), Vec::<String>::new());

    let foreign = [Op::AddTable {
        family: Family::Ipv4,
        name: "foreign".into(),
    }];
    driver.mode_mut().dataplane_mut().apply(&foreign).unwrap();
    driver.mode_mut().periodic_read_back();
    assert!(
        driver
            .sync_once(ObjectChanges::default())
            .unwrap()
            .report
            .full
    );
}
