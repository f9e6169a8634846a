//! The HTTP/1.x server behind every port we serve: hyper's HTTP/1 connection does the
//! parsing, framing and keep-alive on a tokio `TcpListener`; this module adds the
//! limits a port open to the network needs ([`Limits`]) and lays responses out as
//! Go's `net/http` writes them.
//!
//! On the wire a response is: status line (`HTTP/1.0` to a 1.0 client), the handler's
//! headers sorted by name, `Date`, `Content-Length`, then `Connection: close` when a
//! 1.1 client asked to close or `Connection: keep-alive` when a 1.0 client asked to
//! keep the connection; header names in Go's canonical case. Keep-alive is HTTP/1.1's
//! default and HTTP/1.0's on request. Request bodies are never read: a request with
//! a body is answered, then its connection closed.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, CONTENT_LENGTH, DATE, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{StatusCode, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::VecDeque;
use tokio::io::{AsyncRead, AsyncWrite};

use tokio::net::{TcpListener, TcpSocket};
use tokio::task::{AbortHandle, JoinSet};

use super::format::http_date;
use super::health::{Clock, ProxyHealth};
use super::metrics::Metrics;

/// `Content-Type` of `/metrics` (Prometheus text format 0.0.4).
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long [`serve`] waits after a failed `accept` (EMFILE, ENFILE, ENOMEM) before
/// trying again, so a process out of descriptors does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The listen backlog we ask for (the kernel caps it at `net.core.somaxconn`, 4096
/// by default), as Go's listeners do: a burst of probes or connections waits in
/// the accept queue instead of in SYN retransmits.
const LISTEN_BACKLOG: u32 = 4096;

/// A listening socket on `addr` with `SO_REUSEADDR` (as the standard library's
/// listeners have) and a backlog of [`LISTEN_BACKLOG`]. An unspecified IPv6
/// address (`[::]`) takes IPv4 too unless the node set `net.ipv6.bindv6only`.
pub fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// What one listener accepts. Go's servers in kube-proxy set none of these; a port
/// open to every client of the node needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// How long a client may take to send a whole request head, counted from the
    /// connection's start and again from the end of each response: it closes slow
    /// heads (slowloris), silent connections and idle keep-alive connections alike.
    pub header_timeout: Duration,
    /// Largest request head (request line and headers) in bytes; a larger one is
    /// answered 431 and its connection closed. It also bounds each connection's read
    /// buffer (hyper's floor for that buffer is 8 KiB).
    pub max_head_bytes: usize,
    /// Connections served at once. A new connection over it is served and the
    /// oldest one closed: whoever holds many connections open cannot keep a
    /// probe out (a load balancer's health check reaches a healthCheckNodePort
    /// however many idle or slow clients hold it), and memory stays bounded.
    pub max_connections: usize,
}

impl Default for Limits {
    /// 10 s for a head (probes send theirs in one packet), 16 KiB of head (probes
    /// send a few hundred bytes; kubelet's `httpHeaders` are small), 1024
    /// connections per listener.
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            max_head_bytes: 16 * 1024,
            max_connections: 1024,
        }
    }
}

impl Limits {
    /// hyper's HTTP/1 connection settings for these limits.
    fn builder(&self) -> http1::Builder {
        let mut b = http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout)
            .max_header_size(self.max_head_bytes)
            // hyper panics below its 8 KiB minimum.
            .max_buf_size(self.max_head_bytes.max(8 * 1024))
            .keep_alive(true)
            .title_case_headers(true)
            // Date comes from our clock (tests pin it).
            .auto_date_header(false);
        b
    }
}

/// The parts of a request the handlers look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `HEAD`, …
    pub method: String,
    /// The path, without the query string.
    pub path: String,
}

/// A response before framing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header name/value pairs in Go's canonical case (sorted by name when written).
    pub headers: Vec<(&'static str, String)>,
    /// Body (omitted on the wire for `HEAD`).
    pub body: Vec<u8>,
}

impl Response {
    /// A response with headers `Content-Type: content_type` and
    /// `X-Content-Type-Options: nosniff`, as every kube-proxy handler sets.
    pub fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status,
            headers: vec![
                ("Content-Type", content_type.to_string()),
                ("X-Content-Type-Options", "nosniff".into()),
            ],
            body: body.into(),
        }
    }

    /// Go's `http.NotFound`.
    pub fn not_found() -> Self {
        Response::new(404, "text/plain; charset=utf-8", "404 page not found\n")
    }

    /// Add a header.
    #[must_use]
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// The hyper response: the handler's headers sorted by name, then `Date: date`,
    /// `Content-Length`, and `Connection: keep-alive` if `http10_keep_alive` (hyper
    /// adds `Connection: close` itself after those when it will close). A header
    /// that is not a valid name or value is left out and logged. `head_only` sends
    /// the length but no body.
    fn into_hyper(
        self,
        date: &str,
        head_only: bool,
        http10_keep_alive: bool,
    ) -> hyper::Response<Full<Bytes>> {
        let length = self.body.len();
        let body = if head_only { Vec::new() } else { self.body };
        let mut resp = hyper::Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut headers = self.headers;
        headers.sort_by(|a, b| a.0.cmp(b.0));
        let map = resp.headers_mut();
        for (name, value) in headers {
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                (Ok(n), Ok(v)) => {
                    map.append(n, v);
                }
                _ => tracing::warn!(name, value, "response header left out: not valid HTTP"),
            }
        }
        if let Ok(d) = HeaderValue::from_str(date) {
            map.insert(DATE, d);
        }
        map.insert(CONTENT_LENGTH, HeaderValue::from(length));
        if http10_keep_alive {
            map.insert(CONNECTION, HeaderValue::from_static("keep-alive"));
        }
        resp
    }
}

/// A request handler.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Whether a `Connection` header lists `token` (case-insensitive, comma-separated).
fn connection_has(req: &hyper::Request<Incoming>, token: &str) -> bool {
    req.headers()
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Answer one request with `handler`. A target whose path does not start with `/`
/// (`GET healthz`, `OPTIONS *`) is a 400, as Go's request parser makes it; an
/// absolute-form target (`http://host/livez`) is routed on its path.
fn respond(
    req: &hyper::Request<Incoming>,
    clock: &dyn Clock,
    handler: &Handler,
) -> hyper::Response<Full<Bytes>> {
    let path = req.uri().path();
    let resp = if path.starts_with('/') {
        handler(&Request {
            method: req.method().as_str().to_string(),
            path: path.to_string(),
        })
    } else {
        Response::new(400, "text/plain; charset=utf-8", "400 Bad Request")
    };
    let http10_keep_alive = req.version() == Version::HTTP_10 && connection_has(req, "keep-alive");
    resp.into_hyper(
        &http_date(clock.now()),
        req.method() == hyper::Method::HEAD,
        http10_keep_alive,
    )
}

/// Serve HTTP/1 requests on one connection until the client closes it, a limit
/// closes it, or it fails.
pub async fn serve_connection<I>(
    io: I,
    builder: &http1::Builder,
    clock: Arc<dyn Clock>,
    handler: Handler,
) -> Result<(), hyper::Error>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        std::future::ready(Ok::<_, Infallible>(respond(&req, clock.as_ref(), &handler)))
    });
    builder.serve_connection(TokioIo::new(io), service).await
}

/// Whether an `accept` error concerns only the connection being accepted (its client
/// gave up), so the next `accept` may follow at once.
fn connection_only(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// Accept connections on `listener` forever, answering with `handler` within the
/// default [`Limits`].
pub async fn serve(
    listener: TcpListener,
    clock: Arc<dyn Clock>,
    handler: Handler,
) -> io::Result<()> {
    serve_with(listener, clock, handler, Limits::default()).await
}

/// Accept connections on `listener` forever, each served in its own task within
/// `limits`; over `max_connections` the oldest connection is closed. The
/// connections belong to this future: dropping it (aborting its task) closes them
/// with the listener. Connection errors are logged; a failed `accept` is logged
/// and retried after `ACCEPT_BACKOFF` (100 ms).
pub async fn serve_with(
    listener: TcpListener,
    clock: Arc<dyn Clock>,
    handler: Handler,
    limits: Limits,
) -> io::Result<()> {
    let local = listener.local_addr().ok();
    let builder = limits.builder();
    let mut conns = JoinSet::new();
    // The open connections, oldest first (ended ones are dropped lazily: an
    // aborted handle of a finished task does nothing).
    let mut by_age: VecDeque<AbortHandle> = VecDeque::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if conns.len() >= limits.max_connections.max(1) {
                        tracing::debug!(?local, limit = limits.max_connections, "too many connections; closing the oldest");
                        while let Some(oldest) = by_age.pop_front() {
                            if !oldest.is_finished() {
                                oldest.abort();
                                // One task leaves the set: the aborted one (at
                                // once), or one that ended meanwhile.
                                let _ = conns.join_next().await;
                                break;
                            }
                        }
                    }
                    let (builder, clock, handler) = (builder.clone(), clock.clone(), handler.clone());
                    by_age.push_back(conns.spawn(async move {
                        if let Err(e) = serve_connection(stream, &builder, clock, handler).await {
                            tracing::debug!(?local, %peer, error = %e, "HTTP connection failed");
                        }
                    }));
                }
                Err(e) if connection_only(&e) => {
                    tracing::debug!(?local, error = %e, "accept failed for one connection");
                }
                Err(e) => {
                    tracing::warn!(?local, error = %e, "accept failed; backing off");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {
                // Keep the age queue as long as the set, at most.
                while by_age.front().is_some_and(AbortHandle::is_finished) {
                    by_age.pop_front();
                }
                if by_age.len() > 2 * limits.max_connections.max(1) {
                    by_age.retain(|h| !h.is_finished());
                }
            }
        }
    }
}

/// The `/healthz` + `/livez` handler (upstream `ProxyHealthServer`), counting
/// `kubeproxy_proxy_healthz_total` / `kubeproxy_proxy_livez_total`.
pub fn health_handler(health: Arc<ProxyHealth>, metrics: Arc<Metrics>) -> Handler {
    Arc::new(move |req: &Request| match req.path.as_str() {
        "/healthz" => {
            let r = health.healthz();
            metrics.inc_healthz(r.code);
            Response::new(r.code, "application/json", r.body)
        }
        "/livez" => {
            let r = health.livez();
            metrics.inc_livez(r.code);
            Response::new(r.code, "application/json", r.body)
        }
        _ => Response::not_found(),
    })
}

/// The metrics-port handler: `/metrics`, `/proxyMode`, `/status` (JSON, for
/// `kube-nlproxy status`) and `/healthz` answering
/// `ok` like the generic `healthz.InstallHandler` kube-proxy mounts there.
pub fn metrics_handler(metrics: Arc<Metrics>, proxy_mode: &'static str) -> Handler {
    Arc::new(move |req: &Request| match req.path.as_str() {
        "/metrics" => Response::new(200, METRICS_CONTENT_TYPE, metrics.render()),
        "/proxyMode" => Response::new(200, "text/plain; charset=utf-8", proxy_mode),
        "/status" => Response::new(200, "application/json", metrics.status.json()),
        "/healthz" => Response::new(200, "text/plain; charset=utf-8", "ok"),
        _ => Response::not_found(),
    })
}

/// Serve `/healthz` and `/livez` on `addr` (`--healthz-bind-address`). Returns only
/// on a bind error.
pub async fn serve_health(
    addr: SocketAddr,
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
) -> io::Result<()> {
    let listener = bind_listener(addr)?;
    tracing::info!(%addr, "serving /healthz and /livez");
    serve_health_on(listener, health, metrics).await
}

/// [`serve_health`] on a listener bound by the caller.
pub async fn serve_health_on(
    listener: TcpListener,
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
) -> io::Result<()> {
    let clock = health.clock();
    serve(listener, clock, health_handler(health, metrics)).await
}

/// Serve `/metrics`, `/proxyMode` and `/healthz` on `addr`
/// (`--metrics-bind-address`). Returns only on a bind error.
pub async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    proxy_mode: &'static str,
) -> io::Result<()> {
    let listener = bind_listener(addr)?;
    tracing::info!(%addr, "serving /metrics");
    serve_metrics_on(listener, metrics, proxy_mode).await
}

/// [`serve_metrics`] on a listener bound by the caller.
pub async fn serve_metrics_on(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    proxy_mode: &'static str,
) -> io::Result<()> {
    let clock = metrics.clock();
    serve(listener, clock, metrics_handler(metrics, proxy_mode)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::FakeClock;
    use std::time::UNIX_EPOCH;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const DATE: &str = "Thu, 01 Jan 1970 00:00:00 GMT";

    /// A handler answering like a healthCheckNodePort with 0 endpoints.
    fn weight_zero() -> Handler {
        Arc::new(|req: &Request| {
            if req.path == "/" {
                Response::new(503, "application/json", "{}")
                    .header("X-Load-Balancing-Endpoint-Weight", "0")
            } else {
                Response::not_found()
            }
        })
    }

    /// Send `request` over an in-memory connection and read until the server closes.
    async fn exchange(request: &[u8]) -> String {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let clock: Arc<dyn Clock> = Arc::new(FakeClock::new(UNIX_EPOCH));
        let task = tokio::spawn(async move {
            let _ =
                serve_connection(server, &Limits::default().builder(), clock, weight_zero()).await;
        });
        client.write_all(request).await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        task.await.unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn frames_like_go() {
        // HTTP/1.1 asking to close: Go's order, Connection last.
        assert_eq!(
            exchange(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await,
            format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\n\
                 X-Load-Balancing-Endpoint-Weight: 0\r\nDate: {DATE}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            )
        );
        // HEAD: the length, no body.
        assert_eq!(
            exchange(b"HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await,
            format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\n\
                 X-Load-Balancing-Endpoint-Weight: 0\r\nDate: {DATE}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
            )
        );
        // HTTP/1.0: answered in 1.0, no Connection header, closed. With keep-alive
        // asked: `Connection: keep-alive`, and the next request on the same
        // connection is answered.
        let plain = format!(
            "HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\n\
             X-Load-Balancing-Endpoint-Weight: 0\r\nDate: {DATE}\r\nContent-Length: 2\r\n"
        );
        assert_eq!(
            exchange(b"GET / HTTP/1.0\r\n\r\n").await,
            format!("{plain}\r\n{{}}")
        );
        assert_eq!(
            exchange(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\nGET / HTTP/1.0\r\n\r\n")
                .await,
            format!("{plain}Connection: keep-alive\r\n\r\n{{}}{plain}\r\n{{}}")
        );
    }

    #[tokio::test]
    async fn routes_on_the_path() {
        // Absolute form, query string: routed on the path.
        let r = exchange(b"GET http://10.0.0.1:10256/?verbose HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.0 503 "), "{r}");
        let r = exchange(b"GET /x?y HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.0 404 ") && r.ends_with("\r\n\r\n404 page not found\n"));
        // No leading slash: 400, as Go answers it.
        let r = exchange(b"GET healthz HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.0 400 Bad Request\r\n"), "{r}");
        // Not HTTP at all.
        let r = exchange(b"garbage\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{r}");
    }
}
