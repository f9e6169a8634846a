//! `/status` on the metrics port: what `kube-nlproxy status` reads from a
//! running daemon. Each field is set where the daemon already does the work
//! (one sync, one drift check): O(1) per sync.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The daemon's state as `/status` shows it (JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusInfo {
    /// `nftables` or `ipvs`.
    pub mode: String,
    /// Our node's name.
    pub node: String,
    /// Service ports in the model, counted once per family (a dual-stack
    /// port twice), after the last good sync: in nftables mode, the sum of
    /// the service ports the kernel's `ip` and `ip6` tables name.
    pub service_ports: usize,
    /// Which traffic the daemon takes as local, and whether it masquerades
    /// all: `explain` answers as the daemon runs, without the flags typed
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_traffic: Option<LocalTraffic>,
    /// Successful syncs since start.
    pub syncs: u64,
    /// Failed syncs since start.
    pub sync_failures: u64,
    /// When the last good sync ended (seconds since the epoch).
    pub last_sync_unix: Option<f64>,
    /// How long it took (milliseconds).
    pub last_sync_ms: Option<f64>,
    /// Whether it read the kernel back (full) or sent a delta.
    pub last_sync_full: Option<bool>,
    /// The last sync error (with its causes), cleared by the next good sync.
    pub last_error: Option<String>,
    /// Times the drift check found our objects changed by someone else (each
    /// is followed by a repairing full sync).
    pub drift_repairs: u64,
    /// kube-proxy's state found in the kernel by the last look (`None`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy_state: Option<String>,
    /// What is wrong with our Node (missing, no address for a family), as logged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_problems: Vec<String>,
    /// What was removed of kube-proxy's state after the first sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy_state_removed: Option<String>,
}

/// The daemon's local-traffic detection, resolved (`--detect-local-mode`
/// with its CIDRs or interface, the Node's pod CIDRs for `NodeCIDR`), and
/// `--masquerade-all`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalTraffic {
    /// `none`, `cidrs`, `bridge-interface` or `interface-name-prefix`.
    pub detector: String,
    /// The CIDRs of `cidrs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<String>,
    /// The bridge of `bridge-interface`, the prefix of `interface-name-prefix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
}

/// Shared status, updated by the daemon and read by the HTTP handler.
#[derive(Debug, Default)]
pub struct Status(Mutex<StatusInfo>);

impl Status {
    fn with(&self, f: impl FnOnce(&mut StatusInfo)) {
        if let Ok(mut s) = self.0.lock() {
            f(&mut s)
        }
    }

    /// Mode and node (once known).
    pub fn set_identity(&self, mode: &str, node: &str) {
        self.with(|s| {
            s.mode = mode.to_string();
            s.node = node.to_string();
        })
    }

    /// A good sync.
    pub fn sync_ok(&self, took: Duration, full: bool, service_ports: usize) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.with(|s| {
            s.syncs += 1;
            s.last_sync_unix = Some(now);
            s.last_sync_ms = Some(took.as_secs_f64() * 1000.0);
            s.last_sync_full = Some(full);
            s.last_error = None;
            s.service_ports = service_ports;
        })
    }

    /// The local-traffic settings in force (set after each good sync: the
    /// Node's pod CIDRs may have changed).
    pub fn set_local_traffic(&self, local: LocalTraffic) {
        self.with(|s| {
            if s.local_traffic.as_ref() != Some(&local) {
                s.local_traffic = Some(local)
            }
        })
    }

    /// A failed sync.
    pub fn sync_failed(&self, error: String) {
        self.with(|s| {
            s.sync_failures += 1;
            s.last_error = Some(error);
        })
    }

    /// The drift check found a change by someone else.
    pub fn drift_found(&self) {
        self.with(|s| s.drift_repairs += 1)
    }

    /// kube-proxy's state as last found (`None`: none).
    pub fn set_kube_proxy_state(&self, present: Option<String>) {
        self.with(|s| s.kube_proxy_state = present)
    }

    /// What is wrong with our Node (empty: nothing).
    pub fn set_node_problems(&self, problems: Vec<String>) {
        self.with(|s| s.node_problems = problems)
    }

    /// What was removed of kube-proxy's state.
    pub fn kube_proxy_state_removed(&self, removed: String) {
        self.with(|s| s.kube_proxy_state_removed = Some(removed))
    }

    /// The JSON `/status` serves.
    pub fn json(&self) -> String {
        let info = self.0.lock().map(|s| s.clone()).unwrap_or_default();
        serde_json::to_string(&info).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}
