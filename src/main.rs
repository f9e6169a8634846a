//! kube-nlproxy: parse flags, pick a command.

use std::process::ExitCode;

use kube_nlproxy::config::{self, Command, ConfigError};
use kube_nlproxy::proxier;

fn main() -> ExitCode {
    let cfg = match config::parse_args(std::env::args().skip(1)) {
        Ok(cfg) => cfg,
        Err(ConfigError::Help) => {
            print!("{}", config::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kube-nlproxy: {e}");
            return ExitCode::from(2);
        }
    };
    let default_level = match cfg.verbosity {
        0..=1 => "info",
        2..=3 => "debug",
        _ => "trace",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .init();
    for w in &cfg.warnings {
        tracing::warn!("config file: {w}");
    }

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-nlproxy: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cfg.command {
            Command::Run => proxier::run(&cfg).await,
            Command::Plan => proxier::plan(&cfg).await,
            Command::Cleanup => proxier::cleanup(&cfg),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kube-nlproxy: {}", kube_nlproxy::ErrorChain(&e));
            ExitCode::FAILURE
        }
    }
}
