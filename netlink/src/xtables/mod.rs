//! iptables-legacy's x_tables through the kernel's own socket options
//! (`IPT_SO_GET_INFO`, `IPT_SO_GET_ENTRIES`, `IPT_SO_SET_REPLACE` and their
//! `IP6T_` twins on a raw socket), as `iptables-legacy` itself talks to the
//! kernel. Used to find and remove what kube-proxy's iptables mode left behind
//! when it ran with the legacy backend. No program is run.
//!
//! The functions act on the network namespace of the calling thread.
//!
//! Two kernel facts shape the API:
//! - `IPT_SO_GET_INFO` on a table that does not exist yet *creates* it
//!   (built-in tables are instantiated per namespace on first use, and the
//!   `iptable_*` module is autoloaded), registering its netfilter hooks. So
//!   [`read_table`] first looks the table up in `/proc/net/ip_tables_names`
//!   (`ip6_tables_names`) and never asks the kernel about a table not listed
//!   there. The file is read through `/proc/thread-self/net`, since
//!   `/proc/self/net` is the namespace of the process's main thread.
//! - `IPT_SO_SET_REPLACE` carries `num_counters`, which the kernel compares with
//!   the table's current number of entries and answers `EAGAIN` when they
//!   differ, so a table changed since it was read is not overwritten;
//!   [`remove_chains`] then reads again and retries. Like `iptables -w`, the
//!   read-modify-write also holds `/run/xtables.lock`.
//!
//! [`codec`] holds the wire codec of entries and requests, [`table`] groups
//! entries into chains and lays them out again.

pub mod codec;
mod socket;
pub mod table;
#[cfg(test)]
mod tests;

use std::io;
use std::time::Duration;

use netlink_packet_core::DecodeError;

pub use self::codec::{
    Counters, EmitError, Emitted, Entry, Family, Match, TableInfo, Target, Verdict,
};
use self::codec::{GET_ENTRIES_LEN, add_counters_request, get_entries_request};
pub use self::socket::XT_LOCK_PATH;
use self::socket::{XtLock, XtSocket};
pub use self::table::{Chain, ChainKind, Removed, RemovedRule, Table};

/// The tables kube-proxy's iptables mode writes to.
pub const KUBE_PROXY_TABLES: [&str; 3] = ["nat", "filter", "mangle"];

/// How often a read-modify-write is tried when the table keeps changing.
const ATTEMPTS: usize = 5;
/// How long to wait for [`XT_LOCK_PATH`] (kube-proxy passes `-w 5`).
const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of x_tables requests, named by phase.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XtablesError {
    /// Opening the raw socket (needs `CAP_NET_RAW`).
    #[error("opening a raw socket for {}", family.cli())]
    SocketFailed {
        /// The family.
        family: Family,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Reading `/proc/net/ip_tables_names`.
    #[error("listing the {} tables", family.cli())]
    ListTablesFailed {
        /// The family.
        family: Family,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `IPT_SO_GET_INFO` failed (not for an absent table, which is `Ok(None)`).
    #[error("{} -t {table}: IPT_SO_GET_INFO failed", family.cli())]
    GetInfoFailed {
        /// The family.
        family: Family,
        /// The table.
        table: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `IPT_SO_GET_ENTRIES` failed (`EAGAIN` after every retry: the table kept changing).
    #[error("{} -t {table}: IPT_SO_GET_ENTRIES failed", family.cli())]
    GetEntriesFailed {
        /// The family.
        family: Family,
        /// The table.
        table: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `IPT_SO_SET_REPLACE` failed (`EAGAIN`: the table changed since it was read).
    #[error("{} -t {table}: IPT_SO_SET_REPLACE failed", family.cli())]
    ReplaceFailed {
        /// The family.
        family: Family,
        /// The table.
        table: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Waiting for [`XT_LOCK_PATH`].
    #[error("locking {XT_LOCK_PATH}")]
    LockFailed {
        /// Why (`EWOULDBLOCK` after the timeout).
        #[source]
        source: io::Error,
    },
    /// The kernel's table did not decode.
    #[error("decoding {context}")]
    Decode {
        /// What was decoded.
        context: String,
        /// Why.
        #[source]
        source: DecodeError,
    },
    /// A request could not be encoded (a table name too long), or a table could
    /// not be laid out for `IPT_SO_SET_REPLACE`.
    #[error("{} -t {table}: encoding the request", family.cli())]
    Emit {
        /// The family.
        family: Family,
        /// The table.
        table: String,
        /// Why.
        #[source]
        source: EmitError,
    },
}

impl XtablesError {
    /// The kernel errno of a failed socket option, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            XtablesError::SocketFailed { source, .. }
            | XtablesError::GetInfoFailed { source, .. }
            | XtablesError::GetEntriesFailed { source, .. }
            | XtablesError::ReplaceFailed { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

fn open(family: Family) -> Result<XtSocket, XtablesError> {
    XtSocket::open(family).map_err(|source| XtablesError::SocketFailed { family, source })
}

fn names_path(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "/proc/thread-self/net/ip_tables_names",
        Family::Ipv6 => "/proc/thread-self/net/ip6_tables_names",
    }
}

/// The legacy tables that exist in the calling thread's namespace
/// (`cat /proc/net/ip_tables_names`). Empty when `ip_tables` is not loaded.
/// Asks the kernel nothing, so it creates no table.
pub fn table_names(family: Family) -> Result<Vec<String>, XtablesError> {
    match std::fs::read_to_string(names_path(family)) {
        Ok(s) => Ok(s.lines().map(str::to_string).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(XtablesError::ListTablesFailed { family, source }),
    }
}

/// True for the errnos of a table or module that does not exist: `ENOENT`
/// (no such table), `ENOPROTOOPT` (no `ip_tables` socket options at all).
fn is_absent(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOPROTOOPT))
}

/// The table's `IPT_SO_GET_INFO` and its entries (`IPT_SO_GET_ENTRIES`) as
/// the kernel gave them, retried while the table changes between the two.
/// `Ok(None)` when the table does not exist; a table not listed in
/// [`table_names`] is not asked for, so none is created. The bytes
/// `iptables-legacy-save -t NAME` decodes.
pub fn read_raw(family: Family, name: &str) -> Result<Option<(TableInfo, Vec<u8>)>, XtablesError> {
    if !table_names(family)?.iter().any(|t| t == name) {
        return Ok(None);
    }
    let sock = open(family)?;
    read_raw_on(&sock, family, name)
}

fn read_raw_on(
    sock: &XtSocket,
    family: Family,
    name: &str,
) -> Result<Option<(TableInfo, Vec<u8>)>, XtablesError> {
    let emit_err = |source| XtablesError::Emit {
        family,
        table: name.to_string(),
        source,
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut req = TableInfo::request(name).map_err(emit_err)?;
        match sock.get_info(&mut req) {
            Ok(()) => {}
            Err(e) if is_absent(&e) => return Ok(None),
            Err(source) => {
                return Err(XtablesError::GetInfoFailed {
                    family,
                    table: name.to_string(),
                    source,
                });
            }
        }
        let info = TableInfo::parse(&req).map_err(|source| XtablesError::Decode {
            context: format!("{} -t {name} IPT_SO_GET_INFO", family.cli()),
            source,
        })?;
        let mut buf = get_entries_request(name, info.size).map_err(emit_err)?;
        match sock.get_entries(&mut buf) {
            Ok(()) => {}
            // The table's size changed after GET_INFO.
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && attempt < ATTEMPTS => continue,
            Err(source) => {
                return Err(XtablesError::GetEntriesFailed {
                    family,
                    table: name.to_string(),
                    source,
                });
            }
        }
        buf.drain(..GET_ENTRIES_LEN);
        return Ok(Some((info, buf)));
    }
}

/// Reads and decodes a table (`iptables-legacy-save -t NAME`). `Ok(None)` when
/// the table (or the `ip_tables` module) does not exist; the table is never
/// created by asking (see [`table_names`]).
pub fn read_table(family: Family, name: &str) -> Result<Option<Table>, XtablesError> {
    if !table_names(family)?.iter().any(|t| t == name) {
        return Ok(None);
    }
    let sock = open(family)?;
    read_table_on(&sock, family, name)
}

fn read_table_on(
    sock: &XtSocket,
    family: Family,
    name: &str,
) -> Result<Option<Table>, XtablesError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some((info, blob)) = read_raw_on(sock, family, name)? else {
            return Ok(None);
        };
        // A table replaced by one of the same size between GET_INFO and
        // GET_ENTRIES gives entries that do not fit the info (other hook
        // offsets or entry count): read both again.
        match Table::parse(family, &info, &blob) {
            Ok(t) if t.read_entries == info.num_entries => return Ok(Some(t)),
            Ok(_) | Err(_) if attempt < ATTEMPTS => continue,
            // The entries are self-consistent; their count is what a
            // replace must name.
            Ok(t) => return Ok(Some(t)),
            Err(source) => {
                return Err(XtablesError::Decode {
                    context: format!("{} -t {name} entries", family.cli()),
                    source,
                });
            }
        }
    }
}

/// Replaces the table in the kernel with `table` (`iptables-legacy-restore`
/// of one table, without `--noflush`), with `IPT_SO_SET_REPLACE`:
/// `num_counters` is [`Table::read_entries`], so the kernel refuses with
/// `EAGAIN` ([`XtablesError::ReplaceFailed`]) when the table changed since it
/// was read. The kernel zeroes the counters of a new table; as libiptc does,
/// every entry that came from the kernel ([`Entry::origin`]) then gets back the
/// final counters of its old self with `IPT_SO_SET_ADD_COUNTERS`.
pub fn write_table(table: &Table) -> Result<(), XtablesError> {
    let sock = open(table.family)?;
    write_table_on(&sock, table)
}

fn write_table_on(sock: &XtSocket, table: &Table) -> Result<(), XtablesError> {
    let family = table.family;
    let layout: Emitted = table.emit().map_err(|source| XtablesError::Emit {
        family,
        table: table.name.clone(),
        source,
    })?;
    let old = sock
        .replace(&table.name, table.valid_hooks, &layout, table.read_entries)
        .map_err(|source| XtablesError::ReplaceFailed {
            family,
            table: table.name.clone(),
            source,
        })?;
    let counters: Vec<Counters> = layout
        .origins
        .iter()
        .map(|o| {
            o.and_then(|i| old.get(i as usize).copied())
                .unwrap_or_default()
        })
        .collect();
    if counters.iter().any(|c| *c != Counters::default()) {
        // The new table is in place; losing its counters is not worth failing for.
        let res = add_counters_request(&table.name, &counters)
            .map_err(io::Error::other)
            .and_then(|req| sock.add_counters(&req));
        if let Err(e) = res {
            tracing::warn!(
                "{} -t {}: carrying counters over the replace: {e}",
                family.cli(),
                table.name
            );
        }
    }
    Ok(())
}

/// Removes from one table every user-defined chain whose name matches `pred`
/// and every rule jumping to one ([`Table::remove_chains`]), then writes the
/// table back if anything was removed (`iptables -t T -D ...`, `-F`, `-X`).
/// Holds [`XT_LOCK_PATH`]; when the table changes under us (`EAGAIN`), reads it
/// again and retries. A table that does not exist removes nothing.
pub fn remove_chains(
    family: Family,
    table: &str,
    mut pred: impl FnMut(&str) -> bool,
) -> Result<Removed, XtablesError> {
    if !table_names(family)?.iter().any(|t| t == table) {
        return Ok(Removed::default());
    }
    let _lock =
        XtLock::acquire(LOCK_TIMEOUT).map_err(|source| XtablesError::LockFailed { source })?;
    let sock = open(family)?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(mut t) = read_table_on(&sock, family, table)? else {
            return Ok(Removed::default());
        };
        let removed = t.remove_chains(&mut pred);
        if removed.is_empty() {
            return Ok(removed);
        }
        match write_table_on(&sock, &t) {
            Ok(()) => return Ok(removed),
            Err(e) if e.errno() == Some(libc::EAGAIN) && attempt < ATTEMPTS => {
                tracing::debug!(
                    "{} -t {table} changed while we removed chains, retrying",
                    family.cli()
                );
            }
            Err(e) => return Err(e),
        }
    }
}

/// kube-proxy's own chains, by their names in upstream's iptables and ipvs
/// proxiers (`pkg/proxy/iptables`, `pkg/proxy/ipvs`).
pub const KUBE_PROXY_CHAINS: [&str; 13] = [
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-PROXY-CANARY",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// The prefixes of kube-proxy's per-Service and per-endpoint chains.
pub const KUBE_PROXY_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-FW-",
    "KUBE-EXT-",
    "KUBE-SEP-",
];

/// True for the chains kube-proxy creates: [`KUBE_PROXY_CHAINS`] and the
/// per-Service chains of [`KUBE_PROXY_CHAIN_PREFIXES`]. The kubelet's chains
/// (`KUBE-FIREWALL`, `KUBE-KUBELET-CANARY`, `KUBE-IPTABLES-HINT`) and any other
/// `KUBE-` chain are not kube-proxy's.
pub fn is_kube_proxy_chain(name: &str) -> bool {
    KUBE_PROXY_CHAINS.contains(&name)
        || KUBE_PROXY_CHAIN_PREFIXES
            .iter()
            .any(|p| name.starts_with(p))
}

/// The `KUBE-*` user-defined chains in the legacy `nat`, `filter` and
/// `mangle` tables, as `(table, chain)` (`iptables-legacy-save | grep '^:KUBE-'`).
/// Tables that do not exist are skipped (and not created).
pub fn kube_proxy_state(family: Family) -> Result<Vec<(String, String)>, XtablesError> {
    let mut out = Vec::new();
    for name in KUBE_PROXY_TABLES {
        if let Some(t) = read_table(family, name)? {
            out.extend(
                t.chains
                    .iter()
                    .filter(|c| c.is_user() && is_kube_proxy_chain(&c.name))
                    .map(|c| (name.to_string(), c.name.clone())),
            );
        }
    }
    Ok(out)
}

/// Removes kube-proxy's iptables-mode state from the legacy `nat`, `filter`
/// and `mangle` tables: every `KUBE-*` user-defined chain and every rule
/// jumping to one, as [`remove_chains`] (what `kube-proxy --cleanup` does for
/// the iptables mode). Only tables that exist are read, and a table without
/// such a chain is not written.
pub fn remove_kube_proxy_state(family: Family) -> Result<Removed, XtablesError> {
    let mut removed = Removed::default();
    for name in KUBE_PROXY_TABLES {
        removed.extend(remove_chains(family, name, is_kube_proxy_chain)?);
    }
    Ok(removed)
}
