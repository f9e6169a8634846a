//! Real-packet test harness for kube-nlproxy.
//!
//! Builds a small "cluster" out of network namespaces with `ip`:
//!
//! ```text
//!                 LAN namespace (bridge br0, 10.77.0.0/24, fd77::/64)
//!        +----------------+------------------+-------------------+
//!   node N (eth0 .1/::1)   remote R (.2/::2)   EXT (.100/::100)
//!    cbr0 10.244.1.1/24     cbr0 10.244.2.1/24
//!    fd44:1::1/64           fd44:2::1/64
//!     |  local pods          |  remote pods
//! ```
//!
//! Every pod runs TCP/UDP (and SCTP when the kernel has it) servers as
//! in-process threads that entered the pod's namespace with `setns(2)`.
//! Clients run in short-lived threads that enter a namespace the same way.
//! All namespaces are deleted when the [`Topo`] is dropped (also on panic).
#![allow(dead_code)]

pub mod apiserver;
pub mod cluster;
pub mod kubelet;

use std::fmt;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Node name of the node the proxy runs on.
pub const NODE: &str = "node-a";
/// Node name of the remote node.
pub const REMOTE: &str = "node-b";
/// Node addresses on the LAN.
pub const NODE_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const NODE_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1);
pub const REMOTE_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
pub const REMOTE_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
pub const EXT_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 100);
pub const EXT_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 0x100);
/// Pod bridge gateway addresses on the node (what a hairpinned pod sees).
pub const NODE_BR_V4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);
pub const NODE_BR_V6: Ipv6Addr = Ipv6Addr::new(0xfd44, 1, 0, 0, 0, 0, 0, 1);

/// Ports every pod serves on (TCP and UDP, plus SCTP when available).
pub const PORTS: [u16; 2] = [8080, 8081];
/// TCP echo port: greeting line, then echoes every line until EOF.
pub const ECHO_PORT: u16 = 9000;

/// Timeout used when a connection is expected to succeed.
pub const OK_TIMEOUT: Duration = Duration::from_secs(2);

/// The kube-nlproxy binary under test: `KUBE_NLPROXY_BIN` (the VM runner's copy),
/// else cargo's.
pub fn proxy_bin() -> PathBuf {
    std::env::var_os("KUBE_NLPROXY_BIN")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO_BIN_EXE_kube-nlproxy").map(PathBuf::from))
        .expect("KUBE_NLPROXY_BIN is unset and this is not a cargo test build")
}

/// Whether this runs inside the test VM (`vm-tests/run-tests` sets `KNP_VM`):
/// there every test runs, and nothing may skip for want of a kernel feature.
pub fn in_vm() -> bool {
    std::env::var_os("KNP_VM").is_some()
}

/// Says on stderr that `test` (`binary::test`) passes without testing, and why.
/// The line is written past libtest's output capture, so it shows in every run,
/// and starts `SKIPPED ` so `scripts/test` and `vm-tests/run-tests` count it.
pub fn skipped(test: &str, why: &str) {
    let _ = writeln!(io::stderr(), "SKIPPED {test}: {why}");
}

/// `true` (after saying so with [`skipped`]) when the VM-only test
/// `binary::test` runs outside the test VM (`KNP_VM` unset).
pub fn skip_outside_vm(binary: &str, test: &str) -> bool {
    if in_vm() {
        return false;
    }
    skipped(
        &format!("{binary}::{test}"),
        &format!("not inside the test VM (KNP_VM unset); run vm-tests/run-tests {binary}"),
    );
    true
}
/// Timeout used when a connection is expected to be dropped.
pub const DROP_TIMEOUT: Duration = Duration::from_millis(1200);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// `t` as RFC 3339 with nanoseconds, UTC (Go's `time.RFC3339Nano` without the
/// trailing-zero trimming), as kube-controller-manager writes
/// `endpoints.kubernetes.io/last-change-trigger-time`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let t = k8s_openapi::jiff::Timestamp::try_from(t).expect("a time jiff can hold");
    format!("{t:.9}")
}

/// A unique name `knp-<pid>-<counter>`.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    format!("{prefix}-{}-{n}", std::process::id())
}

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

/// Runs a command, panicking with its output when it fails.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("spawn {args:?}: {e}"));
    if !out.status.success() {
        panic!(
            "command {:?} failed ({}): {}{}",
            args,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command, returning its output whatever the status.
pub fn sh_out(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("spawn {args:?}: {e}"))
}

/// `ip -n NS args...`
pub fn ipn(ns: &str, args: &[&str]) -> String {
    let mut v = vec!["ip", "-n", ns];
    v.extend_from_slice(args);
    sh(&v)
}

/// A network namespace (with `lo` up), deleted on drop (also on panic).
pub struct Netns(pub String);

impl Netns {
    pub fn new(name: String) -> Netns {
        sh(&["ip", "netns", "add", &name]);
        let n = Netns(name);
        ipn(&n.0, &["link", "set", "lo", "up"]);
        n
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

/// `ip netns exec NS args...`
pub fn nsexec(ns: &str, args: &[&str]) -> Output {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    sh_out(&v)
}

/// Reads back an nftables table inside a namespace (oracle only).
/// Returns `None` when the table does not exist.
pub fn nft_table(ns: &str, family: &str, table: &str) -> Option<String> {
    let out = nsexec(ns, &["nft", "list", "table", family, table]);
    if out.status.success() {
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        None
    }
}

/// Lists all tables in a namespace (`nft list tables`).
pub fn nft_tables(ns: &str) -> String {
    let out = nsexec(ns, &["nft", "list", "tables"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---------------------------------------------------------------------------
// Namespaces and setns
// ---------------------------------------------------------------------------

/// Moves the calling thread into the network namespace `ns`.
pub fn enter_ns(ns: &str) -> io::Result<()> {
    let f = fs::File::open(format!("/run/netns/{ns}"))?;
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` in a fresh thread inside namespace `ns`.
pub fn in_ns<R: Send + 'static>(ns: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let ns = ns.to_string();
    thread::spawn(move || {
        enter_ns(&ns).unwrap_or_else(|e| panic!("setns {ns}: {e}"));
        f()
    })
    .join()
    .expect("client thread panicked")
}

/// A network namespace, deleted on drop.
struct NsGuard(String);

impl NsGuard {
    fn new(name: String) -> NsGuard {
        sh(&["ip", "netns", "add", &name]);
        let g = NsGuard(name);
        // Forwarding on, DAD off (addresses usable immediately), lo up.
        let script = "echo 1 > /proc/sys/net/ipv4/ip_forward; \
             echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad; \
             echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad; \
             echo 1 > /proc/sys/net/ipv6/conf/all/forwarding; \
             echo 1 > /proc/sys/net/ipv6/conf/default/forwarding; \
             echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter; \
             echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter; \
             echo 0 > /proc/sys/net/ipv4/icmp_ratelimit; \
             echo 0 > /proc/sys/net/ipv6/icmp/ratelimit; \
             ip link set lo up";
        let out = nsexec(&g.0, &["sh", "-c", script]);
        assert!(
            out.status.success(),
            "sysctl in {}: {}",
            g.0,
            String::from_utf8_lossy(&out.stderr)
        );
        g
    }
}

impl Drop for NsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

// ---------------------------------------------------------------------------
// Probes
// ---------------------------------------------------------------------------

/// True when the kernel supports SCTP sockets (probed in the caller's netns).
pub fn sctp_available() -> bool {
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
    if fd < 0 {
        return false;
    }
    unsafe { libc::close(fd) };
    true
}

// ---------------------------------------------------------------------------
// Topology
// ---------------------------------------------------------------------------

/// Which node a pod lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    /// On the node the proxy runs on (node-a, behind cbr0 in N).
    Local,
    /// On the remote node (node-b).
    Remote,
}

/// A pod: its namespace, addresses and node.
#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub ns: String,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    pub at: Where,
    /// Name of the host-side veth in the node namespace.
    pub host_if: String,
}

impl Pod {
    pub fn ip(&self, v6: bool) -> IpAddr {
        if v6 { self.v6.into() } else { self.v4.into() }
    }
    pub fn node_name(&self) -> &'static str {
        match self.at {
            Where::Local => NODE,
            Where::Remote => REMOTE,
        }
    }
}

/// The whole topology; dropping it stops servers and deletes namespaces.
pub struct Topo {
    pub id: String,
    pub lan: String,
    pub node: String,
    pub remote: String,
    pub ext: String,
    pub pods: Vec<Pod>,
    pub sctp: bool,
    stop: Arc<AtomicBool>,
    servers: Vec<JoinHandle<()>>,
    guards: Vec<NsGuard>,
    next_host: [u8; 2],
    /// Prefix of the host-side veth names for local pods.
    pub veth_prefix: String,
}

impl Topo {
    /// Builds LAN, node, remote node and external client.
    pub fn new() -> Topo {
        Self::with_veth_prefix("veth")
    }

    pub fn with_veth_prefix(prefix: &str) -> Topo {
        let id = unique("knp");
        let mut t = Topo {
            lan: format!("{id}-lan"),
            node: format!("{id}-node"),
            remote: format!("{id}-rem"),
            ext: format!("{id}-ext"),
            id,
            pods: Vec::new(),
            sctp: sctp_available(),
            stop: Arc::new(AtomicBool::new(false)),
            servers: Vec::new(),
            guards: Vec::new(),
            next_host: [10, 10],
            veth_prefix: prefix.to_string(),
        };
        for ns in [&t.lan, &t.node, &t.remote, &t.ext] {
            t.guards.push(NsGuard::new(ns.clone()));
        }
        ipn(&t.lan, &["link", "add", "br0", "type", "bridge"]);
        ipn(&t.lan, &["link", "set", "br0", "up"]);
        let members = [
            (t.node.clone(), "pn", "10.77.0.1/24", "fd77::1/64"),
            (t.remote.clone(), "pr", "10.77.0.2/24", "fd77::2/64"),
            (t.ext.clone(), "pe", "10.77.0.100/24", "fd77::100/64"),
        ];
        for (ns, port, a4, a6) in &members {
            ipn(
                &t.lan,
                &[
                    "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns,
                ],
            );
            ipn(&t.lan, &["link", "set", port, "master", "br0", "up"]);
            ipn(ns, &["addr", "add", a4, "dev", "eth0"]);
            ipn(ns, &["addr", "add", a6, "dev", "eth0", "nodad"]);
            ipn(ns, &["link", "set", "eth0", "up"]);
        }
        for (ns, a4, a6) in [
            (&t.node, "10.244.1.1/24", "fd44:1::1/64"),
            (&t.remote, "10.244.2.1/24", "fd44:2::1/64"),
        ] {
            ipn(ns, &["link", "add", "cbr0", "type", "bridge"]);
            ipn(ns, &["addr", "add", a4, "dev", "cbr0"]);
            ipn(ns, &["addr", "add", a6, "dev", "cbr0", "nodad"]);
            ipn(ns, &["link", "set", "cbr0", "up"]);
        }
        // Pod ranges between the nodes.
        ipn(
            &t.node,
            &["route", "add", "10.244.2.0/24", "via", "10.77.0.2"],
        );
        ipn(
            &t.node,
            &["-6", "route", "add", "fd44:2::/64", "via", "fd77::2"],
        );
        ipn(
            &t.remote,
            &["route", "add", "10.244.1.0/24", "via", "10.77.0.1"],
        );
        ipn(
            &t.remote,
            &["-6", "route", "add", "fd44:1::/64", "via", "fd77::1"],
        );
        // External / LB ranges from EXT go through the node.
        ipn(
            &t.ext,
            &["route", "add", "10.78.0.0/24", "via", "10.77.0.1"],
        );
        ipn(
            &t.ext,
            &["-6", "route", "add", "fd78::/64", "via", "fd77::1"],
        );
        // The node has a default route (as real nodes do) so that traffic to
        // service VIPs without a DNAT reaches the forward hook instead of
        // failing routing. It points at EXT, which does not forward (a
        // packet leaking there is silently dropped).
        ipn(&t.node, &["route", "add", "default", "via", "10.77.0.100"]);
        ipn(
            &t.node,
            &["-6", "route", "add", "default", "via", "fd77::100"],
        );
        let out = nsexec(
            &t.ext,
            &[
                "sh",
                "-c",
                "echo 0 > /proc/sys/net/ipv4/ip_forward; \
                 echo 0 > /proc/sys/net/ipv6/conf/all/forwarding",
            ],
        );
        assert!(out.status.success());
        // Off-cluster client EXT reaches service CIDRs through the node.
        ipn(
            &t.ext,
            &["route", "add", "10.96.0.0/16", "via", "10.77.0.1"],
        );
        ipn(
            &t.ext,
            &["-6", "route", "add", "fd96::/112", "via", "fd77::1"],
        );
        // Service CIDRs from the remote node also go through node-a (lets
        // remote pods act as "other cluster" clients if a test wants it).
        ipn(
            &t.remote,
            &["route", "add", "10.96.0.0/16", "via", "10.77.0.1"],
        );
        ipn(
            &t.remote,
            &["-6", "route", "add", "fd96::/112", "via", "fd77::1"],
        );
        t
    }

    /// Adds a pod on `at` with servers on [`PORTS`] and [`ECHO_PORT`].
    pub fn add_pod(&mut self, name: &str, at: Where) -> Pod {
        let (idx, node_ns, subnet) = match at {
            Where::Local => (0, self.node.clone(), 1u16),
            Where::Remote => (1, self.remote.clone(), 2u16),
        };
        let host = self.next_host[idx];
        self.next_host[idx] += 1;
        let ns = format!("{}-{}", self.id, name);
        self.guards.push(NsGuard::new(ns.clone()));
        let v4 = Ipv4Addr::new(10, 244, subnet as u8, host);
        let v6 = Ipv6Addr::new(0xfd44, subnet, 0, 0, 0, 0, 0, host as u16);
        let host_if = format!("{}{}", self.veth_prefix, host);
        ipn(
            &ns,
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", &host_if, "netns", &node_ns,
            ],
        );
        ipn(&node_ns, &["link", "set", &host_if, "master", "cbr0", "up"]);
        // Like the bridge CNI with hairpinMode: a pod reaching itself via a
        // service VIP is bridged back out of its own port.
        ipn(
            &node_ns,
            &[
                "link",
                "set",
                &host_if,
                "type",
                "bridge_slave",
                "hairpin",
                "on",
            ],
        );
        ipn(&ns, &["addr", "add", &format!("{v4}/24"), "dev", "eth0"]);
        ipn(
            &ns,
            &["addr", "add", &format!("{v6}/64"), "dev", "eth0", "nodad"],
        );
        ipn(&ns, &["link", "set", "eth0", "up"]);
        ipn(
            &ns,
            &[
                "route",
                "add",
                "default",
                "via",
                &format!("10.244.{subnet}.1"),
            ],
        );
        ipn(
            &ns,
            &[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &format!("fd44:{subnet}::1"),
            ],
        );
        let pod = Pod {
            name: name.to_string(),
            ns: ns.clone(),
            v4,
            v6,
            at,
            host_if,
        };
        self.start_servers(&pod);
        self.pods.push(pod.clone());
        pod
    }

    /// Adds a local pod attached by a routed veth (no bridge; the host side
    /// is named `<veth_prefix><n>`), as CNIs like Calico do. Used for
    /// detect-local InterfaceNamePrefix.
    pub fn add_routed_pod(&mut self, name: &str) -> Pod {
        let host = self.next_host[0];
        self.next_host[0] += 1;
        let ns = format!("{}-{}", self.id, name);
        self.guards.push(NsGuard::new(ns.clone()));
        let v4 = Ipv4Addr::new(10, 244, 1, host);
        let v6 = Ipv6Addr::new(0xfd44, 1, 0, 0, 0, 0, 0, host as u16);
        let host_if = format!("{}{}", self.veth_prefix, host);
        let node = self.node.clone();
        ipn(
            &ns,
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", &host_if, "netns", &node,
            ],
        );
        ipn(&node, &["addr", "add", "10.244.1.1/32", "dev", &host_if]);
        ipn(
            &node,
            &["addr", "add", "fd44:1::1/128", "dev", &host_if, "nodad"],
        );
        ipn(&node, &["link", "set", &host_if, "up"]);
        ipn(
            &node,
            &["route", "replace", &format!("{v4}/32"), "dev", &host_if],
        );
        ipn(
            &node,
            &[
                "-6",
                "route",
                "replace",
                &format!("{v6}/128"),
                "dev",
                &host_if,
            ],
        );
        ipn(&ns, &["addr", "add", &format!("{v4}/32"), "dev", "eth0"]);
        ipn(
            &ns,
            &["addr", "add", &format!("{v6}/128"), "dev", "eth0", "nodad"],
        );
        ipn(&ns, &["link", "set", "eth0", "up"]);
        ipn(
            &ns,
            &[
                "route",
                "add",
                "default",
                "via",
                "10.244.1.1",
                "dev",
                "eth0",
                "onlink",
            ],
        );
        ipn(
            &ns,
            &[
                "-6",
                "route",
                "add",
                "default",
                "via",
                "fd44:1::1",
                "dev",
                "eth0",
                "onlink",
            ],
        );
        let pod = Pod {
            name: name.to_string(),
            ns,
            v4,
            v6,
            at: Where::Local,
            host_if,
        };
        self.start_servers(&pod);
        self.pods.push(pod.clone());
        pod
    }

    /// Addresses of node-a (LAN and pod bridge) for one family: what a
    /// masqueraded connection may show as its source.
    pub fn node_addrs(v6: bool) -> [IpAddr; 2] {
        if v6 {
            [NODE_V6.into(), NODE_BR_V6.into()]
        } else {
            [NODE_V4.into(), NODE_BR_V4.into()]
        }
    }

    pub fn pod(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .expect("no such pod")
    }

    fn start_servers(&mut self, pod: &Pod) {
        let mut ready = Vec::new();
        for port in PORTS {
            ready.push(self.spawn_server(pod, Server::Tcp, port));
            ready.push(self.spawn_server(pod, Server::Udp, port));
            if self.sctp {
                ready.push(self.spawn_server(pod, Server::Sctp, port));
            }
        }
        ready.push(self.spawn_server(pod, Server::Echo, ECHO_PORT));
        for r in ready {
            r.recv_timeout(Duration::from_secs(5))
                .expect("server did not start")
                .unwrap_or_else(|e| panic!("server in {}: {e}", pod.name));
        }
    }

    fn spawn_server(
        &mut self,
        pod: &Pod,
        kind: Server,
        port: u16,
    ) -> std::sync::mpsc::Receiver<Result<(), String>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = self.stop.clone();
        let ns = pod.ns.clone();
        let name = pod.name.clone();
        let h = thread::spawn(move || {
            if let Err(e) = enter_ns(&ns) {
                let _ = tx.send(Err(format!("setns: {e}")));
                return;
            }
            match kind {
                Server::Tcp | Server::Echo | Server::Sctp => {
                    let l = match kind {
                        Server::Sctp => listen_raw(port, libc::IPPROTO_SCTP),
                        _ => listen_raw(port, libc::IPPROTO_TCP),
                    };
                    let l = match l {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = tx.send(Err(format!("{kind:?} listen {port}: {e}")));
                            return;
                        }
                    };
                    l.set_nonblocking(true).unwrap();
                    let _ = tx.send(Ok(()));
                    let mut conns: Vec<JoinHandle<()>> = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        match l.accept() {
                            Ok((s, peer)) => {
                                let _ = s.set_nonblocking(false);
                                let msg = format!("{name} {}\n", peer.ip().to_canonical());
                                if kind == Server::Echo {
                                    let stop = stop.clone();
                                    conns.push(thread::spawn(move || echo_conn(s, msg, stop)));
                                } else {
                                    let mut s = s;
                                    let _ = s.write_all(msg.as_bytes());
                                    let _ = s.flush();
                                    drop(s);
                                }
                            }
                            // Wait for the next connection, or 10 ms to look
                            // at the stop flag: a connection is accepted at once,
                            // not at the next tick.
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                wait_readable(&l, Duration::from_millis(10))
                            }
                            Err(_) => thread::sleep(Duration::from_millis(10)),
                        }
                    }
                    for c in conns {
                        let _ = c.join();
                    }
                }
                Server::Udp => {
                    let s = match bind_udp(port) {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = tx.send(Err(format!("udp bind {port}: {e}")));
                            return;
                        }
                    };
                    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                    let _ = tx.send(Ok(()));
                    let mut buf = [0u8; 2048];
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok((_, peer)) = s.recv_from(&mut buf) {
                            let msg = format!("{name} {}\n", peer.ip().to_canonical());
                            let _ = s.send_to(msg.as_bytes(), peer);
                        }
                    }
                }
            }
        });
        self.servers.push(h);
        rx
    }

    /// Addresses of the pods, for endpoint slices.
    pub fn eps(&self, names: &[&str], v6: bool) -> Vec<Ep> {
        names
            .iter()
            .map(|n| {
                let p = self.pod(n);
                Ep {
                    ip: p.ip(v6).to_string(),
                    node: p.node_name().to_string(),
                    ready: true,
                }
            })
            .collect()
    }
}

impl Default for Topo {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.servers.drain(..) {
            let _ = h.join();
        }
        // Pods first, then the infrastructure namespaces.
        while let Some(g) = self.guards.pop() {
            drop(g);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    Tcp,
    Udp,
    Sctp,
    Echo,
}

fn echo_conn(s: TcpStream, greeting: String, stop: Arc<AtomicBool>) {
    let mut w = match s.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    if w.write_all(greeting.as_bytes()).is_err() {
        return;
    }
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        match r.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                if line.ends_with('\n') {
                    if w.write_all(line.as_bytes()).is_err() {
                        return;
                    }
                    line.clear();
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn sockaddr6(ip: Ipv6Addr, port: u16) -> libc::sockaddr_in6 {
    let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    sa.sin6_port = port.to_be();
    sa.sin6_addr.s6_addr = ip.octets();
    sa
}

/// Dual-stack `[::]:port` stream listener (IPV6_V6ONLY off) for TCP or
/// SCTP (one-to-one style). IPv4 peers appear as v4-mapped and are
/// canonicalised when replying.
fn listen_raw(port: u16, proto: libc::c_int) -> io::Result<TcpListener> {
    unsafe {
        let fd = cvt(libc::socket(
            libc::AF_INET6,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            proto,
        ))?;
        let l = TcpListener::from_raw_fd(fd);
        let one: libc::c_int = 1;
        let zero: libc::c_int = 0;
        let sz = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        cvt(libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &one as *const _ as _,
            sz,
        ))?;
        cvt(libc::setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            &zero as *const _ as _,
            sz,
        ))?;
        let sa = sockaddr6(Ipv6Addr::UNSPECIFIED, port);
        cvt(libc::bind(
            fd,
            &sa as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        ))?;
        cvt(libc::listen(fd, 128))?;
        Ok(l)
    }
}

fn bind_udp(port: u16) -> io::Result<UdpSocket> {
    unsafe {
        let fd = cvt(libc::socket(
            libc::AF_INET6,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let s = UdpSocket::from_raw_fd(fd);
        let zero: libc::c_int = 0;
        let sz = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        cvt(libc::setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            &zero as *const _ as _,
            sz,
        ))?;
        let sa = sockaddr6(Ipv6Addr::UNSPECIFIED, port);
        cvt(libc::bind(
            fd,
            &sa as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        ))?;
        Ok(s)
    }
}

// ---------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnErr {
    /// ECONNREFUSED (TCP RST or ICMP port unreachable / reject).
    Refused,
    /// No answer within the timeout (dropped).
    Timeout,
    /// EHOSTUNREACH / ENETUNREACH / admin prohibited.
    Unreachable,
    /// Anything else.
    Other(String),
}

impl fmt::Display for ConnErr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

fn classify(e: &io::Error) -> ConnErr {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => ConnErr::Refused,
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ConnErr::Timeout,
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => ConnErr::Unreachable,
        _ => match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => ConnErr::Refused,
            Some(libc::ETIMEDOUT) | Some(libc::EAGAIN) | Some(libc::EINPROGRESS) => {
                ConnErr::Timeout
            }
            Some(libc::EHOSTUNREACH)
            | Some(libc::ENETUNREACH)
            | Some(libc::EACCES)
            | Some(libc::EPERM) => ConnErr::Unreachable,
            _ => ConnErr::Other(e.to_string()),
        },
    }
}

/// A server's answer: which pod answered and the peer address it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub pod: String,
    pub src: IpAddr,
}

impl Reply {
    fn parse(s: &str) -> Result<Reply, ConnErr> {
        let mut it = s.split_whitespace();
        match (it.next(), it.next().and_then(|a| a.parse().ok())) {
            (Some(p), Some(src)) => Ok(Reply {
                pod: p.to_string(),
                src,
            }),
            _ => Err(ConnErr::Other(format!("bad reply {s:?}"))),
        }
    }
}

pub type Res = Result<Reply, ConnErr>;

/// Transport protocol for [`request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

/// One request of `proto` from namespace `ns` to `dst`.
pub fn request(ns: &str, proto: Proto, dst: SocketAddr, timeout: Duration) -> Res {
    match proto {
        Proto::Tcp => tcp(ns, dst, timeout),
        Proto::Udp => udp(ns, dst, None, timeout),
        Proto::Sctp => sctp(ns, dst, timeout),
    }
}

/// TCP connect + read one line, from inside namespace `ns`.
pub fn tcp(ns: &str, dst: SocketAddr, timeout: Duration) -> Res {
    in_ns(ns, move || {
        let mut s = TcpStream::connect_timeout(&dst, timeout).map_err(|e| classify(&e))?;
        s.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).map_err(|e| classify(&e))?;
        Reply::parse(&buf)
    })
}

/// Requests a TCP service from a namespace every ~100 ms until stopped.
pub struct Prober {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<(Duration, Res)>>>,
}

impl Prober {
    pub fn start(ns: &str, dst: SocketAddr) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let ns = ns.to_string();
        let handle = thread::spawn(move || {
            let start = Instant::now();
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                out.push((start.elapsed(), tcp(&ns, dst, OK_TIMEOUT)));
                if let Some(rest) = Duration::from_millis(100).checked_sub(t.elapsed()) {
                    thread::sleep(rest);
                }
            }
            out
        });
        Prober {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops and checks that every request was answered by `pod` seeing `src`;
    /// returns how many requests were made.
    #[track_caller]
    pub fn finish(mut self, what: &str, pod: &str, src: IpAddr) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let results = self.handle.take().unwrap().join().expect("prober panicked");
        let bad: Vec<String> = results
            .iter()
            .filter(|(_, r)| !matches!(r, Ok(rep) if rep.pod == pod && rep.src == src))
            .map(|(at, r)| format!("at {at:?}: {r:?}"))
            .collect();
        assert!(
            bad.is_empty(),
            "{what}: {} of {} requests not answered by {pod} seeing {src}:\n  {}",
            bad.len(),
            results.len(),
            bad.join("\n  ")
        );
        results.len()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Opens a TCP connection from `ns` and returns the stream (used for the
/// echo server); the socket stays in `ns` after the thread exits.
pub fn tcp_stream(ns: &str, dst: SocketAddr, timeout: Duration) -> Result<TcpStream, ConnErr> {
    in_ns(ns, move || {
        let s = TcpStream::connect_timeout(&dst, timeout).map_err(|e| classify(&e))?;
        s.set_read_timeout(Some(timeout)).unwrap();
        Ok(s)
    })
}

/// Sends one line on an echo connection and reads it back.
pub fn echo_roundtrip(s: &mut TcpStream, line: &str) -> io::Result<String> {
    s.write_all(format!("{line}\n").as_bytes())?;
    read_line(s)
}

/// Reads one `\n`-terminated line byte by byte (no buffering past it).
pub fn read_line(s: &mut TcpStream) -> io::Result<String> {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    loop {
        let n = s.read(&mut b)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "eof"));
        }
        if b[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&out).into_owned());
        }
        out.push(b[0]);
    }
}

/// UDP request from `ns` (optionally bound to `src_port`); the socket is
/// connected so ICMP errors surface as [`ConnErr::Refused`].
pub fn udp(ns: &str, dst: SocketAddr, src_port: Option<u16>, timeout: Duration) -> Res {
    in_ns(ns, move || {
        let bind: SocketAddr = if dst.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, src_port.unwrap_or(0)).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, src_port.unwrap_or(0)).into()
        };
        let s = UdpSocket::bind(bind).map_err(|e| ConnErr::Other(format!("bind: {e}")))?;
        s.connect(dst).map_err(|e| classify(&e))?;
        s.set_read_timeout(Some(timeout)).unwrap();
        s.send(b"hello\n").map_err(|e| classify(&e))?;
        let mut buf = [0u8; 512];
        let n = s.recv(&mut buf).map_err(|e| classify(&e))?;
        Reply::parse(&String::from_utf8_lossy(&buf[..n]))
    })
}

/// SCTP (one-to-one) request from `ns`.
pub fn sctp(ns: &str, dst: SocketAddr, timeout: Duration) -> Res {
    in_ns(ns, move || {
        let fam = if dst.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let fd = unsafe {
            libc::socket(
                fam,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                libc::IPPROTO_SCTP,
            )
        };
        if fd < 0 {
            return Err(classify(&io::Error::last_os_error()));
        }
        // SCTP treats ICMP errors during INIT as soft unless RECVERR is on (kernel
        // 6.1 then keeps retrying INIT); with it a reject is ECONNREFUSED, as for TCP.
        let on: libc::c_int = 1;
        let (level, opt) = if dst.is_ipv4() {
            (libc::SOL_IP, libc::IP_RECVERR)
        } else {
            (libc::SOL_IPV6, libc::IPV6_RECVERR)
        };
        unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                &on as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        let mut s = unsafe { TcpStream::from_raw_fd(fd) };
        s.set_nonblocking(true).unwrap();
        let rc = unsafe {
            match dst {
                SocketAddr::V4(a) => {
                    let mut sa: libc::sockaddr_in = std::mem::zeroed();
                    sa.sin_family = libc::AF_INET as libc::sa_family_t;
                    sa.sin_port = a.port().to_be();
                    sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                    libc::connect(
                        fd,
                        &sa as *const _ as *const libc::sockaddr,
                        std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                    )
                }
                SocketAddr::V6(a) => {
                    let sa = sockaddr6(*a.ip(), a.port());
                    libc::connect(
                        fd,
                        &sa as *const _ as *const libc::sockaddr,
                        std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                    )
                }
            }
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(classify(&e));
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
            if n == 0 {
                return Err(ConnErr::Timeout);
            }
            let mut err: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    &mut err as *mut _ as _,
                    &mut len,
                )
            };
            if err != 0 {
                return Err(classify(&io::Error::from_raw_os_error(err)));
            }
        }
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).map_err(|e| classify(&e))?;
        Reply::parse(&buf)
    })
}

/// Polls `f` until it returns true or `timeout` passes.
/// Blocks until `fd` is readable (a listener: a connection waits) or `timeout`.
pub fn wait_readable(fd: &impl std::os::fd::AsRawFd, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
}

pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

pub fn sa(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|_| panic!("bad ip {s}"))
}

// ---------------------------------------------------------------------------
// Proxy runner
// ---------------------------------------------------------------------------

/// Runs kube-nlproxy inside the node namespace against a manifest directory.
pub struct Proxy {
    pub bin: PathBuf,
    pub ns: String,
    pub dir: PathBuf,
    pub args: Vec<String>,
    /// Source flags replacing `--source file:DIR` (see [`Proxy::with_kube_source`]).
    source: Option<Vec<String>>,
    child: Option<Child>,
    log: PathBuf,
}

impl Proxy {
    /// Default flags: hostname node-a, node IPs, cluster CIDRs, detect-local
    /// ClusterCIDR, fast sync periods.
    pub fn new(topo: &Topo, bin: impl AsRef<Path>) -> Proxy {
        let dir = std::env::temp_dir().join(unique("knp-manifests"));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.with_extension("log");
        Proxy {
            bin: bin.as_ref().to_path_buf(),
            ns: topo.node.clone(),
            args: default_args(),
            source: None,
            dir,
            child: None,
            log,
        }
    }

    /// Replaces an argument list (everything after `--source ... --hostname-override`).
    pub fn with_args(mut self, args: &[&str]) -> Proxy {
        self.args = args.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Writes the manifests (atomically: temp file + rename).
    pub fn write(&self, yaml: &str) {
        let tmp = self.dir.with_extension("tmp.yaml");
        fs::write(&tmp, yaml).unwrap();
        fs::rename(&tmp, self.dir.join("cluster.yaml")).unwrap();
    }

    /// Reads objects from an API server (`--source kube --kubeconfig FILE`)
    /// instead of the manifest directory.
    pub fn with_kube_source(mut self, kubeconfig: &Path) -> Proxy {
        self.source = Some(vec![
            "--source".to_string(),
            "kube".to_string(),
            "--kubeconfig".to_string(),
            kubeconfig.display().to_string(),
        ]);
        self
    }

    fn base_args(&self) -> Vec<String> {
        let mut v = self.source.clone().unwrap_or_else(|| {
            vec![
                "--source".to_string(),
                format!("file:{}", self.dir.display()),
            ]
        });
        v.extend(["--hostname-override".to_string(), NODE.to_string()]);
        v.extend(self.args.iter().cloned());
        v
    }

    fn cmd(&self, sub: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]).arg(&self.bin).args(sub);
        c
    }

    /// `run --once`; returns the output (status + stderr).
    pub fn once(&self) -> Output {
        let mut c = self.cmd(&["run"]);
        c.args(self.base_args()).arg("--once");
        c.output().expect("spawn kube-nlproxy")
    }

    /// `run --once` with `RUST_LOG=filter`; returns the output.
    pub fn once_logging(&self, filter: &str) -> Output {
        let mut c = self.cmd(&["run"]);
        c.args(self.base_args())
            .arg("--once")
            .env("RUST_LOG", filter);
        c.output().expect("spawn kube-nlproxy")
    }

    /// `run --once`, panicking with stderr when it fails.
    pub fn sync(&self) {
        let out = self.once();
        assert!(
            out.status.success(),
            "kube-nlproxy --once failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `kube-nlproxy SUB` in the node namespace with the proxy's source and
    /// flags, then `extra` (`plan`, `explain IP:PORT`, `status`).
    pub fn command(&self, sub: &[&str], extra: &[&str]) -> Output {
        let mut c = self.cmd(sub);
        c.args(self.base_args()).args(extra);
        c.output().expect("spawn kube-nlproxy")
    }

    /// `kube-nlproxy SUB` with only `extra` as flags (no source: kernel only).
    /// `explain TARGET --output json [--from FROM]`: against the desired state
    /// too (`source`), or the kernel alone with the daemon's flags.
    pub fn explain_json(&self, target: &str, from: Option<&str>, source: bool) -> Output {
        let mut extra: Vec<&str> = vec![target, "--output", "json"];
        if let Some(f) = from {
            extra.extend(["--from", f]);
        }
        if source {
            self.command(&["explain"], &extra)
        } else {
            extra.extend(self.args.iter().map(String::as_str));
            self.command_bare(&["explain"], &extra)
        }
    }

    pub fn command_bare(&self, sub: &[&str], extra: &[&str]) -> Output {
        let mut c = self.cmd(sub);
        c.args(extra);
        c.output().expect("spawn kube-nlproxy")
    }

    /// `kube-nlproxy cleanup`.
    pub fn cleanup(&self) -> Output {
        self.cmd(&["cleanup"])
            .output()
            .expect("spawn kube-nlproxy cleanup")
    }

    /// Spawns `run` (no `--once`); killed on drop or [`Proxy::stop`].
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = fs::File::create(&self.log).unwrap();
        let mut c = self.cmd(&["run"]);
        c.args(self.base_args())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        self.child = Some(c.spawn().expect("spawn kube-nlproxy run"));
    }

    /// Spawns `run` like [`Proxy::start`], with `wrapper` (e.g. `setpriv ...` or
    /// `strace ...`) between `ip netns exec NS` and the binary.
    pub fn start_wrapped(&mut self, wrapper: &[&str]) {
        assert!(self.child.is_none(), "already running");
        let log = fs::File::create(&self.log).unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns])
            .args(wrapper)
            .arg(&self.bin)
            .arg("run")
            .args(self.base_args())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        self.child = Some(c.spawn().expect("spawn kube-nlproxy run"));
    }

    /// The pid of the running process (`ip netns exec` and an exec'ing wrapper
    /// keep it).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Kills the running process (SIGTERM, then SIGKILL after 3 s).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // The child is `ip netns exec`, which execs the binary: same pid.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(3) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills the running process with SIGKILL: no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// True while the spawned process is alive.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Log (stderr) of the run-mode process.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `nft list table ip kube-nlproxy` in the node namespace (oracle).
    pub fn table(&self) -> Option<String> {
        nft_table(&self.ns, "ip", "kube-nlproxy")
    }

    pub fn table6(&self) -> Option<String> {
        nft_table(&self.ns, "ip6", "kube-nlproxy")
    }

    /// Waits until the ip table differs from `prev` (bounded).
    pub fn wait_table_change(&self, prev: &Option<String>, timeout: Duration) -> bool {
        eventually(timeout, || &self.table() != prev)
    }

    /// Waits until the ip table satisfies `f` (bounded).
    pub fn wait_table(&self, timeout: Duration, f: impl Fn(&str) -> bool) -> bool {
        eventually(timeout, || self.table().is_some_and(|t| f(&t)))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
        let _ = fs::remove_file(&self.log);
    }
}

pub fn default_args() -> Vec<String> {
    [
        "--node-ip",
        "10.77.0.1,fd77::1",
        "--cluster-cidr",
        "10.244.0.0/16,fd44::/16",
        "--detect-local-mode",
        "ClusterCIDR",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

// ---------------------------------------------------------------------------
// YAML builders
// ---------------------------------------------------------------------------

/// A service port.
#[derive(Debug, Clone)]
pub struct SPort {
    pub name: String,
    pub proto: &'static str,
    pub port: u16,
    pub target: u16,
    pub node_port: Option<u16>,
}

pub fn port(name: &str, proto: &'static str, port: u16, target: u16) -> SPort {
    SPort {
        name: name.into(),
        proto,
        port,
        target,
        node_port: None,
    }
}

pub fn nport(name: &str, proto: &'static str, p: u16, target: u16, node_port: u16) -> SPort {
    SPort {
        node_port: Some(node_port),
        ..port(name, proto, p, target)
    }
}

/// A v1 Service.
#[derive(Debug, Clone, Default)]
pub struct Svc {
    pub name: String,
    pub namespace: String,
    /// ClusterIP / NodePort / LoadBalancer
    pub kind: String,
    pub cluster_ips: Vec<String>,
    pub ports: Vec<SPort>,
    pub external_ips: Vec<String>,
    pub lb_ips: Vec<String>,
    pub lb_source_ranges: Vec<String>,
    /// "Local" or "" (Cluster)
    pub etp: String,
    pub itp: String,
    pub affinity: bool,
}

impl Svc {
    pub fn new(name: &str, kind: &str, cluster_ips: &[&str], ports: Vec<SPort>) -> Svc {
        Svc {
            name: name.into(),
            namespace: "default".into(),
            kind: kind.into(),
            cluster_ips: cluster_ips.iter().map(|s| s.to_string()).collect(),
            ports,
            ..Default::default()
        }
    }

    pub fn yaml(&self) -> String {
        let mut y = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {}\n  namespace: {}\nspec:\n  type: {}\n",
            self.name, self.namespace, self.kind
        );
        if let Some(first) = self.cluster_ips.first() {
            y += &format!("  clusterIP: {first}\n  clusterIPs:\n");
            for c in &self.cluster_ips {
                y += &format!("  - {c}\n");
            }
            let fams: Vec<&str> = self
                .cluster_ips
                .iter()
                .map(|c| if c.contains(':') { "IPv6" } else { "IPv4" })
                .collect();
            y += "  ipFamilies:\n";
            for f in &fams {
                y += &format!("  - {f}\n");
            }
            y += &format!(
                "  ipFamilyPolicy: {}\n",
                if fams.len() > 1 {
                    "RequireDualStack"
                } else {
                    "SingleStack"
                }
            );
        }
        y += "  ports:\n";
        for p in &self.ports {
            y += &format!(
                "  - name: {}\n    protocol: {}\n    port: {}\n    targetPort: {}\n",
                p.name, p.proto, p.port, p.target
            );
            if let Some(np) = p.node_port {
                y += &format!("    nodePort: {np}\n");
            }
        }
        if !self.external_ips.is_empty() {
            y += "  externalIPs:\n";
            for e in &self.external_ips {
                y += &format!("  - {e}\n");
            }
        }
        if !self.lb_source_ranges.is_empty() {
            y += "  loadBalancerSourceRanges:\n";
            for e in &self.lb_source_ranges {
                y += &format!("  - {e}\n");
            }
        }
        if !self.etp.is_empty() {
            y += &format!("  externalTrafficPolicy: {}\n", self.etp);
        }
        if !self.itp.is_empty() {
            y += &format!("  internalTrafficPolicy: {}\n", self.itp);
        }
        if self.affinity {
            y += "  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: 10800\n";
        }
        if !self.lb_ips.is_empty() {
            y += "status:\n  loadBalancer:\n    ingress:\n";
            for e in &self.lb_ips {
                y += &format!("    - ip: {e}\n");
            }
        }
        y
    }
}

/// An endpoint of a slice.
#[derive(Debug, Clone)]
pub struct Ep {
    pub ip: String,
    pub node: String,
    pub ready: bool,
}

/// A discovery.k8s.io/v1 EndpointSlice for `svc` with ports `(name, proto, port)`.
pub fn slice(svc: &str, suffix: &str, v6: bool, ports: &[(&str, &str, u16)], eps: &[Ep]) -> String {
    let mut y = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-{suffix}\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {svc}\naddressType: {}\nports:\n",
        if v6 { "IPv6" } else { "IPv4" }
    );
    for (n, pr, p) in ports {
        y += &format!("- name: {n}\n  protocol: {pr}\n  port: {p}\n");
    }
    if eps.is_empty() {
        y += "endpoints: []\n";
    } else {
        y += "endpoints:\n";
        for e in eps {
            y += &format!(
                "- addresses:\n  - {}\n  conditions:\n    ready: {}\n    serving: {}\n    terminating: false\n  nodeName: {}\n",
                e.ip, e.ready, e.ready, e.node
            );
        }
    }
    y
}

/// The two v1 Nodes (node-a, node-b) with InternalIPs and podCIDRs.
pub fn nodes() -> String {
    let mut y = String::new();
    for (n, a4, a6, c4, c6) in [
        (NODE, "10.77.0.1", "fd77::1", "10.244.1.0/24", "fd44:1::/64"),
        (
            REMOTE,
            "10.77.0.2",
            "fd77::2",
            "10.244.2.0/24",
            "fd44:2::/64",
        ),
    ] {
        y += &format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}\nspec:\n  podCIDR: {c4}\n  podCIDRs:\n  - {c4}\n  - {c6}\nstatus:\n  addresses:\n  - type: InternalIP\n    address: {a4}\n  - type: InternalIP\n    address: {a6}\n  - type: Hostname\n    address: {n}\n---\n"
        );
    }
    y
}

/// The default networking.k8s.io/v1 ServiceCIDR (10.96.0.0/16, fd96::/112).
pub fn service_cidr() -> String {
    "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata:\n  name: kubernetes\nspec:\n  cidrs:\n  - 10.96.0.0/16\n  - fd96::/112\n".to_string()
}

/// Joins documents into one multi-document YAML stream.
pub fn docs(parts: &[String]) -> String {
    parts
        .iter()
        .map(|p| p.trim_end_matches("---\n").trim_end())
        .collect::<Vec<_>>()
        .join("\n---\n")
        + "\n"
}

/// Nodes + ServiceCIDR + the given objects.
pub fn cluster(objs: &[String]) -> String {
    let mut v = vec![nodes(), service_cidr()];
    v.extend(objs.iter().cloned());
    docs(&v)
}

/// Makes `n` TCP requests; returns (backends seen, sources seen) or the
/// first error.
pub fn spread(
    ns: &str,
    dst: SocketAddr,
    n: usize,
) -> Result<
    (
        std::collections::BTreeSet<String>,
        std::collections::BTreeSet<IpAddr>,
    ),
    ConnErr,
> {
    let mut pods = std::collections::BTreeSet::new();
    let mut srcs = std::collections::BTreeSet::new();
    for _ in 0..n {
        let r = tcp(ns, dst, OK_TIMEOUT)?;
        pods.insert(r.pod);
        srcs.insert(r.src);
    }
    Ok((pods, srcs))
}

/// Upper bound for a "fast" reject. On the test kernel (6.18) an ICMPv6
/// port-unreachable generated by nf_tables in the forward path takes ~1 s to
/// fail a TCP connect (the SYN retransmit gets it) — reproduced with a
/// hand-written `nft ... reject` rule, so it is not the proxy's doing. IPv4
/// is checked against 1 s, IPv6 against 1.5 s.
pub fn fast(v6: bool) -> Duration {
    if v6 {
        Duration::from_millis(1500)
    } else {
        Duration::from_secs(1)
    }
}

/// Asserts a request fails with `want` within `max` (for fast rejects).
#[track_caller]
pub fn expect_fast_err(what: &str, f: impl FnOnce() -> Res, want: ConnErr, max: Duration) {
    let start = Instant::now();
    let r = f();
    let took = start.elapsed();
    expect_err(what, r, want);
    assert!(took < max, "{what}: took {took:?} (> {max:?})");
}

/// Asserts a request result is a reply from one of `pods`, returning it.
#[track_caller]
pub fn expect_ok(what: &str, r: Res, pods: &[&str]) -> Reply {
    match r {
        Ok(rep) => {
            assert!(
                pods.contains(&rep.pod.as_str()),
                "{what}: answered by {} not in {pods:?}",
                rep.pod
            );
            rep
        }
        Err(e) => panic!("{what}: expected a reply from {pods:?}, got {e:?}"),
    }
}

/// Asserts a request failed with `want`.
#[track_caller]
pub fn expect_err(what: &str, r: Res, want: ConnErr) {
    match r {
        Ok(rep) => panic!("{what}: expected {want:?}, got reply {rep:?}"),
        Err(e) => assert_eq!(e, want, "{what}: wrong failure"),
    }
}

/// Runs named scenario checks, collecting failures instead of stopping at
/// the first one; [`Checks::finish`] panics with the list.
#[derive(Default)]
pub struct Checks {
    failures: Vec<String>,
    passed: Vec<String>,
}

impl Checks {
    pub fn run(&mut self, name: &str, f: impl FnOnce()) {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(()) => {
                eprintln!("PASS {name}");
                self.passed.push(name.to_string());
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                eprintln!("FAIL {name}: {msg}");
                self.failures.push(format!("{name}: {msg}"));
            }
        }
    }

    pub fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} scenario(s) failed ({} passed):\n  {}",
            self.failures.len(),
            self.passed.len(),
            self.failures.join("\n  ")
        );
    }
}

/// A plain HTTP/1.1 GET from inside `ns`: (status code, body).
pub fn http_get(ns: &str, addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let path = path.to_string();
    in_ns(ns, move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map_err(|e| format!("connect {addr}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut out = String::new();
        s.read_to_string(&mut out).map_err(|e| e.to_string())?;
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("bad response {out:?}"))?;
        let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        Ok((code, body))
    })
}

/// Manifests of one ClusterIP Service `web` at `vip`, port 80 (`http`) to 8080
/// on `backend`.
pub fn web_service(t: &Topo, vip: &str, backend: &str) -> String {
    cluster(&[
        Svc::new(
            "web",
            "ClusterIP",
            &[vip],
            vec![port("http", "TCP", 80, 8080)],
        )
        .yaml(),
        slice(
            "web",
            "v4",
            false,
            &[("http", "TCP", 8080)],
            &t.eps(&[backend], false),
        ),
    ])
}

/// A command's stdout as JSON (the panic shows both streams).
pub fn output_json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A command's stdout and stderr, as text.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A `/proc/PID/status` field in kB (`VmHWM`, `VmRSS`); 0 when unreadable.
pub fn status_kb(pid: u32, field: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
