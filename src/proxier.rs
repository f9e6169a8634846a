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
use crate::source::kube::{self as kube_source, KubeSource, KubeSourceConfig, KubeSourceError};
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
    );
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
    let mut nft = nftables_driver(cfg)?;
    let n = nft.cleanup()?;
    tracing::info!("cleanup: deleted {n} table(s)");
    let n = cleanup_ipvs_objects()?;
    tracing::info!("cleanup: {n} IPVS-mode operation(s)");
    Ok(())
}

/// Removes ipvs mode's objects but its nft table (nftables mode converts that
/// by the ordinary diff). Works on a kernel without IPVS, where no IPVS
/// object can exist.
fn cleanup_ipvs_objects() -> Result<usize, ProxierError> {
    let ipvs = match NetlinkIpvs::new() {
        Ok(dp) => dp,
        Err(_) => NetlinkIpvs::without_ipvs()?,
    };
    let mut host = KernelHost::new();
    let addresses = host.local_addresses().unwrap_or_default();
    let mut mode = IpvsMode::new(ipvs, NetlinkDataplane::new()?, "rr");
    Ok(mode.cleanup_ipvs_objects(&addresses)?)
}

/// Starts the configured source: the manifests at `--source file:PATH`, or the API
/// server (in-cluster, `--kubeconfig`, `--master`) for `--source kube`.
async fn start_source(cfg: &Config) -> Result<Box<dyn ObjectSource>, ProxierError> {
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
            };
            let client = kube_source::client(&kcfg).await?;
            let source = KubeSource::start(client.clone(), &node).await?;
            tokio::spawn(async move { kube_source::post_starting_event(&client, &node).await });
            Ok(Box::new(source))
        }
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
        Source::Kube => initial_objects(start_source(cfg).await?.as_ref()).await,
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
        match cleanup_ipvs_objects() {
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
        return Ok(());
    }
    driver.host_mut().apply_conntrack_settings(&cfg.conntrack);
    // oom_score_adj was written by main, with CAP_SYS_RESOURCE, before the
    // capabilities were dropped.
    let source = start_source(cfg).await?;
    Ok(crate::daemon::run(cfg, source.as_ref(), &mut driver).await?)
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
    use crate::sync::explain::{Query, TableView, disagreements, explain, render_text};
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
    let mut kernel = explain(&view, &query);
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
        let tables = driver.mode().renderer().tables();
        if let Some(t) = tables.iter().find(|t| t.family == family) {
            let desired = explain(&TableView::from_spec(t), &query);
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
    let code = kernel.outcome.exit_code();
    match cfg.output {
        crate::config::Output::Text => {
            print!("{}", render_text(&query, &kernel, disagree.as_deref()))
        }
        crate::config::Output::Json => {
            #[derive(serde::Serialize)]
            struct Out<'a> {
                target: String,
                from: Option<std::net::IpAddr>,
                #[serde(flatten)]
                kernel: &'a crate::sync::explain::Explanation,
                exit_code: u8,
                disagreements: Option<&'a [String]>,
            }
            let out = Out {
                target: target.to_string(),
                from: cfg.explain_from,
                kernel: &kernel,
                exit_code: code,
                disagreements: disagree.as_deref(),
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&out)
                    .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
            );
        }
    }
    Ok(code)
}

/// `kube-nlproxy status`: not yet (see README).
pub async fn status(_cfg: &Config) -> Result<(), ProxierError> {
    Err(ProxierError::Argument("status: not implemented yet".into()))
}
