//! Fuzz target: IPVS genl payloads (codec round trip, services, destinations, timeouts).
#![no_main]

use kube_nlproxy_netlink::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::run("ipvs", data));
