//! Conntrack at scale: the stale-UDP cleanup of a sync against a large table.
//!
//! For each table size N, in a private network namespace:
//!
//! 1. S UDP "DNS" Services (ClusterIP:53 → endpoints :5353, two endpoints each)
//!    are synced by the real driver: nftables mode over netlink, the kernel host
//!    wrapped in [`MeteredHost`] to time its conntrack cleanup.
//! 2. N conntrack entries are inserted straight over ctnetlink
//!    (`IPCTNL_MSG_CT_NEW` with `NLM_F_CREATE`, hundreds per `sendmsg`, encoded
//!    here: the product never creates entries), each a flow client →
//!    ClusterIP:53 whose reply tuple comes from one of the service's two
//!    endpoints, as the DNAT leaves it; 600 s timeout. The insert rate is
//!    printed and the netns's `nf_conntrack_count` must reach N.
//! 3. One sync removes E endpoints (the second endpoint of E services): the
//!    sync's time, its conntrack cleanup's time, the entries deleted (checked
//!    against the plan and the table's count), its CPU time (user / system, of
//!    the syncing thread), its peak heap growth (a counting global allocator:
//!    peak live bytes above those at its start) and its peak RSS growth (VmHWM
//!    reset through `/proc/self/clear_refs` right before it, minus VmRSS then;
//!    blind to memory the allocator reuses). Growth that does not follow N means
//!    the dump is streamed.
//! 4. Rounds of two syncs removing E more endpoints each: one with no traffic,
//!    one while a load generator sends real UDP packets making new flows at
//!    `--rate` per second (from 512 sockets on 10.254.0.1 to every ClusterIP in turn,
//!    DNATed by our nat-output rules to a UDP backend on :5353 that drains them
//!    without answering). The sync's time, the cleanup's share and the table's
//!    size are printed per sync.
//!
//! `nf_conntrack_max` and the conntrack hash size are global: they are raised
//! from the host netns for the run and restored afterwards (also on panic). The
//! namespaces die with their threads and take their entries with them.
//!
//! Usage (root):
//!   cargo bench --bench conntrack_scale -- [ENTRIES]... [--services S]
//!       [--remove E] [--rate FLOWS_PER_SEC] [--rounds R]
//! Default: `100000 1000000`, S = 10000, E = 1000, 50000 flows/s, 3 rounds.
//! Small (CI): `-- 20000 --services 2000 --remove 200 --rate 10000 --rounds 1`.
//! Prints numbers only: a run fails only when a correctness check fails
//! (entries missing after the inserts, a delete count off the plan).

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube_nlproxy::config::Config;
use kube_nlproxy::config::host::{ConntrackSettings, SysctlWrite};
use kube_nlproxy::driver::host::FlowTuples;
use kube_nlproxy::driver::nftables::NftablesMode;
use kube_nlproxy::driver::{Driver, Host, HostError, KernelHost};
use kube_nlproxy::source::{ObjectChanges, Objects};
use kube_nlproxy::sync::NetlinkDataplane;
use kube_nlproxy_netlink::addr::InterfaceAddress;
use serde_json::json;

/// Where the load generator's flows come from (local on lo).
const LOAD_CLIENT: Ipv4Addr = Ipv4Addr::new(10, 254, 0, 1);
/// Sockets of the load generator: distinct source ports.
const LOAD_SOCKETS: usize = 512;
/// First source port of the load generator.
const LOAD_PORT: u16 = 20000;
/// Source port of the inserted entries (their source addresses differ).
const INSERT_SPORT: u16 = 40000;
/// Timeout of the inserted entries: longer than the run.
const INSERT_TIMEOUT_SECS: u32 = 600;

// ---------------------------------------------------------------------------------
// Heap accounting

/// The system allocator, counting live bytes and their peak since the last
/// [`HeapMeter::reset_peak`]: the cleanup's heap growth, exact, where RSS hides
/// what the allocator reuses from memory freed earlier.
struct HeapMeter;

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on to `System` unchanged; the counters are plain atomics.
unsafe impl std::alloc::GlobalAlloc for HeapMeter {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            let live =
                LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed) + layout.size() as u64;
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new) };
        if !p.is_null() {
            let live = LIVE.fetch_add(new as u64, Ordering::Relaxed) + new as u64;
            PEAK.fetch_max(live, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static HEAP: HeapMeter = HeapMeter;

impl HeapMeter {
    /// Live heap bytes now.
    fn live() -> u64 {
        LIVE.load(Ordering::Relaxed)
    }

    /// Starts a new peak at the live bytes now.
    fn reset_peak() {
        PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The peak since [`reset_peak`](Self::reset_peak).
    fn peak() -> u64 {
        PEAK.load(Ordering::Relaxed)
    }
}

/// The calling thread's user and system CPU time.
fn thread_cpu() -> (Duration, Duration) {
    // SAFETY: getrusage(2) fills the zeroed struct we pass; RUSAGE_THREAD is Linux's.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

// ---------------------------------------------------------------------------------
// Options

#[derive(Debug, Clone)]
struct Args {
    sizes: Vec<usize>,
    services: usize,
    remove: usize,
    rate: usize,
    rounds: usize,
}

fn parse_args() -> Args {
    let mut args = Args {
        sizes: Vec::new(),
        services: 10_000,
        remove: 1_000,
        rate: 50_000,
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    let number = |s: Option<String>, what: &str| -> usize {
        s.as_deref()
            .and_then(|v| v.replace('_', "").parse().ok())
            .unwrap_or_else(|| panic!("{what} needs a number"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--services" => args.services = number(it.next(), "--services"),
            "--remove" => args.remove = number(it.next(), "--remove"),
            "--rate" => args.rate = number(it.next(), "--rate"),
            "--rounds" => args.rounds = number(it.next(), "--rounds"),
            // cargo bench passes --bench to harness-less benches.
            "--bench" => {}
            n => args.sizes.push(number(Some(n.to_string()), "a table size")),
        }
    }
    if args.sizes.is_empty() {
        args.sizes = vec![100_000, 1_000_000];
    }
    assert!(
        args.services >= args.remove * (1 + 2 * args.rounds),
        "--services must hold --remove × (1 + 2 × --rounds) endpoint removals"
    );
    assert!(args.services > 0 && args.services < 60_000, "--services");
    args
}

// ---------------------------------------------------------------------------------
// Host facts

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

/// Resets VmHWM to the current RSS.
fn reset_hwm() {
    std::fs::write("/proc/self/clear_refs", "5").expect("write /proc/self/clear_refs");
}

/// The calling thread's netns's conntrack entry count.
fn conntrack_count() -> usize {
    std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .expect("nf_conntrack_count")
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

/// `nf_conntrack_max` and the hash size, raised for the run and put back on drop.
struct GlobalConntrack {
    saved: Vec<(&'static str, String)>,
}

const CT_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
const CT_HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";

impl GlobalConntrack {
    /// Raises the limits (never lowers them) for a table of `entries`.
    fn raise(entries: usize) -> Self {
        let mut saved = Vec::new();
        let hash = (entries / 2).next_power_of_two();
        for (path, want) in [(CT_HASHSIZE, hash), (CT_MAX, entries)] {
            let old = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("read {path}: {e}"))
                .trim()
                .to_string();
            if old.parse::<usize>().is_ok_and(|o| o >= want) {
                continue;
            }
            std::fs::write(path, want.to_string()).unwrap_or_else(|e| panic!("write {path}: {e}"));
            println!("set {path} = {want} (was {old}) for the run");
            saved.push((path, old));
        }
        GlobalConntrack { saved }
    }
}

impl Drop for GlobalConntrack {
    fn drop(&mut self) {
        for (path, old) in self.saved.iter().rev() {
            match std::fs::write(path, old) {
                Ok(()) => println!("restored {path} = {old}"),
                Err(e) => eprintln!("could not restore {path} = {old}: {e}"),
            }
        }
    }
}

fn in_private_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare(CLONE_NEWNET) changes only this thread's network namespace;
        // the threads and processes it starts (ip, the load generator) inherit it.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

// ---------------------------------------------------------------------------------
// The cluster

fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + 1 + i as u32)
}

fn endpoint_ip(i: usize, j: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + 1 + (2 * i + j) as u32)
}

/// The client of inserted entry `m`.
fn insert_client(m: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 192, 0, 0)) + 1 + m as u32)
}

fn service(i: usize) -> Service {
    let ip = cluster_ip(i).to_string();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("dns-{i}"), "namespace": "bench"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                 "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}
    }))
    .expect("service")
}

fn slice(i: usize, endpoints: &[Ipv4Addr]) -> EndpointSlice {
    let endpoints: Vec<_> = endpoints
        .iter()
        .map(|ip| json!({"addresses": [ip.to_string()], "nodeName": "node-b", "conditions": {"ready": true}}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("dns-{i}-abc"), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": format!("dns-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}],
        "endpoints": endpoints
    }))
    .expect("endpoint slice")
}

fn node() -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.77.0.1"}]}
    }))
    .expect("node")
}

fn cluster(services: usize) -> ObjectChanges {
    let mut objects = Objects::default();
    for i in 0..services {
        objects.services.push(service(i));
        objects
            .endpoint_slices
            .push(slice(i, &[endpoint_ip(i, 0), endpoint_ip(i, 1)]));
    }
    objects.nodes.push(node());
    ObjectChanges::everything(objects)
}

/// Services `range` keep only their first endpoint.
fn drop_second_endpoints(range: std::ops::Range<usize>) -> ObjectChanges {
    ObjectChanges {
        endpoint_slices: range
            .map(|i| {
                (
                    ("bench".to_string(), format!("dns-{i}-abc")),
                    Some(slice(i, &[endpoint_ip(i, 0)])),
                )
            })
            .collect(),
        ..ObjectChanges::default()
    }
}

// ---------------------------------------------------------------------------------
// The host, metered

/// One call of [`Host::delete_conntrack`], measured.
#[derive(Debug, Clone, Copy)]
struct Cleanup {
    took: Duration,
    deleted: usize,
    /// VmRSS right before, KiB.
    rss_kib: u64,
    /// VmHWM right after (reset right before), KiB.
    hwm_kib: u64,
    /// Peak live heap above the live heap at the start, bytes.
    heap_growth: u64,
    /// The thread's user and system CPU time in it.
    cpu: (Duration, Duration),
}

/// The kernel host, recording each conntrack cleanup.
#[derive(Debug, Default)]
struct MeteredHost {
    inner: KernelHost,
    cleanups: Vec<Cleanup>,
}

impl Host for MeteredHost {
    fn hostname(&self) -> String {
        self.inner.hostname()
    }

    fn local_addresses(&mut self) -> Result<Vec<InterfaceAddress>, HostError> {
        self.inner.local_addresses()
    }

    fn write_sysctls(&mut self, writes: &[SysctlWrite]) {
        self.inner.write_sysctls(writes)
    }

    fn apply_conntrack_settings(&mut self, settings: &ConntrackSettings) {
        self.inner.apply_conntrack_settings(settings)
    }

    fn delete_conntrack(
        &mut self,
        ipv6: bool,
        stale: &dyn Fn(FlowTuples<'_>) -> bool,
    ) -> Result<usize, HostError> {
        let rss_kib = status_kib("VmRSS");
        reset_hwm();
        let heap = HeapMeter::live();
        HeapMeter::reset_peak();
        let cpu = thread_cpu();
        let started = Instant::now();
        let r = self.inner.delete_conntrack(ipv6, stale);
        let took = started.elapsed();
        let cpu_after = thread_cpu();
        self.cleanups.push(Cleanup {
            took,
            deleted: *r.as_ref().unwrap_or(&0),
            rss_kib,
            hwm_kib: status_kib("VmHWM"),
            heap_growth: HeapMeter::peak().saturating_sub(heap),
            cpu: (cpu_after.0 - cpu.0, cpu_after.1 - cpu.1),
        });
        r
    }
}

type BenchDriver = Driver<NftablesMode<NetlinkDataplane>, MeteredHost>;

/// One sync, with what its cleanups did together.
#[derive(Debug, Clone, Copy)]
struct SyncRun {
    took: Duration,
    cleanup: Duration,
    deleted: usize,
    /// Largest RSS growth of one cleanup above its start, KiB.
    peak_growth_kib: u64,
    /// Largest heap growth of one cleanup above its start, bytes.
    heap_growth: u64,
    /// The cleanups' user and system CPU time.
    cpu: (Duration, Duration),
    /// Entries in the table right before the sync.
    table_before: usize,
}

fn timed_sync(driver: &mut BenchDriver, changes: ObjectChanges) -> SyncRun {
    let table_before = conntrack_count();
    driver.host_mut().cleanups.clear();
    let started = Instant::now();
    let synced = driver.sync_once(changes).expect("sync");
    let took = started.elapsed();
    let cleanups = &driver.host().cleanups;
    let deleted = cleanups.iter().map(|c| c.deleted).sum::<usize>();
    assert_eq!(
        deleted as u64,
        synced.conntrack_deleted.iter().sum::<u64>(),
        "the driver reports what the host deleted"
    );
    SyncRun {
        took,
        cleanup: cleanups.iter().map(|c| c.took).sum(),
        deleted,
        peak_growth_kib: cleanups
            .iter()
            .map(|c| c.hwm_kib.saturating_sub(c.rss_kib))
            .max()
            .unwrap_or(0),
        heap_growth: cleanups.iter().map(|c| c.heap_growth).max().unwrap_or(0),
        cpu: cleanups
            .iter()
            .fold((Duration::ZERO, Duration::ZERO), |(u, s), c| {
                (u + c.cpu.0, s + c.cpu.1)
            }),
        table_before,
    }
}

// ---------------------------------------------------------------------------------
// ctnetlink inserts (bench only)

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 0x2;
const NLA_F_NESTED: u16 = 0x8000;
/// `NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW`.
const CT_NEW: u16 = 1 << 8;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TIMEOUT: u16 = 7;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
/// Bytes per `sendmsg`.
const INSERT_DATAGRAM: usize = 64 << 10;

/// One direction of a UDP flow: source, destination.
type Udp4 = (SocketAddrV4, SocketAddrV4);

/// Creates UDP conntrack entries over ctnetlink, many per datagram, without
/// acks (the kernel still answers each failure with an `NLMSG_ERROR`).
struct CtInserter {
    fd: OwnedFd,
    buf: Vec<u8>,
    seq: u32,
    failures: usize,
    first_errno: Option<i32>,
}

fn nla(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    buf.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().div_ceil(4) * 4, 0);
}

fn nest(buf: &mut Vec<u8>, kind: u16, body: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    body(buf);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    buf[start + 2..start + 4].copy_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
}

fn udp_tuple(buf: &mut Vec<u8>, kind: u16, (src, dst): Udp4) {
    nest(buf, kind, |b| {
        nest(b, CTA_TUPLE_IP, |b| {
            nla(b, CTA_IP_V4_SRC, &src.ip().octets());
            nla(b, CTA_IP_V4_DST, &dst.ip().octets());
        });
        nest(b, CTA_TUPLE_PROTO, |b| {
            nla(b, CTA_PROTO_NUM, &[libc::IPPROTO_UDP as u8]);
            nla(b, CTA_PROTO_SRC_PORT, &src.port().to_be_bytes());
            nla(b, CTA_PROTO_DST_PORT, &dst.port().to_be_bytes());
        });
    });
}

impl CtInserter {
    fn open() -> Self {
        // SAFETY: socket(2) with constant arguments; the result is checked below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_NETFILTER,
            )
        };
        assert!(
            fd >= 0,
            "netlink socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        for opt in [libc::SO_SNDBUFFORCE, libc::SO_RCVBUFFORCE] {
            let size: libc::c_int = 8 << 20;
            // SAFETY: a live c_int and its size, on a socket we own.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
        }
        CtInserter {
            fd,
            buf: Vec::with_capacity(INSERT_DATAGRAM + 512),
            seq: 1,
            failures: 0,
            first_errno: None,
        }
    }

    /// Queues one entry; sends the datagram when it is full.
    fn push(&mut self, orig: Udp4, reply: Udp4, timeout_secs: u32) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        self.buf.extend_from_slice(&CT_NEW.to_ne_bytes());
        self.buf
            .extend_from_slice(&(NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL).to_ne_bytes());
        self.buf.extend_from_slice(&self.seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.seq = self.seq.wrapping_add(1);
        // nfgenmsg: AF_INET, version 0, res_id 0.
        self.buf.extend_from_slice(&[libc::AF_INET as u8, 0, 0, 0]);
        udp_tuple(&mut self.buf, CTA_TUPLE_ORIG, orig);
        udp_tuple(&mut self.buf, CTA_TUPLE_REPLY, reply);
        nla(&mut self.buf, CTA_TIMEOUT, &timeout_secs.to_be_bytes());
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        if self.buf.len() >= INSERT_DATAGRAM {
            self.flush();
        }
    }

    /// Sends what is queued and reads the failures it caused.
    fn flush(&mut self) {
        if !self.buf.is_empty() {
            // SAFETY: `buf` is live for `len` bytes; the socket is ours. The kernel
            // processes the whole datagram inside this call.
            let n = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    self.buf.as_ptr().cast(),
                    self.buf.len(),
                    0,
                )
            };
            assert_eq!(
                n,
                self.buf.len() as isize,
                "ctnetlink send: {}",
                std::io::Error::last_os_error()
            );
            self.buf.clear();
        }
        let mut rbuf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: `rbuf` is live and writable for its length; non-blocking read.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    rbuf.as_mut_ptr().cast(),
                    rbuf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                let err = std::io::Error::last_os_error();
                if n < 0 && err.raw_os_error() == Some(libc::ENOBUFS) {
                    // Failures overflowed the receive buffer: the count check says how many.
                    self.failures += 1;
                    continue;
                }
                break;
            }
            let mut off = 0;
            let n = n as usize;
            while off + 20 <= n {
                let len = u32::from_ne_bytes(rbuf[off..off + 4].try_into().expect("4")) as usize;
                let kind = u16::from_ne_bytes(rbuf[off + 4..off + 6].try_into().expect("2"));
                if kind == NLMSG_ERROR {
                    let code = i32::from_ne_bytes(rbuf[off + 16..off + 20].try_into().expect("4"));
                    if code != 0 {
                        self.failures += 1;
                        self.first_errno.get_or_insert(-code);
                    }
                }
                if len < 16 {
                    break;
                }
                off += len.div_ceil(4) * 4;
            }
        }
    }
}

/// Entry `m` of the prefill: service `m % services`, endpoint `(m / services) % 2`.
fn prefill_entry(m: usize, services: usize) -> (Udp4, Udp4) {
    let (i, j) = (m % services, (m / services) % 2);
    let client = SocketAddrV4::new(insert_client(m), INSERT_SPORT);
    let vip = SocketAddrV4::new(cluster_ip(i), 53);
    let ep = SocketAddrV4::new(endpoint_ip(i, j), 5353);
    ((client, vip), (ep, client))
}

/// How many prefill entries of `n` go to the second endpoint of services `range`.
fn prefill_to_second(n: usize, services: usize, range: &std::ops::Range<usize>) -> usize {
    (0..n)
        .filter(|m| range.contains(&(m % services)) && (m / services) % 2 == 1)
        .count()
}

// ---------------------------------------------------------------------------------
// Real UDP load

/// Sends UDP packets from [`LOAD_SOCKETS`] sockets to the ClusterIPs at `rate`
/// a second, each a new flow, and drains them on the backend.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    started: Instant,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// `next` numbers the flows across loads so none repeats a tuple.
    fn start(rate: usize, services: usize, next: Arc<AtomicU64>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let sockets: Vec<UdpSocket> = (0..LOAD_SOCKETS)
            .map(|k| {
                UdpSocket::bind(SocketAddrV4::new(LOAD_CLIENT, LOAD_PORT + k as u16))
                    .expect("bind a load socket")
            })
            .collect();
        let sender = {
            let (stop, sent) = (stop.clone(), sent.clone());
            std::thread::spawn(move || {
                let payload =
                    *b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03svc\x00\x00\x01\x00\x01";
                let started = Instant::now();
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                    if done >= due {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    // Flow f: ClusterIP f % S from socket (f / S) % K: K × S
                    // distinct tuples, every service in turn.
                    let batch = (due - done).min(64);
                    let first = next.fetch_add(batch, Ordering::Relaxed);
                    for f in first..first + batch {
                        let i = (f % services as u64) as usize;
                        let k = ((f / services as u64) % LOAD_SOCKETS as u64) as usize;
                        if sockets[k]
                            .send_to(&payload, SocketAddrV4::new(cluster_ip(i), 53))
                            .is_ok()
                        {
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    done += batch;
                }
            })
        };
        let backend = {
            let stop = stop.clone();
            let sock = UdpSocket::bind("0.0.0.0:5353").expect("bind the backend");
            sock.set_read_timeout(Some(Duration::from_millis(50)))
                .expect("backend timeout");
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    let _ = sock.recv_from(&mut buf);
                }
            })
        };
        Load {
            stop,
            sent,
            started: Instant::now(),
            threads: vec![sender, backend],
        }
    }

    /// Packets sent so far and the rate achieved.
    fn sent(&self) -> (u64, f64) {
        let n = self.sent.load(Ordering::Relaxed);
        (n, n as f64 / self.started.elapsed().as_secs_f64())
    }

    fn stop(self) -> (u64, f64) {
        let out = self.sent();
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("load thread");
        }
        out
    }
}

// ---------------------------------------------------------------------------------
// One table size

#[derive(Debug, Clone)]
struct LoadRow {
    round: usize,
    sync: SyncRun,
    /// Packets sent and the rate achieved, and packets sent before the sync
    /// began, while loaded.
    flows: Option<((u64, f64), u64)>,
}

#[derive(Debug, Clone)]
struct SizeResult {
    entries: usize,
    first_sync: Duration,
    insert: Duration,
    insert_failures: usize,
    remove: SyncRun,
    expected_deletes: usize,
    load_rows: Vec<LoadRow>,
}

fn measure(n: usize, args: Args) -> SizeResult {
    run_ip("link set lo up");
    // Endpoints (10.128/9) and clients (10.192/10, 10.254.0.1) are local addresses.
    run_ip("route add local 10.128.0.0/9 dev lo");
    // ClusterIPs need a route for the first lookup, before the DNAT re-routes.
    run_ip("route add local 10.96.0.0/16 dev lo");
    let cfg = Config {
        hostname_override: Some("node-a".into()),
        ..Config::default()
    };
    let mode = NftablesMode::new(NetlinkDataplane::new().expect("nft socket"));
    let mut driver = Driver::new(&cfg, mode, MeteredHost::default());
    let started = Instant::now();
    driver
        .sync_once(cluster(args.services))
        .expect("first sync");
    let first_sync = started.elapsed();

    let mut ins = CtInserter::open();
    let started = Instant::now();
    for m in 0..n {
        let (orig, reply) = prefill_entry(m, args.services);
        ins.push(orig, reply, INSERT_TIMEOUT_SECS);
    }
    ins.flush();
    let insert = started.elapsed();
    let count = conntrack_count();
    assert_eq!(
        count, n,
        "entries after inserting {n} ({} failures, first errno {:?})",
        ins.failures, ins.first_errno
    );

    let range = 0..args.remove;
    let expected_deletes = prefill_to_second(n, args.services, &range);
    let remove = timed_sync(&mut driver, drop_second_endpoints(range));
    assert_eq!(remove.deleted, expected_deletes, "entries deleted");
    assert_eq!(conntrack_count(), n - expected_deletes, "entries left");

    let mut load_rows = Vec::new();
    let next_flow = Arc::new(AtomicU64::new(0));
    let mut base = args.remove;
    for round in 0..args.rounds {
        for loaded in [false, true] {
            let range = base..base + args.remove;
            base += args.remove;
            let load = loaded.then(|| {
                let l = Load::start(args.rate, args.services, next_flow.clone());
                // Let the flows ramp up and the table take them.
                std::thread::sleep(Duration::from_secs(1));
                l
            });
            let ramp = load.as_ref().map(|l| l.sent().0);
            let sync = timed_sync(&mut driver, drop_second_endpoints(range));
            let flows = load.map(Load::stop).zip(ramp);
            load_rows.push(LoadRow { round, sync, flows });
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    SizeResult {
        entries: n,
        first_sync,
        insert,
        insert_failures: ins.failures,
        remove,
        expected_deletes,
        load_rows,
    }
}

// ---------------------------------------------------------------------------------
// Output

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn kib_of(bytes: u64) -> String {
    if bytes >= 10 << 20 {
        mib(bytes >> 10)
    } else {
        format!("{:.0} KiB", bytes as f64 / 1024.0)
    }
}

fn main() {
    let args = parse_args();
    let largest = *args.sizes.iter().max().expect("a size");
    // Room for the load: every loaded sync adds `rate` flows a second.
    let headroom = args.rate * (2 + 10) * args.rounds + 100_000;
    let _global = GlobalConntrack::raise(largest + headroom);
    let mut results = Vec::new();
    for &n in &args.sizes {
        let a = args.clone();
        println!("== {n} entries, {} UDP services", args.services);
        let r = in_private_netns(move || measure(n, a));
        println!(
            "   first sync {}, inserted {} in {} ({:.0}/s), removal sync {} (cleanup {}, {} deleted, peak heap +{}, peak RSS +{})",
            ms(r.first_sync),
            r.entries,
            ms(r.insert),
            r.entries as f64 / r.insert.as_secs_f64(),
            ms(r.remove.took),
            ms(r.remove.cleanup),
            r.remove.deleted,
            kib_of(r.remove.heap_growth),
            mib(r.remove.peak_growth_kib)
        );
        results.push(r);
    }

    println!();
    println!(
        "### Stale-flow cleanup: one sync removing {} endpoints of {} UDP services",
        args.remove, args.services
    );
    println!();
    println!(
        "| entries | insert (ctnetlink) | insert rate | sync | cleanup | cleanup CPU user / sys | cleanup share | deleted | cleanup peak heap growth | cleanup peak RSS growth |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {} | {:.0}/s | {} | {} | {} / {} | {:.0}% | {} | {} | {} |",
            r.entries,
            ms(r.insert),
            r.entries as f64 / r.insert.as_secs_f64(),
            ms(r.remove.took),
            ms(r.remove.cleanup),
            ms(r.remove.cpu.0),
            ms(r.remove.cpu.1),
            100.0 * r.remove.cleanup.as_secs_f64() / r.remove.took.as_secs_f64(),
            r.remove.deleted,
            kib_of(r.remove.heap_growth),
            mib(r.remove.peak_growth_kib),
        );
        assert_eq!(r.insert_failures, 0);
        assert_eq!(r.remove.deleted, r.expected_deletes);
    }
    println!();
    println!(
        "### Syncs removing {} endpoints each, without and with {} new UDP flows/s (real packets)",
        args.remove, args.rate
    );
    println!();
    println!(
        "| entries at start | round | load (sent, rate) | table at sync | sync | cleanup | cleanup share | sync − cleanup | deleted |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &results {
        for row in &r.load_rows {
            let load = match row.flows {
                Some(((sent, rate), ramp)) => {
                    format!("{sent} pkts ({ramp} before the sync), {rate:.0}/s")
                }
                None => "none".into(),
            };
            let s = &row.sync;
            println!(
                "| {} | {} | {} | {} | {} | {} | {:.0}% | {} | {} |",
                r.entries,
                row.round + 1,
                load,
                s.table_before,
                ms(s.took),
                ms(s.cleanup),
                100.0 * s.cleanup.as_secs_f64() / s.took.as_secs_f64(),
                ms(s.took.saturating_sub(s.cleanup)),
                s.deleted,
            );
        }
    }
}
