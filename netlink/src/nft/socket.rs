//! A blocking NETLINK_NETFILTER socket that applies atomic nf_tables batches and
//! dumps tables.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

use netlink_packet_core::{
    ErrorContext, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NetlinkBuffer, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, Parseable,
};
use netlink_packet_netfilter::nftables::NfTablesMessage;
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterMessageInner};

use super::codec::*;
use super::types::*;
use crate::sock::{error_info, set_int_opt};

const MIN_SOCKBUF: usize = 8 << 20;
/// `struct nlmsghdr` and `struct nfgenmsg` sizes.
const NETLINK_HEADER_LEN: usize = 16;
const NFGENMSG_LEN: usize = 4;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWSETELEM`.
const NEWSETELEM: u16 = (10 << 8) | 12;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWRULE`.
const NEWRULE: u16 = (10 << 8) | 6;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWSET`.
const NEWSET: u16 = (10 << 8) | 9;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWTABLE`.
const NEWTABLE: u16 = 10 << 8;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWCHAIN`.
const NEWCHAIN: u16 = (10 << 8) | 3;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWGEN`.
const NEWGEN: u16 = (10 << 8) | 15;
/// `NLMSG_MIN_TYPE`: types below are netlink control messages.
const NLMSG_MIN_TYPE: u16 = 0x10;
const RECV_BUF: usize = 1 << 20;
const DUMP_RETRIES: usize = 5;
/// Elements one lookup request asks for: each reply is a datagram of about a
/// page of receive buffer, and the kernel ends the request with `ENOBUFS`
/// when they do not fit (512 take some 4 MiB of the 8 MiB minimum).
const LOOKUP_CHUNK: usize = 512;

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
    /// `delete rule … handle H`: one rule, by its kernel handle (rules of tables
    /// we do not own: kube-proxy's jumps in iptables-nft's tables).
    DeleteRule {
        /// family
        family: Family,
        /// table name
        table: String,
        /// chain name
        chain: String,
        /// the rule's handle
        handle: u64,
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
            Op::DeleteRule {
                family,
                table,
                chain,
                handle,
            } => write!(
                f,
                "delete rule {} {table} {chain} handle {handle}",
                family.nft_name()
            ),
            Op::AddRule {
                family,
                table,
                rule,
            } => {
                write!(
                    f,
                    "add rule {} {table} {} {} comment \"{}\"",
                    family.nft_name(),
                    rule.chain,
                    super::text::rule_text(*family, &rule.exprs),
                    rule_comment(rule)
                )
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
    /// The comment (what `nft list` prints; empty when none).
    pub comment: String,
    /// Our fingerprint (userdata TLV [`super::codec::KNLP_UDATA_RULE_FINGERPRINT`];
    /// for a rule written before 0.2, the `#<hex>` tag its comment ended in).
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

/// What the last [`NftSocket::apply`] sent and how long the kernel took with it
/// (all zero when that call had nothing to send).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Netlink messages of the batch, `BATCH_BEGIN` and `BATCH_END` included (the
    /// generation request that fences the acks is not counted).
    pub messages: usize,
    /// Bytes of the batch.
    pub bytes: usize,
    /// From just before the batch's `sendmsg` until the reply that follows its
    /// last ack has been received: nfnetlink validates and commits the batch
    /// inside `sendmsg`, so this is the kernel's share of the apply (plus
    /// reading the acks).
    pub kernel: Duration,
    /// The batch's `sendmsg` call alone (the synchronous validate + commit).
    pub send: Duration,
}

/// A blocking nf_tables netlink socket.
pub struct NftSocket {
    sock: Socket,
    seq: u32,
    sent: u64,
    bufsize: usize,
    rbuf: Vec<u8>,
    last_apply: ApplyStats,
    faults: std::collections::VecDeque<InjectedFault>,
}

/// A kernel failure the socket plays instead of (or on top of) the next
/// request, so tests of the callers can make the kernel fail on demand: see
/// [`NftSocket::inject_fault`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectedFault {
    /// The next batch is rejected with this errno (`EINVAL`, `EPERM`,
    /// `EBUSY`, …) and nothing of it is sent, as the kernel applies nothing of
    /// a rejected batch.
    Batch(i32),
    /// The next `pass` batches go to the kernel as usual; the one after them
    /// is rejected with `errno` as [`Batch`](Self::Batch) is. Fails a sync
    /// that sends several transactions (a cold start) in its middle.
    BatchAfter {
        /// Batches let through first.
        pass: u32,
        /// The errno of the rejected batch.
        errno: i32,
    },
    /// The next dump or get request fails with this errno.
    Dump(i32),
    /// The next dump is interrupted by a concurrent ruleset change
    /// (`NLM_F_DUMP_INTR`): the dump is retried.
    DumpInterrupted,
    /// The next dump overruns the receive buffer (`ENOBUFS`): the buffer is
    /// doubled and the dump retried.
    RecvOverrun,
}

impl InjectedFault {
    /// Whether the fault is played on a batch (else on a dump or get request).
    fn is_batch(&self) -> bool {
        matches!(
            self,
            InjectedFault::Batch(_) | InjectedFault::BatchAfter { .. }
        )
    }
}

impl fmt::Debug for NftSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NftSocket")
            .field("seq", &self.seq)
            .field("sent", &self.sent)
            .finish()
    }
}

/// One received netlink message: its header and its bytes (header included).
pub(crate) struct Received<'a> {
    pub(crate) header: NetlinkHeader,
    pub(crate) bytes: &'a [u8],
}

impl Received<'_> {
    /// The message decoded through netlink-packet-netfilter; `what` names the
    /// request it answers, for the error.
    pub(crate) fn decode(&self, what: &str) -> Result<NetlinkPayload<NetfilterMessage>, NftError> {
        // Set, set-element and rule dumps have their own one-pass decoders (see
        // `parse_set_message`, `parse_set_element_message`, `parse_rule_message`).
        let t = self.header.message_type;
        if t == NEWSET || t == NEWSETELEM || t == NEWRULE {
            let payload = &self.bytes[NETLINK_HEADER_LEN.min(self.bytes.len())..];
            let header = NetfilterHeader::parse(payload).map_err(|e| NftError::Decode {
                what: what.to_string(),
                detail: e.to_string(),
            })?;
            let body = payload.get(NFGENMSG_LEN..).unwrap_or_default();
            let inner = match t {
                NEWSET => NfTablesMessage::NewSet(parse_set_message(body)),
                NEWSETELEM => NfTablesMessage::NewSetElement(parse_set_element_message(body)),
                _ => NfTablesMessage::NewRule(parse_rule_message(body)),
            };
            return Ok(NetlinkPayload::InnerMessage(NetfilterMessage::new(
                header, inner,
            )));
        }
        // Only control messages (error, done) and the kinds we read go through the
        // crate's parser: its set parser slices a short nested attribute out of
        // bounds, and DELSET, GETSET … share it (found by the `nft_datagram` fuzz
        // target). No reply of ours has another kind, so it is nothing for us.
        if t >= NLMSG_MIN_TYPE && t != NEWTABLE && t != NEWCHAIN && t != NEWGEN {
            return Ok(NetlinkPayload::Noop);
        }
        NetlinkMessage::<NetfilterMessage>::deserialize(self.bytes)
            .with_context(|| {
                format!(
                    "netlink message type {:#06x} seq {}",
                    self.header.message_type, self.header.sequence_number
                )
            })
            .map(|m| m.payload)
            .map_err(|e| NftError::Decode {
                what: what.to_string(),
                detail: e.to_string(),
            })
    }
}

/// Split a datagram into its netlink messages (headers only are decoded here, so
/// that messages of other requests never fail this one).
pub(crate) fn split_msgs(b: &[u8]) -> Result<Vec<Received<'_>>, NftError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let buf = NetlinkBuffer::new_checked(&b[i..])
            .and_then(|buf| NetlinkHeader::parse(&buf))
            .with_context(|| format!("netlink message at offset {i} of {}", b.len()))
            .map_err(|e| NftError::Decode {
                what: "netlink datagram".into(),
                detail: e.to_string(),
            })?;
        let len = buf.length as usize;
        out.push(Received {
            header: buf,
            bytes: &b[i..i + len],
        });
        i += len.div_ceil(4) * 4;
    }
    Ok(out)
}

/// A serialized batch: `BATCH_BEGIN`, the ops' messages, `BATCH_END`, in one buffer.
pub(crate) struct Batch {
    pub(crate) buf: Vec<u8>,
    /// `owner[k]` = index of the op whose message has sequence `first_seq + 1 + k`.
    pub(crate) owner: Vec<usize>,
    pub(crate) first_seq: u32,
    pub(crate) end_seq: u32,
}

/// The netlink messages of one op (several for large element lists).
fn op_messages(op: &Op, set_id: &mut u32) -> (Family, Vec<NfTablesMessage>) {
    match op {
        Op::AddTable { family, name } => (*family, vec![new_table(name)]),
        Op::DeleteTable { family, name } => (*family, vec![delete_table(name)]),
        Op::AddChain {
            family,
            table,
            chain,
        } => (*family, vec![new_chain(table, chain)]),
        Op::DeleteChain {
            family,
            table,
            name,
        } => (*family, vec![delete_chain(table, name)]),
        Op::FlushChain {
            family,
            table,
            name,
        } => (*family, vec![flush_chain(table, name)]),
        Op::DeleteRule {
            family,
            table,
            chain,
            handle,
        } => (*family, vec![delete_rule(table, chain, *handle)]),
        Op::AddRule {
            family,
            table,
            rule,
        } => (*family, vec![new_rule(table, rule)]),
        Op::AddSet { family, table, set } => {
            *set_id += 1;
            (*family, vec![new_set(table, set, *set_id)])
        }
        Op::DeleteSet {
            family,
            table,
            name,
        } => (*family, vec![delete_set(table, name)]),
        Op::AddElements {
            family,
            table,
            set,
            elements,
        } => (*family, element_messages(table, set, elements, true)),
        Op::DeleteElements {
            family,
            table,
            set,
            elements,
        } => (*family, element_messages(table, set, elements, false)),
    }
}

/// Serialize `ops` as one batch, numbering messages with `next_seq`.
pub(crate) fn encode_batch(ops: &[Op], next_seq: &mut dyn FnMut() -> u32) -> Batch {
    let mut buf = Vec::new();
    let first_seq = next_seq();
    serialize_into(
        &mut buf,
        &batch_marker(ControlMessage::BatchBegin, first_seq),
    );
    let mut owner = Vec::with_capacity(ops.len());
    let mut set_id = 0;
    for (idx, op) in ops.iter().enumerate() {
        let (family, msgs) = op_messages(op, &mut set_id);
        for m in msgs {
            let flags = batch_flags(&m);
            owner.push(idx);
            let msg = nft_request(family.nfproto(), 0, flags, next_seq(), m);
            serialize_into(&mut buf, &msg);
        }
    }
    let end_seq = next_seq();
    serialize_into(&mut buf, &batch_marker(ControlMessage::BatchEnd, end_seq));
    Batch {
        buf,
        owner,
        first_seq,
        end_seq,
    }
}

/// What one reply of a request carried.
enum Reply {
    /// An nf_tables message.
    Msg(Box<NfTablesMessage>),
    /// The end of the replies (`NLMSG_DONE`, or an ack).
    End,
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
            last_apply: ApplyStats::default(),
            faults: Default::default(),
        };
        s.ensure_bufsize(MIN_SOCKBUF)?;
        Ok(s)
    }

    /// Makes the next matching request fail as `fault` says (faults queue up
    /// and are played in order). For tests of what callers do when the kernel
    /// fails; a socket nobody injects into never fails on its own.
    pub fn inject_fault(&mut self, fault: InjectedFault) {
        self.faults.push_back(fault);
    }

    fn take_fault(&mut self, pick: impl Fn(&InjectedFault) -> bool) -> Option<InjectedFault> {
        let i = self.faults.iter().position(pick)?;
        self.faults.remove(i)
    }

    /// The errno the next batch is rejected with, if a queued fault says so
    /// (a [`InjectedFault::BatchAfter`] still letting batches through counts
    /// this one down instead).
    fn take_batch_fault(&mut self) -> Option<i32> {
        let i = self.faults.iter().position(InjectedFault::is_batch)?;
        match &mut self.faults[i] {
            InjectedFault::BatchAfter { pass, .. } if *pass > 0 => {
                *pass -= 1;
                None
            }
            InjectedFault::Batch(errno) | InjectedFault::BatchAfter { errno, .. } => {
                let errno = *errno;
                self.faults.remove(i);
                Some(errno)
            }
            _ => None,
        }
    }

    /// The socket's current receive and send buffer size.
    pub fn buffer_size(&self) -> usize {
        self.bufsize
    }

    /// Netlink messages sent so far (batch markers and requests included).
    pub fn messages_sent(&self) -> u64 {
        self.sent
    }

    /// Messages, bytes and kernel time of the last [`apply`](Self::apply) call,
    /// successful or rejected.
    pub fn last_apply_stats(&self) -> ApplyStats {
        self.last_apply
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

    /// Replaces the socket with a fresh one whose buffers hold `bufsize` bytes.
    fn reopen(&mut self, bufsize: usize) -> Result<(), NftError> {
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(NftError::Socket)?;
        sock.bind_auto().map_err(NftError::Socket)?;
        sock.set_cap_ack(true).map_err(NftError::Socket)?;
        sock.set_ext_ack(true).map_err(NftError::Socket)?;
        self.sock = sock;
        self.bufsize = 0;
        self.ensure_bufsize(bufsize)
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
        self.last_apply = ApplyStats::default();
        if ops.is_empty() {
            return Ok(());
        }
        if let Some(errno) = self.take_batch_fault() {
            return Err(NftError::BatchRejected {
                index: 0,
                op: ops[0].to_string(),
                errno,
                message: Some("injected fault".into()),
            });
        }
        let Batch {
            buf,
            owner,
            first_seq,
            end_seq,
        } = encode_batch(ops, &mut || self.next_seq());

        self.ensure_bufsize(buf.len().saturating_mul(2))?;
        let count = owner.len() + 2;
        tracing::debug!(
            ops = ops.len(),
            messages = count,
            bytes = buf.len(),
            "sending nf_tables batch"
        );
        self.last_apply.messages = count;
        self.last_apply.bytes = buf.len();
        let started = Instant::now();
        self.send(&buf, count)?;
        self.last_apply.send = started.elapsed();

        // Fence: the GETGEN reply arrives after every error the batch produced.
        let fence = self.send_getgen()?;
        let mut first_err: Option<(u32, i32, Option<String>)> = None;
        loop {
            self.recv()?;
            let mut done = false;
            for m in split_msgs(&self.rbuf)? {
                let seq = m.header.sequence_number;
                let off = seq.wrapping_sub(first_seq);
                let ours = off <= end_seq.wrapping_sub(first_seq);
                if seq != fence && !ours {
                    continue;
                }
                match m.decode("batch reply")? {
                    NetlinkPayload::Error(e) => {
                        let (errno, text) = error_info(m.header.flags, &e);
                        if errno == 0 {
                            continue;
                        }
                        if seq == fence {
                            return Err(NftError::Dump {
                                what: "generation".into(),
                                errno,
                            });
                        }
                        if first_err
                            .as_ref()
                            .is_none_or(|(s, _, _)| off < s.wrapping_sub(first_seq))
                        {
                            first_err = Some((seq, errno, text));
                        }
                    }
                    NetlinkPayload::InnerMessage(NetfilterMessage {
                        inner: NetfilterMessageInner::NfTables(NfTablesMessage::NewGen(_)),
                        ..
                    }) if seq == fence => done = true,
                    _ => {}
                }
            }
            if done {
                break;
            }
        }
        self.last_apply.kernel = started.elapsed();
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
        let mut buf = Vec::new();
        serialize_into(&mut buf, &nft_request(0, 0, 0, seq, get_gen()));
        self.send(&buf, 1)?;
        Ok(seq)
    }

    /// The current nf_tables ruleset generation (`NFTA_GEN_ID`).
    pub fn generation(&mut self) -> Result<u32, NftError> {
        let seq = self.send_getgen()?;
        loop {
            self.recv()?;
            for m in split_msgs(&self.rbuf)? {
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.decode("generation")? {
                    NetlinkPayload::Error(e) => {
                        let (errno, _) = error_info(m.header.flags, &e);
                        return Err(NftError::Dump {
                            what: "generation".into(),
                            errno,
                        });
                    }
                    NetlinkPayload::InnerMessage(NetfilterMessage {
                        inner: NetfilterMessageInner::NfTables(NfTablesMessage::NewGen(g)),
                        ..
                    }) => {
                        return parse_gen(&g).ok_or_else(|| NftError::Decode {
                            what: "generation".into(),
                            detail: "no NFTA_GEN_ID".into(),
                        });
                    }
                    _ => {}
                }
            }
        }
    }

    /// Send a request and collect the nf_tables messages of its replies. Dumps are
    /// retried when interrupted by a concurrent ruleset change.
    fn request(
        &mut self,
        what: &str,
        family: Family,
        msg: &NfTablesMessage,
    ) -> Result<Vec<NfTablesMessage>, NftError> {
        let flags = batch_flags(msg);
        let is_dump = flags & NLM_F_DUMP != 0;
        for _ in 0..DUMP_RETRIES {
            let fault = self.take_fault(|f| !f.is_batch());
            if let Some(InjectedFault::Dump(errno)) = fault {
                return Err(NftError::Dump {
                    what: what.to_string(),
                    errno,
                });
            }
            let seq = self.next_seq();
            let mut buf = Vec::new();
            serialize_into(
                &mut buf,
                &nft_request(family.nfproto(), 0, flags, seq, msg.clone()),
            );
            self.send(&buf, 1)?;
            let mut out = Vec::new();
            let mut interrupted = fault == Some(InjectedFault::DumpInterrupted);
            let mut overrun = fault == Some(InjectedFault::RecvOverrun);
            'recv: loop {
                let received = if std::mem::take(&mut overrun) {
                    Err(NftError::Recv(io::Error::from_raw_os_error(libc::ENOBUFS)))
                } else {
                    self.recv()
                };
                match received {
                    Ok(()) => {}
                    // The replies outgrew the socket buffer and some were
                    // dropped: the dump again, on a fresh socket with twice the
                    // buffer (the kernel allows one dump at a time per socket,
                    // and the broken one may still be running on the old one).
                    Err(NftError::Recv(e))
                        if is_dump && e.raw_os_error() == Some(libc::ENOBUFS) =>
                    {
                        let bigger = self.bufsize.saturating_mul(2);
                        tracing::debug!(
                            what,
                            bufsize = bigger,
                            "nf_tables dump overran its buffer, retrying"
                        );
                        self.reopen(bigger)?;
                        interrupted = true;
                        break 'recv;
                    }
                    Err(e) => return Err(e),
                }
                for m in split_msgs(&self.rbuf)? {
                    if m.header.sequence_number != seq {
                        continue;
                    }
                    if m.header.flags & NLM_F_DUMP_INTR != 0 {
                        interrupted = true;
                    }
                    let reply = match m.decode(what)? {
                        NetlinkPayload::Done(_) => Reply::End,
                        NetlinkPayload::Error(e) => {
                            let (errno, _) = error_info(m.header.flags, &e);
                            if errno != 0 {
                                return Err(NftError::Dump {
                                    what: what.to_string(),
                                    errno,
                                });
                            }
                            Reply::End
                        }
                        NetlinkPayload::InnerMessage(NetfilterMessage {
                            inner: NetfilterMessageInner::NfTables(t),
                            ..
                        }) => Reply::Msg(Box::new(t)),
                        // Noop, overrun or another subsystem: nothing for us.
                        _ => continue,
                    };
                    match reply {
                        Reply::End => break 'recv,
                        Reply::Msg(t) => {
                            out.push(*t);
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

    /// The elements of one set (`nft list set FAMILY TABLE NAME`), including those
    /// the packet path added (dynamic sets). `None` when the set does not exist.
    pub fn dump_set_elements(
        &mut self,
        family: Family,
        table: &str,
        set: &Set,
    ) -> Result<Option<Vec<Element>>, NftError> {
        let msgs = match self.request(
            &format!("elements of {}", set.name),
            family,
            &get_elements(table, &set.name),
        ) {
            Ok(msgs) => msgs,
            Err(NftError::Dump { errno, .. }) if errno == libc::ENOENT => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut elements = Vec::new();
        for m in &msgs {
            if let NfTablesMessage::NewSetElement(e) = m {
                parse_elements(e, &set.key, &set.data, &mut elements);
            }
        }
        Ok(Some(elements))
    }

    /// Looks each of `elements` up in `set` by its key (`GETSETELEM` without
    /// `NLM_F_DUMP`, as `nft get element` does) and returns the index of the
    /// first the kernel does not hold exactly as given (missing, or with other
    /// data or comment); `None` when it holds them all. One reply per element
    /// whatever the set's size, where a dump of a big set costs the kernel
    /// time quadratic in it (its walk restarts for every 32 KiB of reply).
    /// Says nothing of elements the set holds besides these; a set that does
    /// not exist holds none (`Some(0)`).
    pub fn find_unheld_element(
        &mut self,
        family: Family,
        table: &str,
        set: &Set,
        elements: &[&Element],
    ) -> Result<Option<usize>, NftError> {
        let what = || format!("lookup in set {}", set.name);
        if let Some(InjectedFault::Dump(errno)) =
            self.take_fault(|f| matches!(f, InjectedFault::Dump(_)))
        {
            return Err(NftError::Dump {
                what: what(),
                errno,
            });
        }
        let mut got = Vec::new();
        for (chunk_index, chunk) in elements.chunks(LOOKUP_CHUNK).enumerate() {
            let base = chunk_index * LOOKUP_CHUNK;
            let seq = self.next_seq();
            let mut buf = Vec::new();
            let msg = lookup_elements(table, &set.name, chunk);
            serialize_into(
                &mut buf,
                &nft_request(family.nfproto(), 0, NLM_F_ACK, seq, msg),
            );
            self.send(&buf, 1)?;
            // Replies come in the order asked; the ack (or the error of the
            // first missing element) ends them.
            let mut answered = 0;
            let mut first_unheld = None;
            'recv: loop {
                self.recv()?;
                for m in split_msgs(&self.rbuf)? {
                    if m.header.sequence_number != seq {
                        continue;
                    }
                    match m.decode("element lookup")? {
                        NetlinkPayload::Error(e) => {
                            let (errno, _) = error_info(m.header.flags, &e);
                            match errno {
                                0 => {}
                                libc::ENOENT => {
                                    first_unheld.get_or_insert(answered);
                                }
                                _ => {
                                    return Err(NftError::Dump {
                                        what: what(),
                                        errno,
                                    });
                                }
                            }
                            break 'recv;
                        }
                        NetlinkPayload::InnerMessage(NetfilterMessage {
                            inner:
                                NetfilterMessageInner::NfTables(NfTablesMessage::NewSetElement(e)),
                            ..
                        }) => {
                            got.clear();
                            parse_elements(&e, &set.key, &set.data, &mut got);
                            for found in got.drain(..) {
                                if chunk.get(answered).is_none_or(|asked| **asked != found) {
                                    first_unheld.get_or_insert(answered);
                                }
                                answered += 1;
                            }
                        }
                        _ => {}
                    }
                }
            }
            if first_unheld.is_none() && answered < chunk.len() {
                first_unheld = Some(answered);
            }
            if let Some(i) = first_unheld {
                return Ok(Some(base + i.min(chunk.len() - 1)));
            }
        }
        Ok(None)
    }

    /// Dump one table: chains, sets, their elements and rules. `None` when the
    /// table does not exist.
    pub fn dump_table(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<TableState>, NftError> {
        self.dump_table_with(family, table, true)
    }

    /// [`dump_table`](Self::dump_table) without the sets' elements: chains,
    /// rules and set definitions only, a handful of requests whatever the
    /// number of elements (a cheap check that our skeleton is intact).
    pub fn dump_table_skeleton(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<TableState>, NftError> {
        self.dump_table_with(family, table, false)
    }

    fn dump_table_with(
        &mut self,
        family: Family,
        table: &str,
        with_elements: bool,
    ) -> Result<Option<TableState>, NftError> {
        if !self.table_exists(family, table)? {
            return Ok(None);
        }
        let mut state = TableState::default();

        for m in self.request("chains", family, &get_chains(table))? {
            if let NfTablesMessage::NewChain(c) = m
                && let Some((t, chain)) = parse_chain(&c)
                && t == table
            {
                state.chains.push(chain);
            }
        }

        for m in self.request("sets", family, &get_sets(table))? {
            let NfTablesMessage::NewSet(s) = m else {
                continue;
            };
            match parse_set(&s) {
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

        for s in state.sets.iter().filter(|_| with_elements) {
            let msgs = self.request(
                &format!("elements of {}", s.name),
                family,
                &get_elements(table, &s.name),
            )?;
            let mut elems = Vec::new();
            let mut skipped = 0;
            for m in &msgs {
                if let NfTablesMessage::NewSetElement(e) = m {
                    skipped += parse_elements(e, &s.key, &s.data, &mut elems);
                }
            }
            if skipped > 0 {
                tracing::warn!(set = %s.name, skipped, "undecodable set elements in dump");
            }
            state.elements.insert(s.name.clone(), elems);
        }

        for m in self.request("rules", family, &get_rules(table))? {
            let NfTablesMessage::NewRule(r) = m else {
                continue;
            };
            if let Some(r) = parse_rule(&r) {
                if r.table != table {
                    continue;
                }
                state.rules.entry(r.chain).or_default().push(RuleState {
                    handle: r.handle,
                    comment: r.comment,
                    fingerprint: r.fingerprint,
                });
            }
        }
        Ok(Some(state))
    }
}

impl NftSocket {
    /// Whether `table` of `family` exists.
    fn table_exists(&mut self, family: Family, table: &str) -> Result<bool, NftError> {
        match self.request("table", family, &get_table(table)) {
            Ok(msgs) => Ok(msgs.iter().any(|m| match m {
                NfTablesMessage::NewTable(t) => parse_table_name(t) == Some(table),
                _ => false,
            })),
            Err(NftError::Dump { errno, .. }) if errno == libc::ENOENT => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The chains and rules of a table we do not own (`nft -a list table`, without
    /// sets): `None` when it does not exist. For kube-proxy's state, and for the
    /// jumps to it in iptables-nft's `nat`, `filter` and `mangle`.
    pub fn dump_foreign_table(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<ForeignTable>, NftError> {
        if !self.table_exists(family, table)? {
            return Ok(None);
        }
        let mut state = ForeignTable::default();
        for m in self.request("chains", family, &get_chains(table))? {
            if let NfTablesMessage::NewChain(c) = m
                && let Some((t, chain)) = parse_chain(&c)
                && t == table
            {
                state.chains.push(chain.name);
            }
        }
        for m in self.request("rules", family, &get_rules(table))? {
            if let NfTablesMessage::NewRule(r) = m
                && let Some(r) = parse_foreign_rule(&r)
                && r.table == table
            {
                state.rules.push(r);
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
