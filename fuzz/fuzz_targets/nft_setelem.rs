//! Fuzz target: `NFT_MSG_NEWSETELEM` payloads (one-pass element decoder, every key layout, element round trip).
#![no_main]

use kube_nlproxy_netlink::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::run("nft_setelem", data));
