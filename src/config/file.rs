//! `--config FILE`: a `KubeProxyConfiguration` (`kubeproxy.config.k8s.io/v1alpha1`)
//! as kube-proxy reads it. Known fields fill the [`Config`] and are checked as
//! kube-proxy checks them: a value it would reject is an error naming the field
//! (`KubeProxyConfiguration.syncPeriod: Invalid value: "thirty": ...`). Fields we
//! do not know, or that have no effect here, give one warning each.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use super::validate as check;
use super::value::{FieldError, go_quote, parse_go_duration};
use super::{Config, ProxyMode};

const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
const KIND: &str = "KubeProxyConfiguration";

/// Fields kube-proxy has that have no effect here, and why; accepted with a
/// warning.
const NO_EFFECT: &[(&str, &str)] = &[
    ("enableProfiling", "kube-nlproxy serves no /debug/pprof"),
    ("portRange", "kube-nlproxy has no userspace proxy"),
    ("winkernel", "Windows only"),
    ("windowsRunAsService", "Windows only"),
];

/// Why a file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileError {
    /// Not YAML, or not one KubeProxyConfiguration.
    Unusable(String),
    /// Values kube-proxy would reject.
    Invalid(Vec<FieldError>),
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileError::Unusable(s) => f.write_str(s),
            FileError::Invalid(errs) => {
                let lines: Vec<String> = errs.iter().map(ToString::to_string).collect();
                f.write_str(&lines.join("\n"))
            }
        }
    }
}

/// Go's `%v` of a YAML value, for error messages.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => go_quote(s),
        other => other.to_string(),
    }
}

struct Reader {
    warnings: Vec<String>,
    errors: Vec<FieldError>,
}

impl Reader {
    fn wrong_type(&mut self, path: &str, v: &Value, want: &str) {
        self.errors.push(FieldError::invalid(
            path,
            shown(v),
            format!("expected {want}"),
        ));
    }

    fn str(&mut self, path: &str, v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => {
                self.wrong_type(path, other, "a string");
                None
            }
        }
    }

    /// A list of strings (`[a, b]`).
    fn str_list(&mut self, path: &str, v: &Value) -> Option<Vec<String>> {
        match v {
            Value::Array(items) => Some(
                items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, item)| self.str(&format!("{path}[{i}]"), item))
                    .collect(),
            ),
            Value::Null => None,
            other => {
                self.wrong_type(path, other, "a list");
                None
            }
        }
    }

    fn boolean(&mut self, path: &str, v: &Value) -> Option<bool> {
        match v {
            Value::Bool(b) => Some(*b),
            Value::Null => None,
            other => {
                self.wrong_type(path, other, "true or false");
                None
            }
        }
    }

    fn int(&mut self, path: &str, v: &Value) -> Option<i64> {
        match v {
            Value::Number(n) if n.as_i64().is_some() => n.as_i64(),
            Value::Null => None,
            other => {
                self.wrong_type(path, other, "an integer");
                None
            }
        }
    }

    fn float(&mut self, path: &str, v: &Value) -> Option<f64> {
        match v {
            Value::Number(n) => n.as_f64(),
            Value::Null => None,
            other => {
                self.wrong_type(path, other, "a number");
                None
            }
        }
    }

    /// A duration that must not be negative (`positive`: nor zero).
    fn duration(&mut self, path: &str, v: &Value, positive: bool) -> Option<Duration> {
        let s = self.str(path, v)?;
        match parse_go_duration(&s) {
            Ok((true, _)) => {
                self.errors.push(FieldError::invalid(
                    path,
                    go_quote(&s),
                    "must be greater than or equal to 0",
                ));
                None
            }
            Ok((false, d)) if positive && d.is_zero() => {
                self.errors.push(FieldError::invalid(
                    path,
                    go_quote(&s),
                    "must be greater than 0",
                ));
                None
            }
            Ok((false, d)) => Some(d),
            Err(e) => {
                self.errors.push(FieldError::invalid(path, go_quote(&s), e));
                None
            }
        }
    }

    /// A check from [`check`]: keeps the value or the error.
    fn checked<T>(&mut self, r: Result<T, FieldError>) -> Option<T> {
        r.map_err(|e| self.errors.push(e)).ok()
    }

    fn unknown(&mut self, path: &str) {
        self.warnings
            .push(format!("{path}: unknown field; ignored"));
    }

    fn mapping<'v>(&mut self, path: &str, v: &'v Value) -> Option<&'v Map<String, Value>> {
        match v {
            Value::Object(m) => Some(m),
            Value::Null => None,
            other => {
                self.wrong_type(path, other, "a mapping");
                None
            }
        }
    }
}

/// The top level of the file, in the order of the text: later fields override earlier
/// ones (`mode` before `ipvs.syncPeriod` matters), as they did when the file was read.
struct TopLevel(Vec<(String, Value)>);

impl TopLevel {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
}

impl<'de> serde::Deserialize<'de> for TopLevel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = TopLevel;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a KubeProxyConfiguration mapping")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<TopLevel, A::Error> {
                let mut fields = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    fields.push(entry);
                }
                Ok(TopLevel(fields))
            }
        }
        d.deserialize_any(Fields)
    }
}

/// Limits for parsing a configuration file (a few KiB in practice): an alias bomb or
/// a deeply nested file is an error, not an out-of-memory kill.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: 32,
            flow_nesting_limit: 32,
            max_nodes: 100_000,
            max_events: 200_000,
            max_aliases: 1_000,
            max_anchors: 1_000,
            max_merge_keys: 100,
            max_total_scalar_bytes: 1 << 20,
            max_documents: 1,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 10_000,
            max_replay_stack_depth: 16,
        },
        // YAML 1.2 booleans, as before: `yes`/`on` are strings, which gives a warning.
        strict_booleans: true,
        with_snippet: false,
    }
}

/// `false`, `""`, `"0"`, `0`, `null`, or a mapping of those: a field at its default
/// (as `kube-proxy --write-config-to` writes them).
fn is_default(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::String(s) => s.is_empty() || s == "0",
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Object(m) => m.values().all(is_default),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// A healthz or metrics address without a port gets the default one, as
/// kube-proxy's defaulting does (`AppendPortIfNeeded`).
fn with_port(addr: &str, port: u16) -> String {
    let bare = addr.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(_)) => format!("[{bare}]:{port}"),
        Ok(_) => format!("{bare}:{port}"),
        Err(_) => addr.to_string(),
    }
}

/// Applies the configuration in `text` on top of `cfg`; the error is a message.
pub fn apply(text: &str, cfg: Config) -> Result<Config, String> {
    read(text, cfg).map_err(|e| e.to_string())
}

/// Applies the configuration in `text` on top of `cfg`.
pub fn read(text: &str, mut cfg: Config) -> Result<Config, FileError> {
    let doc: Option<TopLevel> =
        serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|e| {
            let msg = e.to_string();
            if msg.contains("Documents") {
                FileError::Unusable(
                    "the file holds several YAML documents (separated by ---); kube-proxy reads one KubeProxyConfiguration".into(),
                )
            } else {
                FileError::Unusable(format!("not valid YAML: {msg}"))
            }
        })?;
    let Some(top) = doc else {
        return Err(FileError::Unusable(
            "expected a KubeProxyConfiguration mapping".into(),
        ));
    };
    let api_version = top.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = top.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != KIND || api_version != API_VERSION {
        return Err(FileError::Unusable(format!(
            "expected apiVersion {API_VERSION} kind {KIND}, got {api_version:?} {kind:?}"
        )));
    }
    let mut r = Reader {
        warnings: Vec::new(),
        errors: Vec::new(),
    };
    // The mode decides which block's periods count, wherever it is in the text.
    if let Some(Value::String(m)) = top.get("mode")
        && let Ok(mode) = check::proxy_mode("mode", m)
    {
        cfg.mode = mode;
    }
    for (name, v) in &top.0 {
        let name = name.as_str();
        match name {
            "apiVersion" | "kind" => {}
            "bindAddress" => {
                if let Some(s) = r.str(name, v).filter(|s| !s.is_empty())
                    && let Some(ip) = r.checked(check::ip(name, &s))
                {
                    cfg.bind_address = ip;
                }
            }
            "bindAddressHardFail" => {
                if let Some(b) = r.boolean(name, v) {
                    cfg.bind_address_hard_fail = b;
                }
            }
            "healthzBindAddress" => {
                if let Some(s) = r.str(name, v).filter(|s| !s.is_empty()) {
                    let s = with_port(&s, 10256);
                    if r.checked(check::host_port(name, &s)).is_some() {
                        cfg.healthz_bind_address = s;
                    }
                }
            }
            "metricsBindAddress" => {
                if let Some(s) = r.str(name, v).filter(|s| !s.is_empty()) {
                    let s = with_port(&s, 10249);
                    if r.checked(check::host_port(name, &s)).is_some() {
                        cfg.metrics_bind_address = s;
                    }
                }
            }
            "clusterCIDR" => {
                if let Some(s) = r.str(name, v)
                    && let Some(c) = r.checked(check::cluster_cidrs(name, &s))
                {
                    cfg.cluster_cidrs = c;
                }
            }
            "hostnameOverride" => {
                if let Some(s) = r.str(name, v).filter(|s| !s.trim().is_empty()) {
                    cfg.hostname_override = Some(s.trim().to_lowercase());
                }
            }
            "mode" => {
                if let Some(s) = r.str(name, v)
                    && let Some(m) = r.checked(check::proxy_mode(name, &s))
                {
                    cfg.mode = m;
                }
            }
            "detectLocalMode" => {
                if let Some(s) = r.str(name, v)
                    && let Some(m) = r.checked(check::detect_local_mode(name, &s))
                {
                    cfg.detect_local_mode = m;
                }
            }
            "detectLocal" => {
                if let Some(m) = r.mapping(name, v) {
                    for (k, v) in m {
                        let sub = format!("detectLocal.{k}");
                        match k.as_str() {
                            "bridgeInterface" => {
                                cfg.pod_bridge_interface = r.str(&sub, v).filter(|s| !s.is_empty())
                            }
                            "interfaceNamePrefix" => {
                                cfg.pod_interface_name_prefix =
                                    r.str(&sub, v).filter(|s| !s.is_empty())
                            }
                            _ => r.unknown(&sub),
                        }
                    }
                }
            }
            "nodePortAddresses" => {
                if let Some(items) = r.str_list(name, v)
                    && let Some((npa, warning)) = r.checked(check::nodeport_addresses(name, &items))
                {
                    cfg.nodeport_addresses = npa;
                    r.warnings.extend(warning);
                }
            }
            // Ours (kube-proxy has no such field): see `--ignore-external-ips`.
            "ignoreExternalIPs" => {
                if let Some(b) = r.boolean(name, v) {
                    cfg.ignore_external_ips = b;
                }
            }
            // Ours: see `--keep-kube-proxy-state`.
            "keepKubeProxyState" => {
                if let Some(b) = r.boolean(name, v) {
                    cfg.keep_kube_proxy_state = b;
                }
            }
            "oomScoreAdj" => {
                if let Some(n) = r.int(name, v)
                    && let Some(a) = r.checked(check::oom_score_adj(name, n))
                {
                    cfg.oom_score_adj = Some(a);
                }
            }
            // Ours (v1alpha1 has them per mode): zero keeps the default.
            "syncPeriod" => {
                if let Some(d) = r.duration(name, v, false).filter(|d| !d.is_zero()) {
                    cfg.sync_period = d;
                }
            }
            "minSyncPeriod" => {
                if let Some(d) = r.duration(name, v, false) {
                    cfg.min_sync_period = d;
                }
            }
            "configSyncPeriod" => {
                if let Some(d) = r.duration(name, v, false).filter(|d| !d.is_zero()) {
                    cfg.config_sync_period = d;
                }
            }
            "showHiddenMetricsForVersion" => {
                if let Some(s) = r.str(name, v)
                    && r.checked(check::show_hidden_metrics(name, &s)).is_some()
                    && !s.is_empty()
                {
                    r.warnings
                        .push(format!("{name}: no effect: kube-nlproxy hides no metrics"));
                }
            }
            "featureGates" => {
                if let Some(m) = r.mapping(name, v) {
                    for (k, v) in m {
                        if let Some(b) = r.boolean(&format!("featureGates.{k}"), v) {
                            cfg.feature_gates.insert(k.clone(), b);
                        }
                    }
                }
            }
            "clientConnection" => read_client_connection(&mut r, v, &mut cfg),
            "logging" => read_logging(&mut r, v, &mut cfg),
            "iptables" | "nftables" | "linux" => {
                // The nftables block applies in nftables mode; the iptables one is
                // read too since many existing files only have it.
                let applies = name != "iptables" || !top.contains_key("nftables");
                read_mode_block(&mut r, name, v, applies, &mut cfg);
            }
            "ipvs" => read_ipvs(&mut r, v, &mut cfg),
            "conntrack" => read_conntrack(&mut r, name, v, &mut cfg),
            other => match NO_EFFECT.iter().find(|(n, _)| *n == other) {
                // Set to its default (as `--write-config-to` writes it): quiet.
                Some(_) if is_default(v) => {}
                Some((_, why)) => r
                    .warnings
                    .push(format!("{other}: accepted, no effect: {why}")),
                None => r.unknown(other),
            },
        }
    }
    if !r.errors.is_empty() {
        return Err(FileError::Invalid(r.errors));
    }
    cfg.warnings = r.warnings;
    Ok(cfg)
}

fn read_client_connection(r: &mut Reader, v: &Value, cfg: &mut Config) {
    let Some(m) = r.mapping("clientConnection", v) else {
        return;
    };
    for (k, v) in m {
        let sub = format!("clientConnection.{k}");
        match k.as_str() {
            "kubeconfig" => {
                if let Some(s) = r.str(&sub, v).filter(|s| !s.is_empty()) {
                    cfg.kubeconfig = Some(PathBuf::from(s));
                }
            }
            "qps" => {
                if let Some(q) = r.float(&sub, v) {
                    cfg.kube_api_qps = q as f32;
                }
            }
            "burst" => {
                if let Some(n) = r.int(&sub, v)
                    && let Some(b) = r.checked(check::burst(&sub, n))
                {
                    cfg.kube_api_burst = b;
                }
            }
            "contentType" => {
                if let Some(s) = r.str(&sub, v).filter(|s| !s.is_empty()) {
                    r.warnings.extend(check::content_type_warning(&sub, &s));
                    cfg.kube_api_content_type = s;
                }
            }
            "acceptContentTypes" => {
                if let Some(s) = r.str(&sub, v) {
                    cfg.kube_api_accept_content_types = s;
                }
            }
            _ => r.unknown(&sub),
        }
    }
}

fn read_logging(r: &mut Reader, v: &Value, cfg: &mut Config) {
    let Some(m) = r.mapping("logging", v) else {
        return;
    };
    for (k, v) in m {
        let sub = format!("logging.{k}");
        match k.as_str() {
            "format" => {
                if let Some(s) = r.str(&sub, v)
                    && let Some(f) = r.checked(check::log_format(&sub, &s))
                {
                    cfg.log_format = f;
                }
            }
            "verbosity" => {
                if let Some(n) = r.int(&sub, v)
                    && let Some(l) = r.checked(check::verbosity(&sub, &n.to_string()))
                {
                    cfg.verbosity = l;
                }
            }
            "vmodule" => {
                let Value::Array(items) = v else {
                    if !v.is_null() {
                        r.wrong_type(&sub, v, "a list of {filePattern, verbosity}");
                    }
                    continue;
                };
                for (i, item) in items.iter().enumerate() {
                    let p = format!("{sub}[{i}]");
                    let Some(m) = r.mapping(&p, item) else {
                        continue;
                    };
                    let pattern = m.get("filePattern").and_then(Value::as_str);
                    let level = m.get("verbosity").and_then(Value::as_u64);
                    match (pattern, level) {
                        (Some(pat), Some(l)) if !pat.is_empty() => cfg
                            .vmodule
                            .push((pat.to_string(), u8::try_from(l).unwrap_or(u8::MAX))),
                        _ => r.wrong_type(&p, item, "{filePattern: PATTERN, verbosity: N}"),
                    }
                }
            }
            "flushFrequency" => {
                if !matches!(v, Value::Number(_)) {
                    r.duration(&sub, v, true);
                }
            }
            "options" if is_default(v) => {}
            "options" => r.warnings.push(format!(
                "{sub}: accepted, no effect: every line goes to stderr at once"
            )),
            _ => r.unknown(&sub),
        }
    }
}

fn read_mode_block(r: &mut Reader, name: &str, v: &Value, applies: bool, cfg: &mut Config) {
    let Some(m) = r.mapping(name, v) else {
        return;
    };
    for (k, v) in m {
        let sub = format!("{name}.{k}");
        match k.as_str() {
            "masqueradeAll" if name != "linux" => {
                if let Some(b) = r.boolean(&sub, v)
                    && applies
                {
                    cfg.masquerade_all = b;
                }
            }
            "masqueradeAll" => {
                if let Some(b) = r.boolean(&sub, v) {
                    cfg.masquerade_all = b;
                }
            }
            "masqueradeBit" if name != "linux" => {
                if let Some(n) = r.int(&sub, v)
                    && let Some(bit) = r.checked(check::masquerade_bit(&sub, n))
                    && applies
                {
                    cfg.masquerade_bit = bit;
                }
            }
            "syncPeriod" if name != "linux" => {
                if let Some(d) = r.duration(&sub, v, false).filter(|d| !d.is_zero())
                    && applies
                    && cfg.mode != ProxyMode::Ipvs
                {
                    cfg.sync_period = d;
                }
            }
            "minSyncPeriod" if name != "linux" => {
                if let Some(d) = r.duration(&sub, v, false).filter(|d| !d.is_zero())
                    && applies
                    && cfg.mode != ProxyMode::Ipvs
                {
                    cfg.min_sync_period = d;
                }
            }
            "oomScoreAdj" if name == "linux" => {
                if let Some(n) = r.int(&sub, v)
                    && let Some(a) = r.checked(check::oom_score_adj(&sub, n))
                {
                    cfg.oom_score_adj = Some(a);
                }
            }
            "conntrack" if name == "linux" => read_conntrack(r, &sub, v, cfg),
            // iptables mode only: kube-proxy ignores it in nftables mode too.
            "localhostNodePorts" if name != "linux" => {
                r.boolean(&sub, v);
            }
            _ => r.unknown(&sub),
        }
    }
}

fn read_ipvs(r: &mut Reader, v: &Value, cfg: &mut Config) {
    let Some(m) = r.mapping("ipvs", v) else {
        return;
    };
    for (k, v) in m {
        let sub = format!("ipvs.{k}");
        match k.as_str() {
            "scheduler" => {
                if let Some(s) = r.str(&sub, v)
                    && let Some(s) = r.checked(check::ipvs_scheduler(&sub, &s))
                {
                    cfg.ipvs_scheduler = s;
                }
            }
            "strictARP" => {
                if let Some(b) = r.boolean(&sub, v) {
                    cfg.ipvs_strict_arp = b;
                }
            }
            "syncPeriod" => {
                if let Some(d) = r.duration(&sub, v, false).filter(|d| !d.is_zero())
                    && cfg.mode == ProxyMode::Ipvs
                {
                    cfg.sync_period = d;
                }
            }
            "minSyncPeriod" => {
                if let Some(d) = r.duration(&sub, v, false)
                    && cfg.mode == ProxyMode::Ipvs
                {
                    cfg.min_sync_period = d;
                }
            }
            "tcpTimeout" | "tcpFinTimeout" | "udpTimeout" => {
                if let Some(d) = r.duration(&sub, v, false) {
                    let i = match k.as_str() {
                        "tcpTimeout" => 0,
                        "tcpFinTimeout" => 1,
                        _ => 2,
                    };
                    cfg.ipvs_timeouts[i] = d;
                }
            }
            "excludeCIDRs" => {
                if let Some(list) = r.str_list(&sub, v) {
                    let items: Vec<&str> = list.iter().map(String::as_str).collect();
                    if let Some(c) = r.checked(check::cidr_list(&sub, &items)) {
                        cfg.ipvs_exclude_cidrs = c;
                    }
                }
            }
            _ => r.unknown(&sub),
        }
    }
}

fn read_conntrack(r: &mut Reader, path: &str, v: &Value, cfg: &mut Config) {
    let Some(m) = r.mapping(path, v) else {
        return;
    };
    for (k, v) in m {
        let sub = format!("{path}.{k}");
        let c = &mut cfg.conntrack;
        match k.as_str() {
            "maxPerCore" => {
                if let Some(n) = r.int(&sub, v)
                    && let Some(n) = r.checked(check::non_negative_u32(&sub, n))
                {
                    c.max_per_core = n;
                }
            }
            "min" => {
                if let Some(n) = r.int(&sub, v)
                    && let Some(n) = r.checked(check::non_negative_u32(&sub, n))
                {
                    c.min = n;
                }
            }
            "tcpEstablishedTimeout" => {
                if let Some(d) = r.duration(&sub, v, false) {
                    c.tcp_established_timeout = d;
                }
            }
            "tcpCloseWaitTimeout" => {
                if let Some(d) = r.duration(&sub, v, false) {
                    c.tcp_close_wait_timeout = d;
                }
            }
            "tcpBeLiberal" => {
                if let Some(b) = r.boolean(&sub, v) {
                    c.tcp_be_liberal = b;
                }
            }
            "udpTimeout" => {
                if let Some(d) = r.duration(&sub, v, false) {
                    c.udp_timeout = d;
                }
            }
            "udpStreamTimeout" => {
                if let Some(d) = r.duration(&sub, v, false) {
                    c.udp_stream_timeout = d;
                }
            }
            _ => r.unknown(&sub),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{DetectLocalMode, NodePortAddressesFlag, parse_args};

    const FULL: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: 10.244.0.0/16,fd44::/48
hostnameOverride: Node-A
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["10.77.0.0/24"]
detectLocalMode: BridgeInterface
detectLocal: {bridgeInterface: cbr0}
oomScoreAdj: -998
clientConnection: {kubeconfig: /etc/kube/config, qps: 5}
nftables: {masqueradeAll: true, masqueradeBit: 15, syncPeriod: 20s, minSyncPeriod: 2s}
iptables: {masqueradeAll: false}
ipvs: {scheduler: wlc, strictARP: true, tcpTimeout: 900s, excludeCIDRs: [10.0.0.0/8]}
conntrack:
  maxPerCore: 65536
  min: 262144
  tcpEstablishedTimeout: 12h
  tcpCloseWaitTimeout: 30m
  tcpBeLiberal: true
  udpTimeout: 45s
featureGates: {NFTablesNetlink: true}
enableProfiling: true
bogusField: 1
"#;

    #[test]
    fn reads_kube_proxy_fields() {
        let cfg = apply(FULL, Config::default()).unwrap();
        assert_eq!(cfg.cluster_cidrs.len(), 2);
        assert_eq!(cfg.hostname_override.as_deref(), Some("node-a"));
        assert!(
            matches!(cfg.nodeport_addresses, NodePortAddressesFlag::Cidrs(ref c) if c.len() == 1)
        );
        assert_eq!(
            cfg.detect_local_mode,
            Some(DetectLocalMode::BridgeInterface)
        );
        assert_eq!(cfg.pod_bridge_interface.as_deref(), Some("cbr0"));
        assert_eq!(cfg.oom_score_adj, Some(-998));
        assert_eq!(cfg.kubeconfig, Some(PathBuf::from("/etc/kube/config")));
        assert!(cfg.masquerade_all, "the nftables block wins over iptables");
        assert_eq!(cfg.masquerade_bit, 15);
        assert_eq!(cfg.sync_period, Duration::from_secs(20));
        assert_eq!(cfg.min_sync_period, Duration::from_secs(2));
        assert_eq!(cfg.ipvs_scheduler, "wlc");
        assert!(cfg.ipvs_strict_arp);
        assert_eq!(cfg.ipvs_timeouts[0], Duration::from_secs(900));
        assert_eq!(cfg.ipvs_exclude_cidrs, ["10.0.0.0/8".parse().unwrap()]);
        assert_eq!(cfg.conntrack.max_per_core, 65536);
        assert_eq!(cfg.conntrack.min, 262144);
        assert_eq!(
            cfg.conntrack.tcp_established_timeout,
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(
            cfg.conntrack.tcp_close_wait_timeout,
            Duration::from_secs(1800)
        );
        assert!(cfg.conntrack.tcp_be_liberal);
        assert_eq!(cfg.conntrack.udp_timeout, Duration::from_secs(45));
        assert_eq!(cfg.kube_api_qps, 5.0);
        assert_eq!(cfg.feature_gates.get("NFTablesNetlink"), Some(&true));
        // One warning per field with no effect or unknown, naming it.
        let w = cfg.warnings.join("\n");
        assert_eq!(cfg.warnings.len(), 2, "{w}");
        assert!(w.contains("enableProfiling: accepted, no effect"), "{w}");
        assert!(w.contains("bogusField: unknown field"), "{w}");
    }

    #[test]
    fn flags_override_the_file_and_bad_files_are_clear_errors() {
        let dir = std::env::temp_dir().join(format!("knp-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(&path, FULL).unwrap();
        let p = path.display().to_string();
        let cfg = parse_args(["--config", &p, "--min-sync-period", "5s"]).unwrap();
        assert_eq!(cfg.min_sync_period, Duration::from_secs(5));
        assert_eq!(cfg.sync_period, Duration::from_secs(20));
        assert_eq!(cfg.config_file, Some(path.clone()));

        std::fs::write(&path, "apiVersion: v1\nkind: ConfigMap\n").unwrap();
        let err = parse_args(["--config", &p]).unwrap_err().to_string();
        assert!(err.contains("KubeProxyConfiguration"), "{err}");
        std::fs::write(&path, "mode: [unclosed").unwrap();
        let err = parse_args(["--config", &p]).unwrap_err().to_string();
        assert!(err.contains("not valid YAML"), "{err}");
        let err = parse_args(["--config", "/nonexistent/x.yaml"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/x.yaml"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn values_kube_proxy_rejects_are_errors_naming_the_field() {
        let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        for (body, want) in [
            (
                "syncPeriod: thirty",
                r#"KubeProxyConfiguration.syncPeriod: Invalid value: "thirty": time: invalid duration "thirty""#,
            ),
            (
                "syncPeriod: 5",
                "KubeProxyConfiguration.syncPeriod: Invalid value: 5: expected a string",
            ),
            (
                "conntrack: {min: abc}",
                r#"KubeProxyConfiguration.conntrack.min: Invalid value: "abc": expected an integer"#,
            ),
            (
                "conntrack: {maxPerCore: -1}",
                "KubeProxyConfiguration.conntrack.maxPerCore: Invalid value: -1: must be greater than or equal to 0",
            ),
            (
                "conntrack: {tcpCloseWaitTimeout: -1s}",
                r#"KubeProxyConfiguration.conntrack.tcpCloseWaitTimeout: Invalid value: "-1s": must be greater than or equal to 0"#,
            ),
            (
                "nftables: {masqueradeBit: 32}",
                "KubeProxyConfiguration.nftables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]",
            ),
            (
                "iptables: {masqueradeBit: -1}",
                "KubeProxyConfiguration.iptables.masqueradeBit: Invalid value: -1: must be within the range [0, 31]",
            ),
            (
                "oomScoreAdj: 1001",
                "KubeProxyConfiguration.oomScoreAdj: Invalid value: 1001: must be within the range [-1000, 1000]",
            ),
            (
                "mode: iptables",
                r#"KubeProxyConfiguration.mode: Invalid value: "iptables": kube-nlproxy has no iptables mode: use "nftables", its netlink equivalent"#,
            ),
            (
                "mode: userspace",
                r#"KubeProxyConfiguration.mode: Invalid value: "userspace": must be nftables, ipvs or blank"#,
            ),
            (
                "detectLocalMode: Pods",
                r#"KubeProxyConfiguration.detectLocalMode: Unsupported value: "Pods": supported values: "ClusterCIDR""#,
            ),
            (
                "clusterCIDR: 10.0.0.0/33",
                r#"KubeProxyConfiguration.clusterCIDR[0]: Invalid value: "10.0.0.0/33": must be a valid CIDR block"#,
            ),
            (
                "nodePortAddresses: [bogus]",
                r#"KubeProxyConfiguration.nodePortAddresses[0]: Invalid value: "bogus": must be a valid CIDR or one of the keywords"#,
            ),
            (
                "healthzBindAddress: 1.2.3.4:0",
                r#"KubeProxyConfiguration.healthzBindAddress: Invalid value: "0": must be a valid port"#,
            ),
            (
                "metricsBindAddress: nowhere:80",
                r#"KubeProxyConfiguration.metricsBindAddress: Invalid value: "nowhere": must be a valid IP"#,
            ),
            (
                "bindAddress: 1.2.3",
                r#"KubeProxyConfiguration.bindAddress: Invalid value: "1.2.3": not a valid textual representation of an IP address"#,
            ),
            (
                "clientConnection: {burst: -1}",
                "KubeProxyConfiguration.clientConnection.burst: Invalid value: -1: must be greater than or equal to 0",
            ),
            (
                "ipvs: {scheduler: fast}",
                r#"KubeProxyConfiguration.ipvs.scheduler: Unsupported value: "fast""#,
            ),
            (
                "ipvs: {excludeCIDRs: [bogus]}",
                r#"KubeProxyConfiguration.ipvs.excludeCIDRs[0]: Invalid value: "bogus": must be a valid CIDR"#,
            ),
            (
                "logging: {format: xml}",
                r#"KubeProxyConfiguration.logging.format: Invalid value: "xml": Unsupported log format"#,
            ),
            (
                "showHiddenMetricsForVersion: \"1.20\"",
                r#"KubeProxyConfiguration.showHiddenMetricsForVersion: Invalid value: "1.20""#,
            ),
        ] {
            let err = apply(&format!("{head}{body}\n"), Config::default()).unwrap_err();
            assert!(err.starts_with(want), "{body}:\n got {err}\nwant {want}");
        }
        // Zero periods keep kube-proxy's defaults; a bare healthz IP gets its port.
        let cfg = apply(
            &format!("{head}nftables: {{syncPeriod: 0s, minSyncPeriod: 0s}}\nhealthzBindAddress: 10.0.0.1\nbindAddress: 10.0.0.2\n"),
            Config::default(),
        )
        .unwrap();
        assert_eq!(cfg.sync_period, Duration::from_secs(30));
        assert_eq!(cfg.min_sync_period, Duration::from_secs(1));
        assert_eq!(cfg.healthz_bind_address, "10.0.0.1:10256");
        assert_eq!(
            cfg.bind_address_node_ip(),
            Some("10.0.0.2".parse().unwrap())
        );
    }

    /// What `kube-proxy --write-config-to` (v1.37.2) writes, with `mode: nftables`.
    const UPSTREAM_DEFAULTS: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: ""
  qps: 5
clusterCIDR: ""
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpBeLiberal: false
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ClusterCIDR
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  localhostNodePorts: true
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 5s
  format: text
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: 127.0.0.1:10249
mode: nftables
nftables:
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: -999
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

    #[test]
    fn kube_proxys_own_defaults_load_without_a_warning() {
        let cfg = apply(UPSTREAM_DEFAULTS, Config::default()).unwrap();
        assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
        let mut want = Config {
            detect_local_mode: Some(DetectLocalMode::ClusterCidr),
            ..Config::default()
        };
        want.warnings.clear();
        assert_eq!(cfg, want);
    }

    #[test]
    fn logging_block_and_flags() {
        let dir = std::env::temp_dir().join(format!("knp-logging-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(
            &path,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n  format: json\n  verbosity: 3\n  vmodule: [{filePattern: daemon, verbosity: 5}]\n",
        )
        .unwrap();
        let p = path.display().to_string();
        let cfg = parse_args(["--config", &p]).unwrap();
        assert_eq!(cfg.log_format, crate::config::LogFormat::Json);
        assert_eq!(cfg.verbosity, 3);
        assert_eq!(cfg.vmodule, [("daemon".to_string(), 5)]);
        // Flags win: -v replaces, --vmodule's patterns come first.
        let cfg = parse_args(["--config", &p, "-v=1", "--vmodule=sync*=4"]).unwrap();
        assert_eq!(cfg.verbosity, 1);
        assert_eq!(
            cfg.vmodule,
            [("sync*".to_string(), 4), ("daemon".to_string(), 5)]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn several_documents_get_a_sentence() {
        let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        let err = apply(&format!("{head}---\n{head}"), Config::default()).unwrap_err();
        assert_eq!(
            err,
            "the file holds several YAML documents (separated by ---); kube-proxy reads one KubeProxyConfiguration"
        );
    }

    #[test]
    fn ignore_external_ips_field() {
        let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nignoreExternalIPs: true\n";
        let cfg = apply(text, Config::default()).unwrap();
        assert!(cfg.ignore_external_ips);
        assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
        assert!(!Config::default().ignore_external_ips);
    }

    #[test]
    fn later_fields_see_earlier_ones_in_file_order() {
        // `ipvs.syncPeriod` applies in ipvs mode; `mode` comes first in the text, and
        // sorts after `ipvs`: the order of the text must be kept.
        let cfg = apply(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nipvs: {syncPeriod: 7s}\n",
            Config::default(),
        )
        .unwrap();
        assert_eq!(cfg.mode, ProxyMode::Ipvs);
        assert_eq!(cfg.sync_period, Duration::from_secs(7));
        assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
    }

    #[test]
    fn hostile_files_are_bounded_errors() {
        let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        let mut bomb = format!("{head}featureGates:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for (prev, next) in ["a", "b", "c", "d", "e", "f"]
            .iter()
            .zip(["b", "c", "d", "e", "f", "g"])
        {
            bomb += &format!(
                "  {next}: &{next} [{}]\n",
                vec![format!("*{prev}"); 10].join(", ")
            );
        }
        let deep = format!("{head}featureGates: {}", "[".repeat(100_000));
        let many = format!("{head}featureGates: [{}]\n", "x, ".repeat(200_000));
        for text in [bomb, deep, many] {
            let err = apply(&text, Config::default()).unwrap_err();
            assert!(err.starts_with("not valid YAML: "), "{err}");
        }
        // A scalar or an empty file is not a configuration.
        for text in ["", "just text", "[1, 2]"] {
            let err = apply(text, Config::default()).unwrap_err();
            assert!(err.contains("KubeProxyConfiguration"), "{text:?}: {err}");
        }
    }
}
