//! Host settings kube-proxy applies at start-up: the `conntrack` block and
//! `oomScoreAdj`. Written through /proc and /sys like any other file — never by
//! running `sysctl`. A setting the kernel refuses (e.g. `nf_conntrack_max` inside a
//! network namespace, a read-only /sys in a container) is a warning, not a failure.

use std::path::Path;
use std::time::Duration;

/// The `conntrack` block of a KubeProxyConfiguration (kube-proxy's defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// `maxPerCore` (32768): `nf_conntrack_max` = max(maxPerCore × CPUs, min).
    pub max_per_core: u32,
    /// `min` (131072)
    pub min: u32,
    /// `tcpEstablishedTimeout` (24h; 0 = leave as is)
    pub tcp_established_timeout: Duration,
    /// `tcpCloseWaitTimeout` (1h; 0 = leave as is)
    pub tcp_close_wait_timeout: Duration,
    /// `tcpBeLiberal` (false)
    pub tcp_be_liberal: bool,
    /// `udpTimeout` (0 = leave as is)
    pub udp_timeout: Duration,
    /// `udpStreamTimeout` (0 = leave as is)
    pub udp_stream_timeout: Duration,
}

impl Default for ConntrackSettings {
    fn default() -> Self {
        ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            tcp_established_timeout: Duration::from_secs(24 * 3600),
            tcp_close_wait_timeout: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }
}

/// A sysctl write: the /proc/sys (or /sys) path and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlWrite {
    /// Path of the file.
    pub path: String,
    /// Value written.
    pub value: String,
}

const NETFILTER: &str = "/proc/sys/net/netfilter";
const HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";

/// What the conntrack block asks for, given the number of CPUs and the current
/// `nf_conntrack_max` and hash size (pure: tests check it without touching the host).
pub fn conntrack_writes(
    c: &ConntrackSettings,
    cpus: u32,
    current_max: Option<u64>,
    current_hashsize: Option<u64>,
) -> Vec<SysctlWrite> {
    let mut out = Vec::new();
    let max = (u64::from(c.max_per_core) * u64::from(cpus)).max(u64::from(c.min));
    if c.max_per_core > 0 && max > 0 && current_max.is_none_or(|m| m < max) {
        // Like kube-proxy: the limit, and the hash table grown to max/4. The limit
        // goes first: where it is not writable (a network namespace), the global
        // hash size must not change either (see `apply_conntrack`).
        out.push(SysctlWrite {
            path: format!("{NETFILTER}/nf_conntrack_max"),
            value: max.to_string(),
        });
        if current_hashsize.is_none_or(|h| h < max / 4) {
            out.push(SysctlWrite {
                path: HASHSIZE.into(),
                value: (max / 4).to_string(),
            });
        }
    }
    let mut secs = |name: &str, d: Duration| {
        if !d.is_zero() {
            out.push(SysctlWrite {
                path: format!("{NETFILTER}/{name}"),
                value: d.as_secs().to_string(),
            });
        }
    };
    secs(
        "nf_conntrack_tcp_timeout_established",
        c.tcp_established_timeout,
    );
    secs(
        "nf_conntrack_tcp_timeout_close_wait",
        c.tcp_close_wait_timeout,
    );
    secs("nf_conntrack_udp_timeout", c.udp_timeout);
    secs("nf_conntrack_udp_timeout_stream", c.udp_stream_timeout);
    if c.tcp_be_liberal {
        out.push(SysctlWrite {
            path: format!("{NETFILTER}/nf_conntrack_tcp_be_liberal"),
            value: "1".into(),
        });
    }
    out
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Writes one value unless the file already holds it. Errors are returned for the
/// caller to log.
pub fn write_sysctl(w: &SysctlWrite) -> std::io::Result<bool> {
    let path = Path::new(&w.path);
    if std::fs::read_to_string(path).is_ok_and(|cur| cur.trim() == w.value) {
        return Ok(false);
    }
    std::fs::write(path, &w.value)?;
    Ok(true)
}

/// Applies the conntrack block; returns what was written, logging what could not be.
pub fn apply_conntrack(c: &ConntrackSettings) -> Vec<SysctlWrite> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let writes = conntrack_writes(
        c,
        cpus,
        read_u64(&format!("{NETFILTER}/nf_conntrack_max")),
        read_u64(HASHSIZE),
    );
    let mut done = Vec::new();
    let mut max_refused = false;
    for w in writes {
        if w.path == HASHSIZE && max_refused {
            continue;
        }
        match write_sysctl(&w) {
            Ok(true) => {
                tracing::info!("set {} = {}", w.path, w.value);
                done.push(w);
            }
            Ok(false) => {}
            Err(e) => {
                max_refused |= w.path.ends_with("nf_conntrack_max");
                tracing::warn!("could not set {} = {}: {e}", w.path, w.value);
            }
        }
    }
    done
}

/// Writes `/proc/self/oom_score_adj`.
pub fn apply_oom_score_adj(value: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", value.to_string()) {
        tracing::warn!("could not set oom_score_adj to {value}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_max_only_grows_and_hashsize_goes_first() {
        let c = ConntrackSettings::default();
        let w = conntrack_writes(&c, 8, Some(100_000), Some(16_384));
        assert!(w[0].path.ends_with("nf_conntrack_max"));
        assert_eq!(w[0].value, "262144");
        assert_eq!(w[1].path, HASHSIZE);
        assert_eq!(w[1].value, "65536");
        // Already large enough: no max/hashsize writes, only timeouts.
        let w = conntrack_writes(&c, 2, Some(262_144), Some(65_536));
        assert!(
            w.iter()
                .all(|w| !w.path.contains("max") && !w.path.contains("hashsize"))
        );
        assert!(
            w.iter()
                .any(|w| w.path.ends_with("tcp_timeout_established") && w.value == "86400")
        );
        assert!(
            w.iter()
                .any(|w| w.path.ends_with("tcp_timeout_close_wait") && w.value == "3600")
        );
        assert!(!w.iter().any(|w| w.path.contains("udp")));
    }

    #[test]
    fn zero_settings_write_nothing() {
        let c = ConntrackSettings {
            max_per_core: 0,
            min: 0,
            tcp_established_timeout: Duration::ZERO,
            tcp_close_wait_timeout: Duration::ZERO,
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        };
        assert!(conntrack_writes(&c, 4, Some(1), Some(1)).is_empty());
    }

    /// Writes the per-namespace values for real, inside a private network namespace.
    #[test]
    fn applies_per_namespace_conntrack_settings() {
        if !nix_root() {
            eprintln!("skipped: needs root for a private network namespace");
            return;
        }
        std::thread::spawn(|| {
            // SAFETY: unshare(CLONE_NEWNET) only changes this thread's namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            let c = ConntrackSettings {
                tcp_established_timeout: Duration::from_secs(7200),
                tcp_be_liberal: true,
                udp_timeout: Duration::from_secs(45),
                ..Default::default()
            };
            let done = apply_conntrack(&c);
            assert!(
                done.iter()
                    .any(|w| w.path.ends_with("tcp_timeout_established"))
            );
            let read = |n: &str| std::fs::read_to_string(format!("{NETFILTER}/{n}")).unwrap();
            assert_eq!(read("nf_conntrack_tcp_timeout_established").trim(), "7200");
            assert_eq!(read("nf_conntrack_tcp_be_liberal").trim(), "1");
            assert_eq!(read("nf_conntrack_udp_timeout").trim(), "45");
            // Applying again changes nothing.
            assert!(apply_conntrack(&c).is_empty());
        })
        .join()
        .unwrap();
    }

    fn nix_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }
}
