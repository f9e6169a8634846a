//! What the node contributes to a sync — its name, its addresses, sysctls,
//! conntrack — behind one trait. [`KernelHost`] is the only place the driver
//! does host I/O; [`FakeHost`] stands in for it in unit tests.

use std::net::IpAddr;

use kube_nlproxy_netlink::addr::{AddrError, InterfaceAddress};
use kube_nlproxy_netlink::conntrack::{ConntrackError, ConntrackHandle, CtTuple};

use crate::config::host::{ConntrackSettings, SysctlWrite, apply_conntrack, write_sysctl};

/// Host I/O that failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Listing the node's addresses over rtnetlink failed.
    #[error("listing local addresses failed")]
    Addresses(#[source] AddrError),
    /// Opening or using the ctnetlink socket failed.
    #[error("conntrack: {what} failed")]
    Conntrack {
        /// what was tried
        what: &'static str,
        /// cause
        #[source]
        source: ConntrackError,
    },
}

/// Original and reply tuple of one conntrack entry.
pub type FlowTuples<'a> = (&'a CtTuple, &'a CtTuple);

/// The node, as the driver sees it.
pub trait Host {
    /// The kernel's host name, lower case (the node name without
    /// `--hostname-override`).
    fn hostname(&self) -> String;
    /// Every address on the node's interfaces.
    fn local_addresses(&mut self) -> Result<Vec<InterfaceAddress>, HostError>;
    /// Writes sysctls; one that cannot be written is a warning, not an error
    /// (kube-proxy does the same: a read-only /proc/sys must not stop a proxy).
    fn write_sysctls(&mut self, writes: &[SysctlWrite]);
    /// Sets the conntrack sysctls of the `conntrack` block.
    fn apply_conntrack_settings(&mut self, settings: &ConntrackSettings);
    /// Deletes the conntrack entries of one family that `stale` picks; returns
    /// how many went.
    fn delete_conntrack(
        &mut self,
        ipv6: bool,
        stale: &dyn Fn(FlowTuples<'_>) -> bool,
    ) -> Result<usize, HostError>;
}

/// The real node: procfs, rtnetlink, ctnetlink (its socket opened on first use).
#[derive(Debug, Default)]
pub struct KernelHost {
    conntrack: Option<ConntrackHandle>,
}

impl KernelHost {
    /// A host whose sockets open when first needed.
    pub fn new() -> Self {
        KernelHost::default()
    }

    fn conntrack(&mut self) -> Result<&ConntrackHandle, HostError> {
        if self.conntrack.is_none() {
            let handle = ConntrackHandle::new().map_err(|source| HostError::Conntrack {
                what: "opening the socket",
                source,
            })?;
            self.conntrack = Some(handle);
        }
        Ok(self.conntrack.as_ref().expect("opened above"))
    }
}

impl Host for KernelHost {
    fn hostname(&self) -> String {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_lowercase())
            .unwrap_or_default()
    }

    fn local_addresses(&mut self) -> Result<Vec<InterfaceAddress>, HostError> {
        kube_nlproxy_netlink::addr::list_addresses().map_err(HostError::Addresses)
    }

    fn write_sysctls(&mut self, writes: &[SysctlWrite]) {
        for w in writes {
            if let Err(e) = write_sysctl(w) {
                tracing::warn!("cannot set {} = {}: {e}", w.path, w.value);
            }
        }
    }

    fn apply_conntrack_settings(&mut self, settings: &ConntrackSettings) {
        apply_conntrack(settings);
    }

    fn delete_conntrack(
        &mut self,
        ipv6: bool,
        stale: &dyn Fn(FlowTuples<'_>) -> bool,
    ) -> Result<usize, HostError> {
        self.conntrack()?
            .delete_matching(ipv6, |e| stale((&e.orig, &e.reply)))
            .map_err(|source| HostError::Conntrack {
                what: "deleting entries",
                source,
            })
    }
}

/// A node in memory: fixed addresses, a conntrack table of tuples, a record of
/// the sysctls written.
#[derive(Debug, Clone, Default)]
pub struct FakeHost {
    /// What [`Host::hostname`] returns.
    pub hostname: String,
    /// What [`Host::local_addresses`] returns.
    pub addresses: Vec<InterfaceAddress>,
    /// How many times the addresses were listed.
    pub address_listings: usize,
    /// Every sysctl written, in order.
    pub sysctls: Vec<SysctlWrite>,
    /// Conntrack settings applied.
    pub conntrack_settings: Vec<ConntrackSettings>,
    /// Conntrack entries (original, reply) of both families.
    pub flows: Vec<(CtTuple, CtTuple)>,
    /// Entries deleted so far.
    pub flows_deleted: usize,
}

impl FakeHost {
    /// A host named `hostname` with addresses `addrs` on `eth0`.
    pub fn new(hostname: &str, addrs: &[IpAddr]) -> Self {
        FakeHost {
            hostname: hostname.to_string(),
            addresses: addrs
                .iter()
                .map(|a| InterfaceAddress {
                    ifname: "eth0".into(),
                    ifindex: 2,
                    addr: *a,
                    prefix_len: if a.is_ipv4() { 24 } else { 64 },
                })
                .collect(),
            ..FakeHost::default()
        }
    }
}

impl Host for FakeHost {
    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    fn local_addresses(&mut self) -> Result<Vec<InterfaceAddress>, HostError> {
        self.address_listings += 1;
        Ok(self.addresses.clone())
    }

    fn write_sysctls(&mut self, writes: &[SysctlWrite]) {
        self.sysctls.extend(writes.iter().cloned());
    }

    fn apply_conntrack_settings(&mut self, settings: &ConntrackSettings) {
        self.conntrack_settings.push(settings.clone());
    }

    fn delete_conntrack(
        &mut self,
        ipv6: bool,
        stale: &dyn Fn(FlowTuples<'_>) -> bool,
    ) -> Result<usize, HostError> {
        let before = self.flows.len();
        self.flows
            .retain(|(orig, reply)| orig.src.is_ipv6() != ipv6 || !stale((orig, reply)));
        let n = before - self.flows.len();
        self.flows_deleted += n;
        Ok(n)
    }
}
