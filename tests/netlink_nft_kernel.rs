//! Kernel tests (root): every test body runs in a thread that unshared its own
//! network namespace, so tests run in parallel and leave nothing behind. `nft`
//! children forked from that thread inherit its netns and serve as the oracle.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;

use kube_nlproxy_netlink::addr::list_addresses;
use kube_nlproxy_netlink::nft::*;

fn in_netns<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::spawn(move || {
        // SAFETY: unshare(2) with CLONE_NEWNET only changes this thread's netns.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

fn nft(args: &[&str]) -> String {
    let out = Command::new("nft").args(args).output().expect("run nft");
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const T: &str = "kube-nlproxy";

fn v4(s: &str) -> KeyValue {
    KeyValue::Addr(s.parse().unwrap())
}

fn ip(s: &str) -> Vec<u8> {
    match s.parse::<IpAddr>().unwrap() {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn verdict(v: Verdict) -> Expr {
    Expr::Immediate {
        dreg: Reg::VERDICT,
        data: ImmediateData::Verdict(v),
    }
}

fn base(name: &str, kind: ChainType, hook: Hook, priority: i32) -> Chain {
    Chain {
        name: name.into(),
        base: Some(BaseChain {
            kind,
            hook,
            priority,
        }),
        comment: None,
    }
}

fn chain(name: &str) -> Chain {
    Chain {
        name: name.into(),
        base: None,
        comment: None,
    }
}

/// `<addr> . meta l4proto . th dport` into regs 1, 9, 10 like nft.
fn tuple_key(family: Family) -> Vec<Expr> {
    let off = if family == Family::Ipv4 { 16 } else { 24 };
    vec![
        Expr::Payload {
            base: PayloadBase::Network,
            offset: off,
            len: family.addr_len(),
            dreg: Reg(1),
        },
        Expr::Meta {
            key: MetaKey::L4Proto,
            dreg: Reg(if family == Family::Ipv4 { 9 } else { 12 }),
        },
        Expr::Payload {
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
            dreg: Reg(if family == Family::Ipv4 { 10 } else { 13 }),
        },
    ]
}

struct Fixture {
    ops: Vec<Op>,
    chains: Vec<Chain>,
    sets: Vec<Set>,
    elements: Vec<(String, Vec<Element>)>,
    rules: Vec<Rule>,
}

fn fixture(family: Family) -> Fixture {
    let a = KeyType::addr(family);
    let (svc, ep) = if family == Family::Ipv4 {
        ("10.0.0.1", "10.1.0.1")
    } else {
        ("fd00::1", "fd01::1")
    };
    let chains = vec![
        base("prerouting", ChainType::Nat, Hook::Prerouting, -100),
        base("output", ChainType::Nat, Hook::Output, -100),
        base("postrouting", ChainType::Nat, Hook::Postrouting, 100),
        base("filter-input", ChainType::Filter, Hook::Input, 0),
        chain("services"),
        Chain {
            comment: Some("default/web:http".into()),
            ..chain("svc-a")
        },
        chain("sep-1"),
        chain("sep-2"),
        chain("masq"),
    ];
    let sets = vec![
        Set {
            name: "service-ips".into(),
            key: vec![a, KeyType::InetProto, KeyType::InetService],
            verdict_map: true,
            data: Vec::new(),
            flags: SetFlags::default(),
            timeout_ms: None,
        },
        Set {
            name: "no-endpoints".into(),
            key: vec![a, KeyType::InetProto, KeyType::InetService],
            verdict_map: false,
            data: Vec::new(),
            flags: SetFlags::default(),
            timeout_ms: None,
        },
        Set {
            name: "aff".into(),
            key: vec![a],
            verdict_map: false,
            data: Vec::new(),
            flags: SetFlags {
                timeout: true,
                dynamic: true,
            },
            timeout_ms: Some(10_800_000),
        },
        Set {
            name: "marks".into(),
            key: vec![KeyType::Mark],
            verdict_map: false,
            data: Vec::new(),
            flags: SetFlags::default(),
            timeout_ms: None,
        },
    ];
    let key = |addr: &str, proto: u8, port: u16| {
        vec![
            KeyValue::Addr(addr.parse().unwrap()),
            KeyValue::Proto(proto),
            KeyValue::Port(port),
        ]
    };
    let elements = vec![
        (
            "service-ips".to_string(),
            vec![
                Element {
                    key: key(svc, 6, 80),
                    verdict: Some(Verdict::Jump("svc-a".into())),
                    data: Vec::new(),
                    comment: None,
                },
                Element {
                    key: key(svc, 17, 53),
                    verdict: Some(Verdict::Goto("svc-a".into())),
                    data: Vec::new(),
                    comment: None,
                },
                Element {
                    key: key(svc, 132, 9),
                    verdict: Some(Verdict::Drop),
                    data: Vec::new(),
                    comment: None,
                },
            ],
        ),
        (
            "no-endpoints".to_string(),
            vec![Element {
                key: key(svc, 6, 81),
                verdict: None,
                data: Vec::new(),
                comment: None,
            }],
        ),
        (
            "marks".to_string(),
            vec![Element {
                key: vec![KeyValue::Mark(0x4000)],
                verdict: None,
                data: Vec::new(),
                comment: None,
            }],
        ),
    ];
    let (nfproto, icmp_code, saddr_off) = if family == Family::Ipv4 {
        (2u8, 3u8, 12)
    } else {
        (10u8, 4u8, 8)
    };
    let mut rules = vec![
        Rule {
            chain: "prerouting".into(),
            exprs: vec![Expr::Counter, verdict(Verdict::Jump("services".into()))],
            comment: None,
        },
        Rule {
            chain: "output".into(),
            exprs: vec![verdict(Verdict::Jump("services".into()))],
            comment: Some("from local".into()),
        },
        Rule {
            chain: "postrouting".into(),
            exprs: vec![
                Expr::Meta {
                    key: MetaKey::NfProto,
                    dreg: Reg(1),
                },
                Expr::Cmp {
                    sreg: Reg(1),
                    op: CmpOp::Eq,
                    data: vec![nfproto],
                },
                verdict(Verdict::Goto("masq".into())),
            ],
            comment: None,
        },
        Rule {
            chain: "masq".into(),
            exprs: vec![
                Expr::Meta {
                    key: MetaKey::Mark,
                    dreg: Reg(1),
                },
                Expr::Bitwise {
                    sreg: Reg(1),
                    dreg: Reg(1),
                    mask: 0x4000u32.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                },
                Expr::Cmp {
                    sreg: Reg(1),
                    op: CmpOp::Eq,
                    data: vec![0; 4],
                },
                verdict(Verdict::Return),
            ],
            comment: None,
        },
        Rule {
            chain: "masq".into(),
            exprs: vec![
                Expr::Meta {
                    key: MetaKey::OifName,
                    dreg: Reg(1),
                },
                Expr::Cmp {
                    sreg: Reg(1),
                    op: CmpOp::Neq,
                    data: b"lo\0\0\0\0\0\0\0\0\0\0\0\0\0\0".to_vec(),
                },
                Expr::Masquerade { fully_random: true },
            ],
            comment: Some("masquerade marked".into()),
        },
        Rule {
            chain: "masq".into(),
            exprs: vec![Expr::Masquerade {
                fully_random: false,
            }],
            comment: None,
        },
    ];
    let mut vmap = tuple_key(family);
    vmap.push(Expr::Lookup {
        set: "service-ips".into(),
        sreg: Reg(1),
        dreg: Some(Reg::VERDICT),
        invert: false,
    });
    rules.push(Rule {
        chain: "services".into(),
        exprs: vmap,
        comment: Some("service vmap".into()),
    });
    let mut rej = vec![
        Expr::Fib {
            addr: FibAddr::Destination,
            result: FibResult::AddrType,
            dreg: Reg(1),
        },
        Expr::Cmp {
            sreg: Reg(1),
            op: CmpOp::Eq,
            data: 2u32.to_ne_bytes().to_vec(),
        },
    ];
    rej.extend(tuple_key(family));
    rej.push(Expr::Lookup {
        set: "no-endpoints".into(),
        sreg: Reg(1),
        dreg: None,
        invert: false,
    });
    rej.push(Expr::Reject(RejectKind::IcmpUnreach(icmp_code)));
    rules.push(Rule {
        chain: "services".into(),
        exprs: rej,
        comment: None,
    });
    rules.push(Rule {
        chain: "services".into(),
        exprs: vec![
            Expr::Meta {
                key: MetaKey::Mark,
                dreg: Reg(1),
            },
            Expr::Lookup {
                set: "marks".into(),
                sreg: Reg(1),
                dreg: None,
                invert: true,
            },
            Expr::Fib {
                addr: FibAddr::Source,
                result: FibResult::AddrType,
                dreg: Reg(1),
            },
            Expr::Cmp {
                sreg: Reg(1),
                op: CmpOp::Eq,
                data: 2u32.to_ne_bytes().to_vec(),
            },
            Expr::Meta {
                key: MetaKey::L4Proto,
                dreg: Reg(1),
            },
            Expr::Cmp {
                sreg: Reg(1),
                op: CmpOp::Eq,
                data: vec![6],
            },
            Expr::Reject(RejectKind::TcpRst),
        ],
        comment: None,
    });
    rules.push(Rule {
        chain: "svc-a".into(),
        exprs: vec![
            Expr::Payload {
                base: PayloadBase::Network,
                offset: saddr_off,
                len: family.addr_len(),
                dreg: Reg(1),
            },
            Expr::Lookup {
                set: "aff".into(),
                sreg: Reg(1),
                dreg: None,
                invert: false,
            },
            verdict(Verdict::Goto("sep-1".into())),
        ],
        comment: None,
    });
    rules.push(Rule {
        chain: "svc-a".into(),
        exprs: vec![
            Expr::NumgenRandom {
                dreg: Reg(1),
                modulus: 2,
                offset: 0,
            },
            Expr::Cmp {
                sreg: Reg(1),
                op: CmpOp::Eq,
                data: 0u32.to_ne_bytes().to_vec(),
            },
            verdict(Verdict::Goto("sep-1".into())),
        ],
        comment: None,
    });
    rules.push(Rule {
        chain: "svc-a".into(),
        exprs: vec![verdict(Verdict::Goto("sep-2".into()))],
        comment: None,
    });
    for (name, addr) in [("sep-1", ep), ("sep-2", ep)] {
        rules.push(Rule {
            chain: name.into(),
            exprs: vec![
                Expr::Ct {
                    key: CtKey::State,
                    dreg: Reg(1),
                },
                Expr::Bitwise {
                    sreg: Reg(1),
                    dreg: Reg(1),
                    mask: 8u32.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                },
                Expr::Cmp {
                    sreg: Reg(1),
                    op: CmpOp::Neq,
                    data: vec![0; 4],
                },
                Expr::Payload {
                    base: PayloadBase::Network,
                    offset: saddr_off,
                    len: family.addr_len(),
                    dreg: Reg(1),
                },
                Expr::Dynset {
                    op: DynsetOp::Update,
                    set: "aff".into(),
                    sreg_key: Reg(1),
                    sreg_data: None,
                    timeout_ms: Some(10_800_000),
                },
                Expr::Immediate {
                    dreg: Reg(1),
                    data: ImmediateData::Value(0x4000u32.to_ne_bytes().to_vec()),
                },
                Expr::MetaSet {
                    key: MetaKey::Mark,
                    sreg: Reg(1),
                },
            ],
            comment: Some(format!("{name} affinity")),
        });
        rules.push(Rule {
            chain: name.into(),
            exprs: vec![
                Expr::Payload {
                    base: PayloadBase::Transport,
                    offset: 2,
                    len: 2,
                    dreg: Reg(1),
                },
                Expr::Cmp {
                    sreg: Reg(1),
                    op: CmpOp::Lt,
                    data: 1024u16.to_be_bytes().to_vec(),
                },
                Expr::Immediate {
                    dreg: Reg(1),
                    data: ImmediateData::Value(ip(addr)),
                },
                Expr::Immediate {
                    dreg: Reg(2),
                    data: ImmediateData::Value(8080u16.to_be_bytes().to_vec()),
                },
                Expr::Dnat {
                    family,
                    reg_addr: Reg(1),
                    reg_port: Some(Reg(2)),
                },
            ],
            comment: Some(format!("{name} dnat")),
        });
        rules.push(Rule {
            chain: name.into(),
            exprs: vec![
                Expr::Immediate {
                    dreg: Reg(1),
                    data: ImmediateData::Value(ip(addr)),
                },
                Expr::Dnat {
                    family,
                    reg_addr: Reg(1),
                    reg_port: None,
                },
            ],
            comment: None,
        });
    }
    rules.push(Rule {
        chain: "filter-input".into(),
        exprs: vec![
            Expr::Meta {
                key: MetaKey::IifName,
                dreg: Reg(1),
            },
            Expr::Cmp {
                sreg: Reg(1),
                op: CmpOp::Eq,
                data: b"lo\0\0\0\0\0\0\0\0\0\0\0\0\0\0".to_vec(),
            },
            verdict(Verdict::Accept),
        ],
        comment: None,
    });
    rules.push(Rule {
        chain: "filter-input".into(),
        exprs: vec![
            Expr::Payload {
                base: PayloadBase::Transport,
                offset: 2,
                len: 2,
                dreg: Reg(1),
            },
            Expr::Cmp {
                sreg: Reg(1),
                op: CmpOp::Gte,
                data: 30000u16.to_be_bytes().to_vec(),
            },
            Expr::Cmp {
                sreg: Reg(1),
                op: CmpOp::Lte,
                data: 32767u16.to_be_bytes().to_vec(),
            },
            Expr::Cmp {
                sreg: Reg(1),
                op: CmpOp::Gt,
                data: 1u16.to_be_bytes().to_vec(),
            },
            Expr::Counter,
            verdict(Verdict::Continue),
        ],
        comment: None,
    });

    let mut ops = vec![Op::AddTable {
        family,
        name: T.into(),
    }];
    ops.extend(chains.iter().map(|c| Op::AddChain {
        family,
        table: T.into(),
        chain: c.clone(),
    }));
    ops.extend(sets.iter().map(|s| Op::AddSet {
        family,
        table: T.into(),
        set: s.clone(),
    }));
    ops.extend(elements.iter().map(|(s, e)| Op::AddElements {
        family,
        table: T.into(),
        set: s.clone(),
        elements: e.clone(),
    }));
    ops.extend(rules.iter().map(|r| Op::AddRule {
        family,
        table: T.into(),
        rule: r.clone(),
    }));
    Fixture {
        ops,
        chains,
        sets,
        elements,
        rules,
    }
}

fn check_dump(family: Family, fx: &Fixture, sock: &mut NftSocket) -> TableState {
    let st = sock.dump_table(family, T).unwrap().expect("table exists");
    let got: BTreeSet<String> = st.chains.iter().map(|c| format!("{c:?}")).collect();
    let want: BTreeSet<String> = fx.chains.iter().map(|c| format!("{c:?}")).collect();
    assert_eq!(got, want);
    let mut got_sets = st.sets.clone();
    got_sets.sort_by(|a, b| a.name.cmp(&b.name));
    let mut want_sets = fx.sets.clone();
    want_sets.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(got_sets, want_sets);
    for (set, elems) in &fx.elements {
        let mut got = st.elements[set].clone();
        got.sort();
        let mut want = elems.clone();
        want.sort();
        assert_eq!(got, want, "elements of {set}");
    }
    for c in &fx.chains {
        let want: Vec<u64> = fx
            .rules
            .iter()
            .filter(|r| r.chain == c.name)
            .map(rule_fingerprint)
            .collect();
        let got: Vec<u64> = st
            .rules
            .get(&c.name)
            .map(|v| {
                v.iter()
                    .map(|r| r.fingerprint.expect("fingerprint"))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(got, want, "rules of {}", c.name);
    }
    st
}

#[test]
fn ipv4_full_table_roundtrip_and_nft_listing() {
    in_netns(|| {
        let fx = fixture(Family::Ipv4);
        let mut sock = NftSocket::new().unwrap();
        assert_eq!(sock.dump_table(Family::Ipv4, T).unwrap(), None);
        let g0 = sock.generation().unwrap();
        sock.apply(&fx.ops).unwrap();
        assert!(sock.generation().unwrap() > g0);
        check_dump(Family::Ipv4, &fx, &mut sock);

        let text = nft(&["list", "table", "ip", T]);
        println!("{text}");
        for want in [
            "type nat hook prerouting priority dstnat; policy accept;",
            "type nat hook postrouting priority srcnat; policy accept;",
            "type filter hook input priority filter; policy accept;",
            "type ipv4_addr . inet_proto . inet_service : verdict",
            "10.0.0.1 . tcp . 80 : jump svc-a",
            "10.0.0.1 . udp . 53 : goto svc-a",
            "type ipv4_addr . inet_proto . inet_service\n",
            "flags dynamic,timeout",
            "timeout 3h",
            "ip daddr . meta l4proto . th dport vmap @service-ips comment \"service vmap\"\n",
            "fib daddr type local ip daddr . meta l4proto . th dport @no-endpoints reject",
            "meta mark != @marks fib saddr type local reject with tcp reset",
            "elements = { 0x00004000 }",
            "th dport 30000-32767 th dport > 1 counter packets 0 bytes 0 continue",
            "ip saddr @aff goto sep-1",
            "numgen random mod 2 0 goto sep-1",
            "ct state new update @aff { ip saddr timeout 3h } meta mark set 0x00004000",
            "th dport < 1024 dnat to 10.1.0.1:8080 comment \"sep-1 dnat\"\n",
            "dnat to 10.1.0.1\n",
            "masquerade fully-random",
            "oifname != \"lo\" masquerade fully-random comment \"masquerade marked\"\n",
            "meta mark & 0x00004000 == 0x00000000 return",
            "meta nfproto ipv4 goto masq",
            "iifname \"lo\" accept",
            "counter packets 0 bytes 0 jump services",
            "jump services comment \"from local\"\n",
            "chain svc-a {\n\t\tcomment \"default/web:http\"\n",
        ] {
            assert!(text.contains(want), "missing `{want}` in:\n{text}");
        }
        // Our fingerprint TLV is in the userdata, and nft prints none of it.
        assert!(!text.contains('#'), "a fingerprint shows in:\n{text}");

        // Re-applying the same objects is idempotent (no EXCL), except rules append.
        let idem: Vec<Op> = fx
            .ops
            .iter()
            .filter(|o| !matches!(o, Op::AddRule { .. }))
            .cloned()
            .collect();
        sock.apply(&idem).unwrap();
        check_dump(Family::Ipv4, &fx, &mut sock);
    });
}

#[test]
fn ipv6_full_table_roundtrip_and_nft_listing() {
    in_netns(|| {
        let fx = fixture(Family::Ipv6);
        let mut sock = NftSocket::new().unwrap();
        sock.apply(&fx.ops).unwrap();
        check_dump(Family::Ipv6, &fx, &mut sock);
        let text = nft(&["list", "table", "ip6", T]);
        println!("{text}");
        for want in [
            "type ipv6_addr . inet_proto . inet_service : verdict",
            "fd00::1 . tcp . 80 : jump svc-a",
            "ip6 daddr . meta l4proto . th dport vmap @service-ips",
            "dnat to [fd01::1]:8080",
            "update @aff { ip6 saddr timeout 3h }",
            "meta nfproto ipv6 goto masq",
        ] {
            assert!(text.contains(want), "missing `{want}` in:\n{text}");
        }
    });
}

#[test]
fn flush_delete_elements_delete_chain() {
    in_netns(|| {
        let fam = Family::Ipv4;
        let fx = fixture(fam);
        let mut sock = NftSocket::new().unwrap();
        sock.apply(&fx.ops).unwrap();
        let svc = fx.elements[0].1.clone();
        sock.apply(&[
            Op::FlushChain {
                family: fam,
                table: T.into(),
                name: "services".into(),
            },
            Op::DeleteElements {
                family: fam,
                table: T.into(),
                set: "service-ips".into(),
                elements: svc[..2].to_vec(),
            },
            Op::FlushChain {
                family: fam,
                table: T.into(),
                name: "svc-a".into(),
            },
            Op::DeleteChain {
                family: fam,
                table: T.into(),
                name: "sep-2".into(),
            },
            Op::DeleteSet {
                family: fam,
                table: T.into(),
                name: "marks".into(),
            },
        ])
        .unwrap();
        let st = sock.dump_table(fam, T).unwrap().unwrap();
        assert!(st.rules.get("services").is_none_or(|r| r.is_empty()));
        assert!(st.rules.get("svc-a").is_none_or(|r| r.is_empty()));
        assert_eq!(st.rules["sep-1"].len(), 3);
        assert_eq!(st.elements["service-ips"], svc[2..].to_vec());
        assert!(!st.chains.iter().any(|c| c.name == "sep-2"));
        assert!(!st.sets.iter().any(|s| s.name == "marks"));
        let text = nft(&["list", "table", "ip", T]);
        assert!(
            !text.contains("sep-2") && !text.contains("@marks"),
            "{text}"
        );

        sock.apply(&[Op::DeleteTable {
            family: fam,
            name: T.into(),
        }])
        .unwrap();
        assert_eq!(sock.dump_table(fam, T).unwrap(), None);
    });
}

#[test]
fn failing_batch_is_atomic_and_names_the_op() {
    in_netns(|| {
        let fam = Family::Ipv4;
        let mut sock = NftSocket::new().unwrap();
        let ops = vec![
            Op::AddTable {
                family: fam,
                name: T.into(),
            },
            Op::AddChain {
                family: fam,
                table: T.into(),
                chain: chain("a"),
            },
            Op::AddRule {
                family: fam,
                table: T.into(),
                rule: Rule {
                    chain: "a".into(),
                    exprs: vec![Expr::Counter],
                    comment: None,
                },
            },
            Op::AddRule {
                family: fam,
                table: T.into(),
                rule: Rule {
                    chain: "a".into(),
                    exprs: vec![verdict(Verdict::Jump("missing".into()))],
                    comment: None,
                },
            },
            Op::AddChain {
                family: fam,
                table: T.into(),
                chain: chain("b"),
            },
        ];
        let err = sock.apply(&ops).unwrap_err();
        match &err {
            NftError::BatchRejected {
                index, op, errno, ..
            } => {
                assert_eq!(*index, 3);
                assert_eq!(*errno, libc::ENOENT);
                assert!(op.contains("jump missing"), "{op}");
            }
            other => panic!("unexpected {other:?}"),
        }
        println!("{err}");
        assert_eq!(sock.dump_table(fam, T).unwrap(), None);
        assert!(!nft(&["list", "ruleset"]).contains(T));
        // The socket stays usable.
        sock.apply(&ops[..3]).unwrap();
        assert_eq!(
            sock.dump_table(fam, T).unwrap().unwrap().rules["a"].len(),
            1
        );
    });
}

#[test]
fn large_batch_applies_in_one_call() {
    in_netns(|| {
        let fam = Family::Ipv4;
        let mut sock = NftSocket::new().unwrap();
        let set = Set {
            name: "service-ips".into(),
            key: vec![KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService],
            verdict_map: true,
            data: Vec::new(),
            flags: SetFlags::default(),
            timeout_ms: None,
        };
        let mut ops = vec![
            Op::AddTable {
                family: fam,
                name: T.into(),
            },
            Op::AddSet {
                family: fam,
                table: T.into(),
                set,
            },
        ];
        for i in 0..5000 {
            let name = format!("svc-{i}");
            ops.push(Op::AddChain {
                family: fam,
                table: T.into(),
                chain: chain(&name),
            });
            ops.push(Op::AddRule {
                family: fam,
                table: T.into(),
                rule: Rule {
                    chain: name,
                    exprs: vec![Expr::Counter, verdict(Verdict::Accept)],
                    comment: Some(format!("service {i}")),
                },
            });
        }
        let elements: Vec<Element> = (0..20_000u32)
            .map(|i| Element {
                key: vec![
                    v4(&format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)),
                    KeyValue::Proto(6),
                    KeyValue::Port(80),
                ],
                verdict: Some(Verdict::Jump(format!("svc-{}", i % 5000))),
                data: Vec::new(),
                comment: None,
            })
            .collect();
        ops.push(Op::AddElements {
            family: fam,
            table: T.into(),
            set: "service-ips".into(),
            elements: elements.clone(),
        });
        let before = sock.messages_sent();
        let t = std::time::Instant::now();
        sock.apply(&ops).unwrap();
        println!(
            "applied {} ops / {} messages in {:?}",
            ops.len(),
            sock.messages_sent() - before,
            t.elapsed()
        );
        let st = sock.dump_table(fam, T).unwrap().unwrap();
        assert_eq!(st.chains.len(), 5000);
        assert_eq!(st.rules.values().map(Vec::len).sum::<usize>(), 5000);
        let mut got = st.elements["service-ips"].clone();
        got.sort();
        let mut want = elements;
        want.sort();
        assert_eq!(got, want);
    });
}

#[test]
fn element_lookup_finds_each_element_and_names_the_first_unheld() {
    in_netns(|| {
        let fam = Family::Ipv4;
        let mut sock = NftSocket::new().unwrap();
        let set = Set {
            name: "endpoints".into(),
            key: vec![
                KeyType::Ipv4Addr,
                KeyType::InetProto,
                KeyType::InetService,
                KeyType::Mark,
            ],
            verdict_map: false,
            data: vec![KeyType::Ipv4Addr, KeyType::InetService],
            flags: SetFlags::default(),
            timeout_ms: None,
        };
        // More than one lookup request's worth, with comments like ours.
        let element = |i: u32| Element {
            key: vec![
                v4(&format!("10.96.{}.{}", i >> 8, i & 255)),
                KeyValue::Proto(6),
                KeyValue::Port(80),
                KeyValue::Mark(i % 2),
            ],
            verdict: None,
            data: vec![
                v4(&format!("10.1.{}.{}", i >> 8, i & 255)),
                KeyValue::Port(8080),
            ],
            comment: Some(format!("default/svc-{i}:http").into()),
        };
        let held: Vec<Element> = (0..1500).map(element).collect();
        sock.apply(&[
            Op::AddTable {
                family: fam,
                name: T.into(),
            },
            Op::AddSet {
                family: fam,
                table: T.into(),
                set: set.clone(),
            },
            Op::AddElements {
                family: fam,
                table: T.into(),
                set: set.name.clone(),
                elements: held.clone(),
            },
        ])
        .unwrap();
        // The dump (the independent read) holds exactly these. Right after a
        // big insert the kernel may still be growing the set's hash table,
        // and a dump walking it meanwhile can miss or repeat elements (its
        // walk restarts at every continuation): read until two agree.
        let want: BTreeSet<Element> = held.iter().cloned().collect();
        let mut dumped = BTreeSet::new();
        for _ in 0..50 {
            dumped = sock
                .dump_set_elements(fam, T, &set)
                .unwrap()
                .unwrap()
                .into_iter()
                .collect();
            if dumped == want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(
            dumped == want,
            "the dump never held exactly the elements added"
        );

        let refs: Vec<&Element> = held.iter().collect();
        assert_eq!(sock.find_unheld_element(fam, T, &set, &refs).unwrap(), None);
        assert_eq!(sock.find_unheld_element(fam, T, &set, &[]).unwrap(), None);

        // Missing, in the second request: its index.
        let absent = element(5000);
        let mut asked = refs.clone();
        asked.insert(700, &absent);
        assert_eq!(
            sock.find_unheld_element(fam, T, &set, &asked).unwrap(),
            Some(700)
        );
        // Held with other data, or another comment.
        let mut other_data = held[10].clone();
        other_data.data[1] = KeyValue::Port(9090);
        let mut asked = refs.clone();
        asked[10] = &other_data;
        assert_eq!(
            sock.find_unheld_element(fam, T, &set, &asked).unwrap(),
            Some(10)
        );
        let mut other_comment = held[1499].clone();
        other_comment.comment = Some("default/other:http".into());
        let mut asked = refs.clone();
        asked[1499] = &other_comment;
        assert_eq!(
            sock.find_unheld_element(fam, T, &set, &asked).unwrap(),
            Some(1499)
        );

        // The socket is left clean: the next request reads its own replies.
        assert_eq!(sock.find_unheld_element(fam, T, &set, &refs).unwrap(), None);
        // A set that does not exist holds none of them.
        let mut missing_set = set.clone();
        missing_set.name = "nope".into();
        assert_eq!(
            sock.find_unheld_element(fam, T, &missing_set, &refs)
                .unwrap(),
            Some(0)
        );
    });
}

#[test]
fn list_addresses_sees_loopback() {
    in_netns(|| {
        let st = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .unwrap();
        assert!(st.success());
        let addrs = list_addresses().unwrap();
        assert!(
            addrs.iter().any(|a| a.ifname == "lo"
                && a.ifindex == 1
                && a.addr == "127.0.0.1".parse::<IpAddr>().unwrap()
                && a.prefix_len == 8),
            "{addrs:?}"
        );
        assert!(
            addrs
                .iter()
                .any(|a| a.addr == "::1".parse::<IpAddr>().unwrap() && a.prefix_len == 128),
            "{addrs:?}"
        );
    });
}

#[test]
fn kernel_faults_leave_the_table_as_it_was_and_dumps_recover() {
    in_netns(|| {
        let fx = fixture(Family::Ipv4);
        let mut sock = NftSocket::new().unwrap();
        sock.apply(&fx.ops).unwrap();
        let before = sock.dump_table(Family::Ipv4, T).unwrap();
        assert!(before.is_some());
        let (set, _) = &fx.elements[0];
        let delete_all = [Op::DeleteTable {
            family: Family::Ipv4,
            name: T.into(),
        }];

        // A batch the kernel rejects for real (its last op names a chain that
        // does not exist): nothing of it is applied.
        let mut real = vec![Op::FlushChain {
            family: Family::Ipv4,
            table: T.into(),
            name: fx.chains[0].name.clone(),
        }];
        real.push(Op::DeleteChain {
            family: Family::Ipv4,
            table: T.into(),
            name: "no-such-chain".into(),
        });
        match sock.apply(&real) {
            Err(NftError::BatchRejected { index, errno, .. }) => {
                assert_eq!((index, errno), (1, libc::ENOENT))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(sock.dump_table(Family::Ipv4, T).unwrap(), before);

        // Injected rejections, as the kernel gives them.
        for errno in [libc::EINVAL, libc::EPERM, libc::EBUSY, libc::ENOBUFS] {
            sock.inject_fault(InjectedFault::Batch(errno));
            match sock.apply(&delete_all) {
                Err(NftError::BatchRejected { errno: e, .. }) => assert_eq!(e, errno),
                other => panic!("{other:?}"),
            }
            assert_eq!(sock.dump_table(Family::Ipv4, T).unwrap(), before);
        }

        // A dump interrupted by a concurrent change is retried.
        sock.inject_fault(InjectedFault::DumpInterrupted);
        sock.inject_fault(InjectedFault::DumpInterrupted);
        assert_eq!(sock.dump_table(Family::Ipv4, T).unwrap(), before);
        // One that keeps being interrupted gives up with EINTR.
        for _ in 0..5 {
            sock.inject_fault(InjectedFault::DumpInterrupted);
        }
        match sock.dump_table(Family::Ipv4, T) {
            Err(NftError::Dump { errno, .. }) => assert_eq!(errno, libc::EINTR),
            other => panic!("{other:?}"),
        }
        sock.inject_fault(InjectedFault::Dump(libc::EPERM));
        match sock.dump_table(Family::Ipv4, T) {
            Err(NftError::Dump { errno, .. }) => assert_eq!(errno, libc::EPERM),
            other => panic!("{other:?}"),
        }
        // A dump that overran its buffer is retried with a bigger one.
        let size = sock.buffer_size();
        sock.inject_fault(InjectedFault::RecvOverrun);
        let sets = fx.sets.iter().find(|s| &s.name == set).unwrap();
        assert_eq!(
            sock.dump_set_elements(Family::Ipv4, T, sets)
                .unwrap()
                .map(|e| e.len()),
            Some(fx.elements[0].1.len())
        );
        assert!(sock.buffer_size() > size);
        assert_eq!(sock.dump_table(Family::Ipv4, T).unwrap(), before);
    });
}

/// A rule written by kube-nlproxy before 0.2 kept its fingerprint in the comment
/// (`"<human> #<16 hex>"`); `nft` writes such a rule here with real kernel bytes,
/// and the dump reads the fingerprint and the human part back.
#[test]
fn old_format_rule_comment_is_read() {
    in_netns(|| {
        nft(&["add", "table", "ip", T]);
        nft(&["add", "chain", "ip", T, "c"]);
        nft(&[
            "add",
            "rule",
            "ip",
            T,
            "c",
            "counter",
            "comment",
            "\"masquerade #00000000deadbeef\"",
        ]);
        nft(&[
            "add",
            "rule",
            "ip",
            T,
            "c",
            "counter",
            "comment",
            "\"plain\"",
        ]);
        let mut sock = NftSocket::new().unwrap();
        let st = sock.dump_table(Family::Ipv4, T).unwrap().expect("table");
        let rules = &st.rules["c"];
        assert_eq!(rules[0].comment, "masquerade");
        assert_eq!(rules[0].fingerprint, Some(0xdead_beef));
        // Someone else's rule: no fingerprint, so the diff rewrites its chain.
        assert_eq!(rules[1].comment, "plain");
        assert_eq!(rules[1].fingerprint, None);
    });
}

/// Ours: the comment TLV nft reads and our fingerprint TLV after it. nft prints
/// the comment alone; a dump gives both back.
#[test]
fn fingerprint_tlv_is_invisible_to_nft() {
    in_netns(|| {
        let rule = Rule {
            chain: "c".into(),
            exprs: vec![Expr::Counter],
            comment: Some("masquerade traffic from outside the cluster".into()),
        };
        let bare = Rule {
            comment: None,
            ..rule.clone()
        };
        let mut sock = NftSocket::new().unwrap();
        sock.apply(&[
            Op::AddTable {
                family: Family::Ipv4,
                name: T.into(),
            },
            Op::AddChain {
                family: Family::Ipv4,
                table: T.into(),
                chain: chain("c"),
            },
            Op::AddRule {
                family: Family::Ipv4,
                table: T.into(),
                rule: rule.clone(),
            },
            Op::AddRule {
                family: Family::Ipv4,
                table: T.into(),
                rule: bare.clone(),
            },
        ])
        .unwrap();
        let text = nft(&["list", "table", "ip", T]);
        assert!(
            text.contains("counter packets 0 bytes 0 comment \"masquerade traffic from outside the cluster\"\n"),
            "{text}"
        );
        assert!(text.contains("counter packets 0 bytes 0\n"), "{text}");
        assert!(!text.contains('#'), "{text}");
        let st = sock.dump_table(Family::Ipv4, T).unwrap().expect("table");
        let rules = &st.rules["c"];
        assert_eq!(rules[0].comment, rule.comment.clone().unwrap());
        assert_eq!(rules[0].fingerprint, Some(rule_fingerprint(&rule)));
        assert_eq!(rules[1].comment, "");
        assert_eq!(rules[1].fingerprint, Some(rule_fingerprint(&bare)));
        // nft re-reads and rewrites the table from its own listing: our TLV
        // does not break its parser.
        let again = nft(&["-j", "list", "table", "ip", T]);
        assert!(again.contains("masquerade traffic from outside the cluster"));
    });
}
