//! PURE: the nf_tables ruleset for a cluster state, per IP family, kept up to date
//! service by service.
//!
//! The *semantics* are upstream kube-proxy's nftables mode (KEP-3866): service IPs
//! and NodePorts looked up by `daddr . l4proto . dport` / `l4proto . dport`,
//! external-traffic handling with the pod/node short-circuit, reject or drop
//! without endpoints, unknown ClusterIP ports rejected, unallocated ServiceCIDR
//! addresses dropped, loadBalancerSourceRanges, mark-for-masquerade + `masquerade
//! fully-random`, hairpin and ClientIP affinity.
//!
//! The *layout* is element-only (DESIGN.md "What a commit costs in the kernel"):
//! every per-service and per-endpoint fact is an element of a map or a set, and the
//! table holds a constant handful of chains and rules. A commit that adds a chain,
//! a rule or a `goto` element makes the kernel re-validate the whole chain graph;
//! one that only adds or deletes data-map elements does not, so a Service or
//! endpoint change costs the kernel the same at 10 or 44 000 services.
//!
//! * `service-ips` (`daddr . l4proto . dport`) and `service-nodeports`
//!   (`l4proto . dport`) map an entry point to an endpoint *group* id.
//!   `service-ips-local` / `service-nodeports-local` do the same for traffic from
//!   outside the cluster to `externalTrafficPolicy: Local` services (their
//!   node-local endpoints).
//! * `endpoints` maps `group id . index` to `endpoint address . port`;
//!   `group-classes` holds `group id . endpoint count . affinity timeout`, and one
//!   rule per distinct (count, timeout) in use picks `numgen random mod count` and
//!   DNATs in the same rule.
//! * Session affinity: one dynamic timeout map `affinity`, `client . group id :
//!   endpoint . port`, checked against `group-endpoints` before it is used, so an
//!   entry for an endpoint that is gone never sends traffic anywhere.
//! * Masquerade decisions are set lookups (`external-cluster-*`,
//!   `external-local-*`, `cluster-ips`), hairpin one `saddr . daddr` set.
//! * Register use inside a dispatch rule (32-bit registers, `A` = address
//!   registers of the family, 1 or 4): the entry key is loaded from register 0,
//!   the group id lands in `G = 2A + 2`, the client address in `G - A` (so
//!   `client . group` is one contiguous affinity key), count and timeout constants
//!   in `G + 1`, `G + 2`, and the chosen endpoint in `G + 1` onwards (so `group .
//!   endpoint . port` is one contiguous key too).

mod claims;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use kube_nlproxy_netlink::nft::{
    BaseChain, Chain, ChainType, DynsetOp, Element, Family, Hook, KeyType, KeyValue, Reg, Rule,
    Set, SetFlags, Verdict,
};

use self::claims::{Claims, ClaimsTable, claim_key};
use crate::mode::rules::{KeyField, RuleBuilder};
use crate::model::{
    ClusterState, Endpoint, IpFamily, NodeInfo, ServicePort, ServicePortName, TrafficPolicy,
    categorize_endpoints,
};

/// The renderer's hash maps: keyed by element keys and service port names,
/// hashed on every render. foldhash (per-process random seed, what hashbrown
/// uses by default) costs a fraction of SipHash on these short keys.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Name of both of our tables (`ip kube-nlproxy`, `ip6 kube-nlproxy`).
pub const TABLE: &str = "kube-nlproxy";

const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
const MASQUERADING: &str = "masquerading";
const SERVICES: &str = "services";
const FIREWALL_CHECK: &str = "firewall-check";
const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
/// The comment of a ServiceCIDR's drop rule, before the CIDR: `explain` reads the
/// CIDRs back from it.
pub const UNALLOCATED_COMMENT: &str = "drop traffic to unallocated ClusterIPs of ServiceCIDR ";
const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
const DISPATCH_IPS: &str = "dispatch-ips";
const DISPATCH_NODEPORTS: &str = "dispatch-nodeports";
const DISPATCH_IPS_LOCAL: &str = "dispatch-ips-local";
const DISPATCH_NODEPORTS_LOCAL: &str = "dispatch-nodeports-local";

/// The sets and maps of the table. Every one exists whatever the services are,
/// except `firewall-allow-P`, which exists while some source range has prefix
/// length P. "ips" sets are keyed by `daddr . l4proto . dport` (ClusterIPs,
/// externalIPs, LB IPs), "nodeports" sets by `l4proto . dport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetId {
    /// `cluster-ips`: ClusterIPs (unknown ports are rejected; masquerade from
    /// outside the cluster).
    ClusterIps,
    /// `nodeport-ips`: the addresses NodePorts listen on (`--nodeport-addresses`).
    NodeportIps,
    /// `*-classes`: `entry . endpoint count . affinity timeout` of every entry
    /// point with endpoints; one DNAT rule per class in use.
    Classes(Entry),
    /// `*-endpoints`: `entry . index : endpoint address . port`.
    Endpoints(Entry),
    /// `affinity-timeouts`: `address . proto . port . timeout` of the entry
    /// points with ClientIP affinity (a NodePort once per NodePort address).
    AffinityTimeouts,
    /// `affinity`: `client . address . proto . port : endpoint address . port`,
    /// filled by packets (recorded after DNAT, followed before it).
    Affinity,
    /// `external-cluster-*`: external entry points of eTP Cluster services
    /// (always masqueraded).
    ExternalCluster(EntryKind),
    /// `external-local-*`: external entry points of eTP Local services with
    /// endpoints (the node's own traffic is masqueraded and short-circuited).
    ExternalLocal(EntryKind),
    /// `no-endpoint-reject-*`: entry points of services without any endpoint.
    NoEndpointReject(EntryKind),
    /// `no-endpoint-drop-*`: entry points whose traffic policy finds no endpoint.
    NoEndpointDrop(EntryKind),
    /// `no-local-endpoint-drop-*`: external entry points of eTP Local services
    /// without a local endpoint: traffic from outside is dropped, the node's own
    /// is short-circuited to the cluster endpoints (and pods' never gets here).
    NoLocalEndpointDrop(EntryKind),
    /// `firewall-ips`: LB IPs with loadBalancerSourceRanges.
    FirewallIps,
    /// `firewall-allow-P`: `lb . proto . port . source network` of prefix length P.
    FirewallAllow(u8),
    /// `hairpin`: `endpoint . endpoint` (a pod reaching itself is masqueraded).
    Hairpin,
}

/// How an entry point is keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKind {
    /// `daddr . l4proto . dport`: ClusterIPs, externalIPs, LB IPs.
    Ips,
    /// `l4proto . dport` on a NodePort address.
    Nodeports,
}

/// Which endpoints an entry point's traffic goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entry {
    /// ClusterIP: the internal policy's endpoints; external addresses: cluster
    /// endpoints (for eTP Local, the pod and node short-circuit).
    Main(EntryKind),
    /// External addresses of eTP Local services, traffic from outside the
    /// cluster: this node's endpoints.
    Local(EntryKind),
}

impl EntryKind {
    fn suffix(self) -> &'static str {
        match self {
            EntryKind::Ips => "ips",
            EntryKind::Nodeports => "nodeports",
        }
    }

    fn key(self, family: Family) -> Vec<KeyType> {
        match self {
            EntryKind::Ips => vec![
                KeyType::addr(family),
                KeyType::InetProto,
                KeyType::InetService,
            ],
            EntryKind::Nodeports => vec![KeyType::InetProto, KeyType::InetService],
        }
    }

    fn fields(self) -> &'static [KeyField] {
        match self {
            EntryKind::Ips => &[KeyField::Daddr, KeyField::L4Proto, KeyField::Dport],
            EntryKind::Nodeports => &[KeyField::L4Proto, KeyField::Dport],
        }
    }
}

impl Entry {
    fn kind(self) -> EntryKind {
        match self {
            Entry::Main(k) | Entry::Local(k) => k,
        }
    }

    fn name(self) -> String {
        match self {
            Entry::Main(k) => k.suffix().to_string(),
            Entry::Local(k) => format!("{}-local", k.suffix()),
        }
    }

    const ALL: [Entry; 4] = [
        Entry::Main(EntryKind::Ips),
        Entry::Main(EntryKind::Nodeports),
        Entry::Local(EntryKind::Ips),
        Entry::Local(EntryKind::Nodeports),
    ];
}

impl SetId {
    /// The set's name in the kernel.
    pub fn name(self) -> String {
        match self {
            SetId::ClusterIps => "cluster-ips".into(),
            SetId::NodeportIps => "nodeport-ips".into(),
            SetId::Classes(e) => format!("classes-{}", e.name()),
            SetId::Endpoints(e) => format!("endpoints-{}", e.name()),
            SetId::AffinityTimeouts => "affinity-timeouts".into(),
            SetId::Affinity => "affinity".into(),
            SetId::ExternalCluster(k) => format!("external-cluster-{}", k.suffix()),
            SetId::ExternalLocal(k) => format!("external-local-{}", k.suffix()),
            SetId::NoEndpointReject(k) => format!("no-endpoint-reject-{}", k.suffix()),
            SetId::NoEndpointDrop(k) => format!("no-endpoint-drop-{}", k.suffix()),
            SetId::NoLocalEndpointDrop(k) => format!("no-local-endpoint-drop-{}", k.suffix()),
            SetId::FirewallIps => "firewall-ips".into(),
            SetId::FirewallAllow(p) => format!("firewall-allow-{p}"),
            SetId::Hairpin => "hairpin".into(),
        }
    }

    /// The fixed sets.
    fn fixed() -> Vec<SetId> {
        let mut out = vec![
            SetId::ClusterIps,
            SetId::NodeportIps,
            SetId::FirewallIps,
            SetId::Hairpin,
            SetId::AffinityTimeouts,
            SetId::Affinity,
        ];
        for e in Entry::ALL {
            out.push(SetId::Classes(e));
            out.push(SetId::Endpoints(e));
        }
        for k in [EntryKind::Ips, EntryKind::Nodeports] {
            out.extend([
                SetId::ExternalCluster(k),
                SetId::ExternalLocal(k),
                SetId::NoEndpointReject(k),
                SetId::NoEndpointDrop(k),
                SetId::NoLocalEndpointDrop(k),
            ]);
        }
        out
    }

    /// The set's definition in a table of `family`.
    pub fn definition(self, family: Family) -> Set {
        use KeyType::{InetProto, InetService, Mark};
        let addr = KeyType::addr(family);
        let with = |mut key: Vec<KeyType>, more: &[KeyType]| {
            key.extend_from_slice(more);
            key
        };
        let plain = SetFlags::default();
        let (key, data, flags) = match self {
            SetId::ClusterIps | SetId::NodeportIps => (vec![addr], vec![], plain),
            SetId::Classes(e) => (with(e.kind().key(family), &[Mark, Mark]), vec![], plain),
            SetId::Endpoints(e) => (
                with(e.kind().key(family), &[Mark]),
                vec![addr, InetService],
                plain,
            ),
            SetId::AffinityTimeouts => (vec![addr, InetProto, InetService, Mark], vec![], plain),
            SetId::Affinity => (
                vec![addr, addr, InetProto, InetService],
                vec![addr, InetService],
                SetFlags {
                    timeout: true,
                    dynamic: true,
                },
            ),
            SetId::ExternalCluster(k)
            | SetId::ExternalLocal(k)
            | SetId::NoEndpointReject(k)
            | SetId::NoEndpointDrop(k)
            | SetId::NoLocalEndpointDrop(k) => (k.key(family), vec![], plain),
            SetId::FirewallIps => (vec![addr, InetProto, InetService], vec![], plain),
            SetId::FirewallAllow(_) => (vec![addr, InetProto, InetService, addr], vec![], plain),
            SetId::Hairpin => (vec![addr, addr], vec![], plain),
        };
        Set {
            name: self.name(),
            key,
            verdict_map: false,
            data,
            flags,
            timeout_ms: None,
        }
    }
}

/// How the proxy tells traffic from local pods apart (`--detect-local-mode`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LocalDetector {
    /// No detector: off-cluster traffic to ClusterIPs is not masqueraded (unless
    /// `--masquerade-all`) and eTP Local cannot short-circuit pod traffic.
    #[default]
    None,
    /// `ClusterCIDR` / `NodeCIDR`: source address in one of these (per family).
    Cidrs(Vec<IpNet>),
    /// `BridgeInterface`: `iifname NAME`.
    BridgeInterface(String),
    /// `InterfaceNamePrefix`: `iifname PREFIX*`.
    InterfaceNamePrefix(String),
}

/// Which destination addresses NodePorts listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every local address except loopback (`fib daddr type local`).
    All,
    /// Only these addresses (both families mixed).
    Ips(Vec<IpAddr>),
}

/// Options of the nftables mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftablesOptions {
    /// `--masquerade-all`
    pub masquerade_all: bool,
    /// `--detect-local-mode` resolved
    pub local_detector: LocalDetector,
    /// `--nodeport-addresses` resolved
    pub nodeport_addresses: NodePortAddresses,
    /// The packet-mark bit asking for masquerade (`1 << masqueradeBit`, 0x4000).
    pub masquerade_mark: u32,
}

/// A chain with the rules it should hold, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    /// The chain.
    pub chain: Chain,
    /// Its rules.
    pub rules: Vec<Rule>,
}

/// A set with the elements it should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSpec {
    /// The set.
    pub set: Set,
    /// Its elements.
    pub elements: BTreeSet<Element>,
}

/// Everything one of our tables should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// `ip` or `ip6`.
    pub family: Family,
    /// Chains by name.
    pub chains: BTreeMap<String, ChainSpec>,
    /// Sets and maps by name.
    pub sets: BTreeMap<String, SetSpec>,
    /// Map keys claimed by two services (the first one in name order keeps it), as
    /// messages for the log.
    pub conflicts: Vec<String>,
    /// Verdict per (map, key), to find conflicts without scanning.
    claimed: BTreeMap<(String, Vec<KeyValue>), Option<Verdict>>,
}

impl TableSpec {
    pub(crate) fn new(family: Family) -> Self {
        TableSpec {
            family,
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
            conflicts: Vec::new(),
            claimed: BTreeMap::new(),
        }
    }

    pub(crate) fn chain(&mut self, name: &str) -> &mut Vec<Rule> {
        &mut self
            .chains
            .entry(name.to_string())
            .or_insert_with(|| ChainSpec {
                chain: Chain {
                    name: name.to_string(),
                    base: None,
                    comment: chain_comment(name),
                },
                rules: Vec::new(),
            })
            .rules
    }

    pub(crate) fn base_chain(&mut self, name: &str, kind: ChainType, hook: Hook, priority: i32) {
        self.chains.insert(
            name.to_string(),
            ChainSpec {
                chain: Chain {
                    name: name.to_string(),
                    base: Some(BaseChain {
                        kind,
                        hook,
                        priority,
                    }),
                    comment: chain_comment(name),
                },
                rules: Vec::new(),
            },
        );
    }

    pub(crate) fn set(
        &mut self,
        name: &str,
        key: Vec<KeyType>,
        verdict_map: bool,
        flags: SetFlags,
    ) {
        self.sets.insert(
            name.to_string(),
            SetSpec {
                set: Set {
                    name: name.to_string(),
                    key,
                    verdict_map,
                    data: Vec::new(),
                    flags,
                    timeout_ms: None,
                },
                elements: BTreeSet::new(),
            },
        );
    }

    pub(crate) fn element(
        &mut self,
        set: &str,
        key: Vec<KeyValue>,
        verdict: Option<Verdict>,
        comment: Option<&str>,
    ) {
        let spec = self.sets.get_mut(set).expect("set declared in skeleton");
        // A map holds one verdict per key: two services claiming the same
        // address/port keep the first (kube-proxy's behaviour is undefined here).
        if spec.set.verdict_map {
            let claim = (set.to_string(), key.clone());
            if let Some(existing) = self.claimed.get(&claim) {
                if *existing != verdict {
                    self.conflicts.push(format!(
                        "{set}: {key:?} is claimed by {existing:?} and {verdict:?}; keeping the first"
                    ));
                }
                return;
            }
            self.claimed.insert(claim, verdict.clone());
        }
        spec.elements.insert(Element {
            key,
            verdict,
            data: Vec::new(),
            comment: comment.map(Into::into),
        });
    }

    /// Appends a rule; one without a comment of its own is named by its chain's
    /// purpose, so every rule `nft list` shows says what it is for.
    pub(crate) fn rule(&mut self, chain: &str, builder: RuleBuilder, comment: Option<&str>) {
        let fallback = chain_comment(chain);
        let rule = builder.build(chain, comment.or(fallback.as_deref()));
        self.chain(chain).push(rule);
    }

    /// Number of rules over all chains.
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(|c| c.rules.len()).sum()
    }
}

pub(crate) fn family_of(f: IpFamily) -> Family {
    match f {
        IpFamily::V4 => Family::Ipv4,
        IpFamily::V6 => Family::Ipv6,
    }
}

pub(crate) fn net_family(net: &IpNet) -> IpFamily {
    match net {
        IpNet::V4(_) => IpFamily::V4,
        IpNet::V6(_) => IpFamily::V6,
    }
}

/// Builds both tables (v4 first) from scratch.
pub fn desired_tables(state: &ClusterState, opts: &NftablesOptions) -> Vec<TableSpec> {
    let mut renderer = NftablesRenderer::default();
    renderer.update(state, opts);
    renderer.tables()
}

/// Builds the table of one family from scratch.
pub fn desired_table(
    state: &ClusterState,
    opts: &NftablesOptions,
    ip_family: IpFamily,
) -> TableSpec {
    let mut table = FamilyRenderer::new(ip_family);
    table.update(state, opts, None);
    table.table()
}

/// What one [`NftablesRenderer::update`] changed, per family, for
/// `sync::diff::delta_ops`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableDelta {
    /// `ip` or `ip6`.
    pub family: Option<Family>,
    /// Chains to create first (only when the table is new).
    pub new_chains: Vec<Chain>,
    /// Sets to create first (a source-range prefix length newly in use).
    pub add_sets: Vec<Set>,
    /// Elements to delete, by set name (including the old version of changed ones).
    /// Shared with the renderer: a delta costs a pointer per element, not a copy.
    pub delete_elements: BTreeMap<String, Vec<Arc<Element>>>,
    /// Chains whose rules changed: flushed and rewritten.
    pub chains: Vec<ChainSpec>,
    /// Elements to add, by set name (shared with the renderer).
    pub add_elements: BTreeMap<String, Vec<Arc<Element>>>,
    /// Sets to delete last.
    pub delete_sets: Vec<String>,
    /// Entry points (`address . proto . port`) with ClientIP affinity that lost
    /// endpoints, with the endpoints they still have: clients' affinity entries
    /// leading anywhere else are stale and must go.
    pub affinity_cleanup: Vec<AffinityEntry>,
}

impl TableDelta {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.add_sets.is_empty()
            && self.new_chains.is_empty()
            && self.delete_elements.is_empty()
            && self.chains.is_empty()
            && self.add_elements.is_empty()
            && self.delete_sets.is_empty()
            && self.affinity_cleanup.is_empty()
    }
}

/// What one update did, for logs, metrics and tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderStats {
    /// Service ports rendered again (changed, added or removed).
    pub rendered: usize,
    /// Whether the node-level part (options, node, ServiceCIDRs) changed, which
    /// re-renders every service port.
    pub node_changed: bool,
    /// Map keys claimed by two services with different data (the first in name
    /// order keeps the key), as messages for the log.
    pub conflicts: Vec<String>,
}

/// The desired nftables dataplane of both families, kept service by service: an
/// update re-renders only the service ports whose inputs changed and says which
/// elements, chains and sets that changed.
#[derive(Debug, Clone)]
pub struct NftablesRenderer {
    families: [FamilyRenderer; 2],
}

impl Default for NftablesRenderer {
    fn default() -> Self {
        NftablesRenderer {
            families: [
                FamilyRenderer::new(IpFamily::V4),
                FamilyRenderer::new(IpFamily::V6),
            ],
        }
    }
}

impl NftablesRenderer {
    /// Brings the desired state to `state`; returns what changed, per family.
    /// Every service port is compared with what was rendered last: O(service
    /// ports) compares, re-rendering only the changed ones.
    pub fn update(
        &mut self,
        state: &ClusterState,
        opts: &NftablesOptions,
    ) -> (Vec<TableDelta>, RenderStats) {
        self.update_inner(state, opts, None)
    }

    /// Like [`update`](Self::update), trusting that only the service ports in
    /// `changed` (added, changed or removed, either family) differ from the last
    /// update: O(changed) work unless the node-level inputs changed.
    pub fn update_changed(
        &mut self,
        state: &ClusterState,
        opts: &NftablesOptions,
        changed: &[ServicePortName],
    ) -> (Vec<TableDelta>, RenderStats) {
        self.update_inner(state, opts, Some(changed))
    }

    fn update_inner(
        &mut self,
        state: &ClusterState,
        opts: &NftablesOptions,
        changed: Option<&[ServicePortName]>,
    ) -> (Vec<TableDelta>, RenderStats) {
        let mut stats = RenderStats::default();
        let deltas = self
            .families
            .iter_mut()
            .map(|f| {
                let (delta, s) = f.update(state, opts, changed);
                stats.rendered += s.rendered;
                stats.node_changed |= s.node_changed;
                stats.conflicts.extend(s.conflicts);
                delta
            })
            .collect();
        (deltas, stats)
    }

    /// The whole desired tables (v4 first): for a read-back diff, `plan` and
    /// `--once`'s check. O(size); the incremental path never calls it.
    pub fn tables(&self) -> Vec<TableSpec> {
        self.families.iter().map(FamilyRenderer::table).collect()
    }

    /// The desired tables (v4 first) as they are held, without building them:
    /// what `--once`'s check and the summary read, so they cost no copy of
    /// every element.
    pub fn rendered(&self) -> impl Iterator<Item = RenderedTable<'_>> {
        self.families.iter().map(|f| RenderedTable { family: f })
    }

    /// One summary line per table (v4 first), counted, not built.
    pub fn summaries(&self) -> Vec<String> {
        self.rendered().map(|t| t.summary()).collect()
    }

    /// Each table's chains, rules and sets (with only node-level elements):
    /// constant size, what a drift check compares with the kernel.
    pub fn skeletons(&self) -> Vec<TableSpec> {
        self.families.iter().map(|f| f.skeleton.clone()).collect()
    }

    /// Every entry point with ClientIP affinity and its endpoints, per family (v4
    /// first): what a full sync checks the clients' affinity entries against.
    pub fn affinity_entries(&self) -> Vec<(Family, Vec<AffinityEntry>)> {
        self.families
            .iter()
            .map(|f| {
                let entries = f
                    .services
                    .values()
                    .flat_map(|r| r.contribution.affinity.iter().cloned())
                    .collect();
                (f.family, entries)
            })
            .collect()
    }

    /// Number of service ports held, both families.
    pub fn service_ports(&self) -> usize {
        self.families.iter().map(|f| f.services.len()).sum()
    }
}

/// One desired table as the renderer holds it: the skeleton (chains, rules,
/// sets and the node-level elements) and, on top of it, the first claim of
/// every element key the services hold.
#[derive(Debug, Clone, Copy)]
pub struct RenderedTable<'a> {
    family: &'a FamilyRenderer,
}

impl<'a> RenderedTable<'a> {
    /// The skeleton: everything but the services' elements.
    pub fn skeleton(&self) -> &'a TableSpec {
        &self.family.skeleton
    }

    /// The services' elements, each with its set, in no particular order.
    pub fn service_elements(&self) -> impl Iterator<Item = (SetId, &'a Element)> + 'a {
        self.family
            .claims
            .iter()
            .filter_map(|claims| claims.first().map(|e| (claims.set(), &**e)))
    }

    /// The whole table, built: O(elements).
    pub fn table(&self) -> TableSpec {
        self.family.table()
    }

    /// How many elements the services hold (what [`service_elements`](Self::service_elements) yields).
    pub fn service_element_count(&self) -> usize {
        self.family.claims.len()
    }

    /// The services' elements, each with its set's name, one Service (every
    /// port of `ns/name`) at a time in name order: what a cold start sends,
    /// whole Services per transaction. Each group is copied as it is taken, so
    /// the caller never holds a copy of every element at once. An element that
    /// several service ports claim comes with the one the kernel gets it from.
    pub fn service_groups(self) -> impl Iterator<Item = Vec<(SetId, Element)>> + 'a {
        let family = self.family;
        let mut ports: Vec<(&'a ServicePortName, &'a RenderedService)> =
            family.services.iter().collect();
        ports.sort_unstable_by_key(|(name, _)| *name);
        let mut ports = ports.into_iter().peekable();
        std::iter::from_fn(move || {
            let (first, rendered) = ports.next()?;
            let mut service = vec![rendered];
            while let Some((_, next)) =
                ports.next_if(|(n, _)| n.namespace == first.namespace && n.name == first.name)
            {
                service.push(next);
            }
            let mut group = Vec::new();
            for (set, element) in service.iter().flat_map(|r| &r.contribution.elements) {
                let in_kernel = family
                    .claims
                    .get(*set, claim_key(*set, &element.key))
                    .and_then(Claims::first)
                    .is_some_and(|first| Arc::ptr_eq(first, element));
                if in_kernel {
                    group.push((*set, Element::clone(element)));
                }
            }
            Some(group)
        })
    }

    /// What [`table_summary`] says of [`table`](Self::table), counted.
    pub fn summary(&self) -> String {
        let skeleton = self.skeleton();
        let elements = skeleton
            .sets
            .values()
            .map(|s| s.elements.len())
            .sum::<usize>()
            + self.service_element_count();
        summary_line(skeleton, elements)
    }
}

/// The node-level inputs of a family's table: when they change, every service
/// port is rendered again.
#[derive(Debug, Clone, PartialEq, Default)]
struct NodeInputs {
    opts: Option<NftablesOptions>,
    node: NodeInfo,
    service_cidrs: Vec<IpNet>,
}

/// A dispatch class: one DNAT rule per (endpoint count, affinity timeout) in use.
type Class = (u32, u32);

/// What one service port put into the table, to take it out again.
#[derive(Debug, Clone, Default, PartialEq)]
struct Contribution {
    /// Shared with the claims (one copy of each element).
    elements: Vec<(SetId, Arc<Element>)>,
    classes: Vec<Class>,
    prefixes: Vec<u8>,
    /// Entry points (`address . proto . port`) with ClientIP affinity and the
    /// endpoints their traffic may go to.
    affinity: Vec<AffinityEntry>,
}

/// An entry point (`address . proto . port`) with ClientIP affinity, and the
/// endpoints (`address, port`) its traffic may go to.
pub type AffinityEntry = (Vec<KeyValue>, BTreeSet<(IpAddr, u16)>);

/// One service port as last rendered.
#[derive(Debug, Clone)]
struct RenderedService {
    /// Hash of the service port and its endpoints as rendered, to tell whether
    /// they changed without keeping a copy.
    inputs: u64,
    contribution: Contribution,
}

/// A hash of what a service port's rendering depends on (besides the node).
fn inputs_hash(svc: &ServicePort, endpoints: &[Endpoint]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    svc.hash(&mut h);
    endpoints.hash(&mut h);
    h.finish()
}

/// The element keys (as [`claim_key`] cuts them) a render touched, with the
/// element each had in the kernel before it.
type Touched = FastMap<(SetId, Vec<KeyValue>), Option<Arc<Element>>>;

/// The table of one family.
#[derive(Debug, Clone)]
struct FamilyRenderer {
    ip_family: IpFamily,
    family: Family,
    inputs: NodeInputs,
    /// Chains and the node-level elements (`nodeport-ips`), rendered from
    /// `inputs`, `classes` and `prefixes`.
    skeleton: TableSpec,
    services: FastMap<ServicePortName, RenderedService>,
    claims: ClaimsTable,
    classes: BTreeMap<Class, usize>,
    prefixes: BTreeMap<u8, usize>,
}

impl FamilyRenderer {
    fn new(ip_family: IpFamily) -> Self {
        let family = family_of(ip_family);
        FamilyRenderer {
            ip_family,
            family,
            inputs: NodeInputs::default(),
            skeleton: TableSpec::new(family),
            services: FastMap::default(),
            claims: ClaimsTable::default(),
            classes: BTreeMap::new(),
            prefixes: BTreeMap::new(),
        }
    }

    /// The whole table: skeleton plus the first claim of every element key.
    fn table(&self) -> TableSpec {
        let mut t = self.skeleton.clone();
        let mut by_set: FastMap<SetId, Vec<Element>> = FastMap::default();
        for claims in self.claims.iter() {
            if let Some(e) = claims.first() {
                by_set
                    .entry(claims.set())
                    .or_default()
                    .push(Element::clone(e));
            }
        }
        for (set, mut elements) in by_set {
            let spec = t
                .sets
                .get_mut(&set.name())
                .expect("every claimed set is in the skeleton");
            // Built in bulk from a sorted run: far cheaper than one insert each.
            elements.extend(std::mem::take(&mut spec.elements));
            elements.sort_unstable();
            spec.elements = elements.into_iter().collect();
        }
        t
    }

    fn update(
        &mut self,
        state: &ClusterState,
        opts: &NftablesOptions,
        changed: Option<&[ServicePortName]>,
    ) -> (TableDelta, RenderStats) {
        let inputs = NodeInputs {
            opts: Some(opts.clone()),
            node: state.node.clone(),
            service_cidrs: state
                .service_cidrs
                .iter()
                .filter(|c| net_family(c) == self.ip_family)
                .copied()
                .collect(),
        };
        let node_changed = inputs != self.inputs;
        self.inputs = inputs;

        // Which service ports to render again.
        let dirty = match changed {
            Some(names) if !node_changed => {
                let mut dirty: Vec<ServicePortName> = names
                    .iter()
                    .filter(|n| {
                        self.services.contains_key(*n)
                            || state.services.contains_key(&((*n).clone(), self.ip_family))
                    })
                    .cloned()
                    .collect();
                dirty.sort();
                dirty.dedup();
                dirty
            }
            _ => self.changed_ports(state, node_changed),
        };
        self.render_changes(state, dirty, node_changed)
    }

    /// The service ports that differ from what was rendered (all of them when the
    /// node-level inputs changed), including removed ones.
    fn changed_ports(&self, state: &ClusterState, node_changed: bool) -> Vec<ServicePortName> {
        let no_endpoints: Vec<Endpoint> = Vec::new();
        let mut dirty: Vec<ServicePortName> = Vec::new();
        let mut present = 0usize;
        for ((name, f), svc) in &state.services {
            if *f != self.ip_family {
                continue;
            }
            present += 1;
            let eps = state
                .endpoints
                .get(name)
                .map_or(&no_endpoints[..], |eps| eps.as_slice());
            let unchanged = !node_changed
                && self
                    .services
                    .get(name)
                    .is_some_and(|r| r.inputs == inputs_hash(svc, eps));
            if !unchanged {
                dirty.push(name.clone());
            }
        }
        let still_present = present
            - dirty
                .iter()
                .filter(|n| !self.services.contains_key(*n))
                .count();
        if still_present < self.services.len() {
            // Some rendered port is gone.
            dirty.extend(
                self.services
                    .keys()
                    .filter(|n| !state.services.contains_key(&((*n).clone(), self.ip_family)))
                    .cloned(),
            );
        }
        dirty
    }

    /// Re-renders `dirty` and says what changed in the table.
    fn render_changes(
        &mut self,
        state: &ClusterState,
        dirty: Vec<ServicePortName>,
        node_changed: bool,
    ) -> (TableDelta, RenderStats) {
        let no_endpoints: Vec<Endpoint> = Vec::new();
        // Rendering into an empty table (a start): every claimed key ends up
        // added, so the keys touched need no record of what they held before.
        let fresh = self.claims.is_empty();
        let mut touched = Touched::default();
        let mut conflicts = Vec::new();
        let old_classes: BTreeSet<Class> = self.classes.keys().copied().collect();
        let old_prefixes: BTreeSet<u8> = self.prefixes.keys().copied().collect();
        let mut lost: BTreeMap<Vec<KeyValue>, BTreeSet<(IpAddr, u16)>> = BTreeMap::new();
        let endpoints_of = |name: &ServicePortName| {
            state
                .endpoints
                .get(name)
                .map_or(&no_endpoints[..], |eps| eps.as_slice())
        };
        // Into an empty table, everything is rendered first so that the claims
        // table is sized once: growing it key by key rehashed every key some
        // twenty times (a tenth of a big start's render).
        let mut rendered_first: Vec<Option<Contribution>> = Vec::new();
        if fresh {
            rendered_first = dirty
                .iter()
                .map(|name| {
                    let svc = state.services.get(&(name.clone(), self.ip_family))?;
                    Some(self.render(svc, endpoints_of(name), &state.node))
                })
                .collect();
            let elements = rendered_first.iter().flatten().map(|c| c.elements.len());
            self.claims.reserve(elements.sum());
        }
        for (i, name) in dirty.iter().enumerate() {
            let old_affinity = match self.services.remove(name) {
                Some(old) => {
                    self.withdraw(name, &old.contribution, (!fresh).then_some(&mut touched));
                    old.contribution.affinity
                }
                None => Vec::new(),
            };
            if let Some(svc) = state.services.get(&(name.clone(), self.ip_family)) {
                let eps = endpoints_of(name);
                let contribution = match rendered_first.get_mut(i).and_then(Option::take) {
                    Some(contribution) => contribution,
                    None => self.render(svc, eps, &state.node),
                };
                self.claim(
                    name,
                    &contribution,
                    (!fresh).then_some(&mut touched),
                    &mut conflicts,
                );
                for (key, before) in &old_affinity {
                    let now = contribution
                        .affinity
                        .iter()
                        .find(|(k, _)| k == key)
                        .map(|(_, t)| t.clone())
                        .unwrap_or_default();
                    if !before.is_subset(&now) {
                        lost.insert(key.clone(), now);
                    }
                }
                self.services.insert(
                    name.clone(),
                    RenderedService {
                        inputs: inputs_hash(svc, eps),
                        contribution,
                    },
                );
            } else {
                for (key, _) in old_affinity {
                    lost.insert(key, BTreeSet::new());
                }
            }
        }

        let mut delta = TableDelta {
            family: Some(self.family),
            affinity_cleanup: lost.into_iter().collect(),
            ..TableDelta::default()
        };
        let classes: BTreeSet<Class> = self.classes.keys().copied().collect();
        let prefixes: BTreeSet<u8> = self.prefixes.keys().copied().collect();
        if node_changed || classes != old_classes || prefixes != old_prefixes {
            let skeleton = skeleton(
                self.family,
                self.ip_family,
                &self.inputs,
                &classes,
                &prefixes,
            );
            skeleton_delta(&self.skeleton, &skeleton, &mut delta);
            self.skeleton = skeleton;
        }
        if fresh {
            for claims in self.claims.iter() {
                if let Some(first) = claims.first() {
                    delta
                        .add_elements
                        .entry(claims.set().name())
                        .or_default()
                        .push(first.clone());
                }
            }
        }
        for ((set, key), before) in touched {
            let after = self.claims.get(set, &key).and_then(Claims::first);
            if before.as_ref() == after {
                continue;
            }
            let set_name = set.name();
            if let Some(b) = before
                && !delta.delete_sets.contains(&set_name)
            {
                delta
                    .delete_elements
                    .entry(set_name.clone())
                    .or_default()
                    .push(b);
            }
            if let Some(a) = after {
                delta
                    .add_elements
                    .entry(set_name)
                    .or_default()
                    .push(a.clone());
            }
        }
        for elements in delta
            .delete_elements
            .values_mut()
            .chain(delta.add_elements.values_mut())
        {
            // One element per key in each list: ordering by key alone is the
            // element order, without comparing data and comments.
            elements.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        }
        let stats = RenderStats {
            rendered: dirty.len(),
            node_changed,
            conflicts,
        };
        (delta, stats)
    }

    /// Notes what the key of `element` in `set` holds before a render first
    /// changes it.
    fn record_before(&self, touched: &mut Touched, set: SetId, element: &Element) {
        let key = claim_key(set, &element.key);
        touched
            .entry((set, key.to_vec()))
            .or_insert_with(|| self.claims.get(set, key).and_then(|c| c.first().cloned()));
    }

    /// Takes a service port's elements, classes and prefixes out.
    fn withdraw(
        &mut self,
        name: &ServicePortName,
        contribution: &Contribution,
        mut touched: Option<&mut Touched>,
    ) {
        for (set, element) in &contribution.elements {
            if let Some(touched) = touched.as_deref_mut() {
                self.record_before(touched, *set, element);
            }
            self.claims.withdraw(*set, &element.key, name);
        }
        for class in &contribution.classes {
            decrement(&mut self.classes, class);
        }
        for prefix in &contribution.prefixes {
            decrement(&mut self.prefixes, prefix);
        }
    }

    /// Puts a service port's elements, classes and prefixes in.
    fn claim(
        &mut self,
        name: &ServicePortName,
        contribution: &Contribution,
        mut touched: Option<&mut Touched>,
        conflicts: &mut Vec<String>,
    ) {
        let owner = Arc::new(name.clone());
        for (set, element) in &contribution.elements {
            if let Some(touched) = touched.as_deref_mut() {
                self.record_before(touched, *set, element);
            }
            let claims = self.claims.claim(*set, owner.clone(), element.clone());
            let decides = matches!(
                set,
                SetId::Classes(_)
                    | SetId::NoEndpointReject(_)
                    | SetId::NoEndpointDrop(_)
                    | SetId::NoLocalEndpointDrop(_)
            );
            if decides && let Some(first) = claims.other_than(name) {
                conflicts.push(format!(
                    "{}: {} is claimed by {first} and {name}; the first in name order keeps it",
                    set.name(),
                    kube_nlproxy_netlink::nft::codec::fmt_element(&Element::new(
                        claim_key(*set, &element.key).to_vec()
                    )),
                ));
            }
        }
        for class in &contribution.classes {
            *self.classes.entry(*class).or_default() += 1;
        }
        for prefix in &contribution.prefixes {
            *self.prefixes.entry(*prefix).or_default() += 1;
        }
    }

    /// The elements, dispatch classes and source-range prefix lengths of one
    /// service port.
    fn render(&self, svc: &ServicePort, endpoints: &[Endpoint], node: &NodeInfo) -> Contribution {
        let cat = categorize_endpoints(endpoints, svc, node);
        let cluster = dedup_endpoints(&cat.cluster);
        let local = dedup_endpoints(&cat.local);
        // One comment for every element of the port, shared.
        let comment: Arc<str> = port_comment(&svc.name).into();
        let proto = svc.name.protocol.number();
        let timeout = svc.affinity_timeout_seconds.unwrap_or(0);
        let has_endpoints = cat.has_any_endpoints;
        let nodeport_addrs: Vec<IpAddr> =
            match self.inputs.opts.as_ref().map(|o| &o.nodeport_addresses) {
                Some(NodePortAddresses::Ips(ips)) => ips.clone(),
                _ => node.ips.clone(),
            }
            .into_iter()
            .filter(|ip| IpFamily::of(ip) == self.ip_family)
            .collect();
        let mut out = Contribution::default();
        let push = |out: &mut Contribution, set: SetId, key: Vec<KeyValue>, data: Vec<KeyValue>| {
            out.elements.push((
                set,
                Arc::new(
                    Element::new(key)
                        .with_data(data)
                        .with_comment(comment.clone()),
                ),
            ));
        };
        // Traffic from `entry` at `key` goes to `eps`.
        let route = |out: &mut Contribution, entry: Entry, key: &[KeyValue], eps: &[Endpoint]| {
            if eps.is_empty() {
                return;
            }
            let with = |more: &[KeyValue]| {
                let mut k = key.to_vec();
                k.extend_from_slice(more);
                k
            };
            let n = eps.len() as u32;
            push(
                out,
                SetId::Classes(entry),
                with(&[KeyValue::Mark(n), KeyValue::Mark(timeout)]),
                vec![],
            );
            for (i, ep) in eps.iter().enumerate() {
                push(
                    out,
                    SetId::Endpoints(entry),
                    with(&[KeyValue::Mark(i as u32)]),
                    vec![KeyValue::Addr(ep.ip), KeyValue::Port(ep.port)],
                );
            }
            if !out.classes.contains(&(n, timeout)) {
                out.classes.push((n, timeout));
            }
            if timeout > 0 {
                // Affinity is recorded and followed by the address the client
                // connected to: a NodePort on each NodePort address.
                let entry_keys: Vec<Vec<KeyValue>> = match entry.kind() {
                    EntryKind::Ips => vec![key.to_vec()],
                    EntryKind::Nodeports => nodeport_addrs
                        .iter()
                        .map(|a| {
                            let mut k = vec![KeyValue::Addr(*a)];
                            k.extend_from_slice(key);
                            k
                        })
                        .collect(),
                };
                let targets: BTreeSet<(IpAddr, u16)> = eps.iter().map(|e| (e.ip, e.port)).collect();
                for k in entry_keys {
                    match out.affinity.iter_mut().find(|(k2, _)| *k2 == k) {
                        Some((_, t)) => t.extend(targets.iter().copied()),
                        None => {
                            let mut timeout_key = k.clone();
                            timeout_key.push(KeyValue::Mark(timeout));
                            push(out, SetId::AffinityTimeouts, timeout_key, vec![]);
                            out.affinity.push((k, targets.clone()));
                        }
                    }
                }
            }
        };
        // Where traffic goes that has no usable endpoint: reject when there is
        // none at all, drop when there are endpoints but none this traffic may use.
        let no_endpoint = |kind| {
            if has_endpoints {
                SetId::NoEndpointDrop(kind)
            } else {
                SetId::NoEndpointReject(kind)
            }
        };

        let internal: &[Endpoint] = if svc.internal_policy == TrafficPolicy::Local {
            &local
        } else {
            &cluster
        };
        if let Some(cip) = svc.cluster_ip {
            out.elements.push((
                SetId::ClusterIps,
                Arc::new(
                    Element::new(vec![KeyValue::Addr(cip)])
                        .with_comment(service_comment(&svc.name)),
                ),
            ));
            let key = vec![
                KeyValue::Addr(cip),
                KeyValue::Proto(proto),
                KeyValue::Port(svc.port),
            ];
            if has_endpoints && !internal.is_empty() {
                route(&mut out, Entry::Main(EntryKind::Ips), &key, internal);
            } else {
                push(&mut out, no_endpoint(EntryKind::Ips), key, vec![]);
            }
        }

        // External entry points: externalIPs, LB IPs, the NodePort.
        let external_local = svc.external_policy_local();
        let has_external = has_endpoints && (!external_local || !local.is_empty());
        let externals = svc
            .external_ips
            .iter()
            .chain(&svc.load_balancer_ips)
            .map(|a| {
                (
                    EntryKind::Ips,
                    vec![
                        KeyValue::Addr(*a),
                        KeyValue::Proto(proto),
                        KeyValue::Port(svc.port),
                    ],
                )
            })
            .chain(svc.node_port.map(|np| {
                (
                    EntryKind::Nodeports,
                    vec![KeyValue::Proto(proto), KeyValue::Port(np)],
                )
            }));
        for (kind, key) in externals {
            if has_endpoints {
                // eTP Cluster: everyone; eTP Local: pods and the node itself.
                route(&mut out, Entry::Main(kind), &key, &cluster);
                if external_local {
                    push(&mut out, SetId::ExternalLocal(kind), key.clone(), vec![]);
                    route(&mut out, Entry::Local(kind), &key, &local);
                } else {
                    push(&mut out, SetId::ExternalCluster(kind), key.clone(), vec![]);
                }
            }
            if !has_endpoints {
                push(&mut out, no_endpoint(kind), key, vec![]);
            } else if !has_external {
                push(&mut out, SetId::NoLocalEndpointDrop(kind), key, vec![]);
            }
        }

        // loadBalancerSourceRanges.
        if !svc.load_balancer_source_ranges.is_empty() && !svc.load_balancer_ips.is_empty() {
            // A node that connects to its own LB IP may be SNATed by the cloud LB
            // to that IP: allow the LB IPs as sources when a node IP is inside.
            let node_allowed = node.ips.iter().any(|ip| {
                svc.load_balancer_source_ranges
                    .iter()
                    .any(|r| r.contains(ip))
            });
            let full = (self.family.addr_len() * 8) as u8;
            for lb in &svc.load_balancer_ips {
                let key = vec![
                    KeyValue::Addr(*lb),
                    KeyValue::Proto(proto),
                    KeyValue::Port(svc.port),
                ];
                push(&mut out, SetId::FirewallIps, key.clone(), vec![]);
                let allowed = svc
                    .load_balancer_source_ranges
                    .iter()
                    .map(|r| (r.prefix_len(), r.network()))
                    .chain(node_allowed.then_some((full, *lb)));
                for (prefix, network) in allowed {
                    let mut k = key.clone();
                    k.push(KeyValue::Addr(network));
                    push(&mut out, SetId::FirewallAllow(prefix), k, vec![]);
                    if !out.prefixes.contains(&prefix) {
                        out.prefixes.push(prefix);
                    }
                }
            }
        }

        let mut hairpin = BTreeSet::new();
        for ep in cluster.iter().chain(&local) {
            if hairpin.insert(ep.ip) {
                out.elements.push((
                    SetId::Hairpin,
                    Arc::new(
                        Element::new(vec![KeyValue::Addr(ep.ip), KeyValue::Addr(ep.ip)])
                            .with_comment(comment.clone()),
                    ),
                ));
            }
        }
        out
    }
}

fn decrement<K: Ord>(counts: &mut BTreeMap<K, usize>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

/// Endpoints by address and port, each once, in a stable order.
fn dedup_endpoints(endpoints: &[Endpoint]) -> Vec<Endpoint> {
    let mut out = endpoints.to_vec();
    out.sort();
    out.dedup_by(|a, b| a.ip == b.ip && a.port == b.port);
    out
}

/// `ns/name:port` (upstream's `ServicePortName.String()`, without the protocol).
pub fn port_comment(name: &ServicePortName) -> String {
    if name.port_name.is_empty() {
        service_comment(name)
    } else {
        format!("{}/{}:{}", name.namespace, name.name, name.port_name)
    }
}

fn service_comment(name: &ServicePortName) -> String {
    format!("{}/{}", name.namespace, name.name)
}

/// The chain and set changes between two skeletons (sets only differ by the
/// source-range prefix sets; chains by their rules).
fn skeleton_delta(old: &TableSpec, new: &TableSpec, delta: &mut TableDelta) {
    for (name, spec) in &new.sets {
        match old.sets.get(name) {
            None => delta.add_sets.push(spec.set.clone()),
            Some(o) => {
                // Elements in `a` and not in `b`, shared for the delta.
                let only_in = |a: &BTreeSet<Element>, b: &BTreeSet<Element>| -> Vec<Arc<Element>> {
                    a.difference(b).cloned().map(Arc::new).collect()
                };
                for (elements, changes) in [
                    (
                        only_in(&o.elements, &spec.elements),
                        &mut delta.delete_elements,
                    ),
                    (
                        only_in(&spec.elements, &o.elements),
                        &mut delta.add_elements,
                    ),
                ] {
                    if !elements.is_empty() {
                        changes.entry(name.clone()).or_default().extend(elements);
                    }
                }
            }
        }
        if !old.sets.contains_key(name) && !spec.elements.is_empty() {
            delta
                .add_elements
                .entry(name.clone())
                .or_default()
                .extend(spec.elements.iter().cloned().map(Arc::new));
        }
    }
    for name in old.sets.keys() {
        if !new.sets.contains_key(name) {
            delta.delete_sets.push(name.clone());
        }
    }
    for (name, spec) in &new.chains {
        match old.chains.get(name) {
            None => delta.new_chains.push(spec.chain.clone()),
            Some(o) if o == spec => continue,
            Some(_) => {}
        }
        delta.chains.push(spec.clone());
    }
}

/// What a chain of ours is for: its comment in the kernel (`nft list` prints it).
pub fn chain_comment(name: &str) -> Option<String> {
    let c = match name {
        "filter-prerouting" => "kube-nlproxy: source ranges of incoming traffic",
        "filter-input" => "kube-nlproxy: services without endpoints, traffic to this node",
        "filter-forward" => "kube-nlproxy: services without endpoints, unknown ClusterIP ports",
        "filter-output" => {
            "kube-nlproxy: services without endpoints, source ranges, this node's traffic"
        }
        "filter-output-post-dnat" => "kube-nlproxy: unknown ClusterIP ports, this node's traffic",
        "nat-prerouting" => "kube-nlproxy: services, incoming traffic",
        "nat-output" => "kube-nlproxy: services, this node's traffic",
        "nat-postrouting" => "kube-nlproxy: masquerade and session affinity",
        MARK_FOR_MASQUERADE => "mark a connection for masquerade",
        MASQUERADING => "record session affinity, masquerade marked connections",
        SERVICES => "masquerade decisions, then dispatch by entry point",
        FIREWALL_CHECK => "loadBalancerSourceRanges",
        CLUSTER_IPS_CHECK => "unknown ports of ClusterIPs, unallocated service addresses",
        SERVICE_ENDPOINTS_CHECK => "service IPs without usable endpoints: reject or drop",
        NODEPORT_ENDPOINTS_CHECK => "NodePorts without usable endpoints: reject or drop",
        DISPATCH_IPS => "DNAT to an endpoint: ClusterIPs, externalIPs, LB IPs",
        DISPATCH_NODEPORTS => "DNAT to an endpoint: NodePorts",
        DISPATCH_IPS_LOCAL => {
            "DNAT to a local endpoint: external traffic, externalTrafficPolicy Local"
        }
        DISPATCH_NODEPORTS_LOCAL => {
            "DNAT to a local endpoint: external NodePort traffic, externalTrafficPolicy Local"
        }
        _ => return None,
    };
    Some(c.to_string())
}

/// `RULE` matching traffic to an address NodePorts listen on: every local
/// address but loopback, or those in `nodeport-ips`.
fn to_nodeport_address(rule: RuleBuilder, all: bool, loopback: &IpNet) -> RuleBuilder {
    if all {
        rule.fib_daddr_local().daddr_not_in(loopback)
    } else {
        rule.in_set(&[KeyField::Daddr], &SetId::NodeportIps.name(), false)
    }
}

/// Register `NFT_REG32_00 + n`.
fn r(n: u32) -> Reg {
    Reg::r32(n)
}

/// The chains (and node-level elements) of a family's table. Constant but for
/// one dispatch rule per class in use, one firewall rule per prefix length in use
/// and one drop rule per ServiceCIDR.
fn skeleton(
    family: Family,
    ip_family: IpFamily,
    inputs: &NodeInputs,
    classes: &BTreeSet<Class>,
    prefixes: &BTreeSet<u8>,
) -> TableSpec {
    use ChainType::{Filter, Nat};
    let opts = inputs
        .opts
        .as_ref()
        .expect("skeleton after the options are known");
    let mut t = TableSpec::new(family);
    for set in SetId::fixed() {
        let def = set.definition(family);
        t.sets.insert(
            def.name.clone(),
            SetSpec {
                set: def,
                elements: BTreeSet::new(),
            },
        );
    }
    for p in prefixes {
        let def = SetId::FirewallAllow(*p).definition(family);
        t.sets.insert(
            def.name.clone(),
            SetSpec {
                set: def,
                elements: BTreeSet::new(),
            },
        );
    }

    // Hooks, with upstream's priorities (filter at dstnat-10 / dstnat+10).
    t.base_chain("filter-prerouting", Filter, Hook::Prerouting, -110);
    t.base_chain("filter-input", Filter, Hook::Input, -110);
    t.base_chain("filter-forward", Filter, Hook::Forward, -110);
    t.base_chain("filter-output", Filter, Hook::Output, -110);
    t.base_chain("filter-output-post-dnat", Filter, Hook::Output, -90);
    t.base_chain("nat-prerouting", Nat, Hook::Prerouting, -100);
    t.base_chain("nat-output", Nat, Hook::Output, -100);
    t.base_chain("nat-postrouting", Nat, Hook::Postrouting, 100);
    for chain in [
        MARK_FOR_MASQUERADE,
        MASQUERADING,
        SERVICES,
        FIREWALL_CHECK,
        CLUSTER_IPS_CHECK,
        SERVICE_ENDPOINTS_CHECK,
        NODEPORT_ENDPOINTS_CHECK,
        DISPATCH_IPS,
        DISPATCH_NODEPORTS,
        DISPATCH_IPS_LOCAL,
        DISPATCH_NODEPORTS_LOCAL,
    ] {
        t.chain(chain);
    }

    let b = || RuleBuilder::new(family);
    let new = || b().ct_state_new();
    let jump = |c: &str| Verdict::Jump(c.to_string());
    let goto = |c: &str| Verdict::Goto(c.to_string());
    for (chain, target) in [
        ("filter-prerouting", FIREWALL_CHECK),
        ("filter-input", NODEPORT_ENDPOINTS_CHECK),
        ("filter-input", SERVICE_ENDPOINTS_CHECK),
        ("filter-forward", SERVICE_ENDPOINTS_CHECK),
        ("filter-forward", CLUSTER_IPS_CHECK),
        ("filter-output", SERVICE_ENDPOINTS_CHECK),
        ("filter-output", FIREWALL_CHECK),
        ("filter-output-post-dnat", CLUSTER_IPS_CHECK),
    ] {
        t.rule(
            chain,
            new().verdict(jump(target)),
            Some(&format!("new connections: {target}")),
        );
    }
    t.rule(
        "nat-prerouting",
        b().verdict(jump(SERVICES)),
        Some("services"),
    );
    t.rule("nat-output", b().verdict(jump(SERVICES)), Some("services"));
    t.rule(
        "nat-postrouting",
        b().verdict(jump(MASQUERADING)),
        Some("masquerading"),
    );

    let mark = opts.masquerade_mark;
    t.rule(
        MARK_FOR_MASQUERADE,
        b().mark_set_or(mark),
        Some("set the masquerade mark"),
    );
    let daddr = [KeyField::Daddr];
    affinity_record_rules(&mut t, classes);
    t.rule(
        MASQUERADING,
        b().ct_status_dnat()
            .in_set(
                &[KeyField::Saddr, KeyField::Daddr],
                &SetId::Hairpin.name(),
                false,
            )
            .verdict(jump(MARK_FOR_MASQUERADE)),
        Some("hairpin: a pod reaching itself through a service"),
    );
    t.rule(
        MASQUERADING,
        b().mark_bits_clear(mark).verdict(Verdict::Return),
        Some("not marked for masquerade"),
    );
    t.rule(
        MASQUERADING,
        b().mark_set_xor(mark),
        Some("clear the masquerade mark"),
    );
    t.rule(
        MASQUERADING,
        b().masquerade_fully_random(),
        Some("masquerade marked connections"),
    );

    let k3 = [KeyField::Daddr, KeyField::L4Proto, KeyField::Dport];
    let k2 = [KeyField::L4Proto, KeyField::Dport];
    let loopback: IpNet = match family {
        Family::Ipv4 => "127.0.0.0/8".parse().expect("valid"),
        Family::Ipv6 => "::1/128".parse().expect("valid"),
    };
    // Traffic to an address NodePorts listen on.
    let all_nodeport_addresses = opts.nodeport_addresses == NodePortAddresses::All;
    let to_nodeport_from =
        |rule: RuleBuilder| to_nodeport_address(rule, all_nodeport_addresses, &loopback);
    let to_nodeport = || to_nodeport_address(b(), all_nodeport_addresses, &loopback);
    if let NodePortAddresses::Ips(ips) = &opts.nodeport_addresses {
        for ip in ips.iter().filter(|ip| IpFamily::of(ip) == ip_family) {
            t.element(
                &SetId::NodeportIps.name(),
                vec![KeyValue::Addr(*ip)],
                None,
                Some("NodePort address"),
            );
        }
    }

    // Filter: source ranges, no endpoints, unknown ports, unallocated IPs.
    let mut not_firewalled = b().in_set(&k3, &SetId::FirewallIps.name(), true);
    not_firewalled = not_firewalled.verdict(Verdict::Return);
    t.rule(
        FIREWALL_CHECK,
        not_firewalled,
        Some("not filtered by loadBalancerSourceRanges"),
    );
    for p in prefixes {
        let fields = [
            KeyField::Daddr,
            KeyField::L4Proto,
            KeyField::Dport,
            KeyField::SaddrMasked(*p),
        ];
        t.rule(
            FIREWALL_CHECK,
            b().in_set(&fields, &SetId::FirewallAllow(*p).name(), false)
                .verdict(Verdict::Return),
            Some("allowed by loadBalancerSourceRanges"),
        );
    }
    t.rule(
        FIREWALL_CHECK,
        b().verdict(Verdict::Drop),
        Some("source not in loadBalancerSourceRanges"),
    );
    t.rule(
        SERVICE_ENDPOINTS_CHECK,
        b().in_set(&k3, &SetId::NoEndpointReject(EntryKind::Ips).name(), false)
            .reject(),
        Some("reject traffic to services without endpoints"),
    );
    t.rule(
        SERVICE_ENDPOINTS_CHECK,
        b().in_set(&k3, &SetId::NoEndpointDrop(EntryKind::Ips).name(), false)
            .verdict(Verdict::Drop),
        Some("drop traffic whose traffic policy finds no endpoint"),
    );
    t.rule(
        SERVICE_ENDPOINTS_CHECK,
        b().fib_saddr_not_local()
            .in_set(
                &k3,
                &SetId::NoLocalEndpointDrop(EntryKind::Ips).name(),
                false,
            )
            .verdict(Verdict::Drop),
        Some("drop external traffic to externalTrafficPolicy Local without a local endpoint"),
    );
    t.rule(
        NODEPORT_ENDPOINTS_CHECK,
        to_nodeport()
            .in_set(
                &k2,
                &SetId::NoEndpointReject(EntryKind::Nodeports).name(),
                false,
            )
            .reject(),
        Some("reject NodePorts without endpoints"),
    );
    t.rule(
        NODEPORT_ENDPOINTS_CHECK,
        to_nodeport_from(b().fib_saddr_not_local())
            .in_set(
                &k2,
                &SetId::NoLocalEndpointDrop(EntryKind::Nodeports).name(),
                false,
            )
            .verdict(Verdict::Drop),
        Some("drop external NodePort traffic to externalTrafficPolicy Local without a local endpoint"),
    );
    t.rule(
        NODEPORT_ENDPOINTS_CHECK,
        to_nodeport()
            .in_set(
                &k2,
                &SetId::NoEndpointDrop(EntryKind::Nodeports).name(),
                false,
            )
            .verdict(Verdict::Drop),
        Some("drop NodePort traffic whose traffic policy finds no endpoint"),
    );
    t.rule(
        CLUSTER_IPS_CHECK,
        b().in_set(&daddr, &SetId::ClusterIps.name(), false)
            .reject(),
        Some("reject traffic to invalid ports of ClusterIPs"),
    );
    for cidr in &inputs.service_cidrs {
        t.rule(
            CLUSTER_IPS_CHECK,
            b().daddr_in(cidr).verdict(Verdict::Drop),
            Some(&format!("{UNALLOCATED_COMMENT}{cidr}")),
        );
    }

    // NAT: masquerade decisions first (they only mark), then DNAT.
    let masq = || Verdict::Jump(MARK_FOR_MASQUERADE.to_string());
    let cluster_ips = SetId::ClusterIps.name();
    let from_outside_cluster = if opts.masquerade_all {
        Some(b())
    } else {
        local_source_into(b(), family, &opts.local_detector, &inputs.node, true)
    };
    if let Some(rule) = from_outside_cluster {
        t.rule(
            SERVICES,
            rule.in_set(&daddr, &cluster_ips, false).verdict(masq()),
            Some("masquerade traffic to ClusterIPs from outside the cluster"),
        );
    }
    t.rule(
        SERVICES,
        b().in_set(&k3, &SetId::ExternalCluster(EntryKind::Ips).name(), false)
            .verdict(masq()),
        Some("masquerade external traffic (externalTrafficPolicy Cluster)"),
    );
    t.rule(
        SERVICES,
        to_nodeport()
            .in_set(
                &k2,
                &SetId::ExternalCluster(EntryKind::Nodeports).name(),
                false,
            )
            .verdict(masq()),
        Some("masquerade NodePort traffic (externalTrafficPolicy Cluster)"),
    );
    t.rule(
        SERVICES,
        b().fib_saddr_local()
            .in_set(&k3, &SetId::ExternalLocal(EntryKind::Ips).name(), false)
            .verdict(masq()),
        Some("masquerade the node's own traffic to externalTrafficPolicy Local"),
    );
    t.rule(
        SERVICES,
        to_nodeport_from(b().fib_saddr_local())
            .in_set(
                &k2,
                &SetId::ExternalLocal(EntryKind::Nodeports).name(),
                false,
            )
            .verdict(masq()),
        Some("masquerade the node's own NodePort traffic to externalTrafficPolicy Local"),
    );
    // From outside the cluster: neither the node itself nor a local pod.
    let outside = || {
        let rule = b().fib_saddr_not_local();
        local_source_into(
            rule.clone(),
            family,
            &opts.local_detector,
            &inputs.node,
            true,
        )
        .unwrap_or(rule)
    };
    t.rule(
        SERVICES,
        outside()
            .in_set(&k3, &SetId::ExternalLocal(EntryKind::Ips).name(), false)
            .verdict(goto(DISPATCH_IPS_LOCAL)),
        Some("external traffic to externalTrafficPolicy Local: local endpoints"),
    );
    t.rule(
        SERVICES,
        to_nodeport_from(outside())
            .in_set(
                &k2,
                &SetId::ExternalLocal(EntryKind::Nodeports).name(),
                false,
            )
            .verdict(goto(DISPATCH_NODEPORTS_LOCAL)),
        Some("external NodePort traffic to externalTrafficPolicy Local: local endpoints"),
    );
    t.rule(
        SERVICES,
        b().verdict(jump(DISPATCH_IPS)),
        Some("service IPs"),
    );
    t.rule(
        SERVICES,
        to_nodeport().verdict(jump(DISPATCH_NODEPORTS)),
        Some("NodePorts"),
    );

    for (chain, entry) in [
        (DISPATCH_IPS, Entry::Main(EntryKind::Ips)),
        (DISPATCH_NODEPORTS, Entry::Main(EntryKind::Nodeports)),
        (DISPATCH_IPS_LOCAL, Entry::Local(EntryKind::Ips)),
        (DISPATCH_NODEPORTS_LOCAL, Entry::Local(EntryKind::Nodeports)),
    ] {
        dispatch_rules(&mut t, chain, entry, classes);
    }
    t
}

/// The DNAT rules of one entry: per affinity timeout in use, the rule that
/// follows a client's affinity entry; per class, the rule that picks an endpoint
/// at random. Every lookup key is assembled from registers that each hold one
/// whole field (a payload, a constant, a `numgen`), so `nft list` can print the
/// rules.
fn dispatch_rules(t: &mut TableSpec, chain: &str, entry: Entry, classes: &BTreeSet<Class>) {
    let family = t.family;
    let a = family.addr_len() / 4;
    let kind = entry.kind();
    let fields = kind.fields();
    // `daddr . l4proto . dport` or `l4proto . dport`, one register per field.
    let key_regs: u32 = match kind {
        EntryKind::Ips => a + 2,
        EntryKind::Nodeports => 2,
    };
    let with = |more: &[KeyField]| {
        let mut f = fields.to_vec();
        f.extend_from_slice(more);
        f
    };
    let timeouts: BTreeSet<u32> = classes.iter().map(|(_, t)| *t).filter(|t| *t > 0).collect();
    let to = [KeyField::Daddr, KeyField::L4Proto, KeyField::Dport];
    for secs in timeouts {
        let mut with_timeout = to.to_vec();
        with_timeout.push(KeyField::Mark(secs));
        t.rule(
            chain,
            RuleBuilder::new(family)
                .in_set(&with_timeout, &SetId::AffinityTimeouts.name(), false)
                .map_lookup(
                    &[
                        KeyField::Saddr,
                        KeyField::Daddr,
                        KeyField::L4Proto,
                        KeyField::Dport,
                    ],
                    &SetId::Affinity.name(),
                    r(0),
                )
                .dnat_regs(r(0), r(a)),
            Some(&format!("session affinity ({secs}s)")),
        );
    }
    for (n, secs) in classes {
        let rule = RuleBuilder::new(family)
            .in_set(
                &with(&[KeyField::Mark(*n), KeyField::Mark(*secs)]),
                &SetId::Classes(entry).name(),
                false,
            )
            .load_at(fields, 0)
            .numgen_into(r(key_regs), *n)
            .lookup_reg(&SetId::Endpoints(entry).name(), r(0), Some(r(0)))
            .dnat_regs(r(0), r(a));
        let comment = if *secs > 0 {
            format!("{n} endpoints, affinity {secs}s")
        } else {
            format!("{n} endpoints")
        };
        t.rule(chain, rule, Some(&comment));
    }
}

/// Per affinity timeout in use: records, after DNAT, which endpoint a client's
/// new connection to an affinity entry point went to (or refreshes the entry).
fn affinity_record_rules(t: &mut TableSpec, classes: &BTreeSet<Class>) {
    let family = t.family;
    let timeouts: BTreeSet<u32> = classes.iter().map(|(_, t)| *t).filter(|t| *t > 0).collect();
    let original = [
        KeyField::CtOriginalDaddr,
        KeyField::L4Proto,
        KeyField::CtOriginalDport,
    ];
    let a = family.addr_len() / 4;
    for secs in timeouts {
        let mut with_timeout = original.to_vec();
        with_timeout.push(KeyField::Mark(secs));
        let mut key = vec![KeyField::Saddr];
        key.extend_from_slice(&original);
        // key from r0 (client . entry: 2A + 2 registers), data after it.
        let data_at = 2 * a + 2;
        t.rule(
            MASQUERADING,
            RuleBuilder::new(family)
                .ct_status_dnat()
                .in_set(&with_timeout, &SetId::AffinityTimeouts.name(), false)
                .load_at(&key, 0)
                .load_at(&[KeyField::Daddr, KeyField::Dport], data_at)
                .dynset_reg(
                    DynsetOp::Update,
                    &SetId::Affinity.name(),
                    r(0),
                    Some(r(data_at)),
                    Some(secs),
                ),
            Some(&format!("record session affinity ({secs}s)")),
        );
    }
}

pub(crate) fn local_source_into(
    b: RuleBuilder,
    family: Family,
    detector: &LocalDetector,
    _node: &crate::model::NodeInfo,
    negate: bool,
) -> Option<RuleBuilder> {
    let ip_family = match family {
        Family::Ipv4 => IpFamily::V4,
        Family::Ipv6 => IpFamily::V6,
    };
    match detector {
        LocalDetector::None => None,
        LocalDetector::Cidrs(cidrs) => {
            let cidr = cidrs.iter().find(|c| net_family(c) == ip_family)?;
            Some(if negate {
                b.saddr_not_in(cidr)
            } else {
                b.saddr_in(cidr)
            })
        }
        LocalDetector::BridgeInterface(name) => Some(b.iifname(name, negate)),
        LocalDetector::InterfaceNamePrefix(prefix) => Some(b.iifname_prefix(prefix, negate)),
    }
}

/// Summary numbers of a desired table, for logs and benchmarks.
pub fn table_summary(t: &TableSpec) -> String {
    summary_line(t, t.sets.values().map(|s| s.elements.len()).sum())
}

fn summary_line(t: &TableSpec, elements: usize) -> String {
    format!(
        "{} {TABLE}: {} chains, {} rules, {} sets, {} elements",
        t.family.nft_name(),
        t.chains.len(),
        t.rule_count(),
        t.sets.len(),
        elements
    )
}
