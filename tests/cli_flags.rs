//! kube-proxy's command line, run on the built binary: every flag of kube-proxy
//! v1.37 is accepted (implemented, or warned about once), a value kube-proxy
//! rejects exits 2 naming the field, and the commands take only their own flags.
//! Nothing here touches the kernel: each run stops at validation, at
//! `--write-config-to`, `--version` or `help`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_kube-nlproxy");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("spawn kube-nlproxy")
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("knp-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs with `--write-config-to` and returns the written file and stderr.
fn write_config(args: &[&str], name: &str) -> (String, String) {
    let path = tmp(name);
    let p = path.display().to_string();
    let mut all = args.to_vec();
    all.extend(["--write-config-to", &p]);
    let out = run(&all);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    let written = std::fs::read_to_string(&path).unwrap();
    (written, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A valid value for each flag of `kube-proxy --help` (the 55 of v1.37.2, and
/// klog's file flags older kube-proxy command lines still carry), and whether it
/// has no effect here (then it is warned about once).
const SAMPLES: &[(&str, &str, bool)] = &[
    ("--add_dir_header", "true", false),
    ("--alsologtostderr", "true", true),
    ("--bind-address", "10.0.0.1", false),
    ("--bind-address-hard-fail", "true", false),
    ("--boot-id-file", "/proc/sys/kernel/random/boot_id", true),
    ("--cleanup", "false", false),
    ("--cluster-cidr", "10.244.0.0/16", false),
    ("--config-sync-period", "10m", true),
    ("--conntrack-max-per-core", "0", false),
    ("--conntrack-min", "0", false),
    ("--conntrack-tcp-be-liberal", "true", false),
    ("--conntrack-tcp-timeout-close-wait", "1h", false),
    ("--conntrack-tcp-timeout-established", "24h", false),
    ("--conntrack-udp-timeout", "30s", false),
    ("--conntrack-udp-timeout-stream", "2m", false),
    ("--detect-local-mode", "NodeCIDR", false),
    ("--feature-gates", "NFTablesNetlink=true", false),
    ("--healthz-bind-address", "0.0.0.0:10256", false),
    ("--hostname-override", "node-a", false),
    ("--init-only", "false", false),
    ("--iptables-localhost-nodeports", "false", true),
    ("--iptables-masquerade-bit", "14", false),
    ("--iptables-min-sync-period", "1s", false),
    ("--iptables-sync-period", "30s", false),
    ("--ipvs-exclude-cidrs", "10.0.0.0/8", false),
    ("--ipvs-min-sync-period", "0s", false),
    ("--ipvs-scheduler", "rr", false),
    ("--ipvs-strict-arp", "true", false),
    ("--ipvs-sync-period", "30s", false),
    ("--ipvs-tcp-timeout", "0s", false),
    ("--ipvs-tcpfin-timeout", "0s", false),
    ("--ipvs-udp-timeout", "0s", false),
    ("--kube-api-burst", "10", false),
    ("--kube-api-content-type", "application/json", false),
    ("--kube-api-qps", "5", false),
    ("--kubeconfig", "/nonexistent/kubeconfig", false),
    ("--log-flush-frequency", "5s", true),
    ("--log-json-info-buffer-size", "0", true),
    ("--log-json-split-stream", "false", true),
    ("--log-text-info-buffer-size", "0", true),
    ("--log-text-split-stream", "false", true),
    ("--log_backtrace_at", "", true),
    ("--log_dir", "/tmp", true),
    ("--log_file", "/tmp/kube-proxy.log", true),
    ("--log_file_max_size", "1800", true),
    ("--logging-format", "text", false),
    ("--logtostderr", "true", true),
    ("--masquerade-all", "true", false),
    ("--master", "https://10.0.0.1:6443", false),
    ("--metrics-bind-address", "127.0.0.1:10249", false),
    ("--nodeport-addresses", "primary", false),
    ("--oom-score-adj", "-999", false),
    ("--one_output", "true", true),
    ("--pod-bridge-interface", "cbr0", false),
    ("--pod-interface-name-prefix", "veth", false),
    ("--profiling", "false", true),
    ("--proxy-mode", "nftables", false),
    ("--show-hidden-metrics-for-version", "1.36", true),
    ("--skip_headers", "false", false),
    ("--skip_log_headers", "true", true),
    ("--stderrthreshold", "INFO", true),
    ("--v", "2", false),
    ("--vmodule", "daemon=2", false),
];

/// Flags checked elsewhere: they end the run (`--version`, `--help`), point at a
/// file (`--config`, `--write-config-to`).
const SPECIAL: &[&str] = &["--config", "--write-config-to", "--version", "--help"];

#[test]
fn every_kube_proxy_flag_is_accepted_and_no_effect_ones_warn_once() {
    for (i, (flag, value, no_effect)) in SAMPLES.iter().enumerate() {
        let arg = format!("{flag}={value}");
        let (_, stderr) = write_config(&[&arg], &format!("flag-{i}.yaml"));
        let warnings = stderr
            .lines()
            .filter(|l| l.starts_with('W') && l.contains(flag))
            .count();
        let want = usize::from(*no_effect);
        assert_eq!(warnings, want, "{arg}: {warnings} warnings:\n{stderr}");
        // The same flag twice still warns once.
        if *no_effect {
            let (_, stderr) = write_config(&[&arg, &arg], &format!("flag-{i}-twice.yaml"));
            let n = stderr.lines().filter(|l| l.contains(flag)).count();
            assert_eq!(n, 1, "{arg} twice:\n{stderr}");
        }
    }
}

#[test]
fn implemented_flags_reach_the_configuration() {
    let (written, _) = write_config(
        &[
            "--bind-address=10.0.0.1",
            "--kube-api-qps=7.5",
            "--kube-api-burst=20",
            "--kube-api-content-type=application/json",
            "--feature-gates=NFTablesNetlink=true,AllAlpha=false",
            "--iptables-masquerade-bit=12",
            "--iptables-sync-period=20s",
            "--iptables-min-sync-period=2s",
            "--logging-format=json",
            "--vmodule=daemon=3",
            "--healthz-port=10257",
        ],
        "implemented.yaml",
    );
    for want in [
        "bindAddress: 10.0.0.1",
        "qps: 7.5",
        "burst: 20",
        "contentType: application/json",
        "NFTablesNetlink: true",
        "masqueradeBit: 12",
        "syncPeriod: 20s",
        "minSyncPeriod: 2s",
        "format: json",
        "filePattern: daemon",
        "healthzBindAddress: 0.0.0.0:10257",
    ] {
        assert!(written.contains(want), "{want}:\n{written}");
    }
}

#[test]
fn the_iptables_periods_do_nothing_in_ipvs_mode_and_say_so() {
    let (written, stderr) = write_config(
        &["--proxy-mode=ipvs", "--iptables-sync-period=20s"],
        "ipvs-periods.yaml",
    );
    assert!(written.contains("syncPeriod: 30s"), "{written}");
    assert_eq!(
        stderr
            .matches("--iptables-sync-period: no effect in ipvs mode")
            .count(),
        1,
        "{stderr}"
    );
}

#[test]
fn all_verbosity_spellings_work() {
    for (i, args) in [
        &["-v=2"][..],
        &["--v=2"],
        &["--v", "2"],
        &["-v", "2"],
        &["-v2"],
    ]
    .iter()
    .enumerate()
    {
        let (written, _) = write_config(args, &format!("v-{i}.yaml"));
        assert!(written.contains("verbosity: 2"), "{args:?}:\n{written}");
    }
}

#[test]
fn version_and_help() {
    let out = run(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("kube-nlproxy v{}", env!("CARGO_PKG_VERSION"))
    );
    // `help CMD` and `CMD --help` show that command's flags only.
    for (args, has, lacks) in [
        (&["help", "plan"][..], "--output", "--cleanup"),
        (&["plan", "--help"], "--output", "--write-config-to"),
        (&["cleanup", "-h"], "--kube-proxy", "--output"),
        (&["explain", "--help"], "--from", "--kube-proxy"),
        (&["help", "run"], "--write-config-to", "--from"),
        (&["--help"], "--feature-gates", "--kube-proxy"),
    ] {
        let out = run(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains(has), "{args:?} lacks {has}:\n{help}");
        assert!(!help.contains(lacks), "{args:?} has {lacks}:\n{help}");
    }
    // Every flag of the list is in the help of run.
    let out = run(&["help", "run"]);
    let help = String::from_utf8_lossy(&out.stdout).replace('_', "-");
    for (flag, _, _) in SAMPLES {
        assert!(help.contains(&flag.replace('_', "-")), "{flag} not in help");
    }
}

#[test]
fn commands_take_their_own_flags_only() {
    for (args, want) in [
        (
            &["plan", "--cleanup=true"][..],
            r#"flag --cleanup does not apply to "plan""#,
        ),
        (
            &["plan", "--cleanup"],
            r#"flag --cleanup does not apply to "plan""#,
        ),
        (
            &["status", "--init-only"],
            r#"flag --init-only does not apply to "status""#,
        ),
        (
            &["run", "--kube-proxy"],
            r#"flag --kube-proxy does not apply to "run""#,
        ),
        (
            &["run", "--output=json"],
            r#"flag --output does not apply to "run""#,
        ),
        (
            &["plan", "--from", "10.0.0.1"],
            r#"flag --from does not apply to "plan""#,
        ),
        (&["bogus"], r#"unknown command "bogus""#),
        (&["help", "bogus"], r#"unknown command "bogus""#),
        (&["--bogus"], "unknown flag: --bogus"),
        (&["plan", "extra"], r#"unexpected argument "extra""#),
        (&["--source"], "flag needs an argument: --source"),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{args:?}: want {want}\n{stderr}");
    }
    // The flags of `cleanup --kube-proxy` and `--keep-kube-proxy-state` still parse.
    let (written, _) = write_config(&["--keep-kube-proxy-state"], "keep.yaml");
    assert!(written.contains("keepKubeProxyState: true"), "{written}");
    // An empty --hostname-override (a DaemonSet's unset $(NODE_NAME)) is unset.
    let (written, _) = write_config(&["--hostname-override="], "empty-host.yaml");
    assert!(written.contains("hostnameOverride: \"\""), "{written}");
}

/// Each rule of kube-proxy's validation, broken once: exit 2 and the field.
#[test]
fn values_kube_proxy_rejects_exit_2_naming_the_field() {
    for (args, want) in [
        (
            &["--sync-period", "0s"][..],
            r#"KubeProxyConfiguration.syncPeriod: Invalid value: "0s": must be greater than 0 (from --sync-period)"#,
        ),
        (
            &["--iptables-sync-period=0"],
            r#"KubeProxyConfiguration.syncPeriod: Invalid value: "0": must be greater than 0"#,
        ),
        (
            &["--sync-period=thirty"],
            r#"KubeProxyConfiguration.syncPeriod: Invalid value: "thirty": time: invalid duration "thirty""#,
        ),
        (
            &["--min-sync-period=-1s"],
            r#"KubeProxyConfiguration.minSyncPeriod: Invalid value: "-1s": must be greater than or equal to 0"#,
        ),
        (
            &["--min-sync-period=1m", "--sync-period=30s"],
            r#"KubeProxyConfiguration.syncPeriod: Invalid value: "1m0s": must be greater than or equal to KubeProxyConfiguration.minSyncPeriod"#,
        ),
        (
            &["--config-sync-period=0s"],
            r#"KubeProxyConfiguration.configSyncPeriod: Invalid value: "0s": must be greater than 0"#,
        ),
        (
            &["--proxy-mode=iptables"],
            r#"KubeProxyConfiguration.mode: Invalid value: "iptables": kube-nlproxy has no iptables mode: use "nftables""#,
        ),
        (
            &["--proxy-mode=kernelspace"],
            r#"KubeProxyConfiguration.mode: Invalid value: "kernelspace""#,
        ),
        (
            &["--proxy-mode=ipvs", "--feature-gates=KubeProxyIPVS=false"],
            r#"KubeProxyConfiguration.mode: Invalid value: "ipvs": the ipvs mode needs the KubeProxyIPVS feature gate"#,
        ),
        (
            &["--bind-address=10.0.0"],
            r#"KubeProxyConfiguration.bindAddress: Invalid value: "10.0.0": not a valid textual representation of an IP address"#,
        ),
        (
            &["--healthz-bind-address=0.0.0.0"],
            r#"KubeProxyConfiguration.healthzBindAddress: Invalid value: "0.0.0.0": must be IP:port"#,
        ),
        (
            &["--metrics-bind-address=localhost:10249"],
            r#"KubeProxyConfiguration.metricsBindAddress: Invalid value: "localhost": must be a valid IP"#,
        ),
        (
            &["--metrics-bind-address=127.0.0.1:65536"],
            r#"KubeProxyConfiguration.metricsBindAddress: Invalid value: "65536": must be a valid port"#,
        ),
        (
            &["--cluster-cidr=10.0.0.0/33"],
            r#"KubeProxyConfiguration.clusterCIDR[0]: Invalid value: "10.0.0.0/33": must be a valid CIDR block"#,
        ),
        (
            &["--cluster-cidr=10.0.0.0/8,10.1.0.0/16"],
            "KubeProxyConfiguration.clusterCIDR: Invalid value: [10.0.0.0/8 10.1.0.0/16]: must be a either a single CIDR or dual-stack pair",
        ),
        (
            &["--detect-local-mode=Pods"],
            r#"KubeProxyConfiguration.detectLocalMode: Unsupported value: "Pods""#,
        ),
        (
            &["--detect-local-mode=BridgeInterface"],
            r#"KubeProxyConfiguration.detectLocal.bridgeInterface: Invalid value: "": must not be empty"#,
        ),
        (
            &["--detect-local-mode=InterfaceNamePrefix"],
            r#"KubeProxyConfiguration.detectLocal.interfaceNamePrefix: Invalid value: "": must not be empty"#,
        ),
        (
            &["--nodeport-addresses=primary,primary"],
            r#"KubeProxyConfiguration.nodePortAddresses[1]: Duplicate value: "primary""#,
        ),
        (
            &["--nodeport-addresses=10.0.0.0/40"],
            r#"KubeProxyConfiguration.nodePortAddresses[0]: Invalid value: "10.0.0.0/40": must be a valid CIDR"#,
        ),
        (
            &["--iptables-masquerade-bit=32"],
            "KubeProxyConfiguration.nftables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]",
        ),
        (
            &["--masquerade-bit=-1"],
            "KubeProxyConfiguration.nftables.masqueradeBit: Invalid value: -1: must be within the range [0, 31]",
        ),
        (
            &["--oom-score-adj=-1001"],
            "KubeProxyConfiguration.oomScoreAdj: Invalid value: -1001: must be within the range [-1000, 1000]",
        ),
        (
            &["--conntrack-max-per-core=-1"],
            "KubeProxyConfiguration.conntrack.maxPerCore: Invalid value: -1: must be greater than or equal to 0",
        ),
        (
            &["--conntrack-min=-1"],
            "KubeProxyConfiguration.conntrack.min: Invalid value: -1: must be greater than or equal to 0",
        ),
        (
            &["--conntrack-tcp-timeout-established=-1s"],
            r#"KubeProxyConfiguration.conntrack.tcpEstablishedTimeout: Invalid value: "-1s": must be greater than or equal to 0"#,
        ),
        (
            &["--conntrack-tcp-timeout-close-wait=-1s"],
            r#"KubeProxyConfiguration.conntrack.tcpCloseWaitTimeout: Invalid value: "-1s""#,
        ),
        (
            &["--conntrack-udp-timeout=-1s"],
            r#"KubeProxyConfiguration.conntrack.udpTimeout: Invalid value: "-1s""#,
        ),
        (
            &["--conntrack-udp-timeout-stream=-1s"],
            r#"KubeProxyConfiguration.conntrack.udpStreamTimeout: Invalid value: "-1s""#,
        ),
        (
            &["--ipvs-tcp-timeout=-1s"],
            r#"KubeProxyConfiguration.ipvs.tcpTimeout: Invalid value: "-1s""#,
        ),
        (
            &["--ipvs-exclude-cidrs=bogus"],
            r#"KubeProxyConfiguration.ipvs.excludeCIDRs[0]: Invalid value: "bogus": must be a valid CIDR"#,
        ),
        (
            &["--ipvs-scheduler=fast"],
            r#"KubeProxyConfiguration.ipvs.scheduler: Unsupported value: "fast""#,
        ),
        (
            &["--kube-api-burst=-1"],
            "KubeProxyConfiguration.clientConnection.burst: Invalid value: -1: must be greater than or equal to 0",
        ),
        (
            &["--kube-api-qps=fast"],
            r#"KubeProxyConfiguration.clientConnection.qps: Invalid value: "fast""#,
        ),
        (
            &["--feature-gates=Foo=true"],
            "KubeProxyConfiguration.featureGates: Invalid value: map[Foo:true]: unrecognized feature gate: Foo",
        ),
        (
            &["--feature-gates=NFTablesProxyMode=false"],
            "cannot set feature gate NFTablesProxyMode to false, feature is locked to true",
        ),
        (
            &["--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true"],
            "kube-nlproxy never serves NodePorts on loopback addresses",
        ),
        (
            &["--feature-gates=NFTablesNetlink"],
            "missing bool value for NFTablesNetlink",
        ),
        (
            &["--logging-format=xml"],
            r#"KubeProxyConfiguration.logging.format: Invalid value: "xml": Unsupported log format"#,
        ),
        (
            &["--v=-1"],
            r#"KubeProxyConfiguration.logging.verbosity: Invalid value: "-1""#,
        ),
        (
            &["--vmodule=daemon"],
            r#"KubeProxyConfiguration.logging.vmodule: Invalid value: "daemon""#,
        ),
        (
            &["--log-json-split-stream=true"],
            "KubeProxyConfiguration.logging.options.json.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled",
        ),
        (
            &["--show-hidden-metrics-for-version=1.20"],
            r#"KubeProxyConfiguration.showHiddenMetricsForVersion: Invalid value: "1.20""#,
        ),
        (
            &["--masquerade-all=maybe"],
            r#"KubeProxyConfiguration.nftables.masqueradeAll: Invalid value: "maybe": strconv.ParseBool"#,
        ),
        (
            &["--hostname-override= "],
            "empty hostname-override is invalid",
        ),
        (
            &["--stderrthreshold=LOUD"],
            "expected INFO, WARNING, ERROR or FATAL",
        ),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(want),
            "{args:?}:\n want {want}\n  got {stderr}"
        );
    }
    // Every error at once, one line each.
    let out = run(&["--oom-score-adj=2000", "--conntrack-min=-1"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).lines().count(),
        2,
        "{}",
        text(&out)
    );
}

fn config_file(name: &str, body: &str) -> String {
    let path = tmp(name);
    std::fs::write(
        &path,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{body}"
        ),
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn config_files_are_checked_as_kube_proxy_checks_them() {
    for (i, (body, want)) in [
        ("syncPeriod: thirty\n", r#"KubeProxyConfiguration.syncPeriod: Invalid value: "thirty": time: invalid duration "thirty""#),
        ("mode: iptables\n", r#"KubeProxyConfiguration.mode: Invalid value: "iptables": kube-nlproxy has no iptables mode: use "nftables""#),
        ("nftables: {syncPeriod: -5s}\n", r#"KubeProxyConfiguration.nftables.syncPeriod: Invalid value: "-5s""#),
        ("featureGates: {Foo: true}\n", "unrecognized feature gate: Foo"),
        ("oomScoreAdj: -2000\n", "KubeProxyConfiguration.oomScoreAdj: Invalid value: -2000"),
        ("conntrack: {min: -5}\n", "KubeProxyConfiguration.conntrack.min: Invalid value: -5"),
        ("---\napiVersion: v1\n", "several YAML documents"),
    ]
    .iter()
    .enumerate()
    {
        let p = config_file(&format!("bad-{i}.yaml"), body);
        let out = run(&["--config", &p]);
        assert_eq!(out.status.code(), Some(2), "{body}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{body}:\n want {want}\n  got {stderr}");
        assert!(!stderr.contains("budget"), "{stderr}");
    }
    // Unknown fields: one warning each; bindAddress is kept.
    let p = config_file(
        "good.yaml",
        "bindAddress: 10.9.8.7\nbogus: 1\nnested: {x: 1}\n",
    );
    let (written, stderr) = write_config(&["--config", &p], "good-out.yaml");
    assert!(written.contains("bindAddress: 10.9.8.7"), "{written}");
    assert_eq!(stderr.matches("unknown field").count(), 2, "{stderr}");
}

#[test]
fn the_written_configuration_reads_back() {
    let (first, _) = write_config(
        &[
            "--proxy-mode=ipvs",
            "--ipvs-sync-period=7s",
            "--cluster-cidr=10.244.0.0/16,fd44::/48",
            "--nodeport-addresses=10.0.0.0/8",
            "--oom-score-adj=-100",
        ],
        "first.yaml",
    );
    let p = tmp("first.yaml").display().to_string();
    let (second, _) = write_config(&["--config", &p], "second.yaml");
    assert_eq!(first, second);
}

/// kube-proxy's own `--help` (built by `testenv/build`), where present: each of
/// its flags is one we test above, and each of its feature gates we know.
#[test]
fn the_real_kube_proxy_help_lists_nothing_we_miss() {
    // `KNP_TESTENV_BIN` (set by scripts/test: then it must be there),
    // `KNP_KUBE_PROXY`, else a finished build (`.build.*` is one under way).
    if let Some(dir) = std::env::var_os("KNP_TESTENV_BIN") {
        let p = PathBuf::from(dir).join("kube-proxy");
        assert!(
            p.exists(),
            "KNP_TESTENV_BIN has no kube-proxy: {}",
            p.display()
        );
    }
    let Some(kube_proxy) = std::env::var_os("KNP_TESTENV_BIN")
        .map(|d| PathBuf::from(d).join("kube-proxy"))
        .into_iter()
        .chain(std::env::var_os("KNP_KUBE_PROXY").map(PathBuf::from))
        .chain(
            std::fs::read_dir("/var/cache/kube-nlproxy-testenv")
                .ok()
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path().join("kube-proxy")),
        )
        .find(|p| p.exists())
    else {
        // Past libtest's capture, in the form scripts/test counts.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED cli_flags::the_real_kube_proxy_help_lists_nothing_we_miss: \
             no kube-proxy under /var/cache/kube-nlproxy-testenv (run testenv/build)"
        );
        return;
    };
    let out = Command::new(&kube_proxy).arg("--help").output().unwrap();
    let help =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let flags = upstream_flags(&help);
    assert!(flags.len() > 50, "{help}");
    for flag in &flags {
        let known = SAMPLES.iter().any(|(f, _, _)| f == flag) || SPECIAL.contains(&flag.as_str());
        assert!(
            known,
            "kube-proxy has {flag}, which this test does not cover ({})",
            kube_proxy.display()
        );
    }
    // kube-proxy's own --write-config-to loads here (its `mode: iptables` aside),
    // and ours loads in kube-proxy.
    let theirs = tmp("theirs.yaml");
    let out = Command::new(&kube_proxy)
        .args(["--write-config-to", &theirs.display().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let t = std::fs::read_to_string(&theirs)
        .unwrap()
        .replace("mode: iptables", "mode: nftables");
    std::fs::write(&theirs, t).unwrap();
    let (ours, stderr) = write_config(&["--config", &theirs.display().to_string()], "ours.yaml");
    assert!(!stderr.lines().any(|l| l.starts_with('W')), "{stderr}");
    let out = Command::new(&kube_proxy)
        .args(["--config", &tmp("ours.yaml").display().to_string()])
        .args([
            "--write-config-to",
            &tmp("theirs-again.yaml").display().to_string(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{ours}\n{}", text(&out));
    // Each gate at its default, all at once: accepted.
    let gates = upstream_gates(&help);
    assert!(gates.len() > 50, "{help}");
    let arg = format!("--feature-gates={}", gates.join(","));
    let (_, stderr) = write_config(&[&arg], "gates.yaml");
    assert!(!stderr.contains("unrecognized"), "{stderr}");
}

/// `--flag` names at the start of the help's lines (`  -h, --help`, `      --v Level`).
fn upstream_flags(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = match l.strip_prefix('-') {
                Some(rest) if rest.len() > 2 && rest.as_bytes()[1] == b',' => {
                    rest[2..].trim_start()
                }
                _ => l,
            };
            let name = l.strip_prefix("--")?;
            let end = name
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                .unwrap_or(name.len());
            Some(format!("--{}", &name[..end]))
        })
        .collect()
}

/// `Name=true|false (BETA - default=true)` lines of `--feature-gates`, as
/// `Name=default`.
fn upstream_gates(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|l| {
            let l = l.trim();
            let (name, rest) = l.split_once("=true|false (")?;
            let default = rest.split("default=").nth(1)?.split(')').next()?;
            Some(format!("{name}={default}"))
        })
        .collect()
}

/// Every flag the README names is one `help` lists (cargo's own flags in its
/// build lines aside), and every command it lists is one `help` knows.
#[test]
fn the_readme_names_only_flags_and_commands_help_lists() {
    const CARGO: &[&str] = &["--bench", "--release", "--profile"];
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let commands = ["run", "plan", "explain", "status", "cleanup"];
    let mut help = String::from_utf8_lossy(&run(&["help"]).stdout).into_owned();
    for c in commands {
        let out = run(&["help", c]);
        assert!(out.status.success(), "help {c}: {}", text(&out));
        help += &String::from_utf8_lossy(&out.stdout);
    }
    let listed: std::collections::BTreeSet<&str> = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
        .filter(|w| w.starts_with("--"))
        .collect();
    let re = regex::Regex::new(r"--[a-z][a-z0-9-]*").unwrap();
    let mut missing = Vec::new();
    for m in re.find_iter(&readme) {
        let flag = m.as_str();
        let known = if flag.ends_with('-') {
            // A family: `--conntrack-*`.
            listed.iter().any(|l| l.starts_with(flag))
        } else {
            listed.contains(flag) || CARGO.contains(&flag)
        };
        if !known && !missing.contains(&flag) {
            missing.push(flag);
        }
    }
    assert!(
        missing.is_empty(),
        "README names flags help does not list: {missing:?}"
    );
    // The command table's first words.
    let table: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("kube-nlproxy "))
        .filter_map(|l| l.split_whitespace().next())
        .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
        .collect();
    assert!(table.len() >= 5, "{table:?}");
    for w in table {
        assert!(
            commands.contains(&w),
            "README's command {w:?} is not one help knows"
        );
    }
}
