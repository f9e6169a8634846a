use super::*;
use crate::source::file::parse_manifests;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn opts() -> BuildOptions {
    BuildOptions {
        node_name: "node-a".into(),
        node_ips_override: vec![],
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
    let names: Vec<_> = state
        .services
        .keys()
        .map(|(n, _)| n.name.as_str())
        .collect();
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
    };
    assert_eq!(build(&objects, &o).0.node.ips, [ip("10.0.0.5")]);
    let o = BuildOptions {
        node_name: "missing".into(),
        node_ips_override: vec![ip("10.0.0.6")],
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
