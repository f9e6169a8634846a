//! `--feature-gates` / `featureGates`: kube-proxy's gates, checked as upstream's
//! `featuregate.SetFromMap` checks them (an unknown gate, or a locked gate set
//! against its lock, is an error), then each gate that changes what a proxy does
//! is either honoured here or refused with the reason.

use std::collections::BTreeMap;

use super::known_gates::KNOWN;

/// A gate's maturity (`featuregate.prerelease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Alpha: off by default.
    Alpha,
    /// Beta.
    Beta,
    /// GA: set to its default only, and soon removed.
    GA,
    /// Deprecated.
    Deprecated,
}

/// One gate kube-proxy knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// `NFTablesNetlink`
    pub name: &'static str,
    /// Its default in v1.37.
    pub default: bool,
    /// Its stage in v1.37.
    pub stage: Stage,
    /// Locked to its default: setting the other value is an error.
    pub locked: bool,
}

/// Looks a gate up by its exact name.
pub fn known(name: &str) -> Option<&'static Gate> {
    KNOWN
        .binary_search_by(|g| g.name.cmp(name))
        .ok()
        .map(|i| &KNOWN[i])
}

/// Every gate name kube-proxy v1.37 accepts.
pub fn names() -> impl Iterator<Item = &'static str> {
    KNOWN.iter().map(|g| g.name)
}

/// Parses `Name=bool,Name=bool` (`cliflag.MapStringBool`) into `gates`.
pub fn parse_flag(value: &str, gates: &mut BTreeMap<String, bool>) -> Result<(), String> {
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!("missing bool value for {}", pair));
        };
        let b = super::value::parse_go_bool(v.trim()).ok_or_else(|| {
            format!(
                "invalid value of {}={}, err: strconv.ParseBool: parsing {}: invalid syntax",
                k.trim(),
                v.trim(),
                super::value::go_quote(v.trim())
            )
        })?;
        gates.insert(k.trim().to_string(), b);
    }
    Ok(())
}

/// What kube-nlproxy does with a gate set to a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted; the gate is not about a service proxy, or its value is what
    /// kube-nlproxy does anyway.
    Accepted,
    /// Accepted, with a warning (upstream warns on GA and deprecated gates, or the
    /// gate has no effect here and the user should know).
    Warn(String),
    /// Refused: kube-nlproxy cannot do what the gate asks.
    Refused(String),
}

/// Checks one gate as upstream does, then as kube-nlproxy does.
pub fn check(name: &str, on: bool) -> Verdict {
    let Some(gate) = known(name) else {
        return Verdict::Refused(format!("unrecognized feature gate: {name}"));
    };
    if gate.locked && on != gate.default {
        return Verdict::Refused(format!(
            "cannot set feature gate {name} to {on}, feature is locked to {}",
            gate.default
        ));
    }
    match (name, on) {
        ("KubeProxyNFTablesLocalhostNodePorts", true) => {
            return Verdict::Refused(
                "kube-nlproxy never serves NodePorts on loopback addresses".into(),
            );
        }
        ("NFTablesNetlink", false) => {
            return Verdict::Warn(
                "NFTablesNetlink=false has no effect: kube-nlproxy always programs nftables over netlink"
                    .into(),
            );
        }
        _ => {}
    }
    match gate.stage {
        Stage::GA => Verdict::Warn(format!(
            "Setting GA feature gate {name}={on}. It will be removed in a future release."
        )),
        Stage::Deprecated => Verdict::Warn(format!(
            "Setting deprecated feature gate {name}={on}. It will be removed in a future release."
        )),
        Stage::Alpha | Stage::Beta => Verdict::Accepted,
    }
}

/// Whether `name` is on, given what was set.
pub fn enabled(gates: &BTreeMap<String, bool>, name: &str) -> bool {
    gates
        .get(name)
        .copied()
        .or_else(|| known(name).map(|g| g.default))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_has_kube_proxys_gates() {
        assert!(KNOWN.windows(2).all(|w| w[0].name < w[1].name));
        for name in [
            "KubeProxyIPVS",
            "NFTablesNetlink",
            "AllAlpha",
            "AllBeta",
            "ContextualLogging",
        ] {
            assert!(known(name).is_some(), "{name}");
        }
    }

    #[test]
    fn gates_are_checked_as_upstream() {
        assert_eq!(check("NFTablesNetlink", true), Verdict::Accepted);
        assert!(
            matches!(check("Foo", true), Verdict::Refused(r) if r == "unrecognized feature gate: Foo")
        );
        assert!(
            matches!(check("NFTablesProxyMode", false), Verdict::Refused(r) if r.contains("locked to true"))
        );
        assert!(matches!(check("KubeProxyIPVS", true), Verdict::Warn(_)));
        assert!(matches!(
            check("KubeProxyNFTablesLocalhostNodePorts", true),
            Verdict::Refused(_)
        ));
        let mut g = BTreeMap::new();
        parse_flag("KubeProxyIPVS=false, AllAlpha=true", &mut g).unwrap();
        assert_eq!(g.len(), 2);
        assert!(!enabled(&g, "KubeProxyIPVS"));
        assert!(enabled(&BTreeMap::new(), "KubeProxyIPVS"));
        assert!(parse_flag("Foo", &mut g).is_err());
        assert!(parse_flag("Foo=maybe", &mut g).is_err());
    }
}
