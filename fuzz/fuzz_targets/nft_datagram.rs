//! Fuzz target: whole nf_tables reply datagrams (message splitter, every kind).
#![no_main]

use kube_nlproxy_netlink::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::run("nft_datagram", data));
