//! Fuzz target: ipset payloads; the first byte is the `IPSET_CMD_*` (codec round trip, listings, members).
#![no_main]

use kube_nlproxy_netlink::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::run("ipset", data));
