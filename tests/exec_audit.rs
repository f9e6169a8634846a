//! The daemon never executes a program: the real binary runs a whole scenario
//! under `strace -f -e trace=execve,execveat` (start on the file source, first
//! sync, an endpoint change, /healthz and /metrics, SIGTERM, then `cleanup`; the
//! same on the kube source; a kubeconfig whose user would run a credential
//! plugin), and the only exec in each trace is the launch of the binary itself.
mod common;
use common::apiserver::FakeApiServer;
use common::*;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const WAIT: Duration = Duration::from_secs(15);
const VIP: &str = "10.96.0.50";

/// One `execve`/`execveat` line of an `strace -f -o FILE` trace.
#[derive(Debug, PartialEq, Eq)]
struct Exec {
    pid: u32,
    path: String,
    line: String,
}

/// The exec calls in `trace` (lines `PID execve("PATH", [...], ...) = R`, also
/// split `<unfinished ...>` / `<... execve resumed>` pairs, counted once).
fn execs(trace: &str) -> Vec<Exec> {
    trace
        .lines()
        .filter_map(|line| {
            let (pid, rest) = line.split_once(' ')?;
            let pid: u32 = pid.trim().parse().ok()?;
            let rest = rest.trim_start();
            let call = ["execve(", "execveat("]
                .into_iter()
                .find(|c| rest.starts_with(c))?;
            let args = &rest[call.len()..];
            // execveat(dirfd, "path", ...): the path is the first quoted string.
            let path = args.split('"').nth(1).unwrap_or("").to_string();
            Some(Exec {
                pid,
                path,
                line: line.to_string(),
            })
        })
        .collect()
}

/// Fails unless the trace holds exactly one exec, of `bin`, that succeeded, and
/// the traced process exited.
fn only_the_launch(trace: &str, bin: &Path) -> Result<(), String> {
    let all = execs(trace);
    let [launch] = &all[..] else {
        return Err(format!("{} exec calls, want 1: {all:#?}", all.len()));
    };
    let want = bin.to_string_lossy();
    if launch.path != want {
        return Err(format!("the exec is of {:?}, not {want:?}", launch.path));
    }
    if !launch.line.trim_end().ends_with("= 0") {
        return Err(format!("the launch failed: {}", launch.line));
    }
    if exit_of(trace, launch.pid).is_none() {
        return Err("the trace does not reach the process's exit".into());
    }
    Ok(())
}

/// `pid`'s exit line in the trace, from "exited with" on. strace pads the pid
/// to five columns (`1059  +++ exited with 0 +++`), so the line is split on
/// whitespace, not matched by prefix.
fn exit_of(trace: &str, pid: u32) -> Option<&str> {
    trace.lines().find_map(|line| {
        let (p, rest) = line.split_once(' ')?;
        let rest = rest.trim_start().strip_prefix("+++ ")?;
        (p.trim().parse::<u32>().ok()? == pid && rest.starts_with("exited with")).then_some(rest)
    })
}

#[test]
fn the_audit_catches_an_exec() {
    let bin = Path::new("/usr/local/bin/kube-nlproxy");
    let ok = "100 execve(\"/usr/local/bin/kube-nlproxy\", [\"kube-nlproxy\", \"run\"], 0x7ffd /* 20 vars */) = 0\n\
              101 --- SIGCHLD ---\n\
              100 +++ exited with 0 +++\n";
    assert_eq!(only_the_launch(ok, bin), Ok(()));
    let forked = format!(
        "{ok}102 execve(\"/usr/sbin/nft\", [\"nft\", \"-f\", \"-\"], 0x55 /* 20 vars */ <unfinished ...>\n"
    );
    assert!(only_the_launch(&forked, bin).is_err());
    let at = format!("{ok}103 execveat(3, \"\", [\"sh\"], 0x1, AT_EMPTY_PATH) = 0\n");
    assert!(only_the_launch(&at, bin).is_err());
    let other = ok.replace("/usr/local/bin/kube-nlproxy\"", "/bin/sh\"");
    assert!(only_the_launch(&other, bin).is_err());
    let no_exit = ok.replace("100 +++ exited with 0 +++\n", "");
    assert!(only_the_launch(&no_exit, bin).is_err());
    // strace pads short pids: the same trace from a fresh machine.
    let padded = ok.replace("100 ", "100  ").replace("101 ", "101  ");
    assert_eq!(only_the_launch(&padded, bin), Ok(()));
    assert_eq!(exit_of(&padded, 100), Some("exited with 0 +++"));
}

fn manifests(t: &Topo, backend: &str) -> String {
    web_service(t, VIP, backend)
}

fn answered_by(p: &Proxy, client: &str, want: &str) {
    let vip = sa(ip(VIP), 80);
    let ok = eventually(WAIT, || {
        tcp(client, vip, OK_TIMEOUT).is_ok_and(|r| r.pod == want)
    });
    assert!(ok, "{VIP}:80 never answered by {want}; log:\n{}", p.log());
}

/// The pid of strace's traced child (the daemon).
fn traced_child(strace_pid: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{strace_pid}/task/{strace_pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// SIGTERM to the daemon that `p` runs under strace (to the daemon itself:
/// strace blocks it when sent to a command it runs), then its trace, which
/// must hold only the launch. Returns the daemon's pid and the trace.
fn sigterm_traced(p: &mut Proxy, trace_file: &Path, what: &str) -> (u32, String) {
    let strace_pid = p.pid().expect("running");
    let daemon = traced_child(strace_pid).expect("strace's child");
    // SAFETY: kill(2) on a pid this test started; no memory is involved.
    assert_eq!(
        unsafe { libc::kill(daemon as libc::pid_t, libc::SIGTERM) },
        0
    );
    assert!(
        eventually(WAIT, || !p.running()),
        "strace did not end after SIGTERM; log:\n{}",
        p.log()
    );
    let trace = std::fs::read_to_string(trace_file).unwrap();
    if let Err(e) = only_the_launch(&trace, Path::new(BIN)) {
        panic!("{what}: {e}\ntrace:\n{trace}\nlog:\n{}", p.log());
    }
    (daemon, trace)
}

fn strace_args(out: &Path) -> Vec<String> {
    [
        "strace",
        "-f",
        "-e",
        "trace=execve,execveat",
        "-o",
        &out.display().to_string(),
        "--",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn the_daemon_and_cleanup_never_exec() {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("b1", Where::Local);
    t.add_pod("b2", Where::Remote);
    let client = t.pod("client").ns.clone();
    let node = t.node.clone();
    let dir = std::env::temp_dir().join(unique("knp-exec-audit"));
    std::fs::create_dir_all(&dir).unwrap();
    let run_trace = dir.join("run.trace");
    let cleanup_trace = dir.join("cleanup.trace");

    let mut p = Proxy::new(&t, BIN);
    p.write(&manifests(&t, "b1"));
    let wrapper = strace_args(&run_trace);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    p.start_wrapped(&wrapper);

    // First sync, then an endpoint change.
    answered_by(&p, &client, "b1");
    let before = p.table();
    p.write(&manifests(&t, "b2"));
    assert!(p.wait_table_change(&before, WAIT), "log:\n{}", p.log());
    answered_by(&p, &client, "b2");
    // The health and metrics servers.
    let health = http_get(&node, sa(NODE_V4, 10256), "/healthz");
    assert!(matches!(health, Ok((200, _))), "/healthz: {health:?}");
    let metrics = http_get(&node, sa(ip("127.0.0.1"), 10249), "/metrics");
    assert!(
        metrics
            .as_ref()
            .is_ok_and(|(code, body)| *code == 200 && body.contains("kubeproxy_sync_proxy_rules")),
        "/metrics: {metrics:?}"
    );

    let (daemon, trace) = sigterm_traced(&mut p, &run_trace, "run");
    assert_eq!(
        exit_of(&trace, daemon),
        Some("exited with 0 +++"),
        "the daemon did not exit 0 on SIGTERM:\n{trace}\nlog:\n{}",
        p.log()
    );

    // `kube-nlproxy cleanup`, traced the same way.
    let out = Command::new("ip")
        .args(["netns", "exec", &node])
        .args(strace_args(&cleanup_trace))
        .args([BIN, "cleanup"])
        .output()
        .expect("spawn cleanup");
    assert!(
        out.status.success(),
        "cleanup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(p.table(), None, "cleanup left our table");
    let trace = std::fs::read_to_string(&cleanup_trace).unwrap();
    if let Err(e) = only_the_launch(&trace, Path::new(BIN)) {
        panic!("cleanup: {e}\ntrace:\n{trace}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `web` (VIP:80 -> 8080) served by `backend`, as API objects.
fn web_objects(t: &Topo, backend: &str) -> [serde_json::Value; 2] {
    let addr = t.pod(backend).v4.to_string();
    [
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "ClusterIP", "clusterIP": VIP, "clusterIPs": [VIP],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
        }),
        serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [addr], "conditions": {"ready": true}}]
        }),
    ]
}

#[test]
fn the_kube_source_never_execs_and_a_kubeconfig_that_would_is_refused() {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("b1", Where::Local);
    t.add_pod("b2", Where::Remote);
    let client = t.pod("client").ns.clone();
    let node = t.node.clone();
    let dir = std::env::temp_dir().join(unique("knp-exec-audit-kube"));
    std::fs::create_dir_all(&dir).unwrap();
    let api = FakeApiServer::start_in_netns(&node);
    for o in web_objects(&t, "b1") {
        api.create(o);
    }
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);

    // The kube source: list, watch, an endpoint change, SIGTERM.
    let run_trace = dir.join("run.trace");
    let mut p = Proxy::new(&t, BIN).with_kube_source(&kubeconfig);
    let wrapper = strace_args(&run_trace);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    p.start_wrapped(&wrapper);
    answered_by(&p, &client, "b1");
    let [_, moved] = web_objects(&t, "b2");
    api.update(moved);
    answered_by(&p, &client, "b2");
    sigterm_traced(&mut p, &run_trace, "kube source");

    // A kubeconfig whose user gets credentials from a program: refused at
    // start with the reason, and the program never runs.
    let marker = dir.join("plugin-ran");
    let refused = dir.join("exec.kubeconfig");
    std::fs::write(
        &refused,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n\
             users:\n- name: plugin\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n\
             \x20     command: /usr/bin/touch\n      args: [{}]\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: plugin\ncurrent-context: c\n",
            api.url(),
            marker.display()
        ),
    )
    .unwrap();
    let exec_trace = dir.join("exec.trace");
    let out = Command::new("ip")
        .args(["netns", "exec", &node])
        .args(strace_args(&exec_trace))
        .arg(BIN)
        .args(["run", "--source", "kube", "--kubeconfig"])
        .arg(&refused)
        .args(["--hostname-override", NODE, "--once"])
        .output()
        .expect("spawn kube-nlproxy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("user \"plugin\" gets its credentials by running a program")
            && stderr.contains("exec: /usr/bin/touch")
            && stderr.contains("kube-nlproxy runs no program"),
        "{stderr}"
    );
    assert!(!marker.exists(), "the credential plugin ran");
    let trace = std::fs::read_to_string(&exec_trace).unwrap();
    if let Err(e) = only_the_launch(&trace, Path::new(BIN)) {
        panic!("exec kubeconfig: {e}\ntrace:\n{trace}\n{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
