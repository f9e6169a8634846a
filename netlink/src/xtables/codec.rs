//! Wire codec for iptables-legacy's x_tables (`linux/netfilter/x_tables.h`,
//! `linux/netfilter_ipv4/ip_tables.h`, `linux/netfilter_ipv6/ip6_tables.h`).
//! No I/O: the socket options live in [`super::socket`].
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
    const fn goto_flag(self) -> (usize, u8) {
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
    fn from_builtin(v: i32) -> Verdict {
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

/// How a chain begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainKind {
    /// A built-in chain, at hook `hook` (index into [`HOOK_NAMES`]).
    Builtin {
        /// The netfilter hook (`NF_INET_*`).
        hook: usize,
    },
    /// A user-defined chain, headed by an entry with an `ERROR` target naming it.
    User {
        /// The head entry.
        head: Entry,
    },
}

/// A chain: its rules in order, the last being the built-in chain's policy or
/// the user chain's unconditional `RETURN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The chain's name.
    pub name: String,
    /// Built-in or user-defined.
    pub kind: ChainKind,
    /// The entries after the head, the policy / `RETURN` last.
    pub rules: Vec<Entry>,
}

impl Chain {
    /// True for a user-defined chain.
    pub fn is_user(&self) -> bool {
        matches!(self.kind, ChainKind::User { .. })
    }
}

/// A table as grouped chains. `parse` then `emit` gives back the kernel's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// The family.
    pub family: Family,
    /// Table name (`nat`, `filter`, `mangle`, ...).
    pub name: String,
    /// `valid_hooks`, which the kernel does not let a replace change.
    pub valid_hooks: u32,
    /// The number of entries when the table was read: the `num_counters` of a
    /// replace, which the kernel checks against the table's current number of
    /// entries (`EAGAIN` when they differ).
    pub read_entries: u32,
    /// The chains in table order.
    pub chains: Vec<Chain>,
    /// The table's final entry (an `ERROR` target named `"ERROR"`).
    pub end: Entry,
}

/// An entry at its offset, verdict not yet resolved.
struct RawEntry {
    offset: usize,
    len: usize,
    entry: Entry,
    /// The standard target's raw verdict.
    verdict: Option<i32>,
}

fn parse_entry(
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

impl Table {
    /// Parses the entries of `IPT_SO_GET_ENTRIES` (without the 40-byte
    /// `ipt_get_entries` header) with the `IPT_SO_GET_INFO` that sized them.
    pub fn parse(family: Family, info: &TableInfo, blob: &[u8]) -> Result<Table, DecodeError> {
        let mut raw = Vec::new();
        let mut offset = 0;
        while offset < blob.len() {
            let e = parse_entry(family, blob, offset, raw.len() as u32)?;
            offset += e.len;
            raw.push(e);
        }
        let Some(last) = raw.pop() else {
            return Err("table without entries".into());
        };
        if last.entry.target != Target::Error(XT_ERROR_TARGET.to_string()) {
            return Err("the last entry is not the ERROR target \"ERROR\"".into());
        }

        // Chain starts: built-in chains at their hook entry, user chains at
        // their ERROR head (their jump target is the entry after the head).
        let mut hook_at: HashMap<usize, usize> = HashMap::new();
        for h in 0..NF_INET_NUMHOOKS {
            if info.valid_hooks & (1 << h) != 0 {
                hook_at.insert(info.hook_entry[h] as usize, h);
            }
        }
        let mut chains: Vec<Chain> = Vec::new();
        let mut starts: HashMap<usize, String> = HashMap::new();
        let mut verdicts: Vec<Vec<(usize, usize, i32)>> = Vec::new();
        // Offset of each chain's last entry so far.
        let mut last_at: Vec<usize> = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            if let Some(&hook) = hook_at.get(&r.offset) {
                starts.insert(r.offset, HOOK_NAMES[hook].to_string());
                chains.push(Chain {
                    name: HOOK_NAMES[hook].to_string(),
                    kind: ChainKind::Builtin { hook },
                    rules: Vec::new(),
                });
                verdicts.push(Vec::new());
                last_at.push(r.offset);
            } else if let Target::Error(name) = &r.entry.target {
                let Some(next) = raw.get(i + 1) else {
                    return Err(format!("user chain {name} has no entries").into());
                };
                if hook_at.contains_key(&next.offset)
                    || matches!(next.entry.target, Target::Error(_))
                {
                    return Err(format!("user chain {name} has no RETURN entry").into());
                }
                starts.insert(next.offset, name.clone());
                chains.push(Chain {
                    name: name.clone(),
                    kind: ChainKind::User {
                        head: r.entry.clone(),
                    },
                    rules: Vec::new(),
                });
                verdicts.push(Vec::new());
                last_at.push(r.offset);
                continue;
            }
            let Some(chain) = chains.last_mut() else {
                return Err(format!("entry at {} is in no chain", r.offset).into());
            };
            if let Some(v) = r.verdict {
                verdicts.last_mut().expect("one per chain").push((
                    chain.rules.len(),
                    r.offset + r.len,
                    v,
                ));
            }
            chain.rules.push(r.entry.clone());
            *last_at.last_mut().expect("one per chain") = r.offset;
        }

        let builtin = chains.iter().filter(|c| !c.is_user()).count();
        if builtin != hook_at.len() || hook_at.len() != info.valid_hooks.count_ones() as usize {
            return Err(format!(
                "valid_hooks {:#x} but {builtin} built-in chains found at hook_entry {:?}",
                info.valid_hooks, info.hook_entry
            )
            .into());
        }
        // Every valid hook's policy must be its chain's last entry: emit puts
        // underflow there.
        for (chain, &last) in chains.iter().zip(&last_at) {
            if let ChainKind::Builtin { hook } = chain.kind
                && last != info.underflow[hook] as usize
            {
                return Err(format!(
                    "{}: underflow {} is not the chain's last entry",
                    chain.name, info.underflow[hook]
                )
                .into());
            }
        }

        for (chain, vs) in chains.iter_mut().zip(verdicts) {
            for (rule, next, v) in vs {
                let verdict = if v < 0 {
                    Verdict::from_builtin(v)
                } else if let Some(name) = starts.get(&(v as usize)) {
                    Verdict::Jump(name.clone())
                } else if v as usize == next {
                    Verdict::Fallthrough
                } else {
                    return Err(format!(
                        "{}: rule {} jumps to offset {v}, which starts no chain",
                        chain.name,
                        rule + 1
                    )
                    .into());
                };
                chain.rules[rule].target = Target::Standard(verdict);
            }
        }

        Ok(Table {
            family,
            name: info.name.clone(),
            valid_hooks: info.valid_hooks,
            read_entries: raw.len() as u32 + 1,
            chains,
            end: last.entry,
        })
    }

    /// Names of the chains, built-in ones included, in table order.
    pub fn chains(&self) -> Vec<&str> {
        self.chains.iter().map(|c| c.name.as_str()).collect()
    }

    /// The chain named `name`.
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }

    /// Removes every user-defined chain whose name matches `pred`, and every
    /// rule of the other chains whose standard target jumps (`-j`) or goes
    /// (`-g`) to one of them. Every other entry is kept as it was. The
    /// `iptables` equivalent is `-D` of each such rule, then `-F` and `-X` of
    /// each such chain.
    pub fn remove_chains(&mut self, mut pred: impl FnMut(&str) -> bool) -> Removed {
        let mut removed = Removed::default();
        let doomed: Vec<String> = self
            .chains
            .iter()
            .filter(|c| c.is_user() && pred(&c.name))
            .map(|c| c.name.clone())
            .collect();
        if doomed.is_empty() {
            return removed;
        }
        self.chains.retain(|c| !doomed.contains(&c.name));
        for chain in &mut self.chains {
            let mut n = 0;
            chain.rules.retain(|r| {
                n += 1;
                match r.jump_target() {
                    Some(to) if doomed.iter().any(|d| d == to) => {
                        removed.rules.push(RemovedRule {
                            table: self.name.clone(),
                            chain: chain.name.clone(),
                            position: n,
                            target: to.to_string(),
                        });
                        false
                    }
                    _ => true,
                }
            });
        }
        removed.chains = doomed.into_iter().map(|c| (self.name.clone(), c)).collect();
        removed
    }

    /// Lays the table out: entries in chain order, every jump, `hook_entry`
    /// and `underflow` recomputed.
    pub fn emit(&self) -> Result<Emitted, EmitError> {
        let family = self.family;
        // Pass 1: offsets.
        let mut starts: HashMap<&str, usize> = HashMap::new();
        let mut hook_entry = [u32::MAX; NF_INET_NUMHOOKS];
        let mut underflow = [u32::MAX; NF_INET_NUMHOOKS];
        let mut offset = 0usize;
        let mut num_entries = 0u32;
        for chain in &self.chains {
            if let ChainKind::User { head } = &chain.kind {
                offset += head.len(family);
                num_entries += 1;
            }
            let Some(last) = chain.rules.last() else {
                return Err(EmitError::EmptyChain(chain.name.clone()));
            };
            if starts.insert(&chain.name, offset).is_some() {
                return Err(EmitError::DuplicateChain(chain.name.clone()));
            }
            let first = offset;
            for r in &chain.rules {
                offset += r.len(family);
                num_entries += 1;
            }
            if let ChainKind::Builtin { hook } = chain.kind {
                if hook >= NF_INET_NUMHOOKS {
                    return Err(EmitError::BadHook(hook));
                }
                hook_entry[hook] = first as u32;
                underflow[hook] = (offset - last.len(family)) as u32;
            }
        }
        let size = offset + self.end.len(family);
        num_entries += 1;

        // Pass 2: bytes.
        let mut out = vec![0u8; size];
        let mut origins = Vec::with_capacity(num_entries as usize);
        let mut at = 0;
        for chain in &self.chains {
            if let ChainKind::User { head } = &chain.kind {
                let mut head = head.clone();
                head.target = Target::Error(chain.name.clone());
                at = emit_entry(family, &head, &mut out, at, &starts)?;
                origins.push(head.origin);
            }
            for r in &chain.rules {
                at = emit_entry(family, r, &mut out, at, &starts)?;
                origins.push(r.origin);
            }
        }
        emit_entry(family, &self.end, &mut out, at, &starts)?;
        origins.push(self.end.origin);
        Ok(Emitted {
            entries: out,
            num_entries,
            hook_entry,
            underflow,
            origins,
        })
    }
}

fn emit_entry(
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

/// What [`Table::remove_chains`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// `(table, chain)` of every removed user-defined chain.
    pub chains: Vec<(String, String)>,
    /// Every rule removed from a kept chain because it jumped to a removed chain.
    pub rules: Vec<RemovedRule>,
}

impl Removed {
    /// True when nothing was removed.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.rules.is_empty()
    }

    /// Appends `other`.
    pub fn extend(&mut self, other: Removed) {
        self.chains.extend(other.chains);
        self.rules.extend(other.rules);
    }
}

/// A rule removed because it jumped to a removed chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedRule {
    /// Table.
    pub table: String,
    /// Chain the rule was in.
    pub chain: String,
    /// Its 1-based position in that chain before the removal (as
    /// `iptables -L --line-numbers`).
    pub position: usize,
    /// The removed chain it jumped to.
    pub target: String,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
