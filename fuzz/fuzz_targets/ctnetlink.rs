//! Fuzz target: `IPCTNL_MSG_CT_NEW` payloads (entry parse, delete-request round trip).
#![no_main]

use kube_nlproxy_netlink::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::run("ctnetlink", data));
