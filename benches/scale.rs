//! Scale benchmark: N ClusterIP services × E endpoints (E = 2 unless told).
//!
//! For each N, in private network namespaces (one per measurement, so the tables of
//! one never tax the commits of another), it measures:
//!
//! 1. our full sync from the objects in memory: `NftablesRenderer::update` +
//!    `Syncer::sync_incremental` (the first sync: read-back + full diff + one
//!    netlink batch), with the batch's messages, bytes and kernel share;
//! 2. one change at a time through `update_changed` + `sync_incremental`: add a
//!    service, change one endpoint, delete a service, nothing (median of `--reps`,
//!    alternating so the state returns), with messages, bytes, kernel share and
//!    the service ports re-rendered (must be 1, 0 for the no-op);
//! 3. the longest single kernel commit (the batch's `sendmsg`) of the full sync;
//! 4. the bench process's peak RSS (VmHWM) after the full sync (one child process
//!    per N, so each N starts from a fresh process);
//! 5. baselines: upstream kube-proxy's nftables layout for the same state via
//!    `nft -f` (full load with a timeout, one-service change, `nft --json list
//!    table`), and an equivalent iptables-mode ruleset via
//!    `iptables-legacy-restore` (full load, one-service `--noflush` change) when
//!    that binary exists;
//! 6. the commit tax on another program's table: one element added to a one-set
//!    table in an empty netns, beside our N services and beside upstream's layout;
//! 7. first-packet TCP connect latency to a ClusterIP with 10 services and with N
//!    services (DNAT in the nat output hook to listeners in the same netns).
//!
//! "Kernel" is `NftSocket::last_apply_stats().kernel`: from the batch's `sendmsg`
//! until the reply fencing its last ack; nfnetlink validates and commits inside
//! that `sendmsg`. For the exec baselines it is the child's system time.
//!
//! Usage (root):
//!   cargo bench --bench scale -- [N | NxE]... [--endpoints E] [--reps R]
//!       [--connects C] [--nft-timeout SECS] [--write-docs] [--json FILE]
//!   cargo bench --bench scale -- --from-json FILE [--write-docs]
//! `--endpoints E` sets E for every plain N; `NxE` names both (`5000x50`).
//! Default: `1000`. `--write-docs` writes docs/benchmarks.png and the results
//! section of docs/benchmarks.md; `--json FILE` saves the raw results and
//! `--from-json FILE` re-prints (or re-writes the docs from) them without measuring.
//! Without these options nothing outside the terminal is written.
//! No timing assertions: a run fails only when a correctness check fails (re-render
//! counts, the kernel not matching the desired state, a baseline tool failing).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube_nlproxy::mode::nftables::{
    LocalDetector, NftablesOptions, NftablesRenderer, NodePortAddresses,
};
use kube_nlproxy::model::{
    ClusterState, Endpoint, IpFamily, NodeInfo, Protocol, ServicePort, ServicePortName,
};
use kube_nlproxy::sync::{Dataplane, NetlinkDataplane, SyncError, Syncer, TableSnapshot};
use kube_nlproxy_netlink::nft::{Element, Family, KeyType, KeyValue, NftSocket, Op, Set};
use serde::{Deserialize, Serialize};

const RESULT_TAG: &str = "@@scale-result ";
const DOCS_BEGIN: &str = "<!-- scale-bench:begin -->";
const DOCS_END: &str = "<!-- scale-bench:end -->";
/// ClusterIP of the connect-latency probe service (outside the bench's ranges).
const PROBE_VIP: Ipv4Addr = Ipv4Addr::new(10, 110, 0, 1);
/// Listener addresses of the probe service's endpoints (on veth1).
const PROBE_EPS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 253, 0, 1), Ipv4Addr::new(10, 253, 0, 2)];
/// The client's address (on veth0, inside the pod CIDR so it is not masqueraded).
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 254, 0, 1);
/// Replacement address for the changed endpoint.
const ALT_EP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);

// ---------------------------------------------------------------------------------
// Options

#[derive(Debug, Clone)]
struct Args {
    scales: Vec<(usize, usize)>,
    reps: usize,
    connects: usize,
    nft_timeout: Duration,
    write_docs: bool,
    /// `--ours-only`: skip the exec baselines (a quick look at our own figures).
    ours_only: bool,
    json_out: Option<String>,
    json_in: Option<String>,
    child: Option<(usize, usize)>,
    command_line: String,
}

fn parse_scale(s: &str, default_e: usize) -> Option<(usize, usize)> {
    let (n, e) = match s.split_once(['x', 'X', '×']) {
        Some((n, e)) => (n, Some(e)),
        None => (s, None),
    };
    let n = n.replace('_', "").parse().ok()?;
    let e = match e {
        Some(e) => e.parse().ok()?,
        None => default_e,
    };
    (n > 0 && e > 0).then_some((n, e))
}

fn parse_args() -> Args {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let mut endpoints = 2;
    let mut scales = Vec::new();
    let mut args = Args {
        scales: Vec::new(),
        reps: 20,
        connects: 300,
        nft_timeout: Duration::from_secs(300),
        write_docs: false,
        ours_only: false,
        json_out: None,
        json_in: None,
        child: None,
        command_line: String::new(),
    };
    let mut shown = Vec::new();
    let mut it = raw.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| -> String {
            let v = it
                .next()
                .unwrap_or_else(|| panic!("{what} needs a value"))
                .clone();
            shown.push(format!("{what} {v}"));
            v
        };
        match a.as_str() {
            "--endpoints" => endpoints = value("--endpoints").parse().expect("--endpoints E"),
            "--reps" => args.reps = value("--reps").parse().expect("--reps R"),
            "--connects" => args.connects = value("--connects").parse().expect("--connects C"),
            "--nft-timeout" => {
                args.nft_timeout =
                    Duration::from_secs(value("--nft-timeout").parse().expect("--nft-timeout S"))
            }
            "--child" => {
                let v = it.next().expect("--child NxE");
                args.child = Some(parse_scale(v, 2).expect("--child NxE"));
            }
            "--write-docs" => {
                args.write_docs = true;
                shown.push(a.clone());
            }
            "--json" => args.json_out = Some(value("--json")),
            "--ours-only" => args.ours_only = true,
            "--from-json" => args.json_in = Some(value("--from-json")),
            // Passed by `cargo bench`.
            "--bench" => {}
            s if s.starts_with('-') => eprintln!("scale: ignoring unknown option {s}"),
            s if s.contains(['x', 'X', '×']) => {
                scales.push(parse_scale(s, 2).unwrap_or_else(|| panic!("bad scale {s}")));
                shown.push(s.to_string());
            }
            s => {
                let n = s
                    .replace('_', "")
                    .parse::<usize>()
                    .unwrap_or_else(|_| panic!("bad N {s}"));
                // E is filled in once every `--endpoints` has been read.
                scales.push((n, 0));
                shown.push(s.to_string());
            }
        }
    }
    args.reps = args.reps.max(1);
    args.connects = args.connects.max(1);
    let mut all: Vec<(usize, usize)> = scales
        .into_iter()
        .map(|(n, e)| (n, if e == 0 { endpoints } else { e }))
        .collect();
    if all.is_empty() && args.child.is_none() && args.json_in.is_none() {
        all.push((1000, endpoints));
    }
    args.scales = all;
    args.command_line = format!("cargo bench --bench scale -- {}", shown.join(" "));
    args
}

// ---------------------------------------------------------------------------------
// Results

/// One exec-based baseline measurement.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Exec {
    wall_s: f64,
    sys_s: f64,
    user_s: f64,
    timed_out: bool,
    input_bytes: usize,
    output_bytes: usize,
}

/// One kind of change, over all repetitions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Change {
    name: String,
    median_s: f64,
    p90_s: f64,
    messages: usize,
    bytes: usize,
    kernel_median_s: f64,
    rendered: Vec<usize>,
}

/// Everything measured at one scale.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Row {
    n: usize,
    e: usize,
    render_s: f64,
    full_s: f64,
    full_messages: usize,
    full_bytes: usize,
    full_kernel_s: f64,
    longest_commit_s: f64,
    first_commit_after_load_s: f64,
    peak_rss_kib: u64,
    objects_rss_kib: u64,
    changes: Vec<Change>,
    tax_empty_s: f64,
    tax_ours_s: f64,
    tax_upstream_s: Option<f64>,
    connect_10_s: f64,
    connect_10_direct_s: f64,
    connect_n_s: f64,
    connect_direct_s: f64,
    upstream_full: Option<Exec>,
    upstream_change: Option<Exec>,
    upstream_list: Option<Exec>,
    iptables_full: Option<Exec>,
    iptables_change: Option<Exec>,
    notes: Vec<String>,
    problems: Vec<String>,
}

/// A whole run, as `--json` writes it and `--from-json` reads it back.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Saved {
    /// The docs section's header: when, which source, the machine, the command.
    header: String,
    rows: Vec<Row>,
}

impl Row {
    fn change(&self, name: &str) -> Option<&Change> {
        self.changes.iter().find(|c| c.name == name)
    }
}

// ---------------------------------------------------------------------------------
// Helpers

fn in_private_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare(CLONE_NEWNET) changes only this thread's network namespace;
        // the threads and processes it starts (nft, ip) inherit it.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("bench thread")
}

fn median(v: &[Duration]) -> f64 {
    quantile(v, 0.5)
}

fn quantile(v: &[Duration], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s: Vec<f64> = v.iter().map(Duration::as_secs_f64).collect();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * q).round() as usize]
}

/// A `kB` field of /proc/self/status (`VmHWM`, `VmRSS`).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn find_in_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        || ["/usr/sbin", "/sbin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(bin).is_file())
}

fn run_ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `cmd args` with `stdin`, killing it after `timeout`. Wall time from before
/// the fork to the reap; user and system time from `wait4`.
fn run_exec(cmd: &str, args: &[&str], stdin: &[u8], timeout: Duration) -> Result<Exec, String> {
    let started = Instant::now();
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cmd}: {e}"))?;
    let pid = child.id() as libc::pid_t;
    let input = stdin.to_vec();
    let mut sin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        let _ = sin.write_all(&input);
    });
    let mut sout = child.stdout.take().expect("stdout");
    let out_reader = std::thread::spawn(move || {
        let mut n = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(k) = sout.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    });
    let mut serr = child.stderr.take().expect("stderr");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = serr.read_to_string(&mut s);
        s
    });
    let done = Arc::new(AtomicBool::new(false));
    let timed_out = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (done, timed_out) = (done.clone(), timed_out.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                if started.elapsed() >= timeout {
                    timed_out.store(true, Ordering::SeqCst);
                    // SAFETY: plain kill(2) of our own, not yet reaped child.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; both pointers are to live locals.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall = started.elapsed();
    done.store(true, Ordering::SeqCst);
    let _ = watchdog.join();
    let _ = writer.join();
    let output_bytes = out_reader.join().unwrap_or(0);
    let stderr = err_reader.join().unwrap_or_default();
    if rc < 0 {
        return Err(format!("wait4 {cmd}: {}", std::io::Error::last_os_error()));
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let exec = Exec {
        wall_s: wall.as_secs_f64(),
        sys_s: tv(ru.ru_stime),
        user_s: tv(ru.ru_utime),
        timed_out: timed_out.load(Ordering::SeqCst),
        input_bytes: stdin.len(),
        output_bytes,
    };
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    if ok || exec.timed_out {
        Ok(exec)
    } else {
        Err(format!(
            "{cmd} {} failed (status {status:#x}): {}",
            args.join(" "),
            stderr.lines().take(5).collect::<Vec<_>>().join(" | ")
        ))
    }
}

// ---------------------------------------------------------------------------------
// The cluster

fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 96 + (i >> 16) as u8, (i >> 8) as u8, i as u8)
}

fn endpoint_ip(i: usize, j: usize, e: usize) -> Ipv4Addr {
    let n = i * e + j;
    assert!(n < 127 << 16, "too many endpoints for the address plan");
    Ipv4Addr::new(10, 128 + (n >> 16) as u8, (n >> 8) as u8, n as u8)
}

fn port_name(name: &str) -> ServicePortName {
    ServicePortName {
        namespace: "bench".into(),
        name: name.into(),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
    }
}

fn insert_service(
    st: &mut ClusterState,
    name: &ServicePortName,
    vip: Ipv4Addr,
    eps: Vec<Ipv4Addr>,
) {
    st.services.insert(
        (name.clone(), IpFamily::V4),
        ServicePort::new(name.clone(), IpFamily::V4, Some(IpAddr::V4(vip)), 80),
    );
    st.endpoints.insert(
        name.clone(),
        std::sync::Arc::new(
            eps.into_iter()
                .map(|ip| Endpoint::ready(IpAddr::V4(ip), 8080, false))
                .collect(),
        ),
    );
}

fn remove_service(st: &mut ClusterState, name: &ServicePortName) {
    st.services.remove(&(name.clone(), IpFamily::V4));
    st.endpoints.remove(name);
}

fn state(n: usize, e: usize) -> ClusterState {
    let mut st = ClusterState {
        node: NodeInfo {
            name: "node-a".into(),
            ips: vec![IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1))],
            ..Default::default()
        },
        ..Default::default()
    };
    for i in 0..n {
        let eps = (0..e).map(|j| endpoint_ip(i, j, e)).collect();
        insert_service(&mut st, &port_name(&format!("svc-{i}")), cluster_ip(i), eps);
    }
    st
}

fn options() -> NftablesOptions {
    NftablesOptions {
        masquerade_all: false,
        local_detector: LocalDetector::Cidrs(vec!["10.128.0.0/9".parse().unwrap()]),
        nodeport_addresses: NodePortAddresses::Ips(vec!["10.77.0.1".parse().unwrap()]),
        masquerade_mark: 0x4000,
    }
}

// ---------------------------------------------------------------------------------
// Our side

/// What one batch cost (a copy of `NftSocket::last_apply_stats`).
#[derive(Debug, Clone, Copy, Default)]
struct BatchStats {
    messages: usize,
    bytes: usize,
    kernel: Duration,
    send: Duration,
}

fn batch_stats(sock: &NftSocket) -> BatchStats {
    let s = sock.last_apply_stats();
    BatchStats {
        messages: s.messages,
        bytes: s.bytes,
        kernel: s.kernel,
        send: s.send,
    }
}

/// `sync::NetlinkDataplane` plus the statistics of every batch it sent.
struct MeteredDataplane {
    inner: NetlinkDataplane,
    batches: Vec<BatchStats>,
}

impl MeteredDataplane {
    fn new() -> Self {
        MeteredDataplane {
            inner: NetlinkDataplane::new().expect("open nf_tables socket"),
            batches: Vec::new(),
        }
    }
}

impl Dataplane for MeteredDataplane {
    fn dump(&mut self, family: Family, table: &str) -> Result<Option<TableSnapshot>, SyncError> {
        self.inner.dump(family, table)
    }

    fn dump_set_elements(
        &mut self,
        family: Family,
        set: &Set,
    ) -> Result<Option<Vec<Element>>, SyncError> {
        self.inner.dump_set_elements(family, set)
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), SyncError> {
        let r = self.inner.apply(ops);
        self.batches.push(batch_stats(self.inner.socket()));
        r
    }

    fn messages_sent(&self) -> u64 {
        self.inner.messages_sent()
    }

    fn generation(&mut self) -> Result<u32, SyncError> {
        self.inner.generation()
    }

    fn dump_skeleton(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<TableSnapshot>, SyncError> {
        self.inner.dump_skeleton(family, table)
    }

    fn find_unheld_element(
        &mut self,
        family: Family,
        set: &Set,
        elements: &[&Element],
    ) -> Result<Option<usize>, SyncError> {
        self.inner.find_unheld_element(family, set, elements)
    }
}

/// A one-set table of "another program", and the kernel time of adding one
/// element to it, `reps` times (median).
struct OtherTable {
    sock: NftSocket,
    next: u32,
}

const OTHER_TABLE: &str = "bench-other";

impl OtherTable {
    /// Creates the table; returns it and the kernel time of that first commit.
    fn create() -> (Self, Duration) {
        let mut sock = NftSocket::new().expect("open nf_tables socket");
        sock.apply(&[
            Op::AddTable {
                family: Family::Ipv4,
                name: OTHER_TABLE.into(),
            },
            Op::AddSet {
                family: Family::Ipv4,
                table: OTHER_TABLE.into(),
                set: Set {
                    name: "allow".into(),
                    key: vec![KeyType::Ipv4Addr],
                    verdict_map: false,
                    data: Vec::new(),
                    flags: Default::default(),
                    timeout_ms: None,
                },
            },
        ])
        .expect("create the other table");
        let first = sock.last_apply_stats().kernel;
        (OtherTable { sock, next: 1 }, first)
    }

    fn add_one(&mut self) -> Duration {
        let k = self.next;
        self.next += 1;
        let ip = Ipv4Addr::new(192, 168, (k >> 8) as u8, k as u8);
        self.sock
            .apply(&[Op::AddElements {
                family: Family::Ipv4,
                table: OTHER_TABLE.into(),
                set: "allow".into(),
                elements: vec![Element::new(vec![KeyValue::Addr(IpAddr::V4(ip))])],
            }])
            .expect("add element to the other table");
        self.sock.last_apply_stats().kernel
    }

    fn median_add(&mut self, reps: usize) -> f64 {
        let _ = self.add_one();
        let v: Vec<Duration> = (0..reps).map(|_| self.add_one()).collect();
        median(&v)
    }
}

/// veth0 (client) and veth1 (the probe's listeners), both in this netns; the
/// ClusterIP range is routed out of veth0, so the nat output hook's DNAT turns
/// a connect into a local delivery.
fn connect_topology() -> (TcpListener, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    for cmd in [
        "link set lo up".to_string(),
        "link add veth0 type veth peer name veth1".to_string(),
        format!("addr add {CLIENT_IP}/24 dev veth0"),
        format!("addr add {}/24 dev veth1", PROBE_EPS[0]),
        format!("addr add {}/24 dev veth1", PROBE_EPS[1]),
        "link set veth0 up".to_string(),
        "link set veth1 up".to_string(),
        format!("route add 10.96.0.0/11 dev veth0 src {CLIENT_IP}"),
    ] {
        run_ip(&cmd);
    }
    let listener = TcpListener::bind("0.0.0.0:8080").expect("listen on :8080");
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let listener = listener.try_clone().expect("clone listener");
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => drop(s),
                    Err(_) => break,
                }
            }
        })
    };
    (listener, stop, acceptor)
}

fn stop_acceptor(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    acceptor: std::thread::JoinHandle<()>,
) {
    stop.store(true, Ordering::SeqCst);
    // SAFETY: shutdown(2) of a listening socket we own wakes the blocked accept.
    unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
    let _ = acceptor.join();
}

fn connect_once(to: SocketAddr) -> Duration {
    let started = Instant::now();
    let s = TcpStream::connect_timeout(&to, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect {to}: {e}"));
    let t = started.elapsed();
    drop(s);
    t
}

/// One connect to the probe's ClusterIP and one straight to its first endpoint.
fn connect_pair() -> (Duration, Duration) {
    let vip = SocketAddr::from((PROBE_VIP, 80));
    let direct = SocketAddr::from((PROBE_EPS[0], 8080));
    (connect_once(vip), connect_once(direct))
}

/// A netns with 10 services and the probe, serving [`connect_pair`] on request, so
/// its connects interleave in time with the N-service ones (the machine's noise
/// then hits both alike).
struct SmallNetns {
    ask: std::sync::mpsc::Sender<()>,
    answer: std::sync::mpsc::Receiver<(Duration, Duration)>,
    worker: std::thread::JoinHandle<()>,
}

impl SmallNetns {
    fn start(e: usize) -> Self {
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (reply, answer) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            // SAFETY: as in `in_private_netns`: this thread's network namespace only.
            let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
            let mut st = state(10, e);
            add_probe(&mut st);
            let (_renderer, _syncer, _, _) = full_sync(&st, &options());
            let (listener, stop, acceptor) = connect_topology();
            let _ = reply.send((Duration::ZERO, Duration::ZERO));
            while asked.recv().is_ok() {
                if reply.send(connect_pair()).is_err() {
                    break;
                }
            }
            stop_acceptor(listener, stop, acceptor);
        });
        let small = SmallNetns {
            ask,
            answer,
            worker,
        };
        small.answer.recv().expect("10-service netns ready");
        small
    }

    fn pair(&self) -> (Duration, Duration) {
        self.ask.send(()).expect("10-service netns");
        self.answer.recv().expect("10-service netns")
    }

    fn stop(self) {
        drop(self.ask);
        let _ = self.worker.join();
    }
}

/// Medians of `count` connects each, interleaved: via the ClusterIP and direct
/// with N services (this netns), then the same with 10 services.
fn connect_latency(count: usize, small: &SmallNetns) -> [f64; 4] {
    for _ in 0..10 {
        connect_pair();
        small.pair();
    }
    let mut v: [Vec<Duration>; 4] = Default::default();
    for _ in 0..count {
        let (via, direct) = connect_pair();
        v[0].push(via);
        v[1].push(direct);
        let (via, direct) = small.pair();
        v[2].push(via);
        v[3].push(direct);
    }
    [median(&v[0]), median(&v[1]), median(&v[2]), median(&v[3])]
}

fn add_probe(st: &mut ClusterState) -> ServicePortName {
    let name = port_name("probe");
    insert_service(st, &name, PROBE_VIP, PROBE_EPS.to_vec());
    name
}

/// Load `st` with a fresh renderer and syncer (the first sync).
fn full_sync(
    st: &ClusterState,
    opts: &NftablesOptions,
) -> (
    NftablesRenderer,
    Syncer<MeteredDataplane>,
    Duration,
    Duration,
) {
    let mut renderer = NftablesRenderer::default();
    let mut syncer = Syncer::new(MeteredDataplane::new());
    let started = Instant::now();
    let (deltas, _) = renderer.update(st, opts);
    let render = started.elapsed();
    let outcome = syncer
        .sync_incremental(&deltas, || renderer.tables())
        .expect("full sync");
    let total = started.elapsed();
    assert!(outcome.full, "the first sync reads the kernel back");
    (renderer, syncer, render, total)
}

fn settle(n: usize, e: usize) {
    // Right after a big load the kernel is still releasing the transaction.
    std::thread::sleep(Duration::from_millis((200 + n * e / 40).min(3000) as u64));
}

fn measure_ours(n: usize, e: usize, reps: usize, connects: usize, row: &mut Row) {
    let opts = options();
    let mut st = state(n, e);
    row.objects_rss_kib = status_kib("VmRSS");
    let (mut renderer, mut syncer, render, total) = full_sync(&st, &opts);
    row.peak_rss_kib = status_kib("VmHWM");
    row.render_s = render.as_secs_f64();
    row.full_s = total.as_secs_f64();
    let batches = &syncer.dataplane().batches;
    row.full_messages = batches.iter().map(|b| b.messages).sum();
    row.full_bytes = batches.iter().map(|b| b.bytes).sum();
    row.full_kernel_s = batches.iter().map(|b| b.kernel.as_secs_f64()).sum();
    row.longest_commit_s = batches
        .iter()
        .map(|b| b.send.as_secs_f64())
        .fold(0.0, f64::max);
    eprintln!(
        "  ours: full sync {:.3}s ({} messages, {} bytes)",
        row.full_s, row.full_messages, row.full_bytes
    );

    // The first commit after the load waits for the kernel to release it.
    let (mut other, first) = OtherTable::create();
    row.first_commit_after_load_s = first.as_secs_f64();
    settle(n, e);

    // One change at a time.
    let added = port_name("svc-added");
    let changed = port_name(&format!("svc-{}", n / 2));
    let kinds = ["add service", "change endpoint", "delete service", "no-op"];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    let mut kernel: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    let mut last: Vec<BatchStats> = vec![BatchStats::default(); kinds.len()];
    let mut rendered: Vec<Vec<usize>> = vec![Vec::new(); kinds.len()];
    let mut flip = false;
    const WARMUP: usize = 2;
    for rep in 0..reps + WARMUP {
        for (k, kind) in kinds.iter().enumerate() {
            let names: Vec<ServicePortName> = match k {
                0 => {
                    let eps = (0..e).map(|j| endpoint_ip(n, j, e)).collect();
                    insert_service(&mut st, &added, cluster_ip(n), eps);
                    vec![added.clone()]
                }
                1 => {
                    flip = !flip;
                    let ep = &mut std::sync::Arc::make_mut(
                        st.endpoints.get_mut(&changed).expect("changed svc"),
                    )[e - 1];
                    ep.ip = IpAddr::V4(if flip {
                        ALT_EP
                    } else {
                        endpoint_ip(n / 2, e - 1, e)
                    });
                    vec![changed.clone()]
                }
                2 => {
                    remove_service(&mut st, &added);
                    vec![added.clone()]
                }
                _ => Vec::new(),
            };
            let before = syncer.dataplane().batches.len();
            let started = Instant::now();
            let (deltas, stats) = renderer.update_changed(&st, &opts, &names);
            let outcome = syncer
                .sync_incremental(&deltas, || renderer.tables())
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
            let took = started.elapsed();
            if outcome.full {
                row.problems.push(format!("{kind}: sync was a full one"));
            }
            if rep < WARMUP {
                continue;
            }
            let b =
                syncer.dataplane().batches[before..]
                    .iter()
                    .fold(BatchStats::default(), |a, b| BatchStats {
                        messages: a.messages + b.messages,
                        bytes: a.bytes + b.bytes,
                        kernel: a.kernel + b.kernel,
                        send: a.send + b.send,
                    });
            times[k].push(took);
            kernel[k].push(b.kernel);
            last[k] = b;
            rendered[k].push(stats.rendered);
        }
    }
    for (k, kind) in kinds.iter().enumerate() {
        let mut r = rendered[k].clone();
        r.sort_unstable();
        r.dedup();
        let want = if k == 3 { 0 } else { 1 };
        if r != [want] {
            row.problems.push(format!(
                "{kind}: re-rendered {r:?} service ports, expected {want}"
            ));
        }
        row.changes.push(Change {
            name: kind.to_string(),
            median_s: median(&times[k]),
            p90_s: quantile(&times[k], 0.9),
            messages: last[k].messages,
            bytes: last[k].bytes,
            kernel_median_s: median(&kernel[k]),
            rendered: r,
        });
    }
    eprintln!(
        "  ours: change endpoint {:.3} ms",
        row.change("change endpoint")
            .map_or(0.0, |c| c.median_s * 1e3)
    );

    // Another program's commit beside our N services.
    row.tax_ours_s = other.median_add(reps);

    // The kernel holds exactly the renderer's state.
    match syncer.verify(&renderer.tables()) {
        Ok(d) if d.is_empty() => {}
        Ok(d) => row.problems.push(format!(
            "kernel differs after the changes: {}",
            d.join("; ")
        )),
        Err(e) => row.problems.push(format!("verify: {e}")),
    }

    // First-packet connect latency with N services.
    let probe = add_probe(&mut st);
    let (deltas, _) = renderer.update_changed(&st, &opts, &[probe]);
    syncer
        .sync_incremental(&deltas, || renderer.tables())
        .expect("add probe");
    let (listener, stop, acceptor) = connect_topology();
    let small = SmallNetns::start(e);
    std::thread::sleep(Duration::from_millis(200));
    [
        row.connect_n_s,
        row.connect_direct_s,
        row.connect_10_s,
        row.connect_10_direct_s,
    ] = connect_latency(connects, &small);
    small.stop();
    stop_acceptor(listener, stop, acceptor);
}

// ---------------------------------------------------------------------------------
// Baselines

fn svc_chain(i: usize) -> String {
    format!("service-{i:08}-bench/svc-{i}/tcp/http")
}

fn ep_chain(i: usize, j: usize, ep: Ipv4Addr) -> String {
    format!("endpoint-{i:08}-{j}-bench/svc-{i}/tcp/http__{ep}/8080")
}

fn upstream_vmap_rule(i: usize, chains: &[String]) -> String {
    let vmap: Vec<String> = chains
        .iter()
        .enumerate()
        .map(|(j, c)| format!("{j} : goto {c}"))
        .collect();
    format!(
        "add rule ip kube-proxy {} numgen random mod {} vmap {{ {} }}\n",
        svc_chain(i),
        chains.len(),
        vmap.join(" , ")
    )
}

fn upstream_endpoint(s: &mut String, chain: &str, ep: Ipv4Addr) {
    let _ = writeln!(s, "add chain ip kube-proxy {chain}");
    let _ = writeln!(
        s,
        "add rule ip kube-proxy {chain} ip saddr {ep} jump mark-for-masquerade"
    );
    let _ = writeln!(
        s,
        "add rule ip kube-proxy {chain} meta l4proto tcp dnat to {ep}:8080"
    );
}

/// Upstream kube-proxy's nftables layout for the same services (the relevant part):
/// per-service and per-endpoint chains, an anonymous `numgen … vmap { … }` per
/// service, one `service-ips` verdict map reached from prerouting and output.
fn upstream_ruleset(n: usize, e: usize) -> String {
    let mut s = String::from(
        "add table ip kube-proxy\n\
         add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
         add chain ip kube-proxy services\n\
         add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority dstnat ; }\n\
         add rule ip kube-proxy nat-prerouting jump services\n\
         add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }\n\
         add rule ip kube-proxy nat-output jump services\n\
         add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add chain ip kube-proxy mark-for-masquerade\n\
         add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000\n",
    );
    for i in 0..n {
        let _ = writeln!(s, "add chain ip kube-proxy {}", svc_chain(i));
        let mut chains = Vec::with_capacity(e);
        for j in 0..e {
            let ep = endpoint_ip(i, j, e);
            let chain = ep_chain(i, j, ep);
            upstream_endpoint(&mut s, &chain, ep);
            chains.push(chain);
        }
        s.push_str(&upstream_vmap_rule(i, &chains));
        let _ = writeln!(
            s,
            "add element ip kube-proxy service-ips {{ {} . tcp . 80 : goto {} }}",
            cluster_ip(i),
            svc_chain(i)
        );
    }
    s
}

/// Upstream's transaction for one changed endpoint of service `i`: the new
/// endpoint's chain, the service chain's vmap rule again, the old chain deleted.
fn upstream_change(i: usize, e: usize, to_alt: bool) -> String {
    let orig = endpoint_ip(i, e - 1, e);
    let (old, new) = if to_alt {
        (orig, ALT_EP)
    } else {
        (ALT_EP, orig)
    };
    let mut s = String::new();
    let new_chain = ep_chain(i, e - 1, new);
    upstream_endpoint(&mut s, &new_chain, new);
    let mut chains: Vec<String> = (0..e - 1)
        .map(|j| ep_chain(i, j, endpoint_ip(i, j, e)))
        .collect();
    chains.push(new_chain);
    let _ = writeln!(s, "flush chain ip kube-proxy {}", svc_chain(i));
    s.push_str(&upstream_vmap_rule(i, &chains));
    let _ = writeln!(s, "delete chain ip kube-proxy {}", ep_chain(i, e - 1, old));
    s
}

fn ipt_svc(i: usize) -> String {
    format!("KUBE-SVC-{i:016X}")
}

fn ipt_sep(i: usize, j: usize, e: usize) -> String {
    format!("KUBE-SEP-{:016X}", i * e + j)
}

fn ipt_alt_sep(i: usize) -> String {
    format!("KUBE-SEP-{:016X}", (1usize << 60) + i)
}

fn ipt_endpoint(s: &mut String, i: usize, chain: &str, ep: Ipv4Addr) {
    let _ = writeln!(
        s,
        "-A {chain} -s {ep}/32 -m comment --comment \"bench/svc-{i}:http\" -j KUBE-MARK-MASQ"
    );
    let _ = writeln!(
        s,
        "-A {chain} -p tcp -m comment --comment \"bench/svc-{i}:http\" -m tcp -j DNAT --to-destination {ep}:8080"
    );
}

fn ipt_svc_rules(s: &mut String, i: usize, seps: &[(String, Ipv4Addr)]) {
    let e = seps.len();
    for (j, (sep, ep)) in seps.iter().enumerate() {
        let left = e - j;
        if left > 1 {
            let _ = writeln!(
                s,
                "-A {} -m comment --comment \"bench/svc-{i}:http -> {ep}:8080\" -m statistic --mode random --probability {:.11} -j {sep}",
                ipt_svc(i),
                1.0 / left as f64
            );
        } else {
            let _ = writeln!(
                s,
                "-A {} -m comment --comment \"bench/svc-{i}:http -> {ep}:8080\" -j {sep}",
                ipt_svc(i)
            );
        }
    }
}

/// kube-proxy's iptables mode for the same services: KUBE-SERVICES → KUBE-SVC-*
/// (`-m statistic --mode random`) → KUBE-SEP-* (mark for masquerade, DNAT).
fn iptables_ruleset(n: usize, e: usize) -> String {
    let mut s = String::from("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
    for i in 0..n {
        let _ = writeln!(s, ":{} - [0:0]", ipt_svc(i));
        for j in 0..e {
            let _ = writeln!(s, ":{} - [0:0]", ipt_sep(i, j, e));
        }
    }
    s.push_str(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n",
    );
    for i in 0..n {
        let _ = writeln!(
            s,
            "-A KUBE-SERVICES -d {}/32 -p tcp -m comment --comment \"bench/svc-{i}:http cluster IP\" -m tcp --dport 80 -j {}",
            cluster_ip(i),
            ipt_svc(i)
        );
        let seps: Vec<(String, Ipv4Addr)> = (0..e)
            .map(|j| (ipt_sep(i, j, e), endpoint_ip(i, j, e)))
            .collect();
        ipt_svc_rules(&mut s, i, &seps);
        for (sep, ep) in &seps {
            ipt_endpoint(&mut s, i, sep, *ep);
        }
    }
    s.push_str("COMMIT\n");
    s
}

/// kube-proxy's (minimized) iptables-restore for one changed endpoint of service
/// `i`, applied with `--noflush`: the service chain and the new endpoint chain are
/// declared (so flushed) and rewritten, the old endpoint chain deleted.
fn iptables_change(i: usize, e: usize, to_alt: bool) -> String {
    let orig = (ipt_sep(i, e - 1, e), endpoint_ip(i, e - 1, e));
    let alt = (ipt_alt_sep(i), ALT_EP);
    let (old, new) = if to_alt { (orig, alt) } else { (alt, orig) };
    let mut seps: Vec<(String, Ipv4Addr)> = (0..e - 1)
        .map(|j| (ipt_sep(i, j, e), endpoint_ip(i, j, e)))
        .collect();
    seps.push(new.clone());
    // Declaring a chain flushes it; `-X` needs it empty and unreferenced.
    let mut s = format!(
        "*nat\n:{} - [0:0]\n:{} - [0:0]\n:{} - [0:0]\n",
        ipt_svc(i),
        new.0,
        old.0
    );
    ipt_svc_rules(&mut s, i, &seps);
    ipt_endpoint(&mut s, i, &new.0, new.1);
    let _ = writeln!(s, "-X {}", old.0);
    s.push_str("COMMIT\n");
    s
}

/// The median repetition of `f(rep)` (by wall time).
fn median_exec(
    reps: usize,
    mut f: impl FnMut(usize) -> Result<Exec, String>,
) -> Result<Exec, String> {
    let mut v = Vec::with_capacity(reps);
    for r in 0..reps {
        let x = f(r)?;
        let stop = x.timed_out;
        v.push(x);
        if stop {
            break;
        }
    }
    v.sort_by(|a, b| a.wall_s.total_cmp(&b.wall_s));
    Ok(v[(v.len() - 1) / 2].clone())
}

/// The netns's nf_tables generation: it moves with every commit, so a changed
/// value after a killed `nft -f` says its transaction went through (`nft list
/// tables` would load nft's whole cache: minutes at 250k chains).
fn generation() -> u32 {
    NftSocket::new()
        .and_then(|mut s| s.generation())
        .expect("nf_tables generation")
}

fn measure_upstream(n: usize, e: usize, reps: usize, timeout: Duration, row: &mut Row) {
    let script = upstream_ruleset(n, e);
    let before = generation();
    match run_exec("nft", &["-f", "-"], script.as_bytes(), timeout) {
        Ok(x) => {
            eprintln!(
                "  upstream: nft -f {:.3}s{}",
                x.wall_s,
                if x.timed_out { " (timed out)" } else { "" }
            );
            if x.timed_out {
                row.notes.push(format!(
                    "{n}×{e}: upstream `nft -f` killed after {} s; the process was reaped after {:.0} s",
                    timeout.as_secs(),
                    x.wall_s
                ));
            }
            row.upstream_full = Some(x);
        }
        Err(err) => row.problems.push(format!("upstream load: {err}")),
    }
    if generation() == before {
        row.notes.push(format!(
            "{n}×{e}: upstream table not loaded; its change, read-back and tax not measured"
        ));
        return;
    }
    // Another program's commit beside upstream's layout (the first one absorbs
    // the release of the big transaction).
    let (mut other, _) = OtherTable::create();
    settle(n, e);
    row.tax_upstream_s = Some(other.median_add(reps));

    let i = n / 2;
    let exec_reps = reps.min(10);
    match median_exec(exec_reps, |r| {
        run_exec(
            "nft",
            &["-f", "-"],
            upstream_change(i, e, r % 2 == 0).as_bytes(),
            timeout,
        )
    }) {
        Ok(x) => row.upstream_change = Some(x),
        Err(err) => row.problems.push(format!("upstream change: {err}")),
    }
    match run_exec(
        "nft",
        &["--json", "list", "table", "ip", "kube-proxy"],
        b"",
        timeout,
    ) {
        Ok(x) => row.upstream_list = Some(x),
        Err(err) => row.problems.push(format!("nft --json list: {err}")),
    }
}

fn measure_iptables(n: usize, e: usize, reps: usize, timeout: Duration, row: &mut Row) {
    let script = iptables_ruleset(n, e);
    let bin = "iptables-legacy-restore";
    match run_exec(bin, &["-w"], script.as_bytes(), timeout) {
        Ok(x) => {
            eprintln!("  iptables-legacy-restore {:.3}s", x.wall_s);
            let timed_out = x.timed_out;
            row.iptables_full = Some(x);
            if timed_out {
                return;
            }
        }
        Err(err) => {
            row.problems.push(format!("iptables load: {err}"));
            return;
        }
    }
    let i = n / 2;
    match median_exec(reps.min(10), |r| {
        run_exec(
            bin,
            &["-w", "--noflush"],
            iptables_change(i, e, r % 2 == 0).as_bytes(),
            timeout,
        )
    }) {
        Ok(x) => row.iptables_change = Some(x),
        Err(err) => row.problems.push(format!("iptables change: {err}")),
    }
}

// ---------------------------------------------------------------------------------
// One scale (in a child process)

fn run_one(n: usize, e: usize, args: &Args) -> Row {
    let mut row = Row {
        n,
        e,
        ..Default::default()
    };
    let (reps, connects, timeout) = (args.reps, args.connects, args.nft_timeout);
    eprintln!("== {n} ClusterIP services × {e} endpoints ==");

    row.tax_empty_s = in_private_netns(move || OtherTable::create().0.median_add(reps));

    let mut r = row;
    r = in_private_netns(move || {
        measure_ours(n, e, reps, connects, &mut r);
        r
    });

    if args.ours_only {
        r.notes
            .push("--ours-only: the exec baselines were not run".into());
        return r;
    }
    if find_in_path("iptables-legacy-restore") {
        r = in_private_netns(move || {
            measure_iptables(n, e, reps, timeout, &mut r);
            r
        });
    } else {
        r.notes.push(
            "iptables-legacy-restore not found (Debian package `iptables`): iptables columns skipped"
                .into(),
        );
    }
    if find_in_path("nft") {
        r = in_private_netns(move || {
            measure_upstream(n, e, reps, timeout, &mut r);
            r
        });
    } else {
        r.notes
            .push("nft not found: upstream nftables columns skipped".into());
    }
    r
}

// ---------------------------------------------------------------------------------
// Formatting

fn t(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.0} s")
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 0.01 {
        format!("{:.1} ms", s * 1e3)
    } else if s >= 0.001 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

fn bytes(b: usize) -> String {
    if b >= 10 << 20 {
        format!("{:.0} MiB", b as f64 / (1 << 20) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
    } else if b >= 10 << 10 {
        format!("{:.0} KiB", b as f64 / 1024.0)
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

fn count(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (k, c) in s.chars().enumerate() {
        if k > 0 && (s.len() - k).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn scale(r: &Row) -> String {
    format!("{} × {}", count(r.n), r.e)
}

fn share(part: f64, whole: f64) -> String {
    if whole <= 0.0 {
        "—".into()
    } else {
        format!("{:.0}%", 100.0 * part / whole)
    }
}

fn exec_cell(x: &Option<Exec>, timeout: Duration, missing: &str) -> String {
    match x {
        None => missing.into(),
        Some(x) if x.timed_out => format!("> {} s (timed out)", timeout.as_secs()),
        Some(x) => format!("{} (sys {})", t(x.wall_s), share(x.sys_s, x.wall_s)),
    }
}

fn tables_markdown(rows: &[Row], args: &Args) -> String {
    let mut s = String::new();
    let timeout = args.nft_timeout;
    let reps = args.reps;
    s.push_str("**Full sync from the objects in memory** (`NftablesRenderer::update` + first `Syncer::sync_incremental`: read-back, full diff, one netlink batch)\n\n");
    s.push_str("| services × endpoints | full sync | of which render | netlink messages | bytes | kernel (share) | longest commit | peak RSS (bench process; RSS with only the objects built) |\n");
    s.push_str("|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} ({}) | {} | {} MiB ({} MiB) |",
            scale(r),
            t(r.full_s),
            t(r.render_s),
            count(r.full_messages),
            bytes(r.full_bytes),
            t(r.full_kernel_s),
            share(r.full_kernel_s, r.full_s),
            t(r.longest_commit_s),
            r.peak_rss_kib / 1024,
            r.objects_rss_kib / 1024
        );
    }
    let _ = write!(
        s,
        "\n**One change** (`update_changed` + `sync_incremental`; median of {reps}, alternating so the state returns)\n\n"
    );
    s.push_str("| services × endpoints | change | time (median) | p90 | netlink messages | bytes | kernel (share) | service ports re-rendered |\n");
    s.push_str("|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        for c in &r.changes {
            let rendered: Vec<String> = c.rendered.iter().map(|x| x.to_string()).collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                scale(r),
                c.name,
                t(c.median_s),
                t(c.p90_s),
                c.messages,
                bytes(c.bytes),
                if c.messages == 0 {
                    "— (nothing sent)".into()
                } else {
                    format!(
                        "{} ({})",
                        t(c.kernel_median_s),
                        share(c.kernel_median_s, c.median_s)
                    )
                },
                rendered.join(", ")
            );
        }
    }
    let ipt_missing = if rows.iter().any(|r| r.iptables_full.is_some()) {
        "—"
    } else {
        "not installed"
    };
    s.push_str("\n**Baselines in the same run** (each in its own private netns; exec time from fork to reap, sys = the tool's system time, i.e. mostly the kernel's commit)\n\n");
    s.push_str("| services × endpoints | kube-nlproxy full sync | upstream layout `nft -f` | `iptables-legacy-restore` | kube-nlproxy endpoint change | upstream one-service `nft -f` | iptables one-service `--noflush` | `nft --json list table` |\n");
    s.push_str("|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let ours_change = r
            .change("change endpoint")
            .map_or("—".into(), |c| t(c.median_s));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            scale(r),
            t(r.full_s),
            exec_cell(&r.upstream_full, timeout, "—"),
            exec_cell(&r.iptables_full, timeout, ipt_missing),
            ours_change,
            exec_cell(&r.upstream_change, timeout, "—"),
            exec_cell(&r.iptables_change, timeout, ipt_missing),
            exec_cell(&r.upstream_list, timeout, "—"),
        );
    }
    let _ = write!(
        s,
        "\n**Kernel side effects**: another program adding one element to its own one-set table (kernel time of that commit, median of {reps}), and first-packet TCP connect latency to a ClusterIP (median of {} connects, interleaved between the two netns, DNAT in the nat output hook to a listener in the same netns; in parentheses the same connect straight to the endpoint address, the floor)\n\n",
        args.connects
    );
    s.push_str("| services × endpoints | +1 element elsewhere: empty netns | beside kube-nlproxy (its first commit, right after our full sync) | beside upstream layout | connect via ClusterIP, 10 services (direct) | connect via ClusterIP, N services (direct) |\n");
    s.push_str("|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} ({}) | {} | {} ({}) | {} ({}) |",
            scale(r),
            t(r.tax_empty_s),
            t(r.tax_ours_s),
            t(r.first_commit_after_load_s),
            r.tax_upstream_s.map_or("—".into(), t),
            t(r.connect_10_s),
            t(r.connect_10_direct_s),
            t(r.connect_n_s),
            t(r.connect_direct_s),
        );
    }
    let notes: Vec<&String> = rows.iter().flat_map(|r| &r.notes).collect();
    if !notes.is_empty() {
        s.push('\n');
        let mut seen = std::collections::BTreeSet::new();
        for n in notes {
            if seen.insert(n) {
                let _ = writeln!(s, "- {n}");
            }
        }
    }
    s
}

fn machine_markdown() -> String {
    let cmd = |c: &str, a: &[&str]| {
        Command::new(c)
            .args(a)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "not installed".into())
    };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or("?".into(), |k| {
            format!("{:.1} GiB", k as f64 / (1 << 20) as f64)
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let ipt = if find_in_path("iptables-legacy-restore") {
        cmd("iptables-legacy-restore", &["--version"])
    } else {
        "not installed".into()
    };
    format!(
        "- CPUs (`nproc`): {cpus} ({model})\n- memory: {mem}\n- kernel (`uname -r`): {kernel}\n- nft: {}\n- iptables-legacy-restore: {ipt}\n",
        cmd("nft", &["--version"]),
    )
}

// ---------------------------------------------------------------------------------
// Chart

fn draw_chart(rows: &[Row], args: &Args, path: &std::path::Path) -> Result<(), String> {
    use plotters::prelude::*;
    use plotters::style::{FontStyle, register_font};

    register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| "DejaVu Sans did not load".to_string())?;
    let timeout = args.nft_timeout.as_secs_f64();
    let root = BitMapBackend::new(path, (1500, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (title, body) = root.split_vertically(44);
    title
        .titled(
            "kube-nlproxy vs exec baselines, N ClusterIP services (log-log; lines: 2 endpoints each, hollow: 50 endpoints each, triangles: timed out)",
            ("sans-serif", 18),
        )
        .map_err(|e| e.to_string())?;
    let (left, right) = body.split_horizontally(750);

    type Pick = fn(&Row) -> Option<(f64, bool)>;
    let full: Vec<(&str, RGBColor, Pick)> = vec![
        ("kube-nlproxy full sync", RGBColor(0, 114, 178), |r| {
            Some((r.full_s, false))
        }),
        ("upstream layout, nft -f", RGBColor(213, 94, 0), |r| {
            r.upstream_full.as_ref().map(|x| (x.wall_s, x.timed_out))
        }),
        ("iptables-legacy-restore", RGBColor(0, 158, 115), |r| {
            r.iptables_full.as_ref().map(|x| (x.wall_s, x.timed_out))
        }),
        (
            "nft --json list table (read-back)",
            RGBColor(204, 121, 167),
            |r| r.upstream_list.as_ref().map(|x| (x.wall_s, x.timed_out)),
        ),
    ];
    let change: Vec<(&str, RGBColor, Pick)> = vec![
        ("kube-nlproxy endpoint change", RGBColor(0, 114, 178), |r| {
            r.change("change endpoint").map(|c| (c.median_s, false))
        }),
        ("kube-nlproxy add service", RGBColor(86, 180, 233), |r| {
            r.change("add service").map(|c| (c.median_s, false))
        }),
        ("upstream one-service nft -f", RGBColor(213, 94, 0), |r| {
            r.upstream_change.as_ref().map(|x| (x.wall_s, x.timed_out))
        }),
        (
            "iptables one-service --noflush",
            RGBColor(0, 158, 115),
            |r| r.iptables_change.as_ref().map(|x| (x.wall_s, x.timed_out)),
        ),
    ];
    for (area, caption, series) in [
        (&left, "Full sync / full read-back", &full),
        (&right, "One change", &change),
    ] {
        let pts: Vec<f64> = rows
            .iter()
            .flat_map(|r| {
                series
                    .iter()
                    .filter_map(|(_, _, f)| f(r))
                    .map(|(y, out)| if out { timeout } else { y })
            })
            .filter(|y| *y > 0.0)
            .collect();
        let ymin = pts.iter().copied().fold(f64::INFINITY, f64::min).max(1e-6) / 2.0;
        // Headroom above the data for the legend (upper left).
        let ymax = pts.iter().copied().fold(0.0, f64::max).max(ymin * 4.0) * 40.0;
        let xmin = rows.iter().map(|r| r.n).min().unwrap_or(1) as f64 / 1.5;
        let xmax = rows.iter().map(|r| r.n).max().unwrap_or(1) as f64 * 1.5;
        // 1-2-5 ticks: plotters' own log ticks collide at the decades.
        let x_ticks: Vec<f64> = (0..8)
            .flat_map(|d| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(d)))
            .filter(|x| (xmin..=xmax).contains(x))
            .collect();
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (xmin..xmax).log_scale().with_key_points(x_ticks.clone()),
                (ymin..ymax).log_scale(),
            )
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("services")
            .y_desc("wall time")
            .x_label_formatter(&|x| {
                if *x >= 1000.0 {
                    format!("{:.0}k", x / 1000.0)
                } else {
                    format!("{x:.0}")
                }
            })
            .y_label_formatter(&|y| t(*y))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| e.to_string())?;
        for (name, color, pick) in series.iter() {
            let color = *color;
            let mut line: Vec<(f64, f64)> = Vec::new();
            let mut wide: Vec<(f64, f64)> = Vec::new();
            let mut timed: Vec<(f64, f64)> = Vec::new();
            for r in rows {
                let Some((y, out)) = pick(r) else { continue };
                let p = (r.n as f64, if out { timeout } else { y });
                if out {
                    timed.push(p);
                } else if r.e == 2 {
                    line.push(p);
                } else {
                    wide.push(p);
                }
            }
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            if line.is_empty() && wide.is_empty() && timed.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(line.iter().map(|p| Circle::new(*p, 4, color.filled())))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(
                    wide.iter()
                        .map(|p| Circle::new(*p, 6, color.stroke_width(2))),
                )
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(
                    timed
                        .iter()
                        .map(|p| TriangleMarker::new(*p, 8, color.filled())),
                )
                .map_err(|e| e.to_string())?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// When, from which source, on which machine, with which command.
fn run_header(args: &Args) -> String {
    let git = |a: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(a)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let dirty = if git(&["status", "--porcelain", "--untracked-files=no"]).is_empty() {
        ""
    } else {
        " plus uncommitted changes"
    };
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!(
        "Run: {date}, source {}{dirty}.\n\nMachine:\n\n{}\nCommand: `{}`\n",
        git(&["rev-parse", "--short", "HEAD"]),
        machine_markdown(),
        args.command_line,
    )
}

fn write_docs(saved: &Saved, args: &Args, tables: &str) -> Result<(), String> {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    std::fs::create_dir_all(&docs).map_err(|e| e.to_string())?;
    draw_chart(&saved.rows, args, &docs.join("benchmarks.png"))?;
    let md = docs.join("benchmarks.md");
    let section = format!(
        "{DOCS_BEGIN}\n<!-- written by `cargo bench --bench scale -- … --write-docs`; edit outside these markers -->\n\n{}\n{}\n![full sync and one change vs N](benchmarks.png)\n{DOCS_END}",
        saved.header, tables
    );
    let text = std::fs::read_to_string(&md).unwrap_or_default();
    let text = match (text.find(DOCS_BEGIN), text.find(DOCS_END)) {
        (Some(a), Some(b)) if a < b => {
            format!("{}{section}{}", &text[..a], &text[b + DOCS_END.len()..])
        }
        _ => format!("{text}\n{section}\n"),
    };
    std::fs::write(&md, text).map_err(|e| e.to_string())?;
    eprintln!(
        "wrote {} and {}",
        md.display(),
        docs.join("benchmarks.png").display()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------

fn main() {
    let args = parse_args();
    if let Some((n, e)) = args.child {
        let row = run_one(n, e, &args);
        println!(
            "{RESULT_TAG}{}",
            serde_json::to_string(&row).expect("serialize")
        );
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("scale: needs root (network namespaces, nf_tables); skipping");
        return;
    }
    let (saved, elapsed, mut failed) = match &args.json_in {
        Some(path) => {
            let text = std::fs::read_to_string(path).expect("read --from-json");
            let saved: Saved = serde_json::from_str(&text).expect("parse --from-json");
            (saved, Duration::ZERO, Vec::new())
        }
        None => measure_all(&args),
    };
    let tables = tables_markdown(&saved.rows, &args);
    println!("\n{tables}");
    println!("total bench time: {:.0} s", elapsed.as_secs_f64());
    if let Some(path) = &args.json_out
        && let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&saved).unwrap())
    {
        failed.push(format!("writing {path}: {e}"));
    }
    if args.write_docs
        && !saved.rows.is_empty()
        && let Err(e) = write_docs(&saved, &args, &tables)
    {
        failed.push(format!("writing docs: {e}"));
    }
    if !failed.is_empty() {
        for f in &failed {
            eprintln!("FAILED: {f}");
        }
        std::process::exit(1);
    }
}

/// Every scale, each in a child process.
fn measure_all(args: &Args) -> (Saved, Duration, Vec<String>) {
    let header = run_header(args);
    println!("## kube-nlproxy scale benchmark\n\n{header}");
    let exe = std::env::current_exe().expect("current exe");
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    let started = Instant::now();
    let mut previous = 0usize;
    for &(n, e) in &args.scales {
        // The kernel tears the last scale's namespaces down in the background
        // (seconds for big tables): let it finish before measuring again.
        if previous > 0 {
            std::thread::sleep(Duration::from_millis((previous / 5).min(20_000) as u64));
        }
        previous = n * e;
        // One process per scale: a fresh peak RSS, and a crash loses one row.
        let mut child = Command::new(&exe)
            .args([
                "--child".to_string(),
                format!("{n}x{e}"),
                "--reps".into(),
                args.reps.to_string(),
                "--connects".into(),
                args.connects.to_string(),
                "--nft-timeout".into(),
                args.nft_timeout.as_secs().to_string(),
            ])
            .args(args.ours_only.then_some("--ours-only"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the bench child");
        let mut row = None;
        for line in BufReader::new(child.stdout.take().expect("stdout")).lines() {
            let line = line.unwrap_or_default();
            match line.strip_prefix(RESULT_TAG) {
                Some(json) => row = serde_json::from_str::<Row>(json).ok(),
                None => println!("{line}"),
            }
        }
        let status = child.wait().expect("wait for the bench child");
        match row {
            Some(r) if status.success() => {
                for p in &r.problems {
                    failed.push(format!("{n}×{e}: {p}"));
                }
                rows.push(r);
            }
            _ => failed.push(format!("{n}×{e}: bench child failed ({status})")),
        }
    }
    let saved = Saved { header, rows };
    (saved, started.elapsed(), failed)
}
