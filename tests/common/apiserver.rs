//! A fake Kubernetes API server for tests: HTTP/1.1 on 127.0.0.1, hand-written, one
//! thread per connection, speaking the list/watch protocol for
//!
//! - `v1` `services` (namespaced) and `nodes` (cluster),
//! - `discovery.k8s.io/v1` `endpointslices` (namespaced),
//! - `networking.k8s.io/v1` `servicecidrs` (cluster; optional),
//!
//! plus the discovery documents (`/api`, `/api/v1`, `/apis`, `/apis/G/V`, `/version`)
//! and `events.k8s.io/v1` event creation (accepted, recorded, not listable).
//!
//! Protocol, as the real server does it:
//! - one global `resourceVersion` counter; every write bumps it; a list carries it in
//!   `metadata.resourceVersion`;
//! - `labelSelector` (`key`, `!key`, `key=value`, `key==value`, `key!=value`) and
//!   `fieldSelector` (`metadata.name`, `metadata.namespace`);
//! - paged lists: `limit=N` (N > 0) returns at most N items in key order
//!   (namespace, then name); when more remain, `metadata.continue` carries an opaque
//!   token (hex of a small JSON: the first page's resourceVersion and the last key
//!   returned) and, for lists without a label or field selector,
//!   `metadata.remainingItemCount` the number left. `continue=TOKEN` resumes after
//!   that key, and every page reports the first page's resourceVersion. A token
//!   older than the watch history (the bound that makes a watch get 410) gets HTTP
//!   410 Expired; a malformed one, one combined with `resourceVersion`, or a
//!   malformed `limit` gets 400 BadRequest. Unlike the real server (which reads later pages from an etcd
//!   snapshot), later pages show the objects as they are now; a client that watches
//!   from the reported resourceVersion gets the writes in between replayed, so it
//!   converges all the same. The list's own `resourceVersion` parameter is ignored
//!   (a list is always of the latest state); `limit=0` or none means one page;
//! - `watch=true`: a chunked stream of `{"type":..,"object":..}` lines, replaying the
//!   bounded event history after the given resourceVersion; an object that starts or
//!   stops matching the selector arrives as ADDED/DELETED; BOOKMARKs every second when
//!   `allowWatchBookmarks=true`; a resourceVersion older than the history gets an
//!   `ERROR` event (Status 410, reason Expired) inside a 200 stream; no or a `0`
//!   resourceVersion starts with synthetic ADDED events for the current objects (and,
//!   with `sendInitialEvents=true`, the `k8s.io/initial-events-end` bookmark; that
//!   parameter gets 422 Invalid unless [`Options::watch_list`]);
//!   the stream ends cleanly at `timeoutSeconds`.
//!
//! Test controls: [`FakeApiServer::create`]/`update`/`apply`/`delete` (JSON values),
//! [`FakeApiServer::drop_watches`], [`FakeApiServer::expire_history`],
//! [`FakeApiServer::fail_next`], and the request log ([`FakeApiServer::list_count`]
//! counts HTTP list requests, so a list of three pages counts three).

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

/// The resources the server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// `v1` `services`
    Services,
    /// `discovery.k8s.io/v1` `endpointslices`
    EndpointSlices,
    /// `v1` `nodes`
    Nodes,
    /// `networking.k8s.io/v1` `servicecidrs`
    ServiceCidrs,
}

impl Resource {
    const ALL: [Resource; 4] = [
        Resource::Services,
        Resource::EndpointSlices,
        Resource::Nodes,
        Resource::ServiceCidrs,
    ];

    /// The plural name in URLs.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Services => "services",
            Resource::EndpointSlices => "endpointslices",
            Resource::Nodes => "nodes",
            Resource::ServiceCidrs => "servicecidrs",
        }
    }

    /// `apiVersion` of the objects.
    pub fn api_version(self) -> &'static str {
        match self {
            Resource::Services | Resource::Nodes => "v1",
            Resource::EndpointSlices => "discovery.k8s.io/v1",
            Resource::ServiceCidrs => "networking.k8s.io/v1",
        }
    }

    /// `kind` of the objects.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Services => "Service",
            Resource::EndpointSlices => "EndpointSlice",
            Resource::Nodes => "Node",
            Resource::ServiceCidrs => "ServiceCIDR",
        }
    }

    fn namespaced(self) -> bool {
        matches!(self, Resource::Services | Resource::EndpointSlices)
    }

    fn of(object: &Value) -> Resource {
        let api_version = object["apiVersion"].as_str().unwrap_or("");
        let kind = object["kind"].as_str().unwrap_or("");
        Resource::ALL
            .into_iter()
            .find(|r| r.api_version() == api_version && r.kind() == kind)
            .unwrap_or_else(|| panic!("fake apiserver: unsupported object {api_version} {kind}"))
    }
}

/// One request as received.
#[derive(Clone, Debug)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The decoded query parameters, in order (empty fields skipped).
    pub query: Vec<(String, String)>,
    /// The client sent `Connection: close`.
    pub close: bool,
}

impl Request {
    /// The value of query parameter `key`.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether this is a watch request.
    pub fn is_watch(&self) -> bool {
        self.param("watch") == Some("true") || self.param("watch") == Some("1")
    }

    /// The resource a list/watch/get request is about.
    pub fn resource(&self) -> Option<Resource> {
        parse_path(&self.path).and_then(|p| match p {
            Route::Objects { resource, .. } => Some(resource),
            _ => None,
        })
    }
}

/// Server options.
#[derive(Clone, Debug)]
pub struct Options {
    /// Whether `networking.k8s.io/v1` serves `servicecidrs` (the group itself is
    /// always there, with `ingresses`).
    pub serve_service_cidrs: bool,
    /// How many write events the watch history keeps.
    pub history_limit: usize,
    /// The resourceVersion counter's start (a "restarted" server must start above
    /// the previous one's maximum).
    pub first_resource_version: u64,
    /// Whether watches may ask for initial events (`sendInitialEvents=true`, the
    /// WatchList feature); without it such a watch gets 422 Invalid, as from a
    /// real API server with the feature gate off.
    pub watch_list: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            serve_service_cidrs: true,
            history_limit: 1000,
            first_resource_version: 100,
            watch_list: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Added,
    Modified,
    Deleted,
}

/// One write, as the watch history keeps it.
#[derive(Debug)]
struct HistoryEvent {
    rv: u64,
    resource: Resource,
    change: Change,
    /// The object before a modification.
    old: Option<Value>,
    /// The object after the write (for a deletion: as it was, with the deletion's RV).
    new: Value,
}

type ObjectKey = (Resource, String, String);

#[derive(Debug)]
struct State {
    options: Options,
    rv: u64,
    objects: BTreeMap<ObjectKey, Value>,
    history: VecDeque<HistoryEvent>,
    /// Watches from a resourceVersion below this get 410 Gone.
    oldest_watchable: u64,
    /// Bumped by `drop_watches`: open watch streams are cut.
    drop_epoch: u64,
    /// Bumped by `expire_history`: open watch streams get 410 Gone.
    expire_epoch: u64,
    /// `fail_next`: (resource, status, remaining count).
    failures: Vec<(Resource, u16, usize)>,
    requests: Vec<Request>,
    posted_events: Vec<Value>,
    open_watches: usize,
    connections: Vec<TcpStream>,
    shutdown: bool,
    uid_counter: u64,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    changed: Condvar,
    addr: SocketAddr,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The fake API server; stops (and cuts every connection) when dropped.
#[derive(Debug)]
pub struct FakeApiServer {
    inner: Arc<Inner>,
    accept: Option<JoinHandle<()>>,
    /// The network namespace the listener lives in (that of the thread that
    /// started the server), so `drop` can wake the accept loop from there.
    netns: Option<std::fs::File>,
}

impl FakeApiServer {
    /// Starts a server with default options (ServiceCIDRs served).
    pub fn start() -> FakeApiServer {
        FakeApiServer::start_with(Options::default())
    }

    /// Starts a server (default options) listening on 127.0.0.1 inside the network
    /// namespace `/run/netns/NS`, for a client that runs there. The listener is
    /// created by a thread that entered the namespace; the server's own threads
    /// only use sockets, so they can live anywhere.
    pub fn start_in_netns(ns: &str) -> FakeApiServer {
        FakeApiServer::start_in_netns_with(ns, Options::default())
    }

    /// [`start_in_netns`](Self::start_in_netns) with `options`.
    pub fn start_in_netns_with(ns: &str, options: Options) -> FakeApiServer {
        super::in_ns(ns, || FakeApiServer::start_with(options))
    }

    /// Starts a server on an ephemeral port of 127.0.0.1, in the network namespace
    /// of the calling thread.
    pub fn start_with(options: Options) -> FakeApiServer {
        let netns = std::fs::File::open("/proc/thread-self/ns/net").ok();
        let listener = TcpListener::bind("127.0.0.1:0").expect("fake apiserver: bind");
        let addr = listener.local_addr().unwrap();
        let rv = options.first_resource_version;
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                options,
                rv,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                oldest_watchable: rv,
                drop_epoch: 0,
                expire_epoch: 0,
                failures: Vec::new(),
                requests: Vec::new(),
                posted_events: Vec::new(),
                open_watches: 0,
                connections: Vec::new(),
                shutdown: false,
                uid_counter: 0,
            }),
            changed: Condvar::new(),
            addr,
        });
        let accept_inner = inner.clone();
        let accept = thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let mut state = accept_inner.lock();
                if state.shutdown {
                    return;
                }
                if let Ok(clone) = conn.try_clone() {
                    state.connections.push(clone);
                }
                drop(state);
                let inner = accept_inner.clone();
                thread::spawn(move || serve_connection(&inner, conn));
            }
        });
        FakeApiServer {
            inner,
            accept: Some(accept),
            netns,
        }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// Writes a kubeconfig file whose current context points at this server.
    pub fn write_kubeconfig(&self, path: &Path) {
        write_kubeconfig(path, &self.url());
    }

    /// The current value of the resourceVersion counter.
    pub fn resource_version(&self) -> u64 {
        self.inner.lock().rv
    }

    /// Creates an object (`apiVersion`, `kind`, `metadata.name` and, for namespaced
    /// kinds, `metadata.namespace` set). Returns its resourceVersion. Panics if it
    /// exists.
    pub fn create(&self, object: Value) -> u64 {
        self.write(object, Some(false))
    }

    /// Replaces an existing object (a write with identical content still gets a new
    /// resourceVersion and a MODIFIED event). Panics if it does not exist.
    pub fn update(&self, object: Value) -> u64 {
        self.write(object, Some(true))
    }

    /// Creates or replaces an object.
    pub fn apply(&self, object: Value) -> u64 {
        self.write(object, None)
    }

    /// Deletes the object `object` names. Panics if it does not exist.
    pub fn delete(&self, object: &Value) -> u64 {
        let key = object_key(object);
        let mut state = self.inner.lock();
        let mut old = state
            .objects
            .remove(&key)
            .unwrap_or_else(|| panic!("fake apiserver: delete of missing {key:?}"));
        state.rv += 1;
        let rv = state.rv;
        old["metadata"]["resourceVersion"] = json!(rv.to_string());
        state.record(HistoryEvent {
            rv,
            resource: key.0,
            change: Change::Deleted,
            old: None,
            new: old,
        });
        drop(state);
        self.inner.changed.notify_all();
        rv
    }

    fn write(&self, mut object: Value, must_exist: Option<bool>) -> u64 {
        let key = object_key(&object);
        let mut state = self.inner.lock();
        let old = state.objects.get(&key).cloned();
        match (must_exist, &old) {
            (Some(true), None) => panic!("fake apiserver: update of missing {key:?}"),
            (Some(false), Some(_)) => panic!("fake apiserver: create of existing {key:?}"),
            _ => {}
        }
        state.rv += 1;
        let rv = state.rv;
        let uid = match &old {
            Some(o) => o["metadata"]["uid"].clone(),
            None => {
                state.uid_counter += 1;
                json!(format!("00000000-0000-0000-0000-{:012}", state.uid_counter))
            }
        };
        let meta = object["metadata"]
            .as_object_mut()
            .expect("fake apiserver: object without metadata");
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("uid".into(), uid);
        meta.entry("creationTimestamp")
            .or_insert_with(|| json!("2026-01-01T00:00:00Z"));
        state.objects.insert(key.clone(), object.clone());
        let change = if old.is_some() {
            Change::Modified
        } else {
            Change::Added
        };
        state.record(HistoryEvent {
            rv,
            resource: key.0,
            change,
            old,
            new: object,
        });
        drop(state);
        self.inner.changed.notify_all();
        rv
    }

    /// Cuts every open watch stream abruptly (no terminating chunk, socket shut down).
    pub fn drop_watches(&self) {
        self.inner.lock().drop_epoch += 1;
        self.inner.changed.notify_all();
    }

    /// Forgets the watch history: open watch streams get an `ERROR` event (Status
    /// 410 Expired) and end, and every watch from a resourceVersion before now gets
    /// the same, so the clients relist.
    pub fn expire_history(&self) {
        let mut state = self.inner.lock();
        state.history.clear();
        // A fresh list returns this RV, and a watch from it must be valid.
        state.rv += 1;
        state.oldest_watchable = state.rv;
        state.expire_epoch += 1;
        drop(state);
        self.inner.changed.notify_all();
    }

    /// Makes the next `count` list or watch requests for `resource` fail with HTTP
    /// `status` (a Status body). The client retries 429/503/504 itself; 500 reaches
    /// the watcher.
    pub fn fail_next(&self, resource: Resource, status: u16, count: usize) {
        self.inner.lock().failures.push((resource, status, count));
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.inner.lock().requests.clone()
    }

    /// How many list (non-watch GET collection) requests `resource` got; each page
    /// of a paged list is one request.
    pub fn list_count(&self, resource: Resource) -> usize {
        self.count(resource, false)
    }

    /// How many watch requests `resource` got.
    pub fn watch_count(&self, resource: Resource) -> usize {
        self.count(resource, true)
    }

    fn count(&self, resource: Resource, watch: bool) -> usize {
        self.inner
            .lock()
            .requests
            .iter()
            .filter(|r| {
                r.method == "GET"
                    && r.is_watch() == watch
                    && matches!(parse_path(&r.path), Some(Route::Objects { resource: res, name: None, .. }) if res == resource)
            })
            .count()
    }

    /// Watch streams open right now.
    pub fn open_watches(&self) -> usize {
        self.inner.lock().open_watches
    }

    /// The `events.k8s.io/v1` Events POSTed so far.
    pub fn posted_events(&self) -> Vec<Value> {
        self.inner.lock().posted_events.clone()
    }

    /// Polls until `cond` holds or `timeout` passes; returns whether it held.
    pub fn wait_until(
        &self,
        timeout: Duration,
        mut cond: impl FnMut(&FakeApiServer) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        state.shutdown = true;
        for c in state.connections.drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        drop(state);
        self.inner.changed.notify_all();
        // Wake the accept loop, from the listener's namespace.
        let addr = self.inner.addr;
        let netns = self.netns.take();
        let _ = thread::spawn(move || {
            if let Some(ns) = netns {
                use std::os::fd::AsRawFd;
                // SAFETY: setns on an open namespace file; affects this thread only.
                unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            }
            let _ = TcpStream::connect(addr);
        })
        .join();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

impl State {
    fn record(&mut self, event: HistoryEvent) {
        self.history.push_back(event);
        while self.history.len() > self.options.history_limit {
            let dropped = self.history.pop_front().unwrap();
            self.oldest_watchable = self.oldest_watchable.max(dropped.rv);
        }
    }

    /// Takes one injected failure for `resource`, if any.
    fn take_failure(&mut self, resource: Resource) -> Option<u16> {
        let f = self
            .failures
            .iter_mut()
            .find(|(r, _, n)| *r == resource && *n > 0)?;
        f.2 -= 1;
        Some(f.1)
    }
}

/// Writes a kubeconfig file with one cluster at `server`, no credentials.
pub fn write_kubeconfig(path: &Path, server: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server}\n\
         users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
         current-context: fake\n"
    );
    std::fs::write(path, text).expect("write kubeconfig");
}

fn object_key(object: &Value) -> ObjectKey {
    let resource = Resource::of(object);
    let meta = &object["metadata"];
    let name = meta["name"]
        .as_str()
        .expect("fake apiserver: object without metadata.name")
        .to_owned();
    let namespace = if resource.namespaced() {
        meta["namespace"]
            .as_str()
            .expect("fake apiserver: namespaced object without metadata.namespace")
            .to_owned()
    } else {
        String::new()
    };
    (resource, namespace, name)
}

// ---------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------

#[derive(Debug, PartialEq)]
enum Route {
    Version,
    CoreVersions,
    Groups,
    GroupVersion(String),
    Objects {
        resource: Resource,
        namespace: Option<String>,
        name: Option<String>,
    },
    Events {
        namespace: String,
        name: Option<String>,
    },
}

fn parse_path(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group_version, rest) = match segs.as_slice() {
        ["version"] => return Some(Route::Version),
        ["api"] => return Some(Route::CoreVersions),
        ["apis"] => return Some(Route::Groups),
        ["api", "v1"] => return Some(Route::GroupVersion("v1".into())),
        ["apis", g, v] => return Some(Route::GroupVersion(format!("{g}/{v}"))),
        ["api", "v1", rest @ ..] => ("v1".to_owned(), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, plural, name) = match rest {
        ["namespaces", ns, plural] => (Some(*ns), *plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
        [plural] => (None, *plural, None),
        [plural, name] => (None, *plural, Some(*name)),
        _ => return None,
    };
    if group_version == "events.k8s.io/v1" && plural == "events" {
        return Some(Route::Events {
            namespace: namespace?.to_owned(),
            name: name.map(str::to_owned),
        });
    }
    let resource = Resource::ALL
        .into_iter()
        .find(|r| r.api_version() == group_version && r.plural() == plural)?;
    Some(Route::Objects {
        resource,
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
    })
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

fn resource_entry(plural: &str, kind: &str, namespaced: bool) -> Value {
    json!({
        "name": plural, "singularName": kind.to_lowercase(), "namespaced": namespaced,
        "kind": kind, "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    })
}

fn discovery(state: &State, route: &Route) -> Option<Value> {
    let serve_cidrs = state.options.serve_service_cidrs;
    let version = |gv: &str| json!({"groupVersion": gv, "version": gv.rsplit('/').next().unwrap()});
    Some(match route {
        Route::Version => json!({
            "major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "gitCommit": "fake",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
            "compiler": "gc", "platform": "linux/amd64",
        }),
        Route::CoreVersions => json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        }),
        Route::Groups => {
            let groups: Vec<Value> = [
                "discovery.k8s.io/v1",
                "events.k8s.io/v1",
                "networking.k8s.io/v1",
            ]
            .into_iter()
            .map(|gv| {
                json!({
                    "name": gv.split('/').next().unwrap(),
                    "versions": [version(gv)],
                    "preferredVersion": version(gv),
                })
            })
            .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        Route::GroupVersion(gv) => {
            let resources: Vec<Value> = match gv.as_str() {
                "v1" => vec![
                    resource_entry("services", "Service", true),
                    resource_entry("nodes", "Node", false),
                ],
                "discovery.k8s.io/v1" => {
                    vec![resource_entry("endpointslices", "EndpointSlice", true)]
                }
                "events.k8s.io/v1" => vec![resource_entry("events", "Event", true)],
                "networking.k8s.io/v1" => {
                    let mut r = vec![resource_entry("ingresses", "Ingress", true)];
                    if serve_cidrs {
                        r.push(resource_entry("servicecidrs", "ServiceCIDR", false));
                    }
                    r
                }
                _ => return None,
            };
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
        }
        _ => return None,
    })
}

// ---------------------------------------------------------------------------
// Selectors
// ---------------------------------------------------------------------------

fn label_selector_matches(selector: &str, object: &Value) -> bool {
    let empty = Map::new();
    let labels = object["metadata"]["labels"].as_object().unwrap_or(&empty);
    let label = |k: &str| labels.get(k.trim()).and_then(Value::as_str);
    selector
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .all(|req| {
            if let Some(key) = req.strip_prefix('!') {
                label(key).is_none()
            } else if let Some((k, v)) = req.split_once("!=") {
                label(k) != Some(v.trim())
            } else if let Some((k, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
                label(k) == Some(v.trim())
            } else {
                label(req).is_some()
            }
        })
}

fn field_selector_matches(selector: &str, object: &Value) -> bool {
    let field = |f: &str| match f.trim() {
        "metadata.name" => object["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        "metadata.namespace" => object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_owned(),
        other => panic!("fake apiserver: unsupported field selector {other:?}"),
    };
    selector
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .all(|req| {
            if let Some((f, v)) = req.split_once("!=") {
                field(f) != v.trim()
            } else if let Some((f, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
                field(f) == v.trim()
            } else {
                panic!("fake apiserver: bad field selector {req:?}")
            }
        })
}

/// What a list or watch request selects.
struct Selection {
    resource: Resource,
    namespace: Option<String>,
    labels: Option<String>,
    fields: Option<String>,
}

impl Selection {
    fn matches(&self, resource: Resource, object: &Value) -> bool {
        resource == self.resource
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns))
            && self
                .labels
                .as_deref()
                .is_none_or(|s| label_selector_matches(s, object))
            && self
                .fields
                .as_deref()
                .is_none_or(|s| field_selector_matches(s, object))
    }

    /// The watch event `event` is for this selection, if any.
    fn watch_event(&self, event: &HistoryEvent) -> Option<Value> {
        let now = self.matches(event.resource, &event.new);
        let before = event
            .old
            .as_ref()
            .is_some_and(|o| self.matches(event.resource, o));
        let kind = match (event.change, before, now) {
            (Change::Added, _, true) => "ADDED",
            (Change::Deleted, _, true) => "DELETED",
            (Change::Modified, true, true) => "MODIFIED",
            (Change::Modified, false, true) => "ADDED",
            (Change::Modified, true, false) => "DELETED",
            _ => return None,
        };
        Some(json!({"type": kind, "object": event.new}))
    }
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|f| !f.is_empty())
        .map(|f| match f.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(f), String::new()),
        })
        .collect()
}

/// Reads one request; `None` at EOF or on a broken connection.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(Request, Vec<u8>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let mut content_length = 0usize;
    let mut close = false;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 {
            return None;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.trim().parse().ok()?;
            } else if name.eq_ignore_ascii_case("connection") {
                close = value.trim().eq_ignore_ascii_case("close");
            }
        }
    }
    let mut body = vec![0; content_length];
    reader.read_exact(&mut body).ok()?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    Some((
        Request {
            method,
            path: path.to_owned(),
            query: parse_query(query),
            close,
        },
        body,
    ))
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        410 => "Gone",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

fn write_response(stream: &mut TcpStream, code: u16, body: &Value) -> io::Result<()> {
    let body = serde_json::to_vec(body).unwrap();
    write!(
        stream,
        "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        reason_phrase(code),
        body.len()
    )?;
    stream.write_all(&body)?;
    stream.flush()
}

fn write_chunk(stream: &mut TcpStream, line: &Value) -> io::Result<()> {
    let mut data = serde_json::to_vec(line).unwrap();
    data.push(b'\n');
    write!(stream, "{:x}\r\n", data.len())?;
    stream.write_all(&data)?;
    stream.write_all(b"\r\n")?;
    stream.flush()
}

fn serve_connection(inner: &Inner, stream: TcpStream) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut stream = stream;
    while let Some((request, body)) = read_request(&mut reader) {
        let close = request.close;
        let keep_going = handle(inner, &mut stream, request, body);
        if close || !matches!(keep_going, Ok(true)) {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Serves one request; `Ok(false)` means the connection must be closed.
fn handle(
    inner: &Inner,
    stream: &mut TcpStream,
    request: Request,
    body: Vec<u8>,
) -> io::Result<bool> {
    let route = parse_path(&request.path);
    let mut state = inner.lock();
    if state.shutdown {
        return Ok(false);
    }
    state.requests.push(request.clone());
    let Some(route) = route else {
        drop(state);
        write_response(
            stream,
            404,
            &status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        )?;
        return Ok(true);
    };
    match (request.method.as_str(), &route) {
        ("GET", Route::Objects { resource, .. })
            if *resource == Resource::ServiceCidrs && !state.options.serve_service_cidrs =>
        {
            drop(state);
            write_response(
                stream,
                404,
                &status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ),
            )?;
            Ok(true)
        }
        (
            "GET",
            Route::Objects {
                resource,
                namespace,
                name,
            },
        ) => {
            if let Some(code) = state.take_failure(*resource) {
                drop(state);
                write_response(
                    stream,
                    code,
                    &status(code, "InternalError", "injected failure"),
                )?;
                return Ok(true);
            }
            let selection = Selection {
                resource: *resource,
                namespace: namespace.clone(),
                labels: request.param("labelSelector").map(str::to_owned),
                fields: request.param("fieldSelector").map(str::to_owned),
            };
            if let Some(name) = name {
                let key = (
                    *resource,
                    namespace.clone().unwrap_or_default(),
                    name.clone(),
                );
                let found = state.objects.get(&key).cloned();
                drop(state);
                match found {
                    Some(o) => write_response(stream, 200, &o)?,
                    None => write_response(
                        stream,
                        404,
                        &status(
                            404,
                            "NotFound",
                            &format!("{} {name:?} not found", resource.plural()),
                        ),
                    )?,
                }
                return Ok(true);
            }
            if request.is_watch() {
                if request.param("sendInitialEvents") == Some("true") && !state.options.watch_list {
                    drop(state);
                    write_response(
                        stream,
                        422,
                        &status(
                            422,
                            "Invalid",
                            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for \
                             watch unless the WatchList feature gate is enabled",
                        ),
                    )?;
                    return Ok(true);
                }
                drop(state);
                return watch(inner, stream, &request, &selection);
            }
            let page = list_page(&state, &request, &selection);
            drop(state);
            match page {
                Ok(list) => write_response(stream, 200, &list)?,
                Err((code, body)) => write_response(stream, code, &body)?,
            }
            Ok(true)
        }
        (
            "POST",
            Route::Events {
                namespace,
                name: None,
            },
        ) => {
            let mut event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if event.is_object() {
                state.rv += 1;
                event["metadata"]["namespace"] = json!(namespace);
                event["metadata"]["resourceVersion"] = json!(state.rv.to_string());
                state.posted_events.push(event.clone());
                drop(state);
                write_response(stream, 201, &event)?;
            } else {
                drop(state);
                write_response(stream, 400, &status(400, "BadRequest", "not a JSON object"))?;
            }
            Ok(true)
        }
        ("PATCH", Route::Events { name: Some(_), .. }) => {
            let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            drop(state);
            write_response(stream, 200, &patch)?;
            Ok(true)
        }
        ("GET", _) => {
            let doc = discovery(&state, &route);
            drop(state);
            match doc {
                Some(d) => write_response(stream, 200, &d)?,
                None => write_response(
                    stream,
                    404,
                    &status(
                        404,
                        "NotFound",
                        "the server could not find the requested resource",
                    ),
                )?,
            }
            Ok(true)
        }
        _ => {
            drop(state);
            write_response(
                stream,
                405,
                &status(405, "MethodNotAllowed", "method not allowed"),
            )?;
            Ok(true)
        }
    }
}

// ---------------------------------------------------------------------------
// Paged lists
// ---------------------------------------------------------------------------

/// The real server's message for a `continue` token whose resourceVersion has been
/// compacted away.
const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a \
     consistent list result. You can start a new list without the continue parameter.";

/// What a `continue` token carries. The real server's token is base64 of a JSON
/// object with the resourceVersion of the first page and the etcd key to start
/// from; clients must treat it as opaque, so this one is hex of a JSON object with
/// the first page's resourceVersion and the last key returned.
#[derive(Debug, PartialEq)]
struct ContinueToken {
    /// The resourceVersion of the first page (every page reports it).
    rv: u64,
    /// The last key returned (empty for cluster-scoped objects).
    namespace: String,
    name: String,
}

impl ContinueToken {
    fn encode(&self) -> String {
        let json = json!({"v": "fake/v1", "rv": self.rv, "ns": self.namespace, "name": self.name});
        serde_json::to_vec(&json)
            .unwrap_or_default()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn decode(token: &str) -> Result<ContinueToken, String> {
        let bytes = token
            .as_bytes()
            .chunks(2)
            .map(|pair| match pair {
                [hi, lo] if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => {
                    let digits = [*hi, *lo];
                    let digits = std::str::from_utf8(&digits).map_err(|e| e.to_string())?;
                    u8::from_str_radix(digits, 16).map_err(|e| e.to_string())
                }
                _ => Err("not hex".to_owned()),
            })
            .collect::<Result<Vec<u8>, String>>()?;
        let json: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        let field = |key: &str| {
            json[key]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("no {key:?}"))
        };
        if json["v"] != "fake/v1" {
            return Err("unknown version".to_owned());
        }
        Ok(ContinueToken {
            rv: json["rv"].as_u64().ok_or("no \"rv\"")?,
            namespace: field("ns")?,
            name: field("name")?,
        })
    }
}

/// An HTTP status and its Status body.
type ErrorResponse = (u16, Value);

fn bad_request(message: &str) -> ErrorResponse {
    (400, status(400, "BadRequest", message))
}

/// Serves one page of a list request (see the module doc for the protocol).
fn list_page(
    state: &State,
    request: &Request,
    selection: &Selection,
) -> Result<Value, ErrorResponse> {
    let resource = selection.resource;
    let limit = match request.param("limit").filter(|l| !l.is_empty()) {
        None => None,
        // The real server treats a zero or negative limit as none.
        Some(l) => match l.parse::<i64>() {
            Ok(n) if n > 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            Ok(_) => None,
            Err(_) => return Err(bad_request(&format!("invalid limit {l:?}"))),
        },
    };
    let token = match request.param("continue").filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => {
            if request
                .param("resourceVersion")
                .is_some_and(|rv| !rv.is_empty())
            {
                return Err(bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let token = ContinueToken::decode(t)
                .map_err(|e| bad_request(&format!("invalid continue token: {e}")))?;
            if token.rv > state.rv {
                return Err(bad_request(&format!(
                    "invalid continue token: resourceVersion {} is in the future",
                    token.rv
                )));
            }
            // The same bound as a watch's: a list resumed from before it cannot be
            // made consistent by replaying the history.
            if token.rv < state.oldest_watchable {
                return Err((410, status(410, "Expired", CONTINUE_EXPIRED)));
            }
            Some(token)
        }
    };
    let (list_rv, start) = match token {
        Some(t) => (t.rv, Bound::Excluded((resource, t.namespace, t.name))),
        // The empty namespace and name sort first.
        None => (
            state.rv,
            Bound::Included((resource, String::new(), String::new())),
        ),
    };
    let mut matching = state
        .objects
        .range((start, Bound::Unbounded))
        .take_while(|((r, _, _), _)| *r == resource)
        .filter(|((r, _, _), o)| selection.matches(*r, o));
    let page: Vec<(&ObjectKey, &Value)> = matching
        .by_ref()
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    // The real server counts what is left only when no selector filters it; a
    // filtered list only needs to know whether anything is left (counting it
    // would make each page cost the rest of the list).
    let unfiltered = [&selection.labels, &selection.fields]
        .iter()
        .all(|s| s.as_deref().is_none_or(|s| s.trim().is_empty()));
    let (remaining, more) = if unfiltered {
        let n = matching.count();
        (Some(n), n > 0)
    } else {
        (None, matching.next().is_some())
    };
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if let (Some(((_, namespace, name), _)), true) = (page.last(), more) {
        let token = ContinueToken {
            rv: list_rv,
            namespace: namespace.clone(),
            name: name.clone(),
        };
        metadata["continue"] = json!(token.encode());
        if let Some(remaining) = remaining {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    let items: Vec<Value> = page.into_iter().map(|(_, o)| o.clone()).collect();
    Ok(json!({
        "apiVersion": resource.api_version(),
        "kind": format!("{}List", resource.kind()),
        "metadata": metadata,
        "items": items,
    }))
}

/// Keeps `open_watches` right however a watch ends.
struct OpenWatch<'a>(&'a Inner);

impl Drop for OpenWatch<'_> {
    fn drop(&mut self) {
        self.0.lock().open_watches -= 1;
    }
}

fn gone(rv: u64, oldest: u64) -> Value {
    json!({
        "type": "ERROR",
        "object": status(410, "Expired", &format!("too old resource version: {rv} ({oldest})")),
    })
}

fn bookmark(resource: Resource, rv: u64, initial_events_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({
        "type": "BOOKMARK",
        "object": {"apiVersion": resource.api_version(), "kind": resource.kind(), "metadata": meta},
    })
}

/// Streams a watch; `Ok(false)` when the connection was cut.
fn watch(
    inner: &Inner,
    stream: &mut TcpStream,
    request: &Request,
    selection: &Selection,
) -> io::Result<bool> {
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )?;
    stream.flush()?;
    let timeout = request
        .param("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .unwrap_or(290u64);
    let deadline = Instant::now() + Duration::from_secs(timeout);
    let bookmarks = request.param("allowWatchBookmarks") == Some("true");
    let send_initial = request.param("sendInitialEvents") == Some("true");
    let from: Option<u64> = request
        .param("resourceVersion")
        .filter(|rv| !rv.is_empty() && *rv != "0")
        .map(|rv| rv.parse().unwrap_or(0));

    let mut state = inner.lock();
    state.open_watches += 1;
    let _open = OpenWatch(inner);
    let drop_epoch = state.drop_epoch;
    let expire_epoch = state.expire_epoch;
    let mut out = Vec::new();
    let mut cursor = match from {
        Some(rv) if rv < state.oldest_watchable => {
            let oldest = state.oldest_watchable;
            drop(state);
            write_chunk(stream, &gone(rv, oldest))?;
            stream.write_all(b"0\r\n\r\n")?;
            return Ok(true);
        }
        Some(rv) => rv,
        None => {
            for ((r, _, _), o) in &state.objects {
                if selection.matches(*r, o) {
                    out.push(json!({"type": "ADDED", "object": o}));
                }
            }
            if send_initial {
                out.push(bookmark(selection.resource, state.rv, true));
            }
            state.rv
        }
    };
    let mut last_bookmark = Instant::now();
    loop {
        if state.shutdown || state.drop_epoch != drop_epoch {
            drop(state);
            let _ = stream.shutdown(Shutdown::Both);
            return Ok(false);
        }
        if state.expire_epoch != expire_epoch || cursor < state.oldest_watchable {
            let oldest = state.oldest_watchable;
            drop(state);
            for line in &out {
                write_chunk(stream, line)?;
            }
            write_chunk(stream, &gone(cursor, oldest))?;
            stream.write_all(b"0\r\n\r\n")?;
            stream.flush()?;
            return Ok(true);
        }
        for event in state.history.iter().filter(|e| e.rv > cursor) {
            if let Some(line) = selection.watch_event(event) {
                out.push(line);
            }
        }
        cursor = cursor.max(state.rv);
        if bookmarks && last_bookmark.elapsed() >= Duration::from_secs(1) {
            out.push(bookmark(selection.resource, cursor, false));
            last_bookmark = Instant::now();
        }
        if !out.is_empty() {
            drop(state);
            for line in out.drain(..) {
                write_chunk(stream, &line)?;
            }
            state = inner.lock();
            continue;
        }
        let now = Instant::now();
        if now >= deadline {
            drop(state);
            stream.write_all(b"0\r\n\r\n")?;
            stream.flush()?;
            return Ok(true);
        }
        let wait = (deadline - now).min(Duration::from_millis(250));
        state = inner
            .changed
            .wait_timeout(state, wait)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}
