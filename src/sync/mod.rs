//! Diff + apply. `diff` is pure; `Syncer::sync` is the only step that talks to the
//! kernel, through the [`Dataplane`] trait that netlink and [`FakeKernel`] implement.
//!
//! Between syncs the last committed state is trusted, so a sync costs what changed.
//! A failed transaction, start-up and the periodic resync read the kernel back
//! (a full sync); a no-op sync sends nothing.

pub mod conntrack;
pub mod diff;
pub mod fake;
pub mod ipvs;
pub mod runner;

use std::collections::BTreeMap;

use kube_nlproxy_netlink::nft::{Family, NftSocket, Op};

use crate::mode::nftables::{TABLE, TableDelta, TableSpec};
pub use diff::{Current, TableSnapshot, delta_ops, diff, op_counts};
pub use fake::FakeKernel;

/// Errors of a sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Reading our tables back failed.
    #[error("reading table {family} {TABLE} back from the kernel failed: {source}")]
    DumpFailed {
        /// `ip` / `ip6`
        family: &'static str,
        /// cause
        #[source]
        source: kube_nlproxy_netlink::nft::NftError,
    },
    /// The kernel rejected the transaction; nothing of it was applied.
    #[error("nf_tables transaction rejected: {0}")]
    Apply(String),
    /// Opening the netlink socket failed.
    #[error("opening the nf_tables netlink socket failed: {0}")]
    Socket(#[source] kube_nlproxy_netlink::nft::NftError),
}

/// Where transactions go: the kernel over netlink, or [`FakeKernel`].
pub trait Dataplane {
    /// Reads one of our tables back (`None`: it does not exist).
    fn dump(&mut self, family: Family, table: &str) -> Result<Option<TableSnapshot>, SyncError>;
    /// Applies `ops` atomically.
    fn apply(&mut self, ops: &[Op]) -> Result<(), SyncError>;
}

/// The kernel, over one NETLINK_NETFILTER socket.
#[derive(Debug)]
pub struct NetlinkDataplane {
    socket: NftSocket,
}

impl NetlinkDataplane {
    /// Opens the socket.
    pub fn new() -> Result<Self, SyncError> {
        Ok(NetlinkDataplane {
            socket: NftSocket::new().map_err(SyncError::Socket)?,
        })
    }

    /// Netlink messages sent so far.
    pub fn messages_sent(&self) -> u64 {
        self.socket.messages_sent()
    }
}

impl Dataplane for NetlinkDataplane {
    fn dump(&mut self, family: Family, table: &str) -> Result<Option<TableSnapshot>, SyncError> {
        self.socket
            .dump_table(family, table)
            .map(|t| t.map(TableSnapshot::from_kernel))
            .map_err(|source| SyncError::DumpFailed {
                family: family.nft_name(),
                source,
            })
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), SyncError> {
        self.socket
            .apply(ops)
            .map_err(|e| SyncError::Apply(e.to_string()))
    }
}

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Whether the kernel was read back first.
    pub full: bool,
    /// Operation counts by kind (empty: nothing was sent).
    pub ops: BTreeMap<&'static str, usize>,
}

/// What we know the kernel holds for one family.
#[derive(Debug, Clone)]
enum Committed {
    /// Read back: `None` when the table does not exist.
    Dumped(Option<TableSnapshot>),
    /// Our last successful transaction.
    Ours(TableSpec),
}

/// Keeps the committed state and turns desired tables into transactions.
#[derive(Debug)]
pub struct Syncer<D> {
    dataplane: D,
    committed: BTreeMap<Family, Committed>,
    need_full: bool,
}

impl<D: Dataplane> Syncer<D> {
    /// A syncer whose first sync reads the kernel back.
    pub fn new(dataplane: D) -> Self {
        Syncer {
            dataplane,
            committed: BTreeMap::new(),
            need_full: true,
        }
    }

    /// The dataplane.
    pub fn dataplane(&self) -> &D {
        &self.dataplane
    }

    /// Makes the next sync read the kernel back (periodic resync, drift repair).
    pub fn request_full_sync(&mut self) {
        self.need_full = true;
    }

    /// The operations a sync would send now (reads the kernel back if needed).
    pub fn plan(&mut self, desired: &[TableSpec]) -> Result<Vec<Op>, SyncError> {
        for t in desired {
            // After an incremental sync nothing is remembered here: read back.
            if self.need_full || !self.committed.contains_key(&t.family) {
                let current = self.dataplane.dump(t.family, TABLE)?;
                self.committed.insert(t.family, Committed::Dumped(current));
            }
        }
        self.need_full = false;
        Ok(desired
            .iter()
            .flat_map(|t| {
                let current = match self.committed.get(&t.family) {
                    Some(Committed::Ours(spec)) => Some(Current::Committed(spec)),
                    Some(Committed::Dumped(Some(snapshot))) => Some(Current::Dumped(snapshot)),
                    Some(Committed::Dumped(None)) | None => None,
                };
                diff(current, t)
            })
            .collect())
    }

    /// Brings the kernel to `desired` in one transaction.
    pub fn sync(&mut self, desired: &[TableSpec]) -> Result<SyncOutcome, SyncError> {
        self.sync_owned(desired.to_vec())
    }

    /// [`sync`](Self::sync) taking the tables by value: they become the committed
    /// state without a copy, and a sync that finds the kernel already matching
    /// (after a read-back) also remembers them, so the next diff is structural.
    pub fn sync_owned(&mut self, desired: Vec<TableSpec>) -> Result<SyncOutcome, SyncError> {
        let full = self.need_full;
        let ops = self.plan(&desired)?;
        if !ops.is_empty()
            && let Err(e) = self.dataplane.apply(&ops)
        {
            self.need_full = true;
            return Err(e);
        }
        for t in desired {
            self.committed.insert(t.family, Committed::Ours(t));
        }
        Ok(SyncOutcome {
            full,
            ops: op_counts(&ops),
        })
    }

    /// Brings the kernel to a renderer's desired state: sends `deltas` (what the
    /// renderer's last update changed) when the kernel is known to hold the
    /// renderer's previous state, otherwise reads the kernel back and diffs it
    /// against `desired()` (start-up, after a failure, periodic resync). One
    /// transaction either way; a failed one makes the next sync a full one.
    pub fn sync_incremental(
        &mut self,
        deltas: &[TableDelta],
        desired: impl FnOnce() -> Vec<TableSpec>,
    ) -> Result<SyncOutcome, SyncError> {
        let full = self.need_full;
        let ops = if full {
            let tables = desired();
            let mut ops = Vec::new();
            for t in &tables {
                let current = self.dataplane.dump(t.family, TABLE)?;
                ops.extend(diff(current.as_ref().map(Current::Dumped), t));
            }
            ops
        } else {
            deltas.iter().flat_map(delta_ops).collect()
        };
        // The renderer holds the desired state; nothing needs remembering here.
        self.committed.clear();
        if !ops.is_empty()
            && let Err(e) = self.dataplane.apply(&ops)
        {
            self.need_full = true;
            return Err(e);
        }
        self.need_full = false;
        Ok(SyncOutcome {
            full,
            ops: op_counts(&ops),
        })
    }

    /// Reads the kernel back and says which tables differ from `desired`.
    pub fn verify(&mut self, desired: &[TableSpec]) -> Result<Vec<String>, SyncError> {
        let mut differing = Vec::new();
        for t in desired {
            let current = self.dataplane.dump(t.family, TABLE)?;
            let want = TableSnapshot::from_spec(t);
            if current.as_ref() != Some(&want) {
                let detail = match &current {
                    None => "missing".to_string(),
                    Some(cur) => describe_difference(cur, &want),
                };
                differing.push(format!("{} {TABLE}: {detail}", t.family.nft_name()));
            }
        }
        Ok(differing)
    }

    /// Deletes our tables (the only objects we own in this mode).
    pub fn cleanup(&mut self) -> Result<usize, SyncError> {
        let mut ops = Vec::new();
        for family in [Family::Ipv4, Family::Ipv6] {
            if self.dataplane.dump(family, TABLE)?.is_some() {
                ops.push(Op::DeleteTable {
                    family,
                    name: TABLE.to_string(),
                });
            }
        }
        if !ops.is_empty() {
            self.dataplane.apply(&ops)?;
        }
        self.committed.clear();
        self.need_full = true;
        Ok(ops.len())
    }
}

fn describe_difference(cur: &TableSnapshot, want: &TableSnapshot) -> String {
    let mut out = Vec::new();
    for (name, c) in &want.chains {
        match cur.chains.get(name) {
            None => out.push(format!("chain {name} missing")),
            Some(k) if k != c => out.push(format!("chain {name} differs")),
            _ => {}
        }
    }
    for name in cur.chains.keys().filter(|n| !want.chains.contains_key(*n)) {
        out.push(format!("extra chain {name}"));
    }
    for (name, s) in &want.sets {
        match cur.sets.get(name) {
            None => out.push(format!("set {name} missing")),
            Some(k) if k.set != s.set => out.push(format!("set {name} definition differs")),
            Some(k) if k.elements != s.elements => out.push(format!(
                "set {name}: {} elements missing, {} extra",
                s.elements.difference(&k.elements).count(),
                k.elements.difference(&s.elements).count()
            )),
            _ => {}
        }
    }
    out.truncate(10);
    out.join("; ")
}

#[cfg(test)]
mod tests;

impl<D: Dataplane + ?Sized> Dataplane for &mut D {
    fn dump(&mut self, family: Family, table: &str) -> Result<Option<TableSnapshot>, SyncError> {
        (**self).dump(family, table)
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), SyncError> {
        (**self).apply(ops)
    }
}
