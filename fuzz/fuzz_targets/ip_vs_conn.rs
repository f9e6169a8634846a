//! Fuzz target: `/proc/net/ip_vs_conn` text (`sync::ipvs::templates`), as
//! `read_templates_of` reads it: lines of bytes, any of them not UTF-8.
//! Properties: every template found is an entry with client port 0 whose client
//! is the one asked for, and `templates_of` finds exactly what `parse_template`
//! finds line by line.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kube_nlproxy::fuzzing::ip_vs_conn_holds(data);
});
