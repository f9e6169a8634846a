//! Command line, with kube-proxy's flag names and defaults.
//!
//! Flags take `--name value` or `--name=value`; booleans take `--name` or
//! `--name=true|false`. `--config FILE` loads a `KubeProxyConfiguration` first;
//! flags given on the command line override it.

pub mod file;
pub mod host;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Command {
    /// The daemon (default).
    #[default]
    Run,
    /// Print the operations a sync would send; apply nothing.
    Plan,
    /// Delete everything we own.
    Cleanup,
    /// Where a new connection to `IP:PORT[/PROTO]` would go, from the kernel.
    Explain,
    /// Mode, node, what is programmed, the last sync.
    Status,
}

/// `--output` of `plan`, `explain` and `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Output {
    /// For people (default).
    #[default]
    Text,
    /// For tools.
    Json,
}

/// `--proxy-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    /// nftables (default)
    #[default]
    Nftables,
    /// ipvs
    Ipvs,
}

/// `--source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Watch the API server.
    Kube,
    /// YAML manifests at a path.
    File(PathBuf),
}

/// `--detect-local-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetectLocalMode {
    /// `ClusterCIDR`
    ClusterCidr,
    /// `NodeCIDR`
    NodeCidr,
    /// `BridgeInterface`
    BridgeInterface,
    /// `InterfaceNamePrefix`
    InterfaceNamePrefix,
}

/// `--nodeport-addresses`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodePortAddressesFlag {
    /// `primary`: the node's primary IPs (default).
    #[default]
    Primary,
    /// A list of CIDRs: local addresses inside them.
    Cidrs(Vec<IpNet>),
}

/// Parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Sub-command.
    pub command: Command,
    /// `--proxy-mode`
    pub mode: ProxyMode,
    /// `--source`
    pub source: Source,
    /// `--hostname-override` (else the kernel host name)
    pub hostname_override: Option<String>,
    /// `--node-ip`
    pub node_ips: Vec<IpAddr>,
    /// `--cluster-cidr`
    pub cluster_cidrs: Vec<IpNet>,
    /// `--detect-local-mode` (default ClusterCIDR when `--cluster-cidr` is set)
    pub detect_local_mode: Option<DetectLocalMode>,
    /// `--pod-bridge-interface`
    pub pod_bridge_interface: Option<String>,
    /// `--pod-interface-name-prefix`
    pub pod_interface_name_prefix: Option<String>,
    /// `--nodeport-addresses`
    pub nodeport_addresses: NodePortAddressesFlag,
    /// `--masquerade-all`
    pub masquerade_all: bool,
    /// `--ignore-external-ips` (ours; file: `ignoreExternalIPs`): serve no
    /// `spec.externalIPs` (CVE-2020-8554, see SECURITY.md).
    pub ignore_external_ips: bool,
    /// `--keep-kube-proxy-state` (ours; file: `keepKubeProxyState`): leave
    /// kube-proxy's rules in the kernel instead of removing them after our
    /// first successful sync.
    pub keep_kube_proxy_state: bool,
    /// `cleanup --kube-proxy`: remove kube-proxy's state instead of ours.
    pub cleanup_kube_proxy: bool,
    /// `--sync-period` (30s)
    pub sync_period: Duration,
    /// `--min-sync-period` (1s)
    pub min_sync_period: Duration,
    /// `--once`
    pub once: bool,
    /// `--kubeconfig`
    pub kubeconfig: Option<PathBuf>,
    /// `--master`
    pub master: Option<String>,
    /// `--healthz-bind-address`
    pub healthz_bind_address: String,
    /// `--metrics-bind-address`
    pub metrics_bind_address: String,
    /// `-v` / `--v` log verbosity (0..)
    pub verbosity: u8,
    /// `--config`
    pub config_file: Option<PathBuf>,
    /// `masqueradeBit` (14): the packet-mark bit that asks for masquerade.
    pub masquerade_bit: u8,
    /// `--ipvs-scheduler` (`rr`)
    pub ipvs_scheduler: String,
    /// `--ipvs-strict-arp`
    pub ipvs_strict_arp: bool,
    /// `ipvs.tcpTimeout`, `tcpFinTimeout`, `udpTimeout` (0 = leave as is);
    /// `--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout`, `--ipvs-udp-timeout`
    pub ipvs_timeouts: [Duration; 3],
    /// `--ipvs-exclude-cidrs` (`ipvs.excludeCIDRs`): virtual and real servers in
    /// these are never deleted by a sync or cleanup.
    pub ipvs_exclude_cidrs: Vec<IpNet>,
    /// `--ipvs-sync-period`, `--ipvs-min-sync-period`: in ipvs mode they replace
    /// `--sync-period` and `--min-sync-period` (applied at the end of parsing).
    pub ipvs_sync_periods: [Option<Duration>; 2],
    /// The `conntrack` block.
    pub conntrack: host::ConntrackSettings,
    /// `--oom-score-adj` (-999)
    pub oom_score_adj: Option<i32>,
    /// Problems found in the configuration file, logged once logging is up.
    pub warnings: Vec<String>,
    /// `--output text|json` (`plan`, `explain`, `status`).
    pub output: Output,
    /// Whether `--source` was given (`explain` then compares with the desired
    /// state).
    pub source_given: bool,
    /// `explain`'s `IP:PORT[/tcp|udp|sctp]`, as given.
    pub explain_target: Option<String>,
    /// `explain --from SRC_IP`.
    pub explain_from: Option<IpAddr>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            command: Command::Run,
            mode: ProxyMode::Nftables,
            source: Source::Kube,
            hostname_override: None,
            node_ips: Vec::new(),
            cluster_cidrs: Vec::new(),
            detect_local_mode: None,
            pod_bridge_interface: None,
            pod_interface_name_prefix: None,
            nodeport_addresses: NodePortAddressesFlag::Primary,
            masquerade_all: false,
            ignore_external_ips: false,
            keep_kube_proxy_state: false,
            cleanup_kube_proxy: false,
            sync_period: Duration::from_secs(30),
            min_sync_period: Duration::from_secs(1),
            once: false,
            kubeconfig: None,
            master: None,
            healthz_bind_address: "0.0.0.0:10256".into(),
            metrics_bind_address: "127.0.0.1:10249".into(),
            verbosity: 0,
            config_file: None,
            masquerade_bit: 14,
            ipvs_scheduler: "rr".into(),
            ipvs_strict_arp: false,
            ipvs_timeouts: [Duration::ZERO; 3],
            ipvs_exclude_cidrs: Vec::new(),
            ipvs_sync_periods: [None; 2],
            conntrack: host::ConntrackSettings::default(),
            oom_score_adj: Some(-999),
            warnings: Vec::new(),
            output: Output::Text,
            source_given: false,
            explain_target: None,
            explain_from: None,
        }
    }
}

/// A command-line error, naming the flag.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Unknown flag.
    #[error("unknown flag {0} (see --help)")]
    UnknownFlag(String),
    /// A flag without its value.
    #[error("flag {0} needs a value")]
    MissingValue(String),
    /// A value that does not parse.
    #[error("invalid value {value:?} for {flag}: {reason}")]
    InvalidValue {
        /// flag
        flag: String,
        /// value
        value: String,
        /// why
        reason: String,
    },
    /// `--help`
    #[error("help requested")]
    Help,
    /// `--config FILE` could not be used.
    #[error("--config {path}: {reason}")]
    ConfigFile {
        /// the file
        path: String,
        /// why
        reason: String,
    },
}

/// Usage text.
pub const USAGE: &str = "\
kube-nlproxy — a Kubernetes service proxy that programs the dataplane over netlink

USAGE:
  kube-nlproxy [run] [FLAGS]      the proxy (default)
  kube-nlproxy plan [FLAGS]       print the netlink operations a sync would send
  kube-nlproxy cleanup            delete everything kube-nlproxy created (also --cleanup)
  kube-nlproxy cleanup --kube-proxy
                                  delete kube-proxy's rules (its nft tables, its KUBE-*
                                  iptables chains and the jumps to them), nothing else
  kube-nlproxy explain IP:PORT[/tcp|udp|sctp] [--from SRC_IP] [FLAGS]
                                  where a new connection would go, read from the kernel
                                  (with --source also compared with the desired state).
                                  Exit status: 0 served, 3 rejected, 4 dropped,
                                  5 not a service, 1 error
  kube-nlproxy status [FLAGS]     mode, node, what is programmed, last sync, last error,
                                  drift repairs (from the daemon's metrics server, else
                                  from the kernel)
  --output text|json              for plan, explain and status (default text)

FLAGS (kube-proxy names):
  --source kube|file:PATH         where objects come from (default kube)
  --proxy-mode nftables|ipvs      (default nftables)
  --hostname-override NAME        node name (default: host name)
  --node-ip IP[,IP]               node IPs (default: from the Node object)
  --cluster-cidr CIDR[,CIDR]      pod network, for --detect-local-mode ClusterCIDR
  --detect-local-mode MODE        ClusterCIDR|NodeCIDR|BridgeInterface|InterfaceNamePrefix
  --pod-bridge-interface NAME     for BridgeInterface
  --pod-interface-name-prefix P   for InterfaceNamePrefix
  --nodeport-addresses primary|CIDR[,CIDR]   (default primary)
  --masquerade-all                SNAT all traffic sent via service IPs
  --ignore-external-ips           serve no Service spec.externalIPs (CVE-2020-8554)
  --keep-kube-proxy-state         leave kube-proxy's rules in the kernel (default: remove
                                  them after the first successful sync)
  --sync-period DURATION          periodic full resync (default 30s)
  --min-sync-period DURATION      minimum time between syncs (default 1s)
  --once                          sync once; exit 0 only if the kernel then matches
  --kubeconfig FILE, --master URL API server access (kube source)
  --healthz-bind-address, --metrics-bind-address   (accepted; servers come with the kube source)
  --config FILE                   KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1);
                                  flags override it
  --masquerade-bit N              mark bit for masquerade (default 14)
  --ipvs-scheduler NAME           rr|wrr|lc|wlc|lblc|lblcr|sh|dh|sed|nq|mh (default rr)
  --ipvs-strict-arp               arp_ignore=1, arp_announce=2
  --ipvs-tcp-timeout D, --ipvs-tcpfin-timeout D, --ipvs-udp-timeout D
                                  IPVS connection timeouts (default 0: the kernel's)
  --ipvs-exclude-cidrs CIDR[,CIDR] IPVS servers never deleted by sync or cleanup
  --ipvs-sync-period D, --ipvs-min-sync-period D   in ipvs mode, instead of --sync-period
                                  and --min-sync-period
  --conntrack-max-per-core N, --conntrack-min N, --conntrack-tcp-timeout-established D,
  --conntrack-tcp-timeout-close-wait D, --conntrack-tcp-be-liberal,
  --conntrack-udp-timeout D, --conntrack-udp-timeout-stream D
  --oom-score-adj N               (default -999)
  -v, --v N                       log verbosity
";

fn invalid(flag: &str, value: &str, reason: impl ToString) -> ConfigError {
    ConfigError::InvalidValue {
        flag: flag.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// Parses a Go-style duration: `30s`, `1m`, `500ms`, `1h30m`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("missing unit in {s:?}"))?;
        let value: f64 = rest[..num_end]
            .parse()
            .map_err(|_| format!("bad number in {s:?}"))?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            u => return Err(format!("unknown unit {u:?} in {s:?}")),
        };
        total += value * factor;
        rest = &rest[unit_end..];
    }
    // A number too big for a Duration (`1e400h`, or digits enough to overflow
    // f64) is an error, not a panic.
    Duration::try_from_secs_f64(total).map_err(|_| format!("duration {s:?} out of range"))
}

fn parse_list<T: std::str::FromStr>(flag: &str, value: &str) -> Result<Vec<T>, ConfigError>
where
    T::Err: std::fmt::Display,
{
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<T>().map_err(|e| invalid(flag, s, e)))
        .collect()
}

fn parse_bool(flag: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(invalid(flag, value, "expected true or false")),
    }
}

/// The value of `--config`, looked up before the other flags so they can override
/// the file.
fn config_file_arg(args: &[String]) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            return it.next().cloned();
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(v.to_string());
        }
    }
    None
}

/// Parses `args` (without the program name).
pub fn parse_args<I, S>(args: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let args: Vec<String> = args.into_iter().map(Into::into).collect();
    let mut cfg = match config_file_arg(&args) {
        Some(path) => {
            let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::ConfigFile {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let mut cfg = file::apply(&text, Config::default()).map_err(|reason| {
                ConfigError::ConfigFile {
                    path: path.clone(),
                    reason,
                }
            })?;
            cfg.config_file = Some(PathBuf::from(path));
            cfg
        }
        None => Config::default(),
    };
    let mut args = args.into_iter().peekable();
    let mut first = true;
    while let Some(arg) = args.next() {
        if first && !arg.starts_with('-') {
            first = false;
            cfg.command = match arg.as_str() {
                "run" => Command::Run,
                "plan" => Command::Plan,
                "cleanup" => Command::Cleanup,
                "explain" => Command::Explain,
                "status" => Command::Status,
                other => return Err(ConfigError::UnknownFlag(other.to_string())),
            };
            continue;
        }
        first = false;
        if cfg.command == Command::Explain && !arg.starts_with('-') {
            if cfg.explain_target.is_some() {
                return Err(ConfigError::UnknownFlag(arg));
            }
            cfg.explain_target = Some(arg);
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        const BOOLS: &[&str] = &[
            "--masquerade-all",
            "--ignore-external-ips",
            "--keep-kube-proxy-state",
            "--kube-proxy",
            "--once",
            "--cleanup",
            "--ipvs-strict-arp",
            "--conntrack-tcp-be-liberal",
            "--help",
            "-h",
        ];
        if BOOLS.contains(&flag.as_str()) {
            let on = match &inline {
                Some(v) => parse_bool(&flag, v)?,
                None => true,
            };
            match flag.as_str() {
                "--masquerade-all" => cfg.masquerade_all = on,
                "--ignore-external-ips" => cfg.ignore_external_ips = on,
                "--keep-kube-proxy-state" => cfg.keep_kube_proxy_state = on,
                "--kube-proxy" => {
                    if cfg.command != Command::Cleanup {
                        return Err(ConfigError::UnknownFlag(
                            "--kube-proxy (only `cleanup --kube-proxy` takes it)".into(),
                        ));
                    }
                    cfg.cleanup_kube_proxy = on
                }
                "--once" => cfg.once = on,
                "--ipvs-strict-arp" => cfg.ipvs_strict_arp = on,
                "--conntrack-tcp-be-liberal" => cfg.conntrack.tcp_be_liberal = on,
                "--cleanup" => {
                    if on {
                        cfg.command = Command::Cleanup
                    }
                }
                _ => return Err(ConfigError::Help),
            }
            continue;
        }
        const VALUED: &[&str] = &[
            "--source",
            "--proxy-mode",
            "--hostname-override",
            "--node-ip",
            "--node-ips",
            "--cluster-cidr",
            "--detect-local-mode",
            "--pod-bridge-interface",
            "--pod-interface-name-prefix",
            "--nodeport-addresses",
            "--sync-period",
            "--min-sync-period",
            "--kubeconfig",
            "--master",
            "--healthz-bind-address",
            "--metrics-bind-address",
            "-v",
            "--v",
            "--config",
            "--masquerade-bit",
            "--ipvs-scheduler",
            "--ipvs-tcp-timeout",
            "--ipvs-tcpfin-timeout",
            "--ipvs-udp-timeout",
            "--ipvs-exclude-cidrs",
            "--ipvs-sync-period",
            "--ipvs-min-sync-period",
            "--conntrack-max-per-core",
            "--conntrack-min",
            "--conntrack-tcp-timeout-established",
            "--conntrack-tcp-timeout-close-wait",
            "--conntrack-udp-timeout",
            "--conntrack-udp-timeout-stream",
            "--oom-score-adj",
            "--output",
            "-o",
            "--from",
        ];
        if !VALUED.contains(&flag.as_str()) {
            return Err(ConfigError::UnknownFlag(flag));
        }
        let value = match inline {
            Some(v) => v,
            None => args
                .next()
                .ok_or_else(|| ConfigError::MissingValue(flag.clone()))?,
        };
        let f = flag.as_str();
        match f {
            "--output" | "-o" => {
                cfg.output = match value.as_str() {
                    "text" => Output::Text,
                    "json" => Output::Json,
                    _ => return Err(invalid(f, &value, "expected text or json")),
                }
            }
            "--from" => {
                cfg.explain_from = Some(
                    value
                        .parse()
                        .map_err(|e: std::net::AddrParseError| invalid(f, &value, e))?,
                )
            }
            "--source" => {
                cfg.source_given = true;
                cfg.source = if value == "kube" {
                    Source::Kube
                } else if let Some(path) = value.strip_prefix("file:") {
                    Source::File(PathBuf::from(path))
                } else {
                    return Err(invalid(f, &value, "expected kube or file:PATH"));
                }
            }
            "--proxy-mode" => {
                cfg.mode = match value.as_str() {
                    "nftables" | "" => ProxyMode::Nftables,
                    "ipvs" => ProxyMode::Ipvs,
                    _ => return Err(invalid(f, &value, "expected nftables or ipvs")),
                }
            }
            "--hostname-override" => cfg.hostname_override = Some(value.trim().to_lowercase()),
            "--node-ip" | "--node-ips" => cfg.node_ips = parse_list(f, &value)?,
            "--cluster-cidr" => cfg.cluster_cidrs = parse_list(f, &value)?,
            "--detect-local-mode" => {
                cfg.detect_local_mode = Some(match value.as_str() {
                    "ClusterCIDR" => DetectLocalMode::ClusterCidr,
                    "NodeCIDR" => DetectLocalMode::NodeCidr,
                    "BridgeInterface" => DetectLocalMode::BridgeInterface,
                    "InterfaceNamePrefix" => DetectLocalMode::InterfaceNamePrefix,
                    _ => {
                        return Err(invalid(
                            f,
                            &value,
                            "expected ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix",
                        ));
                    }
                })
            }
            "--pod-bridge-interface" => cfg.pod_bridge_interface = Some(value),
            "--pod-interface-name-prefix" => cfg.pod_interface_name_prefix = Some(value),
            "--nodeport-addresses" => {
                cfg.nodeport_addresses = if value == "primary" || value.is_empty() {
                    NodePortAddressesFlag::Primary
                } else {
                    NodePortAddressesFlag::Cidrs(parse_list(f, &value)?)
                }
            }
            "--sync-period" => {
                cfg.sync_period = parse_duration(&value).map_err(|e| invalid(f, &value, e))?
            }
            "--min-sync-period" => {
                cfg.min_sync_period = parse_duration(&value).map_err(|e| invalid(f, &value, e))?
            }
            "--kubeconfig" => cfg.kubeconfig = Some(PathBuf::from(value)),
            "--master" => cfg.master = Some(value),
            "--healthz-bind-address" => cfg.healthz_bind_address = value,
            "--metrics-bind-address" => cfg.metrics_bind_address = value,
            "-v" | "--v" => {
                cfg.verbosity = value.parse().map_err(|e| invalid(f, &value, e))?;
            }
            "--config" => {}
            "--masquerade-bit" => {
                cfg.masquerade_bit = value.parse().map_err(|e| invalid(f, &value, e))?;
                if cfg.masquerade_bit > 31 {
                    return Err(invalid(f, &value, "must be within 0..31"));
                }
            }
            "--ipvs-scheduler" => cfg.ipvs_scheduler = value,
            "--ipvs-tcp-timeout" | "--ipvs-tcpfin-timeout" | "--ipvs-udp-timeout" => {
                let i = match f {
                    "--ipvs-tcp-timeout" => 0,
                    "--ipvs-tcpfin-timeout" => 1,
                    _ => 2,
                };
                cfg.ipvs_timeouts[i] = parse_duration(&value).map_err(|e| invalid(f, &value, e))?;
            }
            "--ipvs-exclude-cidrs" => cfg.ipvs_exclude_cidrs = parse_list(f, &value)?,
            "--ipvs-sync-period" | "--ipvs-min-sync-period" => {
                let d = parse_duration(&value).map_err(|e| invalid(f, &value, e))?;
                cfg.ipvs_sync_periods[usize::from(f == "--ipvs-min-sync-period")] = Some(d);
            }
            "--conntrack-max-per-core" => {
                cfg.conntrack.max_per_core = value.parse().map_err(|e| invalid(f, &value, e))?
            }
            "--conntrack-min" => {
                cfg.conntrack.min = value.parse().map_err(|e| invalid(f, &value, e))?
            }
            "--conntrack-tcp-timeout-established" => {
                cfg.conntrack.tcp_established_timeout =
                    parse_duration(&value).map_err(|e| invalid(f, &value, e))?
            }
            "--conntrack-tcp-timeout-close-wait" => {
                cfg.conntrack.tcp_close_wait_timeout =
                    parse_duration(&value).map_err(|e| invalid(f, &value, e))?
            }
            "--conntrack-udp-timeout" => {
                cfg.conntrack.udp_timeout =
                    parse_duration(&value).map_err(|e| invalid(f, &value, e))?
            }
            "--conntrack-udp-timeout-stream" => {
                cfg.conntrack.udp_stream_timeout =
                    parse_duration(&value).map_err(|e| invalid(f, &value, e))?
            }
            "--oom-score-adj" => {
                cfg.oom_score_adj = Some(value.parse().map_err(|e| invalid(f, &value, e))?)
            }
            _ => return Err(ConfigError::UnknownFlag(flag)),
        }
    }
    if cfg.detect_local_mode.is_none() && !cfg.cluster_cidrs.is_empty() {
        cfg.detect_local_mode = Some(DetectLocalMode::ClusterCidr);
    }
    if cfg.mode == ProxyMode::Ipvs {
        let [sync, min] = cfg.ipvs_sync_periods;
        cfg.sync_period = sync.unwrap_or(cfg.sync_period);
        cfg.min_sync_period = min.unwrap_or(cfg.min_sync_period);
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kube_proxys() {
        let c = parse_args(Vec::<String>::new()).unwrap();
        assert_eq!(c.command, Command::Run);
        assert_eq!(c.mode, ProxyMode::Nftables);
        assert_eq!(c.source, Source::Kube);
        assert_eq!(c.sync_period, Duration::from_secs(30));
        assert_eq!(c.min_sync_period, Duration::from_secs(1));
        assert_eq!(c.nodeport_addresses, NodePortAddressesFlag::Primary);
        assert_eq!(c.healthz_bind_address, "0.0.0.0:10256");
        assert_eq!(c.metrics_bind_address, "127.0.0.1:10249");
    }

    #[test]
    fn ignore_external_ips_flag() {
        assert!(
            !parse_args(["run"]).unwrap().ignore_external_ips,
            "off by default"
        );
        assert!(
            parse_args(["--ignore-external-ips"])
                .unwrap()
                .ignore_external_ips
        );
        let c = parse_args(["--ignore-external-ips=false"]).unwrap();
        assert!(!c.ignore_external_ips);
    }

    #[test]
    fn parses_both_flag_styles() {
        let c = parse_args([
            "plan",
            "--source=file:/tmp/x",
            "--cluster-cidr",
            "10.244.0.0/16,fd44::/48",
            "--masquerade-all",
            "--min-sync-period=250ms",
            "--nodeport-addresses",
            "10.0.0.0/8",
        ])
        .unwrap();
        assert_eq!(c.command, Command::Plan);
        assert_eq!(c.source, Source::File("/tmp/x".into()));
        assert_eq!(c.cluster_cidrs.len(), 2);
        assert_eq!(c.detect_local_mode, Some(DetectLocalMode::ClusterCidr));
        assert!(c.masquerade_all);
        assert_eq!(c.min_sync_period, Duration::from_millis(250));
        assert!(
            matches!(c.nodeport_addresses, NodePortAddressesFlag::Cidrs(ref v) if v.len() == 1)
        );
    }

    #[test]
    fn errors_name_the_flag() {
        let e = parse_args(["--cluster-cidr", "10.0.0.300/8"]).unwrap_err();
        assert!(e.to_string().contains("--cluster-cidr"), "{e}");
        assert_eq!(
            parse_args(["--bogus"]).unwrap_err(),
            ConfigError::UnknownFlag("--bogus".into())
        );
        assert_eq!(
            parse_args(["--source"]).unwrap_err(),
            ConfigError::MissingValue("--source".into())
        );
        assert_eq!(parse_args(["--cleanup"]).unwrap().command, Command::Cleanup);
    }

    #[test]
    fn ipvs_flags() {
        let c = parse_args([
            "--ipvs-tcp-timeout=900s",
            "--ipvs-tcpfin-timeout",
            "30s",
            "--ipvs-udp-timeout=1m",
            "--ipvs-exclude-cidrs=10.0.0.0/8,fd00::/64",
            "--ipvs-sync-period=7s",
            "--ipvs-min-sync-period=2s",
            "--proxy-mode=ipvs",
        ])
        .unwrap();
        assert_eq!(
            c.ipvs_timeouts,
            [900, 30, 60].map(Duration::from_secs),
            "tcp, tcpfin, udp"
        );
        assert_eq!(c.ipvs_exclude_cidrs.len(), 2);
        assert_eq!(c.sync_period, Duration::from_secs(7));
        assert_eq!(c.min_sync_period, Duration::from_secs(2));
        // In nftables mode the ipvs periods do not apply.
        let c = parse_args(["--ipvs-sync-period=7s", "--sync-period=9s"]).unwrap();
        assert_eq!(c.sync_period, Duration::from_secs(9));
        let e = parse_args(["--ipvs-tcp-timeout", "soon"]).unwrap_err();
        assert!(e.to_string().contains("--ipvs-tcp-timeout"), "{e}");
        let e = parse_args(["--ipvs-exclude-cidrs", "10.0.0.0/33"]).unwrap_err();
        assert!(e.to_string().contains("--ipvs-exclude-cidrs"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("5").is_err());
        // Beyond what a Duration holds: an error, not a panic.
        assert!(parse_duration("99999999999999999999999h").is_err());
        assert!(parse_duration(&format!("{}s", "9".repeat(400))).is_err());
    }
}
