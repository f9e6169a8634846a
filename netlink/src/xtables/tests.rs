//! Codec unit tests: a hand-built blob and bytes captured from a kernel.

use super::XtablesError;
use super::codec::*;
use super::table::*;

/// Builds one entry's bytes by hand, independently of `emit_entry`.
struct RawBuilder {
    family: Family,
    out: Vec<u8>,
}

/// What an entry's target is, for the hand-built blob.
enum T<'a> {
    Std(i32),
    Err(&'a str),
    Ext(&'a str, u8, &'a [u8]),
}

impl RawBuilder {
    fn at(&self) -> usize {
        self.out.len()
    }

    /// Appends an entry; returns its offset. `src` goes in the first byte of
    /// the ip part, `goto` sets the family's goto flag, `pc` the counters.
    fn push(
        &mut self,
        src: u8,
        goto: bool,
        pc: (u64, u64),
        matches: &[(&str, u8, &[u8])],
        t: T,
    ) -> usize {
        let fam = self.family;
        let start = self.out.len();
        let mut e = vec![0u8; fam.entry_len()];
        e[0] = src;
        if goto {
            let (at, bit) = fam.goto_flag();
            e[at] |= bit;
        }
        e[fam.ip_len()..fam.ip_len() + 4].copy_from_slice(&0x1234u32.to_ne_bytes());
        e[fam.ip_len() + 8..fam.ip_len() + 12].copy_from_slice(&0x10u32.to_ne_bytes());
        e[fam.entry_len() - 16..fam.entry_len() - 8].copy_from_slice(&pc.0.to_ne_bytes());
        e[fam.entry_len() - 8..].copy_from_slice(&pc.1.to_ne_bytes());
        for (name, rev, data) in matches {
            let mut m = vec![0u8; 32];
            m[..2].copy_from_slice(&((32 + data.len()) as u16).to_ne_bytes());
            m[2..2 + name.len()].copy_from_slice(name.as_bytes());
            m[31] = *rev;
            m.extend_from_slice(data);
            e.extend(m);
        }
        let target_offset = e.len() as u16;
        let mut t_bytes = vec![0u8; 32];
        match t {
            T::Std(v) => {
                t_bytes.extend_from_slice(&v.to_ne_bytes());
                t_bytes.extend_from_slice(&[0; 4]);
            }
            T::Err(name) => {
                t_bytes[2..7].copy_from_slice(b"ERROR");
                let mut d = [0u8; 32];
                d[..name.len()].copy_from_slice(name.as_bytes());
                t_bytes.extend_from_slice(&d);
            }
            T::Ext(name, rev, data) => {
                t_bytes[2..2 + name.len()].copy_from_slice(name.as_bytes());
                t_bytes[31] = rev;
                t_bytes.extend_from_slice(data);
            }
        }
        let tl = t_bytes.len() as u16;
        t_bytes[..2].copy_from_slice(&tl.to_ne_bytes());
        e.extend(t_bytes);
        let next = e.len() as u16;
        e[fam.ip_len() + 4..fam.ip_len() + 6].copy_from_slice(&target_offset.to_ne_bytes());
        e[fam.ip_len() + 6..fam.ip_len() + 8].copy_from_slice(&next.to_ne_bytes());
        self.out.extend(e);
        start
    }
}

/// Sizes of the entry kinds used below.
fn std_len(f: Family) -> usize {
    f.entry_len() + STANDARD_TARGET_LEN
}

const COMMENT: &[u8] = &[b'k'; 256];
const LOG: &[u8] = &[7u8; 48];

/// A filter-like table: INPUT jumps to MY-CHAIN and KEEP, FORWARD has a
/// counting rule, OUTPUT a `-m comment -j LOG` rule and a goto to MY-CHAIN;
/// MY-CHAIN jumps to KEEP. Returns the info and the blob.
fn hand_built(family: Family) -> (TableInfo, Vec<u8>) {
    let f = family;
    let mut b = RawBuilder {
        family,
        out: Vec::new(),
    };
    // Offsets are known up front: compute the user chains' starts first.
    let input = 0;
    let input_rules = 3; // jump MY-CHAIN, jump KEEP, policy
    let forward = input + input_rules * std_len(f);
    let forward_rules = 2; // fallthrough, policy DROP
    let output = forward + forward_rules * std_len(f);
    let log_rule = f.entry_len() + 32 + COMMENT.len() + 32 + LOG.len();
    let my_head = output + log_rule + 2 * std_len(f);
    let my_start = my_head + f.entry_len() + ERROR_TARGET_LEN;
    let keep_head = my_start + 2 * std_len(f);
    let keep_start = keep_head + f.entry_len() + ERROR_TARGET_LEN;

    b.push(1, false, (5, 500), &[], T::Std(my_start as i32));
    b.push(2, false, (6, 600), &[], T::Std(keep_start as i32));
    let input_policy = b.push(0, false, (7, 700), &[], T::Std(VERDICT_ACCEPT));
    assert_eq!(b.at(), forward);
    let ft = b.at();
    b.push(3, false, (1, 2), &[], T::Std((ft + std_len(f)) as i32));
    let forward_policy = b.push(0, false, (0, 0), &[], T::Std(VERDICT_DROP));
    assert_eq!(b.at(), output);
    b.push(
        4,
        false,
        (0, 0),
        &[("comment", 0, COMMENT)],
        T::Ext("LOG", 0, LOG),
    );
    b.push(5, true, (0, 0), &[], T::Std(my_start as i32));
    let output_policy = b.push(0, false, (9, 900), &[], T::Std(VERDICT_ACCEPT));
    assert_eq!(b.at(), my_head);
    b.push(0, false, (0, 0), &[], T::Err("MY-CHAIN"));
    b.push(6, false, (0, 0), &[], T::Std(keep_start as i32));
    b.push(0, false, (0, 0), &[], T::Std(VERDICT_RETURN));
    assert_eq!(b.at(), keep_head);
    b.push(0, false, (0, 0), &[], T::Err("KEEP"));
    b.push(0, false, (0, 0), &[], T::Std(VERDICT_RETURN));
    b.push(0, false, (0, 0), &[], T::Err("ERROR"));
    let info = TableInfo {
        name: "filter".to_string(),
        valid_hooks: 0b01110,
        hook_entry: [
            u32::MAX,
            input as u32,
            forward as u32,
            output as u32,
            u32::MAX,
        ],
        underflow: [
            u32::MAX,
            input_policy as u32,
            forward_policy as u32,
            output_policy as u32,
            u32::MAX,
        ],
        num_entries: 14,
        size: b.out.len() as u32,
    };
    (info, b.out)
}

#[test]
fn parse_groups_chains_and_resolves_jumps() {
    for family in [Family::Ipv4, Family::Ipv6] {
        let (info, blob) = hand_built(family);
        let t = Table::parse(family, &info, &blob).unwrap();
        assert_eq!(
            t.chains(),
            ["INPUT", "FORWARD", "OUTPUT", "MY-CHAIN", "KEEP"]
        );
        assert_eq!(t.read_entries, 14);
        let input = t.chain("INPUT").unwrap();
        assert_eq!(input.kind, ChainKind::Builtin { hook: 1 });
        assert_eq!(input.rules[0].jump_target(), Some("MY-CHAIN"));
        assert_eq!(input.rules[1].jump_target(), Some("KEEP"));
        assert_eq!(input.rules[2].target, Target::Standard(Verdict::Accept));
        assert_eq!(
            input.rules[0].counters,
            Counters {
                packets: 5,
                bytes: 500
            }
        );
        assert_eq!(
            t.chain("FORWARD").unwrap().rules[0].target,
            Target::Standard(Verdict::Fallthrough)
        );
        let output = t.chain("OUTPUT").unwrap();
        assert_eq!(output.rules[0].matches[0].name, "comment");
        assert_eq!(output.rules[0].matches[0].data, COMMENT);
        assert!(matches!(&output.rules[0].target, Target::Other { name, .. } if name == "LOG"));
        assert!(output.rules[1].is_goto());
        assert!(!output.rules[0].is_goto());
        assert_eq!(output.rules[1].jump_target(), Some("MY-CHAIN"));
        let my = t.chain("MY-CHAIN").unwrap();
        assert!(my.is_user());
        assert_eq!(my.rules[1].target, Target::Standard(Verdict::Return));
        assert_eq!(t.end.target, Target::Error("ERROR".to_string()));
    }
}

#[test]
fn emit_gives_back_the_bytes() {
    for family in [Family::Ipv4, Family::Ipv6] {
        let (info, blob) = hand_built(family);
        let t = Table::parse(family, &info, &blob).unwrap();
        let e = t.emit().unwrap();
        assert_eq!(e.entries, blob, "{family:?}");
        assert_eq!(e.num_entries, info.num_entries);
        assert_eq!(e.hook_entry, info.hook_entry);
        assert_eq!(e.underflow, info.underflow);
        assert_eq!(e.origins, (0..14).map(Some).collect::<Vec<_>>());
        // And the info round-trips too.
        assert_eq!(TableInfo::parse(&info.emit().unwrap()).unwrap(), info);
    }
}

#[test]
fn remove_chains_drops_the_chain_and_its_jumps_only() {
    for family in [Family::Ipv4, Family::Ipv6] {
        let (info, blob) = hand_built(family);
        let before = Table::parse(family, &info, &blob).unwrap();
        let mut t = before.clone();
        let removed = t.remove_chains(|c| c == "MY-CHAIN");
        assert_eq!(
            removed.chains,
            [("filter".to_string(), "MY-CHAIN".to_string())]
        );
        let where_: Vec<_> = removed
            .rules
            .iter()
            .map(|r| (r.chain.as_str(), r.position, r.target.as_str()))
            .collect();
        assert_eq!(
            where_,
            [("INPUT", 1, "MY-CHAIN"), ("OUTPUT", 2, "MY-CHAIN")]
        );
        assert_eq!(t.chains(), ["INPUT", "FORWARD", "OUTPUT", "KEEP"]);
        // Everything else is kept as it was (counters and origins too).
        let input = &before.chain("INPUT").unwrap().rules;
        assert_eq!(t.chain("INPUT").unwrap().rules, input[1..]);
        assert_eq!(t.chain("FORWARD"), before.chain("FORWARD"));
        assert_eq!(t.chain("KEEP"), before.chain("KEEP"));

        // The emitted table parses back to the same chains, offsets recomputed.
        let e = t.emit().unwrap();
        assert_eq!(e.num_entries, 14 - 2 - 3);
        let info2 = TableInfo {
            num_entries: e.num_entries,
            size: e.entries.len() as u32,
            hook_entry: e.hook_entry,
            underflow: e.underflow,
            ..info.clone()
        };
        let again = Table::parse(family, &info2, &e.entries).unwrap();
        assert_eq!(
            without_origins(again.chains),
            without_origins(t.chains.clone())
        );
        let len = std_len(family);
        assert_eq!(e.hook_entry[1..4], [0, 2 * len as u32, 4 * len as u32]);
        // FORWARD's counting rule falls through to its new next entry.
        let ft = 2 * len;
        let v = &e.entries[ft + family.entry_len() + 32..][..4];
        assert_eq!(i32::from_ne_bytes(v.try_into().unwrap()), (ft + len) as i32);
    }
}

fn without_origins(mut chains: Vec<Chain>) -> Vec<Chain> {
    for c in &mut chains {
        if let ChainKind::User { head } = &mut c.kind {
            head.origin = None;
        }
        for r in &mut c.rules {
            r.origin = None;
        }
    }
    chains
}

/// Kernel bytes (see `testdata/README.md` for the rulesets).
const NAT_V4_INFO: &[u8] = include_bytes!("testdata/nat_v4.info");
const NAT_V4: &[u8] = include_bytes!("testdata/nat_v4.entries");
const FILTER_V6_INFO: &[u8] = include_bytes!("testdata/filter_v6.info");
const FILTER_V6: &[u8] = include_bytes!("testdata/filter_v6.entries");

fn kernel_round_trip(family: Family, info: &[u8], blob: &[u8]) -> Table {
    let info = TableInfo::parse(info).unwrap();
    assert_eq!(info.size as usize, blob.len());
    assert_eq!(TableInfo::parse(&info.emit().unwrap()).unwrap(), info);
    let t = Table::parse(family, &info, blob).unwrap();
    assert_eq!(t.read_entries, info.num_entries);
    let e = t.emit().unwrap();
    assert!(
        e.entries == blob,
        "{family:?}: emit differs from the kernel's bytes"
    );
    assert_eq!(e.num_entries, info.num_entries);
    for h in 0..NF_INET_NUMHOOKS {
        if info.valid_hooks & (1 << h) != 0 {
            assert_eq!(e.hook_entry[h], info.hook_entry[h]);
            assert_eq!(e.underflow[h], info.underflow[h]);
        } else {
            assert_eq!(info.hook_entry[h], u32::MAX);
        }
    }
    t
}

#[test]
fn kernel_nat_v4_round_trips() {
    let t = kernel_round_trip(Family::Ipv4, NAT_V4_INFO, NAT_V4);
    assert_eq!(t.name, "nat");
    assert_eq!(
        t.chains(),
        [
            "PREROUTING",
            "INPUT",
            "OUTPUT",
            "POSTROUTING",
            "KUBE-SEP-Y",
            "KUBE-SERVICES",
            "KUBE-SVC-X"
        ]
    );
    let out = &t.chain("OUTPUT").unwrap().rules;
    assert_eq!(out[0].jump_target(), Some("KUBE-SERVICES"));
    assert_eq!(out[0].matches[0].name, "comment");
    assert_eq!(
        out[0].counters,
        Counters {
            packets: 3,
            bytes: 180
        }
    );
    assert_eq!(out[1].target, Target::Standard(Verdict::Fallthrough));
    assert_eq!(
        out[1].counters,
        Counters {
            packets: 2,
            bytes: 120
        }
    );
    assert!(out[2].is_goto() && out[2].jump_target() == Some("KUBE-SVC-X"));
    assert_eq!(out[3].target, Target::Standard(Verdict::Accept));
    let sep = &t.chain("KUBE-SEP-Y").unwrap().rules;
    assert!(matches!(&sep[0].target, Target::Other { name, .. } if name == "DNAT"));
    assert_eq!(sep[1].target, Target::Standard(Verdict::Return));
    let svc = &t.chain("KUBE-SVC-X").unwrap().rules;
    assert_eq!(svc[0].matches[0].name, "statistic");
    assert_eq!(svc[0].jump_target(), Some("KUBE-SEP-Y"));

    // Removing KUBE-SVC-X takes the goto and the chain; KUBE-SERVICES'
    // jump to it goes too, the rest is unchanged.
    let mut t2 = t.clone();
    let removed = t2.remove_chains(|c| c == "KUBE-SVC-X");
    assert_eq!(removed.rules.len(), 2);
    assert_eq!(t2.chain("KUBE-SEP-Y"), t.chain("KUBE-SEP-Y"));
    assert_eq!(t2.chain("OUTPUT").unwrap().rules.len(), 3);
    t2.emit().unwrap();
}

#[test]
fn kernel_filter_v6_round_trips() {
    let t = kernel_round_trip(Family::Ipv6, FILTER_V6_INFO, FILTER_V6);
    assert_eq!(t.chains(), ["INPUT", "FORWARD", "OUTPUT", "KUBE-FORWARD"]);
    let fwd = &t.chain("FORWARD").unwrap().rules;
    assert_eq!(fwd[0].jump_target(), Some("KUBE-FORWARD"));
    assert!(matches!(&fwd[1].target, Target::Other { name, .. } if name == "LOG"));
    assert_eq!(fwd[2].target, Target::Standard(Verdict::Drop));
    assert_eq!(
        fwd[2].counters,
        Counters {
            packets: 5,
            bytes: 400
        }
    );
    let kf = &t.chain("KUBE-FORWARD").unwrap().rules;
    assert_eq!(kf[0].matches[0].name, "conntrack");
    assert_eq!(kf[0].target, Target::Standard(Verdict::Drop));
}

#[test]
fn jump_to_missing_chain_fails_to_emit() {
    let (info, blob) = hand_built(Family::Ipv4);
    let mut t = Table::parse(Family::Ipv4, &info, &blob).unwrap();
    t.chains.retain(|c| c.name != "KEEP");
    assert_eq!(t.emit(), Err(EmitError::MissingChain("KEEP".to_string())));
}

#[test]
fn bad_blobs_fail_to_parse() {
    let (info, blob) = hand_built(Family::Ipv4);
    // Truncated.
    assert!(Table::parse(Family::Ipv4, &info, &blob[..blob.len() - 8]).is_err());
    // A jump into the middle of a chain.
    let mut bad = blob.clone();
    let v_at = Family::Ipv4.entry_len() + 32;
    bad[v_at..v_at + 4].copy_from_slice(&8i32.to_ne_bytes());
    assert!(Table::parse(Family::Ipv4, &info, &bad).is_err());
    // An underflow that is not the chain's last entry.
    let mut info2 = info.clone();
    info2.underflow[1] = 0;
    assert!(Table::parse(Family::Ipv4, &info2, &blob).is_err());
    // next_offset of zero.
    let mut bad = blob.clone();
    bad[88..92].fill(0);
    assert!(Table::parse(Family::Ipv4, &info, &bad).is_err());
}

#[test]
fn errors_name_the_phase_and_keep_the_source() {
    use std::error::Error as _;
    let e = XtablesError::ReplaceFailed {
        family: Family::Ipv6,
        table: "nat".to_string(),
        source: std::io::Error::from_raw_os_error(libc::EAGAIN),
    };
    assert_eq!(e.to_string(), "ip6tables -t nat: IPT_SO_SET_REPLACE failed");
    assert_eq!(e.errno(), Some(libc::EAGAIN));
    assert_eq!(
        e.source().unwrap().to_string(),
        std::io::Error::from_raw_os_error(libc::EAGAIN).to_string()
    );
    let (info, blob) = hand_built(Family::Ipv4);
    let d = Table::parse(Family::Ipv4, &info, &blob[..100]).unwrap_err();
    let e = XtablesError::Decode {
        context: "iptables -t filter entries".to_string(),
        source: d,
    };
    assert_eq!(e.to_string(), "decoding iptables -t filter entries");
    assert!(e.source().is_some());
}

mod arbitrary {
    //! Kernel replies are input too: mutated tables must not panic the parser,
    //! and whatever parses must emit back to the same bytes.

    use proptest::prelude::*;

    use super::*;
    use crate::fuzzing::{Mutation, mutate};

    fn seeds() -> Vec<(Family, TableInfo, Vec<u8>)> {
        let mut v = vec![
            (
                Family::Ipv4,
                TableInfo::parse(NAT_V4_INFO).unwrap(),
                NAT_V4.to_vec(),
            ),
            (
                Family::Ipv6,
                TableInfo::parse(FILTER_V6_INFO).unwrap(),
                FILTER_V6.to_vec(),
            ),
        ];
        for f in [Family::Ipv4, Family::Ipv6] {
            let (info, blob) = hand_built(f);
            v.push((f, info, blob));
        }
        v
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        let pos = any::<usize>();
        prop_oneof![
            4 => pos.prop_map(Mutation::FlipBit),
            2 => (pos, any::<u8>()).prop_map(|(p, v)| Mutation::SetByte(p, v)),
            3 => (pos, prop_oneof![Just(0u16), Just(8), Just(32), Just(40), Just(64),
                    Just(112), Just(168), Just(0xffff), any::<u16>()])
                .prop_map(|(p, v)| Mutation::SetU16(p, v)),
            2 => pos.prop_map(Mutation::Truncate),
            1 => (pos, proptest::collection::vec(any::<u8>(), 1..16))
                .prop_map(|(p, b)| Mutation::Insert(p, b)),
            1 => (pos, 1usize..16).prop_map(|(p, n)| Mutation::Remove(p, n)),
        ]
    }

    /// Parses, and when that works, checks emit gives the input back.
    fn check(family: Family, info: &TableInfo, blob: &[u8]) {
        if let Ok(t) = Table::parse(family, info, blob) {
            let e = t.emit().expect("a parsed table emits");
            assert!(e.entries == blob, "parsed but emitted other bytes");
            assert_eq!(e.num_entries, t.read_entries);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn mutated_entries_round_trip_or_fail(
            seed in any::<usize>(),
            mutations in proptest::collection::vec(mutation(), 1..4),
        ) {
            let seeds = seeds();
            let (family, info, blob) = &seeds[seed % seeds.len()];
            let blob = mutate(blob, &[], &mutations);
            let info = TableInfo { size: blob.len() as u32, ..info.clone() };
            check(*family, &info, &blob);
        }

        #[test]
        fn mutated_info_round_trips_or_fails(
            seed in any::<usize>(),
            mutations in proptest::collection::vec(mutation(), 1..3),
        ) {
            let seeds = seeds();
            let (family, info, blob) = &seeds[seed % seeds.len()];
            let bytes = mutate(&info.emit().unwrap(), &[], &mutations);
            if let Ok(info) = TableInfo::parse(&bytes) {
                check(*family, &info, blob);
            }
        }
    }
}
