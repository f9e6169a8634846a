//! The commands: `run` (sync loop, or one sync with `--once`), `plan`,
//! `cleanup`. Each builds a [`Driver`] over the configured mode on the real
//! kernel and the real node, and hands it the source's objects.

use std::time::{Duration, Instant};

use crate::config::{Config, ProxyMode, Source};
use crate::daemon::DaemonError;
use crate::driver::host::Host;
use crate::driver::ipvs::IpvsMode;
use crate::driver::nftables::NftablesMode;
use crate::driver::{Driver, DriverError, KernelHost, Mode};
use crate::source::file::{self, FileSource};
use crate::source::kube::{
    self as kube_source, KubeSource, KubeSourceConfig, KubeSourceError, Retention,
};
use crate::source::{ObjectChanges, ObjectSource, Objects};
use crate::sync::ipvs::{IpvsSyncError, NetlinkIpvs, ipvs_sysctls};
use crate::sync::{NetlinkDataplane, SyncError};

/// Errors that end a command.
#[derive(Debug, thiserror::Error)]
pub enum ProxierError {
    /// The file source failed as a whole (a single bad object only warns).
    #[error("reading manifests failed")]
    Source(#[from] file::FileSourceError),
    /// The API server source could not start.
    #[error("kube source")]
    Kube(#[from] KubeSourceError),
    /// The source stopped delivering updates.
    #[error("the object source ended")]
    SourceEnded,
    /// Opening the nf_tables socket.
    #[error("nftables")]
    Nftables(#[from] SyncError),
    /// Opening the IPVS, ipset or rtnetlink sockets.
    #[error("ipvs mode")]
    Ipvs(#[from] IpvsSyncError),
    /// A sync failed.
    #[error("sync")]
    Driver(#[from] DriverError),
    /// Finding or removing kube-proxy's state (`cleanup --kube-proxy`).
    #[error("kube-proxy's state")]
    KubeProxyState(#[from] crate::sync::kube_proxy::KubeProxyStateError),
    /// The daemon could not start its servers.
    #[error("the daemon")]
    Daemon(#[source] DaemonError),
    /// A command's argument is not usable.
    #[error("{0}")]
    Argument(String),
    /// `--once`: the kernel does not match after the sync.
    #[error("the kernel does not match the desired state after the sync: {0}")]
    Mismatch(String),
}

impl From<DaemonError> for ProxierError {
    fn from(e: DaemonError) -> Self {
        match e {
            DaemonError::SourceEnded => ProxierError::SourceEnded,
            e @ DaemonError::Bind { .. } => ProxierError::Daemon(e),
        }
    }
}

/// The node name: `--hostname-override`, else the kernel's host name.
fn node_name(cfg: &Config) -> String {
    cfg.hostname_override
        .clone()
        .unwrap_or_else(|| KernelHost::new().hostname())
}

/// The configured mode on the kernel.
type NftablesDriver = Driver<NftablesMode<NetlinkDataplane>, KernelHost>;
type IpvsDriver = Driver<IpvsMode<NetlinkIpvs, NetlinkDataplane>, KernelHost>;

fn nftables_driver(cfg: &Config) -> Result<NftablesDriver, ProxierError> {
    let mode = NftablesMode::new(NetlinkDataplane::new()?);
    Ok(Driver::new(cfg, mode, KernelHost::new()))
}

/// ipvs mode; `sysctls`: write the sysctls it needs first.
fn ipvs_driver(cfg: &Config, sysctls: bool) -> Result<IpvsDriver, ProxierError> {
    let mut host = KernelHost::new();
    if sysctls {
        host.write_sysctls(&ipvs_sysctls(cfg.ipvs_strict_arp));
    }
    let mode = IpvsMode::new(
        NetlinkIpvs::new()?,
        NetlinkDataplane::new()?,
        &cfg.ipvs_scheduler,
    )
    .exclude_cidrs(cfg.ipvs_exclude_cidrs.clone())
    .timeouts(cfg.ipvs_timeouts);
    Ok(Driver::new(cfg, mode, host))
}

/// Warnings for flag combinations that do nothing.
fn warn_about_flags(cfg: &Config) {
    use crate::config::DetectLocalMode as D;
    match cfg.detect_local_mode {
        Some(D::ClusterCidr) if cfg.cluster_cidrs.is_empty() => tracing::warn!(
            "--detect-local-mode ClusterCIDR without --cluster-cidr: no local traffic detection"
        ),
        Some(D::BridgeInterface) if cfg.pod_bridge_interface.is_none() => {
            tracing::warn!("--detect-local-mode BridgeInterface without --pod-bridge-interface")
        }
        Some(D::InterfaceNamePrefix) if cfg.pod_interface_name_prefix.is_none() => tracing::warn!(
            "--detect-local-mode InterfaceNamePrefix without --pod-interface-name-prefix"
        ),
        _ => {}
    }
}

/// `kube-nlproxy plan`: print what a sync would send.
pub async fn plan(cfg: &Config) -> Result<(), ProxierError> {
    let objects = load_objects(cfg).await?;
    let changes = ObjectChanges::everything(objects);
    let (ops, summary) = match cfg.mode {
        ProxyMode::Nftables => plan_with(nftables_driver(cfg)?, changes)?,
        ProxyMode::Ipvs => plan_with(ipvs_driver(cfg, false)?, changes)?,
    };
    match cfg.output {
        crate::config::Output::Text => {
            print!("{}", crate::driver::plan::render_text(&ops));
            for line in &summary {
                eprintln!("desired {line}");
            }
        }
        crate::config::Output::Json => println!("{}", crate::driver::plan::render_json(&ops)),
    }
    Ok(())
}

fn plan_with<M: Mode, H: Host>(
    mut driver: Driver<M, H>,
    changes: ObjectChanges,
) -> Result<(Vec<crate::driver::plan::PlannedOp>, Vec<String>), ProxierError> {
    let ops = driver.plan(changes)?;
    Ok((ops, driver.mode().summary()))
}

/// `kube-nlproxy cleanup`: delete what either mode made.
pub fn cleanup(cfg: &Config) -> Result<(), ProxierError> {
    if cfg.cleanup_kube_proxy {
        // `cleanup --kube-proxy`: kube-proxy's state only, never ours.
        let mut sock = kube_nlproxy_netlink::nft::NftSocket::new().map_err(SyncError::Socket)?;
        let removed = crate::sync::kube_proxy::remove(&mut sock)?;
        println!("removed kube-proxy's state: {}", removed.summary());
        return Ok(());
    }
    let mut nft = nftables_driver(cfg)?;
    let n = nft.cleanup()?;
    tracing::info!("cleanup: deleted {n} table(s)");
    let n = cleanup_ipvs_objects(cfg)?;
    tracing::info!("cleanup: {n} IPVS-mode operation(s)");
    Ok(())
}

/// Removes ipvs mode's objects but its nft table (nftables mode converts that
/// by the ordinary diff). Works on a kernel without IPVS, where no IPVS
/// object can exist.
fn cleanup_ipvs_objects(cfg: &Config) -> Result<usize, ProxierError> {
    let ipvs = match NetlinkIpvs::new() {
        Ok(dp) => dp,
        Err(_) => NetlinkIpvs::without_ipvs()?,
    };
    let mut host = KernelHost::new();
    let addresses = host.local_addresses().unwrap_or_default();
    let mut mode = IpvsMode::new(ipvs, NetlinkDataplane::new()?, "rr")
        .exclude_cidrs(cfg.ipvs_exclude_cidrs.clone());
    Ok(mode.cleanup_ipvs_objects(&addresses)?)
}

/// Starts the configured source: the manifests at `--source file:PATH`, or the API
/// server (in-cluster, `--kubeconfig`, `--master`) for `--source kube`.
/// Starts the configured source. `retention` says what the kube source keeps:
/// `run` takes its changes ([`Retention::Changes`]), `plan` and `--once` one
/// snapshot ([`Retention::Objects`]).
async fn start_source(
    cfg: &Config,
    retention: Retention,
) -> Result<Box<dyn ObjectSource>, ProxierError> {
    match &cfg.source {
        Source::File(path) => {
            let poll =
                Duration::from_millis(200).min(cfg.min_sync_period.max(Duration::from_millis(50)));
            Ok(Box::new(FileSource::start(path.clone(), poll)?))
        }
        Source::Kube => {
            let node = node_name(cfg);
            let kcfg = KubeSourceConfig {
                kubeconfig: cfg.kubeconfig.clone(),
                master: cfg.master.clone(),
                node_name: node.clone(),
                qps: cfg.kube_api_qps,
                burst: cfg.kube_api_burst,
            };
            let client = kube_source::client(&kcfg).await?;
            // The daemon waits for its API server; a command (`plan`, `--once`)
            // reports the failure.
            let daemon = cfg.command == crate::config::Command::Run && !cfg.once;
            let source = if daemon {
                start_kube_retrying(&client, &node, retention).await?
            } else {
                KubeSource::start_with(client.clone(), &node, retention).await?
            };
            tokio::spawn(async move { kube_source::post_starting_event(&client, &node).await });
            Ok(Box::new(source))
        }
    }
}

/// Starts the kube source; an unreachable or failing API server is retried with
/// backoff (1 s doubling to 30 s), one warning per attempt, never fatal: a node's
/// proxy often starts before its API server is reachable (a reboot, a new node,
/// a control plane that restarts).
async fn start_kube_retrying(
    client: &::kube::Client,
    node: &str,
    retention: Retention,
) -> Result<KubeSource, ProxierError> {
    let mut delay = Duration::from_secs(1);
    let mut attempt = 1u32;
    loop {
        match KubeSource::start_with(client.clone(), node, retention).await {
            Ok(source) => {
                if attempt > 1 {
                    tracing::info!(attempt, "the API server answered; watching");
                }
                return Ok(source);
            }
            Err(e) => {
                tracing::warn!(
                    attempt,
                    retry_in = ?delay,
                    "cannot reach the API server yet: {}",
                    crate::ErrorChain(&e)
                );
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
        attempt += 1;
    }
}

/// The objects of one sync without a watch: the manifests read once, or the
/// API server's initial lists.
async fn load_objects(cfg: &Config) -> Result<Objects, ProxierError> {
    match &cfg.source {
        Source::File(path) => {
            let (objects, warnings) = file::load_path(path)?;
            for w in &warnings {
                tracing::warn!("{w}");
            }
            Ok(objects)
        }
        Source::Kube => {
            initial_objects(start_source(cfg, Retention::Objects).await?.as_ref()).await
        }
    }
}

/// Waits until the source has its initial state (every initial list done).
async fn initial_objects(source: &dyn ObjectSource) -> Result<Objects, ProxierError> {
    let mut changes = source.subscribe();
    while *changes.borrow_and_update() == 0 {
        if changes.changed().await.is_err() {
            return Err(ProxierError::SourceEnded);
        }
    }
    Ok(source.snapshot())
}

/// `kube-nlproxy [run]`: sync, then follow changes (or exit with `--once`).
pub async fn run(cfg: &Config) -> Result<(), ProxierError> {
    warn_about_flags(cfg);
    if cfg.mode == ProxyMode::Nftables {
        // Coming from ipvs mode: remove its objects (the shared nft table is
        // converted by the ordinary diff).
        match cleanup_ipvs_objects(cfg) {
            Ok(0) => {}
            Ok(n) => tracing::info!("removed ipvs-mode leftovers ({n} operations)"),
            Err(e) => tracing::warn!(
                "could not check for ipvs-mode leftovers: {}",
                crate::ErrorChain(&e)
            ),
        }
    }
    match cfg.mode {
        ProxyMode::Nftables => run_with(cfg, nftables_driver(cfg)?).await,
        ProxyMode::Ipvs => run_with(cfg, ipvs_driver(cfg, true)?).await,
    }
}

async fn run_with<M: Mode, H: Host>(
    cfg: &Config,
    mut driver: Driver<M, H>,
) -> Result<(), ProxierError> {
    if cfg.once {
        let started = Instant::now();
        let objects = load_objects(cfg).await?;
        let loaded = started.elapsed();
        let synced = driver.sync_once(ObjectChanges::everything(objects))?;
        let sync_done = started.elapsed();
        // A Node that is missing, or lacks an address NodePorts need, is as loud
        // here as in the daemon.
        let node_found = driver
            .tracker()
            .nodes()
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some(driver.state().node.name.as_str()));
        let nodeports = driver
            .node_context()
            .map(|n| n.options.nodeport_addresses.clone())
            .unwrap_or(crate::mode::nftables::NodePortAddresses::All);
        crate::daemon::NodeCheck::default().check(
            node_found,
            true,
            driver.state(),
            &nodeports,
            &crate::serve::Metrics::new(),
        );
        let differing = driver.verify()?;
        if !differing.is_empty() {
            return Err(ProxierError::Mismatch(differing.join(" | ")));
        }
        tracing::info!(
            elapsed = ?started.elapsed(),
            ?loaded,
            ?sync_done,
            ops = ?synced.report.ops,
            conntrack_deleted = ?synced.conntrack_deleted,
            "sync complete; the kernel matches"
        );
        for line in driver.mode().summary() {
            tracing::info!("{line}");
        }
        // The process exits next: freeing every service's state one allocation
        // at a time would only delay that (~0.1 s at 10k services).
        std::mem::forget(driver);
        return Ok(());
    }
    driver.host_mut().apply_conntrack_settings(&cfg.conntrack);
    // oom_score_adj was written by main, with CAP_SYS_RESOURCE, before the
    // capabilities were dropped.
    // /livez answers from the first second, also while the API is unreachable.
    let side = crate::daemon::SideChannels::start(cfg, driver.mode().name()).await?;
    let source = tokio::select! {
        source = start_source(cfg, Retention::Changes) => source?,
        _ = crate::daemon::shutdown_signal() => {
            tracing::info!("terminating before the first sync; the dataplane stays as it is");
            return Ok(());
        }
    };
    Ok(crate::daemon::run(cfg, source.as_ref(), &mut driver, side).await?)
}

/// `IP:PORT[/tcp|udp|sctp]` (IPv6 as `[ADDR]:PORT`): address, protocol
/// number, port.
pub fn parse_target(s: &str) -> Result<(std::net::IpAddr, u8, u16), String> {
    let (addr_port, proto) = match s.rsplit_once('/') {
        Some((a, p)) => (a, p),
        None => (s, "tcp"),
    };
    let proto = match proto.to_ascii_lowercase().as_str() {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        other => return Err(format!("unknown protocol {other:?} (tcp, udp or sctp)")),
    };
    let sock: std::net::SocketAddr = addr_port
        .parse()
        .map_err(|e| format!("{addr_port:?} is not IP:PORT ([IPv6]:PORT): {e}"))?;
    Ok((sock.ip(), proto, sock.port()))
}

/// `kube-nlproxy explain`: where a new connection would go, from our nft table
/// in the kernel; with `--source`, also from the desired state, and where the
/// two disagree. Returns the exit status (see `Outcome::exit_code`).
pub async fn explain(cfg: &Config) -> Result<u8, ProxierError> {
    use crate::sync::explain::{Outcome, Query, TableView, disagreements, explain};
    use kube_nlproxy_netlink::nft::{Family, NftSocket};
    let target = cfg
        .explain_target
        .as_deref()
        .ok_or_else(|| ProxierError::Argument("explain needs IP:PORT[/PROTO]".into()))?;
    let (daddr, proto, dport) = parse_target(target).map_err(ProxierError::Argument)?;
    if let Some(s) = cfg.explain_from
        && s.is_ipv4() != daddr.is_ipv4()
    {
        return Err(ProxierError::Argument(format!(
            "--from {s} and {daddr} are of different families"
        )));
    }
    let family = Family::of(&daddr);
    let mut sock = NftSocket::new().map_err(SyncError::Socket)?;
    let state = sock
        .dump_table(family, crate::mode::nftables::TABLE)
        .map_err(|source| SyncError::DumpFailed {
            family: family.nft_name(),
            source,
        })?;
    let view = state
        .as_ref()
        .map(TableView::from_kernel)
        .unwrap_or_default();
    let local_addresses = kube_nlproxy_netlink::addr::list_addresses()
        .map(|l| l.into_iter().map(|a| a.addr).collect())
        .unwrap_or_else(|e| {
            tracing::warn!("explain without the node's addresses: {e}");
            Vec::new()
        });
    let nodeport_all = view.sets.get("nodeport-ips").is_none_or(|s| s.is_empty());
    // Which traffic is local: as typed, else as the running daemon has it.
    let daemon_local = (!cfg.local_traffic_given)
        .then(|| daemon_status(&cfg.metrics_bind_address))
        .flatten()
        .and_then(|d| d.local_traffic)
        .and_then(|l| Some((crate::daemon::local_detector_of(&l)?, l.masquerade_all)));
    let mut query = Query {
        daddr,
        proto,
        dport,
        saddr: cfg.explain_from,
        local_addresses,
        nodeport_all,
        local_detector: crate::driver::local_detector(cfg, &Default::default()),
        masquerade_all: cfg.masquerade_all,
    };
    // The desired state (`--source`) is rendered with the same settings.
    let mut daemon_cfg = None;
    if let Some((detector, masquerade_all)) = &daemon_local {
        query.local_detector = detector.clone();
        query.masquerade_all = *masquerade_all;
        daemon_cfg = Some(with_local_traffic(cfg, detector, *masquerade_all));
    }
    let cfg = daemon_cfg.as_ref().unwrap_or(cfg);
    let settings_note = daemon_local.as_ref().map(|_| {
        format!(
            "local traffic and masquerading as the daemon on {} runs them",
            cfg.metrics_bind_address
        )
    });
    if cfg.mode == ProxyMode::Ipvs {
        return explain_ipvs_mode(cfg, target, query, state.as_ref()).await;
    }
    let mut kernel = explain(&view, &query);
    if let Some(note) = &settings_note {
        kernel.masquerade_reason = format!("{} ({note})", kernel.masquerade_reason);
    }
    if state.is_none() {
        kernel.problems.push(format!(
            "no table {} {} in the kernel: kube-nlproxy has not synced here (or it was deleted)",
            family.nft_name(),
            crate::mode::nftables::TABLE
        ));
    }
    // With a source: the desired state, explained the same way.
    let mut disagree = None;
    if cfg.source_given {
        let objects = load_objects(cfg).await?;
        let changes = ObjectChanges::everything(objects);
        let mut driver = nftables_driver(cfg)?;
        let pending = driver.plan(changes)?;
        query.local_detector = crate::driver::local_detector(cfg, driver.state());
        add_endpoint_reasons(&mut kernel, driver.state(), &query);
        let tables = driver.mode().renderer().tables();
        if let Some(t) = tables.iter().find(|t| t.family == family) {
            let desired = explain(&TableView::from_spec(t), &query);
            // Served, but without endpoints the desired state has: degraded.
            let lacking: Vec<&str> = desired
                .candidates
                .iter()
                .map(|c| c.endpoint.as_str())
                .filter(|e| !kernel.candidates.iter().any(|k| k.endpoint == *e))
                .collect();
            if kernel.outcome == Outcome::Served && !lacking.is_empty() {
                kernel.outcome = Outcome::Degraded;
                kernel.problems.push(format!(
                    "the kernel lacks endpoints the desired state has: {}",
                    lacking.join(", ")
                ));
            }
            let mut d = disagreements(&kernel, &desired);
            let pending: Vec<String> = pending
                .iter()
                .filter(|p| p.service.is_some() && p.service == desired.service)
                .map(|p| format!("the next sync would send `{} {}`", p.op, p.text))
                .collect();
            d.extend(pending);
            disagree = Some(d);
        }
    }
    print_explanation(cfg, target, &query, &kernel, disagree.as_deref());
    Ok(kernel.outcome.exit_code())
}

/// `cfg` with the local-traffic detection and `--masquerade-all` of a running
/// daemon (its pod CIDRs, whichever mode found them, as `ClusterCIDR`).
fn with_local_traffic(
    cfg: &Config,
    detector: &crate::mode::nftables::LocalDetector,
    masquerade_all: bool,
) -> Config {
    use crate::config::DetectLocalMode as Mode;
    use crate::mode::nftables::LocalDetector;
    let mut out = cfg.clone();
    out.masquerade_all = masquerade_all;
    out.detect_local_mode = match detector {
        LocalDetector::None => None,
        LocalDetector::Cidrs(c) => {
            out.cluster_cidrs = c.clone();
            Some(Mode::ClusterCidr)
        }
        LocalDetector::BridgeInterface(i) => {
            out.pod_bridge_interface = Some(i.clone());
            Some(Mode::BridgeInterface)
        }
        LocalDetector::InterfaceNamePrefix(p) => {
            out.pod_interface_name_prefix = Some(p.clone());
            Some(Mode::InterfaceNamePrefix)
        }
    };
    out
}

/// With the desired state at hand: why the matched service port's endpoints
/// are the ones they are, when it is not simply "the ready ones" (topology
/// hints, a terminating fallback), after what the kernel says.
fn add_endpoint_reasons(
    ex: &mut crate::sync::explain::Explanation,
    state: &crate::model::ClusterState,
    query: &crate::sync::explain::Query,
) {
    let Some(service) = ex.service.as_deref() else {
        return;
    };
    let family = crate::model::IpFamily::of(&query.daddr);
    let Some(((name, _), svc)) = state.services.iter().find(|((name, f), _)| {
        *f == family
            && name.protocol.number() == query.proto
            && crate::mode::nftables::port_comment(name) == service
    }) else {
        return;
    };
    let endpoints = state
        .endpoints
        .get(name)
        .map_or(&[][..], |eps| eps.as_slice());
    let reasons = crate::model::categorize_endpoints(endpoints, svc, &state.node).reasons;
    if reasons.is_empty() {
        return;
    }
    let reasons = reasons.join("; ");
    ex.endpoints_from = Some(match ex.endpoints_from.take() {
        Some(from) => format!("{from}; desired state: {reasons}"),
        None => format!("desired state: {reasons}"),
    });
}

/// `explain` in ipvs mode: IPVS, the ipsets and our table read from the
/// kernel; with `--source`, the desired state explained the same way.
async fn explain_ipvs_mode(
    cfg: &Config,
    target: &str,
    mut query: crate::sync::explain::Query,
    table: Option<&kube_nlproxy_netlink::nft::TableState>,
) -> Result<u8, ProxierError> {
    use crate::sync::ipvs::IpvsDataplane;
    use crate::sync::ipvs::explain::{IpvsView, disagreements_ipvs, explain_ipvs};
    let current = NetlinkIpvs::new()?.dump()?;
    let mut view = IpvsView::from_kernel(&current, table);
    if let Some(client) = query.saddr {
        match crate::sync::ipvs::templates::read_templates_of(client) {
            Ok(t) => view.templates = Some(t),
            Err(e) => tracing::warn!(
                "cannot read {}: {e}",
                crate::sync::ipvs::templates::IP_VS_CONN
            ),
        }
    }
    let family = crate::model::IpFamily::of(&query.daddr);
    let mut desired_view = None;
    let mut source_driver = None;
    let mut pending = Vec::new();
    if cfg.source_given {
        let objects = load_objects(cfg).await?;
        let changes = ObjectChanges::everything(objects);
        let driver = source_driver.insert(ipvs_driver(cfg, false)?);
        pending = driver.plan(changes)?;
        query.local_detector = crate::driver::local_detector(cfg, driver.state());
        let mode = driver.mode();
        let desired = mode.desired_state();
        view.names = IpvsView::names_of(desired);
        desired_view = Some(IpvsView::from_desired(
            desired,
            &mode.desired_tables(),
            family,
        ));
    }
    let mut kernel = explain_ipvs(&view, &query);
    if let Some(driver) = &source_driver {
        add_endpoint_reasons(&mut kernel, driver.state(), &query);
    }
    let disagree = desired_view.map(|d| {
        let desired = explain_ipvs(&d, &query);
        let mut out = disagreements_ipvs(&kernel, &desired);
        out.extend(
            pending
                .iter()
                .filter(|p| p.service.is_some() && p.service == desired.service)
                .map(|p| format!("the next sync would send `{} {}`", p.op, p.text)),
        );
        out
    });
    print_explanation(cfg, target, &query, &kernel, disagree.as_deref());
    Ok(kernel.outcome.exit_code())
}

/// Prints an explanation as text or JSON (`--output`).
fn print_explanation(
    cfg: &Config,
    target: &str,
    query: &crate::sync::explain::Query,
    kernel: &crate::sync::explain::Explanation,
    disagree: Option<&[String]>,
) {
    let code = kernel.outcome.exit_code();
    match cfg.output {
        crate::config::Output::Text => {
            print!(
                "{}",
                crate::sync::explain::render_text(query, kernel, disagree)
            )
        }
        crate::config::Output::Json => {
            #[derive(serde::Serialize)]
            struct Out<'a> {
                target: String,
                from: Option<std::net::IpAddr>,
                mode: &'static str,
                #[serde(flatten)]
                kernel: &'a crate::sync::explain::Explanation,
                exit_code: u8,
                disagreements: Option<&'a [String]>,
            }
            let out = Out {
                target: target.to_string(),
                from: cfg.explain_from,
                mode: match cfg.mode {
                    ProxyMode::Nftables => "nftables",
                    ProxyMode::Ipvs => "ipvs",
                },
                kernel,
                exit_code: code,
                disagreements: disagree,
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&out)
                    .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
            );
        }
    }
}

/// `/status` of a daemon on `addr` (the metrics port), if one answers.
fn daemon_status(addr: &str) -> Option<crate::serve::status::StatusInfo> {
    use std::io::{Read, Write};
    let mut sock: std::net::SocketAddr = addr.parse().ok()?;
    if sock.ip().is_unspecified() {
        sock.set_ip(match sock {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let timeout = Duration::from_secs(1);
    let mut s = std::net::TcpStream::connect_timeout(&sock, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(b"GET /status HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut body = Vec::new();
    s.take(1 << 20).read_to_end(&mut body).ok()?;
    let text = String::from_utf8_lossy(&body);
    let (_, json) = text.split_once("\r\n\r\n")?;
    serde_json::from_str(json).ok()
}

/// What our nft tables in the kernel hold, per family.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KernelTableStatus {
    /// `ip` / `ip6`
    pub family: &'static str,
    /// Whether the table exists.
    pub exists: bool,
    /// Chains, rules, sets.
    pub chains: usize,
    /// Rules over all chains.
    pub rules: usize,
    /// Sets and maps.
    pub sets: usize,
    /// Elements over all sets (packet-made affinity entries included).
    pub elements: usize,
    /// Services (`ns/name`) named by an element.
    pub services: usize,
    /// Service ports (`ns/name:port`) named by an element.
    pub service_ports: usize,
    /// Endpoint elements (entry point x endpoint).
    pub endpoint_elements: usize,
    /// Rules without our fingerprint: changed behind our back.
    pub foreign_rules: Vec<String>,
}

/// What the ipvs mode's objects in the kernel hold.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KernelIpvsStatus {
    /// Addresses on `kube-ipvs0` (`None`: no such link).
    pub dummy_addresses: Option<usize>,
    /// Virtual servers whose address is on `kube-ipvs0` or is a NodePort
    /// address (not on it, and the port in our NodePort ipsets).
    pub virtual_servers: usize,
    /// Their real servers.
    pub real_servers: usize,
    /// Of those, with weight 0 (terminating, draining).
    pub draining: usize,
    /// Other IPVS virtual servers (not ours; never touched).
    pub other_virtual_servers: usize,
    /// Our KUBE-* ipsets that exist.
    pub ipsets: usize,
}

/// Reads IPVS, `kube-ipvs0` and the ipsets for `status` in ipvs mode.
fn kernel_ipvs_status() -> Result<KernelIpvsStatus, ProxierError> {
    use crate::sync::ipvs::IpvsDataplane;
    let cur = NetlinkIpvs::new()?.dump()?;
    let dummy = cur.dummy.clone().unwrap_or_default();
    let nodeport_ports: std::collections::BTreeSet<u16> = cur
        .ipsets
        .iter()
        .filter(|(n, _)| n.contains("NODE-PORT"))
        .flat_map(|(_, s)| &s.members)
        .filter_map(|m| match m {
            kube_nlproxy_netlink::ipset::IpsetMember::Port(p) => Some(*p),
            kube_nlproxy_netlink::ipset::IpsetMember::IpPort { port, .. } => Some(*port),
            _ => None,
        })
        .collect();
    let mut st = KernelIpvsStatus {
        dummy_addresses: cur.dummy.as_ref().map(|d| d.len()),
        ipsets: cur.ipsets.len(),
        ..Default::default()
    };
    for (k, vs) in &cur.services {
        if dummy.contains(&k.addr) || nodeport_ports.contains(&k.port) {
            st.virtual_servers += 1;
            st.real_servers += vs.dests.len();
            st.draining += vs.dests.values().filter(|d| d.weight == 0).count();
        } else {
            st.other_virtual_servers += 1;
        }
    }
    Ok(st)
}

/// `kube-nlproxy status`: the daemon's `/status` when one answers on
/// `--metrics-bind-address`, and what our tables in the kernel hold.
pub async fn status(cfg: &Config) -> Result<(), ProxierError> {
    use kube_nlproxy_netlink::nft::{Family, NftSocket};
    let daemon = daemon_status(&cfg.metrics_bind_address);
    let mut sock = NftSocket::new().map_err(SyncError::Socket)?;
    let mut tables = Vec::new();
    for family in [Family::Ipv4, Family::Ipv6] {
        let state = sock
            .dump_table(family, crate::mode::nftables::TABLE)
            .map_err(|source| SyncError::DumpFailed {
                family: family.nft_name(),
                source,
            })?;
        let mut t = KernelTableStatus {
            family: family.nft_name(),
            ..Default::default()
        };
        if let Some(st) = state {
            t.exists = true;
            t.chains = st.chains.len();
            t.rules = st.rules.values().map(Vec::len).sum();
            t.sets = st.sets.len();
            t.elements = st.elements.values().map(Vec::len).sum();
            // Elements name a port (`ns/name:port`) or the whole Service
            // (`ns/name`, also a port's name when it has no port name: then
            // the Service has that one port).
            let mut named_ports: std::collections::BTreeMap<
                &str,
                std::collections::BTreeSet<&str>,
            > = Default::default();
            for e in st.elements.values().flatten() {
                if let Some(c) = e.comment.as_deref()
                    && let Some(s) = crate::sync::service_of_comment(c)
                {
                    let ports = named_ports.entry(s).or_default();
                    if c.len() > s.len() {
                        ports.insert(c);
                    }
                }
            }
            t.services = named_ports.len();
            t.service_ports = named_ports.values().map(|p| p.len().max(1)).sum();
            t.endpoint_elements = st
                .elements
                .iter()
                .filter(|(n, _)| n.starts_with("endpoints-"))
                .map(|(_, e)| e.len())
                .sum();
            t.foreign_rules = crate::sync::explain::TableView::from_kernel(&st).foreign_rules;
        }
        tables.push(t);
    }
    // kube-proxy's leftovers act on traffic we do not NAT: say so.
    let kube_proxy = crate::sync::kube_proxy::detect(&mut sock)?;
    let ipvs = match cfg.mode {
        ProxyMode::Ipvs => Some(kernel_ipvs_status()?),
        ProxyMode::Nftables => None,
    };
    // ipvs mode with `--source`: where the kernel differs from the desired
    // state (IPVS has no generation id to check drift by), as plan lists it.
    let drift = match cfg.mode {
        ProxyMode::Ipvs if cfg.source_given => {
            let changes = ObjectChanges::everything(load_objects(cfg).await?);
            let (ops, _) = plan_with(ipvs_driver(cfg, false)?, changes)?;
            Some(
                ops.iter()
                    .map(|p| match &p.service {
                        Some(s) => format!("{} {}  # {s}", p.op, p.text),
                        None => format!("{} {}", p.op, p.text),
                    })
                    .collect::<Vec<_>>(),
            )
        }
        _ => None,
    };
    // The daemon's count and the kernel's, in the same unit (nftables mode:
    // ipvs keeps its services out of our table).
    let counts_agree = daemon
        .as_ref()
        .filter(|d| d.mode == "nftables" && d.syncs > 0)
        .map(|d| d.service_ports == tables.iter().map(|t| t.service_ports).sum::<usize>());
    match cfg.output {
        crate::config::Output::Json => {
            #[derive(serde::Serialize)]
            struct Out<'a> {
                daemon: Option<&'a crate::serve::status::StatusInfo>,
                #[serde(skip_serializing_if = "Option::is_none")]
                service_ports_agree: Option<bool>,
                kernel: &'a [KernelTableStatus],
                #[serde(skip_serializing_if = "Option::is_none")]
                ipvs: Option<&'a KernelIpvsStatus>,
                #[serde(skip_serializing_if = "Option::is_none")]
                drift: Option<&'a [String]>,
                kube_proxy_state: &'a crate::sync::kube_proxy::KubeProxyState,
            }
            println!(
                "{}",
                serde_json::to_string_pretty(&Out {
                    daemon: daemon.as_ref(),
                    service_ports_agree: counts_agree,
                    kernel: &tables,
                    ipvs: ipvs.as_ref(),
                    drift: drift.as_deref(),
                    kube_proxy_state: &kube_proxy,
                })
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
            );
        }
        crate::config::Output::Text => {
            match &daemon {
                Some(d) => {
                    println!("daemon ({}/status):", cfg.metrics_bind_address);
                    println!("  mode:          {}", d.mode);
                    println!("  node:          {}", d.node);
                    println!(
                        "  service ports: {} (once per family, as the tables below count them)",
                        d.service_ports
                    );
                    let ago = d.last_sync_unix.map(|t| {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_secs_f64())
                            .unwrap_or(t);
                        format!("{:.1}s ago", (now - t).max(0.0))
                    });
                    println!(
                        "  last sync:     {} ({} ms, {})",
                        ago.unwrap_or_else(|| "never".into()),
                        d.last_sync_ms
                            .map(|m| format!("{m:.1}"))
                            .unwrap_or("-".into()),
                        match d.last_sync_full {
                            Some(true) => "read back",
                            Some(false) => "delta",
                            None => "-",
                        }
                    );
                    println!(
                        "  syncs:         {} ok, {} failed",
                        d.syncs, d.sync_failures
                    );
                    println!(
                        "  last error:    {}",
                        d.last_error.as_deref().unwrap_or("none")
                    );
                    println!("  drift repairs: {}", d.drift_repairs);
                    for p in &d.node_problems {
                        println!("  node problem:  {p}");
                    }
                }
                None => println!(
                    "no daemon answers on {} (/status); from the kernel only:",
                    cfg.metrics_bind_address
                ),
            }
            if kube_proxy.is_empty() {
                println!("kube-proxy state: none");
            } else {
                println!(
                    "kube-proxy state: {} — it hooks at the priorities of ours and \
                     still serves Services we no longer do; remove it with \
                     `kube-nlproxy cleanup --kube-proxy`",
                    kube_proxy.summary()
                );
            }
            for t in &tables {
                if !t.exists {
                    println!("table {} kube-nlproxy: absent", t.family);
                    continue;
                }
                println!(
                    "table {} kube-nlproxy: {} services ({} service ports), {} endpoint elements; {} chains, {} rules, {} sets, {} elements",
                    t.family,
                    t.services,
                    t.service_ports,
                    t.endpoint_elements,
                    t.chains,
                    t.rules,
                    t.sets,
                    t.elements
                );
                for r in &t.foreign_rules {
                    println!("  ! not ours (changed behind our back): {r}");
                }
            }
            if let Some(false) = counts_agree {
                println!(
                    "! the daemon serves {} service ports, the kernel's tables name {}: \
                     a sync is pending or failed (see last error)",
                    daemon.as_ref().map_or(0, |d| d.service_ports),
                    tables.iter().map(|t| t.service_ports).sum::<usize>()
                );
            }
            if let Some(i) = &ipvs {
                match i.dummy_addresses {
                    Some(n) => println!(
                        "ipvs: {} virtual servers on {} ({} addresses), {} real servers ({} draining); {} other virtual servers; {} KUBE-* ipsets",
                        i.virtual_servers,
                        crate::mode::ipvs::DUMMY_LINK,
                        n,
                        i.real_servers,
                        i.draining,
                        i.other_virtual_servers,
                        i.ipsets
                    ),
                    None => println!(
                        "ipvs: no {} ({} virtual servers not ours; {} KUBE-* ipsets)",
                        crate::mode::ipvs::DUMMY_LINK,
                        i.other_virtual_servers,
                        i.ipsets
                    ),
                }
            }
            match drift.as_deref() {
                Some([]) => println!("drift: none, the kernel matches the desired state"),
                Some(ops) => {
                    println!(
                        "drift: the kernel differs from the desired state; the next sync would send {} operations:",
                        ops.len()
                    );
                    for op in ops.iter().take(20) {
                        println!("  ! {op}");
                    }
                }
                None => {}
            }
        }
    }
    Ok(())
}
