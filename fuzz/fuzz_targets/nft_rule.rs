//! Fuzz target: `NFT_MSG_NEWRULE` payloads (one-pass rule decoder, comment).
#![no_main]

use kube_nlproxy_netlink::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::run("nft_rule", data));
