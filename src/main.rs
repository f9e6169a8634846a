//! kube-nlproxy: parse flags, pick a command.

use std::process::ExitCode;

use kube_nlproxy::config::{self, Command, ConfigError, host};
use kube_nlproxy::privileges::{Needs, Privileges};
use kube_nlproxy::proxier;

/// Prints `what: error: cause: ...` and fails.
fn fail(what: &str, e: &dyn std::error::Error) -> ExitCode {
    let mut msg = format!("kube-nlproxy: {what}: {e}");
    let mut cause = e.source();
    while let Some(c) = cause {
        msg.push_str(&format!(": {c}"));
        cause = c.source();
    }
    eprintln!("{msg}");
    ExitCode::FAILURE
}

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

    // Least privilege (SECURITY.md), while the process has one thread: keep what
    // the command needs, lower oom_score_adj with CAP_SYS_RESOURCE, then drop it.
    let mut privileges = match Privileges::drop_to(&Needs::for_config(&cfg)) {
        Ok(p) => p,
        Err(e) => return fail("cannot drop privileges", &e),
    };
    if cfg.command == Command::Run
        && !cfg.once
        && let Some(adj) = cfg.oom_score_adj
        && let Err(e) = privileges.with_sys_resource(|| host::apply_oom_score_adj(adj))
    {
        return fail("cannot raise CAP_SYS_RESOURCE", &e);
    }
    if let Err(e) = privileges.drop_sys_resource() {
        return fail("cannot drop CAP_SYS_RESOURCE", &e);
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
            Command::Plan => proxier::plan(&cfg).await.map(|()| 0),
            Command::Cleanup => proxier::cleanup(&cfg).map(|()| 0),
            Command::Explain => proxier::explain(&cfg).await,
            Command::Status => proxier::status(&cfg).await.map(|()| 0),
            Command::Run => proxier::run(&cfg).await.map(|()| 0),
        }
    });
    match result {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("kube-nlproxy: {}", kube_nlproxy::ErrorChain(&e));
            ExitCode::FAILURE
        }
    }
}
