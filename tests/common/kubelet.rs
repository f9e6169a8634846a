//! A real node for tests: Debian's containerd (and runc) and the kubelet of
//! `testenv/`, both in the node's network namespace (`nsenter --net`, not
//! `ip netns exec`, which remounts /sys and hides the cgroups), with images
//! imported from OCI layout tarballs (there is no registry). Everything lives
//! under one temporary folder; dropping [`KubeletNode`] stops the kubelet, kills
//! every container of this containerd, stops containerd and its shims, unmounts
//! what they left and removes the folder (also on panic).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::cluster::RealCluster;

/// The final stage of the Containerfile: what the image holds and runs.
#[derive(Debug, Clone, PartialEq)]
pub struct FinalStage {
    /// The `FROM` of the stage (`scratch`).
    pub from: String,
    /// The `COPY` destination of the binary (`/kube-nlproxy`).
    pub dest: String,
    /// The `ENTRYPOINT` (exec form).
    pub entrypoint: Vec<String>,
}

/// Reads the last stage of a Containerfile: its `FROM`, its one `COPY`
/// destination and its exec-form `ENTRYPOINT`.
pub fn final_stage(containerfile: &str) -> FinalStage {
    let lines: Vec<&str> = containerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let start = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("the Containerfile has a FROM");
    let from = lines[start]["FROM ".len()..].trim().to_string();
    let mut dest = None;
    let mut entrypoint = None;
    for l in &lines[start + 1..] {
        if let Some(rest) = l.strip_prefix("COPY ") {
            dest = rest.split_whitespace().last().map(str::to_string);
        } else if let Some(rest) = l.strip_prefix("ENTRYPOINT ") {
            entrypoint = Some(
                serde_json::from_str::<Vec<String>>(rest.trim())
                    .expect("ENTRYPOINT in exec form (a JSON array)"),
            );
        }
    }
    FinalStage {
        from,
        dest: dest.expect("the final stage COPYs the binary"),
        entrypoint: entrypoint.expect("the final stage has an ENTRYPOINT"),
    }
}

/// One image of an OCI layout: `name` (`docker.io/local/x:1`), one layer holding
/// `file` at `dest`, run as `entrypoint`.
pub struct Image<'a> {
    pub name: &'a str,
    pub file: &'a Path,
    pub dest: &'a str,
    pub entrypoint: &'a [String],
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `sha256:<hex>` of a file (`sha256sum`).
fn digest(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    let text = String::from_utf8_lossy(&out.stdout);
    format!("sha256:{}", text.split_whitespace().next().unwrap())
}

/// Writes a blob of `layout` and returns its descriptor fields (digest, size).
fn put_blob(layout: &Path, data: &[u8]) -> (String, usize) {
    let tmp = layout.join("blob.tmp");
    std::fs::write(&tmp, data).unwrap();
    let d = digest(&tmp);
    let hex = d.trim_start_matches("sha256:");
    std::fs::rename(&tmp, layout.join("blobs/sha256").join(hex)).unwrap();
    (d, data.len())
}

/// Writes an OCI image layout tarball (`docker save`'s OCI form) of `images` under
/// `dir` and returns its path, for `ctr images import`. Each image is one
/// uncompressed layer with its one file, as a `FROM scratch` + `COPY` build gives.
pub fn oci_tarball(dir: &Path, images: &[Image]) -> PathBuf {
    let layout = dir.join("oci-layout");
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let mut manifests = Vec::new();
    for (i, img) in images.iter().enumerate() {
        let rootfs = dir.join(format!("rootfs-{i}"));
        let rel = img.dest.trim_start_matches('/');
        let target = rootfs.join(rel);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(img.file, &target).unwrap();
        run(Command::new("chmod").arg("0755").arg(&target));
        let layer = dir.join(format!("layer-{i}.tar"));
        run(Command::new("tar")
            .args([
                "--numeric-owner",
                "--owner=0",
                "--group=0",
                "--mtime=@0",
                "-C",
            ])
            .arg(&rootfs)
            .arg("-cf")
            .arg(&layer)
            .arg(rel));
        let layer_bytes = std::fs::read(&layer).unwrap();
        let (layer_digest, layer_size) = put_blob(&layout, &layer_bytes);
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": img.entrypoint, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        });
        let (config_digest, config_size) = put_blob(&layout, config.to_string().as_bytes());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest, "size": layer_size}],
        });
        let (manifest_digest, manifest_size) = put_blob(&layout, manifest.to_string().as_bytes());
        let tag = img.name.rsplit(':').next().unwrap();
        manifests.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": img.name,
                            "org.opencontainers.image.ref.name": tag},
        }));
    }
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    });
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
    let tarball = dir.join("images.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&tarball)
        .args(["oci-layout", "index.json", "blobs"]));
    tarball
}

/// The sandbox ("pause") image every pod's sandbox runs (testenv/pause).
pub const PAUSE_IMAGE: &str = "docker.io/local/pause:1";

/// containerd and the kubelet of one node, in network namespace `netns`.
pub struct KubeletNode {
    /// Everything of this node: configs, containerd's root and state, the
    /// kubelet's root, logs.
    pub dir: PathBuf,
    /// The node's network namespace.
    pub netns: String,
    /// The node's name (`--hostname-override`).
    pub name: String,
    /// The node's IP (`--node-ip`).
    pub ip: String,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    kubeconfig: PathBuf,
}

impl KubeletNode {
    /// Starts containerd in `netns`: its socket, root and state under a new
    /// folder; the sandbox image [`PAUSE_IMAGE`]; `restrict_oom_score_adj` (this
    /// machine's root has no CAP_SYS_RESOURCE, and runc fails to raise a
    /// container's oom_score_adj without it); cgroupfs; no CNI (every pod of the
    /// test uses the host network).
    pub fn start_runtime(netns: &str, name: &str, ip: &str, cluster: &RealCluster) -> KubeletNode {
        let dir = std::env::temp_dir().join(super::unique("knp-kubelet"));
        std::fs::create_dir_all(dir.join("cni/bin")).unwrap();
        std::fs::create_dir_all(dir.join("cni/net.d")).unwrap();
        let mut node = KubeletNode {
            dir,
            netns: netns.to_string(),
            name: name.to_string(),
            ip: ip.to_string(),
            containerd: None,
            kubelet: None,
            kubeconfig: cluster.dir.join("admin.kubeconfig"),
        };
        let d = node.dir.display().to_string();
        let config = format!(
            r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = "{d}/containerd-debug.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_cdi = false
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/net.d"
"#
        );
        std::fs::write(node.dir.join("containerd.toml"), config).unwrap();
        let log = std::fs::File::create(node.dir.join("containerd.log")).unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .arg("containerd")
            .arg("--config")
            .arg(node.dir.join("containerd.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn containerd");
        node.containerd = Some(child);
        let sock = node.socket();
        assert!(
            super::eventually(Duration::from_secs(30), || sock.exists()
                && node.ctr(&["version"]).status.success()),
            "containerd did not start:\n{}",
            node.log_tail("containerd.log", 30)
        );
        node
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// `ctr -a SOCKET -n k8s.io ARGS` (the CRI's namespace).
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("-a")
            .arg(self.socket())
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .expect("spawn ctr")
    }

    /// Imports an OCI layout tarball (`ctr images import`).
    pub fn import(&self, tarball: &Path) {
        let out = self.ctr(&["images", "import", &tarball.display().to_string()]);
        assert!(
            out.status.success(),
            "ctr images import: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the kubelet of `components` (testenv/) in the node's namespace, as
    /// admin of the cluster: cgroupfs without per-QoS cgroups, cgroup v1 allowed
    /// (this machine's hierarchy), anonymous and always-allowed kubelet API,
    /// no iptables chains of its own, the node's IP `--node-ip`.
    pub fn start_kubelet(&mut self, components: &str) {
        let d = self.dir.display().to_string();
        if !self.dir.join("kubelet.yaml").exists() {
            let config = format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{d}/containerd.sock
imageServiceEndpoint: unix://{d}/containerd.sock
podLogsDir: {d}/podlogs
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
cgroupsPerQOS: false
enforceNodeAllocatable: []
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
makeIPTablesUtilChains: false
resolvConf: /etc/resolv.conf
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
registerNode: true
clusterDNS: []
",
                ip = self.ip
            );
            std::fs::write(self.dir.join("kubelet.yaml"), config).unwrap();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("kubelet.log"))
            .unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns))
            .arg(format!("{components}/kubelet"))
            .arg("--config")
            .arg(self.dir.join("kubelet.yaml"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--root-dir")
            .arg(self.dir.join("kubelet"))
            .args(["--hostname-override", &self.name, "--node-ip", &self.ip])
            .args(["--v", "2"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn kubelet");
        self.kubelet = Some(child);
    }

    /// Kills the kubelet (SIGKILL), as a node that loses power does.
    pub fn kill_kubelet(&mut self) {
        if let Some(mut k) = self.kubelet.take() {
            let _ = k.kill();
            let _ = k.wait();
        }
    }

    /// Kills every container of this containerd (SIGKILL to each task).
    pub fn kill_containers(&self) {
        let out = self.ctr(&["tasks", "ls", "-q"]);
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = self.ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
        }
        super::eventually(Duration::from_secs(20), || {
            let out = self.ctr(&["tasks", "ls"]);
            !String::from_utf8_lossy(&out.stdout).contains("RUNNING")
        });
    }

    /// The last `n` lines of one of the node's logs (`kubelet.log`, `containerd.log`).
    pub fn log_tail(&self, file: &str, n: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Pids of the shims of this containerd (`-address SOCKET` on their command line).
    fn shims(&self) -> Vec<i32> {
        let sock = self.socket().display().to_string();
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            if args
                .first()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
                && args
                    .windows(2)
                    .any(|w| w[0] == b"-address" && w[1] == sock.as_bytes())
            {
                pids.push(pid);
            }
        }
        pids
    }

    /// Mount points under the node's folder, deepest first.
    fn mounts(&self) -> Vec<String> {
        let prefix = format!("{}/", self.dir.display());
        let mut m: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|p| p.starts_with(&prefix))
            .map(str::to_string)
            .collect();
        m.sort();
        m.reverse();
        m
    }
}

impl Drop for KubeletNode {
    fn drop(&mut self) {
        self.kill_kubelet();
        if self.containerd.is_some() {
            self.kill_containers();
            let out = self.ctr(&["tasks", "ls", "-q"]);
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = self.ctr(&["tasks", "delete", "-f", id]);
            }
        }
        if let Some(mut c) = self.containerd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for pid in self.shims() {
            // SAFETY: kill(2) of a shim our containerd started (found by its socket).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        for m in self.mounts() {
            // SAFETY: a NUL-terminated path; umount2 only reads it.
            let c = std::ffi::CString::new(m).unwrap();
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
        if std::env::var_os("KNP_KEEP_CLUSTER").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
