//! PURE: the desired dataplane per proxy mode.

pub mod ipvs;
pub mod nftables;
pub mod rules;

#[cfg(test)]
pub(crate) mod tests;
