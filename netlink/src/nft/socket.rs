//! A blocking NETLINK_NETFILTER socket that applies atomic nf_tables batches and
//! dumps tables.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::os::fd::AsRawFd;

use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

use super::codec::{self, *};
use super::types::*;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLM_F_CAPPED: u16 = 0x100;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;
const MIN_SOCKBUF: usize = 8 << 20;
const RECV_BUF: usize = 1 << 20;
const DUMP_RETRIES: usize = 5;

/// Errors of the nf_tables socket, named by the phase that failed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// Opening, binding or configuring the socket.
    #[error("opening NETLINK_NETFILTER socket: {0}")]
    Socket(#[source] io::Error),
    /// `sendmsg` of a batch or request.
    #[error("sending {messages} netlink messages ({bytes} bytes): {source}")]
    Send {
        /// Messages in the buffer.
        messages: usize,
        /// Buffer size.
        bytes: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `recv` from the socket.
    #[error("receiving from NETLINK_NETFILTER socket: {0}")]
    Recv(#[source] io::Error),
    /// The kernel rejected the batch; nothing of it was applied.
    #[error("nf_tables batch rejected at op #{index} `{op}`: {} (errno {errno}){}",
        io::Error::from_raw_os_error(*errno),
        message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    BatchRejected {
        /// Index of the failing op in the `apply` slice.
        index: usize,
        /// The failing op, rendered nft-like.
        op: String,
        /// Positive errno.
        errno: i32,
        /// Extended ack message from the kernel, if any.
        message: Option<String>,
    },
    /// A dump or get request returned an error.
    #[error("nf_tables dump of {what} failed: {} (errno {errno})", io::Error::from_raw_os_error(*errno))]
    Dump {
        /// What was dumped.
        what: String,
        /// Positive errno.
        errno: i32,
    },
    /// A reply could not be decoded.
    #[error("decoding nf_tables {what}: {detail}")]
    Decode {
        /// What was being decoded.
        what: String,
        /// What was wrong.
        detail: String,
    },
}

/// One change in an atomic batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `add table` (idempotent).
    AddTable {
        /// family
        family: Family,
        /// table name
        name: String,
    },
    /// `delete table` (with everything in it).
    DeleteTable {
        /// family
        family: Family,
        /// table name
        name: String,
    },
    /// `add chain` (idempotent).
    AddChain {
        /// family
        family: Family,
        /// table name
        table: String,
        /// the chain
        chain: Chain,
    },
    /// `delete chain` (its rules go with it; fails while jumped to).
    DeleteChain {
        /// family
        family: Family,
        /// table name
        table: String,
        /// chain name
        name: String,
    },
    /// `flush chain`: delete all rules of a chain.
    FlushChain {
        /// family
        family: Family,
        /// table name
        table: String,
        /// chain name
        name: String,
    },
    /// `add rule` (appended).
    AddRule {
        /// family
        family: Family,
        /// table name
        table: String,
        /// the rule
        rule: Rule,
    },
    /// `add set` / `add map` (idempotent when identical).
    AddSet {
        /// family
        family: Family,
        /// table name
        table: String,
        /// the set
        set: Set,
    },
    /// `delete set`.
    DeleteSet {
        /// family
        family: Family,
        /// table name
        table: String,
        /// set name
        name: String,
    },
    /// `add element` (split into several messages when large).
    AddElements {
        /// family
        family: Family,
        /// table name
        table: String,
        /// set name
        set: String,
        /// elements
        elements: Vec<Element>,
    },
    /// `delete element` (keys only are sent).
    DeleteElements {
        /// family
        family: Family,
        /// table name
        table: String,
        /// set name
        set: String,
        /// elements
        elements: Vec<Element>,
    },
}

fn fmt_elements(f: &mut fmt::Formatter<'_>, elements: &[Element]) -> fmt::Result {
    const SHOW: usize = 4;
    let shown: Vec<String> = elements.iter().take(SHOW).map(fmt_element).collect();
    write!(f, "{{ {}", shown.join(", "))?;
    if elements.len() > SHOW {
        write!(f, ", … ({} elements)", elements.len())?;
    }
    write!(f, " }}")
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::AddTable { family, name } => write!(f, "add table {} {name}", family.nft_name()),
            Op::DeleteTable { family, name } => {
                write!(f, "delete table {} {name}", family.nft_name())
            }
            Op::AddChain {
                family,
                table,
                chain,
            } => {
                write!(f, "add chain {} {table} {}", family.nft_name(), chain.name)?;
                if let Some(b) = &chain.base {
                    let hook = format!("{:?}", b.hook).to_lowercase();
                    write!(
                        f,
                        " {{ type {} hook {hook} priority {}; }}",
                        b.kind.name(),
                        b.priority
                    )?;
                }
                Ok(())
            }
            Op::DeleteChain {
                family,
                table,
                name,
            } => {
                write!(f, "delete chain {} {table} {name}", family.nft_name())
            }
            Op::FlushChain {
                family,
                table,
                name,
            } => write!(f, "flush chain {} {table} {name}", family.nft_name()),
            Op::AddRule {
                family,
                table,
                rule,
            } => {
                write!(f, "add rule {} {table} {}", family.nft_name(), rule.chain)?;
                for e in &rule.exprs {
                    write!(f, " {}", fmt_expr(e))?;
                }
                write!(f, " comment \"{}\"", rule_comment(rule))
            }
            Op::AddSet { family, table, set } => {
                let kind = if set.verdict_map { "map" } else { "set" };
                write!(
                    f,
                    "add {kind} {} {table} {} {{ {};",
                    family.nft_name(),
                    set.name,
                    fmt_set_type(set)
                )?;
                let mut flags = Vec::new();
                if set.flags.dynamic {
                    flags.push("dynamic");
                }
                if set.flags.timeout {
                    flags.push("timeout");
                }
                if !flags.is_empty() {
                    write!(f, " flags {};", flags.join(","))?;
                }
                if let Some(t) = set.timeout_ms {
                    write!(f, " timeout {t}ms;")?;
                }
                write!(f, " }}")
            }
            Op::DeleteSet {
                family,
                table,
                name,
            } => write!(f, "delete set {} {table} {name}", family.nft_name()),
            Op::AddElements {
                family,
                table,
                set,
                elements,
            } => {
                write!(f, "add element {} {table} {set} ", family.nft_name())?;
                fmt_elements(f, elements)
            }
            Op::DeleteElements {
                family,
                table,
                set,
                elements,
            } => {
                write!(f, "delete element {} {table} {set} ", family.nft_name())?;
                fmt_elements(f, elements)
            }
        }
    }
}

/// A rule as found in a dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleState {
    /// Kernel rule handle.
    pub handle: u64,
    /// The full stored comment (including our `#<fingerprint>` tag).
    pub comment: String,
    /// The fingerprint parsed from the comment, if it carries one.
    pub fingerprint: Option<u64>,
}

/// What a table holds, as dumped from the kernel.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TableState {
    /// Chains in kernel order.
    pub chains: Vec<Chain>,
    /// Named, non-anonymous sets and verdict maps.
    pub sets: Vec<Set>,
    /// Elements per set name.
    pub elements: BTreeMap<String, Vec<Element>>,
    /// Rules per chain name, in chain order.
    pub rules: BTreeMap<String, Vec<RuleState>>,
}

/// A blocking nf_tables netlink socket.
pub struct NftSocket {
    sock: Socket,
    seq: u32,
    sent: u64,
    bufsize: usize,
    rbuf: Vec<u8>,
}

impl fmt::Debug for NftSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NftSocket")
            .field("seq", &self.seq)
            .field("sent", &self.sent)
            .finish()
    }
}

/// One received netlink message (header fields and payload after the header).
struct Msg<'a> {
    ty: u16,
    flags: u16,
    seq: u32,
    payload: &'a [u8],
}

fn split_msgs(b: &[u8]) -> Vec<Msg<'_>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + NLMSG_HDRLEN <= b.len() {
        let len = u32::from_ne_bytes(b[i..i + 4].try_into().unwrap_or_default()) as usize;
        if len < NLMSG_HDRLEN || i + len > b.len() {
            break;
        }
        out.push(Msg {
            ty: u16::from_ne_bytes([b[i + 4], b[i + 5]]),
            flags: u16::from_ne_bytes([b[i + 6], b[i + 7]]),
            seq: u32::from_ne_bytes(b[i + 8..i + 12].try_into().unwrap_or_default()),
            payload: &b[i + NLMSG_HDRLEN..i + len],
        });
        i += len.div_ceil(4) * 4;
    }
    out
}

/// `(positive errno, ext-ack message)` of an NLMSG_ERROR payload.
fn parse_error(m: &Msg<'_>) -> (i32, Option<String>) {
    let p = m.payload;
    let err = p
        .get(..4)
        .map(|b| i32::from_ne_bytes(b.try_into().unwrap_or_default()))
        .unwrap_or(-libc::EIO);
    let mut text = None;
    if m.flags & NLM_F_ACK_TLVS != 0 {
        let orig_len = if m.flags & NLM_F_CAPPED != 0 {
            NLMSG_HDRLEN
        } else {
            p.get(4..8)
                .map(|b| u32::from_ne_bytes(b.try_into().unwrap_or_default()) as usize)
                .unwrap_or(0)
        };
        let off = (4 + orig_len).div_ceil(4) * 4;
        if let Some(tlvs) = p.get(off..) {
            for (t, v) in codec::attrs(tlvs) {
                if t == NLMSGERR_ATTR_MSG {
                    let end = v.iter().position(|&c| c == 0).unwrap_or(v.len());
                    text = Some(String::from_utf8_lossy(&v[..end]).into_owned());
                }
            }
        }
    }
    (-err, text)
}

fn set_int_opt(fd: i32, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `fd` is a valid open socket owned by the caller; we pass a pointer to a
    // live c_int and its exact size, as setsockopt(2) requires.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast::<libc::c_void>(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl NftSocket {
    /// Open and bind a NETLINK_NETFILTER socket in the calling thread's netns.
    pub fn new() -> Result<Self, NftError> {
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(NftError::Socket)?;
        sock.bind_auto().map_err(NftError::Socket)?;
        sock.set_cap_ack(true).map_err(NftError::Socket)?;
        sock.set_ext_ack(true).map_err(NftError::Socket)?;
        let mut s = NftSocket {
            sock,
            seq: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as u32)
                .unwrap_or(1),
            sent: 0,
            bufsize: 0,
            rbuf: Vec::with_capacity(RECV_BUF),
        };
        s.ensure_bufsize(MIN_SOCKBUF)?;
        Ok(s)
    }

    /// Netlink messages sent so far (batch markers and requests included).
    pub fn messages_sent(&self) -> u64 {
        self.sent
    }

    fn ensure_bufsize(&mut self, want: usize) -> Result<(), NftError> {
        if want <= self.bufsize {
            return Ok(());
        }
        let size = want.max(MIN_SOCKBUF).min(i32::MAX as usize / 2) as i32;
        let fd = self.sock.as_raw_fd();
        set_int_opt(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, size).map_err(NftError::Socket)?;
        set_int_opt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, size).map_err(NftError::Socket)?;
        self.bufsize = size as usize;
        Ok(())
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn send(&mut self, buf: &[u8], messages: usize) -> Result<(), NftError> {
        let n = self.sock.send(buf, 0).map_err(|source| NftError::Send {
            messages,
            bytes: buf.len(),
            source,
        })?;
        if n != buf.len() {
            return Err(NftError::Send {
                messages,
                bytes: buf.len(),
                source: io::Error::other(format!("short send: {n} of {} bytes", buf.len())),
            });
        }
        self.sent += messages as u64;
        Ok(())
    }

    /// Receive one datagram into `self.rbuf`.
    fn recv(&mut self) -> Result<(), NftError> {
        self.rbuf.clear();
        let n = self
            .sock
            .recv(&mut self.rbuf, libc::MSG_TRUNC)
            .map_err(NftError::Recv)?;
        if n > self.rbuf.len() {
            return Err(NftError::Recv(io::Error::other(format!(
                "netlink datagram of {n} bytes truncated"
            ))));
        }
        Ok(())
    }

    /// Apply `ops` as one atomic nf_tables transaction: all or nothing.
    pub fn apply(&mut self, ops: &[Op]) -> Result<(), NftError> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut w = Writer::default();
        let first_seq = self.next_seq();
        let p = w.msg_start(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            first_seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        w.msg_end(p);
        // owner[k] = op index of the message with seq first_seq + 1 + k
        let mut owner: Vec<usize> = Vec::with_capacity(ops.len());
        let mut set_id: u32 = 0;
        for (idx, op) in ops.iter().enumerate() {
            let mut msg = |w: &mut Writer,
                           ty: u16,
                           flags: u16,
                           family: Family,
                           body: &dyn Fn(&mut Writer)| {
                let seq = self.next_seq();
                owner.push(idx);
                let p = w.msg_start(
                    nft_type(ty),
                    NLM_F_REQUEST | flags,
                    seq,
                    family.nfproto(),
                    0,
                );
                body(w);
                w.msg_end(p);
            };
            match op {
                Op::AddTable { family, name } => {
                    msg(&mut w, NFT_MSG_NEWTABLE, NLM_F_CREATE, *family, &|w| {
                        encode_table(w, name)
                    })
                }
                Op::DeleteTable { family, name } => {
                    msg(&mut w, NFT_MSG_DELTABLE, 0, *family, &|w| {
                        encode_table_name(w, name)
                    })
                }
                Op::AddChain {
                    family,
                    table,
                    chain,
                } => msg(&mut w, NFT_MSG_NEWCHAIN, NLM_F_CREATE, *family, &|w| {
                    encode_chain(w, table, chain)
                }),
                Op::DeleteChain {
                    family,
                    table,
                    name,
                } => msg(&mut w, NFT_MSG_DELCHAIN, 0, *family, &|w| {
                    encode_chain_ref(w, table, name)
                }),
                Op::FlushChain {
                    family,
                    table,
                    name,
                } => msg(&mut w, NFT_MSG_DELRULE, 0, *family, &|w| {
                    encode_flush_chain(w, table, name)
                }),
                Op::AddRule {
                    family,
                    table,
                    rule,
                } => msg(
                    &mut w,
                    NFT_MSG_NEWRULE,
                    NLM_F_CREATE | NLM_F_APPEND,
                    *family,
                    &|w| encode_rule(w, table, rule),
                ),
                Op::AddSet { family, table, set } => {
                    set_id += 1;
                    let id = set_id;
                    msg(&mut w, NFT_MSG_NEWSET, NLM_F_CREATE, *family, &|w| {
                        encode_set(w, table, set, id)
                    })
                }
                Op::DeleteSet {
                    family,
                    table,
                    name,
                } => msg(&mut w, NFT_MSG_DELSET, 0, *family, &|w| {
                    encode_set_ref(w, table, name)
                }),
                Op::AddElements {
                    family,
                    table,
                    set,
                    elements,
                } => {
                    for chunk in element_chunks(elements, true) {
                        msg(&mut w, NFT_MSG_NEWSETELEM, NLM_F_CREATE, *family, &|w| {
                            encode_elem_list(w, table, set, &chunk)
                        });
                    }
                }
                Op::DeleteElements {
                    family,
                    table,
                    set,
                    elements,
                } => {
                    for chunk in element_chunks(elements, false) {
                        msg(&mut w, NFT_MSG_DELSETELEM, 0, *family, &|w| {
                            encode_elem_list(w, table, set, &chunk)
                        });
                    }
                }
            }
        }
        let end_seq = self.next_seq();
        let p = w.msg_start(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            end_seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        w.msg_end(p);

        self.ensure_bufsize(w.buf.len().saturating_mul(2))?;
        let count = owner.len() + 2;
        tracing::debug!(
            ops = ops.len(),
            messages = count,
            bytes = w.buf.len(),
            "sending nf_tables batch"
        );
        self.send(&w.buf, count)?;

        // Fence: the GETGEN reply arrives after every error the batch produced.
        let fence = self.send_getgen()?;
        let mut first_err: Option<(u32, i32, Option<String>)> = None;
        loop {
            self.recv()?;
            let mut done = false;
            for m in split_msgs(&self.rbuf) {
                if m.ty == NLMSG_ERROR {
                    let (errno, text) = parse_error(&m);
                    if errno == 0 {
                        continue;
                    }
                    if m.seq == fence {
                        return Err(NftError::Dump {
                            what: "generation".into(),
                            errno,
                        });
                    }
                    let off = m.seq.wrapping_sub(first_seq);
                    if off <= end_seq.wrapping_sub(first_seq)
                        && first_err
                            .as_ref()
                            .is_none_or(|(s, _, _)| off < s.wrapping_sub(first_seq))
                    {
                        first_err = Some((m.seq, errno, text));
                    }
                } else if m.seq == fence && m.ty == nft_type(NFT_MSG_NEWGEN) {
                    done = true;
                }
            }
            if done {
                break;
            }
        }
        match first_err {
            None => Ok(()),
            Some((seq, errno, message)) => {
                let off = seq.wrapping_sub(first_seq) as usize;
                let (index, op) = if off == 0 || off > owner.len() {
                    (ops.len(), "batch".to_string())
                } else {
                    let i = owner[off - 1];
                    (i, truncate(ops[i].to_string(), 512))
                };
                Err(NftError::BatchRejected {
                    index,
                    op,
                    errno,
                    message,
                })
            }
        }
    }

    fn send_getgen(&mut self) -> Result<u32, NftError> {
        let seq = self.next_seq();
        let mut w = Writer::default();
        let p = w.msg_start(nft_type(NFT_MSG_GETGEN), NLM_F_REQUEST, seq, 0, 0);
        w.msg_end(p);
        self.send(&w.buf, 1)?;
        Ok(seq)
    }

    /// The current nf_tables ruleset generation (`NFTA_GEN_ID`).
    pub fn generation(&mut self) -> Result<u32, NftError> {
        let seq = self.send_getgen()?;
        loop {
            self.recv()?;
            for m in split_msgs(&self.rbuf) {
                if m.seq != seq {
                    continue;
                }
                if m.ty == NLMSG_ERROR {
                    let (errno, _) = parse_error(&m);
                    return Err(NftError::Dump {
                        what: "generation".into(),
                        errno,
                    });
                }
                if m.ty == nft_type(NFT_MSG_NEWGEN) {
                    return m
                        .payload
                        .get(NFGENMSG_LEN..)
                        .and_then(parse_gen)
                        .ok_or_else(|| NftError::Decode {
                            what: "generation".into(),
                            detail: "no NFTA_GEN_ID".into(),
                        });
                }
            }
        }
    }

    /// Send a request and collect the payloads (after `nfgenmsg`) of its replies.
    /// Dumps are retried when interrupted by a concurrent ruleset change.
    fn request(
        &mut self,
        what: &str,
        msg: u16,
        flags: u16,
        family: Family,
        body: &dyn Fn(&mut Writer),
    ) -> Result<Vec<Vec<u8>>, NftError> {
        for _ in 0..DUMP_RETRIES {
            let seq = self.next_seq();
            let mut w = Writer::default();
            let p = w.msg_start(
                nft_type(msg),
                NLM_F_REQUEST | flags,
                seq,
                family.nfproto(),
                0,
            );
            body(&mut w);
            w.msg_end(p);
            self.send(&w.buf, 1)?;
            let mut out = Vec::new();
            let mut interrupted = false;
            let is_dump = flags & NLM_F_DUMP != 0;
            'recv: loop {
                self.recv()?;
                for m in split_msgs(&self.rbuf) {
                    if m.seq != seq {
                        continue;
                    }
                    if m.flags & NLM_F_DUMP_INTR != 0 {
                        interrupted = true;
                    }
                    match m.ty {
                        NLMSG_DONE => break 'recv,
                        NLMSG_ERROR => {
                            let (errno, _) = parse_error(&m);
                            if errno == 0 {
                                break 'recv;
                            }
                            return Err(NftError::Dump {
                                what: what.to_string(),
                                errno,
                            });
                        }
                        _ => {
                            out.push(m.payload.get(NFGENMSG_LEN..).unwrap_or_default().to_vec());
                            if !is_dump {
                                break 'recv;
                            }
                        }
                    }
                }
            }
            if !interrupted {
                return Ok(out);
            }
            tracing::debug!(what, "nf_tables dump interrupted, retrying");
        }
        Err(NftError::Dump {
            what: what.to_string(),
            errno: libc::EINTR,
        })
    }

    /// Dump one table: chains, sets, their elements and rules. `None` when the
    /// table does not exist.
    pub fn dump_table(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<TableState>, NftError> {
        match self.request("table", NFT_MSG_GETTABLE, 0, family, &|w| {
            encode_table_name(w, table)
        }) {
            Ok(msgs) => {
                if !msgs
                    .iter()
                    .any(|m| parse_table_name(m).as_deref() == Some(table))
                {
                    return Ok(None);
                }
            }
            Err(NftError::Dump { errno, .. }) if errno == libc::ENOENT => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut state = TableState::default();

        let chains = self.request("chains", NFT_MSG_GETCHAIN, NLM_F_DUMP, family, &|w| {
            encode_chain_ref_table(w, table)
        })?;
        state.chains.extend(
            chains
                .iter()
                .filter_map(|m| parse_chain(m))
                .filter(|(t, _)| t == table)
                .map(|(_, c)| c),
        );

        let sets = self.request("sets", NFT_MSG_GETSET, NLM_F_DUMP, family, &|w| {
            encode_set_table(w, table)
        })?;
        for m in &sets {
            match parse_set(m) {
                Some(ParsedSet::Set(t, s)) if t == table => state.sets.push(s),
                Some(ParsedSet::BadKey(name, ktype, klen)) => {
                    return Err(NftError::Decode {
                        what: format!("set {name}"),
                        detail: format!("unsupported key type {ktype:#x} (len {klen})"),
                    });
                }
                _ => {}
            }
        }

        for s in &state.sets {
            let msgs = self.request(
                &format!("elements of {}", s.name),
                NFT_MSG_GETSETELEM,
                NLM_F_DUMP,
                family,
                &|w| encode_elem_list_ref(w, table, &s.name),
            )?;
            let mut elems = Vec::new();
            let mut skipped = 0;
            for m in &msgs {
                skipped += parse_elements(m, &s.key, &mut elems);
            }
            if skipped > 0 {
                tracing::warn!(set = %s.name, skipped, "undecodable set elements in dump");
            }
            state.elements.insert(s.name.clone(), elems);
        }

        let rules = self.request("rules", NFT_MSG_GETRULE, NLM_F_DUMP, family, &|w| {
            encode_flush_chain_table(w, table)
        })?;
        for m in &rules {
            if let Some(r) = parse_rule(m) {
                if r.table != table {
                    continue;
                }
                let (_, fingerprint) = parse_comment(&r.comment);
                state.rules.entry(r.chain).or_default().push(RuleState {
                    handle: r.handle,
                    comment: r.comment,
                    fingerprint,
                });
            }
        }
        Ok(Some(state))
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}
