//! Proxy health, as upstream's `ProxyHealthServer` (`pkg/proxy/healthcheck/proxy_health.go`).
//!
//! The sync loop reports two events: [`ProxyHealth::queued_update`] when a change
//! arrives that needs a sync (upstream `QueuedUpdate`, called from `Sync()`), and
//! [`ProxyHealth::updated`] when a sync succeeded (upstream `Updated`, also called
//! once when the sync loop starts, "in case Sync() never succeeds"). The proxy is
//! unhealthy when an update has been queued for at least `healthTimeout`
//! (2 × syncPeriod, as kube-proxy's `NewProxyHealthServer(addr, 2*SyncPeriod)`)
//! without a successful sync since.
//!
//! Upstream keeps this per IP family because it runs one proxier per family; we sync
//! both families in one transaction, so every configured family carries the same
//! state and the JSON lists each of them under `status`, as a dual-stack kube-proxy does.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

use super::format::{GO_ZERO_TIME, rfc3339_nano};
use crate::model::IpFamily;

/// The taint the Cluster Autoscaler puts on a node before deleting it (upstream
/// `ToBeDeletedTaint`).
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Upstream's name of a family (`v1.IPFamily`): `IPv4` / `IPv6`.
pub fn family_name(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

/// A source of wall-clock time, injectable for tests (upstream `clock.Clock`).
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to (upstream `clocktesting.FakeClock`).
#[derive(Debug)]
pub struct FakeClock {
    now: Mutex<SystemTime>,
}

impl FakeClock {
    /// A clock standing at `t`.
    pub fn new(t: SystemTime) -> Self {
        FakeClock { now: Mutex::new(t) }
    }

    /// Move to `t`.
    pub fn set(&self, t: SystemTime) {
        *self.now.lock().unwrap() = t;
    }

    /// Move forward by `d`.
    pub fn step(&self, d: Duration) {
        *self.now.lock().unwrap() += d;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap()
    }
}

/// Why the node is or is not eligible to receive load-balancer traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeEligibility {
    /// Neither being deleted nor tainted for deletion.
    Eligible,
    /// `metadata.deletionTimestamp` is set.
    Deleting,
    /// Tainted `ToBeDeletedByClusterAutoscaler`.
    ToBeDeleted,
}

impl NodeEligibility {
    /// Classify a Node as upstream's `NodeEligible()` does.
    pub fn of(node: &Node) -> Self {
        if node.metadata.deletion_timestamp.is_some() {
            return NodeEligibility::Deleting;
        }
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
        if tainted {
            NodeEligibility::ToBeDeleted
        } else {
            NodeEligibility::Eligible
        }
    }
}

/// Whether `node` may receive load-balancer traffic: not being deleted and not
/// tainted `ToBeDeletedByClusterAutoscaler`.
pub fn node_eligibility(node: &Node) -> bool {
    NodeEligibility::of(node) == NodeEligibility::Eligible
}

#[derive(Debug)]
struct State {
    /// Upstream `lastUpdatedMap`: set by `updated()`, for every family at once.
    last_updated: Option<SystemTime>,
    /// Upstream `oldestPendingQueuedMap`: the first `queued_update()` since the last
    /// `updated()`.
    oldest_pending_queued: Option<SystemTime>,
    /// `None` until `set_node` is first called.
    node: Option<Option<NodeEligibility>>,
}

/// Health of the proxy (one per process, shared as `Arc<ProxyHealth>`).
#[derive(Debug)]
pub struct ProxyHealth {
    clock: Arc<dyn Clock>,
    health_timeout: Duration,
    families: Vec<IpFamily>,
    state: Mutex<State>,
}

/// Health of one family's proxier, as upstream's `ProxierHealth` JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProxierHealth {
    /// RFC 3339 time of the family's last successful sync.
    #[serde(rename = "lastUpdated")]
    pub last_updated: String,
    /// Whether that family is healthy.
    pub healthy: bool,
}

/// The `/healthz` and `/livez` body, field for field upstream's `ProxyHealth`
/// (`json.Marshal`: compact, in this order, `nodeEligible` only on `/healthz`,
/// `status` omitted while empty, its keys sorted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthReport {
    /// The most recent `lastUpdated` of any family; the current time when the
    /// response is healthy (upstream keeps that for backward compatibility).
    #[serde(rename = "lastUpdated")]
    pub last_updated: String,
    /// The current time.
    #[serde(rename = "currentTime")]
    pub current_time: String,
    /// `/healthz` only.
    #[serde(rename = "nodeEligible", skip_serializing_if = "Option::is_none")]
    pub node_eligible: Option<bool>,
    /// True when every family is healthy (the node is not considered here).
    pub healthy: bool,
    /// Per family (`IPv4`, `IPv6`), once that family has synced.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub status: BTreeMap<&'static str, ProxierHealth>,
}

/// A rendered `/healthz` or `/livez` response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthResponse {
    /// 200 or 503.
    pub code: u16,
    /// The JSON body.
    pub body: String,
}

impl ProxyHealth {
    /// Health with `healthTimeout` = 2 × `sync_period`, both families, the real clock.
    pub fn new(sync_period: Duration) -> Self {
        ProxyHealth {
            clock: Arc::new(SystemClock),
            health_timeout: sync_period * 2,
            families: IpFamily::ALL.to_vec(),
            state: Mutex::new(State {
                last_updated: None,
                oldest_pending_queued: None,
                node: None,
            }),
        }
    }

    /// Use `clock` instead of the system clock.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Report only these families (default: IPv4 and IPv6).
    #[must_use]
    pub fn with_families(mut self, families: &[IpFamily]) -> Self {
        let mut f = families.to_vec();
        f.sort();
        f.dedup();
        self.families = f;
        self
    }

    /// The current time of this health's clock.
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// The clock, for servers that print a `Date`.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// `2 × syncPeriod`.
    pub fn health_timeout(&self) -> Duration {
        self.health_timeout
    }

    /// A change needing a sync arrived. Only the first one since the last successful
    /// sync is remembered (upstream `QueuedUpdate`).
    pub fn queued_update(&self) {
        let now = self.now();
        let mut st = self.state.lock().unwrap();
        st.oldest_pending_queued.get_or_insert(now);
    }

    /// A sync succeeded, or the sync loop started (upstream `Updated`): the pending
    /// queue is cleared and `lastUpdated` is now.
    pub fn updated(&self) {
        let now = self.now();
        let mut st = self.state.lock().unwrap();
        st.oldest_pending_queued = None;
        st.last_updated = Some(now);
    }

    /// The node's state: `None` when the Node object is missing (not eligible).
    pub fn set_node(&self, node: Option<NodeEligibility>) {
        self.state.lock().unwrap().node = Some(node);
    }

    /// Whether the node may receive load-balancer traffic. Until [`set_node`] is first
    /// called the node counts as eligible (kube-proxy waits for its Node before
    /// serving; upstream's comment: "eligible while it's starting up").
    ///
    /// [`set_node`]: ProxyHealth::set_node
    pub fn node_eligible(&self) -> bool {
        match self.state.lock().unwrap().node {
            None => true,
            Some(n) => n == Some(NodeEligibility::Eligible),
        }
    }

    /// The proxier's health, ignoring the node (upstream `Health()`).
    pub fn health(&self) -> HealthReport {
        let st = self.state.lock().unwrap();
        let now = self.now();
        let mut report = HealthReport {
            last_updated: GO_ZERO_TIME.into(),
            current_time: rfc3339_nano(now),
            node_eligible: None,
            healthy: true,
            status: BTreeMap::new(),
        };
        // Upstream only looks at families that have called Updated: before the sync
        // loop starts the proxy is healthy whatever is queued.
        if let Some(last) = st.last_updated {
            let late = st
                .oldest_pending_queued
                .is_some_and(|q| now.duration_since(q).unwrap_or_default() >= self.health_timeout);
            report.healthy = !late;
            report.last_updated = rfc3339_nano(last);
            for f in &self.families {
                report.status.insert(
                    family_name(*f),
                    ProxierHealth {
                        last_updated: rfc3339_nano(last),
                        healthy: !late,
                    },
                );
            }
        }
        report
    }

    /// The proxier's health, ignoring the node (upstream `IsHealthy`/`Health().Healthy`).
    pub fn is_healthy(&self) -> bool {
        self.health().healthy
    }

    /// The `/healthz` response: 503 when the proxier is unhealthy or the node is not
    /// eligible; `nodeEligible` is included.
    /// Before the first successful sync it is 503 (`healthy: false`): nothing is
    /// programmed yet, so the pod is not ready and a rollout waits for it.
    pub fn healthz(&self) -> HealthResponse {
        let mut report = self.health();
        let eligible = self.node_eligible();
        report.node_eligible = Some(eligible);
        if !self.synced() {
            report.healthy = false;
        }
        self.respond(report, eligible)
    }

    /// Whether a sync has succeeded yet.
    pub fn synced(&self) -> bool {
        self.state.lock().unwrap().last_updated.is_some()
    }

    /// The `/livez` response: like `/healthz` but ignoring the node, and 200
    /// from the start (a proxy waiting for the API server is alive).
    pub fn livez(&self) -> HealthResponse {
        self.respond(self.health(), true)
    }

    fn respond(&self, mut report: HealthReport, node_ok: bool) -> HealthResponse {
        let code = if report.healthy && node_ok {
            // "the returned lastUpdated value is 'recent' if the server is healthy"
            report.last_updated = rfc3339_nano(self.now());
            200
        } else {
            503
        };
        let body = serde_json::to_string(&report).expect("health report serializes");
        HealthResponse { code, body }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use std::time::UNIX_EPOCH;

    const T0: &str = "2024-05-01T10:00:00Z";

    fn fixture() -> (Arc<FakeClock>, ProxyHealth) {
        let clock = Arc::new(FakeClock::new(
            UNIX_EPOCH + Duration::from_secs(1_714_557_600),
        ));
        let h = ProxyHealth::new(Duration::from_secs(30)).with_clock(clock.clone());
        (clock, h)
    }

    #[test]
    fn fresh_start_is_alive_but_not_ready() {
        let (clock, h) = fixture();
        h.queued_update();
        clock.step(Duration::from_secs(3600));
        // Nothing has called updated() (no sync yet, the API may be unreachable):
        // /healthz (readiness) is 503, /livez (liveness) 200.
        let r = h.healthz();
        assert_eq!(r.code, 503);
        assert_eq!(
            r.body,
            r#"{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2024-05-01T11:00:00Z","nodeEligible":true,"healthy":false}"#
        );
        let r = h.livez();
        assert_eq!(r.code, 200);
        assert_eq!(
            r.body,
            r#"{"lastUpdated":"2024-05-01T11:00:00Z","currentTime":"2024-05-01T11:00:00Z","healthy":true}"#
        );
    }

    #[test]
    fn queued_too_long_is_unhealthy_until_updated() {
        let (clock, h) = fixture();
        h.updated(); // sync loop start
        clock.step(Duration::from_secs(1));
        h.queued_update();
        clock.step(Duration::from_secs(59));
        assert!(h.is_healthy(), "59 s < 60 s");
        h.queued_update(); // does not move the oldest pending time
        clock.step(Duration::from_secs(1));
        assert!(!h.is_healthy(), "60 s >= 2 x 30 s");
        let r = h.healthz();
        assert_eq!(r.code, 503);
        assert_eq!(
            r.body,
            format!(
                r#"{{"lastUpdated":"{T0}","currentTime":"2024-05-01T10:01:01Z","nodeEligible":true,"healthy":false,"status":{{"IPv4":{{"lastUpdated":"{T0}","healthy":false}},"IPv6":{{"lastUpdated":"{T0}","healthy":false}}}}}}"#
            )
        );
        assert_eq!(h.livez().code, 503);
        h.updated();
        let r = h.livez();
        assert_eq!(r.code, 200);
        assert_eq!(
            r.body,
            r#"{"lastUpdated":"2024-05-01T10:01:01Z","currentTime":"2024-05-01T10:01:01Z","healthy":true,"status":{"IPv4":{"lastUpdated":"2024-05-01T10:01:01Z","healthy":true},"IPv6":{"lastUpdated":"2024-05-01T10:01:01Z","healthy":true}}}"#
        );
    }

    #[test]
    fn families_can_be_restricted() {
        let (_, h) = fixture();
        let h = h.with_families(&[IpFamily::V4]);
        h.updated();
        assert!(h.livez().body.ends_with(
            r#""status":{"IPv4":{"lastUpdated":"2024-05-01T10:00:00Z","healthy":true}}}"#
        ));
    }

    fn node(deleting: bool, taint: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                deletion_timestamp: deleting.then(|| Time(Default::default())),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: taint.map(|k| {
                    vec![Taint {
                        key: k.into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn node_eligibility_rules() {
        assert!(node_eligibility(&node(false, None)));
        assert!(node_eligibility(&node(false, Some("other"))));
        assert_eq!(
            NodeEligibility::of(&node(true, None)),
            NodeEligibility::Deleting
        );
        assert_eq!(
            NodeEligibility::of(&node(false, Some(TO_BE_DELETED_TAINT))),
            NodeEligibility::ToBeDeleted
        );
        let (_, h) = fixture();
        h.updated();
        assert!(h.node_eligible(), "eligible until told otherwise");
        for n in [
            None,
            Some(NodeEligibility::Deleting),
            Some(NodeEligibility::ToBeDeleted),
        ] {
            h.set_node(n);
            let r = h.healthz();
            assert_eq!(r.code, 503, "{n:?}");
            assert!(
                r.body.contains(r#""nodeEligible":false,"healthy":true"#),
                "{}",
                r.body
            );
            assert_eq!(h.livez().code, 200, "{n:?}");
        }
        h.set_node(Some(NodeEligibility::Eligible));
        assert_eq!(h.healthz().code, 200);
    }
}
