//! The ipvs mode's nftables tables and KUBE-* ipsets against the host kernel (which
//! has nf_tables and ipset but no IPVS and no dummy driver): everything the mode
//! commits besides IPVS services and `kube-ipvs0` must be accepted, read back as
//! intended (`nft list table`, `ipset list` as oracles), and a restart (a new syncer
//! reading the kernel back) must plan nothing.
//!
//! Every test runs in a thread that entered a private network namespace
//! (`unshare(CLONE_NEWNET)`); the `nft`/`ipset` oracles are spawned from that thread
//! and inherit it.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;

use kube_nlproxy::mode::ipvs::{IpvsDesired, IpvsOptions, desired_ipvs};
use kube_nlproxy::mode::nftables::LocalDetector;
use kube_nlproxy::model::{BuildOptions, ClusterState, build};
use kube_nlproxy::source::file::parse_manifests;
use kube_nlproxy::sync::ipvs::{IpvsDataplane, IpvsOp, NetlinkIpvs, diff_ipvs};
use kube_nlproxy::sync::{NetlinkDataplane, Syncer};

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
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn oracle(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses:
  - {type: InternalIP, address: 192.168.1.10}
  - {type: InternalIP, address: "fd00::10"}
"#;

/// A Service + one EndpointSlice per family.
#[allow(clippy::too_many_arguments)]
fn service(
    name: &str,
    kind: &str,
    cips: &[&str],
    proto: &str,
    node_port: Option<u16>,
    extra_spec: &str,
    status: &str,
    eps: &[(&str, &str)],
) -> String {
    let fams: Vec<&str> = cips
        .iter()
        .map(|c| if c.contains(':') { "IPv6" } else { "IPv4" })
        .collect();
    let np = node_port.map_or(String::new(), |p| format!(", nodePort: {p}"));
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  type: {kind}\n  clusterIP: \"{}\"\n  clusterIPs: [{}]\n  ipFamilies: [{}]\n  ipFamilyPolicy: {}\n  ports: [{{name: p, protocol: {proto}, port: 80, targetPort: 8080{np}}}]\n{extra_spec}{status}",
        cips[0],
        cips.iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(", "),
        fams.join(", "),
        if cips.len() > 1 {
            "RequireDualStack"
        } else {
            "SingleStack"
        },
    );
    for fam in ["IPv4", "IPv6"] {
        let mine: Vec<&(&str, &str)> = eps
            .iter()
            .filter(|(a, _)| a.contains(':') == (fam == "IPv6"))
            .collect();
        if mine.is_empty() {
            continue;
        }
        y += &format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-{fam}, namespace: ns, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: {fam}\nports: [{{name: p, protocol: {proto}, port: 8080}}]\nendpoints:\n"
        );
        for (a, node) in mine {
            y += &format!("- addresses: [\"{a}\"]\n  nodeName: {node}\n");
        }
    }
    y
}

/// ClusterIP, NodePort (TCP, UDP, SCTP), ExternalIP, LB + source ranges of several
/// prefix lengths, eTP Local, both families.
fn rich_manifests() -> String {
    let mut m = NODE.to_string();
    let eps = [
        ("10.244.1.5", "node-a"),
        ("10.244.2.6", "node-b"),
        ("fd44:1::5", "node-a"),
        ("fd44:2::6", "node-b"),
    ];
    m += &service(
        "cip",
        "ClusterIP",
        &["10.96.0.10", "fd96::10"],
        "TCP",
        None,
        "  sessionAffinity: ClientIP\n",
        "",
        &eps,
    );
    m += &service(
        "np",
        "NodePort",
        &["10.96.0.11", "fd96::11"],
        "TCP",
        Some(30011),
        "",
        "",
        &eps,
    );
    m += &service(
        "npudp",
        "NodePort",
        &["10.96.0.12", "fd96::12"],
        "UDP",
        Some(30012),
        "  externalTrafficPolicy: Local\n",
        "",
        &eps,
    );
    m += &service(
        "npsctp",
        "NodePort",
        &["10.96.0.13", "fd96::13"],
        "SCTP",
        Some(30013),
        "  externalTrafficPolicy: Local\n",
        "",
        &eps,
    );
    m += &service(
        "ext",
        "ClusterIP",
        &["10.96.0.14", "fd96::14"],
        "TCP",
        None,
        "  externalIPs: [10.78.0.1, \"fd78::1\"]\n  externalTrafficPolicy: Local\n",
        "",
        &eps,
    );
    m += &service(
        "lb",
        "LoadBalancer",
        &["10.96.0.15", "fd96::15"],
        "TCP",
        Some(30015),
        "  loadBalancerSourceRanges: [10.77.0.100/32, 192.0.2.0/24, 172.16.0.0/12, 192.168.1.0/24, \"fd77::100/128\", \"2001:db8::/32\", \"fd00::/64\"]\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32000\n",
        "status:\n  loadBalancer:\n    ingress: [{ip: 10.78.0.100}, {ip: \"fd78::100\"}]\n",
        &eps,
    );
    m += &service(
        "lbopen",
        "LoadBalancer",
        &["10.96.0.16"],
        "UDP",
        Some(30016),
        "",
        "status:\n  loadBalancer:\n    ingress: [{ip: 10.78.0.101}]\n",
        &eps[..2],
    );
    m
}

/// `n` ClusterIP+NodePort services with one LB each (same shape: the rule count
/// must not depend on `n`).
fn many_manifests(n: usize) -> String {
    let mut m = NODE.to_string();
    for i in 0..n {
        let (hi, lo) = (i / 250, i % 250 + 1);
        let cip = format!("10.96.{hi}.{lo}");
        let lb = format!("10.78.{hi}.{lo}");
        let ep = format!("10.244.{}.{}", hi % 2 + 1, lo);
        m += &service(
            &format!("s{i}"),
            "LoadBalancer",
            &[&cip],
            "TCP",
            (i < 2700).then_some(30000 + i as u16),
            "  loadBalancerSourceRanges: [192.0.2.0/24, 10.77.0.100/32]\n",
            &format!("status:\n  loadBalancer:\n    ingress: [{{ip: {lb}}}]\n"),
            &[(&ep, if hi % 2 == 0 { "node-a" } else { "node-b" })],
        );
    }
    m
}

fn state(manifests: &str) -> ClusterState {
    let (objects, warnings) = parse_manifests(manifests, "test");
    assert!(warnings.is_empty(), "{warnings:?}");
    let (state, warnings) = build(
        &objects,
        &BuildOptions {
            node_name: "node-a".into(),
            node_ips_override: vec![],
            primary_node_ip: None,
            ignore_external_ips: false,
        },
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    state
}

fn opts() -> IpvsOptions {
    IpvsOptions {
        scheduler: "rr".into(),
        nodeport_ips: vec![ip("192.168.1.10"), ip("fd00::10")],
        masquerade_all: false,
        local_detector: LocalDetector::Cidrs(vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd44::/16".parse().unwrap(),
        ]),
        masquerade_mark: 0x4000,
        exclude_cidrs: vec![],
    }
}

/// The ipset part of the ipvs sync (what runs without IPVS and the dummy driver):
/// applies the ipset operations of the plan, returns how many were applied.
fn sync_ipsets(d: &IpvsDesired) -> usize {
    let mut dp = NetlinkIpvs::without_ipvs().expect("ipset + rtnetlink sockets");
    let current = dp.dump().expect("dump");
    let plan = diff_ipvs(&current, d, &d.nodeport_ips);
    let mut n = 0;
    for op in plan.ops.iter().filter(|op| is_ipset_op(op)) {
        dp.apply(op).unwrap_or_else(|e| panic!("{op}: {e}"));
        n += 1;
    }
    n
}

fn is_ipset_op(op: &IpvsOp) -> bool {
    matches!(
        op,
        IpvsOp::CreateIpset(_)
            | IpvsOp::DestroyIpset(_)
            | IpvsOp::AddMembers(..)
            | IpvsOp::DelMembers(..)
    )
}

fn ipset_ops_planned(d: &IpvsDesired) -> Vec<String> {
    let mut dp = NetlinkIpvs::without_ipvs().unwrap();
    let current = dp.dump().unwrap();
    diff_ipvs(&current, d, &d.nodeport_ips)
        .ops
        .iter()
        .filter(|op| is_ipset_op(op))
        .map(ToString::to_string)
        .collect()
}

fn commit_tables(d: &IpvsDesired) {
    let mut nft = Syncer::new(NetlinkDataplane::new().expect("nfnetlink socket"));
    let out = nft
        .sync(&d.tables)
        .unwrap_or_else(|e| panic!("the kernel refused the ipvs mode's tables: {e}"));
    assert!(!out.ops.is_empty());
}

fn nft_rule_count(table: &str) -> usize {
    // Rules are the lines of a chain body that are not the chain's `type` or
    // `comment` line.
    let mut n = 0;
    let mut in_chain = false;
    for line in table.lines().map(str::trim) {
        if line.starts_with("chain ") {
            in_chain = true;
            continue;
        }
        if line.starts_with("set ") || line.starts_with("map ") {
            in_chain = false;
            continue;
        }
        // A chain's own comment is a line of its own (a rule's ends its line).
        if in_chain
            && !line.is_empty()
            && line != "}"
            && !line.starts_with("type ")
            && !line.starts_with("comment ")
        {
            n += 1;
        }
    }
    n
}

#[test]
fn ipvs_tables_and_ipsets_accepted_and_restart_plans_nothing() {
    in_private_netns(|| {
        let d = desired_ipvs(&state(&rich_manifests()), &opts());
        assert!(d.conflicts.is_empty(), "{:?}", d.conflicts);
        commit_tables(&d);
        let applied = sync_ipsets(&d);
        assert!(applied > 34, "ipset ops applied: {applied}");

        // nft oracle.
        let v4 = oracle(&["nft", "list", "table", "ip", "kube-nlproxy"]);
        let v6 = oracle(&["nft", "list", "table", "ip6", "kube-nlproxy"]);
        for want in [
            "set KUBE-CLUSTER-IP",
            "set KUBE-LOAD-BALANCER-SOURCE-CIDR-24 {",
            "set KUBE-LOAD-BALANCER-SOURCE-CIDR-12 {",
            "set KUBE-LOAD-BALANCER-SOURCE-CIDR-32 {",
            "@KUBE-LOAD-BALANCER-SOURCE-CIDR-24 return",
            "10.96.0.10 . tcp . 80",
            "10.78.0.100 . tcp . 80 . 192.0.2.0",
            "10.78.0.100 . tcp . 80 . 172.16.0.0",
            "ip saddr & 255.255.255.0",
            "ip saddr & 255.240.0.0",
            "th dport @KUBE-NODE-PORT-TCP",
            "th dport @KUBE-NODE-PORT-LOCAL-UDP",
            "tcp . 30011",
            "tcp . 30015",
            "udp . 30012",
            "fib daddr type local",
            "masquerade fully-random",
        ] {
            assert!(v4.contains(want), "ip table lacks {want:?}:\n{v4}");
        }
        for want in [
            "set KUBE-6-CLUSTER-IP",
            "fd96::10 . tcp . 80",
            "fd78::100 . tcp . 80 . 2001:db8::",
            "ip6 saddr & ffff:ffff:ffff:ffff::",
            "ip6 saddr & ffff:ffff::",
            "th dport @KUBE-6-NODE-PORT-TCP",
        ] {
            assert!(v6.contains(want), "ip6 table lacks {want:?}:\n{v6}");
        }

        // ipset oracle.
        let list = oracle(&["ipset", "list"]);
        for want in [
            "Name: KUBE-CLUSTER-IP",
            "Type: hash:ip,port",
            "10.96.0.10,tcp:80",
            "10.96.0.12,udp:80",
            "10.78.0.100,tcp:80,192.0.2.0/24",
            "10.78.0.100,tcp:80,172.16.0.0/12",
            "Name: KUBE-NODE-PORT-TCP",
            "Type: bitmap:port",
            "Name: KUBE-NODE-PORT-SCTP-HASH",
            "192.168.1.10,sctp:30013",
            "Name: KUBE-6-CLUSTER-IP",
            "fd96::10,tcp:80",
            "fd78::100,tcp:80,2001:db8::/32",
            "Name: KUBE-LOOP-BACK",
            "10.244.1.5,tcp:8080,10.244.1.5",
            "Name: KUBE-HEALTH-CHECK-NODE-PORT",
            "32000",
            "Name: KUBE-IPVS-IPS",
        ] {
            assert!(list.contains(want), "ipset list lacks {want:?}:\n{list}");
        }

        // A restart: new syncers read the kernel back and plan nothing.
        let mut nft = Syncer::new(NetlinkDataplane::new().unwrap());
        let ops = nft.plan(&d.tables).unwrap();
        assert!(ops.is_empty(), "restart plans nft ops: {ops:?}");
        assert!(nft.verify(&d.tables).unwrap().is_empty());
        let ops = ipset_ops_planned(&d);
        assert!(ops.is_empty(), "restart plans ipset ops: {ops:?}");

        // A change (one service gone, a source range changed) is accepted too, and
        // then is a fixed point again.
        let changed = rich_manifests()
            .replace("172.16.0.0/12", "172.16.0.0/16")
            .replace("name: cip,", "name: cip2,");
        let d2 = desired_ipvs(&state(&changed), &opts());
        nft.sync(&d2.tables).expect("change accepted");
        sync_ipsets(&d2);
        let mut fresh = Syncer::new(NetlinkDataplane::new().unwrap());
        assert!(fresh.plan(&d2.tables).unwrap().is_empty());
        assert!(ipset_ops_planned(&d2).is_empty());
        let v4 = oracle(&["nft", "list", "table", "ip", "kube-nlproxy"]);
        assert!(v4.contains("ip saddr & 255.255.0.0"), "{v4}");
        assert!(!v4.contains("ip saddr & 255.240.0.0"), "{v4}");
    });
}

#[test]
fn ipvs_rule_count_independent_of_service_count() {
    in_private_netns(|| {
        let mut counts = Vec::new();
        for n in [10usize, 10_000] {
            let d = desired_ipvs(&state(&many_manifests(n)), &opts());
            assert_eq!(d.virtual_servers.len(), 2 * n + n.min(2700));
            commit_tables(&d);
            let v4 = oracle(&["nft", "list", "table", "ip", "kube-nlproxy"]);
            let v6 = oracle(&["nft", "list", "table", "ip6", "kube-nlproxy"]);
            let kernel = nft_rule_count(&v4) + nft_rule_count(&v6);
            let mut w = std::io::stderr();
            let _ = std::io::Write::write_all(
                &mut w,
                format!(
                    "ipvs mode, {n} services: {} nft rules desired, {kernel} in the kernel\n",
                    d.rule_count()
                )
                .as_bytes(),
            );
            assert_eq!(kernel, d.rule_count(), "{v4}");
            counts.push(kernel);
            let members: BTreeSet<_> = d.ipsets["KUBE-CLUSTER-IP"].members.clone();
            assert_eq!(members.len(), n);
            let t0 = std::time::Instant::now();
            sync_ipsets(&d);
            let t_ipsets = t0.elapsed();
            // A restart at this size plans nothing either (and how long it takes).
            // At 10 000 services the nft read-back takes ~50 s in a debug build
            // (netlink-packet-netfilter 0.4 formats the whole message buffer with
            // `{:?}` for every set element it parses: quadratic), so only on demand.
            if n > 10 && std::env::var_os("KNP_IPVS_HOST_RESTART_10K").is_none() {
                continue;
            }
            let t0 = std::time::Instant::now();
            let mut fresh = Syncer::new(NetlinkDataplane::new().unwrap());
            assert!(fresh.plan(&d.tables).unwrap().is_empty());
            let t_nft = t0.elapsed();
            let t0 = std::time::Instant::now();
            assert!(ipset_ops_planned(&d).is_empty());
            let t_ipset_plan = t0.elapsed();
            let _ = std::io::Write::write_all(
                &mut w,
                format!(
                    "  {n} services: ipsets created in {t_ipsets:?}; restart plan: nft {t_nft:?}, ipsets {t_ipset_plan:?}\n"
                )
                .as_bytes(),
            );
        }
        assert_eq!(
            counts[0], counts[1],
            "rule count depends on the service count"
        );
    });
}
