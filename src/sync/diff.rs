//! PURE: what the kernel holds vs what it should hold → the nf_tables operations that
//! turn one into the other, ordered so the kernel accepts them in one batch.

use std::collections::{BTreeMap, BTreeSet};

use kube_nlproxy_netlink::nft::{Chain, Element, Family, Op, Set, TableState, rule_fingerprint};

use crate::mode::nftables::{TABLE, TableSpec};

/// A chain as far as the diff cares: its definition and its rules' fingerprints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSnapshot {
    /// Definition (name, hook).
    pub chain: Chain,
    /// Fingerprints of its rules, in order.
    pub rules: Vec<u64>,
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

    /// A kernel dump. A rule without our fingerprint (someone else's rule in our
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
                let el = elements.remove(&s.name).unwrap_or_default();
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

/// The operations that turn `current` (None: no table) into `desired`.
///
/// Order inside the batch: new chains and sets first (so rules and elements can
/// refer to them), then element deletions, rewritten chains, element additions, and
/// last the chains and sets nobody refers to any more. A changed base chain or set
/// definition (a layout change between versions) recreates the table.
pub fn diff(current: Option<&TableSnapshot>, desired: &TableSpec) -> Vec<Op> {
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
        if !current.chains.contains_key(name) {
            ops.push(Op::AddChain {
                family,
                table: table.clone(),
                chain: spec.chain.clone(),
            });
        }
    }
    for (name, spec) in &desired.sets {
        if !current.sets.contains_key(name) {
            ops.push(Op::AddSet {
                family,
                table: table.clone(),
                set: spec.set.clone(),
            });
        }
    }
    // Element deletions (including map elements whose verdict changes).
    for (name, cur) in &current.sets {
        let Some(want) = desired.sets.get(name) else {
            continue;
        };
        let gone: Vec<Element> = cur.elements.difference(&want.elements).cloned().collect();
        push_elements(&mut ops, family, name, gone, false);
    }
    // Rewritten and new chains.
    for (name, spec) in &desired.chains {
        let fingerprints: Vec<u64> = spec.rules.iter().map(rule_fingerprint).collect();
        match current.chains.get(name) {
            Some(cur) if cur.rules == fingerprints => continue,
            Some(cur) if !cur.rules.is_empty() => ops.push(Op::FlushChain {
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
        let new: Vec<Element> = match current.sets.get(name) {
            Some(cur) => want.elements.difference(&cur.elements).cloned().collect(),
            None => want.elements.iter().cloned().collect(),
        };
        push_elements(&mut ops, family, name, new, true);
    }
    // Chains nobody refers to any more: flush all of them, then delete.
    let stale: Vec<&ChainSnapshot> = current
        .chains
        .iter()
        .filter(|(name, _)| !desired.chains.contains_key(*name))
        .map(|(_, c)| c)
        .collect();
    for c in &stale {
        if !c.rules.is_empty() {
            ops.push(Op::FlushChain {
                family,
                table: table.clone(),
                name: c.chain.name.clone(),
            });
        }
    }
    for c in &stale {
        ops.push(Op::DeleteChain {
            family,
            table: table.clone(),
            name: c.chain.name.clone(),
        });
    }
    for name in current.sets.keys() {
        if !desired.sets.contains_key(name) {
            ops.push(Op::DeleteSet {
                family,
                table: table.clone(),
                name: name.clone(),
            });
        }
    }
    ops
}

fn layout_changed(current: &TableSnapshot, desired: &TableSpec) -> bool {
    let base_changed = desired.chains.iter().any(|(name, spec)| {
        current
            .chains
            .get(name)
            .is_some_and(|c| c.chain != spec.chain)
    }) || current
        .chains
        .values()
        .any(|c| c.chain.base.is_some() && !desired.chains.contains_key(&c.chain.name));
    let set_changed = desired
        .sets
        .iter()
        .any(|(name, spec)| current.sets.get(name).is_some_and(|s| s.set != spec.set));
    base_changed || set_changed
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
