//! The command line: split into flags and words, the configuration file read, each
//! flag applied on top of it in order and checked as kube-proxy checks it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::{
    Command, Config, ConfigError, DetectLocalMode, Output, ProxyMode, Source, features, file,
    flags, validate, value,
};

/// One flag as given.
struct Given {
    flag: &'static flags::Flag,
    /// As typed (`--log_dir`, `-v`).
    typed: String,
    /// The value (`true` for a bare boolean).
    value: String,
}

/// Splits the command line into flags, the command and explain's target.
fn tokenize(args: &[String]) -> Result<(Vec<Given>, Vec<String>), ConfigError> {
    let mut given = Vec::new();
    let mut positional = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            positional.extend(it.by_ref().cloned());
            break;
        }
        let (typed, inline) = if arg.starts_with("--") {
            match arg.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (arg.clone(), None),
            }
        } else if arg.starts_with('-') && arg.len() > 1 {
            // `-v`, `-v=2`, `-v2`, `-h`, `-o json`.
            let short = &arg[..2];
            let rest = &arg[2..];
            let inline = if rest.is_empty() {
                None
            } else {
                Some(rest.strip_prefix('=').unwrap_or(rest).to_string())
            };
            (short.to_string(), inline)
        } else {
            positional.push(arg.clone());
            continue;
        };
        let Some(flag) = flags::lookup(&typed) else {
            return Err(ConfigError::UnknownFlag(typed));
        };
        let value = match (flag.value, inline) {
            (_, Some(v)) => v,
            (None, None) => "true".to_string(),
            (Some(_), None) => match it.next() {
                Some(v) => v.clone(),
                None => return Err(ConfigError::MissingValue(typed)),
            },
        };
        given.push(Given { flag, typed, value });
    }
    Ok((given, positional))
}

/// Parses `args` (without the program name): the command, the configuration file
/// and the flags, checked as kube-proxy checks them.
pub fn parse_args<I, S>(args: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let args: Vec<String> = args.into_iter().map(Into::into).collect();
    let (given, positional) = tokenize(&args)?;
    let mut positional = positional.into_iter();
    let mut command = Command::Run;
    let mut explicit = false;
    let mut explain_target = None;
    if let Some(word) = positional.next() {
        if word == "help" {
            return Err(match positional.next() {
                None => ConfigError::Help(None),
                Some(topic) => match Command::from_word(&topic) {
                    Some(c) => ConfigError::Help(Some(c)),
                    None => ConfigError::UnknownCommand(topic),
                },
            });
        }
        command = Command::from_word(&word).ok_or(ConfigError::UnknownCommand(word))?;
        explicit = true;
    }
    for extra in positional {
        if command == Command::Explain && explain_target.is_none() {
            explain_target = Some(extra);
        } else {
            return Err(ConfigError::UnexpectedArgument(extra));
        }
    }
    for g in &given {
        match g.flag.name {
            "--help" if value::parse_go_bool(&g.value) != Some(false) => {
                return Err(ConfigError::Help(explicit.then_some(command)));
            }
            "--version" if g.value == "raw" || value::parse_go_bool(&g.value) == Some(true) => {
                return Err(ConfigError::Version);
            }
            _ => {}
        }
    }
    // `--cleanup` (run's) is the cleanup command: it takes `--kube-proxy` too.
    let cleanup_flag = given
        .iter()
        .any(|g| g.flag.name == "--cleanup" && value::parse_go_bool(&g.value) == Some(true));
    for g in &given {
        let by_cleanup = cleanup_flag && g.flag.scope.applies_to(Command::Cleanup);
        if !g.flag.scope.applies_to(command) && !by_cleanup {
            return Err(ConfigError::FlagNotForCommand {
                flag: g.typed.clone(),
                command: command.name(),
            });
        }
    }

    let mut errors = Vec::new();
    let config_path = given
        .iter()
        .rev()
        .find(|g| g.flag.name == "--config")
        .map(|g| g.value.clone());
    let mut cfg = Config::default();
    if let Some(path) = config_path {
        if path.is_empty() {
            return Err(ConfigError::ConfigFile {
                path,
                reason: "empty path".into(),
            });
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::ConfigFile {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        cfg = match file::read(&text, cfg) {
            Ok(c) => c,
            Err(file::FileError::Unusable(reason)) => {
                return Err(ConfigError::ConfigFile { path, reason });
            }
            Err(file::FileError::Invalid(errs)) => {
                return Err(ConfigError::Invalid(errs));
            }
        };
        cfg.config_file = Some(PathBuf::from(path));
    }
    cfg.command = command;
    cfg.explain_target = explain_target;

    let mut late = LateFlags::default();
    let mut warned = std::collections::BTreeSet::new();
    // Feature gates first: other flags' checks depend on them.
    let (gates, rest): (Vec<&Given>, Vec<&Given>) =
        given.iter().partition(|g| g.flag.name == "--feature-gates");
    for g in gates.into_iter().chain(rest) {
        if let flags::Effect::NoEffect(why) = g.flag.effect
            && warned.insert(g.flag.name)
        {
            cfg.warnings.push(format!(
                "{}: accepted for kube-proxy compatibility, no effect: {why}",
                g.typed
            ));
        }
        if let Err(e) = apply_flag(&mut cfg, &mut late, g) {
            match e {
                FlagError::Field(fe) => errors.push(fe.from_flag(&g.typed)),
                FlagError::Other(ce) => return Err(ce),
            }
        }
    }
    late.finish(&mut cfg);
    errors.extend(validate::validate(&mut cfg, &late.origins));
    if !errors.is_empty() {
        return Err(ConfigError::Invalid(errors));
    }
    Ok(cfg)
}

enum FlagError {
    Field(value::FieldError),
    Other(ConfigError),
}

impl From<value::FieldError> for FlagError {
    fn from(e: value::FieldError) -> Self {
        FlagError::Field(e)
    }
}

/// Flags whose effect depends on others, applied once all are read (as kube-proxy's
/// `processV1Alpha1Flags` does), and which flag set which field.
#[derive(Default)]
pub(crate) struct LateFlags {
    iptables_sync: Option<Duration>,
    iptables_min_sync: Option<Duration>,
    healthz_port: Option<u16>,
    metrics_port: Option<u16>,
    /// `logging.vmodule` of the file, kept behind the flag's patterns.
    file_vmodule: Option<Vec<(String, u8)>>,
    /// Field path (below KubeProxyConfiguration) -> the flag that set it.
    pub(crate) origins: BTreeMap<&'static str, String>,
}

impl LateFlags {
    fn finish(&mut self, cfg: &mut Config) {
        if cfg.detect_local_mode.is_none() && !cfg.cluster_cidrs.is_empty() {
            cfg.detect_local_mode = Some(DetectLocalMode::ClusterCidr);
        }
        if cfg.mode == ProxyMode::Ipvs {
            let [sync, min] = cfg.ipvs_sync_periods;
            cfg.sync_period = sync.unwrap_or(cfg.sync_period);
            cfg.min_sync_period = min.unwrap_or(cfg.min_sync_period);
            for (set, flag) in [
                (self.iptables_sync.is_some(), "--iptables-sync-period"),
                (
                    self.iptables_min_sync.is_some(),
                    "--iptables-min-sync-period",
                ),
            ] {
                if set {
                    cfg.warnings.push(format!(
                        "{flag}: no effect in ipvs mode (as in kube-proxy): use --ipvs-{}",
                        flag.trim_start_matches("--iptables-")
                    ));
                }
            }
        } else {
            // kube-proxy: the iptables periods apply in every mode but ipvs.
            if let Some(d) = self.iptables_sync {
                cfg.sync_period = d;
            }
            if let Some(d) = self.iptables_min_sync {
                cfg.min_sync_period = d;
            }
        }
        for (port, addr) in [
            (self.healthz_port, &mut cfg.healthz_bind_address),
            (self.metrics_port, &mut cfg.metrics_bind_address),
        ] {
            match port {
                None => {}
                Some(0) => addr.clear(),
                Some(p) => {
                    let host = addr
                        .rsplit_once(':')
                        .map(|(h, _)| h.to_string())
                        .unwrap_or_else(|| addr.clone());
                    *addr = format!("{host}:{p}");
                }
            }
        }
    }
}

/// The KubeProxyConfiguration field each flag sets (for error messages).
fn field_of(flag: &str) -> &'static str {
    match flag {
        "--proxy-mode" => "mode",
        "--hostname-override" => "hostnameOverride",
        "--bind-address" => "bindAddress",
        "--bind-address-hard-fail" => "bindAddressHardFail",
        "--cluster-cidr" => "clusterCIDR",
        "--detect-local-mode" => "detectLocalMode",
        "--pod-bridge-interface" => "detectLocal.bridgeInterface",
        "--pod-interface-name-prefix" => "detectLocal.interfaceNamePrefix",
        "--nodeport-addresses" => "nodePortAddresses",
        "--masquerade-all" => "nftables.masqueradeAll",
        "--masquerade-bit" | "--iptables-masquerade-bit" => "nftables.masqueradeBit",
        "--sync-period" | "--iptables-sync-period" => "syncPeriod",
        "--min-sync-period" | "--iptables-min-sync-period" => "minSyncPeriod",
        "--ipvs-sync-period" => "ipvs.syncPeriod",
        "--ipvs-min-sync-period" => "ipvs.minSyncPeriod",
        "--config-sync-period" => "configSyncPeriod",
        "--kubeconfig" => "clientConnection.kubeconfig",
        "--kube-api-qps" => "clientConnection.qps",
        "--kube-api-burst" => "clientConnection.burst",
        "--kube-api-content-type" => "clientConnection.contentType",
        "--healthz-bind-address" | "--healthz-port" => "healthzBindAddress",
        "--metrics-bind-address" | "--metrics-port" => "metricsBindAddress",
        "--profiling" => "enableProfiling",
        "--show-hidden-metrics-for-version" => "showHiddenMetricsForVersion",
        "--feature-gates" => "featureGates",
        "--ipvs-scheduler" => "ipvs.scheduler",
        "--ipvs-strict-arp" => "ipvs.strictARP",
        "--ipvs-tcp-timeout" => "ipvs.tcpTimeout",
        "--ipvs-tcpfin-timeout" => "ipvs.tcpFinTimeout",
        "--ipvs-udp-timeout" => "ipvs.udpTimeout",
        "--ipvs-exclude-cidrs" => "ipvs.excludeCIDRs",
        "--iptables-localhost-nodeports" => "iptables.localhostNodePorts",
        "--conntrack-max-per-core" => "conntrack.maxPerCore",
        "--conntrack-min" => "conntrack.min",
        "--conntrack-tcp-timeout-established" => "conntrack.tcpEstablishedTimeout",
        "--conntrack-tcp-timeout-close-wait" => "conntrack.tcpCloseWaitTimeout",
        "--conntrack-tcp-be-liberal" => "conntrack.tcpBeLiberal",
        "--conntrack-udp-timeout" => "conntrack.udpTimeout",
        "--conntrack-udp-timeout-stream" => "conntrack.udpStreamTimeout",
        "--oom-score-adj" => "oomScoreAdj",
        "--v" => "logging.verbosity",
        "--vmodule" => "logging.vmodule",
        "--logging-format" => "logging.format",
        "--log-flush-frequency" => "logging.flushFrequency",
        "--log-json-split-stream" => "logging.options.json.splitStream",
        "--log-json-info-buffer-size" => "logging.options.json.infoBufferSize",
        "--log-text-split-stream" => "logging.options.text.splitStream",
        "--log-text-info-buffer-size" => "logging.options.text.infoBufferSize",
        "--ignore-external-ips" => "ignoreExternalIPs",
        "--keep-kube-proxy-state" => "keepKubeProxyState",
        _ => "",
    }
}

/// The flags that say which traffic is local and what is masqueraded (with
/// `--config`, which may say it too): `explain` takes these from a running
/// daemon unless one is given.
const LOCAL_TRAFFIC_FLAGS: &[&str] = &[
    "--config",
    "--detect-local-mode",
    "--cluster-cidr",
    "--pod-bridge-interface",
    "--pod-interface-name-prefix",
    "--masquerade-all",
];

fn apply_flag(cfg: &mut Config, late: &mut LateFlags, g: &Given) -> Result<(), FlagError> {
    let name = g.flag.name;
    let v = g.value.as_str();
    let path = field_of(name);
    if !path.is_empty() {
        late.origins.insert(path, g.typed.clone());
    }
    if LOCAL_TRAFFIC_FLAGS.contains(&name) {
        cfg.local_traffic_given = true;
    }
    if name == "--help" || name == "--version" {
        // Handled before; `--version=vX.Y.Z` sets upstream's reported version.
        if name == "--version" && v.starts_with('v') {
            cfg.warnings.push(format!(
                "{}={v}: no effect: kube-nlproxy reports its own version",
                g.typed
            ));
        }
        return Ok(());
    }
    let quoted = || value::go_quote(v);
    let invalid = |detail: String| value::FieldError::invalid(path, value::go_quote(v), detail);
    let other = |reason: &str| {
        FlagError::Other(ConfigError::InvalidValue {
            flag: g.typed.clone(),
            value: v.to_string(),
            reason: reason.to_string(),
        })
    };
    if g.flag.value.is_none() {
        let on = value::parse_go_bool(v).ok_or_else(|| {
            if path.is_empty() {
                other("expected true or false")
            } else {
                invalid(format!(
                    "strconv.ParseBool: parsing {}: invalid syntax",
                    quoted()
                ))
                .into()
            }
        })?;
        match name {
            "--masquerade-all" => cfg.masquerade_all = on,
            "--ignore-external-ips" => cfg.ignore_external_ips = on,
            "--keep-kube-proxy-state" => cfg.keep_kube_proxy_state = on,
            "--kube-proxy" => cfg.cleanup_kube_proxy = on,
            "--once" => cfg.once = on,
            "--init-only" => cfg.init_only = on,
            "--ipvs-strict-arp" => cfg.ipvs_strict_arp = on,
            "--conntrack-tcp-be-liberal" => cfg.conntrack.tcp_be_liberal = on,
            "--bind-address-hard-fail" => cfg.bind_address_hard_fail = on,
            "--skip-headers" => cfg.log_skip_headers = on,
            "--add-dir-header" => cfg.log_add_dir_header = on,
            "--cleanup" if on => cfg.command = Command::Cleanup,
            "--log-json-split-stream" | "--log-text-split-stream"
                if on && !features::enabled(&cfg.feature_gates, "LoggingAlphaOptions") =>
            {
                return Err(value::FieldError::forbidden(
                    path,
                    "Feature LoggingAlphaOptions is disabled",
                )
                .into());
            }
            // Checked, no effect (warned above).
            _ => {}
        }
        return Ok(());
    }
    let duration = |positive: bool| -> Result<Duration, FlagError> {
        let (negative, d) = value::parse_go_duration(v).map_err(invalid)?;
        if negative {
            return Err(invalid("must be greater than or equal to 0".into()).into());
        }
        if positive && d.is_zero() {
            return Err(invalid("must be greater than 0".into()).into());
        }
        Ok(d)
    };
    let int = || -> Result<i64, FlagError> {
        v.parse::<i64>()
            .map_err(|e| invalid(format!("strconv.ParseInt: parsing {}: {e}", quoted())).into())
    };
    match name {
        "--config" => {}
        "--write-config-to" => cfg.write_config_to = Some(PathBuf::from(v)),
        "--output" => {
            cfg.output = match v {
                "text" => Output::Text,
                "json" => Output::Json,
                _ => return Err(other("expected text or json")),
            }
        }
        "--from" => {
            cfg.explain_from = Some(v.parse().map_err(|_| other("expected an IP address"))?)
        }
        "--source" => {
            cfg.source_given = true;
            cfg.source = if v == "kube" {
                Source::Kube
            } else if let Some(p) = v.strip_prefix("file:") {
                Source::File(PathBuf::from(p))
            } else {
                return Err(other("expected kube or file:PATH"));
            }
        }
        "--proxy-mode" => cfg.mode = validate::proxy_mode("mode", v)?,
        // As kube-proxy: empty is unset; blanks only are an error.
        "--hostname-override" if v.is_empty() => {}
        "--hostname-override" => {
            let h = v.trim();
            if h.is_empty() {
                return Err(other("empty hostname-override is invalid"));
            }
            cfg.hostname_override = Some(h.to_lowercase())
        }
        "--node-ip" | "--node-ips" => {
            cfg.node_ips = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().map_err(|_| other("expected IP[,IP]")))
                .collect::<Result<_, _>>()?
        }
        "--bind-address" => cfg.bind_address = validate::ip(path, v)?,
        "--cluster-cidr" => cfg.cluster_cidrs = validate::cluster_cidrs(path, v)?,
        "--detect-local-mode" => cfg.detect_local_mode = validate::detect_local_mode(path, v)?,
        "--pod-bridge-interface" => cfg.pod_bridge_interface = Some(v.to_string()),
        "--pod-interface-name-prefix" => cfg.pod_interface_name_prefix = Some(v.to_string()),
        "--nodeport-addresses" => {
            let items: Vec<String> = v
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            let (npa, warning) = validate::nodeport_addresses(path, &items)?;
            cfg.nodeport_addresses = npa;
            cfg.warnings.extend(warning);
        }
        "--sync-period" => cfg.sync_period = duration(true)?,
        "--min-sync-period" => cfg.min_sync_period = duration(false)?,
        "--iptables-sync-period" => late.iptables_sync = Some(duration(true)?),
        "--iptables-min-sync-period" => late.iptables_min_sync = Some(duration(false)?),
        "--ipvs-sync-period" => cfg.ipvs_sync_periods[0] = Some(duration(true)?),
        "--ipvs-min-sync-period" => cfg.ipvs_sync_periods[1] = Some(duration(false)?),
        "--config-sync-period" => cfg.config_sync_period = duration(true)?,
        "--kubeconfig" => cfg.kubeconfig = (!v.is_empty()).then(|| PathBuf::from(v)),
        "--master" => cfg.master = (!v.is_empty()).then(|| v.to_string()),
        "--kube-api-qps" => {
            cfg.kube_api_qps = v
                .parse::<f32>()
                .map_err(|e| invalid(format!("strconv.ParseFloat: parsing {}: {e}", quoted())))?
        }
        "--kube-api-burst" => {
            let n = int()?;
            cfg.kube_api_burst = validate::burst(path, n)?;
        }
        "--kube-api-content-type" => {
            cfg.warnings.extend(validate::content_type_warning(path, v));
            cfg.kube_api_content_type = v.to_string()
        }
        // Empty or `0` (ours, for both): the server is off.
        "--healthz-bind-address" | "--metrics-bind-address" => {
            if !v.is_empty() && v != "0" {
                validate::host_port(path, v)?;
            }
            if name == "--healthz-bind-address" {
                cfg.healthz_bind_address = v.to_string()
            } else {
                cfg.metrics_bind_address = v.to_string()
            }
        }
        "--healthz-port" | "--metrics-port" => {
            let p = u16::try_from(int()?).map_err(|_| invalid("must be a valid port".into()))?;
            if name == "--healthz-port" {
                late.healthz_port = Some(p);
            } else {
                late.metrics_port = Some(p);
            }
        }
        "--show-hidden-metrics-for-version" => validate::show_hidden_metrics(path, v)?,
        "--feature-gates" => {
            let mut gates = BTreeMap::new();
            features::parse_flag(v, &mut gates).map_err(&invalid)?;
            for (k, on) in gates {
                cfg.feature_gates.insert(k, on);
            }
        }
        "-v" | "--v" => {
            cfg.verbosity = validate::verbosity(path, v)?;
        }
        // As kube-proxy: the flag's patterns first (they win), then the file's.
        "--vmodule" => {
            let from_file = late
                .file_vmodule
                .get_or_insert_with(|| cfg.vmodule.clone())
                .clone();
            cfg.vmodule = validate::vmodule(path, v)?;
            cfg.vmodule.extend(from_file);
        }
        "--logging-format" => cfg.log_format = validate::log_format(path, v)?,
        "--masquerade-bit" | "--iptables-masquerade-bit" => {
            cfg.masquerade_bit = validate::masquerade_bit(path, int()?)?
        }
        "--ipvs-scheduler" => cfg.ipvs_scheduler = validate::ipvs_scheduler(path, v)?,
        "--ipvs-tcp-timeout" => cfg.ipvs_timeouts[0] = duration(false)?,
        "--ipvs-tcpfin-timeout" => cfg.ipvs_timeouts[1] = duration(false)?,
        "--ipvs-udp-timeout" => cfg.ipvs_timeouts[2] = duration(false)?,
        "--ipvs-exclude-cidrs" => {
            let items: Vec<&str> = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            cfg.ipvs_exclude_cidrs = validate::cidr_list(path, &items)?;
        }
        "--conntrack-max-per-core" => {
            cfg.conntrack.max_per_core = validate::non_negative_u32(path, int()?)?
        }
        "--conntrack-min" => cfg.conntrack.min = validate::non_negative_u32(path, int()?)?,
        "--conntrack-tcp-timeout-established" => {
            cfg.conntrack.tcp_established_timeout = duration(false)?
        }
        "--conntrack-tcp-timeout-close-wait" => {
            cfg.conntrack.tcp_close_wait_timeout = duration(false)?
        }
        "--conntrack-udp-timeout" => cfg.conntrack.udp_timeout = duration(false)?,
        "--conntrack-udp-timeout-stream" => cfg.conntrack.udp_stream_timeout = duration(false)?,
        "--oom-score-adj" => cfg.oom_score_adj = Some(validate::oom_score_adj(path, int()?)?),
        "--log-flush-frequency" => {
            duration(true)?;
        }
        "--log-file-max-size" => {
            if v.parse::<u64>().is_err() {
                return Err(other("expected a size in megabytes"));
            }
        }
        "--stderrthreshold" => {
            if !matches!(
                v.to_ascii_uppercase().as_str(),
                "INFO" | "WARNING" | "ERROR" | "FATAL" | "0" | "1" | "2" | "3"
            ) {
                return Err(other("expected INFO, WARNING, ERROR or FATAL"));
            }
        }
        "--log-backtrace-at" => {
            if !v.is_empty()
                && !v
                    .rsplit_once(':')
                    .is_some_and(|(f, l)| !f.is_empty() && l.parse::<u32>().is_ok())
            {
                return Err(other("expected FILE:LINE"));
            }
        }
        "--log-json-info-buffer-size" | "--log-text-info-buffer-size" => {
            validate::quantity(path, v)?;
            if v != "0" && !features::enabled(&cfg.feature_gates, "LoggingAlphaOptions") {
                return Err(value::FieldError::forbidden(
                    path,
                    "Feature LoggingAlphaOptions is disabled",
                )
                .into());
            }
        }
        // Checked, no effect (warned in parse_args).
        "--log-dir" | "--log-file" | "--boot-id-file" => {}
        _ => return Err(FlagError::Other(ConfigError::UnknownFlag(g.typed.clone()))),
    }
    Ok(())
}
