//! deploy/: every manifest parses into its k8s-openapi type without losing a field,
//! the DaemonSet's flags parse with the binary's own parser, the ConfigMap's
//! KubeProxyConfiguration loads without a warning, and RBAC grants nothing beyond
//! what the proxy uses.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::Value;

use kube_nlproxy::config::{self, Command, host};
use kube_nlproxy::privileges::{Caps, Needs};

const MANIFEST: &str = include_str!("../deploy/kube-nlproxy.yaml");

/// Drops nulls and empty maps/lists so a typed round trip compares equal to the
/// source when no field was lost.
fn normalize(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (k, normalize(v)))
                .filter(|(_, v)| !matches!(v, Value::Null))
                .collect(),
        ),
        Value::Array(s) => Value::Array(s.into_iter().map(normalize).collect()),
        other => other,
    }
}

fn typed<T>(doc: &Value) -> T
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let obj: T = serde_json::from_value(doc.clone()).expect("parses into its type");
    let back = normalize(serde_json::to_value(&obj).unwrap());
    assert_eq!(
        back,
        normalize(doc.clone()),
        "a field was dropped or misspelled"
    );
    obj
}

struct Docs {
    daemonset: DaemonSet,
    configmap: ConfigMap,
    role: ClusterRole,
    binding: ClusterRoleBinding,
    account: ServiceAccount,
}

fn docs() -> Docs {
    let (mut ds, mut cm, mut role, mut binding, mut sa) = (None, None, None, None, None);
    let options = serde_saphyr::options! { strict_booleans: true };
    let documents: Vec<Value> =
        serde_saphyr::from_multiple_with_options(MANIFEST, options).expect("valid YAML");
    for v in documents {
        match v["kind"].as_str().unwrap() {
            "DaemonSet" => ds = Some(typed::<DaemonSet>(&v)),
            "ConfigMap" => cm = Some(typed::<ConfigMap>(&v)),
            "ClusterRole" => role = Some(typed::<ClusterRole>(&v)),
            "ClusterRoleBinding" => binding = Some(typed::<ClusterRoleBinding>(&v)),
            "ServiceAccount" => sa = Some(typed::<ServiceAccount>(&v)),
            other => panic!("unexpected kind {other}"),
        }
    }
    Docs {
        daemonset: ds.unwrap(),
        configmap: cm.unwrap(),
        role: role.unwrap(),
        binding: binding.unwrap(),
        account: sa.unwrap(),
    }
}

#[test]
fn daemonset_flags_parse_with_the_binarys_parser() {
    let d = docs();
    let pod = d.daemonset.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerations = pod.tolerations.unwrap();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "tolerates every taint"
    );
    assert_eq!(
        pod.service_account_name.as_deref(),
        d.account.metadata.name.as_deref()
    );
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap();
    let cfg_path = args
        .iter()
        .find_map(|a| a.strip_prefix("--config="))
        .expect("--config flag");
    // The ConfigMap is mounted where --config points.
    let mount = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| cfg_path.starts_with(&m.mount_path))
        .expect("config mounted");
    assert_eq!(mount.read_only, Some(true));
    let config_text = d.configmap.data.as_ref().unwrap()["config.conf"].clone();
    let dir = std::env::temp_dir().join(format!("knp-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.conf"), &config_text).unwrap();
    let local_args: Vec<String> = args
        .iter()
        .map(|a| {
            if a.starts_with("--config=") {
                format!("--config={}", dir.join("config.conf").display())
            } else {
                a.clone()
            }
        })
        .collect();
    let cfg = config::parse_args(local_args).expect("the DaemonSet's args parse");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(cfg.command, Command::Run);
    assert!(
        cfg.warnings.is_empty(),
        "config warnings: {:?}",
        cfg.warnings
    );
    assert_eq!(cfg.healthz_bind_address, "0.0.0.0:10256");

    // Bootstrap: the API is reached at the control-plane endpoint through the
    // ConfigMap's kubeconfig (mounted beside config.conf), with the
    // ServiceAccount's projected CA and token, never through a ClusterIP.
    let kubeconfig_path = cfg.kubeconfig.clone().expect("clientConnection.kubeconfig");
    assert_eq!(
        kubeconfig_path,
        std::path::Path::new(&mount.mount_path).join("kubeconfig.conf")
    );
    let kubeconfig_text = d.configmap.data.as_ref().unwrap()["kubeconfig.conf"].clone();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&kubeconfig_text).expect("kubeconfig");
    let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
    assert!(
        cluster.server.as_deref().unwrap().starts_with("https://")
            && !cluster.server.as_deref().unwrap().contains("10.96."),
        "{:?}",
        cluster.server
    );
    const SA: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert_eq!(
        cluster.certificate_authority.as_deref(),
        Some(&*format!("{SA}/ca.crt"))
    );
    let user = kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
    assert_eq!(user.token_file.as_deref(), Some(&*format!("{SA}/token")));

    // Probes hit the health server's port and paths.
    let live = c
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    let ready = c
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(live.path.as_deref(), Some("/livez"));
    assert_eq!(ready.path.as_deref(), Some("/healthz"));
    let port = cfg.healthz_bind_address.rsplit(':').next().unwrap();
    for probe in [live, ready] {
        assert_eq!(
            probe.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port.parse().unwrap())
        );
    }
    // Exactly the capabilities the daemon keeps for this configuration (and
    // CAP_SYS_RESOURCE for its start-up window); no privileged mode, no
    // escalation, no /lib/modules.
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.run_as_user, Some(0), "uid 0 owns the files it writes");
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    // On a node where kube-proxy ran with iptables-legacy (its x_tables are
    // removed through a raw socket) the daemon keeps CAP_NET_RAW too.
    let needs = Needs::for_config_with(&cfg, true);
    let mut want = needs.kept(1024);
    if needs.sys_resource {
        want = want.with(Caps::SYS_RESOURCE);
    }
    assert_eq!(
        want,
        Caps::NET_ADMIN.with(Caps::NET_RAW).with(Caps::SYS_RESOURCE)
    );
    assert_eq!(caps.add.clone().unwrap_or_default(), want.pod_names());
    // /proc/sys and /sys are read-only in such a container: the configuration
    // asks for no sysctl write, whatever the node's current values.
    let writes = host::conntrack_writes(&cfg.conntrack, 64, Some(0), Some(0));
    assert!(writes.is_empty(), "conntrack writes: {writes:?}");
    assert!(
        pod.volumes
            .unwrap_or_default()
            .iter()
            .all(|v| v.host_path.is_none()),
        "no host paths"
    );
}

#[test]
fn rbac_grants_only_what_the_proxy_uses() {
    let d = docs();
    let mut grants = Vec::new();
    for rule in d.role.rules.unwrap() {
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    grants.push(format!("{group}/{resource}:{verb}"));
                }
            }
        }
    }
    grants.sort();
    let mut want = vec![
        "/services:get",
        "/services:list",
        "/services:watch",
        "/nodes:get",
        "/nodes:list",
        "/nodes:watch",
        "discovery.k8s.io/endpointslices:get",
        "discovery.k8s.io/endpointslices:list",
        "discovery.k8s.io/endpointslices:watch",
        "networking.k8s.io/servicecidrs:get",
        "networking.k8s.io/servicecidrs:list",
        "networking.k8s.io/servicecidrs:watch",
        "/events:create",
        "/events:patch",
        "events.k8s.io/events:create",
        "events.k8s.io/events:patch",
    ];
    want.sort();
    assert_eq!(grants, want);
    assert_eq!(d.binding.role_ref.name, d.role.metadata.name.unwrap());
    let subject = &d.binding.subjects.unwrap()[0];
    assert_eq!(Some(subject.name.clone()), d.account.metadata.name);
    assert_eq!(subject.namespace, d.account.metadata.namespace);
}
