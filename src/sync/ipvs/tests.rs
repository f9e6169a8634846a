use std::collections::{BTreeMap, BTreeSet};

use kube_nlproxy_netlink::ipset::IpsetMember;
use kube_nlproxy_netlink::ipvs::{IpvsDestination, IpvsProtocol, IpvsService};

use super::*;
use crate::mode::ipvs::tests::{ep, ip, opts, state, svc};
use crate::mode::ipvs::{CLUSTER_IP, IpvsDesired, desired_ipvs};
use crate::model::ServicePort;

fn desired(services: Vec<(ServicePort, Vec<crate::model::Endpoint>)>) -> IpvsDesired {
    desired_ipvs(&state(services), &opts())
}

fn web(eps: &[&str]) -> IpvsDesired {
    let mut s = svc("web", "10.96.0.10");
    s.node_port = Some(30080);
    desired(vec![(s, eps.iter().map(|e| ep(e, false)).collect())])
}

fn synced(d: &IpvsDesired) -> IpvsSyncer<FakeIpvs> {
    let mut s = IpvsSyncer::new(FakeIpvs::default());
    s.sync(d).unwrap();
    s
}

fn vs_dests(f: &FakeIpvs, addr: &str, port: u16) -> BTreeMap<String, (u32, u32)> {
    let k = VsKey {
        family: IpFamily::of(&ip(addr)),
        protocol: Protocol::Tcp,
        addr: ip(addr),
        port,
    };
    f.state.services[&k]
        .dests
        .values()
        .map(|d| (format!("{}:{}", d.addr, d.port), (d.weight, d.active_conns)))
        .collect()
}

#[test]
fn first_sync_creates_everything_then_noop() {
    let d = web(&["10.244.1.5"]);
    let mut s = IpvsSyncer::new(FakeIpvs::default());
    let out = s.sync(&d).unwrap();
    assert!(out.full);
    let f = &s.dataplane().state;
    assert_eq!(f.services.len(), 3);
    assert_eq!(f.dummy, Some(BTreeSet::from([ip("10.96.0.10")])));
    assert_eq!(f.ipsets.len(), 34);
    assert_eq!(
        f.ipsets[CLUSTER_IP].members,
        BTreeSet::from([IpsetMember::IpPort {
            ip: ip("10.96.0.10"),
            proto: 6,
            port: 80
        }])
    );
    assert_eq!(vs_dests(s.dataplane(), "192.168.1.10", 30080).len(), 1);
    // A resync with nothing changed sends nothing and reads nothing.
    let sent = s.dataplane().log.len();
    let out = s.sync(&d).unwrap();
    assert!(out.ops.is_empty() && !out.full);
    assert_eq!(s.dataplane().log.len(), sent);
    assert_eq!(s.dataplane().dumps, 1);
    // A full resync of an unchanged kernel sends nothing either.
    s.request_full_sync();
    let out = s.sync(&d).unwrap();
    assert!(out.full && out.ops.is_empty(), "{out:?}");
}

#[test]
fn endpoint_added_and_scheduler_changed_in_place() {
    let mut s = synced(&web(&["10.244.1.5"]));
    let d = web(&["10.244.1.5", "10.244.2.6"]);
    let out = s.sync(&d).unwrap();
    assert_eq!(out.ops, BTreeMap::from([("add-rs", 3)]));
    let mut web2 = svc("web", "10.96.0.10");
    web2.node_port = Some(30080);
    web2.ipvs_scheduler = Some("lc".into());
    web2.affinity_timeout_seconds = Some(30);
    let d = desired(vec![(
        web2,
        vec![ep("10.244.1.5", false), ep("10.244.2.6", false)],
    )]);
    let out = s.sync(&d).unwrap();
    assert_eq!(out.ops, BTreeMap::from([("update-vs", 3)]));
    let k = d.virtual_servers.keys().next().unwrap();
    let svc = &s.dataplane().state.services[k].service;
    assert_eq!(svc.scheduler, "lc");
    assert_eq!(svc.timeout, 30);
}

#[test]
fn graceful_termination_tcp() {
    let mut s = synced(&web(&["10.244.1.5", "10.244.2.6"]));
    // Open connections on the endpoint that goes away.
    for vs in s.dataplane.state.services.values_mut() {
        for d in vs.dests.values_mut() {
            if d.addr == ip("10.244.2.6") {
                d.active_conns = 2;
                d.inact_conns = 1;
            }
        }
    }
    let d = web(&["10.244.1.5"]);
    let out = s.sync(&d).unwrap();
    assert_eq!(out.ops, BTreeMap::from([("update-rs", 3)]));
    assert!(s.pending_graceful());
    assert_eq!(
        vs_dests(s.dataplane(), "10.96.0.10", 80)["10.244.2.6:8080"],
        (0, 2)
    );
    // Still connections: the re-check reads counters again and sends nothing.
    let dumps = s.dataplane().dumps;
    let out = s.sync(&d).unwrap();
    assert!(out.ops.is_empty());
    assert_eq!(s.dataplane().dumps, dumps + 1);
    assert!(s.pending_graceful());
    // Connections gone: deleted.
    for vs in s.dataplane.state.services.values_mut() {
        for d in vs.dests.values_mut() {
            d.active_conns = 0;
            d.inact_conns = 0;
        }
    }
    let out = s.sync(&d).unwrap();
    assert_eq!(out.ops, BTreeMap::from([("del-rs", 3)]));
    assert!(!s.pending_graceful());
    assert_eq!(vs_dests(s.dataplane(), "10.96.0.10", 80).len(), 1);
    // An endpoint that comes back while draining gets its weight back.
}

#[test]
fn draining_endpoint_coming_back_gets_weight_again() {
    let mut s = synced(&web(&["10.244.1.5", "10.244.2.6"]));
    for vs in s.dataplane.state.services.values_mut() {
        for d in vs.dests.values_mut() {
            d.active_conns = 1;
        }
    }
    s.sync(&web(&["10.244.1.5"])).unwrap();
    let out = s.sync(&web(&["10.244.1.5", "10.244.2.6"])).unwrap();
    assert_eq!(out.ops, BTreeMap::from([("update-rs", 3)]));
    assert!(!s.pending_graceful());
    assert_eq!(
        vs_dests(s.dataplane(), "10.96.0.10", 80)["10.244.2.6:8080"].0,
        1
    );
}

#[test]
fn udp_real_servers_are_deleted_at_once() {
    let mk = |eps: &[&str]| {
        let mut u = svc("dns", "10.96.0.53");
        u.name.protocol = Protocol::Udp;
        desired(vec![(u, eps.iter().map(|e| ep(e, false)).collect())])
    };
    let mut s = synced(&mk(&["10.244.1.5", "10.244.2.6"]));
    for vs in s.dataplane.state.services.values_mut() {
        for d in vs.dests.values_mut() {
            d.active_conns = 5;
        }
    }
    let out = s.sync(&mk(&["10.244.1.5"])).unwrap();
    assert_eq!(out.ops, BTreeMap::from([("del-rs", 1)]));
    assert!(!s.pending_graceful());
}

#[test]
fn removed_service_is_deleted_with_its_address_and_members() {
    let mut s = synced(&web(&["10.244.1.5"]));
    let out = s.sync(&desired(vec![])).unwrap();
    assert_eq!(out.ops["del-vs"], 3);
    assert_eq!(out.ops["del-address"], 1);
    let f = &s.dataplane().state;
    assert!(f.services.is_empty());
    assert!(f.ipsets.values().all(|s| s.members.is_empty()));
    assert_eq!(f.dummy, Some(BTreeSet::new()));
    // Order: VSs go before the records of ownership.
    let kinds: Vec<&str> = s
        .dataplane()
        .log
        .iter()
        .rev()
        .take(6)
        .map(IpvsOp::kind)
        .collect();
    assert_eq!(kinds[0], "del-address");
}

fn foreign() -> (VsKey, CurrentVs) {
    let service = IpvsService::new(IpvsProtocol::Tcp, ip("192.168.1.10"), 8443);
    (
        vs_key(&service).unwrap(),
        CurrentVs {
            service,
            dests: BTreeMap::from([(
                (ip("10.0.0.9"), 443),
                IpvsDestination::new(ip("10.0.0.9"), 443),
            )]),
        },
    )
}

#[test]
fn foreign_virtual_servers_are_untouched() {
    let mut fake = FakeIpvs::default();
    let (k, v) = foreign();
    fake.state.services.insert(k, v.clone());
    // Also a foreign VS on a node IP at a port that is not one of our NodePorts,
    // and one on another address.
    let other = IpvsService::new(IpvsProtocol::Udp, ip("172.16.0.1"), 53);
    fake.state.services.insert(
        vs_key(&other).unwrap(),
        CurrentVs {
            service: other,
            dests: BTreeMap::new(),
        },
    );
    let mut s = IpvsSyncer::new(fake);
    s.sync(&web(&["10.244.1.5"])).unwrap();
    s.sync(&desired(vec![])).unwrap();
    s.cleanup(&BTreeSet::from([ip("192.168.1.10")])).unwrap();
    let f = &s.dataplane().state;
    assert_eq!(f.services.len(), 2);
    assert_eq!(f.services[&k], v);
    assert!(s.dataplane().log.iter().all(|op| match op {
        IpvsOp::DelService(x) | IpvsOp::UpdateService(x) => x.port != 8443 && x.port != 53,
        IpvsOp::AddDest(x, _) | IpvsOp::UpdateDest(x, _) | IpvsOp::DelDest(x, _) =>
            x.port != 8443 && x.port != 53,
        _ => true,
    }));
}

#[test]
fn adoption_of_kube_proxy_state_without_churn() {
    // What kube-proxy's IPVS mode left: the dummy with the VIP, the VSs with
    // their real servers, the ipsets with members — and a stale NodePort VS.
    let d = web(&["10.244.1.5"]);
    let mut fake = FakeIpvs::default();
    for op in diff_ipvs(&IpvsCurrent::default(), &d, &BTreeSet::new()).ops {
        fake.state.apply(&op).unwrap();
    }
    let stale = IpvsService::new(IpvsProtocol::Tcp, ip("192.168.1.10"), 31000);
    fake.state.services.insert(
        vs_key(&stale).unwrap(),
        CurrentVs {
            service: stale.clone(),
            dests: BTreeMap::new(),
        },
    );
    fake.state
        .ipsets
        .get_mut("KUBE-NODE-PORT-TCP")
        .unwrap()
        .members
        .insert(IpsetMember::Port(31000));
    let mut s = IpvsSyncer::new(fake);
    let out = s.sync(&d).unwrap();
    // Only the stale NodePort VS and its member go; nothing is re-added.
    assert_eq!(
        out.ops,
        BTreeMap::from([("del-vs", 1), ("del-member", 1)]),
        "{:?}",
        s.dataplane().log
    );
}

#[test]
fn cleanup_removes_everything_we_own() {
    let mut s = synced(&web(&["10.244.1.5"]));
    let n = s.cleanup(&BTreeSet::new()).unwrap();
    assert!(n > 0);
    let f = &s.dataplane().state;
    assert!(f.services.is_empty());
    assert!(f.dummy.is_none());
    assert!(f.ipsets.is_empty());
}

#[test]
fn fake_refuses_what_the_kernel_refuses() {
    let mut f = FakeIpvs::default();
    assert!(f.apply(&IpvsOp::AddAddress(ip("10.96.0.1"))).is_err());
    let s = IpvsService::new(IpvsProtocol::Tcp, ip("10.96.0.1"), 80);
    assert!(f.apply(&IpvsOp::DelService(s.clone())).is_err());
    f.apply(&IpvsOp::AddService(s.clone())).unwrap();
    assert!(f.apply(&IpvsOp::AddService(s)).is_err());
}

#[test]
fn sysctls() {
    let w = ipvs_sysctls(true);
    let paths: Vec<&str> = w.iter().map(|w| w.path.as_str()).collect();
    assert!(paths.contains(&"/proc/sys/net/ipv4/vs/conntrack"));
    assert!(paths.contains(&"/proc/sys/net/ipv4/conf/all/arp_announce"));
    assert_eq!(ipvs_sysctls(false).len(), 5);
}

#[test]
fn exclude_cidrs_keep_virtual_and_real_servers() {
    // Two services and a real server synced; then the desired state drops a
    // service and a real server, with both in --ipvs-exclude-cidrs.
    let mut a = svc("a", "10.96.0.10");
    a.node_port = None;
    let b = svc("b", "10.97.0.10");
    let before = desired(vec![
        (
            a.clone(),
            vec![ep("10.244.1.5", false), ep("172.16.0.5", false)],
        ),
        (b, vec![ep("10.244.1.6", false)]),
    ]);
    let mut s = synced(&before);
    let mut o = opts();
    o.exclude_cidrs = vec![
        "10.97.0.0/16".parse().unwrap(),
        "172.16.0.0/12".parse().unwrap(),
    ];
    let after = desired_ipvs(&state(vec![(a, vec![ep("10.244.1.5", false)])]), &o);
    s.request_full_sync();
    let out = s.sync(&after).unwrap();
    assert!(!out.ops.contains_key("del-vs"), "{:?}", out.ops);
    assert!(!out.ops.contains_key("del-rs"), "{:?}", out.ops);
    let f = s.dataplane();
    assert_eq!(vs_dests(f, "10.97.0.10", 80).len(), 1, "excluded VS kept");
    assert_eq!(
        vs_dests(f, "10.96.0.10", 80).keys().collect::<Vec<_>>(),
        ["10.244.1.5:8080", "172.16.0.5:8080"],
        "excluded real server kept"
    );
    // Without the exclusion the same sync deletes both.
    let mut s2 = synced(&before);
    let plain = desired_ipvs(
        &state(vec![(
            svc("a", "10.96.0.10"),
            vec![ep("10.244.1.5", false)],
        )]),
        &opts(),
    );
    let out = s2.sync(&plain).unwrap();
    assert!(out.ops.contains_key("del-vs"), "{:?}", out.ops);
    // Cleanup keeps the excluded VS too.
    s.set_exclude_cidrs(o.exclude_cidrs.clone());
    s.cleanup(&BTreeSet::new()).unwrap();
    let left: Vec<IpAddr> = s
        .dataplane()
        .state
        .services
        .keys()
        .map(|k| k.addr)
        .collect();
    assert_eq!(left, [ip("10.97.0.10")]);
}

#[test]
fn timeouts_are_set_and_read_back() {
    let mut s = IpvsSyncer::new(FakeIpvs::default());
    let t = s
        .set_timeouts(&IpvsTimeouts {
            tcp: 0,
            tcp_fin: 5,
            udp: 7,
        })
        .unwrap();
    // 0 leaves the kernel's value.
    assert_eq!(
        t,
        IpvsTimeouts {
            tcp: 900,
            tcp_fin: 5,
            udp: 7
        }
    );
}
