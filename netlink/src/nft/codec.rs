//! Our nf_tables object model as typed netlink messages, and back.
//!
//! Messages are netlink-packet-netfilter's `NfTablesMessage`s (table, chain, rule,
//! set, set element, generation) framed by netlink-packet-core's `NetlinkMessage`.
//! The expressions it types (`payload`, `meta`, `cmp`, `bitwise`, `lookup`,
//! `immediate`) use its attribute enums; the others use our own attribute enums in
//! `nft/attrs.rs`, sent through its `Expressions::Other`.
//!
//! Attributes are built in the same order and with the same flags (`NLA_F_NESTED`
//! on nests, NUL-terminated strings, big-endian integers) as `nft` 1.0.x via
//! libnftnl, so the rule bytes we send are what `nft` would send.

use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REQUEST,
    NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla,
};
use netlink_packet_netfilter::nftables::{self as nl, ExpressionAttribute, ListAttribute};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

use super::attrs::*;
use super::types::*;

// ---- constants from linux/netfilter/nf_tables.h and nfnetlink.h ----

/// `NFNL_SUBSYS_NFTABLES`: the `res_id` of batch begin/end messages.
const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// `NFTNL_UDATA_RULE_COMMENT` in a rule's userdata TLVs (libnftnl).
const NFTNL_UDATA_RULE_COMMENT: u8 = 0;
/// `NFTNL_UDATA_SET_KEYBYTEORDER` in a set's userdata TLVs (libnftnl).
const NFTNL_UDATA_SET_KEYBYTEORDER: u8 = 0;
/// `NFTNL_UDATA_SET_DATABYTEORDER` in a set's userdata TLVs (libnftnl).
const NFTNL_UDATA_SET_DATABYTEORDER: u8 = 1;
/// `NFTNL_UDATA_SET_ELEM_COMMENT` in an element's userdata TLVs (libnftnl).
const NFTNL_UDATA_SET_ELEM_COMMENT: u8 = 0;
/// `NFTNL_UDATA_CHAIN_COMMENT` in a chain's userdata TLVs (libnftnl).
const NFTNL_UDATA_CHAIN_COMMENT: u8 = 0;
/// Our own TLV in a rule's userdata: the rule's fingerprint, 8 bytes big-endian.
/// libnftnl defines rule TLVs 0 (comment) and 1 (ebtables policy); nft's parse
/// callback skips every other type, so `nft list` prints the comment alone
/// (checked against nft 1.0.6 in `tests/netlink_nft_kernel.rs`).
pub const KNLP_UDATA_RULE_FINGERPRINT: u8 = 0xf0;
/// `NFTA_SET_DESC_CONCAT`
const NFTA_SET_DESC_CONCAT: u16 = 2;

/// `NFT_DATA_VERDICT`: the data type of a verdict map.
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
/// `NFT_LOOKUP_F_INV`
const NFT_LOOKUP_F_INV: u32 = 0x1;

/// `NF_DROP` (netfilter verdict, not typed by the crate's `Verdict`).
const NF_DROP: u32 = 0;
/// `NF_ACCEPT` (netfilter verdict, not typed by the crate's `Verdict`).
const NF_ACCEPT: u32 = 1;

/// Bits per field in nft's concatenated datatype numbering.
const TYPE_BITS: u32 = 6;

/// Longest comment (including the NUL) we store in a rule's userdata.
pub const MAX_COMMENT_LEN: usize = 128;

/// Soft limit for one element message; the kernel caps one attribute at 64 KiB.
const ELEM_MSG_SOFT_LIMIT: usize = 32 * 1024;

// ---- framing ----

/// A netlink message carrying `msg` for `family`, sequence `seq`, `NLM_F_REQUEST | flags`.
pub(crate) fn nft_request(
    family: u8,
    res_id: u16,
    flags: u16,
    seq: u32,
    msg: impl Into<netlink_packet_netfilter::NetfilterMessageInner>,
) -> NetlinkMessage<NetfilterMessage> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = seq;
    let inner = NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::from(family), 0, res_id),
        msg,
    );
    let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(inner));
    m.finalize();
    m
}

/// `NFNL_MSG_BATCH_BEGIN` / `_END` (`res_id` = `NFNL_SUBSYS_NFTABLES`).
pub(crate) fn batch_marker(
    msg: netlink_packet_netfilter::none::ControlMessage,
    seq: u32,
) -> NetlinkMessage<NetfilterMessage> {
    nft_request(0, NFNL_SUBSYS_NFTABLES, 0, seq, msg)
}

/// Append the serialized `msg` to `buf`.
pub(crate) fn serialize_into(buf: &mut Vec<u8>, msg: &NetlinkMessage<NetfilterMessage>) {
    let start = buf.len();
    buf.resize(start + msg.buffer_len(), 0);
    msg.serialize(&mut buf[start..]);
}

// ---- expressions ----

fn reg(r: Reg) -> nl::Register {
    nl::Register::from(r.0)
}

pub(crate) fn verdict_attrs(v: &Verdict) -> Vec<nl::VerdictAttribute> {
    let code = match v {
        Verdict::Accept => nl::Verdict::Other(NF_ACCEPT),
        Verdict::Drop => nl::Verdict::Other(NF_DROP),
        Verdict::Return => nl::Verdict::Return,
        Verdict::Continue => nl::Verdict::Continue,
        Verdict::Jump(_) => nl::Verdict::Jump,
        Verdict::Goto(_) => nl::Verdict::Goto,
    };
    let mut attrs = vec![nl::VerdictAttribute::Code(code)];
    if let Some(c) = v.chain() {
        attrs.push(nl::VerdictAttribute::Chain(c.to_string()));
    }
    attrs
}

fn payload_base(b: PayloadBase) -> u32 {
    match b {
        PayloadBase::LinkLayer => 0, // NFT_PAYLOAD_LL_HEADER
        PayloadBase::Network => 1,   // NFT_PAYLOAD_NETWORK_HEADER
        PayloadBase::Transport => 2, // NFT_PAYLOAD_TRANSPORT_HEADER
    }
}

fn meta_key(k: MetaKey) -> nl::MetaKey {
    match k {
        MetaKey::Mark => nl::MetaKey::Mark,
        MetaKey::IifName => nl::MetaKey::Iifname,
        MetaKey::OifName => nl::MetaKey::Oifname,
        MetaKey::NfProto => nl::MetaKey::Nfproto,
        MetaKey::L4Proto => nl::MetaKey::L4Proto,
    }
}

fn cmp_op(op: CmpOp) -> nl::Operator {
    match op {
        CmpOp::Eq => nl::Operator::Equal,
        CmpOp::Neq => nl::Operator::NotEqual,
        CmpOp::Lt => nl::Operator::LessThan,
        CmpOp::Lte => nl::Operator::LessThanEqual,
        CmpOp::Gt => nl::Operator::GreaterThan,
        CmpOp::Gte => nl::Operator::GreatherThanEqual,
    }
}

fn value(bytes: &[u8]) -> nl::DataAttribute {
    nl::DataAttribute::Value(bytes.to_vec())
}

/// One expression (a complete `NFTA_LIST_ELEM`), attributes in libnftnl's order.
pub(crate) fn encode_expr(e: &Expr) -> ListAttribute<ExpressionAttribute> {
    use nl::Expressions as X;
    match e {
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        } => X::Payload(vec![
            nl::Payload::DestinationRegister(reg(*dreg)),
            nl::Payload::Base(payload_base(*base)),
            nl::Payload::Offset(*offset),
            nl::Payload::Len(*len),
        ])
        .into(),
        Expr::Meta { key, dreg } => X::Meta(vec![
            nl::Meta::Key(meta_key(*key)),
            nl::Meta::DestinationRegister(reg(*dreg)),
        ])
        .into(),
        Expr::MetaSet { key, sreg } => X::Meta(vec![
            nl::Meta::Key(meta_key(*key)),
            nl::Meta::SourceRegister(reg(*sreg)),
        ])
        .into(),
        Expr::Cmp { sreg, op, data } => X::Cmp(vec![
            nl::Cmp::SourceRegister(reg(*sreg)),
            nl::Cmp::Op(cmp_op(*op)),
            nl::Cmp::Data(value(data)),
        ])
        .into(),
        Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
        } => X::Bitwise(vec![
            nl::Bitwise::SourceRegister(reg(*sreg)),
            nl::Bitwise::DestinationRegister(reg(*dreg)),
            nl::Bitwise::Length(mask.len() as u32),
            nl::Bitwise::Mask(value(mask)),
            nl::Bitwise::Xor(value(xor)),
        ])
        .into(),
        Expr::Lookup {
            set,
            sreg,
            dreg,
            invert,
        } => {
            let mut a = vec![nl::Lookup::SourceRegister(reg(*sreg))];
            if let Some(d) = dreg {
                a.push(nl::Lookup::DestinationRegister(reg(*d)));
            }
            a.push(nl::Lookup::Set(set.clone()));
            if *invert {
                a.push(nl::Lookup::Flags(NFT_LOOKUP_F_INV));
            }
            X::Lookup(a).into()
        }
        Expr::Immediate { dreg, data } => X::Immediate(vec![
            nl::Immediate::DestinationRegister(reg(*dreg)),
            nl::Immediate::Data(match data {
                ImmediateData::Verdict(v) => nl::DataAttribute::Verdict(verdict_attrs(v)),
                ImmediateData::Value(b) => value(b),
            }),
        ])
        .into(),
        Expr::NumgenRandom {
            dreg,
            modulus,
            offset,
        } => own_expr(
            "numgen",
            &[
                NumgenAttr::Dreg(dreg.0),
                NumgenAttr::Modulus(*modulus),
                NumgenAttr::Type(NFT_NG_RANDOM),
                NumgenAttr::Offset(*offset),
            ],
        ),
        Expr::Fib { addr, result, dreg } => {
            let flags = match addr {
                FibAddr::Source => NFTA_FIB_F_SADDR,
                FibAddr::Destination => NFTA_FIB_F_DADDR,
            };
            let res = match result {
                FibResult::AddrType => NFT_FIB_RESULT_ADDRTYPE,
            };
            own_expr(
                "fib",
                &[
                    FibAttr::Flags(flags),
                    FibAttr::Result(res),
                    FibAttr::Dreg(dreg.0),
                ],
            )
        }
        Expr::Ct { key, dreg } => {
            let (k, original) = match key {
                CtKey::State => (NFT_CT_STATE, false),
                CtKey::Status => (NFT_CT_STATUS, false),
                CtKey::OriginalDstIp => (NFT_CT_DST_IP, true),
                CtKey::OriginalDstIp6 => (NFT_CT_DST_IP6, true),
                CtKey::OriginalProtoDst => (NFT_CT_PROTO_DST, true),
            };
            let mut a = vec![CtAttr::Key(k)];
            if original {
                a.push(CtAttr::Direction(IP_CT_DIR_ORIGINAL));
            }
            a.push(CtAttr::Dreg(dreg.0));
            own_expr("ct", &a)
        }
        Expr::Dnat {
            family,
            reg_addr,
            reg_port,
        } => {
            let mut a = vec![
                NatAttr::Type(NFT_NAT_DNAT),
                NatAttr::Family(u32::from(family.nfproto())),
                NatAttr::RegAddrMin(reg_addr.0),
            ];
            if let Some(p) = reg_port {
                a.push(NatAttr::RegProtoMin(p.0));
                // as nft sends it
                a.push(NatAttr::Flags(NF_NAT_RANGE_PROTO_SPECIFIED));
            }
            own_expr("nat", &a)
        }
        Expr::Masquerade { fully_random } => {
            let a: &[MasqAttr] = if *fully_random {
                &[MasqAttr::Flags(NF_NAT_RANGE_PROTO_RANDOM_FULLY)]
            } else {
                &[]
            };
            own_expr("masq", a)
        }
        Expr::Reject(kind) => {
            let (ty, code) = match kind {
                RejectKind::IcmpUnreach(code) => (NFT_REJECT_ICMP_UNREACH, *code),
                RejectKind::TcpRst => (NFT_REJECT_TCP_RST, 0),
            };
            own_expr(
                "reject",
                &[RejectAttr::Type(ty), RejectAttr::IcmpCode(code)],
            )
        }
        Expr::Counter => own_expr::<DefaultNla>("counter", &[]),
        Expr::Dynset {
            op,
            set,
            sreg_key,
            sreg_data,
            timeout_ms,
        } => {
            let o = match op {
                DynsetOp::Add => NFT_DYNSET_OP_ADD,
                DynsetOp::Update => NFT_DYNSET_OP_UPDATE,
                DynsetOp::Delete => NFT_DYNSET_OP_DELETE,
            };
            let mut a = vec![DynsetAttr::SregKey(sreg_key.0)];
            if let Some(d) = sreg_data {
                a.push(DynsetAttr::SregData(d.0));
            }
            a.push(DynsetAttr::Op(o));
            if let Some(ms) = timeout_ms {
                a.push(DynsetAttr::Timeout(*ms));
            }
            a.push(DynsetAttr::SetName(set.clone()));
            own_expr("dynset", &a)
        }
    }
}

fn expr_list(exprs: &[Expr]) -> Vec<ListAttribute<ExpressionAttribute>> {
    exprs.iter().map(encode_expr).collect()
}

/// The content of `NFTA_RULE_EXPRESSIONS` for a list of expressions.
pub fn encode_exprs(exprs: &[Expr]) -> Vec<u8> {
    emit_all(&expr_list(exprs))
}

/// FNV-1a 64 over bytes.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Fingerprint of a rule: FNV-1a 64 over its encoded expressions and then its
/// comment (as stored), so a changed expression or comment rewrites the chain.
/// Stored in the rule's userdata as our own TLV ([`KNLP_UDATA_RULE_FINGERPRINT`]),
/// which `nft list` does not print.
pub fn rule_fingerprint(rule: &Rule) -> u64 {
    fingerprint_of(&encode_exprs(&rule.exprs), rule.comment.as_deref())
}

fn fingerprint_of(expr_bytes: &[u8], comment: Option<&str>) -> u64 {
    let mut bytes = expr_bytes.to_vec();
    if let Some(c) = comment {
        bytes.push(0xff);
        bytes.extend_from_slice(truncated(c).as_bytes());
    }
    fnv1a64(&bytes)
}

/// The comment we store for a rule (cut to [`MAX_COMMENT_LEN`] - 1 bytes at a
/// char boundary): what `nft list` prints.
pub fn rule_comment(rule: &Rule) -> String {
    rule.comment
        .as_deref()
        .map(truncated)
        .unwrap_or_default()
        .to_string()
}

fn truncated(c: &str) -> &str {
    let mut end = c.len().min(MAX_COMMENT_LEN - 1);
    while !c.is_char_boundary(end) {
        end -= 1;
    }
    &c[..end]
}

/// Split a comment written by kube-nlproxy before 0.2 (`"<human> #<16 hex>"`,
/// the fingerprint inside the comment) into its human part and fingerprint.
/// Such a fingerprint never equals a current one (those include the comment), so
/// an adopted old table gets its chains rewritten once, elements kept.
pub fn parse_comment(comment: &str) -> (String, Option<u64>) {
    let (human, tag) = match comment.rfind('#') {
        Some(i) => (&comment[..i], &comment[i + 1..]),
        None => return (comment.to_string(), None),
    };
    if tag.len() != 16 || !tag.bytes().all(|b| b.is_ascii_hexdigit()) {
        return (comment.to_string(), None);
    }
    match u64::from_str_radix(tag, 16) {
        Ok(fp) => (
            human.strip_suffix(' ').unwrap_or(human).to_string(),
            Some(fp),
        ),
        Err(_) => (comment.to_string(), None),
    }
}

/// nft's datatype number of a set key (concatenations: `(acc << 6) | type`).
pub fn set_key_type(key: &[KeyType]) -> u32 {
    key.iter()
        .fold(0, |acc, k| (acc << TYPE_BITS) | k.nft_type())
}

/// A rule's userdata: the comment TLV nft reads (when there is a comment), then
/// our fingerprint TLV.
fn rule_userdata(comment: Option<&str>, fp: u64) -> Vec<u8> {
    let mut v = match comment {
        Some(c) => comment_userdata(NFTNL_UDATA_RULE_COMMENT, c),
        None => Vec::new(),
    };
    v.extend_from_slice(&[KNLP_UDATA_RULE_FINGERPRINT, 8]);
    v.extend_from_slice(&fp.to_be_bytes());
    v
}

// ---- objects ----

fn set_flags(set: &Set) -> nl::SetFlags {
    let mut f = nl::SetFlags::empty();
    if set.is_map() {
        f |= nl::SetFlags::Map;
    }
    if set.key.len() > 1 {
        f |= nl::SetFlags::Concat;
    }
    if set.flags.timeout {
        f |= nl::SetFlags::Timeout;
    }
    if set.flags.dynamic {
        f |= nl::SetFlags::Eval;
    }
    f
}

fn table_msg(attributes: Vec<nl::TableAttribute>) -> nl::TableMessage {
    nl::TableMessage { attributes }
}

fn chain_msg(attributes: Vec<nl::ChainAttribute>) -> nl::ChainMessage {
    nl::ChainMessage { attributes }
}

fn rule_msg(attributes: Vec<nl::RuleAttribute>) -> nl::RuleMessage {
    nl::RuleMessage { attributes }
}

fn set_msg(attributes: Vec<nl::SetAttribute>) -> nl::SetMessage {
    nl::SetMessage { attributes }
}

fn elem_msg(attributes: Vec<nl::SetElementList>) -> nl::SetElementMessage {
    nl::SetElementMessage { attributes }
}

/// `NEWTABLE { NAME, FLAGS 0 }`.
pub(crate) fn new_table(name: &str) -> nl::NfTablesMessage {
    nl::NfTablesMessage::NewTable(table_msg(vec![
        nl::TableAttribute::Name(name.to_string()),
        nl::TableAttribute::Flags(nl::TableFlags::empty()),
    ]))
}

/// `DELTABLE { NAME }`.
pub(crate) fn delete_table(name: &str) -> nl::NfTablesMessage {
    nl::NfTablesMessage::DeleteTable(table_msg(vec![nl::TableAttribute::Name(name.to_string())]))
}

/// `GETTABLE { NAME }`.
pub(crate) fn get_table(name: &str) -> nl::NfTablesMessage {
    nl::NfTablesMessage::GetTable(table_msg(vec![nl::TableAttribute::Name(name.to_string())]))
}

/// `NEWCHAIN { TABLE, NAME, [TYPE, HOOK { HOOKNUM, PRIORITY }] }`.
pub(crate) fn new_chain(table: &str, chain: &Chain) -> nl::NfTablesMessage {
    let mut a = vec![
        nl::ChainAttribute::Table(table.to_string()),
        nl::ChainAttribute::Name(chain.name.clone()),
    ];
    if let Some(b) = &chain.base {
        a.push(nl::ChainAttribute::Type(b.kind.name().to_string()));
        a.push(nl::ChainAttribute::Hook(vec![
            nl::Hook::Number(nl::HookNumber::Inet(b.hook.number().into())),
            // The crate types the (signed) priority as u32; same bytes.
            nl::Hook::Priority(b.priority as u32),
        ]));
    }
    if let Some(c) = &chain.comment {
        a.push(nl::ChainAttribute::UserData(comment_userdata(
            NFTNL_UDATA_CHAIN_COMMENT,
            c,
        )));
    }
    nl::NfTablesMessage::NewChain(chain_msg(a))
}

/// `DELCHAIN { TABLE, NAME }`.
pub(crate) fn delete_chain(table: &str, name: &str) -> nl::NfTablesMessage {
    nl::NfTablesMessage::DeleteChain(chain_msg(vec![
        nl::ChainAttribute::Table(table.to_string()),
        nl::ChainAttribute::Name(name.to_string()),
    ]))
}

/// `GETCHAIN { TABLE }` (dump).
pub(crate) fn get_chains(table: &str) -> nl::NfTablesMessage {
    nl::NfTablesMessage::GetChain(chain_msg(vec![nl::ChainAttribute::Table(
        table.to_string(),
    )]))
}

/// `NEWRULE { TABLE, CHAIN, EXPRESSIONS, USERDATA }` (nft's order); the
/// userdata holds the comment and the fingerprint (see [`rule_fingerprint`]).
pub(crate) fn new_rule(table: &str, rule: &Rule) -> nl::NfTablesMessage {
    let exprs = expr_list(&rule.exprs);
    let fp = fingerprint_of(&emit_all(&exprs), rule.comment.as_deref());
    nl::NfTablesMessage::NewRule(rule_msg(vec![
        nl::RuleAttribute::Table(table.to_string()),
        nl::RuleAttribute::Chain(rule.chain.clone()),
        nl::RuleAttribute::Expressions(exprs),
        nl::RuleAttribute::UserData(rule_userdata(rule.comment.as_deref(), fp)),
    ]))
}

/// `DELRULE { TABLE, CHAIN }`: flush a chain.
pub(crate) fn flush_chain(table: &str, chain: &str) -> nl::NfTablesMessage {
    nl::NfTablesMessage::DeleteRule(rule_msg(vec![
        nl::RuleAttribute::Table(table.to_string()),
        nl::RuleAttribute::Chain(chain.to_string()),
    ]))
}

/// `DELRULE { TABLE, CHAIN, HANDLE }`: delete one rule.
pub(crate) fn delete_rule(table: &str, chain: &str, handle: u64) -> nl::NfTablesMessage {
    nl::NfTablesMessage::DeleteRule(rule_msg(vec![
        nl::RuleAttribute::Table(table.to_string()),
        nl::RuleAttribute::Chain(chain.to_string()),
        nl::RuleAttribute::Handle(handle),
    ]))
}

/// A rule of any table, as far as removing it needs: its place and the chains
/// its `immediate` verdicts jump to or go to (`-j CHAIN` of iptables-nft, `jump`
/// and `goto` of nft). Other expressions (`match`, `target` of xtables, …) are
/// not looked at.
pub(crate) fn parse_foreign_rule(m: &nl::RuleMessage) -> Option<ForeignRule> {
    let (mut table, mut chain, mut handle) = (None, None, None);
    let mut jumps_to = Vec::new();
    for a in &m.attributes {
        match a {
            nl::RuleAttribute::Table(t) => table = Some(t.clone()),
            nl::RuleAttribute::Chain(c) => chain = Some(c.clone()),
            nl::RuleAttribute::Handle(h) => handle = Some(*h),
            nl::RuleAttribute::Expressions(exprs) => {
                for e in exprs {
                    let ListAttribute::Element(attrs) = e else {
                        continue;
                    };
                    for attr in attrs {
                        let ExpressionAttribute::Data(nl::Expressions::Immediate(imm)) = attr
                        else {
                            continue;
                        };
                        for i in imm {
                            let nl::Immediate::Data(nl::DataAttribute::Verdict(v)) = i else {
                                continue;
                            };
                            jumps_to.extend(v.iter().filter_map(|v| match v {
                                nl::VerdictAttribute::Chain(c) => Some(c.clone()),
                                _ => None,
                            }));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Some(ForeignRule {
        table: table?,
        chain: chain?,
        handle: handle?,
        jumps_to,
    })
}

/// `GETRULE { TABLE }` (dump).
pub(crate) fn get_rules(table: &str) -> nl::NfTablesMessage {
    nl::NfTablesMessage::GetRule(rule_msg(vec![nl::RuleAttribute::Table(table.to_string())]))
}

/// `NEWSET`, attributes in nft's order.
pub(crate) fn new_set(table: &str, set: &Set, id: u32) -> nl::NfTablesMessage {
    let mut a = vec![
        nl::SetAttribute::Table(table.to_string()),
        nl::SetAttribute::Name(set.name.clone()),
        nl::SetAttribute::Flags(set_flags(set)),
        nl::SetAttribute::KeyType(set_key_type(&set.key)),
        nl::SetAttribute::KeyLen(set.key_len()),
    ];
    if set.verdict_map {
        a.push(nl::SetAttribute::DataType(NFT_DATA_VERDICT));
        // as nft: the kernel uses sizeof(verdict)
        a.push(nl::SetAttribute::DataLen(0));
    } else if !set.data.is_empty() {
        a.push(nl::SetAttribute::DataType(set_key_type(&set.data)));
        a.push(nl::SetAttribute::DataLen(set.data_len()));
    }
    a.push(nl::SetAttribute::Id(id));
    if let Some(ms) = set.timeout_ms {
        a.push(nl::SetAttribute::Timeout(ms));
    }
    if set.key.len() > 1 {
        let fields: Vec<ListAttribute<SetFieldAttr>> = set
            .key
            .iter()
            .map(|k| ListAttribute::Element(vec![SetFieldAttr::Len(k.len())]))
            .collect();
        // The crate's `SetDescription::Concat` emits NFTA_SET_DESC_CONCAT without
        // NLA_F_NESTED; nft sends it nested, so we send it as `Other` with the flag.
        a.push(nl::SetAttribute::Description(vec![
            nl::SetDescription::Other(DefaultNla::new(
                NFTA_SET_DESC_CONCAT | NLA_F_NESTED,
                emit_all(&fields),
            )),
        ]));
    }
    // nft's key byte order hint (BYTEORDER_HOST_ENDIAN = 1, BIG_ENDIAN = 2, 0 for
    // concatenations), so `nft list` prints e.g. marks the right way round.
    let order: u32 = match set.key.as_slice() {
        [KeyType::Mark] => 1,
        [_] => 2,
        _ => 0,
    };
    let mut ud = vec![NFTNL_UDATA_SET_KEYBYTEORDER, 4];
    ud.extend_from_slice(&order.to_ne_bytes());
    if !set.data.is_empty() {
        let order: u32 = match set.data.as_slice() {
            [KeyType::Mark] => 1,
            [_] => 2,
            _ => 0,
        };
        ud.extend_from_slice(&[NFTNL_UDATA_SET_DATABYTEORDER, 4]);
        ud.extend_from_slice(&order.to_ne_bytes());
    }
    a.push(nl::SetAttribute::UserData(ud));
    nl::NfTablesMessage::NewSet(set_msg(a))
}

/// `DELSET { TABLE, NAME }`.
pub(crate) fn delete_set(table: &str, name: &str) -> nl::NfTablesMessage {
    nl::NfTablesMessage::DeleteSet(set_msg(vec![
        nl::SetAttribute::Table(table.to_string()),
        nl::SetAttribute::Name(name.to_string()),
    ]))
}

/// `GETSET { TABLE }` (dump).
pub(crate) fn get_sets(table: &str) -> nl::NfTablesMessage {
    nl::NfTablesMessage::GetSet(set_msg(vec![nl::SetAttribute::Table(table.to_string())]))
}

/// Appends one netlink attribute to `buf`: its header, the value `value`
/// writes, and the padding to four bytes. The header's length covers the
/// value (a nested value's own attributes come padded).
fn push_nla(buf: &mut Vec<u8>, kind: u16, value: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    value(buf);
    let len = buf.len() - start;
    buf[start..start + 2].copy_from_slice(&(len as u16).to_ne_bytes());
    buf[start + 2..start + 4].copy_from_slice(&kind.to_ne_bytes());
    buf.resize(start + len.div_ceil(4) * 4, 0);
}

/// Appends `fields` in the kernel's padded, concatenated layout (as
/// [`Element::key_bytes`]) without building them first.
fn push_fields(buf: &mut Vec<u8>, fields: &[KeyValue]) {
    for f in fields {
        let start = buf.len();
        match f {
            KeyValue::Addr(std::net::IpAddr::V4(a)) => buf.extend_from_slice(&a.octets()),
            KeyValue::Addr(std::net::IpAddr::V6(a)) => buf.extend_from_slice(&a.octets()),
            KeyValue::Proto(p) => buf.push(*p),
            KeyValue::Port(p) => buf.extend_from_slice(&p.to_be_bytes()),
            KeyValue::Mark(m) => buf.extend_from_slice(&m.to_ne_bytes()),
        }
        buf.resize(start + (buf.len() - start).div_ceil(4) * 4, 0);
    }
}

/// One element, `NFTA_LIST_ELEM { KEY { VALUE }, DATA { VERDICT | VALUE }?,
/// USERDATA? }` (data and comment only when adding), written straight into
/// `buf`: the crate's typed attributes recompute every nested length at each
/// level they are emitted from, a fifth of a big cold start's encoding.
/// `element_bytes_match_the_typed_attributes` holds the two to the same bytes.
pub(crate) fn push_element(buf: &mut Vec<u8>, e: &Element, with_data: bool) {
    push_nla(buf, NFTA_LIST_ELEM | NLA_F_NESTED, |b| {
        push_nla(b, NFTA_SET_ELEM_KEY | NLA_F_NESTED, |b| {
            push_nla(b, NFTA_DATA_VALUE, |b| push_fields(b, &e.key));
        });
        if !with_data {
            return;
        }
        if let Some(v) = &e.verdict {
            let data = nl::SetElementAttribute::Data(nl::DataAttribute::Verdict(verdict_attrs(v)));
            let at = b.len();
            b.resize(at + data.buffer_len(), 0);
            data.emit(&mut b[at..]);
        } else if !e.data.is_empty() {
            push_nla(b, NFTA_SET_ELEM_DATA | NLA_F_NESTED, |b| {
                push_nla(b, NFTA_DATA_VALUE, |b| push_fields(b, &e.data));
            });
        }
        if let Some(c) = &e.comment {
            push_nla(b, NFTA_SET_ELEM_USERDATA, |b| {
                b.extend_from_slice(&comment_userdata(NFTNL_UDATA_SET_ELEM_COMMENT, c));
            });
        }
    });
}

/// `NFTA_SET_ELEM_LIST_ELEMENTS` holding `elements`, already encoded.
fn element_list(encoded: Vec<u8>) -> nl::SetElementList {
    nl::SetElementList::Other(DefaultNla::new(
        NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED,
        encoded,
    ))
}

/// A userdata TLV holding `comment` (NUL-terminated, cut to [`MAX_COMMENT_LEN`]).
fn comment_userdata(kind: u8, comment: &str) -> Vec<u8> {
    let mut end = comment.len().min(MAX_COMMENT_LEN - 1);
    while !comment.is_char_boundary(end) {
        end -= 1;
    }
    let text = &comment.as_bytes()[..end];
    let mut v = vec![kind, (text.len() + 1) as u8];
    v.extend_from_slice(text);
    v.push(0);
    v
}

/// Element list messages (`NEWSETELEM` with data, or `DELSETELEM` with keys only),
/// split so that each message's element list stays under the soft limit.
pub(crate) fn element_messages(
    table: &str,
    set: &str,
    elements: &[Element],
    add: bool,
) -> Vec<nl::NfTablesMessage> {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut cur = Vec::new();
    for e in elements {
        let before = cur.len();
        push_element(&mut cur, e, add);
        if before > 0 && cur.len() > ELEM_MSG_SOFT_LIMIT {
            let next = cur.split_off(before);
            chunks.push(std::mem::replace(&mut cur, next));
        }
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    chunks
        .into_iter()
        .map(|chunk| {
            let m = elem_msg(vec![
                nl::SetElementList::Table(table.to_string()),
                nl::SetElementList::Set(set.to_string()),
                element_list(chunk),
            ]);
            if add {
                nl::NfTablesMessage::NewSetElement(m)
            } else {
                nl::NfTablesMessage::DeleteSetElement(m)
            }
        })
        .collect()
}

/// `GETSETELEM { TABLE, SET }` (dump).
pub(crate) fn get_elements(table: &str, set: &str) -> nl::NfTablesMessage {
    nl::NfTablesMessage::GetSetElement(elem_msg(vec![
        nl::SetElementList::Table(table.to_string()),
        nl::SetElementList::Set(set.to_string()),
    ]))
}

/// `GETSETELEM { TABLE, SET, ELEMENTS [key of each of elements] }` without
/// `NLM_F_DUMP`: the kernel answers with one `NEWSETELEM` per element it
/// holds, in order, and stops at the first it does not (`ENOENT`).
pub(crate) fn lookup_elements(
    table: &str,
    set: &str,
    elements: &[&Element],
) -> nl::NfTablesMessage {
    nl::NfTablesMessage::GetSetElement(elem_msg(vec![
        nl::SetElementList::Table(table.to_string()),
        nl::SetElementList::Set(set.to_string()),
        element_list({
            let mut encoded = Vec::new();
            for e in elements {
                push_element(&mut encoded, e, false);
            }
            encoded
        }),
    ]))
}

/// `GETGEN {}`.
pub(crate) fn get_gen() -> nl::NfTablesMessage {
    nl::NfTablesMessage::GetGen(nl::GenMessage { attributes: vec![] })
}

/// Flags of a batch message of `msg`'s kind (besides `NLM_F_REQUEST`).
pub(crate) fn batch_flags(msg: &nl::NfTablesMessage) -> u16 {
    use nl::NfTablesMessage as M;
    match msg {
        M::NewRule(_) => NLM_F_CREATE | NLM_F_APPEND,
        M::NewTable(_) | M::NewChain(_) | M::NewSet(_) | M::NewSetElement(_) => NLM_F_CREATE,
        M::GetChain(_) | M::GetRule(_) | M::GetSet(_) | M::GetSetElement(_) => NLM_F_DUMP,
        _ => 0,
    }
}

// ---- parsing ----

/// A chain from a `NEWCHAIN` dump message: `(table, chain)`.
pub(crate) fn parse_chain(m: &nl::ChainMessage) -> Option<(String, Chain)> {
    let (mut table, mut name, mut comment) = (None, None, None);
    let (mut hooknum, mut prio, mut kind) = (None, None, None);
    for a in &m.attributes {
        match a {
            nl::ChainAttribute::Table(t) => table = Some(t.clone()),
            nl::ChainAttribute::Name(n) => name = Some(n.clone()),
            nl::ChainAttribute::UserData(u) => comment = userdata_tlv(u, NFTNL_UDATA_CHAIN_COMMENT),
            nl::ChainAttribute::Type(k) => kind = Some(k.clone()),
            nl::ChainAttribute::Hook(hook) => {
                for h in hook {
                    match h {
                        nl::Hook::Number(n) => hooknum = Some(u32::from(*n)),
                        // The crate types the (signed) priority as u32.
                        nl::Hook::Priority(p) => prio = Some(*p as i32),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let base = match (hooknum, kind.as_deref()) {
        (Some(h), Some(k)) => Some(BaseChain {
            kind: if k == "nat" {
                ChainType::Nat
            } else {
                ChainType::Filter
            },
            hook: Hook::from_number(h)?,
            priority: prio.unwrap_or(0),
        }),
        _ => None,
    };
    Some((
        table?,
        Chain {
            name: name?,
            base,
            comment,
        },
    ))
}

fn key_type_from_nft(t: u32) -> Option<KeyType> {
    Some(match t {
        7 => KeyType::Ipv4Addr,
        8 => KeyType::Ipv6Addr,
        12 => KeyType::InetProto,
        13 => KeyType::InetService,
        19 => KeyType::Mark,
        _ => return None,
    })
}

/// Decompose nft's (possibly concatenated) datatype into fields, checked against
/// the key length. `fields` is the field count from the concat description, if any.
pub(crate) fn decode_key_types(
    ktype: u32,
    klen: u32,
    fields: Option<usize>,
) -> Option<Vec<KeyType>> {
    let mut raw = Vec::new();
    let mut t = ktype;
    match fields {
        Some(n) => {
            for _ in 0..n {
                raw.push(t & ((1 << TYPE_BITS) - 1));
                t >>= TYPE_BITS;
            }
        }
        None => {
            while t != 0 {
                raw.push(t & ((1 << TYPE_BITS) - 1));
                t >>= TYPE_BITS;
            }
        }
    }
    raw.reverse();
    let key: Vec<KeyType> = raw
        .into_iter()
        .map(key_type_from_nft)
        .collect::<Option<_>>()?;
    let len: u32 = key.iter().map(|k| k.padded_len()).sum();
    (len == klen && !key.is_empty()).then_some(key)
}

/// Result of parsing a `NEWSET` dump message.
pub(crate) enum ParsedSet {
    /// One of ours: `(table, set)`.
    Set(String, Set),
    /// Anonymous or otherwise not representable.
    Skip,
    /// Key could not be decoded: `(name, key type, key len)`.
    BadKey(String, u32, u32),
}

/// Fields of a concatenation in an `NFTA_SET_DESC`, however the crate typed it.
fn concat_fields(desc: &[nl::SetDescription]) -> Option<usize> {
    desc.iter().find_map(|d| match d {
        nl::SetDescription::Concat(fields) => Some(fields.len()),
        nl::SetDescription::Other(a) if a.kind() & !NLA_F_NESTED == NFTA_SET_DESC_CONCAT => {
            let mut v = vec![0; a.value_len()];
            a.emit_value(&mut v);
            Some(netlink_packet_core::NlasIterator::new(&v[..]).count())
        }
        _ => None,
    })
}

pub(crate) fn parse_set(m: &nl::SetMessage) -> Option<ParsedSet> {
    let (mut table, mut name) = (None, None);
    let (mut flags, mut ktype, mut klen, mut dtype, mut dlen, mut timeout) =
        (nl::SetFlags::empty(), 0, 0, None, 0, None);
    let mut fields = None;
    for a in &m.attributes {
        match a {
            nl::SetAttribute::Table(t) => table = Some(t.clone()),
            nl::SetAttribute::Name(n) => name = Some(n.clone()),
            nl::SetAttribute::Flags(f) => flags = *f,
            nl::SetAttribute::KeyType(t) => ktype = *t,
            nl::SetAttribute::KeyLen(l) => klen = *l,
            nl::SetAttribute::DataType(t) => dtype = Some(*t),
            nl::SetAttribute::DataLen(l) => dlen = *l,
            nl::SetAttribute::Timeout(t) => timeout = Some(*t),
            nl::SetAttribute::Description(d) => fields = concat_fields(d),
            _ => {}
        }
    }
    let (table, name) = (table?, name?);
    if flags.contains(nl::SetFlags::Anonymous) {
        return Some(ParsedSet::Skip);
    }
    let is_map = flags.contains(nl::SetFlags::Map);
    let verdict_map = is_map && dtype == Some(NFT_DATA_VERDICT);
    let data = match (is_map, verdict_map, dtype) {
        (true, false, Some(t)) => match decode_key_types(t, dlen, None) {
            Some(d) => d,
            None => return Some(ParsedSet::BadKey(name, t, dlen)),
        },
        (true, false, None) => return Some(ParsedSet::Skip),
        _ => Vec::new(),
    };
    let Some(key) = decode_key_types(ktype, klen, fields.filter(|&n| n > 1)) else {
        return Some(ParsedSet::BadKey(name, ktype, klen));
    };
    Some(ParsedSet::Set(
        table,
        Set {
            name,
            key,
            verdict_map,
            data,
            flags: SetFlags {
                timeout: flags.contains(nl::SetFlags::Timeout),
                dynamic: flags.contains(nl::SetFlags::Eval),
            },
            timeout_ms: timeout,
        },
    ))
}

fn parse_verdict(attrs: &[nl::VerdictAttribute]) -> Option<Verdict> {
    let (mut code, mut chain) = (None, None);
    for a in attrs {
        match a {
            nl::VerdictAttribute::Code(c) => code = Some(*c),
            nl::VerdictAttribute::Chain(c) => chain = Some(c.clone()),
            _ => {}
        }
    }
    Some(match code? {
        nl::Verdict::Other(NF_ACCEPT) => Verdict::Accept,
        nl::Verdict::Other(NF_DROP) => Verdict::Drop,
        nl::Verdict::Return => Verdict::Return,
        nl::Verdict::Continue => Verdict::Continue,
        nl::Verdict::Jump => Verdict::Jump(chain?),
        nl::Verdict::Goto => Verdict::Goto(chain?),
        _ => return None,
    })
}

fn parse_key(key: &[KeyType], bytes: &[u8]) -> Option<Vec<KeyValue>> {
    let mut out = Vec::with_capacity(key.len());
    let mut off = 0usize;
    for k in key {
        out.push(KeyValue::parse(*k, bytes.get(off..)?)?);
        off += k.padded_len() as usize;
    }
    Some(out)
}

/// Elements of a `NEWSETELEM` dump message, decoded by `key`. Elements that do not
/// decode are skipped (returned count tells how many).
pub(crate) fn parse_elements(
    m: &nl::SetElementMessage,
    key: &[KeyType],
    data: &[KeyType],
    out: &mut Vec<Element>,
) -> usize {
    let mut skipped = 0;
    for a in &m.attributes {
        let nl::SetElementList::Elements(list) = a else {
            continue;
        };
        for elem in list {
            let ListAttribute::Element(attrs) = elem else {
                continue;
            };
            let (mut k, mut verdict, mut value, mut comment) = (None, None, Some(vec![]), None);
            for a in attrs {
                match a {
                    nl::SetElementAttribute::Key(nl::DataAttribute::Value(v)) => {
                        k = parse_key(key, v)
                    }
                    nl::SetElementAttribute::Data(nl::DataAttribute::Verdict(v)) => {
                        verdict = parse_verdict(v)
                    }
                    nl::SetElementAttribute::Data(nl::DataAttribute::Value(v)) => {
                        value = parse_key(data, v)
                    }
                    nl::SetElementAttribute::UserData(u) => {
                        comment = userdata_tlv(u, NFTNL_UDATA_SET_ELEM_COMMENT)
                    }
                    _ => {}
                }
            }
            match (k, value) {
                (Some(key), Some(data)) => out.push(Element {
                    key,
                    verdict,
                    data,
                    comment: comment.map(Into::into),
                }),
                _ => skipped += 1,
            }
        }
    }
    skipped
}

/// A rule from a `NEWRULE` dump message.
pub(crate) struct ParsedRule {
    pub(crate) table: String,
    pub(crate) chain: String,
    pub(crate) handle: u64,
    pub(crate) comment: String,
    /// Our fingerprint TLV, else the one inside an old-format comment.
    pub(crate) fingerprint: Option<u64>,
}

/// The comment in a rule's userdata TLVs (`type u8, len u8, value`).
fn userdata_comment(p: &[u8]) -> Option<String> {
    userdata_tlv(p, NFTNL_UDATA_RULE_COMMENT)
}

/// Our fingerprint TLV in a rule's userdata.
fn userdata_fingerprint(p: &[u8]) -> Option<u64> {
    let mut i = 0;
    let mut fp = None;
    while i + 2 <= p.len() {
        let (t, l) = (p[i], p[i + 1] as usize);
        let Some(v) = p.get(i + 2..i + 2 + l) else {
            break;
        };
        if t == KNLP_UDATA_RULE_FINGERPRINT
            && let Ok(b) = <[u8; 8]>::try_from(v)
        {
            fp = Some(u64::from_be_bytes(b));
        }
        i += 2 + l;
    }
    fp
}

/// The string of TLV `kind` in userdata TLVs (`type u8, len u8, value`).
fn userdata_tlv(p: &[u8], kind: u8) -> Option<String> {
    let mut comment = None;
    let mut i = 0;
    while i + 2 <= p.len() {
        let (t, l) = (p[i], p[i + 1] as usize);
        let Some(v) = p.get(i + 2..i + 2 + l) else {
            break;
        };
        if t == kind {
            let end = v.iter().position(|&c| c == 0).unwrap_or(v.len());
            comment = Some(String::from_utf8_lossy(&v[..end]).into_owned());
        }
        i += 2 + l;
    }
    comment
}

pub(crate) fn parse_rule(m: &nl::RuleMessage) -> Option<ParsedRule> {
    let (mut table, mut chain, mut handle, mut comment) = (None, None, None, String::new());
    let mut fingerprint = None;
    for a in &m.attributes {
        match a {
            nl::RuleAttribute::Table(t) => table = Some(t.clone()),
            nl::RuleAttribute::Chain(c) => chain = Some(c.clone()),
            nl::RuleAttribute::Handle(h) => handle = Some(*h),
            nl::RuleAttribute::UserData(u) => {
                if let Some(c) = userdata_comment(u) {
                    comment = c;
                }
                fingerprint = userdata_fingerprint(u);
            }
            _ => {}
        }
    }
    if fingerprint.is_none() {
        // Written by an older version: the fingerprint was in the comment.
        let (human, fp) = parse_comment(&comment);
        if fp.is_some() {
            comment = human;
            fingerprint = fp;
        }
    }
    Some(ParsedRule {
        table: table?,
        chain: chain?,
        handle: handle?,
        comment,
        fingerprint,
    })
}

/// Table name from a `NEWTABLE` message.
pub(crate) fn parse_table_name(m: &nl::TableMessage) -> Option<&str> {
    m.attributes.iter().find_map(|a| match a {
        nl::TableAttribute::Name(n) => Some(n.as_str()),
        _ => None,
    })
}

/// Generation id from a `NEWGEN` message.
pub(crate) fn parse_gen(m: &nl::GenMessage) -> Option<u32> {
    m.attributes.iter().find_map(|a| match a {
        nl::GenAttribute::Id(id) => Some(*id),
        _ => None,
    })
}

// ---- human-readable rendering (for `plan`; rules: `super::text`) ----

/// nft-like text of a verdict.
pub fn fmt_verdict(v: &Verdict) -> String {
    match v {
        Verdict::Accept => "accept".into(),
        Verdict::Drop => "drop".into(),
        Verdict::Return => "return".into(),
        Verdict::Continue => "continue".into(),
        Verdict::Jump(c) => format!("jump {c}"),
        Verdict::Goto(c) => format!("goto {c}"),
    }
}

/// nft-like text of an element key.
pub fn fmt_element(e: &Element) -> String {
    let key: Vec<String> = e.key.iter().map(fmt_key_value).collect();
    let mut out = key.join(" . ");
    if let Some(v) = &e.verdict {
        out = format!("{out} : {}", fmt_verdict(v));
    } else if !e.data.is_empty() {
        let data: Vec<String> = e.data.iter().map(fmt_key_value).collect();
        out = format!("{out} : {}", data.join(" . "));
    }
    if let Some(c) = &e.comment {
        out = format!("{out} comment \"{c}\"");
    }
    out
}

/// nft-like text of one key or data field.
pub fn fmt_key_value(k: &KeyValue) -> String {
    match k {
        KeyValue::Addr(a) => a.to_string(),
        KeyValue::Proto(6) => "tcp".into(),
        KeyValue::Proto(17) => "udp".into(),
        KeyValue::Proto(132) => "sctp".into(),
        KeyValue::Proto(p) => p.to_string(),
        KeyValue::Port(p) => p.to_string(),
        KeyValue::Mark(m) => format!("0x{m:08x}"),
    }
}

/// nft-like text of a set's type.
pub fn fmt_set_type(s: &Set) -> String {
    let names = |types: &[KeyType]| -> String {
        let names: Vec<&str> = types
            .iter()
            .map(|k| match k {
                KeyType::Ipv4Addr => "ipv4_addr",
                KeyType::Ipv6Addr => "ipv6_addr",
                KeyType::InetProto => "inet_proto",
                KeyType::InetService => "inet_service",
                KeyType::Mark => "mark",
            })
            .collect();
        names.join(" . ")
    };
    let mut out = format!("type {}", names(&s.key));
    if s.verdict_map {
        out.push_str(" : verdict");
    } else if !s.data.is_empty() {
        out.push_str(&format!(" : {}", names(&s.data)));
    }
    out
}

// Attribute numbers of a set-element dump (`linux/netfilter/nf_tables.h`).
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

fn nlas(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    netlink_packet_core::NlasIterator::new(buf)
        .filter_map(Result::ok)
        .map(|nla| {
            let kind = nla.kind() & netlink_packet_core::NLA_TYPE_MASK;
            let len = usize::from(nla.length());
            let bytes: &[u8] = nla.into_inner();
            (kind, bytes.get(4..len).unwrap_or_default())
        })
}

/// The payload (after `nfgenmsg`) of a `NEWSETELEM` message, as the crate's typed
/// message. Decoded here, attribute by attribute in one pass: the crate's own list
/// parser formats the whole message into an error context for every element it
/// reads, which makes a dump of a large map quadratic (seconds at 1 000 services,
/// minutes at 10 000). Attributes we do not use are left out.
pub(crate) fn parse_set_element_message(payload: &[u8]) -> nl::SetElementMessage {
    let mut attributes = Vec::new();
    for (kind, value) in nlas(payload) {
        match kind {
            NFTA_SET_ELEM_LIST_TABLE => attributes.push(nl::SetElementList::Table(c_string(value))),
            NFTA_SET_ELEM_LIST_SET => attributes.push(nl::SetElementList::Set(c_string(value))),
            NFTA_SET_ELEM_LIST_ELEMENTS => {
                let elements = nlas(value)
                    .filter(|(k, _)| *k == NFTA_LIST_ELEM)
                    .map(|(_, elem)| ListAttribute::Element(element_attributes(elem)))
                    .collect();
                attributes.push(nl::SetElementList::Elements(elements));
            }
            _ => {}
        }
    }
    nl::SetElementMessage { attributes }
}

fn element_attributes(elem: &[u8]) -> Vec<nl::SetElementAttribute> {
    let mut out = Vec::new();
    for (kind, value) in nlas(elem) {
        match kind {
            NFTA_SET_ELEM_KEY => {
                if let Some((_, v)) = nlas(value).find(|(k, _)| *k == NFTA_DATA_VALUE) {
                    out.push(nl::SetElementAttribute::Key(nl::DataAttribute::Value(
                        v.to_vec(),
                    )));
                }
            }
            NFTA_SET_ELEM_USERDATA => {
                out.push(nl::SetElementAttribute::UserData(value.to_vec()));
            }
            NFTA_SET_ELEM_DATA => {
                if let Some((_, v)) = nlas(value).find(|(k, _)| *k == NFTA_DATA_VALUE) {
                    out.push(nl::SetElementAttribute::Data(nl::DataAttribute::Value(
                        v.to_vec(),
                    )));
                }
                if let Some((_, v)) = nlas(value).find(|(k, _)| *k == NFTA_DATA_VERDICT) {
                    let verdict = nlas(v)
                        .filter_map(|(k, v)| match k {
                            NFTA_VERDICT_CODE if v.len() >= 4 => Some(nl::VerdictAttribute::Code(
                                nl::Verdict::from(u32::from_be_bytes([v[0], v[1], v[2], v[3]])),
                            )),
                            NFTA_VERDICT_CHAIN => Some(nl::VerdictAttribute::Chain(c_string(v))),
                            _ => None,
                        })
                        .collect();
                    out.push(nl::SetElementAttribute::Data(nl::DataAttribute::Verdict(
                        verdict,
                    )));
                }
            }
            _ => {}
        }
    }
    out
}

fn c_string(v: &[u8]) -> String {
    let end = v.iter().position(|&c| c == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_IMMEDIATE_DATA: u16 = 2;

/// The payload of a `NEWRULE` dump message, reduced to what a dump needs (table,
/// chain, handle, userdata): the expressions are identified by the fingerprint in
/// the comment, and the crate's expression-list parser has the same quadratic
/// error-context cost as its element lists.
pub(crate) fn parse_rule_message(payload: &[u8]) -> nl::RuleMessage {
    let mut attributes = Vec::new();
    for (kind, value) in nlas(payload) {
        match kind {
            NFTA_RULE_TABLE => attributes.push(nl::RuleAttribute::Table(c_string(value))),
            NFTA_RULE_CHAIN => attributes.push(nl::RuleAttribute::Chain(c_string(value))),
            NFTA_RULE_HANDLE if value.len() >= 8 => {
                let mut be = [0u8; 8];
                be.copy_from_slice(&value[..8]);
                attributes.push(nl::RuleAttribute::Handle(u64::from_be_bytes(be)));
            }
            NFTA_RULE_USERDATA => attributes.push(nl::RuleAttribute::UserData(value.to_vec())),
            NFTA_RULE_EXPRESSIONS => {
                let jumps = verdict_chains(value);
                if !jumps.is_empty() {
                    attributes.push(nl::RuleAttribute::Expressions(jumps));
                }
            }
            _ => {}
        }
    }
    nl::RuleMessage { attributes }
}

/// Of a rule's `NFTA_RULE_EXPRESSIONS`, only the `immediate` verdicts that name a
/// chain (`jump`/`goto`, iptables-nft's `-j CHAIN`), each as an `immediate`
/// expression holding that verdict; other expressions are not decoded.
fn verdict_chains(exprs: &[u8]) -> Vec<ListAttribute<ExpressionAttribute>> {
    let mut out = Vec::new();
    for (kind, expr) in nlas(exprs) {
        if kind != NFTA_LIST_ELEM {
            continue;
        }
        let is_immediate =
            nlas(expr).any(|(k, v)| k == NFTA_EXPR_NAME && c_string(v) == "immediate");
        let Some((_, data)) = nlas(expr).find(|(k, _)| *k == NFTA_EXPR_DATA) else {
            continue;
        };
        if !is_immediate {
            continue;
        }
        for (k, imm) in nlas(data) {
            if k != NFTA_IMMEDIATE_DATA {
                continue;
            }
            for (k, verdict) in nlas(imm) {
                if k != NFTA_DATA_VERDICT {
                    continue;
                }
                let attrs: Vec<nl::VerdictAttribute> = nlas(verdict)
                    .filter_map(|(k, v)| match k {
                        NFTA_VERDICT_CODE if v.len() >= 4 => Some(nl::VerdictAttribute::Code(
                            nl::Verdict::from(u32::from_be_bytes([v[0], v[1], v[2], v[3]])),
                        )),
                        NFTA_VERDICT_CHAIN => Some(nl::VerdictAttribute::Chain(c_string(v))),
                        _ => None,
                    })
                    .collect();
                if attrs
                    .iter()
                    .any(|a| matches!(a, nl::VerdictAttribute::Chain(_)))
                {
                    out.push(ListAttribute::Element(vec![
                        ExpressionAttribute::Name("immediate".into()),
                        ExpressionAttribute::Data(nl::Expressions::Immediate(vec![
                            nl::Immediate::Data(nl::DataAttribute::Verdict(attrs)),
                        ])),
                    ]));
                }
            }
        }
    }
    out
}

const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_TIMEOUT: u16 = 11;

fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

fn be64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?))
}

/// The payload of a `NEWSET` dump message, reduced to what [`parse_set`] reads.
/// The crate's own parser slices the nested `NFTA_SET_EXPR` attribute without a
/// length check and panics on a short one (found by the `nft_set` fuzz target);
/// we never need the set's expressions, so they are not decoded at all.
pub(crate) fn parse_set_message(payload: &[u8]) -> nl::SetMessage {
    let mut attributes = Vec::new();
    for (kind, value) in nlas(payload) {
        let a = match kind {
            NFTA_SET_TABLE => nl::SetAttribute::Table(c_string(value)),
            NFTA_SET_NAME => nl::SetAttribute::Name(c_string(value)),
            NFTA_SET_FLAGS => match be32(value) {
                Some(f) => nl::SetAttribute::Flags(nl::SetFlags::from_bits_retain(f)),
                None => continue,
            },
            NFTA_SET_KEY_TYPE => match be32(value) {
                Some(t) => nl::SetAttribute::KeyType(t),
                None => continue,
            },
            NFTA_SET_KEY_LEN => match be32(value) {
                Some(l) => nl::SetAttribute::KeyLen(l),
                None => continue,
            },
            NFTA_SET_DATA_TYPE => match be32(value) {
                Some(t) => nl::SetAttribute::DataType(t),
                None => continue,
            },
            NFTA_SET_DATA_LEN => match be32(value) {
                Some(l) => nl::SetAttribute::DataLen(l),
                None => continue,
            },
            NFTA_SET_TIMEOUT => match be64(value) {
                Some(t) => nl::SetAttribute::Timeout(t),
                None => continue,
            },
            // Kept raw: `concat_fields` counts the fields of NFTA_SET_DESC_CONCAT.
            NFTA_SET_DESC => nl::SetAttribute::Description(
                nlas(value)
                    .map(|(k, v)| nl::SetDescription::Other(DefaultNla::new(k, v.to_vec())))
                    .collect(),
            ),
            _ => continue,
        };
        attributes.push(a);
    }
    nl::SetMessage { attributes }
}
