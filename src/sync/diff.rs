//! PURE: what the kernel holds vs what it should hold → the nf_tables operations that
//! turn one into the other, ordered so the kernel accepts them in one batch.

use std::collections::{BTreeMap, BTreeSet};

use kube_nlproxy_netlink::nft::{Chain, Element, Family, Op, Set, TableState, rule_fingerprint};

use crate::mode::nftables::{ChainSpec, TABLE, TableDelta, TableSpec};

/// A chain as far as the diff cares: its definition and its rules' fingerprints.
/// Equal when name, hook and rules are: the chain's comment is for people (a
/// chain adopted from a version without comments is not drift).
#[derive(Debug, Clone, Eq)]
pub struct ChainSnapshot {
    /// Definition (name, hook).
    pub chain: Chain,
    /// Fingerprints of its rules, in order.
    pub rules: Vec<u64>,
}

impl PartialEq for ChainSnapshot {
    fn eq(&self, other: &Self) -> bool {
        self.chain.name == other.chain.name
            && self.chain.base == other.chain.base
            && self.rules == other.rules
    }
}

/// A set and its elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSnapshot {
    /// Definition.
    pub set: Set,
    /// Elements.
    pub elements: BTreeSet<Element>,
}

/// One of our tables as the kernel holds it (dumped) or as we last committed it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableSnapshot {
    /// Chains by name.
    pub chains: BTreeMap<String, ChainSnapshot>,
    /// Sets by name.
    pub sets: BTreeMap<String, SetSnapshot>,
}

impl TableSnapshot {
    /// What the kernel will hold once `spec` is committed.
    pub fn from_spec(spec: &TableSpec) -> Self {
        TableSnapshot {
            chains: spec
                .chains
                .iter()
                .map(|(name, c)| {
                    (
                        name.clone(),
                        ChainSnapshot {
                            chain: c.chain.clone(),
                            rules: c.rules.iter().map(rule_fingerprint).collect(),
                        },
                    )
                })
                .collect(),
            sets: spec
                .sets
                .iter()
                .map(|(name, s)| {
                    (
                        name.clone(),
                        SetSnapshot {
                            set: s.set.clone(),
                            elements: s.elements.clone(),
                        },
                    )
                })
                .collect(),
        }
    }

    /// A kernel dump. Elements of dynamic sets (added by packets, e.g. session
    /// affinity) are left out: they are state, not configuration. A rule without our fingerprint (someone else's rule in our
    /// table) gets fingerprint 0, which never matches, so its chain is rewritten.
    pub fn from_kernel(state: TableState) -> Self {
        let mut chains: BTreeMap<String, ChainSnapshot> = state
            .chains
            .into_iter()
            .map(|c| {
                (
                    c.name.clone(),
                    ChainSnapshot {
                        chain: c,
                        rules: Vec::new(),
                    },
                )
            })
            .collect();
        for (chain, rules) in state.rules {
            if let Some(c) = chains.get_mut(&chain) {
                c.rules = rules.iter().map(|r| r.fingerprint.unwrap_or(0)).collect();
            }
        }
        let mut elements = state.elements;
        let sets = state
            .sets
            .into_iter()
            .map(|s| {
                // Elements the packet path adds (affinity) are not ours to diff.
                let el = match elements.remove(&s.name) {
                    Some(_) if s.flags.dynamic => Vec::new(),
                    Some(el) => el,
                    None => Vec::new(),
                };
                (
                    s.name.clone(),
                    SetSnapshot {
                        set: s,
                        elements: el.into_iter().collect(),
                    },
                )
            })
            .collect();
        TableSnapshot { chains, sets }
    }
}

/// Operation counts of a transaction, by kind (for logs and metrics).
pub fn op_counts(ops: &[Op]) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    for op in ops {
        let (kind, n) = match op {
            Op::AddTable { .. } => ("add-table", 1),
            Op::DeleteTable { .. } => ("delete-table", 1),
            Op::AddChain { .. } => ("add-chain", 1),
            Op::DeleteChain { .. } => ("delete-chain", 1),
            Op::FlushChain { .. } => ("flush-chain", 1),
            Op::DeleteRule { .. } => ("delete-rule", 1),
            Op::AddRule { .. } => ("add-rule", 1),
            Op::AddSet { .. } => ("add-set", 1),
            Op::DeleteSet { .. } => ("delete-set", 1),
            Op::AddElements { elements, .. } => ("add-element", elements.len()),
            Op::DeleteElements { elements, .. } => ("delete-element", elements.len()),
        };
        *m.entry(kind).or_insert(0) += n;
    }
    m
}

/// What the kernel holds now: the tables we committed last (trusted, compared
/// structurally, so an unchanged chain costs no encoding), or a dump (compared by
/// rule fingerprints).
#[derive(Debug, Clone, Copy)]
pub enum Current<'a> {
    /// Our last successful commit.
    Committed(&'a TableSpec),
    /// Read back from the kernel.
    Dumped(&'a TableSnapshot),
}

impl<'a> Current<'a> {
    /// The chain's definition and whether it holds any rule.
    fn chain(&self, name: &str) -> Option<(&'a Chain, bool)> {
        match *self {
            Current::Committed(t) => t.chains.get(name).map(|c| (&c.chain, !c.rules.is_empty())),
            Current::Dumped(t) => t.chains.get(name).map(|c| (&c.chain, !c.rules.is_empty())),
        }
    }

    /// Whether the chain holds exactly `spec`'s rules.
    fn chain_matches(&self, name: &str, spec: &ChainSpec) -> bool {
        match *self {
            Current::Committed(t) => t.chains.get(name).is_some_and(|c| c.rules == spec.rules),
            Current::Dumped(t) => t.chains.get(name).is_some_and(|c| {
                c.rules.len() == spec.rules.len()
                    && c.rules
                        .iter()
                        .zip(&spec.rules)
                        .all(|(f, r)| *f == rule_fingerprint(r))
            }),
        }
    }

    fn chains(&self) -> Vec<(&'a Chain, bool)> {
        match *self {
            Current::Committed(t) => t
                .chains
                .values()
                .map(|c| (&c.chain, !c.rules.is_empty()))
                .collect(),
            Current::Dumped(t) => t
                .chains
                .values()
                .map(|c| (&c.chain, !c.rules.is_empty()))
                .collect(),
        }
    }

    fn set(&self, name: &str) -> Option<(&'a Set, &'a BTreeSet<Element>)> {
        match *self {
            Current::Committed(t) => t.sets.get(name).map(|s| (&s.set, &s.elements)),
            Current::Dumped(t) => t.sets.get(name).map(|s| (&s.set, &s.elements)),
        }
    }

    fn sets(&self) -> Vec<(&'a Set, &'a BTreeSet<Element>)> {
        match *self {
            Current::Committed(t) => t.sets.values().map(|s| (&s.set, &s.elements)).collect(),
            Current::Dumped(t) => t.sets.values().map(|s| (&s.set, &s.elements)).collect(),
        }
    }
}

/// The operations that turn `current` (None: no table) into `desired`.
///
/// Order inside the batch: new chains and sets first (so rules and elements can
/// refer to them), then element deletions, rewritten chains, element additions, and
/// last what nobody refers to any more: stale chains flushed, stale sets deleted,
/// then the stale chains. A changed base chain or set
/// definition (a layout change between versions) recreates the table.
pub fn diff(current: Option<Current<'_>>, desired: &TableSpec) -> Vec<Op> {
    let family = desired.family;
    let table = TABLE.to_string();
    let mut ops = Vec::new();
    let current = match current {
        Some(c) if !layout_changed(c, desired) => c,
        Some(_) => {
            ops.push(Op::DeleteTable {
                family,
                name: table.clone(),
            });
            ops.extend(create_all(desired));
            return ops;
        }
        None => return create_all(desired),
    };

    for (name, spec) in &desired.chains {
        if current.chain(name).is_none() {
            ops.push(Op::AddChain {
                family,
                table: table.clone(),
                chain: spec.chain.clone(),
            });
        }
    }
    for (name, spec) in &desired.sets {
        if current.set(name).is_none() {
            ops.push(Op::AddSet {
                family,
                table: table.clone(),
                set: spec.set.clone(),
            });
        }
    }
    // Element deletions (including map elements whose verdict changes).
    for (set, elements) in current.sets() {
        let Some(want) = desired.sets.get(&set.name) else {
            continue;
        };
        let gone: Vec<Element> = elements.difference(&want.elements).cloned().collect();
        push_elements(&mut ops, family, &set.name, gone, false);
    }
    // Rewritten and new chains.
    for (name, spec) in &desired.chains {
        match current.chain(name) {
            Some(_) if current.chain_matches(name, spec) => continue,
            Some((_, true)) => ops.push(Op::FlushChain {
                family,
                table: table.clone(),
                name: name.clone(),
            }),
            _ => {}
        }
        ops.extend(spec.rules.iter().map(|rule| Op::AddRule {
            family,
            table: table.clone(),
            rule: rule.clone(),
        }));
    }
    // Element additions.
    for (name, want) in &desired.sets {
        let new: Vec<Element> = match current.set(name) {
            Some((_, elements)) => want.elements.difference(elements).cloned().collect(),
            None => want.elements.iter().cloned().collect(),
        };
        push_elements(&mut ops, family, name, new, true);
    }
    // Chains nobody refers to any more: flush all of them, then delete.
    let stale: Vec<(&Chain, bool)> = current
        .chains()
        .into_iter()
        .filter(|(c, _)| !desired.chains.contains_key(&c.name))
        .collect();
    for (c, has_rules) in &stale {
        if *has_rules {
            ops.push(Op::FlushChain {
                family,
                table: table.clone(),
                name: c.name.clone(),
            });
        }
    }
    // Sets nobody refers to any more go before the stale chains: a verdict map's
    // `goto` elements hold the chains they name (EBUSY), and the rules that used the
    // sets are flushed by now.
    for (set, _) in current.sets() {
        if !desired.sets.contains_key(&set.name) {
            ops.push(Op::DeleteSet {
                family,
                table: table.clone(),
                name: set.name.clone(),
            });
        }
    }
    for (c, _) in &stale {
        ops.push(Op::DeleteChain {
            family,
            table: table.clone(),
            name: c.name.clone(),
        });
    }
    ops
}

fn layout_changed(current: Current<'_>, desired: &TableSpec) -> bool {
    let base_changed = desired
        .chains
        .iter()
        // By hook only: a chain's comment is for people, and one adopted from an
        // older version without it keeps working as it is.
        .any(|(name, spec)| {
            current
                .chain(name)
                .is_some_and(|(c, _)| c.base != spec.chain.base)
        })
        || current
            .chains()
            .iter()
            .any(|(c, _)| c.base.is_some() && !desired.chains.contains_key(&c.name));
    let set_changed = desired
        .sets
        .iter()
        .any(|(name, spec)| current.set(name).is_some_and(|(s, _)| *s != spec.set));
    base_changed || set_changed
}

/// Copies of a delta's shared elements, for an operation.
fn owned(elements: &[std::sync::Arc<Element>]) -> Vec<Element> {
    elements.iter().map(|e| Element::clone(e)).collect()
}

fn push_elements(ops: &mut Vec<Op>, family: Family, set: &str, elements: Vec<Element>, add: bool) {
    if elements.is_empty() {
        return;
    }
    let table = TABLE.to_string();
    let set = set.to_string();
    ops.push(if add {
        Op::AddElements {
            family,
            table,
            set,
            elements,
        }
    } else {
        Op::DeleteElements {
            family,
            table,
            set,
            elements,
        }
    });
}

fn create_all(desired: &TableSpec) -> Vec<Op> {
    let family = desired.family;
    let table = TABLE.to_string();
    let mut ops = vec![Op::AddTable {
        family,
        name: table.clone(),
    }];
    ops.extend(desired.chains.values().map(|c| Op::AddChain {
        family,
        table: table.clone(),
        chain: c.chain.clone(),
    }));
    ops.extend(desired.sets.values().map(|s| Op::AddSet {
        family,
        table: table.clone(),
        set: s.set.clone(),
    }));
    for c in desired.chains.values() {
        ops.extend(c.rules.iter().map(|rule| Op::AddRule {
            family,
            table: table.clone(),
            rule: rule.clone(),
        }));
    }
    for (name, s) in &desired.sets {
        push_elements(
            &mut ops,
            family,
            name,
            s.elements.iter().cloned().collect(),
            true,
        );
    }
    ops
}

/// The operations of a renderer's delta (`mode::nftables::TableDelta`), valid when
/// the kernel holds the renderer's previous state. Same order as [`diff`]: new
/// chains and sets, element deletions, rewritten chains, element additions, sets
/// nobody refers to any more.
pub fn delta_ops(delta: &TableDelta) -> Vec<Op> {
    let Some(family) = delta.family else {
        return Vec::new();
    };
    let table = TABLE.to_string();
    let mut ops = Vec::new();
    ops.extend(delta.new_chains.iter().map(|chain| Op::AddChain {
        family,
        table: table.clone(),
        chain: chain.clone(),
    }));
    ops.extend(delta.add_sets.iter().map(|set| Op::AddSet {
        family,
        table: table.clone(),
        set: set.clone(),
    }));
    for (set, elements) in &delta.delete_elements {
        push_elements(&mut ops, family, set, owned(elements), false);
    }
    for spec in &delta.chains {
        if !delta.new_chains.contains(&spec.chain) {
            ops.push(Op::FlushChain {
                family,
                table: table.clone(),
                name: spec.chain.name.clone(),
            });
        }
        ops.extend(spec.rules.iter().map(|rule| Op::AddRule {
            family,
            table: table.clone(),
            rule: rule.clone(),
        }));
    }
    for (set, elements) in &delta.add_elements {
        push_elements(&mut ops, family, set, owned(elements), true);
    }
    ops.extend(delta.delete_sets.iter().map(|name| Op::DeleteSet {
        family,
        table: table.clone(),
        name: name.clone(),
    }));
    ops
}
