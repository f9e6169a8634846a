//! Drift repair with real traffic: while the daemon runs, something else deletes
//! our table, adds a chain and a rule to it, and empties one of its maps. The
//! daemon notices (the ruleset generation every second, the read-back every
//! `--sync-period`) and puts exactly its state back, traffic flowing again; a
//! table of another program is never touched.
mod common;
use common::*;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");
const VIP: &str = "10.96.0.80";
const SYNC_PERIOD: Duration = Duration::from_secs(3);
const SHORT: Duration = Duration::from_millis(700);

fn nft(ns: &str, cmd: &str) -> String {
    let out = nsexec(ns, &["nft", cmd]);
    assert!(
        out.status.success(),
        "nft {cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_daemon_repairs_what_others_change_and_leaves_their_tables_alone() {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("web", Where::Local);
    let client = t.pod("client").ns.clone();
    let node = t.node.clone();
    let mut args = default_args();
    args.extend(["--sync-period".to_string(), "3s".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut p = Proxy::new(&t, BIN).with_args(&args);
    p.write(&web_service(&t, VIP, "web"));
    p.start();
    let served = || tcp(&client, sa(ip(VIP), 80), SHORT).is_ok_and(|r| r.pod == "web");
    assert!(
        eventually(Duration::from_secs(10), served),
        "log:\n{}",
        p.log()
    );

    // Another program's table, with a chain and an element.
    nft(&node, "add table ip foreign");
    nft(&node, "add chain ip foreign keep");
    nft(&node, "add set ip foreign s { type ipv4_addr; }");
    nft(&node, "add element ip foreign s { 192.0.2.1 }");
    let foreign = nft(&node, "list table ip foreign");

    let mut c = Checks::default();
    c.run("our table deleted: rebuilt within a second or two", || {
        nft(&node, "delete table ip kube-nlproxy");
        assert!(!served(), "nothing serves the VIP without our table");
        assert!(
            eventually(Duration::from_secs(5), served),
            "never repaired; log:\n{}",
            p.log()
        );
        assert!(p.log().contains("changed by someone else"), "{}", p.log());
    });
    c.run("a chain and a rule added to our table: removed", || {
        nft(&node, "add chain ip kube-nlproxy intruder");
        nft(
            &node,
            "add rule ip kube-nlproxy nat-output counter comment \"intruder\"",
        );
        assert!(
            eventually(Duration::from_secs(5), || {
                p.table().is_some_and(|t| !t.contains("intruder"))
            }),
            "{:?}",
            p.table()
        );
        assert!(served());
    });
    c.run(
        "a map emptied behind our back: refilled by the read-back",
        || {
            let table = p.table().unwrap_or_default();
            let map = table
                .lines()
                .find_map(|l| l.trim().strip_prefix("map endpoints-"))
                .and_then(|rest| rest.split_whitespace().next())
                .map(|name| format!("endpoints-{name}"))
                .expect("an endpoints map");
            nft(&node, &format!("flush map ip kube-nlproxy {map}"));
            assert!(!served(), "the emptied map serves nothing");
            assert!(
                eventually(SYNC_PERIOD * 3, served),
                "not refilled within a sync period; log:\n{}",
                p.log()
            );
            // Logged as a repair and counted (drift_repairs in /status).
            assert!(
                eventually(Duration::from_secs(2), || p
                    .log()
                    .contains("the periodic read-back found our objects changed")),
                "the element repair is not logged:\n{}",
                p.log()
            );
            let status = output_text(&p.command(&["status", "--output", "json"], &[]));
            let repairs = status
                .lines()
                .find_map(|l| l.trim().strip_prefix("\"drift_repairs\": "))
                .and_then(|v| v.trim_end_matches(',').parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no drift_repairs in {status}"));
            assert!(
                repairs >= 2,
                "table deletion and element drift: {repairs}\n{status}"
            );
        },
    );
    c.run("the other program's table is as it was", || {
        assert_eq!(nft(&node, "list table ip foreign"), foreign);
    });
    c.run("the daemon still runs", || {
        assert!(p.running(), "{}", p.log())
    });
    p.stop();
    c.run("cleanup leaves the other table", || {
        let out = p.cleanup();
        assert!(out.status.success());
        assert_eq!(nft(&node, "list table ip foreign"), foreign);
    });
    c.finish();
}
