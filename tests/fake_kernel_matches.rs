//! The FakeKernel used by unit tests must behave like the kernel: the same sequence
//! of syncs leaves the same dump in both, and both reject the same bad transaction.
//! Runs in a private network namespace entered by one thread (`unshare`), so it
//! touches nothing else on the machine.

use std::net::IpAddr;

use kube_nlproxy::mode::nftables::{
    LocalDetector, NftablesOptions, NodePortAddresses, TABLE, desired_tables,
};
use kube_nlproxy::model::{
    ClusterState, Endpoint, IpFamily, NodeInfo, Protocol, ServicePort, ServicePortName,
    TrafficDistribution, TrafficPolicy,
};
use kube_nlproxy::sync::{Dataplane, FakeKernel, NetlinkDataplane, Syncer};
use kube_nlproxy_netlink::nft::{Chain, Element, Family, KeyType, KeyValue, Op, Set, SetFlags};

fn in_private_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare(CLONE_NEWNET) only changes this thread's network namespace;
        // the thread ends with the test, and the namespace with it.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        f()
    })
    .join()
    .expect("test thread panicked")
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A state with `n` services; service i has endpoints `first..first+count`.
fn state(services: &[(u8, u8, u8, bool)]) -> ClusterState {
    let mut st = ClusterState {
        node: NodeInfo {
            name: "node-a".into(),
            ips: vec![ip("10.77.0.1"), ip("fd77::1")],
            ..Default::default()
        },
        service_cidrs: vec![
            "10.96.0.0/16".parse().unwrap(),
            "fd96::/112".parse().unwrap(),
        ],
        ..Default::default()
    };
    for &(id, first, count, v6) in services {
        let family = if v6 { IpFamily::V6 } else { IpFamily::V4 };
        let name = ServicePortName {
            namespace: "default".into(),
            name: format!("svc-{id}").into(),
            port_name: "http".into(),
            protocol: if id % 2 == 0 {
                Protocol::Tcp
            } else {
                Protocol::Udp
            },
        };
        let cip = if v6 {
            ip(&format!("fd96::{id}"))
        } else {
            ip(&format!("10.96.0.{id}"))
        };
        st.services.insert(
            (name.clone(), family),
            ServicePort {
                name: name.clone(),
                family,
                cluster_ip: Some(cip),
                port: 80,
                node_port: Some(30000 + u16::from(id)),
                external_ips: vec![],
                load_balancer_ips: if v6 {
                    vec![ip(&format!("fd78::{id}"))]
                } else {
                    vec![ip(&format!("10.78.0.{id}"))]
                },
                load_balancer_source_ranges: vec![
                    if v6 { "fd77::/64" } else { "10.77.0.0/24" }
                        .parse()
                        .unwrap(),
                ],
                external_policy: if id % 3 == 0 {
                    TrafficPolicy::Local
                } else {
                    TrafficPolicy::Cluster
                },
                internal_policy: TrafficPolicy::Cluster,
                affinity_timeout_seconds: (id % 2 == 1).then_some(30),
                health_check_node_port: None,
                traffic_distribution: TrafficDistribution::Unset,
                ipvs_scheduler: None,
            },
        );
        st.endpoints.insert(
            name,
            (first..first + count)
                .map(|h| Endpoint {
                    ip: if v6 {
                        ip(&format!("fd44::{h}"))
                    } else {
                        ip(&format!("10.244.1.{h}"))
                    },
                    port: 8080,
                    ready: true,
                    serving: true,
                    terminating: false,
                    is_local: h % 2 == 0,
                    zone: None,
                    zone_hints: vec![],
                    node_hints: vec![],
                })
                .collect::<Vec<_>>()
                .into(),
        );
    }
    st
}

#[test]
fn kernel_and_fake_end_in_the_same_state() {
    in_private_netns(|| {
        let opts = NftablesOptions {
            masquerade_all: false,
            local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
            nodeport_addresses: NodePortAddresses::Ips(vec![ip("10.77.0.1"), ip("fd77::1")]),
            masquerade_mark: 0x4000,
        };
        let steps = [
            state(&[(1, 1, 2, false), (2, 3, 1, false), (3, 1, 1, true)]),
            state(&[
                (1, 1, 3, false),
                (2, 3, 0, false),
                (3, 1, 2, true),
                (4, 5, 2, false),
            ]),
            state(&[(2, 3, 2, false), (4, 5, 2, false), (6, 1, 1, true)]),
            state(&[]),
        ];
        let mut kernel = Syncer::new(NetlinkDataplane::new().unwrap());
        let mut fake = Syncer::new(FakeKernel::default());
        for (i, st) in steps.iter().enumerate() {
            let desired = desired_tables(st, &opts);
            let k_ops = kernel.plan(&desired).unwrap();
            let f_ops = fake.plan(&desired).unwrap();
            assert_eq!(k_ops, f_ops, "step {i}: both plan the same transaction");
            kernel.sync(&desired).unwrap();
            fake.sync(&desired).unwrap();
            assert!(
                kernel.verify(&desired).unwrap().is_empty(),
                "step {i}: kernel differs"
            );
            let mut kd = NetlinkDataplane::new().unwrap();
            let mut fd = fake_dataplane(&fake);
            for family in [Family::Ipv4, Family::Ipv6] {
                assert_eq!(
                    kd.dump(family, TABLE).unwrap(),
                    fd.dump(family, TABLE).unwrap(),
                    "step {i}: {family:?} dumps differ"
                );
            }
            // A restart reads the kernel back and finds nothing to do.
            let mut restarted = Syncer::new(NetlinkDataplane::new().unwrap());
            assert!(restarted.plan(&desired).unwrap().is_empty(), "step {i}");
        }
    });
}

fn fake_dataplane(s: &Syncer<FakeKernel>) -> FakeKernel {
    s.dataplane().clone()
}

#[test]
fn both_reject_a_bad_transaction_and_keep_nothing_of_it() {
    in_private_netns(|| {
        let opts = NftablesOptions {
            masquerade_all: false,
            local_detector: LocalDetector::None,
            nodeport_addresses: NodePortAddresses::All,
            masquerade_mark: 0x4000,
        };
        let desired = desired_tables(&state(&[(1, 1, 2, false)]), &opts);
        let mut kernel = NetlinkDataplane::new().unwrap();
        let mut fake = FakeKernel::default();
        Syncer::new(&mut kernel).sync(&desired).unwrap();
        Syncer::new(&mut fake).sync(&desired).unwrap();
        let before = kernel.dump(Family::Ipv4, TABLE).unwrap();
        // A new chain, then deleting a chain that is still jumped to.
        let bad = [
            Op::AddChain {
                family: Family::Ipv4,
                table: TABLE.into(),
                chain: Chain {
                    name: "new-chain".into(),
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
        let k_err = kernel.apply(&bad).unwrap_err();
        let f_err = fake.apply(&bad).unwrap_err();
        let k_err = kube_nlproxy::ErrorChain(&k_err).to_string();
        let f_err = kube_nlproxy::ErrorChain(&f_err).to_string();
        assert!(k_err.contains("services"), "{k_err}");
        assert!(f_err.contains("services"), "{f_err}");
        assert_eq!(kernel.dump(Family::Ipv4, TABLE).unwrap(), before);
        assert_eq!(fake.dump(Family::Ipv4, TABLE).unwrap(), before);
    });
}

/// Lookups in several big sets go out from two sockets at once; the answers
/// are the ones one socket gives, and the fake's.
#[test]
fn lookups_side_by_side_answer_as_one_socket_and_the_fake_do() {
    in_private_netns(|| {
        let fam = Family::Ipv4;
        let set = |name: &str| Set {
            name: name.into(),
            key: vec![KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService],
            verdict_map: false,
            data: vec![KeyType::Ipv4Addr, KeyType::InetService],
            flags: SetFlags::default(),
            timeout_ms: None,
        };
        let element = |i: u32| Element {
            key: vec![
                KeyValue::Addr(std::net::Ipv4Addr::from(0x0a60_0000 + i).into()),
                KeyValue::Proto(6),
                KeyValue::Port(80),
            ],
            verdict: None,
            data: vec![
                KeyValue::Addr(std::net::Ipv4Addr::from(0x0a01_0000 + i).into()),
                KeyValue::Port(8080),
            ],
            comment: Some(format!("default/svc-{i}:http").into()),
        };
        // Enough elements in all for two sockets (more than 20 000).
        let sizes = [("a", 15_000), ("b", 9_000), ("c", 4_000), ("d", 300)];
        let held: Vec<(Set, Vec<Element>)> = sizes
            .iter()
            .map(|&(name, n)| (set(name), (0..n).map(element).collect()))
            .collect();
        let mut ops = vec![Op::AddTable {
            family: fam,
            name: TABLE.into(),
        }];
        for (set, elements) in &held {
            ops.push(Op::AddSet {
                family: fam,
                table: TABLE.into(),
                set: set.clone(),
            });
            ops.push(Op::AddElements {
                family: fam,
                table: TABLE.into(),
                set: set.name.clone(),
                elements: elements.clone(),
            });
        }
        let mut kernel = NetlinkDataplane::new().unwrap();
        let mut fake = FakeKernel::default();
        kernel.apply(&ops).unwrap();
        fake.apply(&ops).unwrap();

        // "a" holds all asked; "b" lacks one; "c" holds one with other data;
        // "d" one with another comment.
        let absent = element(20_000);
        let mut other_data = held[2].1[3_999].clone();
        other_data.data[1] = KeyValue::Port(9090);
        let mut other_comment = held[3].1[5].clone();
        other_comment.comment = Some("default/other:http".into());
        let mut lookups: Vec<(&Set, Vec<&Element>)> = held
            .iter()
            .map(|(set, elements)| (set, elements.iter().collect()))
            .collect();
        lookups[1].1.insert(8_500, &absent);
        lookups[2].1[3_999] = &other_data;
        lookups[3].1[5] = &other_comment;
        let want = vec![None, Some(8_500), Some(3_999), Some(5)];

        assert_eq!(kernel.find_unheld_elements(fam, &lookups).unwrap(), want);
        assert_eq!(fake.find_unheld_elements(fam, &lookups).unwrap(), want);
        let one_by_one: Vec<Option<usize>> = lookups
            .iter()
            .map(|(set, elements)| kernel.find_unheld_element(fam, set, elements).unwrap())
            .collect();
        assert_eq!(one_by_one, want);
        // Again, on the sockets as they are now (the second one is reused).
        assert_eq!(kernel.find_unheld_elements(fam, &lookups).unwrap(), want);
    });
}
