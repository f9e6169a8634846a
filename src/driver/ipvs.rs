//! ipvs mode as a [`Mode`]: IPVS virtual servers, `kube-ipvs0`, the KUBE-*
//! ipsets, and the mode's constant nf_tables table.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use kube_nlproxy_netlink::addr::InterfaceAddress;

use crate::mode::ipvs::{DUMMY_LINK, IpvsDesired, IpvsOptions, desired_ipvs};
use crate::mode::nftables::{NodePortAddresses, table_summary};
use crate::model::{ClusterState, ServicePortName};
use crate::sync::ipvs::{IpvsDataplane, IpvsSyncError, IpvsSyncer};
use crate::sync::{Dataplane, Syncer};

use super::{Mode, ModeError, NodeContext, SyncReport};

/// How often draining real servers are re-checked.
pub const GRACEFUL_RECHECK: Duration = Duration::from_secs(2);

/// ipvs mode over an IPVS dataplane and an nf_tables one.
#[derive(Debug)]
pub struct IpvsMode<I, D> {
    ipvs: IpvsSyncer<I>,
    nft: Syncer<D>,
    scheduler: String,
    desired: IpvsDesired,
    /// IPVS, ipset and address operations sent so far (one request each).
    ipvs_requests: u64,
}

impl<I: IpvsDataplane, D: Dataplane> IpvsMode<I, D> {
    /// Over `ipvs` and `nft`, scheduling with `scheduler` (`--ipvs-scheduler`).
    pub fn new(ipvs: I, nft: D, scheduler: &str) -> Self {
        IpvsMode {
            ipvs: IpvsSyncer::new(ipvs),
            nft: Syncer::new(nft),
            scheduler: scheduler.to_string(),
            desired: IpvsDesired::default(),
            ipvs_requests: 0,
        }
    }

    /// The IPVS dataplane.
    pub fn ipvs_dataplane(&self) -> &I {
        self.ipvs.dataplane()
    }

    /// The nf_tables dataplane.
    pub fn nft_dataplane(&self) -> &D {
        self.nft.dataplane()
    }

    /// The desired state of the last [`Mode::desired`].
    pub fn desired_state(&self) -> &IpvsDesired {
        &self.desired
    }

    /// Deletes the IPVS objects of the mode (virtual servers on `kube-ipvs0`
    /// and our NodePort ones, `kube-ipvs0`, the KUBE-* ipsets) but not the nft
    /// table: what nftables mode does when it takes over a node.
    pub fn cleanup_ipvs_objects(
        &mut self,
        addresses: &[InterfaceAddress],
    ) -> Result<usize, IpvsSyncError> {
        // NodePort VSs may sit on any local address; they are ours only when
        // their port is in our KUBE-NODE-PORT-* sets.
        let nodeport_ips: BTreeSet<IpAddr> = addresses.iter().map(|a| a.addr).collect();
        let n = self.ipvs.cleanup(&nodeport_ips)?;
        self.ipvs_requests += n as u64;
        Ok(n)
    }
}

/// The ipvs-mode options from the flags resolved for the node: NodePorts on
/// every local address become the list of those addresses, but loopback,
/// link-local and `kube-ipvs0`'s.
pub fn ipvs_options(node: &NodeContext, scheduler: &str) -> IpvsOptions {
    let nodeport_ips = match &node.options.nodeport_addresses {
        NodePortAddresses::Ips(ips) => ips.clone(),
        NodePortAddresses::All => node
            .addresses
            .iter()
            .filter(|a| a.ifname != DUMMY_LINK)
            .map(|a| a.addr)
            .filter(|ip| !ip.is_loopback() && !is_link_local(ip))
            .collect(),
    };
    IpvsOptions {
        scheduler: scheduler.to_string(),
        nodeport_ips,
        masquerade_all: node.options.masquerade_all,
        local_detector: node.options.local_detector.clone(),
        masquerade_mark: node.options.masquerade_mark,
    }
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}

impl<I: IpvsDataplane, D: Dataplane> Mode for IpvsMode<I, D> {
    fn name(&self) -> &'static str {
        "ipvs"
    }

    fn needs_local_addresses(&self, options: &crate::mode::nftables::NftablesOptions) -> bool {
        options.nodeport_addresses == NodePortAddresses::All
    }

    fn desired(
        &mut self,
        state: &ClusterState,
        node: &NodeContext,
        // The IPVS mode still renders every service on each sync.
        _changed: Option<&[ServicePortName]>,
    ) -> Result<(), ModeError> {
        self.desired = desired_ipvs(state, &ipvs_options(node, &self.scheduler));
        for c in &self.desired.conflicts {
            tracing::warn!("conflicting services: {c}");
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<SyncReport, ModeError> {
        let outcome = self.ipvs.sync(&self.desired)?;
        self.ipvs_requests += outcome.ops.values().sum::<usize>() as u64;
        let mut ops = outcome.ops;
        let nft = self.nft.sync(&self.desired.tables)?;
        for (kind, n) in nft.ops {
            *ops.entry(kind).or_default() += n;
        }
        if outcome.draining > 0 {
            tracing::debug!(draining = outcome.draining, "real servers draining");
        }
        Ok(SyncReport {
            full: outcome.full || nft.full,
            ops,
        })
    }

    fn plan(&mut self) -> Result<Vec<String>, ModeError> {
        let mut out: Vec<String> = (self.ipvs.plan(&self.desired)?.ops.iter())
            .map(ToString::to_string)
            .collect();
        out.extend(
            self.nft
                .plan(&self.desired.tables)?
                .iter()
                .map(ToString::to_string),
        );
        self.ipvs.request_full_sync();
        self.nft.request_full_sync();
        Ok(out)
    }

    fn verify(&mut self) -> Result<Vec<String>, ModeError> {
        self.ipvs.request_full_sync();
        let mut differing: Vec<String> = (self.ipvs.plan(&self.desired)?.ops.iter())
            .map(|op| format!("ipvs: the kernel lacks `{op}`"))
            .collect();
        differing.extend(self.nft.verify(&self.desired.tables)?);
        Ok(differing)
    }

    fn cleanup(&mut self, addresses: &[InterfaceAddress]) -> Result<usize, ModeError> {
        let n = self.cleanup_ipvs_objects(addresses)?;
        Ok(n + self.nft.cleanup()?)
    }

    fn request_full_sync(&mut self) {
        self.ipvs.request_full_sync();
        self.nft.request_full_sync();
    }

    fn messages_sent(&self) -> u64 {
        self.nft.dataplane().messages_sent() + self.ipvs_requests
    }

    fn recheck_after(&self) -> Option<Duration> {
        self.ipvs.pending_graceful().then_some(GRACEFUL_RECHECK)
    }

    fn summary(&self) -> Vec<String> {
        let mut out = vec![format!(
            "ipvs: {} virtual servers, {} real servers, {} addresses on {DUMMY_LINK}",
            self.desired.virtual_servers.len(),
            self.desired
                .virtual_servers
                .values()
                .map(|v| v.real_servers.len())
                .sum::<usize>(),
            self.desired.bound_addrs.len()
        )];
        out.extend(self.desired.tables.iter().map(table_summary));
        out
    }
}
