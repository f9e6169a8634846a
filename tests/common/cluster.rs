//! A real control plane (etcd, kube-apiserver, kube-controller-manager) for tests,
//! started by `scripts/cluster up DIR` in a network namespace of the test and
//! stopped by `scripts/cluster down DIR` when the guard drops (also on panic).
//!
//! The first use on a machine builds the components (`testenv/build`, minutes);
//! later ones reuse the cached binaries.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The repository root (where `scripts/cluster` is).
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A running control plane; `scripts/cluster down` on drop, its state dir removed.
pub struct RealCluster {
    /// The state folder (certificates, data, logs, pidfiles, kubeconfigs).
    pub dir: PathBuf,
    /// The network namespace the control plane runs in.
    pub netns: String,
    /// The address kube-apiserver listens on (inside `netns`).
    pub address: String,
}

impl RealCluster {
    /// The folder holding the built components: `$KNP_TESTENV_BIN` (set by
    /// `scripts/test`, which builds them before any test starts), else
    /// `testenv/build` builds what is missing and prints it.
    pub fn components_dir() -> String {
        if let Ok(dir) = std::env::var("KNP_TESTENV_BIN")
            && !dir.is_empty()
        {
            return dir;
        }
        let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/testenv/build"))
            .output()
            .expect("run testenv/build");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// Starts a control plane in `netns`, kube-apiserver bound to `address` (an
    /// address of that namespace). Extra kube-apiserver flags in `apiserver_args`.
    pub fn up(netns: &str, address: &str, apiserver_args: &[&str]) -> RealCluster {
        let dir = std::env::temp_dir().join(super::unique("knp-cluster"));
        std::fs::create_dir_all(&dir).unwrap();
        // The guard exists before anything starts, so a failed `up` is cleaned too.
        let c = RealCluster {
            dir,
            netns: netns.to_string(),
            address: address.to_string(),
        };
        c.start(apiserver_args);
        c
    }

    /// (Re)starts whatever is not running (`scripts/cluster up`).
    pub fn start(&self, apiserver_args: &[&str]) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(repo().join("scripts/cluster"))
            .arg("up")
            .arg(&self.dir)
            .env("KNP_CLUSTER_ADDRESS", &self.address)
            .env("KNP_CLUSTER_APISERVER_ARGS", apiserver_args.join(" "))
            .stdin(Stdio::null())
            .output()
            .expect("spawn scripts/cluster up");
        assert!(
            out.status.success(),
            "scripts/cluster up {} failed: {}\n{}",
            self.dir.display(),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
    }

    /// Stops one component (`etcd`, `kube-apiserver`, `kube-controller-manager`).
    pub fn stop(&self, component: &str) {
        let out = Command::new(repo().join("scripts/cluster"))
            .arg("stop")
            .arg(&self.dir)
            .arg(component)
            .output()
            .expect("spawn scripts/cluster stop");
        assert!(out.status.success(), "scripts/cluster stop {component}");
    }

    /// The pid of a running component (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager`, `kube-scheduler`) from its pidfile, for
    /// `/proc/PID` figures (CPU time, `VmHWM`); `None` when it is not running.
    pub fn pid(&self, component: &str) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.join(format!("{component}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        std::path::Path::new(&format!("/proc/{pid}"))
            .exists()
            .then_some(pid)
    }

    /// The kubeconfig of the `kube-nlproxy` ServiceAccount (RBAC of `deploy/`).
    pub fn nlproxy_kubeconfig(&self) -> PathBuf {
        self.dir.join("kube-nlproxy.kubeconfig")
    }

    /// The token file that kubeconfig names.
    pub fn nlproxy_token_file(&self) -> PathBuf {
        self.dir.join("kube-nlproxy.token")
    }

    /// A value of `DIR/ports` (`etcd_client`, `apiserver`, ...).
    pub fn port(&self, name: &str) -> u16 {
        let ports = std::fs::read_to_string(self.dir.join("ports")).unwrap();
        ports
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in ports"))
            .parse()
            .unwrap()
    }

    /// `kubectl --kubeconfig admin.kubeconfig ARGS` in the cluster's namespace,
    /// with `stdin` as input.
    pub fn kubectl_in(&self, args: &[&str], stdin: &str) -> Output {
        let kubectl = format!("{}/kubectl", Self::components_dir());
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.netns, &kubectl, "--kubeconfig"])
            .arg(self.dir.join("admin.kubeconfig"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// The `kubernetes` Service's ClusterIP.
    pub fn kubernetes_cluster_ip(&self) -> String {
        self.kubectl(&[
            "get",
            "service",
            "kubernetes",
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .trim()
        .to_string()
    }

    /// `kubectl ARGS` as admin; panics when it fails; its stdout.
    #[track_caller]
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_in(args, "");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `yaml` as admin.
    #[track_caller]
    pub fn apply(&self, yaml: &str) {
        let out = self.kubectl_in(&["apply", "-f", "-"], yaml);
        assert!(
            out.status.success(),
            "kubectl apply: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The command line of the real kube-proxy (`testenv/`) in `mode` (`nftables`,
    /// `iptables`) on node [`NODE`](super::NODE) of this cluster, as admin: the pod
    /// ranges `cluster_cidr` (ClusterCIDR local detection), NodePorts on the primary
    /// node IP, no conntrack or OOM tuning (a test namespace has none of its own),
    /// no minimum sync period, metrics and healthz on 127.0.0.1 (10249, 10256).
    pub fn kube_proxy_args(&self, mode: &str, cluster_cidr: &str) -> Vec<String> {
        self.kube_proxy_args_on(mode, cluster_cidr, super::NODE)
    }

    /// [`kube_proxy_args`](Self::kube_proxy_args) for node `node` (its Node
    /// object's name, `--hostname-override`): what a fleet of node namespaces
    /// runs, one kube-proxy each.
    pub fn kube_proxy_args_on(&self, mode: &str, cluster_cidr: &str, node: &str) -> Vec<String> {
        let kubeconfig = self.dir.join("admin.kubeconfig").display().to_string();
        [
            "--proxy-mode",
            mode,
            "--kubeconfig",
            &kubeconfig,
            "--hostname-override",
            node,
            "--cluster-cidr",
            cluster_cidr,
            "--detect-local-mode",
            "ClusterCIDR",
            "--nodeport-addresses",
            "primary",
            "--conntrack-max-per-core",
            "0",
            "--conntrack-tcp-timeout-established",
            "0",
            "--conntrack-tcp-timeout-close-wait",
            "0",
            "--oom-score-adj",
            "0",
            // Also nftables mode's minimum (kube-proxy's one MinSyncPeriod).
            "--iptables-min-sync-period",
            "0s",
            "--metrics-bind-address",
            "127.0.0.1:10249",
            "--healthz-bind-address",
            "127.0.0.1:10256",
            "--v",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// A Pod object for the test pod `pod` (label `app=web`, on its node), its
    /// status patched Running and Ready with the pod's addresses (there is no
    /// kubelet: the EndpointSlice controller reads this).
    pub fn create_pod(&self, pod: &super::Pod) {
        let spec = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": "default", "labels": {"app": "web"}},
            "spec": {
                "nodeName": pod.node_name(),
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 600,
                "containers": [{"name": "c", "image": "none"}],
            },
        });
        self.apply(&spec.to_string());
        self.set_pod_ready(pod, true);
    }

    /// Patches the Pod's status: Running, Ready `ready`, the pod's two addresses.
    pub fn set_pod_ready(&self, pod: &super::Pod, ready: bool) {
        let flag = if ready { "True" } else { "False" };
        let status = serde_json::json!({"status": {
            "phase": "Running",
            "podIP": pod.v4.to_string(),
            "podIPs": [{"ip": pod.v4.to_string()}, {"ip": pod.v6.to_string()}],
            "conditions": [
                {"type": "Ready", "status": flag},
                {"type": "ContainersReady", "status": flag},
            ],
        }});
        self.kubectl(&[
            "patch",
            "pod",
            &pod.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
    }

    /// Creates our Node object (`NODE`, `NODE_V4`/`NODE_V6` InternalIPs) with
    /// `labels`.
    pub fn create_node(
        &self,
        name: &str,
        v4: std::net::Ipv4Addr,
        v6: std::net::Ipv6Addr,
        zone: Option<&str>,
    ) {
        let mut labels = serde_json::json!({"kubernetes.io/hostname": name});
        if let Some(z) = zone {
            labels["topology.kubernetes.io/zone"] = z.into();
        }
        self.apply(
            &serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels},
            })
            .to_string(),
        );
        let status = serde_json::json!({"status": {"addresses": [
            {"type": "InternalIP", "address": v4.to_string()},
            {"type": "InternalIP", "address": v6.to_string()},
            {"type": "Hostname", "address": name},
        ]}});
        self.kubectl(&[
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
    }

    /// A new token of the kube-nlproxy ServiceAccount (`kubectl create token` ARGS).
    pub fn token(&self, args: &[&str]) -> String {
        let mut v = vec!["create", "token", "-n", "kube-system", "kube-nlproxy"];
        v.extend_from_slice(args);
        self.kubectl(&v).trim().to_string()
    }

    /// The logs of every component, for failure messages (last lines of each).
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for n in ["etcd", "kube-apiserver", "kube-controller-manager"] {
            let log =
                std::fs::read_to_string(self.dir.join(format!("{n}.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            s += &format!(
                "--- {n}.log (last {} lines)\n{}\n",
                tail.len(),
                tail.join("\n")
            );
        }
        s
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/cluster"))
            .arg("down")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .status();
        if std::env::var_os("KNP_KEEP_CLUSTER").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Which iptables kube-proxy's iptables mode runs: the `iptables*` commands it
/// finds on its PATH are links to these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IptablesBackend {
    /// iptables-nft (nf_tables tables `nat`, `filter`, `mangle`).
    Nft,
    /// iptables-legacy (x_tables).
    Legacy,
}

/// The real kube-proxy in a node namespace; SIGKILLed on drop if still running.
pub struct RealKubeProxy {
    child: std::process::Child,
    log: PathBuf,
    path_dir: Option<PathBuf>,
}

impl RealKubeProxy {
    /// Starts `kube-proxy ARGS` of `bin_dir` in `ns`; with `backend`, its PATH
    /// leads `iptables`, `iptables-save`, `iptables-restore` and the ip6 ones to
    /// that backend's commands.
    pub fn start(
        bin_dir: &str,
        ns: &str,
        args: &[String],
        backend: Option<IptablesBackend>,
    ) -> RealKubeProxy {
        let log = std::env::temp_dir().join(format!("{}.kube-proxy.log", super::unique("knp")));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .arg(format!("{bin_dir}/kube-proxy"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
        let mut path_dir = None;
        if let Some(backend) = backend {
            let dir = std::env::temp_dir().join(super::unique("knp-iptables"));
            std::fs::create_dir_all(&dir).unwrap();
            let suffix = match backend {
                IptablesBackend::Nft => "nft",
                IptablesBackend::Legacy => "legacy",
            };
            for base in ["iptables", "ip6tables"] {
                for tail in ["", "-save", "-restore"] {
                    let target = format!("/usr/sbin/{base}-{suffix}{tail}");
                    std::os::unix::fs::symlink(&target, dir.join(format!("{base}{tail}"))).unwrap();
                }
            }
            let path = format!(
                "{}:{}",
                dir.display(),
                std::env::var("PATH").unwrap_or_default()
            );
            cmd.env("PATH", path);
            path_dir = Some(dir);
        }
        let child = cmd.spawn().expect("spawn kube-proxy");
        RealKubeProxy {
            child,
            log,
            path_dir,
        }
    }

    /// Its log (stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as a DaemonSet rollout stops a pod (kube-proxy does no cleanup),
    /// and waits for the exit.
    pub fn terminate(&mut self) {
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

impl Drop for RealKubeProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
        if let Some(dir) = &self.path_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// An HTTPS request from the node namespace to the `kubernetes` Service's
/// ClusterIP: the HTTP status the API server answered, or `None` when nothing
/// answered (curl's `000`).
pub fn kubernetes_livez(node_ns: &str, cluster_ip: &str) -> Option<u16> {
    let out = super::nsexec(
        node_ns,
        &[
            "curl",
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "2",
            &format!("https://{cluster_ip}:443/livez"),
        ],
    );
    let code: u16 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    (code != 0).then_some(code)
}
