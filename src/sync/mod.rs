//! Diff + apply. `diff` is pure; `Syncer::sync` is the only step that talks to the
//! kernel, through the [`Dataplane`] trait that netlink and [`FakeKernel`] implement.
//!
//! Between syncs the last committed state is trusted, so a sync costs what changed.
//! A failed transaction and start-up read the kernel back (a full sync); so
//! does the periodic resync, unless nothing has committed since our last sync
//! and looking our elements up finds them all. A no-op sync sends nothing.

pub mod conntrack;
pub mod diff;
pub mod explain;
pub mod fake;
pub mod ipvs;
pub mod kube_proxy;
pub mod runner;

use std::collections::{BTreeMap, HashMap};

use kube_nlproxy_netlink::nft::{Element, Family, KeyValue, NftSocket, Op, Set};

use crate::mode::nftables::{
    AffinityEntry, NftablesRenderer, RenderedTable, SetId, TABLE, TableDelta, TableSpec,
};
pub use diff::{Current, SetSnapshot, TableSnapshot, delta_ops, diff, op_counts};
pub use fake::{FakeKernel, Fault, FaultPoint};

/// Errors of a sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Reading our tables back failed.
    #[error("reading table {family} {TABLE} back from the kernel failed")]
    DumpFailed {
        /// `ip` / `ip6`
        family: &'static str,
        /// cause
        #[source]
        source: kube_nlproxy_netlink::nft::NftError,
    },
    /// The kernel rejected the transaction; nothing of it was applied.
    #[error("nf_tables transaction failed")]
    Apply(#[source] kube_nlproxy_netlink::nft::NftError),
    /// Opening the netlink socket failed.
    #[error("opening the nf_tables netlink socket failed")]
    Socket(#[source] kube_nlproxy_netlink::nft::NftError),
}

/// Where transactions go: the kernel over netlink, or [`FakeKernel`].
pub trait Dataplane {
    /// Reads one of our tables back (`None`: it does not exist).
    fn dump(&mut self, family: Family, table: &str) -> Result<Option<TableSnapshot>, SyncError>;
    /// Applies `ops` atomically.
    fn apply(&mut self, ops: &[Op]) -> Result<(), SyncError>;
    /// The elements of one of our sets, including those packets added (`None`:
    /// no such set).
    fn dump_set_elements(
        &mut self,
        family: Family,
        set: &Set,
    ) -> Result<Option<Vec<Element>>, SyncError>;
    /// Netlink messages sent so far (a fake counts its requests).
    fn messages_sent(&self) -> u64;
    /// The ruleset generation: it moves with every commit in the namespace,
    /// ours or anyone's (one tiny request).
    fn generation(&mut self) -> Result<u32, SyncError>;
    /// One of our tables without its sets' elements (`None`: it does not
    /// exist): a constant number of requests.
    fn dump_skeleton(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<TableSnapshot>, SyncError>;
    /// Looks `elements` up in one of our sets one by one: the index of the
    /// first it does not hold exactly as given, `None` when it holds them all
    /// (see [`NftSocket::find_unheld_element`]). Linear in `elements`
    /// whatever the set's size; blind to elements besides them.
    fn find_unheld_element(
        &mut self,
        family: Family,
        set: &Set,
        elements: &[&Element],
    ) -> Result<Option<usize>, SyncError>;
    /// [`find_unheld_element`](Self::find_unheld_element) for several sets of
    /// one family, in the order given. The default asks one set after another;
    /// the kernel answers lookups side by side, so [`NetlinkDataplane`] asks
    /// from two sockets at once when there is much to look up.
    fn find_unheld_elements(
        &mut self,
        family: Family,
        lookups: &[(&Set, Vec<&Element>)],
    ) -> Result<Vec<Option<usize>>, SyncError> {
        lookups
            .iter()
            .map(|(set, elements)| self.find_unheld_element(family, set, elements))
            .collect()
    }
}

/// The kernel, over one NETLINK_NETFILTER socket (and a second one, opened
/// when first needed, for lookups side by side).
#[derive(Debug)]
pub struct NetlinkDataplane {
    socket: NftSocket,
    second: Option<NftSocket>,
}

impl NetlinkDataplane {
    /// Opens the socket.
    pub fn new() -> Result<Self, SyncError> {
        Ok(NetlinkDataplane {
            socket: NftSocket::new().map_err(SyncError::Socket)?,
            second: None,
        })
    }
}

/// Lookups of at least this many elements in all are split between two
/// sockets on two threads (below it a thread costs more than it saves).
const PARALLEL_LOOKUP_FROM: usize = 20_000;

/// The lookups `which` (indices into `lookups`) on `socket`, one after another.
fn look_up_on(
    socket: &mut NftSocket,
    family: Family,
    lookups: &[(&Set, Vec<&Element>)],
    which: &[usize],
) -> Result<Vec<(usize, Option<usize>)>, SyncError> {
    which
        .iter()
        .map(|&i| {
            let (set, elements) = &lookups[i];
            socket
                .find_unheld_element(family, TABLE, set, elements)
                .map(|unheld| (i, unheld))
                .map_err(|source| SyncError::DumpFailed {
                    family: family.nft_name(),
                    source,
                })
        })
        .collect()
}

impl NetlinkDataplane {
    /// The socket (e.g. for the statistics of its last batch).
    pub fn socket(&self) -> &NftSocket {
        &self.socket
    }

    /// The socket, mutably: tests make the kernel fail through it
    /// ([`NftSocket::inject_fault`]) under a real syncer.
    pub fn socket_mut(&mut self) -> &mut NftSocket {
        &mut self.socket
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
        self.socket.apply(ops).map_err(SyncError::Apply)
    }

    fn dump_set_elements(
        &mut self,
        family: Family,
        set: &Set,
    ) -> Result<Option<Vec<Element>>, SyncError> {
        self.socket
            .dump_set_elements(family, TABLE, set)
            .map_err(|source| SyncError::DumpFailed {
                family: family.nft_name(),
                source,
            })
    }

    fn messages_sent(&self) -> u64 {
        self.socket.messages_sent()
    }

    fn generation(&mut self) -> Result<u32, SyncError> {
        self.socket
            .generation()
            .map_err(|source| SyncError::DumpFailed {
                family: "any",
                source,
            })
    }

    fn dump_skeleton(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<TableSnapshot>, SyncError> {
        self.socket
            .dump_table_skeleton(family, table)
            .map(|t| t.map(TableSnapshot::from_kernel))
            .map_err(|source| SyncError::DumpFailed {
                family: family.nft_name(),
                source,
            })
    }

    fn find_unheld_element(
        &mut self,
        family: Family,
        set: &Set,
        elements: &[&Element],
    ) -> Result<Option<usize>, SyncError> {
        self.socket
            .find_unheld_element(family, TABLE, set, elements)
            .map_err(|source| SyncError::DumpFailed {
                family: family.nft_name(),
                source,
            })
    }

    /// Two halves by element count (the biggest sets first, each to the
    /// lighter half), one on each socket. The second socket is opened on this
    /// thread, so it is in the same network namespace as the first. Lookups
    /// run under RCU in the kernel, so the halves do not wait for each other.
    fn find_unheld_elements(
        &mut self,
        family: Family,
        lookups: &[(&Set, Vec<&Element>)],
    ) -> Result<Vec<Option<usize>>, SyncError> {
        let all: Vec<usize> = (0..lookups.len()).collect();
        let on_one_socket = |socket: &mut NftSocket| -> Result<Vec<Option<usize>>, SyncError> {
            Ok(look_up_on(socket, family, lookups, &all)?
                .into_iter()
                .map(|(_, unheld)| unheld)
                .collect())
        };
        let total: usize = lookups.iter().map(|(_, e)| e.len()).sum();
        if lookups.len() < 2 || total < PARALLEL_LOOKUP_FROM {
            return on_one_socket(&mut self.socket);
        }
        let mut by_size = all.clone();
        by_size.sort_by_key(|&i| std::cmp::Reverse(lookups[i].1.len()));
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        let (mut my_load, mut their_load) = (0, 0);
        for i in by_size {
            if my_load <= their_load {
                my_load += lookups[i].1.len();
                mine.push(i);
            } else {
                their_load += lookups[i].1.len();
                theirs.push(i);
            }
        }
        let mut second = match self.second.take().map_or_else(NftSocket::new, Ok) {
            Ok(second) => second,
            // No second socket to be had (say, out of descriptors): all of it
            // on the one.
            Err(e) => {
                tracing::debug!("lookups on one socket: opening a second failed: {e}");
                return on_one_socket(&mut self.socket);
            }
        };
        let socket = &mut self.socket;
        let (my_answers, their_answers) = std::thread::scope(|scope| {
            let helper = std::thread::Builder::new()
                .name("nft-lookup".into())
                .spawn_scoped(scope, || look_up_on(&mut second, family, lookups, &theirs));
            match helper {
                Ok(helper) => {
                    let mine = look_up_on(socket, family, lookups, &mine);
                    let theirs = helper
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    (mine, theirs)
                }
                // No thread to be had: all of it here, one after another.
                Err(_) => (look_up_on(socket, family, lookups, &all), Ok(Vec::new())),
            }
        });
        self.second = Some(second);
        let mut unheld = vec![None; lookups.len()];
        for (i, answer) in my_answers?.into_iter().chain(their_answers?) {
            unheld[i] = answer;
        }
        Ok(unheld)
    }
}

/// At most this many elements go in one transaction of a cold start: the
/// kernel's commit time grows with the elements it validates, and one huge
/// transaction stalls it (upstream sees soft lockups, kubernetes#139328).
/// Each transaction is built only as it is sent, so this also bounds the
/// start's transient memory (5 000 rather than 10 000: 1.5 MiB less at the
/// peak of 10k services).
pub const COLD_START_BATCH_ELEMENTS: usize = 5_000;

/// The Service an element's comment names (`ns/name` of `ns/name` or
/// `ns/name:port`); node-wide elements' comments (no `/`) name none.
pub fn service_of_comment(comment: &str) -> Option<&str> {
    let service = comment.split(':').next()?;
    service.contains('/').then_some(service)
}

/// Splits a sync into transactions of at most `limit` elements when it must add
/// more — only when our table does not exist yet (start on a fresh node, or the
/// table was deleted), as every other sync is one transaction. The first
/// transaction holds everything but the services' elements: tables, chains,
/// sets, rules, node-wide elements, and whatever changes an existing table.
/// Each next one adds whole services: every element that names the same
/// service (its comment, `ns/name` or `ns/name:port`) goes in the same
/// transaction, so a new connection finds a service either complete or not
/// there at all. A service bigger than `limit` gets a transaction of its own.
pub fn cold_start_batches(ops: Vec<Op>, limit: usize) -> Vec<Vec<Op>> {
    let total: usize = ops
        .iter()
        .map(|op| match op {
            Op::AddElements { elements, .. } => elements.len(),
            _ => 0,
        })
        .sum();
    if total <= limit {
        return vec![ops];
    }
    let mut first = Vec::new();
    // Sets by the index of their op's name in `sets`: an element costs no copy
    // of its set's name and no string comparison on the way.
    let mut sets: Vec<String> = Vec::new();
    let mut by_service: BTreeMap<String, ServiceElements<usize>> = BTreeMap::new();
    for op in ops {
        let Op::AddElements {
            family,
            table,
            set,
            elements,
        } = op
        else {
            first.push(op);
            continue;
        };
        let set_index = sets.len();
        let mut unnamed = Vec::new();
        for e in elements {
            let comment = e.comment.clone();
            match comment.as_deref().and_then(service_of_comment) {
                Some(service) => {
                    let entry = (family, set_index, e);
                    match by_service.get_mut(service) {
                        Some(elements) => elements.push(entry),
                        None => {
                            by_service.insert(service.to_string(), vec![entry]);
                        }
                    }
                }
                None => unnamed.push(e),
            }
        }
        if !unnamed.is_empty() {
            first.push(Op::AddElements {
                family,
                table,
                set: set.clone(),
                elements: unnamed,
            });
        }
        sets.push(set);
    }
    cold_start_transactions(
        first,
        by_service.into_values(),
        total,
        limit,
        |&i: &usize| sets[i].clone(),
    )
    .collect()
}

/// One Service's elements, each with its family and set (`S`: the set's name,
/// or anything that [`cold_start_transactions`] can name it from).
pub type ServiceElements<S = String> = Vec<(Family, S, Element)>;

/// The transactions of a cold start, built one at a time as they are taken, so
/// a cold start never holds a copy of every element: `first` (tables, chains,
/// sets, rules, node-wide elements) alone, then `services` (`total` elements in
/// all), whole Services, at most `limit` elements per transaction (a bigger
/// Service gets one of its own). When `total` fits in `limit`, everything is one
/// transaction. `set_name` names a set once per transaction, not per element.
pub fn cold_start_transactions<S: Ord>(
    first: Vec<Op>,
    services: impl Iterator<Item = ServiceElements<S>>,
    total: usize,
    limit: usize,
    set_name: impl Fn(&S) -> String,
) -> impl Iterator<Item = Vec<Op>> {
    let together = total <= limit;
    let mut first = Some(first);
    let mut services = services.peekable();
    std::iter::from_fn(move || {
        let mut ops = match first.take() {
            Some(first) if !together => return Some(first),
            Some(first) => first,
            None => Vec::new(),
        };
        let mut per_set: BTreeMap<(Family, S), Vec<Element>> = BTreeMap::new();
        let mut size = 0;
        while let Some(service) =
            services.next_if(|s| together || size == 0 || size + s.len() <= limit)
        {
            size += service.len();
            for (family, set, element) in service {
                per_set.entry((family, set)).or_default().push(element);
            }
        }
        if ops.is_empty() && per_set.is_empty() {
            return None;
        }
        ops.extend(
            per_set
                .into_iter()
                .map(|((family, set), elements)| Op::AddElements {
                    family,
                    table: TABLE.to_string(),
                    set: set_name(&set),
                    elements,
                }),
        );
        Some(ops)
    })
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
    /// The ruleset generation right after our last sync.
    generation: Option<u32>,
}

impl<D: Dataplane> Syncer<D> {
    /// A syncer whose first sync reads the kernel back.
    pub fn new(dataplane: D) -> Self {
        Syncer {
            dataplane,
            committed: BTreeMap::new(),
            need_full: true,
            generation: None,
        }
    }

    /// The dataplane.
    pub fn dataplane(&self) -> &D {
        &self.dataplane
    }

    /// The dataplane, mutably.
    pub fn dataplane_mut(&mut self) -> &mut D {
        &mut self.dataplane
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
        let counts = if full {
            let tables = desired();
            let (mut warm, mut cold) = (Vec::new(), Vec::new());
            for t in &tables {
                let current = self.dataplane.dump(t.family, TABLE)?;
                let ops = diff(current.as_ref().map(Current::Dumped), t);
                match current {
                    Some(_) => warm.extend(ops),
                    None => cold.extend(ops),
                }
            }
            warm.extend(cold);
            self.send(cold_start_batches(warm, COLD_START_BATCH_ELEMENTS))?
        } else {
            self.send([deltas.iter().flat_map(delta_ops).collect()])?
        };
        Ok(self.synced(full, counts, deltas))
    }

    /// Sends `transactions` in order; a failed one makes the next sync a full
    /// one. Returns the operation counts of all of them.
    fn send(
        &mut self,
        transactions: impl IntoIterator<Item = Vec<Op>>,
    ) -> Result<BTreeMap<&'static str, usize>, SyncError> {
        // The renderer holds the desired state; nothing needs remembering here.
        self.committed.clear();
        let mut counts = BTreeMap::new();
        for ops in transactions.into_iter().filter(|ops| !ops.is_empty()) {
            if let Err(e) = self.dataplane.apply(&ops) {
                self.need_full = true;
                return Err(e);
            }
            for (kind, n) in op_counts(&ops) {
                *counts.entry(kind).or_insert(0) += n;
            }
        }
        Ok(counts)
    }

    /// After a successful sync: the generation our state is at, and the clients'
    /// affinity entries that `deltas` made stale.
    fn synced(
        &mut self,
        full: bool,
        mut counts: BTreeMap<&'static str, usize>,
        deltas: &[TableDelta],
    ) -> SyncOutcome {
        self.need_full = false;
        // A sync that sent nothing leaves the generation where it was: one
        // request less, and a drift check would look.
        if full || !counts.is_empty() {
            self.generation = self.dataplane.generation().ok();
        }
        for delta in deltas.iter().filter(|d| !d.affinity_cleanup.is_empty()) {
            let Some(family) = delta.family else { continue };
            match self.clean_affinity(family, &delta.affinity_cleanup, false) {
                Ok(0) => {}
                Ok(n) => *counts.entry("delete-affinity").or_insert(0) += n,
                Err(e) => tracing::warn!("clearing stale session-affinity entries failed: {e}"),
            }
        }
        SyncOutcome { full, ops: counts }
    }

    /// The full sync of a renderer: each table that exists is read back and
    /// diffed with the whole desired table; a table that does not exist is
    /// created from the renderer's parts, the skeleton first and then the
    /// services, one bounded transaction at a time
    /// ([`cold_start_transactions`]), without building the whole table.
    fn sync_full_rendered(
        &mut self,
        renderer: &NftablesRenderer,
        deltas: &[TableDelta],
    ) -> Result<SyncOutcome, SyncError> {
        let mut first = Vec::new();
        let mut cold = Vec::new();
        for table in renderer.rendered() {
            let family = table.skeleton().family;
            match self.dataplane.dump(family, TABLE)? {
                Some(current) => {
                    first.extend(diff(Some(Current::Dumped(&current)), &table.table()))
                }
                None => cold.push(table),
            }
        }
        for table in &cold {
            first.extend(diff(None, table.skeleton()));
        }
        let total = cold.iter().map(RenderedTable::service_element_count).sum();
        let services = cold.into_iter().flat_map(|table| {
            let family = table.skeleton().family;
            table.service_groups().map(move |group| {
                group
                    .into_iter()
                    .map(|(set, element)| (family, set, element))
                    .collect()
            })
        });
        let counts = self.send(cold_start_transactions(
            first,
            services,
            total,
            COLD_START_BATCH_ELEMENTS,
            |set: &SetId| set.name(),
        ))?;
        Ok(self.synced(true, counts, deltas))
    }

    /// [`sync_incremental`](Self::sync_incremental) for a renderer's update; a
    /// full sync also checks every client's affinity entry against the entry
    /// points as they are now (entries made before a restart, or by a layout we
    /// no longer have).
    pub fn sync_rendered(
        &mut self,
        renderer: &NftablesRenderer,
        deltas: &[TableDelta],
    ) -> Result<SyncOutcome, SyncError> {
        let mut outcome = if self.need_full {
            self.sync_full_rendered(renderer, deltas)?
        } else {
            self.sync_incremental(deltas, || renderer.tables())?
        };
        if outcome.full {
            for (family, entries) in renderer.affinity_entries() {
                match self.clean_affinity(family, &entries, true) {
                    Ok(0) => {}
                    Ok(n) => *outcome.ops.entry("delete-affinity").or_insert(0) += n,
                    Err(e) => {
                        tracing::warn!("clearing stale session-affinity entries failed: {e}")
                    }
                }
            }
        }
        Ok(outcome)
    }

    /// Deletes the clients' affinity entries of `delta`'s entry points that lead
    /// to an endpoint the entry point no longer has. Runs right after the commit
    /// that removed the endpoints (so no new entry can lead there); an entry that
    /// expires meanwhile makes the delete fail, and the cleanup is tried once more
    /// on a fresh dump.
    /// `strict`: an entry point missing from `entries` has no valid entry at all.
    fn clean_affinity(
        &mut self,
        family: Family,
        entries: &[AffinityEntry],
        strict: bool,
    ) -> Result<usize, SyncError> {
        let set = SetId::Affinity.definition(family);
        let keep: BTreeMap<&[KeyValue], &std::collections::BTreeSet<(std::net::IpAddr, u16)>> =
            entries.iter().map(|(k, v)| (k.as_slice(), v)).collect();
        let mut last = Ok(0);
        for _ in 0..2 {
            let Some(elements) = self.dataplane.dump_set_elements(family, &set)? else {
                return Ok(0);
            };
            let stale: Vec<Element> = elements
                .into_iter()
                .filter(|e| {
                    let entry = e.key.get(1..).unwrap_or_default();
                    let target = match e.data.as_slice() {
                        [KeyValue::Addr(a), KeyValue::Port(p)] => Some((*a, *p)),
                        _ => None,
                    };
                    match keep.get(entry) {
                        Some(k) => target.is_none_or(|t| !k.contains(&t)),
                        None => strict,
                    }
                })
                .map(|e| Element::new(e.key))
                .collect();
            if stale.is_empty() {
                return Ok(0);
            }
            let n = stale.len();
            let op = Op::DeleteElements {
                family,
                table: TABLE.to_string(),
                set: set.name.clone(),
                elements: stale,
            };
            last = self.dataplane.apply(&[op]).map(|()| n);
            if last.is_ok() {
                break;
            }
        }
        last
    }

    /// Whether something else changed our tables' chains, rules or sets since
    /// our last sync (`skeletons`: the desired tables without elements). Costs
    /// one request while the ruleset generation has not moved; when it moved
    /// (anyone's commit moves it), a dump of our skeletons, a constant
    /// handful of requests. Drift found makes the next sync a full one; drift
    /// in elements alone is left to the periodic read-back.
    pub fn drifted(&mut self, skeletons: &[TableSpec]) -> Result<bool, SyncError> {
        let Some(ours) = self.generation else {
            return Ok(false);
        };
        let now = self.dataplane.generation()?;
        if now == ours {
            return Ok(false);
        }
        for t in skeletons {
            let want = TableSnapshot::from_spec(t);
            let same = match self.dataplane.dump_skeleton(t.family, TABLE)? {
                None => false,
                Some(cur) => {
                    cur.chains == want.chains
                        && cur.sets.len() == want.sets.len()
                        && cur
                            .sets
                            .iter()
                            .all(|(name, s)| want.sets.get(name).is_some_and(|w| w.set == s.set))
                }
            };
            if !same {
                self.need_full = true;
                self.generation = None;
                return Ok(true);
            }
        }
        // Someone else's commit: nothing of ours moved.
        self.generation = Some(now);
        Ok(false)
    }

    /// [`verify`](Self::verify) against a renderer's tables without building
    /// them: each dumped set is compared with the skeleton and the services'
    /// elements by count and lookup. Only a table that differs is built, to
    /// say how.
    pub fn verify_rendered(
        &mut self,
        renderer: &NftablesRenderer,
    ) -> Result<Vec<String>, SyncError> {
        let mut differing = Vec::new();
        // Nothing committed in the namespace since our last sync: each set
        // holds what our transactions left in it, nothing else's.
        let unmoved = self.generation_unmoved()?;
        for rendered in renderer.rendered() {
            let family = rendered.skeleton().family;
            if unmoved && self.holds_by_lookup(&rendered)? {
                continue;
            }
            let current = self.dataplane.dump(family, TABLE)?;
            if current
                .as_ref()
                .is_some_and(|cur| holds_rendered(cur, &rendered))
            {
                continue;
            }
            let want = TableSnapshot::from_spec(&rendered.table());
            let detail = match &current {
                None => "missing".to_string(),
                Some(cur) if *cur == want => continue,
                Some(cur) => describe_difference(cur, &want),
            };
            differing.push(format!("{} {TABLE}: {detail}", family.nft_name()));
        }
        Ok(differing)
    }

    /// Whether the ruleset generation is still the one our last sync left:
    /// nothing, ours or anyone's, has committed since (one small request).
    fn generation_unmoved(&mut self) -> Result<bool, SyncError> {
        match self.generation {
            Some(ours) => Ok(self.dataplane.generation()? == ours),
            None => Ok(false),
        }
    }

    /// Whether the kernel holds every table of `renderer`, read as
    /// [`holds_by_lookup`](Self::holds_by_lookup) does; only while the ruleset
    /// generation is still the one our last sync left (`false` otherwise, and
    /// when a full sync is due anyway).
    pub fn holds_unmoved(&mut self, renderer: &NftablesRenderer) -> Result<bool, SyncError> {
        if self.need_full || !self.generation_unmoved()? {
            return Ok(false);
        }
        for rendered in renderer.rendered() {
            if !self.holds_by_lookup(&rendered)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether the kernel holds `rendered`'s table, read without dumping big
    /// sets: the skeleton is dumped and compared; a set of up to
    /// [`LOOKUP_FROM`] elements is dumped and compared element for element;
    /// in a bigger one each element we want is looked up by key (a dump of
    /// it would cost the kernel time quadratic in its size). Lookups cannot
    /// see extra elements: the caller asks only while the ruleset generation
    /// is still the one our last commit made. `false` may mean "not sure":
    /// the caller then dumps the whole table.
    fn holds_by_lookup(&mut self, rendered: &RenderedTable<'_>) -> Result<bool, SyncError> {
        let family = rendered.skeleton().family;
        let Some(cur) = self.dataplane.dump_skeleton(family, TABLE)? else {
            return Ok(false);
        };
        let skeleton = TableSnapshot::from_spec(rendered.skeleton());
        let Some(wanted) = wanted_elements(&cur, &skeleton, rendered) else {
            return Ok(false);
        };
        let mut lookups = Vec::new();
        for (set, elements) in wanted.into_values() {
            // What packets add is not ours to compare.
            if set.flags.dynamic {
                continue;
            }
            if elements.len() > LOOKUP_FROM {
                tracing::debug!(set = %set.name, elements = elements.len(), "read back by lookup");
                lookups.push((set, elements));
                continue;
            }
            let Some(have) = self.dataplane.dump_set_elements(family, set)? else {
                return Ok(false);
            };
            let have: std::collections::HashSet<&Element> = have.iter().collect();
            if have.len() != elements.len() || !elements.iter().all(|e| have.contains(e)) {
                return Ok(false);
            }
        }
        let unheld = self.dataplane.find_unheld_elements(family, &lookups)?;
        Ok(unheld.iter().all(Option::is_none))
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

/// Sets bigger than this are read back by looking their elements up, not by
/// dumping them (see `Syncer::holds_by_lookup`): a dump of `n` elements walks
/// the kernel's hash `n / ~400` times from the start.
pub const LOOKUP_FROM: usize = 2048;

/// Whether `cur` is exactly `rendered`'s table: the skeleton's chains and set
/// definitions, and in each set its skeleton elements and services' elements
/// and nothing else. `false` may also mean "not sure" (an element counted
/// twice): the caller then compares the built table.
fn holds_rendered(cur: &TableSnapshot, rendered: &RenderedTable<'_>) -> bool {
    let skeleton = TableSnapshot::from_spec(rendered.skeleton());
    let Some(wanted) = wanted_elements(cur, &skeleton, rendered) else {
        return false;
    };
    wanted.into_iter().all(|(name, (_, elements))| {
        let have = &cur.sets[name].elements;
        have.len() == elements.len() && elements.iter().all(|e| have.contains(*e))
    })
}

/// What `rendered` wants in each of its sets, by name: the skeleton's elements
/// and the services'. `None` when `cur` (our table as the kernel holds it,
/// with or without elements) has other chains or set definitions than the
/// skeleton's.
fn wanted_elements<'a>(
    cur: &TableSnapshot,
    skeleton: &'a TableSnapshot,
    rendered: &RenderedTable<'a>,
) -> Option<HashMap<&'a str, (&'a Set, Vec<&'a Element>)>> {
    if cur.chains != skeleton.chains || cur.sets.len() != skeleton.sets.len() {
        return None;
    }
    let mut wanted = HashMap::new();
    for (name, want) in &skeleton.sets {
        if cur.sets.get(name)?.set != want.set {
            return None;
        }
        let elements: Vec<&Element> = want.elements.iter().collect();
        wanted.insert(name.as_str(), (&want.set, elements));
    }
    // The name of each set id, made once.
    let mut names: HashMap<SetId, &str> = HashMap::new();
    for (id, element) in rendered.service_elements() {
        let name = match names.entry(id) {
            std::collections::hash_map::Entry::Occupied(o) => *o.get(),
            std::collections::hash_map::Entry::Vacant(v) => {
                *v.insert(skeleton.sets.get_key_value(&id.name())?.0.as_str())
            }
        };
        wanted.get_mut(name)?.1.push(element);
    }
    Some(wanted)
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
pub(crate) mod tests;

impl<D: Dataplane + ?Sized> Dataplane for &mut D {
    fn dump(&mut self, family: Family, table: &str) -> Result<Option<TableSnapshot>, SyncError> {
        (**self).dump(family, table)
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), SyncError> {
        (**self).apply(ops)
    }

    fn dump_set_elements(
        &mut self,
        family: Family,
        set: &Set,
    ) -> Result<Option<Vec<Element>>, SyncError> {
        (**self).dump_set_elements(family, set)
    }

    fn messages_sent(&self) -> u64 {
        (**self).messages_sent()
    }

    fn generation(&mut self) -> Result<u32, SyncError> {
        (**self).generation()
    }

    fn find_unheld_element(
        &mut self,
        family: Family,
        set: &Set,
        elements: &[&Element],
    ) -> Result<Option<usize>, SyncError> {
        (**self).find_unheld_element(family, set, elements)
    }

    fn find_unheld_elements(
        &mut self,
        family: Family,
        lookups: &[(&Set, Vec<&Element>)],
    ) -> Result<Vec<Option<usize>>, SyncError> {
        (**self).find_unheld_elements(family, lookups)
    }

    fn dump_skeleton(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<TableSnapshot>, SyncError> {
        (**self).dump_skeleton(family, table)
    }
}
