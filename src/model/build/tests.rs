use super::*;
use crate::source::file::parse_manifests;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn opts() -> BuildOptions {
    BuildOptions {
        node_name: "node-a".into(),
        node_ips_override: vec![],
        primary_node_ip: None,
        ignore_external_ips: false,
    }
}

fn run(yaml: &str) -> (ClusterState, Vec<Warning>) {
    let (objects, w) = parse_manifests(yaml, "test");
    assert!(w.is_empty(), "parse warnings: {w:?}");
    build(&objects, &opts())
}

fn spn(name: &str, port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "ns".into(),
        name: name.into(),
        port_name: port.into(),
        protocol,
    }
}

fn svc(name: &str, extra_meta: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: ns\n{extra_meta}spec:\n{spec}"
    )
}

#[test]
fn ignore_rules() {
    let mut y = String::new();
    y += &svc("headless", "", "  clusterIP: None\n  ports: [{port: 80}]\n");
    y += &svc(
        "extname",
        "",
        "  type: ExternalName\n  externalName: x.example\n  ports: [{port: 80}]\n",
    );
    y += &svc(
        "other-proxy",
        "  labels: {service.kubernetes.io/service-proxy-name: foo}\n",
        "  clusterIP: 10.0.0.2\n  ports: [{port: 80}]\n",
    );
    y += &svc(
        "headless-label",
        "  labels: {service.kubernetes.io/headless: \"\"}\n",
        "  clusterIP: 10.0.0.3\n  ports: [{port: 80}]\n",
    );
    y += &svc("no-ip", "", "  ports: [{port: 80}]\n");
    y += &svc("ok", "", "  clusterIP: 10.0.0.4\n  ports: [{port: 80}]\n");
    let (state, w) = run(&y);
    assert!(w.is_empty(), "{w:?}");
    let names: Vec<_> = state.services.keys().map(|(n, _)| &*n.name).collect();
    assert_eq!(names, ["ok"]);
    let sp = &state.services[&(spn("ok", "", Protocol::Tcp), IpFamily::V4)];
    assert_eq!(sp.cluster_ip, Some(ip("10.0.0.4")));
    assert_eq!(sp.port, 80);
    assert_eq!(sp.node_port, None);
    assert_eq!(sp.external_policy, TrafficPolicy::Cluster);
    assert_eq!(sp.internal_policy, TrafficPolicy::Cluster);
    assert_eq!(sp.affinity_timeout_seconds, None);
    assert_eq!(sp.traffic_distribution, TrafficDistribution::Unset);
}

#[test]
fn bad_cluster_ip_skips_service_with_warning() {
    let y = svc(
        "bad",
        "",
        "  clusterIP: 10.0.0.300\n  clusterIPs: [10.0.0.300]\n  ports: [{port: 80}]\n",
    ) + &svc("good", "", "  clusterIP: 10.0.0.1\n  ports: [{port: 80}]\n");
    let (state, w) = run(&y);
    assert_eq!(state.services.len(), 1);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].object, "Service ns/bad");
    assert_eq!(w[0].field, "spec.clusterIPs[0]");
    assert!(
        w[0].to_string()
            .starts_with("Service ns/bad: spec.clusterIPs[0]: ")
    );
}

#[test]
fn tolerant_parsing_and_bad_entries_dropped() {
    let y = svc(
        "s",
        "",
        r#"  type: LoadBalancer
  clusterIP: 172.30.0.041
  externalIPs: [1.2.3.4, bogus, "001.002.003.005"]
  loadBalancerSourceRanges: [" 10.0.0.0/8", "192.168.1.1/24", "nope/1"]
  ports: [{port: 80, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [{ip: 5.6.7.8}, {ip: "x.y"}, {hostname: lb.example}, {ip: 9.9.9.9, ipMode: Proxy}, {ip: 8.8.8.8, ipMode: VIP}]
"#,
    );
    let (state, w) = run(&y);
    let sp = &state.services[&(spn("s", "", Protocol::Tcp), IpFamily::V4)];
    assert_eq!(sp.cluster_ip, Some(ip("172.30.0.41")));
    assert_eq!(sp.external_ips, [ip("1.2.3.4"), ip("1.2.3.5")]);
    assert_eq!(sp.load_balancer_ips, [ip("5.6.7.8"), ip("8.8.8.8")]);
    assert_eq!(
        sp.load_balancer_source_ranges,
        [
            "10.0.0.0/8".parse::<IpNet>().unwrap(),
            "192.168.1.0/24".parse().unwrap()
        ]
    );
    assert_eq!(sp.node_port, Some(30080));
    let fields: Vec<_> = w.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.externalIPs[1]",
            "status.loadBalancer.ingress[1].ip",
            "spec.loadBalancerSourceRanges[2]"
        ]
    );
}

#[test]
fn dual_stack_split() {
    let y = svc(
        "ds",
        "",
        r#"  type: NodePort
  clusterIP: 10.0.0.1
  clusterIPs: [10.0.0.1, "fd00::1"]
  ipFamilies: [IPv4, IPv6]
  externalIPs: [1.1.1.1, "2001:db8::1"]
  loadBalancerSourceRanges: [10.0.0.0/8, "2001:db8::/32"]
  ports: [{name: http, port: 80, nodePort: 30001}, {name: dns, port: 53, protocol: UDP}]
"#,
    );
    let (state, w) = run(&y);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(state.services.len(), 4);
    let v4 = &state.services[&(spn("ds", "http", Protocol::Tcp), IpFamily::V4)];
    let v6 = &state.services[&(spn("ds", "http", Protocol::Tcp), IpFamily::V6)];
    assert_eq!(v4.cluster_ip, Some(ip("10.0.0.1")));
    assert_eq!(v6.cluster_ip, Some(ip("fd00::1")));
    assert_eq!(v4.external_ips, [ip("1.1.1.1")]);
    assert_eq!(v6.external_ips, [ip("2001:db8::1")]);
    assert_eq!(v4.load_balancer_source_ranges.len(), 1);
    assert_eq!(
        v6.load_balancer_source_ranges,
        ["2001:db8::/32".parse::<IpNet>().unwrap()]
    );
    assert_eq!(v6.node_port, Some(30001));
    let dns = &state.services[&(spn("ds", "dns", Protocol::Udp), IpFamily::V6)];
    assert_eq!(dns.port, 53);
    assert_eq!(dns.node_port, None);
}

#[test]
fn service_options() {
    let y = svc(
        "lb",
        "",
        r#"  type: LoadBalancer
  clusterIP: 10.0.0.1
  externalTrafficPolicy: Local
  internalTrafficPolicy: Local
  healthCheckNodePort: 32000
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  trafficDistribution: PreferClose
  ports: [{port: 80, nodePort: 30080, protocol: SCTP}, {port: 81, protocol: ICMP}]
"#,
    ) + &svc(
        "cip",
        "",
        r#"  clusterIP: 10.0.0.2
  externalTrafficPolicy: Local
  healthCheckNodePort: 32001
  sessionAffinity: ClientIP
  trafficDistribution: PreferSameNode
  ports: [{port: 80, nodePort: 30081}]
"#,
    );
    let (state, w) = run(&y);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].field, "spec.ports[1].protocol");
    let lb = &state.services[&(spn("lb", "", Protocol::Sctp), IpFamily::V4)];
    assert_eq!(lb.external_policy, TrafficPolicy::Local);
    assert_eq!(lb.internal_policy, TrafficPolicy::Local);
    assert_eq!(lb.health_check_node_port, Some(32000));
    assert_eq!(lb.affinity_timeout_seconds, Some(60));
    assert_eq!(lb.traffic_distribution, TrafficDistribution::PreferSameZone);
    assert_eq!(lb.node_port, Some(30080));
    let cip = &state.services[&(spn("cip", "", Protocol::Tcp), IpFamily::V4)];
    // ClusterIP type: no node port, eTP meaningless, no health check port.
    assert_eq!(cip.node_port, None);
    assert_eq!(cip.external_policy, TrafficPolicy::Cluster);
    assert_eq!(cip.health_check_node_port, None);
    assert_eq!(cip.affinity_timeout_seconds, Some(10800));
    assert_eq!(
        cip.traffic_distribution,
        TrafficDistribution::PreferSameNode
    );
}

fn slice(name: &str, svc: &str, family: &str, body: &str) -> String {
    format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: ns\n  labels: {{kubernetes.io/service-name: {svc}}}\naddressType: {family}\n{body}"
    )
}

#[test]
fn endpoints_port_matching_conditions_dedup() {
    let mut y = svc(
        "web",
        "",
        "  clusterIP: 10.0.0.1\n  ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}, {name: other, port: 9}]\n",
    );
    y += &slice(
        "web-1",
        "web",
        "IPv4",
        r#"ports: [{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}, {name: dns, port: 5454, protocol: TCP}, {name: other}]
endpoints:
- addresses: [10.1.0.1]
  nodeName: node-a
  zone: z1
  hints: {forZones: [{name: z1}], forNodes: [{name: node-a}]}
- addresses: [10.1.0.2, 10.1.0.99]
  conditions: {ready: false, serving: true, terminating: true}
  nodeName: node-b
- addresses: [010.1.0.3]
  conditions: {ready: false}
"#,
    );
    // Same ip:port as web-1's first endpoint: first wins (web-1 sorts first).
    y += &slice(
        "web-2",
        "web",
        "IPv4",
        "ports: [{name: http, port: 8080}]\nendpoints:\n- addresses: [10.1.0.1]\n  conditions: {ready: false}\n- addresses: [10.1.0.4]\n",
    );
    y += &slice(
        "web-fqdn",
        "web",
        "FQDN",
        "ports: [{name: http, port: 8080}]\nendpoints:\n- addresses: [foo.example]\n",
    );
    y += "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: orphan, namespace: ns}\naddressType: IPv4\nendpoints: []\n";
    let (state, w) = run(&y);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].object, "EndpointSlice ns/orphan");

    let http = &state.endpoints[&spn("web", "http", Protocol::Tcp)];
    let ips: Vec<_> = http.iter().map(|e| e.ip.to_string()).collect();
    assert_eq!(ips, ["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"]);
    assert!(http.iter().all(|e| e.port == 8080));
    let e1 = &http[0];
    assert!(e1.ready && e1.serving && !e1.terminating && e1.is_local);
    assert_eq!(e1.zone.as_deref(), Some("z1"));
    assert_eq!(e1.zone_hints, ["z1"]);
    assert_eq!(e1.node_hints, ["node-a"]);
    let e2 = &http[1];
    assert!(!e2.ready && e2.serving && e2.terminating && !e2.is_local);
    let e3 = &http[2];
    assert!(!e3.ready && e3.serving && !e3.terminating);
    let dns = &state.endpoints[&spn("web", "dns", Protocol::Udp)];
    assert!(dns.iter().all(|e| e.port == 5353));
    // TCP "dns" has no service port; "other" has no port number.
    assert!(
        !state
            .endpoints
            .contains_key(&spn("web", "dns", Protocol::Tcp))
    );
    assert!(
        !state
            .endpoints
            .contains_key(&spn("web", "other", Protocol::Tcp))
    );
}

#[test]
fn dedup_prefers_local() {
    let mut y = svc("s", "", "  clusterIP: 10.0.0.1\n  ports: [{port: 80}]\n");
    y += &slice(
        "s-1",
        "s",
        "IPv4",
        "ports: [{port: 8080}]\nendpoints:\n- addresses: [10.1.0.1]\n  nodeName: node-b\n",
    );
    y += &slice(
        "s-2",
        "s",
        "IPv4",
        "ports: [{port: 8080}]\nendpoints:\n- addresses: [10.1.0.1]\n  nodeName: node-a\n",
    );
    let (state, _) = run(&y);
    let eps = &state.endpoints[&spn("s", "", Protocol::Tcp)];
    assert_eq!(eps.len(), 1);
    assert!(eps[0].is_local);
}

#[test]
fn node_info_and_service_cidrs() {
    let y = r#"
apiVersion: v1
kind: Node
metadata: {name: node-b}
status: {addresses: [{type: InternalIP, address: 9.9.9.9}]}
---
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/zone: z1}
spec: {podCIDR: 10.244.1.0/24, podCIDRs: [10.244.1.0/24, "fd00:1::/64"]}
status:
  addresses:
  - {type: Hostname, address: node-a}
  - {type: ExternalIP, address: "2001:db8::5"}
  - {type: InternalIP, address: 192.168.0.10}
  - {type: InternalIP, address: 192.168.0.11}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [10.96.0.0/12, "fd00:10::/108"]}
"#;
    let (state, w) = run(y);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(state.node.name, "node-a");
    assert_eq!(state.node.zone.as_deref(), Some("z1"));
    assert_eq!(state.node.ips, [ip("192.168.0.10"), ip("2001:db8::5")]);
    assert_eq!(state.node.pod_cidrs.len(), 2);
    assert_eq!(state.service_cidrs.len(), 2);

    let (objects, _) = parse_manifests(y, "t");
    let o = BuildOptions {
        node_name: "node-a".into(),
        node_ips_override: vec![ip("10.0.0.5")],
        primary_node_ip: None,
        ignore_external_ips: false,
    };
    assert_eq!(build(&objects, &o).0.node.ips, [ip("10.0.0.5")]);
    // --bind-address: the primary IP of its family replaces the Node's one; the
    // other family's address stays.
    let o = BuildOptions {
        node_name: "node-a".into(),
        node_ips_override: vec![],
        primary_node_ip: Some(ip("10.0.0.7")),
        ignore_external_ips: false,
    };
    assert_eq!(
        build(&objects, &o).0.node.ips,
        [ip("10.0.0.7"), ip("2001:db8::5")]
    );
    let o = BuildOptions {
        node_name: "missing".into(),
        node_ips_override: vec![ip("10.0.0.6")],
        primary_node_ip: None,
        ignore_external_ips: false,
    };
    let node = build(&objects, &o).0.node;
    assert_eq!(
        node,
        NodeInfo {
            name: "missing".into(),
            zone: None,
            ips: vec![ip("10.0.0.6")],
            pod_cidrs: vec![]
        }
    );
}

fn fields(w: &[Warning]) -> Vec<(&str, &str)> {
    w.iter()
        .map(|w| (w.object.as_str(), w.field.as_str()))
        .collect()
}

#[test]
fn node_port_out_of_range_keeps_the_cluster_ip() {
    let y = svc(
        "np",
        "",
        "  type: NodePort\n  clusterIP: 10.0.0.1\n  ports: [{name: a, port: 80, nodePort: 99999}, {name: b, port: 81, nodePort: -1}, {name: c, port: 82, nodePort: 30082}, {name: d, port: 83, nodePort: 0}]\n",
    ) + &svc(
        "hc",
        "",
        "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 65536\n  clusterIP: 10.0.0.2\n  ports: [{port: 80, nodePort: 30080}]\n",
    );
    let (state, w) = run(&y);
    assert_eq!(
        fields(&w),
        [
            ("Service ns/np", "spec.ports[0].nodePort"),
            ("Service ns/np", "spec.ports[1].nodePort"),
            ("Service ns/hc", "spec.healthCheckNodePort"),
        ],
        "{w:?}"
    );
    assert!(w[0].message.contains("99999"), "{}", w[0]);
    for (port, number, node_port) in [("a", 80, None), ("b", 81, None), ("c", 82, Some(30082))] {
        let sp = &state.services[&(spn("np", port, Protocol::Tcp), IpFamily::V4)];
        assert_eq!(sp.cluster_ip, Some(ip("10.0.0.1")), "{port}");
        assert_eq!((sp.port, sp.node_port), (number, node_port), "{port}");
    }
    // nodePort 0 is "not allocated", not an error.
    assert_eq!(
        state.services[&(spn("np", "d", Protocol::Tcp), IpFamily::V4)].node_port,
        None
    );
    let hc = &state.services[&(spn("hc", "", Protocol::Tcp), IpFamily::V4)];
    assert_eq!(
        (hc.node_port, hc.health_check_node_port),
        (Some(30080), None)
    );
}

#[test]
fn service_port_out_of_range_skips_only_that_port() {
    let y = svc(
        "p",
        "",
        "  clusterIP: 10.0.0.1\n  ports: [{name: zero, port: 0}, {name: big, port: 65536}, {name: neg, port: -80}, {name: ok, port: 65535}]\n",
    );
    let (state, w) = run(&y);
    assert_eq!(
        fields(&w),
        [
            ("Service ns/p", "spec.ports[0].port"),
            ("Service ns/p", "spec.ports[1].port"),
            ("Service ns/p", "spec.ports[2].port"),
        ]
    );
    assert!(w[1].message.contains("65536"), "{}", w[1]);
    let names: Vec<_> = state.services.keys().map(|(n, _)| &*n.port_name).collect();
    assert_eq!(names, ["ok"]);
}

#[test]
fn duplicate_port_names_keep_the_first() {
    let y = svc(
        "dup",
        "",
        "  clusterIP: 10.0.0.1\n  ports: [{name: http, port: 80}, {name: http, port: 81}, {name: http, port: 82, protocol: UDP}, {name: dns, port: 53}]\n",
    ) + &svc(
        "unnamed",
        "",
        "  clusterIP: 10.0.0.2\n  ports: [{port: 80}, {port: 81}]\n",
    );
    let (state, w) = run(&y);
    assert_eq!(
        fields(&w),
        [
            ("Service ns/dup", "spec.ports[1].name"),
            ("Service ns/dup", "spec.ports[2].name"),
            ("Service ns/unnamed", "spec.ports[1].name"),
        ],
        "{w:?}"
    );
    assert!(w[0].message.contains("spec.ports[0]"), "{}", w[0]);
    assert_eq!(
        state.services[&(spn("dup", "http", Protocol::Tcp), IpFamily::V4)].port,
        80
    );
    assert!(
        !state
            .services
            .contains_key(&(spn("dup", "http", Protocol::Udp), IpFamily::V4))
    );
    assert!(
        state
            .services
            .contains_key(&(spn("dup", "dns", Protocol::Tcp), IpFamily::V4))
    );
    assert_eq!(
        state.services[&(spn("unnamed", "", Protocol::Tcp), IpFamily::V4)].port,
        80
    );
}

#[test]
fn slice_port_out_of_range_is_ignored() {
    let mut y = svc(
        "s",
        "",
        "  clusterIP: 10.0.0.1\n  ports: [{name: a, port: 80}, {name: b, port: 81}]\n",
    );
    y += &slice(
        "s-1",
        "s",
        "IPv4",
        "ports: [{name: a, port: 70000}, {name: b, port: 8081}]\nendpoints:\n- addresses: [10.1.0.1]\n",
    );
    let (state, w) = run(&y);
    assert_eq!(fields(&w), [("EndpointSlice ns/s-1", "ports[0].port")]);
    assert!(w[0].message.contains("70000"), "{}", w[0]);
    assert!(!state.endpoints.contains_key(&spn("s", "a", Protocol::Tcp)));
    assert_eq!(state.endpoints[&spn("s", "b", Protocol::Tcp)][0].port, 8081);
}

#[test]
fn slice_without_service_name_label_is_ignored() {
    let mut y = svc("s", "", "  clusterIP: 10.0.0.1\n  ports: [{port: 80}]\n");
    y += "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s-1, namespace: ns, labels: {app: s}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [10.1.0.1]}]\n";
    y += "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s-2, namespace: ns, labels: {kubernetes.io/service-name: \"\"}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [10.1.0.2]}]\n";
    let (state, w) = run(&y);
    assert_eq!(
        fields(&w),
        [
            (
                "EndpointSlice ns/s-1",
                "metadata.labels[kubernetes.io/service-name]"
            ),
            (
                "EndpointSlice ns/s-2",
                "metadata.labels[kubernetes.io/service-name]"
            ),
        ]
    );
    assert!(state.endpoints.is_empty());
}

#[test]
fn slice_addresses_of_the_wrong_family_or_invalid_are_dropped() {
    let mut y = svc(
        "ds",
        "",
        "  clusterIP: 10.0.0.1\n  clusterIPs: [10.0.0.1, \"fd00::1\"]\n  ports: [{port: 80}]\n",
    );
    y += &slice(
        "ds-v4",
        "ds",
        "IPv4",
        "ports: [{port: 8080}]\nendpoints:\n- addresses: [10.1.0.1]\n- addresses: [\"fd01::2\"]\n- addresses: [not-an-ip]\n- addresses: [10.1.0.4]\n",
    );
    y += &slice(
        "ds-v6",
        "ds",
        "IPv6",
        "ports: [{port: 8080}]\nendpoints:\n- addresses: [\"fd01::1\"]\n- addresses: [10.1.0.9]\n- addresses: [\"::ffff:10.1.0.8\"]\n",
    );
    // The only port is invalid: the bad address is still reported.
    y += &slice(
        "ds-noport",
        "ds",
        "IPv4",
        "ports: [{port: 0}]\nendpoints:\n- addresses: [10.1.0.300]\n",
    );
    y += &slice(
        "ds-odd",
        "ds",
        "IPv5",
        "ports: [{port: 8080}]\nendpoints:\n- addresses: [10.1.0.7]\n",
    );
    let (state, w) = run(&y);
    assert_eq!(
        fields(&w),
        [
            ("EndpointSlice ns/ds-odd", "addressType"),
            ("EndpointSlice ns/ds-noport", "endpoints[0].addresses[0]"),
            ("EndpointSlice ns/ds-noport", "ports[0].port"),
            ("EndpointSlice ns/ds-v4", "endpoints[1].addresses[0]"),
            ("EndpointSlice ns/ds-v4", "endpoints[2].addresses[0]"),
            ("EndpointSlice ns/ds-v6", "endpoints[1].addresses[0]"),
            ("EndpointSlice ns/ds-v6", "endpoints[2].addresses[0]"),
        ],
        "{w:?}"
    );
    assert!(w[3].message.contains("IPv4"), "{}", w[3]);
    let ips: Vec<_> = state.endpoints[&spn("ds", "", Protocol::Tcp)]
        .iter()
        .map(|e| e.ip.to_string())
        .collect();
    assert_eq!(ips, ["10.1.0.1", "10.1.0.4", "fd01::1"]);
}

#[test]
fn ignore_external_ips_builds_services_without_them() {
    let y = svc(
        "ext",
        "",
        r#"  clusterIP: 10.0.0.9
  externalIPs: [1.2.3.4, bogus]
  externalTrafficPolicy: Local
  ports: [{port: 80}]
"#,
    );
    let (objects, _) = parse_manifests(&y, "t");
    let key = (spn("ext", "", Protocol::Tcp), IpFamily::V4);

    let (served, w) = build(&objects, &opts());
    assert_eq!(served.services[&key].external_ips, [ip("1.2.3.4")]);
    // An externalIP makes a ClusterIP service externally reachable: eTP applies.
    assert_eq!(served.services[&key].external_policy, TrafficPolicy::Local);
    assert_eq!(w.len(), 1, "{w:?}");

    let ignoring = BuildOptions {
        ignore_external_ips: true,
        ..opts()
    };
    let (state, w) = build(&objects, &ignoring);
    let sp = &state.services[&key];
    assert!(sp.external_ips.is_empty());
    // As if the field were absent: eTP is meaningless, nothing to warn about.
    assert_eq!(sp.external_policy, TrafficPolicy::Cluster);
    assert!(w.is_empty(), "{w:?}");
    // The rest of the service is unchanged.
    assert_eq!(sp.cluster_ip, Some(ip("10.0.0.9")));
    assert_eq!(
        ServicePort {
            external_ips: vec![],
            external_policy: TrafficPolicy::Cluster,
            ..served.services[&key].clone()
        },
        *sp
    );
}
