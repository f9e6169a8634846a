//! x_tables (iptables-legacy) kernel tests (root). Each case runs in fresh,
//! uniquely named network namespaces deleted on drop (also on panic); our
//! calls run in a thread that entered the namespace, and
//! `iptables-legacy-restore`/`-save` (and the ip6 ones) run there through
//! `ip netns exec` as the independent oracle. Every case runs for IPv4 and IPv6.
mod common;
use common::*;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use kube_nlproxy_netlink::xtables::*;

/// One address family: our family, its CLI and the addresses of the rulesets.
#[derive(Clone, Copy)]
struct Fam {
    family: Family,
    restore: &'static str,
    save: &'static str,
    cli: &'static str,
    /// Loopback net, pod CIDR, ClusterIP, endpoints, a docker container and net,
    /// an allowed source, a counted source.
    lo: &'static str,
    pods: &'static str,
    vip: &'static str,
    ep1: &'static str,
    ep2: &'static str,
    docker: &'static str,
    docker_net: &'static str,
    allowed: &'static str,
    counted: &'static str,
    /// `[addr]` for DNAT `--to-destination` (`addr` for IPv4).
    bracket: fn(&str) -> String,
}

const V4: Fam = Fam {
    family: Family::Ipv4,
    restore: "iptables-legacy-restore",
    save: "iptables-legacy-save",
    cli: "iptables-legacy",
    lo: "127.0.0.0/8",
    pods: "10.244.0.0/16",
    vip: "10.96.0.10",
    ep1: "10.244.1.5",
    ep2: "10.244.1.6",
    docker: "172.17.0.2",
    docker_net: "172.17.0.0/16",
    allowed: "192.0.2.0/24",
    counted: "198.51.100.1/32",
    bracket: |a| a.to_string(),
};

const V6: Fam = Fam {
    family: Family::Ipv6,
    restore: "ip6tables-legacy-restore",
    save: "ip6tables-legacy-save",
    cli: "ip6tables-legacy",
    lo: "::1/128",
    pods: "fd00:10:244::/48",
    vip: "fd00:10:96::10",
    ep1: "fd00:10:244:1::5",
    ep2: "fd00:10:244:1::6",
    docker: "fd00:172:17::2",
    docker_net: "fd00:172:17::/64",
    allowed: "2001:db8::/32",
    counted: "2001:db8:100::1/128",
    bracket: |a| format!("[{a}]"),
};

const FAMS: [Fam; 2] = [V4, V6];

/// A ruleset like kube-proxy's iptables mode writes (plus the kubelet's
/// chains), mixed with rules of others that must survive: a DOCKER chain with
/// a DNAT, a plain ACCEPT with `-s`, a LOG rule, a counting rule without `-j`,
/// a goto. Some rules and policies carry counters (`iptables-restore -c`).
fn kube_ruleset(f: &Fam) -> String {
    let Fam {
        lo,
        pods,
        vip,
        ep1,
        ep2,
        docker,
        docker_net,
        allowed,
        counted,
        ..
    } = *f;
    let (b_ep1, b_ep2, b_docker) = ((f.bracket)(ep1), (f.bracket)(ep2), (f.bracket)(docker));
    let host = if f.family == Family::Ipv4 { 32 } else { 128 };
    format!(
        r#"*mangle
:PREROUTING ACCEPT [10:1000]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-PROXY-CANARY - [0:0]
[4:400] -A PREROUTING -i eth9 -j MARK --set-xmark 0x1/0xffffffff
COMMIT
*filter
:INPUT ACCEPT [11:2000]
:FORWARD DROP [1:60]
:OUTPUT ACCEPT [0:0]
:DOCKER - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
[5:300] -A INPUT -j KUBE-FIREWALL
[3:180] -A INPUT -s {allowed} -j ACCEPT
[2:120] -A INPUT -s {counted}
-A INPUT -p tcp -m tcp --dport 22 -j LOG --log-prefix "ssh: "
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
[7:420] -A FORWARD -j DOCKER
-A FORWARD -i eth7 -g DOCKER
-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A OUTPUT -o eth8 -g KUBE-FORWARD
-A DOCKER -d {docker}/{host} ! -i docker0 -o docker0 -p tcp -m tcp --dport 80 -j ACCEPT
-A KUBE-FIREWALL ! -s {lo} -d {lo} -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-SERVICES -d {vip}/{host} -p tcp -m comment --comment "default/web:http has no endpoints" -m tcp --dport 81 -j REJECT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-XXXXXXXXXXXXXXXX - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
[6:360] -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT ! -d {lo} -m addrtype --dst-type LOCAL -j DOCKER
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s {docker_net} ! -o docker0 -j MASQUERADE
-A DOCKER -i docker0 -j RETURN
-A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination {b_docker}:80
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SEP-AAAAAAAAAAAAAAAA -s {ep1}/{host} -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination {b_ep1}:8080
-A KUBE-SEP-BBBBBBBBBBBBBBBB -s {ep2}/{host} -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination {b_ep2}:8080
[2:120] -A KUBE-SERVICES -d {vip}/{host} -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-XXXXXXXXXXXXXXXX
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-XXXXXXXXXXXXXXXX ! -s {pods} -d {vip}/{host} -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-XXXXXXXXXXXXXXXX -m comment --comment "default/web:http -> {ep1}:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-AAAAAAAAAAAAAAAA
-A KUBE-SVC-XXXXXXXXXXXXXXXX -m comment --comment "default/web:http -> {ep2}:8080" -j KUBE-SEP-BBBBBBBBBBBBBBBB
COMMIT
"#
    )
}

/// `*-restore -w 5 -c FILE` of `rules` in `ns`.
fn restore(ns: &str, f: &Fam, rules: &str) {
    let path = std::env::temp_dir().join(format!("{}.rules", unique("xt")));
    std::fs::write(&path, rules).unwrap();
    let out = nsexec(ns, &[f.restore, "-w", "5", "-c", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{} failed: {}",
        f.restore,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `*-save -c` in `ns`, without the comment lines (header, timestamps).
fn save(ns: &str, f: &Fam) -> String {
    let out = nsexec(ns, &[f.save, "-c"]);
    assert!(
        out.status.success(),
        "{}: {}",
        f.save,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `iptables-legacy -w 5 args...` in `ns`.
fn cli(ns: &str, f: &Fam, args: &[&str]) {
    let mut v = vec![f.cli, "-w", "5"];
    v.extend_from_slice(args);
    let out = nsexec(ns, &v);
    assert!(
        out.status.success(),
        "{v:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The saved ruleset minus every line naming a `KUBE-` chain: the chain
/// declarations, their rules and the rules jumping to them.
fn without_kube(saved: &str) -> String {
    saved
        .lines()
        .filter(|l| saved_line_chains(l).iter().all(|c| !is_kube_proxy_chain(c)))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The `KUBE-…` chain names a saved line mentions (its declaration, its chain,
/// its jump target).
fn saved_line_chains(l: &str) -> Vec<&str> {
    l.split(|c: char| c.is_whitespace() || c == ':')
        .filter(|w| w.starts_with("KUBE-"))
        .collect()
}

/// `(table, chain)` of kube-proxy's chain declarations in a saved ruleset.
fn saved_kube_chains(saved: &str) -> Vec<(String, String)> {
    let mut table = "";
    let mut out = Vec::new();
    for l in saved.lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t;
        } else if let Some(c) = l.strip_prefix(':') {
            let name = c.split_whitespace().next().unwrap();
            if is_kube_proxy_chain(name) {
                out.push((table.to_string(), name.to_string()));
            }
        }
    }
    out.sort();
    out
}

fn tables_file(f: &Fam) -> &'static str {
    match f.family {
        Family::Ipv4 => "/proc/thread-self/net/ip_tables_names",
        Family::Ipv6 => "/proc/thread-self/net/ip6_tables_names",
    }
}

/// In a fresh namespace no legacy table exists: reads say "absent", nothing
/// is removed, and none of it creates a table. Asking with the CLI does.
#[test]
fn absent_tables_are_none_and_not_created() {
    for f in FAMS {
        let ns = Netns::new(unique("xt-absent"));
        let (names, fam) = (tables_file(&f), f.family);
        in_ns(&ns.0, move || {
            for t in KUBE_PROXY_TABLES {
                assert!(read_table(fam, t).unwrap().is_none(), "{fam:?} {t}");
                assert!(read_raw(fam, t).unwrap().is_none(), "{fam:?} {t}");
            }
            assert!(kube_proxy_state(fam).unwrap().is_empty());
            assert!(remove_kube_proxy_state(fam).unwrap().is_empty());
            assert!(table_names(fam).unwrap().is_empty(), "{fam:?}");
            assert_eq!(std::fs::read_to_string(names).unwrap_or_default(), "");
        });
        // The kernel fact that makes read_table look first: a GET_INFO (here
        // by `iptables-legacy -t nat -S`) creates the table in the namespace.
        cli(&ns.0, &f, &["-t", "nat", "-S"]);
        let names = in_ns(&ns.0, move || table_names(fam).unwrap());
        assert_eq!(names, ["nat"], "{fam:?}");
        let t = in_ns(&ns.0, move || read_table(fam, "nat").unwrap()).expect("nat exists now");
        assert_eq!(t.chains(), ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]);
        // Filter was not asked for and still does not exist.
        assert!(
            in_ns(&ns.0, move || read_table(fam, "filter").unwrap()).is_none(),
            "{fam:?}"
        );
    }
}

/// A kube-proxy ruleset is read with all its chains; emitting it gives the
/// kernel's bytes; writing the unchanged table back leaves `*-save -c`
/// (counters included) identical.
#[test]
fn kube_proxy_ruleset_round_trips() {
    for f in FAMS {
        let ns = Netns::new(unique("xt-rt"));
        restore(&ns.0, &f, &kube_ruleset(&f));
        let before = save(&ns.0, &f);
        let fam = f.family;
        let state = in_ns(&ns.0, move || {
            for name in KUBE_PROXY_TABLES {
                let (info, blob) = read_raw(fam, name).unwrap().expect("table exists");
                let t = Table::parse(fam, &info, &blob).unwrap();
                let e = t.emit().unwrap();
                assert!(
                    e.entries == blob,
                    "{fam:?} {name}: emit differs from the kernel's bytes"
                );
                assert_eq!(e.num_entries, info.num_entries, "{fam:?} {name}");
                for h in 0..5 {
                    if info.valid_hooks & (1 << h) != 0 {
                        assert_eq!(e.hook_entry[h], info.hook_entry[h], "{fam:?} {name}");
                        assert_eq!(e.underflow[h], info.underflow[h], "{fam:?} {name}");
                    }
                }
                write_table(&t).unwrap();
            }
            let nat = read_table(fam, "nat").unwrap().unwrap();
            let svc = nat.chain("KUBE-SERVICES").expect("KUBE-SERVICES");
            assert_eq!(
                svc.rules[0].jump_target(),
                Some("KUBE-SVC-XXXXXXXXXXXXXXXX")
            );
            assert_eq!(
                svc.rules[0]
                    .matches
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>(),
                ["comment", "tcp"]
            );
            let sep = nat.chain("KUBE-SEP-AAAAAAAAAAAAAAAA").unwrap();
            assert!(matches!(&sep.rules[1].target, Target::Other { name, .. } if name == "DNAT"));
            let filter = read_table(fam, "filter").unwrap().unwrap();
            let fwd = filter.chain("FORWARD").unwrap();
            assert!(fwd.rules[5].is_goto() && fwd.rules[5].jump_target() == Some("DOCKER"));
            let input = filter.chain("INPUT").unwrap();
            assert_eq!(
                input.rules[5].target,
                Target::Standard(Verdict::Fallthrough)
            );
            assert_eq!(
                input.rules[4].counters,
                Counters {
                    packets: 3,
                    bytes: 180
                }
            );
            kube_proxy_state(fam).unwrap()
        });
        let mut state = state;
        state.sort();
        assert_eq!(state, saved_kube_chains(&before), "{:?}", f.family);
        assert_eq!(
            save(&ns.0, &f),
            before,
            "{:?}: write_table changed the ruleset",
            f.family
        );
    }
}

/// remove_kube_proxy_state leaves exactly the ruleset minus the KUBE- chains
/// and the rules jumping to them, other rules (and their counters) unchanged.
#[test]
fn remove_kube_proxy_state_keeps_other_rules() {
    for f in FAMS {
        let ns = Netns::new(unique("xt-rm"));
        restore(&ns.0, &f, &kube_ruleset(&f));
        let before = save(&ns.0, &f);
        let fam = f.family;
        let (removed, again, state) = in_ns(&ns.0, move || {
            let removed = remove_kube_proxy_state(fam).unwrap();
            (
                removed,
                remove_kube_proxy_state(fam).unwrap(),
                kube_proxy_state(fam).unwrap(),
            )
        });
        let after = save(&ns.0, &f);
        assert_eq!(after, without_kube(&before), "{:?}", f.family);
        let mut chains = removed.chains.clone();
        chains.sort();
        assert_eq!(chains, saved_kube_chains(&before));
        // Rules of kept chains that jumped to KUBE- chains (`-c` lines read
        // `[p:b] -A CHAIN ...`).
        let jumps = before
            .lines()
            .filter_map(|l| l.split_once("-A "))
            .filter(|(_, rule)| {
                let chain = rule.split_whitespace().next().unwrap_or("");
                !is_kube_proxy_chain(chain)
                    && saved_line_chains(rule)
                        .iter()
                        .any(|c| is_kube_proxy_chain(c))
            })
            .count();
        assert_eq!(
            removed.rules.len(),
            jumps,
            "{:?}: {:?}",
            f.family,
            removed.rules
        );
        assert!(again.is_empty() && state.is_empty(), "{again:?} {state:?}");
        // Only the three tables were touched; the table set is unchanged.
        let names = in_ns(&ns.0, move || table_names(fam).unwrap());
        assert_eq!(names.len(), 3, "{names:?}");
    }
}

/// A table changed after it was read is not overwritten: the replace fails
/// with EAGAIN, and remove_chains (which reads again) still succeeds.
#[test]
fn replace_of_a_changed_table_is_eagain() {
    for f in FAMS {
        let ns = Netns::new(unique("xt-eagain"));
        restore(&ns.0, &f, &kube_ruleset(&f));
        let fam = f.family;
        let stale = in_ns(&ns.0, move || read_table(fam, "nat").unwrap().unwrap());
        cli(
            &ns.0,
            &f,
            &["-t", "nat", "-A", "DOCKER", "-p", "udp", "-j", "RETURN"],
        );
        let with_rule = save(&ns.0, &f);
        let err = in_ns(&ns.0, move || write_table(&stale).unwrap_err());
        assert!(matches!(err, XtablesError::ReplaceFailed { .. }), "{err:?}");
        assert_eq!(err.errno(), Some(libc::EAGAIN), "{err}");
        assert_eq!(
            save(&ns.0, &f),
            with_rule,
            "a failed replace changed nothing"
        );
        let removed = in_ns(&ns.0, move || {
            remove_chains(fam, "nat", |c| c.starts_with("KUBE-")).unwrap()
        });
        assert!(!removed.chains.is_empty());
        assert!(save(&ns.0, &f).contains("-A DOCKER -p udp -j RETURN"));
    }
}

/// A TCP server in `ns` answering `hello` to every connection until dropped.
struct Server {
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Server {
    fn start(ns: &str, addr: SocketAddr) -> Server {
        let listener = in_ns(ns, move || TcpListener::bind(addr).expect("bind"));
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let handle = thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        count.fetch_add(1, Ordering::SeqCst);
                        let _ = s.set_nonblocking(false);
                        let _ = s.write_all(b"hello\n");
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(10))
                    }
                    Err(_) => break,
                }
            }
        });
        Server {
            accepted,
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Connects from `ns` to `dst` and reads the answer.
fn fetch(ns: &str, dst: SocketAddr) -> io::Result<String> {
    in_ns(ns, move || {
        let mut s = TcpStream::connect_timeout(&dst, Duration::from_millis(1500))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
}

/// Real packets: in a client namespace, legacy nat OUTPUT → KUBE-SERVICES →
/// KUBE-SVC → KUBE-SEP DNATs a fake ClusterIP to a server namespace across a
/// veth, and a DOCKER chain DNATs another address there too. After
/// remove_kube_proxy_state the ClusterIP no longer reaches the server and the
/// DOCKER DNAT still does.
#[test]
fn removed_clusterip_stops_dnat_packets() {
    for f in FAMS {
        let v6 = f.family == Family::Ipv6;
        let client = Netns::new(unique("xt-cli"));
        let server = Netns::new(unique("xt-srv"));
        ipn(
            &client.0,
            &[
                "link", "add", "xc", "type", "veth", "peer", "name", "xs", "netns", &server.0,
            ],
        );
        let (c_addr, s_addr, vip, docker_vip) = if v6 {
            ("fd88::1", "fd88::2", "fd96::10", "fd97::20")
        } else {
            ("10.88.0.1", "10.88.0.2", "10.96.0.10", "10.97.0.20")
        };
        let (plen, host) = if v6 { ("64", "128") } else { ("24", "32") };
        ipn(
            &client.0,
            &[
                "addr",
                "add",
                &format!("{c_addr}/{plen}"),
                "dev",
                "xc",
                "nodad",
            ],
        );
        ipn(
            &server.0,
            &[
                "addr",
                "add",
                &format!("{s_addr}/{plen}"),
                "dev",
                "xs",
                "nodad",
            ],
        );
        ipn(&client.0, &["link", "set", "xc", "up"]);
        ipn(&server.0, &["link", "set", "xs", "up"]);
        ipn(&client.0, &["route", "add", "default", "via", s_addr]);
        let srv = Server::start(&server.0, SocketAddr::new(s_addr.parse().unwrap(), 8080));
        let to = (f.bracket)(s_addr);
        let rules = format!(
            r#"*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-TESTTESTTESTTEST - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TESTTESTTESTTEST - [0:0]
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j DOCKER
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A DOCKER -d {docker_vip}/{host} -p tcp -m tcp --dport 80 -j DNAT --to-destination {to}:8080
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SEP-TESTTESTTESTTEST -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination {to}:8080
-A KUBE-SERVICES -d {vip}/{host} -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-TESTTESTTESTTEST
-A KUBE-SVC-TESTTESTTESTTEST -m comment --comment "default/web:http -> {s_addr}:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-TESTTESTTESTTEST
-A KUBE-SVC-TESTTESTTESTTEST -m comment --comment "default/web:http -> {s_addr}:8080" -j KUBE-SEP-TESTTESTTESTTEST
COMMIT
"#
        );
        restore(&client.0, &f, &rules);
        let vip_sa = SocketAddr::new(vip.parse().unwrap(), 80);
        let docker_sa = SocketAddr::new(docker_vip.parse().unwrap(), 80);
        // The topology answers at all (a busy machine may take a moment to
        // bring the veth and the server up); from then on every fetch counts.
        assert!(
            eventually(Duration::from_secs(15), || fetch(&client.0, vip_sa)
                .is_ok_and(|s| s == "hello\n")),
            "{:?} ClusterIP never answered before the removal",
            f.family
        );
        let answered_first = srv.accepted.load(Ordering::SeqCst);
        for _ in 0..3 {
            assert_eq!(
                fetch(&client.0, vip_sa).unwrap(),
                "hello\n",
                "{:?} ClusterIP before",
                f.family
            );
        }
        assert_eq!(
            fetch(&client.0, docker_sa).unwrap(),
            "hello\n",
            "{:?} DOCKER before",
            f.family
        );

        let fam = f.family;
        let removed = in_ns(&client.0, move || remove_kube_proxy_state(fam).unwrap());
        assert_eq!(removed.chains.len(), 5, "{removed:?}");

        let seen = srv.accepted.load(Ordering::SeqCst);
        assert_eq!(seen, answered_first + 4, "{:?}", f.family);
        let res = fetch(&client.0, vip_sa);
        assert!(
            res.is_err(),
            "{:?}: the ClusterIP still answers: {res:?}",
            f.family
        );
        // (IPv4: a timeout; IPv6: ENETUNREACH, the server's ICMPv6 "no route".)
        assert_eq!(srv.accepted.load(Ordering::SeqCst), seen, "{:?}", f.family);
        assert_eq!(
            fetch(&client.0, docker_sa).unwrap(),
            "hello\n",
            "{:?} DOCKER after",
            f.family
        );
        let saved = save(&client.0, &f);
        assert!(!saved.contains("KUBE-"), "{saved}");
        assert!(saved.contains("-j DNAT"), "{saved}");
    }
}
