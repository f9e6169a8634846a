//! The long-running proxy: follows a source, syncs through the bounded-frequency
//! runner, and keeps the side channels kube-proxy has up to date — health
//! (`/healthz`, `/livez`), metrics, health-check node ports and stale UDP/SCTP
//! conntrack entries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::config::Config;
use crate::mode::nftables::{NftablesOptions, NftablesRenderer, NodePortAddresses};
use crate::model::{ClusterState, IpFamily, TrafficPolicy, categorize_endpoints};
use crate::proxier::{ProxierError, build_state_quiet, nftables_options};
use crate::serve::{
    self, Metrics, NodeEligibility, ProxyHealth, ServiceHealthServer, TrafficPolicy as Policy,
};
use crate::source::{ObjectSource, Objects};
use crate::sync::conntrack::{StaleFlow, stale_flows};
use crate::sync::runner::{BoundedFrequencyRunner, RunReason};
use crate::sync::{NetlinkDataplane, Syncer};

/// EndpointSlice annotation with the time of the change that caused it.
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// A proxy mode as the daemon drives it: program a cluster state, report what was
/// sent.
pub trait Backend {
    /// `/proxyMode` and metric label: `nftables` or `ipvs`.
    fn mode(&self) -> &'static str;
    /// Brings the kernel to `state`; returns operation counts by kind (empty:
    /// nothing was sent). `opts` are the flags resolved against the node, once per
    /// sync by the daemon.
    fn sync(
        &mut self,
        cfg: &Config,
        state: &ClusterState,
        opts: &NftablesOptions,
    ) -> Result<BTreeMap<&'static str, usize>, ProxierError>;
    /// Makes the next sync read the kernel back.
    fn request_full_sync(&mut self);
    /// Netlink messages sent so far.
    fn messages_sent(&self) -> u64;
    /// When the next sync is needed without any change (e.g. draining real
    /// servers to re-check).
    fn recheck_after(&self) -> Option<Duration> {
        None
    }
}

/// nftables mode: the desired tables kept service by service, so a sync renders
/// and sends only what changed.
pub struct NftablesBackend {
    syncer: Syncer<NetlinkDataplane>,
    renderer: NftablesRenderer,
}

impl NftablesBackend {
    /// Over `syncer`.
    pub fn new(syncer: Syncer<NetlinkDataplane>) -> Self {
        NftablesBackend {
            syncer,
            renderer: NftablesRenderer::default(),
        }
    }
}

impl Backend for NftablesBackend {
    fn mode(&self) -> &'static str {
        "nftables"
    }

    fn sync(
        &mut self,
        _cfg: &Config,
        state: &ClusterState,
        opts: &NftablesOptions,
    ) -> Result<BTreeMap<&'static str, usize>, ProxierError> {
        let (deltas, stats) = self.renderer.update(state, opts);
        for conflict in &stats.conflicts {
            tracing::warn!("conflicting services: {conflict}");
        }
        let renderer = &self.renderer;
        let outcome = self
            .syncer
            .sync_incremental(&deltas, || renderer.tables())?;
        tracing::debug!(
            rendered = stats.rendered,
            node_changed = stats.node_changed,
            full = outcome.full,
            "nftables sync"
        );
        Ok(outcome.ops)
    }

    fn request_full_sync(&mut self) {
        self.syncer.request_full_sync();
    }

    fn messages_sent(&self) -> u64 {
        self.syncer.dataplane().messages_sent()
    }
}

/// What the daemon remembers between syncs.
struct Daemon<'a> {
    cfg: &'a Config,
    backend: &'a mut dyn Backend,
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
    service_health: Option<ServiceHealthServer>,
    /// Cluster state of the last successful sync.
    committed: Option<ClusterState>,
    /// The objects of the last successful sync, to count changes and find the
    /// EndpointSlices whose trigger time is new.
    previous: Objects,
    /// Warnings of the last build, so a periodic sync does not repeat them.
    last_warnings: BTreeSet<String>,
    netlink_messages: u64,
}

/// `namespace/name` of the objects that differ between `before` and `after`
/// (added, changed or removed). Objects compare by content; the sources strip
/// bookkeeping fields (resourceVersion, managedFields) already.
fn changed_keys<T: PartialEq>(
    before: &[T],
    after: &[T],
    meta: impl Fn(&T) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<String> {
    let key = |o: &T| {
        let m = meta(o);
        format!(
            "{}/{}",
            m.namespace.as_deref().unwrap_or(""),
            m.name.as_deref().unwrap_or("")
        )
    };
    let mut old: HashMap<String, &T> = before.iter().map(|o| (key(o), o)).collect();
    let mut out = Vec::new();
    for o in after {
        let k = key(o);
        match old.remove(&k) {
            Some(p) if p == o => {}
            _ => out.push(k),
        }
    }
    out.extend(old.into_keys());
    out
}

impl Daemon<'_> {
    /// One sync of `objects`; updates health, metrics, health-check ports and
    /// conntrack. Returns whether it succeeded.
    async fn sync(&mut self, snapshot: Objects) -> bool {
        let objects = &snapshot;
        let started = Instant::now();
        let (state, warnings) = build_state_quiet(self.cfg, objects);
        let warnings: BTreeSet<String> = warnings.into_iter().collect();
        for w in warnings.difference(&self.last_warnings) {
            tracing::warn!("skipped: {w}");
        }
        self.last_warnings = warnings;

        let changed_services =
            changed_keys(&self.previous.services, &objects.services, |s| &s.metadata);
        let changed_slices = changed_keys(
            &self.previous.endpoint_slices,
            &objects.endpoint_slices,
            |s| &s.metadata,
        );
        self.metrics
            .set_service_changes_pending(changed_services.len() as u64);
        self.metrics
            .set_endpoint_changes_pending(changed_slices.len() as u64);

        let node = objects
            .nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(state.node.name.as_str()));
        self.health.set_node(node.map(NodeEligibility::of));

        let opts = match nftables_options(self.cfg, &state) {
            Ok(opts) => opts,
            Err(e) => {
                tracing::error!("sync failed: {e}");
                self.metrics.inc_sync_failures();
                return false;
            }
        };
        let ops = match self.backend.sync(self.cfg, &state, &opts) {
            Ok(ops) => ops,
            Err(e) => {
                tracing::error!("sync failed, the next one reads the kernel back: {e}");
                self.backend.request_full_sync();
                self.metrics.inc_sync_failures();
                return false;
            }
        };
        let elapsed = started.elapsed();
        if ops.is_empty() {
            tracing::debug!(?elapsed, "sync: kernel already up to date");
        } else {
            tracing::info!(?elapsed, ?ops, "sync: committed");
        }
        self.record_success(&ops, elapsed, objects, &changed_slices);

        self.update_service_health(&state, &opts.nodeport_addresses)
            .await;
        if let Some(prev) = &self.committed {
            clear_stale_conntrack(&stale_flows(prev, &state), &self.metrics);
        }
        self.committed = Some(state);
        self.previous = snapshot;
        true
    }

    fn record_success(
        &mut self,
        ops: &BTreeMap<&'static str, usize>,
        elapsed: Duration,
        objects: &Objects,
        changed_slices: &[String],
    ) {
        self.health.updated();
        self.metrics.observe_sync_duration(elapsed);
        self.metrics.set_last_sync_now();
        self.metrics
            .set_sync_operations(ops.iter().map(|(k, v)| (*k, *v)));
        self.metrics.set_endpoint_changes_pending(0);
        self.metrics.set_service_changes_pending(0);
        let sent = self.backend.messages_sent();
        self.metrics
            .add_netlink_messages(self.backend.mode(), sent - self.netlink_messages);
        self.netlink_messages = sent;
        // Network programming latency: from the change that caused an
        // EndpointSlice update (its trigger-time annotation) to now.
        let now = SystemTime::now();
        let changed: BTreeSet<&String> = changed_slices.iter().collect();
        for slice in &objects.endpoint_slices {
            let key = format!(
                "{}/{}",
                slice.metadata.namespace.as_deref().unwrap_or(""),
                slice.metadata.name.as_deref().unwrap_or("")
            );
            if !changed.contains(&key) {
                continue;
            }
            let Some(t) = slice
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TRIGGER_TIME))
                .and_then(|s| {
                    serde_json::from_value::<Time>(serde_json::Value::String(s.clone())).ok()
                })
            else {
                continue;
            };
            let triggered =
                SystemTime::UNIX_EPOCH + Duration::from_nanos(t.0.as_nanosecond().max(0) as u64);
            if let Ok(latency) = now.duration_since(triggered) {
                self.metrics.observe_network_programming(latency);
            }
        }
    }

    /// Health-check node ports of eTP Local services, and the per-policy count of
    /// services without local endpoints.
    async fn update_service_health(&mut self, state: &ClusterState, nodeports: &NodePortAddresses) {
        let mut ports = BTreeMap::new();
        let mut local_ips: BTreeMap<(String, String), BTreeSet<IpAddr>> = BTreeMap::new();
        let mut no_local: BTreeMap<(IpFamily, Policy), u64> = BTreeMap::new();
        for ((name, family), svc) in &state.services {
            let key = (name.namespace.clone(), name.name.clone());
            let endpoints = state.endpoints.get(name).map(Vec::as_slice).unwrap_or(&[]);
            let cat = categorize_endpoints(endpoints, svc, &state.node);
            if cat.has_any_endpoints && cat.local.is_empty() {
                if svc.internal_policy == TrafficPolicy::Local {
                    *no_local.entry((*family, Policy::Internal)).or_default() += 1;
                }
                if svc.external_policy_local() {
                    *no_local.entry((*family, Policy::External)).or_default() += 1;
                }
            }
            if let Some(port) = svc
                .health_check_node_port
                .filter(|_| svc.external_policy_local())
            {
                ports.insert(key.clone(), port);
                let ips = local_ips.entry(key).or_default();
                ips.extend(
                    endpoints
                        .iter()
                        .filter(|e| e.is_local && e.ready)
                        .map(|e| e.ip),
                );
            }
        }
        for family in IpFamily::ALL {
            for policy in [Policy::Internal, Policy::External] {
                let n = no_local.get(&(family, policy)).copied().unwrap_or(0);
                self.metrics.set_no_local_endpoints(family, policy, n);
            }
        }
        if self.service_health.is_none() {
            let bind = match nodeports {
                NodePortAddresses::All => None,
                NodePortAddresses::Ips(ips) => Some(ips.clone()),
            };
            self.service_health = Some(ServiceHealthServer::new(bind, self.health.clone()));
        }
        let server = self.service_health.as_ref().expect("created above");
        server.sync_services(ports).await;
        server.sync_endpoints(
            local_ips
                .into_iter()
                .map(|(k, ips)| (k, ips.len()))
                .collect(),
        );
    }
}

/// Deletes the conntrack entries that `flows` describe (UDP/SCTP only), over
/// ctnetlink; one dump per family.
fn clear_stale_conntrack(flows: &[StaleFlow], metrics: &Metrics) {
    if flows.is_empty() {
        return;
    }
    let handle = match kube_nlproxy_netlink::conntrack::ConntrackHandle::new() {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("conntrack cleanup skipped: {e}");
            return;
        }
    };
    for (ipv6, family) in [(false, IpFamily::V4), (true, IpFamily::V6)] {
        let relevant: Vec<&StaleFlow> = flows
            .iter()
            .filter(|f| f.is_ipv6().is_none_or(|v6| v6 == ipv6))
            .collect();
        if relevant.is_empty() {
            continue;
        }
        match handle.delete_matching(ipv6, |e| {
            relevant.iter().any(|f| f.matches(&e.orig, &e.reply))
        }) {
            Ok(n) => {
                if n > 0 {
                    tracing::info!("deleted {n} stale conntrack entries");
                }
                metrics.add_conntrack_deleted(family, n as u64);
            }
            Err(e) => tracing::warn!("conntrack cleanup failed: {e}"),
        }
    }
}

fn bind_address(flag: &str, what: &str) -> Option<SocketAddr> {
    if flag.is_empty() || flag == "0" {
        return None;
    }
    match flag.parse() {
        Ok(a) => Some(a),
        Err(e) => {
            tracing::warn!("{what} {flag:?} is not an address:port ({e}); not serving it");
            None
        }
    }
}

/// Runs the proxy on `source` until SIGTERM/SIGINT.
pub async fn run(
    cfg: &Config,
    source: &dyn ObjectSource,
    backend: &mut dyn Backend,
) -> Result<(), ProxierError> {
    let mode = backend.mode();
    let health = Arc::new(ProxyHealth::new(cfg.sync_period));
    let metrics = Arc::new(Metrics::new());
    if let Some(addr) = bind_address(&cfg.healthz_bind_address, "--healthz-bind-address") {
        let (h, m) = (health.clone(), metrics.clone());
        tokio::spawn(async move {
            if let Err(e) = serve::serve_health(addr, h, m).await {
                tracing::error!("health server on {addr}: {e}");
            }
        });
    }
    if let Some(addr) = bind_address(&cfg.metrics_bind_address, "--metrics-bind-address") {
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = serve::serve_metrics(addr, m, mode).await {
                tracing::error!("metrics server on {addr}: {e}");
            }
        });
    }
    // Like kube-proxy's SyncLoop: healthy from the start, until an update waits
    // too long.
    health.updated();
    metrics.set_last_queued_now();

    let mut daemon = Daemon {
        cfg,
        backend,
        health: health.clone(),
        metrics: metrics.clone(),
        service_health: None,
        committed: None,
        previous: Objects::default(),
        last_warnings: BTreeSet::new(),
        netlink_messages: 0,
    };
    let mut changes = source.subscribe();
    let mut terminate = std::pin::pin!(shutdown_signal());
    // No sync before the source has its initial state: an empty start-up state
    // must never be programmed over a working one.
    while *changes.borrow_and_update() == 0 {
        tokio::select! {
            r = changes.changed() => if r.is_err() { return Err(ProxierError::SourceEnded) },
            _ = &mut terminate => return Ok(()),
        }
    }
    let mut runner = BoundedFrequencyRunner::new(
        cfg.min_sync_period,
        cfg.sync_period,
        cfg.min_sync_period.max(Duration::from_secs(1)),
    );
    loop {
        let now = tokio::time::Instant::now();
        let recheck = daemon.backend.recheck_after();
        if let Some(reason) = runner.due(now) {
            if reason == RunReason::Periodic {
                // Read the kernel back: repairs drift nobody told us about.
                daemon.backend.request_full_sync();
            }
            let ok = daemon.sync(source.snapshot()).await;
            runner.ran(now, ok);
            continue;
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return Err(ProxierError::SourceEnded);
                }
                health.queued_update();
                metrics.set_last_queued_now();
                runner.request();
            }
            _ = tokio::time::sleep_until(runner.next_deadline(now)) => {}
            _ = tokio::time::sleep(recheck.unwrap_or(Duration::MAX)), if recheck.is_some() => {
                runner.request();
            }
            _ = &mut terminate => {
                tracing::info!("terminating; the dataplane stays as it is");
                return Ok(());
            }
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
