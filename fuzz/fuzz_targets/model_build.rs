//! Fuzz target: the model build (`model::build::build`) from arbitrary objects, as
//! the sources decode them. The input is JSON `{"services": [...],
//! "endpointSlices": [...], "nodes": [...], "serviceCIDRs": [...]}`; each element
//! that decodes as its Kubernetes type is kept and the rest dropped, as the kube
//! source's lenient decoder does, so the build sees objects that are well-typed but
//! hold any values (negative ports, bad IPs, odd families, unknown protocols, …).
//! Properties: no panic; every warning names its object and field; the build is
//! deterministic.
#![no_main]

use kube_nlproxy::model::{BuildOptions, build};
use kube_nlproxy::source::Objects;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The elements of `doc[key]` that decode as `K`.
fn decoded<K: DeserializeOwned>(doc: &Value, key: &str) -> Vec<K> {
    doc.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| serde_json::from_value(v.clone()).ok())
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let objects = Objects {
        services: decoded(&doc, "services"),
        endpoint_slices: decoded(&doc, "endpointSlices"),
        nodes: decoded(&doc, "nodes"),
        service_cidrs: decoded(&doc, "serviceCIDRs"),
    };
    let opts = BuildOptions {
        node_name: "node-a".into(),
        ..Default::default()
    };
    let (state, warnings) = build(&objects, &opts);
    for w in &warnings {
        assert!(!w.object.is_empty() && !w.field.is_empty(), "{w:?}");
    }
    let (again, _) = build(&objects, &opts);
    assert_eq!(state, again, "the build is deterministic");

});
