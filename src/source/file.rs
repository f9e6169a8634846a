//! File source: a YAML/JSON file or a directory of them, multi-document, holding
//! Services, EndpointSlices, Nodes, ServiceCIDRs and `List`s of those (what
//! `kubectl get -o yaml` prints).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_yaml::Value;

pub use super::Objects;

/// Errors loading a file source. One bad document is a warning, not an error; these
/// are for paths that cannot be read at all.
#[derive(Debug, thiserror::Error)]
pub enum FileSourceError {
    /// `stat` of the path failed.
    #[error("file source: stat {path}: {source}")]
    Stat {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Listing the directory failed.
    #[error("file source: list directory {path}: {source}")]
    ListDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Reading a file failed.
    #[error("file source: read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// `kind namespace/name` of a raw object, as far as it is readable.
fn describe(value: &Value) -> String {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("<no kind>");
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("<no name>");
    match meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
    {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Deserialize a raw value into `T`. The fast path converts the value directly; on
/// failure the value is re-parsed from text so the error names the field path.
fn convert<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    match T::deserialize(&value) {
        Ok(v) => Ok(v),
        Err(first) => {
            let detailed = serde_yaml::to_string(&value)
                .ok()
                .and_then(|text| serde_yaml::from_str::<T>(&text).err());
            Err(detailed.unwrap_or(first).to_string())
        }
    }
}

/// Add one object (not a List) to `objects`; `at` locates it for warnings.
fn add_object(value: Value, at: &str, objects: &mut Objects, warnings: &mut Vec<String>) {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let what = describe(&value);
    let result = match (api_version, kind) {
        ("v1", "Service") => convert(value).map(|o| objects.services.push(o)),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            convert(value).map(|o| objects.endpoint_slices.push(o))
        }
        ("v1", "Node") => convert(value).map(|o| objects.nodes.push(o)),
        ("networking.k8s.io/v1", "ServiceCIDR") => {
            convert(value).map(|o| objects.service_cidrs.push(o))
        }
        _ => {
            warnings.push(format!(
                "{at}: ignoring unsupported object kind {kind:?} apiVersion {api_version:?} ({what})"
            ));
            return;
        }
    };
    if let Err(e) = result {
        warnings.push(format!("{at}: skipping invalid {what}: {e}"));
    }
}

/// Parse multi-document YAML (or JSON) text. `origin` names the text in warnings
/// (normally the file path). Never fails: bad documents become warnings and the
/// remaining documents still load.
pub fn parse_manifests(text: &str, origin: &str) -> (Objects, Vec<String>) {
    let mut objects = Objects::default();
    let mut warnings = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let at = format!("{origin}: document {index}");
        let value = match Value::deserialize(document) {
            Ok(v) => v,
            Err(e) => {
                warnings.push(format!("{at}: invalid YAML: {e}"));
                // A syntax error ends the stream; serde_yaml stops yielding documents.
                continue;
            }
        };
        if value.is_null() {
            continue;
        }
        if !value.is_mapping() {
            warnings.push(format!("{at}: ignoring a document that is not an object"));
            continue;
        }
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind.ends_with("List") {
            let kind = kind.to_owned();
            let mut value = value;
            let items = match value.get_mut("items").map(std::mem::take) {
                Some(Value::Sequence(items)) => items,
                None | Some(Value::Null) => Vec::new(),
                Some(_) => {
                    warnings.push(format!("{at}: {kind}: items is not a list"));
                    continue;
                }
            };
            for (item_index, item) in items.into_iter().enumerate() {
                if item.is_null() {
                    continue;
                }
                let item_at = format!("{at} items[{item_index}]");
                add_object(item, &item_at, &mut objects, &mut warnings);
            }
        } else {
            add_object(value, &at, &mut objects, &mut warnings);
        }
    }
    (objects, warnings)
}

fn is_manifest_name(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    let ext_ok = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    );
    !hidden && ext_ok
}

/// The files a path stands for: the file itself, or the sorted `*.yaml`, `*.yml`,
/// `*.json` files of a directory (non-recursive, hidden files skipped).
pub fn manifest_files(path: &Path) -> Result<Vec<PathBuf>, FileSourceError> {
    let meta = std::fs::metadata(path).map_err(|source| FileSourceError::Stat {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let list_err = |source| FileSourceError::ListDir {
        path: path.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(list_err)? {
        let entry = entry.map_err(list_err)?;
        let p = entry.path();
        if is_manifest_name(&p) && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// Load a file, or a directory of manifest files. Returns the objects and the
/// warnings about documents that were skipped.
pub fn load_path(path: &Path) -> Result<(Objects, Vec<String>), FileSourceError> {
    let mut objects = Objects::default();
    let mut warnings = Vec::new();
    for file in manifest_files(path)? {
        let text = std::fs::read_to_string(&file).map_err(|source| FileSourceError::Read {
            path: file.clone(),
            source,
        })?;
        let (o, w) = parse_manifests(&text, &file.display().to_string());
        objects.extend(o);
        warnings.extend(w);
    }
    Ok((objects, warnings))
}

/// Cheap change detection for polling: (path, mtime, length) of every manifest file.
/// Compare two fingerprints; any difference (including added/removed files) means
/// the source must be reloaded.
pub fn fingerprint(path: &Path) -> std::io::Result<Vec<(PathBuf, SystemTime, u64)>> {
    let files = manifest_files(path).map_err(|e| match e {
        FileSourceError::Stat { source, .. }
        | FileSourceError::ListDir { source, .. }
        | FileSourceError::Read { source, .. } => source,
    })?;
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let meta = std::fs::metadata(&f)?;
        out.push((f, meta.modified()?, meta.len()));
    }
    Ok(out)
}

/// The file source as an event source: a task polls the path, reloads it when it
/// changes, logs the warnings of each new load once, and bumps the generation.
#[derive(Debug, Clone)]
pub struct FileSource {
    objects: std::sync::Arc<std::sync::Mutex<Objects>>,
    generation: tokio::sync::watch::Receiver<u64>,
}

impl FileSource {
    /// Loads `path` once (an unreadable path is an error), then follows it every
    /// `poll` on the current tokio runtime.
    pub fn start(path: PathBuf, poll: std::time::Duration) -> Result<FileSource, FileSourceError> {
        let mut seen = fingerprint(&path).ok();
        let (objects, warnings) = load_path(&path)?;
        for w in &warnings {
            tracing::warn!("{w}");
        }
        let objects = std::sync::Arc::new(std::sync::Mutex::new(objects));
        let (tx, rx) = tokio::sync::watch::channel(1u64);
        let shared = objects.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(poll).await;
                let now = fingerprint(&path).ok();
                if now == seen {
                    continue;
                }
                match load_path(&path) {
                    Ok((o, warnings)) => {
                        for w in &warnings {
                            tracing::warn!("{w}");
                        }
                        *shared.lock().expect("file source lock") = o;
                        seen = now;
                        if tx.is_closed() {
                            return;
                        }
                        tx.send_modify(|generation| *generation += 1);
                    }
                    // Keep the last good objects; try again next poll.
                    Err(e) => tracing::warn!("reloading {}: {e}", path.display()),
                }
            }
        });
        Ok(FileSource {
            objects,
            generation: rx,
        })
    }
}

impl super::ObjectSource for FileSource {
    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.clone()
    }

    fn snapshot(&self) -> Objects {
        self.objects.lock().expect("file source lock").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIXED: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: a, namespace: default}
spec:
  clusterIP: 10.0.0.1
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: default}
spec:
  ports: [{port: "eighty"}]
---
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: a-1
  namespace: default
  labels: {kubernetes.io/service-name: a}
addressType: IPv4
endpoints: [{addresses: [10.1.0.1]}]
ports: [{port: 8080}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [10.0.0.0/16]}
"#;

    #[test]
    fn mixed_documents_bad_one_skipped() {
        let (o, w) = parse_manifests(MIXED, "test.yaml");
        assert_eq!(o.services.len(), 1);
        assert_eq!(o.services[0].metadata.name.as_deref(), Some("a"));
        assert_eq!(o.endpoint_slices.len(), 1);
        assert_eq!(o.nodes.len(), 1);
        assert_eq!(o.service_cidrs.len(), 1);
        assert_eq!(w.len(), 2, "{w:?}");
        let bad = w
            .iter()
            .find(|w| w.contains("Service default/bad"))
            .unwrap();
        assert!(bad.contains("test.yaml"), "{bad}");
        assert!(bad.contains("spec.ports[0].port"), "{bad}");
        let unknown = w.iter().find(|w| w.contains("Deployment")).unwrap();
        assert!(unknown.contains("document 4"), "{unknown}");
    }

    #[test]
    fn list_documents() {
        let text = r#"
apiVersion: v1
kind: List
metadata: {resourceVersion: ""}
items:
- apiVersion: v1
  kind: Service
  metadata: {name: a, namespace: ns}
  spec: {clusterIP: 10.0.0.1, ports: [{port: 80, protocol: UDP}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: a-x, namespace: ns, labels: {kubernetes.io/service-name: a}}
  addressType: IPv4
  endpoints: []
- apiVersion: v1
  kind: Service
  metadata: {name: b, namespace: ns}
  spec: {ports: [{port: {}}]}
"#;
        let (o, w) = parse_manifests(text, "l.yaml");
        assert_eq!(o.services.len(), 1);
        assert_eq!(o.endpoint_slices.len(), 1);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("items[2]") && w[0].contains("Service ns/b"),
            "{w:?}"
        );
    }

    #[test]
    fn json_and_empty() {
        let (o, w) = parse_manifests("", "e");
        assert!(o.services.is_empty() && w.is_empty());
        let (o, w) = parse_manifests(
            r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}"#,
            "j.json",
        );
        assert_eq!(o.nodes.len(), 1);
        assert!(w.is_empty());
    }

    #[test]
    fn load_directory_sorted_and_fingerprint() {
        let dir = std::env::temp_dir().join(format!("nlproxy-file-src-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let node = |n: &str| format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {n}}}\n");
        std::fs::write(dir.join("b.yaml"), node("b")).unwrap();
        std::fs::write(dir.join("a.yml"), node("a")).unwrap();
        std::fs::write(dir.join(".hidden.yaml"), node("h")).unwrap();
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        let (o, w) = load_path(&dir).unwrap();
        let names: Vec<_> = o
            .nodes
            .iter()
            .map(|n| n.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert!(w.is_empty());
        let f1 = fingerprint(&dir).unwrap();
        assert_eq!(f1.len(), 2);
        std::fs::write(dir.join("c.yaml"), node("c")).unwrap();
        assert_ne!(f1, fingerprint(&dir).unwrap());
        let (o, _) = load_path(&dir.join("c.yaml")).unwrap();
        assert_eq!(o.nodes.len(), 1);
        assert!(matches!(
            load_path(&dir.join("missing")),
            Err(FileSourceError::Stat { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
