//! The HTTP side of the proxy, as kube-proxy serves it:
//!
//! - `--healthz-bind-address` (default `0.0.0.0:10256`): `/healthz` and `/livez`
//!   ([`serve_health`], state in [`ProxyHealth`]);
//! - `--metrics-bind-address` (default `127.0.0.1:10249`): `/metrics`, `/proxyMode`,
//!   `/healthz` ([`serve_metrics`], values in [`Metrics`]);
//! - one listener per `healthCheckNodePort` ([`ServiceHealthServer`]).
//!
//! HTTP/1.x itself (parsing, framing, keep-alive) is hyper's, with limits on head
//! size, head time and connections per listener ([`http::Limits`]); field names,
//! formats, headers and metric names follow upstream.

pub mod format;
pub mod health;
pub mod http;
pub mod metrics;
pub mod service_health;
pub mod status;

pub use health::{
    Clock, FakeClock, HealthReport, HealthResponse, NodeEligibility, ProxierHealth, ProxyHealth,
    SystemClock, TO_BE_DELETED_TAINT, node_eligibility,
};
pub use http::{
    METRICS_CONTENT_TYPE, serve_health, serve_health_on, serve_metrics, serve_metrics_on,
};
pub use metrics::{Histogram, Metrics, TrafficPolicy};
pub use service_health::{ServiceHealthServer, ServiceKey, service_health_body};
