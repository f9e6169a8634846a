//! Hostile input for the file source: truncated, binary, non-Kubernetes, alias-bomb,
//! deeply nested and huge files next to good manifests. Each case checks that the
//! load returns (no panic, no hang), that the good Service is still there and in the
//! model, that the bad file gives exactly one warning naming it, and that peak memory
//! grows by less than a generous bound. Needs neither root nor network namespaces.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kube_nlproxy::model::{self, BuildOptions, IpFamily, Protocol, ServicePortName};
use kube_nlproxy::source::Objects;
use kube_nlproxy::source::file::{MAX_FILE_BYTES, load_path};

/// The good manifests every case's directory holds.
const GOOD: &str = r#"apiVersion: v1
kind: Service
metadata: {name: good, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: good-1
  namespace: default
  labels: {kubernetes.io/service-name: good}
addressType: IPv4
endpoints: [{addresses: [10.244.0.5]}]
ports: [{name: http, port: 8080}]
"#;

/// Peak-memory growth allowed for one load, far below what the inputs could reach
/// without limits (serde_yaml: 24 GB for the truncated file).
const MAX_GROWTH_BYTES: u64 = 1 << 30;

/// No load may take longer than this (a debug build parses 50 MB in well under it).
const TIMEOUT: Duration = Duration::from_secs(300);

/// Cases run one at a time so that each one's peak memory is its own: every test
/// holds this for its whole run.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(case: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("knp-bad-input-{}-{case}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("good.yaml"), GOOD).unwrap();
        TempDir(dir)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `/proc/self/status` field in bytes (`VmHWM`, `VmRSS`).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

/// What one load gave.
struct Outcome {
    objects: Objects,
    warnings: Vec<String>,
    peak_growth: u64,
}

/// `load_path(dir)` on its own thread: a panic or a hang fails the test instead of
/// taking the test binary down.
fn load(dir: &TempDir) -> Outcome {
    // Reset the peak to the current RSS (Linux >= 4.0). The growth reads low when the
    // load reuses heap freed by an earlier case (or the reset is refused), but
    // unbounded growth cannot hide: it would pass any earlier peak.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status_bytes("VmHWM");
    let path = dir.0.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(load_path(&path));
    });
    let result = match rx.recv_timeout(TIMEOUT) {
        Ok(r) => r,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("load_path hung"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("load_path panicked"),
    };
    let took = start.elapsed();
    let peak_growth = status_bytes("VmHWM").saturating_sub(before);
    eprintln!(
        "{}: {took:?}, peak +{} MiB",
        dir.0.display(),
        peak_growth >> 20
    );
    let (objects, warnings) = result.expect("a readable directory loads");
    assert!(
        peak_growth < MAX_GROWTH_BYTES,
        "peak memory grew by {} MiB",
        peak_growth >> 20
    );
    Outcome {
        objects,
        warnings,
        peak_growth,
    }
}

fn service_names(o: &Objects) -> Vec<&str> {
    o.services
        .iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .collect()
}

/// The good Service is loaded and reaches the model with its endpoint.
fn assert_good_service(o: &Outcome) {
    assert!(
        service_names(&o.objects).contains(&"good"),
        "good Service missing; warnings: {:?}",
        o.warnings
    );
    let (state, _) = model::build(
        &o.objects,
        &BuildOptions {
            node_name: "node-a".into(),
            node_ips_override: vec![],
            primary_node_ip: None,
            ignore_external_ips: false,
        },
    );
    let good = ServicePortName {
        namespace: "default".into(),
        name: "good".into(),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
    };
    let sp = &state.services[&(good.clone(), IpFamily::V4)];
    assert_eq!(sp.port, 80);
    assert_eq!(sp.cluster_ip, Some("10.96.0.10".parse().unwrap()));
    let eps = &state.endpoints[&good];
    assert_eq!(eps.len(), 1);
    assert_eq!(eps[0].port, 8080);
}

/// Exactly one warning, and it names `file` and contains `what`.
fn assert_one_warning(o: &Outcome, file: &Path, what: &str) {
    assert_eq!(o.warnings.len(), 1, "{:#?}", o.warnings);
    let w = &o.warnings[0];
    assert!(w.contains(&file.display().to_string()), "{w}");
    assert!(w.contains(what), "{w}");
}

/// A bad file beside the good one: one warning naming it, the good Service intact.
fn bad_file_case(case: &str, contents: &[u8], what: &str) -> Outcome {
    let dir = TempDir::new(case);
    let bad = dir.path("bad.yaml");
    std::fs::write(&bad, contents).unwrap();
    let o = load(&dir);
    assert_good_service(&o);
    assert_one_warning(&o, &bad, what);
    o
}

#[test]
fn truncated_yaml_is_one_warning_and_keeps_earlier_documents() {
    let _serial = serial();
    // serde_yaml yielded this error forever: the load allocated until OOM.
    let o = bad_file_case("truncated", b"just: a\nrandom: [document", "line 2");
    assert_eq!(service_names(&o.objects), ["good"]);

    // The documents before the syntax error are kept.
    let dir = TempDir::new("truncated-after");
    let bad = dir.path("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: Service\nmetadata: {name: before, namespace: default}\n\
         spec: {clusterIP: 10.96.0.11, ports: [{port: 81}]}\n---\njust: a\nrandom: [document",
    )
    .unwrap();
    let o = load(&dir);
    assert_good_service(&o);
    assert_one_warning(&o, &bad, "line 7");
    assert_eq!(service_names(&o.objects), ["before", "good"]);
}

/// Deterministic bytes: xorshift, with NULs and invalid UTF-8 throughout.
fn random_bytes(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out[0] = 0;
    out
}

#[test]
fn binary_file_is_one_warning() {
    let _serial = serial();
    let o = bad_file_case("binary", &random_bytes(1 << 20), "not UTF-8");
    assert_eq!(service_names(&o.objects), ["good"]);
}

#[test]
fn nul_bytes_in_utf8_text_are_one_warning() {
    let _serial = serial();
    let o = bad_file_case(
        "nul",
        b"apiVersion: v1\nkind: Service\x00\x00\nmetadata: {name: x}\n",
        "bad.yaml",
    );
    assert_eq!(service_names(&o.objects), ["good"]);
}

#[test]
fn yaml_that_is_not_kubernetes_is_one_warning() {
    let _serial = serial();
    let o = bad_file_case("not-k8s", b"just: a\n", "unsupported object kind");
    assert_eq!(service_names(&o.objects), ["good"]);
    // A scalar or a list as a document, and a Service of the wrong shape.
    bad_file_case("scalar", b"just a string\n", "not an object");
    bad_file_case(
        "wrong-shape",
        b"apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: default}\nspec: [1, 2]\n",
        "Service default/s: spec: invalid type: sequence",
    );
}

#[test]
fn alias_bomb_is_one_warning() {
    let _serial = serial();
    // "Billion laughs": nine levels of nine aliases, 9^9 strings when expanded.
    let mut text = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    let levels = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for pair in levels.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        let refs = vec![format!("*{prev}"); 9].join(", ");
        writeln!(text, "{next}: &{next} [{refs}]").unwrap();
    }
    let o = bad_file_case("alias-bomb", text.as_bytes(), "bad.yaml");
    assert!(o.peak_growth < 256 << 20, "{} MiB", o.peak_growth >> 20);

    // The same bomb inside a Service's annotations.
    let mut svc = String::from(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: bomb\n  namespace: default\n  annotations:\n",
    );
    for line in text.lines() {
        writeln!(svc, "    {line}").unwrap();
    }
    svc += "spec: {clusterIP: 10.96.0.12, ports: [{port: 80}]}\n";
    let o = bad_file_case("alias-bomb-svc", svc.as_bytes(), "bad.yaml");
    assert_eq!(service_names(&o.objects), ["good"]);
}

#[test]
fn deep_nesting_is_one_warning() {
    let _serial = serial();
    let o = bad_file_case("deep-flow", "[".repeat(100_000).as_bytes(), "bad.yaml");
    assert!(o.peak_growth < 256 << 20, "{} MiB", o.peak_growth >> 20);
    // Closed, so it is valid YAML, and nested in mappings rather than lists.
    let deep = "{a: ".repeat(100_000) + &"}".repeat(100_000);
    bad_file_case("deep-map", deep.as_bytes(), "bad.yaml");
    // Block style: 200 levels of indentation.
    let mut block = String::new();
    for depth in 0..200 {
        writeln!(block, "{}k{depth}:", " ".repeat(depth)).unwrap();
    }
    bad_file_case("deep-block", block.as_bytes(), "bad.yaml");
}

fn note(n: usize) -> String {
    format!("generated for the bad-input test, service number {n}")
}

fn service(name: &str, n: usize) -> String {
    let (hi, lo) = (n / 250 % 250, n % 250);
    let note = note(n);
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: load\n  \
         labels: {{app: {name}, tier: backend}}\n  \
         annotations: {{note: \"{note}\"}}\n\
         spec:\n  type: ClusterIP\n  clusterIP: 10.100.{hi}.{lo}\n  clusterIPs: [10.100.{hi}.{lo}]\n  \
         selector: {{app: {name}}}\n  ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: 8080}}\n  \
         - {{name: https, port: 443, protocol: TCP, targetPort: 8443}}\n"
    )
}

/// A Service as `kubectl get -o yaml` prints an applied one: with its
/// `last-applied-configuration`, so most of the bytes are in one long scalar.
fn applied_service(name: &str, n: usize) -> String {
    let description = format!("service {n} of the 50 MB test; ").repeat(40);
    let applied = format!(
        r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"annotations":{{"description":"{description}"}},"name":"{name}","namespace":"load"}},"spec":{{"ports":[{{"name":"http","port":80,"targetPort":8080}},{{"name":"https","port":443,"targetPort":8443}}],"selector":{{"app":"{name}"}}}}}}"#
    );
    let flow = format!("  annotations: {{note: \"{}\"}}\n", note(n));
    let block = format!(
        "  annotations:\n    note: \"{}\"\n    kubectl.kubernetes.io/last-applied-configuration: |\n      {applied}\n",
        note(n)
    );
    let doc = service(name, n);
    assert!(doc.contains(&flow));
    doc.replace(&flow, &block)
}

#[test]
fn fifty_megabytes_of_valid_services_load() {
    let _serial = serial();
    let dir = TempDir::new("50mb");
    let file = dir.path("many.yaml");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    let (mut written, mut count) = (0usize, 0usize);
    while written < 50_000_000 {
        let doc = format!("---\n{}", applied_service(&format!("svc-{count}"), count));
        w.write_all(doc.as_bytes()).unwrap();
        written += doc.len();
        count += 1;
    }
    w.flush().unwrap();
    drop(w);
    let o = load(&dir);
    assert!(
        o.warnings.is_empty(),
        "{:?}",
        &o.warnings[..o.warnings.len().min(5)]
    );
    assert_eq!(o.objects.services.len(), count + 1);
    let last = o
        .objects
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(format!("svc-{}", count - 1).as_str()))
        .unwrap();
    let annotations = last.metadata.annotations.as_ref().unwrap();
    assert!(annotations["kubectl.kubernetes.io/last-applied-configuration"].len() > 1000);
    assert_good_service(&o);
    let (state, warnings) = model::build(&o.objects, &BuildOptions::default());
    assert!(
        warnings.is_empty(),
        "{:?}",
        &warnings[..warnings.len().min(5)]
    );
    assert_eq!(state.services.len(), 2 * count + 1);
    eprintln!("50 MB: {count} Services");
}

#[test]
fn file_over_the_limit_is_one_warning_and_not_read() {
    let _serial = serial();
    let dir = TempDir::new("too-large");
    let file = dir.path("huge.yaml");
    // Sparse: no disk space, and the limit is checked before reading.
    let f = std::fs::File::create(&file).unwrap();
    f.set_len(MAX_FILE_BYTES + 1).unwrap();
    drop(f);
    let o = load(&dir);
    assert_good_service(&o);
    assert_one_warning(&o, &file, "larger than 64 MiB");
    assert!(o.peak_growth < 16 << 20, "{} MiB", o.peak_growth >> 20);
}

#[test]
fn names_at_their_length_limits_load() {
    let _serial = serial();
    // Service and namespace names are DNS-1035 labels (63), EndpointSlice and node
    // names DNS-1123 subdomains (253), label keys a 253-character prefix plus a
    // 63-character name, port names IANA service names (15).
    let label = |c: char| c.to_string().repeat(63);
    let subdomain = |c: char| {
        let mut s = [label(c), label(c), label(c)].join(".") + ".";
        s.push_str(&c.to_string().repeat(253 - s.len()));
        s
    };
    let (svc, ns, slice, node) = (label('s'), label('n'), subdomain('e'), subdomain('h'));
    let key = format!("{}/{}", subdomain('k'), label('v'));
    assert_eq!((svc.len(), slice.len(), key.len()), (63, 253, 317));
    let port = "p".repeat(15);
    let text = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {svc}\n  namespace: {ns}\n  labels: {{{key}: {v}}}\n\
         spec:\n  clusterIP: 10.96.1.1\n  ports: [{{name: {port}, port: 80}}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {slice}\n  namespace: {ns}\n  \
         labels: {{kubernetes.io/service-name: {svc}, {key}: {v}}}\naddressType: IPv4\n\
         endpoints: [{{addresses: [10.244.1.1], nodeName: {node}}}]\nports: [{{name: {port}, port: 8080}}]\n",
        v = label('v'),
    );
    let dir = TempDir::new("long-names");
    std::fs::write(dir.path("long.yaml"), text).unwrap();
    let o = load(&dir);
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert_good_service(&o);
    assert!(
        o.objects
            .endpoint_slices
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some(slice.as_str()))
    );
    let (state, warnings) = model::build(
        &o.objects,
        &BuildOptions {
            node_name: node.clone(),
            node_ips_override: vec![],
            primary_node_ip: None,
            ignore_external_ips: false,
        },
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    let spn = ServicePortName {
        namespace: ns.into(),
        name: svc.into(),
        port_name: port.into(),
        protocol: Protocol::Tcp,
    };
    assert!(state.services.contains_key(&(spn.clone(), IpFamily::V4)));
    assert!(state.endpoints[&spn][0].is_local);
}

#[test]
fn ten_thousand_endpoints_in_one_slice_load() {
    let _serial = serial();
    let mut text = String::from(
        "apiVersion: v1\nkind: Service\nmetadata: {name: big, namespace: load}\n\
         spec: {clusterIP: 10.96.2.1, ports: [{port: 80}]}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: big-1\n  \
         namespace: load\n  labels: {kubernetes.io/service-name: big}\naddressType: IPv4\n\
         ports: [{port: 8080}]\nendpoints:\n",
    );
    for i in 0..10_000 {
        writeln!(
            text,
            "- addresses: [10.{}.{}.{}]\n  conditions: {{ready: true, serving: true, terminating: false}}\n  \
             nodeName: node-{}\n  zone: zone-{}\n  targetRef: {{kind: Pod, namespace: load, name: big-{i}}}",
            i / 65536 + 1,
            i / 256 % 256,
            i % 256,
            i % 50,
            i % 3
        )
        .unwrap();
    }
    let dir = TempDir::new("10k-endpoints");
    std::fs::write(dir.path("big.yaml"), text).unwrap();
    let o = load(&dir);
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert_good_service(&o);
    let slice = o
        .objects
        .endpoint_slices
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("big-1"))
        .unwrap();
    assert_eq!(slice.endpoints.len(), 10_000);
    let (state, _) = model::build(&o.objects, &BuildOptions::default());
    let spn = ServicePortName {
        namespace: "load".into(),
        name: "big".into(),
        port_name: "".into(),
        protocol: Protocol::Tcp,
    };
    assert_eq!(state.endpoints[&spn].len(), 10_000);
}

#[test]
fn ten_thousand_services_in_one_list_load() {
    let _serial = serial();
    // As `kubectl get services -A -o yaml` prints them: one List document.
    let mut text =
        String::from("apiVersion: v1\nkind: List\nmetadata: {resourceVersion: \"\"}\nitems:\n");
    for i in 0..10_000 {
        for (j, line) in service(&format!("svc-{i}"), i).lines().enumerate() {
            let indent = if j == 0 { "- " } else { "  " };
            writeln!(text, "{indent}{line}").unwrap();
        }
    }
    let dir = TempDir::new("10k-services");
    std::fs::write(dir.path("list.yaml"), text).unwrap();
    let o = load(&dir);
    assert!(
        o.warnings.is_empty(),
        "{:?}",
        &o.warnings[..o.warnings.len().min(5)]
    );
    assert_eq!(o.objects.services.len(), 10_001);
    assert_good_service(&o);
    let (state, _) = model::build(&o.objects, &BuildOptions::default());
    // Two ports each, plus the good one.
    assert_eq!(state.services.len(), 20_001);
}

#[test]
fn many_bad_documents_give_bounded_warnings() {
    let _serial = serial();
    // Twenty thousand tiny bad documents: the warnings are capped per file.
    let dir = TempDir::new("many-bad");
    let file = dir.path("bad.yaml");
    std::fs::write(&file, "---\njust: a\n".repeat(20_000)).unwrap();
    let o = load(&dir);
    assert_good_service(&o);
    let cap = kube_nlproxy::source::file::MAX_WARNINGS_PER_FILE;
    assert_eq!(o.warnings.len(), cap + 1);
    assert!(o.warnings.iter().all(|w| w.contains("bad.yaml")));
    assert!(
        o.warnings[cap].contains("19900 more warnings"),
        "{}",
        o.warnings[cap]
    );
}

#[test]
fn bad_objects_are_one_warning_each_naming_object_and_field() {
    let _serial = serial();
    let dir = TempDir::new("bad-objects");
    let file = dir.path("objects.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Service\nmetadata: {name: typo, namespace: default}\n\
         spec: {clusterIP: 10.96.3.1, ports: [{port: eighty}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: np, namespace: default}\n\
         spec: {type: NodePort, clusterIP: 10.96.3.2, ports: [{port: 80, nodePort: 99999}]}\n",
    )
    .unwrap();
    let o = load(&dir);
    assert_good_service(&o);
    // The parser skips the object that does not fit its type...
    assert_one_warning(&o, &file, "Service default/typo: spec.ports[0].port");
    // ...and the model keeps what it can of one with a field out of range.
    let (state, warnings) = model::build(&o.objects, &BuildOptions::default());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        (warnings[0].object.as_str(), warnings[0].field.as_str()),
        ("Service default/np", "spec.ports[0].nodePort")
    );
    let np = ServicePortName {
        namespace: "default".into(),
        name: "np".into(),
        port_name: "".into(),
        protocol: Protocol::Tcp,
    };
    let sp = &state.services[&(np, IpFamily::V4)];
    assert_eq!(sp.cluster_ip, Some("10.96.3.2".parse().unwrap()));
    assert_eq!((sp.port, sp.node_port), (80, None));
}
