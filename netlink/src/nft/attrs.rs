//! Our own netlink attribute types for what netlink-packet-netfilter 0.4 does not
//! type: the data attributes of the expressions `numgen`, `fib`, `ct`, `nat`, `masq`,
//! `reject`, `counter`, `dynset` (sent through its `Expressions::Other` escape hatch)
//! and the field list of a set's concatenation description.
//!
//! Constants and values from linux/netfilter/nf_tables.h and nf_nat.h.

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, ErrorContext, NLA_F_NESTED, Nla, NlaBuffer, Parseable,
    emit_u32_be, emit_u64_be, parse_string, parse_u8, parse_u32_be, parse_u64_be,
};
use netlink_packet_netfilter::nftables::{ExpressionAttribute, Expressions, ListAttribute};

/// The value of one attribute: how it is laid out in the netlink payload.
pub(crate) trait AttrValue: Sized {
    fn value_len(&self) -> usize;
    fn emit_value(&self, buf: &mut [u8]);
    fn parse_value(buf: &[u8]) -> Result<Self, DecodeError>;
}

/// Big-endian, as nf_tables wants every integer.
impl AttrValue for u32 {
    fn value_len(&self) -> usize {
        4
    }
    fn emit_value(&self, buf: &mut [u8]) {
        // The buffer is sized by `value_len`, so this cannot fail.
        let _ = emit_u32_be(buf, *self);
    }
    fn parse_value(buf: &[u8]) -> Result<Self, DecodeError> {
        parse_u32_be(buf)
    }
}

/// Big-endian.
impl AttrValue for u64 {
    fn value_len(&self) -> usize {
        8
    }
    fn emit_value(&self, buf: &mut [u8]) {
        let _ = emit_u64_be(buf, *self);
    }
    fn parse_value(buf: &[u8]) -> Result<Self, DecodeError> {
        parse_u64_be(buf)
    }
}

impl AttrValue for u8 {
    fn value_len(&self) -> usize {
        1
    }
    fn emit_value(&self, buf: &mut [u8]) {
        buf[0] = *self;
    }
    fn parse_value(buf: &[u8]) -> Result<Self, DecodeError> {
        parse_u8(buf)
    }
}

/// NUL-terminated.
impl AttrValue for String {
    fn value_len(&self) -> usize {
        self.len() + 1
    }
    fn emit_value(&self, buf: &mut [u8]) {
        buf[..self.len()].copy_from_slice(self.as_bytes());
        buf[self.len()] = 0;
    }
    fn parse_value(buf: &[u8]) -> Result<Self, DecodeError> {
        parse_string(buf)
    }
}

/// An attribute enum: one variant per kernel attribute (with a named const for its
/// number), plus `Other(DefaultNla)` for anything else; `Nla` and `Parseable`.
macro_rules! attr_enum {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident($ty:ty) = $konst:ident = $num:expr, )*
        }
    ) => {
        $( const $konst: u16 = $num; )*

        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[non_exhaustive]
        pub(crate) enum $name {
            $( $(#[$vmeta])* #[doc = concat!("`", stringify!($konst), "`")] $variant($ty), )*
            /// An attribute we do not type.
            #[allow(dead_code)]
            Other(DefaultNla),
        }

        impl Nla for $name {
            fn value_len(&self) -> usize {
                match self {
                    $( Self::$variant(v) => AttrValue::value_len(v), )*
                    Self::Other(a) => a.value_len(),
                }
            }
            fn kind(&self) -> u16 {
                match self {
                    $( Self::$variant(_) => $konst, )*
                    Self::Other(a) => a.kind(),
                }
            }
            fn emit_value(&self, buf: &mut [u8]) {
                match self {
                    $( Self::$variant(v) => AttrValue::emit_value(v, buf), )*
                    Self::Other(a) => a.emit_value(buf),
                }
            }
        }

        impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for $name {
            fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
                Ok(match buf.kind() {
                    $( $konst => Self::$variant(
                        <$ty as AttrValue>::parse_value(buf.value())
                            .context(concat!("invalid ", stringify!($konst), " value"))?,
                    ), )*
                    _ => Self::Other(DefaultNla::parse(buf)?),
                })
            }
        }
    };
}

attr_enum! {
    /// `NFTA_NG_*`: the `numgen` expression.
    NumgenAttr {
        Dreg(u32) = NFTA_NG_DREG = 1,
        Modulus(u32) = NFTA_NG_MODULUS = 2,
        Type(u32) = NFTA_NG_TYPE = 3,
        Offset(u32) = NFTA_NG_OFFSET = 4,
    }
}
/// `NFT_NG_RANDOM`
pub(crate) const NFT_NG_RANDOM: u32 = 1;

attr_enum! {
    /// `NFTA_FIB_*`: the `fib` expression.
    FibAttr {
        Dreg(u32) = NFTA_FIB_DREG = 1,
        Result(u32) = NFTA_FIB_RESULT = 2,
        Flags(u32) = NFTA_FIB_FLAGS = 3,
    }
}
/// `NFTA_FIB_F_SADDR`
pub(crate) const NFTA_FIB_F_SADDR: u32 = 1;
/// `NFTA_FIB_F_DADDR`
pub(crate) const NFTA_FIB_F_DADDR: u32 = 2;
/// `NFT_FIB_RESULT_ADDRTYPE`
pub(crate) const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;

attr_enum! {
    /// `NFTA_CT_*`: the `ct` expression.
    CtAttr {
        Dreg(u32) = NFTA_CT_DREG = 1,
        Key(u32) = NFTA_CT_KEY = 2,
        Direction(u8) = NFTA_CT_DIRECTION = 3,
    }
}
/// `NFT_CT_STATE`
pub(crate) const NFT_CT_STATE: u32 = 0;
/// `NFT_CT_STATUS`
pub(crate) const NFT_CT_STATUS: u32 = 2;
/// `NFT_CT_PROTO_DST`
pub(crate) const NFT_CT_PROTO_DST: u32 = 12;
/// `NFT_CT_DST_IP`
pub(crate) const NFT_CT_DST_IP: u32 = 20;
/// `NFT_CT_DST_IP6`
pub(crate) const NFT_CT_DST_IP6: u32 = 22;
/// `IP_CT_DIR_ORIGINAL`
pub(crate) const IP_CT_DIR_ORIGINAL: u8 = 0;

attr_enum! {
    /// `NFTA_NAT_*`: the `nat` expression.
    NatAttr {
        Type(u32) = NFTA_NAT_TYPE = 1,
        Family(u32) = NFTA_NAT_FAMILY = 2,
        RegAddrMin(u32) = NFTA_NAT_REG_ADDR_MIN = 3,
        RegProtoMin(u32) = NFTA_NAT_REG_PROTO_MIN = 5,
        Flags(u32) = NFTA_NAT_FLAGS = 7,
    }
}
/// `NFT_NAT_DNAT`
pub(crate) const NFT_NAT_DNAT: u32 = 1;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`
pub(crate) const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;
/// `NF_NAT_RANGE_PROTO_RANDOM_FULLY`
pub(crate) const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;

attr_enum! {
    /// `NFTA_MASQ_*`: the `masq` expression.
    MasqAttr {
        Flags(u32) = NFTA_MASQ_FLAGS = 1,
    }
}

attr_enum! {
    /// `NFTA_REJECT_*`: the `reject` expression.
    RejectAttr {
        Type(u32) = NFTA_REJECT_TYPE = 1,
        IcmpCode(u8) = NFTA_REJECT_ICMP_CODE = 2,
    }
}
/// `NFT_REJECT_ICMP_UNREACH`
pub(crate) const NFT_REJECT_ICMP_UNREACH: u32 = 0;
/// `NFT_REJECT_TCP_RST`
pub(crate) const NFT_REJECT_TCP_RST: u32 = 1;

attr_enum! {
    /// `NFTA_DYNSET_*`: the `dynset` expression.
    DynsetAttr {
        SetName(String) = NFTA_DYNSET_SET_NAME = 1,
        Op(u32) = NFTA_DYNSET_OP = 3,
        SregKey(u32) = NFTA_DYNSET_SREG_KEY = 4,
        SregData(u32) = NFTA_DYNSET_SREG_DATA = 5,
        Timeout(u64) = NFTA_DYNSET_TIMEOUT = 6,
    }
}
/// `NFT_DYNSET_OP_ADD`
pub(crate) const NFT_DYNSET_OP_ADD: u32 = 0;
/// `NFT_DYNSET_OP_UPDATE`
pub(crate) const NFT_DYNSET_OP_UPDATE: u32 = 1;
/// `NFT_DYNSET_OP_DELETE`
pub(crate) const NFT_DYNSET_OP_DELETE: u32 = 2;

attr_enum! {
    /// `NFTA_SET_FIELD_*`: one field of a set's concatenation description.
    SetFieldAttr {
        Len(u32) = NFTA_SET_FIELD_LEN = 1,
    }
}

/// The attribute as the crate's untyped `DefaultNla` (same bytes).
pub(crate) fn to_default_nla<N: Nla>(nla: &N) -> DefaultNla {
    let mut value = vec![0; nla.value_len()];
    nla.emit_value(&mut value);
    let nested = if nla.is_nested() { NLA_F_NESTED } else { 0 };
    DefaultNla::new(nla.kind() | nested, value)
}

/// A complete expression (`NFTA_LIST_ELEM { NAME, DATA }`) built from our own
/// attributes, through the crate's `Expressions::Other`.
pub(crate) fn own_expr<N: Nla>(name: &str, attrs: &[N]) -> ListAttribute<ExpressionAttribute> {
    Expressions::Other {
        expression_type: name.to_string(),
        attributes: attrs.iter().map(to_default_nla).collect(),
    }
    .into()
}

/// Emit a list of attributes into a fresh buffer.
pub(crate) fn emit_all<N: Nla>(attrs: &[N]) -> Vec<u8> {
    let mut buf = vec![0; attrs.buffer_len()];
    attrs.emit(&mut buf);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::NlasIterator;

    fn roundtrip<N>(attrs: Vec<N>)
    where
        N: Nla + std::fmt::Debug + PartialEq + for<'a> Parseable<NlaBuffer<&'a [u8]>>,
    {
        let bytes = emit_all(&attrs);
        let back: Vec<N> = NlasIterator::new(&bytes[..])
            .map(|b| N::parse(&b.unwrap()).unwrap())
            .collect();
        assert_eq!(back, attrs);
    }

    #[test]
    fn own_attributes_roundtrip() {
        roundtrip(vec![
            NumgenAttr::Dreg(1),
            NumgenAttr::Modulus(3),
            NumgenAttr::Type(NFT_NG_RANDOM),
            NumgenAttr::Offset(0),
        ]);
        roundtrip(vec![
            RejectAttr::Type(NFT_REJECT_ICMP_UNREACH),
            RejectAttr::IcmpCode(3),
        ]);
        roundtrip(vec![
            DynsetAttr::SregKey(1),
            DynsetAttr::Op(NFT_DYNSET_OP_UPDATE),
            DynsetAttr::Timeout(10_800_000),
            DynsetAttr::SetName("aff".into()),
        ]);
        roundtrip(vec![NatAttr::Type(NFT_NAT_DNAT), NatAttr::Flags(2)]);
        // Unknown attributes are kept, not rejected.
        roundtrip(vec![
            CtAttr::Key(NFT_CT_STATE),
            CtAttr::Other(DefaultNla::new(9, vec![1, 2])),
        ]);
    }
}
