//! Fuzz target: `RTM_NEWLINK` payloads.
#![no_main]

use kube_nlproxy_netlink::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::run("rtnl_link", data));
