//! `kube-nlproxy plan`: the operations the next sync would send, one line per
//! object, grouped by the Service port each is for.
//!
//! The nftables side names its Service port itself (every element's comment is
//! `ns/name:port`); an IPVS virtual server or real server is named by looking
//! its address up among the service ports of the model. Everything else (chains,
//! rules, sets, node-wide elements, `kube-ipvs0`) is the table's own.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use kube_nlproxy_netlink::nft::{Element, Op};
use serde::Serialize;

use crate::model::{ClusterState, ServicePortName};
use crate::sync::explain::element_text;
use crate::sync::ipvs::IpvsOp;
use crate::sync::service_of_comment;

/// One operation of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedOp {
    /// The Service port it is for (`ns/name:port`, or `ns/name` for a
    /// ClusterIP's own element); `None`: the table's or the node's own objects.
    pub service: Option<String>,
    /// `+` added, `-` deleted, `~` changed in place (an IPVS weight, a flushed
    /// chain's rules follow as `+`).
    pub op: &'static str,
    /// What it is, nft-like (`element ip endpoints-ips 10.96.0.10 . tcp . 80 .
    /// 0 : 10.244.2.7 . 8080`) or ipvsadm-like.
    pub text: String,
    /// The virtual address (`addr, IP protocol, port`) of an IPVS operation,
    /// to name its Service port by ([`resolve`]).
    #[serde(skip)]
    pub address: Option<(IpAddr, u8, u16)>,
}

/// One line per element of element operations, one per other operation.
pub fn nft_planned(ops: &[Op]) -> Vec<PlannedOp> {
    let mut out = Vec::new();
    let element = |sign, family: &str, set: &str, e: &Element| PlannedOp {
        service: e
            .comment
            .as_deref()
            .and_then(|c| service_of_comment(c).map(|_| c.to_string())),
        op: sign,
        text: format!("element {family} {set} {}", element_text(e)),
        address: None,
    };
    for op in ops {
        match op {
            Op::AddElements {
                family,
                set,
                elements,
                ..
            } => out.extend(
                elements
                    .iter()
                    .map(|e| element("+", family.nft_name(), set, e)),
            ),
            Op::DeleteElements {
                family,
                set,
                elements,
                ..
            } => out.extend(
                elements
                    .iter()
                    .map(|e| element("-", family.nft_name(), set, e)),
            ),
            other => {
                let text = other.to_string();
                let (sign, rest) = if let Some(r) = text.strip_prefix("add ") {
                    ("+", r.to_string())
                } else if let Some(r) = text.strip_prefix("delete ") {
                    ("-", r.to_string())
                } else {
                    ("~", text.clone())
                };
                out.push(PlannedOp {
                    service: None,
                    op: sign,
                    text: rest,
                    address: None,
                });
            }
        }
    }
    out
}

/// One line per IPVS operation (ipset members: one per member).
pub fn ipvs_planned(ops: &[IpvsOp]) -> Vec<PlannedOp> {
    use kube_nlproxy_netlink::ipvs::IpvsProtocol as P;
    let mut out = Vec::new();
    for op in ops {
        let sign = match op {
            IpvsOp::EnsureDummy
            | IpvsOp::AddAddress(_)
            | IpvsOp::AddService(_)
            | IpvsOp::AddDest(..)
            | IpvsOp::CreateIpset(_)
            | IpvsOp::AddMembers(..) => "+",
            IpvsOp::UpdateService(_) | IpvsOp::UpdateDest(..) => "~",
            _ => "-",
        };
        let service = match op {
            IpvsOp::AddService(s)
            | IpvsOp::UpdateService(s)
            | IpvsOp::DelService(s)
            | IpvsOp::AddDest(s, _)
            | IpvsOp::UpdateDest(s, _)
            | IpvsOp::DelDest(s, _) => Some(s),
            _ => None,
        };
        let address = service.and_then(|s| {
            let proto = match s.protocol {
                P::Tcp => 6,
                P::Udp => 17,
                P::Sctp => 132,
                #[allow(unreachable_patterns)]
                _ => return None,
            };
            Some((s.addr, proto, s.port))
        });
        match op {
            IpvsOp::AddMembers(set, members) | IpvsOp::DelMembers(set, members) => {
                out.extend(members.iter().map(|m| PlannedOp {
                    service: None,
                    op: sign,
                    text: format!("ipset {set} {m:?}"),
                    address: None,
                }))
            }
            _ => out.push(PlannedOp {
                service: None,
                op: sign,
                text: op.to_string(),
                address,
            }),
        }
    }
    out
}

/// Names the Service port of the operations that carry a virtual address:
/// the port whose ClusterIP, externalIP or LB IP (with its port) or NodePort
/// (on any address) it is.
pub fn resolve(ops: &mut [PlannedOp], state: &ClusterState) {
    if ops.iter().all(|o| o.address.is_none()) {
        return;
    }
    let mut by_ip: HashMap<(IpAddr, u8, u16), &ServicePortName> = HashMap::new();
    let mut by_nodeport: HashMap<(u8, u16), &ServicePortName> = HashMap::new();
    for svc in state.services.values() {
        let proto = svc.name.protocol.number();
        for ip in svc
            .cluster_ip
            .iter()
            .chain(&svc.external_ips)
            .chain(&svc.load_balancer_ips)
        {
            by_ip.entry((*ip, proto, svc.port)).or_insert(&svc.name);
        }
        if let Some(np) = svc.node_port {
            by_nodeport.entry((proto, np)).or_insert(&svc.name);
        }
    }
    for op in ops.iter_mut().filter(|o| o.service.is_none()) {
        let Some((ip, proto, port)) = op.address else {
            continue;
        };
        op.service = by_ip
            .get(&(ip, proto, port))
            .or_else(|| by_nodeport.get(&(proto, port)))
            .map(|n| port_label(n));
    }
}

/// `ns/name:port` (`ns/name` for an unnamed port), like the element comments.
pub fn port_label(name: &ServicePortName) -> String {
    if name.port_name.is_empty() {
        format!("{}/{}", name.namespace, name.name)
    } else {
        format!("{}/{}:{}", name.namespace, name.name, name.port_name)
    }
}

/// The plan in its printed order: Service ports by name (each one's operations
/// in the order they would be sent), then the table's own.
pub fn grouped(ops: Vec<PlannedOp>) -> Vec<PlannedOp> {
    let mut groups: BTreeMap<(bool, Option<String>), Vec<PlannedOp>> = BTreeMap::new();
    for op in ops {
        groups
            .entry((op.service.is_none(), op.service.clone()))
            .or_default()
            .push(op);
    }
    groups.into_values().flatten().collect()
}

/// Counts of a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PlanSummary {
    /// Operations (lines).
    pub operations: usize,
    /// `+` lines.
    pub additions: usize,
    /// `-` lines.
    pub deletions: usize,
    /// `~` lines.
    pub changes: usize,
    /// Service ports with at least one operation.
    pub services: usize,
}

/// The counts of `ops`.
pub fn summary(ops: &[PlannedOp]) -> PlanSummary {
    let mut services: Vec<&str> = ops.iter().filter_map(|o| o.service.as_deref()).collect();
    services.sort_unstable();
    services.dedup();
    PlanSummary {
        operations: ops.len(),
        additions: ops.iter().filter(|o| o.op == "+").count(),
        deletions: ops.iter().filter(|o| o.op == "-").count(),
        changes: ops.iter().filter(|o| o.op == "~").count(),
        services: services.len(),
    }
}

/// The plan as text: one line per operation, `SIGN TEXT  # SERVICE`, then a
/// one-line summary.
pub fn render_text(ops: &[PlannedOp]) -> String {
    let mut out = String::new();
    for op in ops {
        match &op.service {
            Some(s) => out.push_str(&format!("{} {}  # {s}\n", op.op, op.text)),
            None => out.push_str(&format!("{} {}\n", op.op, op.text)),
        }
    }
    let s = summary(ops);
    if s.operations == 0 {
        out.push_str("plan: no operations; the kernel matches the desired state\n");
    } else {
        out.push_str(&format!(
            "plan: {} operations ({} additions, {} deletions, {} changes) for {} service ports\n",
            s.operations, s.additions, s.deletions, s.changes, s.services
        ));
    }
    out
}

/// The plan as JSON: `{"operations": [...], "summary": {...}}`.
pub fn render_json(ops: &[PlannedOp]) -> String {
    #[derive(Serialize)]
    struct Out<'a> {
        operations: &'a [PlannedOp],
        summary: PlanSummary,
    }
    serde_json::to_string_pretty(&Out {
        operations: ops,
        summary: summary(ops),
    })
    .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_nlproxy_netlink::nft::{Family, KeyValue};

    #[test]
    fn elements_are_named_by_their_service_port_and_grouped() {
        let ep = Element::new(vec![
            KeyValue::Addr("10.96.0.10".parse().unwrap()),
            KeyValue::Proto(6),
            KeyValue::Port(80),
            KeyValue::Mark(0),
        ])
        .with_data(vec![
            KeyValue::Addr("10.244.2.7".parse().unwrap()),
            KeyValue::Port(8080),
        ])
        .with_comment("default/web:http");
        let other =
            Element::new(vec![KeyValue::Addr("10.96.0.11".parse().unwrap())]).with_comment("a/db");
        let node = Element::new(vec![KeyValue::Addr("192.0.2.1".parse().unwrap())])
            .with_comment("NodePort address");
        let ops = vec![
            Op::AddElements {
                family: Family::Ipv4,
                table: "kube-nlproxy".into(),
                set: "endpoints-ips".into(),
                elements: vec![ep],
            },
            Op::AddElements {
                family: Family::Ipv4,
                table: "kube-nlproxy".into(),
                set: "nodeport-ips".into(),
                elements: vec![node],
            },
            Op::DeleteElements {
                family: Family::Ipv4,
                table: "kube-nlproxy".into(),
                set: "cluster-ips".into(),
                elements: vec![other],
            },
        ];
        let plan = grouped(nft_planned(&ops));
        let text = render_text(&plan);
        assert_eq!(
            text,
            "- element ip cluster-ips 10.96.0.11  # a/db\n\
             + element ip endpoints-ips 10.96.0.10 . tcp . 80 . 0 : 10.244.2.7 . 8080  # default/web:http\n\
             + element ip nodeport-ips 192.0.2.1\n\
             plan: 3 operations (2 additions, 1 deletions, 0 changes) for 2 service ports\n"
        );
        let json: serde_json::Value = serde_json::from_str(&render_json(&plan)).unwrap();
        assert_eq!(json["summary"]["services"], 2);
        assert_eq!(json["operations"][1]["service"], "default/web:http");
        assert_eq!(
            render_text(&[]),
            "plan: no operations; the kernel matches the desired state\n"
        );
    }
}
