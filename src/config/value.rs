//! Values as kube-proxy's flags and configuration file spell them: Go durations and
//! booleans, and the field errors of `k8s.io/apimachinery`'s `field` package
//! (`KubeProxyConfiguration.syncPeriod: Invalid value: "0s": must be greater than 0`).

use std::fmt;
use std::time::Duration;

/// Parses a Go duration (`time.ParseDuration`): `30s`, `1m`, `500ms`, `1h30m`, `0`,
/// with an optional sign. Returns whether it was negative, and its size.
pub fn parse_go_duration(s: &str) -> Result<(bool, Duration), String> {
    let bad = || format!("time: invalid duration {}", go_quote(s));
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if body == "0" {
        return Ok((false, Duration::ZERO));
    }
    if body.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    let mut rest = body;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("time: missing unit in duration {}", go_quote(s)))?;
        if num_end == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            u => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    go_quote(u),
                    go_quote(s)
                ));
            }
        };
        total += value * factor;
        rest = &rest[unit_end..];
    }
    // A number too big for a Duration (`1e400h`, or digits enough to overflow f64)
    // is an error, not a panic.
    let d = Duration::try_from_secs_f64(total)
        .map_err(|_| format!("time: invalid duration {} (out of range)", go_quote(s)))?;
    Ok((negative && !d.is_zero(), d))
}

/// Formats a duration as Go's `time.Duration.String` does: `30s`, `1m0s`, `24h0m0s`,
/// `250ms`, `0s`.
pub fn go_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_secs(1) {
        let ns = d.as_nanos();
        return if ns.is_multiple_of(1_000_000) {
            format!("{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1_000) {
            format!("{}µs", ns / 1_000)
        } else if ns < 1_000 {
            format!("{ns}ns")
        } else {
            format!("{}µs", trim_fraction(ns as f64 / 1e3))
        };
    }
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let s = if nanos == 0 {
        format!("{s}s")
    } else {
        format!("{}s", trim_fraction(s as f64 + f64::from(nanos) / 1e9))
    };
    if h > 0 {
        format!("{h}h{m}m{s}")
    } else if m > 0 {
        format!("{m}m{s}")
    } else {
        s
    }
}

fn trim_fraction(x: f64) -> String {
    let t = format!("{x:.9}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `%q` for a string (one implementation, shared with the servers' JSON).
pub use crate::serve::format::go_quote;

/// What is wrong with a field (`field.ErrorType`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Invalid value`
    Invalid,
    /// `Unsupported value`, with the values that are.
    Unsupported(Vec<String>),
    /// `Duplicate value`
    Duplicate,
    /// `Forbidden`
    Forbidden,
}

/// One invalid field, as upstream's `field.Error` prints it, naming the flag that
/// set it when a flag did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// `KubeProxyConfiguration.syncPeriod`
    pub path: String,
    /// The value as Go's `%v` shows it (strings quoted).
    pub value: String,
    /// What kind of error.
    pub kind: FieldErrorKind,
    /// Why.
    pub detail: String,
    /// The flag the value came from, if any.
    pub flag: Option<String>,
}

impl FieldError {
    /// `path: Invalid value: value: detail`; `path` is below
    /// `KubeProxyConfiguration`.
    pub fn invalid(path: &str, value: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            path: full_path(path),
            value: value.into(),
            kind: FieldErrorKind::Invalid,
            detail: detail.into(),
            flag: None,
        }
    }

    /// `path: Unsupported value: value: supported values: ...`.
    pub fn unsupported(path: &str, value: &str, supported: &[&str]) -> Self {
        FieldError {
            path: full_path(path),
            value: go_quote(value),
            kind: FieldErrorKind::Unsupported(supported.iter().map(|s| s.to_string()).collect()),
            detail: String::new(),
            flag: None,
        }
    }

    /// `path: Duplicate value: value`.
    pub fn duplicate(path: &str, value: &str) -> Self {
        FieldError {
            path: full_path(path),
            value: go_quote(value),
            kind: FieldErrorKind::Duplicate,
            detail: String::new(),
            flag: None,
        }
    }

    /// `path: Forbidden: detail`.
    pub fn forbidden(path: &str, detail: impl Into<String>) -> Self {
        FieldError {
            path: full_path(path),
            value: String::new(),
            kind: FieldErrorKind::Forbidden,
            detail: detail.into(),
            flag: None,
        }
    }

    /// The same error, naming the flag that set the value.
    #[must_use]
    pub fn from_flag(mut self, flag: &str) -> Self {
        self.flag = Some(flag.to_string());
        self
    }
}

fn full_path(path: &str) -> String {
    if path.is_empty() {
        "KubeProxyConfiguration".into()
    } else {
        format!("KubeProxyConfiguration.{path}")
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            FieldErrorKind::Invalid => write!(
                f,
                "{}: Invalid value: {}: {}",
                self.path, self.value, self.detail
            )?,
            FieldErrorKind::Unsupported(values) => {
                let list: Vec<String> = values.iter().map(|v| go_quote(v)).collect();
                write!(
                    f,
                    "{}: Unsupported value: {}: supported values: {}",
                    self.path,
                    self.value,
                    list.join(", ")
                )?;
                if !self.detail.is_empty() {
                    write!(f, " ({})", self.detail)?;
                }
            }
            FieldErrorKind::Duplicate => {
                write!(f, "{}: Duplicate value: {}", self.path, self.value)?
            }
            FieldErrorKind::Forbidden => write!(f, "{}: Forbidden: {}", self.path, self.detail)?,
        }
        if let Some(flag) = &self.flag {
            write!(f, " (from {flag})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_round_trip() {
        for (text, secs) in [
            ("30s", 30.0),
            ("1m0s", 60.0),
            ("24h0m0s", 86400.0),
            ("1h30m0s", 5400.0),
            ("250ms", 0.25),
            ("1.5s", 1.5),
            ("0s", 0.0),
        ] {
            let (neg, d) = parse_go_duration(text).unwrap();
            assert!(!neg);
            assert_eq!(d, Duration::from_secs_f64(secs), "{text}");
            assert_eq!(go_duration(d), text);
        }
        assert_eq!(
            parse_go_duration("-1s").unwrap(),
            (true, Duration::from_secs(1))
        );
        assert_eq!(parse_go_duration("-0s").unwrap(), (false, Duration::ZERO));
        let e = parse_go_duration("thirty").unwrap_err();
        assert_eq!(e, r#"time: invalid duration "thirty""#);
        assert!(parse_go_duration("5").is_err());
        assert!(parse_go_duration("").is_err());
        assert!(
            parse_go_duration("1x")
                .unwrap_err()
                .contains("unknown unit")
        );
    }

    #[test]
    fn field_errors_print_as_upstream() {
        let e = FieldError::invalid("syncPeriod", go_quote("0s"), "must be greater than 0");
        assert_eq!(
            e.to_string(),
            r#"KubeProxyConfiguration.syncPeriod: Invalid value: "0s": must be greater than 0"#
        );
        let e = FieldError::unsupported("mode", "iptables", &["ipvs", "nftables"])
            .from_flag("--proxy-mode");
        assert_eq!(
            e.to_string(),
            r#"KubeProxyConfiguration.mode: Unsupported value: "iptables": supported values: "ipvs", "nftables" (from --proxy-mode)"#
        );
        assert_eq!(go_quote("a\"b\n"), r#""a\"b\n""#);
    }
}
