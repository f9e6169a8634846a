//! Where cluster objects come from.

pub mod file;
pub mod kube;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;

/// The API objects the proxy reads, as delivered by a source (file or API server).
#[derive(Debug, Clone, Default)]
pub struct Objects {
    /// `v1 Service`
    pub services: Vec<Service>,
    /// `discovery.k8s.io/v1 EndpointSlice`
    pub endpoint_slices: Vec<EndpointSlice>,
    /// `v1 Node`
    pub nodes: Vec<Node>,
    /// `networking.k8s.io/v1 ServiceCIDR`
    pub service_cidrs: Vec<ServiceCIDR>,
}

impl Objects {
    /// Append all objects of `other`.
    pub fn extend(&mut self, other: Objects) {
        self.services.extend(other.services);
        self.endpoint_slices.extend(other.endpoint_slices);
        self.nodes.extend(other.nodes);
        self.service_cidrs.extend(other.service_cidrs);
    }
}

/// A source of cluster objects, as the sync loop sees it.
pub trait ObjectSource {
    /// A generation counter: 0 while the initial state is still loading, then bumped
    /// whenever the objects change.
    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64>;
    /// The objects now.
    fn snapshot(&self) -> Objects;
}
