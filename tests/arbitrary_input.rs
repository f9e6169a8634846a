//! Untrusted input: the file source's manifest parser and the
//! `KubeProxyConfiguration` parser get arbitrary text and mutated corpus seeds
//! (`fuzz/corpus/file_manifest/`, `fuzz/corpus/kube_proxy_config/`: valid
//! manifests and the malformed kinds of `tests/bad_input.rs`) and must not
//! panic; `/proc/net/ip_vs_conn` lines (`fuzz/corpus/ip_vs_conn/`) and the model
//! build from decoded objects (`fuzz/corpus/model_build/`, with values replaced
//! anywhere in the object tree) keep the properties their fuzz targets check.
//! The same seeds feed the `cargo fuzz` targets of the same names.

use std::path::PathBuf;

use kube_nlproxy::config::{Config, file::apply};
use kube_nlproxy::fuzzing::{ip_vs_conn_holds, model_build_holds};
use kube_nlproxy::source::file::parse_manifests;
use kube_nlproxy_netlink::fuzzing::{self, Mutation};
use proptest::prelude::*;
use serde_json::Value;

fn seeds(target: &str) -> Vec<Vec<u8>> {
    fuzzing::seeds(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus"),
        target,
    )
}

/// Both parsers on `bytes` as text (lossily, so every mutation is parsed).
fn parse_both(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let _ = parse_manifests(&text, "fuzz.yaml");
    let _ = apply(&text, Config::default());
}

#[test]
fn every_seed_parses_and_the_good_ones_load() {
    for target in ["file_manifest", "kube_proxy_config"] {
        for seed in seeds(target) {
            parse_both(&seed);
        }
    }
    // The corpus holds valid inputs, not only broken ones.
    let good = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/file_manifest/good.yaml"),
    )
    .unwrap();
    let (objects, warnings) = parse_manifests(&good, "good.yaml");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(objects.services.len(), 1);
    let full = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/kube_proxy_config/full.yaml"),
    )
    .unwrap();
    assert!(apply(&full, Config::default()).is_ok());
}

fn json_seeds() -> Vec<Value> {
    seeds("model_build")
        .iter()
        .map(|s| serde_json::from_slice(s).expect("model_build seeds are JSON"))
        .collect()
}

#[test]
fn ip_vs_conn_and_model_build_seeds_hold() {
    let templates: usize = seeds("ip_vs_conn")
        .iter()
        .map(|s| ip_vs_conn_holds(s))
        .sum();
    assert!(templates > 0, "the ip_vs_conn corpus holds templates");
    let good = json_seeds();
    assert!(!good.is_empty());
    let built: Vec<(usize, usize)> = good.iter().map(model_build_holds).collect();
    assert!(
        built
            .iter()
            .any(|&(services, warnings)| services > 0 && warnings == 0),
        "the model_build corpus holds a clean document: {built:?}"
    );
}

/// Values a decoded object may hold that a well-formed one would not.
fn odd_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!(0)),
        Just(serde_json::json!(65536)),
        Just(serde_json::json!(i64::MAX)),
        Just(serde_json::json!("")),
        Just(serde_json::json!("::1")),
        Just(serde_json::json!("10.0.0.0/8")),
        Just(serde_json::json!("SCTP")),
        Just(serde_json::json!("Local")),
        Just(serde_json::json!("IPv6")),
        Just(serde_json::json!(true)),
        Just(serde_json::json!([])),
        Just(serde_json::json!({})),
        "[ -~]{0,12}".prop_map(Value::String),
    ]
}

/// Replaces the `n`th node (pre-order, modulo the count) of `doc` by `with`.
fn replace_nth(doc: &mut Value, n: usize, with: Value) {
    fn count(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(count).sum(),
            Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    fn walk(v: &mut Value, n: &mut usize, with: &mut Option<Value>) {
        if *n == 0 {
            *v = with.take().unwrap_or(Value::Null);
            return;
        }
        *n -= 1;
        let children: Vec<&mut Value> = match v {
            Value::Array(a) => a.iter_mut().collect(),
            Value::Object(o) => o.values_mut().collect(),
            _ => Vec::new(),
        };
        for c in children {
            if with.is_none() {
                return;
            }
            walk(c, n, with);
        }
    }
    let mut n = n % count(doc);
    walk(doc, &mut n, &mut Some(with));
}

/// Mutations that keep YAML-ish text: flips and byte overwrites hit structure
/// characters, inserts add indentation, anchors, flow brackets and quotes.
fn mutation() -> impl Strategy<Value = Mutation> {
    let pos = any::<usize>();
    let token = prop_oneof![
        Just(b"\n".to_vec()),
        Just(b"  ".to_vec()),
        Just(b"- ".to_vec()),
        Just(b": ".to_vec()),
        Just(b"&a ".to_vec()),
        Just(b"*a".to_vec()),
        Just(b"[".to_vec()),
        Just(b"{".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"---\n".to_vec()),
        Just(b"!!binary ".to_vec()),
        Just(b"<<: *a\n".to_vec()),
        Just(b"\t".to_vec()),
        Just(b"99999999999999999999".to_vec()),
        proptest::collection::vec(any::<u8>(), 1..8),
    ];
    prop_oneof![
        2 => pos.prop_map(Mutation::FlipBit),
        2 => (pos, prop_oneof![Just(b':'), Just(b'-'), Just(b' '), Just(b'\n'), Just(b'#'), any::<u8>()])
            .prop_map(|(p, v)| Mutation::SetByte(p, v)),
        2 => pos.prop_map(Mutation::Truncate),
        3 => (pos, token).prop_map(|(p, b)| Mutation::Insert(p, b)),
        1 => (pos, 1usize..32).prop_map(|(p, n)| Mutation::Remove(p, n)),
        1 => (pos, any::<usize>(), pos).prop_map(|(p, o, f)| Mutation::Splice(p, o, f)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_seeds_do_not_panic(
        config in any::<bool>(),
        seed in any::<usize>(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let seeds = seeds(if config { "kube_proxy_config" } else { "file_manifest" });
        parse_both(&fuzzing::mutate(&seeds[seed % seeds.len()], &seeds, &mutations));
    }

    #[test]
    fn arbitrary_text_does_not_panic(text in "(?s).{0,200}") {
        parse_both(text.as_bytes());
    }

    #[test]
    fn mutated_ip_vs_conn_lines_hold(
        seed in any::<usize>(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let seeds = seeds("ip_vs_conn");
        ip_vs_conn_holds(&fuzzing::mutate(&seeds[seed % seeds.len()], &seeds, &mutations));
    }

    #[test]
    fn model_build_with_odd_values_holds(
        seed in any::<usize>(),
        edits in proptest::collection::vec((any::<usize>(), odd_value()), 1..8),
    ) {
        let seeds = json_seeds();
        let mut doc = seeds[seed % seeds.len()].clone();
        for (at, with) in edits {
            replace_nth(&mut doc, at, with);
        }
        model_build_holds(&doc);
    }
}
