//! PURE: the desired dataplane per proxy mode.

pub mod nftables;
pub mod rules;

#[cfg(test)]
mod tests;
