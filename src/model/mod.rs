//! PURE: API objects -> service ports + categorized endpoints. No I/O, no clock.

mod build;
mod categorize;
mod parse;
mod tracker;
mod types;

pub use build::{ANNOTATION_IPVS_SCHEDULER, BuildOptions, IPVS_SCHEDULERS, Warning, build};
pub use categorize::{Categorized, categorize_endpoints};
pub use parse::{parse_cidr_sloppy, parse_ip_sloppy};
pub use tracker::{ModelTracker, ModelUpdate};
pub use types::*;
