//! ipvs mode under drift and `kill -9`, in the VM (the host has no IPVS): while
//! the daemon runs, something else deletes a virtual server, a real server, a
//! VIP address and an ipset member; each comes back within the sync period and
//! traffic flows again, while a virtual server and an ipset that are not ours
//! are never touched. Then the daemon is killed with SIGKILL under traffic and
//! started again: the connection and the UDP flow keep going, nothing is re-sent.
//! Outside the VM (`KNP_VM` unset) the tests say SKIPPED and pass.
mod common;
use common::*;

use std::time::Duration;

const VIP: &str = "10.96.0.60";
const DNS: &str = "10.96.0.61";
const SYNC_PERIOD: Duration = Duration::from_secs(3);

fn skip(test: &str) -> bool {
    skip_outside_vm("vm_ipvs_resilience", test)
}

fn node(t: &Topo, cmd: &str) -> String {
    let out = nsexec(&t.node, &["sh", "-c", cmd]);
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn proxy(t: &Topo) -> Proxy {
    let mut args = default_args();
    args.extend(["--proxy-mode", "ipvs", "--sync-period", "3s"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = Proxy::new(t, proxy_bin()).with_args(&args);
    p.write(&cluster(&[
        Svc::new(
            "web",
            "ClusterIP",
            &[VIP],
            vec![port("http", "TCP", 80, 8080)],
        )
        .yaml(),
        slice(
            "web",
            "v4",
            false,
            &[("http", "TCP", 8080)],
            &t.eps(&["web"], false),
        ),
        Svc::new(
            "echo",
            "ClusterIP",
            &["10.96.0.62"],
            vec![port("echo", "TCP", 90, ECHO_PORT)],
        )
        .yaml(),
        slice(
            "echo",
            "v4",
            false,
            &[("echo", "TCP", ECHO_PORT)],
            &t.eps(&["web"], false),
        ),
        Svc::new(
            "dns",
            "ClusterIP",
            &[DNS],
            vec![port("dns", "UDP", 53, 8080)],
        )
        .yaml(),
        slice(
            "dns",
            "v4",
            false,
            &[("dns", "UDP", 8080)],
            &t.eps(&["web"], false),
        ),
    ]));
    p
}

#[test]
fn ipvs_drift_is_repaired_and_foreign_objects_stay() {
    if skip("ipvs_drift_is_repaired_and_foreign_objects_stay") {
        return;
    }
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("web", Where::Local);
    let client = t.pod("client").ns.clone();
    let web = t.pod("web").v4.to_string();
    let mut p = proxy(&t);
    p.start();
    let served = || tcp(&client, sa(ip(VIP), 80), OK_TIMEOUT).is_ok_and(|r| r.pod == "web");
    assert!(
        eventually(Duration::from_secs(20), served),
        "log:\n{}",
        p.log()
    );
    // Not ours: a VS on the node address, a set of another name.
    node(&t, "ipvsadm -A -t 10.77.0.1:8443 -s rr");
    node(&t, "ipset create FOREIGN-SET hash:ip");
    let repaired = || eventually(SYNC_PERIOD * 4, served);

    let mut c = Checks::default();
    c.run("a virtual server deleted: back", || {
        node(&t, &format!("ipvsadm -D -t {VIP}:80"));
        assert!(repaired(), "log:\n{}", p.log());
    });
    c.run("a real server deleted: back", || {
        node(&t, &format!("ipvsadm -d -t {VIP}:80 -r {web}:8080"));
        assert!(repaired(), "log:\n{}", p.log());
        assert!(node(&t, &format!("ipvsadm -Ln -t {VIP}:80")).contains(&format!("{web}:8080")));
    });
    c.run("a VIP address deleted from kube-ipvs0: back", || {
        node(&t, &format!("ip addr del {VIP}/32 dev kube-ipvs0"));
        assert!(
            eventually(SYNC_PERIOD * 4, || node(
                &t,
                "ip -o addr show dev kube-ipvs0"
            )
            .contains(&format!("{VIP}/32"))),
            "log:\n{}",
            p.log()
        );
        assert!(repaired());
    });
    c.run("an ipset member deleted: back", || {
        node(&t, &format!("ipset del KUBE-CLUSTER-IP {VIP},tcp:80"));
        assert!(
            eventually(SYNC_PERIOD * 4, || nsexec(
                &t.node,
                &["ipset", "test", "KUBE-CLUSTER-IP", &format!("{VIP},tcp:80")]
            )
            .status
            .success()),
            "log:\n{}",
            p.log()
        );
    });
    c.run("the foreign VS and ipset are untouched", || {
        assert!(node(&t, "ipvsadm -Ln").contains("10.77.0.1:8443"));
        assert!(node(&t, "ipset list -n").contains("FOREIGN-SET"));
    });
    p.stop();
    c.run("cleanup leaves them too", || {
        assert!(p.cleanup().status.success());
        assert!(node(&t, "ipvsadm -Ln").contains("10.77.0.1:8443"));
        assert!(node(&t, "ipset list -n").contains("FOREIGN-SET"));
    });
    c.finish();
}

#[test]
fn ipvs_kill_9_and_restart_keeps_connections_and_resends_nothing() {
    if skip("ipvs_kill_9_and_restart_keeps_connections_and_resends_nothing") {
        return;
    }
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("web", Where::Local);
    let client = t.pod("client").ns.clone();
    let mut p = proxy(&t);
    p.start();
    let echo = sa(ip("10.96.0.62"), 90);
    assert!(
        eventually(Duration::from_secs(20), || {
            tcp_stream(&client, echo, OK_TIMEOUT).is_ok_and(|mut s| read_line(&mut s).is_ok())
        }),
        "log:\n{}",
        p.log()
    );
    // IPVS is programmed before the nft table of the same sync: traffic can
    // flow before the sync is complete. Kill only a daemon whose sync is done.
    assert!(
        eventually(Duration::from_secs(30), || p
            .log()
            .contains("sync: committed")),
        "log:\n{}",
        p.log()
    );
    let mut stream = tcp_stream(&client, echo, OK_TIMEOUT).expect("connect");
    read_line(&mut stream).expect("greeting");
    const SRC_PORT: u16 = 40061;
    udp(&client, sa(ip(DNS), 53), Some(SRC_PORT), OK_TIMEOUT).expect("udp");
    let before = node(&t, "ipvsadm -Sn");

    let mut c = Checks::default();
    p.kill9();
    c.run(
        "with the daemon dead, the connection and the flow go on",
        || {
            assert_eq!(echo_roundtrip(&mut stream, "dead").unwrap(), "dead");
            udp(&client, sa(ip(DNS), 53), Some(SRC_PORT), OK_TIMEOUT).expect("udp");
        },
    );
    p.start();
    c.run(
        "the restarted daemon adopts everything and sends nothing",
        || {
            assert!(
                eventually(Duration::from_secs(20), || p
                    .log()
                    .contains("serving /healthz")),
                "{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(500));
            assert!(!p.log().contains("sync: committed"), "{}", p.log());
            assert_eq!(node(&t, "ipvsadm -Sn"), before);
        },
    );
    c.run("the same connection and flow still work", || {
        assert_eq!(echo_roundtrip(&mut stream, "after").unwrap(), "after");
        udp(&client, sa(ip(DNS), 53), Some(SRC_PORT), OK_TIMEOUT).expect("udp");
    });
    p.stop();
    c.finish();
}
