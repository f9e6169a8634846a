//! The properties the `cargo fuzz` targets of the main crate check, in one place
//! for them and for `tests/arbitrary_input.rs` (which runs them on the corpus and
//! on mutations of it). Each panics when its property does not hold.

use std::io::BufRead;
use std::net::IpAddr;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::model::{BuildOptions, build};
use crate::source::Objects;
use crate::sync::ipvs::templates::{parse_template, templates_of};

/// `/proc/net/ip_vs_conn` text as `read_templates_of` reads it (lines of bytes,
/// any of them not UTF-8): every template found has a known protocol, and
/// `templates_of` finds for a client exactly what `parse_template` finds line by
/// line. Returns how many templates that client has.
pub fn ip_vs_conn_holds(data: &[u8]) -> usize {
    let mut by_line = Vec::new();
    for line in data.lines().map_while(Result::ok) {
        if let Some(t) = parse_template(&line) {
            assert!(matches!(t.proto, 6 | 17 | 132), "{line:?} → {t:?}");
            by_line.push(t);
        }
    }
    // The client to look for: the first template's, else one nobody has.
    let client: IpAddr = by_line
        .first()
        .map_or(IpAddr::from([192, 0, 2, 1]), |t| t.client);
    let found = templates_of(client, data);
    let expected: Vec<_> = by_line.into_iter().filter(|t| t.client == client).collect();
    assert_eq!(found, expected);
    found.len()
}

/// The elements of `doc[key]` that decode as `K`; the rest are dropped, as the
/// sources' lenient decoders drop them.
fn decoded<K: DeserializeOwned>(doc: &Value, key: &str) -> Vec<K> {
    doc.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| serde_json::from_value(v.clone()).ok())
        .collect()
}

/// The model build from `doc`, JSON `{"services": [...], "endpointSlices": [...],
/// "nodes": [...], "serviceCIDRs": [...]}`: no panic, every warning names its
/// object and field, and the build is deterministic. Returns the service ports
/// built and the warnings.
pub fn model_build_holds(doc: &Value) -> (usize, usize) {
    let objects = Objects {
        services: decoded(doc, "services"),
        endpoint_slices: decoded(doc, "endpointSlices"),
        nodes: decoded(doc, "nodes"),
        service_cidrs: decoded(doc, "serviceCIDRs"),
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
    (state.services.len(), warnings.len())
}
