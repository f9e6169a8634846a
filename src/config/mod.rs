//! Command line, with kube-proxy's flag names, defaults and validation.
//!
//! Flags take `--name value` or `--name=value`; booleans take `--name` or
//! `--name=true|false`; `_` in a name reads as `-` (`--log_dir`), as kube-proxy's
//! flag set normalizes it. `--config FILE` loads a `KubeProxyConfiguration` first;
//! flags given on the command line override it. A value kube-proxy would reject is
//! an error naming the field (`KubeProxyConfiguration.syncPeriod: Invalid value:
//! ...`), which `main` turns into exit status 2.

pub mod features;
pub mod file;
pub mod flags;
pub mod host;
mod known_gates;
mod parse;
pub mod validate;
pub mod value;
pub mod write;

pub use parse::parse_args;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
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

/// `--logging-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// klog's text lines (default).
    #[default]
    Text,
    /// component-base's JSON lines.
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

/// Parsed command line and configuration file.
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
    /// `--vmodule pattern=N,...` (file: `logging.vmodule`): per-file or per-module
    /// verbosity.
    pub vmodule: Vec<(String, u8)>,
    /// `--logging-format` (file: `logging.format`).
    pub log_format: LogFormat,
    /// `--skip-headers`: text lines without the klog header.
    pub log_skip_headers: bool,
    /// `--add-dir-header`: the source file's directory in the klog header.
    pub log_add_dir_header: bool,
    /// `--bind-address` (file: `bindAddress`, default 0.0.0.0): when not 0.0.0.0
    /// or ::, the node's primary IP, as kube-proxy takes it (see
    /// [`Config::bind_address_node_ip`]).
    pub bind_address: IpAddr,
    /// `--bind-address-hard-fail` (`bindAddressHardFail`): a health or metrics
    /// server that cannot bind its port is fatal.
    pub bind_address_hard_fail: bool,
    /// `--kube-api-qps` (`clientConnection.qps`, 5).
    pub kube_api_qps: f32,
    /// `--kube-api-burst` (`clientConnection.burst`, 10).
    pub kube_api_burst: i32,
    /// `--kube-api-content-type` (`clientConnection.contentType`,
    /// `application/vnd.kubernetes.protobuf`).
    pub kube_api_content_type: String,
    /// `clientConnection.acceptContentTypes` (empty: the client's default).
    pub kube_api_accept_content_types: String,
    /// `--feature-gates` (`featureGates`), as given; each was checked by
    /// [`features::check`].
    pub feature_gates: BTreeMap<String, bool>,
    /// `--init-only`: do the node set-up that needs full privileges, then exit 0.
    pub init_only: bool,
    /// `--write-config-to FILE`: write the effective configuration there and exit.
    pub write_config_to: Option<PathBuf>,
    /// `--config-sync-period` (`configSyncPeriod`, 15m): checked, no effect.
    pub config_sync_period: Duration,
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
    /// Whether a flag (or `--config`) said which traffic is local or what is
    /// masqueraded (`explain` otherwise takes the daemon's settings).
    pub local_traffic_given: bool,
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
            vmodule: Vec::new(),
            log_format: LogFormat::Text,
            log_skip_headers: false,
            log_add_dir_header: false,
            bind_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            bind_address_hard_fail: false,
            kube_api_qps: 5.0,
            kube_api_burst: 10,
            kube_api_content_type: "application/vnd.kubernetes.protobuf".into(),
            kube_api_accept_content_types: String::new(),
            feature_gates: BTreeMap::new(),
            init_only: false,
            write_config_to: None,
            config_sync_period: Duration::from_secs(15 * 60),
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
            local_traffic_given: false,
            explain_target: None,
            explain_from: None,
        }
    }
}

impl Config {
    /// The node IP `--bind-address` / `bindAddress` sets, as kube-proxy reads it:
    /// when it is not 0.0.0.0 or ::, it is the node's primary IP (its family is the
    /// primary family), overriding the Node object's address of that family.
    pub fn bind_address_node_ip(&self) -> Option<IpAddr> {
        (!self.bind_address.is_unspecified()).then_some(self.bind_address)
    }
}

/// Why the command line or the configuration cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// Unknown flag.
    #[error("unknown flag: {0} (see kube-nlproxy help)")]
    UnknownFlag(String),
    /// An unknown command word.
    #[error(
        "unknown command {0:?} for \"kube-nlproxy\" (commands: run, plan, explain, status, cleanup, help)"
    )]
    UnknownCommand(String),
    /// A flag that another command takes.
    #[error("flag {flag} does not apply to {command:?} (see kube-nlproxy help {command})")]
    FlagNotForCommand {
        /// the flag
        flag: String,
        /// the command
        command: &'static str,
    },
    /// An argument that is neither a flag nor expected.
    #[error("unexpected argument {0:?}")]
    UnexpectedArgument(String),
    /// A flag without its value.
    #[error("flag needs an argument: {0}")]
    MissingValue(String),
    /// A value that does not parse, for a flag that sets no configuration field.
    #[error("invalid argument {value:?} for {flag}: {reason}")]
    InvalidValue {
        /// flag
        flag: String,
        /// value
        value: String,
        /// why
        reason: String,
    },
    /// `--help`, `-h`, `help [CMD]`: print [`help_text`] of the command.
    #[error("help requested")]
    Help(Option<Command>),
    /// `--version`.
    #[error("version requested")]
    Version,
    /// `--config FILE` could not be read or is not a KubeProxyConfiguration.
    #[error("--config {path}: {reason}")]
    ConfigFile {
        /// the file
        path: String,
        /// why
        reason: String,
    },
    /// Values kube-proxy would reject, one line each.
    #[error("{}", join_lines(.0))]
    Invalid(Vec<value::FieldError>),
}

fn join_lines(errors: &[value::FieldError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    lines.join("\n")
}

/// The usage text (`kube-nlproxy help`).
pub fn usage() -> String {
    flags::usage()
}

/// The help for `cmd` (`None`: the usage of the whole program).
pub fn help_text(cmd: Option<Command>) -> String {
    match cmd {
        None => flags::usage(),
        Some(c) => flags::help(c),
    }
}

/// `kube-nlproxy v0.1.0`: what `--version` prints.
pub fn version_line() -> String {
    format!("kube-nlproxy v{}", env!("CARGO_PKG_VERSION"))
}

impl Command {
    /// The command's word.
    pub fn name(self) -> &'static str {
        match self {
            Command::Run => "run",
            Command::Plan => "plan",
            Command::Cleanup => "cleanup",
            Command::Explain => "explain",
            Command::Status => "status",
        }
    }

    fn from_word(word: &str) -> Option<Command> {
        Some(match word {
            "run" => Command::Run,
            "plan" => Command::Plan,
            "cleanup" => Command::Cleanup,
            "explain" => Command::Explain,
            "status" => Command::Status,
            _ => return None,
        })
    }
}

/// Parses a Go-style duration: `30s`, `1m`, `500ms`, `1h30m`, `0`. A negative one
/// is an error.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    match value::parse_go_duration(s)? {
        (false, d) => Ok(d),
        (true, _) => Err(format!("negative duration {s:?}")),
    }
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
        let c = parse_args(["--cleanup", "--kube-proxy"]).unwrap();
        assert!(c.command == Command::Cleanup && c.cleanup_kube_proxy);
        let c = parse_args(["cleanup", "--kube-proxy"]).unwrap();
        assert!(c.command == Command::Cleanup && c.cleanup_kube_proxy);
        assert!(matches!(
            parse_args(["--kube-proxy"]),
            Err(ConfigError::FlagNotForCommand { .. })
        ));
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
