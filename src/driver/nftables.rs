//! nftables mode as a [`Mode`]: the renderer keeps the desired tables service
//! by service, the syncer sends the elements that changed.

use crate::mode::nftables::{NftablesRenderer, TableDelta};
use crate::model::{ClusterState, ServicePortName};
use crate::sync::{Dataplane, Syncer};

use super::{Mode, ModeError, NodeContext, SyncReport};

/// nftables mode over a dataplane (the kernel, or `FakeKernel`).
#[derive(Debug)]
pub struct NftablesMode<D> {
    syncer: Syncer<D>,
    renderer: NftablesRenderer,
    /// What the renderer changed since the last sync.
    deltas: Vec<TableDelta>,
}

impl<D: Dataplane> NftablesMode<D> {
    /// Over `dataplane`; the first sync reads the kernel back.
    pub fn new(dataplane: D) -> Self {
        NftablesMode {
            syncer: Syncer::new(dataplane),
            renderer: NftablesRenderer::default(),
            deltas: Vec::new(),
        }
    }

    /// The dataplane.
    pub fn dataplane(&self) -> &D {
        self.syncer.dataplane()
    }

    /// The dataplane, mutably (tests make it fail).
    pub fn dataplane_mut(&mut self) -> &mut D {
        self.syncer.dataplane_mut()
    }

    /// The renderer (the desired state).
    pub fn renderer(&self) -> &NftablesRenderer {
        &self.renderer
    }
}

impl<D: Dataplane> Mode for NftablesMode<D> {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn desired(
        &mut self,
        state: &ClusterState,
        node: &NodeContext,
        changed: Option<&[ServicePortName]>,
    ) -> Result<(), ModeError> {
        let (deltas, stats) = match changed {
            Some(changed) => self.renderer.update_changed(state, &node.options, changed),
            None => self.renderer.update(state, &node.options),
        };
        for conflict in &stats.conflicts {
            tracing::warn!("conflicting services: {conflict}");
        }
        tracing::debug!(
            rendered = stats.rendered,
            node_changed = stats.node_changed,
            "nftables desired state"
        );
        // Deltas not yet sent stay until the next sync sends them (or a full
        // sync replaces them).
        self.deltas.extend(deltas);
        Ok(())
    }

    fn sync(&mut self) -> Result<SyncReport, ModeError> {
        let deltas = std::mem::take(&mut self.deltas);
        let outcome = self.syncer.sync_rendered(&self.renderer, &deltas)?;
        Ok(SyncReport {
            full: outcome.full,
            ops: outcome.ops,
        })
    }

    fn plan(&mut self) -> Result<Vec<super::plan::PlannedOp>, ModeError> {
        let ops = self.syncer.plan(&self.renderer.tables())?;
        // The plan read the kernel back; keep the next sync honest.
        self.syncer.request_full_sync();
        Ok(super::plan::nft_planned(&ops))
    }

    fn verify(&mut self) -> Result<Vec<String>, ModeError> {
        Ok(self.syncer.verify_rendered(&self.renderer)?)
    }

    fn cleanup(
        &mut self,
        _addresses: &[kube_nlproxy_netlink::addr::InterfaceAddress],
    ) -> Result<usize, ModeError> {
        self.deltas.clear();
        Ok(self.syncer.cleanup()?)
    }

    fn check_drift(&mut self) -> Result<bool, ModeError> {
        Ok(self.syncer.drifted(&self.renderer.skeletons())?)
    }

    fn request_full_sync(&mut self) {
        self.deltas.clear();
        self.syncer.request_full_sync();
    }

    /// While nothing has committed since our last sync, a dump would only
    /// find what we committed: the kernel is read by lookup instead (linear,
    /// where a dump of a big set is quadratic), and a full sync follows only
    /// when it lacks something.
    fn periodic_read_back(&mut self) {
        if self.deltas.is_empty() {
            match self.syncer.holds_unmoved(&self.renderer) {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!("periodic read-back by lookup: {}", crate::ErrorChain(&e))
                }
            }
        }
        self.request_full_sync();
    }

    fn messages_sent(&self) -> u64 {
        self.syncer.dataplane().messages_sent()
    }

    fn summary(&self) -> Vec<String> {
        self.renderer.summaries()
    }
}
