//! `scarab serve`: the service with its HTTP API, stopped cleanly by SIGTERM or SIGINT.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use super::LogFormat;
use crate::api::{self, ApiState};
use crate::service::{self, Settings, StateDir};

/// Changes the log filter of a running process (SIGHUP).
pub type LogReload =
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// `SCARAB_LOG` wins over the file's `log.level`, which wins over `default_level`.
fn log_filter(file_level: Option<&str>, default_level: &str) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_env("SCARAB_LOG")
        .ok()
        .or_else(|| file_level.and_then(|l| tracing_subscriber::EnvFilter::try_new(l).ok()))
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default_level))
}

/// Logs to stderr: human on a terminal, plain lines without timestamps or colours under
/// systemd (journald stamps and stores them), JSON for collectors.
pub fn init_logging(
    format: LogFormat,
    file_level: Option<&str>,
    default_level: &str,
) -> Option<LogReload> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let (filter, handle) =
        tracing_subscriber::reload::Layer::new(log_filter(file_level, default_level));
    let terminal = std::io::stderr().is_terminal();
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let registry = tracing_subscriber::registry().with(filter);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Json => registry.with(fmt.json()).try_init(),
        LogFormat::Auto if journald && !terminal => registry
            .with(fmt.without_time().with_ansi(false).with_target(false))
            .try_init(),
        LogFormat::Auto | LogFormat::Human => registry.with(fmt.with_ansi(terminal)).try_init(),
    };
    result.ok().map(|()| handle)
}

/// What `scarab serve` runs with.
pub struct Options {
    pub state_dir: std::path::PathBuf,
    pub listen: String,
    /// The listener's certificate chain and key files: HTTPS only.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    pub log_format: LogFormat,
    pub log_level: Option<String>,
    pub shutdown_deadline: std::time::Duration,
    /// The config file, re-read on SIGHUP.
    pub config: Option<std::path::PathBuf>,
    pub settings: Settings,
}

pub fn serve(options: Options) -> anyhow::Result<ExitCode> {
    let log = init_logging(options.log_format, options.log_level.as_deref(), "info");
    let signals = forward_signals()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(serve_async(options, log, signals))?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    Stop,
    Reload,
}

/// SIGTERM, SIGINT and SIGHUP through signal-hook, forwarded to the runtime.
fn forward_signals() -> anyhow::Result<tokio::sync::mpsc::UnboundedReceiver<Signal>> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .context("installing signal handlers")?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                let forwarded = if signal == SIGHUP {
                    Signal::Reload
                } else {
                    Signal::Stop
                };
                if tx.send(forwarded).is_err() {
                    return;
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(rx)
}

async fn serve_async(
    options: Options,
    log: Option<LogReload>,
    mut signals: tokio::sync::mpsc::UnboundedReceiver<Signal>,
) -> anyhow::Result<()> {
    let state_dir = StateDir::new(&options.state_dir);
    crate::service::prepare_state_dir(&state_dir.root)?;
    // Said before the port is bound: two services on one state dir usually share a port.
    crate::service::check_state_dir_free(&state_dir.root)?;
    api::listen::raise_open_files_limit();
    let admin_token = ensure_admin_token(&state_dir.admin_token())?;
    let step_key = ensure_admin_token(&state_dir.root.join("step-token.key"))?;
    let tls = match &options.tls {
        Some((cert, key)) => Some(std::sync::Arc::new(
            crate::tls::ServerTls::load(cert, key).map_err(anyhow::Error::msg)?,
        )),
        None => None,
    };
    // Bind before starting the engine: a taken port fails fast and changes nothing.
    let listener = tokio::net::TcpListener::bind(&options.listen)
        .await
        .with_context(|| format!("listening on {}", options.listen))?;
    // Local steps call back on loopback. Under TLS they get a listener of their own
    // there, plain HTTP, so that they need neither the certificate nor its CA: that
    // traffic never leaves the box.
    let step_listener = match &tls {
        Some(_) => Some(
            tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .context("listening on loopback for step callbacks")?,
        ),
        None => None,
    };
    let step_url = match &step_listener {
        Some(steps) => format!("http://{}", steps.local_addr()?),
        None => format!("http://{}", listener.local_addr()?),
    };
    let mut settings = options.settings;
    settings.step_tokens = Some(crate::service::tokens::StepTokens {
        key: step_key.into_bytes(),
        url: step_url,
    });
    let exe = std::env::current_exe().context("locating the scarab binary")?;
    let running = service::start(state_dir.clone(), settings, exe).await?;
    let service = running.service.clone();
    let router = api::router(ApiState {
        service: service.clone(),
        admin_token: std::sync::Arc::new(admin_token),
        tls: tls.is_some(),
        parsed: Default::default(),
    });
    tracing::info!(
        listen = %listener.local_addr()?,
        tls = tls.is_some(),
        state_dir = %state_dir.root.display(),
        "scarab serving"
    );
    // Recovery and re-adoption are done (`start` returns after them): tell systemd.
    notify(&[sd_notify::NotifyState::Ready]);
    watchdog(&service);

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut stop_tx = Some(stop_tx);
    let config = options.config.clone();
    let deadline = options.shutdown_deadline;
    let (steps_stop_tx, steps_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let steps_server = step_listener.map(|steps| {
        tokio::spawn(api::listen::serve(
            steps,
            router.clone(),
            async move {
                let _ = steps_stop_rx.await;
            },
            None,
        ))
    });
    let server = tokio::spawn(api::listen::serve(
        listener,
        router,
        async move {
            let _ = stop_rx.await;
        },
        tls.clone(),
    ));
    while let Some(Signal::Reload) = signals.recv().await {
        reload(config.as_deref(), &service, log.as_ref());
        if let Some(tls) = &tls {
            match tls.reload() {
                Ok(()) => tracing::info!("TLS certificate and key reloaded"),
                Err(error) => {
                    tracing::error!(%error, "TLS reload rejected; the previous certificate stays")
                }
            }
        }
        // The driver takes new admission limits at its next batch: this is one, so a
        // raised limit admits at once.
        let _ = service.ping().await;
    }
    tracing::info!(deadline = ?deadline, "stopping: no new requests; running steps stay for re-adoption");
    notify(&[sd_notify::NotifyState::Stopping]);
    if let Some(stop) = stop_tx.take() {
        let _ = stop.send(());
    }
    let _ = steps_stop_tx.send(());
    // Event streams never end on their own: they would hold up the listener's stop.
    service.events.close();
    let orderly = async {
        let _ = server.await;
        if let Some(steps) = steps_server {
            let _ = steps.await;
        }
        running.stop().await;
    };
    tokio::select! {
        () = orderly => {
            tracing::info!("stopped");
            Ok(())
        }
        () = tokio::time::sleep(deadline) => {
            tracing::error!("shutdown deadline passed: exiting; committed state is safe, the next start recovers");
            std::process::exit(1);
        }
        Some(_) = signals.recv() => {
            tracing::warn!("second signal: exiting at once; committed state is safe, the next start recovers");
            std::process::exit(1);
        }
    }
}

fn notify(state: &[sd_notify::NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some()
        && let Err(error) = sd_notify::notify(state)
    {
        tracing::warn!(%error, "sd_notify failed");
    }
}

/// When systemd asks for a watchdog, ping it at half the interval, but only while the
/// engine's driver loop answers: a wedged driver stops the pings and systemd restarts us.
fn watchdog(service: &service::Service) {
    let Some(interval) = sd_notify::watchdog_enabled().filter(|d| !d.is_zero()) else {
        return;
    };
    let period = interval / 2;
    let service = service.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            match tokio::time::timeout(period, service.ping()).await {
                Ok(Ok(())) => notify(&[sd_notify::NotifyState::Watchdog]),
                Ok(Err(_)) => return,
                Err(_) => tracing::error!("watchdog: the engine did not answer in time"),
            }
        }
    });
}

/// SIGHUP: re-read the config file and replace webhooks, tokens, the log level, the
/// auto-retry settings, the secrets and the admission limits at once, or nothing at all when the new file is invalid.
fn reload(path: Option<&Path>, service: &service::Service, log: Option<&LogReload>) {
    notify(&[sd_notify::NotifyState::Reloading]);
    let result = match path {
        None => Err("no config file was given (--config); nothing to reload".to_string()),
        Some(path) => crate::config::ConfigFile::load(path)
            .map_err(|e| e.to_string())
            .and_then(|file| {
                let live = file
                    .live(|name| std::env::var(name).ok())
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                Ok((file, live))
            }),
    };
    match result {
        Ok((file, live)) => {
            if let Some(log) = log
                && let Err(error) = log.reload(log_filter(file.log.level.as_deref(), "info"))
            {
                tracing::warn!(%error, "log level not reloaded");
            }
            tracing::info!(
                webhooks = live.webhooks.len(),
                tokens = live.tokens.len(),
                auto_retry = live.auto_retry.enabled,
                max_parallel_local = live.admission.local,
                max_pods = live.admission.pods,
                locks = live.admission.locks.len(),
                "configuration reloaded"
            );
            service.settings.replace_live(live);
        }
        Err(error) => {
            tracing::error!(%error, "configuration reload rejected; the previous configuration stays");
        }
    }
    notify(&[sd_notify::NotifyState::Ready]);
}

/// Reads a secret file (the admin token, the step-token key), creating it (mode 0600,
/// 256 random bits) on first start.
fn ensure_admin_token(path: &Path) -> anyhow::Result<String> {
    if let Ok(token) = std::fs::read_to_string(path) {
        let token = token.trim().to_string();
        anyhow::ensure!(!token.is_empty(), "{} is empty", path.display());
        return Ok(token);
    }
    let token = crate::service::tokens::random_hex().context("reading /dev/urandom")?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(file, "{token}")?;
    file.sync_all()?;
    Ok(token)
}
