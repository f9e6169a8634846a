//! nf_tables over NETLINK_NETFILTER.

pub mod codec;
mod socket;
mod types;

pub use codec::{rule_comment, rule_fingerprint};
pub use socket::{NftError, NftSocket, Op, RuleState, TableState};
pub use types::*;
