//! Where cluster objects come from.

pub mod api_rate;
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

/// `(namespace, name)` of an object; the namespace is empty for cluster-scoped
/// kinds.
pub type ObjectKey = (String, String);

/// The objects that changed since the last [`ObjectSource::take_changes`]:
/// per key the object now, or `None` when it was deleted. Nodes and ServiceCIDRs
/// are few and come whole when any of them changed.
#[derive(Debug, Clone, Default)]
pub struct ObjectChanges {
    /// Changed Services.
    pub services: Vec<(ObjectKey, Option<Service>)>,
    /// Changed EndpointSlices.
    pub endpoint_slices: Vec<(ObjectKey, Option<EndpointSlice>)>,
    /// All Nodes, when one changed.
    pub nodes: Option<Vec<Node>>,
    /// All ServiceCIDRs, when one changed.
    pub service_cidrs: Option<Vec<ServiceCIDR>>,
}

impl ObjectChanges {
    /// Every object of `objects`, as the changes of a first sync.
    pub fn everything(objects: Objects) -> Self {
        fn keyed<K: ::kube::Resource>(objects: Vec<K>) -> Vec<(ObjectKey, Option<K>)> {
            objects
                .into_iter()
                .map(|o| {
                    let m = o.meta();
                    let key = (
                        m.namespace.clone().unwrap_or_default(),
                        m.name.clone().unwrap_or_default(),
                    );
                    (key, Some(o))
                })
                .collect()
        }
        ObjectChanges {
            services: keyed(objects.services),
            endpoint_slices: keyed(objects.endpoint_slices),
            nodes: Some(objects.nodes),
            service_cidrs: Some(objects.service_cidrs),
        }
    }

    /// The changes that turn `before` into `after` (O(objects): for sources that
    /// do not track changes themselves).
    pub fn between(before: &Objects, after: &Objects) -> Self {
        fn diff<K: ::kube::Resource + PartialEq + Clone>(
            before: &[K],
            after: &[K],
        ) -> Vec<(ObjectKey, Option<K>)> {
            let key = |o: &K| {
                let m = o.meta();
                (
                    m.namespace.clone().unwrap_or_default(),
                    m.name.clone().unwrap_or_default(),
                )
            };
            let mut old: std::collections::HashMap<ObjectKey, &K> =
                before.iter().map(|o| (key(o), o)).collect();
            let mut out = Vec::new();
            for o in after {
                let k = key(o);
                match old.remove(&k) {
                    Some(p) if p == o => {}
                    _ => out.push((k, Some(o.clone()))),
                }
            }
            out.extend(old.into_keys().map(|k| (k, None)));
            out
        }
        ObjectChanges {
            services: diff(&before.services, &after.services),
            endpoint_slices: diff(&before.endpoint_slices, &after.endpoint_slices),
            nodes: (before.nodes != after.nodes).then(|| after.nodes.clone()),
            service_cidrs: (before.service_cidrs != after.service_cidrs)
                .then(|| after.service_cidrs.clone()),
        }
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.endpoint_slices.is_empty()
            && self.nodes.is_none()
            && self.service_cidrs.is_none()
    }
}

/// A source of cluster objects, as the sync loop sees it.
pub trait ObjectSource {
    /// A generation counter: 0 while the initial state is still loading, then bumped
    /// whenever the objects change.
    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64>;
    /// The objects now.
    fn snapshot(&self) -> Objects;
    /// The objects changed since the last call (everything on the first), for the
    /// one sync loop that consumes this source; `None` when the source does not
    /// track changes (the caller diffs snapshots instead).
    fn take_changes(&self) -> Option<ObjectChanges> {
        None
    }
}
