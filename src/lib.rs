//! kube-nlproxy: a Kubernetes service proxy that programs the Linux dataplane over
//! netlink only. Data flows one way: `source -> model -> mode -> sync -> netlink`;
//! [`driver`] runs one sync over that chain, [`daemon`] runs it in a loop with
//! the side channels, [`proxier`] is the commands.

pub mod config;
pub mod daemon;
pub mod driver;
pub mod fuzzing;
pub mod logging;
pub mod mode;
pub mod model;
pub mod privileges;
pub mod proxier;
pub mod serve;
pub mod source;
pub mod sync;

/// Displays an error with every cause behind it, each once: `a: b: c` (a cause
/// whose text an earlier message already holds is not repeated).
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&logging::error_chain(self.0))
    }
}
