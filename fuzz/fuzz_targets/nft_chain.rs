//! Fuzz target: `NFT_MSG_NEWCHAIN` payloads (chain parse, chain round trip).
#![no_main]

use kube_nlproxy_netlink::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::run("nft_chain", data));
