//! Fuzz target: `KubeProxyConfiguration` files (`config::file::apply`), UTF-8 text only as the config loader reads them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kube_nlproxy::config::file::apply(text, kube_nlproxy::config::Config::default());
    }
});
