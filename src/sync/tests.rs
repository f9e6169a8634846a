use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;
use crate::mode::nftables::{
    LocalDetector, NftablesOptions, NftablesRenderer, NodePortAddresses, SetId, TableDelta,
    desired_tables,
};
use crate::model::{
    ClusterState, Endpoint, IpFamily, NodeInfo, Protocol, ServicePort, ServicePortName,
    TrafficDistribution, TrafficPolicy,
};

/// A compact random description of one service port.
#[derive(Debug, Clone)]
pub(crate) struct SvcSeed {
    id: u8,
    v6: bool,
    protocol: u8,
    node_port: bool,
    external_ip: bool,
    lb: bool,
    source_range: bool,
    etp_local: bool,
    itp_local: bool,
    affinity: bool,
    /// (host byte, local, ready, serving, terminating)
    endpoints: Vec<(u8, bool, bool, bool, bool)>,
}

pub(crate) fn svc_seed() -> impl Strategy<Value = SvcSeed> {
    (
        0u8..12,
        any::<bool>(),
        0u8..3,
        any::<[bool; 7]>(),
        prop::collection::vec(
            (
                1u8..6,
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
            ),
            0..4,
        ),
    )
        .prop_map(|(id, v6, protocol, f, endpoints)| SvcSeed {
            id,
            v6,
            protocol,
            node_port: f[0],
            external_ip: f[1],
            lb: f[2],
            source_range: f[3],
            etp_local: f[4],
            itp_local: f[5],
            affinity: f[6],
            endpoints,
        })
}

fn addr(v6: bool, net: u8, host: u8) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(
            0xfd00,
            u16::from(net),
            0,
            0,
            0,
            0,
            0,
            u16::from(host),
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, net, 0, host))
    }
}

pub(crate) fn state_of(seeds: &[SvcSeed]) -> ClusterState {
    let mut state = ClusterState {
        node: NodeInfo {
            name: "node-a".into(),
            zone: None,
            ips: vec![addr(false, 77, 1), addr(true, 77, 1)],
            pod_cidrs: Vec::new(),
        },
        ..Default::default()
    };
    for s in seeds {
        let protocol = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp][s.protocol as usize];
        let name = ServicePortName {
            namespace: "ns".into(),
            name: format!("svc{}", s.id).into(),
            port_name: "p".into(),
            protocol,
        };
        let family = if s.v6 { IpFamily::V6 } else { IpFamily::V4 };
        let port = ServicePort {
            name: name.clone(),
            family,
            cluster_ip: Some(addr(s.v6, 96, s.id + 1)),
            port: 80,
            node_port: s.node_port.then_some(30000 + u16::from(s.id)),
            external_ips: if s.external_ip {
                vec![addr(s.v6, 78, s.id + 1)]
            } else {
                vec![]
            },
            load_balancer_ips: if s.lb {
                vec![addr(s.v6, 79, s.id + 1)]
            } else {
                vec![]
            },
            load_balancer_source_ranges: if s.source_range {
                vec![if s.v6 {
                    "fd00:77::/32".parse().unwrap()
                } else {
                    "10.77.0.0/16".parse().unwrap()
                }]
            } else {
                vec![]
            },
            external_policy: if s.etp_local {
                TrafficPolicy::Local
            } else {
                TrafficPolicy::Cluster
            },
            internal_policy: if s.itp_local {
                TrafficPolicy::Local
            } else {
                TrafficPolicy::Cluster
            },
            affinity_timeout_seconds: s.affinity.then_some(60),
            health_check_node_port: None,
            traffic_distribution: TrafficDistribution::Unset,
            ipvs_scheduler: None,
        };
        state.services.insert((name.clone(), family), port);
        let eps = std::sync::Arc::make_mut(state.endpoints.entry(name).or_default());
        for (host, local, ready, serving, terminating) in &s.endpoints {
            eps.push(Endpoint {
                ip: addr(s.v6, 244, *host),
                port: 8080,
                ready: *ready,
                serving: *serving,
                terminating: *terminating,
                is_local: *local,
                zone: None,
                zone_hints: vec![],
                node_hints: vec![],
            });
        }
        eps.sort();
        eps.dedup_by(|a, b| a.ip == b.ip);
    }
    state
}

fn opts() -> NftablesOptions {
    NftablesOptions {
        masquerade_all: false,
        local_detector: LocalDetector::Cidrs(vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:f4::/32".parse().unwrap(),
        ]),
        nodeport_addresses: NodePortAddresses::Ips(vec![addr(false, 77, 1), addr(true, 77, 1)]),
        masquerade_mark: 0x4000,
    }
}

fn kernel_tables(kernel: &mut FakeKernel) -> Vec<Option<TableSnapshot>> {
    [Family::Ipv4, Family::Ipv6]
        .iter()
        .map(|f| kernel.dump(*f, TABLE).unwrap())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any sequence of cluster states: every sync is accepted by the (fake) kernel,
    /// leaves it holding exactly the desired tables, and repeating it sends nothing.
    #[test]
    fn syncs_converge_and_repeat_as_noops(
        states in prop::collection::vec(prop::collection::vec(svc_seed(), 0..6), 1..5)
    ) {
        let mut syncer = Syncer::new(FakeKernel::default());
        for seeds in &states {
            let desired = desired_tables(&state_of(seeds), &opts());
            syncer.sync(&desired).unwrap();
            let dumped = kernel_tables(&mut syncer.dataplane);
            for (t, d) in desired.iter().zip(dumped) {
                prop_assert_eq!(Some(TableSnapshot::from_spec(t)), d);
            }
            prop_assert!(syncer.plan(&desired).unwrap().is_empty());
            // A restarted proxy (no committed state) reads the kernel and agrees.
            let mut restarted = Syncer::new(syncer.dataplane.clone());
            prop_assert!(restarted.plan(&desired).unwrap().is_empty());
        }
    }
}

/// The services an operation touches, by the comments of its elements
/// (`ns/svcN:port`); shared hairpin elements carry none.
fn service_of(op: &Op) -> Vec<String> {
    let mut names = Vec::new();
    match op {
        Op::AddElements { elements, set, .. } | Op::DeleteElements { elements, set, .. } => {
            for e in elements {
                let comment = e.comment.clone().unwrap_or_default();
                for svc in ["svc1", "svc2", "svc3"] {
                    if comment.starts_with(&format!("ns/{svc}"))
                        && !names.contains(&svc.to_string())
                    {
                        names.push(svc.to_string());
                    }
                }
                if set == "hairpin" && !names.contains(&"hairpin".to_string()) {
                    names.push("hairpin".into());
                }
            }
        }
        other => names.push(format!("not an element operation: {other}")),
    }
    names
}

#[test]
fn changing_one_endpoint_touches_only_that_services_elements() {
    let seed = |id, hosts: &[u8]| SvcSeed {
        id,
        v6: false,
        protocol: 0,
        node_port: true,
        external_ip: false,
        lb: false,
        source_range: false,
        etp_local: false,
        itp_local: false,
        affinity: false,
        endpoints: hosts
            .iter()
            .map(|h| (*h, true, true, true, false))
            .collect(),
    };
    let before = vec![seed(1, &[1, 2]), seed(2, &[3, 4]), seed(3, &[5, 7])];
    let after = vec![seed(1, &[1, 2]), seed(2, &[3, 6]), seed(3, &[5, 7])];
    let removed = vec![seed(1, &[1, 2]), seed(2, &[3, 6])];
    // Both paths: the read-back diff (plan) and the renderer's delta.
    let mut syncer = Syncer::new(FakeKernel::default());
    let mut renderer = NftablesRenderer::default();
    let (deltas, _) = renderer.update(&state_of(&before), &opts());
    syncer
        .sync_incremental(&deltas, || renderer.tables())
        .unwrap();
    for (next, who) in [(&after, "svc2"), (&removed, "svc3")] {
        let planned = syncer
            .plan(&desired_tables(&state_of(next), &opts()))
            .unwrap();
        let (deltas, stats) = renderer.update(&state_of(next), &opts());
        assert_eq!(stats.rendered, 1);
        let delta: Vec<Op> = deltas.iter().flat_map(delta_ops).collect();
        for ops in [&planned, &delta] {
            assert!(!ops.is_empty());
            for op in ops.iter() {
                for touched in service_of(op) {
                    assert!(touched == who || touched == "hairpin", "{op}");
                }
            }
        }
        let outcome = syncer
            .sync_incremental(&deltas, || renderer.tables())
            .unwrap();
        assert!(!outcome.full);
        assert_eq!(outcome.ops, op_counts(&delta));
        let dumped = kernel_tables(&mut syncer.dataplane);
        for (t, d) in desired_tables(&state_of(next), &opts()).iter().zip(dumped) {
            assert_eq!(Some(TableSnapshot::from_spec(t)), d);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any sequence of cluster states through the renderer's deltas: the (fake)
    /// kernel accepts every one and ends holding exactly a fresh build's tables;
    /// an update with nothing changed sends nothing.
    #[test]
    fn incremental_syncs_equal_fresh_builds(
        states in prop::collection::vec(prop::collection::vec(svc_seed(), 0..6), 1..6)
    ) {
        let mut syncer = Syncer::new(FakeKernel::default());
        let mut renderer = NftablesRenderer::default();
        for seeds in &states {
            let state = state_of(seeds);
            let (deltas, _) = renderer.update(&state, &opts());
            syncer.sync_incremental(&deltas, || renderer.tables()).unwrap();
            let dumped = kernel_tables(&mut syncer.dataplane);
            for (t, d) in desired_tables(&state, &opts()).iter().zip(dumped) {
                prop_assert_eq!(Some(TableSnapshot::from_spec(t)), d);
            }
            let (deltas, stats) = renderer.update(&state, &opts());
            prop_assert_eq!(stats.rendered, 0);
            prop_assert!(deltas.iter().all(TableDelta::is_empty));
            let outcome = syncer.sync_incremental(&deltas, || renderer.tables()).unwrap();
            prop_assert!(outcome.ops.is_empty());
        }
    }
}

#[test]
fn fake_kernel_rejects_like_the_kernel_and_keeps_nothing() {
    let mut syncer = Syncer::new(FakeKernel::default());
    let desired = desired_tables(&state_of(&[]), &opts());
    syncer.sync(&desired).unwrap();
    let before = kernel_tables(&mut syncer.dataplane);
    let bad = vec![
        Op::AddChain {
            family: Family::Ipv4,
            table: TABLE.into(),
            chain: kube_nlproxy_netlink::nft::Chain {
                name: "x".into(),
                base: None,
                comment: None,
            },
        },
        Op::DeleteChain {
            family: Family::Ipv4,
            table: TABLE.into(),
            name: "services".into(),
        },
    ];
    let err = syncer.dataplane.apply(&bad).unwrap_err();
    let chain = crate::ErrorChain(&err).to_string();
    assert!(chain.contains("busy"), "{chain}");
    assert_eq!(kernel_tables(&mut syncer.dataplane), before);
}

#[test]
fn affinity_entries_of_removed_endpoints_are_deleted_after_the_commit() {
    let seed = |id, affinity, hosts: &[u8]| SvcSeed {
        id,
        v6: false,
        protocol: 0,
        node_port: false,
        external_ip: false,
        lb: false,
        source_range: false,
        etp_local: false,
        itp_local: false,
        affinity,
        endpoints: hosts
            .iter()
            .map(|h| (*h, true, true, true, false))
            .collect(),
    };
    // What a packet's `update @affinity` leaves: client . entry : endpoint . port.
    let entry = |client: u8, id: u8, host: u8| {
        Element::new(vec![
            KeyValue::Addr(addr(false, 1, client)),
            KeyValue::Addr(addr(false, 96, id + 1)),
            KeyValue::Proto(6),
            KeyValue::Port(80),
        ])
        .with_data(vec![
            KeyValue::Addr(addr(false, 244, host)),
            KeyValue::Port(8080),
        ])
    };
    let affinity = SetId::Affinity.definition(Family::Ipv4);
    let before = vec![seed(1, true, &[1, 2]), seed(2, false, &[3])];
    let mut syncer = Syncer::new(FakeKernel::default());
    let mut renderer = NftablesRenderer::default();
    let (deltas, _) = renderer.update(&state_of(&before), &opts());
    syncer.sync_rendered(&renderer, &deltas).unwrap();
    for e in [entry(1, 1, 1), entry(2, 1, 2), entry(3, 2, 3)] {
        syncer
            .dataplane
            .add_by_packet(Family::Ipv4, &affinity.name, e);
    }
    let held = |s: &mut Syncer<FakeKernel>| {
        let mut v = s
            .dataplane
            .dump_set_elements(Family::Ipv4, &affinity)
            .unwrap()
            .unwrap();
        v.sort();
        v
    };

    // Endpoint 1 of svc1 goes: only the entry leading to it goes, in the sync.
    let after = vec![seed(1, true, &[2]), seed(2, false, &[3])];
    let (deltas, _) = renderer.update(&state_of(&after), &opts());
    assert_eq!(deltas[0].affinity_cleanup.len(), 1);
    let outcome = syncer.sync_rendered(&renderer, &deltas).unwrap();
    assert_eq!(outcome.ops.get("delete-affinity"), Some(&1));
    assert_eq!(held(&mut syncer), vec![entry(2, 1, 2), entry(3, 2, 3)]);

    // A restarted proxy (a full sync) also drops entries of entry points that
    // have no affinity at all.
    let mut restarted = Syncer::new(syncer.dataplane.clone());
    let mut renderer = NftablesRenderer::default();
    let (deltas, _) = renderer.update(&state_of(&after), &opts());
    let outcome = restarted.sync_rendered(&renderer, &deltas).unwrap();
    assert!(outcome.full);
    assert_eq!(held(&mut restarted), vec![entry(2, 1, 2)]);

    // svc1 deleted: its entries go.
    let gone = vec![seed(2, false, &[3])];
    let (deltas, _) = renderer.update(&state_of(&gone), &opts());
    restarted.sync_rendered(&renderer, &deltas).unwrap();
    assert!(held(&mut restarted).is_empty());
}

fn port_name(i: usize) -> ServicePortName {
    ServicePortName {
        namespace: "ns".into(),
        name: format!("s{i}").into(),
        port_name: "p".into(),
        protocol: Protocol::Tcp,
    }
}

/// `n` ClusterIP services with two endpoints each, one of them local.
fn two_endpoint_services(n: usize) -> ClusterState {
    let mut state = ClusterState {
        node: NodeInfo {
            name: "node-a".into(),
            ips: vec![addr(false, 77, 1)],
            ..Default::default()
        },
        ..Default::default()
    };
    for i in 0..n {
        let name = port_name(i);
        let cip = Ipv4Addr::new(10, 96, (i >> 8) as u8, i as u8);
        state.services.insert(
            (name.clone(), IpFamily::V4),
            ServicePort::new(name.clone(), IpFamily::V4, Some(IpAddr::V4(cip)), 80),
        );
        let eps = (0..2)
            .map(|j| {
                let n = i * 2 + j;
                let ip = Ipv4Addr::new(10, 128 + (n >> 16) as u8, (n >> 8) as u8, n as u8);
                Endpoint::ready(IpAddr::V4(ip), 8080, j == 0)
            })
            .collect();
        state.endpoints.insert(name, std::sync::Arc::new(eps));
    }
    state
}

/// `kernel` holds what one transaction of `renderer`'s whole tables makes.
fn assert_holds_one_transactions_tables(renderer: &NftablesRenderer, kernel: &mut FakeKernel) {
    let mut one = FakeKernel::default();
    let ops: Vec<Op> = renderer
        .tables()
        .iter()
        .flat_map(|t| diff(None, t))
        .collect();
    one.apply(&ops).unwrap();
    assert_eq!(kernel_tables(&mut one), kernel_tables(kernel));
}

/// Checks a cold start's transactions: objects and node-wide elements only in
/// the first, each Service's elements all in one later one, at most `limit`
/// elements each. Returns the number of Services and of elements.
fn whole_services_in_bounded_transactions(
    transactions: &[Vec<Op>],
    limit: usize,
) -> (usize, usize) {
    let mut seen = BTreeMap::new();
    let mut total = 0;
    for (i, ops) in transactions.iter().enumerate() {
        let mut size = 0;
        for op in ops {
            match op {
                Op::AddElements { elements, .. } => {
                    size += elements.len();
                    for e in elements {
                        let Some(service) = e.comment.as_deref().and_then(service_of_comment)
                        else {
                            assert_eq!(i, 0, "node-wide elements come with the skeleton");
                            continue;
                        };
                        let first = *seen.entry(service.to_string()).or_insert(i);
                        assert_eq!(first, i, "{service} split over two transactions");
                        assert!(i > 0, "service elements after the skeleton");
                    }
                }
                _ => assert_eq!(i, 0, "only the first transaction makes objects: {op}"),
            }
        }
        assert!(size <= limit, "transaction {i}: {size} elements");
        total += size;
    }
    (seen.len(), total)
}

#[test]
fn a_cold_start_goes_in_bounded_transactions_of_whole_services() {
    let state = two_endpoint_services(10_000);
    let mut renderer = NftablesRenderer::default();
    renderer.update(&state, &opts());
    let ops: Vec<Op> = renderer
        .tables()
        .iter()
        .flat_map(|t| diff(None, t))
        .collect();
    let limit = 7_000;
    let batches = cold_start_batches(ops.clone(), limit);
    assert!(batches.len() > 3, "{} batches", batches.len());
    let (services, _) = whole_services_in_bounded_transactions(&batches, limit);
    assert_eq!(services, 10_000);
    // The batches build what the one transaction builds.
    let (mut one, mut many) = (FakeKernel::default(), FakeKernel::default());
    one.apply(&ops).unwrap();
    for batch in &batches {
        many.apply(batch).unwrap();
    }
    assert_eq!(kernel_tables(&mut one), kernel_tables(&mut many));
    // Small syncs stay one transaction.
    let small: Vec<Op> = ops.into_iter().take(40).collect();
    assert_eq!(cold_start_batches(small.clone(), limit), vec![small]);
}

/// A dataplane that keeps every transaction it passes on.
#[derive(Default)]
struct Recording {
    kernel: FakeKernel,
    transactions: Vec<Vec<Op>>,
    /// Whole-table dumps asked for.
    table_dumps: usize,
    /// Sets whose elements were looked up by key.
    lookups: Vec<String>,
}

impl Dataplane for Recording {
    fn dump(&mut self, family: Family, table: &str) -> Result<Option<TableSnapshot>, SyncError> {
        self.table_dumps += 1;
        self.kernel.dump(family, table)
    }
    fn apply(&mut self, ops: &[Op]) -> Result<(), SyncError> {
        self.transactions.push(ops.to_vec());
        self.kernel.apply(ops)
    }
    fn dump_set_elements(
        &mut self,
        family: Family,
        set: &Set,
    ) -> Result<Option<Vec<Element>>, SyncError> {
        self.kernel.dump_set_elements(family, set)
    }
    fn messages_sent(&self) -> u64 {
        self.kernel.messages_sent()
    }
    fn generation(&mut self) -> Result<u32, SyncError> {
        self.kernel.generation()
    }
    fn dump_skeleton(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<TableSnapshot>, SyncError> {
        self.kernel.dump_skeleton(family, table)
    }
    fn find_unheld_element(
        &mut self,
        family: Family,
        set: &Set,
        elements: &[&Element],
    ) -> Result<Option<usize>, SyncError> {
        self.lookups.push(set.name.clone());
        self.kernel.find_unheld_element(family, set, elements)
    }
}

/// A renderer's cold start, built from its parts one transaction at a time:
/// the skeleton alone first, then whole services, each transaction within the
/// limit, and the kernel ends up with exactly the desired tables. A small
/// cold start is one transaction.
#[test]
fn a_rendered_cold_start_sends_whole_services_in_bounded_transactions() {
    let state = two_endpoint_services(10_000);
    let mut renderer = NftablesRenderer::default();
    let (deltas, _) = renderer.update(&state, &opts());
    let total: usize = renderer.rendered().map(|t| t.service_element_count()).sum();
    assert!(total > COLD_START_BATCH_ELEMENTS, "{total} elements");
    let mut syncer = Syncer::new(Recording::default());
    let outcome = syncer.sync_rendered(&renderer, &deltas).unwrap();
    assert!(outcome.full);
    let transactions = &syncer.dataplane.transactions;
    assert!(
        transactions.len() >= 3,
        "{} transactions",
        transactions.len()
    );
    let (services, elements) =
        whole_services_in_bounded_transactions(transactions, COLD_START_BATCH_ELEMENTS);
    assert_eq!(services, 10_000);
    assert!(elements >= total);
    assert_eq!(outcome.ops["add-element"], elements);
    assert_holds_one_transactions_tables(&renderer, &mut syncer.dataplane.kernel);
    assert_eq!(
        syncer.verify_rendered(&renderer).unwrap(),
        Vec::<String>::new()
    );

    // 50 services fit in one transaction.
    let state = two_endpoint_services(50);
    let mut renderer = NftablesRenderer::default();
    let (deltas, _) = renderer.update(&state, &opts());
    let mut syncer = Syncer::new(Recording::default());
    syncer.sync_rendered(&renderer, &deltas).unwrap();
    assert_eq!(syncer.dataplane.transactions.len(), 1);
    assert_holds_one_transactions_tables(&renderer, &mut syncer.dataplane.kernel);
}

#[test]
fn one_endpoint_change_among_10k_sends_a_constant_handful_and_a_noop_nothing() {
    let mut state = two_endpoint_services(10_000);
    let name = port_name;
    let mut syncer = Syncer::new(FakeKernel::default());
    let mut renderer = NftablesRenderer::default();
    let (deltas, _) = renderer.update(&state, &opts());
    assert!(syncer.sync_rendered(&renderer, &deltas).unwrap().full);
    let commits = syncer.dataplane.commits;

    for i in [17, 4242, 9999] {
        std::sync::Arc::make_mut(state.endpoints.get_mut(&name(i)).unwrap())[1].ip =
            IpAddr::V4(Ipv4Addr::new(10, 250, 0, 1));
        let (deltas, stats) = renderer.update_changed(&state, &opts(), &[name(i)]);
        assert_eq!(stats.rendered, 1);
        let outcome = syncer.sync_rendered(&renderer, &deltas).unwrap();
        assert!(!outcome.full);
        // The endpoint element and the endpoint's hairpin element, out and in.
        assert_eq!(
            outcome.ops,
            BTreeMap::from([("add-element", 2), ("delete-element", 2)]),
            "service {i}"
        );
        std::sync::Arc::make_mut(state.endpoints.get_mut(&name(i)).unwrap())[1].ip = IpAddr::V4(
            Ipv4Addr::new(10, 128, ((i * 2 + 1) >> 8) as u8, (i * 2 + 1) as u8),
        );
        renderer.update_changed(&state, &opts(), &[name(i)]);
        syncer.request_full_sync();
        syncer.sync_rendered(&renderer, &[]).unwrap();
    }
    // Nothing changed: nothing rendered, nothing sent, no transaction.
    let commits_before = syncer.dataplane.commits;
    let (deltas, stats) = renderer.update_changed(&state, &opts(), &[]);
    assert_eq!(stats.rendered, 0);
    let outcome = syncer.sync_rendered(&renderer, &deltas).unwrap();
    assert!(outcome.ops.is_empty());
    assert_eq!(syncer.dataplane.commits, commits_before);
    assert!(commits_before > commits);
}

/// `verify_rendered` (no table built) says what `verify` of the built tables
/// says: nothing after a sync, and the same difference when an element of a
/// service is missing, changed, or one is added that no service holds.
#[test]
fn verify_rendered_says_what_verify_of_the_built_tables_says() {
    let state = two_endpoint_services(50);
    let mut renderer = NftablesRenderer::default();
    let mut syncer = Syncer::new(FakeKernel::default());
    let (deltas, _) = renderer.update(&state, &opts());
    syncer
        .sync_incremental(&deltas, || renderer.tables())
        .unwrap();
    assert_eq!(
        syncer.verify_rendered(&renderer).unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        syncer.verify(&renderer.tables()).unwrap(),
        Vec::<String>::new()
    );

    let v4 = renderer.tables().remove(0);
    let (name, set) = v4
        .sets
        .iter()
        .find(|(_, s)| s.elements.len() > 10 && !s.set.data.is_empty())
        .expect("a map with service elements");
    let element = set.elements.iter().next().unwrap().clone();
    let mut changed = element.clone();
    changed.comment = Some("not ours".into());
    // A key no service holds: the same fields, an address nothing uses.
    let mut foreign = element.clone();
    for field in &mut foreign.key {
        if let KeyValue::Addr(IpAddr::V4(_)) = field {
            *field = KeyValue::Addr(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 99)));
        }
    }
    assert_ne!(foreign.key, element.key);
    let tampers: [Vec<Op>; 3] = [
        vec![Op::DeleteElements {
            family: v4.family,
            table: TABLE.into(),
            set: name.clone(),
            elements: vec![Element::new(element.key.clone())],
        }],
        vec![
            Op::DeleteElements {
                family: v4.family,
                table: TABLE.into(),
                set: name.clone(),
                elements: vec![Element::new(element.key.clone())],
            },
            Op::AddElements {
                family: v4.family,
                table: TABLE.into(),
                set: name.clone(),
                elements: vec![changed],
            },
        ],
        vec![Op::AddElements {
            family: v4.family,
            table: TABLE.into(),
            set: name.clone(),
            elements: vec![foreign],
        }],
    ];
    for tamper in tampers {
        let mut kernel = syncer.dataplane().clone();
        kernel.apply(&tamper).unwrap();
        let mut tampered = Syncer::new(kernel);
        let fast = tampered.verify_rendered(&renderer).unwrap();
        assert_eq!(fast.len(), 1, "{tamper:?}: {fast:?}");
        assert_eq!(
            fast,
            tampered.verify(&renderer.tables()).unwrap(),
            "{tamper:?}"
        );
    }
}

/// After our own sync, with the ruleset generation where our last commit left
/// it, a big table is read back without dumping it: small sets element for
/// element, sets past `LOOKUP_FROM` by looking each wanted element up. An
/// element of a big set missing or changed is found (and described from a
/// dump); once the generation moved, the whole table is dumped, so an extra
/// element is found too.
#[test]
fn a_big_table_is_read_back_by_lookup_while_the_generation_is_ours() {
    let state = two_endpoint_services(1500);
    let mut renderer = NftablesRenderer::default();
    let (deltas, _) = renderer.update(&state, &opts());
    let mut syncer = Syncer::new(Recording::default());
    syncer.sync_rendered(&renderer, &deltas).unwrap();
    syncer.dataplane.table_dumps = 0;
    assert_eq!(
        syncer.verify_rendered(&renderer).unwrap(),
        Vec::<String>::new()
    );
    let mut looked_up = syncer.dataplane.lookups.clone();
    looked_up.sort();
    assert_eq!(looked_up, ["endpoints-ips", "hairpin"]);
    assert_eq!(syncer.dataplane.table_dumps, 0);

    let v4 = renderer.tables().remove(0);
    let endpoints = &v4.sets["endpoints-ips"];
    assert!(endpoints.elements.len() > LOOKUP_FROM);
    let element = endpoints.elements.iter().nth(1234).unwrap().clone();
    let mut changed = element.clone();
    changed.data[1] = KeyValue::Port(9999);
    let mut foreign = element.clone();
    foreign.key[0] = KeyValue::Addr(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 99)));
    let delete = Op::DeleteElements {
        family: v4.family,
        table: TABLE.into(),
        set: "endpoints-ips".into(),
        elements: vec![Element::new(element.key.clone())],
    };
    let add = |e: Element| Op::AddElements {
        family: v4.family,
        table: TABLE.into(),
        set: "endpoints-ips".into(),
        elements: vec![e],
    };
    // Our own transactions gone wrong: the generation stays ours.
    for wrong in [vec![delete.clone()], vec![delete, add(changed)]] {
        let mut syncer = Syncer::new(Recording {
            kernel: syncer.dataplane.kernel.clone(),
            ..Default::default()
        });
        syncer.dataplane.kernel.apply(&wrong).unwrap();
        syncer.generation = Some(syncer.dataplane.kernel.generation);
        let found = syncer.verify_rendered(&renderer).unwrap();
        assert!(
            syncer
                .dataplane
                .lookups
                .iter()
                .any(|s| s == "endpoints-ips"),
            "{wrong:?}"
        );
        assert_eq!(found, syncer.verify(&renderer.tables()).unwrap());
        assert_eq!(found.len(), 1, "{wrong:?}: {found:?}");
    }
    // Someone else's commit moved the generation: the table is dumped.
    let mut tampered = Syncer::new(Recording {
        kernel: syncer.dataplane.kernel.clone(),
        ..Default::default()
    });
    tampered.generation = Some(tampered.dataplane.kernel.generation);
    tampered.dataplane.kernel.apply(&[add(foreign)]).unwrap();
    let found = tampered.verify_rendered(&renderer).unwrap();
    assert!(tampered.dataplane.lookups.is_empty());
    assert_eq!(
        found,
        ["ip kube-nlproxy: set endpoints-ips: 0 elements missing, 1 extra"]
    );
}
