//! kube-nlproxy: parse flags, set up the logs, pick a command.

use std::process::ExitCode;

use kube_nlproxy::config::{self, Command, ConfigError, host};
use kube_nlproxy::logging;
use kube_nlproxy::privileges::{Needs, Privileges};
use kube_nlproxy::proxier;

/// Prints `kube-nlproxy: what: error: cause` (each cause once) and fails.
fn fail(what: &str, e: &(dyn std::error::Error + 'static)) -> ExitCode {
    eprintln!("kube-nlproxy: {what}: {}", logging::error_chain(e));
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let cfg = match config::parse_args(std::env::args().skip(1)) {
        Ok(cfg) => cfg,
        Err(ConfigError::Help(cmd)) => {
            print!("{}", config::help_text(cmd));
            return ExitCode::SUCCESS;
        }
        Err(ConfigError::Version) => {
            println!("{}", config::version_line());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            for line in e.to_string().lines() {
                eprintln!("kube-nlproxy: {line}");
            }
            return ExitCode::from(2);
        }
    };
    logging::init(logging::Options {
        format: cfg.log_format,
        verbosity: cfg.verbosity,
        vmodule: cfg.vmodule.clone(),
        skip_headers: cfg.log_skip_headers,
        add_dir_header: cfg.log_add_dir_header,
        quiet_info: cfg.command != Command::Run,
        filter: true,
    });
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }

    if let Some(path) = &cfg.write_config_to {
        // As kube-proxy: write the effective configuration and exit.
        if let Err(e) = std::fs::write(path, config::write::to_yaml(&cfg)) {
            return fail(&format!("cannot write {}", path.display()), &e);
        }
        tracing::info!(file = %path.display(), "Wrote configuration");
        return ExitCode::SUCCESS;
    }
    if cfg.command == Command::Run {
        tracing::info!(
            version = %config::version_line(),
            config = %config::write::to_object(&cfg),
            "Starting kube-nlproxy"
        );
    }

    // Least privilege (SECURITY.md), while the process has one thread: keep what
    // the command needs, lower oom_score_adj with CAP_SYS_RESOURCE, then drop it.
    let mut privileges = match Privileges::drop_to(&Needs::for_config(&cfg)) {
        Ok(p) => p,
        Err(e) => return fail("cannot drop privileges", &e),
    };
    if cfg.command == Command::Run
        && (!cfg.once || cfg.init_only)
        && let Some(adj) = cfg.oom_score_adj
        && let Err(e) = privileges.with_sys_resource(|| host::apply_oom_score_adj(adj))
    {
        return fail("cannot raise CAP_SYS_RESOURCE", &e);
    }
    if let Err(e) = privileges.drop_sys_resource() {
        return fail("cannot drop CAP_SYS_RESOURCE", &e);
    }
    if cfg.init_only {
        // kube-proxy's --init-only: the set-up that needs privileges (oom_score_adj
        // above, the conntrack sysctls here), then exit.
        host::apply_conntrack(&cfg.conntrack);
        tracing::info!("Initialization done (--init-only)");
        return ExitCode::SUCCESS;
    }

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail("cannot start the runtime", &e),
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
            eprintln!("kube-nlproxy: {}", logging::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
