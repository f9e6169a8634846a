//! The driver of `--proxy-mode ipvs`: `source -> model -> mode::ipvs ->
//! sync::ipvs (+ the nft Syncer for the mode's constant table)`.
//!
//! [`IpvsBackend`] is driven by `daemon::run` like nftables mode, so health,
//! metrics, health-check node ports and the UDP/SCTP conntrack cleanup are the
//! same in both modes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use crate::config::Config;
use crate::daemon::Backend;
use crate::mode::ipvs::{DUMMY_LINK, IpvsDesired, IpvsOptions, desired_ipvs};
use crate::mode::nftables::{NftablesOptions, NodePortAddresses};
use crate::model::ClusterState;
use crate::proxier::{ProxierError, build_state_quiet, nftables_options};
use crate::source::{ObjectSource, Objects};
use crate::sync::ipvs::{IpvsSyncError, IpvsSyncer, NetlinkIpvs, apply_ipvs_sysctls};
use crate::sync::{NetlinkDataplane, Syncer};

/// How often draining real servers are re-checked.
pub const GRACEFUL_RECHECK: Duration = Duration::from_secs(2);

fn sync_err(e: IpvsSyncError) -> ProxierError {
    ProxierError::Ipvs(e.to_string())
}

/// The ipvs-mode options from the flags resolved for the node (NodePorts on every
/// local address are expanded to the address list ipvs needs).
pub fn ipvs_options(cfg: &Config, nft: NftablesOptions) -> Result<IpvsOptions, ProxierError> {
    let nodeport_ips = match nft.nodeport_addresses {
        NodePortAddresses::Ips(ips) => ips,
        // Every local address but loopback, link-local and kube-ipvs0's.
        NodePortAddresses::All => kube_nlproxy_netlink::addr::list_addresses()
            .map_err(|e| ProxierError::Addresses(e.to_string()))?
            .into_iter()
            .filter(|a| a.ifname != DUMMY_LINK)
            .map(|a| a.addr)
            .filter(|ip| !ip.is_loopback() && !is_link_local(ip))
            .collect(),
    };
    Ok(IpvsOptions {
        scheduler: cfg.ipvs_scheduler.clone(),
        nodeport_ips,
        masquerade_all: nft.masquerade_all,
        local_detector: nft.local_detector,
        masquerade_mark: nft.masquerade_mark,
    })
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// One ipvs-mode sync of `objects`.
pub fn sync_objects(
    cfg: &Config,
    objects: &Objects,
    ipvs: &mut IpvsSyncer<NetlinkIpvs>,
    nft: &mut Syncer<NetlinkDataplane>,
) -> Result<IpvsDesired, ProxierError> {
    let (state, warnings) = build_state_quiet(cfg, objects);
    for w in &warnings {
        tracing::warn!("skipped: {w}");
    }
    let opts = ipvs_options(cfg, nftables_options(cfg, &state)?)?;
    let desired = desired_ipvs(&state, &opts);
    for c in &desired.conflicts {
        tracing::warn!("conflicting services: {c}");
    }
    let outcome = ipvs.sync(&desired).map_err(sync_err)?;
    let nft_outcome = nft.sync(&desired.tables)?;
    if outcome.ops.is_empty() && nft_outcome.ops.is_empty() {
        tracing::debug!("sync: kernel already up to date");
    } else {
        tracing::info!(ipvs = ?outcome.ops, nft = ?nft_outcome.ops, draining = outcome.draining, "sync: committed");
    }
    Ok(desired)
}

/// ipvs mode as the daemon drives it: IPVS virtual servers, `kube-ipvs0`, the
/// KUBE-* ipsets, and the mode's constant nf_tables table.
pub struct IpvsBackend {
    ipvs: IpvsSyncer<NetlinkIpvs>,
    nft: Syncer<NetlinkDataplane>,
}

impl IpvsBackend {
    /// Opens the sockets and writes the sysctls ipvs mode needs.
    pub fn new(cfg: &Config) -> Result<Self, ProxierError> {
        apply_ipvs_sysctls(cfg.ipvs_strict_arp);
        Ok(IpvsBackend {
            ipvs: IpvsSyncer::new(NetlinkIpvs::new().map_err(sync_err)?),
            nft: Syncer::new(NetlinkDataplane::new()?),
        })
    }
}

impl Backend for IpvsBackend {
    fn mode(&self) -> &'static str {
        "ipvs"
    }

    fn sync(
        &mut self,
        cfg: &Config,
        state: &ClusterState,
        opts: &NftablesOptions,
        // The IPVS mode still builds and diffs everything on each sync.
        _changed: Option<&[crate::model::ServicePortName]>,
    ) -> Result<BTreeMap<&'static str, usize>, ProxierError> {
        let opts = ipvs_options(cfg, opts.clone())?;
        let desired = desired_ipvs(state, &opts);
        for c in &desired.conflicts {
            tracing::warn!("conflicting services: {c}");
        }
        let mut ops = self.ipvs.sync(&desired).map_err(sync_err)?.ops;
        for (kind, n) in self.nft.sync(&desired.tables)?.ops {
            *ops.entry(kind).or_default() += n;
        }
        Ok(ops)
    }

    fn request_full_sync(&mut self) {
        self.ipvs.request_full_sync();
        self.nft.request_full_sync();
    }

    fn messages_sent(&self) -> u64 {
        self.nft.dataplane().messages_sent()
    }

    fn recheck_after(&self) -> Option<Duration> {
        self.ipvs.pending_graceful().then_some(GRACEFUL_RECHECK)
    }
}

/// `run --proxy-mode ipvs`: sync, then follow `source` until SIGTERM/SIGINT
/// (or exit after one sync with `--once`).
pub async fn run_ipvs(cfg: &Config, source: &dyn ObjectSource) -> Result<(), ProxierError> {
    if cfg.once {
        apply_ipvs_sysctls(cfg.ipvs_strict_arp);
        let mut ipvs = IpvsSyncer::new(NetlinkIpvs::new().map_err(sync_err)?);
        let mut nft = Syncer::new(NetlinkDataplane::new()?);
        let mut changes = source.subscribe();
        while *changes.borrow_and_update() == 0 {
            if changes.changed().await.is_err() {
                return Err(ProxierError::SourceEnded);
            }
        }
        sync_objects(cfg, &source.snapshot(), &mut ipvs, &mut nft)?;
        return Ok(());
    }
    let mut backend = IpvsBackend::new(cfg)?;
    crate::daemon::run(cfg, source, &mut backend).await
}

/// Removes what ipvs mode owns (VSs on `kube-ipvs0` and our NodePort VSs,
/// `kube-ipvs0`, KUBE-* ipsets). Works on a kernel without IPVS (nothing of
/// IPVS can exist there). Used by `cleanup` and when nftables mode starts.
pub fn cleanup_ipvs(nodeport_ips: &BTreeSet<IpAddr>) -> Result<usize, ProxierError> {
    // NodePort VSs may sit on any local address; they are ours only when their
    // port is in our KUBE-NODE-PORT-* sets.
    let mut nodeport_ips = nodeport_ips.clone();
    if let Ok(addrs) = kube_nlproxy_netlink::addr::list_addresses() {
        nodeport_ips.extend(addrs.into_iter().map(|a| a.addr));
    }
    let dp = match NetlinkIpvs::new() {
        Ok(dp) => dp,
        Err(_) => NetlinkIpvs::without_ipvs().map_err(sync_err)?,
    };
    IpvsSyncer::new(dp).cleanup(&nodeport_ips).map_err(sync_err)
}
