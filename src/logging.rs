//! Logs as Kubernetes components write them: klog's text lines by default,
//! component-base's JSON lines with `--logging-format json`, klog's verbosity
//! (`-v`, `--vmodule`), written whole to stderr, never with colour codes.
//!
//! ```text
//! I1202 17:00:00.000000    1234 daemon.rs:123] "Synced" services=12 took="3ms"
//! {"ts":1764694800.000000,"caller":"daemon.rs:123","msg":"Synced","v":0,"services":12,"took":"3ms"}
//! ```
//!
//! Levels map to klog's verbosity: ERROR, WARN and INFO are V(0) (E, W, I), DEBUG is
//! V(2) and TRACE V(4) (both I). For the CLI commands, whose output is on stdout,
//! INFO is V(1): they print no INFO line unless `-v` is given.

use std::fmt::{self, Write as _};
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer};

use crate::config::LogFormat;
use crate::config::value::go_quote;

/// How to log.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// klog text or component-base JSON.
    pub format: LogFormat,
    /// `-v`.
    pub verbosity: u8,
    /// `--vmodule`: (pattern, level); the first pattern that matches a call site
    /// sets its level.
    pub vmodule: Vec<(String, u8)>,
    /// `--skip-headers` (text).
    pub skip_headers: bool,
    /// `--add-dir-header` (text): the file's directory in the header.
    pub add_dir_header: bool,
    /// A CLI command: INFO lines need `-v` 1 or more.
    pub quiet_info: bool,
    /// Filter by `verbosity`/`vmodule` (false when `RUST_LOG` filters instead).
    pub filter: bool,
}

/// The klog verbosity of a line at `level` (`quiet_info`: INFO is V(1)).
pub fn v_of(level: &Level, quiet_info: bool) -> u8 {
    match *level {
        Level::ERROR | Level::WARN => 0,
        Level::INFO => u8::from(quiet_info),
        Level::DEBUG => 2,
        Level::TRACE => 4,
    }
}

/// `*` and `?` globs.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match (pattern.first(), text.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob(&pattern[1..], text) || (!text.is_empty() && glob(pattern, &text[1..]))
        }
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &text[1..]),
        (Some(p), Some(t)) if p == t => glob(&pattern[1..], &text[1..]),
        _ => false,
    }
}

/// Whether a `--vmodule` pattern names this call site: its file name without
/// `.rs` (`daemon`), its path when the pattern has a `/` (`src/sync/*`), its module
/// path (`kube_nlproxy::sync::runner`) or that path's last part (`runner`), or a
/// module above it (`kube_nlproxy::sync`).
pub fn vmodule_matches(pattern: &str, meta: &Metadata<'_>) -> bool {
    let p = pattern.as_bytes();
    if let Some(file) = meta.file() {
        let path = file.strip_suffix(".rs").unwrap_or(file);
        let stem = path.rsplit('/').next().unwrap_or(path);
        if glob(p, stem.as_bytes()) || (pattern.contains('/') && glob(p, path.as_bytes())) {
            return true;
        }
        if pattern.contains('/') && glob(p, file.as_bytes()) {
            return true;
        }
    }
    let module = meta.module_path().unwrap_or(meta.target());
    let last = module.rsplit("::").next().unwrap_or(module);
    glob(p, module.as_bytes())
        || glob(p, last.as_bytes())
        || module.starts_with(&format!("{pattern}::"))
}

impl Options {
    /// The verbosity that applies at a call site.
    fn level_at(&self, meta: &Metadata<'_>) -> u8 {
        self.vmodule
            .iter()
            .find(|(p, _)| vmodule_matches(p, meta))
            .map_or(self.verbosity, |(_, n)| *n)
    }

    /// Whether a call site logs.
    pub fn enabled(&self, meta: &Metadata<'_>) -> bool {
        !self.filter || v_of(meta.level(), self.quiet_info) <= self.level_at(meta)
    }
}

/// The layer that formats and writes each event.
pub struct KlogLayer<W> {
    opts: Options,
    writer: W,
    pid: u32,
}

impl<W> KlogLayer<W> {
    /// A layer writing to `writer`.
    pub fn new(opts: Options, writer: W) -> Self {
        KlogLayer {
            opts,
            writer,
            pid: std::process::id(),
        }
    }
}

impl<S, W> Layer<S> for KlogLayer<W>
where
    S: Subscriber,
    W: for<'a> MakeWriter<'a> + 'static,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.opts.enabled(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        self.opts.enabled(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        if !self.opts.filter {
            return None;
        }
        let top = self
            .opts
            .vmodule
            .iter()
            .map(|(_, n)| *n)
            .chain([self.opts.verbosity])
            .max()
            .unwrap_or(0);
        Some(match top {
            0 if self.opts.quiet_info => LevelFilter::WARN,
            0 | 1 => LevelFilter::INFO,
            2 | 3 => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        })
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let line = format_event(&self.opts, self.pid, SystemTime::now(), event);
        // One write per line: lines from several threads never interleave.
        let _ = self.writer.make_writer().write_all(line.as_bytes());
    }
}

/// A value of a key.
enum Val {
    /// A string: quoted.
    Str(String),
    /// A number or a boolean: as is.
    Raw(String),
}

#[derive(Default)]
struct Fields {
    msg: String,
    kvs: Vec<(String, Val)>,
}

impl Fields {
    fn key(field: &Field) -> String {
        match field.name() {
            "error" | "err" => "err".into(),
            n => n.to_string(),
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.msg = value.to_string();
        } else {
            self.kvs
                .push((Self::key(field), Val::Str(value.to_string())));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.kvs
            .push((Self::key(field), Val::Str(error_chain(value))));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.kvs
            .push((Self::key(field), Val::Raw(value.to_string())));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.kvs
            .push((Self::key(field), Val::Raw(value.to_string())));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.kvs
            .push((Self::key(field), Val::Raw(value.to_string())));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        let v = if value.is_finite() {
            Val::Raw(value.to_string())
        } else {
            Val::Str(value.to_string())
        };
        self.kvs.push((Self::key(field), v));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.msg = format!("{value:?}");
        } else {
            self.kvs
                .push((Self::key(field), Val::Str(format!("{value:?}"))));
        }
    }
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// One line, newline included.
pub fn format_event(opts: &Options, pid: u32, now: SystemTime, event: &Event<'_>) -> String {
    let mut fields = Fields::default();
    event.record(&mut fields);
    let meta = event.metadata();
    let file = meta.file().unwrap_or("???");
    let line = meta.line().unwrap_or(1);
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    match opts.format {
        LogFormat::Text => text_line(opts, pid, since, meta, file, line, &fields),
        LogFormat::Json => json_line(opts, since, meta, file, line, &fields),
    }
}

fn text_line(
    opts: &Options,
    pid: u32,
    since: std::time::Duration,
    meta: &Metadata<'_>,
    file: &str,
    line: u32,
    fields: &Fields,
) -> String {
    let mut out = String::with_capacity(128);
    if !opts.skip_headers {
        let severity = match *meta.level() {
            Level::ERROR => 'E',
            Level::WARN => 'W',
            _ => 'I',
        };
        let secs = since.as_secs() as i64;
        let (_, month, day) = civil(secs.div_euclid(86_400));
        let tod = secs.rem_euclid(86_400);
        let shown = if opts.add_dir_header {
            file
        } else {
            file.rsplit('/').next().unwrap_or(file)
        };
        let _ = write!(
            out,
            "{severity}{month:02}{day:02} {:02}:{:02}:{:02}.{:06} {pid:>7} {shown}:{line}] ",
            tod / 3600,
            (tod / 60) % 60,
            tod % 60,
            since.subsec_micros()
        );
    }
    out.push_str(&go_quote(&fields.msg));
    for (k, v) in &fields.kvs {
        match v {
            Val::Raw(s) => {
                let _ = write!(out, " {k}={s}");
            }
            // klog writes a multi-line string as an indented block.
            Val::Str(s) if s.contains('\n') => {
                let _ = writeln!(out, " {k}=<");
                for l in s.trim_end_matches('\n').split('\n') {
                    let _ = writeln!(out, "\t{l}");
                }
                out.push_str(" >");
            }
            Val::Str(s) => {
                let _ = write!(out, " {k}={}", go_quote(s));
            }
        }
    }
    out.push('\n');
    out
}

fn json_line(
    opts: &Options,
    since: std::time::Duration,
    meta: &Metadata<'_>,
    file: &str,
    line: u32,
    fields: &Fields,
) -> String {
    let js = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let base = file.rsplit('/').next().unwrap_or(file);
    let mut out = format!(
        "{{\"ts\":{}.{:06},\"caller\":{},\"msg\":{}",
        since.as_secs(),
        since.subsec_micros(),
        js(&format!("{base}:{line}")),
        js(&fields.msg)
    );
    // component-base: error lines carry "err" and no "v".
    if *meta.level() != Level::ERROR {
        let _ = write!(out, ",\"v\":{}", v_of(meta.level(), opts.quiet_info));
    }
    for (k, v) in &fields.kvs {
        let value = match v {
            Val::Raw(s) => s.clone(),
            // The start-up line's configuration is an object, not a string.
            Val::Str(s) if k == "config" && s.starts_with('{') => {
                match serde_json::from_str::<serde_json::Value>(s) {
                    Ok(obj) => obj.to_string(),
                    Err(_) => js(s),
                }
            }
            Val::Str(s) => js(s),
        };
        let _ = write!(out, ",{}:{value}", js(k));
    }
    out.push_str("}\n");
    out
}

/// An error and its causes, `a: b: c`, each said once: a cause whose text the
/// message so far already holds is not repeated.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// Installs the logger on stderr. `RUST_LOG`, when set, filters instead of
/// `-v`/`--vmodule` (a developer's override).
pub fn init(mut opts: Options) {
    use tracing_subscriber::layer::SubscriberExt;
    let env = std::env::var("RUST_LOG")
        .ok()
        .filter(|s| !s.is_empty())
        .and_then(|s| tracing_subscriber::EnvFilter::try_new(s).ok());
    opts.filter = env.is_none();
    let layer = KlogLayer::new(opts, std::io::stderr);
    let registry = tracing_subscriber::registry().with(layer);
    let result = match env {
        Some(filter) => tracing::subscriber::set_global_default(registry.with(filter)),
        None => tracing::subscriber::set_global_default(registry),
    };
    if let Err(e) = result {
        eprintln!("kube-nlproxy: cannot install the logger: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    fn capture(opts: Options, f: impl FnOnce()) -> String {
        let out = Captured::default();
        let sub = tracing_subscriber::registry().with(KlogLayer::new(opts, out.clone()));
        tracing::subscriber::with_default(sub, f);
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    fn opts(format: LogFormat, v: u8) -> Options {
        Options {
            format,
            verbosity: v,
            filter: true,
            ..Options::default()
        }
    }

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "cannot open: {}", self.0)
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn klog_text_lines() {
        let out = capture(opts(LogFormat::Text, 0), || {
            tracing::info!(services = 12, name = "web", ok = true, "Synced");
            tracing::warn!("careful \"x\"");
            tracing::error!(error = %"boom", "Failed");
            tracing::debug!("hidden at -v=0");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        let re_head = |l: &str, sev: char| {
            let b = l.as_bytes();
            assert_eq!(b[0] as char, sev, "{l}");
            assert!(b[1..5].iter().all(u8::is_ascii_digit), "{l}");
            assert_eq!(&l[5..6], " ");
            assert_eq!(&l[8..9], ":");
            assert_eq!(&l[14..15], ".");
            assert_eq!(&l[21..22], " ");
            let pid = format!("{:>7}", std::process::id());
            assert_eq!(&l[22..29], pid, "{l}");
            assert!(l[30..].starts_with("logging.rs:"), "{l}");
        };
        re_head(lines[0], 'I');
        assert!(
            lines[0].ends_with(r#"] "Synced" services=12 name="web" ok=true"#),
            "{}",
            lines[0]
        );
        re_head(lines[1], 'W');
        assert!(lines[1].ends_with(r#"] "careful \"x\"""#), "{}", lines[1]);
        re_head(lines[2], 'E');
        assert!(
            lines[2].ends_with(r#"] "Failed" err="boom""#),
            "{}",
            lines[2]
        );
        assert!(!out.contains('\x1b'));
    }

    #[test]
    fn component_base_json_lines() {
        let out = capture(opts(LogFormat::Json, 4), || {
            tracing::info!(services = 12, "Synced");
            tracing::debug!(name = "web", "Detail");
            tracing::trace!("Deep");
            tracing::error!(error = %"boom", "Failed");
        });
        let v: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(v.len(), 4, "{out}");
        assert!(v[0]["ts"].as_f64().unwrap() > 1.7e9);
        assert!(v[0]["caller"].as_str().unwrap().starts_with("logging.rs:"));
        assert_eq!(v[0]["msg"], "Synced");
        assert_eq!(v[0]["v"], 0);
        assert_eq!(v[0]["services"], 12);
        assert_eq!(v[1]["v"], 2);
        assert_eq!(v[1]["name"], "web");
        assert_eq!(v[2]["v"], 4);
        assert_eq!(v[3]["err"], "boom");
        assert!(v[3].get("v").is_none(), "error lines have no v");
        let keys: Vec<&String> = v[0].as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 5);
        assert!(out.lines().next().unwrap().starts_with("{\"ts\":"));
    }

    #[test]
    fn verbosity_and_vmodule() {
        let out = capture(opts(LogFormat::Text, 2), || {
            tracing::debug!("debug shown at 2");
            tracing::trace!("trace hidden at 2");
        });
        assert_eq!(out.lines().count(), 1, "{out}");
        let mut o = opts(LogFormat::Text, 0);
        o.vmodule = vec![("logg*".into(), 4)];
        let out = capture(o, || tracing::trace!("trace shown by vmodule"));
        assert_eq!(out.lines().count(), 1, "{out}");
        let mut o = opts(LogFormat::Text, 0);
        o.vmodule = vec![("kube_nlproxy::logging".into(), 2)];
        let out = capture(o, || {
            tracing::debug!("by module path");
            tracing::trace!("not at 2");
        });
        assert_eq!(out.lines().count(), 1, "{out}");
        let mut o = opts(LogFormat::Text, 0);
        o.quiet_info = true;
        let out = capture(o, || {
            tracing::info!("quiet");
            tracing::warn!("warnings still");
        });
        assert_eq!(out.lines().count(), 1, "{out}");
    }

    #[test]
    fn headers_and_multiline() {
        let mut o = opts(LogFormat::Text, 0);
        o.skip_headers = true;
        let out = capture(o, || tracing::info!(table = "a\nb", "Dump"));
        assert_eq!(out, "\"Dump\" table=<\n\ta\n\tb\n >\n");
    }

    #[test]
    fn dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(20_424), (2025, 12, 2));
        assert_eq!(civil(11_016), (2000, 2, 29));
    }

    #[test]
    fn causes_are_said_once() {
        let e = Outer(std::io::Error::other("disk full"));
        assert_eq!(error_chain(&e), "cannot open: disk full");
        #[derive(Debug)]
        struct Plain(std::io::Error);
        impl fmt::Display for Plain {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("cannot open")
            }
        }
        impl std::error::Error for Plain {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Plain(std::io::Error::other("disk full"));
        assert_eq!(error_chain(&e), "cannot open: disk full");
    }
}
