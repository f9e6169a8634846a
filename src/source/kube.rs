//! Kubernetes API source: kube-rs watchers on Services, EndpointSlices, our own Node
//! and (when the API serves them) ServiceCIDRs.
//!
//! Each kind has one watcher task (`watcher(..).default_backoff().modify(..)`). Its
//! events go through [`KindState::apply`], which keeps a fingerprint of each current
//! object per `(namespace, name)` (and the object itself, or with
//! [`Retention::Changes`] only until it is taken), buffers a (re)list between `Init`
//! and `InitDone` and swaps it in whole, and reports whether anything actually
//! changed. Objects are stored without
//! `metadata.resourceVersion` and `metadata.managedFields`, so an update or a relist
//! that only moves those is a no-op and does not wake the sync loop.
//!
//! The initial state comes from a streaming list where the API server serves
//! one ([`ListStrategy::choose`] asks once, at start): each watcher's first watch
//! asks for initial events, which the server sends from its watch cache, so no
//! list is encoded, paged or read from etcd. Elsewhere it is a paged consistent
//! list, then a watch. A relist after 410 Gone takes the same way.
//!
//! The generation counter ([`KubeSource::subscribe`]) stays 0 until every watched kind
//! has completed its first list; it then becomes 1 and is bumped once per event that
//! changed the stored objects.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ::kube::Resource;
use ::kube::api::Api;
use ::kube::config::{Config, InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use ::kube::runtime::WatchStreamExt;
use ::kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use ::kube::runtime::watcher::{self, Event};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;

use super::file::{self, Node as FileNode};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use super::{ObjectChanges, Objects};

/// Label selector of the Service and EndpointSlice watchers (the same as kube-proxy's):
/// objects handled by another proxy, and headless ones, are never even listed.
pub const PROXY_LABEL_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// Label selector of the watch that asks whether the API server streams lists
/// (`sendInitialEvents`): it matches no object, so a server that streams answers
/// with the initial-events-end bookmark alone.
pub const STREAMING_LIST_PROBE_SELECTOR: &str = "kube-nlproxy.io/streaming-list-probe=never";

/// How long the streaming-list probe waits for its bookmark.
const STREAMING_LIST_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// client-go's feature-gate variable for streaming lists; `false` makes the
/// watchers list, as it makes client-go's informers (kube-proxy's) list.
pub const WATCH_LIST_CLIENT_ENV: &str = "KUBE_FEATURE_WatchListClient";

/// The annotation of the bookmark that ends a watch's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// The API group version that serves ServiceCIDRs, when the cluster has them.
const SERVICE_CIDR_GROUP_VERSION: &str = "networking.k8s.io/v1";

/// `reportingController` of the events we post.
const REPORTING_CONTROLLER: &str = "kube-nlproxy";

/// How to reach the API server: kube-proxy's `--kubeconfig`, `--master` and node name.
#[derive(Debug, Clone, Default)]
pub struct KubeSourceConfig {
    /// `--kubeconfig FILE`; without it (and without `master`) the in-cluster
    /// service account configuration is used.
    pub kubeconfig: Option<PathBuf>,
    /// `--master URL`: overrides the cluster URL of the kubeconfig (or, alone, is the
    /// URL of an API server reached without credentials).
    pub master: Option<String>,
    /// Our node's name (`--hostname-override` or the host name).
    pub node_name: String,
    /// `--kube-api-qps`: requests per second (0: client-go's default, 5;
    /// negative: no limit).
    pub qps: f32,
    /// `--kube-api-burst`: requests at once (0: client-go's default, 10).
    pub burst: i32,
}

/// Errors of the API source, named by the phase that failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    /// Neither `--kubeconfig` nor `--master`, and the in-cluster configuration
    /// (service account token, `KUBERNETES_SERVICE_HOST`) is not usable.
    #[error("loading the in-cluster API configuration: {0}")]
    InClusterConfig(#[source] InClusterError),
    /// The `--kubeconfig` file could not be read or parsed.
    #[error("reading kubeconfig {path}: {source}")]
    KubeconfigRead {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: KubeconfigError,
    },
    /// The kubeconfig was read but does not yield a usable configuration (no current
    /// context, missing cluster, bad certificate data, ...).
    #[error("loading kubeconfig {path}: {source}")]
    KubeconfigLoad {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: KubeconfigError,
    },
    /// The kubeconfig would have the client run a program for credentials
    /// (`exec:`, or an `auth-provider` with `cmd-path`): kube-nlproxy runs no
    /// program, ever.
    #[error(
        "kubeconfig {path}: user {user:?} gets its credentials by running a program ({how}); \
         kube-nlproxy runs no program: give it a token, tokenFile or client certificate"
    )]
    ExecCredential {
        /// The file.
        path: PathBuf,
        /// The user entry.
        user: String,
        /// `exec: COMMAND` or `auth-provider cmd-path: COMMAND`.
        how: String,
    },
    /// `--master` is not a URL.
    #[error("--master {url:?} is not a valid URL: {source}")]
    MasterUrl {
        /// The value given.
        url: String,
        /// The cause.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// Building the HTTP client (TLS setup) failed.
    #[error("creating the API client: {0}")]
    ClientBuild(#[source] ::kube::Error),
    /// Asking the API whether it serves `networking.k8s.io/v1` ServiceCIDRs failed
    /// with something other than 404.
    #[error("discovering {SERVICE_CIDR_GROUP_VERSION} ServiceCIDRs: {0}")]
    Discovery(#[source] ::kube::Error),
}

/// Builds the API client: `--kubeconfig` (with `--master` overriding its cluster URL),
/// else `--master` alone, else the in-cluster configuration; its requests are
/// rate-limited by `qps` and `burst` ([`super::api_rate`]). It speaks JSON
/// only: kube-rs reads no protobuf, so `--kube-api-content-type` is not sent.
pub async fn client(cfg: &KubeSourceConfig) -> Result<::kube::Client, KubeSourceError> {
    let master = match &cfg.master {
        Some(url) => Some(
            url.parse::<http::Uri>()
                .map_err(|e| KubeSourceError::MasterUrl {
                    url: url.clone(),
                    source: e,
                })?,
        ),
        None => None,
    };
    let config = match (&cfg.kubeconfig, master) {
        (Some(path), master) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| KubeSourceError::KubeconfigRead {
                    path: path.clone(),
                    source,
                })?;
            if let Some((user, how)) = exec_credentials(&kubeconfig).into_iter().next() {
                return Err(KubeSourceError::ExecCredential {
                    path: path.clone(),
                    user,
                    how,
                });
            }
            let mut config =
                Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(|source| KubeSourceError::KubeconfigLoad {
                        path: path.clone(),
                        source,
                    })?;
            if let Some(url) = master {
                config.cluster_url = url;
            }
            config
        }
        (None, Some(url)) => Config::new(url),
        (None, None) => Config::incluster().map_err(KubeSourceError::InClusterConfig)?,
    };
    let builder =
        ::kube::client::ClientBuilder::try_from(config).map_err(KubeSourceError::ClientBuild)?;
    Ok(match super::api_rate::limit_of(cfg.qps, cfg.burst) {
        Some(limit) => builder.with_layer(&limit).build(),
        None => builder.build(),
    })
}

/// The users of `kubeconfig` whose credentials come from running a program
/// (`exec:`, an `auth-provider` with `cmd-path`), with how. kube's client would
/// run it; we refuse the file instead, whichever context is current.
pub fn exec_credentials(kubeconfig: &Kubeconfig) -> Vec<(String, String)> {
    kubeconfig
        .auth_infos
        .iter()
        .filter_map(|named| {
            let auth = named.auth_info.as_ref()?;
            let how = if let Some(exec) = &auth.exec {
                format!(
                    "exec: {}",
                    exec.command.as_deref().unwrap_or("(no command)")
                )
            } else {
                let provider = auth.auth_provider.as_ref()?;
                let cmd = provider.config.get("cmd-path")?;
                format!("auth-provider {} cmd-path: {cmd}", provider.name)
            };
            Some((named.name.clone(), how))
        })
        .collect()
}

/// `(namespace, name)`; the namespace is empty for cluster-scoped kinds.
type Key = (String, String);

fn key_of<K: Resource>(obj: &K) -> Key {
    let meta = obj.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Clears what changes without the object changing (resourceVersion, managedFields),
/// so stored objects compare equal across no-op updates and relists.
fn strip_volatile<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.resource_version = None;
    meta.managed_fields = None;
}

/// What a kind's store keeps of each object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Every current object: [`KubeSource::snapshot`] returns them all (`plan`,
    /// `--once`, tests).
    Objects,
    /// For Services and EndpointSlices, only a fingerprint of each current object,
    /// and the changed objects until [`KubeSource::take_changes`] hands them over:
    /// the consumer (the model tracker) keeps what it needs, so the source holds no
    /// second copy of the cluster (`run`). The first list is handed over as it
    /// arrives (the generation stays 0 meanwhile, but subscribers are woken), so
    /// the whole cluster is never held as API objects at once. Nodes and
    /// ServiceCIDRs are kept whole.
    Changes,
}

/// A 128-bit hash of an object's JSON form (after [`strip_volatile`]): equal
/// objects have equal fingerprints, and different ones collide with probability
/// 2^-128 under per-process random keys.
type Fingerprint = u128;

/// The two keyed hashers of a kind's fingerprints.
#[derive(Debug, Clone, Default)]
struct Fingerprinter([std::hash::RandomState; 2]);

impl Fingerprinter {
    fn new() -> Self {
        Fingerprinter([std::hash::RandomState::new(), std::hash::RandomState::new()])
    }

    fn of<K: serde::Serialize>(&self, obj: &K) -> Fingerprint {
        use std::hash::{BuildHasher, Hasher};
        struct Both<H>([H; 2]);
        impl<H: Hasher> std::io::Write for Both<H> {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0[0].write(buf);
                self.0[1].write(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut both = Both([self.0[0].build_hasher(), self.0[1].build_hasher()]);
        // Writing to a hasher cannot fail, and serializing a decoded object cannot
        // either; should it, the fingerprint of what was written still differs
        // from a complete one only by chance.
        let _ = serde_json::to_writer(&mut both, obj);
        (u128::from(both.0[0].finish()) << 64) | u128::from(both.0[1].finish())
    }
}

/// An object of a (re)list: its fingerprint, and the object unless the store
/// already holds an equal one it does not need again. Boxed: a buffer entry
/// without its object costs a pointer, not an empty object's size (over 1 KB
/// for a Service, in every slot of the buffer's B-tree nodes).
type Listed<K> = (Fingerprint, Option<Box<K>>);

/// Where one kind's watcher is in its list/watch cycle.
#[derive(Debug)]
enum Phase<K> {
    /// The first list has not completed; its objects collect in `buffer`. Until it
    /// completes, nothing may be synced (the proxy would delete what it has not seen).
    Listing {
        /// Objects of the list so far.
        buffer: BTreeMap<Key, Listed<K>>,
    },
    /// In sync with the API: watch events apply to the objects directly.
    Watching,
    /// A relist is running (after 410 Gone or a failed watch). The objects last seen
    /// stay current until `InitDone` swaps the listed ones in; objects missing from
    /// the relist are deletions.
    Relisting {
        /// Objects of the relist so far.
        buffer: BTreeMap<Key, Listed<K>>,
    },
}

/// One kind's objects and watcher phase.
#[derive(Debug)]
struct KindState<K> {
    /// Whether this kind is watched at all (ServiceCIDRs may not be served).
    watched: bool,
    /// Whether `objects` holds every current object, or only the changed ones not
    /// yet taken ([`Retention::Changes`]).
    keep_objects: bool,
    fingerprinter: Fingerprinter,
    /// The fingerprint of every current object.
    fingerprints: BTreeMap<Key, Fingerprint>,
    /// The current objects without volatile metadata: all of them, or (without
    /// `keep_objects`) those in `dirty`.
    objects: BTreeMap<Key, K>,
    phase: Phase<K>,
    /// Keys whose object changed since the last `take_changes`.
    dirty: BTreeSet<Key>,
}

impl<K: Resource + serde::Serialize> KindState<K> {
    fn new(watched: bool) -> Self {
        Self::with_retention(watched, true)
    }

    fn with_retention(watched: bool, keep_objects: bool) -> Self {
        KindState {
            watched,
            keep_objects,
            fingerprinter: Fingerprinter::new(),
            fingerprints: BTreeMap::new(),
            objects: BTreeMap::new(),
            phase: Phase::Listing {
                buffer: BTreeMap::new(),
            },
            dirty: BTreeSet::new(),
        }
    }

    /// The changed objects since the last call (`None`: deleted), in key order.
    /// Without `keep_objects`, they leave the store.
    fn take_dirty(&mut self) -> Vec<(Key, Option<K>)>
    where
        K: Clone,
    {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|k| {
                let obj = match self.keep_objects {
                    true => self.objects.get(&k).cloned(),
                    false => self.objects.remove(&k),
                };
                (k, obj)
            })
            .collect()
    }

    /// Whether the first list has completed (or the kind is not watched).
    fn ready(&self) -> bool {
        !self.watched || !matches!(self.phase, Phase::Listing { .. })
    }

    /// Applies one watcher event; returns whether the current objects changed
    /// (or, during a streamed first list, whether objects wait to be taken).
    /// Unchanged objects (equal after [`strip_volatile`]) are no-ops.
    fn apply(&mut self, event: Event<K>) -> bool {
        let phase = std::mem::replace(&mut self.phase, Phase::Watching);
        let (changed, next) = self.step(phase, event);
        self.phase = next;
        changed
    }

    /// Advances by one event: whether the current objects changed, and the next
    /// phase.
    fn step(&mut self, phase: Phase<K>, event: Event<K>) -> (bool, Phase<K>) {
        match (phase, event) {
            // A restarted first list starts over; a restart after that is a relist.
            (Phase::Listing { .. }, Event::Init) => (
                false,
                Phase::Listing {
                    buffer: BTreeMap::new(),
                },
            ),
            (Phase::Watching | Phase::Relisting { .. }, Event::Init) => (
                false,
                Phase::Relisting {
                    buffer: BTreeMap::new(),
                },
            ),
            // Without `keep_objects`, the first list is handed over as it
            // arrives: the consumer may take it before the kind is ready (it must
            // not sync on it), so the objects never collect here. The buffer keeps
            // the listed keys, so that objects of a restarted list that the new one
            // misses are deletions at `InitDone`.
            (Phase::Listing { mut buffer }, Event::InitApply(obj)) if !self.keep_objects => {
                let (key, fingerprint, changed) = self.make_current(obj);
                buffer.insert(key, (fingerprint, None));
                (changed, Phase::Listing { buffer })
            }
            (Phase::Listing { mut buffer }, Event::InitApply(obj)) => {
                let (key, listed) = self.listed(obj);
                buffer.insert(key, listed);
                (false, Phase::Listing { buffer })
            }
            (Phase::Relisting { mut buffer }, Event::InitApply(obj)) => {
                let (key, listed) = self.listed(obj);
                buffer.insert(key, listed);
                (false, Phase::Relisting { buffer })
            }
            (Phase::Listing { buffer } | Phase::Relisting { buffer }, Event::InitDone) => {
                (self.swap_in(buffer), Phase::Watching)
            }
            (Phase::Watching, Event::InitDone) => (false, Phase::Watching),
            // Watch events. The watcher sends none between Init and InitDone, but
            // should one come, it applies to the current objects and the phase stays.
            (phase, Event::Apply(obj) | Event::InitApply(obj)) => {
                let (_, _, changed) = self.make_current(obj);
                (changed, phase)
            }
            (phase, Event::Delete(obj)) => {
                let key = key_of(&obj);
                let changed = self.fingerprints.remove(&key).is_some();
                if changed {
                    self.objects.remove(&key);
                    self.dirty.insert(key);
                }
                (changed, phase)
            }
        }
    }

    /// Makes `obj` current: its fingerprint, and the object until it is taken
    /// (or for good with `keep_objects`), dirty when it changed. Returns its key,
    /// its fingerprint and whether it changed.
    fn make_current(&mut self, obj: K) -> (Key, Fingerprint, bool) {
        let key = key_of(&obj);
        let fingerprint = self.fingerprinter.of(&obj);
        let changed = self.fingerprints.get(&key) != Some(&fingerprint);
        if changed {
            self.dirty.insert(key.clone());
            self.fingerprints.insert(key.clone(), fingerprint);
            self.objects.insert(key.clone(), obj);
        }
        (key, fingerprint, changed)
    }

    /// A listed object for the buffer: without `keep_objects`, one equal to the
    /// current object is kept as its fingerprint only.
    fn listed(&self, obj: K) -> (Key, Listed<K>) {
        let key = key_of(&obj);
        let fingerprint = self.fingerprinter.of(&obj);
        let needed = self.keep_objects || self.fingerprints.get(&key) != Some(&fingerprint);
        (key, (fingerprint, needed.then(|| Box::new(obj))))
    }

    /// Makes a completed (re)list current: what it changed (added, changed and
    /// missing keys) becomes dirty. Returns whether anything changed.
    fn swap_in(&mut self, buffer: BTreeMap<Key, Listed<K>>) -> bool {
        let mut changed = false;
        let gone: Vec<Key> = self
            .fingerprints
            .keys()
            .filter(|k| !buffer.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            self.fingerprints.remove(&key);
            self.objects.remove(&key);
            self.dirty.insert(key);
            changed = true;
        }
        for (key, (fingerprint, obj)) in buffer {
            let same = self.fingerprints.get(&key) == Some(&fingerprint);
            match obj {
                Some(obj) if !same => {
                    self.fingerprints.insert(key.clone(), fingerprint);
                    self.objects.insert(key.clone(), *obj);
                    self.dirty.insert(key);
                    changed = true;
                }
                // Equal to the current one (kept as is), or left out as equal
                // when listed and changed since by a watch event, which is newer.
                Some(_) | None => {}
            }
        }
        changed
    }
}

/// Everything the watchers write.
#[derive(Debug)]
struct Stores {
    services: KindState<Service>,
    endpoint_slices: KindState<EndpointSlice>,
    nodes: KindState<Node>,
    service_cidrs: KindState<ServiceCIDR>,
}

impl Stores {
    fn ready(&self) -> bool {
        self.services.ready()
            && self.endpoint_slices.ready()
            && self.nodes.ready()
            && self.service_cidrs.ready()
    }
}

/// State shared by the watcher tasks and [`KubeSource`].
#[derive(Debug)]
struct Shared {
    stores: Mutex<Stores>,
    generation: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Stores> {
        self.stores.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies an event to the kind `slot` selects; bumps the generation when the
    /// objects changed after every kind is ready, or when this event made them ready.
    fn apply<K: Resource + serde::Serialize>(
        &self,
        event: Event<K>,
        slot: fn(&mut Stores) -> &mut KindState<K>,
    ) {
        let mut stores = self.lock();
        let was_ready = stores.ready();
        let changed = slot(&mut stores).apply(event);
        if stores.ready() && (changed || !was_ready) {
            self.generation.send_modify(|g| *g += 1);
        } else if changed {
            // Objects of a streamed first list wait in `take_changes`: wake the
            // consumer, without a generation (nothing may be synced yet).
            self.generation.send_modify(|_| {});
        }
    }
}

/// How the watchers get the objects at start and after a relist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// A consistent list in pages of 500 (kube's watcher's default), then a watch
    /// from the list's resourceVersion. Every API server serves it; each list is
    /// read from etcd or, with `ConsistentListFromCache`, copied out of the watch
    /// cache and encoded as one response per page.
    List,
    /// A watch with `sendInitialEvents=true` (`resourceVersionMatch=NotOlderThan`
    /// at `0`): the API server streams the current objects from its watch cache as
    /// ADDED events, then the initial-events-end bookmark, then goes on watching
    /// (KEP-3157, "streaming lists"; beta and served by default since v1.32).
    Stream,
}

impl ListStrategy {
    /// What the API server serves: [`Stream`](Self::Stream) when a watch of
    /// Services asking for initial events, with [`STREAMING_LIST_PROBE_SELECTOR`],
    /// ends its (empty) initial events with the bookmark within 5 s; else
    /// [`List`](Self::List) (a server without the feature answers 422, or ignores
    /// `sendInitialEvents` and never sends the bookmark). `KUBE_FEATURE_WatchListClient=false`
    /// in the environment chooses `List` without asking. Costs one request.
    pub async fn choose(client: &::kube::Client) -> ListStrategy {
        if std::env::var(WATCH_LIST_CLIENT_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("false")) {
            tracing::info!("initial lists: listed ({WATCH_LIST_CLIENT_ENV}=false)");
            return ListStrategy::List;
        }
        match tokio::time::timeout(STREAMING_LIST_PROBE_TIMEOUT, Self::probe(client)).await {
            Ok(Ok(())) => {
                tracing::info!(
                    "initial lists: streamed from the API server's watch cache (sendInitialEvents)"
                );
                ListStrategy::Stream
            }
            Ok(Err(why)) => {
                tracing::info!("initial lists: listed (the API server streams none: {why})");
                ListStrategy::List
            }
            Err(_) => {
                tracing::info!(
                    "initial lists: listed (no initial-events-end bookmark within {:?})",
                    STREAMING_LIST_PROBE_TIMEOUT
                );
                ListStrategy::List
            }
        }
    }

    /// The probe watch: `Ok` once its initial-events-end bookmark arrives, else
    /// why not.
    async fn probe(client: &::kube::Client) -> Result<(), String> {
        let params = ::kube::api::WatchParams::streaming_lists()
            .labels(STREAMING_LIST_PROBE_SELECTOR)
            .timeout(STREAMING_LIST_PROBE_TIMEOUT.as_secs() as u32);
        let api = Api::<::kube::core::PartialObjectMeta<Service>>::all(client.clone());
        let stream = api
            .watch_metadata(&params, "0")
            .await
            .map_err(|e| e.to_string())?;
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event.map_err(|e| e.to_string())? {
                ::kube::api::WatchEvent::Bookmark(b)
                    if b.metadata
                        .annotations
                        .get(INITIAL_EVENTS_END)
                        .map(String::as_str)
                        == Some("true") =>
                {
                    return Ok(());
                }
                ::kube::api::WatchEvent::Error(e) => return Err(e.to_string()),
                _ => {}
            }
        }
        Err("the watch ended before the initial-events-end bookmark".into())
    }

    /// `config` with this strategy.
    fn apply(self, config: watcher::Config) -> watcher::Config {
        match self {
            ListStrategy::List => config,
            ListStrategy::Stream => config.streaming_lists(),
        }
    }
}

/// Watches the API and keeps the objects the proxy needs. Dropping it stops the
/// watchers.
#[derive(Debug)]
pub struct KubeSource {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    service_cidrs: bool,
    list_strategy: ListStrategy,
}

impl KubeSource {
    /// Starts the watchers: Services and EndpointSlices with
    /// [`PROXY_LABEL_SELECTOR`], the Node named `node_name`, and ServiceCIDRs when
    /// the API serves `networking.k8s.io/v1` `servicecidrs` (a 404 on the group means
    /// it does not; any other discovery error is returned). Must be called inside a
    /// tokio runtime. The watchers retry with kube's default backoff forever.
    pub async fn start(
        client: ::kube::Client,
        node_name: &str,
    ) -> Result<KubeSource, KubeSourceError> {
        Self::start_with(client, node_name, Retention::Objects).await
    }

    /// Like [`start`](Self::start), keeping what `retention` says of each object.
    pub async fn start_with(
        client: ::kube::Client,
        node_name: &str,
        retention: Retention,
    ) -> Result<KubeSource, KubeSourceError> {
        let keep_objects = retention == Retention::Objects;
        let service_cidrs = serves_service_cidrs(&client).await?;
        if !service_cidrs {
            tracing::info!(
                "the API does not serve {SERVICE_CIDR_GROUP_VERSION} ServiceCIDRs; not watching them"
            );
        }
        let list_strategy = ListStrategy::choose(&client).await;
        let (generation, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            stores: Mutex::new(Stores {
                services: KindState::with_retention(true, keep_objects),
                endpoint_slices: KindState::with_retention(true, keep_objects),
                nodes: KindState::new(true),
                service_cidrs: KindState::new(service_cidrs),
            }),
            generation,
        });
        let config = || list_strategy.apply(watcher::Config::default());
        let proxied = config().labels(PROXY_LABEL_SELECTOR);
        let mut tasks = vec![
            spawn_watcher::<Service>(client.clone(), proxied.clone(), shared.clone(), |s| {
                &mut s.services
            }),
            spawn_watcher::<EndpointSlice>(client.clone(), proxied, shared.clone(), |s| {
                &mut s.endpoint_slices
            }),
            spawn_watcher::<Node>(
                client.clone(),
                config().fields(&format!("metadata.name={node_name}")),
                shared.clone(),
                |s| &mut s.nodes,
            ),
        ];
        if service_cidrs {
            tasks.push(spawn_watcher::<ServiceCIDR>(
                client,
                config(),
                shared.clone(),
                |s| &mut s.service_cidrs,
            ));
        }
        Ok(KubeSource {
            shared,
            tasks,
            service_cidrs,
            list_strategy,
        })
    }

    /// The generation counter: 0 until every watcher has completed its first list,
    /// then bumped once per applied event that changed the objects.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.generation.subscribe()
    }

    /// The current objects, each kind sorted by `(namespace, name)`. The objects carry
    /// no `resourceVersion` or `managedFields`. With [`Retention::Changes`], only the
    /// Services and EndpointSlices changed since the last [`take_changes`](Self::take_changes).
    pub fn snapshot(&self) -> Objects {
        let stores = self.shared.lock();
        Objects {
            services: stores.services.objects.values().cloned().collect(),
            endpoint_slices: stores.endpoint_slices.objects.values().cloned().collect(),
            nodes: stores.nodes.objects.values().cloned().collect(),
            service_cidrs: stores.service_cidrs.objects.values().cloned().collect(),
        }
    }

    /// The objects changed since the last call (every object on the first call
    /// after the initial lists), each kind in key order. O(changed objects).
    /// With [`Retention::Changes`], Services and EndpointSlices of the first lists
    /// can be taken before [`subscribe`](Self::subscribe)'s generation is 1 (it
    /// wakes its receivers when some arrived): they are for the model only, and
    /// nothing may be synced before the generation is 1.
    pub fn take_changes(&self) -> ObjectChanges {
        let mut stores = self.shared.lock();
        let nodes = (!stores.nodes.dirty.is_empty()).then(|| {
            stores.nodes.dirty.clear();
            stores.nodes.objects.values().cloned().collect()
        });
        let service_cidrs = (!stores.service_cidrs.dirty.is_empty()).then(|| {
            stores.service_cidrs.dirty.clear();
            stores.service_cidrs.objects.values().cloned().collect()
        });
        ObjectChanges {
            services: stores.services.take_dirty(),
            endpoint_slices: stores.endpoint_slices.take_dirty(),
            nodes,
            service_cidrs,
        }
    }

    /// Whether every watcher has completed its first list.
    pub fn ready(&self) -> bool {
        self.shared.lock().ready()
    }

    /// How the watchers get their initial state ([`ListStrategy::choose`] at start).
    pub fn list_strategy(&self) -> ListStrategy {
        self.list_strategy
    }

    /// Whether ServiceCIDRs are watched (the API served them at start).
    pub fn watches_service_cidrs(&self) -> bool {
        self.service_cidrs
    }
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Whether the API serves `networking.k8s.io/v1` `servicecidrs`.
async fn serves_service_cidrs(client: &::kube::Client) -> Result<bool, KubeSourceError> {
    match client
        .list_api_group_resources(SERVICE_CIDR_GROUP_VERSION)
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "servicecidrs")),
        Err(::kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(KubeSourceError::Discovery(e)),
    }
}

/// Spawns the watcher task of one kind; its events go to the kind `slot` selects.
fn spawn_watcher<K>(
    client: ::kube::Client,
    config: watcher::Config,
    shared: Arc<Shared>,
    slot: fn(&mut Stores) -> &mut KindState<K>,
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync,
    K: serde::Serialize,
    K: Default + 'static,
{
    tokio::spawn(async move {
        let kind = K::kind(&());
        let api = Api::<Lenient<K>>::all(client);
        let stream = watcher::watcher(api, config)
            .default_backoff()
            .modify(strip_volatile::<Lenient<K>>);
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    if let Some(event) = valid_event(event) {
                        shared.apply(event, slot);
                    }
                }
                Err(e) => tracing::warn!(%kind, "watch failed, retrying with backoff: {e}"),
            }
        }
    })
}

/// An object as the API server sent it: `K` when it decodes, else its metadata
/// and what did not decode, with the field's path. kube decodes a list as a
/// whole, so one malformed object would otherwise stop its whole kind (no first
/// list, no sync at all). A real API server validates types; this is for one
/// that does not, or a proxy or conversion in between.
#[derive(Debug, Clone)]
enum Lenient<K> {
    Valid(K),
    Invalid {
        metadata: Box<ObjectMeta>,
        error: String,
    },
}

/// The name under which serde_json hands a value over as its JSON text (its
/// `RawValue` token, `raw_value` feature).
const RAW_JSON_TOKEN: &str = "$serde_json::private::RawValue";

impl<K: DeserializeOwned> Lenient<K> {
    /// From the object's JSON text: decoded straight into `K` (one pass, as kube
    /// would); only when that fails is it read as a value tree, for the field that
    /// failed and the object's name.
    fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        match serde_json::from_str::<K>(text) {
            Ok(k) => Ok(Lenient::Valid(k)),
            Err(_) => Ok(Lenient::from_node(&serde_json::from_str::<FileNode>(text)?)),
        }
    }

    /// From a value tree: `K`, or its metadata and the path of the field that
    /// does not decode.
    fn from_node(node: &FileNode) -> Self {
        match file::convert::<K>(node) {
            Ok(k) => Lenient::Valid(k),
            Err(error) => Lenient::Invalid {
                metadata: Box::new(
                    node.get("metadata")
                        .and_then(|m| file::convert::<ObjectMeta>(m).ok())
                        .unwrap_or_default(),
                ),
                error,
            },
        }
    }
}

impl<'de, K: DeserializeOwned> serde::Deserialize<'de> for Lenient<K> {
    /// serde_json (a list's items, a watch event whose `type` comes before its
    /// `object`) hands over the object's JSON text, which decodes in one pass.
    /// A deserializer that does not (serde's buffer for a watch event whose
    /// `object` comes first) goes through the value tree.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_newtype_struct(RAW_JSON_TOKEN, LenientVisitor(std::marker::PhantomData))
    }
}

struct LenientVisitor<K>(std::marker::PhantomData<K>);

impl<'de, K: DeserializeOwned> serde::de::Visitor<'de> for LenientVisitor<K> {
    type Value = Lenient<K>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Kubernetes object")
    }

    /// serde_json's raw value: a map of one entry, the token and the JSON text.
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        if map.next_key::<serde::de::IgnoredAny>()?.is_none() {
            return Err(A::Error::custom("expected an object's JSON text"));
        }
        map.next_value_seed(self)
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Lenient::from_json(text).map_err(E::custom)
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Lenient::from_json(text).map_err(E::custom)
    }

    fn visit_newtype_struct<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> Result<Self::Value, D::Error> {
        Ok(Lenient::from_node(
            &<FileNode as serde::Deserialize>::deserialize(d)?,
        ))
    }
}

impl<'de, K: DeserializeOwned> serde::de::DeserializeSeed<'de> for LenientVisitor<K> {
    type Value = Lenient<K>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Valid(k) => k.meta(),
            Lenient::Invalid { metadata, .. } => metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Valid(k) => k.meta_mut(),
            Lenient::Invalid { metadata, .. } => metadata,
        }
    }
}

/// The event for the store: a malformed object is one warning naming it and
/// the field, and is as if absent (a delete when it replaces a good version).
fn valid_event<K: Resource<DynamicType = ()> + Default>(
    event: Event<Lenient<K>>,
) -> Option<Event<K>> {
    let valid = |obj: Lenient<K>| -> Result<K, K> {
        match obj {
            Lenient::Valid(k) => Ok(k),
            Lenient::Invalid { metadata, error } => {
                let (ns, name) = (
                    metadata.namespace.clone().unwrap_or_default(),
                    metadata.name.clone().unwrap_or_default(),
                );
                let kind = K::kind(&());
                match ns.is_empty() {
                    true => tracing::warn!("skipping invalid {kind} {name}: {error}"),
                    false => tracing::warn!("skipping invalid {kind} {ns}/{name}: {error}"),
                }
                let mut placeholder = K::default();
                *placeholder.meta_mut() = *metadata;
                Err(placeholder)
            }
        }
    };
    Some(match event {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::InitApply(obj) => Event::InitApply(valid(obj).ok()?),
        Event::Apply(obj) => match valid(obj) {
            Ok(k) => Event::Apply(k),
            Err(gone) => Event::Delete(gone),
        },
        Event::Delete(obj) => Event::Delete(valid(obj).unwrap_or_else(|gone| gone)),
    })
}

/// Posts an `events.k8s.io/v1` Event "Starting" regarding our Node, as kube-proxy
/// does at start-up. Best effort: a failure is logged and otherwise ignored.
pub async fn post_starting_event(client: &::kube::Client, node_name: &str) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some(node_name.into()),
        },
    );
    // kube-proxy refers to its Node with the node name as UID.
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node_name.into()),
        uid: Some(node_name.into()),
        ..ObjectReference::default()
    };
    let event = KubeEvent {
        type_: EventType::Normal,
        reason: "Starting".into(),
        note: Some("Starting kube-nlproxy.".into()),
        action: "StartKubeProxy".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &regarding).await {
        tracing::warn!(node = node_name, "posting the Starting event failed: {e}");
    }
}

impl super::ObjectSource for KubeSource {
    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        KubeSource::subscribe(self)
    }

    fn snapshot(&self) -> Objects {
        KubeSource::snapshot(self)
    }

    fn take_changes(&self) -> Option<ObjectChanges> {
        Some(KubeSource::take_changes(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn kubeconfig_users_that_run_programs_are_found() {
        let k = Kubeconfig::from_yaml(
            "apiVersion: v1\nkind: Config\nusers:\n\
             - name: token\n  user:\n    tokenFile: /var/run/token\n\
             - name: plugin\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /usr/bin/aws\n\
             - name: gcp\n  user:\n    auth-provider:\n      name: gcp\n      config:\n        cmd-path: /usr/bin/gcloud\n\
             - name: oidc\n  user:\n    auth-provider:\n      name: oidc\n      config:\n        id-token: x\n",
        )
        .unwrap();
        assert_eq!(
            exec_credentials(&k),
            [
                ("plugin".to_string(), "exec: /usr/bin/aws".to_string()),
                (
                    "gcp".to_string(),
                    "auth-provider gcp cmd-path: /usr/bin/gcloud".to_string()
                ),
            ]
        );
    }

    fn svc(name: &str, rv: &str, ip: &str) -> Service {
        let mut s = Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                cluster_ip: Some(ip.into()),
                ..Default::default()
            }),
            ..Service::default()
        };
        strip_volatile(&mut s);
        s
    }

    #[test]
    fn first_list_then_events() {
        let mut k = KindState::<Service>::new(true);
        assert!(!k.ready());
        assert!(!k.apply(Event::Init));
        assert!(!k.apply(Event::InitApply(svc("a", "1", "10.0.0.1"))));
        assert!(!k.ready());
        assert!(k.apply(Event::InitDone));
        assert!(k.ready());
        assert_eq!(k.objects.len(), 1);
        // Same content, new resourceVersion (stripped): no-op.
        assert!(!k.apply(Event::Apply(svc("a", "2", "10.0.0.1"))));
        assert!(k.apply(Event::Apply(svc("a", "3", "10.0.0.2"))));
        assert!(k.apply(Event::Apply(svc("b", "4", "10.0.0.3"))));
        assert!(k.apply(Event::Delete(svc("b", "5", "10.0.0.3"))));
        assert!(!k.apply(Event::Delete(svc("b", "5", "10.0.0.3"))));
        assert_eq!(k.objects.len(), 1);
    }

    #[test]
    fn relist_swaps_and_surfaces_deletions() {
        let mut k = KindState::<Service>::new(true);
        k.apply(Event::Init);
        k.apply(Event::InitApply(svc("a", "1", "10.0.0.1")));
        k.apply(Event::InitApply(svc("b", "2", "10.0.0.2")));
        k.apply(Event::InitDone);
        // Identical relist: nothing changed; the old objects stay visible meanwhile.
        assert!(!k.apply(Event::Init));
        assert!(!k.apply(Event::InitApply(svc("a", "1", "10.0.0.1"))));
        assert_eq!(k.objects.len(), 2);
        assert!(!k.apply(Event::InitApply(svc("b", "2", "10.0.0.2"))));
        assert!(!k.apply(Event::InitDone));
        assert!(k.ready());
        // A relist without b deletes b.
        k.apply(Event::Init);
        assert!(k.ready(), "a relist keeps the kind ready");
        k.apply(Event::InitApply(svc("a", "1", "10.0.0.1")));
        assert!(k.apply(Event::InitDone));
        assert_eq!(
            k.objects.keys().cloned().collect::<Vec<_>>(),
            [("ns".to_string(), "a".to_string())]
        );
    }

    #[test]
    fn changes_retention_keeps_fingerprints_and_hands_objects_over() {
        let mut k = KindState::<Service>::with_retention(true, false);
        k.apply(Event::Init);
        assert!(k.apply(Event::InitApply(svc("a", "1", "10.0.0.1"))));
        assert!(k.apply(Event::InitApply(svc("b", "2", "10.0.0.2"))));
        // Handed over as listed: InitDone itself changes nothing more.
        assert!(!k.apply(Event::InitDone));
        let first = k.take_dirty();
        assert_eq!(first.len(), 2);
        assert!(first.iter().all(|(_, o)| o.is_some()));
        assert!(k.objects.is_empty(), "taken objects leave the store");
        assert_eq!(k.fingerprints.len(), 2);
        // A no-op update is still recognised without the object.
        assert!(!k.apply(Event::Apply(svc("a", "3", "10.0.0.1"))));
        assert!(k.take_dirty().is_empty());
        assert!(k.apply(Event::Apply(svc("a", "4", "10.0.0.9"))));
        let changed = k.take_dirty();
        assert_eq!(changed.len(), 1);
        assert_eq!(
            changed[0]
                .1
                .as_ref()
                .and_then(|s| s.spec.as_ref()?.cluster_ip.clone()),
            Some("10.0.0.9".to_string())
        );
        // A relist: b unchanged (not kept), a changed back, c new, nothing else.
        k.apply(Event::Init);
        k.apply(Event::InitApply(svc("a", "5", "10.0.0.1")));
        k.apply(Event::InitApply(svc("b", "6", "10.0.0.2")));
        k.apply(Event::InitApply(svc("c", "7", "10.0.0.3")));
        assert!(k.apply(Event::InitDone));
        let names: Vec<String> = k.take_dirty().into_iter().map(|(k, _)| k.1).collect();
        assert_eq!(names, ["a", "c"]);
        assert!(k.objects.is_empty());
        // A relist without b: b is deleted (no object).
        k.apply(Event::Init);
        k.apply(Event::InitApply(svc("a", "8", "10.0.0.1")));
        k.apply(Event::InitApply(svc("c", "9", "10.0.0.3")));
        assert!(k.apply(Event::InitDone));
        let gone = k.take_dirty();
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].0.1, "b");
        assert!(gone[0].1.is_none());
        assert!(k.apply(Event::Delete(svc("a", "10", "10.0.0.1"))));
        assert_eq!(k.take_dirty()[0].1, None);
        assert_eq!(k.fingerprints.len(), 1);
    }

    #[test]
    fn changes_retention_streams_the_first_list() {
        let mut k = KindState::<Service>::with_retention(true, false);
        k.apply(Event::Init);
        assert!(k.apply(Event::InitApply(svc("a", "1", "10.0.0.1"))));
        assert!(!k.ready());
        let early = k.take_dirty();
        assert_eq!(early.len(), 1);
        assert!(early[0].1.is_some());
        assert!(
            k.objects.is_empty(),
            "a taken listed object leaves the store"
        );
        // The list restarts and does not have a: a is deleted at InitDone, b new.
        k.apply(Event::Init);
        assert!(k.apply(Event::InitApply(svc("b", "2", "10.0.0.2"))));
        assert!(k.apply(Event::InitDone));
        assert!(k.ready());
        let rest: Vec<(String, bool)> = k
            .take_dirty()
            .into_iter()
            .map(|(k, o)| (k.1, o.is_some()))
            .collect();
        assert_eq!(rest, [("a".to_string(), false), ("b".to_string(), true)]);
        // A listed object equal to one already handed over is not handed again.
        let mut k = KindState::<Service>::with_retention(true, false);
        k.apply(Event::Init);
        k.apply(Event::InitApply(svc("a", "1", "10.0.0.1")));
        k.take_dirty();
        k.apply(Event::Init);
        assert!(!k.apply(Event::InitApply(svc("a", "2", "10.0.0.1"))));
        assert!(!k.apply(Event::InitDone));
        assert!(k.take_dirty().is_empty());
    }

    #[test]
    fn streamed_first_list_wakes_without_a_generation() {
        let (generation, mut rx) = watch::channel(0);
        let shared = Shared {
            stores: Mutex::new(Stores {
                services: KindState::with_retention(true, false),
                endpoint_slices: KindState::with_retention(true, false),
                nodes: KindState::new(true),
                service_cidrs: KindState::new(false),
            }),
            generation,
        };
        rx.borrow_and_update();
        shared.apply(Event::Init, |s| &mut s.services);
        assert!(!rx.has_changed().unwrap());
        shared.apply(Event::InitApply(svc("a", "1", "10.0.0.1")), |s| {
            &mut s.services
        });
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 0);
        assert_eq!(shared.lock().services.take_dirty().len(), 1);
    }

    #[test]
    fn fingerprints_tell_objects_apart() {
        let f = Fingerprinter::new();
        assert_eq!(
            f.of(&svc("a", "1", "10.0.0.1")),
            f.of(&svc("a", "2", "10.0.0.1"))
        );
        assert_ne!(
            f.of(&svc("a", "1", "10.0.0.1")),
            f.of(&svc("a", "1", "10.0.0.2"))
        );
        assert_ne!(
            f.of(&svc("a", "1", "10.0.0.1")),
            f.of(&svc("b", "1", "10.0.0.1"))
        );
    }

    /// An object decodes alike whether serde_json hands it over as text (a list's
    /// items, a watch event with `type` first) or serde buffers it (a watch event
    /// with `object` first); a malformed one is `Invalid` with its name and the
    /// failing field's path in every envelope.
    #[test]
    fn lenient_objects_decode_alike_in_every_envelope() {
        use ::kube::core::{ObjectList, WatchEvent};
        let good = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"good","namespace":"ns","labels":{"a":"b"}},"spec":{"clusterIP":"10.96.0.1","ports":[{"port":80,"targetPort":"http","protocol":"TCP"}]}}"#;
        let bad = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"bad","namespace":"ns"},"spec":{"ports":[{"port":"eighty"}]}}"#;
        let expected: Service = serde_json::from_str(good).unwrap();
        let check = |objects: Vec<Lenient<Service>>, envelope: &str| {
            let [valid, invalid] = <[_; 2]>::try_from(objects).expect("two objects");
            match valid {
                Lenient::Valid(s) => assert_eq!(s, expected, "{envelope}"),
                Lenient::Invalid { error, .. } => panic!("{envelope}: {error}"),
            }
            match invalid {
                Lenient::Invalid { metadata, error } => {
                    assert_eq!(metadata.name.as_deref(), Some("bad"), "{envelope}");
                    assert!(error.contains("spec.ports[0].port"), "{envelope}: {error}");
                }
                Lenient::Valid(_) => panic!("{envelope}: a port of \"eighty\" decoded"),
            }
        };
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"ServiceList","metadata":{{"resourceVersion":"5"}},"items":[{good},{bad}]}}"#
        );
        let list: ObjectList<Lenient<Service>> = serde_json::from_str(&list).unwrap();
        check(list.items, "list");
        let event = |text: &str| -> Lenient<Service> {
            match serde_json::from_str::<WatchEvent<Lenient<Service>>>(text).unwrap() {
                WatchEvent::Added(o) => o,
                _ => panic!("not ADDED: {text}"),
            }
        };
        let type_first = |o: &str| format!(r#"{{"type":"ADDED","object":{o}}}"#);
        let object_first = |o: &str| format!(r#"{{"object":{o},"type":"ADDED"}}"#);
        check(
            vec![event(&type_first(good)), event(&type_first(bad))],
            "watch event, type first",
        );
        check(
            vec![event(&object_first(good)), event(&object_first(bad))],
            "watch event, object first",
        );
        // From a reader, the text is handed over owned.
        let owned: Vec<Lenient<Service>> =
            serde_json::from_reader(format!("[{good},{bad}]").as_bytes()).unwrap();
        check(owned, "reader");
    }

    #[test]
    fn unwatched_kind_is_ready() {
        assert!(KindState::<ServiceCIDR>::new(false).ready());
    }

    #[test]
    fn generation_waits_for_every_kind() {
        let (generation, rx) = watch::channel(0);
        let shared = Shared {
            stores: Mutex::new(Stores {
                services: KindState::new(true),
                endpoint_slices: KindState::new(true),
                nodes: KindState::new(true),
                service_cidrs: KindState::new(false),
            }),
            generation,
        };
        shared.apply(Event::Init, |s| &mut s.services);
        shared.apply(Event::InitApply(svc("a", "1", "10.0.0.1")), |s| {
            &mut s.services
        });
        shared.apply(Event::InitDone, |s| &mut s.services);
        shared.apply(Event::Init, |s| &mut s.endpoint_slices);
        shared.apply(Event::InitDone, |s| &mut s.endpoint_slices);
        assert_eq!(*rx.borrow(), 0);
        shared.apply(Event::Init, |s| &mut s.nodes);
        shared.apply(Event::InitDone, |s| &mut s.nodes);
        assert_eq!(*rx.borrow(), 1);
        shared.apply(Event::Apply(svc("a", "2", "10.0.0.1")), |s| &mut s.services);
        assert_eq!(*rx.borrow(), 1);
        shared.apply(Event::Apply(svc("a", "3", "10.0.0.9")), |s| &mut s.services);
        assert_eq!(*rx.borrow(), 2);
    }
}
