//! `explain` and `plan` against the kernel state the daemon made, in network
//! namespaces, checked with real connections: what explain predicts (the
//! backend set, the source address the backend sees, reject, drop, not a
//! service) is what a connection does; a change made behind our back shows up
//! in explain (kernel alone and against the desired state) and in plan.
mod common;
use common::*;
use std::process::Output;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const VIP: &str = "10.96.0.90";
const EMPTY: &str = "10.96.0.92";
const LOCAL_VIP: &str = "10.96.0.93";
const DRAIN_VIP: &str = "10.96.0.94";
const NODE_PORT: u16 = 30090;
const LOCAL_NODE_PORT: u16 = 30093;

fn candidates(v: &serde_json::Value) -> Vec<String> {
    let mut c: Vec<String> = v["candidates"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["endpoint"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    c.sort();
    c
}

#[test]
fn explain_predicts_what_connections_do() {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Remote);
    let client = t.pod("client").v4.to_string();
    let (a, b) = (t.pod("a").v4.to_string(), t.pod("b").v4.to_string());
    let client_ns = t.pod("client").ns.clone();
    let ext = t.ext.clone();
    let p = Proxy::new(&t, BIN);
    let mut local = Svc::new(
        "local",
        "NodePort",
        &[LOCAL_VIP],
        vec![nport("echo", "TCP", 80, 8080, LOCAL_NODE_PORT)],
    );
    local.etp = "Local".into();
    p.write(&cluster(&[
        Svc::new(
            "web",
            "NodePort",
            &[VIP],
            vec![nport("echo", "TCP", 80, 8080, NODE_PORT)],
        )
        .yaml(),
        slice(
            "web",
            "v4",
            false,
            &[("echo", "TCP", 8080)],
            &t.eps(&["a", "b"], false),
        ),
        Svc::new(
            "empty",
            "ClusterIP",
            &[EMPTY],
            vec![port("echo", "TCP", 80, 8080)],
        )
        .yaml(),
        local.yaml(),
        slice(
            "local",
            "v4",
            false,
            &[("echo", "TCP", 8080)],
            &t.eps(&["b"], false),
        ),
        Svc::new(
            "drain",
            "ClusterIP",
            &[DRAIN_VIP],
            vec![port("echo", "TCP", 80, 8080)],
        )
        .yaml(),
        // Every endpoint terminating: a still serves, b no longer does.
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: drain-v4\n  namespace: default\n  labels:\n    kubernetes.io/service-name: drain\naddressType: IPv4\nports:\n- name: echo\n  protocol: TCP\n  port: 8080\nendpoints:\n- addresses: [{a}]\n  conditions: {{ready: false, serving: true, terminating: true}}\n- addresses: [{b}]\n  conditions: {{ready: false, serving: false, terminating: true}}\n"
        ),
    ]));
    // plan before the first sync: the rules it would add, as nft writes them.
    let out = p.command(&["plan"], &[]);
    let s = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        s.contains("ip daddr . meta l4proto . th dport @no-endpoint-reject-ips reject")
            && s.contains("ip saddr != 10.244.0.0/16 ip daddr @cluster-ips jump")
            && s.contains("meta mark & 0x00004000 == 0x00000000 return")
            && s.contains("dnat ip addr . port to ")
            && s.contains("masquerade fully-random")
            && !s.contains("[ payload")
            && !s.contains("reg "),
        "{s}"
    );
    p.sync();

    // plan after a sync: nothing to send.
    let out = p.command(&["plan"], &[]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("plan: no operations"),
        "{}",
        output_text(&out)
    );

    let explain = |target: &str, from: Option<&str>, source: bool| -> Output {
        p.explain_json(target, from, source)
    };
    let want = {
        let mut w = vec![format!("{a}:8080"), format!("{b}:8080")];
        w.sort();
        w
    };

    // ClusterIP from a pod: served, both endpoints, not masqueraded.
    let out = explain(&format!("{VIP}:80/tcp"), Some(&client), false);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let v = output_json(&out);
    assert_eq!(v["outcome"], "served");
    assert_eq!(v["service"], "default/web:echo");
    assert_eq!(v["matched_by"], "ClusterIP");
    assert_eq!(candidates(&v), want);
    assert_eq!(v["masquerade"], false, "{v}");
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..12 {
        let r = tcp(&client_ns, sa(ip(VIP), 80), OK_TIMEOUT).expect("ClusterIP answers");
        assert_eq!(r.src.to_string(), client, "explain said: not masqueraded");
        seen.insert(r.pod);
    }
    assert_eq!(seen, ["a", "b"].iter().map(|s| s.to_string()).collect());

    // NodePort from outside: served, masqueraded.
    let np = format!("{NODE_V4}:{NODE_PORT}");
    let out = explain(&np, Some(&EXT_V4.to_string()), false);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let v = output_json(&out);
    assert_eq!(v["matched_by"], "NodePort", "{v}");
    assert_eq!(candidates(&v), want);
    assert_eq!(v["masquerade"], true, "{v}");
    let r = tcp(&ext, sa(NODE_V4, NODE_PORT), OK_TIMEOUT).expect("NodePort answers");
    assert_ne!(
        r.src,
        std::net::IpAddr::from(EXT_V4),
        "explain said: masqueraded"
    );

    // No endpoints: rejected (exit 3), and a connection is refused at once.
    let out = explain(&format!("{EMPTY}:80"), Some(&client), false);
    assert_eq!(out.status.code(), Some(3), "{}", output_text(&out));
    assert!(
        output_json(&out)["decided_by"]
            .as_str()
            .unwrap_or("")
            .contains("no-endpoint-reject-ips"),
        "{}",
        output_text(&out)
    );
    assert!(tcp(&client_ns, sa(ip(EMPTY), 80), OK_TIMEOUT).is_err());
    // A ClusterIP port no Service has: rejected too.
    let out = explain(&format!("{VIP}:81"), None, false);
    assert_eq!(out.status.code(), Some(3), "{}", output_text(&out));
    assert!(tcp(&client_ns, sa(ip(VIP), 81), OK_TIMEOUT).is_err());

    // eTP Local without a local endpoint, from outside: dropped (exit 4); the
    // connection times out rather than being refused.
    let out = explain(
        &format!("{NODE_V4}:{LOCAL_NODE_PORT}"),
        Some(&EXT_V4.to_string()),
        false,
    );
    assert_eq!(out.status.code(), Some(4), "{}", output_text(&out));
    let started = std::time::Instant::now();
    assert!(tcp(&ext, sa(NODE_V4, LOCAL_NODE_PORT), Duration::from_secs(2)).is_err());
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "dropped, not refused"
    );

    // An address of the ServiceCIDR that no Service has: dropped (exit 4) by the
    // ServiceCIDR's rule, named; the connection times out.
    let out = explain("10.96.0.222:80", Some(&client), false);
    assert_eq!(out.status.code(), Some(4), "{}", output_text(&out));
    let decided = output_json(&out)["decided_by"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        decided.contains("unallocated address of ServiceCIDR 10.96.0.0/16"),
        "{}",
        output_text(&out)
    );
    let started = std::time::Instant::now();
    assert!(
        tcp(
            &client_ns,
            sa(ip("10.96.0.222"), 80),
            Duration::from_secs(2)
        )
        .is_err()
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "dropped, not refused"
    );

    // Not a service (exit 5).
    let out = explain("10.1.2.3:80/udp", None, false);
    assert_eq!(out.status.code(), Some(5), "{}", output_text(&out));
    // Bad input: a clear error, exit 1 (no panic).
    let out = explain("10.1.2.3", None, false);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("IP:PORT"),
        "{}",
        output_text(&out)
    );

    // Behind our back: one endpoint element deleted by hand.
    sh(&[
        "ip",
        "netns",
        "exec",
        &p.ns,
        "nft",
        &format!("delete element ip kube-nlproxy endpoints-ips {{ {VIP} . tcp . 80 . 1 }}"),
    ]);
    let out = explain(&format!("{VIP}:80"), Some(&client), false);
    // Degraded (exit 6), not served: half the new connections go nowhere.
    assert_eq!(out.status.code(), Some(6), "{}", output_text(&out));
    let v = output_json(&out);
    let problems = v["problems"].to_string();
    assert!(problems.contains("endpoint 1 of 2 is missing"), "{v}");
    let results: Vec<bool> = (0..20)
        .map(|_| tcp(&client_ns, sa(ip(VIP), 80), Duration::from_millis(300)).is_ok())
        .collect();
    assert!(
        results.contains(&true) && results.contains(&false),
        "one of two endpoints missing: some connections must fail, some succeed: {results:?}"
    );
    let out = explain(&format!("{VIP}:80"), Some(&client), true);
    assert_eq!(out.status.code(), Some(6), "{}", output_text(&out));
    let v = output_json(&out);
    let d = v["disagreements"].to_string();
    assert!(d.contains("endpoints: the kernel has"), "{v}");
    assert!(d.contains("the next sync would send"), "{v}");
    // Text output says so too.
    let out = p.command(&["explain"], &[&format!("{VIP}:80"), "--from", &client]);
    let s = output_text(&out);
    assert!(s.contains("kernel differs from the desired state"), "{s}");
    // plan shows the repair, named by its Service port.
    let out = p.command(&["plan"], &[]);
    let s = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        s.contains(&format!(
            "+ element ip endpoints-ips {VIP} . tcp . 80 . 1 : "
        )) && s.contains("# default/web:echo"),
        "{s}"
    );
    assert!(s.contains("plan: 1 operations"), "{s}");
    let out = p.command(&["plan"], &["--output", "json"]);
    assert_eq!(output_json(&out)["summary"]["operations"], 1);
    // A sync repairs it; explain and plan agree again.
    p.sync();
    let out = explain(&format!("{VIP}:80"), Some(&client), true);
    let v = output_json(&out);
    assert_eq!(v["disagreements"], serde_json::json!([]), "{v}");
    assert_eq!(v["problems"], serde_json::json!([]), "{v}");

    // Only terminating endpoints: with the desired state at hand, explain
    // says the serving one takes new connections as a fallback; real
    // connections reach it alone.
    let out = explain(&format!("{DRAIN_VIP}:80"), Some(&client), true);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let v = output_json(&out);
    assert_eq!(candidates(&v), [format!("{a}:8080")], "{v}");
    assert!(
        v["endpoints_from"].as_str().unwrap_or("").contains(
            "the 1 serving, terminating ones take new connections (terminating fallback)"
        ),
        "{v}"
    );
    for _ in 0..8 {
        let r =
            tcp(&client_ns, sa(ip(DRAIN_VIP), 80), OK_TIMEOUT).expect("the serving one answers");
        assert_eq!(
            r.pod, "a",
            "explain said: only the serving, terminating endpoint"
        );
    }
}

/// A daemon (metrics on 127.0.0.1:10249, and `extra` flags) serving
/// `default/web` on VIP:80 by `pods`, once it has synced.
fn daemon_serving_web(t: &Topo, pods: &[&str], extra: &[&str]) -> Proxy {
    let mut p = Proxy::new(t, BIN);
    p.args.extend(
        ["--metrics-bind-address", "127.0.0.1:10249"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string()),
    );
    p.write(&cluster(&[
        Svc::new(
            "web",
            "ClusterIP",
            &[VIP],
            vec![port("echo", "TCP", 80, 8080)],
        )
        .yaml(),
        slice(
            "web",
            "v4",
            false,
            &[("echo", "TCP", 8080)],
            &t.eps(pods, false),
        ),
    ]));
    p.start();
    assert!(
        p.wait_table(Duration::from_secs(10), |s| s.contains(VIP)),
        "the daemon synced"
    );
    p
}

/// `status` from the running daemon (`/status` on its metrics port) and, with
/// no daemon, from the kernel; a rule added behind our back is counted as a
/// drift repair by the daemon and named by the kernel-only status.
#[test]
fn status_from_the_daemon_and_from_the_kernel() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Remote);
    let mut p = daemon_serving_web(&t, &["a", "b"], &[]);
    let status = |p: &Proxy| -> serde_json::Value {
        let out = p.command_bare(
            &["status"],
            &[
                "--metrics-bind-address",
                "127.0.0.1:10249",
                "--output",
                "json",
            ],
        );
        assert!(out.status.success(), "{}", output_text(&out));
        output_json(&out)
    };
    // The daemon answers once its first sync is recorded.
    let mut v = status(&p);
    for _ in 0..50 {
        if v["daemon"]["syncs"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        v = status(&p);
    }
    assert_eq!(v["daemon"]["mode"], "nftables", "{v}");
    assert_eq!(v["daemon"]["node"], "node-a", "{v}");
    assert_eq!(v["daemon"]["last_error"], serde_json::Value::Null, "{v}");
    assert_eq!(v["daemon"]["drift_repairs"], 0, "{v}");
    assert_eq!(v["kernel"][0]["services"], 1, "{v}");
    assert_eq!(v["kernel"][0]["endpoint_elements"], 2, "{v}");
    // The daemon's count and the kernel's are of the same thing.
    assert_eq!(v["daemon"]["service_ports"], 1, "{v}");
    assert_eq!(v["kernel"][0]["service_ports"], 1, "{v}");
    assert_eq!(v["service_ports_agree"], true, "{v}");
    // The local-traffic settings it runs with, for explain.
    assert_eq!(v["daemon"]["local_traffic"]["detector"], "cidrs", "{v}");
    assert_eq!(
        v["daemon"]["local_traffic"]["cidrs"],
        serde_json::json!(["10.244.0.0/16", "fd44::/16"]),
        "{v}"
    );
    let out = p.command_bare(&["status"], &["--metrics-bind-address", "127.0.0.1:10249"]);
    let s = output_text(&out);
    assert!(
        s.contains("service ports: 1 (once per family")
            && s.contains("1 services (1 service ports)")
            && !s.contains("kernel's tables name"),
        "{s}"
    );
    // Behind our back: a rule in our chain. The drift check (every second)
    // finds it and repairs; status counts it.
    sh(&[
        "ip",
        "netns",
        "exec",
        &p.ns,
        "nft",
        "add",
        "rule",
        "ip",
        "kube-nlproxy",
        "services",
        "counter",
    ]);
    let mut repaired = false;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let v = status(&p);
        if v["daemon"]["drift_repairs"].as_u64().unwrap_or(0) >= 1
            && v["kernel"][0]["foreign_rules"] == serde_json::json!([])
        {
            repaired = true;
            break;
        }
    }
    assert!(repaired, "status shows the drift repair: {}", status(&p));
    // No daemon: status reads the kernel, and names a foreign rule.
    p.stop();
    sh(&[
        "ip",
        "netns",
        "exec",
        &p.ns,
        "nft",
        "add",
        "rule",
        "ip",
        "kube-nlproxy",
        "services",
        "counter",
    ]);
    let v = status(&p);
    assert_eq!(v["daemon"], serde_json::Value::Null, "{v}");
    assert_eq!(v["kernel"][0]["services"], 1, "{v}");
    assert!(
        v["kernel"][0]["foreign_rules"]
            .to_string()
            .contains("services"),
        "{v}"
    );
    let out = p.command_bare(&["status"], &["--metrics-bind-address", "127.0.0.1:10249"]);
    let s = output_text(&out);
    assert!(s.contains("no daemon answers"), "{s}");
    assert!(s.contains("changed behind our back"), "{s}");
}

/// `explain` without the daemon's flags typed again: it asks the running
/// daemon (`/status`) which traffic is local and what is masqueraded, and its
/// answer is what a real connection sees.
#[test]
fn explain_answers_as_the_running_daemon() {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("a", Where::Local);
    let client = t.pod("client").v4.to_string();
    let client_ns = t.pod("client").ns.clone();
    let ext = t.ext.clone();
    let p = daemon_serving_web(&t, &["a"], &["-v=2"]);
    // At -v=2 the sync line names the Services it changed.
    let log = p.log();
    assert!(
        log.lines()
            .any(|l| l.contains("sync: changed") && l.contains("default/web")),
        "{log}"
    );
    // Only the metrics address: no --cluster-cidr, no --detect-local-mode.
    let explain = |from: &str, metrics: &str| -> serde_json::Value {
        let mut v = serde_json::Value::Null;
        // The daemon publishes its settings after its first sync.
        for _ in 0..50 {
            let out = p.command_bare(
                &["explain"],
                &[
                    &format!("{VIP}:80"),
                    "--from",
                    from,
                    "--metrics-bind-address",
                    metrics,
                    "--output",
                    "json",
                ],
            );
            assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
            v = output_json(&out);
            if metrics.ends_with(":1")
                || v["masquerade_reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("as the daemon on")
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        v
    };
    // Off-cluster client: masqueraded, as the daemon's ClusterCIDR detection says.
    let v = explain(&EXT_V4.to_string(), "127.0.0.1:10249");
    assert_eq!(v["masquerade"], true, "{v}");
    assert!(
        v["masquerade_reason"]
            .as_str()
            .unwrap_or("")
            .contains("as the daemon on 127.0.0.1:10249 runs them"),
        "{v}"
    );
    let r = tcp(&ext, sa(ip(VIP), 80), OK_TIMEOUT).expect("ClusterIP answers the outside");
    assert_ne!(
        r.src,
        std::net::IpAddr::from(EXT_V4),
        "explain said: masqueraded"
    );
    // A pod: not masqueraded.
    let v = explain(&client, "127.0.0.1:10249");
    assert_eq!(v["masquerade"], false, "{v}");
    let r = tcp(&client_ns, sa(ip(VIP), 80), OK_TIMEOUT).expect("ClusterIP answers a pod");
    assert_eq!(r.src.to_string(), client, "explain said: not masqueraded");
    // Without a daemon to ask and without the flags, explain cannot know the
    // pod CIDRs: its answer differs from what the connection saw.
    let v = explain(&EXT_V4.to_string(), "127.0.0.1:1");
    assert_eq!(v["masquerade"], false, "{v}");
}
