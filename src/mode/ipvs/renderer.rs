//! The ipvs mode's desired state kept service port by service port: an update
//! re-renders only the changed ports and says which virtual servers, addresses
//! and ipset members it touched, plus the nft element changes of the mode's
//! table. The same model as `NftablesRenderer`, for IPVS.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use kube_nlproxy_netlink::ipset::{IpsetMember, IpsetType};
use kube_nlproxy_netlink::nft::{Element, KeyValue};

use super::{
    IPSETS, IpsetSpec, IpvsDesired, IpvsOptions, VirtualServer, VsKey, family_of, ipset_name,
    nft_element, port_set_protocol, service_port, source_cidr_set, table,
};
use crate::mode::nftables::{TableDelta, TableSpec};
use crate::model::{ClusterState, IpFamily, NodeInfo, ServicePortName};

/// What one service port (one family) puts into the desired state.
#[derive(Debug, Clone, Default, PartialEq)]
struct Contribution {
    virtual_servers: Vec<(VsKey, VirtualServer)>,
    bound_addrs: Vec<IpAddr>,
    /// `(ipset name, member)`.
    members: Vec<(String, IpsetMember)>,
    /// Elements of the table's own sets and maps: `(family, set, element)`.
    nft_elements: Vec<(IpFamily, String, Element)>,
    conflicts: Vec<String>,
}

/// A key of one of the table's own sets or maps.
type NftKey = (IpFamily, String, Vec<KeyValue>);

/// The keys an update touched: all a diff needs to look at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsTouched {
    /// Virtual servers added, changed or removed.
    pub virtual_servers: BTreeSet<VsKey>,
    /// Addresses of `kube-ipvs0` added or removed.
    pub bound_addrs: BTreeSet<IpAddr>,
    /// `(ipset name, member)` added or removed.
    pub members: BTreeSet<(String, IpsetMember)>,
}

impl IpvsTouched {
    /// Whether nothing was touched.
    pub fn is_empty(&self) -> bool {
        self.virtual_servers.is_empty() && self.bound_addrs.is_empty() && self.members.is_empty()
    }

    /// Both sets of keys.
    pub fn extend(&mut self, other: IpvsTouched) {
        self.virtual_servers.extend(other.virtual_servers);
        self.bound_addrs.extend(other.bound_addrs);
        self.members.extend(other.members);
    }
}

/// What an update changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IpvsUpdate {
    /// The touched keys; `None` when everything was re-rendered (first update,
    /// the node or the options changed, a source-range prefix length came or
    /// went): the diff must look at everything.
    pub touched: Option<IpvsTouched>,
    /// The mode table's element changes per family (empty when `touched` is
    /// `None`: the tables are then diffed whole).
    pub nft: Vec<TableDelta>,
    /// Service ports re-rendered.
    pub rendered: usize,
    /// Virtual servers claimed by two service ports among the re-rendered ones.
    pub conflicts: Vec<String>,
}

/// The desired ipvs-mode state, kept service port by service port.
#[derive(Debug, Default)]
pub struct IpvsRenderer {
    /// What every port depends on: a change re-renders everything.
    inputs: Option<(IpvsOptions, NodeInfo)>,
    contributions: HashMap<(ServicePortName, IpFamily), Contribution>,
    /// Every port claiming a virtual server; the first in name order has it.
    claims: BTreeMap<VsKey, BTreeMap<ServicePortName, VirtualServer>>,
    addr_refs: BTreeMap<IpAddr, usize>,
    member_refs: BTreeMap<(String, IpsetMember), usize>,
    /// Every port claiming a key of the table's own sets; the first in name
    /// order has it.
    nft_claims: BTreeMap<NftKey, BTreeMap<ServicePortName, Element>>,
    /// Source-range prefix lengths in use per family (one nft set and rule each).
    prefixes: BTreeMap<(IpFamily, u8), usize>,
    /// The aggregate, kept in step (`tables` stays empty: see [`Self::tables`]).
    desired: IpvsDesired,
}

impl IpvsRenderer {
    /// The desired state as of the last update (without the nft tables).
    pub fn desired(&self) -> &IpvsDesired {
        &self.desired
    }

    /// The mode's nft table of each family, built whole (full syncs only).
    pub fn tables(&self) -> Vec<TableSpec> {
        let Some((opts, _)) = &self.inputs else {
            return Vec::new();
        };
        IpFamily::ALL
            .iter()
            .map(|f| table(*f, &self.desired, opts))
            .collect()
    }

    /// Re-renders every service port of `state`.
    pub fn update(&mut self, state: &ClusterState, opts: &IpvsOptions) -> IpvsUpdate {
        self.rebuild(state, opts)
    }

    /// Re-renders the ports in `changed` (both families); everything when the
    /// node or the options changed since the last update.
    pub fn update_changed(
        &mut self,
        state: &ClusterState,
        opts: &IpvsOptions,
        changed: &[ServicePortName],
    ) -> IpvsUpdate {
        if self.inputs.as_ref() != Some(&(opts.clone(), state.node.clone())) {
            return self.rebuild(state, opts);
        }
        let prefixes_before: BTreeSet<(IpFamily, u8)> = self.prefixes.keys().copied().collect();
        let mut touched = IpvsTouched::default();
        let mut elements = ElementChanges::default();
        let mut update = IpvsUpdate::default();
        for name in changed {
            for family in IpFamily::ALL {
                let key = (name.clone(), family);
                let new = state
                    .services
                    .get(&key)
                    .map(|svc| contribution(svc, family, state, opts));
                let old = self.contributions.get(&key);
                if old == new.as_ref() {
                    continue;
                }
                update.rendered += 1;
                if let Some(old) = self.contributions.remove(&key) {
                    self.withdraw(name, &old, &mut touched, &mut elements);
                }
                if let Some(new) = new {
                    update.conflicts.extend(new.conflicts.iter().cloned());
                    self.contribute(name, &new, &mut touched, &mut elements);
                    self.contributions.insert(key, new);
                }
            }
        }
        for key in &touched.virtual_servers {
            if let Some(claims) = self.claims.get(key).filter(|c| c.len() > 1) {
                let names: Vec<String> = claims.keys().map(ToString::to_string).collect();
                update.conflicts.push(format!(
                    "virtual server {key} is claimed by {}; keeping the first",
                    names.join(" and ")
                ));
            }
        }
        let prefixes_after: BTreeSet<(IpFamily, u8)> = self.prefixes.keys().copied().collect();
        if prefixes_after != prefixes_before {
            // A source-range set and its rule come or go: the table's skeleton
            // changes, and the diff looks at everything.
            update.touched = None;
            return update;
        }
        update.nft = elements.into_deltas();
        update.touched = Some(touched);
        update
    }

    fn rebuild(&mut self, state: &ClusterState, opts: &IpvsOptions) -> IpvsUpdate {
        *self = IpvsRenderer {
            inputs: Some((opts.clone(), state.node.clone())),
            desired: empty_desired(opts),
            ..IpvsRenderer::default()
        };
        let mut update = IpvsUpdate::default();
        let (mut touched, mut elements) = (IpvsTouched::default(), ElementChanges::default());
        for ((name, family), svc) in &state.services {
            let c = contribution(svc, *family, state, opts);
            update.conflicts.extend(c.conflicts.iter().cloned());
            self.contribute(name, &c, &mut touched, &mut elements);
            self.contributions.insert((name.clone(), *family), c);
            update.rendered += 1;
        }
        for (key, claims) in self.claims.iter().filter(|(_, c)| c.len() > 1) {
            let names: Vec<String> = claims.keys().map(ToString::to_string).collect();
            update.conflicts.push(format!(
                "virtual server {key} is claimed by {}; keeping the first",
                names.join(" and ")
            ));
        }
        update
    }

    fn contribute(
        &mut self,
        name: &ServicePortName,
        c: &Contribution,
        touched: &mut IpvsTouched,
        elements: &mut ElementChanges,
    ) {
        for (key, vs) in &c.virtual_servers {
            let claims = self.claims.entry(*key).or_default();
            claims.insert(name.clone(), vs.clone());
            let (_, first) = claims.first_key_value().expect("inserted above");
            if self.desired.virtual_servers.get(key) != Some(first) {
                self.desired.virtual_servers.insert(*key, first.clone());
                touched.virtual_servers.insert(*key);
            }
        }
        for addr in &c.bound_addrs {
            let n = self.addr_refs.entry(*addr).or_default();
            *n += 1;
            if *n == 1 {
                self.desired.bound_addrs.insert(*addr);
                touched.bound_addrs.insert(*addr);
            }
        }
        for (set, member) in &c.members {
            let n = self
                .member_refs
                .entry((set.clone(), member.clone()))
                .or_default();
            *n += 1;
            if *n > 1 {
                continue;
            }
            let spec = self
                .desired
                .ipsets
                .get_mut(set)
                .expect("every ipset is declared");
            spec.members.insert(member.clone());
            touched.members.insert((set.clone(), member.clone()));
            if let Some(prefix) = source_prefix(spec, member) {
                *self.prefixes.entry((spec.family, prefix)).or_default() += 1;
            }
            elements.add(spec, member);
        }
        for (family, set, element) in &c.nft_elements {
            let key = (*family, set.clone(), element.key.clone());
            let claims = self.nft_claims.entry(key.clone()).or_default();
            let before = claims.first_key_value().map(|(_, e)| e.clone());
            claims.insert(name.clone(), element.clone());
            let (_, first) = claims.first_key_value().expect("inserted above");
            if before.as_ref() != Some(first) {
                let first = first.clone();
                self.set_nft_element(&key, before, Some(first), elements);
            }
        }
    }

    /// Replaces the element of `key` (`old` → `new`) in the desired state and
    /// in the element changes.
    fn set_nft_element(
        &mut self,
        key: &NftKey,
        old: Option<Element>,
        new: Option<Element>,
        elements: &mut ElementChanges,
    ) {
        let (family, set, k) = key;
        let map = self
            .desired
            .nft_elements
            .entry((*family, set.clone()))
            .or_default();
        if let Some(old) = old {
            map.remove(k);
            elements.delete_raw(*family, set, old);
        }
        if let Some(new) = new {
            map.insert(k.clone(), new.clone());
            elements.add_raw(*family, set, new);
        }
        if map.is_empty() {
            self.desired.nft_elements.remove(&(*family, set.clone()));
        }
    }

    fn withdraw(
        &mut self,
        name: &ServicePortName,
        c: &Contribution,
        touched: &mut IpvsTouched,
        elements: &mut ElementChanges,
    ) {
        for (key, _) in &c.virtual_servers {
            let Some(claims) = self.claims.get_mut(key) else {
                continue;
            };
            claims.remove(name);
            touched.virtual_servers.insert(*key);
            match claims.first_key_value() {
                Some((_, first)) => {
                    self.desired.virtual_servers.insert(*key, first.clone());
                }
                None => {
                    self.claims.remove(key);
                    self.desired.virtual_servers.remove(key);
                }
            }
        }
        for addr in &c.bound_addrs {
            if decrement(&mut self.addr_refs, addr) {
                self.desired.bound_addrs.remove(addr);
                touched.bound_addrs.insert(*addr);
            }
        }
        for (set, member) in &c.members {
            if !decrement(&mut self.member_refs, &(set.clone(), member.clone())) {
                continue;
            }
            let spec = self
                .desired
                .ipsets
                .get_mut(set)
                .expect("every ipset is declared");
            spec.members.remove(member);
            touched.members.insert((set.clone(), member.clone()));
            if let Some(prefix) = source_prefix(spec, member) {
                decrement(&mut self.prefixes, &(spec.family, prefix));
            }
            elements.delete(spec, member);
        }
        for (family, set, element) in &c.nft_elements {
            let key = (*family, set.clone(), element.key.clone());
            let Some(claims) = self.nft_claims.get_mut(&key) else {
                continue;
            };
            let before = claims.first_key_value().map(|(_, e)| e.clone());
            claims.remove(name);
            let after = claims.first_key_value().map(|(_, e)| e.clone());
            if claims.is_empty() {
                self.nft_claims.remove(&key);
            }
            if before != after {
                self.set_nft_element(&key, before, after, elements);
            }
        }
    }
}

/// Decrements a reference count; whether it reached zero (and was removed).
fn decrement<K: Ord>(refs: &mut BTreeMap<K, usize>, key: &K) -> bool {
    match refs.get_mut(key) {
        Some(n) if *n > 1 => {
            *n -= 1;
            false
        }
        Some(_) => {
            refs.remove(key);
            true
        }
        None => false,
    }
}

/// The desired state with every ipset declared and nothing else.
pub(super) fn empty_desired(opts: &IpvsOptions) -> IpvsDesired {
    let mut d = IpvsDesired {
        nodeport_ips: opts.nodeport_ips.iter().copied().collect(),
        exclude_cidrs: opts.exclude_cidrs.clone(),
        ..IpvsDesired::default()
    };
    for family in IpFamily::ALL {
        for (name, kind) in IPSETS {
            let name = ipset_name(name, family);
            d.ipsets.insert(
                name.clone(),
                IpsetSpec {
                    name,
                    kind,
                    family,
                    members: BTreeSet::new(),
                },
            );
        }
    }
    d
}

/// What `svc` contributes, rendered alone.
fn contribution(
    svc: &crate::model::ServicePort,
    family: IpFamily,
    state: &ClusterState,
    opts: &IpvsOptions,
) -> Contribution {
    let mut scratch = empty_desired(opts);
    let endpoints = state
        .endpoints
        .get(&svc.name)
        .map(|eps| eps.as_slice())
        .unwrap_or(&[]);
    service_port(&mut scratch, svc, family, endpoints, state, opts);
    Contribution {
        nft_elements: scratch
            .nft_elements
            .into_iter()
            .flat_map(|((family, set), elements)| {
                elements
                    .into_values()
                    .map(move |e| (family, set.clone(), e))
            })
            .collect(),
        virtual_servers: scratch.virtual_servers.into_iter().collect(),
        bound_addrs: scratch.bound_addrs.into_iter().collect(),
        members: scratch
            .ipsets
            .into_values()
            .flat_map(|spec| {
                let name = spec.name;
                spec.members.into_iter().map(move |m| (name.clone(), m))
            })
            .collect(),
        conflicts: scratch.conflicts,
    }
}

/// The prefix length of a source-range member (each has its own nft set).
fn source_prefix(spec: &IpsetSpec, member: &IpsetMember) -> Option<u8> {
    match (spec.kind, member) {
        (IpsetType::HashIpPortNet, IpsetMember::IpPortNet { cidr, .. }) => Some(*cidr),
        _ => None,
    }
}

/// Removes `element` from `changes[key]`; whether it was there.
fn take(
    changes: &mut BTreeMap<(IpFamily, String), Vec<Element>>,
    key: &(IpFamily, String),
    element: &Element,
) -> bool {
    let Some(list) = changes.get_mut(key) else {
        return false;
    };
    match list.iter().position(|e| e == element) {
        Some(i) => {
            list.remove(i);
            true
        }
        None => false,
    }
}

/// The nft mirror elements that come and go, per family and set.
#[derive(Debug, Default)]
struct ElementChanges {
    add: BTreeMap<(IpFamily, String), Vec<Element>>,
    delete: BTreeMap<(IpFamily, String), Vec<Element>>,
}

impl ElementChanges {
    fn mirror(spec: &IpsetSpec, member: &IpsetMember) -> (String, Element) {
        match source_prefix(spec, member) {
            Some(prefix) => (
                source_cidr_set(spec.family, prefix),
                Element::new(nft_element(member, 0)),
            ),
            None => (
                spec.name.clone(),
                Element::new(nft_element(member, port_set_protocol(&spec.name))),
            ),
        }
    }

    fn add(&mut self, spec: &IpsetSpec, member: &IpsetMember) {
        let (set, element) = Self::mirror(spec, member);
        self.add_raw(spec.family, &set, element);
    }

    fn delete(&mut self, spec: &IpsetSpec, member: &IpsetMember) {
        let (set, element) = Self::mirror(spec, member);
        self.delete_raw(spec.family, &set, element);
    }

    fn add_raw(&mut self, family: IpFamily, set: &str, element: Element) {
        let key = (family, set.to_string());
        // Deleted and added back in one update: nothing changes.
        if !take(&mut self.delete, &key, &element) {
            self.add.entry(key).or_default().push(element);
        }
    }

    fn delete_raw(&mut self, family: IpFamily, set: &str, element: Element) {
        let key = (family, set.to_string());
        if !take(&mut self.add, &key, &element) {
            self.delete.entry(key).or_default().push(element);
        }
    }

    fn into_deltas(self) -> Vec<TableDelta> {
        let mut deltas: BTreeMap<IpFamily, TableDelta> = BTreeMap::new();
        for ((family, set), elements) in self.delete {
            if !elements.is_empty() {
                let d = deltas.entry(family).or_default();
                d.family = Some(family_of(family));
                d.delete_elements
                    .insert(set, elements.into_iter().map(Arc::new).collect());
            }
        }
        for ((family, set), elements) in self.add {
            if !elements.is_empty() {
                let d = deltas.entry(family).or_default();
                d.family = Some(family_of(family));
                d.add_elements
                    .insert(set, elements.into_iter().map(Arc::new).collect());
            }
        }
        deltas.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;
    use crate::mode::ipvs::desired_ipvs;
    use crate::mode::ipvs::tests::opts;
    use crate::sync::ipvs::{FakeIpvs, IpvsSyncer};
    use crate::sync::tests::{state_of, svc_seed};
    use crate::sync::{Dataplane, FakeKernel, Syncer};

    fn names(state: &ClusterState) -> BTreeSet<ServicePortName> {
        state
            .services
            .keys()
            .map(|(n, _)| n.clone())
            .chain(state.endpoints.keys().cloned())
            .collect()
    }

    fn same(renderer: &IpvsRenderer, fresh: &IpvsDesired) {
        let d = renderer.desired();
        assert_eq!(d.virtual_servers, fresh.virtual_servers);
        assert_eq!(d.bound_addrs, fresh.bound_addrs);
        assert_eq!(d.ipsets, fresh.ipsets);
        assert_eq!(d.nodeport_ips, fresh.nodeport_ips);
        assert_eq!(d.nft_elements, fresh.nft_elements);
        assert_eq!(renderer.tables(), fresh.tables);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any state to any state: the incremental update equals a fresh
        /// render, and the scoped syncs leave IPVS, the ipsets and the nft
        /// table exactly as a full sync of the new state does.
        #[test]
        fn incremental_equals_fresh_and_scoped_syncs_equal_a_full_sync(
            before in vec(svc_seed(), 0..8),
            after in vec(svc_seed(), 0..8),
        ) {
            let opts = opts();
            let (s1, s2) = (state_of(&before), state_of(&after));
            let mut renderer = IpvsRenderer::default();
            renderer.update(&s1, &opts);
            same(&renderer, &desired_ipvs(&s1, &opts));

            let mut ipvs = IpvsSyncer::new(FakeIpvs::default());
            let mut nft = Syncer::new(FakeKernel::default());
            ipvs.sync(renderer.desired()).unwrap();
            nft.sync_incremental(&[], || renderer.tables()).unwrap();

            let mut changed: Vec<ServicePortName> = names(&s1).into_iter().collect();
            changed.extend(names(&s2));
            changed.sort();
            changed.dedup();
            let update = renderer.update_changed(&s2, &opts, &changed);
            let fresh = desired_ipvs(&s2, &opts);
            same(&renderer, &fresh);

            if update.touched.is_none() {
                nft.request_full_sync();
            }
            ipvs.sync_scoped(renderer.desired(), update.touched.as_ref()).unwrap();
            nft.sync_incremental(&update.nft, || renderer.tables()).unwrap();

            let mut full_ipvs = IpvsSyncer::new(FakeIpvs::default());
            full_ipvs.sync(&fresh).unwrap();
            let mut full_nft = Syncer::new(FakeKernel::default());
            full_nft.sync(&fresh.tables).unwrap();
            prop_assert_eq!(&ipvs.dataplane().state, &full_ipvs.dataplane().state);
            for family in [kube_nlproxy_netlink::nft::Family::Ipv4, kube_nlproxy_netlink::nft::Family::Ipv6] {
                let mut a = nft.dataplane().clone();
                let mut b = full_nft.dataplane().clone();
                prop_assert_eq!(
                    a.dump(family, crate::mode::nftables::TABLE).unwrap(),
                    b.dump(family, crate::mode::nftables::TABLE).unwrap()
                );
            }
        }
    }

    #[test]
    fn one_endpoint_change_among_10k_touches_one_real_server() {
        use crate::model::{Endpoint, IpFamily, Protocol, ServicePort};
        use std::net::Ipv4Addr;
        let opts = opts();
        let name = |i: usize| ServicePortName {
            namespace: "ns".into(),
            name: format!("s{i}").into(),
            port_name: "p".into(),
            protocol: Protocol::Tcp,
        };
        let mut state = ClusterState::default();
        for i in 0..10_000usize {
            let cip = Ipv4Addr::new(10, 96, (i >> 8) as u8, i as u8);
            state.services.insert(
                (name(i), IpFamily::V4),
                ServicePort::new(name(i), IpFamily::V4, Some(IpAddr::V4(cip)), 80),
            );
            let eps = (0..2)
                .map(|j| {
                    let ip = Ipv4Addr::new(10, 128 + j as u8, (i >> 8) as u8, i as u8);
                    Endpoint::ready(IpAddr::V4(ip), 8080, false)
                })
                .collect();
            state.endpoints.insert(name(i), std::sync::Arc::new(eps));
        }
        let mut renderer = IpvsRenderer::default();
        renderer.update(&state, &opts);
        let mut ipvs = IpvsSyncer::new(FakeIpvs::default());
        ipvs.sync(renderer.desired()).unwrap();
        let dumps = ipvs.dataplane().dumps;
        let ops = ipvs.dataplane().log.len();

        std::sync::Arc::make_mut(state.endpoints.get_mut(&name(4321)).unwrap())[1].ip =
            IpAddr::V4(Ipv4Addr::new(10, 250, 0, 1));
        let update = renderer.update_changed(&state, &opts, &[name(4321)]);
        assert_eq!(update.rendered, 1);
        let touched = update.touched.expect("scoped");
        assert_eq!(touched.virtual_servers.len(), 1);
        ipvs.sync_scoped(renderer.desired(), Some(&touched))
            .unwrap();
        // One real server in, one out; no read-back.
        let sent: Vec<String> = ipvs.dataplane().log[ops..]
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(ipvs.dataplane().dumps, dumps);
        // Nothing changed: nothing rendered, nothing sent.
        let update = renderer.update_changed(&state, &opts, &[]);
        assert_eq!(update.rendered, 0);
        let outcome = ipvs
            .sync_scoped(renderer.desired(), update.touched.as_ref())
            .unwrap();
        assert!(outcome.ops.is_empty());
    }
}
