//! PURE: which UDP/SCTP conntrack entries a sync made stale, as kube-proxy computes
//! them. TCP is never touched: its endpoints notice a dead peer on their own.
//!
//! - A service port that had no serving endpoint and now has one: flows to its
//!   addresses were rejected or dropped and their conntrack entries keep them so;
//!   delete flows to every service address (and its node port).
//! - An endpoint that was serving and no longer is (or is gone): delete flows that a
//!   service address (or node port) DNATed to it.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use kube_nlproxy_netlink::conntrack::CtTuple;

use crate::model::{ClusterState, Endpoint, IpFamily, Protocol, ServicePort};

/// One kind of conntrack entry to delete.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum StaleFlow {
    /// Original destination `addr:port`.
    ToService {
        /// service address (ClusterIP, external IP or LB IP)
        addr: IpAddr,
        /// service port
        port: u16,
        /// IP protocol number
        proto: u8,
    },
    /// Original destination port `port` on any address (a node port).
    ToNodePort {
        /// node port
        port: u16,
        /// IP protocol number
        proto: u8,
    },
    /// Original destination `addr:port`, DNATed to `endpoint:endpoint_port`.
    ServiceToEndpoint {
        /// service address
        addr: IpAddr,
        /// service port
        port: u16,
        /// endpoint address
        endpoint: IpAddr,
        /// endpoint port
        endpoint_port: u16,
        /// IP protocol number
        proto: u8,
    },
    /// Original destination port `port` (a node port), DNATed to the endpoint.
    NodePortToEndpoint {
        /// node port
        port: u16,
        /// endpoint address
        endpoint: IpAddr,
        /// endpoint port
        endpoint_port: u16,
        /// IP protocol number
        proto: u8,
    },
}

impl StaleFlow {
    /// Whether a conntrack entry (original and reply tuples) is one of these.
    pub fn matches(&self, orig: &CtTuple, reply: &CtTuple) -> bool {
        match *self {
            StaleFlow::ToService { addr, port, proto } => {
                orig.proto == proto && orig.dst == addr && orig.dport == port
            }
            StaleFlow::ToNodePort { port, proto } => orig.proto == proto && orig.dport == port,
            StaleFlow::ServiceToEndpoint {
                addr,
                port,
                endpoint,
                endpoint_port,
                proto,
            } => {
                orig.proto == proto
                    && orig.dst == addr
                    && orig.dport == port
                    && reply.src == endpoint
                    && reply.sport == endpoint_port
            }
            StaleFlow::NodePortToEndpoint {
                port,
                endpoint,
                endpoint_port,
                proto,
            } => {
                orig.proto == proto
                    && orig.dport == port
                    && reply.src == endpoint
                    && reply.sport == endpoint_port
                    && orig.dst != endpoint
            }
        }
    }

    /// The address family the entry lives in.
    pub fn is_ipv6(&self) -> Option<bool> {
        match self {
            StaleFlow::ToService { addr, .. } | StaleFlow::ServiceToEndpoint { addr, .. } => {
                Some(addr.is_ipv6())
            }
            StaleFlow::NodePortToEndpoint { endpoint, .. } => Some(endpoint.is_ipv6()),
            StaleFlow::ToNodePort { .. } => None,
        }
    }
}

/// [`StaleFlow`]s looked up by a conntrack entry's original destination: one
/// hash lookup per dumped entry however many flows a sync made stale (a sync
/// removing 1,000 endpoints would otherwise test each of a million entries
/// against 1,000 flows).
#[derive(Debug, Clone, Default)]
pub struct StaleFlowIndex {
    /// `(address, port, proto)` → the flows to that service address.
    to_service: HashMap<(IpAddr, u16, u8), Vec<StaleFlow>>,
    /// `(port, proto)` → the flows to that node port, any address.
    to_node_port: HashMap<(u16, u8), Vec<StaleFlow>>,
}

impl StaleFlowIndex {
    /// The index of `flows`.
    pub fn new<'a>(flows: impl IntoIterator<Item = &'a StaleFlow>) -> Self {
        let mut index = StaleFlowIndex::default();
        for f in flows {
            match *f {
                StaleFlow::ToService {
                    addr, port, proto, ..
                }
                | StaleFlow::ServiceToEndpoint {
                    addr, port, proto, ..
                } => index
                    .to_service
                    .entry((addr, port, proto))
                    .or_default()
                    .push(f.clone()),
                StaleFlow::ToNodePort { port, proto }
                | StaleFlow::NodePortToEndpoint { port, proto, .. } => index
                    .to_node_port
                    .entry((port, proto))
                    .or_default()
                    .push(f.clone()),
            }
        }
        index
    }

    /// Whether there is no flow.
    pub fn is_empty(&self) -> bool {
        self.to_service.is_empty() && self.to_node_port.is_empty()
    }

    /// Whether the entry `orig`/`reply` is one of the flows: the same answer as
    /// [`StaleFlow::matches`] over all of them.
    pub fn matches(&self, orig: &CtTuple, reply: &CtTuple) -> bool {
        let any = |flows: Option<&Vec<StaleFlow>>| {
            flows.is_some_and(|fs| fs.iter().any(|f| f.matches(orig, reply)))
        };
        any(self.to_service.get(&(orig.dst, orig.dport, orig.proto)))
            || any(self.to_node_port.get(&(orig.dport, orig.proto)))
    }
}

fn service_addrs(svc: &ServicePort) -> Vec<IpAddr> {
    svc.cluster_ip
        .iter()
        .chain(&svc.external_ips)
        .chain(&svc.load_balancer_ips)
        .copied()
        .collect()
}

fn serving(
    eps: Option<&std::sync::Arc<Vec<Endpoint>>>,
    family: IpFamily,
) -> BTreeSet<(IpAddr, u16)> {
    eps.map(|eps| {
        eps.iter()
            .filter(|e| e.serving && IpFamily::of(&e.ip) == family)
            .map(|e| (e.ip, e.port))
            .collect()
    })
    .unwrap_or_default()
}

/// Which UDP/SCTP flows are stale by `state` alone, without knowing what came
/// before (a `--once` sync, a restart): a flow to a service entry point DNATed
/// to an endpoint the entry point no longer has, or not DNATed at all although
/// the entry point now has endpoints. TCP is never touched.
#[derive(Debug, Clone, Default)]
pub struct StaleByState {
    /// `(address, port, proto)` of ClusterIPs, externalIPs, LB IPs → endpoints.
    services: std::collections::HashMap<(IpAddr, u16, u8), BTreeSet<(IpAddr, u16)>>,
    /// `(node port, proto, is IPv6)` → endpoints.
    node_ports: std::collections::HashMap<(u16, u8, bool), BTreeSet<(IpAddr, u16)>>,
}

impl StaleByState {
    /// The UDP/SCTP entry points of `state`.
    pub fn new(state: &ClusterState) -> Self {
        let mut out = StaleByState::default();
        for ((name, family), svc) in &state.services {
            if svc.name.protocol == Protocol::Tcp {
                continue;
            }
            let proto = svc.name.protocol.number();
            let eps = serving(state.endpoints.get(name), *family);
            for addr in service_addrs(svc) {
                out.services.insert((addr, svc.port, proto), eps.clone());
            }
            if let Some(port) = svc.node_port {
                out.node_ports
                    .insert((port, proto, *family == IpFamily::V6), eps.clone());
            }
        }
        out
    }

    /// Whether nothing could be stale (no UDP or SCTP entry point).
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.node_ports.is_empty()
    }

    /// Whether the entry `orig`/`reply` is stale.
    pub fn matches(&self, orig: &CtTuple, reply: &CtTuple) -> bool {
        let dnat = reply.src != orig.dst || reply.sport != orig.dport;
        let eps = self
            .services
            .get(&(orig.dst, orig.dport, orig.proto))
            .or_else(|| {
                self.node_ports
                    .get(&(orig.dport, orig.proto, orig.dst.is_ipv6()))
            });
        match eps {
            None => false,
            Some(eps) if dnat => !eps.contains(&(reply.src, reply.sport)),
            Some(eps) => !eps.is_empty(),
        }
    }
}

/// The entries a change from `prev` to `cur` made stale.
pub fn stale_flows(prev: &ClusterState, cur: &ClusterState) -> Vec<StaleFlow> {
    let mut out = BTreeSet::new();
    for ((name, family), svc) in &cur.services {
        if svc.name.protocol == Protocol::Tcp {
            continue;
        }
        let proto = svc.name.protocol.number();
        let before = serving(prev.endpoints.get(name), *family);
        let now = serving(cur.endpoints.get(name), *family);
        let existed = prev.services.contains_key(&(name.clone(), *family));
        if before.is_empty() && !now.is_empty() {
            for addr in service_addrs(svc) {
                out.insert(StaleFlow::ToService {
                    addr,
                    port: svc.port,
                    proto,
                });
            }
            if let Some(port) = svc.node_port {
                out.insert(StaleFlow::ToNodePort { port, proto });
            }
        }
        if !existed {
            continue;
        }
        for &(endpoint, endpoint_port) in before.difference(&now) {
            for addr in service_addrs(svc) {
                out.insert(StaleFlow::ServiceToEndpoint {
                    addr,
                    port: svc.port,
                    endpoint,
                    endpoint_port,
                    proto,
                });
            }
            if let Some(port) = svc.node_port {
                out.insert(StaleFlow::NodePortToEndpoint {
                    port,
                    endpoint,
                    endpoint_port,
                    proto,
                });
            }
        }
    }
    // Removed service ports: flows DNATed to their endpoints are stale too.
    for ((name, family), svc) in &prev.services {
        if svc.name.protocol == Protocol::Tcp || cur.services.contains_key(&(name.clone(), *family))
        {
            continue;
        }
        let proto = svc.name.protocol.number();
        for (endpoint, endpoint_port) in serving(prev.endpoints.get(name), *family) {
            for addr in service_addrs(svc) {
                out.insert(StaleFlow::ServiceToEndpoint {
                    addr,
                    port: svc.port,
                    endpoint,
                    endpoint_port,
                    proto,
                });
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ServicePortName;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn state(protocol: Protocol, endpoints: &[&str]) -> ClusterState {
        let name = ServicePortName {
            namespace: "ns".into(),
            name: "dns".into(),
            port_name: "".into(),
            protocol,
        };
        let mut st = ClusterState::default();
        st.services.insert(
            (name.clone(), IpFamily::V4),
            ServicePort {
                node_port: Some(30053),
                ..ServicePort::new(name.clone(), IpFamily::V4, Some(ip("10.96.0.10")), 53)
            },
        );
        st.endpoints.insert(
            name,
            std::sync::Arc::new(
                endpoints
                    .iter()
                    .map(|e| Endpoint::ready(ip(e), 5353, true))
                    .collect(),
            ),
        );
        st
    }

    #[test]
    fn udp_endpoint_replaced_clears_flows_to_the_old_one() {
        let flows = stale_flows(
            &state(Protocol::Udp, &["10.244.1.2"]),
            &state(Protocol::Udp, &["10.244.1.3"]),
        );
        assert_eq!(
            flows,
            vec![
                StaleFlow::ServiceToEndpoint {
                    addr: ip("10.96.0.10"),
                    port: 53,
                    endpoint: ip("10.244.1.2"),
                    endpoint_port: 5353,
                    proto: 17
                },
                StaleFlow::NodePortToEndpoint {
                    port: 30053,
                    endpoint: ip("10.244.1.2"),
                    endpoint_port: 5353,
                    proto: 17
                },
            ]
        );
    }

    #[test]
    fn zero_to_one_endpoints_clears_flows_to_the_service() {
        let flows = stale_flows(
            &state(Protocol::Sctp, &[]),
            &state(Protocol::Sctp, &["10.244.1.2"]),
        );
        assert_eq!(
            flows,
            vec![
                StaleFlow::ToService {
                    addr: ip("10.96.0.10"),
                    port: 53,
                    proto: 132
                },
                StaleFlow::ToNodePort {
                    port: 30053,
                    proto: 132
                },
            ]
        );
    }

    #[test]
    fn tcp_is_never_touched() {
        assert!(
            stale_flows(
                &state(Protocol::Tcp, &["10.244.1.2"]),
                &state(Protocol::Tcp, &["10.244.1.3"])
            )
            .is_empty()
        );
        assert!(
            stale_flows(
                &state(Protocol::Tcp, &[]),
                &state(Protocol::Tcp, &["10.244.1.3"])
            )
            .is_empty()
        );
    }

    #[test]
    fn matching_needs_the_nat_pair() {
        let f = StaleFlow::ServiceToEndpoint {
            addr: ip("10.96.0.10"),
            port: 53,
            endpoint: ip("10.244.1.2"),
            endpoint_port: 5353,
            proto: 17,
        };
        let t = |src: &str, dst: &str, sport, dport| CtTuple {
            src: ip(src),
            dst: ip(dst),
            proto: 17,
            sport,
            dport,
        };
        let orig = t("10.244.1.9", "10.96.0.10", 4000, 53);
        assert!(f.matches(&orig, &t("10.244.1.2", "10.244.1.9", 5353, 4000)));
        // A direct flow to the pod, not through the service, stays.
        let direct = t("10.244.1.9", "10.244.1.2", 4000, 5353);
        assert!(!f.matches(&direct, &t("10.244.1.2", "10.244.1.9", 5353, 4000)));
    }

    #[test]
    fn stale_by_state_alone() {
        let tuple = |src: &str, sport, dst: &str, dport| CtTuple {
            src: ip(src),
            dst: ip(dst),
            proto: 17,
            sport,
            dport,
        };
        let st = StaleByState::new(&state(Protocol::Udp, &["10.244.1.2"]));
        let orig = tuple("10.244.1.9", 4000, "10.96.0.10", 53);
        // DNATed to the current endpoint: kept; to another: stale.
        assert!(!st.matches(&orig, &tuple("10.244.1.2", 5353, "10.244.1.9", 4000)));
        assert!(st.matches(&orig, &tuple("10.244.1.3", 5353, "10.244.1.9", 4000)));
        // Not DNATed although the service has endpoints: stale.
        assert!(st.matches(&orig, &tuple("10.96.0.10", 53, "10.244.1.9", 4000)));
        // The node port, DNATed elsewhere: stale; unrelated flows: kept.
        let np = tuple("10.0.0.9", 4000, "10.77.0.1", 30053);
        assert!(st.matches(&np, &tuple("10.244.1.3", 5353, "10.0.0.9", 4000)));
        let other = tuple("10.244.1.9", 4000, "10.96.0.99", 53);
        assert!(!st.matches(&other, &tuple("10.244.1.3", 5353, "10.244.1.9", 4000)));
        // TCP services are never looked at.
        assert!(StaleByState::new(&state(Protocol::Tcp, &["10.244.1.2"])).is_empty());
    }
    #[test]
    fn the_index_answers_as_the_flows_do() {
        let v4 = |a: u8, b: u8| IpAddr::from([10, a, 0, b]);
        let mut flows = Vec::new();
        for i in 1..4u8 {
            flows.push(StaleFlow::ToService {
                addr: v4(96, i),
                port: 53,
                proto: 17,
            });
            flows.push(StaleFlow::ServiceToEndpoint {
                addr: v4(96, i + 10),
                port: 53,
                endpoint: v4(128, i),
                endpoint_port: 5353,
                proto: 17,
            });
            flows.push(StaleFlow::NodePortToEndpoint {
                port: 30000 + u16::from(i),
                endpoint: v4(128, i),
                endpoint_port: 5353,
                proto: 132,
            });
        }
        flows.push(StaleFlow::ToNodePort {
            port: 30100,
            proto: 17,
        });
        let index = StaleFlowIndex::new(&flows);
        assert!(!index.is_empty());
        assert!(StaleFlowIndex::new(&[]).is_empty());
        // Every combination of a few addresses, ports and protocols.
        let addrs: Vec<IpAddr> = (0..16u8)
            .flat_map(|b| [v4(96, b), v4(128, b)])
            .chain([v4(77, 1)])
            .collect();
        let ports = [53, 5353, 30001, 30002, 30100, 4000];
        let (mut seen, mut hits) = (0, 0);
        for &dst in &addrs {
            for &dport in &ports {
                for proto in [6, 17, 132] {
                    for &rsrc in &addrs {
                        for sport in [5353, 53] {
                            let orig = CtTuple {
                                src: v4(192, 1),
                                dst,
                                proto,
                                sport: 4000,
                                dport,
                            };
                            let reply = CtTuple {
                                src: rsrc,
                                dst: v4(192, 1),
                                proto,
                                sport,
                                dport: 4000,
                            };
                            let linear = flows.iter().any(|f| f.matches(&orig, &reply));
                            assert_eq!(index.matches(&orig, &reply), linear, "{orig:?} {reply:?}");
                            seen += 1;
                            hits += usize::from(linear);
                        }
                    }
                }
            }
        }
        assert!(hits > 0 && hits < seen, "{hits} of {seen}");
    }
}
