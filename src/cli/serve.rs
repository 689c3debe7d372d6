//! `scarab serve`: the service with its HTTP API, stopped cleanly by SIGTERM or SIGINT.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};

use super::LogFormat;
use crate::api::{self, ApiState};
use crate::service::{self, Settings, StateDir};

pub fn init_logging(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SCARAB_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

pub fn serve(
    state_dir: &Path,
    listen: &str,
    log_format: LogFormat,
    settings: Settings,
) -> anyhow::Result<ExitCode> {
    init_logging(log_format, "info");
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(serve_async(state_dir, listen, settings))?;
    Ok(ExitCode::SUCCESS)
}

async fn serve_async(state_dir: &Path, listen: &str, settings: Settings) -> anyhow::Result<()> {
    let state_dir = StateDir::new(state_dir);
    std::fs::create_dir_all(&state_dir.root)
        .with_context(|| format!("creating {}", state_dir.root.display()))?;
    let admin_token = ensure_admin_token(&state_dir.admin_token())?;
    let step_key = ensure_admin_token(&state_dir.root.join("step-token.key"))?;
    // Bind before starting the engine: a taken port fails fast and changes nothing.
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let mut settings = settings;
    settings.step_tokens = Some(crate::service::tokens::StepTokens {
        key: step_key.into_bytes(),
        url: format!("http://{}", listener.local_addr()?),
    });
    let exe = std::env::current_exe().context("locating the scarab binary")?;
    let running = service::start(state_dir.clone(), settings, exe).await?;
    let router = api::router(ApiState {
        service: running.service.clone(),
        admin_token: std::sync::Arc::new(admin_token),
    });
    tracing::info!(listen = %listener.local_addr()?, state_dir = %state_dir.root.display(), "scarab serving");
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            tracing::info!("stopping: no new requests; running steps stay for re-adoption");
        })
        .await?;
    running.stop().await;
    Ok(())
}

/// Reads a secret file (the admin token, the step-token key), creating it (mode 0600,
/// 256 random bits) on first start.
fn ensure_admin_token(path: &Path) -> anyhow::Result<String> {
    if let Ok(token) = std::fs::read_to_string(path) {
        let token = token.trim().to_string();
        anyhow::ensure!(!token.is_empty(), "{} is empty", path.display());
        return Ok(token);
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
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
