//! kube-proxy's checks (`pkg/proxy/apis/config/validation/validation.go` of
//! v1.37, and the flag parsers in front of it), written for our [`Config`]. Each
//! value check returns the parsed value or the [`FieldError`] upstream would give;
//! [`validate`] does the checks that look at several fields.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::features::{self, Verdict};
use super::value::{FieldError, go_duration, go_quote};
use super::{Config, DetectLocalMode, NodePortAddressesFlag, ProxyMode};

/// `mode`: nftables (default), ipvs; iptables names its netlink equivalent.
pub fn proxy_mode(path: &str, v: &str) -> Result<ProxyMode, FieldError> {
    match v {
        "" | "nftables" => Ok(ProxyMode::Nftables),
        "ipvs" => Ok(ProxyMode::Ipvs),
        "iptables" => Err(FieldError::invalid(
            path,
            go_quote(v),
            "kube-nlproxy has no iptables mode: use \"nftables\", its netlink equivalent (or \"ipvs\")",
        )),
        _ => Err(FieldError::invalid(
            path,
            go_quote(v),
            "must be nftables, ipvs or blank (blank means nftables)",
        )),
    }
}

/// An IP address (`netutils.ParseIPSloppy`: IPv4 parts may have leading zeros).
pub fn ip(path: &str, v: &str) -> Result<IpAddr, FieldError> {
    parse_ip_sloppy(v).ok_or_else(|| {
        FieldError::invalid(
            path,
            go_quote(v),
            "not a valid textual representation of an IP address",
        )
    })
}

fn parse_ip_sloppy(v: &str) -> Option<IpAddr> {
    if let Ok(ip) = v.parse() {
        return Some(ip);
    }
    // Leading zeros, as Go's net.ParseIP accepted before 1.17 and ParseIPSloppy does.
    let parts: Vec<&str> = v.split('.').collect();
    if parts.len() == 4
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()))
    {
        let mut octets = [0u8; 4];
        for (o, p) in octets.iter_mut().zip(&parts) {
            *o = p.parse().ok()?;
        }
        return Some(IpAddr::from(octets));
    }
    None
}

fn parse_cidr(v: &str) -> Option<IpNet> {
    v.parse().ok().or_else(|| {
        let (addr, len) = v.split_once('/')?;
        let ip = parse_ip_sloppy(addr)?;
        IpNet::new(ip, len.parse().ok()?).ok()
    })
}

/// `clusterCIDR` / `--cluster-cidr`: one CIDR or a dual-stack pair.
pub fn cluster_cidrs(path: &str, v: &str) -> Result<Vec<IpNet>, FieldError> {
    let parts: Vec<&str> = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        match parse_cidr(p) {
            Some(n) => out.push(n),
            None => {
                return Err(FieldError::invalid(
                    &format!("{path}[{i}]"),
                    go_quote(p),
                    "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
                ));
            }
        }
    }
    Ok(out)
}

/// `detectLocalMode`.
pub fn detect_local_mode(path: &str, v: &str) -> Result<Option<DetectLocalMode>, FieldError> {
    Ok(Some(match v {
        "" => return Ok(None),
        "ClusterCIDR" => DetectLocalMode::ClusterCidr,
        "NodeCIDR" => DetectLocalMode::NodeCidr,
        "BridgeInterface" => DetectLocalMode::BridgeInterface,
        "InterfaceNamePrefix" => DetectLocalMode::InterfaceNamePrefix,
        _ => {
            return Err(FieldError::unsupported(
                path,
                v,
                &[
                    "ClusterCIDR",
                    "NodeCIDR",
                    "BridgeInterface",
                    "InterfaceNamePrefix",
                    "",
                ],
            ));
        }
    }))
}

/// `nodePortAddresses`: CIDRs and the keywords `primary`, `localhost`, `all`, each
/// keyword at most once. Returns what we serve, and a warning where we differ.
pub fn nodeport_addresses(
    path: &str,
    items: &[String],
) -> Result<(NodePortAddressesFlag, Option<String>), FieldError> {
    let mut seen = Vec::new();
    let mut cidrs = Vec::new();
    let mut primary = false;
    let mut warning = None;
    for (i, item) in items.iter().enumerate() {
        let item = item.as_str();
        if matches!(item, "primary" | "localhost" | "all") {
            if seen.contains(&item) {
                return Err(FieldError::duplicate(&format!("{path}[{i}]"), item));
            }
            seen.push(item);
            match item {
                "primary" => primary = true,
                "all" => cidrs.extend(["0.0.0.0/0", "::/0"].map(|c| c.parse::<IpNet>().unwrap())),
                _ => {
                    warning = Some(format!(
                        "{path}: {item:?} ignored: kube-nlproxy never serves NodePorts on loopback addresses"
                    ))
                }
            }
            continue;
        }
        match parse_cidr(item) {
            Some(n) => cidrs.push(n),
            None => {
                return Err(FieldError::invalid(
                    &format!("{path}[{i}]"),
                    go_quote(item),
                    "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'",
                ));
            }
        }
    }
    if primary && !cidrs.is_empty() {
        warning = Some(format!(
            "{path}: \"primary\" with CIDRs: kube-nlproxy serves NodePorts on the primary IPs only"
        ));
    }
    let npa = if primary || cidrs.is_empty() {
        NodePortAddressesFlag::Primary
    } else {
        NodePortAddressesFlag::Cidrs(cidrs)
    };
    Ok((npa, warning))
}

/// `clientConnection.contentType`: kube-nlproxy speaks JSON to the API server
/// whatever is asked (kube-rs reads no protobuf). kube-proxy's default,
/// protobuf, is taken as JSON without a word (it is in every configuration
/// kube-proxy writes; docs/differences-from-kube-proxy.md says so); any other
/// value gets a warning. Upstream checks no value.
pub fn content_type_warning(path: &str, v: &str) -> Option<String> {
    let json_or_default = [
        "",
        "application/json",
        "application/vnd.kubernetes.protobuf",
    ];
    (!json_or_default.contains(&v)).then(|| {
        format!(
            "{path} {v:?}: kube-nlproxy requests application/json \
             (its Kubernetes client reads no protobuf)"
        )
    })
}

/// `clientConnection.burst`: not negative.
pub fn burst(path: &str, n: i64) -> Result<i32, FieldError> {
    if n < 0 {
        return Err(FieldError::invalid(
            path,
            n.to_string(),
            "must be greater than or equal to 0",
        ));
    }
    i32::try_from(n).map_err(|_| FieldError::invalid(path, n.to_string(), "out of range"))
}

/// `healthzBindAddress`, `metricsBindAddress`: `IP:port` (`validateHostPort`).
pub fn host_port(path: &str, v: &str) -> Result<(), FieldError> {
    let split = if let Some(rest) = v.strip_prefix('[') {
        rest.split_once("]:")
    } else {
        v.rsplit_once(':').filter(|(h, _)| !h.contains(':'))
    };
    let Some((host, port)) = split else {
        return Err(FieldError::invalid(path, go_quote(v), "must be IP:port"));
    };
    if parse_ip_sloppy(host).is_none() {
        return Err(FieldError::invalid(
            path,
            go_quote(host),
            "must be a valid IP",
        ));
    }
    match port.parse::<i64>() {
        Ok(1..=65535) => Ok(()),
        _ => Err(FieldError::invalid(
            path,
            go_quote(port),
            "must be a valid port",
        )),
    }
}

/// `showHiddenMetricsForVersion`: empty, or the previous minor version (1.36).
pub fn show_hidden_metrics(path: &str, v: &str) -> Result<(), FieldError> {
    if v.is_empty() || v == "1.36" {
        return Ok(());
    }
    Err(FieldError::invalid(
        path,
        go_quote(v),
        "--show-hidden-metrics-for-version must be omitted or have the value '1.36'. Only the previous minor version is allowed",
    ))
}

/// `logging.verbosity` / `-v`: a level from 0.
pub fn verbosity(path: &str, v: &str) -> Result<u8, FieldError> {
    let n: u32 = v.trim().parse().map_err(|_| {
        FieldError::invalid(path, go_quote(v), "must be a verbosity level: 0 or more")
    })?;
    Ok(u8::try_from(n).unwrap_or(u8::MAX))
}

/// `--vmodule pattern=N,...`.
pub fn vmodule(path: &str, v: &str) -> Result<Vec<(String, u8)>, FieldError> {
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let parsed = part
            .split_once('=')
            .filter(|(p, _)| !p.is_empty())
            .and_then(|(p, n)| Some((p.to_string(), n.trim().parse::<u32>().ok()?)));
        match parsed {
            Some((p, n)) => out.push((p, u8::try_from(n).unwrap_or(u8::MAX))),
            None => {
                return Err(FieldError::invalid(
                    path,
                    go_quote(v),
                    format!("{} does not have the pattern=N format", go_quote(part)),
                ));
            }
        }
    }
    Ok(out)
}

/// `logging.format`.
pub fn log_format(path: &str, v: &str) -> Result<super::LogFormat, FieldError> {
    match v {
        "" | "text" => Ok(super::LogFormat::Text),
        "json" => Ok(super::LogFormat::Json),
        _ => Err(FieldError::invalid(
            path,
            go_quote(v),
            "Unsupported log format",
        )),
    }
}

/// `masqueradeBit`: 0..31.
pub fn masquerade_bit(path: &str, n: i64) -> Result<u8, FieldError> {
    match u8::try_from(n) {
        Ok(b) if b <= 31 => Ok(b),
        _ => Err(FieldError::invalid(
            path,
            n.to_string(),
            "must be within the range [0, 31]",
        )),
    }
}

/// The IPVS schedulers (`ipvs.scheduler`; empty is rr).
pub fn ipvs_scheduler(path: &str, v: &str) -> Result<String, FieldError> {
    const ALL: &[&str] = &[
        "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh",
    ];
    match v {
        "" => Ok("rr".into()),
        s if ALL.contains(&s) => Ok(s.to_string()),
        _ => Err(FieldError::unsupported(path, v, ALL)),
    }
}

/// `ipvs.excludeCIDRs`: each a CIDR.
pub fn cidr_list(path: &str, items: &[&str]) -> Result<Vec<IpNet>, FieldError> {
    items
        .iter()
        .enumerate()
        .map(|(i, c)| {
            parse_cidr(c).ok_or_else(|| {
                FieldError::invalid(&format!("{path}[{i}]"), go_quote(c), "must be a valid CIDR")
            })
        })
        .collect()
}

/// `conntrack.maxPerCore`, `conntrack.min`: not negative.
pub fn non_negative_u32(path: &str, n: i64) -> Result<u32, FieldError> {
    if n < 0 {
        return Err(FieldError::invalid(
            path,
            n.to_string(),
            "must be greater than or equal to 0",
        ));
    }
    i32::try_from(n)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| FieldError::invalid(path, n.to_string(), "out of range for an int32"))
}

/// `oomScoreAdj`: -1000..1000.
pub fn oom_score_adj(path: &str, n: i64) -> Result<i32, FieldError> {
    match i32::try_from(n) {
        Ok(a) if (-1000..=1000).contains(&a) => Ok(a),
        _ => Err(FieldError::invalid(
            path,
            n.to_string(),
            "must be within the range [-1000, 1000]",
        )),
    }
}

/// A resource quantity (`0`, `64Ki`, `1M`).
pub fn quantity(path: &str, v: &str) -> Result<(), FieldError> {
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &v[digits.len()..];
    let ok = !digits.is_empty()
        && digits.parse::<f64>().is_ok()
        && matches!(
            suffix,
            "" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
        );
    if ok {
        Ok(())
    } else {
        Err(FieldError::invalid(
            path,
            go_quote(v),
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ))
    }
}

/// The checks across fields, on the configuration flags and file made together.
/// Feature-gate warnings go to `cfg.warnings`. Errors name the flag that set the
/// field, from `origins` (field path -> flag).
pub fn validate(cfg: &mut Config, origins: &BTreeMap<&'static str, String>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if cfg.sync_period.is_zero() {
        errors.push(FieldError::invalid(
            "syncPeriod",
            go_quote("0s"),
            "must be greater than 0",
        ));
    }
    if cfg.min_sync_period > cfg.sync_period {
        errors.push(FieldError::invalid(
            "syncPeriod",
            go_quote(&go_duration(cfg.min_sync_period)),
            "must be greater than or equal to KubeProxyConfiguration.minSyncPeriod",
        ));
    }
    for (name, on) in &cfg.feature_gates {
        match features::check(name, *on) {
            Verdict::Accepted => {}
            Verdict::Warn(w) => cfg.warnings.push(format!("featureGates: {w}")),
            Verdict::Refused(why) => errors.push(FieldError::invalid(
                "featureGates",
                format!("map[{name}:{on}]"),
                why,
            )),
        }
    }
    if cfg.log_format == super::LogFormat::Json
        && !features::enabled(&cfg.feature_gates, "LoggingBetaOptions")
    {
        errors.push(FieldError::forbidden(
            "logging.format",
            "Feature LoggingBetaOptions is disabled: the json format needs it",
        ));
    }
    if cfg.mode == ProxyMode::Ipvs && !features::enabled(&cfg.feature_gates, "KubeProxyIPVS") {
        errors.push(FieldError::invalid(
            "mode",
            go_quote("ipvs"),
            "the ipvs mode needs the KubeProxyIPVS feature gate (as in kube-proxy)",
        ));
    }
    match cfg.detect_local_mode {
        Some(DetectLocalMode::BridgeInterface)
            if cfg.pod_bridge_interface.as_deref().unwrap_or("").is_empty() =>
        {
            errors.push(FieldError::invalid(
                "detectLocal.bridgeInterface",
                go_quote(""),
                "must not be empty",
            ))
        }
        Some(DetectLocalMode::InterfaceNamePrefix)
            if cfg
                .pod_interface_name_prefix
                .as_deref()
                .unwrap_or("")
                .is_empty() =>
        {
            errors.push(FieldError::invalid(
                "detectLocal.interfaceNamePrefix",
                go_quote(""),
                "must not be empty",
            ))
        }
        Some(DetectLocalMode::ClusterCidr) => {
            let c = &cfg.cluster_cidrs;
            let shown = format!(
                "[{}]",
                c.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            let dual = "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]";
            if c.len() > 2 || (c.len() == 2 && c[0].addr().is_ipv4() == c[1].addr().is_ipv4()) {
                errors.push(FieldError::invalid("clusterCIDR", shown, dual));
            }
        }
        _ => {}
    }
    for e in &mut errors {
        if e.flag.is_none()
            && let Some(flag) = e
                .path
                .strip_prefix("KubeProxyConfiguration.")
                .and_then(|p| origins.get(p))
        {
            e.flag = Some(flag.clone());
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_other_than_json_or_the_default_warn() {
        let path = "clientConnection.contentType";
        assert_eq!(content_type_warning(path, "application/json"), None);
        assert_eq!(
            content_type_warning(path, "application/vnd.kubernetes.protobuf"),
            None
        );
        let w = content_type_warning(path, "application/yaml").unwrap();
        assert!(
            w.contains("application/yaml") && w.contains("application/json"),
            "{w}"
        );
    }

    #[test]
    fn host_ports_as_upstream() {
        assert!(host_port("h", "0.0.0.0:10256").is_ok());
        assert!(host_port("h", "[::]:10256").is_ok());
        assert!(host_port("h", "127.000.0.1:1").is_ok());
        for (v, msg) in [
            ("10256", "must be IP:port"),
            ("::1:80", "must be IP:port"),
            ("host:80", "must be a valid IP"),
            ("1.2.3.4:0", "must be a valid port"),
            ("1.2.3.4:70000", "must be a valid port"),
            ("1.2.3.4:x", "must be a valid port"),
        ] {
            let e = host_port("healthzBindAddress", v).unwrap_err().to_string();
            assert!(e.contains(msg), "{v}: {e}");
            assert!(
                e.starts_with("KubeProxyConfiguration.healthzBindAddress: Invalid value: "),
                "{e}"
            );
        }
    }

    #[test]
    fn nodeport_keywords() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            nodeport_addresses("n", &s(&["primary"])).unwrap().0,
            NodePortAddressesFlag::Primary
        );
        assert!(
            matches!(nodeport_addresses("n", &s(&["all"])).unwrap().0, NodePortAddressesFlag::Cidrs(ref c) if c.len() == 2)
        );
        let e = nodeport_addresses("nodePortAddresses", &s(&["all", "all"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"KubeProxyConfiguration.nodePortAddresses[1]: Duplicate value: "all""#
        );
        assert!(nodeport_addresses("n", &s(&["10.0.0.0/33"])).is_err());
        assert!(
            nodeport_addresses("n", &s(&["localhost"]))
                .unwrap()
                .1
                .is_some()
        );
    }
}
