//! kube-proxy's state in the kernel: found, reported and removed, with no exec.
//!
//! What kube-proxy leaves, by mode and backend (all by its known names):
//! - nftables mode: the tables `ip kube-proxy` and `ip6 kube-proxy`, its own;
//! - iptables mode over iptables-nft: `KUBE-*` chains in the nf_tables tables `ip`/`ip6`
//!   `nat`, `filter` and `mangle` (upstream's names: [`is_kube_proxy_chain`]), and
//!   the rules of other chains that jump or go to them (`-A PREROUTING … -j
//!   KUBE-SERVICES`);
//! - iptables mode over iptables-legacy: the same in x_tables (see
//!   [`kube_nlproxy_netlink::xtables`]).
//! - ipvs mode: adopted by our ipvs mode, removed by nftables mode at start.
//!
//! Nothing else in those tables is touched: another program's rules, iptables' own
//! base chains and their policies stay byte for byte. Upstream kube-proxy removes the
//! other modes' state at start the same way (`platformCleanup`); we do it right after
//! our first successful sync, so that no moment is without service rules.

use kube_nlproxy_netlink::nft::{Family, ForeignTable, NftError, NftSocket, Op};
use kube_nlproxy_netlink::xtables;
use serde::{Deserialize, Serialize};

/// kube-proxy's nftables-mode table, in families `ip` and `ip6`.
pub const KUBE_PROXY_TABLE: &str = "kube-proxy";
/// The iptables tables kube-proxy's iptables mode writes to.
pub const IPTABLES_TABLES: [&str; 3] = ["nat", "filter", "mangle"];

/// Whether `chain` is one of kube-proxy's iptables chains, by upstream's names
/// (`KUBE-SERVICES`, `KUBE-SVC-…`, `KUBE-SEP-…`, …); the kubelet's `KUBE-FIREWALL`,
/// `KUBE-KUBELET-CANARY` and `KUBE-IPTABLES-HINT` are not.
pub use kube_nlproxy_netlink::xtables::is_kube_proxy_chain;

/// What kube-proxy left in the kernel, one line per object (`ip kube-proxy`,
/// `ip nat KUBE-SERVICES`), by backend.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeProxyState {
    /// nftables mode's tables: `ip kube-proxy`, `ip6 kube-proxy`.
    pub nftables: Vec<String>,
    /// iptables mode through iptables-nft: `FAMILY TABLE CHAIN` of each chain.
    pub iptables_nft: Vec<String>,
    /// iptables mode through iptables-legacy: `FAMILY TABLE CHAIN` of each chain.
    pub iptables_legacy: Vec<String>,
}

impl KubeProxyState {
    /// Nothing of kube-proxy's is there.
    pub fn is_empty(&self) -> bool {
        self.nftables.is_empty() && self.iptables_nft.is_empty() && self.iptables_legacy.is_empty()
    }

    /// Objects per backend (`nftables`, `iptables-nft`, `iptables-legacy`).
    pub fn counts(&self) -> [(&'static str, usize); 3] {
        [
            ("nftables", self.nftables.len()),
            ("iptables-nft", self.iptables_nft.len()),
            ("iptables-legacy", self.iptables_legacy.len()),
        ]
    }

    /// One line for people: `nftables: ip kube-proxy; iptables-nft: 14 KUBE-* chains (ip nat KUBE-SERVICES, …)`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if !self.nftables.is_empty() {
            parts.push(format!(
                "nftables mode's tables {}",
                self.nftables.join(", ")
            ));
        }
        for (backend, chains) in [
            ("iptables-nft", &self.iptables_nft),
            ("iptables-legacy", &self.iptables_legacy),
        ] {
            if !chains.is_empty() {
                let shown: Vec<&str> = chains.iter().take(3).map(String::as_str).collect();
                let more = if chains.len() > 3 { ", …" } else { "" };
                parts.push(format!(
                    "iptables mode's {} chains through {backend} ({}{more})",
                    chains.len(),
                    shown.join(", ")
                ));
            }
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join("; ")
        }
    }
}

/// Finding or removing kube-proxy's state failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeProxyStateError {
    /// Reading or changing nf_tables (kube-proxy's table, iptables-nft's tables).
    #[error("kube-proxy's nf_tables state")]
    Nftables(#[source] NftError),
    /// Reading or rewriting x_tables (iptables-legacy).
    #[error("kube-proxy's iptables-legacy state")]
    Xtables(#[source] xtables::XtablesError),
}

/// The operations that remove kube-proxy's chains from one iptables-nft table
/// `table` of `family`, as `state` holds it: first every rule of another chain that
/// jumps or goes to one of them, then each `KUBE-*` chain with its rules. Empty when
/// the table has none. Pure.
pub fn iptables_nft_removal(family: Family, table: &str, state: &ForeignTable) -> Vec<Op> {
    let mut ops = Vec::new();
    for rule in &state.rules {
        if !is_kube_proxy_chain(&rule.chain) && rule.jumps_to.iter().any(|c| is_kube_proxy_chain(c))
        {
            ops.push(Op::DeleteRule {
                family,
                table: table.to_string(),
                chain: rule.chain.clone(),
                handle: rule.handle,
            });
        }
    }
    let chains: Vec<&String> = state
        .chains
        .iter()
        .filter(|c| is_kube_proxy_chain(c))
        .collect();
    // Their rules first (they jump to each other), then the chains, all in one
    // transaction.
    for chain in &chains {
        ops.push(Op::FlushChain {
            family,
            table: table.to_string(),
            name: chain.to_string(),
        });
    }
    for chain in &chains {
        ops.push(Op::DeleteChain {
            family,
            table: table.to_string(),
            name: chain.to_string(),
        });
    }
    ops
}

/// kube-proxy's state in nf_tables, and the operations that remove it.
fn nftables_state(sock: &mut NftSocket) -> Result<(KubeProxyState, Vec<Op>), NftError> {
    let mut found = KubeProxyState::default();
    let mut ops = Vec::new();
    for family in [Family::Ipv4, Family::Ipv6] {
        if sock.dump_foreign_table(family, KUBE_PROXY_TABLE)?.is_some() {
            found
                .nftables
                .push(format!("{} {KUBE_PROXY_TABLE}", family.nft_name()));
            ops.push(Op::DeleteTable {
                family,
                name: KUBE_PROXY_TABLE.to_string(),
            });
        }
        for table in IPTABLES_TABLES {
            let Some(state) = sock.dump_foreign_table(family, table)? else {
                continue;
            };
            found.iptables_nft.extend(
                state
                    .chains
                    .iter()
                    .filter(|c| is_kube_proxy_chain(c))
                    .map(|c| format!("{} {table} {c}", family.nft_name())),
            );
            ops.extend(iptables_nft_removal(family, table, &state));
        }
    }
    Ok((found, ops))
}

/// `ip` or `ip6`, as the other backends' lines say it.
fn xtables_family_name(family: xtables::Family) -> &'static str {
    match family {
        xtables::Family::Ipv4 => "ip",
        xtables::Family::Ipv6 => "ip6",
    }
}

const XTABLES_FAMILIES: [xtables::Family; 2] = [xtables::Family::Ipv4, xtables::Family::Ipv6];

/// kube-proxy's iptables-legacy chains (x_tables), `FAMILY TABLE CHAIN` each.
fn xtables_state() -> Result<Vec<String>, xtables::XtablesError> {
    let mut found = Vec::new();
    for family in XTABLES_FAMILIES {
        for (table, chain) in xtables::kube_proxy_state(family)? {
            found.push(format!("{} {table} {chain}", xtables_family_name(family)));
        }
    }
    Ok(found)
}

/// What kube-proxy left in the kernel (reads only).
pub fn detect(sock: &mut NftSocket) -> Result<KubeProxyState, KubeProxyStateError> {
    let (mut found, _) = nftables_state(sock).map_err(KubeProxyStateError::Nftables)?;
    found.iptables_legacy = xtables_state().map_err(KubeProxyStateError::Xtables)?;
    Ok(found)
}

/// Removes kube-proxy's state: its nftables tables and its iptables-nft chains in one
/// nf_tables transaction, then its iptables-legacy chains table by table. Returns
/// what was removed.
pub fn remove(sock: &mut NftSocket) -> Result<KubeProxyState, KubeProxyStateError> {
    let (mut found, ops) = nftables_state(sock).map_err(KubeProxyStateError::Nftables)?;
    if !ops.is_empty() {
        sock.apply(&ops).map_err(KubeProxyStateError::Nftables)?;
    }
    for family in XTABLES_FAMILIES {
        let removed =
            xtables::remove_kube_proxy_state(family).map_err(KubeProxyStateError::Xtables)?;
        found.iptables_legacy.extend(
            removed
                .chains
                .iter()
                .map(|(table, chain)| format!("{} {table} {chain}", xtables_family_name(family))),
        );
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_nlproxy_netlink::nft::ForeignRule;

    fn rule(chain: &str, handle: u64, jumps_to: &[&str]) -> ForeignRule {
        ForeignRule {
            table: "nat".into(),
            chain: chain.into(),
            handle,
            jumps_to: jumps_to.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn removal_takes_kube_chains_and_the_jumps_to_them_only() {
        let table = ForeignTable {
            chains: [
                "PREROUTING",
                "OUTPUT",
                "POSTROUTING",
                "KUBE-SERVICES",
                "KUBE-SVC-ABC",
                "KUBE-POSTROUTING",
                "KUBE-FIREWALL",
                "DOCKER",
            ]
            .map(String::from)
            .to_vec(),
            rules: vec![
                rule("PREROUTING", 2, &["KUBE-SERVICES"]),
                rule("PREROUTING", 3, &["DOCKER"]),
                rule("OUTPUT", 4, &["KUBE-SERVICES"]),
                rule("OUTPUT", 5, &[]),
                rule("POSTROUTING", 6, &["KUBE-POSTROUTING"]),
                rule("OUTPUT", 9, &["KUBE-FIREWALL"]),
                rule("KUBE-SERVICES", 7, &["KUBE-SVC-ABC"]),
                rule("DOCKER", 8, &[]),
            ],
        };
        let ops = iptables_nft_removal(Family::Ipv4, "nat", &table);
        let text: Vec<String> = ops.iter().map(|o| o.to_string()).collect();
        assert_eq!(
            text,
            [
                "delete rule ip nat PREROUTING handle 2",
                "delete rule ip nat OUTPUT handle 4",
                "delete rule ip nat POSTROUTING handle 6",
                "flush chain ip nat KUBE-SERVICES",
                "flush chain ip nat KUBE-SVC-ABC",
                "flush chain ip nat KUBE-POSTROUTING",
                "delete chain ip nat KUBE-SERVICES",
                "delete chain ip nat KUBE-SVC-ABC",
                "delete chain ip nat KUBE-POSTROUTING",
            ]
        );
    }

    #[test]
    fn a_table_without_kube_chains_is_left_alone() {
        let table = ForeignTable {
            chains: vec!["INPUT".into(), "DOCKER".into()],
            rules: vec![rule("INPUT", 1, &["DOCKER"])],
        };
        assert!(iptables_nft_removal(Family::Ipv6, "filter", &table).is_empty());
    }

    #[test]
    fn summary_names_each_backend() {
        let s = KubeProxyState {
            nftables: vec!["ip kube-proxy".into()],
            iptables_nft: (0..5).map(|i| format!("ip nat KUBE-SVC-{i}")).collect(),
            iptables_legacy: vec![],
        };
        assert_eq!(
            s.summary(),
            "nftables mode's tables ip kube-proxy; iptables mode's 5 chains through \
             iptables-nft (ip nat KUBE-SVC-0, ip nat KUBE-SVC-1, ip nat KUBE-SVC-2, …)"
        );
        assert_eq!(KubeProxyState::default().summary(), "none");
        assert!(KubeProxyState::default().is_empty());
    }
}
