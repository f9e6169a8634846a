//! kube-nlproxy: a Kubernetes service proxy that programs the Linux dataplane over
//! netlink only. Data flows one way: `source -> model -> mode -> sync -> netlink`.

pub mod config;
pub mod daemon;
pub mod ipvs_proxier;
pub mod mode;
pub mod model;
pub mod privileges;
pub mod proxier;
pub mod serve;
pub mod source;
pub mod sync;
