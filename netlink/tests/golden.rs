//! Golden bytes: our expression encoding equals what `nft` 1.0.6 sends, captured with
//! `strace -f -e trace=sendmsg -xx -s 65536 nft -f …` inside a scratch netns.

use kube_nlproxy_netlink::nft::codec::{encode_exprs, parse_comment};
use kube_nlproxy_netlink::nft::*;

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `meta l4proto tcp ip daddr 10.0.0.1 dnat to 10.1.0.1:8080`
#[test]
fn dnat_rule_matches_nft() {
    let nft = unhex(
        "24000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d70\
         0020000280080001000000000108000200000000000c0003800500010006000000340001800c0001007061796c6f6164\
         002400028008000100000000010800020000000001080003000000001008000400000000042c00018008000100636d70\
         0020000280080001000000000108000200000000000c000380080001000a0000012c0001800e000100696d6d65646961\
         74650000001800028008000100000000010c000280080001000a0100012c0001800e000100696d6d6564696174650000\
         001800028008000100000000020c000280060001001f90000038000180080001006e6174002c00028008000100000000\
         010800020000000002080003000000000108000500000000020800070000000002",
    );
    let exprs = vec![
        Expr::Meta {
            key: MetaKey::L4Proto,
            dreg: Reg(1),
        },
        Expr::Cmp {
            sreg: Reg(1),
            op: CmpOp::Eq,
            data: vec![6],
        },
        Expr::Payload {
            base: PayloadBase::Network,
            offset: 16,
            len: 4,
            dreg: Reg(1),
        },
        Expr::Cmp {
            sreg: Reg(1),
            op: CmpOp::Eq,
            data: vec![10, 0, 0, 1],
        },
        Expr::Immediate {
            dreg: Reg(1),
            data: ImmediateData::Value(vec![10, 1, 0, 1]),
        },
        Expr::Immediate {
            dreg: Reg(2),
            data: ImmediateData::Value(8080u16.to_be_bytes().to_vec()),
        },
        Expr::Dnat {
            family: Family::Ipv4,
            reg_addr: Reg(1),
            reg_port: Some(Reg(2)),
        },
    ];
    assert_eq!(hex(&encode_exprs(&exprs)), hex(&nft));
}

/// `ip daddr . meta l4proto . th dport vmap @svc`. nft also sends
/// `NFTA_LOOKUP_SET_ID` (it knows the set's batch id); we look sets up by name
/// only, so that attribute is removed from the capture (nest lengths adjusted).
#[test]
fn vmap_lookup_rule_matches_nft() {
    let nft = unhex(
        "340001800c0001007061796c6f616400240002800800010000000001080002000000000108000300000000100800040000\
         00000424000180090001006d657461000000001400028008000200000000100800010000000009340001800c0001007061\
         796c6f61640024000280080001000000000a080002000000000208000300000000020800040000000002\
         2c0001800b0001006c6f6f6b75700000\
         1c000280080002000000000108000300000000000800010073766300",
    );
    let exprs = vec![
        Expr::Payload {
            base: PayloadBase::Network,
            offset: 16,
            len: 4,
            dreg: Reg(1),
        },
        Expr::Meta {
            key: MetaKey::L4Proto,
            dreg: Reg(9),
        },
        Expr::Payload {
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
            dreg: Reg(10),
        },
        Expr::Lookup {
            set: "svc".into(),
            sreg: Reg(1),
            dreg: Some(Reg::VERDICT),
            invert: false,
        },
    ];
    assert_eq!(hex(&encode_exprs(&exprs)), hex(&nft));
}

/// `fib daddr type local counter masquerade fully-random`
#[test]
fn fib_counter_masq_matches_nft() {
    let nft = unhex(
        "28000180080001006669620 01c00028008000300000000020800020000000003080001000000000\
         12c00018008000100636d700020000280080001000000000108000200000000000c00038008000100\
         02000000140001800c000100636f756e746572000400028 01c000180090001006d61737100000000\
         0c00028008000100 00000010",
    );
    let exprs = vec![
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
        Expr::Counter,
        Expr::Masquerade { fully_random: true },
    ];
    assert_eq!(hex(&encode_exprs(&exprs)), hex(&nft));
}

/// `ct state new update @aff { ip saddr timeout 3h } reject` (minus dynset's SET_ID)
/// and `meta mark set 0x4000 … return`.
#[test]
fn ct_dynset_reject_meta_set_match_nft() {
    let nft = unhex(
        "20000180070001006374000014000280080002000000000008000100000000014400018 00c000100626974776973650034\
         000280080001000000000108000200000000010800030000000004 0c000480080001000800000 00c0005800800010000\
         0000002c00018008000100636d700020000280080001000000000108000200000000010c000380080001000000000034\
         0001800c0001007061796c6f6164002400028008000100000000010800020000000001080003000000000c0800040000\
         000004 38000180 0b00010064796e736574000028000280 08000400000000010800030000000001 0c000600000000000\
         0a4cb80 0800010061666600 24000180 0b00010072656a656374000014000280080001000000000005000200030000 00",
    );
    let exprs = vec![
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
            offset: 12,
            len: 4,
            dreg: Reg(1),
        },
        Expr::Dynset {
            op: DynsetOp::Update,
            set: "aff".into(),
            sreg_key: Reg(1),
            sreg_data: None,
            timeout_ms: Some(10_800_000),
        },
        Expr::Reject(RejectKind::IcmpUnreach(3)),
    ];
    assert_eq!(hex(&encode_exprs(&exprs)), hex(&nft));

    let nft2 = unhex(
        "2c0001800e000100696d6d6564696174650000001800028008000100000000010c00028008000100004000002400018009\
         0001006d6574610000000014000280080002000000000308000300000000013000 01800e000100696d6d656469617465\
         0000001c0002800800010000000000100002800c0002800800010 0fffffffb",
    );
    let exprs2 = vec![
        Expr::Immediate {
            dreg: Reg(1),
            data: ImmediateData::Value(0x4000u32.to_ne_bytes().to_vec()),
        },
        Expr::MetaSet {
            key: MetaKey::Mark,
            sreg: Reg(1),
        },
        Expr::Immediate {
            dreg: Reg::VERDICT,
            data: ImmediateData::Verdict(Verdict::Return),
        },
    ];
    assert_eq!(hex(&encode_exprs(&exprs2)), hex(&nft2));
}

/// `numgen random mod 2` (first expression of `numgen random mod 2 vmap { … }`).
#[test]
fn numgen_matches_nft() {
    let nft = unhex(
        "340001800b0001006e756d67656e0000240002800800010000000001080002000000000208000300000000010800040000000000",
    );
    let exprs = vec![Expr::NumgenRandom {
        dreg: Reg(1),
        modulus: 2,
        offset: 0,
    }];
    assert_eq!(hex(&encode_exprs(&exprs)), hex(&nft));
}

#[test]
fn fingerprint_and_comment() {
    let rule = Rule {
        chain: "c".into(),
        exprs: vec![Expr::Counter],
        comment: Some("x".repeat(300)),
    };
    // The comment is for people only: no fingerprint tag in it any more.
    let c = rule_comment(&rule);
    assert!(c.len() < 128, "{}", c.len());
    assert!(!c.contains('#'));
    let bare = Rule {
        comment: None,
        ..rule.clone()
    };
    assert_eq!(rule_comment(&bare), "");
    // The fingerprint covers the comment too: a new comment rewrites the chain.
    assert_ne!(rule_fingerprint(&bare), rule_fingerprint(&rule));
    let other = Rule {
        exprs: vec![Expr::Masquerade {
            fully_random: false,
        }],
        ..rule.clone()
    };
    assert_ne!(rule_fingerprint(&other), rule_fingerprint(&rule));
    // An old (pre-userdata) comment still parses into its two parts.
    let old = format!("masquerade #{:016x}", 0x1234u64);
    assert_eq!(
        parse_comment(&old),
        ("masquerade".to_string(), Some(0x1234))
    );
    // multibyte truncation stays on a char boundary
    let uni = Rule {
        chain: "c".into(),
        exprs: vec![],
        comment: Some("é".repeat(200)),
    };
    assert!(rule_comment(&uni).len() < 128);
}

#[test]
fn op_display_is_nft_like() {
    let op = Op::AddChain {
        family: Family::Ipv4,
        table: "t".into(),
        chain: Chain {
            name: "pre".into(),
            base: Some(BaseChain {
                kind: ChainType::Nat,
                hook: Hook::Prerouting,
                priority: -100,
            }),
            comment: None,
        },
    };
    assert_eq!(
        op.to_string(),
        "add chain ip t pre { type nat hook prerouting priority -100; }"
    );
    let op = Op::AddElements {
        family: Family::Ipv6,
        table: "t".into(),
        set: "m".into(),
        elements: vec![Element {
            key: vec![
                KeyValue::Addr("fd00::1".parse().unwrap()),
                KeyValue::Proto(6),
                KeyValue::Port(80),
            ],
            verdict: Some(Verdict::Jump("svc".into())),
            data: Vec::new(),
            comment: None,
        }],
    };
    assert_eq!(
        op.to_string(),
        "add element ip6 t m { fd00::1 . tcp . 80 : jump svc }"
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
