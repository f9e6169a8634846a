//! Fuzz target: the model build (`model::build::build`) from arbitrary objects, as
//! the sources decode them. The input is JSON `{"services": [...],
//! "endpointSlices": [...], "nodes": [...], "serviceCIDRs": [...]}`; each element
//! that decodes as its Kubernetes type is kept and the rest dropped, as the kube
//! source's lenient decoder does, so the build sees objects that are well-typed but
//! hold any values (negative ports, bad IPs, odd families, unknown protocols, …).
//! Properties: no panic; every warning names its object and field; the build is
//! deterministic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(doc) = serde_json::from_slice(data) {
        kube_nlproxy::fuzzing::model_build_holds(&doc);
    }
});
