//! Ops covering every message and expression kind, for the whole-batch golden test.

use super::socket::Op;
use super::types::*;

fn chain(name: &str, base: Option<(ChainType, Hook, i32)>) -> Chain {
    Chain {
        name: name.into(),
        base: base.map(|(kind, hook, priority)| BaseChain {
            kind,
            hook,
            priority,
        }),
        comment: None,
    }
}

pub(crate) fn ops() -> Vec<Op> {
    let mut ops = Vec::new();
    for family in [Family::Ipv4, Family::Ipv6] {
        let t = "kube-nlproxy".to_string();
        let a = KeyType::addr(family);
        let (svc, ep): (std::net::IpAddr, Vec<u8>) = if family == Family::Ipv4 {
            ("10.0.0.1".parse().unwrap(), vec![10, 1, 0, 1])
        } else {
            ("fd00::1".parse().unwrap(), {
                let x: std::net::Ipv6Addr = "fd01::1".parse().unwrap();
                x.octets().to_vec()
            })
        };
        ops.push(Op::AddTable {
            family,
            name: t.clone(),
        });
        for c in [
            chain("prerouting", Some((ChainType::Nat, Hook::Prerouting, -100))),
            chain("output", Some((ChainType::Nat, Hook::Output, -100))),
            chain(
                "postrouting",
                Some((ChainType::Nat, Hook::Postrouting, 100)),
            ),
            chain("input", Some((ChainType::Filter, Hook::Input, 0))),
            chain("forward", Some((ChainType::Filter, Hook::Forward, -1))),
            chain("services", None),
            chain("svc-a", None),
        ] {
            ops.push(Op::AddChain {
                family,
                table: t.clone(),
                chain: c,
            });
        }
        for set in [
            Set {
                name: "service-ips".into(),
                key: vec![a, KeyType::InetProto, KeyType::InetService],
                verdict_map: true,
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
            Set {
                name: "ports".into(),
                key: vec![KeyType::InetService],
                verdict_map: true,
                data: Vec::new(),
                flags: SetFlags::default(),
                timeout_ms: None,
            },
        ] {
            ops.push(Op::AddSet {
                family,
                table: t.clone(),
                set,
            });
        }
        let key = |proto: u8, port: u16| {
            vec![
                KeyValue::Addr(svc),
                KeyValue::Proto(proto),
                KeyValue::Port(port),
            ]
        };
        let verdicts = [
            Verdict::Accept,
            Verdict::Drop,
            Verdict::Return,
            Verdict::Continue,
            Verdict::Jump("svc-a".into()),
            Verdict::Goto("svc-a".into()),
        ];
        let elements: Vec<Element> = verdicts
            .iter()
            .enumerate()
            .map(|(i, v)| Element {
                key: key(6 + i as u8, 80 + i as u16),
                verdict: Some(v.clone()),
                data: Vec::new(),
                comment: None,
            })
            .collect();
        ops.push(Op::AddElements {
            family,
            table: t.clone(),
            set: "service-ips".into(),
            elements: elements.clone(),
        });
        ops.push(Op::AddElements {
            family,
            table: t.clone(),
            set: "marks".into(),
            elements: vec![Element {
                key: vec![KeyValue::Mark(0x4000)],
                verdict: None,
                data: Vec::new(),
                comment: None,
            }],
        });
        ops.push(Op::DeleteElements {
            family,
            table: t.clone(),
            set: "service-ips".into(),
            elements,
        });
        let nfproto = family.nfproto();
        let exprs = vec![
            Expr::Meta {
                key: MetaKey::NfProto,
                dreg: Reg(1),
            },
            Expr::Cmp {
                sreg: Reg(1),
                op: CmpOp::Eq,
                data: vec![nfproto],
            },
            Expr::Meta {
                key: MetaKey::IifName,
                dreg: Reg(1),
            },
            Expr::Cmp {
                sreg: Reg(1),
                op: CmpOp::Neq,
                data: b"lo\0".to_vec(),
            },
            Expr::Meta {
                key: MetaKey::OifName,
                dreg: Reg(2),
            },
            Expr::Cmp {
                sreg: Reg(2),
                op: CmpOp::Lt,
                data: vec![1],
            },
            Expr::Cmp {
                sreg: Reg(2),
                op: CmpOp::Lte,
                data: vec![1],
            },
            Expr::Cmp {
                sreg: Reg(2),
                op: CmpOp::Gt,
                data: vec![1],
            },
            Expr::Cmp {
                sreg: Reg(2),
                op: CmpOp::Gte,
                data: vec![1],
            },
            Expr::Payload {
                base: PayloadBase::LinkLayer,
                offset: 0,
                len: 6,
                dreg: Reg(1),
            },
            Expr::Payload {
                base: PayloadBase::Network,
                offset: 16,
                len: family.addr_len(),
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
                set: "service-ips".into(),
                sreg: Reg(1),
                dreg: Some(Reg::VERDICT),
                invert: false,
            },
            Expr::Lookup {
                set: "marks".into(),
                sreg: Reg(1),
                dreg: None,
                invert: true,
            },
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
            Expr::MetaSet {
                key: MetaKey::Mark,
                sreg: Reg(1),
            },
            Expr::NumgenRandom {
                dreg: Reg(1),
                modulus: 3,
                offset: 1,
            },
            Expr::Fib {
                addr: FibAddr::Source,
                result: FibResult::AddrType,
                dreg: Reg(1),
            },
            Expr::Fib {
                addr: FibAddr::Destination,
                result: FibResult::AddrType,
                dreg: Reg(1),
            },
            Expr::Ct {
                key: CtKey::State,
                dreg: Reg(1),
            },
            Expr::Immediate {
                dreg: Reg(1),
                data: ImmediateData::Value(ep.clone()),
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
            Expr::Dnat {
                family,
                reg_addr: Reg(1),
                reg_port: None,
            },
            Expr::Masquerade { fully_random: true },
            Expr::Masquerade {
                fully_random: false,
            },
            Expr::Reject(RejectKind::IcmpUnreach(3)),
            Expr::Reject(RejectKind::TcpRst),
            Expr::Counter,
            Expr::Dynset {
                op: DynsetOp::Update,
                set: "aff".into(),
                sreg_key: Reg(1),
                sreg_data: None,
                timeout_ms: Some(10_800_000),
            },
            Expr::Dynset {
                op: DynsetOp::Add,
                set: "aff".into(),
                sreg_key: Reg(1),
                sreg_data: None,
                timeout_ms: None,
            },
        ];
        let mut rules = vec![Rule {
            chain: "services".into(),
            exprs: exprs.clone(),
            comment: Some("all expressions".into()),
        }];
        for v in verdicts {
            rules.push(Rule {
                chain: "svc-a".into(),
                exprs: vec![Expr::Immediate {
                    dreg: Reg::VERDICT,
                    data: ImmediateData::Verdict(v),
                }],
                comment: None,
            });
        }
        for rule in rules {
            ops.push(Op::AddRule {
                family,
                table: t.clone(),
                rule,
            });
        }
        ops.push(Op::FlushChain {
            family,
            table: t.clone(),
            name: "svc-a".into(),
        });
        ops.push(Op::DeleteChain {
            family,
            table: t.clone(),
            name: "svc-a".into(),
        });
        ops.push(Op::DeleteSet {
            family,
            table: t.clone(),
            name: "aff".into(),
        });
        ops.push(Op::DeleteTable { family, name: t });
    }
    ops
}

/// One large `add element` and `delete element` (split into several messages each).
pub(crate) fn ops_many() -> Vec<Op> {
    let many: Vec<Element> = (0..3000u16)
        .map(|i| Element {
            key: vec![KeyValue::Port(i)],
            verdict: Some(Verdict::Jump("svc-a".into())),
            data: Vec::new(),
            comment: None,
        })
        .collect();
    vec![
        Op::AddElements {
            family: Family::Ipv4,
            table: "t".into(),
            set: "ports".into(),
            elements: many.clone(),
        },
        Op::DeleteElements {
            family: Family::Ipv4,
            table: "t".into(),
            set: "ports".into(),
            elements: many,
        },
    ]
}
