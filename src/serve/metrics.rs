//! Metrics under kube-proxy's names (`pkg/proxy/metrics/metrics.go`), so dashboards
//! and alerts written for kube-proxy keep working, plus a few of our own
//! (`kube_nlproxy_*`). Rendered in the Prometheus text exposition format 0.0.4.
//!
//! Metrics upstream labels by `ip_family` get one series per configured family. We
//! sync both families in one transaction, so a sync is observed once per family, as
//! a dual-stack kube-proxy (one proxier per family) would report it. Unlike
//! client_golang, every family is printed (HELP/TYPE) from the start, and the
//! `ip_family` series start at 0 instead of appearing on first use.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::format::go_float;
use super::health::{Clock, SystemClock, family_name};
use crate::model::IpFamily;

/// `metrics.ExponentialBuckets(0.001, 2, 15)`: 1 ms … 16.384 s.
pub fn sync_duration_buckets() -> Vec<f64> {
    let mut b = Vec::with_capacity(15);
    let mut v = 0.001;
    for _ in 0..15 {
        b.push(v);
        v *= 2.0;
    }
    b
}

/// `metrics.MergeBuckets(LinearBuckets(0.25, 0.25, 2), LinearBuckets(1, 1, 59),
/// LinearBuckets(60, 5, 12), LinearBuckets(120, 30, 7))`. `MergeBuckets` starts
/// from a one-element slice, so the first bound is 0.
pub fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.0];
    for (start, width, count) in [
        (0.25, 0.25, 2),
        (1.0, 1.0, 59),
        (60.0, 5.0, 12),
        (120.0, 30.0, 7),
    ] {
        let mut v: f64 = start;
        for _ in 0..count {
            b.push(v);
            v += width;
        }
    }
    b
}

/// A cumulative histogram with fixed upper bounds (`le` inclusive).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    /// Non-cumulative count per bound; the last slot is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: Vec<f64>) -> Self {
        let n = bounds.len();
        Histogram {
            bounds,
            counts: vec![0; n + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Record one value.
    pub fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// `(le, cumulative count)` per bound, then `(+Inf, count)`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        let mut out = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            acc += c;
            out.push((self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc));
        }
        out
    }

    /// Sum of observed values.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Which Local traffic policy a service without local endpoints has
/// (`traffic_policy` label of `kubeproxy_sync_proxy_rules_no_local_endpoints_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TrafficPolicy {
    /// `internalTrafficPolicy: Local`.
    Internal,
    /// `externalTrafficPolicy: Local`.
    External,
}

impl TrafficPolicy {
    fn label(self) -> &'static str {
        match self {
            TrafficPolicy::Internal => "internal",
            TrafficPolicy::External => "external",
        }
    }
}

#[derive(Debug, Clone)]
struct PerFamily {
    sync_duration: Histogram,
    network_programming: Histogram,
    last_sync: f64,
    last_queued: f64,
    nftables_sync_failures: u64,
    no_local_internal: u64,
    no_local_external: u64,
    conntrack_deleted: u64,
}

#[derive(Debug)]
struct Inner {
    families: BTreeMap<IpFamily, PerFamily>,
    endpoint_changes_pending: u64,
    endpoint_changes_total: u64,
    service_changes_pending: u64,
    service_changes_total: u64,
    healthz: BTreeMap<u16, u64>,
    livez: BTreeMap<u16, u64>,
    netlink_messages: BTreeMap<String, u64>,
    sync_operations: BTreeMap<String, u64>,
    /// kube-proxy's objects found in the kernel, by backend.
    kube_proxy_state: BTreeMap<&'static str, u64>,
    /// Problems with our Node (missing, no address of a family NodePorts need).
    node_problems: u64,
}

/// All metrics of the process (shared as `Arc<Metrics>`).
#[derive(Debug)]
pub struct Metrics {
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
    /// What `/status` serves.
    pub status: super::status::Status,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn secs(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

impl Metrics {
    /// Metrics for both families, on the system clock.
    pub fn new() -> Self {
        let m = Metrics {
            clock: Arc::new(SystemClock),
            inner: Mutex::new(Inner {
                families: BTreeMap::new(),
                endpoint_changes_pending: 0,
                endpoint_changes_total: 0,
                service_changes_pending: 0,
                service_changes_total: 0,
                healthz: BTreeMap::new(),
                livez: BTreeMap::new(),
                netlink_messages: BTreeMap::new(),
                sync_operations: BTreeMap::new(),
                kube_proxy_state: BTreeMap::new(),
                node_problems: 0,
            }),
            status: Default::default(),
        };
        m.with_families(&IpFamily::ALL)
    }

    /// Label `ip_family` series with these families only (default: both).
    #[must_use]
    pub fn with_families(self, families: &[IpFamily]) -> Self {
        {
            let mut inner = self.inner.lock().unwrap();
            inner.families = families
                .iter()
                .map(|f| {
                    (
                        *f,
                        PerFamily {
                            sync_duration: Histogram::new(sync_duration_buckets()),
                            network_programming: Histogram::new(network_programming_buckets()),
                            last_sync: 0.0,
                            last_queued: 0.0,
                            nftables_sync_failures: 0,
                            no_local_internal: 0,
                            no_local_external: 0,
                            conntrack_deleted: 0,
                        },
                    )
                })
                .collect();
        }
        self
    }

    /// Use `clock` for the `*_timestamp_seconds` gauges.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The clock behind the timestamps (and the `Date` of the metrics server).
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    fn each_family(&self, f: impl Fn(&mut PerFamily)) {
        let mut inner = self.inner.lock().unwrap();
        for pf in inner.families.values_mut() {
            f(pf);
        }
    }

    fn one_family(&self, family: IpFamily, f: impl FnOnce(&mut PerFamily)) {
        if let Some(pf) = self.inner.lock().unwrap().families.get_mut(&family) {
            f(pf);
        }
    }

    /// `kubeproxy_sync_proxy_rules_duration_seconds`: how long one sync took.
    pub fn observe_sync_duration(&self, d: Duration) {
        self.each_family(|pf| pf.sync_duration.observe(d.as_secs_f64()));
    }

    /// `kubeproxy_network_programming_duration_seconds{ip_family}`: from an
    /// EndpointSlice's last change trigger time (its annotation) to the sync that
    /// programmed it, in the series of the slice's family only (upstream observes
    /// it in the proxier of that family, the one whose tracker saw the slice).
    pub fn observe_network_programming(&self, family: IpFamily, d: Duration) {
        self.one_family(family, |pf| pf.network_programming.observe(d.as_secs_f64()));
    }

    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds` = now: a sync succeeded.
    pub fn set_last_sync_now(&self) {
        let now = secs(self.clock.now());
        self.each_family(|pf| pf.last_sync = now);
    }

    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` = now: a sync was
    /// requested (also set when the sync loop starts, as upstream's `SyncLoop`).
    pub fn set_last_queued_now(&self) {
        let now = secs(self.clock.now());
        self.each_family(|pf| pf.last_queued = now);
    }

    /// `kubeproxy_sync_proxy_rules_endpoint_changes_total` += `n`.
    pub fn add_endpoint_changes(&self, n: u64) {
        self.inner.lock().unwrap().endpoint_changes_total += n;
    }

    /// `kubeproxy_sync_proxy_rules_endpoint_changes_pending` = `n`.
    pub fn set_endpoint_changes_pending(&self, n: u64) {
        self.inner.lock().unwrap().endpoint_changes_pending = n;
    }

    /// `kubeproxy_sync_proxy_rules_service_changes_total` += `n`.
    pub fn add_service_changes(&self, n: u64) {
        self.inner.lock().unwrap().service_changes_total += n;
    }

    /// `kubeproxy_sync_proxy_rules_service_changes_pending` = `n`.
    pub fn set_service_changes_pending(&self, n: u64) {
        self.inner.lock().unwrap().service_changes_pending = n;
    }

    /// `kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family,traffic_policy}`
    /// (a gauge despite its name): services of `family` with a Local policy and no
    /// local endpoints, as counted by the last sync.
    pub fn set_no_local_endpoints(&self, family: IpFamily, policy: TrafficPolicy, n: u64) {
        self.one_family(family, |pf| match policy {
            TrafficPolicy::Internal => pf.no_local_internal = n,
            TrafficPolicy::External => pf.no_local_external = n,
        });
    }

    /// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total` += 1: a transaction
    /// failed (both families' tables are in it).
    pub fn inc_sync_failures(&self) {
        self.each_family(|pf| pf.nftables_sync_failures += 1);
    }

    /// `kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family}` += `n`.
    pub fn add_conntrack_deleted(&self, family: IpFamily, n: u64) {
        self.one_family(family, |pf| pf.conntrack_deleted += n);
    }

    /// `kubeproxy_proxy_healthz_total{code}` += 1.
    pub fn inc_healthz(&self, code: u16) {
        *self.inner.lock().unwrap().healthz.entry(code).or_insert(0) += 1;
    }

    /// `kubeproxy_proxy_livez_total{code}` += 1.
    pub fn inc_livez(&self, code: u16) {
        *self.inner.lock().unwrap().livez.entry(code).or_insert(0) += 1;
    }

    /// `kube_nlproxy_netlink_messages_total{kind}` += `n`.
    pub fn add_netlink_messages(&self, kind: &str, n: u64) {
        *self
            .inner
            .lock()
            .unwrap()
            .netlink_messages
            .entry(kind.to_string())
            .or_insert(0) += n;
    }

    /// `kube_nlproxy_node_problems`: what is wrong with our Node (0: nothing).
    pub fn set_node_problems(&self, n: usize) {
        self.inner.lock().unwrap().node_problems = n as u64;
    }

    /// `kube_nlproxy_kube_proxy_state_objects{backend}`: kube-proxy's tables or
    /// chains found in the kernel by the last look (0 once removed).
    pub fn set_kube_proxy_state(&self, counts: impl IntoIterator<Item = (&'static str, usize)>) {
        let mut inner = self.inner.lock().unwrap();
        for (backend, n) in counts {
            inner.kube_proxy_state.insert(backend, n as u64);
        }
    }

    /// `kube_nlproxy_sync_operations{op}`: operations of the last sync by kind (as
    /// `sync::op_counts` gives them). Kinds seen before and absent now drop to 0.
    pub fn set_sync_operations<'a>(&self, ops: impl IntoIterator<Item = (&'a str, usize)>) {
        let mut inner = self.inner.lock().unwrap();
        for v in inner.sync_operations.values_mut() {
            *v = 0;
        }
        for (op, n) in ops {
            inner.sync_operations.insert(op.to_string(), n as u64);
        }
    }

    /// Everything, in the text exposition format 0.0.4, families sorted by name as
    /// client_golang gathers them.
    pub fn render(&self) -> String {
        let inner = self.inner.lock().unwrap();
        let fams: Vec<(&'static str, &PerFamily)> = inner
            .families
            .iter()
            .map(|(f, pf)| (family_name(*f), pf))
            .collect();
        let mut out = String::new();
        let mut w = Writer { out: &mut out };

        w.head(
            "kube_nlproxy_netlink_messages_total",
            "Netlink messages sent, by kind",
            "counter",
        );
        for (k, v) in &inner.netlink_messages {
            w.sample_named(
                "kube_nlproxy_netlink_messages_total",
                &[("kind", k)],
                *v as f64,
            );
        }
        let name = "kube_nlproxy_node_problems";
        w.head(
            name,
            "Problems with our Node: missing, or no address of a family that NodePorts need",
            "gauge",
        );
        w.sample_named(name, &[], inner.node_problems as f64);
        if !inner.kube_proxy_state.is_empty() {
            let name = "kube_nlproxy_kube_proxy_state_objects";
            w.head(
                name,
                "kube-proxy's tables (nftables) or KUBE-* chains (iptables) found in the kernel, by backend",
                "gauge",
            );
            for (backend, n) in &inner.kube_proxy_state {
                w.sample_named(name, &[("backend", backend)], *n as f64);
            }
        }
        w.head(
            "kube_nlproxy_sync_operations",
            "Dataplane operations sent by the last sync, by kind",
            "gauge",
        );
        for (k, v) in &inner.sync_operations {
            w.sample_named("kube_nlproxy_sync_operations", &[("op", k)], *v as f64);
        }

        let name = "kubeproxy_conntrack_reconciler_deleted_entries_total";
        w.head(
            name,
            "Cumulative conntrack flows deleted by conntrack reconciler",
            "counter",
        );
        per_family_named(w.out, name, &fams, |pf| pf.conntrack_deleted as f64);

        let name = "kubeproxy_network_programming_duration_seconds";
        w.head(
            name,
            "In Cluster Network Programming Latency in seconds",
            "histogram",
        );
        for (fam, pf) in &fams {
            histogram(w.out, name, fam, &pf.network_programming);
        }

        w.head(
            "kubeproxy_proxy_healthz_total",
            "Cumulative proxy healthz HTTP status",
            "counter",
        );
        for (code, v) in &inner.healthz {
            w.sample_named(
                "kubeproxy_proxy_healthz_total",
                &[("code", &code.to_string())],
                *v as f64,
            );
        }
        w.head(
            "kubeproxy_proxy_livez_total",
            "Cumulative proxy livez HTTP status",
            "counter",
        );
        for (code, v) in &inner.livez {
            w.sample_named(
                "kubeproxy_proxy_livez_total",
                &[("code", &code.to_string())],
                *v as f64,
            );
        }

        let name = "kubeproxy_sync_proxy_rules_duration_seconds";
        w.head(name, "SyncProxyRules latency in seconds", "histogram");
        for (fam, pf) in &fams {
            histogram(w.out, name, fam, &pf.sync_duration);
        }

        for (name, help, ty, v) in [
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "Pending proxy rules Endpoint changes",
                "gauge",
                inner.endpoint_changes_pending,
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                "Cumulative proxy rules Endpoint changes",
                "counter",
                inner.endpoint_changes_total,
            ),
        ] {
            w.head(name, help, ty);
            w.sample_named(name, &[], v as f64);
        }

        let name = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds";
        w.head(
            name,
            "The last time a sync of proxy rules was queued",
            "gauge",
        );
        per_family_named(w.out, name, &fams, |pf| pf.last_queued);
        let name = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
        w.head(
            name,
            "The last time proxy rules were successfully synced",
            "gauge",
        );
        per_family_named(w.out, name, &fams, |pf| pf.last_sync);
        let name = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total";
        w.head(name, "Cumulative proxy nftables sync failures", "counter");
        per_family_named(w.out, name, &fams, |pf| pf.nftables_sync_failures as f64);

        let name = "kubeproxy_sync_proxy_rules_no_local_endpoints_total";
        w.head(
            name,
            "Number of services with a Local traffic policy and no endpoints",
            "gauge",
        );
        for (fam, pf) in &fams {
            for (policy, v) in [
                (TrafficPolicy::External, pf.no_local_external),
                (TrafficPolicy::Internal, pf.no_local_internal),
            ] {
                w.sample_named(
                    name,
                    &[("ip_family", fam), ("traffic_policy", policy.label())],
                    v as f64,
                );
            }
        }

        for (name, help, ty, v) in [
            (
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "Pending proxy rules Service changes",
                "gauge",
                inner.service_changes_pending,
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_total",
                "Cumulative proxy rules Service changes",
                "counter",
                inner.service_changes_total,
            ),
        ] {
            w.head(name, help, ty);
            w.sample_named(name, &[], v as f64);
        }
        out
    }
}

struct Writer<'a> {
    out: &'a mut String,
}

impl Writer<'_> {
    fn head(&mut self, name: &str, help: &str, ty: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {ty}");
    }

    fn sample_named(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.out.push_str(name);
        sample(self.out, labels, v);
    }
}

/// Writes `{labels} value\n` after a name already written.
fn sample(out: &mut String, labels: &[(&str, &str)], v: f64) {
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, val)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape_label(val));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {}", go_float(v));
}

fn per_family_named(
    out: &mut String,
    name: &str,
    fams: &[(&'static str, &PerFamily)],
    get: impl Fn(&PerFamily) -> f64,
) {
    for (fam, pf) in fams {
        out.push_str(name);
        sample(out, &[("ip_family", fam)], get(pf));
    }
}

fn histogram(out: &mut String, name: &str, fam: &str, h: &Histogram) {
    for (le, c) in h.cumulative() {
        let le = go_float(le);
        let _ = write!(out, "{name}_bucket");
        sample(out, &[("ip_family", fam), ("le", &le)], c as f64);
    }
    let _ = write!(out, "{name}_sum");
    sample(out, &[("ip_family", fam)], h.sum());
    let _ = write!(out, "{name}_count");
    sample(out, &[("ip_family", fam)], h.count() as f64);
}

/// Label values escape `\`, `"` and newline.
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// HELP text escapes `\` and newline.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::health::FakeClock;

    #[test]
    fn upstream_buckets() {
        let b = sync_duration_buckets();
        assert_eq!(b.len(), 15);
        assert_eq!(go_float(b[0]), "0.001");
        assert_eq!(go_float(b[14]), "16.384");
        let n = network_programming_buckets();
        assert_eq!(n.len(), 1 + 2 + 59 + 12 + 7);
        assert_eq!(&n[..5], &[0.0, 0.25, 0.5, 1.0, 2.0]);
        assert_eq!(n[61], 59.0);
        assert_eq!(n[62], 60.0);
        assert_eq!(n[73], 115.0);
        assert_eq!(n[74], 120.0);
        assert_eq!(*n.last().unwrap(), 300.0);
        assert!(n.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn histogram_math() {
        let mut h = Histogram::new(vec![0.001, 0.002, 0.004]);
        for v in [0.0005, 0.001, 0.0015, 0.003, 10.0] {
            h.observe(v);
        }
        assert_eq!(
            h.cumulative(),
            vec![(0.001, 2), (0.002, 3), (0.004, 4), (f64::INFINITY, 5)]
        );
        assert_eq!(h.count(), 5);
        assert!((h.sum() - 10.006).abs() < 1e-12);
    }

    #[test]
    fn render_exposition() {
        let clock = Arc::new(FakeClock::new(
            UNIX_EPOCH + Duration::from_secs(1_714_557_600),
        ));
        let m = Metrics::new().with_clock(clock.clone());
        m.observe_sync_duration(Duration::from_millis(3));
        m.observe_sync_duration(Duration::from_secs(20));
        m.observe_network_programming(IpFamily::V4, Duration::from_millis(1500));
        m.set_last_sync_now();
        clock.step(Duration::from_millis(500));
        m.set_last_queued_now();
        m.add_endpoint_changes(3);
        m.add_endpoint_changes(2);
        m.set_endpoint_changes_pending(1);
        m.add_service_changes(4);
        m.set_service_changes_pending(2);
        m.set_no_local_endpoints(IpFamily::V4, TrafficPolicy::External, 7);
        m.inc_sync_failures();
        m.add_conntrack_deleted(IpFamily::V6, 9);
        m.inc_healthz(200);
        m.inc_healthz(200);
        m.inc_healthz(503);
        m.inc_livez(200);
        m.add_netlink_messages("nft-newrule", 10);
        m.add_netlink_messages("a\"b\\c\nd", 1);
        m.set_sync_operations([("add-rule", 5usize), ("add-chain", 2)]);
        m.set_sync_operations([("add-rule", 1usize)]);
        let text = m.render();

        for (name, ty) in [
            ("kubeproxy_sync_proxy_rules_duration_seconds", "histogram"),
            (
                "kubeproxy_network_programming_duration_seconds",
                "histogram",
            ),
            ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge"),
            (
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                "counter",
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_total",
                "counter",
            ),
            (
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                "gauge",
            ),
            ("kubeproxy_proxy_healthz_total", "counter"),
            ("kubeproxy_proxy_livez_total", "counter"),
            (
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
                "counter",
            ),
            (
                "kubeproxy_conntrack_reconciler_deleted_entries_total",
                "counter",
            ),
            ("kube_nlproxy_netlink_messages_total", "counter"),
            ("kube_nlproxy_sync_operations", "gauge"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {ty}\n")),
                "{name} {ty}"
            );
        }
        for line in [
            "# HELP kubeproxy_sync_proxy_rules_duration_seconds SyncProxyRules latency in seconds",
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 0"#,
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 1"#,
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="16.384"} 1"#,
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 2"#,
            r#"kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 20.003"#,
            r#"kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 2"#,
            r#"kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0"} 0"#,
            r#"kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="1"} 0"#,
            r#"kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="2"} 1"#,
            r#"kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="300"} 1"#,
            r#"kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"} 1.5"#,
            r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7145576e+09"#,
            r#"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"} 1.7145576005e+09"#,
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 5",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 1",
            "kubeproxy_sync_proxy_rules_service_changes_total 4",
            "kubeproxy_sync_proxy_rules_service_changes_pending 2",
            r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 7"#,
            r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 0"#,
            r#"kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv6"} 1"#,
            r#"kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 0"#,
            r#"kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv6"} 9"#,
            r#"kubeproxy_proxy_healthz_total{code="200"} 2"#,
            r#"kubeproxy_proxy_healthz_total{code="503"} 1"#,
            r#"kubeproxy_proxy_livez_total{code="200"} 1"#,
            r#"kube_nlproxy_netlink_messages_total{kind="nft-newrule"} 10"#,
            r#"kube_nlproxy_netlink_messages_total{kind="a\"b\\c\nd"} 1"#,
            r#"kube_nlproxy_sync_operations{op="add-chain"} 0"#,
            r#"kube_nlproxy_sync_operations{op="add-rule"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        // Families are sorted by name, HELP before TYPE.
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn counters_only_increase() {
        let m = Metrics::new().with_families(&[IpFamily::V4]);
        let get = |m: &Metrics| -> String {
            m.render()
                .lines()
                .find(|l| l.starts_with("kubeproxy_sync_proxy_rules_nftables_sync_failures_total"))
                .unwrap()
                .to_string()
        };
        assert_eq!(
            get(&m),
            r#"kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 0"#
        );
        m.inc_sync_failures();
        m.inc_sync_failures();
        assert_eq!(
            get(&m),
            r#"kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 2"#
        );
        assert!(!m.render().contains("IPv6"));
    }
}
