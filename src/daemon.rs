//! The long-running proxy: follows a source, syncs through the bounded-frequency
//! runner, and keeps the side channels kube-proxy has up to date — health
//! (`/healthz`, `/livez`), metrics, health-check node ports and stale UDP/SCTP
//! conntrack entries. Each sync is one [`Driver::sync_once`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::config::Config;
use crate::driver::{Driver, Host, Mode, Synced};
use crate::mode::nftables::{LocalDetector, NodePortAddresses};
use crate::model::{ClusterState, IpFamily, ServicePortName, TrafficPolicy, categorize_endpoints};
use crate::serve::status::LocalTraffic;
use crate::serve::{
    self, Metrics, NodeEligibility, ProxyHealth, ServiceHealthServer, TrafficPolicy as Policy,
};
use crate::source::{ObjectChanges, ObjectSource, Objects};
use crate::sync::kube_proxy::{self, KubeProxyState};
use crate::sync::runner::{BoundedFrequencyRunner, RunReason};
use kube_nlproxy_netlink::nft::NftSocket;

/// How often the kernel is checked for changes to our objects.
pub const DRIFT_CHECK: Duration = Duration::from_secs(1);

/// The daemon stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The source stopped delivering updates.
    #[error("the object source ended")]
    SourceEnded,
    /// A health or metrics port could not be bound (`--bind-address-hard-fail`).
    #[error("{what} {addr}: cannot bind")]
    Bind {
        /// The flag.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// What the daemon remembers between syncs.
struct Daemon<'a, M, H> {
    driver: &'a mut Driver<M, H>,
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
    service_health: Option<ServiceHealthServer>,
    /// Health-check node ports and local-endpoint counts, per service port.
    health_index: HealthIndex,
    /// For a source that does not track changes: its last snapshot, to diff.
    last_snapshot: Option<Objects>,
    netlink_messages: u64,
    node_check: NodeCheck,
    /// The last sync was a full one that sent operations for no change of
    /// ours: it repaired drift.
    last_sync_repaired: bool,
}

/// What the health side channels need of one service port.
#[derive(Debug, Clone, Default, PartialEq)]
struct HealthEntry {
    /// No local endpoint while iTP Local / eTP Local (for the metrics).
    no_local_internal: bool,
    no_local_external: bool,
    /// `healthCheckNodePort` of an eTP Local service and its ready local endpoints.
    check: Option<HealthCheck>,
}

/// A `healthCheckNodePort` and the ready local endpoint addresses behind it.
type HealthCheck = (u16, BTreeSet<IpAddr>);

/// [`HealthEntry`] per service port that has something to report (a health
/// check, or no local endpoint under a Local policy), with the totals kept
/// as entries change.
#[derive(Debug, Default)]
struct HealthIndex {
    entries: HashMap<(ServicePortName, IpFamily), HealthEntry>,
    no_local: BTreeMap<(IpFamily, Policy), u64>,
    /// Entries with a health-check port, by service.
    checks: BTreeMap<(String, String), BTreeMap<(ServicePortName, IpFamily), HealthCheck>>,
}

impl HealthIndex {
    fn entry_of(state: &ClusterState, key: &(ServicePortName, IpFamily)) -> Option<HealthEntry> {
        let svc = state.services.get(key)?;
        let endpoints = state
            .endpoints
            .get(&key.0)
            .map(|eps| eps.as_slice())
            .unwrap_or(&[]);
        let cat = categorize_endpoints(endpoints, svc, &state.node);
        let no_local = cat.has_any_endpoints && cat.local.is_empty();
        let entry = HealthEntry {
            no_local_internal: no_local && svc.internal_policy == TrafficPolicy::Local,
            no_local_external: no_local && svc.external_policy_local(),
            check: svc
                .health_check_node_port
                .filter(|_| svc.external_policy_local())
                .map(|port| {
                    let ips = endpoints
                        .iter()
                        .filter(|e| e.is_local && e.ready)
                        .map(|e| e.ip)
                        .collect();
                    (port, ips)
                }),
        };
        // Most ports (ClusterIP, eTP Cluster) have nothing to report: keep
        // no entry for them.
        (entry != HealthEntry::default()).then_some(entry)
    }

    fn count(&mut self, key: &(ServicePortName, IpFamily), entry: &HealthEntry, add: bool) {
        for (on, policy) in [
            (entry.no_local_internal, Policy::Internal),
            (entry.no_local_external, Policy::External),
        ] {
            if on {
                let n = self.no_local.entry((key.1, policy)).or_default();
                *n = if add { *n + 1 } else { n.saturating_sub(1) };
            }
        }
        if let Some(check) = &entry.check {
            let service = (key.0.namespace.to_string(), key.0.name.to_string());
            let ports = self.checks.entry(service.clone()).or_default();
            if add {
                ports.insert(key.clone(), check.clone());
            } else {
                ports.remove(key);
            }
            if ports.is_empty() {
                self.checks.remove(&service);
            }
        }
    }

    /// Re-reads `changed` (every port when `all`) from `state`; returns whether
    /// anything changed.
    fn update(&mut self, state: &ClusterState, changed: &[ServicePortName], all: bool) -> bool {
        let mut any = false;
        if all {
            let gone: Vec<(ServicePortName, IpFamily)> = self
                .entries
                .keys()
                .filter(|key| !state.services.contains_key(*key))
                .cloned()
                .collect();
            for key in gone.iter().chain(state.services.keys()) {
                any |= self.refresh(state, key);
            }
        } else {
            for name in changed {
                for family in IpFamily::ALL {
                    any |= self.refresh(state, &(name.clone(), family));
                }
            }
        }
        any
    }

    /// Re-reads one service port; returns whether its entry changed.
    fn refresh(&mut self, state: &ClusterState, key: &(ServicePortName, IpFamily)) -> bool {
        let new = Self::entry_of(state, key);
        if self.entries.get(key) == new.as_ref() {
            return false;
        }
        if let Some(old) = self.entries.remove(key) {
            self.count(key, &old, false);
        }
        if let Some(new) = new {
            self.count(key, &new, true);
            self.entries.insert(key.clone(), new);
        }
        true
    }
}

/// `namespace/name` of each object in `changes`.
/// The changed EndpointSlices that still exist, `namespace/name` → their family
/// (a deleted slice has no trigger time left; FQDN slices are not proxied).
fn slice_families(
    changes: &[((String, String), Option<EndpointSlice>)],
) -> BTreeMap<String, IpFamily> {
    changes
        .iter()
        .filter_map(|((ns, name), slice)| {
            let family = match slice.as_ref()?.address_type.as_str() {
                "IPv4" => IpFamily::V4,
                "IPv6" => IpFamily::V6,
                _ => return None,
            };
            Some((format!("{ns}/{name}"), family))
        })
        .collect()
}

impl<M: Mode, H: Host> Daemon<'_, M, H> {
    /// The changes of `source` since the last sync: tracked by the source, or
    /// the difference of two snapshots.
    fn changes_of(&mut self, source: &dyn ObjectSource) -> ObjectChanges {
        if let Some(changes) = source.take_changes() {
            return changes;
        }
        let now = source.snapshot();
        let changes = match &self.last_snapshot {
            Some(before) => ObjectChanges::between(before, &now),
            None => ObjectChanges::everything(now.clone()),
        };
        self.last_snapshot = Some(now);
        changes
    }

    /// One sync of `changes`; updates health, metrics, health-check ports and
    /// conntrack. Returns whether it succeeded. O(changed objects) but for the
    /// kernel read-back a periodic or failed sync asks for.
    async fn sync(&mut self, changes: ObjectChanges) -> bool {
        let started = Instant::now();
        let changed_slices = slice_families(&changes.endpoint_slices);
        self.metrics
            .set_service_changes_pending(changes.services.len() as u64);
        self.metrics
            .set_endpoint_changes_pending(changes.endpoint_slices.len() as u64);
        let result = self.driver.sync_once(changes);
        let state = self.driver.state();
        let node = self
            .driver
            .tracker()
            .nodes()
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(state.node.name.as_str()));
        self.health.set_node(node.map(NodeEligibility::of));
        let node_found = node.is_some();
        let synced = match result {
            Ok(synced) => synced,
            Err(e) => {
                tracing::error!(
                    "sync failed, the next one reads the kernel back: {}",
                    crate::ErrorChain(&e)
                );
                self.metrics.inc_sync_failures();
                self.metrics
                    .status
                    .sync_failed(crate::ErrorChain(&e).to_string());
                // The kernel is behind what we want: a periodic resync that
                // keeps failing must turn /healthz 503 after the health timeout
                // even when no change is queued (kubernetes#142068). The next
                // good sync clears it.
                self.health.queued_update();
                return false;
            }
        };
        let elapsed = started.elapsed();
        self.last_sync_repaired = synced.report.full
            && !synced.report.ops.is_empty()
            && synced.changed.is_empty()
            && !synced.node_changed;
        if synced.report.ops.is_empty() {
            tracing::debug!(?elapsed, "sync: kernel already up to date");
        } else {
            tracing::info!(
                ?elapsed,
                ops = ?synced.report.ops,
                full = synced.report.full,
                changed = synced.changed.len(),
                model = ?synced.phases.model,
                render = ?synced.phases.render,
                commit = ?synced.phases.commit,
                conntrack = ?synced.phases.conntrack,
                "sync: committed"
            );
        }
        // -v=2: which Services the sync changed (the first ones, then a count:
        // a first sync at 10k Services stays one line).
        if !synced.changed.is_empty() && tracing::enabled!(tracing::Level::DEBUG) {
            tracing::debug!(
                services = %changed_services(&synced.changed, CHANGED_SERVICES_LOGGED),
                "sync: changed"
            );
        }
        self.record_success(&synced, elapsed, &changed_slices);
        let nodeports = self
            .driver
            .node_context()
            .map(|n| n.options.nodeport_addresses.clone())
            .unwrap_or(NodePortAddresses::All);
        self.node_check.check(
            node_found,
            synced.node_changed,
            self.driver.state(),
            &nodeports,
            &self.metrics,
        );

        let state = self.driver.state();
        if self
            .health_index
            .update(state, &synced.changed, synced.node_changed)
            || self.service_health.is_none()
        {
            let nodeports = self
                .driver
                .node_context()
                .map(|n| n.options.nodeport_addresses.clone())
                .unwrap_or(NodePortAddresses::All);
            self.update_service_health(&nodeports).await;
        }
        true
    }

    fn record_success(
        &mut self,
        synced: &Synced,
        elapsed: Duration,
        changed_slices: &BTreeMap<String, IpFamily>,
    ) {
        self.health.updated();
        self.metrics.observe_sync_duration(elapsed);
        self.metrics.set_last_sync_now();
        self.metrics
            .status
            .set_identity(self.driver.mode().name(), &self.driver.state().node.name);
        self.metrics.status.sync_ok(
            elapsed,
            synced.report.full,
            self.driver.state().services.len(),
        );
        self.metrics
            .set_sync_operations(synced.report.ops.iter().map(|(k, v)| (*k, *v)));
        self.metrics.set_endpoint_changes_pending(0);
        self.metrics.set_service_changes_pending(0);
        for (family, n) in [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .zip(synced.conntrack_deleted)
        {
            self.metrics.add_conntrack_deleted(family, n);
        }
        let mode = self.driver.mode();
        let sent = mode.messages_sent();
        self.metrics
            .add_netlink_messages(mode.name(), sent.saturating_sub(self.netlink_messages));
        self.netlink_messages = sent;
        // Network programming latency: from the change that caused an
        // EndpointSlice update (its trigger-time annotation) to now, in the
        // slice's family only (upstream: the proxier of that family observes it).
        let now = SystemTime::now();
        for (key, family) in changed_slices {
            let Some(t) =
                self.driver.tracker().trigger_time(key).and_then(|s| {
                    serde_json::from_value::<Time>(serde_json::Value::String(s)).ok()
                })
            else {
                continue;
            };
            let triggered =
                SystemTime::UNIX_EPOCH + Duration::from_nanos(t.0.as_nanosecond().max(0) as u64);
            if let Ok(latency) = now.duration_since(triggered) {
                self.metrics.observe_network_programming(*family, latency);
            }
        }
    }

    /// Health-check node ports of eTP Local services, and the per-policy count of
    /// services without local endpoints, from the health index.
    async fn update_service_health(&mut self, nodeports: &NodePortAddresses) {
        for family in IpFamily::ALL {
            for policy in [Policy::Internal, Policy::External] {
                let n = self
                    .health_index
                    .no_local
                    .get(&(family, policy))
                    .copied()
                    .unwrap_or(0);
                self.metrics.set_no_local_endpoints(family, policy, n);
            }
        }
        let mut ports = BTreeMap::new();
        let mut local_ips: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (service, checks) in &self.health_index.checks {
            let mut ips = BTreeSet::new();
            for (port, local) in checks.values() {
                ports.insert(service.clone(), *port);
                ips.extend(local.iter().copied());
            }
            local_ips.insert(service.clone(), ips.len());
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
        server.sync_endpoints(local_ips);
    }
}

/// How often a lasting node misconfiguration is logged again.
const NODE_WARNING_EVERY: Duration = Duration::from_secs(300);

/// Our Node as the sync found it: missing, or without an address of a family
/// that NodePorts need. Loud: a WARN at the first sync and again every
/// [`NODE_WARNING_EVERY`] while it lasts (or when it changes), a line in
/// `/status`, the metric `kube_nlproxy_node_problems`. The NodePorts that cannot
/// be served are named. The scan for them runs only while there is a problem, at
/// most once per warning.
#[derive(Default)]
pub(crate) struct NodeCheck {
    problems: Vec<String>,
    last_warned: Option<Instant>,
}

impl NodeCheck {
    /// After a successful sync: `node_found` whether our Node object exists,
    /// `nodeports` where NodePorts listen now.
    pub(crate) fn check(
        &mut self,
        node_found: bool,
        node_changed: bool,
        state: &ClusterState,
        nodeports: &NodePortAddresses,
        m: &Metrics,
    ) {
        let node = &state.node;
        // The families NodePorts cannot be served in: listening on given
        // addresses, none of that family.
        let unserved: Vec<IpFamily> = match nodeports {
            NodePortAddresses::All => Vec::new(),
            NodePortAddresses::Ips(ips) => IpFamily::ALL
                .into_iter()
                .filter(|f| !ips.iter().any(|ip| IpFamily::of(ip) == *f))
                .collect(),
        };
        // Cheap first: a Node that exists and NodePorts in both families.
        if node_found && unserved.is_empty() {
            if !self.problems.is_empty() {
                tracing::info!(node = %node.name, "our Node is complete again");
                self.problems.clear();
                m.status.set_node_problems(Vec::new());
                m.set_node_problems(0);
            }
            return;
        }
        let due = node_changed
            || self
                .last_warned
                .is_none_or(|t| t.elapsed() >= NODE_WARNING_EVERY);
        if !due {
            return;
        }
        let mut problems = Vec::new();
        if !node_found {
            let nodeports = match nodeports {
                NodePortAddresses::All if node.ips.is_empty() => {
                    "; with no node IP known, NodePorts listen on every local address"
                }
                _ => "",
            };
            problems.push(format!(
                "Node {} not found (is --hostname-override right?): its addresses, \
                 topology labels and deletion state are unknown{nodeports}",
                node.name
            ));
        }
        for family in unserved {
            let node_ports: Vec<String> = state
                .services
                .iter()
                .filter(|((_, f), svc)| *f == family && svc.node_port.is_some())
                .map(|((name, _), svc)| format!("{name} ({})", svc.node_port.unwrap_or(0)))
                .collect();
            if node_ports.is_empty() {
                continue;
            }
            let shown: Vec<&str> = node_ports.iter().take(5).map(String::as_str).collect();
            let family = crate::serve::health::family_name(family);
            problems.push(format!(
                "our Node has no {family} address: {} {family} NodePort(s) not served: {}{}",
                node_ports.len(),
                shown.join(", "),
                if node_ports.len() > shown.len() {
                    ", …"
                } else {
                    ""
                }
            ));
        }
        if problems.is_empty() {
            return;
        }
        for p in &problems {
            tracing::warn!("{p}");
        }
        self.last_warned = Some(Instant::now());
        m.set_node_problems(problems.len());
        m.status.set_node_problems(problems.clone());
        self.problems = problems;
    }
}

/// kube-proxy's leftovers (see [`crate::sync::kube_proxy`]): removed right after
/// our first successful sync unless `--keep-kube-proxy-state`, then watched. A
/// kube-proxy that comes back (`kubeadm upgrade` re-installs its DaemonSet) is
/// reported as soon as the nf_tables generation moves, and at each periodic sync
/// (iptables-legacy has no generation).
struct KubeProxyWatch {
    keep: bool,
    /// Its own socket: the mode's belongs to the sync.
    sock: Option<NftSocket>,
    first_sync_done: bool,
    generation: Option<u32>,
    looked: bool,
    present: KubeProxyState,
}

impl KubeProxyWatch {
    fn new(keep: bool) -> Self {
        KubeProxyWatch {
            keep,
            sock: None,
            first_sync_done: false,
            generation: None,
            looked: false,
            present: KubeProxyState::default(),
        }
    }

    fn sock(&mut self) -> Option<&mut NftSocket> {
        if self.sock.is_none() {
            match NftSocket::new() {
                Ok(s) => self.sock = Some(s),
                Err(e) => {
                    tracing::debug!("kube-proxy state: no nf_tables socket: {e}");
                    return None;
                }
            }
        }
        self.sock.as_mut()
    }

    /// After a successful sync: the first one removes kube-proxy's state (or
    /// reports it when kept); a periodic one looks again.
    fn synced(&mut self, periodic: bool, metrics: &Metrics) {
        if self.first_sync_done && !periodic {
            return;
        }
        let first = !self.first_sync_done;
        self.first_sync_done = true;
        if first && !self.keep {
            let Some(sock) = self.sock() else { return };
            match kube_proxy::remove(sock) {
                Ok(removed) if removed.is_empty() => {}
                Ok(removed) => {
                    tracing::info!(
                        "removed kube-proxy's state after our first sync: {}",
                        removed.summary()
                    );
                    metrics.status.kube_proxy_state_removed(removed.summary());
                }
                Err(e) => tracing::warn!(
                    "could not remove kube-proxy's state: {}",
                    crate::ErrorChain(&e)
                ),
            }
        }
        self.look(metrics);
    }

    /// On each drift tick: looks again when the nf_tables generation moved.
    fn tick(&mut self, metrics: &Metrics) {
        if !self.first_sync_done {
            return;
        }
        let Some(sock) = self.sock() else { return };
        let Ok(generation) = sock.generation() else {
            return;
        };
        if self.generation != Some(generation) {
            self.look(metrics);
        }
    }

    fn look(&mut self, metrics: &Metrics) {
        let Some(sock) = self.sock() else { return };
        let generation = sock.generation().ok();
        let found = match kube_proxy::detect(sock) {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!("kube-proxy state: {}", crate::ErrorChain(&e));
                return;
            }
        };
        self.generation = generation;
        let first_look = !self.looked;
        self.looked = true;
        if found != self.present && !found.is_empty() {
            if self.keep && first_look {
                tracing::warn!(
                    "kube-proxy's state is in the kernel ({}), kept as --keep-kube-proxy-state \
                     asks: it hooks at the priorities of ours and serves Services we no \
                     longer do; `kube-nlproxy cleanup --kube-proxy` removes it",
                    found.summary()
                );
            } else {
                tracing::warn!(
                    "kube-proxy's state appeared in the kernel ({}): is kube-proxy running \
                     beside us (kubeadm upgrade re-installs its DaemonSet)? Its rules act on \
                     traffic we do not NAT; `kube-nlproxy cleanup --kube-proxy` removes them",
                    found.summary()
                );
            }
        }
        metrics.set_kube_proxy_state(found.counts());
        metrics
            .status
            .set_kube_proxy_state((!found.is_empty()).then(|| found.summary()));
        self.present = found;
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

/// Binds the server of a bind-address flag: `None` when it is off.
async fn bind(
    flag: &str,
    what: &'static str,
) -> Option<Result<(SocketAddr, tokio::net::TcpListener), DaemonError>> {
    let addr = bind_address(flag, what)?;
    Some(match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => Ok((addr, listener)),
        Err(source) => Err(DaemonError::Bind { what, addr, source }),
    })
}

/// The health and metrics servers: up from the first second of `run`, before
/// the API is reached (a kubelet's liveness probe must not kill a proxy that
/// waits for an unreachable API server).
pub struct SideChannels {
    /// `/healthz`, `/livez` and the health-check node ports read it.
    pub health: Arc<ProxyHealth>,
    /// `/metrics`, `/status`.
    pub metrics: Arc<Metrics>,
}

impl SideChannels {
    /// Starts the servers of `--healthz-bind-address` and `--metrics-bind-address`.
    /// `/livez` answers 200 at once; `/healthz` 503 until the first sync. A port
    /// that cannot be bound is one error in the log, or the end of the run with
    /// `--bind-address-hard-fail` (as upstream).
    pub async fn start(cfg: &Config, mode: &'static str) -> Result<SideChannels, DaemonError> {
        let health = Arc::new(ProxyHealth::new(cfg.sync_period));
        let metrics = Arc::new(Metrics::new());
        let fail = |e: DaemonError| -> Result<(), DaemonError> {
            if cfg.bind_address_hard_fail {
                return Err(e);
            }
            tracing::error!("{}", crate::ErrorChain(&e));
            Ok(())
        };
        match bind(&cfg.healthz_bind_address, "--healthz-bind-address").await {
            Some(Ok((addr, listener))) => {
                let (h, m) = (health.clone(), metrics.clone());
                tracing::info!(%addr, "serving /healthz and /livez");
                tokio::spawn(async move {
                    if let Err(e) = serve::serve_health_on(listener, h, m).await {
                        tracing::error!("health server on {addr}: {e}");
                    }
                });
            }
            Some(Err(e)) => fail(e)?,
            None => {}
        }
        match bind(&cfg.metrics_bind_address, "--metrics-bind-address").await {
            Some(Ok((addr, listener))) => {
                let m = metrics.clone();
                tracing::info!(%addr, "serving /metrics");
                tokio::spawn(async move {
                    if let Err(e) = serve::serve_metrics_on(listener, m, mode).await {
                        tracing::error!("metrics server on {addr}: {e}");
                    }
                });
            }
            Some(Err(e)) => fail(e)?,
            None => {}
        }
        metrics.set_last_queued_now();
        Ok(SideChannels { health, metrics })
    }
}

/// Runs the proxy on `source` until SIGTERM/SIGINT, reporting through `side`
/// (started before the source, see [`SideChannels::start`]).
pub async fn run<M: Mode, H: Host>(
    cfg: &Config,
    source: &dyn ObjectSource,
    driver: &mut Driver<M, H>,
    side: SideChannels,
) -> Result<(), DaemonError> {
    let SideChannels { health, metrics } = side;
    let mut daemon = Daemon {
        driver,
        health: health.clone(),
        metrics: metrics.clone(),
        service_health: None,
        health_index: HealthIndex::default(),
        last_snapshot: None,
        netlink_messages: 0,
        node_check: NodeCheck::default(),
        last_sync_repaired: false,
    };
    let mut changes = source.subscribe();
    let mut terminate = std::pin::pin!(shutdown_signal());
    // No sync before the source has its initial state: an empty start-up state
    // must never be programmed over a working one.
    // Objects a source hands over meanwhile (a streamed first list) go to the
    // model at once, so they are never all held as API objects.
    let waiting = Instant::now();
    while *changes.borrow_and_update() == 0 {
        tokio::select! {
            r = changes.changed() => {
                if r.is_err() {
                    return Err(DaemonError::SourceEnded);
                }
                if *changes.borrow() == 0
                    && let Some(early) = source.take_changes()
                {
                    daemon.driver.absorb(early);
                }
            }
            _ = &mut terminate => return Ok(()),
        }
    }
    tracing::info!(
        waited = ?waiting.elapsed(),
        absorbed_service_ports = daemon.driver.state().services.len(),
        "source: initial state in; first sync next"
    );
    let mut runner = BoundedFrequencyRunner::new(
        cfg.min_sync_period,
        cfg.sync_period,
        cfg.min_sync_period.max(Duration::from_secs(1)),
    );
    // Something else may change our objects: a cheap check every second (one
    // request while the ruleset generation stands still), a full sync when it
    // finds drift.
    let mut kube_proxy_watch = KubeProxyWatch::new(cfg.keep_kube_proxy_state);
    let mut drift_check = tokio::time::interval(DRIFT_CHECK);
    drift_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let now = tokio::time::Instant::now();
        let recheck = daemon.driver.mode().recheck_after();
        if let Some(reason) = runner.due(now) {
            if reason == RunReason::Periodic {
                // Read the kernel back: repairs drift nobody told us about.
                daemon.driver.mode_mut().periodic_read_back();
            }
            let changes = daemon.changes_of(source);
            let ok = daemon.sync(changes).await;
            runner.ran(now, ok);
            // A read-back sync that had to send something for no change of ours:
            // someone changed our objects (elements the 1 s generation check
            // does not read).
            if ok && reason == RunReason::Periodic && daemon.last_sync_repaired {
                tracing::warn!(
                    "the periodic read-back found our objects changed by someone else; repaired"
                );
                metrics.status.drift_found();
            }
            if ok {
                kube_proxy_watch.synced(reason == RunReason::Periodic, &metrics);
                metrics
                    .status
                    .set_local_traffic(local_traffic_of(cfg, daemon.driver.state()));
            }
            continue;
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return Err(DaemonError::SourceEnded);
                }
                health.queued_update();
                metrics.set_last_queued_now();
                runner.request();
            }
            _ = tokio::time::sleep_until(runner.next_deadline(now)) => {}
            _ = drift_check.tick() => {
                kube_proxy_watch.tick(&metrics);
                match daemon.driver.check_drift() {
                    Ok(false) => {}
                    Ok(true) => {
                        tracing::warn!(
                            "our kernel objects were changed by someone else; repairing"
                        );
                        metrics.status.drift_found();
                        runner.request();
                    }
                    Err(e) => tracing::debug!("drift check: {}", crate::ErrorChain(&e)),
                }
            }
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

/// How many changed Services a `-v=2` sync line names.
const CHANGED_SERVICES_LOGGED: usize = 20;

/// The Services (`ns/name`) of the changed service ports, each once, the
/// first `limit` of them and how many more.
fn changed_services(changed: &[ServicePortName], limit: usize) -> String {
    let mut seen = BTreeSet::new();
    for p in changed {
        seen.insert((&*p.namespace, &*p.name));
    }
    let mut out: Vec<String> = seen
        .iter()
        .take(limit)
        .map(|(ns, name)| format!("{ns}/{name}"))
        .collect();
    if seen.len() > limit {
        out.push(format!("and {} more", seen.len() - limit));
    }
    out.join(", ")
}

/// The local-traffic detection and `--masquerade-all` in force, as `/status`
/// shows them.
pub fn local_traffic_of(cfg: &Config, state: &ClusterState) -> LocalTraffic {
    let (detector, cidrs, interface) = match crate::driver::local_detector(cfg, state) {
        LocalDetector::None => ("none", Vec::new(), None),
        LocalDetector::Cidrs(c) => ("cidrs", c.iter().map(|c| c.to_string()).collect(), None),
        LocalDetector::BridgeInterface(i) => ("bridge-interface", Vec::new(), Some(i)),
        LocalDetector::InterfaceNamePrefix(p) => ("interface-name-prefix", Vec::new(), Some(p)),
    };
    LocalTraffic {
        detector: detector.to_string(),
        cidrs,
        interface,
        masquerade_all: cfg.masquerade_all,
    }
}

/// The local-traffic detection a daemon's `/status` shows; `None` when it
/// names one this version does not know.
pub fn local_detector_of(local: &LocalTraffic) -> Option<LocalDetector> {
    Some(match (local.detector.as_str(), &local.interface) {
        ("none", _) => LocalDetector::None,
        ("cidrs", _) => LocalDetector::Cidrs(
            local
                .cidrs
                .iter()
                .map(|c| c.parse().ok())
                .collect::<Option<_>>()?,
        ),
        ("bridge-interface", Some(i)) => LocalDetector::BridgeInterface(i.clone()),
        ("interface-name-prefix", Some(p)) => LocalDetector::InterfaceNamePrefix(p.clone()),
        _ => return None,
    })
}

/// Resolves at SIGTERM or SIGINT.
pub async fn shutdown_signal() {
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

#[cfg(test)]
mod tests;
