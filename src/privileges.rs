//! Least privilege: at start the daemon keeps only the capabilities its run needs
//! and sets `no_new_privs`.
//!
//! What needs what (measured on kernel 6.18 as uid 0, see SECURITY.md):
//! - every netlink request we send (nf_tables, IPVS, ipset, rtnetlink, ctnetlink)
//!   and `net.ipv4.ip_forward`: `CAP_NET_ADMIN`;
//! - binding `--healthz-bind-address`/`--metrics-bind-address` to a port below
//!   `net.ipv4.ip_unprivileged_port_start`: `CAP_NET_BIND_SERVICE` (the defaults,
//!   10256 and 10249, need nothing);
//! - lowering `/proc/self/oom_score_adj` (`oomScoreAdj`, -999 by default):
//!   `CAP_SYS_RESOURCE`, held in the permitted set only until
//!   [`Privileges::drop_sys_resource`];
//! - the conntrack sysctls (`nf_conntrack_max`, the hash size, the per-namespace
//!   timeouts) and the IPVS sysctls: no capability; uid 0 owns the files.
//!   [`Privileges::with_sys_resource`] may still wrap them.
//!
//! Capabilities, the bounding set and `no_new_privs` belong to each thread and are
//! inherited at `clone`, so [`Privileges::drop_to`] must run before any other thread
//! exists (it checks). [`Privileges::drop_sys_resource`] checks every thread.

use std::fmt;
use std::net::SocketAddr;

use rustix::thread::{self as rt, CapabilitySet, CapabilitySets};

use crate::config::{Command, Config};

/// Errors while dropping privileges.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// Reading the capability sets (`capget`) failed.
    #[error("reading the capability sets failed")]
    Capget(#[source] std::io::Error),
    /// Setting the capability sets (`capset`) failed.
    #[error("setting the capability sets to {wanted} failed")]
    Capset {
        /// the permitted set asked for
        wanted: Caps,
        /// the kernel's answer
        #[source]
        source: std::io::Error,
    },
    /// `PR_CAPBSET_DROP` failed.
    #[error("removing {cap} from the bounding set failed")]
    BoundingDrop {
        /// the capability
        cap: Caps,
        /// the kernel's answer
        #[source]
        source: std::io::Error,
    },
    /// `PR_CAP_AMBIENT_CLEAR_ALL` failed.
    #[error("clearing the ambient set failed")]
    AmbientClear(#[source] std::io::Error),
    /// `PR_SET_NO_NEW_PRIVS` failed.
    #[error("setting no_new_privs failed")]
    NoNewPrivs(#[source] std::io::Error),
    /// Reading `/proc/self/task` failed.
    #[error("reading /proc/self/task failed")]
    Threads(#[source] std::io::Error),
    /// Other threads exist: they would keep what this thread drops.
    #[error("{0} threads are running; privileges must be dropped while there is one")]
    ThreadsRunning(usize),
    /// A thread still holds a capability after the drop.
    #[error("thread {tid} still holds {extra}")]
    ThreadKeeps {
        /// the thread id
        tid: String,
        /// what it holds beyond the kept set
        extra: Caps,
    },
}

/// A set of capabilities, printed by name (`CAP_NET_ADMIN,CAP_SYS_RESOURCE`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Caps(pub u64);

const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

impl Caps {
    /// No capability.
    pub const NONE: Caps = Caps(0);
    /// `CAP_NET_BIND_SERVICE`
    pub const NET_BIND_SERVICE: Caps = Caps(CapabilitySet::NET_BIND_SERVICE.bits());
    /// `CAP_NET_ADMIN`
    pub const NET_ADMIN: Caps = Caps(CapabilitySet::NET_ADMIN.bits());
    /// `CAP_NET_RAW`
    pub const NET_RAW: Caps = Caps(CapabilitySet::NET_RAW.bits());
    /// `CAP_SYS_RESOURCE`
    pub const SYS_RESOURCE: Caps = Caps(CapabilitySet::SYS_RESOURCE.bits());
    /// `CAP_SETPCAP`
    pub const SETPCAP: Caps = Caps(CapabilitySet::SETPCAP.bits());

    /// Whether every capability of `other` is in `self`.
    pub fn contains(self, other: Caps) -> bool {
        self.0 & other.0 == other.0
    }

    /// The capabilities of `self` not in `other`.
    #[must_use]
    pub fn without(self, other: Caps) -> Caps {
        Caps(self.0 & !other.0)
    }

    /// Both sets together.
    #[must_use]
    pub fn with(self, other: Caps) -> Caps {
        Caps(self.0 | other.0)
    }

    /// The names, e.g. `["CAP_NET_ADMIN"]` (`cap_41` past the known ones).
    pub fn names(self) -> Vec<String> {
        (0..64)
            .filter(|bit| self.0 & (1 << bit) != 0)
            .map(|bit| match NAMES.get(bit) {
                Some(n) => (*n).to_string(),
                None => format!("cap_{bit}"),
            })
            .collect()
    }

    /// The names without `CAP_`, as a Pod's `securityContext.capabilities.add`
    /// spells them (`NET_ADMIN`).
    pub fn pod_names(self) -> Vec<String> {
        self.names()
            .into_iter()
            .map(|n| n.trim_start_matches("CAP_").to_string())
            .collect()
    }
}

impl fmt::Display for Caps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("no capability");
        }
        f.write_str(&self.names().join(","))
    }
}

impl fmt::Debug for Caps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Caps({self})")
    }
}

/// What a run needs from the kernel beyond what uid 0 has without capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    /// Netlink: always true for the commands that touch the dataplane.
    pub net_admin: bool,
    /// A raw IP socket, for iptables-legacy's x_tables (kube-proxy's state: read
    /// and removed through `IPT_SO_*` socket options).
    pub net_raw: bool,
    /// Addresses the run binds (health and metrics servers).
    pub binds: Vec<SocketAddr>,
    /// Whether the run lowers `oom_score_adj` (or writes anything else that needs
    /// `CAP_SYS_RESOURCE`) before [`Privileges::drop_sys_resource`].
    pub sys_resource: bool,
}

/// Parses a bind-address flag like the daemon does: empty or `0` is off.
fn bind_flag(flag: &str) -> Option<SocketAddr> {
    if flag.is_empty() || flag == "0" {
        return None;
    }
    flag.parse().ok()
}

impl Needs {
    /// What `cfg`'s command needs: the daemon (`run` without `--once`) binds its
    /// health and metrics addresses and applies `oomScoreAdj`; `--once`, `plan`
    /// and `cleanup` only talk netlink.
    pub fn for_config(cfg: &Config) -> Needs {
        Self::for_config_with(cfg, legacy_xtables_in_use())
    }

    /// [`for_config`](Self::for_config), given whether this network namespace
    /// has iptables-legacy tables (pure). `CAP_NET_RAW` is kept where kube-proxy's
    /// legacy state may have to be read or removed: `status`, `cleanup
    /// --kube-proxy`, and the daemon when legacy tables exist at its start.
    pub fn for_config_with(cfg: &Config, legacy_xtables: bool) -> Needs {
        let daemon = cfg.command == Command::Run && !cfg.once;
        let net_raw = match cfg.command {
            Command::Status => true,
            Command::Cleanup => cfg.cleanup_kube_proxy,
            Command::Run => daemon && legacy_xtables,
            _ => false,
        };
        let binds = if daemon {
            [&cfg.healthz_bind_address, &cfg.metrics_bind_address]
                .into_iter()
                .filter_map(|f| bind_flag(f))
                .collect()
        } else {
            Vec::new()
        };
        Needs {
            net_admin: true,
            net_raw,
            binds,
            sys_resource: daemon && cfg.oom_score_adj.is_some(),
        }
    }

    /// The capabilities kept for the whole run, given the network namespace's
    /// `net.ipv4.ip_unprivileged_port_start` (pure).
    pub fn kept(&self, unprivileged_port_start: u16) -> Caps {
        let mut caps = Caps::NONE;
        if self.net_admin {
            caps = caps.with(Caps::NET_ADMIN);
        }
        if self.net_raw {
            caps = caps.with(Caps::NET_RAW);
        }
        if self
            .binds
            .iter()
            .any(|a| a.port() != 0 && a.port() < unprivileged_port_start)
        {
            caps = caps.with(Caps::NET_BIND_SERVICE);
        }
        caps
    }
}

/// Whether this network namespace has iptables-legacy tables (IPv4 or IPv6):
/// the kernel lists them in `/proc/thread-self/net/ip{,6}_tables_names` (empty or
/// absent when none exists; reading creates none).
pub fn legacy_xtables_in_use() -> bool {
    ["ip_tables_names", "ip6_tables_names"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/thread-self/net/{f}"))
            .is_ok_and(|s| !s.trim().is_empty())
    })
}

/// `net.ipv4.ip_unprivileged_port_start` of our network namespace (1024 when it
/// cannot be read, the kernel's default).
pub fn unprivileged_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024)
}

/// The highest capability number this kernel knows.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
        .min(63)
}

fn sets() -> Result<CapabilitySets, PrivilegeError> {
    rt::capabilities(None).map_err(|e| PrivilegeError::Capget(e.into()))
}

fn set(effective: Caps, permitted: Caps) -> Result<(), PrivilegeError> {
    rt::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::from_bits_retain(effective.0),
            permitted: CapabilitySet::from_bits_retain(permitted.0),
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(|e| PrivilegeError::Capset {
        wanted: permitted,
        source: e.into(),
    })
}

/// Removes from the bounding set every capability not in `keep`; needs
/// `CAP_SETPCAP` in the effective set.
fn shrink_bounding(keep: Caps) -> Result<(), PrivilegeError> {
    for bit in 0..=last_cap() {
        let cap = Caps(1 << bit);
        if keep.contains(cap) {
            continue;
        }
        let one = CapabilitySet::from_bits_retain(cap.0);
        if rt::capability_is_in_bounding_set(one).unwrap_or(false) {
            rt::remove_capability_from_bounding_set(one).map_err(|e| {
                PrivilegeError::BoundingDrop {
                    cap,
                    source: e.into(),
                }
            })?;
        }
    }
    Ok(())
}

/// The thread ids of this process.
fn threads() -> Result<Vec<String>, PrivilegeError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").map_err(PrivilegeError::Threads)? {
        let entry = entry.map_err(PrivilegeError::Threads)?;
        out.push(entry.file_name().to_string_lossy().into_owned());
    }
    Ok(out)
}

/// A `CapXxx:` line of `/proc/.../status`.
fn status_caps(status: &str, key: &str) -> Option<Caps> {
    status.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix(':')?;
        u64::from_str_radix(v.trim(), 16).ok().map(Caps)
    })
}

/// The capabilities this process runs with, after [`Privileges::drop_to`].
#[derive(Debug)]
pub struct Privileges {
    /// Kept for the whole run.
    kept: Caps,
    /// Held in the permitted set until [`Privileges::drop_sys_resource`]:
    /// `CAP_SYS_RESOURCE`, and `CAP_SETPCAP` when the process had it (to take
    /// `CAP_SYS_RESOURCE` out of the bounding set then). Empty once dropped.
    window: Caps,
}

impl Privileges {
    /// Drops every capability `needs` does not ask for from the effective,
    /// permitted, inheritable, ambient and bounding sets, and sets
    /// `no_new_privs`. `CAP_SYS_RESOURCE`, when needed, stays permitted (not
    /// effective) until [`Privileges::drop_sys_resource`]. A capability asked for
    /// that the process does not have is logged and left out. Must run while the
    /// process has one thread.
    pub fn drop_to(needs: &Needs) -> Result<Privileges, PrivilegeError> {
        let n = threads()?.len();
        if n != 1 {
            return Err(PrivilegeError::ThreadsRunning(n));
        }
        let now = sets()?;
        let permitted = Caps(now.permitted.bits());
        let wanted = needs.kept(unprivileged_port_start());
        let missing = wanted.without(permitted);
        if missing != Caps::NONE {
            tracing::warn!("running without {missing}: the process does not have it");
        }
        let kept = Caps(wanted.0 & permitted.0);
        let sys_resource = needs.sys_resource && permitted.contains(Caps::SYS_RESOURCE);
        if needs.sys_resource && !sys_resource {
            tracing::warn!(
                "running without CAP_SYS_RESOURCE: the process does not have it (oomScoreAdj cannot be lowered)"
            );
        }
        let setpcap = permitted.contains(Caps::SETPCAP);
        // Held until `drop_sys_resource`: SYS_RESOURCE, and SETPCAP (when we have
        // it) to take SYS_RESOURCE out of the bounding set then.
        let window = match (sys_resource, setpcap) {
            (false, _) => Caps::NONE,
            (true, false) => Caps::SYS_RESOURCE,
            (true, true) => Caps::SYS_RESOURCE.with(Caps::SETPCAP),
        };
        if setpcap {
            set(Caps(now.effective.bits()).with(Caps::SETPCAP), permitted)?;
            shrink_bounding(kept.with(window))?;
        } else {
            let bounding = bounding_now();
            if bounding.without(kept.with(window)) != Caps::NONE {
                tracing::warn!(
                    "cannot shrink the bounding set without CAP_SETPCAP; no_new_privs still keeps exec from gaining {}",
                    bounding.without(kept)
                );
            }
        }
        rt::clear_ambient_capability_set().map_err(|e| PrivilegeError::AmbientClear(e.into()))?;
        rt::set_no_new_privs(true).map_err(|e| PrivilegeError::NoNewPrivs(e.into()))?;
        set(kept, kept.with(window))?;
        tracing::info!(
            "capabilities: {kept}{}; no_new_privs set",
            if sys_resource {
                " (CAP_SYS_RESOURCE until start-up settings are written)"
            } else {
                ""
            }
        );
        Ok(Privileges { kept, window })
    }

    /// The capabilities kept for the whole run.
    pub fn kept(&self) -> Caps {
        self.kept
    }

    /// Whether `CAP_SYS_RESOURCE` is still held (permitted).
    pub fn holds_sys_resource(&self) -> bool {
        self.window.contains(Caps::SYS_RESOURCE)
    }

    /// Runs `f` with `CAP_SYS_RESOURCE` effective on this thread (when it is still
    /// held), then lowers it again. Without it, just runs `f`.
    pub fn with_sys_resource<T>(&self, f: impl FnOnce() -> T) -> Result<T, PrivilegeError> {
        if !self.holds_sys_resource() {
            return Ok(f());
        }
        let permitted = self.kept.with(self.window);
        set(self.kept.with(Caps::SYS_RESOURCE), permitted)?;
        let out = f();
        set(self.kept, permitted)?;
        Ok(out)
    }

    /// Drops `CAP_SYS_RESOURCE` (and `CAP_SETPCAP`) from every set of this
    /// thread (from the bounding set only when `CAP_SETPCAP` was held), then checks that no thread of the process holds more than
    /// [`Privileges::kept`]. Calling it again only repeats the check.
    pub fn drop_sys_resource(&mut self) -> Result<(), PrivilegeError> {
        if self.window != Caps::NONE {
            if self.window.contains(Caps::SETPCAP) {
                set(self.kept.with(Caps::SETPCAP), self.kept.with(self.window))?;
                shrink_bounding(self.kept)?;
            }
            // Without CAP_SETPCAP the bounding set keeps CAP_SYS_RESOURCE; with
            // no_new_privs and empty inheritable/ambient sets no exec can regain it.
            set(self.kept, self.kept)?;
            self.window = Caps::NONE;
            tracing::info!("dropped CAP_SYS_RESOURCE; capabilities: {}", self.kept);
        }
        self.check_threads()
    }

    /// Every thread holds at most [`Privileges::kept`] (effective, permitted,
    /// inheritable, ambient).
    fn check_threads(&self) -> Result<(), PrivilegeError> {
        for tid in threads()? {
            let Ok(status) = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
            else {
                continue; // the thread ended
            };
            for key in ["CapEff", "CapPrm", "CapInh", "CapAmb"] {
                if let Some(c) = status_caps(&status, key) {
                    let extra = c.without(self.kept);
                    if extra != Caps::NONE {
                        return Err(PrivilegeError::ThreadKeeps { tid, extra });
                    }
                }
            }
        }
        Ok(())
    }
}

/// This thread's bounding set.
fn bounding_now() -> Caps {
    let mut caps = Caps::NONE;
    for bit in 0..=last_cap() {
        let one = CapabilitySet::from_bits_retain(1 << bit);
        if rt::capability_is_in_bounding_set(one).unwrap_or(false) {
            caps = caps.with(Caps(1 << bit));
        }
    }
    caps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(args: &[&str]) -> Config {
        crate::config::parse_args(args.iter().map(|s| s.to_string())).unwrap()
    }

    #[test]
    fn the_daemon_needs_net_admin_and_sys_resource_only() {
        let n = Needs::for_config(&cfg(&["run"]));
        assert_eq!(
            n.binds,
            vec![
                "0.0.0.0:10256".parse().unwrap(),
                "127.0.0.1:10249".parse().unwrap()
            ]
        );
        assert!(n.sys_resource);
        assert_eq!(n.kept(1024), Caps::NET_ADMIN);
    }

    #[test]
    fn a_low_port_needs_net_bind_service() {
        let n = Needs::for_config(&cfg(&["run", "--healthz-bind-address=0.0.0.0:256"]));
        assert_eq!(n.kept(1024), Caps::NET_ADMIN.with(Caps::NET_BIND_SERVICE));
        // Unless the namespace lets anyone bind it.
        assert_eq!(n.kept(0), Caps::NET_ADMIN);
        assert_eq!(n.kept(256), Caps::NET_ADMIN);
        assert_eq!(n.kept(257), Caps::NET_ADMIN.with(Caps::NET_BIND_SERVICE));
        // A disabled server binds nothing.
        let n = Needs::for_config(&cfg(&[
            "run",
            "--healthz-bind-address=",
            "--metrics-bind-address=0",
        ]));
        assert!(n.binds.is_empty());
    }

    #[test]
    fn one_shot_commands_bind_nothing_and_keep_no_sys_resource() {
        for args in [&["run", "--once"][..], &["plan"], &["cleanup"]] {
            let n = Needs::for_config(&cfg(args));
            assert!(n.binds.is_empty(), "{args:?}");
            assert!(!n.sys_resource, "{args:?}");
            assert_eq!(n.kept(1024), Caps::NET_ADMIN, "{args:?}");
        }
        let mut c = cfg(&["run"]);
        c.oom_score_adj = None;
        assert!(
            !Needs::for_config(&c).sys_resource,
            "no oomScoreAdj to write"
        );
    }

    #[test]
    fn caps_print_by_name() {
        assert_eq!(
            Caps::NET_ADMIN.with(Caps::SYS_RESOURCE).to_string(),
            "CAP_NET_ADMIN,CAP_SYS_RESOURCE"
        );
        assert_eq!(Caps::NET_ADMIN.pod_names(), vec!["NET_ADMIN".to_string()]);
        assert_eq!(Caps(1 << 45).names(), vec!["cap_45".to_string()]);
        assert_eq!(Caps::NONE.to_string(), "no capability");
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000001000\n";
        assert_eq!(status_caps(status, "CapEff"), Some(Caps::NET_ADMIN));
        assert_eq!(status_caps(status, "CapInh"), Some(Caps::NONE));
        assert_eq!(status_caps(status, "CapBnd"), None);
    }
}
