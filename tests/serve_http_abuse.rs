//! The HTTP servers under abuse, over real loopback sockets (127.0.0.1 only, ports
//! from `:0`): slow and silent clients, oversized heads, garbage, and 10,000
//! connections to a healthCheckNodePort. Measured numbers are printed to stderr
//! (`cargo test --test serve_http_abuse -- --nocapture`), never asserted beyond
//! generous bounds.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube_nlproxy::serve::http::{Limits, health_handler, serve_with};
use kube_nlproxy::serve::{Metrics, ProxyHealth, ServiceHealthServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// The head timeout of the servers these tests start themselves (short, so slow
/// clients are closed within the test).
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// A bound no healthy run comes near; it only keeps a broken server from hanging
/// the test.
const HANG: Duration = Duration::from_secs(60);

fn healthy() -> Arc<ProxyHealth> {
    let h = Arc::new(ProxyHealth::new(Duration::from_secs(30)));
    h.updated();
    h
}

/// `/healthz` + `/livez` on a fresh loopback port within `limits`.
async fn start(limits: Limits) -> SocketAddr {
    let l = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    let health = healthy();
    let handler = health_handler(health.clone(), Arc::new(Metrics::new()));
    tokio::spawn(serve_with(l, health.clock(), handler, limits));
    addr
}

fn short_timeout() -> Limits {
    Limits {
        header_timeout: HEAD_TIMEOUT,
        ..Limits::default()
    }
}

/// Resident set size of this process, in KiB (`VmRSS` of `/proc/self/status`).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A probe as kubelet sends it (new connection, `Connection: close`); the status code.
async fn probe(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.33\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    let out = String::from_utf8_lossy(&out);
    out.get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {out:?}")))
}

/// What became of a client that never completed its head.
#[derive(Debug)]
struct Ended {
    /// Bytes the server sent back.
    received: usize,
    /// Head bytes this client got out before the server closed.
    sent: usize,
}

/// A client that sends a request head one byte every 300 ms and never finishes it
/// (`slow`), or opens and sends nothing; returns when the server closes.
async fn stalling_client(addr: SocketAddr, slow: bool) -> Ended {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    let mut sent = 0;
    let mut buf = [0u8; 1024];
    let mut received = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(300));
    loop {
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return Ended { received, sent },
                Ok(n) => received += n,
            },
            _ = tick.tick(), if slow => {
                let byte = head.get(sent).copied().unwrap_or(b'a');
                if s.write_all(&[byte]).await.is_err() {
                    return Ended { received, sent };
                }
                sent += 1;
            }
        }
    }
}

#[tokio::test]
async fn slow_and_silent_clients_are_closed_and_probes_answered() {
    let addr = start(short_timeout()).await;
    let clients: Vec<_> = (0..40)
        .map(|i| tokio::spawn(stalling_client(addr, i % 2 == 0)))
        .collect();
    let started = Instant::now();

    // Probe while they stall.
    let mut latencies = Vec::new();
    while clients.iter().any(|c| !c.is_finished()) {
        let t = Instant::now();
        let code = tokio::time::timeout(HEAD_TIMEOUT, probe(addr, "/livez"))
            .await
            .expect("probe not answered within the head timeout")
            .unwrap();
        latencies.push(t.elapsed());
        assert_eq!(code, 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(started.elapsed() < HANG, "stalling clients never closed");
    }
    let closed_after = started.elapsed();
    let mut slow_sent = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let ended = c.await.unwrap();
        // Closed without an answer; the slow ones got some bytes out first.
        assert_eq!(ended.received, 0, "client {i}: {ended:?}");
        if i % 2 == 0 {
            assert!(ended.sent > 0, "client {i}: {ended:?}");
            slow_sent.push(ended.sent);
        }
    }
    assert!(!latencies.is_empty());
    latencies.sort();
    eprintln!(
        "slowloris: 20 slow + 20 silent clients closed after {closed_after:?} (head timeout {HEAD_TIMEOUT:?}), \
         slow ones had sent {}..{} bytes; {} probes meanwhile, latency median {:?}, max {:?}",
        slow_sent.iter().min().unwrap(),
        slow_sent.iter().max().unwrap(),
        latencies.len(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
    );
}

/// Send `head` (ignoring a write cut short by the server) and read what comes back
/// until the server closes; a reset counts as a close.
async fn send_and_read(addr: SocketAddr, head: Vec<u8>) -> String {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        let _ = w.write_all(&head).await;
        w
    });
    let mut out = Vec::new();
    let read = tokio::time::timeout(HANG, async {
        let mut buf = [0u8; 4096];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "server neither answered nor closed");
    drop(writer.await);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn oversized_heads_get_431_or_a_close() {
    let addr = start(short_timeout()).await;
    let mib = 1024 * 1024;
    let one_big_header = [
        b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: ".as_slice(),
        &vec![b'a'; mib],
        b"\r\n\r\n",
    ]
    .concat();
    let many_headers = [
        b"GET /livez HTTP/1.1\r\nHost: x\r\n".as_slice(),
        &b"X-N: 1\r\n".repeat(mib / 8),
        b"\r\n",
    ]
    .concat();
    let long_target = [b"GET /".as_slice(), &vec![b'a'; mib], b" HTTP/1.1\r\n\r\n"].concat();

    let before = rss_kib();
    let mut outcomes = BTreeMap::new();
    for round in 0..4 {
        let sends = (0..32).map(|i| {
            let head = [&one_big_header, &many_headers, &long_target][(i + round) % 3].clone();
            send_and_read(addr, head)
        });
        for out in futures::future::join_all(sends).await {
            let line = out.lines().next().unwrap_or("(closed)").to_string();
            assert!(
                line == "(closed)" || line.starts_with("HTTP/1.1 431 "),
                "{out}"
            );
            *outcomes.entry(line).or_insert(0) += 1;
        }
        assert_eq!(probe(addr, "/livez").await.unwrap(), 200);
    }
    let after = rss_kib();
    eprintln!(
        "oversized heads: 128 requests of 1 MiB heads -> {outcomes:?}; RSS {before} KiB -> {after} KiB ({:+} KiB)",
        after as i64 - before as i64
    );
    // The server buffers at most 16 KiB a connection; 32 at once is well under this.
    assert!(after.saturating_sub(before) < 64 * 1024);
}

/// Bytes that are not an HTTP/1 request.
fn garbage() -> Vec<(&'static str, Vec<u8>)> {
    // xorshift64: the same "random" bytes on every run.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    // A TLS 1.2 record carrying the start of a ClientHello.
    let mut client_hello = vec![
        0x16, 0x03, 0x01, 0x00, 0x2f, 0x01, 0x00, 0x00, 0x2b, 0x03, 0x03,
    ];
    client_hello.extend_from_slice(&random[..32]);
    client_hello.extend_from_slice(&[0x00, 0x00, 0x02, 0x13, 0x01, 0x01, 0x00]);
    // HTTP/2 preface and an empty SETTINGS frame.
    let mut h2 = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    h2.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    vec![
        ("random", random),
        ("binary", b"\x00\x01\x02\xff\xfe\r\n\r\n".to_vec()),
        ("tls client hello", client_hello),
        ("http/2 preface", h2),
        ("no target", b"GET\r\n\r\n".to_vec()),
        ("http/9.9", b"GET / HTTP/9.9\r\n\r\n".to_vec()),
        ("tab in method", b"G\tET / HTTP/1.1\r\n\r\n".to_vec()),
        (
            "header without colon",
            b"GET / HTTP/1.1\r\nBad Header\r\n\r\n".to_vec(),
        ),
        (
            "negative length",
            b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n".to_vec(),
        ),
        (
            "nul in header",
            b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n".to_vec(),
        ),
        ("only newlines", b"\r\n\r\n\r\n\r\n".to_vec()),
    ]
}

#[tokio::test]
async fn garbage_gets_400_or_a_close() {
    let addr = start(short_timeout()).await;
    for (what, bytes) in garbage() {
        let out = send_and_read(addr, bytes).await;
        let line = out.lines().next().unwrap_or("(closed)");
        eprintln!("garbage {what}: {line}");
        assert!(
            line == "(closed)" || line.starts_with("HTTP/1.1 400 "),
            "{what}: {out}"
        );
        assert_eq!(probe(addr, "/livez").await.unwrap(), 200, "after {what}");
    }
}

/// Raise this process's open-file soft limit to at least `n`, and the hard limit if
/// it is lower and the process may (CAP_SYS_RESOURCE).
fn raise_nofile(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < n {
            lim.rlim_cur = n;
            lim.rlim_max = lim.rlim_max.max(n);
            assert_eq!(
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim),
                0,
                "RLIMIT_NOFILE to {n}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

#[tokio::test]
async fn ten_thousand_connections_to_a_health_check_node_port() {
    const CONNS: usize = 10_000;
    // Our clients, the connections the server holds (up to its cap) and slack.
    raise_nofile((CONNS + 2 * Limits::default().max_connections + 512) as u64);
    let hcs = Arc::new(ServiceHealthServer::new(Some(vec![LOOPBACK]), healthy()));
    let port = |_| {
        std::net::TcpListener::bind((LOOPBACK, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (pa, pb) = (port(()), port(()));
    let key = |n: &str| ("ns".to_string(), n.to_string());
    hcs.sync_services(BTreeMap::from([(key("a"), pa)])).await;
    hcs.sync_endpoints(BTreeMap::from([(key("a"), 1)]));
    let addr = SocketAddr::new(LOOPBACK, pa);
    assert_eq!(probe(addr, "/").await.unwrap(), 200);

    // A timer task and a sync loop on the same runtime: both must keep going.
    let ticks = Arc::new(AtomicU64::new(0));
    let syncs = Arc::new(AtomicU64::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            let mut i = tokio::time::interval(Duration::from_millis(10));
            loop {
                i.tick().await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let syncer = tokio::spawn({
        let (hcs, syncs) = (hcs.clone(), syncs.clone());
        async move {
            loop {
                // Service b's health check opens and closes on every other sync.
                let n = syncs.load(Ordering::Relaxed);
                let mut set = BTreeMap::from([(key("a"), pa)]);
                if n % 2 == 0 {
                    set.insert(key("b"), pb);
                }
                hcs.sync_services(set).await;
                hcs.sync_endpoints(BTreeMap::from([(key("a"), 1), (key("b"), n as usize)]));
                syncs.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    let rss_before = rss_kib();
    let (ticks0, syncs0) = (ticks.load(Ordering::Relaxed), syncs.load(Ordering::Relaxed));
    let t = Instant::now();
    let conns: Vec<std::io::Result<TcpStream>> = futures::stream::iter(0..CONNS)
        .map(|_| TcpStream::connect(addr))
        // Many in flight, fewer than the listen backlog we ask for (4096).
        .buffer_unordered(512)
        .collect()
        .await;
    let opened = t.elapsed();
    let conns: Vec<TcpStream> = conns.into_iter().filter_map(Result::ok).collect();
    let (ticks1, syncs1) = (ticks.load(Ordering::Relaxed), syncs.load(Ordering::Relaxed));

    // While they are held: the loops go on (counted, not timed).
    let held_since = Instant::now();
    while syncs.load(Ordering::Relaxed) < syncs1 + 10 {
        assert!(held_since.elapsed() < HANG, "sync loop stalled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (ticks2, syncs2) = (ticks.load(Ordering::Relaxed), syncs.load(Ordering::Relaxed));
    let rss_held = rss_kib();

    // A probe still gets in while they are held: the server closes its oldest
    // connection for it, not the new one.
    assert_eq!(
        probe(addr, "/").await.unwrap(),
        200,
        "a probe among {CONNS} connections"
    );

    // Which connections the server keeps: up to its cap; the oldest are closed.
    // Asked of the kernel (a nonblocking peek), not of the reactor's readiness. A
    // client may count as open for a moment while the server has not been handed it
    // yet (its final ACK was dropped on a full accept queue and the handshake
    // completes on a SYN-ACK retransmit): count again until it settles.
    let conns: Vec<std::net::TcpStream> =
        conns.into_iter().map(|c| c.into_std().unwrap()).collect();
    let cap = Limits::default().max_connections;
    let count = || {
        conns
            .iter()
            .filter(|c| {
                matches!(c.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .count()
    };
    let mut open = count();
    while open > cap {
        assert!(held_since.elapsed() < HANG, "{open} connections still open");
        tokio::time::sleep(Duration::from_millis(100)).await;
        open = count();
    }
    let settled = held_since.elapsed();
    let closed = conns.len() - open;
    eprintln!(
        "{CONNS} connections: {} connected in {opened:?}, {open} held by the server, {closed} closed by it \
         (cap {cap}, settled after {settled:?}); RSS {rss_before} KiB -> {rss_held} KiB ({:+} KiB) with them open; while connecting \
         {} ticks of 10 ms and {} syncs, while held {} ticks and {} syncs",
        conns.len(),
        rss_held as i64 - rss_before as i64,
        ticks1 - ticks0,
        syncs1 - syncs0,
        ticks2 - ticks1,
        syncs2 - syncs1,
    );
    assert_eq!(conns.len(), CONNS);
    // Held up to the cap: the server's head timeout (10 s) has not closed them yet.
    assert!(open > cap / 2 && open <= cap, "{open} held");
    assert!(ticks2 > ticks1 && syncs2 >= syncs1 + 10);
    assert!(rss_held.saturating_sub(rss_before) < 200 * 1024);

    // Once they go, the port answers again.
    drop(conns);
    let freed = Instant::now();
    loop {
        match probe(addr, "/").await {
            Ok(code) => {
                assert_eq!(code, 200);
                break;
            }
            Err(e) => assert!(freed.elapsed() < HANG, "port never answered again: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ticker.abort();
    syncer.abort();
    let _ = syncer.await;
    hcs.sync_services(BTreeMap::new()).await;
    assert!(TcpStream::connect(addr).await.is_err());
}
