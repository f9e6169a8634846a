//! `--config FILE`: a `KubeProxyConfiguration` (`kubeproxy.config.k8s.io/v1alpha1`)
//! as kube-proxy's documentation describes it. Known fields fill the [`Config`];
//! fields we do not support, or do not know, give one warning each and are ignored.

use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{Config, DetectLocalMode, NodePortAddressesFlag, ProxyMode, parse_duration};

const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
const KIND: &str = "KubeProxyConfiguration";

/// Fields kube-proxy has that make no sense here; accepted with a warning.
const IGNORED: &[&str] = &[
    "bindAddressHardFail",
    "enableProfiling",
    "showHiddenMetricsForVersion",
    "featureGates",
    "portRange",
    "configSyncPeriod",
    "winkernel",
    "windowsRunAsService",
    "logging",
    "udpIdleTimeout",
];

struct Reader<'a> {
    warnings: &'a mut Vec<String>,
}

impl Reader<'_> {
    fn str(&mut self, path: &str, v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => {
                self.warnings
                    .push(format!("{path}: expected a string, got {other:?}; ignored"));
                None
            }
        }
    }

    /// A list of strings (`[a, b]`); a non-string item is a warning.
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
                self.warnings
                    .push(format!("{path}: expected a list, got {other:?}; ignored"));
                None
            }
        }
    }

    fn boolean(&mut self, path: &str, v: &Value) -> Option<bool> {
        match v {
            Value::Bool(b) => Some(*b),
            Value::Null => None,
            other => {
                self.warnings.push(format!(
                    "{path}: expected true or false, got {other:?}; ignored"
                ));
                None
            }
        }
    }

    fn int(&mut self, path: &str, v: &Value) -> Option<i64> {
        match v {
            Value::Number(n) if n.as_i64().is_some() => n.as_i64(),
            Value::Null => None,
            other => {
                self.warnings.push(format!(
                    "{path}: expected an integer, got {other:?}; ignored"
                ));
                None
            }
        }
    }

    fn duration(&mut self, path: &str, v: &Value) -> Option<std::time::Duration> {
        let s = self.str(path, v)?;
        match parse_duration(&s) {
            Ok(d) => Some(d),
            Err(e) => {
                self.warnings.push(format!("{path}: {e}; ignored"));
                None
            }
        }
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
                self.warnings.push(format!(
                    "{path}: expected a mapping, got {other:?}; ignored"
                ));
                None
            }
        }
    }
}

fn key(k: &str) -> String {
    k.to_owned()
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

/// Applies the configuration in `text` on top of `cfg`.
pub fn apply(text: &str, mut cfg: Config) -> Result<Config, String> {
    let doc: Option<TopLevel> = serde_saphyr::from_str_with_options(text, yaml_options())
        .map_err(|e| format!("not valid YAML: {e}"))?;
    let Some(top) = doc else {
        return Err("expected a KubeProxyConfiguration mapping".into());
    };
    let api_version = top.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = top.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != KIND || api_version != API_VERSION {
        return Err(format!(
            "expected apiVersion {API_VERSION} kind {KIND}, got {api_version:?} {kind:?}"
        ));
    }
    let mut warnings = Vec::new();
    let mut r = Reader {
        warnings: &mut warnings,
    };
    for (k, v) in &top.0 {
        let name = key(k);
        match name.as_str() {
            "apiVersion" | "kind" => {}
            "bindAddress" => {}
            "healthzBindAddress" => {
                if let Some(s) = r.str(&name, v).filter(|s| !s.is_empty()) {
                    cfg.healthz_bind_address = s;
                }
            }
            "metricsBindAddress" => {
                if let Some(s) = r.str(&name, v).filter(|s| !s.is_empty()) {
                    cfg.metrics_bind_address = s;
                }
            }
            "clusterCIDR" => {
                if let Some(s) = r.str(&name, v) {
                    let mut cidrs = Vec::new();
                    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                        match part.parse() {
                            Ok(c) => cidrs.push(c),
                            Err(e) => r
                                .warnings
                                .push(format!("clusterCIDR: {part:?}: {e}; ignored")),
                        }
                    }
                    cfg.cluster_cidrs = cidrs;
                }
            }
            "hostnameOverride" => {
                if let Some(s) = r.str(&name, v).filter(|s| !s.trim().is_empty()) {
                    cfg.hostname_override = Some(s.trim().to_lowercase());
                }
            }
            "mode" => match r.str(&name, v).as_deref() {
                None | Some("") | Some("nftables") => cfg.mode = ProxyMode::Nftables,
                Some("ipvs") => cfg.mode = ProxyMode::Ipvs,
                Some(other) => r.warnings.push(format!(
                    "mode: {other:?} is not supported (nftables or ipvs); using {:?}",
                    cfg.mode
                )),
            },
            "detectLocalMode" => match r.str(&name, v).as_deref() {
                None | Some("") => {}
                Some("ClusterCIDR") => cfg.detect_local_mode = Some(DetectLocalMode::ClusterCidr),
                Some("NodeCIDR") => cfg.detect_local_mode = Some(DetectLocalMode::NodeCidr),
                Some("BridgeInterface") => {
                    cfg.detect_local_mode = Some(DetectLocalMode::BridgeInterface)
                }
                Some("InterfaceNamePrefix") => {
                    cfg.detect_local_mode = Some(DetectLocalMode::InterfaceNamePrefix)
                }
                Some(other) => r
                    .warnings
                    .push(format!("detectLocalMode: unknown mode {other:?}; ignored")),
            },
            "detectLocal" => {
                if let Some(m) = r.mapping(&name, v) {
                    for (k, v) in m {
                        let sub = format!("detectLocal.{}", key(k));
                        match key(k).as_str() {
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
            "nodePortAddresses" => match v {
                Value::Array(items) => {
                    let mut cidrs = Vec::new();
                    let mut primary = false;
                    for (i, item) in items.iter().enumerate() {
                        let path = format!("nodePortAddresses[{i}]");
                        match r.str(&path, item).as_deref() {
                            Some("primary") => primary = true,
                            Some(s) => match s.trim().parse() {
                                Ok(c) => cidrs.push(c),
                                Err(e) => r.warnings.push(format!("{path}: {s:?}: {e}; ignored")),
                            },
                            None => {}
                        }
                    }
                    cfg.nodeport_addresses = if primary || cidrs.is_empty() {
                        NodePortAddressesFlag::Primary
                    } else {
                        NodePortAddressesFlag::Cidrs(cidrs)
                    };
                }
                Value::Null => {}
                other => r.warnings.push(format!(
                    "nodePortAddresses: expected a list, got {other:?}; ignored"
                )),
            },
            // Ours (kube-proxy has no such field): see `--ignore-external-ips`.
            "ignoreExternalIPs" => {
                if let Some(b) = r.boolean(&name, v) {
                    cfg.ignore_external_ips = b;
                }
            }
            // Ours: see `--keep-kube-proxy-state`.
            "keepKubeProxyState" => {
                if let Some(b) = r.boolean(&name, v) {
                    cfg.keep_kube_proxy_state = b;
                }
            }
            "oomScoreAdj" => {
                if let Some(n) = r.int(&name, v) {
                    cfg.oom_score_adj = i32::try_from(n).ok();
                }
            }
            "syncPeriod" => {
                if let Some(d) = r.duration(&name, v).filter(|d| !d.is_zero()) {
                    cfg.sync_period = d;
                }
            }
            "minSyncPeriod" => {
                if let Some(d) = r.duration(&name, v) {
                    cfg.min_sync_period = d;
                }
            }
            "clientConnection" => {
                if let Some(m) = r.mapping(&name, v) {
                    for (k, v) in m {
                        let sub = format!("clientConnection.{}", key(k));
                        match key(k).as_str() {
                            "kubeconfig" => {
                                if let Some(s) = r.str(&sub, v).filter(|s| !s.is_empty()) {
                                    cfg.kubeconfig = Some(PathBuf::from(s));
                                }
                            }
                            "acceptContentTypes" | "contentType" | "qps" | "burst" => {
                                r.warnings.push(format!("{sub}: not supported; ignored"))
                            }
                            _ => r.unknown(&sub),
                        }
                    }
                }
            }
            "iptables" | "nftables" | "linux" => {
                if let Some(m) = r.mapping(&name, v) {
                    // The nftables block applies in nftables mode; the iptables one
                    // is read too since many existing files only have it.
                    let applies = name != "iptables" || !top.contains_key("nftables");
                    for (k, v) in m {
                        let sub = format!("{name}.{}", key(k));
                        match key(k).as_str() {
                            "masqueradeAll" => {
                                if let Some(b) = r.boolean(&sub, v)
                                    && applies
                                {
                                    cfg.masquerade_all = b;
                                }
                            }
                            "masqueradeBit" => {
                                if let Some(n) = r.int(&sub, v) {
                                    match u8::try_from(n) {
                                        Ok(bit) if bit <= 31 && applies => cfg.masquerade_bit = bit,
                                        Ok(_) if !applies => {}
                                        _ => r.warnings.push(format!("{sub}: {n} not in 0..31; ignored")),
                                    }
                                }
                            }
                            "syncPeriod" => {
                                if let Some(d) = r.duration(&sub, v).filter(|d| !d.is_zero())
                                    && applies
                                {
                                    cfg.sync_period = d;
                                }
                            }
                            "minSyncPeriod" => {
                                if let Some(d) = r.duration(&sub, v)
                                    && applies
                                {
                                    cfg.min_sync_period = d;
                                }
                            }
                            "oomScoreAdj" if name == "linux" => {
                                if let Some(n) = r.int(&sub, v) {
                                    cfg.oom_score_adj = i32::try_from(n).ok();
                                }
                            }
                            "conntrack" if name == "linux" => {
                                read_conntrack(&mut r, &sub, v, &mut cfg);
                            }
                            "localhostNodePorts" => r.warnings.push(format!(
                                "{sub}: not supported (NodePorts are never served on loopback, as in nftables mode); ignored"
                            )),
                            _ => r.unknown(&sub),
                        }
                    }
                }
            }
            "ipvs" => {
                if let Some(m) = r.mapping(&name, v) {
                    for (k, v) in m {
                        let sub = format!("ipvs.{}", key(k));
                        match key(k).as_str() {
                            "scheduler" => {
                                if let Some(s) = r.str(&sub, v).filter(|s| !s.is_empty()) {
                                    cfg.ipvs_scheduler = s;
                                }
                            }
                            "strictARP" => {
                                if let Some(b) = r.boolean(&sub, v) {
                                    cfg.ipvs_strict_arp = b;
                                }
                            }
                            "syncPeriod" | "minSyncPeriod" => {
                                if let Some(d) = r.duration(&sub, v)
                                    && cfg.mode == ProxyMode::Ipvs
                                {
                                    if key(k) == "syncPeriod" {
                                        cfg.sync_period = d;
                                    } else {
                                        cfg.min_sync_period = d;
                                    }
                                }
                            }
                            "tcpTimeout" | "tcpFinTimeout" | "udpTimeout" => {
                                if let Some(d) = r.duration(&sub, v) {
                                    let i = match key(k).as_str() {
                                        "tcpTimeout" => 0,
                                        "tcpFinTimeout" => 1,
                                        _ => 2,
                                    };
                                    cfg.ipvs_timeouts[i] = d;
                                }
                            }
                            "excludeCIDRs" => {
                                if let Some(list) = r.str_list(&sub, v) {
                                    let mut cidrs = Vec::new();
                                    for c in list {
                                        match c.parse() {
                                            Ok(n) => cidrs.push(n),
                                            Err(e) => r.warnings.push(format!(
                                                "{sub}: {c:?} is not a CIDR ({e}); ignored"
                                            )),
                                        }
                                    }
                                    cfg.ipvs_exclude_cidrs = cidrs;
                                }
                            }
                            _ => r.unknown(&sub),
                        }
                    }
                }
            }
            "conntrack" => read_conntrack(&mut r, &name, v, &mut cfg),
            other if IGNORED.contains(&other) => r
                .warnings
                .push(format!("{other}: not supported by kube-nlproxy; ignored")),
            other => r.unknown(other),
        }
    }
    cfg.warnings = warnings;
    Ok(cfg)
}

fn read_conntrack(r: &mut Reader<'_>, path: &str, v: &Value, cfg: &mut Config) {
    let Some(m) = r.mapping(path, v) else {
        return;
    };
    for (k, v) in m {
        let sub = format!("{path}.{}", key(k));
        let c = &mut cfg.conntrack;
        match key(k).as_str() {
            "maxPerCore" => {
                if let Some(n) = r.int(&sub, v) {
                    c.max_per_core = u32::try_from(n).unwrap_or(0);
                }
            }
            "min" => {
                if let Some(n) = r.int(&sub, v) {
                    c.min = u32::try_from(n).unwrap_or(0);
                }
            }
            "tcpEstablishedTimeout" => {
                if let Some(d) = r.duration(&sub, v) {
                    c.tcp_established_timeout = d;
                }
            }
            "tcpCloseWaitTimeout" => {
                if let Some(d) = r.duration(&sub, v) {
                    c.tcp_close_wait_timeout = d;
                }
            }
            "tcpBeLiberal" => {
                if let Some(b) = r.boolean(&sub, v) {
                    c.tcp_be_liberal = b;
                }
            }
            "udpTimeout" => {
                if let Some(d) = r.duration(&sub, v) {
                    c.udp_timeout = d;
                }
            }
            "udpStreamTimeout" => {
                if let Some(d) = r.duration(&sub, v) {
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
    use crate::config::parse_args;

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
ipvs: {scheduler: wlc, strictARP: true, tcpTimeout: 900s, excludeCIDRs: [10.0.0.0/8, bogus]}
conntrack:
  maxPerCore: 65536
  min: 262144
  tcpEstablishedTimeout: 12h
  tcpCloseWaitTimeout: 30m
  tcpBeLiberal: true
  udpTimeout: 45s
featureGates: {Foo: true}
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
        // One warning per unsupported or unknown field, naming it.
        let w = cfg.warnings.join("\n");
        assert_eq!(cfg.warnings.len(), 4, "{w}");
        assert!(w.contains("clientConnection.qps"), "{w}");
        assert!(w.contains("ipvs.excludeCIDRs: \"bogus\""), "{w}");
        assert!(w.contains("featureGates"), "{w}");
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
    fn wrong_types_warn_and_keep_defaults() {
        let cfg = apply(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nsyncPeriod: 5\nconntrack: {min: abc}\n",
            Config::default(),
        )
        .unwrap();
        assert_eq!(cfg.sync_period, Duration::from_secs(30));
        assert_eq!(cfg.warnings.len(), 2, "{:?}", cfg.warnings);
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
        for text in [bomb, deep, many, format!("{head}---\n{head}")] {
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
