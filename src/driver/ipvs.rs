//! ipvs mode as a [`Mode`]: IPVS virtual servers, `kube-ipvs0`, the KUBE-*
//! ipsets, and the mode's constant nf_tables table.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use kube_nlproxy_netlink::addr::InterfaceAddress;
use kube_nlproxy_netlink::ipvs::IpvsTimeouts;

use crate::mode::ipvs::{DUMMY_LINK, IpvsDesired, IpvsOptions, IpvsRenderer, IpvsTouched};
use crate::mode::nftables::{NodePortAddresses, TableDelta, table_summary};
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
    renderer: IpvsRenderer,
    /// What the renderer touched since the last sync (`None`: everything).
    touched: Option<IpvsTouched>,
    /// The nft element changes since the last sync.
    nft_deltas: Vec<TableDelta>,
    /// IPVS, ipset and address operations sent so far (one request each).
    ipvs_requests: u64,
    /// `--ipvs-exclude-cidrs`
    exclude_cidrs: Vec<IpNet>,
    /// `--ipvs-tcp-timeout` etc. still to set (`None`: set, or all 0).
    pending_timeouts: Option<IpvsTimeouts>,
    /// The timeouts the kernel reported after setting them.
    applied_timeouts: Option<IpvsTimeouts>,
}

impl<I: IpvsDataplane, D: Dataplane> IpvsMode<I, D> {
    /// Over `ipvs` and `nft`, scheduling with `scheduler` (`--ipvs-scheduler`).
    pub fn new(ipvs: I, nft: D, scheduler: &str) -> Self {
        IpvsMode {
            ipvs: IpvsSyncer::new(ipvs),
            nft: Syncer::new(nft),
            scheduler: scheduler.to_string(),
            renderer: IpvsRenderer::default(),
            touched: None,
            nft_deltas: Vec::new(),
            ipvs_requests: 0,
            exclude_cidrs: Vec::new(),
            pending_timeouts: None,
            applied_timeouts: None,
        }
    }

    /// Never deletes virtual or real servers in `cidrs` (`--ipvs-exclude-cidrs`).
    #[must_use]
    pub fn exclude_cidrs(mut self, cidrs: Vec<IpNet>) -> Self {
        self.ipvs.set_exclude_cidrs(cidrs.clone());
        self.exclude_cidrs = cidrs;
        self
    }

    /// Sets IPVS's TCP, TCP-FIN and UDP connection timeouts before the first
    /// sync (`--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout`, `--ipvs-udp-timeout`;
    /// a zero leaves the kernel's value, all zero sends nothing), as upstream
    /// does at start.
    #[must_use]
    pub fn timeouts(mut self, timeouts: [Duration; 3]) -> Self {
        let secs = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
        let t = IpvsTimeouts {
            tcp: secs(timeouts[0]),
            tcp_fin: secs(timeouts[1]),
            udp: secs(timeouts[2]),
        };
        self.pending_timeouts = (t != IpvsTimeouts::default()).then_some(t);
        self
    }

    /// The timeouts the kernel reported after they were set.
    pub fn applied_timeouts(&self) -> Option<IpvsTimeouts> {
        self.applied_timeouts
    }

    /// The IPVS dataplane.
    pub fn ipvs_dataplane(&self) -> &I {
        self.ipvs.dataplane()
    }

    /// The nf_tables dataplane.
    pub fn nft_dataplane(&self) -> &D {
        self.nft.dataplane()
    }

    /// The desired state of the last [`Mode::desired`] (its nft tables are
    /// built only when a full sync needs them).
    pub fn desired_state(&self) -> &IpvsDesired {
        self.renderer.desired()
    }

    /// The desired nft tables (v4 first), rendered now.
    pub fn desired_tables(&self) -> Vec<crate::mode::nftables::TableSpec> {
        self.renderer.tables()
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
pub fn ipvs_options(node: &NodeContext, scheduler: &str, exclude_cidrs: &[IpNet]) -> IpvsOptions {
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
        exclude_cidrs: exclude_cidrs.to_vec(),
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
        changed: Option<&[ServicePortName]>,
    ) -> Result<(), ModeError> {
        let opts = ipvs_options(node, &self.scheduler, &self.exclude_cidrs);
        let update = match changed {
            Some(changed) => self.renderer.update_changed(state, &opts, changed),
            None => self.renderer.update(state, &opts),
        };
        for c in &update.conflicts {
            tracing::warn!("conflicting services: {c}");
        }
        tracing::debug!(rendered = update.rendered, "ipvs desired state");
        match (&mut self.touched, update.touched) {
            (Some(pending), Some(touched)) => {
                pending.extend(touched);
                self.nft_deltas.extend(update.nft);
            }
            // Everything was re-rendered: the next sync diffs everything.
            (pending, None) => {
                *pending = None;
                self.nft_deltas.clear();
                self.nft.request_full_sync();
            }
            // Still to diff whole from an earlier update.
            (None, Some(_)) => {}
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<SyncReport, ModeError> {
        if let Some(t) = self.pending_timeouts {
            let now = self.ipvs.set_timeouts(&t)?;
            self.ipvs_requests += 2;
            tracing::info!(
                tcp = now.tcp,
                tcp_fin = now.tcp_fin,
                udp = now.udp,
                "IPVS connection timeouts set"
            );
            self.applied_timeouts = Some(now);
            self.pending_timeouts = None;
        }
        let touched = self.touched.replace(IpvsTouched::default());
        let deltas = std::mem::take(&mut self.nft_deltas);
        let desired = self.renderer.desired();
        let outcome = self.ipvs.sync_scoped(desired, touched.as_ref())?;
        self.ipvs_requests += outcome.ops.values().sum::<usize>() as u64;
        let mut ops = outcome.ops;
        let renderer = &self.renderer;
        let nft = self.nft.sync_incremental(&deltas, || renderer.tables())?;
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

    fn plan(&mut self) -> Result<Vec<super::plan::PlannedOp>, ModeError> {
        let desired = self.renderer.desired();
        let mut out = super::plan::ipvs_planned(&self.ipvs.plan(desired)?.ops);
        out.extend(super::plan::nft_planned(
            &self.nft.plan(&self.renderer.tables())?,
        ));
        self.request_full_sync();
        Ok(out)
    }

    fn verify(&mut self) -> Result<Vec<String>, ModeError> {
        self.ipvs.request_full_sync();
        let mut differing: Vec<String> = (self.ipvs.plan(self.renderer.desired())?.ops.iter())
            .map(|op| format!("ipvs: the kernel lacks `{op}`"))
            .collect();
        differing.extend(self.nft.verify(&self.renderer.tables())?);
        Ok(differing)
    }

    fn cleanup(&mut self, addresses: &[InterfaceAddress]) -> Result<usize, ModeError> {
        let n = self.cleanup_ipvs_objects(addresses)?;
        Ok(n + self.nft.cleanup()?)
    }

    fn request_full_sync(&mut self) {
        self.touched = None;
        self.nft_deltas.clear();
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
        let desired = self.renderer.desired();
        let mut out = vec![format!(
            "ipvs: {} virtual servers, {} real servers, {} addresses on {DUMMY_LINK}",
            desired.virtual_servers.len(),
            desired
                .virtual_servers
                .values()
                .map(|v| v.real_servers.len())
                .sum::<usize>(),
            desired.bound_addrs.len()
        )];
        out.extend(self.renderer.tables().iter().map(table_summary));
        out
    }
}
