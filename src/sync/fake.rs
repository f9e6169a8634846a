//! A kernel stand-in for unit tests: applies nf_tables operations all-or-nothing and
//! rejects what the kernel rejects (missing table/chain/set, jumps to missing chains,
//! deleting a chain or set still in use, a map element re-added with other data).
//! `tests/` checks that the real kernel ends in the same state.

use std::collections::{BTreeMap, BTreeSet};

use kube_nlproxy_netlink::nft::{
    Element, Expr, Family, ImmediateData, Op, Rule, Set, rule_fingerprint,
};

use super::diff::{ChainSnapshot, SetSnapshot, TableSnapshot};
use super::{Dataplane, SyncError};

#[derive(Debug, Clone, Default)]
struct FakeChain {
    snapshot: Option<ChainSnapshot>,
    /// Chains and sets each rule refers to.
    refs: Vec<(Vec<String>, Vec<String>)>,
}

#[derive(Debug, Clone, Default)]
struct FakeTable {
    chains: BTreeMap<String, FakeChain>,
    sets: BTreeMap<String, (Set, BTreeMap<Vec<u8>, Element>)>,
}

/// The fake kernel.
#[derive(Debug, Clone, Default)]
pub struct FakeKernel {
    tables: BTreeMap<(Family, String), FakeTable>,
    /// Number of successful transactions.
    pub commits: usize,
    /// Netlink messages a kernel would have received: each batch's operations
    /// with its begin and end, and one request per dump.
    pub messages: u64,
    /// Failures to give instead of doing the next requests, in order.
    pub faults: std::collections::VecDeque<Fault>,
    /// The ruleset generation: moves with every commit, and with
    /// [`FakeKernel::tamper`].
    pub generation: u32,
}

/// A failure [`FakeKernel`] gives the next time it is asked for `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Which request fails.
    pub at: FaultPoint,
    /// With which errno (`libc::ENOBUFS`, `EPERM`, …).
    pub errno: i32,
}

/// The requests [`FakeKernel`] can be told to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// A transaction (nothing of it is applied).
    Apply,
    /// Reading a table or a set back.
    Dump,
}

impl FakeKernel {
    /// Something else's commit: `change` runs on the tables, and the
    /// generation moves (as any commit in the namespace moves it).
    pub fn tamper(&mut self, change: impl FnOnce(&mut FakeKernel)) {
        change(self);
        self.generation += 1;
    }

    /// Makes the next `count` requests of kind `at` fail with `errno`.
    pub fn fail_next(&mut self, at: FaultPoint, errno: i32, count: usize) {
        self.faults
            .extend(std::iter::repeat_n(Fault { at, errno }, count));
    }

    fn take_fault(&mut self, at: FaultPoint) -> Option<i32> {
        let i = self.faults.iter().position(|f| f.at == at)?;
        self.faults.remove(i).map(|f| f.errno)
    }

    fn dump_fault(&mut self, family: Family) -> Result<(), SyncError> {
        match self.take_fault(FaultPoint::Dump) {
            None => Ok(()),
            Some(errno) => Err(SyncError::DumpFailed {
                family: family.nft_name(),
                source: kube_nlproxy_netlink::nft::NftError::Dump {
                    what: "table".into(),
                    errno,
                },
            }),
        }
    }
}

fn err(op: &Op, errno: i32) -> SyncError {
    SyncError::Apply(kube_nlproxy_netlink::nft::NftError::BatchRejected {
        index: 0,
        op: op.to_string(),
        errno,
        message: None,
    })
}

fn rule_refs(rule: &Rule) -> (Vec<String>, Vec<String>) {
    let mut chains = Vec::new();
    let mut sets = Vec::new();
    for e in &rule.exprs {
        match e {
            Expr::Immediate {
                data: ImmediateData::Verdict(v),
                ..
            } => chains.extend(v.chain().map(str::to_string)),
            Expr::Lookup { set, .. } | Expr::Dynset { set, .. } => sets.push(set.clone()),
            _ => {}
        }
    }
    (chains, sets)
}

impl FakeTable {
    fn chain_in_use(&self, name: &str) -> bool {
        self.chains
            .values()
            .flat_map(|c| &c.refs)
            .any(|(chains, _)| chains.iter().any(|c| c == name))
            || self
                .sets
                .values()
                .flat_map(|(_, els)| els.values())
                .any(|e| e.verdict.as_ref().and_then(|v| v.chain()) == Some(name))
    }

    fn set_in_use(&self, name: &str) -> bool {
        self.chains
            .values()
            .flat_map(|c| &c.refs)
            .any(|(_, sets)| sets.iter().any(|s| s == name))
    }
}

impl FakeKernel {
    fn apply_one(&mut self, op: &Op) -> Result<(), SyncError> {
        use libc_errno::*;
        fn table_of<'a>(
            k: &'a mut FakeKernel,
            family: Family,
            table: &str,
        ) -> Result<&'a mut FakeTable, i32> {
            k.tables.get_mut(&(family, table.to_string())).ok_or(ENOENT)
        }
        let r: Result<(), i32> = (|| match op {
            Op::AddTable { family, name } => {
                self.tables.entry((*family, name.clone())).or_default();
                Ok(())
            }
            Op::DeleteTable { family, name } => self
                .tables
                .remove(&(*family, name.clone()))
                .map(|_| ())
                .ok_or(ENOENT),
            Op::AddChain {
                family,
                table,
                chain,
            } => {
                let t = table_of(self, *family, table)?;
                let c = t.chains.entry(chain.name.clone()).or_default();
                match &c.snapshot {
                    Some(s) if s.chain != *chain => Err(EEXIST),
                    Some(_) => Ok(()),
                    None => {
                        c.snapshot = Some(ChainSnapshot {
                            chain: chain.clone(),
                            rules: Vec::new(),
                        });
                        Ok(())
                    }
                }
            }
            Op::DeleteChain {
                family,
                table,
                name,
            } => {
                let t = table_of(self, *family, table)?;
                let c = t.chains.get(name).ok_or(ENOENT)?;
                if !c.refs.is_empty() || t.chain_in_use(name) {
                    return Err(EBUSY);
                }
                t.chains.remove(name);
                Ok(())
            }
            Op::FlushChain {
                family,
                table,
                name,
            } => {
                let t = table_of(self, *family, table)?;
                let c = t.chains.get_mut(name).ok_or(ENOENT)?;
                c.refs.clear();
                if let Some(s) = c.snapshot.as_mut() {
                    s.rules.clear();
                }
                Ok(())
            }
            // Rules by handle are deleted only from tables we do not own, which
            // the fake never holds: the kernel's answer for an unknown handle.
            Op::DeleteRule { family, table, .. } => {
                table_of(self, *family, table)?;
                Err(ENOENT)
            }
            Op::AddRule {
                family,
                table,
                rule,
            } => {
                let t = table_of(self, *family, table)?;
                let (chains, sets) = rule_refs(rule);
                if chains.iter().any(|c| !t.chains.contains_key(c))
                    || sets.iter().any(|s| !t.sets.contains_key(s))
                {
                    return Err(ENOENT);
                }
                let c = t.chains.get_mut(&rule.chain).ok_or(ENOENT)?;
                c.snapshot
                    .as_mut()
                    .expect("created chain")
                    .rules
                    .push(rule_fingerprint(rule));
                c.refs.push((chains, sets));
                Ok(())
            }
            Op::AddSet { family, table, set } => {
                let t = table_of(self, *family, table)?;
                match t.sets.get(&set.name) {
                    Some((s, _)) if s != set => Err(EEXIST),
                    Some(_) => Ok(()),
                    None => {
                        t.sets
                            .insert(set.name.clone(), (set.clone(), BTreeMap::new()));
                        Ok(())
                    }
                }
            }
            Op::DeleteSet {
                family,
                table,
                name,
            } => {
                let t = table_of(self, *family, table)?;
                if !t.sets.contains_key(name) {
                    return Err(ENOENT);
                }
                if t.set_in_use(name) {
                    return Err(EBUSY);
                }
                t.sets.remove(name);
                Ok(())
            }
            Op::AddElements {
                family,
                table,
                set,
                elements,
            } => {
                let t = table_of(self, *family, table)?;
                for e in elements {
                    if let Some(c) = e.verdict.as_ref().and_then(|v| v.chain())
                        && !t.chains.contains_key(c)
                    {
                        return Err(ENOENT);
                    }
                }
                let (_, els) = t.sets.get_mut(set).ok_or(ENOENT)?;
                for e in elements {
                    match els.get(&e.key_bytes()) {
                        Some(old) if old.verdict != e.verdict => return Err(EEXIST),
                        _ => {
                            els.insert(e.key_bytes(), e.clone());
                        }
                    }
                }
                Ok(())
            }
            Op::DeleteElements {
                family,
                table,
                set,
                elements,
            } => {
                let t = table_of(self, *family, table)?;
                let (_, els) = t.sets.get_mut(set).ok_or(ENOENT)?;
                for e in elements {
                    els.remove(&e.key_bytes()).ok_or(ENOENT)?;
                }
                Ok(())
            }
        })();
        r.map_err(|errno| err(op, errno))
    }
}

/// errno values (Linux).
mod libc_errno {
    pub const ENOENT: i32 = 2;
    pub const EBUSY: i32 = 16;
    pub const EEXIST: i32 = 17;
}

impl FakeKernel {
    /// What a packet's `dynset` does: adds `element` to a dynamic set of ours.
    pub fn add_by_packet(&mut self, family: Family, set: &str, element: Element) {
        if let Some(t) = self.tables.get_mut(&(family, super::TABLE.to_string()))
            && let Some((s, els)) = t.sets.get_mut(set)
            && s.flags.dynamic
        {
            els.insert(element.key_bytes(), element);
        }
    }
}

impl Dataplane for FakeKernel {
    fn dump(&mut self, family: Family, table: &str) -> Result<Option<TableSnapshot>, SyncError> {
        self.messages += 1;
        self.dump_fault(family)?;
        Ok(self
            .tables
            .get(&(family, table.to_string()))
            .map(|t| TableSnapshot {
                chains: t
                    .chains
                    .iter()
                    .filter_map(|(n, c)| Some((n.clone(), c.snapshot.clone()?)))
                    .collect(),
                sets: t
                    .sets
                    .iter()
                    .map(|(n, (s, els))| {
                        // Like a kernel dump: what packets added is not configuration.
                        let elements = if s.flags.dynamic {
                            BTreeSet::new()
                        } else {
                            els.values().cloned().collect::<BTreeSet<_>>()
                        };
                        (
                            n.clone(),
                            SetSnapshot {
                                set: s.clone(),
                                elements,
                            },
                        )
                    })
                    .collect(),
            }))
    }

    fn dump_set_elements(
        &mut self,
        family: Family,
        set: &Set,
    ) -> Result<Option<Vec<Element>>, SyncError> {
        self.messages += 1;
        self.dump_fault(family)?;
        Ok(self
            .tables
            .get(&(family, super::TABLE.to_string()))
            .and_then(|t| t.sets.get(&set.name))
            .map(|(_, els)| els.values().cloned().collect()))
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), SyncError> {
        self.messages += ops.len() as u64 + 2;
        if let Some(errno) = self.take_fault(FaultPoint::Apply) {
            let op = ops.first().map(ToString::to_string).unwrap_or_default();
            return Err(SyncError::Apply(
                kube_nlproxy_netlink::nft::NftError::BatchRejected {
                    index: 0,
                    op,
                    errno,
                    message: None,
                },
            ));
        }
        let saved = self.tables.clone();
        for (index, op) in ops.iter().enumerate() {
            if let Err(mut e) = self.apply_one(op) {
                if let SyncError::Apply(kube_nlproxy_netlink::nft::NftError::BatchRejected {
                    index: i,
                    ..
                }) = &mut e
                {
                    *i = index;
                }
                self.tables = saved;
                return Err(e);
            }
        }
        self.commits += 1;
        self.generation += 1;
        Ok(())
    }

    fn messages_sent(&self) -> u64 {
        self.messages
    }

    fn generation(&mut self) -> Result<u32, SyncError> {
        self.messages += 1;
        Ok(self.generation)
    }

    fn dump_skeleton(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<TableSnapshot>, SyncError> {
        let mut t = self.dump(family, table)?;
        for s in t.iter_mut().flat_map(|t| t.sets.values_mut()) {
            s.elements.clear();
        }
        Ok(t)
    }

    fn find_unheld_element(
        &mut self,
        family: Family,
        set: &Set,
        elements: &[&Element],
    ) -> Result<Option<usize>, SyncError> {
        // One request per 512 elements, like the socket's.
        self.messages += elements.len().div_ceil(512).max(1) as u64;
        self.dump_fault(family)?;
        let held = self
            .tables
            .get(&(family, super::TABLE.to_string()))
            .and_then(|t| t.sets.get(&set.name))
            .map(|(_, els)| els);
        Ok(elements.iter().position(|asked| {
            held.and_then(|els| els.get(&asked.key_bytes()))
                .is_none_or(|have| have != *asked)
        }))
    }
}
