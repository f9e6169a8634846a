//! Least privilege with real packets: the daemon, started as root with every
//! capability, keeps only CAP_NET_ADMIN (effective, permitted and bounding, in
//! every thread), nothing inheritable or ambient, and no_new_privs; it still
//! serves a ClusterIP, follows an endpoint change and answers /healthz. Launched
//! with only the DaemonSet's capabilities (`setpriv`), it does the same.
mod common;
use common::*;
use std::net::SocketAddr;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const WAIT: Duration = Duration::from_secs(10);
const CAP_NET_ADMIN: u64 = 1 << 12;
const CAP_NET_RAW: u64 = 1 << 13;
const CAP_SYS_RESOURCE: u64 = 1 << 24;
const VIP: &str = "10.96.0.40";

/// The capability lines and NoNewPrivs of one `/proc/.../status`.
#[derive(Debug, PartialEq, Eq)]
struct CapStatus {
    inh: u64,
    prm: u64,
    eff: u64,
    bnd: u64,
    amb: u64,
    no_new_privs: u64,
}

fn parse_status(text: &str) -> CapStatus {
    let field = |key: &str, radix: u32| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{key}:")))
            .unwrap_or_else(|| panic!("no {key} in status:\n{text}"));
        u64::from_str_radix(line[key.len() + 1..].trim(), radix).unwrap()
    };
    CapStatus {
        inh: field("CapInh", 16),
        prm: field("CapPrm", 16),
        eff: field("CapEff", 16),
        bnd: field("CapBnd", 16),
        amb: field("CapAmb", 16),
        no_new_privs: field("NoNewPrivs", 10),
    }
}

/// The status of every thread of `pid`.
fn thread_statuses(pid: u32) -> Vec<(String, CapStatus)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let tid = e.unwrap().file_name().to_string_lossy().into_owned();
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) {
            out.push((tid, parse_status(&text)));
        }
    }
    assert!(!out.is_empty());
    out
}

/// This process's bounding set (what a child can be given at most).
fn own_bounding() -> u64 {
    parse_status(&std::fs::read_to_string("/proc/self/status").unwrap()).bnd
}

fn manifests(t: &Topo, backend: &str) -> String {
    web_service(t, VIP, backend)
}

fn http_status(ns: &str, addr: SocketAddr, path: &str) -> Result<u16, String> {
    http_get(ns, addr, path).map(|(code, _)| code)
}

/// Waits until a TCP connection to the VIP from `client` is answered by `want`.
fn answered_by(p: &Proxy, client: &str, want: &str) {
    let vip = sa(ip(VIP), 80);
    let ok = eventually(WAIT, || {
        tcp(client, vip, OK_TIMEOUT).is_ok_and(|r| r.pod == want)
    });
    assert!(
        ok,
        "{VIP}:80 never answered by {want} (last: {:?}); log:\n{}",
        tcp(client, vip, OK_TIMEOUT),
        p.log()
    );
    // Every further connection goes there too: one endpoint.
    for _ in 0..5 {
        assert_eq!(tcp(client, vip, OK_TIMEOUT).unwrap().pod, want);
    }
}

/// Starts the daemon (through `wrapper`) on a ClusterIP with backend `b1`, checks
/// traffic, the capabilities of every thread against `want_bnd` (CapBnd) and
/// CAP_NET_ADMIN (CapEff, CapPrm), then moves the endpoint to `b2` and checks
/// that the dropped-down daemon still programs the kernel and serves /healthz.
fn scenario(wrapper: &[&str], want_bnd: u64) {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("b1", Where::Local);
    t.add_pod("b2", Where::Remote);
    let client = t.pod("client").ns.clone();
    let mut p = Proxy::new(&t, BIN);
    p.write(&manifests(&t, "b1"));
    p.start_wrapped(wrapper);
    answered_by(&p, &client, "b1");

    let pid = p.pid().expect("running");
    let threads = thread_statuses(pid);
    for (tid, st) in &threads {
        assert_eq!(
            st,
            &CapStatus {
                inh: 0,
                prm: CAP_NET_ADMIN,
                eff: CAP_NET_ADMIN,
                bnd: want_bnd,
                amb: 0,
                no_new_privs: 1,
            },
            "thread {tid} of {pid}; log:\n{}",
            p.log()
        );
    }

    // A sync after the drop: the endpoint moves to the other backend.
    let before = p.table();
    p.write(&manifests(&t, "b2"));
    assert!(
        p.wait_table_change(&before, WAIT),
        "no sync after the change; log:\n{}",
        p.log()
    );
    answered_by(&p, &client, "b2");
    // The health server bound its port without CAP_NET_BIND_SERVICE.
    let node = t.node.clone();
    let ok = eventually(WAIT, || {
        http_status(&node, sa(NODE_V4, 10256), "/healthz") == Ok(200)
    });
    assert!(
        ok,
        "/healthz: {:?}",
        http_status(&node, sa(NODE_V4, 10256), "/healthz")
    );
    assert!(p.running(), "the daemon exited; log:\n{}", p.log());
    // Still exactly CAP_NET_ADMIN, in every thread (the runtime's too).
    for (tid, st) in thread_statuses(pid) {
        assert_eq!(
            st.prm | st.eff | st.inh | st.amb,
            CAP_NET_ADMIN,
            "thread {tid}"
        );
    }
    p.stop();
}

#[test]
fn started_with_every_capability_it_keeps_only_net_admin() {
    // As root with every capability: the bounding set shrinks to CAP_NET_ADMIN too.
    assert_ne!(
        own_bounding() & !CAP_NET_ADMIN,
        0,
        "the test must start with more"
    );
    scenario(&[], CAP_NET_ADMIN);
}

#[test]
fn launched_with_only_the_daemonsets_capabilities_it_still_works() {
    // What deploy/kube-nlproxy.yaml adds (NET_ADMIN, NET_RAW, SYS_RESOURCE), as far
    // as this process may hand them on (a sandbox may lack CAP_SYS_RESOURCE). The
    // test namespace has no iptables-legacy table: CAP_NET_RAW is dropped.
    let mut launch = CAP_NET_ADMIN | CAP_NET_RAW;
    let mut names = vec!["+net_admin", "+net_raw"];
    if own_bounding() & CAP_SYS_RESOURCE != 0 {
        launch |= CAP_SYS_RESOURCE;
        names.push("+sys_resource");
    }
    let caps = format!("-all,{}", names.join(","));
    let wrapper = [
        "setpriv",
        "--inh-caps",
        &caps,
        "--ambient-caps",
        &caps,
        "--bounding-set",
        &caps,
        "--",
    ];
    // Without CAP_SETPCAP the daemon cannot shrink the bounding set; it keeps
    // only CAP_NET_ADMIN in every other set.
    scenario(&wrapper, launch);
}
