//! PURE: the cluster state kept up to date object by object, like upstream's
//! service and endpoints change trackers. A changed Service rebuilds its own ports,
//! a changed EndpointSlice re-merges the endpoints of its own service; an update
//! says which service ports changed, so everything after it can work on those
//! alone. The result always equals [`build`](super::build) of the same objects.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::build::{
    BuildOptions, LABEL_SERVICE_NAME, Warning, endpoints, node_info, service_cidrs, service_ports,
};
use super::types::*;
use crate::source::{ObjectChanges, ObjectKey};

/// One EndpointSlice, parsed.
#[derive(Debug, Clone)]
struct ParsedSlice {
    /// `(namespace, service name)` from its `kubernetes.io/service-name` label.
    service: Option<ObjectKey>,
    /// Its endpoints per service port, in name order (a slice has one or a few
    /// ports: a `BTreeMap` would allocate a node of eleven entries per slice).
    endpoints: Box<[(ServicePortName, Arc<Vec<Endpoint>>)]>,
    /// `endpoints.kubernetes.io/last-change-trigger-time`, if set.
    trigger_time: Option<String>,
}

/// EndpointSlice annotation with the time of the change that caused it.
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// What one [`ModelTracker::apply`] changed.
#[derive(Debug, Clone, Default)]
pub struct ModelUpdate {
    /// Service ports that were added, changed or removed (either family), sorted.
    /// A port whose object changed without changing its ports may be listed too.
    pub changed: Vec<ServicePortName>,
    /// Whether our Node or the ServiceCIDRs changed (everything depends on them).
    pub node_changed: bool,
    /// Warnings that were not there before the update.
    pub new_warnings: Vec<Warning>,
    /// The changed service ports as they were before the update (services and
    /// endpoints), with the node as it was: what stale-flow cleanup compares with.
    pub before: ClusterState,
}

/// The names of one Service's EndpointSlices, sorted. Almost always one: a
/// short vector, where a `BTreeSet` would allocate a node of eleven per Service.
#[derive(Debug, Clone, Default)]
struct SliceNames(Vec<String>);

impl SliceNames {
    fn insert(&mut self, name: String) {
        if let Err(i) = self.0.binary_search(&name) {
            self.0.reserve_exact(1);
            self.0.insert(i, name);
        }
    }

    fn remove(&mut self, name: &str) {
        if let Ok(i) = self.0.binary_search_by(|n| n.as_str().cmp(name)) {
            self.0.remove(i);
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = &String> {
        self.0.iter()
    }
}

/// The cluster state of the objects seen so far, updated by changes.
#[derive(Debug, Clone, Default)]
pub struct ModelTracker {
    opts: BuildOptions,
    state: ClusterState,
    /// Service → its ports.
    ports: HashMap<ObjectKey, Vec<(ServicePortName, IpFamily)>>,
    /// EndpointSlice → parsed.
    slices: HashMap<ObjectKey, ParsedSlice>,
    /// `(namespace, service name)` → names of its EndpointSlices.
    slices_of: HashMap<ObjectKey, SliceNames>,
    /// Warnings per object (`Kind namespace/name`).
    warnings: HashMap<String, Vec<Warning>>,
    nodes: Vec<Node>,
}

impl ModelTracker {
    /// An empty state for `opts`.
    pub fn new(opts: BuildOptions) -> Self {
        ModelTracker {
            opts,
            ..Default::default()
        }
    }

    /// The current state.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// The Nodes (only ours is watched).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The trigger-time annotation of the EndpointSlice `namespace/name`.
    pub fn trigger_time(&self, key: &str) -> Option<String> {
        let (ns, name) = key.split_once('/')?;
        self.slices
            .get(&(ns.to_string(), name.to_string()))?
            .trigger_time
            .clone()
    }

    /// Every warning the current objects give.
    pub fn warnings(&self) -> impl Iterator<Item = &Warning> {
        self.warnings.values().flatten()
    }

    /// Applies the changed objects. O(changed objects and their services' slices).
    pub fn apply(&mut self, changes: ObjectChanges) -> ModelUpdate {
        let mut update = ModelUpdate::default();
        update.before.node = self.state.node.clone();
        let mut affected: BTreeSet<ObjectKey> = BTreeSet::new();

        for (key, slice) in changes.endpoint_slices {
            let object = format!("EndpointSlice {}/{}", key.0, key.1);
            if let Some(old) = self.slices.remove(&key)
                && let Some(service) = old.service
            {
                if let Some(names) = self.slices_of.get_mut(&service) {
                    names.remove(&key.1);
                    if names.is_empty() {
                        self.slices_of.remove(&service);
                    }
                }
                affected.insert(service);
            }
            let mut warnings = Vec::new();
            if let Some(slice) = slice {
                let service = slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_SERVICE_NAME))
                    .filter(|s| !s.is_empty())
                    .map(|s| (key.0.clone(), s.clone()));
                let parsed = endpoints(
                    std::slice::from_ref(&slice),
                    &self.opts.node_name,
                    &mut warnings,
                );
                if let Some(service) = &service {
                    self.slices_of
                        .entry(service.clone())
                        .or_default()
                        .insert(key.1.clone());
                    affected.insert(service.clone());
                }
                let trigger_time = slice
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(TRIGGER_TIME))
                    .cloned();
                self.slices.insert(
                    key,
                    ParsedSlice {
                        service,
                        endpoints: parsed
                            .into_iter()
                            .map(|(name, mut eps)| {
                                eps.shrink_to_fit();
                                (name, Arc::new(eps))
                            })
                            .collect(),
                        trigger_time,
                    },
                );
            }
            self.set_warnings(object, warnings, &mut update.new_warnings);
        }

        let mut services: Vec<(ObjectKey, Option<k8s_openapi::api::core::v1::Service>)> =
            changes.services;
        for (key, _) in &services {
            affected.insert(key.clone());
        }
        services.sort_by(|a, b| a.0.cmp(&b.0));
        let services: HashMap<ObjectKey, Option<k8s_openapi::api::core::v1::Service>> =
            services.into_iter().collect();

        for key in affected {
            // Take the service's ports and endpoints out, remembering them.
            let old_ports = self.ports.get(&key).cloned().unwrap_or_default();
            for (name, family) in &old_ports {
                if let Some(sp) = self.state.services.remove(&(name.clone(), *family)) {
                    update.before.services.insert((name.clone(), *family), sp);
                }
                if let Some(eps) = self.state.endpoints.remove(name) {
                    update.before.endpoints.insert(name.clone(), eps);
                }
                update.changed.push(name.clone());
            }
            // Its ports: rebuilt when the Service changed, else as they were.
            let new_ports: Vec<ServicePort> = match services.get(&key) {
                Some(Some(svc)) => {
                    let mut warnings = Vec::new();
                    let ports = service_ports(svc, &self.opts, &mut warnings);
                    self.set_warnings(
                        format!("Service {}/{}", key.0, key.1),
                        warnings,
                        &mut update.new_warnings,
                    );
                    ports
                }
                Some(None) => {
                    self.warnings
                        .remove(&format!("Service {}/{}", key.0, key.1));
                    Vec::new()
                }
                None => old_ports
                    .iter()
                    .filter_map(|k| update.before.services.get(k).cloned())
                    .collect(),
            };
            let names: Vec<(ServicePortName, IpFamily)> = new_ports
                .iter()
                .map(|sp| (sp.name.clone(), sp.family))
                .collect();
            for sp in new_ports {
                update.changed.push(sp.name.clone());
                self.state.services.insert((sp.name.clone(), sp.family), sp);
            }
            // Its endpoints: the merge of its slices, for the ports it has.
            for (name, eps) in self.merged_endpoints(&key) {
                if names.iter().any(|(n, _)| *n == name) {
                    self.state.endpoints.insert(name, eps);
                }
            }
            if names.is_empty() {
                self.ports.remove(&key);
            } else {
                self.ports.insert(key, names);
            }
        }
        update.changed.sort();
        update.changed.dedup();

        let mut node_warnings = Vec::new();
        if let Some(nodes) = changes.nodes {
            self.nodes = nodes;
        }
        let node = node_info(&self.nodes, &self.opts, &mut node_warnings);
        if node != self.state.node {
            self.state.node = node;
            update.node_changed = true;
        }
        self.set_warnings("Node".into(), node_warnings, &mut update.new_warnings);
        if let Some(cidrs) = changes.service_cidrs {
            let mut warnings = Vec::new();
            let cidrs = service_cidrs(&cidrs, &mut warnings);
            self.set_warnings("ServiceCIDRs".into(), warnings, &mut update.new_warnings);
            if cidrs != self.state.service_cidrs {
                self.state.service_cidrs = cidrs;
                update.node_changed = true;
            }
        }
        update
    }

    /// The endpoints of a service's slices merged like [`build`](super::build)
    /// does: slices in name order, the first of an address and port kept unless a
    /// later one is local.
    fn merged_endpoints(
        &self,
        service: &ObjectKey,
    ) -> BTreeMap<ServicePortName, Arc<Vec<Endpoint>>> {
        let mut out: BTreeMap<ServicePortName, Arc<Vec<Endpoint>>> = BTreeMap::new();
        let Some(names) = self.slices_of.get(service) else {
            return out;
        };
        let slices: Vec<&ParsedSlice> = names
            .iter()
            .filter_map(|slice_name| self.slices.get(&(service.0.clone(), slice_name.clone())))
            .collect();
        // One slice (the usual case): its lists are already merged (each
        // address and port once), and the model shares them.
        if let [slice] = slices.as_slice() {
            for (name, eps) in &slice.endpoints {
                if !eps.is_empty() {
                    out.insert(name.clone(), Arc::clone(eps));
                }
            }
            return out;
        }
        let mut merged: BTreeMap<ServicePortName, Vec<Endpoint>> = BTreeMap::new();
        let mut seen: HashMap<ServicePortName, HashMap<(std::net::IpAddr, u16), usize>> =
            HashMap::new();
        for slice in slices {
            for (name, eps) in &slice.endpoints {
                let list = merged.entry(name.clone()).or_default();
                let index = seen.entry(name.clone()).or_default();
                for ep in eps.iter() {
                    match index.get(&(ep.ip, ep.port)) {
                        None => {
                            index.insert((ep.ip, ep.port), list.len());
                            list.push(ep.clone());
                        }
                        Some(&i) if ep.is_local => list[i] = ep.clone(),
                        Some(_) => {}
                    }
                }
            }
        }
        // Kept for as long as the service is: no spare capacity.
        for (name, mut list) in merged {
            if !list.is_empty() {
                list.shrink_to_fit();
                out.insert(name, Arc::new(list));
            }
        }
        out
    }

    fn set_warnings(&mut self, object: String, warnings: Vec<Warning>, new: &mut Vec<Warning>) {
        let old = self.warnings.remove(&object).unwrap_or_default();
        new.extend(warnings.iter().filter(|w| !old.contains(w)).cloned());
        if !warnings.is_empty() {
            self.warnings.insert(object, warnings);
        }
    }
}

#[cfg(test)]
mod tests;
