//! `source::kube` against the fake API server of `tests/common/apiserver.rs`, through
//! the real kube client: initial sync gating, label/field selectors, event
//! application, no-op suppression, recovery from cut watches and 410 Gone relists,
//! ServiceCIDR discovery, paged initial lists, the Starting event, and client
//! configuration; and the fake server's own protocol (selectors, paging, 410s).
//!
//! No root needed.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::apiserver::{FakeApiServer, Options, Resource};
use kube::ResourceExt;
use kube_nlproxy::source::kube::{
    KubeSource, KubeSourceConfig, KubeSourceError, ListStrategy, PROXY_LABEL_SELECTOR,
    STREAMING_LIST_PROBE_SELECTOR, client, post_starting_event,
};
use serde_json::{Value, json};
use tokio::sync::watch::Receiver;

const NODE: &str = "node-a";
/// Recovery paths go through kube's backoff (0.8 s doubling, jitter).
const RECOVERY: Duration = Duration::from_secs(30);
/// How long "nothing more happens" is watched for.
const QUIET: Duration = Duration::from_millis(700);

fn service(name: &str, ip: &str) -> Value {
    service_labelled(name, ip, json!({}))
}

fn service_labelled(name: &str, ip: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
        },
    })
}

fn slice(name: &str, service: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": name, "namespace": "default",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}, "nodeName": NODE}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    })
}

fn node(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    })
}

fn service_cidr(name: &str, cidr: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": [cidr]},
    })
}

fn names<K: ResourceExt>(objects: &[K]) -> Vec<String> {
    objects.iter().map(|o| o.name_any()).collect()
}

fn kubeconfig_path(server: &FakeApiServer, tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "kube-nlproxy-test-{}-{tag}.kubeconfig",
        std::process::id()
    ));
    server.write_kubeconfig(&path);
    path
}

async fn kube_client(server: &FakeApiServer, tag: &str) -> kube::Client {
    let path = kubeconfig_path(server, tag);
    let cfg = KubeSourceConfig {
        kubeconfig: Some(path.clone()),
        master: None,
        node_name: NODE.into(),
        ..Default::default()
    };
    let c = client(&cfg).await.expect("client");
    // The kubeconfig is read once, when the client is built.
    let _ = std::fs::remove_file(path);
    c
}

async fn start(server: &FakeApiServer, tag: &str) -> (KubeSource, Receiver<u64>) {
    let source = KubeSource::start(kube_client(server, tag).await, NODE)
        .await
        .expect("start");
    let rx = source.subscribe();
    (source, rx)
}

/// Waits until the generation satisfies `cond`; returns it.
async fn wait_generation(rx: &mut Receiver<u64>, what: &str, cond: impl Fn(u64) -> bool) -> u64 {
    let wait = async {
        loop {
            let g = *rx.borrow_and_update();
            if cond(g) {
                return g;
            }
            rx.changed().await.expect("source dropped");
        }
    };
    match tokio::time::timeout(RECOVERY, wait).await {
        Ok(g) => g,
        Err(_) => panic!("timed out waiting for {what}; generation {}", *rx.borrow()),
    }
}

/// Polls `cond` (without blocking the runtime) until it holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + RECOVERY;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a source on objects created beforehand and waits for its first sync.
async fn synced(server: &FakeApiServer, tag: &str) -> (KubeSource, Receiver<u64>) {
    let (source, mut rx) = start(server, tag).await;
    let g = wait_generation(&mut rx, "the initial sync", |g| g > 0).await;
    assert_eq!(g, 1, "the first sync is generation 1");
    (source, rx)
}

fn base_objects(server: &FakeApiServer) {
    server.create(node(NODE, "10.77.0.1"));
    server.create(service("a", "10.96.0.10"));
    server.create(slice("a-1", "a", "10.244.1.5"));
}

#[tokio::test]
async fn generation_stays_zero_until_every_initial_list_is_done() {
    let server = FakeApiServer::start();
    base_objects(&server);
    // The Node list fails (HTTP 500 reaches the watcher, which backs off), so
    // Services and EndpointSlices finish their lists first.
    server.fail_next(Resource::Nodes, 500, 2);
    let (source, mut rx) = start(&server, "gating").await;
    eventually(
        "services, slices and cidrs listed; node list failed",
        || {
            server.watch_count(Resource::Services) >= 1
                && server.watch_count(Resource::EndpointSlices) >= 1
                && server.watch_count(Resource::ServiceCidrs) >= 1
                && server.list_count(Resource::Nodes) >= 1
        },
    )
    .await;
    // A change before the node is listed does not bump either.
    server.create(service("early", "10.96.0.11"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(*rx.borrow(), 0, "no generation before the Node list");
    assert!(!source.ready());
    let g = wait_generation(&mut rx, "the initial sync", |g| g > 0).await;
    assert_eq!(g, 1);
    assert!(source.ready());
    assert!(
        server.list_count(Resource::Nodes) >= 3,
        "two failed lists, then one"
    );
    let snap = source.snapshot();
    assert_eq!(names(&snap.services), ["a", "early"]);
    assert_eq!(names(&snap.endpoint_slices), ["a-1"]);
    assert_eq!(names(&snap.nodes), [NODE]);
}

#[tokio::test]
async fn selectors_and_initial_snapshot() {
    let server = FakeApiServer::start();
    base_objects(&server);
    server.create(node("node-b", "10.77.0.2"));
    server.create(service_labelled(
        "other-proxy",
        "10.96.0.20",
        json!({"service.kubernetes.io/service-proxy-name": "other"}),
    ));
    server.create(service_labelled(
        "headless",
        "None",
        json!({"service.kubernetes.io/headless": ""}),
    ));
    let mut excluded_slice = slice("other-proxy-1", "other-proxy", "10.244.1.9");
    excluded_slice["metadata"]["labels"]["service.kubernetes.io/service-proxy-name"] =
        json!("other");
    server.create(excluded_slice);
    let (source, mut rx) = synced(&server, "selectors").await;
    let snap = source.snapshot();
    assert_eq!(names(&snap.services), ["a"]);
    assert_eq!(names(&snap.endpoint_slices), ["a-1"]);
    assert_eq!(names(&snap.nodes), [NODE]);
    // Stored objects carry no resourceVersion.
    assert!(snap.services[0].metadata.resource_version.is_none());

    // What the watchers asked for: first whether the server streams lists (it
    // does not by default: 422), then lists and watches with kube-proxy's selector.
    assert_eq!(source.list_strategy(), ListStrategy::List);
    let requests = server.requests();
    let (probes, requests): (Vec<_>, Vec<_>) = requests
        .into_iter()
        .partition(|r| r.param("labelSelector") == Some(STREAMING_LIST_PROBE_SELECTOR));
    assert_eq!(probes.len(), 1, "{probes:?}");
    assert_eq!(probes[0].resource(), Some(Resource::Services));
    assert_eq!(probes[0].param("sendInitialEvents"), Some("true"));
    assert!(
        requests
            .iter()
            .all(|r| r.param("sendInitialEvents").is_none()),
        "{requests:?}"
    );
    for r in requests.iter().filter(|r| {
        matches!(
            r.resource(),
            Some(Resource::Services | Resource::EndpointSlices)
        )
    }) {
        assert_eq!(
            r.param("labelSelector"),
            Some(PROXY_LABEL_SELECTOR),
            "{r:?}"
        );
    }
    for r in requests
        .iter()
        .filter(|r| r.resource() == Some(Resource::Nodes))
    {
        assert_eq!(
            r.param("fieldSelector"),
            Some(format!("metadata.name={NODE}").as_str()),
            "{r:?}"
        );
    }

    // A new excluded service and another node never show; the next included
    // service bumps the generation exactly once.
    server.create(service_labelled(
        "other-proxy-2",
        "10.96.0.21",
        json!({"service.kubernetes.io/service-proxy-name": "other"}),
    ));
    server.create(node("node-c", "10.77.0.3"));
    server.create(service("b", "10.96.0.30"));
    let g = wait_generation(&mut rx, "service b", |g| g > 1).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(*rx.borrow(), g);
    assert_eq!(g, 2);
    let snap = source.snapshot();
    assert_eq!(names(&snap.services), ["a", "b"]);
    assert_eq!(names(&snap.nodes), [NODE]);

    // Our node changes: bump.
    server.update(node(NODE, "10.77.0.9"));
    wait_generation(&mut rx, "node update", |g| g > 2).await;
    let snap = source.snapshot();
    let addr = &snap.nodes[0]
        .status
        .as_ref()
        .unwrap()
        .addresses
        .as_ref()
        .unwrap()[0];
    assert_eq!(addr.address, "10.77.0.9");
}

#[tokio::test]
async fn modify_noop_and_delete() {
    let server = FakeApiServer::start();
    base_objects(&server);
    server.create(service("b", "10.96.0.30"));
    let (source, mut rx) = synced(&server, "modify").await;

    server.update(service("a", "10.96.0.99"));
    let g = wait_generation(&mut rx, "modify a", |g| g > 1).await;
    let snap = source.snapshot();
    let a = snap.services.iter().find(|s| s.name_any() == "a").unwrap();
    assert_eq!(
        a.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("10.96.0.99")
    );

    // A write with identical content (new resourceVersion, MODIFIED event) is a
    // no-op; the marker after it is the only bump.
    server.update(service("a", "10.96.0.99"));
    server.update(slice("a-1", "a", "10.244.1.5"));
    server.update(service("b", "10.96.0.31"));
    let g2 = wait_generation(&mut rx, "modify b", |x| x > g).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(*rx.borrow(), g2);
    assert_eq!(g2, g + 1, "no-op updates must not bump the generation");

    server.delete(&service("a", ""));
    server.delete(&slice("a-1", "a", ""));
    wait_generation(&mut rx, "deletions", |x| x >= g2 + 2).await;
    let snap = source.snapshot();
    assert_eq!(names(&snap.services), ["b"]);
    assert!(snap.endpoint_slices.is_empty());

    // Labelling a service out of our selector deletes it from our view.
    server.update(service_labelled(
        "b",
        "10.96.0.31",
        json!({"service.kubernetes.io/service-proxy-name": "other"}),
    ));
    eventually("b labelled away", || source.snapshot().services.is_empty()).await;
}

#[tokio::test]
async fn dropped_watches_resume_without_bump() {
    let server = FakeApiServer::start();
    base_objects(&server);
    let (source, mut rx) = synced(&server, "drop").await;
    let watches = server.watch_count(Resource::Services);
    let lists = server.list_count(Resource::Services);

    server.drop_watches();
    eventually("watches re-established", || {
        server.watch_count(Resource::Services) > watches && server.open_watches() >= 4
    })
    .await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(*rx.borrow(), 1, "resuming a watch is not a change");
    assert_eq!(
        server.list_count(Resource::Services),
        lists,
        "a cut watch resumes from its resourceVersion without a relist"
    );

    // Changes made while the watch is down arrive from the history.
    server.drop_watches();
    server.create(service("during", "10.96.0.40"));
    server.delete(&slice("a-1", "a", ""));
    wait_generation(&mut rx, "changes made during the outage", |g| g >= 3).await;
    let snap = source.snapshot();
    assert_eq!(names(&snap.services), ["a", "during"]);
    assert!(snap.endpoint_slices.is_empty());

    // And later changes still arrive.
    server.create(service("after", "10.96.0.41"));
    wait_generation(&mut rx, "a later change", |g| g >= 4).await;
    assert_eq!(names(&source.snapshot().services), ["a", "after", "during"]);
}

#[tokio::test]
async fn expired_history_relists_without_bump_when_unchanged() {
    let server = FakeApiServer::start();
    base_objects(&server);
    let (source, mut rx) = synced(&server, "expire").await;
    let lists = [
        Resource::Services,
        Resource::EndpointSlices,
        Resource::Nodes,
        Resource::ServiceCidrs,
    ]
    .map(|r| server.list_count(r));

    server.expire_history();
    eventually("every kind relisted", || {
        [
            Resource::Services,
            Resource::EndpointSlices,
            Resource::Nodes,
            Resource::ServiceCidrs,
        ]
        .iter()
        .zip(lists)
        .all(|(r, n)| server.list_count(*r) > n)
            && server.open_watches() >= 4
    })
    .await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        *rx.borrow(),
        1,
        "a relist of identical objects is not a change"
    );
    assert!(source.ready());

    server.create(service("b", "10.96.0.30"));
    let g = wait_generation(&mut rx, "a change after the relist", |g| g > 1).await;
    assert_eq!(g, 2);
    assert_eq!(names(&source.snapshot().services), ["a", "b"]);

    // A relist whose objects only have new resourceVersions (no-op writes while the
    // watch was down) is not a change either.
    let lists = server.list_count(Resource::Services);
    server.fail_next(Resource::Services, 500, 1);
    server.drop_watches();
    server.update(service("a", "10.96.0.10"));
    server.update(service("b", "10.96.0.30"));
    server.expire_history();
    eventually("services relisted", || {
        server.list_count(Resource::Services) > lists && server.open_watches() >= 4
    })
    .await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(*rx.borrow(), 2, "only resourceVersions moved");
}

#[tokio::test]
async fn deletions_while_disconnected_surface_after_relist() {
    let server = FakeApiServer::start();
    base_objects(&server);
    server.create(service("b", "10.96.0.30"));
    server.create(slice("b-1", "b", "10.244.1.6"));
    let (source, mut rx) = synced(&server, "relist-delete").await;
    let lists = server.list_count(Resource::Services);

    // Cut the watches and fail the first reconnects, so the deletions are never
    // streamed; then forget the history, so the reconnect gets 410 and relists.
    server.fail_next(Resource::Services, 500, 1);
    server.fail_next(Resource::EndpointSlices, 500, 1);
    server.drop_watches();
    server.delete(&service("b", ""));
    server.delete(&slice("b-1", "b", ""));
    server.update(service("a", "10.96.0.11"));
    server.expire_history();

    wait_generation(&mut rx, "the relist", |g| g > 1).await;
    eventually("b gone and a updated", || {
        let snap = source.snapshot();
        names(&snap.services) == ["a"]
            && names(&snap.endpoint_slices) == ["a-1"]
            && snap.services[0]
                .spec
                .as_ref()
                .unwrap()
                .cluster_ip
                .as_deref()
                == Some("10.96.0.11")
    })
    .await;
    assert!(
        server.list_count(Resource::Services) > lists,
        "recovered through a relist"
    );
}

#[tokio::test]
async fn service_cidrs_when_served() {
    let server = FakeApiServer::start();
    base_objects(&server);
    server.create(service_cidr("kubernetes", "10.96.0.0/16"));
    let (source, mut rx) = synced(&server, "cidrs").await;
    assert!(source.watches_service_cidrs());
    assert_eq!(names(&source.snapshot().service_cidrs), ["kubernetes"]);
    server.create(service_cidr("extra", "10.97.0.0/16"));
    wait_generation(&mut rx, "new ServiceCIDR", |g| g > 1).await;
    assert_eq!(
        names(&source.snapshot().service_cidrs),
        ["extra", "kubernetes"]
    );
}

#[tokio::test]
async fn service_cidrs_skipped_when_not_served() {
    let server = FakeApiServer::start_with(Options {
        serve_service_cidrs: false,
        ..Options::default()
    });
    base_objects(&server);
    let (source, _rx) = synced(&server, "no-cidrs").await;
    assert!(!source.watches_service_cidrs());
    assert!(source.snapshot().service_cidrs.is_empty());
    let requests = server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.path == "/apis/networking.k8s.io/v1"),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .all(|r| r.resource() != Some(Resource::ServiceCidrs)),
        "{requests:?}"
    );
}

#[tokio::test]
async fn starting_event_is_posted() {
    let server = FakeApiServer::start();
    let client = kube_client(&server, "event").await;
    post_starting_event(&client, NODE).await;
    let events = server.posted_events();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e["reason"], "Starting");
    assert_eq!(e["action"], "StartKubeProxy");
    assert_eq!(e["reportingController"], "kube-nlproxy");
    assert_eq!(e["regarding"]["kind"], "Node");
    assert_eq!(e["regarding"]["name"], NODE);
    assert_eq!(e["metadata"]["namespace"], "default");
    assert!(server.requests().iter().any(
        |r| r.method == "POST" && r.path == "/apis/events.k8s.io/v1/namespaces/default/events"
    ));
    // Best effort: a server that is gone only logs.
    drop(server);
    post_starting_event(&client, NODE).await;
}

#[tokio::test]
async fn client_configuration() {
    let server = FakeApiServer::start();
    base_objects(&server);

    // --master overrides the kubeconfig's cluster URL.
    let dead = std::env::temp_dir().join(format!(
        "kube-nlproxy-test-{}-dead.kubeconfig",
        std::process::id()
    ));
    common::apiserver::write_kubeconfig(&dead, "http://127.0.0.1:1");
    let cfg = KubeSourceConfig {
        kubeconfig: Some(dead.clone()),
        master: Some(server.url()),
        node_name: NODE.into(),
        ..Default::default()
    };
    let c = client(&cfg).await.expect("client");
    let source = KubeSource::start(c, NODE)
        .await
        .expect("start via --master");
    let mut rx = source.subscribe();
    wait_generation(&mut rx, "sync via --master", |g| g > 0).await;
    drop(source);

    // --master alone.
    let cfg = KubeSourceConfig {
        kubeconfig: None,
        master: Some(server.url()),
        node_name: NODE.into(),
        ..Default::default()
    };
    let c = client(&cfg).await.expect("client");
    assert!(KubeSource::start(c, NODE).await.is_ok());

    // Errors name the phase.
    let cfg = KubeSourceConfig {
        kubeconfig: None,
        master: Some("http://exa mple".into()),
        node_name: NODE.into(),
        ..Default::default()
    };
    assert!(matches!(
        client(&cfg).await,
        Err(KubeSourceError::MasterUrl { .. })
    ));
    let cfg = KubeSourceConfig {
        kubeconfig: Some("/nonexistent/kubeconfig".into()),
        master: None,
        node_name: NODE.into(),
        ..Default::default()
    };
    assert!(matches!(
        client(&cfg).await,
        Err(KubeSourceError::KubeconfigRead { .. })
    ));
    // Discovery against a dead server fails at start (not a 404: not "skip").
    let cfg = KubeSourceConfig {
        kubeconfig: Some(dead.clone()),
        master: None,
        node_name: NODE.into(),
        ..Default::default()
    };
    let c = client(&cfg).await.expect("client");
    let _ = std::fs::remove_file(&dead);
    assert!(matches!(
        KubeSource::start(c, NODE).await,
        Err(KubeSourceError::Discovery(_))
    ));
}

/// The fake server itself: selectors, 410 inside a 200 watch stream, streaming lists.
#[tokio::test]
async fn fake_server_protocol() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, ListParams};
    use kube::runtime::watcher;
    use std::io::{Read, Write};

    let server = FakeApiServer::start_with(Options {
        watch_list: true,
        ..Options::default()
    });
    server.create(service_labelled("x", "10.96.0.1", json!({"tier": "web"})));
    server.create(service_labelled("y", "10.96.0.2", json!({"tier": "db"})));
    server.create(service("z", "10.96.0.3"));
    let client = kube_client(&server, "protocol").await;
    let api: Api<Service> = Api::all(client);
    let list = |selector: &'static str| {
        let api = api.clone();
        async move {
            let l = api
                .list(&ListParams::default().labels(selector))
                .await
                .unwrap();
            names(&l.items)
        }
    };
    assert_eq!(list("tier").await, ["x", "y"]);
    assert_eq!(list("!tier").await, ["z"]);
    assert_eq!(list("tier=web").await, ["x"]);
    assert_eq!(list("tier!=web").await, ["y", "z"]);
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=y"))
        .await
        .unwrap();
    assert_eq!(names(&by_name.items), ["y"]);
    assert_eq!(
        by_name.metadata.resource_version,
        Some(server.resource_version().to_string())
    );

    // A watch from a forgotten resourceVersion: 200, one ERROR event (410 Expired).
    server.expire_history();
    let addr = server.addr();
    let raw = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET /api/v1/services?&watch=true&resourceVersion=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(
        raw.contains(r#""type":"ERROR""#) && raw.contains(r#""code":410"#),
        "{raw}"
    );
    assert!(raw.contains(r#""reason":"Expired""#), "{raw}");

    // Streaming lists end at the initial-events-end bookmark.
    let mut stream = std::pin::pin!(watcher::watcher(
        api.clone(),
        watcher::Config::default().streaming_lists()
    ));
    let mut listed = Vec::new();
    let done = tokio::time::timeout(RECOVERY, async {
        while let Some(ev) = stream.next().await {
            match ev.unwrap() {
                watcher::Event::InitApply(s) => listed.push(s.name_any()),
                watcher::Event::InitDone => return,
                _ => {}
            }
        }
    })
    .await;
    assert!(done.is_ok(), "streaming list never completed");
    assert_eq!(listed, ["x", "y", "z"]);
    let streaming = server
        .requests()
        .into_iter()
        .any(|r| r.param("sendInitialEvents") == Some("true"));
    assert!(streaming);

    // Without the WatchList feature, a watch asking for initial events is refused
    // before it starts, as by a real API server with the gate off.
    let gated = FakeApiServer::start();
    let api: Api<Service> = Api::all(kube_client(&gated, "protocol-gated").await);
    let refused = api
        .watch(&kube::api::WatchParams::streaming_lists(), "0")
        .await
        .map(|_| ())
        .expect_err("a gated server streamed a list");
    match refused {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert_eq!(status.reason, "Invalid", "{status:?}");
        }
        e => panic!("not a 422 Status: {e}"),
    }
}

/// `GET path_and_query` over a fresh connection: the status code and the JSON body.
fn raw_get(server: &FakeApiServer, path_and_query: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path_and_query} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("no end of headers");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head}"));
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (code, body)
}

fn item_names(list: &Value) -> Vec<&str> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect()
}

/// The fake server's paged lists: `limit`, `continue`, `remainingItemCount`, one
/// resourceVersion for every page, 410 for an expired token, 400 for a bad one.
#[test]
fn fake_server_paged_lists() {
    let server = FakeApiServer::start();
    for i in 0..7 {
        let labels = if i % 2 == 0 {
            json!({"parity": "even"})
        } else {
            json!({})
        };
        server.create(service_labelled(&format!("s{i}"), "10.96.0.1", labels));
    }
    let list_rv = server.resource_version().to_string();
    let path = "/api/v1/namespaces/default/services";

    let (code, first) = raw_get(&server, &format!("{path}?limit=3"));
    assert_eq!(code, 200, "{first}");
    assert_eq!(item_names(&first), ["s0", "s1", "s2"]);
    assert_eq!(first["metadata"]["resourceVersion"], list_rv.as_str());
    assert_eq!(first["metadata"]["remainingItemCount"], 4);
    let token = first["metadata"]["continue"].as_str().unwrap().to_owned();

    // A write between pages does not change the resourceVersion the pages report.
    server.update(service_labelled(
        "s0",
        "10.96.0.2",
        json!({"parity": "even"}),
    ));
    assert_ne!(server.resource_version().to_string(), list_rv);
    let (code, second) = raw_get(&server, &format!("{path}?limit=3&continue={token}"));
    assert_eq!(code, 200, "{second}");
    assert_eq!(item_names(&second), ["s3", "s4", "s5"]);
    assert_eq!(second["metadata"]["resourceVersion"], list_rv.as_str());
    assert_eq!(second["metadata"]["remainingItemCount"], 1);
    let token2 = second["metadata"]["continue"].as_str().unwrap();
    let (code, third) = raw_get(&server, &format!("{path}?limit=3&continue={token2}"));
    assert_eq!(code, 200, "{third}");
    assert_eq!(item_names(&third), ["s6"]);
    assert_eq!(third["metadata"]["resourceVersion"], list_rv.as_str());
    assert!(third["metadata"].get("continue").is_none(), "{third}");
    assert!(third["metadata"].get("remainingItemCount").is_none());
    assert_eq!(server.list_count(Resource::Services), 3, "each page counts");

    // No limit (or limit=0): one page. A selector: pages, but no remainingItemCount.
    let (_, all) = raw_get(&server, &format!("{path}?limit=0"));
    assert_eq!(item_names(&all).len(), 7);
    assert!(all["metadata"].get("continue").is_none());
    let (_, even) = raw_get(
        &server,
        &format!("{path}?limit=2&labelSelector=parity%3Deven"),
    );
    assert_eq!(item_names(&even), ["s0", "s2"]);
    assert!(even["metadata"]["continue"].is_string(), "{even}");
    assert!(
        even["metadata"].get("remainingItemCount").is_none(),
        "{even}"
    );
    let even_token = even["metadata"]["continue"].as_str().unwrap();
    let (_, even2) = raw_get(
        &server,
        &format!("{path}?limit=2&labelSelector=parity%3Deven&continue={even_token}"),
    );
    assert_eq!(item_names(&even2), ["s4", "s6"]);
    assert!(even2["metadata"].get("continue").is_none(), "{even2}");

    // Malformed input: 400 BadRequest.
    for query in [
        "limit=3&continue=garbage",
        "limit=3&continue=7b7d", // hex of "{}"
        "limit=x",
        &format!("limit=3&continue={token}&resourceVersion={list_rv}"),
    ] {
        let (code, body) = raw_get(&server, &format!("{path}?{query}"));
        assert_eq!(code, 400, "{query}: {body}");
        assert_eq!(body["reason"], "BadRequest", "{query}: {body}");
    }

    // A token from before the watch history: 410 Expired.
    server.expire_history();
    let (code, body) = raw_get(&server, &format!("{path}?limit=3&continue={token}"));
    assert_eq!(code, 410, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["code"], 410);
    assert_eq!(body["reason"], "Expired");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("The provided continue parameter is too old"),
        "{body}"
    );
}

/// A server holding our Node and `count` Services, each with one EndpointSlice.
fn server_with_services(count: usize) -> FakeApiServer {
    let server = FakeApiServer::start();
    server.create(node(NODE, "10.77.0.1"));
    for i in 0..count {
        let name = format!("svc-{i:04}");
        let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        server.create(service(&name, &ip));
        server.create(slice(&format!("{name}-1"), &name, "10.244.1.5"));
    }
    server
}

/// The rate limit counts a paged list once: with 6 tokens and one more every
/// 100 s, the discovery request, the streaming-list probe and the four first
/// pages take the six, and the
/// four later pages of the Service and EndpointSlice lists (1200 objects, pages
/// of 500) go at once. Were every page a request, the first sync would wait for
/// four more tokens, 400 s.
#[tokio::test]
async fn a_paged_list_takes_one_token_of_the_rate_limit() {
    const COUNT: usize = 1200;
    let server = server_with_services(COUNT);
    let path = kubeconfig_path(&server, "rate-pages");
    let cfg = KubeSourceConfig {
        kubeconfig: Some(path.clone()),
        master: None,
        node_name: NODE.into(),
        qps: 0.01,
        burst: 6,
    };
    let client = client(&cfg).await.expect("client");
    let _ = std::fs::remove_file(path);
    let source = KubeSource::start(client, NODE).await.expect("start");
    let mut rx = source.subscribe();
    wait_generation(
        &mut rx,
        "the initial lists, paged, under the rate limit",
        |g| g > 0,
    )
    .await;
    let snap = source.snapshot();
    assert_eq!(snap.services.len(), COUNT);
    assert_eq!(snap.endpoint_slices.len(), COUNT);
    let requests = server.requests();
    let continued = |resource| {
        requests
            .iter()
            .filter(|r| r.resource() == Some(resource) && r.param("continue").is_some())
            .count()
    };
    assert_eq!(continued(Resource::Services), 2, "1200 in pages of 500");
    assert_eq!(continued(Resource::EndpointSlices), 2);
}

/// Where the server streams lists (`sendInitialEvents`, the WatchList feature),
/// the source takes its initial state from watches, lists nothing, and a relist
/// after 410 Gone is streamed too: what changed meanwhile arrives, deletions
/// included, and the generation counts it once per change.
#[tokio::test]
async fn initial_state_is_streamed_where_the_server_serves_streaming_lists() {
    let server = FakeApiServer::start_with(Options {
        watch_list: true,
        ..Options::default()
    });
    base_objects(&server);
    server.create(service("b", "10.96.0.30"));
    server.create(slice("b-1", "b", "10.244.1.6"));
    server.create(service_cidr("kubernetes", "10.96.0.0/16"));
    let (source, mut rx) = synced(&server, "streamed").await;
    assert_eq!(source.list_strategy(), ListStrategy::Stream);
    let snap = source.snapshot();
    assert_eq!(names(&snap.services), ["a", "b"]);
    assert_eq!(names(&snap.endpoint_slices), ["a-1", "b-1"]);
    assert_eq!(names(&snap.nodes), [NODE]);
    assert_eq!(names(&snap.service_cidrs), ["kubernetes"]);
    let kinds = [
        Resource::Services,
        Resource::EndpointSlices,
        Resource::Nodes,
        Resource::ServiceCidrs,
    ];
    let initial = |r: Resource| {
        server
            .requests()
            .iter()
            .filter(|q| {
                q.resource() == Some(r)
                    && q.is_watch()
                    && q.param("sendInitialEvents") == Some("true")
                    && q.param("labelSelector") != Some(STREAMING_LIST_PROBE_SELECTOR)
            })
            .count()
    };
    for r in kinds {
        assert_eq!(server.list_count(r), 0, "{r:?} listed");
        assert_eq!(initial(r), 1, "{r:?}: one streamed initial watch");
    }
    // The Services and EndpointSlices watches carry kube-proxy's selector.
    for r in server.requests().iter().filter(|q| {
        matches!(
            q.resource(),
            Some(Resource::Services | Resource::EndpointSlices)
        ) && q.param("labelSelector") != Some(STREAMING_LIST_PROBE_SELECTOR)
    }) {
        assert_eq!(
            r.param("labelSelector"),
            Some(PROXY_LABEL_SELECTOR),
            "{r:?}"
        );
    }

    // Watch events after the initial ones.
    server.create(service("c", "10.96.0.31"));
    let g = wait_generation(&mut rx, "a change after the streamed list", |g| g > 1).await;
    assert_eq!(g, 2);

    // 410 Gone: the relist is streamed as well, and sees what changed while the
    // watches were down.
    let streams = kinds.map(initial);
    server.drop_watches();
    server.delete(&service("b", ""));
    server.update(slice("a-1", "a", "10.244.1.9"));
    server.expire_history();
    eventually("every kind re-streamed", || {
        kinds.iter().zip(streams).all(|(r, n)| initial(*r) > n) && server.open_watches() >= 4
    })
    .await;
    wait_generation(&mut rx, "the relist's changes", |g| g >= 4).await;
    let snap = source.snapshot();
    assert_eq!(names(&snap.services), ["a", "c"]);
    assert_eq!(
        snap.endpoint_slices[0].endpoints[0].addresses,
        ["10.244.1.9"]
    );
    for r in kinds {
        assert_eq!(server.list_count(r), 0, "{r:?} listed on the relist");
    }
    tokio::time::sleep(QUIET).await;
    assert_eq!(*rx.borrow(), 4, "two changes, one generation each");
}

/// More objects than the watcher's page (500): the initial lists are paged, and the
/// source still gets every object, then the changes after the list.
#[tokio::test]
async fn paged_initial_lists_deliver_every_object() {
    const COUNT: usize = 1200;
    let server = server_with_services(COUNT);
    let (source, mut rx) = synced(&server, "paged").await;
    let snap = source.snapshot();
    assert_eq!(snap.services.len(), COUNT);
    assert_eq!(snap.endpoint_slices.len(), COUNT);
    let continued = |resource| {
        server
            .requests()
            .iter()
            .filter(|r| r.resource() == Some(resource) && r.param("continue").is_some())
            .count()
    };
    assert_eq!(continued(Resource::Services), 2, "1200 in pages of 500");
    assert_eq!(continued(Resource::EndpointSlices), 2);
    assert_eq!(server.list_count(Resource::Services), 3);

    // The watch starts at the paged list's resourceVersion.
    server.create(service("late", "10.96.9.1"));
    wait_generation(&mut rx, "a change after the paged list", |g| g > 1).await;
    assert_eq!(source.snapshot().services.len(), COUNT + 1);
}
