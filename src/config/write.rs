//! `--write-config-to FILE`: the effective configuration as a
//! `KubeProxyConfiguration` YAML document, which `--config` reads back to the same
//! [`Config`] (flags of ours that have no field, such as `--source`, excepted).

use serde_json::{Map, Value, json};

use super::value::go_duration;
use super::{Config, DetectLocalMode, LogFormat, NodePortAddressesFlag, ProxyMode};

/// The effective configuration as a KubeProxyConfiguration object (JSON names).
pub fn to_object(cfg: &Config) -> Value {
    let d = |x| Value::String(go_duration(x));
    let c = &cfg.conntrack;
    let mode = match cfg.mode {
        ProxyMode::Nftables => "nftables",
        ProxyMode::Ipvs => "ipvs",
    };
    let detect = match cfg.detect_local_mode {
        None => "",
        Some(DetectLocalMode::ClusterCidr) => "ClusterCIDR",
        Some(DetectLocalMode::NodeCidr) => "NodeCIDR",
        Some(DetectLocalMode::BridgeInterface) => "BridgeInterface",
        Some(DetectLocalMode::InterfaceNamePrefix) => "InterfaceNamePrefix",
    };
    let npa: Vec<String> = match &cfg.nodeport_addresses {
        NodePortAddressesFlag::Primary => vec!["primary".into()],
        NodePortAddressesFlag::Cidrs(c) => c.iter().map(ToString::to_string).collect(),
    };
    let cidrs: Vec<String> = cfg.cluster_cidrs.iter().map(ToString::to_string).collect();
    let exclude: Vec<String> = cfg
        .ipvs_exclude_cidrs
        .iter()
        .map(ToString::to_string)
        .collect();
    let vmodule: Vec<Value> = cfg
        .vmodule
        .iter()
        .map(|(p, n)| json!({"filePattern": p, "verbosity": n}))
        .collect();
    let mut logging = Map::new();
    logging.insert(
        "format".into(),
        json!(match cfg.log_format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }),
    );
    logging.insert("verbosity".into(), json!(cfg.verbosity));
    if !vmodule.is_empty() {
        logging.insert("vmodule".into(), Value::Array(vmodule));
    }
    let mut obj = json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "bindAddress": cfg.bind_address.to_string(),
        "bindAddressHardFail": cfg.bind_address_hard_fail,
        "clientConnection": {
            "acceptContentTypes": cfg.kube_api_accept_content_types,
            "burst": cfg.kube_api_burst,
            "contentType": cfg.kube_api_content_type,
            "kubeconfig": cfg.kubeconfig.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            "qps": cfg.kube_api_qps,
        },
        "clusterCIDR": cidrs.join(","),
        "configSyncPeriod": d(cfg.config_sync_period),
        "conntrack": {
            "maxPerCore": c.max_per_core,
            "min": c.min,
            "tcpBeLiberal": c.tcp_be_liberal,
            "tcpCloseWaitTimeout": d(c.tcp_close_wait_timeout),
            "tcpEstablishedTimeout": d(c.tcp_established_timeout),
            "udpStreamTimeout": d(c.udp_stream_timeout),
            "udpTimeout": d(c.udp_timeout),
        },
        "detectLocal": {
            "bridgeInterface": cfg.pod_bridge_interface.clone().unwrap_or_default(),
            "interfaceNamePrefix": cfg.pod_interface_name_prefix.clone().unwrap_or_default(),
        },
        "detectLocalMode": detect,
        "enableProfiling": false,
        "healthzBindAddress": cfg.healthz_bind_address,
        "hostnameOverride": cfg.hostname_override.clone().unwrap_or_default(),
        "ignoreExternalIPs": cfg.ignore_external_ips,
        // The effective periods, in the block of each mode.
        "ipvs": {
            "excludeCIDRs": exclude,
            "minSyncPeriod": d(cfg.min_sync_period),
            "scheduler": cfg.ipvs_scheduler,
            "strictARP": cfg.ipvs_strict_arp,
            "syncPeriod": d(cfg.sync_period),
            "tcpFinTimeout": d(cfg.ipvs_timeouts[1]),
            "tcpTimeout": d(cfg.ipvs_timeouts[0]),
            "udpTimeout": d(cfg.ipvs_timeouts[2]),
        },
        "keepKubeProxyState": cfg.keep_kube_proxy_state,
        "logging": Value::Object(logging),
        "metricsBindAddress": cfg.metrics_bind_address,
        "mode": mode,
        "nftables": {
            "masqueradeAll": cfg.masquerade_all,
            "masqueradeBit": cfg.masquerade_bit,
            "minSyncPeriod": d(cfg.min_sync_period),
            "syncPeriod": d(cfg.sync_period),
        },
        "nodePortAddresses": npa,
        "showHiddenMetricsForVersion": "",
    });
    if let Some(adj) = cfg.oom_score_adj {
        obj["oomScoreAdj"] = json!(adj);
    }
    if !cfg.feature_gates.is_empty() {
        obj["featureGates"] = json!(cfg.feature_gates);
    }
    obj
}

/// The effective configuration as YAML text.
pub fn to_yaml(cfg: &Config) -> String {
    let obj = to_object(cfg);
    let mut out = String::new();
    // apiVersion and kind first, as upstream writes them.
    if let Value::Object(m) = &obj {
        for key in ["apiVersion", "kind"] {
            out.push_str(&format!("{key}: {}\n", scalar(&m[key])));
        }
        let rest: Map<String, Value> = m
            .iter()
            .filter(|(k, _)| *k != "apiVersion" && *k != "kind")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        emit_map(&rest, 0, &mut out);
    }
    out
}

fn emit_map(m: &Map<String, Value>, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    for (k, v) in m {
        match v {
            Value::Object(inner) if !inner.is_empty() => {
                out.push_str(&format!("{pad}{k}:\n"));
                emit_map(inner, indent + 2, out);
            }
            Value::Object(_) => out.push_str(&format!("{pad}{k}: {{}}\n")),
            Value::Array(items) if !items.is_empty() => {
                out.push_str(&format!("{pad}{k}:\n"));
                for item in items {
                    match item {
                        Value::Object(inner) => {
                            let mut first = true;
                            for (ik, iv) in inner {
                                let lead = if first { "- " } else { "  " };
                                first = false;
                                out.push_str(&format!("{pad}{lead}{ik}: {}\n", scalar(iv)));
                            }
                        }
                        other => out.push_str(&format!("{pad}- {}\n", scalar(other))),
                    }
                }
            }
            Value::Array(_) => out.push_str(&format!("{pad}{k}: []\n")),
            other => out.push_str(&format!("{pad}{k}: {}\n", scalar(other))),
        }
    }
}

/// A scalar: plain where YAML reads it back as the same string, else quoted.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let plain = !s.is_empty()
                && s.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '/')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/._:-,µ".contains(c))
                && !s.contains(": ")
                && s.parse::<f64>().is_err()
                && !matches!(
                    s.to_ascii_lowercase().as_str(),
                    "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n" | "~"
                );
            if plain { s.clone() } else { v.to_string() }
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file;

    #[test]
    fn the_written_file_reads_back_the_same() {
        let mut cfg = crate::config::parse_args([
            "--proxy-mode=ipvs",
            "--cluster-cidr=10.244.0.0/16,fd44::/48",
            "--ipvs-sync-period=7s",
            "--ipvs-min-sync-period=0s",
            "--nodeport-addresses=10.0.0.0/8",
            "--feature-gates=KubeProxyIPVS=true",
            "--vmodule=daemon=4",
            "--conntrack-udp-timeout=45s",
            "--hostname-override=Node-A",
            "--bind-address=10.1.2.3",
            "--kube-api-qps=7.5",
            "--oom-score-adj=-500",
        ])
        .unwrap();
        cfg.warnings.clear();
        let text = to_yaml(&cfg);
        let mut back = file::read(&text, crate::config::Config::default()).unwrap();
        assert!(back.warnings.is_empty(), "{:?}\n{text}", back.warnings);
        // The ipvs flags' periods were folded into the effective ones.
        back.ipvs_sync_periods = cfg.ipvs_sync_periods;
        // Which flags were typed is the command line's, not the file's.
        back.local_traffic_given = cfg.local_traffic_given;
        assert_eq!(back, cfg, "{text}");
        assert!(
            text.starts_with(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
            ),
            "{text}"
        );
    }
}
