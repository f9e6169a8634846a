//! A table as chains: grouping the entries of `IPT_SO_GET_ENTRIES` into
//! built-in and user-defined chains with jumps resolved to chain names
//! ([`Table::parse`]), removing chains ([`Table::remove_chains`]), and laying
//! the entries out again with every offset recomputed ([`Table::emit`]). No I/O.

use std::collections::HashMap;

use netlink_packet_core::DecodeError;

use super::codec::{
    EmitError, Emitted, Entry, Family, HOOK_NAMES, NF_INET_NUMHOOKS, TableInfo, Target, Verdict,
    XT_ERROR_TARGET, emit_entry, parse_entry,
};

/// How a chain begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainKind {
    /// A built-in chain, at hook `hook` (index into [`HOOK_NAMES`]).
    Builtin {
        /// The netfilter hook (`NF_INET_*`).
        hook: usize,
    },
    /// A user-defined chain, headed by an entry with an `ERROR` target naming it.
    User {
        /// The head entry.
        head: Entry,
    },
}

/// A chain: its rules in order, the last being the built-in chain's policy or
/// the user chain's unconditional `RETURN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The chain's name.
    pub name: String,
    /// Built-in or user-defined.
    pub kind: ChainKind,
    /// The entries after the head, the policy / `RETURN` last.
    pub rules: Vec<Entry>,
}

impl Chain {
    /// True for a user-defined chain.
    pub fn is_user(&self) -> bool {
        matches!(self.kind, ChainKind::User { .. })
    }
}

/// A table as grouped chains. `parse` then `emit` gives back the kernel's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// The family.
    pub family: Family,
    /// Table name (`nat`, `filter`, `mangle`, ...).
    pub name: String,
    /// `valid_hooks`, which the kernel does not let a replace change.
    pub valid_hooks: u32,
    /// The number of entries when the table was read: the `num_counters` of a
    /// replace, which the kernel checks against the table's current number of
    /// entries (`EAGAIN` when they differ).
    pub read_entries: u32,
    /// The chains in table order.
    pub chains: Vec<Chain>,
    /// The table's final entry (an `ERROR` target named `"ERROR"`).
    pub end: Entry,
}

impl Table {
    /// Parses the entries of `IPT_SO_GET_ENTRIES` (without the 40-byte
    /// `ipt_get_entries` header) with the `IPT_SO_GET_INFO` that sized them.
    pub fn parse(family: Family, info: &TableInfo, blob: &[u8]) -> Result<Table, DecodeError> {
        let mut raw = Vec::new();
        let mut offset = 0;
        while offset < blob.len() {
            let e = parse_entry(family, blob, offset, raw.len() as u32)?;
            offset += e.len;
            raw.push(e);
        }
        let Some(last) = raw.pop() else {
            return Err("table without entries".into());
        };
        if last.entry.target != Target::Error(XT_ERROR_TARGET.to_string()) {
            return Err("the last entry is not the ERROR target \"ERROR\"".into());
        }

        // Chain starts: built-in chains at their hook entry, user chains at
        // their ERROR head (their jump target is the entry after the head).
        let mut hook_at: HashMap<usize, usize> = HashMap::new();
        for h in 0..NF_INET_NUMHOOKS {
            if info.valid_hooks & (1 << h) != 0 {
                hook_at.insert(info.hook_entry[h] as usize, h);
            }
        }
        let mut chains: Vec<Chain> = Vec::new();
        let mut starts: HashMap<usize, String> = HashMap::new();
        let mut verdicts: Vec<Vec<(usize, usize, i32)>> = Vec::new();
        // Offset of each chain's last entry so far.
        let mut last_at: Vec<usize> = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            if let Some(&hook) = hook_at.get(&r.offset) {
                starts.insert(r.offset, HOOK_NAMES[hook].to_string());
                chains.push(Chain {
                    name: HOOK_NAMES[hook].to_string(),
                    kind: ChainKind::Builtin { hook },
                    rules: Vec::new(),
                });
                verdicts.push(Vec::new());
                last_at.push(r.offset);
            } else if let Target::Error(name) = &r.entry.target {
                let Some(next) = raw.get(i + 1) else {
                    return Err(format!("user chain {name} has no entries").into());
                };
                if hook_at.contains_key(&next.offset)
                    || matches!(next.entry.target, Target::Error(_))
                {
                    return Err(format!("user chain {name} has no RETURN entry").into());
                }
                starts.insert(next.offset, name.clone());
                chains.push(Chain {
                    name: name.clone(),
                    kind: ChainKind::User {
                        head: r.entry.clone(),
                    },
                    rules: Vec::new(),
                });
                verdicts.push(Vec::new());
                last_at.push(r.offset);
                continue;
            }
            let Some(chain) = chains.last_mut() else {
                return Err(format!("entry at {} is in no chain", r.offset).into());
            };
            if let Some(v) = r.verdict {
                verdicts.last_mut().expect("one per chain").push((
                    chain.rules.len(),
                    r.offset + r.len,
                    v,
                ));
            }
            chain.rules.push(r.entry.clone());
            *last_at.last_mut().expect("one per chain") = r.offset;
        }

        let builtin = chains.iter().filter(|c| !c.is_user()).count();
        if builtin != hook_at.len() || hook_at.len() != info.valid_hooks.count_ones() as usize {
            return Err(format!(
                "valid_hooks {:#x} but {builtin} built-in chains found at hook_entry {:?}",
                info.valid_hooks, info.hook_entry
            )
            .into());
        }
        // Every valid hook's policy must be its chain's last entry: emit puts
        // underflow there.
        for (chain, &last) in chains.iter().zip(&last_at) {
            if let ChainKind::Builtin { hook } = chain.kind
                && last != info.underflow[hook] as usize
            {
                return Err(format!(
                    "{}: underflow {} is not the chain's last entry",
                    chain.name, info.underflow[hook]
                )
                .into());
            }
        }

        for (chain, vs) in chains.iter_mut().zip(verdicts) {
            for (rule, next, v) in vs {
                let verdict = if v < 0 {
                    Verdict::from_builtin(v)
                } else if let Some(name) = starts.get(&(v as usize)) {
                    Verdict::Jump(name.clone())
                } else if v as usize == next {
                    Verdict::Fallthrough
                } else {
                    return Err(format!(
                        "{}: rule {} jumps to offset {v}, which starts no chain",
                        chain.name,
                        rule + 1
                    )
                    .into());
                };
                chain.rules[rule].target = Target::Standard(verdict);
            }
        }

        Ok(Table {
            family,
            name: info.name.clone(),
            valid_hooks: info.valid_hooks,
            read_entries: raw.len() as u32 + 1,
            chains,
            end: last.entry,
        })
    }

    /// Names of the chains, built-in ones included, in table order.
    pub fn chains(&self) -> Vec<&str> {
        self.chains.iter().map(|c| c.name.as_str()).collect()
    }

    /// The chain named `name`.
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }

    /// Removes every user-defined chain whose name matches `pred`, and every
    /// rule of the other chains whose standard target jumps (`-j`) or goes
    /// (`-g`) to one of them. Every other entry is kept as it was. The
    /// `iptables` equivalent is `-D` of each such rule, then `-F` and `-X` of
    /// each such chain.
    pub fn remove_chains(&mut self, mut pred: impl FnMut(&str) -> bool) -> Removed {
        let mut removed = Removed::default();
        let doomed: Vec<String> = self
            .chains
            .iter()
            .filter(|c| c.is_user() && pred(&c.name))
            .map(|c| c.name.clone())
            .collect();
        if doomed.is_empty() {
            return removed;
        }
        self.chains.retain(|c| !doomed.contains(&c.name));
        for chain in &mut self.chains {
            let mut n = 0;
            chain.rules.retain(|r| {
                n += 1;
                match r.jump_target() {
                    Some(to) if doomed.iter().any(|d| d == to) => {
                        removed.rules.push(RemovedRule {
                            table: self.name.clone(),
                            chain: chain.name.clone(),
                            position: n,
                            target: to.to_string(),
                        });
                        false
                    }
                    _ => true,
                }
            });
        }
        removed.chains = doomed.into_iter().map(|c| (self.name.clone(), c)).collect();
        removed
    }

    /// Lays the table out: entries in chain order, every jump, `hook_entry`
    /// and `underflow` recomputed.
    pub fn emit(&self) -> Result<Emitted, EmitError> {
        let family = self.family;
        // Pass 1: offsets.
        let mut starts: HashMap<&str, usize> = HashMap::new();
        let mut hook_entry = [u32::MAX; NF_INET_NUMHOOKS];
        let mut underflow = [u32::MAX; NF_INET_NUMHOOKS];
        let mut offset = 0usize;
        let mut num_entries = 0u32;
        for chain in &self.chains {
            if let ChainKind::User { head } = &chain.kind {
                offset += head.len(family);
                num_entries += 1;
            }
            let Some(last) = chain.rules.last() else {
                return Err(EmitError::EmptyChain(chain.name.clone()));
            };
            if starts.insert(&chain.name, offset).is_some() {
                return Err(EmitError::DuplicateChain(chain.name.clone()));
            }
            let first = offset;
            for r in &chain.rules {
                offset += r.len(family);
                num_entries += 1;
            }
            if let ChainKind::Builtin { hook } = chain.kind {
                if hook >= NF_INET_NUMHOOKS {
                    return Err(EmitError::BadHook(hook));
                }
                hook_entry[hook] = first as u32;
                underflow[hook] = (offset - last.len(family)) as u32;
            }
        }
        let size = offset + self.end.len(family);
        num_entries += 1;

        // Pass 2: bytes.
        let mut out = vec![0u8; size];
        let mut origins = Vec::with_capacity(num_entries as usize);
        let mut at = 0;
        for chain in &self.chains {
            if let ChainKind::User { head } = &chain.kind {
                let mut head = head.clone();
                head.target = Target::Error(chain.name.clone());
                at = emit_entry(family, &head, &mut out, at, &starts)?;
                origins.push(head.origin);
            }
            for r in &chain.rules {
                at = emit_entry(family, r, &mut out, at, &starts)?;
                origins.push(r.origin);
            }
        }
        emit_entry(family, &self.end, &mut out, at, &starts)?;
        origins.push(self.end.origin);
        Ok(Emitted {
            entries: out,
            num_entries,
            hook_entry,
            underflow,
            origins,
        })
    }
}

/// What [`Table::remove_chains`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// `(table, chain)` of every removed user-defined chain.
    pub chains: Vec<(String, String)>,
    /// Every rule removed from a kept chain because it jumped to a removed chain.
    pub rules: Vec<RemovedRule>,
}

impl Removed {
    /// True when nothing was removed.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.rules.is_empty()
    }

    /// Appends `other`.
    pub fn extend(&mut self, other: Removed) {
        self.chains.extend(other.chains);
        self.rules.extend(other.rules);
    }
}

/// A rule removed because it jumped to a removed chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedRule {
    /// Table.
    pub table: String,
    /// Chain the rule was in.
    pub chain: String,
    /// Its 1-based position in that chain before the removal (as
    /// `iptables -L --line-numbers`).
    pub position: usize,
    /// The removed chain it jumped to.
    pub target: String,
}
