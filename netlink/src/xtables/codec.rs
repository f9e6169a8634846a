//! Wire codec for iptables-legacy's x_tables (`linux/netfilter/x_tables.h`,
//! `linux/netfilter_ipv4/ip_tables.h`, `linux/netfilter_ipv6/ip6_tables.h`).
//! No I/O: the socket options are sent by the parent module.
//!
//! A table travels as one blob of entries (`IPT_SO_GET_ENTRIES` out,
//! `IPT_SO_SET_REPLACE` in). Every integer is in host byte order.
//!
//! ```text
//! entry (ipt_entry 112 bytes / ip6t_entry 168 bytes, 8-byte aligned):
//! +--------------------------------------------+
//! | ipt_ip (84) / ip6t_ip6 (136)               |  kept as raw bytes
//! | nfcache u32                                |
//! | target_offset u16 | next_offset u16        |  recomputed on emit
//! | comefrom u32 | (ip6: 4 bytes padding)      |
//! | counters: pcnt u64, bcnt u64               |
//! +--------------------------------------------+
//! | xt_entry_match: match_size u16,            |  0..n matches
//! |   name[29], revision u8, data ...          |
//! +--------------------------------------------+
//! | xt_entry_target: target_size u16,          |  exactly one target
//! |   name[29], revision u8, data ...          |
//! +--------------------------------------------+
//! ```
//!
//! The standard target has the empty name and an `int` verdict: negative is a
//! built-in verdict (`-NF_ACCEPT - 1`, ..., `XT_RETURN = -NF_REPEAT - 1`),
//! positive is the byte offset (from the first entry) of the entry to continue
//! at. iptables writes three kinds of positive verdicts: a jump to a built-in
//! chain's first entry, a jump to the entry after a user chain's `ERROR` head,
//! and, for a rule without `-j`, the offset of the very next entry
//! ([`Verdict::Fallthrough`]). Each user-defined chain starts with an entry
//! whose `ERROR` target carries the chain's name and ends with an unconditional
//! `RETURN`; a built-in chain runs from `hook_entry[hook]` to its policy at
//! `underflow[hook]`; the table ends with an `ERROR` entry named `"ERROR"`.

use std::collections::HashMap;

use netlink_packet_core::DecodeError;

/// `XT_TABLE_MAXNAMELEN` (including the NUL).
pub const XT_TABLE_MAXNAMELEN: usize = 32;
/// `XT_EXTENSION_MAXNAMELEN` (including the NUL): match and target names.
pub const XT_EXTENSION_MAXNAMELEN: usize = 29;
/// `XT_FUNCTION_MAXNAMELEN` (including the NUL): the `ERROR` target's chain name.
pub const XT_FUNCTION_MAXNAMELEN: usize = 30;
/// `NF_INET_NUMHOOKS`
pub const NF_INET_NUMHOOKS: usize = 5;
/// `__alignof__(struct _xt_align)`: `XT_ALIGN` rounds sizes up to this.
pub const XT_ALIGN: usize = 8;

/// `IPT_SO_GET_INFO` (`SOL_IP`) and `IP6T_SO_GET_INFO` (`SOL_IPV6`).
pub const IPT_SO_GET_INFO: i32 = 64;
/// `IPT_SO_GET_ENTRIES` and `IP6T_SO_GET_ENTRIES`.
pub const IPT_SO_GET_ENTRIES: i32 = 65;
/// `IPT_SO_SET_REPLACE` and `IP6T_SO_SET_REPLACE`.
pub const IPT_SO_SET_REPLACE: i32 = 64;
/// `IPT_SO_SET_ADD_COUNTERS` and `IP6T_SO_SET_ADD_COUNTERS`.
pub const IPT_SO_SET_ADD_COUNTERS: i32 = 65;

/// `sizeof(struct ipt_getinfo)` (`ip6t_getinfo` is the same).
pub const GETINFO_LEN: usize = 84;
/// `sizeof(struct ipt_get_entries)`: the entries start here.
pub const GET_ENTRIES_LEN: usize = 40;
/// `sizeof(struct ipt_replace)`: the entries start here.
pub const REPLACE_LEN: usize = 96;
/// `sizeof(struct xt_counters_info)`: the counters start here.
pub const COUNTERS_INFO_LEN: usize = 40;
/// `sizeof(struct xt_counters)`.
pub const COUNTERS_LEN: usize = 16;
/// `sizeof(struct xt_entry_match)` and `sizeof(struct xt_entry_target)`.
pub const EXT_HEADER_LEN: usize = 32;
/// `XT_ALIGN(sizeof(struct xt_standard_target))`.
pub const STANDARD_TARGET_LEN: usize = 40;
/// `XT_ALIGN(sizeof(struct xt_error_target))`.
pub const ERROR_TARGET_LEN: usize = 64;

/// `XT_STANDARD_TARGET`
pub const XT_STANDARD_TARGET: &str = "";
/// `XT_ERROR_TARGET`
pub const XT_ERROR_TARGET: &str = "ERROR";

/// `-NF_DROP - 1`
pub const VERDICT_DROP: i32 = -1;
/// `-NF_ACCEPT - 1`
pub const VERDICT_ACCEPT: i32 = -2;
/// `-NF_QUEUE - 1`
pub const VERDICT_QUEUE: i32 = -4;
/// `XT_RETURN` (`-NF_REPEAT - 1`)
pub const VERDICT_RETURN: i32 = -5;

/// `IPT_F_GOTO` in `ipt_ip.flags`.
pub const IPT_F_GOTO: u8 = 0x02;
/// `IP6T_F_GOTO` in `ip6t_ip6.flags`.
pub const IP6T_F_GOTO: u8 = 0x04;

/// Names of the netfilter hooks (`NF_INET_PRE_ROUTING` ..
/// `NF_INET_POST_ROUTING`), as iptables names their built-in chains.
pub const HOOK_NAMES: [&str; NF_INET_NUMHOOKS] =
    ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// The address family of a table: `iptables` or `ip6tables`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `ip_tables` (`AF_INET`, `SOL_IP`).
    Ipv4,
    /// `ip6_tables` (`AF_INET6`, `SOL_IPV6`).
    Ipv6,
}

impl Family {
    /// `sizeof(struct ipt_entry)` / `sizeof(struct ip6t_entry)`.
    pub const fn entry_len(self) -> usize {
        match self {
            Family::Ipv4 => 112,
            Family::Ipv6 => 168,
        }
    }

    /// `sizeof(struct ipt_ip)` / `sizeof(struct ip6t_ip6)`.
    pub const fn ip_len(self) -> usize {
        match self {
            Family::Ipv4 => 84,
            Family::Ipv6 => 136,
        }
    }

    /// Offset and bit of the goto flag inside the ip part.
    pub(super) const fn goto_flag(self) -> (usize, u8) {
        match self {
            // ipt_ip: ..., proto u16 @80, flags u8 @82
            Family::Ipv4 => (82, IPT_F_GOTO),
            // ip6t_ip6: ..., proto u16 @128, tos u8 @130, flags u8 @131
            Family::Ipv6 => (131, IP6T_F_GOTO),
        }
    }

    /// The family's `iptables` command, for messages.
    pub const fn cli(self) -> &'static str {
        match self {
            Family::Ipv4 => "iptables",
            Family::Ipv6 => "ip6tables",
        }
    }
}

/// Packet and byte counters of an entry (`struct xt_counters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets (`pcnt`).
    pub packets: u64,
    /// Bytes (`bcnt`).
    pub bytes: u64,
}

/// The reply to `IPT_SO_GET_INFO` (`struct ipt_getinfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// Table name.
    pub name: String,
    /// Bit `h` set when hook `h` has a built-in chain.
    pub valid_hooks: u32,
    /// Offset of each built-in chain's first entry (`0xFFFFFFFF` for an invalid hook).
    pub hook_entry: [u32; NF_INET_NUMHOOKS],
    /// Offset of each built-in chain's policy entry.
    pub underflow: [u32; NF_INET_NUMHOOKS],
    /// Number of entries.
    pub num_entries: u32,
    /// Size of the entries in bytes.
    pub size: u32,
}

fn ne_u16(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}
fn ne_u32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn ne_u64(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_ne_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// A NUL-terminated name in a fixed field.
fn parse_name(field: &[u8], what: &str) -> Result<String, DecodeError> {
    let end = field
        .iter()
        .position(|&c| c == 0)
        .ok_or_else(|| DecodeError::from(format!("{what}: name without NUL")))?;
    String::from_utf8(field[..end].to_vec())
        .map_err(|_| DecodeError::from(format!("{what}: name is not UTF-8")))
}

/// Writes `name` NUL-padded into a fixed field of `len` bytes.
fn put_name(b: &mut [u8], at: usize, len: usize, name: &str) -> Result<(), EmitError> {
    if name.len() >= len || name.as_bytes().contains(&0) {
        return Err(EmitError::NameTooLong {
            name: name.to_string(),
            max: len - 1,
        });
    }
    b[at..at + len].fill(0);
    b[at..at + name.len()].copy_from_slice(name.as_bytes());
    Ok(())
}

impl TableInfo {
    /// The `IPT_SO_GET_INFO` argument: the name, everything else zero.
    pub fn request(name: &str) -> Result<[u8; GETINFO_LEN], EmitError> {
        let mut b = [0u8; GETINFO_LEN];
        put_name(&mut b, 0, XT_TABLE_MAXNAMELEN, name)?;
        Ok(b)
    }

    /// Parses the kernel's `struct ipt_getinfo`.
    pub fn parse(b: &[u8]) -> Result<TableInfo, DecodeError> {
        if b.len() != GETINFO_LEN {
            return Err(DecodeError::buffer_too_small(b.len(), GETINFO_LEN));
        }
        let arr = |at: usize| std::array::from_fn(|h| ne_u32(b, at + 4 * h));
        Ok(TableInfo {
            name: parse_name(&b[..XT_TABLE_MAXNAMELEN], "ipt_getinfo")?,
            valid_hooks: ne_u32(b, 32),
            hook_entry: arr(36),
            underflow: arr(56),
            num_entries: ne_u32(b, 76),
            size: ne_u32(b, 80),
        })
    }

    /// Emits `struct ipt_getinfo` (the inverse of [`TableInfo::parse`]).
    pub fn emit(&self) -> Result<[u8; GETINFO_LEN], EmitError> {
        let mut b = Self::request(&self.name)?;
        put_u32(&mut b, 32, self.valid_hooks);
        for h in 0..NF_INET_NUMHOOKS {
            put_u32(&mut b, 36 + 4 * h, self.hook_entry[h]);
            put_u32(&mut b, 56 + 4 * h, self.underflow[h]);
        }
        put_u32(&mut b, 76, self.num_entries);
        put_u32(&mut b, 80, self.size);
        Ok(b)
    }
}

/// The `IPT_SO_GET_ENTRIES` argument for `size` bytes of entries: the header
/// (`name`, `size`) followed by `size` zero bytes the kernel fills in.
pub fn get_entries_request(name: &str, size: u32) -> Result<Vec<u8>, EmitError> {
    let mut b = vec![0u8; GET_ENTRIES_LEN + size as usize];
    put_name(&mut b, 0, XT_TABLE_MAXNAMELEN, name)?;
    put_u32(&mut b, 32, size);
    Ok(b)
}

/// A laid-out table: what `IPT_SO_SET_REPLACE` takes besides the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// The entries.
    pub entries: Vec<u8>,
    /// Number of entries.
    pub num_entries: u32,
    /// First entry of each built-in chain (`u32::MAX` for an invalid hook).
    pub hook_entry: [u32; NF_INET_NUMHOOKS],
    /// Policy entry of each built-in chain (`u32::MAX` for an invalid hook).
    pub underflow: [u32; NF_INET_NUMHOOKS],
    /// [`Entry::origin`] of each entry, in order.
    pub origins: Vec<Option<u32>>,
}

/// The `IPT_SO_SET_REPLACE` argument (`struct ipt_replace` then the entries).
/// `counters` is the address of a buffer of `num_counters` `struct xt_counters`
/// that the kernel fills with the replaced entries' final counters.
pub fn replace_request(
    name: &str,
    valid_hooks: u32,
    layout: &Emitted,
    num_counters: u32,
    counters: u64,
) -> Result<Vec<u8>, EmitError> {
    let mut b = vec![0u8; REPLACE_LEN + layout.entries.len()];
    put_name(&mut b, 0, XT_TABLE_MAXNAMELEN, name)?;
    put_u32(&mut b, 32, valid_hooks);
    put_u32(&mut b, 36, layout.num_entries);
    put_u32(&mut b, 40, layout.entries.len() as u32);
    for h in 0..NF_INET_NUMHOOKS {
        put_u32(&mut b, 44 + 4 * h, layout.hook_entry[h]);
        put_u32(&mut b, 64 + 4 * h, layout.underflow[h]);
    }
    put_u32(&mut b, 84, num_counters);
    put_u64(&mut b, 88, counters);
    b[REPLACE_LEN..].copy_from_slice(&layout.entries);
    Ok(b)
}

/// The `IPT_SO_SET_ADD_COUNTERS` argument (`struct xt_counters_info`): one
/// counter pair per entry of the table, added to the entry's counters.
pub fn add_counters_request(name: &str, counters: &[Counters]) -> Result<Vec<u8>, EmitError> {
    let mut b = vec![0u8; COUNTERS_INFO_LEN + COUNTERS_LEN * counters.len()];
    put_name(&mut b, 0, XT_TABLE_MAXNAMELEN, name)?;
    put_u32(&mut b, 32, counters.len() as u32);
    for (i, c) in counters.iter().enumerate() {
        let at = COUNTERS_INFO_LEN + COUNTERS_LEN * i;
        put_u64(&mut b, at, c.packets);
        put_u64(&mut b, at + 8, c.bytes);
    }
    Ok(b)
}

/// Parses an array of `struct xt_counters` (what `IPT_SO_SET_REPLACE` writes
/// back for the replaced entries).
pub fn parse_counters(b: &[u8]) -> Vec<Counters> {
    b.chunks_exact(COUNTERS_LEN)
        .map(|c| Counters {
            packets: ne_u64(c, 0),
            bytes: ne_u64(c, 8),
        })
        .collect()
}

/// A match of an entry (`struct xt_entry_match`), e.g. `-m comment`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// Extension name (`"comment"`, `"statistic"`, `"tcp"`).
    pub name: String,
    /// Extension revision.
    pub revision: u8,
    /// The match's data as the kernel gave it, padding included
    /// (`match_size` is `32 + data.len()`).
    pub data: Vec<u8>,
}

/// The verdict of a standard target.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// `-j ACCEPT`
    Accept,
    /// `-j DROP`
    Drop,
    /// `-j QUEUE`
    Queue,
    /// `-j RETURN`
    Return,
    /// Another built-in (negative) verdict.
    Other(i32),
    /// `-j CHAIN` or `-g CHAIN` (see [`Entry::is_goto`]): continue at the first
    /// entry of the named chain.
    Jump(String),
    /// No `-j`: continue at the next entry (counting rules do this).
    Fallthrough,
}

impl Verdict {
    pub(super) fn from_builtin(v: i32) -> Verdict {
        match v {
            VERDICT_ACCEPT => Verdict::Accept,
            VERDICT_DROP => Verdict::Drop,
            VERDICT_QUEUE => Verdict::Queue,
            VERDICT_RETURN => Verdict::Return,
            v => Verdict::Other(v),
        }
    }
}

/// The target of an entry (`struct xt_entry_target`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// The standard target (`XT_STANDARD_TARGET`, empty name).
    Standard(Verdict),
    /// The `ERROR` target: its data is a user chain's name (a chain head), or
    /// `"ERROR"` in the table's last entry.
    Error(String),
    /// Any other target (`DNAT`, `MARK`, `LOG`, ...), kept as bytes.
    Other {
        /// Extension name.
        name: String,
        /// Extension revision.
        revision: u8,
        /// The target's data, padding included (`target_size` is `32 + data.len()`).
        data: Vec<u8>,
    },
}

/// One entry (rule) of a table: the fixed `ipt_entry`/`ip6t_entry` header, its
/// matches and its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The raw `struct ipt_ip` (84 bytes) or `struct ip6t_ip6` (136 bytes):
    /// addresses, masks, interfaces, protocol, flags.
    pub ip: Vec<u8>,
    /// `nfcache`, as read.
    pub nfcache: u32,
    /// `comefrom` (the kernel's back pointer; the kernel resets it on replace).
    pub comefrom: u32,
    /// Counters as read (the kernel ignores them on replace; see
    /// [`super::write_table`] for how they are carried over).
    pub counters: Counters,
    /// The matches, in order.
    pub matches: Vec<Match>,
    /// The target.
    pub target: Target,
    /// Position of this entry in the table as read, `None` for an entry that
    /// did not come from the kernel. Used to carry counters over a replace.
    pub origin: Option<u32>,
}

impl Entry {
    /// True for `-g CHAIN` (the goto flag of the ip part).
    pub fn is_goto(&self) -> bool {
        let family = if self.ip.len() == Family::Ipv6.ip_len() {
            Family::Ipv6
        } else {
            Family::Ipv4
        };
        let (at, bit) = family.goto_flag();
        self.ip.get(at).is_some_and(|f| f & bit != 0)
    }

    /// The chain this entry's standard target jumps or goes to.
    pub fn jump_target(&self) -> Option<&str> {
        match &self.target {
            Target::Standard(Verdict::Jump(c)) => Some(c),
            _ => None,
        }
    }

    fn target_len(&self) -> usize {
        match &self.target {
            Target::Standard(_) => STANDARD_TARGET_LEN,
            Target::Error(_) => ERROR_TARGET_LEN,
            Target::Other { data, .. } => EXT_HEADER_LEN + data.len(),
        }
    }

    fn matches_len(&self) -> usize {
        self.matches
            .iter()
            .map(|m| EXT_HEADER_LEN + m.data.len())
            .sum()
    }

    /// The entry's size in bytes (`next_offset`).
    pub fn len(&self, family: Family) -> usize {
        family.entry_len() + self.matches_len() + self.target_len()
    }
}

/// An entry at its offset, verdict not yet resolved.
pub(super) struct RawEntry {
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) entry: Entry,
    /// The standard target's raw verdict.
    pub(super) verdict: Option<i32>,
}

pub(super) fn parse_entry(
    family: Family,
    blob: &[u8],
    offset: usize,
    index: u32,
) -> Result<RawEntry, DecodeError> {
    let elen = family.entry_len();
    let ip_len = family.ip_len();
    if blob.len() - offset < elen {
        return Err(DecodeError::buffer_too_small(blob.len() - offset, elen));
    }
    let h = &blob[offset..];
    let target_offset = ne_u16(h, ip_len + 4) as usize;
    let next_offset = ne_u16(h, ip_len + 6) as usize;
    if next_offset < elen + EXT_HEADER_LEN
        || next_offset > h.len()
        || target_offset < elen
        || target_offset + EXT_HEADER_LEN > next_offset
    {
        return Err(format!(
            "entry at {offset}: target_offset {target_offset}, next_offset {next_offset} \
             outside the entry ({} bytes left)",
            h.len()
        )
        .into());
    }
    let e = &h[..next_offset];
    let counters = Counters {
        packets: ne_u64(e, elen - 16),
        bytes: ne_u64(e, elen - 8),
    };
    // ip6t_entry has 4 bytes of padding before the counters; we emit zeros.
    if family == Family::Ipv6 && e[ip_len + 12..ip_len + 16] != [0; 4] {
        return Err(format!("entry at {offset}: non-zero padding").into());
    }
    let mut matches = Vec::new();
    let mut at = elen;
    while at < target_offset {
        if at + EXT_HEADER_LEN > target_offset {
            return Err(format!("entry at {offset}: match header at {at} overruns").into());
        }
        let size = ne_u16(e, at) as usize;
        if size < EXT_HEADER_LEN || at + size > target_offset {
            return Err(format!("entry at {offset}: match at {at} has size {size}").into());
        }
        matches.push(Match {
            name: parse_name(&e[at + 2..at + 2 + XT_EXTENSION_MAXNAMELEN], "match")?,
            revision: e[at + 31],
            data: e[at + EXT_HEADER_LEN..at + size].to_vec(),
        });
        at += size;
    }
    let t = &e[target_offset..];
    let tsize = ne_u16(t, 0) as usize;
    if tsize != t.len() {
        return Err(format!(
            "entry at {offset}: target_size {tsize} but {} bytes follow target_offset",
            t.len()
        )
        .into());
    }
    let name = parse_name(&t[2..2 + XT_EXTENSION_MAXNAMELEN], "target")?;
    let revision = t[31];
    let data = &t[EXT_HEADER_LEN..];
    let mut verdict = None;
    let target = match (name.as_str(), revision, tsize) {
        (XT_STANDARD_TARGET, 0, STANDARD_TARGET_LEN) if data[4..] == [0; 4] => {
            verdict = Some(i32::from_ne_bytes(data[..4].try_into().expect("4 bytes")));
            // Resolved by the table once every offset is known.
            Target::Standard(Verdict::Fallthrough)
        }
        (XT_ERROR_TARGET, 0, ERROR_TARGET_LEN)
            if data[XT_FUNCTION_MAXNAMELEN..] == [0; 2]
                // Emit pads the name with zeros: only such names round-trip.
                && data[..XT_FUNCTION_MAXNAMELEN]
                    .iter()
                    .skip_while(|&&c| c != 0)
                    .all(|&c| c == 0) =>
        {
            Target::Error(parse_name(&data[..XT_FUNCTION_MAXNAMELEN], "ERROR target")?)
        }
        _ => Target::Other {
            name,
            revision,
            data: data.to_vec(),
        },
    };
    let name_padded = |field: &[u8]| field.iter().skip_while(|&&c| c != 0).all(|&c| c == 0);
    let mut at = elen;
    while at < target_offset {
        if !name_padded(&e[at + 2..at + 31]) {
            return Err(format!("entry at {offset}: match name not NUL-padded").into());
        }
        at += ne_u16(e, at) as usize;
    }
    if !name_padded(&t[2..31]) {
        return Err(format!("entry at {offset}: target name not NUL-padded").into());
    }
    Ok(RawEntry {
        offset,
        len: next_offset,
        entry: Entry {
            ip: e[..ip_len].to_vec(),
            nfcache: ne_u32(e, ip_len),
            comefrom: ne_u32(e, ip_len + 8),
            counters,
            matches,
            target,
            origin: Some(index),
        },
        verdict,
    })
}

pub(super) fn emit_entry(
    family: Family,
    e: &Entry,
    out: &mut [u8],
    at: usize,
    starts: &HashMap<&str, usize>,
) -> Result<usize, EmitError> {
    let ip_len = family.ip_len();
    let elen = family.entry_len();
    if e.ip.len() != ip_len {
        return Err(EmitError::IpLength {
            len: e.ip.len(),
            want: ip_len,
        });
    }
    let len = e.len(family);
    let target_offset = elen + e.matches_len();
    if len > u16::MAX as usize {
        return Err(EmitError::EntryTooLarge(len));
    }
    let b = &mut out[at..at + len];
    b[..ip_len].copy_from_slice(&e.ip);
    put_u32(b, ip_len, e.nfcache);
    put_u16(b, ip_len + 4, target_offset as u16);
    put_u16(b, ip_len + 6, len as u16);
    put_u32(b, ip_len + 8, e.comefrom);
    put_u64(b, elen - 16, e.counters.packets);
    put_u64(b, elen - 8, e.counters.bytes);
    let mut m_at = elen;
    for m in &e.matches {
        let size = EXT_HEADER_LEN + m.data.len();
        put_u16(b, m_at, size as u16);
        put_name(b, m_at + 2, XT_EXTENSION_MAXNAMELEN, &m.name)?;
        b[m_at + 31] = m.revision;
        b[m_at + EXT_HEADER_LEN..m_at + size].copy_from_slice(&m.data);
        m_at += size;
    }
    let t = &mut b[target_offset..];
    put_u16(t, 0, t.len() as u16);
    match &e.target {
        Target::Standard(v) => {
            let raw = match v {
                Verdict::Accept => VERDICT_ACCEPT,
                Verdict::Drop => VERDICT_DROP,
                Verdict::Queue => VERDICT_QUEUE,
                Verdict::Return => VERDICT_RETURN,
                Verdict::Other(v) => *v,
                Verdict::Fallthrough => (at + len) as i32,
                Verdict::Jump(to) => *starts
                    .get(to.as_str())
                    .ok_or_else(|| EmitError::MissingChain(to.clone()))?
                    as i32,
            };
            t[EXT_HEADER_LEN..EXT_HEADER_LEN + 4].copy_from_slice(&raw.to_ne_bytes());
        }
        Target::Error(name) => {
            put_name(t, 2, XT_EXTENSION_MAXNAMELEN, XT_ERROR_TARGET)?;
            put_name(t, EXT_HEADER_LEN, XT_FUNCTION_MAXNAMELEN, name)?;
        }
        Target::Other {
            name,
            revision,
            data,
        } => {
            put_name(t, 2, XT_EXTENSION_MAXNAMELEN, name)?;
            t[31] = *revision;
            t[EXT_HEADER_LEN..].copy_from_slice(data);
        }
    }
    Ok(at + len)
}

/// Why a table could not be laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EmitError {
    /// A rule jumps to a chain that is not in the table.
    #[error("a rule jumps to chain {0}, which is not in the table")]
    MissingChain(String),
    /// Two chains share a name.
    #[error("chain {0} appears twice")]
    DuplicateChain(String),
    /// A chain without its policy / `RETURN` entry.
    #[error("chain {0} has no entries (not even its policy or RETURN)")]
    EmptyChain(String),
    /// A hook number outside `0..NF_INET_NUMHOOKS`.
    #[error("hook {0} does not exist")]
    BadHook(usize),
    /// A name that does not fit its field.
    #[error("name {name:?} is longer than {max} bytes or contains NUL")]
    NameTooLong {
        /// The name.
        name: String,
        /// Longest allowed length.
        max: usize,
    },
    /// An entry whose ip part has the other family's size.
    #[error("entry ip part of {len} bytes, expected {want}")]
    IpLength {
        /// Its length.
        len: usize,
        /// The family's `ipt_ip` / `ip6t_ip6` size.
        want: usize,
    },
    /// An entry larger than `next_offset` (u16) can express.
    #[error("entry of {0} bytes exceeds 65535")]
    EntryTooLarge(usize),
}
