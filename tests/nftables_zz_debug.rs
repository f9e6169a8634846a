mod common;
use common::*;
#[test]
#[ignore]
fn debug_reject6() {
    let mut t = Topo::new();
    t.add_pod("a", Where::Local);
    let a = t.pod("a").ns.clone();
    println!("{}", String::from_utf8_lossy(&nsexec(&t.node, &["sh","-c","echo 0 > /proc/sys/net/bridge/bridge-nf-call-ip6tables; nft add table ip6 x; nft add chain ip6 x f '{ type filter hook forward priority 0; }'; nft add rule ip6 x f ip6 daddr fd96::/112 reject; nft add table ip x; nft add chain ip x f '{ type filter hook forward priority 0; }'; nft add rule ip x f ip daddr 10.96.0.0/16 reject"]).stderr));
    for i in 0..3 {
        let s = std::time::Instant::now();
        let r = tcp(&a, sa(ip("fd96::12"), 80), OK_TIMEOUT);
        println!("v6 {i} {r:?} {:?}", s.elapsed());
        let s = std::time::Instant::now();
        let r = tcp(&a, sa(ip("10.96.0.12"), 80), OK_TIMEOUT);
        println!("v4 {i} {r:?} {:?}", s.elapsed());
    }
    println!(
        "{}",
        String::from_utf8_lossy(&nsexec(&a, &["ip", "-6", "neigh"]).stdout)
    );
    println!(
        "{}",
        String::from_utf8_lossy(&nsexec(&t.node, &["ip", "-6", "neigh"]).stdout)
    );
}
