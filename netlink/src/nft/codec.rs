//! Byte-level encoding of our nf_tables object model into netlink messages, and
//! parsing of what the kernel's dumps return.
//!
//! The encoders emit attributes in the same order and with the same flags
//! (`NLA_F_NESTED` on nests, NUL-terminated strings, big-endian u32/u64) as
//! `nft` 1.0.x via libnftnl, so the rule bytes we send are what `nft` would send.

use super::types::*;

// ---- constants from linux/netfilter/nf_tables.h and nfnetlink.h ----

pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(crate) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub(crate) const NFNL_MSG_BATCH_END: u16 = 0x11;

pub(crate) const NFT_MSG_NEWTABLE: u16 = 0;
pub(crate) const NFT_MSG_GETTABLE: u16 = 1;
pub(crate) const NFT_MSG_DELTABLE: u16 = 2;
pub(crate) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(crate) const NFT_MSG_GETCHAIN: u16 = 4;
pub(crate) const NFT_MSG_DELCHAIN: u16 = 5;
pub(crate) const NFT_MSG_NEWRULE: u16 = 6;
pub(crate) const NFT_MSG_GETRULE: u16 = 7;
pub(crate) const NFT_MSG_DELRULE: u16 = 8;
pub(crate) const NFT_MSG_NEWSET: u16 = 9;
pub(crate) const NFT_MSG_GETSET: u16 = 10;
pub(crate) const NFT_MSG_DELSET: u16 = 11;
pub(crate) const NFT_MSG_NEWSETELEM: u16 = 12;
pub(crate) const NFT_MSG_GETSETELEM: u16 = 13;
pub(crate) const NFT_MSG_DELSETELEM: u16 = 14;
pub(crate) const NFT_MSG_NEWGEN: u16 = 15;
pub(crate) const NFT_MSG_GETGEN: u16 = 16;

pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;

const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

const NFTA_LIST_ELEM: u16 = 1;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;

const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTNL_UDATA_RULE_COMMENT: u8 = 0;

const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;

const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_TIMEOUT: u16 = 11;
const NFTA_SET_USERDATA: u16 = 13;
/// `NFTNL_UDATA_SET_KEYBYTEORDER` in nft's set userdata.
const NFTNL_UDATA_SET_KEYBYTEORDER: u8 = 0;
const NFTA_SET_DESC_CONCAT: u16 = 2;
const NFTA_SET_FIELD_LEN: u16 = 1;

const NFT_SET_ANONYMOUS: u32 = 0x1;
const NFT_SET_MAP: u32 = 0x8;
const NFT_SET_TIMEOUT: u32 = 0x10;
const NFT_SET_EVAL: u32 = 0x20;
const NFT_SET_CONCAT: u32 = 0x80;
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;

pub(crate) const NFTA_GEN_ID: u16 = 1;

const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_CONTINUE: i32 = -1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

/// Bits per field in nft's concatenated datatype numbering.
const TYPE_BITS: u32 = 6;

/// Longest comment (including the NUL) we store in a rule's userdata.
pub const MAX_COMMENT_LEN: usize = 128;

/// Soft limit for one element message; the kernel caps one attribute at 64 KiB.
const ELEM_MSG_SOFT_LIMIT: usize = 32 * 1024;

// ---- low-level attribute writer ----

/// Append-only netlink message/attribute writer.
#[derive(Debug, Default, Clone)]
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    pub(crate) fn put(&mut self, ty: u16, data: &[u8]) {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    pub(crate) fn put_str(&mut self, ty: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.put(ty, &v);
    }

    pub(crate) fn put_u32(&mut self, ty: u16, v: u32) {
        self.put(ty, &v.to_be_bytes());
    }

    fn put_u64(&mut self, ty: u16, v: u64) {
        self.put(ty, &v.to_be_bytes());
    }

    fn nest_start(&mut self, ty: u16) -> usize {
        let pos = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        pos
    }

    fn nest_end(&mut self, pos: usize) {
        let len = (self.buf.len() - pos) as u16;
        self.buf[pos..pos + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// Start a netlink message with an `nfgenmsg` header; returns its offset.
    pub(crate) fn msg_start(
        &mut self,
        ty: u16,
        flags: u16,
        seq: u32,
        family: u8,
        res_id: u16,
    ) -> usize {
        let pos = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.push(family);
        self.buf.push(0); // NFNETLINK_V0
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        pos
    }

    pub(crate) fn msg_end(&mut self, pos: usize) {
        let len = (self.buf.len() - pos) as u32;
        self.buf[pos..pos + 4].copy_from_slice(&len.to_ne_bytes());
    }
}

/// nlmsg_type of an nf_tables message.
pub(crate) fn nft_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

// ---- expressions ----

fn expr_start(w: &mut Writer, name: &str) -> (usize, usize) {
    let elem = w.nest_start(NFTA_LIST_ELEM);
    w.put_str(NFTA_EXPR_NAME, name);
    let data = w.nest_start(NFTA_EXPR_DATA);
    (elem, data)
}

fn expr_end(w: &mut Writer, (elem, data): (usize, usize)) {
    w.nest_end(data);
    w.nest_end(elem);
}

fn verdict_code(v: &Verdict) -> i32 {
    match v {
        Verdict::Accept => NF_ACCEPT,
        Verdict::Drop => NF_DROP,
        Verdict::Return => NFT_RETURN,
        Verdict::Continue => NFT_CONTINUE,
        Verdict::Jump(_) => NFT_JUMP,
        Verdict::Goto(_) => NFT_GOTO,
    }
}

/// `NFTA_DATA_VERDICT { CODE, CHAIN? }` (inside a DATA nest).
fn put_verdict(w: &mut Writer, v: &Verdict) {
    let n = w.nest_start(NFTA_DATA_VERDICT);
    w.put(NFTA_VERDICT_CODE, &verdict_code(v).to_be_bytes());
    if let Some(c) = v.chain() {
        w.put_str(NFTA_VERDICT_CHAIN, c);
    }
    w.nest_end(n);
}

fn put_data_value(w: &mut Writer, ty: u16, value: &[u8]) {
    let n = w.nest_start(ty);
    w.put(NFTA_DATA_VALUE, value);
    w.nest_end(n);
}

fn payload_base(b: PayloadBase) -> u32 {
    match b {
        PayloadBase::LinkLayer => 0,
        PayloadBase::Network => 1,
        PayloadBase::Transport => 2,
    }
}

fn meta_key(k: MetaKey) -> u32 {
    match k {
        MetaKey::Mark => 3,
        MetaKey::IifName => 6,
        MetaKey::OifName => 7,
        MetaKey::NfProto => 15,
        MetaKey::L4Proto => 16,
    }
}

fn cmp_op(op: CmpOp) -> u32 {
    match op {
        CmpOp::Eq => 0,
        CmpOp::Neq => 1,
        CmpOp::Lt => 2,
        CmpOp::Lte => 3,
        CmpOp::Gt => 4,
        CmpOp::Gte => 5,
    }
}

/// Encode one expression (a complete `NFTA_LIST_ELEM`) in libnftnl's attribute order.
pub(crate) fn encode_expr(w: &mut Writer, e: &Expr) {
    match e {
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        } => {
            let t = expr_start(w, "payload");
            w.put_u32(1, dreg.0); // NFTA_PAYLOAD_DREG
            w.put_u32(2, payload_base(*base)); // BASE
            w.put_u32(3, *offset); // OFFSET
            w.put_u32(4, *len); // LEN
            expr_end(w, t);
        }
        Expr::Meta { key, dreg } => {
            let t = expr_start(w, "meta");
            w.put_u32(2, meta_key(*key)); // NFTA_META_KEY
            w.put_u32(1, dreg.0); // NFTA_META_DREG
            expr_end(w, t);
        }
        Expr::MetaSet { key, sreg } => {
            let t = expr_start(w, "meta");
            w.put_u32(2, meta_key(*key)); // NFTA_META_KEY
            w.put_u32(3, sreg.0); // NFTA_META_SREG
            expr_end(w, t);
        }
        Expr::Cmp { sreg, op, data } => {
            let t = expr_start(w, "cmp");
            w.put_u32(1, sreg.0); // NFTA_CMP_SREG
            w.put_u32(2, cmp_op(*op)); // NFTA_CMP_OP
            put_data_value(w, 3, data); // NFTA_CMP_DATA
            expr_end(w, t);
        }
        Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
        } => {
            let t = expr_start(w, "bitwise");
            w.put_u32(1, sreg.0); // NFTA_BITWISE_SREG
            w.put_u32(2, dreg.0); // DREG
            w.put_u32(3, mask.len() as u32); // LEN
            put_data_value(w, 4, mask); // MASK
            put_data_value(w, 5, xor); // XOR
            expr_end(w, t);
        }
        Expr::Lookup {
            set,
            sreg,
            dreg,
            invert,
        } => {
            let t = expr_start(w, "lookup");
            w.put_u32(2, sreg.0); // NFTA_LOOKUP_SREG
            if let Some(d) = dreg {
                w.put_u32(3, d.0); // DREG
            }
            w.put_str(1, set); // SET
            if *invert {
                w.put_u32(5, 1); // FLAGS: NFT_LOOKUP_F_INV
            }
            expr_end(w, t);
        }
        Expr::Immediate { dreg, data } => {
            let t = expr_start(w, "immediate");
            w.put_u32(1, dreg.0); // NFTA_IMMEDIATE_DREG
            let n = w.nest_start(2); // NFTA_IMMEDIATE_DATA
            match data {
                ImmediateData::Verdict(v) => put_verdict(w, v),
                ImmediateData::Value(b) => w.put(NFTA_DATA_VALUE, b),
            }
            w.nest_end(n);
            expr_end(w, t);
        }
        Expr::NumgenRandom {
            dreg,
            modulus,
            offset,
        } => {
            let t = expr_start(w, "numgen");
            w.put_u32(1, dreg.0); // NFTA_NG_DREG
            w.put_u32(2, *modulus); // MODULUS
            w.put_u32(3, 1); // TYPE: NFT_NG_RANDOM
            w.put_u32(4, *offset); // OFFSET
            expr_end(w, t);
        }
        Expr::Fib { addr, result, dreg } => {
            let t = expr_start(w, "fib");
            let flags = match addr {
                FibAddr::Source => 1,
                FibAddr::Destination => 2,
            };
            w.put_u32(3, flags); // NFTA_FIB_FLAGS
            let res = match result {
                FibResult::AddrType => 3,
            };
            w.put_u32(2, res); // NFTA_FIB_RESULT
            w.put_u32(1, dreg.0); // NFTA_FIB_DREG
            expr_end(w, t);
        }
        Expr::Ct { key, dreg } => {
            let t = expr_start(w, "ct");
            let k = match key {
                CtKey::State => 0,
            };
            w.put_u32(2, k); // NFTA_CT_KEY
            w.put_u32(1, dreg.0); // NFTA_CT_DREG
            expr_end(w, t);
        }
        Expr::Dnat {
            family,
            reg_addr,
            reg_port,
        } => {
            let t = expr_start(w, "nat");
            w.put_u32(1, 1); // NFTA_NAT_TYPE: NFT_NAT_DNAT
            w.put_u32(2, u32::from(family.nfproto())); // FAMILY
            w.put_u32(3, reg_addr.0); // REG_ADDR_MIN
            if let Some(p) = reg_port {
                w.put_u32(5, p.0); // REG_PROTO_MIN
                w.put_u32(7, 2); // FLAGS: NF_NAT_RANGE_PROTO_SPECIFIED (as nft sends)
            }
            expr_end(w, t);
        }
        Expr::Masquerade { fully_random } => {
            let t = expr_start(w, "masq");
            if *fully_random {
                w.put_u32(1, 0x10); // NFTA_MASQ_FLAGS: NF_NAT_RANGE_PROTO_RANDOM_FULLY
            }
            expr_end(w, t);
        }
        Expr::Reject(kind) => {
            let t = expr_start(w, "reject");
            match kind {
                RejectKind::IcmpUnreach(code) => {
                    w.put_u32(1, 0); // NFTA_REJECT_TYPE: NFT_REJECT_ICMP_UNREACH
                    w.put(2, &[*code]); // NFTA_REJECT_ICMP_CODE
                }
                RejectKind::TcpRst => {
                    w.put_u32(1, 1); // NFT_REJECT_TCP_RST
                    w.put(2, &[0]);
                }
            }
            expr_end(w, t);
        }
        Expr::Counter => {
            let t = expr_start(w, "counter");
            expr_end(w, t);
        }
        Expr::Dynset {
            op,
            set,
            sreg_key,
            timeout_ms,
        } => {
            let t = expr_start(w, "dynset");
            w.put_u32(4, sreg_key.0); // NFTA_DYNSET_SREG_KEY
            let o = match op {
                DynsetOp::Add => 0,
                DynsetOp::Update => 1,
            };
            w.put_u32(3, o); // NFTA_DYNSET_OP
            if let Some(ms) = timeout_ms {
                w.put_u64(6, *ms); // NFTA_DYNSET_TIMEOUT
            }
            w.put_str(1, set); // NFTA_DYNSET_SET_NAME
            expr_end(w, t);
        }
    }
}

/// The content of `NFTA_RULE_EXPRESSIONS` for a list of expressions.
pub fn encode_exprs(exprs: &[Expr]) -> Vec<u8> {
    let mut w = Writer::default();
    for e in exprs {
        encode_expr(&mut w, e);
    }
    w.buf
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

/// Fingerprint of a rule: FNV-1a 64 over its encoded expressions. Stored in the
/// rule's comment as `#<16 hex>` so a dump tells whether a rule is current.
pub fn rule_fingerprint(rule: &Rule) -> u64 {
    fnv1a64(&encode_exprs(&rule.exprs))
}

/// The comment we store for a rule: `"<comment> #<fp>"`, or `"#<fp>"`, at most
/// [`MAX_COMMENT_LEN`] - 1 bytes (the human part is truncated at a char boundary).
pub fn rule_comment(rule: &Rule) -> String {
    comment_with_fingerprint(rule.comment.as_deref(), rule_fingerprint(rule))
}

fn comment_with_fingerprint(human: Option<&str>, fp: u64) -> String {
    let tag = format!("#{fp:016x}");
    match human {
        None | Some("") => tag,
        Some(h) => {
            let room = MAX_COMMENT_LEN - 1 - tag.len() - 1;
            let mut end = h.len().min(room);
            while !h.is_char_boundary(end) {
                end -= 1;
            }
            format!("{} {tag}", &h[..end])
        }
    }
}

/// Split a stored comment into its human part and fingerprint.
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

fn rule_userdata(comment: &str) -> Vec<u8> {
    let mut v = vec![NFTNL_UDATA_RULE_COMMENT, (comment.len() + 1) as u8];
    v.extend_from_slice(comment.as_bytes());
    v.push(0);
    v
}

// ---- objects ----

/// nft's datatype number of a set key (concatenations: `(acc << 6) | type`).
pub fn set_key_type(key: &[KeyType]) -> u32 {
    key.iter()
        .fold(0, |acc, k| (acc << TYPE_BITS) | k.nft_type())
}

fn set_flags(set: &Set) -> u32 {
    let mut f = 0;
    if set.verdict_map {
        f |= NFT_SET_MAP;
    }
    if set.key.len() > 1 {
        f |= NFT_SET_CONCAT;
    }
    if set.flags.timeout {
        f |= NFT_SET_TIMEOUT;
    }
    if set.flags.dynamic {
        f |= NFT_SET_EVAL;
    }
    f
}

pub(crate) fn encode_table(w: &mut Writer, name: &str) {
    w.put_str(NFTA_TABLE_NAME, name);
    w.put_u32(NFTA_TABLE_FLAGS, 0);
}

pub(crate) fn encode_table_name(w: &mut Writer, name: &str) {
    w.put_str(NFTA_TABLE_NAME, name);
}

pub(crate) fn encode_chain(w: &mut Writer, table: &str, chain: &Chain) {
    w.put_str(NFTA_CHAIN_TABLE, table);
    w.put_str(NFTA_CHAIN_NAME, &chain.name);
    if let Some(b) = &chain.base {
        w.put_str(NFTA_CHAIN_TYPE, b.kind.name());
        let n = w.nest_start(NFTA_CHAIN_HOOK);
        w.put_u32(NFTA_HOOK_HOOKNUM, b.hook.number());
        w.put(NFTA_HOOK_PRIORITY, &b.priority.to_be_bytes());
        w.nest_end(n);
    }
}

pub(crate) fn encode_chain_ref(w: &mut Writer, table: &str, name: &str) {
    w.put_str(NFTA_CHAIN_TABLE, table);
    w.put_str(NFTA_CHAIN_NAME, name);
}

/// `NFTA_RULE_TABLE`, `CHAIN`, `EXPRESSIONS`, `USERDATA` (nft's order).
pub(crate) fn encode_rule(w: &mut Writer, table: &str, rule: &Rule) {
    w.put_str(NFTA_RULE_TABLE, table);
    w.put_str(NFTA_RULE_CHAIN, &rule.chain);
    let exprs = encode_exprs(&rule.exprs);
    let fp = fnv1a64(&exprs);
    let n = w.nest_start(NFTA_RULE_EXPRESSIONS);
    w.buf.extend_from_slice(&exprs);
    w.nest_end(n);
    let comment = comment_with_fingerprint(rule.comment.as_deref(), fp);
    w.put(NFTA_RULE_USERDATA, &rule_userdata(&comment));
}

pub(crate) fn encode_chain_ref_table(w: &mut Writer, table: &str) {
    w.put_str(NFTA_CHAIN_TABLE, table);
}

pub(crate) fn encode_set_table(w: &mut Writer, table: &str) {
    w.put_str(NFTA_SET_TABLE, table);
}

pub(crate) fn encode_flush_chain_table(w: &mut Writer, table: &str) {
    w.put_str(NFTA_RULE_TABLE, table);
}

pub(crate) fn encode_flush_chain(w: &mut Writer, table: &str, chain: &str) {
    w.put_str(NFTA_RULE_TABLE, table);
    w.put_str(NFTA_RULE_CHAIN, chain);
}

pub(crate) fn encode_set(w: &mut Writer, table: &str, set: &Set, id: u32) {
    w.put_str(NFTA_SET_TABLE, table);
    w.put_str(NFTA_SET_NAME, &set.name);
    w.put_u32(NFTA_SET_FLAGS, set_flags(set));
    w.put_u32(NFTA_SET_KEY_TYPE, set_key_type(&set.key));
    w.put_u32(NFTA_SET_KEY_LEN, set.key_len());
    if set.verdict_map {
        w.put_u32(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
        w.put_u32(NFTA_SET_DATA_LEN, 0); // as nft: the kernel uses sizeof(verdict)
    }
    w.put_u32(NFTA_SET_ID, id);
    if let Some(ms) = set.timeout_ms {
        w.put_u64(NFTA_SET_TIMEOUT, ms);
    }
    if set.key.len() > 1 {
        let d = w.nest_start(NFTA_SET_DESC);
        let c = w.nest_start(NFTA_SET_DESC_CONCAT);
        for k in &set.key {
            let e = w.nest_start(NFTA_LIST_ELEM);
            w.put_u32(NFTA_SET_FIELD_LEN, k.len());
            w.nest_end(e);
        }
        w.nest_end(c);
        w.nest_end(d);
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
    w.put(NFTA_SET_USERDATA, &ud);
}

pub(crate) fn encode_set_ref(w: &mut Writer, table: &str, name: &str) {
    w.put_str(NFTA_SET_TABLE, table);
    w.put_str(NFTA_SET_NAME, name);
}

/// Encode one element (`NFTA_LIST_ELEM { KEY, DATA? }`) into a scratch buffer.
fn encode_element(e: &Element, with_data: bool) -> Vec<u8> {
    let mut w = Writer::default();
    let n = w.nest_start(NFTA_LIST_ELEM);
    put_data_value(&mut w, NFTA_SET_ELEM_KEY, &e.key_bytes());
    if let (true, Some(v)) = (with_data, &e.verdict) {
        let d = w.nest_start(NFTA_SET_ELEM_DATA);
        put_verdict(&mut w, v);
        w.nest_end(d);
    }
    w.nest_end(n);
    w.buf
}

/// Group elements into chunks whose encoded list stays under the soft message limit.
/// Returns the encoded `NFTA_SET_ELEM_LIST_ELEMENTS` contents, one per message.
pub(crate) fn element_chunks(elements: &[Element], with_data: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for e in elements {
        let enc = encode_element(e, with_data);
        if !cur.is_empty() && cur.len() + enc.len() > ELEM_MSG_SOFT_LIMIT {
            out.push(std::mem::take(&mut cur));
        }
        cur.extend_from_slice(&enc);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

pub(crate) fn encode_elem_list(w: &mut Writer, table: &str, set: &str, encoded: &[u8]) {
    w.put_str(NFTA_SET_ELEM_LIST_TABLE, table);
    w.put_str(NFTA_SET_ELEM_LIST_SET, set);
    let n = w.nest_start(NFTA_SET_ELEM_LIST_ELEMENTS);
    w.buf.extend_from_slice(encoded);
    w.nest_end(n);
}

pub(crate) fn encode_elem_list_ref(w: &mut Writer, table: &str, set: &str) {
    w.put_str(NFTA_SET_ELEM_LIST_TABLE, table);
    w.put_str(NFTA_SET_ELEM_LIST_SET, set);
}

// ---- parsing ----

/// Iterate over the attributes of `b`: `(type without flags, payload)`.
pub(crate) fn attrs(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut i = 0usize;
    std::iter::from_fn(move || {
        if i + 4 > b.len() {
            return None;
        }
        let len = u16::from_ne_bytes([b[i], b[i + 1]]) as usize;
        let ty = u16::from_ne_bytes([b[i + 2], b[i + 3]]) & NLA_TYPE_MASK;
        if len < 4 || i + len > b.len() {
            return None;
        }
        let payload = &b[i + 4..i + len];
        i += len.div_ceil(4) * 4;
        Some((ty, payload))
    })
}

fn be32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

fn be64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}

fn string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// A chain from a `NEWCHAIN` dump message: `(table, chain)`.
pub(crate) fn parse_chain(b: &[u8]) -> Option<(String, Chain)> {
    let (mut table, mut name) = (None, None);
    let (mut hooknum, mut prio, mut kind) = (None, None, None);
    for (ty, p) in attrs(b) {
        match ty {
            NFTA_CHAIN_TABLE => table = Some(string(p)),
            NFTA_CHAIN_NAME => name = Some(string(p)),
            NFTA_CHAIN_TYPE => kind = Some(string(p)),
            NFTA_CHAIN_HOOK => {
                for (t, q) in attrs(p) {
                    match t {
                        NFTA_HOOK_HOOKNUM => hooknum = be32(q),
                        NFTA_HOOK_PRIORITY => prio = be32(q).map(|v| v as i32),
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
    Some((table?, Chain { name: name?, base }))
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

pub(crate) fn parse_set(b: &[u8]) -> Option<ParsedSet> {
    let (mut table, mut name) = (None, None);
    let (mut flags, mut ktype, mut klen, mut dtype, mut timeout) = (0, 0, 0, None, None);
    let mut fields = None;
    for (ty, p) in attrs(b) {
        match ty {
            NFTA_SET_TABLE => table = Some(string(p)),
            NFTA_SET_NAME => name = Some(string(p)),
            NFTA_SET_FLAGS => flags = be32(p)?,
            NFTA_SET_KEY_TYPE => ktype = be32(p)?,
            NFTA_SET_KEY_LEN => klen = be32(p)?,
            NFTA_SET_DATA_TYPE => dtype = be32(p),
            NFTA_SET_TIMEOUT => timeout = be64(p),
            NFTA_SET_DESC => {
                for (t, q) in attrs(p) {
                    if t == NFTA_SET_DESC_CONCAT {
                        fields = Some(attrs(q).count());
                    }
                }
            }
            _ => {}
        }
    }
    let (table, name) = (table?, name?);
    if flags & NFT_SET_ANONYMOUS != 0 {
        return Some(ParsedSet::Skip);
    }
    let verdict_map = flags & NFT_SET_MAP != 0;
    if verdict_map && dtype != Some(NFT_DATA_VERDICT) {
        return Some(ParsedSet::Skip);
    }
    let Some(key) = decode_key_types(ktype, klen, fields.filter(|&n| n > 1)) else {
        return Some(ParsedSet::BadKey(name, ktype, klen));
    };
    Some(ParsedSet::Set(
        table,
        Set {
            name,
            key,
            verdict_map,
            flags: SetFlags {
                timeout: flags & NFT_SET_TIMEOUT != 0,
                dynamic: flags & NFT_SET_EVAL != 0,
            },
            timeout_ms: timeout,
        },
    ))
}

fn parse_verdict(b: &[u8]) -> Option<Verdict> {
    let (mut code, mut chain) = (None, None);
    for (t, q) in attrs(b) {
        match t {
            NFTA_VERDICT_CODE => code = be32(q).map(|c| c as i32),
            NFTA_VERDICT_CHAIN => chain = Some(string(q)),
            _ => {}
        }
    }
    Some(match code? {
        NF_ACCEPT => Verdict::Accept,
        NF_DROP => Verdict::Drop,
        NFT_RETURN => Verdict::Return,
        NFT_CONTINUE => Verdict::Continue,
        NFT_JUMP => Verdict::Jump(chain?),
        NFT_GOTO => Verdict::Goto(chain?),
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
pub(crate) fn parse_elements(b: &[u8], key: &[KeyType], out: &mut Vec<Element>) -> usize {
    let mut skipped = 0;
    for (ty, p) in attrs(b) {
        if ty != NFTA_SET_ELEM_LIST_ELEMENTS {
            continue;
        }
        for (t, elem) in attrs(p) {
            if t != NFTA_LIST_ELEM {
                continue;
            }
            let (mut k, mut verdict) = (None, None);
            for (a, q) in attrs(elem) {
                match a {
                    NFTA_SET_ELEM_KEY => {
                        k = attrs(q)
                            .find(|(x, _)| *x == NFTA_DATA_VALUE)
                            .and_then(|(_, v)| parse_key(key, v))
                    }
                    NFTA_SET_ELEM_DATA => {
                        verdict = attrs(q)
                            .find(|(x, _)| *x == NFTA_DATA_VERDICT)
                            .and_then(|(_, v)| parse_verdict(v))
                    }
                    _ => {}
                }
            }
            match k {
                Some(key) => out.push(Element { key, verdict }),
                None => skipped += 1,
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
}

pub(crate) fn parse_rule(b: &[u8]) -> Option<ParsedRule> {
    let (mut table, mut chain, mut handle, mut comment) = (None, None, None, String::new());
    for (ty, p) in attrs(b) {
        match ty {
            NFTA_RULE_TABLE => table = Some(string(p)),
            NFTA_RULE_CHAIN => chain = Some(string(p)),
            NFTA_RULE_HANDLE => handle = be64(p),
            NFTA_RULE_USERDATA => {
                let mut i = 0;
                while i + 2 <= p.len() {
                    let (t, l) = (p[i], p[i + 1] as usize);
                    let Some(v) = p.get(i + 2..i + 2 + l) else {
                        break;
                    };
                    if t == NFTNL_UDATA_RULE_COMMENT {
                        comment = string(v);
                    }
                    i += 2 + l;
                }
            }
            _ => {}
        }
    }
    Some(ParsedRule {
        table: table?,
        chain: chain?,
        handle: handle?,
        comment,
    })
}

/// Table name from a `NEWTABLE` message.
pub(crate) fn parse_table_name(b: &[u8]) -> Option<String> {
    attrs(b)
        .find(|(t, _)| *t == NFTA_TABLE_NAME)
        .map(|(_, p)| string(p))
}

/// Generation id from a `NEWGEN` message.
pub(crate) fn parse_gen(b: &[u8]) -> Option<u32> {
    attrs(b)
        .find(|(t, _)| *t == NFTA_GEN_ID)
        .and_then(|(_, p)| be32(p))
}

// ---- human-readable rendering (for `plan`) ----

fn fmt_reg(r: Reg) -> String {
    if r == Reg::VERDICT {
        "verdict".into()
    } else {
        format!("reg {}", r.0)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

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

/// One expression in the style of `nft --debug=netlink`.
pub fn fmt_expr(e: &Expr) -> String {
    match e {
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        } => {
            let b = match base {
                PayloadBase::LinkLayer => "link",
                PayloadBase::Network => "network",
                PayloadBase::Transport => "transport",
            };
            format!(
                "[ payload load {len}b @ {b} header + {offset} => {} ]",
                fmt_reg(*dreg)
            )
        }
        Expr::Meta { key, dreg } => {
            format!("[ meta load {key:?} => {} ]", fmt_reg(*dreg)).to_lowercase()
        }
        Expr::MetaSet { key, sreg } => {
            format!("[ meta set {key:?} with {} ]", fmt_reg(*sreg)).to_lowercase()
        }
        Expr::Cmp { sreg, op, data } => {
            format!("[ cmp {op:?} {} 0x{} ]", fmt_reg(*sreg), hex(data)).to_lowercase()
        }
        Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
        } => {
            format!(
                "[ bitwise {} = ({} & 0x{}) ^ 0x{} ]",
                fmt_reg(*dreg),
                fmt_reg(*sreg),
                hex(mask),
                hex(xor)
            )
        }
        Expr::Lookup {
            set,
            sreg,
            dreg,
            invert,
        } => {
            let d = dreg
                .map(|d| format!(" dreg {}", fmt_reg(d)))
                .unwrap_or_default();
            let inv = if *invert { " 0x1" } else { "" };
            format!("[ lookup {} set {set}{d}{inv} ]", fmt_reg(*sreg))
        }
        Expr::Immediate { dreg, data } => match data {
            ImmediateData::Verdict(v) => {
                format!("[ immediate {} {} ]", fmt_reg(*dreg), fmt_verdict(v))
            }
            ImmediateData::Value(b) => format!("[ immediate {} 0x{} ]", fmt_reg(*dreg), hex(b)),
        },
        Expr::NumgenRandom {
            dreg,
            modulus,
            offset,
        } => {
            format!(
                "[ numgen {} = random mod {modulus} offset {offset} ]",
                fmt_reg(*dreg)
            )
        }
        Expr::Fib { addr, dreg, .. } => {
            let a = match addr {
                FibAddr::Source => "saddr",
                FibAddr::Destination => "daddr",
            };
            format!("[ fib {a} type => {} ]", fmt_reg(*dreg))
        }
        Expr::Ct { dreg, .. } => format!("[ ct load state => {} ]", fmt_reg(*dreg)),
        Expr::Dnat {
            family,
            reg_addr,
            reg_port,
        } => {
            let p = reg_port
                .map(|p| format!(" proto_min {}", fmt_reg(p)))
                .unwrap_or_default();
            format!(
                "[ nat dnat {} addr_min {}{p} ]",
                family.nft_name(),
                fmt_reg(*reg_addr)
            )
        }
        Expr::Masquerade { fully_random } => {
            if *fully_random {
                "[ masq flags 0x10 ]".into()
            } else {
                "[ masq ]".into()
            }
        }
        Expr::Reject(RejectKind::IcmpUnreach(c)) => format!("[ reject type 0 code {c} ]"),
        Expr::Reject(RejectKind::TcpRst) => "[ reject type 1 ]".into(),
        Expr::Counter => "[ counter ]".into(),
        Expr::Dynset {
            op,
            set,
            sreg_key,
            timeout_ms,
        } => {
            let o = match op {
                DynsetOp::Add => "add",
                DynsetOp::Update => "update",
            };
            let t = timeout_ms
                .map(|t| format!(" timeout {t}ms"))
                .unwrap_or_default();
            format!("[ dynset {o} {} set {set}{t} ]", fmt_reg(*sreg_key))
        }
    }
}

/// nft-like text of an element key.
pub fn fmt_element(e: &Element) -> String {
    let key: Vec<String> = e
        .key
        .iter()
        .map(|k| match k {
            KeyValue::Addr(a) => a.to_string(),
            KeyValue::Proto(6) => "tcp".into(),
            KeyValue::Proto(17) => "udp".into(),
            KeyValue::Proto(132) => "sctp".into(),
            KeyValue::Proto(p) => p.to_string(),
            KeyValue::Port(p) => p.to_string(),
            KeyValue::Mark(m) => format!("0x{m:08x}"),
        })
        .collect();
    match &e.verdict {
        Some(v) => format!("{} : {}", key.join(" . "), fmt_verdict(v)),
        None => key.join(" . "),
    }
}

/// nft-like text of a set's type.
pub fn fmt_set_type(s: &Set) -> String {
    let names: Vec<&str> = s
        .key
        .iter()
        .map(|k| match k {
            KeyType::Ipv4Addr => "ipv4_addr",
            KeyType::Ipv6Addr => "ipv6_addr",
            KeyType::InetProto => "inet_proto",
            KeyType::InetService => "inet_service",
            KeyType::Mark => "mark",
        })
        .collect();
    let mut out = format!("type {}", names.join(" . "));
    if s.verdict_map {
        out.push_str(" : verdict");
    }
    out
}
