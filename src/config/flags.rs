//! The flag table: every flag of kube-proxy v1.37 plus ours, which commands take
//! it, and the help text printed by `kube-nlproxy help [CMD]` and `CMD --help`.

use super::Command;

/// Which commands take a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Describes the node, the cluster or the logs: every command takes it (so
    /// `plan` and `explain` accept the daemon's whole command line).
    Config,
    /// An action of `run`: `--cleanup`, `--init-only`, `--write-config-to`, `--once`.
    Run,
    /// `cleanup --kube-proxy`.
    Cleanup,
    /// `--output` of `plan`, `explain` and `status`.
    Output,
    /// `explain --from`.
    Explain,
    /// `--help`, `--version`.
    Any,
}

impl Scope {
    /// Whether `cmd` takes a flag of this scope.
    pub fn applies_to(self, cmd: Command) -> bool {
        match self {
            Scope::Config | Scope::Any => true,
            Scope::Run => cmd == Command::Run,
            Scope::Cleanup => cmd == Command::Cleanup,
            Scope::Output => matches!(cmd, Command::Plan | Command::Explain | Command::Status),
            Scope::Explain => cmd == Command::Explain,
        }
    }
}

/// What a flag does here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Does what kube-proxy's flag does.
    Upstream,
    /// Ours; kube-proxy has no such flag.
    Ours,
    /// Accepted (the value is still checked as upstream checks it) with one
    /// warning saying why it has no effect here.
    NoEffect(&'static str),
}

/// One flag.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    /// `--name` (with dashes; `_` in a given name is read as `-`, as kube-proxy's
    /// flag set normalizes it).
    pub name: &'static str,
    /// `-v`, `-h`, `-o`.
    pub short: Option<&'static str>,
    /// The value's name in help; `None` for a boolean (`--x`, `--x=false`).
    pub value: Option<&'static str>,
    /// Which commands take it.
    pub scope: Scope,
    /// What it does here.
    pub effect: Effect,
    /// One line of help.
    pub help: &'static str,
}

const fn f(
    name: &'static str,
    value: Option<&'static str>,
    scope: Scope,
    effect: Effect,
    help: &'static str,
) -> Flag {
    Flag {
        name,
        short: None,
        value,
        scope,
        effect,
        help,
    }
}

use Effect::{NoEffect, Ours, Upstream};
use Scope::{Any, Cleanup, Config, Explain, Output, Run};

const S: Option<&str> = Some("STRING");
const D: Option<&str> = Some("DURATION");
const N: Option<&str> = Some("INT");
const B: Option<&str> = None;

const LOG_FILES: &str =
    "kube-nlproxy writes its log to stderr only (the container runtime keeps it)";

/// Every flag, in help order.
#[rustfmt::skip]
pub const FLAGS: &[Flag] = &[
    // Commands and actions.
    Flag { short: Some("-h"), ..f("--help", B, Any, Ours, "help for kube-nlproxy or the command") },
    f("--version", B, Any, Upstream, "print kube-nlproxy's version and exit (also --version=raw)"),
    f("--config", S, Config, Upstream, "KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1); flags given too override it"),
    f("--write-config-to", S, Run, Upstream, "write the effective configuration as a KubeProxyConfiguration to this file and exit"),
    f("--cleanup", B, Run, Upstream, "remove everything kube-nlproxy created and exit (= the cleanup command)"),
    f("--init-only", B, Run, Upstream, "do the node set-up that needs full privileges, then exit"),
    f("--once", B, Run, Ours, "sync once; exit 0 only if the kernel then matches the desired state"),
    f("--kube-proxy", B, Cleanup, Ours, "remove kube-proxy's rules (its nft tables, its KUBE-* iptables chains and the jumps to them), nothing else"),
    Flag { short: Some("-o"), ..f("--output", Some("text|json"), Output, Ours, "output format (default text)") },
    f("--from", Some("IP"), Explain, Ours, "the client's source address"),
    // Where objects come from.
    f("--source", Some("kube|file:PATH"), Config, Ours, "where Services, EndpointSlices and the Node come from (default kube)"),
    f("--kubeconfig", S, Config, Upstream, "kubeconfig file (kube source)"),
    f("--master", S, Config, Upstream, "API server address (overrides the kubeconfig's)"),
    f("--kube-api-qps", Some("FLOAT"), Config, Upstream, "QPS to the API server (default 5)"),
    f("--kube-api-burst", N, Config, Upstream, "burst to the API server (default 10)"),
    f("--kube-api-content-type", S, Config, Upstream, "content type of requests to the API server (default application/vnd.kubernetes.protobuf)"),
    // The node.
    f("--hostname-override", S, Config, Upstream, "the Node's name (default: the host name)"),
    f("--node-ip", Some("IP[,IP]"), Config, Ours, "the node's IPs (default: from the Node object)"),
    f("--bind-address", Some("IP"), Config, Upstream, "the node's primary IP, as kube-proxy reads it (0.0.0.0 or :: = from the Node object)"),
    f("--proxy-mode", Some("nftables|ipvs"), Config, Upstream, "proxy mode (default nftables; iptables is not offered: nftables is its netlink equivalent)"),
    f("--cluster-cidr", Some("CIDR[,CIDR]"), Config, Upstream, "the pod network, for --detect-local-mode ClusterCIDR"),
    f("--detect-local-mode", Some("MODE"), Config, Upstream, "ClusterCIDR|NodeCIDR|BridgeInterface|InterfaceNamePrefix"),
    f("--pod-bridge-interface", S, Config, Upstream, "bridge, for --detect-local-mode BridgeInterface"),
    f("--pod-interface-name-prefix", S, Config, Upstream, "interface prefix, for --detect-local-mode InterfaceNamePrefix"),
    f("--nodeport-addresses", Some("primary|all|CIDR,..."), Config, Upstream, "node addresses that serve NodePorts (default primary)"),
    f("--masquerade-all", B, Config, Upstream, "SNAT all traffic sent via Service cluster IPs"),
    Flag { short: None, ..f("--iptables-masquerade-bit", N, Config, Upstream, "the fwmark bit that asks for SNAT, 0..31 (default 14)") },
    f("--masquerade-bit", N, Config, Ours, "same as --iptables-masquerade-bit"),
    f("--ignore-external-ips", B, Config, Ours, "serve no Service spec.externalIPs (CVE-2020-8554)"),
    f("--keep-kube-proxy-state", B, Config, Ours, "leave kube-proxy's rules in the kernel (default: remove them after the first successful sync)"),
    f("--feature-gates", Some("NAME=BOOL,..."), Config, Upstream, "kube-proxy's feature gates; unknown gates are an error"),
    // Syncing.
    f("--sync-period", D, Config, Ours, "periodic full resync (default 30s)"),
    f("--min-sync-period", D, Config, Ours, "minimum time between syncs (default 1s)"),
    f("--iptables-sync-period", D, Config, Upstream, "= --sync-period, except in ipvs mode (as kube-proxy)"),
    f("--iptables-min-sync-period", D, Config, Upstream, "= --min-sync-period, except in ipvs mode (as kube-proxy)"),
    f("--ipvs-sync-period", D, Config, Upstream, "= --sync-period in ipvs mode"),
    f("--ipvs-min-sync-period", D, Config, Upstream, "= --min-sync-period in ipvs mode"),
    f("--config-sync-period", D, Config, NoEffect("the watchers of kube-nlproxy never resync from their cache"), "informer resync period"),
    // IPVS.
    f("--ipvs-scheduler", S, Config, Upstream, "rr|wrr|lc|wlc|lblc|lblcr|sh|dh|sed|nq|mh (default rr)"),
    f("--ipvs-strict-arp", B, Config, Upstream, "arp_ignore=1, arp_announce=2"),
    f("--ipvs-tcp-timeout", D, Config, Upstream, "IPVS TCP idle timeout (0 = leave as is)"),
    f("--ipvs-tcpfin-timeout", D, Config, Upstream, "IPVS TCP FIN timeout (0 = leave as is)"),
    f("--ipvs-udp-timeout", D, Config, Upstream, "IPVS UDP timeout (0 = leave as is)"),
    f("--ipvs-exclude-cidrs", Some("CIDR,..."), Config, Upstream, "IPVS servers never deleted by sync or cleanup"),
    f("--iptables-localhost-nodeports", B, Config, NoEffect("NodePorts are never served on loopback addresses (as in kube-proxy's nftables mode)"), "iptables mode's localhost NodePorts"),
    // Conntrack and the process.
    f("--conntrack-max-per-core", N, Config, Upstream, "nf_conntrack_max per CPU (default 32768; 0 = leave as is)"),
    f("--conntrack-min", N, Config, Upstream, "minimum nf_conntrack_max (default 131072)"),
    f("--conntrack-tcp-timeout-established", D, Config, Upstream, "(default 24h0m0s; 0 = leave as is)"),
    f("--conntrack-tcp-timeout-close-wait", D, Config, Upstream, "(default 1h0m0s; 0 = leave as is)"),
    f("--conntrack-tcp-be-liberal", B, Config, Upstream, "nf_conntrack_tcp_be_liberal=1"),
    f("--conntrack-udp-timeout", D, Config, Upstream, "(0 = leave as is)"),
    f("--conntrack-udp-timeout-stream", D, Config, Upstream, "(0 = leave as is)"),
    f("--oom-score-adj", N, Config, Upstream, "-1000..1000 (default -999)"),
    // Servers.
    f("--healthz-bind-address", Some("IP:PORT"), Config, Upstream, "health server (default 0.0.0.0:10256; empty = off)"),
    f("--metrics-bind-address", Some("IP:PORT"), Config, Upstream, "metrics server (default 127.0.0.1:10249)"),
    f("--bind-address-hard-fail", B, Config, Upstream, "exit if the health or metrics server cannot bind its port"),
    f("--profiling", B, Config, NoEffect("kube-nlproxy serves no /debug/pprof"), "Go profiling handlers"),
    f("--show-hidden-metrics-for-version", S, Config, NoEffect("kube-nlproxy hides no metrics"), "show metrics hidden since this version"),
    f("--boot-id-file", S, Config, NoEffect("kube-nlproxy reads no boot id"), "files holding the boot id"),
    // Logs.
    Flag { short: Some("-v"), ..f("--v", N, Config, Upstream, "log verbosity: 0 info, 2-3 debug, 4+ trace") },
    f("--vmodule", Some("PATTERN=N,..."), Config, Upstream, "per-file or per-module verbosity (file name or module path, * and ? globs)"),
    f("--logging-format", Some("text|json"), Config, Upstream, "klog text (default) or component-base JSON"),
    f("--skip-headers", B, Config, Upstream, "text log lines without the klog header"),
    f("--add-dir-header", B, Config, Upstream, "the source file's directory in the klog header"),
    f("--logtostderr", B, Config, NoEffect(LOG_FILES), "log to stderr (default true)"),
    f("--alsologtostderr", B, Config, NoEffect(LOG_FILES), "log to stderr and files"),
    f("--log-dir", S, Config, NoEffect(LOG_FILES), "log file directory"),
    f("--log-file", S, Config, NoEffect(LOG_FILES), "log file"),
    f("--log-file-max-size", N, Config, NoEffect(LOG_FILES), "log file size limit (MB)"),
    f("--one-output", B, Config, NoEffect(LOG_FILES), "one log file per severity"),
    f("--skip-log-headers", B, Config, NoEffect(LOG_FILES), "no headers in log files"),
    f("--stderrthreshold", Some("SEVERITY"), Config, NoEffect("every line goes to stderr"), "lines at or above it go to stderr"),
    f("--log-backtrace-at", Some("FILE:LINE"), Config, NoEffect("Rust log lines carry no Go stack"), "stack trace at this line"),
    f("--log-flush-frequency", D, Config, NoEffect("every line is written at once, unbuffered"), "log flush period"),
    f("--log-json-info-buffer-size", Some("QUANTITY"), Config, NoEffect("every line is written at once, unbuffered"), "JSON info stream buffer (alpha)"),
    f("--log-json-split-stream", B, Config, NoEffect("every line goes to stderr"), "JSON info lines to stdout (alpha)"),
    f("--log-text-info-buffer-size", Some("QUANTITY"), Config, NoEffect("every line is written at once, unbuffered"), "text info stream buffer (alpha)"),
    f("--log-text-split-stream", B, Config, NoEffect("every line goes to stderr"), "text info lines to stdout (alpha)"),
    // Hidden upstream, deprecated: still read.
    f("--healthz-port", N, Config, Upstream, "deprecated: port of --healthz-bind-address (0 = off)"),
    f("--metrics-port", N, Config, Upstream, "deprecated: port of --metrics-bind-address (0 = off)"),
    // Ours, kept from before.
    f("--node-ips", Some("IP[,IP]"), Config, Ours, "same as --node-ip"),
];

/// Finds a flag by what was typed: `--name`, `--name_with_underscores`, `-v`.
pub fn lookup(typed: &str) -> Option<&'static Flag> {
    if !typed.starts_with("--") {
        return FLAGS.iter().find(|f| f.short == Some(typed));
    }
    let name = typed.replace('_', "-");
    FLAGS.iter().find(|f| f.name == name)
}

/// What each command does, for help.
fn about(cmd: Command) -> (&'static str, &'static str) {
    match cmd {
        Command::Run => (
            "kube-nlproxy [run] [FLAGS]",
            "The proxy (the default command).",
        ),
        Command::Plan => (
            "kube-nlproxy plan [FLAGS]",
            "Print the netlink operations a sync would send, grouped by Service; apply nothing.",
        ),
        Command::Cleanup => (
            "kube-nlproxy cleanup [--kube-proxy] [FLAGS]",
            "Delete everything kube-nlproxy created (also: --cleanup); with --kube-proxy,\nkube-proxy's rules instead.",
        ),
        Command::Explain => (
            "kube-nlproxy explain IP:PORT[/tcp|udp|sctp] [--from SRC_IP] [FLAGS]",
            "Where a new connection would go, read from the kernel (with --source also\ncompared with the desired state). Exit status: 0 served, 3 rejected, 4 dropped,\n5 not a service, 6 degraded (endpoints missing from the kernel), 1 error.",
        ),
        Command::Status => (
            "kube-nlproxy status [FLAGS]",
            "Mode, node, what is programmed, last sync, last error, drift repairs (from the\ndaemon's metrics server, else from the kernel).",
        ),
    }
}

fn line(f: &Flag) -> String {
    let mut name = match f.short {
        Some(s) => format!("{s}, {}", f.name),
        None => format!("    {}", f.name),
    };
    if let Some(v) = f.value {
        name.push(' ');
        name.push_str(v);
    }
    let help = match f.effect {
        Effect::NoEffect(why) => format!("{} (accepted; no effect: {why})", f.help),
        _ => f.help.to_string(),
    };
    if name.len() < 36 {
        format!("  {name:<36} {help}\n")
    } else {
        format!("  {name}\n  {:<36} {help}\n", "")
    }
}

/// `kube-nlproxy help`: the commands and `run`'s flags.
pub fn usage() -> String {
    let mut s = String::from(
        "kube-nlproxy: a Kubernetes service proxy that programs the dataplane over netlink.\n\
         It takes kube-proxy's flags and KubeProxyConfiguration file.\n\n\
         Commands:\n\
         \x20 run        the proxy (default)\n\
         \x20 plan       print the netlink operations a sync would send\n\
         \x20 explain    where a new connection to IP:PORT would go\n\
         \x20 status     mode, node, what is programmed, last sync\n\
         \x20 cleanup    delete everything kube-nlproxy created\n\
         \x20 help CMD   a command's flags\n\n",
    );
    s.push_str(&help(Command::Run));
    s
}

/// `kube-nlproxy help CMD` / `CMD --help`: that command and its flags only.
pub fn help(cmd: Command) -> String {
    let (usage, what) = about(cmd);
    let mut s = format!("Usage: {usage}\n\n{what}\n\n");
    let own: Vec<&Flag> = FLAGS
        .iter()
        .filter(|f| f.scope != Scope::Config && f.scope.applies_to(cmd))
        .collect();
    if !own.is_empty() {
        s.push_str("Flags:\n");
        for f in own {
            s.push_str(&line(f));
        }
        s.push('\n');
    }
    if cmd == Command::Run {
        s.push_str("Configuration flags (kube-proxy's names; every command takes them):\n");
        for f in FLAGS.iter().filter(|f| f.scope == Scope::Config) {
            s.push_str(&line(f));
        }
    } else {
        s.push_str(
            "It also takes run's configuration flags (--config, --source, --proxy-mode, ...):\n\
             see `kube-nlproxy help run`.\n",
        );
    }
    s
}
