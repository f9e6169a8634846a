//! Fuzz target: `/proc/net/ip_vs_conn` text (`sync::ipvs::templates`), as
//! `read_templates_of` reads it: lines of bytes, any of them not UTF-8.
//! Properties: every template found is an entry with client port 0 whose client
//! is the one asked for, and `templates_of` finds exactly what `parse_template`
//! finds line by line.
#![no_main]

use std::io::BufRead;
use std::net::IpAddr;

use kube_nlproxy::sync::ipvs::templates::{parse_template, templates_of};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut by_line = Vec::new();
    for line in data.lines().map_while(Result::ok) {
        if let Some(t) = parse_template(&line) {
            assert!(matches!(t.proto, 6 | 17 | 132), "{line:?} → {t:?}");
            by_line.push(t);
        }
    }
    // The client to look for: the first template's, else one nobody has.
    let client: IpAddr = by_line
        .first()
        .map_or_else(|| "192.0.2.1".parse().unwrap(), |t| t.client);
    let found = templates_of(client, data);
    let expected: Vec<_> = by_line.into_iter().filter(|t| t.client == client).collect();
    assert_eq!(found, expected);
});
