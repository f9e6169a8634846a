//! `explain`, `status` and `plan` in `--proxy-mode ipvs`, for the VM harness
//! (vm-tests/), whose kernel has IPVS and the dummy driver. Outside the VM
//! (`KNP_VM` unset) the test writes a SKIPPED line to stderr and passes.
//!
//! kube-nlproxy syncs (`--once`) in the node namespace with backends in pod
//! namespaces (tests/common topology); each explain is checked against a real
//! connection: which backend answered, the source address it saw, refused,
//! dropped. Then a real server is deleted behind our back with `ipvsadm -d`:
//! explain (kernel only) shows one backend left, explain `--source` reports the
//! disagreement, status `--source` reports the drift.

mod common;
use common::*;

use std::process::Output;

const WEB: &str = "10.96.0.10";
const EMPTY: &str = "10.96.0.11";
const LOCAL: &str = "10.96.0.12";
const STICKY: &str = "10.96.0.13";
const NODE_PORT: u16 = 30080;
const LOCAL_NODE_PORT: u16 = 30085;

/// Candidates with weight > 0, sorted.
fn serving(v: &serde_json::Value) -> Vec<String> {
    let mut c: Vec<String> = v["candidates"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|c| c["weight"].as_u64() != Some(0))
                .filter_map(|c| c["endpoint"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    c.sort();
    c
}

#[test]
fn ipvs_explain_predicts_what_connections_do() {
    if skip_outside_vm("vm_explain", "ipvs_explain_predicts_what_connections_do") {
        return;
    }
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Remote);
    let client = t.pod("client").clone();
    let (a, b) = (t.pod("a").v4.to_string(), t.pod("b").v4.to_string());
    let ext = t.ext.clone();
    let mut args = default_args();
    args.extend(["--proxy-mode".to_string(), "ipvs".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = Proxy::new(&t, proxy_bin()).with_args(&args);
    let http = [("echo", "TCP", 8080)];
    let mut local = Svc::new(
        "local",
        "NodePort",
        &[LOCAL],
        vec![nport("echo", "TCP", 80, 8080, LOCAL_NODE_PORT)],
    );
    local.etp = "Local".into();
    let mut sticky = Svc::new(
        "sticky",
        "ClusterIP",
        &[STICKY],
        vec![port("echo", "TCP", 80, 8080)],
    );
    sticky.affinity = true;
    p.write(&cluster(&[
        Svc::new(
            "web",
            "NodePort",
            &[WEB],
            vec![nport("echo", "TCP", 80, 8080, NODE_PORT)],
        )
        .yaml(),
        slice("web", "v4", false, &http, &t.eps(&["a", "b"], false)),
        Svc::new(
            "empty",
            "ClusterIP",
            &[EMPTY],
            vec![port("echo", "TCP", 80, 8080)],
        )
        .yaml(),
        local.yaml(),
        slice("local", "v4", false, &http, &t.eps(&["b"], false)),
        sticky.yaml(),
        slice("sticky", "v4", false, &http, &t.eps(&["a", "b"], false)),
    ]));
    p.sync();

    let explain = |target: &str, from: Option<&str>, source: bool| -> Output {
        p.explain_json(target, from, source)
    };
    let both = {
        let mut w = vec![format!("{a}:8080"), format!("{b}:8080")];
        w.sort();
        w
    };
    let client_ip = client.v4.to_string();
    let ext_ip = EXT_V4.to_string();
    let mut c = Checks::default();

    c.run("plan after a sync: no operations", || {
        let out = p.command(&["plan"], &[]);
        assert!(out.status.success(), "{}", output_text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("plan: no operations"),
            "{}",
            output_text(&out)
        );
    });

    c.run("ClusterIP from a pod: both backends, source = pod", || {
        let out = explain(&format!("{WEB}:80/tcp"), Some(&client_ip), false);
        assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
        let v = output_json(&out);
        assert_eq!(v["mode"], "ipvs", "{v}");
        assert_eq!(v["outcome"], "served", "{v}");
        assert_eq!(v["matched_by"], "ClusterIP", "{v}");
        assert_eq!(serving(&v), both, "{v}");
        assert_eq!(v["masquerade"], false, "{v}");
        assert_eq!(v["problems"], serde_json::json!([]), "{v}");
        let (pods, srcs) =
            spread(&client.ns, sa(ip(WEB), 80), 12).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pods.len(), 2, "backends {pods:?}");
        assert_eq!(srcs.into_iter().collect::<Vec<_>>(), vec![ip(&client_ip)]);
    });

    c.run("NodePort from outside: both backends, masqueraded", || {
        let target = format!("{NODE_V4}:{NODE_PORT}/tcp");
        let out = explain(&target, Some(&ext_ip), false);
        assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
        let v = output_json(&out);
        assert_eq!(v["matched_by"], "NodePort", "{v}");
        assert_eq!(serving(&v), both, "{v}");
        assert_eq!(v["masquerade"], true, "{v}");
        let (pods, srcs) =
            spread(&ext, sa(NODE_V4, NODE_PORT), 12).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pods.len(), 2, "backends {pods:?}");
        for s in &srcs {
            assert!(
                Topo::node_addrs(false).contains(s),
                "source {s} not a node address"
            );
        }
    });

    c.run(
        "no endpoints: rejected (exit 3), connection refused",
        || {
            let out = explain(&format!("{EMPTY}:80/tcp"), Some(&client_ip), false);
            assert_eq!(out.status.code(), Some(3), "{}", output_text(&out));
            let v = output_json(&out);
            assert!(
                v["decided_by"].as_str().is_some_and(|d| d.contains(EMPTY)),
                "{v}"
            );
            match tcp(&client.ns, sa(ip(EMPTY), 80), OK_TIMEOUT) {
                Err(ConnErr::Refused) => {}
                other => panic!("expected refused, got {other:?}"),
            }
        },
    );

    c.run(
        "eTP Local without a local endpoint from outside: dropped (exit 4)",
        || {
            let target = format!("{NODE_V4}:{LOCAL_NODE_PORT}/tcp");
            let out = explain(&target, Some(&ext_ip), false);
            assert_eq!(out.status.code(), Some(4), "{}", output_text(&out));
            let v = output_json(&out);
            assert!(
                v["decided_by"]
                    .as_str()
                    .is_some_and(|d| d.contains("external-local-no-endpoints")),
                "{v}"
            );
            match tcp(&ext, sa(NODE_V4, LOCAL_NODE_PORT), DROP_TIMEOUT) {
                Err(ConnErr::Timeout) => {}
                other => panic!("expected a drop (timeout), got {other:?}"),
            }
        },
    );

    c.run("not a service: exit 5", || {
        let out = explain("10.96.5.5:80/tcp", Some(&client_ip), false);
        assert_eq!(out.status.code(), Some(5), "{}", output_text(&out));
        assert_eq!(output_json(&out)["outcome"], "not-a-service");
    });

    c.run("text output, with --source: names, agreement", || {
        let mut extra = vec![format!("{WEB}:80/tcp"), "--from".into(), client_ip.clone()];
        extra.push("--output".into());
        extra.push("text".into());
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let out = p.command(&["explain"], &extra);
        let s = output_text(&out);
        assert_eq!(out.status.code(), Some(0), "{s}");
        assert!(s.contains("default/web:echo (by ClusterIP)"), "{s}");
        assert!(s.contains("(weight 1)"), "{s}");
        assert!(s.contains("kernel and desired state agree"), "{s}");
    });

    c.run(
        "ClientIP affinity: explain names the client's persistence template",
        || {
            let target = format!("{STICKY}:80/tcp");
            let out = explain(&target, Some(&client_ip), false);
            assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
            let a = output_json(&out)["affinity"].to_string();
            assert!(
                a.contains(&format!("no template for {client_ip} yet")),
                "{a}"
            );
            let r = tcp(&client.ns, sa(ip(STICKY), 80), OK_TIMEOUT).expect("sticky answers");
            let backend = if r.pod == "a" { &a } else { &b };
            let out = explain(&target, Some(&client_ip), false);
            let a = output_json(&out)["affinity"].to_string();
            assert!(
                a.contains(&format!(
                    "{client_ip} -> {backend}:8080 (IPVS persistence template"
                )),
                "{a} (the connection reached {})",
                r.pod
            );
            // And the next connections go there too.
            for _ in 0..4 {
                let again =
                    tcp(&client.ns, sa(ip(STICKY), 80), OK_TIMEOUT).expect("sticky answers");
                assert_eq!(again.pod, r.pod, "explain said: {a}");
            }
        },
    );

    c.run("status in ipvs mode", || {
        let out = p.command(&["status"], &["--output", "json"]);
        assert!(out.status.success(), "{}", output_text(&out));
        let v = output_json(&out);
        assert!(v["ipvs"]["virtual_servers"].as_u64() >= Some(3), "{v}");
        assert_eq!(v["drift"], serde_json::json!([]), "{v}");
    });

    // Behind our back: a real server of the ClusterIP deleted.
    let out = nsexec(
        &t.node,
        &[
            "ipvsadm",
            "-d",
            "-t",
            &format!("{WEB}:80"),
            "-r",
            &format!("{b}:8080"),
        ],
    );
    assert!(out.status.success(), "ipvsadm -d: {}", output_text(&out));

    c.run(
        "explain sees the real server gone; --source reports it",
        || {
            let out = explain(&format!("{WEB}:80/tcp"), Some(&client_ip), false);
            assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
            let v = output_json(&out);
            assert_eq!(serving(&v), vec![format!("{a}:8080")], "{v}");
            let (pods, _) =
                spread(&client.ns, sa(ip(WEB), 80), 6).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(pods.into_iter().collect::<Vec<_>>(), vec!["a".to_string()]);
            let out = explain(&format!("{WEB}:80/tcp"), Some(&client_ip), true);
            let v = output_json(&out);
            let d = v["disagreements"].as_array().cloned().unwrap_or_default();
            assert!(
                d.iter()
                    .any(|x| x.as_str().is_some_and(|x| x.starts_with("endpoints:"))),
                "{v}"
            );
            assert!(
                d.iter().any(|x| x
                    .as_str()
                    .is_some_and(|x| x.contains("next sync would send") && x.contains(&b))),
                "{v}"
            );
        },
    );

    c.run(
        "status --source reports the drift; plan would repair it",
        || {
            let out = p.command(&["status"], &[]);
            let s = output_text(&out);
            assert!(out.status.success(), "{s}");
            assert!(s.contains("drift: the kernel differs"), "{s}");
            assert!(s.contains(&format!("{b}:8080")), "{s}");
            let out = p.command(&["plan"], &[]);
            assert!(
                output_text(&out).contains(&format!("{b}:8080")),
                "{}",
                output_text(&out)
            );
        },
    );

    c.finish();
}
