//! nf_tables over NETLINK_NETFILTER.

mod attrs;
pub mod codec;
pub(crate) mod socket;
pub mod text;
mod types;

pub use codec::{rule_comment, rule_fingerprint};
pub use socket::{ApplyStats, InjectedFault, NftError, NftSocket, Op, RuleState, TableState};
pub use types::*;

#[cfg(test)]
mod golden_ops;
#[cfg(test)]
mod tests;
