//! `kill -9` under traffic: TCP connections through a ClusterIP and a NodePort
//! keep exchanging data and a UDP flow keeps its backend while the daemon is
//! killed and started again; the restarted daemon adopts the kernel's state
//! (reads it back, finds it matching) and resets, flushes or re-sends nothing.
mod common;
use common::*;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const VIP: &str = "10.96.0.90";
const DNS: &str = "10.96.0.91";
const NODE_PORT: u16 = 30090;

#[test]
fn kill_9_and_restart_keeps_every_connection_and_resends_nothing() {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("a", Where::Local);
    t.add_pod("b", Where::Remote);
    let client = t.pod("client").ns.clone();
    let ext = t.ext.clone();
    let mut p = Proxy::new(&t, BIN);
    p.write(&cluster(&[
        Svc::new(
            "echo",
            "NodePort",
            &[VIP],
            vec![nport("echo", "TCP", 90, ECHO_PORT, NODE_PORT)],
        )
        .yaml(),
        slice(
            "echo",
            "v4",
            false,
            &[("echo", "TCP", ECHO_PORT)],
            &t.eps(&["a", "b"], false),
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
            &t.eps(&["a", "b"], false),
        ),
    ]));
    p.start();
    let vip = sa(ip(VIP), 90);
    assert!(
        eventually(Duration::from_secs(10), || {
            tcp_stream(&client, vip, OK_TIMEOUT).is_ok_and(|mut s| read_line(&mut s).is_ok())
        }),
        "{:?} {:?}; log:\n{}",
        tcp_stream(&client, vip, OK_TIMEOUT).map(|mut s| read_line(&mut s)),
        p.table(),
        p.log()
    );
    let mut via_cluster_ip =
        tcp_stream(&client, vip, OK_TIMEOUT).expect("connect to the ClusterIP");
    let mut via_node_port =
        tcp_stream(&ext, sa(NODE_V4, NODE_PORT), OK_TIMEOUT).expect("connect to the NodePort");
    for s in [&mut via_cluster_ip, &mut via_node_port] {
        read_line(s).expect("greeting");
        assert_eq!(echo_roundtrip(s, "before").unwrap(), "before");
    }
    const SRC_PORT: u16 = 40091;
    let udp_backend = udp(&client, sa(ip(DNS), 53), Some(SRC_PORT), OK_TIMEOUT)
        .expect("udp")
        .pod;
    let table = p.table();

    let mut c = Checks::default();
    p.kill9();
    c.run("with the daemon dead, everything still flows", || {
        for s in [&mut via_cluster_ip, &mut via_node_port] {
            assert_eq!(echo_roundtrip(s, "dead").unwrap(), "dead");
        }
        let r = udp(&client, sa(ip(DNS), 53), Some(SRC_PORT), OK_TIMEOUT).expect("udp");
        assert_eq!(r.pod, udp_backend);
        assert_eq!(p.table(), table, "the kernel keeps our state as it was");
    });
    p.start();
    c.run(
        "the restarted daemon adopts the state and sends nothing",
        || {
            assert!(
                eventually(Duration::from_secs(10), || p
                    .log()
                    .contains("serving /healthz")),
                "{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(500));
            assert!(!p.log().contains("sync: committed"), "{}", p.log());
            assert_eq!(p.table(), table);
        },
    );
    c.run(
        "after the restart, the same connections and flow still work",
        || {
            for s in [&mut via_cluster_ip, &mut via_node_port] {
                assert_eq!(echo_roundtrip(s, "after").unwrap(), "after");
            }
            let r = udp(&client, sa(ip(DNS), 53), Some(SRC_PORT), OK_TIMEOUT).expect("udp");
            assert_eq!(r.pod, udp_backend, "the UDP flow kept its backend");
            assert!(!p.log().contains("stale conntrack"), "{}", p.log());
        },
    );
    p.stop();
    c.finish();
}
