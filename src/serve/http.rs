//! A deliberately small HTTP/1.1 server on `tokio::net::TcpListener`: read the request
//! line and headers, answer, close. Enough for probes and scrapes; no keep-alive, no
//! request bodies, no TLS.
//!
//! Responses are laid out as Go's `net/http` writes them for a client that sent
//! `Connection: close`: status line, the handler's headers sorted by name, then
//! `Connection: close`, `Date`, `Content-Length`.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::format::http_date;
use super::health::{Clock, ProxyHealth};
use super::metrics::Metrics;

/// Largest request head we read (Go's `DefaultMaxHeaderBytes` is 1 MiB; probes send
/// a few hundred bytes).
const MAX_HEAD: usize = 64 * 1024;
/// How long a client may take to send its request head (Go servers in kube-proxy
/// set no limit; we do, so a silent client cannot hold a task forever).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// `Content-Type` of `/metrics` (Prometheus text format 0.0.4).
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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
    /// Header name/value pairs (sorted by name when written).
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

    /// The bytes on the wire, with `date` as the `Date` header.
    pub fn to_bytes(&self, date: &str, head_only: bool) -> Vec<u8> {
        let mut headers = self.headers.clone();
        headers.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (k, v) in &headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str(&format!(
            "Connection: close\r\nDate: {date}\r\nContent-Length: {}\r\n\r\n",
            self.body.len()
        ));
        let mut bytes = out.into_bytes();
        if !head_only {
            bytes.extend_from_slice(&self.body);
        }
        bytes
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// A request handler.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Parse `METHOD SP target SP HTTP/x.y` from the head; the target may be in
/// origin form (`/healthz?x`) or absolute form (`http://host/healthz`).
fn parse_head(head: &[u8]) -> Option<Request> {
    let text = std::str::from_utf8(head).ok()?;
    let line = text.split("\r\n").next()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") || method.is_empty() {
        return None;
    }
    let target = match target.find("://") {
        Some(i) => {
            let rest = &target[i + 3..];
            rest.find('/').map_or("/", |j| &rest[j..])
        }
        None => target,
    };
    let path = target.split('?').next().unwrap_or("");
    if !path.starts_with('/') {
        return None;
    }
    Some(Request {
        method: method.to_string(),
        path: path.to_string(),
    })
}

/// Read the request head (up to the blank line).
async fn read_head(stream: &mut TcpStream) -> io::Result<Result<Vec<u8>, u16>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed mid-request",
            ));
        }
        let scan_from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf[scan_from..].windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(scan_from + i + 4);
            return Ok(Ok(buf));
        }
        if buf.len() > MAX_HEAD {
            return Ok(Err(431));
        }
    }
}

async fn handle_conn(
    mut stream: TcpStream,
    clock: &dyn Clock,
    handler: &Handler,
) -> io::Result<()> {
    let head = tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream))
        .await
        .map_err(|_| {
            io::Error::new(io::ErrorKind::TimedOut, "request head not received in time")
        })??;
    let (resp, head_only) = match head {
        Ok(h) => match parse_head(&h) {
            Some(req) => (handler(&req), req.method == "HEAD"),
            None => (
                Response::new(400, "text/plain; charset=utf-8", "400 Bad Request"),
                false,
            ),
        },
        Err(code) => (
            Response::new(code, "text/plain; charset=utf-8", reason(code)),
            false,
        ),
    };
    let bytes = resp.to_bytes(&http_date(clock.now()), head_only);
    stream.write_all(&bytes).await?;
    stream.shutdown().await
}

/// Accept connections on `listener` forever, answering each with `handler`.
/// Per-connection errors are logged; accept errors are logged and retried.
pub async fn serve(
    listener: TcpListener,
    clock: Arc<dyn Clock>,
    handler: Handler,
) -> io::Result<()> {
    let local = listener.local_addr().ok();
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let (clock, handler) = (clock.clone(), handler.clone());
                tokio::spawn(async move {
                    if let Err(e) = handle_conn(stream, clock.as_ref(), &handler).await {
                        tracing::debug!(?local, %peer, error = %e, "HTTP connection failed");
                    }
                });
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(?local, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
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
    let listener = TcpListener::bind(addr).await?;
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
    let listener = TcpListener::bind(addr).await?;
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

    #[test]
    fn parses_request_lines() {
        let r = parse_head(b"GET /healthz?verbose HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", "/healthz"));
        let r = parse_head(b"HEAD http://10.0.0.1:10256/livez HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("HEAD", "/livez"));
        assert!(parse_head(b"GET healthz HTTP/1.1\r\n\r\n").is_none());
        assert!(parse_head(b"garbage\r\n\r\n").is_none());
        assert!(parse_head(b"GET / SPDY/3\r\n\r\n").is_none());
    }

    #[test]
    fn frames_like_go() {
        let r = Response::new(503, "application/json", "{}")
            .header("X-Load-Balancing-Endpoint-Weight", "0");
        let b = r.to_bytes("Thu, 01 Jan 1970 00:00:00 GMT", false);
        assert_eq!(
            String::from_utf8(b).unwrap(),
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nX-Load-Balancing-Endpoint-Weight: 0\r\nConnection: close\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\nContent-Length: 2\r\n\r\n{}"
        );
        let b = r.to_bytes("D", true);
        assert!(
            String::from_utf8(b)
                .unwrap()
                .ends_with("Content-Length: 2\r\n\r\n")
        );
    }
}
