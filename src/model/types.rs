//! The proxy's view of the cluster after validation: service ports with their
//! endpoints. Pure values, built by `model::build` from API objects.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

/// Transport protocol of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP
    Tcp,
    /// UDP
    Udp,
    /// SCTP
    Sctp,
}

impl Protocol {
    /// IANA protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// Lower-case name (`tcp`).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    /// IPv4
    V4,
    /// IPv6
    V6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(addr: &IpAddr) -> IpFamily {
        match addr {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// Both families, v4 first.
    pub const ALL: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];
}

/// Identity of one service port: `namespace/name:portname/protocol`, as upstream's
/// `ServicePortName`. The names are shared: the model, the tracker, the
/// renderer and the health index each keep the name of every port, and a
/// clone costs three reference counts, not three strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    /// Namespace.
    pub namespace: Arc<str>,
    /// Service name.
    pub name: Arc<str>,
    /// Port name ("" for an unnamed single port).
    pub port_name: Arc<str>,
    /// Protocol.
    pub protocol: Protocol,
}

impl std::fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}:{}/{}",
            self.namespace,
            self.name,
            self.port_name,
            self.protocol.name()
        )
    }
}

/// Traffic policy (`externalTrafficPolicy` / `internalTrafficPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TrafficPolicy {
    /// `Cluster` (the default)
    #[default]
    Cluster,
    /// `Local`
    Local,
}

/// Topology preference from `spec.trafficDistribution`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TrafficDistribution {
    /// Not set, or a value we do not know: no topology filtering by distribution
    /// (zone hints still apply when every endpoint has them, like upstream).
    #[default]
    Unset,
    /// `PreferClose` / `PreferSameZone`: use zone hints.
    PreferSameZone,
    /// `PreferSameNode`: use node hints, falling back to zone hints.
    PreferSameNode,
}

/// One service port, everything the dataplane needs about it for one IP family.
///
/// A dual-stack Service yields one `ServicePort` per family, each carrying only the
/// addresses of its family.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePort {
    /// Identity.
    pub name: ServicePortName,
    /// Family of every address below.
    pub family: IpFamily,
    /// `spec.clusterIPs` of this family (normally one).
    pub cluster_ip: Option<IpAddr>,
    /// `port`.
    pub port: u16,
    /// `nodePort`, when the type is NodePort or LoadBalancer (and allocated).
    pub node_port: Option<u16>,
    /// `spec.externalIPs` of this family.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of this family, except `ipMode: Proxy`.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` of this family (tolerant parsing).
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// `externalTrafficPolicy` (only meaningful with external addresses / node port).
    pub external_policy: TrafficPolicy,
    /// `internalTrafficPolicy`.
    pub internal_policy: TrafficPolicy,
    /// `sessionAffinity: ClientIP` timeout in seconds (`None` = no affinity).
    pub affinity_timeout_seconds: Option<u32>,
    /// `healthCheckNodePort` (eTP Local LoadBalancer).
    pub health_check_node_port: Option<u16>,
    /// `spec.trafficDistribution`.
    pub traffic_distribution: TrafficDistribution,
    /// IPVS scheduler from the annotation `kube-nlproxy.io/ipvs-scheduler`
    /// (validated; `None` = use `--ipvs-scheduler`). Only the ipvs mode reads it.
    pub ipvs_scheduler: Option<String>,
}

impl ServicePort {
    /// A port reachable only on `cluster_ip:port`, every other option at its
    /// default (Cluster policies, no affinity, no node port).
    pub fn new(
        name: ServicePortName,
        family: IpFamily,
        cluster_ip: Option<IpAddr>,
        port: u16,
    ) -> Self {
        ServicePort {
            name,
            family,
            cluster_ip,
            port,
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            external_policy: TrafficPolicy::Cluster,
            internal_policy: TrafficPolicy::Cluster,
            affinity_timeout_seconds: None,
            health_check_node_port: None,
            traffic_distribution: TrafficDistribution::Unset,
            ipvs_scheduler: None,
        }
    }

    /// Whether external traffic must only go to node-local endpoints.
    pub fn external_policy_local(&self) -> bool {
        self.external_policy == TrafficPolicy::Local && self.has_external_addresses()
    }

    /// Whether the port uses cluster-wide endpoints: internal policy Cluster, or
    /// reachable from outside at all (eTP Local short-circuits pods and the node to
    /// cluster endpoints), as upstream's `UsesClusterEndpoints`.
    pub fn uses_cluster_endpoints(&self) -> bool {
        self.internal_policy == TrafficPolicy::Cluster || self.has_external_addresses()
    }

    /// Whether the port uses node-local endpoints (either policy Local).
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy == TrafficPolicy::Local || self.external_policy_local()
    }

    /// Whether the service is reachable from outside the cluster network at all
    /// (node port, external IPs or LB ingress).
    pub fn has_external_addresses(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }
}

impl Endpoint {
    /// A ready, serving, not terminating endpoint without zone or hints.
    pub fn ready(ip: IpAddr, port: u16, is_local: bool) -> Self {
        Endpoint {
            ip,
            port,
            ready: true,
            serving: true,
            terminating: false,
            is_local,
            zone: None,
            zone_hints: Vec::new(),
            node_hints: Vec::new(),
        }
    }
}

/// One endpoint of a service port (after merging and deduplicating slices).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// Address (first address of the slice endpoint).
    pub ip: IpAddr,
    /// Target port from the slice port with the same name and protocol.
    pub port: u16,
    /// `conditions.ready` (unset = true).
    pub ready: bool,
    /// `conditions.serving` (unset = true).
    pub serving: bool,
    /// `conditions.terminating` (unset = false).
    pub terminating: bool,
    /// `nodeName` equals our node name.
    pub is_local: bool,
    /// `zone` of the endpoint, if set.
    pub zone: Option<String>,
    /// `hints.forZones[].name`, empty when the endpoint has no zone hints.
    pub zone_hints: Vec<String>,
    /// `hints.forNodes[].name`, empty when the endpoint has no node hints.
    pub node_hints: Vec<String>,
}

/// The node we run on, as far as the proxy cares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    /// Node name (`--hostname-override` or the host name).
    pub name: String,
    /// Zone label `topology.kubernetes.io/zone`.
    pub zone: Option<String>,
    /// Primary node IPs per family (InternalIP first, else ExternalIP), or from
    /// `--node-ip`.
    pub ips: Vec<IpAddr>,
    /// `spec.podCIDRs` (for `--detect-local-mode NodeCIDR`).
    pub pod_cidrs: Vec<IpNet>,
}

/// Everything the dataplane is built from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterState {
    /// Service ports, per family.
    pub services: BTreeMap<(ServicePortName, IpFamily), ServicePort>,
    /// Endpoints per service port name (both families mixed; filter by address).
    /// Shared: a service with one EndpointSlice holds the slice's own list.
    pub endpoints: BTreeMap<ServicePortName, Arc<Vec<Endpoint>>>,
    /// Our node.
    pub node: NodeInfo,
    /// `networking.k8s.io/v1` ServiceCIDRs (`spec.cidrs`), for the unallocated-IP drop.
    pub service_cidrs: Vec<IpNet>,
}
