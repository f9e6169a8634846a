//! The ipvs mode's diff + apply: IPVS virtual servers and real servers (generic
//! netlink), the addresses of `kube-ipvs0` (rtnetlink) and the KUBE-* ipsets
//! (nfnetlink). The mode's nftables table goes through the ordinary
//! [`Syncer`](super::Syncer).
//!
//! [`diff_ipvs`] is pure. [`IpvsSyncer::sync`] is the only I/O step, through the
//! [`IpvsDataplane`] trait that [`NetlinkIpvs`] and [`FakeIpvs`] implement.
//!
//! Ownership (DESIGN.md "Ownership"): a virtual server is ours when its address is
//! on `kube-ipvs0`, or when it is a NodePort VS — its address is one of the
//! NodePort addresses and its port is listed in our `KUBE-NODE-PORT-*` ipsets (the
//! record kube-proxy keeps too). Nothing else is ever updated or deleted, and IPVS is
//! never flushed. An existing `kube-ipvs0`, its addresses, the VSs on them and the
//! ipsets are adopted as they are: same keys, so no delete/re-add and no reset
//! connection when a node moves from kube-proxy's IPVS mode.
//!
//! Graceful termination (upstream `graceful_termination.go`): a real server leaving
//! a TCP VS first gets weight 0 and is deleted once `ActiveConn + InactConn == 0`,
//! re-checked on every sync; [`IpvsSyncer::pending_graceful`] tells the daemon to
//! schedule re-checks. UDP/SCTP real servers are deleted at once (the daemon clears
//! their conntrack entries).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kube_nlproxy_netlink::ipset::{IpsetCreate, IpsetFamily, IpsetHandle, IpsetMember, IpsetType};
use kube_nlproxy_netlink::ipvs::codec::IP_VS_SVC_F_PERSISTENT;
use kube_nlproxy_netlink::ipvs::{
    FwdMethod, IpvsDestination, IpvsHandle, IpvsProtocol, IpvsRequest, IpvsService, IpvsTimeouts,
};
use kube_nlproxy_netlink::link::LinkHandle;

use crate::config::host::{SysctlWrite, write_sysctl};
use crate::mode::ipvs::{
    DUMMY_LINK, IPSETS, IpsetSpec, IpvsDesired, IpvsTouched, NODE_PORT_LOCAL_SCTP,
    NODE_PORT_LOCAL_TCP, NODE_PORT_LOCAL_UDP, NODE_PORT_SCTP, NODE_PORT_TCP, NODE_PORT_UDP,
    REAL_SERVER_WEIGHT, VirtualServer, VsKey, ipset_name,
};
use crate::model::{IpFamily, Protocol};

/// A cause, kept whole (its own `source()` chain and errno included).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of the ipvs mode's sync.
#[derive(Debug, thiserror::Error)]
pub enum IpvsSyncError {
    /// Opening a netlink socket failed (e.g. no IPVS in the kernel).
    #[error("opening the {what} netlink socket failed")]
    Socket {
        /// `IPVS`, `ipset`, `rtnetlink`
        what: &'static str,
        /// cause
        #[source]
        source: BoxError,
    },
    /// Reading the current state failed.
    #[error("reading {what} back failed")]
    DumpFailed {
        /// what was read
        what: String,
        /// cause
        #[source]
        source: BoxError,
    },
    /// One operation failed; the ones before it were applied.
    #[error("{op} failed")]
    ApplyFailed {
        /// the operation
        op: String,
        /// cause
        #[source]
        source: BoxError,
    },
}

/// A virtual server as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentVs {
    /// The service.
    pub service: IpvsService,
    /// Its real servers by (address, port).
    pub dests: BTreeMap<(IpAddr, u16), IpvsDestination>,
}

/// One of our ipsets as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentIpset {
    /// Its type (`None`: a type we do not know).
    pub kind: Option<IpsetType>,
    /// Members.
    pub members: BTreeSet<IpsetMember>,
}

/// What the kernel holds, as far as the ipvs mode cares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpvsCurrent {
    /// Every IPVS virtual server (ours or not), by key. fwmark and non
    /// TCP/UDP/SCTP services are left out: never ours.
    pub services: BTreeMap<VsKey, CurrentVs>,
    /// Addresses on `kube-ipvs0`; `None` when the link does not exist.
    pub dummy: Option<BTreeSet<IpAddr>>,
    /// Our ipsets (names of [`IPSETS`] in both families) that exist.
    pub ipsets: BTreeMap<String, CurrentIpset>,
}

/// One operation of an IPVS-mode transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpvsOp {
    /// `ip link add kube-ipvs0 type dummy` (when missing)
    EnsureDummy,
    /// `ip link del kube-ipvs0`
    DeleteDummy,
    /// `ip addr add ADDR dev kube-ipvs0`
    AddAddress(IpAddr),
    /// `ip addr del ADDR dev kube-ipvs0`
    DelAddress(IpAddr),
    /// `ipvsadm -A`
    AddService(IpvsService),
    /// `ipvsadm -E`
    UpdateService(IpvsService),
    /// `ipvsadm -D`
    DelService(IpvsService),
    /// `ipvsadm -a`
    AddDest(IpvsService, IpvsDestination),
    /// `ipvsadm -e` (weight 0: draining)
    UpdateDest(IpvsService, IpvsDestination),
    /// `ipvsadm -d`
    DelDest(IpvsService, IpvsDestination),
    /// `ipset create`
    CreateIpset(IpsetCreate),
    /// `ipset destroy`
    DestroyIpset(String),
    /// `ipset add` (many members)
    AddMembers(String, Vec<IpsetMember>),
    /// `ipset del` (many members)
    DelMembers(String, Vec<IpsetMember>),
}

impl IpvsOp {
    /// Short kind name, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            IpvsOp::EnsureDummy => "ensure-dummy",
            IpvsOp::DeleteDummy => "delete-dummy",
            IpvsOp::AddAddress(_) => "add-address",
            IpvsOp::DelAddress(_) => "del-address",
            IpvsOp::AddService(_) => "add-vs",
            IpvsOp::UpdateService(_) => "update-vs",
            IpvsOp::DelService(_) => "del-vs",
            IpvsOp::AddDest(..) => "add-rs",
            IpvsOp::UpdateDest(..) => "update-rs",
            IpvsOp::DelDest(..) => "del-rs",
            IpvsOp::CreateIpset(_) => "create-ipset",
            IpvsOp::DestroyIpset(_) => "destroy-ipset",
            IpvsOp::AddMembers(..) => "add-member",
            IpvsOp::DelMembers(..) => "del-member",
        }
    }
}

impl std::fmt::Display for IpvsOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let vs = |s: &IpvsService| format!("{:?} {}:{}", s.protocol, s.addr, s.port);
        match self {
            IpvsOp::EnsureDummy => write!(f, "ip link add {DUMMY_LINK} type dummy"),
            IpvsOp::DeleteDummy => write!(f, "ip link del {DUMMY_LINK}"),
            IpvsOp::AddAddress(a) => write!(f, "ip addr add {a} dev {DUMMY_LINK}"),
            IpvsOp::DelAddress(a) => write!(f, "ip addr del {a} dev {DUMMY_LINK}"),
            IpvsOp::AddService(s) => write!(f, "ipvsadm -A {} -s {}", vs(s), s.scheduler),
            IpvsOp::UpdateService(s) => write!(f, "ipvsadm -E {} -s {}", vs(s), s.scheduler),
            IpvsOp::DelService(s) => write!(f, "ipvsadm -D {}", vs(s)),
            IpvsOp::AddDest(s, d) => {
                write!(
                    f,
                    "ipvsadm -a {} -r {}:{} -w {}",
                    vs(s),
                    d.addr,
                    d.port,
                    d.weight
                )
            }
            IpvsOp::UpdateDest(s, d) => {
                write!(
                    f,
                    "ipvsadm -e {} -r {}:{} -w {}",
                    vs(s),
                    d.addr,
                    d.port,
                    d.weight
                )
            }
            IpvsOp::DelDest(s, d) => write!(f, "ipvsadm -d {} -r {}:{}", vs(s), d.addr, d.port),
            IpvsOp::CreateIpset(c) => write!(f, "ipset create {} {}", c.name, c.kind.name()),
            IpvsOp::DestroyIpset(n) => write!(f, "ipset destroy {n}"),
            IpvsOp::AddMembers(n, m) => write!(f, "ipset add {n} ({} members)", m.len()),
            IpvsOp::DelMembers(n, m) => write!(f, "ipset del {n} ({} members)", m.len()),
        }
    }
}

fn ipvs_protocol(p: Protocol) -> IpvsProtocol {
    match p {
        Protocol::Tcp => IpvsProtocol::Tcp,
        Protocol::Udp => IpvsProtocol::Udp,
        Protocol::Sctp => IpvsProtocol::Sctp,
    }
}

/// The key of a kernel service (`None` for fwmark or other protocols).
pub fn vs_key(s: &IpvsService) -> Option<VsKey> {
    if s.fwmark.is_some() {
        return None;
    }
    let protocol = match s.protocol {
        IpvsProtocol::Tcp => Protocol::Tcp,
        IpvsProtocol::Udp => Protocol::Udp,
        IpvsProtocol::Sctp => Protocol::Sctp,
        _ => return None,
    };
    Some(VsKey {
        family: IpFamily::of(&s.addr),
        protocol,
        addr: s.addr,
        port: s.port,
    })
}

/// The kernel service for a desired virtual server.
pub fn ipvs_service(key: &VsKey, vs: &VirtualServer) -> IpvsService {
    let s =
        IpvsService::new(ipvs_protocol(key.protocol), key.addr, key.port).scheduler(&vs.scheduler);
    match vs.persistence_timeout {
        Some(t) => s.persistent(t),
        None => s,
    }
}

fn service_differs(cur: &IpvsService, want: &IpvsService) -> bool {
    let persistent = |s: &IpvsService| s.flags & IP_VS_SVC_F_PERSISTENT != 0;
    cur.scheduler != want.scheduler
        || persistent(cur) != persistent(want)
        || (persistent(want) && (cur.timeout != want.timeout || cur.netmask != want.netmask))
}

/// How an ipset of ours is created.
pub fn ipset_create(spec: &IpsetSpec) -> IpsetCreate {
    match spec.kind {
        IpsetType::BitmapPort => IpsetCreate::bitmap_port(&spec.name, 0, 65535),
        kind => IpsetCreate::hash(
            &spec.name,
            kind,
            match spec.family {
                IpFamily::V4 => IpsetFamily::Inet,
                IpFamily::V6 => IpsetFamily::Inet6,
            },
        ),
    }
}

/// Whether `addr` is in one of `--ipvs-exclude-cidrs`: a virtual or real server
/// there is never deleted (upstream's `isIPInExcludeCIDRs`).
pub fn excluded(addr: &IpAddr, exclude: &[IpNet]) -> bool {
    exclude.iter().any(|c| c.contains(addr))
}

/// Whether the kernel VS `key` is ours (see the module doc) and not excluded.
fn owned(
    key: &VsKey,
    current: &IpvsCurrent,
    nodeport_ips: &BTreeSet<IpAddr>,
    exclude: &[IpNet],
) -> bool {
    if excluded(&key.addr, exclude) {
        return false;
    }
    if current
        .dummy
        .as_ref()
        .is_some_and(|a| a.contains(&key.addr))
    {
        return true;
    }
    if !nodeport_ips.contains(&key.addr) {
        return false;
    }
    let listed = |set: &str, m: &IpsetMember| {
        current
            .ipsets
            .get(&ipset_name(set, key.family))
            .is_some_and(|s| s.members.contains(m))
    };
    match key.protocol {
        Protocol::Tcp => [NODE_PORT_TCP, NODE_PORT_LOCAL_TCP]
            .iter()
            .any(|s| listed(s, &IpsetMember::Port(key.port))),
        Protocol::Udp => [NODE_PORT_UDP, NODE_PORT_LOCAL_UDP]
            .iter()
            .any(|s| listed(s, &IpsetMember::Port(key.port))),
        Protocol::Sctp => {
            let m = IpsetMember::IpPort {
                ip: key.addr,
                proto: Protocol::Sctp.number(),
                port: key.port,
            };
            [NODE_PORT_SCTP, NODE_PORT_LOCAL_SCTP]
                .iter()
                .any(|s| listed(s, &m))
        }
    }
}

/// The result of [`diff_ipvs`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsPlan {
    /// Operations, in the order they must be applied.
    pub ops: Vec<IpvsOp>,
    /// Real servers left draining (weight 0, connections remaining) after `ops`.
    pub draining: usize,
}

/// PURE: the operations that turn `current` into `desired`. `nodeport_ips` are the
/// NodePort addresses used now or before (ownership of NodePort VSs).
pub fn diff_ipvs(
    current: &IpvsCurrent,
    desired: &IpvsDesired,
    nodeport_ips: &BTreeSet<IpAddr>,
) -> IpvsPlan {
    diff_ipvs_scoped(current, desired, nodeport_ips, None)
}

/// PURE: [`diff_ipvs`] looking only at the keys in `touched` (`None`: at
/// everything). With `current` the state the last sync left, the keys an
/// update touched are all that can differ, so the diff costs what changed.
pub fn diff_ipvs_scoped(
    current: &IpvsCurrent,
    desired: &IpvsDesired,
    nodeport_ips: &BTreeSet<IpAddr>,
    touched: Option<&IpvsTouched>,
) -> IpvsPlan {
    let mut plan = IpvsPlan::default();
    let no_addrs = BTreeSet::new();
    let bound = current.dummy.as_ref().unwrap_or(&no_addrs);
    // 1. kube-ipvs0 and its new addresses first: they establish ownership.
    if current.dummy.is_none() {
        plan.ops.push(IpvsOp::EnsureDummy);
    }
    let addrs: Vec<IpAddr> = match touched {
        None => desired.bound_addrs.union(bound).copied().collect(),
        Some(t) => t.bound_addrs.iter().copied().collect(),
    };
    for a in &addrs {
        if desired.bound_addrs.contains(a) && !bound.contains(a) {
            plan.ops.push(IpvsOp::AddAddress(*a));
        }
    }
    // 2. ipsets: create, add members (deletions wait until step 5).
    let mut late = Vec::new();
    match touched {
        None => {
            for spec in desired.ipsets.values() {
                diff_ipset(current, spec, None, &mut plan.ops, &mut late);
            }
        }
        Some(t) => {
            let mut by_set: BTreeMap<&str, Vec<&IpsetMember>> = BTreeMap::new();
            for (set, member) in &t.members {
                by_set.entry(set.as_str()).or_default().push(member);
            }
            for (set, members) in by_set {
                if let Some(spec) = desired.ipsets.get(set) {
                    diff_ipset(current, spec, Some(&members), &mut plan.ops, &mut late);
                }
            }
        }
    }
    // 3. virtual servers and real servers.
    let mut removals = Vec::new();
    let keys: Vec<&VsKey> = match touched {
        None => desired.virtual_servers.keys().collect(),
        Some(t) => t.virtual_servers.iter().collect(),
    };
    for key in &keys {
        if let Some(vs) = desired.virtual_servers.get(key) {
            diff_vs(
                key,
                vs,
                current,
                &desired.exclude_cidrs,
                &mut plan,
                &mut removals,
            );
        }
    }
    plan.ops.extend(removals);
    // 4. virtual servers of ours nobody wants.
    let gone: Vec<&VsKey> = match touched {
        None => current.services.keys().collect(),
        Some(_) => keys,
    };
    for key in gone {
        if desired.virtual_servers.contains_key(key)
            || !owned(key, current, nodeport_ips, &desired.exclude_cidrs)
        {
            continue;
        }
        if let Some(cur) = current.services.get(key) {
            plan.ops.push(IpvsOp::DelService(cur.service.clone()));
        }
    }
    // 5. members and addresses last: they record ownership until the VSs are gone.
    plan.ops.extend(late);
    for a in &addrs {
        if !desired.bound_addrs.contains(a) && bound.contains(a) {
            plan.ops.push(IpvsOp::DelAddress(*a));
        }
    }
    plan
}

/// One ipset: created when missing (or of another type), then the members of
/// `only` (every member when `None`) added now and deleted in `late`.
fn diff_ipset(
    current: &IpvsCurrent,
    spec: &IpsetSpec,
    only: Option<&[&IpsetMember]>,
    ops: &mut Vec<IpvsOp>,
    late: &mut Vec<IpvsOp>,
) {
    let cur = current.ipsets.get(&spec.name);
    let exists_ok = cur.is_some_and(|c| c.kind == Some(spec.kind));
    if cur.is_some() && !exists_ok {
        ops.push(IpvsOp::DestroyIpset(spec.name.clone()));
    }
    if !exists_ok {
        ops.push(IpvsOp::CreateIpset(ipset_create(spec)));
    }
    let empty = BTreeSet::new();
    let have = cur.filter(|_| exists_ok).map_or(&empty, |c| &c.members);
    let (add, del): (Vec<IpsetMember>, Vec<IpsetMember>) = match only {
        // A set made anew gets every member, whatever was touched.
        Some(members) if exists_ok => (
            members
                .iter()
                .filter(|m| spec.members.contains(**m) && !have.contains(**m))
                .map(|m| (*m).clone())
                .collect(),
            members
                .iter()
                .filter(|m| !spec.members.contains(**m) && have.contains(**m))
                .map(|m| (*m).clone())
                .collect(),
        ),
        _ => (
            spec.members.difference(have).cloned().collect(),
            have.difference(&spec.members).cloned().collect(),
        ),
    };
    if !add.is_empty() {
        ops.push(IpvsOp::AddMembers(spec.name.clone(), add));
    }
    if !del.is_empty() {
        late.push(IpvsOp::DelMembers(spec.name.clone(), del));
    }
}

/// One desired virtual server against what the kernel has at `key`.
fn diff_vs(
    key: &VsKey,
    vs: &VirtualServer,
    current: &IpvsCurrent,
    exclude: &[IpNet],
    plan: &mut IpvsPlan,
    removals: &mut Vec<IpvsOp>,
) {
    let want = ipvs_service(key, vs);
    let empty = BTreeMap::new();
    let cur_dests = match current.services.get(key) {
        None => {
            plan.ops.push(IpvsOp::AddService(want.clone()));
            &empty
        }
        Some(cur) => {
            if service_differs(&cur.service, &want) {
                plan.ops.push(IpvsOp::UpdateService(want.clone()));
            }
            &cur.dests
        }
    };
    for rs in &vs.real_servers {
        let dest = IpvsDestination::new(rs.addr, rs.port).weight(REAL_SERVER_WEIGHT);
        match cur_dests.get(&(rs.addr, rs.port)) {
            None => plan.ops.push(IpvsOp::AddDest(want.clone(), dest)),
            Some(d) if d.weight != REAL_SERVER_WEIGHT || d.fwd_method != FwdMethod::Masq => {
                plan.ops.push(IpvsOp::UpdateDest(want.clone(), dest))
            }
            Some(_) => {}
        }
    }
    for ((addr, port), d) in cur_dests {
        if vs.real_servers.contains(&crate::mode::ipvs::RealServer {
            addr: *addr,
            port: *port,
        }) || excluded(addr, exclude)
        {
            continue;
        }
        let gone = d.active_conns + d.inact_conns == 0;
        if key.protocol != Protocol::Tcp || gone {
            removals.push(IpvsOp::DelDest(want.clone(), d.clone()));
        } else {
            plan.draining += 1;
            if d.weight != 0 {
                let mut drained = d.clone();
                drained.weight = 0;
                removals.push(IpvsOp::UpdateDest(want.clone(), drained));
            }
        }
    }
}

/// PURE: the operations `kube-nlproxy cleanup` sends: every VS of ours, the dummy
/// link and every KUBE-* ipset of ours.
pub fn cleanup_ops(
    current: &IpvsCurrent,
    nodeport_ips: &BTreeSet<IpAddr>,
    exclude: &[IpNet],
) -> Vec<IpvsOp> {
    let mut ops: Vec<IpvsOp> = current
        .services
        .iter()
        .filter(|(k, _)| owned(k, current, nodeport_ips, exclude))
        .map(|(_, v)| IpvsOp::DelService(v.service.clone()))
        .collect();
    if current.dummy.is_some() {
        ops.push(IpvsOp::DeleteDummy);
    }
    ops.extend(
        current
            .ipsets
            .keys()
            .map(|n| IpvsOp::DestroyIpset(n.clone())),
    );
    ops
}

/// The names of every ipset the mode owns (both families).
pub fn owned_ipset_names() -> Vec<String> {
    IpFamily::ALL
        .iter()
        .flat_map(|f| IPSETS.iter().map(move |(n, _)| ipset_name(n, *f)))
        .collect()
}

impl IpvsCurrent {
    /// The state after `op`, as the kernel would make it; `Err` with the errno
    /// name when the kernel would refuse it (ENOENT, EEXIST).
    pub fn apply(&mut self, op: &IpvsOp) -> Result<(), &'static str> {
        let key_of = |s: &IpvsService| vs_key(s).ok_or("EINVAL");
        match op {
            IpvsOp::EnsureDummy => {
                self.dummy.get_or_insert_with(BTreeSet::new);
            }
            IpvsOp::DeleteDummy => {
                // Deleting the link removes its addresses.
                self.dummy.take().ok_or("ENODEV")?;
            }
            IpvsOp::AddAddress(a) => {
                let d = self.dummy.as_mut().ok_or("ENODEV")?;
                if !d.insert(*a) {
                    return Err("EEXIST");
                }
            }
            IpvsOp::DelAddress(a) => {
                let d = self.dummy.as_mut().ok_or("ENODEV")?;
                if !d.remove(a) {
                    return Err("EADDRNOTAVAIL");
                }
            }
            IpvsOp::AddService(s) => {
                let k = key_of(s)?;
                if self.services.contains_key(&k) {
                    return Err("EEXIST");
                }
                self.services.insert(
                    k,
                    CurrentVs {
                        service: s.clone(),
                        dests: BTreeMap::new(),
                    },
                );
            }
            IpvsOp::UpdateService(s) => {
                let cur = self.services.get_mut(&key_of(s)?).ok_or("ESRCH")?;
                cur.service = s.clone();
            }
            IpvsOp::DelService(s) => {
                self.services.remove(&key_of(s)?).ok_or("ESRCH")?;
            }
            IpvsOp::AddDest(s, d) => {
                let cur = self.services.get_mut(&key_of(s)?).ok_or("ESRCH")?;
                if cur.dests.contains_key(&(d.addr, d.port)) {
                    return Err("EEXIST");
                }
                cur.dests.insert((d.addr, d.port), d.clone());
            }
            IpvsOp::UpdateDest(s, d) => {
                let cur = self.services.get_mut(&key_of(s)?).ok_or("ESRCH")?;
                let e = cur.dests.get_mut(&(d.addr, d.port)).ok_or("ENOENT")?;
                e.weight = d.weight;
                e.fwd_method = d.fwd_method;
            }
            IpvsOp::DelDest(s, d) => {
                let cur = self.services.get_mut(&key_of(s)?).ok_or("ESRCH")?;
                cur.dests.remove(&(d.addr, d.port)).ok_or("ENOENT")?;
            }
            IpvsOp::CreateIpset(c) => {
                if self.ipsets.contains_key(&c.name) {
                    return Err("EEXIST");
                }
                self.ipsets.insert(
                    c.name.clone(),
                    CurrentIpset {
                        kind: Some(c.kind),
                        members: BTreeSet::new(),
                    },
                );
            }
            IpvsOp::DestroyIpset(n) => {
                self.ipsets.remove(n).ok_or("ENOENT")?;
            }
            IpvsOp::AddMembers(n, m) => {
                let s = self.ipsets.get_mut(n).ok_or("ENOENT")?;
                s.members.extend(m.iter().cloned());
            }
            IpvsOp::DelMembers(n, m) => {
                let s = self.ipsets.get_mut(n).ok_or("ENOENT")?;
                for x in m {
                    s.members.remove(x);
                }
            }
        }
        Ok(())
    }
}

/// Where IPVS-mode operations go: the kernel ([`NetlinkIpvs`]) or [`FakeIpvs`].
pub trait IpvsDataplane {
    /// Reads the current state (all services with their real servers and
    /// counters, `kube-ipvs0`'s addresses, our ipsets).
    fn dump(&mut self) -> Result<IpvsCurrent, IpvsSyncError>;
    /// Applies one operation.
    fn apply(&mut self, op: &IpvsOp) -> Result<(), IpvsSyncError>;
    /// Applies `ops` in order; on failure, the index of the first that
    /// failed (the ones after it may have been applied or not).
    fn apply_all(&mut self, ops: &[IpvsOp]) -> Result<(), (usize, IpvsSyncError)> {
        for (i, op) in ops.iter().enumerate() {
            self.apply(op).map_err(|e| (i, e))?;
        }
        Ok(())
    }
    /// Reads the real servers of one service with fresh connection counters.
    fn dests(&mut self, service: &IpvsService) -> Result<Vec<IpvsDestination>, IpvsSyncError>;
    /// Sets IPVS's connection timeouts (0 leaves one as it is):
    /// `ipvsadm --set TCP TCPFIN UDP`.
    fn set_timeouts(&mut self, timeouts: &IpvsTimeouts) -> Result<(), IpvsSyncError>;
    /// Reads IPVS's connection timeouts: `ipvsadm -L --timeout`.
    fn timeouts(&mut self) -> Result<IpvsTimeouts, IpvsSyncError>;
}

/// An in-memory kernel for unit tests: refuses what the kernel refuses and
/// counts what it was sent.
#[derive(Debug, Clone, Default)]
pub struct FakeIpvs {
    /// The state.
    pub state: IpvsCurrent,
    /// Every operation applied, in order.
    pub log: Vec<IpvsOp>,
    /// Number of dumps.
    pub dumps: usize,
    /// The connection timeouts (the kernel's defaults: 900, 120, 300 s).
    pub timeouts: Option<IpvsTimeouts>,
}

/// IPVS's default connection timeouts (`ipvsadm -L --timeout` on a fresh kernel).
pub const KERNEL_DEFAULT_TIMEOUTS: IpvsTimeouts = IpvsTimeouts {
    tcp: 900,
    tcp_fin: 120,
    udp: 300,
};

impl IpvsDataplane for FakeIpvs {
    fn dump(&mut self) -> Result<IpvsCurrent, IpvsSyncError> {
        self.dumps += 1;
        Ok(self.state.clone())
    }

    fn apply(&mut self, op: &IpvsOp) -> Result<(), IpvsSyncError> {
        self.state
            .apply(op)
            .map_err(|e| IpvsSyncError::ApplyFailed {
                op: op.to_string(),
                source: e.into(),
            })?;
        self.log.push(op.clone());
        Ok(())
    }

    fn dests(&mut self, service: &IpvsService) -> Result<Vec<IpvsDestination>, IpvsSyncError> {
        let key = vs_key(service).ok_or_else(|| IpvsSyncError::DumpFailed {
            what: "real servers".into(),
            source: "not a TCP/UDP/SCTP service".into(),
        })?;
        Ok(self
            .state
            .services
            .get(&key)
            .map(|v| v.dests.values().cloned().collect())
            .unwrap_or_default())
    }

    fn set_timeouts(&mut self, t: &IpvsTimeouts) -> Result<(), IpvsSyncError> {
        let mut now = self.timeouts.unwrap_or(KERNEL_DEFAULT_TIMEOUTS);
        for (cur, new) in [
            (&mut now.tcp, t.tcp),
            (&mut now.tcp_fin, t.tcp_fin),
            (&mut now.udp, t.udp),
        ] {
            if new != 0 {
                *cur = new;
            }
        }
        self.timeouts = Some(now);
        Ok(())
    }

    fn timeouts(&mut self) -> Result<IpvsTimeouts, IpvsSyncError> {
        Ok(self.timeouts.unwrap_or(KERNEL_DEFAULT_TIMEOUTS))
    }
}

impl<D: IpvsDataplane + ?Sized> IpvsDataplane for &mut D {
    fn dump(&mut self) -> Result<IpvsCurrent, IpvsSyncError> {
        (**self).dump()
    }

    fn apply(&mut self, op: &IpvsOp) -> Result<(), IpvsSyncError> {
        (**self).apply(op)
    }

    fn apply_all(&mut self, ops: &[IpvsOp]) -> Result<(), (usize, IpvsSyncError)> {
        (**self).apply_all(ops)
    }

    fn dests(&mut self, service: &IpvsService) -> Result<Vec<IpvsDestination>, IpvsSyncError> {
        (**self).dests(service)
    }

    fn set_timeouts(&mut self, timeouts: &IpvsTimeouts) -> Result<(), IpvsSyncError> {
        (**self).set_timeouts(timeouts)
    }

    fn timeouts(&mut self) -> Result<IpvsTimeouts, IpvsSyncError> {
        (**self).timeouts()
    }
}

/// The kernel: IPVS over generic netlink, ipsets over nfnetlink, `kube-ipvs0`
/// over rtnetlink.
#[derive(Debug)]
pub struct NetlinkIpvs {
    ipvs: Option<IpvsHandle>,
    ipset: IpsetHandle,
    link: LinkHandle,
    /// `kube-ipvs0`'s index as last seen (dump, create), so binding 10 000 VIPs
    /// does not cost 10 000 link look-ups. A stale index makes the address
    /// operation fail, and the next (full) sync's dump refreshes it.
    dummy_index: Option<u32>,
}

fn host_prefix(a: &IpAddr) -> u8 {
    if a.is_ipv4() { 32 } else { 128 }
}

impl NetlinkIpvs {
    /// Opens the sockets. Fails when the kernel has no IPVS.
    pub fn new() -> Result<Self, IpvsSyncError> {
        let ipvs = IpvsHandle::new().map_err(|e| IpvsSyncError::Socket {
            what: "IPVS",
            source: e.into(),
        })?;
        let mut me = Self::without_ipvs()?;
        me.ipvs = Some(ipvs);
        Ok(me)
    }

    /// Opens the ipset and rtnetlink sockets only (cleanup on a kernel without
    /// IPVS: VSs cannot exist there).
    pub fn without_ipvs() -> Result<Self, IpvsSyncError> {
        Ok(NetlinkIpvs {
            dummy_index: None,
            ipvs: None,
            ipset: IpsetHandle::new().map_err(|e| IpvsSyncError::Socket {
                what: "ipset",
                source: e.into(),
            })?,
            link: LinkHandle::new().map_err(|e| IpvsSyncError::Socket {
                what: "rtnetlink",
                source: e.into(),
            })?,
        })
    }

    fn ifindex(&mut self) -> Result<u32, BoxError> {
        if let Some(i) = self.dummy_index {
            return Ok(i);
        }
        let i = self
            .link
            .link_index(DUMMY_LINK)?
            .ok_or_else(|| format!("{DUMMY_LINK} does not exist"))?;
        self.dummy_index = Some(i);
        Ok(i)
    }

    fn ipvs(&self) -> Result<&IpvsHandle, BoxError> {
        self.ipvs
            .as_ref()
            .ok_or_else(|| "the kernel has no IPVS".into())
    }
}

impl IpvsDataplane for NetlinkIpvs {
    fn dump(&mut self) -> Result<IpvsCurrent, IpvsSyncError> {
        let failed = |what: &str, e: BoxError| IpvsSyncError::DumpFailed {
            what: what.to_string(),
            source: e,
        };
        let mut cur = IpvsCurrent::default();
        if let Some(ipvs) = &self.ipvs {
            for s in ipvs
                .list_services()
                .map_err(|e| failed("IPVS services", e.into()))?
            {
                let Some(key) = vs_key(&s) else { continue };
                let dests = ipvs
                    .list_destinations(&s)
                    .map_err(|e| failed(&format!("real servers of {key}"), e.into()))?
                    .into_iter()
                    .map(|d| ((d.addr, d.port), d))
                    .collect();
                cur.services.insert(key, CurrentVs { service: s, dests });
            }
        }
        self.dummy_index = self
            .link
            .link_index(DUMMY_LINK)
            .map_err(|e| failed(DUMMY_LINK, e.into()))?;
        if let Some(idx) = self.dummy_index {
            let addrs = self
                .link
                .list_addresses(idx)
                .map_err(|e| failed(DUMMY_LINK, e.into()))?;
            cur.dummy = Some(addrs.into_iter().map(|(a, _)| a).collect());
        }
        let existing: BTreeSet<String> = self
            .ipset
            .list_names()
            .map_err(|e| failed("ipset names", e.into()))?
            .into_iter()
            .collect();
        for name in owned_ipset_names() {
            if !existing.contains(&name) {
                continue;
            }
            let listing = self
                .ipset
                .list(&name)
                .map_err(|e| failed(&format!("ipset {name}"), e.into()))?;
            let kind = IpsetType::from_name(&listing.type_name);
            let members = match listing.members() {
                Some(Ok(m)) => m.into_iter().collect(),
                Some(Err(e)) => return Err(failed(&format!("ipset {name}"), e.into())),
                None => BTreeSet::new(),
            };
            cur.ipsets.insert(name, CurrentIpset { kind, members });
        }
        Ok(cur)
    }

    fn apply(&mut self, op: &IpvsOp) -> Result<(), IpvsSyncError> {
        let r: Result<(), BoxError> = (|| match op {
            IpvsOp::EnsureDummy => {
                self.dummy_index = None;
                let i = self.link.ensure_dummy(DUMMY_LINK).map_err(BoxError::from)?;
                self.dummy_index = Some(i);
                Ok(())
            }
            IpvsOp::DeleteDummy => {
                self.dummy_index = None;
                self.link
                    .delete_link(DUMMY_LINK)
                    .map(|_| ())
                    .map_err(BoxError::from)
            }
            IpvsOp::AddAddress(a) => {
                let idx = self.ifindex()?;
                self.link
                    .add_address(idx, *a, host_prefix(a))
                    .map(|_| ())
                    .map_err(BoxError::from)
            }
            IpvsOp::DelAddress(a) => {
                let idx = self.ifindex()?;
                self.link
                    .del_address(idx, *a, host_prefix(a))
                    .map(|_| ())
                    .map_err(BoxError::from)
            }
            IpvsOp::AddService(s) => self.ipvs()?.add_service(s).map_err(BoxError::from),
            IpvsOp::UpdateService(s) => self.ipvs()?.update_service(s).map_err(BoxError::from),
            IpvsOp::DelService(s) => self.ipvs()?.del_service(s).map_err(BoxError::from),
            IpvsOp::AddDest(s, d) => self.ipvs()?.add_destination(s, d).map_err(BoxError::from),
            IpvsOp::UpdateDest(s, d) => self
                .ipvs()?
                .update_destination(s, d)
                .map_err(BoxError::from),
            IpvsOp::DelDest(s, d) => self.ipvs()?.del_destination(s, d).map_err(BoxError::from),
            IpvsOp::CreateIpset(c) => self.ipset.create(c, false).map_err(BoxError::from),
            IpvsOp::DestroyIpset(n) => self.ipset.destroy(n).map_err(BoxError::from),
            IpvsOp::AddMembers(n, m) => self.ipset.add(n, m, true).map_err(BoxError::from),
            IpvsOp::DelMembers(n, m) => self.ipset.del(n, m, true).map_err(BoxError::from),
        })();
        r.map_err(|source| IpvsSyncError::ApplyFailed {
            op: op.to_string(),
            source,
        })
    }

    /// Runs of IPVS operations go pipelined (one round trip per window, not
    /// per operation); the rest one by one.
    fn apply_all(&mut self, ops: &[IpvsOp]) -> Result<(), (usize, IpvsSyncError)> {
        let mut i = 0;
        while i < ops.len() {
            let run: Vec<IpvsRequest<'_>> = ops[i..].iter().map_while(ipvs_request).collect();
            if run.len() < 2 {
                self.apply(&ops[i]).map_err(|e| (i, e))?;
                i += 1;
                continue;
            }
            let ipvs = self.ipvs().map_err(|source| {
                (
                    i,
                    IpvsSyncError::ApplyFailed {
                        op: ops[i].to_string(),
                        source,
                    },
                )
            })?;
            let results = ipvs.apply_pipelined(&run);
            if let Some((k, e)) = results
                .into_iter()
                .enumerate()
                .find_map(|(k, r)| r.err().map(|e| (k, e)))
            {
                return Err((
                    i + k,
                    IpvsSyncError::ApplyFailed {
                        op: ops[i + k].to_string(),
                        source: e.into(),
                    },
                ));
            }
            i += run.len();
        }
        Ok(())
    }

    fn dests(&mut self, service: &IpvsService) -> Result<Vec<IpvsDestination>, IpvsSyncError> {
        let failed = |source: BoxError| IpvsSyncError::DumpFailed {
            what: format!("real servers of {}:{}", service.addr, service.port),
            source,
        };
        self.ipvs()
            .map_err(failed)?
            .list_destinations(service)
            .map_err(|e| failed(e.into()))
    }

    fn set_timeouts(&mut self, t: &IpvsTimeouts) -> Result<(), IpvsSyncError> {
        let failed = |source: BoxError| IpvsSyncError::ApplyFailed {
            op: format!(
                "ipvsadm --set {} {} {} (IPVS_CMD_SET_CONFIG)",
                t.tcp, t.tcp_fin, t.udp
            ),
            source,
        };
        self.ipvs()
            .map_err(failed)?
            .set_timeouts(t)
            .map_err(|e| failed(e.into()))
    }

    fn timeouts(&mut self) -> Result<IpvsTimeouts, IpvsSyncError> {
        let failed = |source: BoxError| IpvsSyncError::DumpFailed {
            what: "IPVS timeouts (IPVS_CMD_GET_CONFIG)".into(),
            source,
        };
        self.ipvs()
            .map_err(failed)?
            .timeouts()
            .map_err(|e| failed(e.into()))
    }
}

/// The IPVS request of an operation that is one (the rest are ipset, link
/// and address operations).
fn ipvs_request(op: &IpvsOp) -> Option<IpvsRequest<'_>> {
    Some(match op {
        IpvsOp::AddService(s) => IpvsRequest::AddService(s),
        IpvsOp::UpdateService(s) => IpvsRequest::UpdateService(s),
        IpvsOp::DelService(s) => IpvsRequest::DelService(s),
        IpvsOp::AddDest(s, d) => IpvsRequest::AddDestination(s, d),
        IpvsOp::UpdateDest(s, d) => IpvsRequest::UpdateDestination(s, d),
        IpvsOp::DelDest(s, d) => IpvsRequest::DelDestination(s, d),
        _ => return None,
    })
}

/// What one IPVS-mode sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsOutcome {
    /// Whether the kernel was read back first.
    pub full: bool,
    /// Operation counts by kind (empty: nothing was sent).
    pub ops: BTreeMap<&'static str, usize>,
    /// Real servers still draining.
    pub draining: usize,
}

/// Keeps the committed IPVS state and turns [`IpvsDesired`] into operations.
#[derive(Debug)]
pub struct IpvsSyncer<D> {
    dataplane: D,
    committed: Option<IpvsCurrent>,
    draining: usize,
    nodeport_ips: BTreeSet<IpAddr>,
    /// `--ipvs-exclude-cidrs`, for cleanup (a sync takes the desired state's).
    exclude_cidrs: Vec<IpNet>,
}

impl<D: IpvsDataplane> IpvsSyncer<D> {
    /// Never deletes a virtual or real server in `cidrs` (`--ipvs-exclude-cidrs`),
    /// in cleanup as in syncs.
    pub fn set_exclude_cidrs(&mut self, cidrs: Vec<IpNet>) {
        self.exclude_cidrs = cidrs;
    }

    /// Sets IPVS's connection timeouts and reads them back.
    pub fn set_timeouts(&mut self, t: &IpvsTimeouts) -> Result<IpvsTimeouts, IpvsSyncError> {
        self.dataplane.set_timeouts(t)?;
        self.dataplane.timeouts()
    }

    /// A syncer whose first sync reads the kernel back.
    pub fn new(dataplane: D) -> Self {
        IpvsSyncer {
            dataplane,
            committed: None,
            draining: 0,
            nodeport_ips: BTreeSet::new(),
            exclude_cidrs: Vec::new(),
        }
    }

    /// The dataplane.
    pub fn dataplane(&self) -> &D {
        &self.dataplane
    }

    /// Makes the next sync read the kernel back.
    pub fn request_full_sync(&mut self) {
        self.committed = None;
    }

    /// Whether real servers are draining: the daemon should sync again soon
    /// (every few seconds) so they are deleted once their connections are gone.
    pub fn pending_graceful(&self) -> bool {
        self.draining > 0
    }

    /// The operations a sync would send now (reads the kernel back if needed).
    pub fn plan(&mut self, desired: &IpvsDesired) -> Result<IpvsPlan, IpvsSyncError> {
        self.plan_scoped(desired, None)
    }

    /// [`plan`](Self::plan) looking only at `touched` when the kernel is known
    /// to hold the last sync's state (a read-back looks at everything).
    pub fn plan_scoped(
        &mut self,
        desired: &IpvsDesired,
        touched: Option<&IpvsTouched>,
    ) -> Result<IpvsPlan, IpvsSyncError> {
        // Draining real servers need fresh connection counters.
        let mut scope = touched;
        if self.committed.is_none() || self.draining > 0 {
            self.committed = Some(self.dataplane.dump()?);
            scope = None;
        }
        self.nodeport_ips
            .extend(desired.nodeport_ips.iter().copied());
        let current = self.committed.as_mut().expect("dumped above");
        let plan = diff_ipvs_scoped(current, desired, &self.nodeport_ips, scope);
        // Deciding between drain and delete needs fresh connection counters: our
        // model of the kernel does not see connections come and go.
        let mut refreshed = false;
        for op in &plan.ops {
            let IpvsOp::DelDest(s, _) = op else { continue };
            if s.protocol != IpvsProtocol::Tcp {
                continue;
            }
            let Some(vs) = vs_key(s).and_then(|k| current.services.get_mut(&k)) else {
                continue;
            };
            vs.dests = self
                .dataplane
                .dests(s)?
                .into_iter()
                .map(|d| ((d.addr, d.port), d))
                .collect();
            refreshed = true;
        }
        if !refreshed {
            return Ok(plan);
        }
        Ok(diff_ipvs_scoped(
            current,
            desired,
            &self.nodeport_ips,
            scope,
        ))
    }

    /// Brings IPVS, `kube-ipvs0` and the ipsets to `desired`. On a failed
    /// operation the next sync reads the kernel back.
    pub fn sync(&mut self, desired: &IpvsDesired) -> Result<IpvsOutcome, IpvsSyncError> {
        self.sync_scoped(desired, None)
    }

    /// [`sync`](Self::sync) looking only at `touched` (see
    /// [`plan_scoped`](Self::plan_scoped)).
    pub fn sync_scoped(
        &mut self,
        desired: &IpvsDesired,
        touched: Option<&IpvsTouched>,
    ) -> Result<IpvsOutcome, IpvsSyncError> {
        let full = self.committed.is_none() || self.draining > 0;
        let plan = self.plan_scoped(desired, touched)?;
        let mut counts = BTreeMap::new();
        let mut state = self.committed.take().expect("set by plan");
        if let Err((_, e)) = self.dataplane.apply_all(&plan.ops) {
            // Which of the later operations went through is unknown: the next
            // sync reads the kernel back.
            return Err(e);
        }
        for op in &plan.ops {
            // Keep our model of the kernel in step (it cannot refuse what the
            // kernel accepted).
            let _ = state.apply(op);
            *counts.entry(op.kind()).or_insert(0) += 1;
        }
        self.committed = Some(state);
        // A scoped diff only follows a sync that left nothing draining (one
        // that did makes the next sync read everything back).
        self.draining = plan.draining;
        // After a full sync the nodeport addresses in use are exactly the desired.
        if full {
            self.nodeport_ips = desired.nodeport_ips.clone();
        }
        Ok(IpvsOutcome {
            full,
            ops: counts,
            draining: plan.draining,
        })
    }

    /// Deletes everything the mode owns: our VSs, `kube-ipvs0`, the KUBE-* ipsets.
    /// A foreign VS stays. Returns the number of operations.
    pub fn cleanup(&mut self, nodeport_ips: &BTreeSet<IpAddr>) -> Result<usize, IpvsSyncError> {
        let current = self.dataplane.dump()?;
        let mut known = self.nodeport_ips.clone();
        known.extend(nodeport_ips.iter().copied());
        let ops = cleanup_ops(&current, &known, &self.exclude_cidrs);
        for op in &ops {
            self.dataplane.apply(op)?;
        }
        self.committed = None;
        self.draining = 0;
        Ok(ops.len())
    }
}

/// The sysctls IPVS mode needs (upstream's `NewProxier`), as /proc/sys writes.
pub fn ipvs_sysctls(strict_arp: bool) -> Vec<SysctlWrite> {
    let w = |path: &str, value: &str| SysctlWrite {
        path: format!("/proc/sys/{path}"),
        value: value.to_string(),
    };
    let mut out = vec![
        w("net/ipv4/vs/conntrack", "1"),
        w("net/ipv4/vs/conn_reuse_mode", "0"),
        w("net/ipv4/vs/expire_nodest_conn", "1"),
        w("net/ipv4/vs/expire_quiescent_template", "1"),
        w("net/ipv4/ip_forward", "1"),
    ];
    if strict_arp {
        out.push(w("net/ipv4/conf/all/arp_ignore", "1"));
        out.push(w("net/ipv4/conf/all/arp_announce", "2"));
    }
    out
}

/// Writes [`ipvs_sysctls`]; a refused write is a warning.
pub fn apply_ipvs_sysctls(strict_arp: bool) {
    for w in ipvs_sysctls(strict_arp) {
        match write_sysctl(&w) {
            Ok(_) => {}
            Err(e) => tracing::warn!("cannot set {} = {}: {e}", w.path, w.value),
        }
    }
}

pub mod explain;
pub mod templates;

#[cfg(test)]
mod tests;
