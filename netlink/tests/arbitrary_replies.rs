//! Kernel replies are input too: every netlink reply parser (nf_tables tables,
//! chains, sets, elements, rules and whole datagrams; IPVS; ipset; rtnetlink links
//! and addresses; ctnetlink) gets arbitrary bytes and mutated corpus seeds (bit
//! flips, overwritten length/type fields, truncations, insertions, splices) and
//! must not panic; what parses and re-emits must parse back the same (checked in
//! `fuzzing`). The seeds are the fuzz corpus, `fuzz/corpus/<target>/`.

use std::path::PathBuf;

use kube_nlproxy_netlink::fuzzing::{self, Mutation, TARGETS};
use proptest::prelude::*;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

/// Every seed of every target as is: real kernel bytes parse without panic.
#[test]
fn every_seed_parses() {
    for (name, f) in TARGETS {
        for seed in fuzzing::seeds(&corpus(), name) {
            f(&seed);
        }
    }
}

/// The corpora of the main crate's parsers (YAML manifests, the config file,
/// `/proc/net/ip_vs_conn`, the model build), tested in its `tests/arbitrary_input.rs`.
const MAIN_CRATE_CORPORA: [&str; 4] = [
    "file_manifest",
    "ip_vs_conn",
    "kube_proxy_config",
    "model_build",
];

/// Every fuzz target has a corpus directory and every corpus directory a target
/// (here or in the main crate).
#[test]
fn targets_and_corpus_match() {
    let mut dirs: Vec<String> = std::fs::read_dir(corpus())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !MAIN_CRATE_CORPORA.contains(&n.as_str()))
        .collect();
    dirs.sort();
    let mut names: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    assert_eq!(dirs, names);
    // Every `cargo fuzz` target, of either crate, has its corpus.
    let fuzz_targets = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/fuzz_targets");
    let mut targets: Vec<String> = std::fs::read_dir(fuzz_targets)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter_map(|n| n.strip_suffix(".rs").map(str::to_string))
        .collect();
    targets.sort();
    let mut all = names;
    all.extend(MAIN_CRATE_CORPORA.iter().map(|n| n.to_string()));
    all.sort();
    assert_eq!(targets, all);
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let pos = any::<usize>();
    prop_oneof![
        4 => pos.prop_map(Mutation::FlipBit),
        2 => (pos, any::<u8>()).prop_map(|(p, v)| Mutation::SetByte(p, v)),
        3 => (pos, prop_oneof![Just(0u16), Just(1), Just(3), Just(4), Just(5), Just(8),
                Just(0x7fff), Just(0x8000), Just(0xffff), any::<u16>()])
            .prop_map(|(p, v)| Mutation::SetU16(p, v)),
        2 => pos.prop_map(Mutation::Truncate),
        1 => (pos, proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(p, b)| Mutation::Insert(p, b)),
        1 => (pos, 1usize..16).prop_map(|(p, n)| Mutation::Remove(p, n)),
        1 => (pos, any::<usize>(), pos).prop_map(|(p, o, f)| Mutation::Splice(p, o, f)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Mutated seeds: most of a real message survives, so the parsers get past
    /// the header checks into the attributes.
    #[test]
    fn mutated_seeds_do_not_panic(
        target in 0..TARGETS.len(),
        seed in any::<usize>(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let (name, f) = TARGETS[target];
        let seeds = fuzzing::seeds(&corpus(), name);
        let input = fuzzing::mutate(&seeds[seed % seeds.len()], &seeds, &mutations);
        f(&input);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary bytes, with and without a plausible first attribute header.
    #[test]
    fn arbitrary_bytes_do_not_panic(
        target in 0..TARGETS.len(),
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        (TARGETS[target].1)(&bytes);
    }
}
