//! healthCheckNodePort servers, as upstream's `ServiceHealthServer`
//! (`pkg/proxy/healthcheck/service_health.go`).
//!
//! A `LoadBalancer` Service with `externalTrafficPolicy: Local` has a
//! `healthCheckNodePort`; cloud load balancers probe it on every node and send traffic
//! only to nodes answering 200. Any path answers 200 when the service has at least
//! one local endpoint and the proxy is healthy, else 503, with a tab-indented JSON
//! body identical to upstream's and `X-Load-Balancing-Endpoint-Weight: <count>`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;

use super::format::go_quote;
use super::health::ProxyHealth;
use super::http::{Handler, Request, Response, bind_listener, serve};

/// `(namespace, name)` of a Service.
pub type ServiceKey = (String, String);

#[derive(Debug)]
struct Instance {
    port: u16,
    /// Unique local ready endpoint IPs, from the last `sync_endpoints`.
    endpoints: usize,
    tasks: Vec<JoinHandle<()>>,
}

/// Opens, keeps and closes one listener set per service with a healthCheckNodePort.
#[derive(Debug)]
pub struct ServiceHealthServer {
    /// Where to listen; empty = every address.
    bind_ips: Vec<IpAddr>,
    health: Arc<ProxyHealth>,
    services: Arc<Mutex<BTreeMap<ServiceKey, Instance>>>,
    /// Serializes `sync_services` (it awaits between closing and opening).
    syncing: tokio::sync::Mutex<()>,
}

/// The body upstream writes: `dedent` of a tab-indented template, trimmed of
/// newlines, namespace and name through `%q`.
pub fn service_health_body(
    namespace: &str,
    name: &str,
    local_endpoints: usize,
    proxy_healthy: bool,
) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        go_quote(namespace),
        go_quote(name)
    )
}

impl ServiceHealthServer {
    /// `bind_ips`: `None` listens on every address (`[::]`, dual-stack, falling back
    /// to `0.0.0.0` where IPv6 is unavailable); `Some(ips)` only on those node IPs
    /// (what `--nodeport-addresses` selects).
    pub fn new(bind_ips: Option<Vec<IpAddr>>, health: Arc<ProxyHealth>) -> Self {
        ServiceHealthServer {
            bind_ips: bind_ips.unwrap_or_default(),
            health,
            services: Arc::new(Mutex::new(BTreeMap::new())),
            syncing: tokio::sync::Mutex::new(()),
        }
    }

    /// The services with an open health check and their ports.
    pub fn open_ports(&self) -> BTreeMap<ServiceKey, u16> {
        self.services
            .lock()
            .unwrap()
            .iter()
            .map(|(k, i)| (k.clone(), i.port))
            .collect()
    }

    /// Make `services` (→ healthCheckNodePort) the open set: listeners of services
    /// gone or whose port changed are closed, new ones opened, unchanged ones left
    /// alone. A port that fails to bind is logged and tried again on the next call.
    pub async fn sync_services(&self, services: BTreeMap<ServiceKey, u16>) {
        let _guard = self.syncing.lock().await;
        let closing: Vec<(ServiceKey, Instance)> = {
            let mut map = self.services.lock().unwrap();
            let gone: Vec<ServiceKey> = map
                .iter()
                .filter(|(k, i)| services.get(*k) != Some(&i.port))
                .map(|(k, _)| k.clone())
                .collect();
            gone.into_iter()
                .filter_map(|k| map.remove(&k).map(|i| (k, i)))
                .collect()
        };
        for ((ns, name), inst) in closing {
            tracing::info!(service = %format!("{ns}/{name}"), port = inst.port, "closing healthcheck");
            for t in inst.tasks {
                t.abort();
                // Wait until the listener is dropped so its port can be reused now.
                let _ = t.await;
            }
        }
        for (key, port) in services {
            if self.services.lock().unwrap().contains_key(&key) {
                continue;
            }
            match self.listen_all(&key, port) {
                Ok(tasks) => {
                    tracing::info!(service = %format!("{}/{}", key.0, key.1), port, "opened healthcheck");
                    self.services.lock().unwrap().insert(
                        key,
                        Instance {
                            port,
                            endpoints: 0,
                            tasks,
                        },
                    );
                }
                Err(e) => tracing::error!(
                    service = %format!("{}/{}", key.0, key.1),
                    port,
                    error = %e,
                    "failed to start healthcheck; will retry on the next sync"
                ),
            }
        }
    }

    /// Record each service's count of unique local ready endpoint IPs; services
    /// missing from `counts` have 0. Counts for services without a health check are
    /// dropped.
    pub fn sync_endpoints(&self, counts: BTreeMap<ServiceKey, usize>) {
        let mut map = self.services.lock().unwrap();
        for (key, inst) in map.iter_mut() {
            inst.endpoints = counts.get(key).copied().unwrap_or(0);
        }
    }

    /// Bind every address; on any failure close what was opened (upstream
    /// `listenAndServeAll`).
    fn listen_all(&self, key: &ServiceKey, port: u16) -> std::io::Result<Vec<JoinHandle<()>>> {
        let addrs: Vec<SocketAddr> = if self.bind_ips.is_empty() {
            vec![SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)]
        } else {
            self.bind_ips
                .iter()
                .map(|ip| SocketAddr::new(*ip, port))
                .collect()
        };
        let mut listeners = Vec::with_capacity(addrs.len());
        for addr in addrs {
            let bound = match bind_listener(addr) {
                Err(e) if self.bind_ips.is_empty() && ipv6_unavailable(&e) => {
                    bind_listener(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))
                }
                r => r,
            };
            listeners.push(bound?);
        }
        let handler = self.handler(key.clone());
        Ok(listeners
            .into_iter()
            .map(|l| {
                let (clock, handler) = (self.health.clock(), handler.clone());
                tokio::spawn(async move {
                    let _ = serve(l, clock, handler).await;
                })
            })
            .collect())
    }

    fn handler(&self, key: ServiceKey) -> Handler {
        let services = self.services.clone();
        let health = self.health.clone();
        Arc::new(move |_req: &Request| {
            let count = services.lock().unwrap().get(&key).map(|i| i.endpoints);
            let Some(count) = count else {
                // Upstream: "Received request for closed healthcheck", empty 200.
                tracing::error!(service = %format!("{}/{}", key.0, key.1), "request for closed healthcheck");
                return Response {
                    status: 200,
                    headers: Vec::new(),
                    body: Vec::new(),
                };
            };
            let healthy = health.is_healthy();
            let status = if count != 0 && healthy { 200 } else { 503 };
            Response::new(
                status,
                "application/json",
                service_health_body(&key.0, &key.1, count, healthy),
            )
            .header("X-Load-Balancing-Endpoint-Weight", count.to_string())
        })
    }
}

fn ipv6_unavailable(e: &std::io::Error) -> bool {
    // EAFNOSUPPORT (97) / EADDRNOTAVAIL (99) on Linux when IPv6 is disabled.
    matches!(e.raw_os_error(), Some(97) | Some(99))
}

impl Drop for ServiceHealthServer {
    fn drop(&mut self) {
        if let Ok(map) = self.services.lock() {
            for inst in map.values() {
                for t in &inst.tasks {
                    t.abort();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_upstreams_dedented_template() {
        assert_eq!(
            service_health_body("ns", "svc", 2, true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"svc\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }
}
