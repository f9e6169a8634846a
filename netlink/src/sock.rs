//! A small blocking netlink request/reply helper shared by the IPVS, ipset,
//! link and conntrack handles: one socket, sequence numbers, ack and dump loops,
//! extended-ack error text.

use std::fmt;
use std::io;
use std::os::fd::AsRawFd;

use netlink_packet_core::{
    ErrorMessage, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST, NetlinkBuffer, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable, NlasIterator, Parseable, parse_string,
};
use netlink_sys::Socket;

/// `NLMSGERR_ATTR_MSG`: the ext-ack message text.
const NLMSGERR_ATTR_MSG: u16 = 1;
/// Size of `struct nlmsghdr`.
const NETLINK_HEADER_LEN: usize = 16;
/// Socket buffers we ask for (bulk ipset adds, large dumps).
const SOCKBUF: i32 = 4 << 20;
/// Dumps interrupted by concurrent changes are retried this often.
const DUMP_RETRIES: usize = 5;

/// What went wrong talking to the kernel, before a module adds its own context.
#[derive(Debug)]
pub(crate) enum SockError {
    /// socket/bind/setsockopt.
    Open(io::Error),
    /// sendmsg.
    Send(io::Error),
    /// recvmsg.
    Recv(io::Error),
    /// `NLMSG_ERROR` with a non-zero code: positive errno and ext-ack text.
    Kernel { errno: i32, message: Option<String> },
    /// A reply did not decode.
    Decode(String),
}

impl fmt::Display for SockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SockError::Open(e) => write!(f, "opening netlink socket: {e}"),
            SockError::Send(e) => write!(f, "sending netlink request: {e}"),
            SockError::Recv(e) => write!(f, "receiving netlink reply: {e}"),
            SockError::Kernel { errno, message } => {
                write!(
                    f,
                    "{} (errno {errno})",
                    io::Error::from_raw_os_error(*errno)
                )?;
                if let Some(m) = message {
                    write!(f, ": {m}")?;
                }
                Ok(())
            }
            SockError::Decode(d) => write!(f, "decoding netlink reply: {d}"),
        }
    }
}

/// A bound blocking netlink socket in the netns of the thread that opened it.
pub(crate) struct NlSocket {
    sock: Socket,
    seq: u32,
    rbuf: Vec<u8>,
}

impl fmt::Debug for NlSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NlSocket").field("seq", &self.seq).finish()
    }
}

/// `setsockopt(2)` with an int value.
pub(crate) fn set_int_opt(fd: i32, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `fd` is a valid open socket owned by the caller; we pass a pointer to a
    // live c_int and its exact size, as setsockopt(2) requires.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `(positive errno, ext-ack message)` of an `NLMSG_ERROR`. `flags` are the error
/// message's header flags. The crate keeps everything after the error code (the
/// original request's header or message, then the ext-ack TLVs) as raw bytes.
pub(crate) fn error_info(flags: u16, e: &ErrorMessage) -> (i32, Option<String>) {
    let errno = e.code.map_or(0, |c| -c.get());
    let mut text = None;
    if flags & NLM_F_ACK_TLVS != 0 {
        let orig_len = if flags & NLM_F_CAPPED != 0 {
            NETLINK_HEADER_LEN
        } else {
            e.header
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .map(|b| u32::from_ne_bytes(b) as usize)
                .unwrap_or(0)
        };
        if let Some(tlvs) = e.header.get(orig_len.div_ceil(4) * 4..) {
            for nla in NlasIterator::new(tlvs).flatten() {
                if nla.kind() == NLMSGERR_ATTR_MSG {
                    text = parse_string(nla.value()).ok();
                }
            }
        }
    }
    (errno, text)
}

/// The messages of one datagram: each header with the message's bytes.
fn split_datagram(buf: &[u8]) -> Result<Vec<(NetlinkHeader, &[u8])>, SockError> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < buf.len() {
        let bytes = &buf[off..];
        let header = NetlinkBuffer::new_checked(bytes)
            .and_then(|b| NetlinkHeader::parse(&b))
            .map_err(|e| SockError::Decode(format!("netlink header: {e}")))?;
        let len = header.length as usize;
        if len < NETLINK_HEADER_LEN || len > bytes.len() {
            return Err(SockError::Decode(format!(
                "netlink message length {len} at offset {off}"
            )));
        }
        out.push((header, &bytes[..len]));
        off += len.div_ceil(4) * 4;
    }
    Ok(out)
}

impl NlSocket {
    /// Open and bind a socket of `protocol` (e.g. `NETLINK_GENERIC`).
    pub(crate) fn open(protocol: isize) -> Result<Self, SockError> {
        let mut sock = Socket::new(protocol).map_err(SockError::Open)?;
        sock.bind_auto().map_err(SockError::Open)?;
        sock.set_ext_ack(true).map_err(SockError::Open)?;
        let fd = sock.as_raw_fd();
        // Best effort: *FORCE needs CAP_NET_ADMIN, the plain ones are capped by sysctls.
        for (force, plain) in [
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        ] {
            if set_int_opt(fd, libc::SOL_SOCKET, force, SOCKBUF).is_err() {
                let _ = set_int_opt(fd, libc::SOL_SOCKET, plain, SOCKBUF);
            }
        }
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        Ok(NlSocket {
            sock,
            seq,
            rbuf: Vec::with_capacity(1 << 20),
        })
    }

    fn send<T: NetlinkSerializable>(&mut self, flags: u16, msg: T) -> Result<u32, SockError> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = self.seq;
        let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        m.finalize();
        let mut buf = vec![0u8; m.buffer_len()];
        m.serialize(&mut buf);
        let n = self.sock.send(&buf, 0).map_err(SockError::Send)?;
        if n != buf.len() {
            return Err(SockError::Send(io::Error::other(format!(
                "short send: {n} of {} bytes",
                buf.len()
            ))));
        }
        Ok(self.seq)
    }

    /// Send `msg` with `flags` and collect replies until the ack or `NLMSG_DONE`.
    /// `NLM_F_DUMP` is added for dumps, `NLM_F_ACK` for everything else. Returns the inner messages and
    /// whether a dump was interrupted (`NLM_F_DUMP_INTR`).
    fn exchange<T>(
        &mut self,
        flags: u16,
        is_dump: bool,
        msg: T,
    ) -> Result<(Vec<T>, bool), SockError>
    where
        T: NetlinkSerializable + NetlinkDeserializable,
    {
        // NLM_F_EXCL shares its bit with NLM_F_MATCH (half of NLM_F_DUMP), so the
        // caller says whether this is a dump.
        let flags = if is_dump {
            flags | NLM_F_DUMP
        } else {
            flags | NLM_F_ACK
        };
        let seq = self.send(flags, msg)?;
        let mut out = Vec::new();
        let mut interrupted = false;
        loop {
            self.recv_datagram()?;
            for (header, bytes) in split_datagram(&self.rbuf)? {
                if header.sequence_number != seq {
                    continue;
                }
                if header.flags & NLM_F_DUMP_INTR != 0 {
                    interrupted = true;
                }
                let m = NetlinkMessage::<T>::deserialize(bytes).map_err(|e| {
                    SockError::Decode(format!(
                        "message type {} of {} bytes: {e}",
                        header.message_type,
                        bytes.len()
                    ))
                })?;
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok((out, interrupted)),
                    NetlinkPayload::Error(e) => {
                        let (errno, message) = error_info(header.flags, &e);
                        if errno != 0 {
                            return Err(SockError::Kernel { errno, message });
                        }
                        return Ok((out, interrupted));
                    }
                    NetlinkPayload::InnerMessage(inner) => out.push(inner),
                    _ => {}
                }
            }
        }
    }

    /// Receives one datagram into `self.rbuf`.
    fn recv_datagram(&mut self) -> Result<(), SockError> {
        self.rbuf.clear();
        let n = self
            .sock
            .recv(&mut self.rbuf, libc::MSG_TRUNC)
            .map_err(SockError::Recv)?;
        if n > self.rbuf.len() {
            return Err(SockError::Recv(io::Error::other(format!(
                "netlink datagram of {n} bytes truncated"
            ))));
        }
        Ok(())
    }

    /// Sends every message of `msgs` asking for an ack, keeping up to `window`
    /// of them in flight instead of waiting for each ack, and returns each
    /// one's outcome in order. The kernel handles the requests of one socket
    /// one after another, in order, so a request may depend on an earlier one.
    /// Replies other than the acks are dropped (for requests that have none).
    pub(crate) fn request_pipelined<T>(
        &mut self,
        flags: u16,
        msgs: Vec<T>,
        window: usize,
    ) -> Vec<Result<(), SockError>>
    where
        T: NetlinkSerializable + NetlinkDeserializable,
    {
        let total = msgs.len();
        let mut results: Vec<Option<Result<(), SockError>>> = (0..total).map(|_| None).collect();
        let mut first_seq = None;
        let mut pending = msgs.into_iter();
        let (mut sent, mut done) = (0, 0);
        let fail_rest = |results: &mut Vec<Option<Result<(), SockError>>>,
                         what: &dyn fmt::Display| {
            for r in results.iter_mut().filter(|r| r.is_none()) {
                *r = Some(Err(SockError::Send(io::Error::other(what.to_string()))));
            }
        };
        while done < total {
            while sent < total && sent - done < window.max(1) {
                let msg = pending.next().expect("counted");
                match self.send(flags | NLM_F_ACK, msg) {
                    Ok(seq) => {
                        first_seq.get_or_insert(seq);
                        sent += 1;
                    }
                    Err(e) => {
                        results[sent] = Some(Err(e));
                        fail_rest(&mut results, &"not sent: an earlier send failed");
                        return results.into_iter().map(|r| r.expect("filled")).collect();
                    }
                }
            }
            if let Err(e) = self.recv_datagram() {
                fail_rest(&mut results, &e);
                break;
            }
            let base = first_seq.expect("something was sent");
            let acks = match split_datagram(&self.rbuf) {
                Ok(messages) => messages
                    .into_iter()
                    .filter_map(|(header, bytes)| {
                        let index = header.sequence_number.wrapping_sub(base) as usize;
                        if index >= sent {
                            return None;
                        }
                        match NetlinkMessage::<T>::deserialize(bytes).map(|m| m.payload) {
                            Ok(NetlinkPayload::Error(e)) => {
                                let (errno, message) = error_info(header.flags, &e);
                                Some((index, errno, message))
                            }
                            _ => None,
                        }
                    })
                    .collect::<Vec<_>>(),
                Err(e) => {
                    fail_rest(&mut results, &e);
                    break;
                }
            };
            for (index, errno, message) in acks {
                if results[index].is_some() {
                    continue;
                }
                results[index] = Some(match errno {
                    0 => Ok(()),
                    errno => Err(SockError::Kernel { errno, message }),
                });
                done += 1;
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(SockError::Recv(io::Error::other("no ack")))))
            .collect()
    }

    /// A request that expects an ack (and maybe replies before it).
    pub(crate) fn request<T>(&mut self, flags: u16, msg: T) -> Result<Vec<T>, SockError>
    where
        T: NetlinkSerializable + NetlinkDeserializable,
    {
        Ok(self.exchange(flags, false, msg)?.0)
    }

    /// A dump (`NLM_F_DUMP`) whose messages go to `each` as their datagram
    /// arrives, never collected: memory stays one datagram whatever the size of
    /// the dump (the kernel fills the next one only when it is read). The outer
    /// error is the socket's; the inner one is the first error of `each`, after
    /// which the rest of the dump is read and dropped, so the socket stays
    /// usable. `Ok(Ok(true))`: the kernel flagged the dump as interrupted
    /// (`NLM_F_DUMP_INTR`); `each` may have missed entries, the caller redoes it.
    pub(crate) fn dump_each<T, E>(
        &mut self,
        msg: T,
        mut each: impl FnMut(T) -> Result<(), E>,
    ) -> Result<Result<bool, E>, SockError>
    where
        T: NetlinkSerializable + NetlinkDeserializable,
    {
        let seq = self.send(NLM_F_DUMP, msg)?;
        let mut interrupted = false;
        // The first failure, ours or the caller's; the dump is drained after it.
        let mut decode_failed = None;
        let mut failed = None;
        loop {
            self.recv_datagram()?;
            for (header, bytes) in split_datagram(&self.rbuf)? {
                if header.sequence_number != seq {
                    continue;
                }
                if header.flags & NLM_F_DUMP_INTR != 0 {
                    interrupted = true;
                }
                let payload = match NetlinkMessage::<T>::deserialize(bytes) {
                    Ok(m) => m.payload,
                    Err(e) => {
                        decode_failed.get_or_insert_with(|| {
                            SockError::Decode(format!(
                                "message type {} of {} bytes: {e}",
                                header.message_type,
                                bytes.len()
                            ))
                        });
                        continue;
                    }
                };
                match payload {
                    NetlinkPayload::Done(_) => {}
                    NetlinkPayload::Error(e) => {
                        let (errno, message) = error_info(header.flags, &e);
                        if errno != 0 {
                            return Err(SockError::Kernel { errno, message });
                        }
                    }
                    NetlinkPayload::InnerMessage(inner) => {
                        if decode_failed.is_none() && failed.is_none() {
                            failed = each(inner).err();
                        }
                        continue;
                    }
                    _ => continue,
                }
                if let Some(e) = decode_failed {
                    return Err(e);
                }
                return Ok(match failed {
                    Some(e) => Err(e),
                    None => Ok(interrupted),
                });
            }
        }
    }

    /// A dump (`NLM_F_DUMP`), retried when the kernel flags it as interrupted.
    pub(crate) fn dump<T>(&mut self, msg: T) -> Result<Vec<T>, SockError>
    where
        T: NetlinkSerializable + NetlinkDeserializable + Clone,
    {
        for _ in 0..DUMP_RETRIES {
            let (out, interrupted) = self.exchange(0, true, msg.clone())?;
            if !interrupted {
                return Ok(out);
            }
        }
        Err(SockError::Kernel {
            errno: libc::EINTR,
            message: Some("dump interrupted repeatedly".into()),
        })
    }
}
