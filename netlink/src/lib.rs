//! kube-nlproxy-netlink: the only code in kube-nlproxy that opens netlink sockets.
#![deny(missing_docs)]

pub mod addr;
pub mod conntrack;
#[doc(hidden)]
pub mod fuzzing;
pub mod ipset;
pub mod ipvs;
pub mod link;
pub mod nft;
mod sock;
pub mod xtables;
