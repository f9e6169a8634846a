//! The built binary's logs, parsed: klog text lines by default, component-base JSON
//! lines with `--logging-format json`, no colour codes on a pipe, and no INFO lines
//! from a CLI command unless `-v` is given. `plan --source file:` computes the
//! desired state without touching the kernel.

use std::io::Write as _;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");

fn plan(extra: &[&str]) -> Output {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/demo/");
    Command::new(BIN)
        .args(["plan", "--source", &format!("file:{demo}")])
        .args(extra)
        .env_remove("RUST_LOG")
        .output()
        .expect("spawn kube-nlproxy")
}

fn stderr(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A klog header: `Lmmdd hh:mm:ss.uuuuuu PPPPPPP file:line] `; returns the rest.
fn klog_body(line: &str) -> Option<&str> {
    let b = line.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    let ok = b.len() > 32
        && matches!(b[0], b'I' | b'W' | b'E')
        && digits(1..5)
        && b[5] == b' '
        && digits(6..8)
        && b[8] == b':'
        && digits(9..11)
        && b[11] == b':'
        && digits(12..14)
        && b[14] == b'.'
        && digits(15..21)
        && b[21] == b' '
        && line[22..29]
            .trim_start()
            .bytes()
            .all(|c| c.is_ascii_digit())
        && b[29] == b' ';
    if !ok {
        return None;
    }
    let (caller, body) = line[30..].split_once("] ")?;
    let (file, n) = caller.rsplit_once(':')?;
    (file.ends_with(".rs") && n.parse::<u32>().is_ok()).then_some(body)
}

#[test]
fn klog_text_by_default() {
    let err = stderr(&plan(&["-v=2"]));
    assert!(!err.contains("\x1b["), "colour codes on a pipe:\n{err}");
    let logs: Vec<&str> = err.lines().filter_map(klog_body).collect();
    assert!(!logs.is_empty(), "no klog line:\n{err}");
    for body in &logs {
        // The message is quoted, then key=value pairs.
        assert!(body.starts_with('"'), "{body}");
    }
    assert!(
        err.lines()
            .any(|l| l.starts_with('I') && klog_body(l).is_some()),
        "{err}"
    );
}

#[test]
fn component_base_json_with_logging_format_json() {
    let err = stderr(&plan(&["--logging-format=json", "--v", "4"]));
    assert!(!err.contains("\x1b["), "{err}");
    let mut n = 0;
    for line in err.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let obj = v.as_object().unwrap();
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        assert!(v["ts"].as_f64().is_some_and(|t| t > 1.6e9), "{line}");
        let caller = v["caller"].as_str().unwrap();
        assert!(caller.contains(".rs:"), "{line}");
        assert!(v["msg"].is_string(), "{line}");
        assert!(
            v["v"].as_u64().is_some() || v.get("err").is_some(),
            "{line}"
        );
        assert!(line.starts_with(r#"{"ts":"#), "{line}");
        assert!(keys.contains(&"msg"), "{line}");
        n += 1;
    }
    assert!(n > 0, "no JSON line:\n{err}");
}

#[test]
fn cli_commands_print_no_info_without_v() {
    let err = stderr(&plan(&[]));
    assert!(
        !err.lines()
            .any(|l| l.starts_with('I') && klog_body(l).is_some()),
        "{err}"
    );
    let err = stderr(&plan(&["-v=1"]));
    assert!(
        err.lines()
            .any(|l| l.starts_with('I') && klog_body(l).is_some()),
        "-v=1 shows INFO:\n{err}"
    );
}

#[test]
fn vmodule_raises_one_file() {
    let quiet = stderr(&plan(&["-v=1"]));
    let loud = stderr(&plan(&["-v=1", "--vmodule=nftables=2"]));
    let count = |s: &str| s.lines().filter(|l| klog_body(l).is_some()).count();
    assert!(
        count(&loud) > count(&quiet),
        "quiet:\n{quiet}\nloud:\n{loud}"
    );
    assert!(
        loud.lines()
            .filter(|l| klog_body(l).is_some())
            .all(|l| !l.contains("privileges.rs") || quiet.contains("privileges.rs")),
        "{loud}"
    );
}

#[test]
fn a_missing_config_file_says_its_cause_once() {
    let out = Command::new(BIN)
        .args(["--config", "/nonexistent/kube-proxy.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `run --init-only` with a conntrack block that writes nothing: only the
/// process's own oom_score_adj changes. Needs root (privileges are dropped).
fn init_only(test: &str, extra: &[&str]) -> Option<Output> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    if !status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    {
        // Past libtest's capture, in the form scripts/test counts.
        let _ = writeln!(std::io::stderr(), "SKIPPED logging::{test}: needs root");
        return None;
    }
    let out = Command::new(BIN)
        .args([
            "run",
            "--init-only",
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--hostname-override=node-a",
        ])
        .args(extra)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    Some(out)
}

#[test]
fn run_logs_the_version_and_the_configuration_at_start() {
    let Some(out) = init_only("run_logs_the_version_and_the_configuration_at_start", &[]) else {
        return;
    };
    let err = stderr(&out);
    let start = err
        .lines()
        .find(|l| l.contains("Starting kube-nlproxy"))
        .unwrap_or_else(|| panic!("no start-up line:\n{err}"));
    let body = klog_body(start).unwrap();
    let version = format!("version=\"kube-nlproxy v{}\"", env!("CARGO_PKG_VERSION"));
    assert!(body.contains(&version), "{body}");
    assert!(
        body.contains(r#"\"hostnameOverride\":\"node-a\""#),
        "{body}"
    );

    let Some(out) = init_only(
        "run_logs_the_version_and_the_configuration_at_start",
        &["--logging-format=json"],
    ) else {
        return;
    };
    let err = stderr(&out);
    let start: serde_json::Value = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["msg"] == "Starting kube-nlproxy")
        .unwrap_or_else(|| panic!("no start-up line:\n{err}"));
    assert_eq!(start["v"], 0);
    assert_eq!(start["config"]["kind"], "KubeProxyConfiguration");
    assert_eq!(start["config"]["hostnameOverride"], "node-a");
    assert_eq!(start["config"]["logging"]["format"], "json");
}
