//! The commands: `run` (sync loop), `plan`, `cleanup`. Wires
//! `source -> model -> mode -> sync` together; the only place with a clock.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;

use crate::config::{Config, DetectLocalMode, NodePortAddressesFlag, ProxyMode, Source};
use crate::mode::nftables::{
    LocalDetector, NftablesOptions, NodePortAddresses, TableSpec, desired_tables, table_summary,
};
use crate::model::{BuildOptions, ClusterState, build};
use crate::source::file::{self, FileSource};
use crate::source::kube::{self as kube_source, KubeSource, KubeSourceConfig};
use crate::source::{ObjectSource, Objects};
use crate::sync::{NetlinkDataplane, SyncError, Syncer};

/// Errors that end a command.
#[derive(Debug, thiserror::Error)]
pub enum ProxierError {
    /// A mode or source this build does not provide yet.
    #[error("{0} is not available in this version")]
    Unsupported(&'static str),
    /// The file source failed as a whole (a single bad object only warns).
    #[error("reading manifests failed: {0}")]
    Source(#[from] file::FileSourceError),
    /// Syncing failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
    /// `--once`: the kernel does not match after the sync.
    #[error("the kernel does not match the desired state after the sync: {0}")]
    Mismatch(String),
    /// The source stopped delivering updates.
    #[error("the object source ended")]
    SourceEnded,
    /// The API server source could not start.
    #[error("kube source: {0}")]
    Kube(String),
    /// IPVS, `kube-ipvs0` or the KUBE-* ipsets could not be synced.
    #[error("ipvs mode: {0}")]
    Ipvs(String),
    /// Listing local addresses for `--nodeport-addresses` failed.
    #[error("listing local addresses for --nodeport-addresses failed: {0}")]
    Addresses(String),
}

/// The node name: `--hostname-override`, else the kernel's host name.
fn node_name(cfg: &Config) -> String {
    cfg.hostname_override.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_lowercase())
            .unwrap_or_default()
    })
}

/// What the model needs of the flags.
pub(crate) fn build_options(cfg: &Config) -> BuildOptions {
    BuildOptions {
        node_name: node_name(cfg),
        node_ips_override: cfg.node_ips.clone(),
        ignore_external_ips: cfg.ignore_external_ips,
    }
}

/// Builds the cluster state; returns the skipped objects and fields as messages.
pub(crate) fn build_state_quiet(cfg: &Config, objects: &Objects) -> (ClusterState, Vec<String>) {
    let (state, warnings) = build(objects, &build_options(cfg));
    (state, warnings.iter().map(ToString::to_string).collect())
}

/// Builds the cluster state, logging every object or field that was skipped.
fn build_state(cfg: &Config, objects: &Objects) -> ClusterState {
    let (state, warnings) = build_state_quiet(cfg, objects);
    for w in &warnings {
        tracing::warn!("skipped: {w}");
    }
    state
}

/// Resolves the flags that depend on the node into the mode's options.
pub(crate) fn nftables_options(
    cfg: &Config,
    state: &ClusterState,
) -> Result<NftablesOptions, ProxierError> {
    let local_detector = match cfg.detect_local_mode {
        None => LocalDetector::None,
        Some(DetectLocalMode::ClusterCidr) => {
            if cfg.cluster_cidrs.is_empty() {
                tracing::warn!(
                    "--detect-local-mode ClusterCIDR without --cluster-cidr: no local traffic detection"
                );
                LocalDetector::None
            } else {
                LocalDetector::Cidrs(cfg.cluster_cidrs.clone())
            }
        }
        Some(DetectLocalMode::NodeCidr) => LocalDetector::Cidrs(state.node.pod_cidrs.clone()),
        Some(DetectLocalMode::BridgeInterface) => match &cfg.pod_bridge_interface {
            Some(name) => LocalDetector::BridgeInterface(name.clone()),
            None => {
                tracing::warn!(
                    "--detect-local-mode BridgeInterface without --pod-bridge-interface"
                );
                LocalDetector::None
            }
        },
        Some(DetectLocalMode::InterfaceNamePrefix) => match &cfg.pod_interface_name_prefix {
            Some(p) => LocalDetector::InterfaceNamePrefix(p.clone()),
            None => {
                tracing::warn!(
                    "--detect-local-mode InterfaceNamePrefix without --pod-interface-name-prefix"
                );
                LocalDetector::None
            }
        },
    };
    let nodeport_addresses = match &cfg.nodeport_addresses {
        NodePortAddressesFlag::Primary if state.node.ips.is_empty() => {
            tracing::warn!(
                "node {:?} has no primary IP (no Node object and no --node-ip): NodePorts listen on all local addresses",
                state.node.name
            );
            NodePortAddresses::All
        }
        NodePortAddressesFlag::Primary => NodePortAddresses::Ips(state.node.ips.clone()),
        NodePortAddressesFlag::Cidrs(cidrs) => nodeport_ips_in(cidrs)?,
    };
    Ok(NftablesOptions {
        masquerade_all: cfg.masquerade_all,
        local_detector,
        nodeport_addresses,
        masquerade_mark: 1 << cfg.masquerade_bit,
    })
}

/// Local addresses inside `cidrs` (an all-zeros CIDR means every local address).
fn nodeport_ips_in(cidrs: &[IpNet]) -> Result<NodePortAddresses, ProxierError> {
    if cidrs.iter().any(|c| c.prefix_len() == 0) {
        return Ok(NodePortAddresses::All);
    }
    let addrs = kube_nlproxy_netlink::addr::list_addresses()
        .map_err(|e| ProxierError::Addresses(e.to_string()))?;
    let ips: Vec<IpAddr> = addrs
        .iter()
        .map(|a| a.addr)
        .filter(|ip| cidrs.iter().any(|c| c.contains(ip)))
        .collect();
    Ok(NodePortAddresses::Ips(ips))
}

fn desired(
    cfg: &Config,
    objects: &Objects,
) -> Result<(ClusterState, Vec<TableSpec>), ProxierError> {
    let state = build_state(cfg, objects);
    let opts = nftables_options(cfg, &state)?;
    let tables = desired_tables(&state, &opts);
    for conflict in tables.iter().flat_map(|t| &t.conflicts) {
        tracing::warn!("conflicting services: {conflict}");
    }
    Ok((state, tables))
}

/// `kube-nlproxy plan`: print what a sync would send.
pub async fn plan(cfg: &Config) -> Result<(), ProxierError> {
    if cfg.mode == ProxyMode::Ipvs {
        return Err(ProxierError::Unsupported("plan with --proxy-mode ipvs"));
    }
    let objects = match &cfg.source {
        Source::File(path) => {
            let (objects, warnings) = file::load_path(path)?;
            for w in &warnings {
                tracing::warn!("{w}");
            }
            objects
        }
        Source::Kube => initial_objects(start_source(cfg).await?.as_ref()).await?,
    };
    let (_, tables) = desired(cfg, &objects)?;
    let mut syncer = Syncer::new(NetlinkDataplane::new()?);
    let ops = syncer.plan(&tables)?;
    for op in &ops {
        println!("{op}");
    }
    for t in &tables {
        eprintln!("desired {}", table_summary(t));
    }
    eprintln!("{} operations", ops.len());
    Ok(())
}

/// `kube-nlproxy cleanup`: delete our tables.
pub fn cleanup() -> Result<(), ProxierError> {
    let mut syncer = Syncer::new(NetlinkDataplane::new()?);
    let n = syncer.cleanup()?;
    tracing::info!("cleanup: deleted {n} table(s)");
    let n = crate::ipvs_proxier::cleanup_ipvs(&Default::default())?;
    tracing::info!("cleanup: {n} IPVS-mode operation(s)");
    Ok(())
}

/// One sync: build, diff, apply; logs what was sent.
fn sync_objects(
    cfg: &Config,
    objects: &Objects,
    syncer: &mut Syncer<NetlinkDataplane>,
) -> Result<(ClusterState, Vec<TableSpec>), ProxierError> {
    let started = Instant::now();
    let (state, tables) = desired(cfg, objects)?;
    let outcome = syncer.sync(&tables)?;
    let elapsed = started.elapsed();
    if outcome.ops.is_empty() {
        tracing::debug!(
            full = outcome.full,
            ?elapsed,
            "sync: kernel already up to date"
        );
    } else {
        tracing::info!(full = outcome.full, ?elapsed, ops = ?outcome.ops, "sync: committed");
    }
    Ok((state, tables))
}

/// Starts the configured source: the manifests at `--source file:PATH`, or the API
/// server (in-cluster, `--kubeconfig`, `--master`) for `--source kube`.
async fn start_source(cfg: &Config) -> Result<Box<dyn ObjectSource>, ProxierError> {
    match &cfg.source {
        Source::File(path) => {
            let poll =
                Duration::from_millis(200).min(cfg.min_sync_period.max(Duration::from_millis(50)));
            Ok(Box::new(FileSource::start(path.clone(), poll)?))
        }
        Source::Kube => {
            let node = node_name(cfg);
            let kcfg = KubeSourceConfig {
                kubeconfig: cfg.kubeconfig.clone(),
                master: cfg.master.clone(),
                node_name: node.clone(),
            };
            let client = kube_source::client(&kcfg)
                .await
                .map_err(|e| ProxierError::Kube(e.to_string()))?;
            let source = KubeSource::start(client.clone(), &node)
                .await
                .map_err(|e| ProxierError::Kube(e.to_string()))?;
            tokio::spawn(async move { kube_source::post_starting_event(&client, &node).await });
            Ok(Box::new(source))
        }
    }
}

/// Waits until the source has its initial state (every initial list done).
async fn initial_objects(source: &dyn ObjectSource) -> Result<Objects, ProxierError> {
    let mut changes = source.subscribe();
    while *changes.borrow_and_update() == 0 {
        if changes.changed().await.is_err() {
            return Err(ProxierError::SourceEnded);
        }
    }
    Ok(source.snapshot())
}

/// `kube-nlproxy [run]`: sync, then follow changes (or exit with `--once`).
pub async fn run(cfg: &Config) -> Result<(), ProxierError> {
    if cfg.mode == ProxyMode::Ipvs {
        crate::config::host::apply_conntrack(&cfg.conntrack);
        let source = start_source(cfg).await?;
        return crate::ipvs_proxier::run_ipvs(cfg, source.as_ref()).await;
    }
    // Coming from ipvs mode: remove its objects (the shared nft table is
    // converted by the ordinary diff).
    match crate::ipvs_proxier::cleanup_ipvs(&Default::default()) {
        Ok(0) => {}
        Ok(n) => tracing::info!("removed ipvs-mode leftovers ({n} operations)"),
        Err(e) => tracing::warn!("could not check for ipvs-mode leftovers: {e}"),
    }
    let mut syncer = Syncer::new(NetlinkDataplane::new()?);
    if cfg.once {
        let started = Instant::now();
        let objects = match &cfg.source {
            Source::File(path) => {
                let (objects, warnings) = file::load_path(path)?;
                for w in &warnings {
                    tracing::warn!("{w}");
                }
                objects
            }
            Source::Kube => initial_objects(start_source(cfg).await?.as_ref()).await?,
        };
        let (state, tables) = sync_objects(cfg, &objects, &mut syncer)?;
        let differing = syncer.verify(&tables)?;
        if !differing.is_empty() {
            return Err(ProxierError::Mismatch(differing.join(" | ")));
        }
        // Like every sync: UDP/SCTP flows to endpoints that are gone must not
        // stick to them. Without the previous state, judged by this one alone.
        let stale = crate::sync::conntrack::StaleByState::new(&state);
        if !stale.is_empty() {
            crate::daemon::clear_conntrack_where(|orig, reply| stale.matches(orig, reply));
        }
        tracing::info!(elapsed = ?started.elapsed(), "sync complete; the kernel matches");
        for t in &tables {
            tracing::info!("{}", table_summary(t));
        }
        return Ok(());
    }

    crate::config::host::apply_conntrack(&cfg.conntrack);
    if let Some(adj) = cfg.oom_score_adj {
        crate::config::host::apply_oom_score_adj(adj);
    }
    let source = start_source(cfg).await?;
    let mut backend = crate::daemon::NftablesBackend::new(syncer);
    crate::daemon::run(cfg, source.as_ref(), &mut backend).await
}
