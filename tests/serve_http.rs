//! The HTTP servers over real loopback sockets (127.0.0.1 only, ports from `:0`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use kube_nlproxy::serve::{
    FakeClock, Metrics, NodeEligibility, ProxyHealth, ServiceHealthServer, serve_health,
    serve_health_on, serve_metrics_on,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// 2024-05-01T10:00:00Z, a Wednesday.
const T0: u64 = 1_714_557_600;

fn clock() -> Arc<FakeClock> {
    Arc::new(FakeClock::new(UNIX_EPOCH + Duration::from_secs(T0)))
}

fn health(clock: &Arc<FakeClock>) -> Arc<ProxyHealth> {
    Arc::new(ProxyHealth::new(Duration::from_secs(30)).with_clock(clock.clone()))
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind((LOOPBACK, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn request(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: Go-http-client/1.1\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

async fn get(addr: SocketAddr, path: &str) -> String {
    request(addr, "GET", path).await.unwrap()
}

fn status(resp: &str) -> u16 {
    resp[9..12].parse().unwrap()
}

fn body(resp: &str) -> &str {
    resp.split_once("\r\n\r\n").unwrap().1
}

fn svc(ns: &str, name: &str) -> (String, String) {
    (ns.to_string(), name.to_string())
}

#[tokio::test]
async fn health_check_node_port_bytes_match_upstream() {
    let clock = clock();
    let health = health(&clock);
    health.updated();
    let hcs = ServiceHealthServer::new(Some(vec![LOOPBACK]), health.clone());
    let port = free_port();
    hcs.sync_services(BTreeMap::from([(svc("ns", "svc"), port)]))
        .await;
    hcs.sync_endpoints(BTreeMap::from([(svc("ns", "svc"), 2)]));
    let addr = SocketAddr::new(LOOPBACK, port);

    // What Go's net/http writes for upstream's hcHandler, client sent Connection: close:
    // the handler's headers sorted, then Date, Content-Length, Connection (the order of
    // its `extraHeader.Write`).
    let expected = "HTTP/1.1 200 OK\r\n\
        Content-Type: application/json\r\n\
        X-Content-Type-Options: nosniff\r\n\
        X-Load-Balancing-Endpoint-Weight: 2\r\n\
        Date: Wed, 01 May 2024 10:00:00 GMT\r\n\
        Content-Length: 109\r\n\
        Connection: close\r\n\
        \r\n\
        {\n\
        \t\"service\": {\n\
        \t\t\"namespace\": \"ns\",\n\
        \t\t\"name\": \"svc\"\n\
        \t},\n\
        \t\"localEndpoints\": 2,\n\
        \t\"serviceProxyHealthy\": true\n\
        }";
    assert_eq!(get(addr, "/").await, expected);
    // Any path, any method.
    assert_eq!(get(addr, "/whatever?x=1").await, expected);

    // No local endpoints: 503, weight 0.
    hcs.sync_endpoints(BTreeMap::new());
    let expected = "HTTP/1.1 503 Service Unavailable\r\n\
        Content-Type: application/json\r\n\
        X-Content-Type-Options: nosniff\r\n\
        X-Load-Balancing-Endpoint-Weight: 0\r\n\
        Date: Wed, 01 May 2024 10:00:00 GMT\r\n\
        Content-Length: 109\r\n\
        Connection: close\r\n\
        \r\n\
        {\n\
        \t\"service\": {\n\
        \t\t\"namespace\": \"ns\",\n\
        \t\t\"name\": \"svc\"\n\
        \t},\n\
        \t\"localEndpoints\": 0,\n\
        \t\"serviceProxyHealthy\": true\n\
        }";
    assert_eq!(get(addr, "/").await, expected);

    // Endpoints but the proxy is unhealthy (queued 2 x syncPeriod ago): 503.
    hcs.sync_endpoints(BTreeMap::from([(svc("ns", "svc"), 1)]));
    health.queued_update();
    clock.step(Duration::from_secs(60));
    let r = get(addr, "/").await;
    assert_eq!(status(&r), 503);
    assert!(r.contains("X-Load-Balancing-Endpoint-Weight: 1\r\n"));
    assert!(body(&r).ends_with("\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": false\n}"));

    // A node that is being deleted does not matter here (only /healthz looks at it).
    health.updated();
    health.set_node(Some(NodeEligibility::Deleting));
    assert_eq!(status(&get(addr, "/").await), 200);

    // HEAD: headers only.
    let r = request(addr, "HEAD", "/").await.unwrap();
    assert!(
        r.ends_with("Content-Length: 109\r\nConnection: close\r\n\r\n"),
        "{r}"
    );
}

#[tokio::test]
async fn listeners_follow_services() {
    let clock = clock();
    let health = health(&clock);
    let hcs = ServiceHealthServer::new(Some(vec![LOOPBACK]), health);
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let a = SocketAddr::new(LOOPBACK, pa);
    let b = SocketAddr::new(LOOPBACK, pb);
    let c = SocketAddr::new(LOOPBACK, pc);

    hcs.sync_services(BTreeMap::from([(svc("ns", "a"), pa), (svc("ns", "b"), pb)]))
        .await;
    assert!(get(a, "/").await.contains("\"name\": \"a\""));
    assert!(get(b, "/").await.contains("\"name\": \"b\""));

    // b goes away: its port refuses connections.
    hcs.sync_services(BTreeMap::from([(svc("ns", "a"), pa)]))
        .await;
    assert_eq!(
        TcpStream::connect(b).await.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    assert_eq!(status(&get(a, "/").await), 503);

    // a moves to another port; another service takes a's old one in the same sync.
    hcs.sync_services(BTreeMap::from([(svc("ns", "a"), pc), (svc("ns", "d"), pa)]))
        .await;
    assert!(get(c, "/").await.contains("\"name\": \"a\""));
    assert!(get(a, "/").await.contains("\"name\": \"d\""));
    assert_eq!(
        hcs.open_ports(),
        BTreeMap::from([(svc("ns", "a"), pc), (svc("ns", "d"), pa)])
    );

    // A port held by someone else: logged, not fatal, retried on the next sync.
    let blocker = std::net::TcpListener::bind(b).unwrap();
    let set = BTreeMap::from([
        (svc("ns", "a"), pc),
        (svc("ns", "d"), pa),
        (svc("ns", "e"), pb),
    ]);
    hcs.sync_services(set.clone()).await;
    assert!(!hcs.open_ports().contains_key(&svc("ns", "e")));
    drop(blocker);
    hcs.sync_services(set).await;
    assert_eq!(hcs.open_ports().get(&svc("ns", "e")), Some(&pb));
    assert!(get(b, "/").await.contains("\"name\": \"e\""));

    // Everything removed.
    hcs.sync_services(BTreeMap::new()).await;
    for addr in [a, b, c] {
        assert!(TcpStream::connect(addr).await.is_err(), "{addr} still open");
    }
}

async fn start_health(health: Arc<ProxyHealth>, metrics: Arc<Metrics>) -> SocketAddr {
    let l = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve_health_on(l, health, metrics));
    addr
}

#[tokio::test]
async fn healthz_and_livez_across_the_state_machine() {
    let clock = clock();
    let health = health(&clock);
    let metrics = Arc::new(Metrics::new());
    let addr = start_health(health.clone(), metrics.clone()).await;

    // Fresh start, no sync yet: /healthz 503 until the first sync (a rollout
    // waits for the node to be programmed), /livez 200 from the first second.
    let r = get(addr, "/healthz").await;
    assert_eq!(
        r,
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\n\
         Date: Wed, 01 May 2024 10:00:00 GMT\r\nContent-Length: 111\r\nConnection: close\r\n\r\n\
         {\"lastUpdated\":\"0001-01-01T00:00:00Z\",\"currentTime\":\"2024-05-01T10:00:00Z\",\"nodeEligible\":true,\"healthy\":false}"
    );
    assert_eq!(status(&get(addr, "/livez").await), 200);

    // Sync loop starts, a change is queued and not synced for 2 x syncPeriod.
    health.updated();
    clock.step(Duration::from_secs(5));
    health.queued_update();
    clock.step(Duration::from_millis(59_500));
    assert_eq!(status(&get(addr, "/healthz").await), 200);
    clock.step(Duration::from_millis(500));
    let r = get(addr, "/healthz").await;
    assert_eq!(status(&r), 503);
    assert_eq!(
        body(&r),
        "{\"lastUpdated\":\"2024-05-01T10:00:00Z\",\"currentTime\":\"2024-05-01T10:01:05Z\",\"nodeEligible\":true,\"healthy\":false,\
         \"status\":{\"IPv4\":{\"lastUpdated\":\"2024-05-01T10:00:00Z\",\"healthy\":false},\"IPv6\":{\"lastUpdated\":\"2024-05-01T10:00:00Z\",\"healthy\":false}}}"
    );
    let r = get(addr, "/livez").await;
    assert_eq!(status(&r), 503);
    assert!(!body(&r).contains("nodeEligible"));

    // The sync succeeds.
    clock.step(Duration::from_millis(250));
    health.updated();
    let r = get(addr, "/livez").await;
    assert_eq!(status(&r), 200);
    assert_eq!(
        body(&r),
        "{\"lastUpdated\":\"2024-05-01T10:01:05.25Z\",\"currentTime\":\"2024-05-01T10:01:05.25Z\",\"healthy\":true,\
         \"status\":{\"IPv4\":{\"lastUpdated\":\"2024-05-01T10:01:05.25Z\",\"healthy\":true},\"IPv6\":{\"lastUpdated\":\"2024-05-01T10:01:05.25Z\",\"healthy\":true}}}"
    );

    // Node missing, deleting, tainted: /healthz 503, /livez 200.
    for node in [
        None,
        Some(NodeEligibility::Deleting),
        Some(NodeEligibility::ToBeDeleted),
    ] {
        health.set_node(node);
        let r = get(addr, "/healthz").await;
        assert_eq!(status(&r), 503, "{node:?}");
        assert!(
            body(&r).contains("\"nodeEligible\":false,\"healthy\":true"),
            "{r}"
        );
        assert_eq!(status(&get(addr, "/livez").await), 200, "{node:?}");
    }
    health.set_node(Some(NodeEligibility::Eligible));
    assert_eq!(status(&get(addr, "/healthz").await), 200);

    // Unknown path: Go's NotFound.
    let r = get(addr, "/metrics").await;
    assert_eq!(status(&r), 404);
    assert_eq!(body(&r), "404 page not found\n");

    // Probes were counted: healthz 200 x2 (59.5 s, eligible again), 503 x5
    // (start, stale, three ineligible nodes); livez 503 x1, 200 x5.
    let text = metrics.render();
    for line in [
        "kubeproxy_proxy_healthz_total{code=\"200\"} 2",
        "kubeproxy_proxy_healthz_total{code=\"503\"} 5",
        "kubeproxy_proxy_livez_total{code=\"200\"} 5",
        "kubeproxy_proxy_livez_total{code=\"503\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
}

#[tokio::test]
async fn metrics_server_routes() {
    let metrics = Arc::new(Metrics::new());
    metrics.add_service_changes(3);
    let l = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve_metrics_on(l, metrics.clone(), "nftables"));

    let r = get(addr, "/metrics").await;
    assert_eq!(status(&r), 200);
    assert!(r.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    assert!(body(&r).contains("\nkubeproxy_sync_proxy_rules_service_changes_total 3\n"));
    assert!(body(&r).contains("# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\n"));
    metrics.add_service_changes(1);
    assert!(
        body(&get(addr, "/metrics").await)
            .contains("\nkubeproxy_sync_proxy_rules_service_changes_total 4\n")
    );

    let r = get(addr, "/proxyMode").await;
    assert_eq!(status(&r), 200);
    assert!(r.contains("\r\nContent-Type: text/plain; charset=utf-8\r\n"));
    assert_eq!(body(&r), "nftables");
    assert_eq!(body(&get(addr, "/healthz").await), "ok");
    assert_eq!(status(&get(addr, "/livez").await), 404);
}

#[tokio::test]
async fn bind_errors_are_returned() {
    let taken = std::net::TcpListener::bind((LOOPBACK, 0)).unwrap();
    let addr = taken.local_addr().unwrap();
    let clock = clock();
    let err = serve_health(addr, health(&clock), Arc::new(Metrics::new()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
}

#[tokio::test]
async fn bad_requests_do_not_kill_the_server() {
    let clock = clock();
    let addr = start_health(health(&clock), Arc::new(Metrics::new())).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"nonsense\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    // A client that hangs up mid-request.
    drop(TcpStream::connect(addr).await.unwrap());
    assert_eq!(status(&get(addr, "/livez").await), 200);
}

/// Read one response from a kept-alive connection: its head, then `Content-Length`
/// bytes of body unless `head_only`.
async fn read_response(s: &mut TcpStream, head_only: bool) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .map_or(0, |v| v.parse().unwrap());
            let total = end + 4 + if head_only { 0 } else { length };
            while buf.len() < total {
                let n = s.read(&mut chunk).await.unwrap();
                assert_ne!(n, 0, "closed mid-response: {head}");
                buf.extend_from_slice(&chunk[..n]);
            }
            assert_eq!(buf.len(), total, "more than one response");
            return String::from_utf8(buf).unwrap();
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert_ne!(n, 0, "closed before a response");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Whether the server has closed `s` (reads EOF or a reset).
async fn closed(s: &mut TcpStream) -> bool {
    matches!(s.read(&mut [0u8; 1]).await, Ok(0) | Err(_))
}

#[tokio::test]
async fn keep_alive_probes() {
    let clock = clock();
    let health = health(&clock);
    health.updated();
    let addr = start_health(health.clone(), Arc::new(Metrics::new())).await;

    // HTTP/1.1, as Go's client (kubelet with keep-alive, Prometheus) sends it:
    // several requests on one connection, HEAD among them, no Connection header.
    let mut s = TcpStream::connect(addr).await.unwrap();
    for (method, path, code) in [
        ("GET", "/healthz", 200),
        ("HEAD", "/livez", 200),
        ("GET", "/livez", 200),
        ("GET", "/nope", 404),
        ("GET", "/healthz", 200),
    ] {
        s.write_all(
            format!(
                "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: Go-http-client/1.1\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let r = read_response(&mut s, method == "HEAD").await;
        assert_eq!(status(&r), code, "{r}");
        assert!(r.starts_with("HTTP/1.1 "), "{r}");
        assert!(!r.contains("Connection:"), "{r}");
        assert_eq!(r.ends_with("\r\n\r\n"), method == "HEAD", "{r}");
    }
    // The last one asks to close: answered with `Connection: close`, then closed.
    s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut s, false).await;
    assert!(r.contains("\r\nConnection: close\r\n\r\n"), "{r}");
    assert!(closed(&mut s).await);

    // HTTP/1.0 without keep-alive (a plain health checker): one answer in 1.0, closed.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.unwrap();
    let r = read_response(&mut s, false).await;
    assert!(r.starts_with("HTTP/1.0 200 OK\r\n"), "{r}");
    assert!(!r.contains("Connection:"), "{r}");
    assert!(closed(&mut s).await);

    // HTTP/1.0 with `Connection: keep-alive` (some cloud load balancers): kept open
    // for as long as the client asks, each answer saying so.
    let mut s = TcpStream::connect(addr).await.unwrap();
    for method in ["GET", "HEAD", "GET"] {
        s.write_all(
            format!("{method} /livez HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let r = read_response(&mut s, method == "HEAD").await;
        assert!(r.starts_with("HTTP/1.0 200 OK\r\n"), "{r}");
        assert!(r.contains("\r\nConnection: keep-alive\r\n\r\n"), "{r}");
    }
    s.write_all(b"GET /livez HTTP/1.0\r\n\r\n").await.unwrap();
    assert_eq!(status(&read_response(&mut s, false).await), 200);
    assert!(closed(&mut s).await);
}

#[tokio::test]
async fn health_check_node_port_keeps_a_load_balancers_connection() {
    let clock = clock();
    let health = health(&clock);
    health.updated();
    let hcs = ServiceHealthServer::new(Some(vec![LOOPBACK]), health);
    let port = free_port();
    hcs.sync_services(BTreeMap::from([(svc("ns", "svc"), port)]))
        .await;
    let addr = SocketAddr::new(LOOPBACK, port);
    let mut s = TcpStream::connect(addr).await.unwrap();
    // The endpoint count changes between probes on the same connection.
    for count in [0, 3, 1] {
        hcs.sync_endpoints(BTreeMap::from([(svc("ns", "svc"), count)]));
        s.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\n\r\n")
            .await
            .unwrap();
        let r = read_response(&mut s, false).await;
        assert_eq!(status(&r), if count == 0 { 503 } else { 200 });
        assert!(r.contains(&format!(
            "\r\nX-Load-Balancing-Endpoint-Weight: {count}\r\n"
        )));
    }
    // Closing the service's health check closes its open connections too.
    hcs.sync_services(BTreeMap::new()).await;
    assert!(closed(&mut s).await);
}

#[tokio::test]
async fn request_bodies_are_not_read() {
    let clock = clock();
    let addr = start_health(health(&clock), Arc::new(Metrics::new())).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    // A body announced as 1 GiB, of which 1 KiB is sent: answered, then closed
    // without waiting for the rest.
    s.write_all(b"POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n")
        .await
        .unwrap();
    s.write_all(&[b'a'; 1024]).await.unwrap();
    let r = read_response(&mut s, false).await;
    assert_eq!(status(&r), 200, "{r}");
    assert!(closed(&mut s).await);
    assert_eq!(status(&get(addr, "/livez").await), 200);
}
