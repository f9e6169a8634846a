//! Fuzz target: file source manifests (`source::file::parse_manifests`), as `read_manifest` passes them: UTF-8 text only.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kube_nlproxy::source::file::parse_manifests(text, "fuzz.yaml");
    }
});
