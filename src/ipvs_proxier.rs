//! The driver of `--proxy-mode ipvs`: `source -> model -> mode::ipvs ->
//! sync::ipvs (+ the nft Syncer for the mode's constant table)`.
//!
//! Kept apart from `daemon.rs` on purpose (a minimal hook in `proxier::run`). Not
//! wired yet, and left for the daemon: health/metrics servers, health-check node
//! ports and the UDP/SCTP conntrack cleanup (the daemon's `stale_flows` works on
//! `ClusterState` and applies to this mode unchanged).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use crate::config::Config;
use crate::mode::ipvs::{DUMMY_LINK, IpvsDesired, IpvsOptions, desired_ipvs};
use crate::mode::nftables::NodePortAddresses;
use crate::proxier::{ProxierError, build_state_quiet, nftables_options};
use crate::source::{ObjectSource, Objects};
use crate::sync::ipvs::{IpvsSyncError, IpvsSyncer, NetlinkIpvs, apply_ipvs_sysctls};
use crate::sync::{NetlinkDataplane, Syncer};

/// How often draining real servers are re-checked.
pub const GRACEFUL_RECHECK: Duration = Duration::from_secs(2);

fn sync_err(e: IpvsSyncError) -> ProxierError {
    ProxierError::Ipvs(e.to_string())
}

/// The ipvs-mode options for a cluster state (resolves `--nodeport-addresses`).
pub fn ipvs_options(
    cfg: &Config,
    state: &crate::model::ClusterState,
) -> Result<IpvsOptions, ProxierError> {
    let nft = nftables_options(cfg, state)?;
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
    let opts = ipvs_options(cfg, &state)?;
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

/// `run --proxy-mode ipvs`: sync, then follow `source` until SIGTERM/SIGINT
/// (or exit after one sync with `--once`).
pub async fn run_ipvs(cfg: &Config, source: &dyn ObjectSource) -> Result<(), ProxierError> {
    apply_ipvs_sysctls(cfg.ipvs_strict_arp);
    let mut ipvs = IpvsSyncer::new(NetlinkIpvs::new().map_err(sync_err)?);
    let mut nft = Syncer::new(NetlinkDataplane::new()?);
    let mut changes = source.subscribe();
    while *changes.borrow_and_update() == 0 {
        if changes.changed().await.is_err() {
            return Err(ProxierError::SourceEnded);
        }
    }
    let mut last_full = tokio::time::Instant::now();
    loop {
        if let Err(e) = sync_objects(cfg, &source.snapshot(), &mut ipvs, &mut nft) {
            tracing::error!("sync failed, the next one reads the kernel back: {e}");
            ipvs.request_full_sync();
            nft.request_full_sync();
        }
        if cfg.once {
            return Ok(());
        }
        let wait = if ipvs.pending_graceful() {
            GRACEFUL_RECHECK
        } else {
            cfg.sync_period
        };
        tokio::select! {
            r = changes.changed() => if r.is_err() { return Err(ProxierError::SourceEnded) },
            _ = tokio::time::sleep(wait) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        tokio::time::sleep(cfg.min_sync_period).await;
        if last_full.elapsed() >= cfg.sync_period {
            ipvs.request_full_sync();
            nft.request_full_sync();
            last_full = tokio::time::Instant::now();
        }
    }
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
