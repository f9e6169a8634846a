//! Untrusted text: the file source's manifest parser and the
//! `KubeProxyConfiguration` parser get arbitrary text and mutated corpus seeds
//! (`fuzz/corpus/file_manifest/`, `fuzz/corpus/kube_proxy_config/`: valid
//! manifests and the malformed kinds of `tests/bad_input.rs`) and must not
//! panic. The same seeds feed the `cargo fuzz` targets of the same names.

use std::path::PathBuf;

use kube_nlproxy::config::{Config, file::apply};
use kube_nlproxy::source::file::parse_manifests;
use kube_nlproxy_netlink::fuzzing::{self, Mutation};
use proptest::prelude::*;

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
}
