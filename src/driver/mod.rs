//! One sync, whatever the command and the mode: `changes → model → mode →
//! kernel`, then the conntrack entries the change made stale.
//!
//! [`Driver::sync_once`] is what `run` does on every loop turn, what `--once`
//! does once and what `plan` does without sending. The mode is a [`Mode`]
//! (nftables or ipvs), generic over its dataplane; the node is a [`Host`]. With
//! `FakeKernel`, `FakeIpvs` and [`FakeHost`] the whole sync runs in memory.

pub mod host;
pub mod ipvs;
pub mod nftables;
pub mod plan;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use kube_nlproxy_netlink::addr::InterfaceAddress;

use crate::config::{Config, DetectLocalMode, NodePortAddressesFlag};
use crate::mode::nftables::{LocalDetector, NftablesOptions, NodePortAddresses};
use crate::model::{
    BuildOptions, ClusterState, IpFamily, ModelTracker, ModelUpdate, ServicePortName,
};
use crate::source::ObjectChanges;
use crate::sync::SyncError;
use crate::sync::conntrack::{StaleByState, StaleFlowIndex, stale_flows};
use crate::sync::ipvs::IpvsSyncError;
pub use host::{FakeHost, Host, HostError, KernelHost};

/// A mode's sync that failed.
#[derive(Debug, thiserror::Error)]
pub enum ModeError {
    /// The nf_tables side.
    #[error("nftables")]
    Nftables(#[from] SyncError),
    /// IPVS, `kube-ipvs0` or the KUBE-* ipsets.
    #[error("ipvs")]
    Ipvs(#[from] IpvsSyncError),
    /// What the mode needed of the node.
    #[error("host")]
    Host(#[from] HostError),
}

/// A sync that failed, with its cause.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// Resolving `--nodeport-addresses` against the node's addresses.
    #[error("resolving --nodeport-addresses")]
    NodePortAddresses(#[source] HostError),
    /// The mode could not bring the kernel to the desired state (nothing of a
    /// failed nf_tables transaction was applied; the next sync is a full one).
    #[error("{mode} mode sync")]
    Mode {
        /// `nftables` or `ipvs`
        mode: &'static str,
        /// cause
        #[source]
        source: ModeError,
    },
}

/// What one sync sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Whether the kernel was read back first.
    pub full: bool,
    /// Operations by kind (empty: nothing was sent).
    pub ops: BTreeMap<&'static str, usize>,
}

/// What the node contributes to one sync, resolved by the driver through its
/// [`Host`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeContext {
    /// The flags resolved against the node (both modes use them).
    pub options: NftablesOptions,
    /// The node's addresses, when the mode asked for them.
    pub addresses: Vec<InterfaceAddress>,
}

/// A proxy mode: keeps its desired state, service by service, and brings the
/// kernel to it.
pub trait Mode {
    /// `/proxyMode`, metric label: `nftables` or `ipvs`.
    fn name(&self) -> &'static str;
    /// Whether [`NodeContext::addresses`] is needed (listed once per sync).
    fn needs_local_addresses(&self, _options: &NftablesOptions) -> bool {
        false
    }
    /// Updates the desired state from `state`: only the ports in `changed`, or
    /// everything when `None`. Pure: no I/O.
    fn desired(
        &mut self,
        state: &ClusterState,
        node: &NodeContext,
        changed: Option<&[ServicePortName]>,
    ) -> Result<(), ModeError>;
    /// Sends what the kernel lacks of the desired state.
    fn sync(&mut self) -> Result<SyncReport, ModeError>;
    /// What [`sync`](Self::sync) would send now, one entry per object.
    fn plan(&mut self) -> Result<Vec<plan::PlannedOp>, ModeError>;
    /// Reads the kernel back; what differs from the desired state.
    fn verify(&mut self) -> Result<Vec<String>, ModeError>;
    /// Deletes every kernel object the mode owns; returns how many operations.
    /// `addresses`: the node's (objects of the mode may sit on any of them).
    fn cleanup(&mut self, addresses: &[InterfaceAddress]) -> Result<usize, ModeError>;
    /// Whether something else changed the mode's kernel objects since the
    /// last sync, by a cheap check (a full sync follows when it did; what the
    /// check cannot see, the periodic read-back repairs).
    fn check_drift(&mut self) -> Result<bool, ModeError> {
        Ok(false)
    }
    /// Makes the next sync read the kernel back.
    fn request_full_sync(&mut self);
    /// The periodic read-back: makes the next sync a full one, unless a
    /// cheaper read shows the kernel still holds the desired state.
    fn periodic_read_back(&mut self) {
        self.request_full_sync();
    }
    /// Netlink messages sent so far.
    fn messages_sent(&self) -> u64;
    /// When the next sync is needed without any change (real servers draining).
    fn recheck_after(&self) -> Option<Duration> {
        None
    }
    /// One line per kernel object group: what the desired state holds.
    fn summary(&self) -> Vec<String>;
}

/// The outcome of [`Driver::sync_once`].
#[derive(Debug, Clone, Default)]
pub struct Synced {
    /// What the model update changed. The first sync re-renders everything
    /// (`node_changed`) and names only what changed after the last absorb.
    pub changed: Vec<ServicePortName>,
    /// Whether node-level facts changed (everything was re-rendered).
    pub node_changed: bool,
    /// What was sent.
    pub report: SyncReport,
    /// Stale UDP/SCTP conntrack entries deleted, IPv4 and IPv6.
    pub conntrack_deleted: [u64; 2],
    /// Where the sync's time went.
    pub phases: SyncPhases,
}

/// The wall-clock time of each phase of one [`Driver::sync_once`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncPhases {
    /// The model update and the node's flags resolved against its addresses
    /// (a first sync's objects mostly went into the model earlier, as the
    /// lists streamed).
    pub model: Duration,
    /// The desired dataplane of what changed: the mode's render.
    pub render: Duration,
    /// The mode's sync: the diff against what the kernel holds, the netlink
    /// encoding and the kernel's commit (a full sync's read-back included).
    pub commit: Duration,
    /// Stale conntrack entries found and deleted.
    pub conntrack: Duration,
}

/// The sync engine: the model, kept object by object; the mode; the node.
pub struct Driver<M, H> {
    cfg: Config,
    mode: M,
    host: H,
    tracker: ModelTracker,
    /// What earlier failed syncs changed, and what [`absorb`](Self::absorb)
    /// took, handed on to the next sync.
    pending: Option<ModelUpdate>,
    /// Whether a sync succeeded since start (the first one judges conntrack by
    /// the state alone).
    synced: bool,
    node: Option<NodeContext>,
}

impl<M: Mode, H: Host> Driver<M, H> {
    /// A driver for `cfg` with nothing seen yet.
    pub fn new(cfg: &Config, mode: M, host: H) -> Self {
        let opts = BuildOptions {
            node_name: cfg
                .hostname_override
                .clone()
                .unwrap_or_else(|| host.hostname()),
            node_ips_override: cfg.node_ips.clone(),
            primary_node_ip: cfg.bind_address_node_ip(),
            ignore_external_ips: cfg.ignore_external_ips,
        };
        Driver {
            cfg: cfg.clone(),
            mode,
            host,
            tracker: ModelTracker::new(opts),
            pending: None,
            synced: false,
            node: None,
        }
    }

    /// The mode.
    pub fn mode(&self) -> &M {
        &self.mode
    }

    /// The mode, to drive directly (e.g. a full sync request).
    pub fn mode_mut(&mut self) -> &mut M {
        &mut self.mode
    }

    /// The node.
    pub fn host(&self) -> &H {
        &self.host
    }

    /// The node, mutably (tests change it between syncs).
    pub fn host_mut(&mut self) -> &mut H {
        &mut self.host
    }

    /// The model.
    pub fn tracker(&self) -> &ModelTracker {
        &self.tracker
    }

    /// The cluster state as last applied.
    pub fn state(&self) -> &ClusterState {
        self.tracker.state()
    }

    /// The node as last resolved (`None` before the first sync).
    pub fn node_context(&self) -> Option<&NodeContext> {
        self.node.as_ref()
    }

    /// Applies `changes` to the model and renders the mode's desired state
    /// (only what changed, unless the node did). Sends nothing.
    pub fn prepare(&mut self, changes: ObjectChanges) -> Result<ModelUpdate, DriverError> {
        self.prepare_timed(changes, &mut SyncPhases::default())
    }

    /// [`prepare`](Self::prepare), timing the model update and the render.
    fn prepare_timed(
        &mut self,
        changes: ObjectChanges,
        phases: &mut SyncPhases,
    ) -> Result<ModelUpdate, DriverError> {
        let started = Instant::now();
        let update = self.tracker.apply(changes);
        for w in &update.new_warnings {
            tracing::warn!("skipped: {w}");
        }
        let update = match self.pending.take() {
            Some(earlier) => merge_updates(earlier, update),
            None => update,
        };
        let node = match self.resolve_node() {
            Ok(node) => node,
            Err(e) => {
                self.pending = Some(update);
                return Err(e);
            }
        };
        let node_changed = update.node_changed || self.node.as_ref() != Some(&node);
        let changed = (!node_changed && self.synced).then_some(update.changed.as_slice());
        let rendering = Instant::now();
        phases.model = rendering - started;
        let rendered = self.mode.desired(self.tracker.state(), &node, changed);
        phases.render = rendering.elapsed();
        if let Err(source) = rendered {
            self.pending = Some(update);
            return Err(self.mode_error(source));
        }
        self.node = Some(node);
        let mut update = update;
        update.node_changed = node_changed;
        Ok(update)
    }

    /// Applies `changes` to the model only: nothing is rendered or sent; the
    /// next sync does both for them too. For objects that arrive before the
    /// first sync may run (a first list handed over as it is read), so they do
    /// not wait in the source as API objects.
    pub fn absorb(&mut self, changes: ObjectChanges) {
        let mut update = self.tracker.apply(changes);
        for w in &update.new_warnings {
            tracing::warn!("skipped: {w}");
        }
        if !self.synced {
            // The first sync renders everything and judges stale flows by the
            // state alone: neither the names of what changed nor the state
            // before are needed, and the latter would be a second copy of the
            // model.
            update.changed = Vec::new();
            update.before = ClusterState {
                node: update.before.node,
                ..ClusterState::default()
            };
        }
        // Absorbs come per handful of objects: the names are deduplicated each
        // time their number reaches a power of two (O(n log n) in all), and the
        // sync's merge sorts them once more.
        match &mut self.pending {
            Some(earlier) => {
                append_update(earlier, update);
                let n = earlier.changed.len();
                if n >= 1024 && n.is_power_of_two() {
                    earlier.changed.sort_unstable();
                    earlier.changed.dedup();
                }
            }
            None => self.pending = Some(update),
        }
    }

    /// One sync: the model takes `changes`, the mode re-renders what changed
    /// and sends the difference, then the conntrack entries the change made
    /// stale are deleted. On failure nothing is lost: the next call syncs these
    /// changes too, reading the kernel back.
    pub fn sync_once(&mut self, changes: ObjectChanges) -> Result<Synced, DriverError> {
        let mut phases = SyncPhases::default();
        let update = self.prepare_timed(changes, &mut phases)?;
        let committing = Instant::now();
        let report = match self.mode.sync() {
            Ok(report) => report,
            Err(source) => {
                self.mode.request_full_sync();
                self.pending = Some(update);
                return Err(self.mode_error(source));
            }
        };
        let first = !self.synced;
        self.synced = true;
        let cleaning = Instant::now();
        phases.commit = cleaning - committing;
        let conntrack_deleted = self.clear_stale_conntrack(&update, first);
        phases.conntrack = cleaning.elapsed();
        Ok(Synced {
            changed: update.changed,
            node_changed: update.node_changed,
            report,
            conntrack_deleted,
            phases,
        })
    }

    /// The operations the next sync would send for `changes`, sending nothing.
    /// Each is named by its Service port where it has one, in printing order
    /// (see [`plan::grouped`]).
    pub fn plan(&mut self, changes: ObjectChanges) -> Result<Vec<plan::PlannedOp>, DriverError> {
        self.prepare(changes)?;
        let mut ops = self.mode.plan().map_err(|e| self.mode_error(e))?;
        plan::resolve(&mut ops, self.tracker.state());
        Ok(plan::grouped(ops))
    }

    /// Reads the kernel back: where it differs from the desired state.
    pub fn verify(&mut self) -> Result<Vec<String>, DriverError> {
        self.mode.verify().map_err(|e| self.mode_error(e))
    }

    /// Whether the kernel changed behind our back (see [`Mode::check_drift`]).
    pub fn check_drift(&mut self) -> Result<bool, DriverError> {
        self.mode.check_drift().map_err(|e| self.mode_error(e))
    }

    /// Deletes what the mode owns.
    pub fn cleanup(&mut self) -> Result<usize, DriverError> {
        let addresses = self.host.local_addresses().unwrap_or_else(|e| {
            tracing::warn!(
                "cleanup without the node's addresses: {}",
                crate::ErrorChain(&e)
            );
            Vec::new()
        });
        self.mode
            .cleanup(&addresses)
            .map_err(|e| self.mode_error(e))
    }

    fn mode_error(&self, source: ModeError) -> DriverError {
        DriverError::Mode {
            mode: self.mode.name(),
            source,
        }
    }

    /// The flags resolved against the node and its addresses.
    fn resolve_node(&mut self) -> Result<NodeContext, DriverError> {
        let state = self.tracker.state();
        let local_detector = local_detector(&self.cfg, state);
        let mut addresses = None;
        let nodeport_addresses = match &self.cfg.nodeport_addresses {
            NodePortAddressesFlag::Primary if state.node.ips.is_empty() => {
                tracing::debug!(
                    "node {:?} has no primary IP (no Node object and no --node-ip): NodePorts listen on all local addresses",
                    state.node.name
                );
                NodePortAddresses::All
            }
            NodePortAddressesFlag::Primary => NodePortAddresses::Ips(state.node.ips.clone()),
            NodePortAddressesFlag::Cidrs(cidrs) if cidrs.iter().any(|c| c.prefix_len() == 0) => {
                NodePortAddresses::All
            }
            NodePortAddressesFlag::Cidrs(cidrs) => {
                let listed = self
                    .host
                    .local_addresses()
                    .map_err(DriverError::NodePortAddresses)?;
                let ips = ips_in(&listed, cidrs);
                addresses = Some(listed);
                NodePortAddresses::Ips(ips)
            }
        };
        let options = NftablesOptions {
            masquerade_all: self.cfg.masquerade_all,
            local_detector,
            nodeport_addresses,
            masquerade_mark: 1 << self.cfg.masquerade_bit,
        };
        let addresses = match addresses {
            Some(a) if self.mode.needs_local_addresses(&options) => a,
            None if self.mode.needs_local_addresses(&options) => self
                .host
                .local_addresses()
                .map_err(DriverError::NodePortAddresses)?,
            _ => Vec::new(),
        };
        Ok(NodeContext { options, addresses })
    }

    /// UDP/SCTP flows the update made stale: judged by the whole state on the
    /// first sync and when the node changed, else by the changed ports before
    /// and after.
    fn clear_stale_conntrack(&mut self, update: &ModelUpdate, whole: bool) -> [u64; 2] {
        let deleted = self.delete_stale_flows(update, whole);
        let total = deleted[0] + deleted[1];
        if total > 0 {
            tracing::info!("deleted {total} stale conntrack entries");
        }
        deleted
    }

    fn delete_stale_flows(&mut self, update: &ModelUpdate, whole: bool) -> [u64; 2] {
        let state = self.tracker.state();
        let mut deleted = [0; 2];
        if whole || update.node_changed {
            let stale = StaleByState::new(state);
            if stale.is_empty() {
                return deleted;
            }
            for (i, ipv6) in [false, true].into_iter().enumerate() {
                match self
                    .host
                    .delete_conntrack(ipv6, &|(o, r)| stale.matches(o, r))
                {
                    Ok(n) => deleted[i] = n as u64,
                    Err(e) => tracing::warn!("stale conntrack cleanup: {}", crate::ErrorChain(&e)),
                }
            }
            return deleted;
        }
        if update.changed.is_empty() {
            return deleted;
        }
        let flows = stale_flows(&update.before, &restricted(state, &update.changed));
        for (i, (ipv6, family)) in [(false, IpFamily::V4), (true, IpFamily::V6)]
            .into_iter()
            .enumerate()
        {
            let relevant = StaleFlowIndex::new(
                flows
                    .iter()
                    .filter(|f| f.is_ipv6().is_none_or(|v6| v6 == ipv6)),
            );
            if relevant.is_empty() {
                continue;
            }
            match self
                .host
                .delete_conntrack(ipv6, &|(o, r)| relevant.matches(o, r))
            {
                Ok(n) => deleted[i] = n as u64,
                Err(e) => tracing::warn!(
                    "stale conntrack cleanup ({family:?}): {}",
                    crate::ErrorChain(&e)
                ),
            }
        }
        deleted
    }
}

/// `--detect-local-mode` resolved against the flags and the node.
pub fn local_detector(cfg: &Config, state: &ClusterState) -> LocalDetector {
    match cfg.detect_local_mode {
        None => LocalDetector::None,
        Some(DetectLocalMode::ClusterCidr) if cfg.cluster_cidrs.is_empty() => {
            tracing::debug!(
                "--detect-local-mode ClusterCIDR without --cluster-cidr: no local traffic detection"
            );
            LocalDetector::None
        }
        Some(DetectLocalMode::ClusterCidr) => LocalDetector::Cidrs(cfg.cluster_cidrs.clone()),
        Some(DetectLocalMode::NodeCidr) => LocalDetector::Cidrs(state.node.pod_cidrs.clone()),
        Some(DetectLocalMode::BridgeInterface) => match &cfg.pod_bridge_interface {
            Some(name) => LocalDetector::BridgeInterface(name.clone()),
            None => LocalDetector::None,
        },
        Some(DetectLocalMode::InterfaceNamePrefix) => match &cfg.pod_interface_name_prefix {
            Some(p) => LocalDetector::InterfaceNamePrefix(p.clone()),
            None => LocalDetector::None,
        },
    }
}

/// The local addresses inside `cidrs`.
fn ips_in(addresses: &[InterfaceAddress], cidrs: &[IpNet]) -> Vec<IpAddr> {
    addresses
        .iter()
        .map(|a| a.addr)
        .filter(|ip| cidrs.iter().any(|c| c.contains(ip)))
        .collect()
}

/// The service ports in `changed`, as they are in `state` (for a stale-flow
/// comparison with the same ports before).
fn restricted(state: &ClusterState, changed: &[ServicePortName]) -> ClusterState {
    let mut out = ClusterState {
        node: state.node.clone(),
        ..ClusterState::default()
    };
    for name in changed {
        for family in IpFamily::ALL {
            let key = (name.clone(), family);
            if let Some(svc) = state.services.get(&key) {
                out.services.insert(key, svc.clone());
            }
        }
        if let Some(eps) = state.endpoints.get(name) {
            out.endpoints.insert(name.clone(), eps.clone());
        }
    }
    out
}

/// Merges what a later update changed into an earlier one that was not synced.
fn merge_updates(mut earlier: ModelUpdate, later: ModelUpdate) -> ModelUpdate {
    append_update(&mut earlier, later);
    earlier.changed.sort();
    earlier.changed.dedup();
    earlier
}

/// `later` added to `earlier`, leaving `changed` unsorted (with repeats).
fn append_update(earlier: &mut ModelUpdate, later: ModelUpdate) {
    earlier.changed.extend(later.changed);
    earlier.node_changed |= later.node_changed;
    for (k, v) in later.before.services {
        earlier.before.services.entry(k).or_insert(v);
    }
    for (k, v) in later.before.endpoints {
        earlier.before.endpoints.entry(k).or_insert(v);
    }
}

#[cfg(test)]
mod tests;
