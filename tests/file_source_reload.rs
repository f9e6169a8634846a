//! A manifest directory that goes away while the daemon runs: the last good
//! objects stay programmed (real packets still reach the backend), and the failing
//! reload is one warning, not one per poll.
//!
//! Needs root.
mod common;

use std::time::Duration;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");

#[test]
fn a_vanished_manifest_directory_warns_once_and_keeps_serving() {
    let mut t = Topo::new();
    t.add_pod("client", Where::Local);
    t.add_pod("web", Where::Local);
    let client = t.pod("client").ns.clone();
    let mut p = Proxy::new(&t, BIN);
    p.write(&web_service(&t, "10.96.0.90", "web"));
    p.start();
    let vip = sa(ip("10.96.0.90"), 80);
    let served = || matches!(tcp(&client, vip, OK_TIMEOUT), Ok(r) if r.pod == "web");
    assert!(
        eventually(Duration::from_secs(10), served),
        "log:\n{}",
        p.log()
    );
    std::fs::remove_dir_all(&p.dir).unwrap();
    // The source polls every 200 ms: some 15 failed reloads in 3 s.
    std::thread::sleep(Duration::from_secs(3));
    let log = p.log();
    let warnings = log.matches("reloading ").count();
    assert_eq!(
        warnings, 1,
        "the failing reload is not rate-limited:\n{log}"
    );
    assert!(served(), "the last good objects are no longer served");
    assert!(p.running(), "{log}");
    std::fs::create_dir_all(&p.dir).unwrap();
}
