//! The `scarab` command line: `serve` and `run` start the engine; the client commands
//! talk to a running service over HTTP.

mod client;
pub(crate) mod explain;
pub(crate) mod live;
mod schedule;
mod serve;
pub(crate) mod table;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

use crate::pipeline::{self, Format};
use crate::service::{self, Settings, StartError, StateDir};
use crate::store::records::{PipelineSource, SourceFormat};

#[derive(Parser)]
#[command(
    name = "scarab",
    version,
    about = "A single-node pipeline runner: fenced attempts, honest failure classes, one redb file"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable on a terminal; plain lines without timestamps or colours under
    /// systemd (journald stamps them).
    #[default]
    Auto,
    Human,
    Json,
}

impl LogFormat {
    fn parse(name: &str) -> Option<LogFormat> {
        match name {
            "auto" => Some(LogFormat::Auto),
            "human" => Some(LogFormat::Human),
            "json" => Some(LogFormat::Json),
            _ => None,
        }
    }
}

/// Options of every command that talks to a running service.
#[derive(clap::Args, Clone, Debug)]
pub struct ClientArgs {
    /// Base URL of the service.
    #[arg(
        long,
        env = "SCARAB_URL",
        default_value = "http://127.0.0.1:7300",
        global = true
    )]
    url: String,
    /// API token (default: read from --state-dir's admin.token).
    #[arg(long, env = "SCARAB_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// State dir of a local service, to read its admin token from.
    #[arg(long, env = "SCARAB_STATE_DIR", global = true)]
    state_dir: Option<PathBuf>,
    /// For an https:// URL whose certificate a private CA signed: that CA's certificate
    /// (PEM) [default: the system's roots].
    #[arg(long, env = "SCARAB_CA_CERT", global = true)]
    ca_cert: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
}

/// Engine settings shared by `serve` and `run`. Each flag (or its `SCARAB_*` variable)
/// wins over the config file's key, which wins over the default.
#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    /// Step timeout for steps that name none [default: 1h; file: engine.default_step_timeout].
    #[arg(long, env = "SCARAB_DEFAULT_STEP_TIMEOUT", value_parser = humantime::parse_duration)]
    default_step_timeout: Option<Duration>,
    /// Never-started retries every step gets, 0..=20 [default: 3; file: engine.infra_retries].
    #[arg(long, env = "SCARAB_INFRA_RETRIES",
          value_parser = clap::value_parser!(u32).range(0..=i64::from(crate::limits::INFRA_RETRIES_MAX)))]
    infra_retries: Option<u32>,
    /// Grace between SIGTERM and SIGKILL when Scarab stops a step [default: 5s].
    #[arg(long, env = "SCARAB_KILL_GRACE", value_parser = humantime::parse_duration)]
    kill_grace: Option<Duration>,
    /// The configuration file (TOML; docs/configuration.md).
    #[arg(long, env = "SCARAB_CONFIG")]
    config: Option<PathBuf>,
    /// Deliveries of one outbox message before it is dead-lettered [default: 10].
    #[arg(long, env = "SCARAB_MAX_DELIVERIES", value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_deliveries: Option<u32>,
    /// How long a finished run's step logs and attempt directories are kept [default: 7d].
    #[arg(long, env = "SCARAB_LOG_RETENTION", value_parser = humantime::parse_duration)]
    log_retention: Option<Duration>,
    /// Run `executor: kubernetes` steps on the cluster of this kubeconfig file.
    #[arg(long, env = "SCARAB_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Run `executor: kubernetes` steps with the in-cluster service account.
    #[arg(long, env = "SCARAB_KUBE_IN_CLUSTER", conflicts_with = "kubeconfig")]
    kube_in_cluster: bool,
    /// The namespace of the step Pods [default: scarab].
    #[arg(long, env = "SCARAB_KUBE_NAMESPACE")]
    kube_namespace: Option<String>,
    /// How long an image pull may keep failing before the attempt is infra_never_started
    /// [default: 5m].
    #[arg(long, env = "SCARAB_KUBE_GRACE_IMAGE_PULL", value_parser = humantime::parse_duration)]
    kube_grace_image_pull: Option<Duration>,
    /// How long a container configuration error may last [default: 2m].
    #[arg(long, env = "SCARAB_KUBE_GRACE_CONFIG", value_parser = humantime::parse_duration)]
    kube_grace_config: Option<Duration>,
    /// How long a Pod may stay unschedulable [default: 10m].
    #[arg(long, env = "SCARAB_KUBE_GRACE_UNSCHEDULABLE", value_parser = humantime::parse_duration)]
    kube_grace_unschedulable: Option<Duration>,
    /// How long a Pod may stay pending for any other reason [default: 30m].
    #[arg(long, env = "SCARAB_KUBE_GRACE_PENDING", value_parser = humantime::parse_duration)]
    kube_grace_pending: Option<Duration>,
    /// The grace period of Scarab's Pod deletions (cancel, timeout kill, clean-up):
    /// SIGTERM, then SIGKILL after it [default: 30s; file: kubernetes.delete_grace].
    #[arg(long, env = "SCARAB_KUBE_DELETE_GRACE", value_parser = humantime::parse_duration)]
    kube_delete_grace: Option<Duration>,
    /// The API's URL as the cluster's Pods reach it (`http://10.0.0.5:7300`); set, Pod
    /// steps get SCARAB_URL and their attempt's token to report outputs
    /// [default: none; file: kubernetes.callback_url].
    #[arg(long, env = "SCARAB_KUBE_CALLBACK_URL")]
    kube_callback_url: Option<String>,
}

impl EngineArgs {
    /// The config file named by `--config` (or `SCARAB_CONFIG`), or an empty one.
    fn file(&self) -> anyhow::Result<crate::config::ConfigFile> {
        Ok(match &self.config {
            Some(path) => crate::config::ConfigFile::load(path)?,
            None => crate::config::ConfigFile::default(),
        })
    }

    fn settings(&self, file: &crate::config::ConfigFile) -> anyhow::Result<Settings> {
        let mut settings = Settings::default();
        let live = file
            .live(|name| std::env::var(name).ok())
            .map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
        settings.replace_live(live);
        let engine = &file.engine;
        let defaults = Settings::default();
        settings.engine.default_step_timeout = self
            .default_step_timeout
            .or(engine.default_step_timeout)
            .unwrap_or(defaults.engine.default_step_timeout);
        settings.engine.infra_retries = self
            .infra_retries
            .or(engine.infra_retries)
            .unwrap_or(defaults.engine.infra_retries);
        settings.step_env_passthrough = engine.step_env_passthrough.clone().unwrap_or_default();
        // Besides the state dir, steps never reach the files that hold Scarab's authority
        // (the token files and the secrets dir, which a reload may change, come from
        // `Live::step_protected`).
        settings.step_protected = self
            .config
            .iter()
            .cloned()
            .chain(
                self.kubeconfig
                    .clone()
                    .or(file.kubernetes.kubeconfig.clone()),
            )
            .collect();
        settings.kill_grace = self
            .kill_grace
            .or(engine.kill_grace)
            .unwrap_or(defaults.kill_grace);
        settings.engine.log_retention = self
            .log_retention
            .or(engine.log_retention)
            .unwrap_or(defaults.engine.log_retention);
        settings.max_deliveries = self
            .max_deliveries
            .or(engine.max_deliveries)
            .unwrap_or(defaults.max_deliveries);
        let kube = &file.kubernetes;
        let kubeconfig = self.kubeconfig.clone().or(kube.kubeconfig.clone());
        let in_cluster =
            self.kube_in_cluster || (kubeconfig.is_none() && kube.in_cluster == Some(true));
        if kubeconfig.is_some() || in_cluster {
            let grace = crate::executor::kubernetes::classify::GracePeriods::default();
            settings.kubernetes = Some(crate::service::KubernetesSettings {
                kubeconfig,
                namespace: self
                    .kube_namespace
                    .clone()
                    .or(kube.namespace.clone())
                    .unwrap_or_else(|| "scarab".to_string()),
                grace: crate::executor::kubernetes::classify::GracePeriods {
                    image_pull: self
                        .kube_grace_image_pull
                        .or(kube.grace_image_pull)
                        .unwrap_or(grace.image_pull),
                    config: self
                        .kube_grace_config
                        .or(kube.grace_config)
                        .unwrap_or(grace.config),
                    unschedulable: self
                        .kube_grace_unschedulable
                        .or(kube.grace_unschedulable)
                        .unwrap_or(grace.unschedulable),
                    pending: self
                        .kube_grace_pending
                        .or(kube.grace_pending)
                        .unwrap_or(grace.pending),
                },
                delete_grace: self
                    .kube_delete_grace
                    .or(kube.delete_grace)
                    .unwrap_or(Duration::from_secs(30)),
                callback_url: self.kube_callback_url.clone().or(kube.callback_url.clone()),
            });
        }
        check_bounds(&settings)?;
        Ok(settings)
    }
}

/// The same bounds the config file's keys have, for values that came from flags or
/// their variables.
fn check_bounds(settings: &Settings) -> anyhow::Result<()> {
    let check = |name: &str, value: Duration, min: Duration, max: Duration| {
        anyhow::ensure!(
            (min..=max).contains(&value),
            "{name}: must be between {} and {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        );
        Ok(())
    };
    let secs = Duration::from_secs;
    check(
        "--default-step-timeout (engine.default_step_timeout)",
        settings.engine.default_step_timeout,
        crate::limits::STEP_TIMEOUT_MIN,
        crate::limits::STEP_TIMEOUT_MAX,
    )?;
    check(
        "--kill-grace (engine.kill_grace)",
        settings.kill_grace,
        secs(0),
        secs(600),
    )?;
    check(
        "--log-retention (engine.log_retention)",
        settings.engine.log_retention,
        secs(1),
        secs(3650 * 86400),
    )?;
    if let Some(kube) = &settings.kubernetes {
        for (name, value) in [
            ("--kube-grace-image-pull", kube.grace.image_pull),
            ("--kube-grace-config", kube.grace.config),
            ("--kube-grace-unschedulable", kube.grace.unschedulable),
            ("--kube-grace-pending", kube.grace.pending),
        ] {
            check(name, value, secs(1), secs(7 * 86400))?;
        }
        check(
            "--kube-delete-grace (kubernetes.delete_grace)",
            kube.delete_grace,
            secs(0),
            secs(3600),
        )?;
        if let Some(url) = &kube.callback_url {
            crate::config::check_callback_url(url).map_err(|e| {
                anyhow::anyhow!("--kube-callback-url (kubernetes.callback_url): {e}")
            })?;
        }
    }
    Ok(())
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a config file with the `SCARAB_*` overrides applied: exit 0 when valid,
    /// 2 with the offending key on stderr when not.
    Check {
        /// Default: $SCARAB_CONFIG, else /etc/scarab/scarab.toml.
        file: Option<PathBuf>,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

/// `scarab restore FILE --state-dir DIR`, with the service stopped.
fn restore(file: &Path, state_dir: &Path) -> anyhow::Result<ExitCode> {
    let (counts, runs) = crate::store::verify_file(file)
        .map_err(|e| anyhow::anyhow!("{} is not a usable backup: {e}", file.display()))?;
    let target = StateDir::new(state_dir).database();
    std::fs::create_dir_all(state_dir)?;
    // The live store must not be open: redb locks it while the service runs.
    crate::service::check_state_dir_free(state_dir)?;
    if target.exists() {
        match crate::store::Store::open(&target) {
            Ok(store) => drop(store),
            Err(error) => bail_restore(&target, &error.to_string())?,
        }
    }
    // Copy next to the target first, so the final step is one rename on one filesystem.
    let staged = state_dir.join("scarab.redb.restoring");
    let _ = std::fs::remove_file(&staged);
    std::fs::copy(file, &staged).with_context(|| format!("copying {}", file.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::File::open(&staged)?.sync_all()?;
    let aside = if target.exists() {
        let stamp = crate::clock::rfc3339(crate::clock::now()).replace(':', "");
        let aside = state_dir.join(format!("scarab.redb.before-restore-{stamp}"));
        std::fs::rename(&target, &aside)?;
        Some(aside)
    } else {
        None
    };
    std::fs::rename(&staged, &target)?;
    std::fs::File::open(state_dir)?.sync_all()?;
    let rows: u64 = counts.iter().map(|(_, n)| n).sum();
    println!(
        "restored {} ({runs} runs, {rows} rows) into {}",
        file.display(),
        target.display()
    );
    if let Some(aside) = aside {
        println!("the previous store is kept as {}", aside.display());
    }
    println!(
        "on start, fences are raised above every attempt still on disk or in the cluster, and attempts this store does not know are stopped"
    );
    Ok(ExitCode::SUCCESS)
}

fn bail_restore(target: &Path, error: &str) -> anyhow::Result<()> {
    anyhow::bail!(
        "cannot open {} ({error}): stop the service before restoring",
        target.display()
    )
}

/// The packaged config file's place.
pub const DEFAULT_CONFIG: &str = "/etc/scarab/scarab.toml";

fn config_check(file: Option<PathBuf>, output: Output) -> anyhow::Result<ExitCode> {
    let path = file
        .or_else(|| std::env::var_os("SCARAB_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    let checked = crate::config::ConfigFile::load(&path).and_then(|config| {
        config
            .live(|name| std::env::var(name).ok())
            .map(|live| (config, live))
            .map_err(|message| crate::config::ConfigError::Invalid {
                path: path.display().to_string(),
                message,
            })
    });
    match checked {
        Ok((config, live)) => {
            let state_dir = config.state_dir.as_ref().map(|d| d.display().to_string());
            let listen = config.listen.as_deref().unwrap_or("127.0.0.1:7300");
            let auto_retry = if live.auto_retry.enabled { "on" } else { "off" };
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::json!({
                        "file": path.display().to_string(),
                        "valid": true,
                        "state_dir": state_dir,
                        "listen": listen,
                        "webhooks": live.webhooks.len(),
                        "tokens": live.tokens.len(),
                        "auto_retry": live.auto_retry.enabled,
                    })
                ),
                Output::Table => println!(
                    "{}: valid (state_dir {}, listen {listen}, {} webhook(s), {} token(s), auto-retry {auto_retry})",
                    path.display(),
                    state_dir.as_deref().unwrap_or("unset"),
                    live.webhooks.len(),
                    live.tokens.len(),
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::json!({
                        "file": path.display().to_string(),
                        "valid": false,
                        "error": error.to_string(),
                    })
                ),
                Output::Table => eprintln!("error: {error}"),
            }
            Ok(ExitCode::from(2))
        }
    }
}

#[derive(Subcommand)]
enum OutputCommand {
    /// Store KEY = VALUE for this attempt; refused (exit 2) if a newer attempt exists.
    Set {
        /// The output's name: 1 to 64 characters of [A-Za-z0-9_.-].
        key: String,
        /// Its value, as text.
        value: String,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// List dead letters, oldest first.
    List {
        /// Start after this dead letter's id (the `--after` the previous page printed).
        #[arg(long)]
        after: Option<u64>,
        /// Dead letters listed at most.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show one dead letter.
    Show {
        /// The dead letter's id, as `scarab dlq list` printed it.
        id: u64,
    },
    /// Put it back in the outbox with a fresh delivery budget (its run resumes).
    Requeue {
        /// The dead letter's id, as `scarab dlq list` printed it.
        id: u64,
    },
    /// Drop it for good; the reason is recorded in the run's history.
    Discard {
        /// The dead letter's id, as `scarab dlq list` printed it.
        id: u64,
        /// Why, kept in the run's history.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand, Debug)]
enum ScheduleCommand {
    /// Create a schedule that starts FILE's pipeline at the times CRON names.
    Create {
        /// The schedule's name: 1 to 63 bytes of [A-Za-z0-9_.-].
        name: String,
        /// Five fields (minute hour day-of-month month day-of-week), or six with seconds
        /// first, e.g. "0 2 * * *" (02:00 every day).
        #[arg(long)]
        cron: String,
        /// An IANA time zone the expression is read in, e.g. Europe/Berlin [default: UTC].
        #[arg(long)]
        timezone: Option<String>,
        /// The pipeline file; stored with the schedule when it is created.
        file: PathBuf,
        /// A value for one of the pipeline's `params` (repeatable).
        #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
        params: Vec<(String, String)>,
        /// Fires missed while the service was down: one run for all of them, or none
        /// [default: one].
        #[arg(long, value_parser = ["none", "one"])]
        catch_up: Option<String>,
        /// A fire while the previous run is unfinished: start anyway, or skip it
        /// [default: allow].
        #[arg(long, value_parser = ["allow", "skip"])]
        overlap: Option<String>,
    },
    /// List every schedule: next fire (on its own clock) and last run.
    List,
    /// Show one schedule with its next fires and its last skipped fire.
    Show {
        /// The schedule's name.
        name: String,
    },
    /// Stop firing until resumed.
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Fire again, from the next fire after now (paused fires are not caught up).
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Delete a schedule; runs it started go on.
    Delete {
        /// The schedule's name.
        name: String,
    },
}

/// What `scarab submit` may set for one run over its pipeline's admission keys.
#[derive(clap::Args, Debug)]
pub struct AdmissionArgs {
    /// The run's priority, -1000..=1000 (higher is admitted first).
    #[arg(long, allow_hyphen_values = true)]
    priority: Option<i32>,
    /// At most this many of the run's steps active at once.
    #[arg(long)]
    parallelism: Option<u32>,
    /// The run's concurrency group.
    #[arg(long)]
    concurrency_group: Option<String>,
    /// Runs of the group in progress at once (default 1).
    #[arg(long)]
    concurrency_limit: Option<u32>,
    /// Cancel the group's older runs still waiting for a slot.
    #[arg(long)]
    supersede: bool,
}

impl AdmissionArgs {
    /// The submit's query string ("" or "?k=v&..."); the service checks the values.
    fn query(&self) -> anyhow::Result<String> {
        let mut pairs = Vec::new();
        if let Some(priority) = self.priority {
            pairs.push(format!("priority={priority}"));
        }
        if let Some(parallelism) = self.parallelism {
            pairs.push(format!("parallelism={parallelism}"));
        }
        if let Some(group) = &self.concurrency_group {
            crate::limits::check_admission_name(group, crate::limits::GROUP_NAME_MAX_BYTES)
                .map_err(|problem| anyhow::anyhow!("--concurrency-group: {problem}"))?;
            pairs.push(format!("concurrency_group={group}"));
        }
        if let Some(limit) = self.concurrency_limit {
            pairs.push(format!("concurrency_limit={limit}"));
        }
        if self.supersede {
            pairs.push("supersede=true".into());
        }
        Ok(if pairs.is_empty() {
            String::new()
        } else {
            format!("?{}", pairs.join("&"))
        })
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the service: HTTP API, engine and executors.
    Serve {
        /// The state dir [file: state_dir].
        #[arg(long, env = "SCARAB_STATE_DIR")]
        state_dir: Option<PathBuf>,
        /// The API's address [default: 127.0.0.1:7300; file: listen].
        #[arg(long, env = "SCARAB_LISTEN")]
        listen: Option<String>,
        /// Serve HTTPS with this certificate chain (PEM, leaf first); needs --tls-key
        /// [file: tls_cert]. Re-read on SIGHUP.
        #[arg(long, env = "SCARAB_TLS_CERT", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The private key of --tls-cert (PEM) [file: tls_key].
        #[arg(long, env = "SCARAB_TLS_KEY", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Log format [default: auto; file: log.format].
        #[arg(long, env = "SCARAB_LOG_FORMAT", value_enum)]
        log_format: Option<LogFormat>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// The configuration file.
    Config {
        #[command(subcommand)]
        action: ConfigCommand,
    },
    /// Run one pipeline in-process to completion with live progress. Exits 0 if it
    /// succeeded, 1 if it failed or was dead-lettered, 2 for invalid input.
    Run {
        /// The pipeline file (YAML, or JSON when it ends in .json).
        file: PathBuf,
        /// Where to keep state [default: $XDG_STATE_HOME/scarab/run/<dir>-<hash>, one per
        /// working directory, under ~/.local/state without XDG_STATE_HOME].
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// A value for one of the pipeline's `params` (repeatable).
        #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
        params: Vec<(String, String)>,
        /// Output format: `json` prints the finished run's detail (as `GET /v1/runs/{id}`
        /// answers it) on stdout; the progress stays on stderr.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Check a pipeline file: exits 0 when valid, 2 with every error on stderr (with
    /// `-o json`, in the JSON on stdout) when not.
    Validate {
        /// The pipeline file (YAML, or JSON when it ends in .json).
        file: PathBuf,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Print the pipeline format's JSON Schema.
    Schema,
    /// Print the shell completion script for SHELL (the .deb installs bash's, zsh's and
    /// fish's).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page, roff, generated from these definitions (the .deb installs it).
    Man,
    /// Print this build's version, the commit it was built from, and the store formats it
    /// writes and reads.
    Version {
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Judge a Pod (`kubectl get pod NAME -o json` or `-o yaml`; `-` reads stdin) exactly
    /// as the Kubernetes executor would. Exits 2 when the input is not a Pod.
    ExplainPod {
        /// The Pod document, JSON or YAML; `-` reads stdin.
        file: PathBuf,
        /// Judge as of this time (RFC 3339); default: now.
        #[arg(long)]
        now: Option<String>,
        /// The step's container (default: the Pod's first container).
        #[arg(long)]
        container: Option<String>,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Submit a pipeline to a running service; prints the run id.
    Submit {
        /// The pipeline file (YAML, or JSON when it ends in .json).
        file: PathBuf,
        /// Print only the run id.
        #[arg(short, long)]
        quiet: bool,
        /// Follow the run to its end with live progress on stderr (the id is printed
        /// first); exit 0 when it succeeded, 1 when it ended otherwise.
        #[arg(long)]
        wait: bool,
        /// A value for one of the pipeline's `params` (repeatable).
        #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
        params: Vec<(String, String)>,
        /// Resubmitting with the same key returns the same run.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// The producing system, when not this CLI (runs of another origin are never
        /// auto-retried).
        #[arg(long)]
        origin: Option<String>,
        #[command(flatten)]
        admission: AdmissionArgs,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Admission control: the pools, the locks, and what waits on what in admission order.
    Queue {
        /// Queued steps listed at most.
        #[arg(long, default_value_t = 500)]
        limit: usize,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List runs, newest first.
    Runs {
        /// Only runs in this state.
        #[arg(long, value_parser = [
            "queued", "running", "waiting", "succeeded", "failed", "dead_lettered",
            "cancelled", "quarantined",
        ])]
        state: Option<String>,
        /// Runs listed at most (1 to 500).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Go on from where the previous page ended (the `--cursor` it printed).
        #[arg(long)]
        cursor: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one run with every attempt, fence, class and reason.
    Show {
        /// The run's id, as `scarab submit` printed it.
        run: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a step's log (stdout by default; the last attempt unless --attempt).
    Logs {
        /// The run's id, as `scarab submit` printed it.
        run: String,
        /// The step; without it, every step's log (current attempt), each line prefixed
        /// with the step's name.
        step: Option<String>,
        /// `stdout` or `stderr`.
        #[arg(long, default_value = "stdout", value_parser = ["stdout", "stderr"])]
        stream: String,
        /// The attempt's number (default: the step's latest).
        #[arg(long, requires = "step")]
        attempt: Option<u32>,
        /// Keep printing until the attempt finishes; waits for a step that has not
        /// started yet.
        #[arg(short, long, requires = "step")]
        follow: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Schedules: pipelines started at the times a cron expression names.
    Schedule {
        #[command(subcommand)]
        action: ScheduleCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The dead-letter queue: messages whose deliveries were exhausted.
    Dlq {
        #[command(subcommand)]
        action: DlqCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Write a consistent snapshot of the running service's whole state to FILE (admin
    /// token), fsynced and verified.
    Backup {
        /// Where to write the backup; an existing file is never overwritten.
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Replace a stopped service's store with a backup: the file is validated, the old
    /// store kept aside as scarab.redb.before-restore-TIME, and the swap is atomic.
    Restore {
        /// The backup `scarab backup` wrote.
        file: PathBuf,
        /// The state dir of the stopped service whose store is replaced.
        #[arg(long, env = "SCARAB_STATE_DIR")]
        state_dir: PathBuf,
    },
    /// Release a quarantined run: a fresh try of its failed steps, with new fences.
    Requeue {
        /// The run's id, as `scarab submit` printed it.
        run: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Discard a quarantined run: it stays dead-lettered and is never auto-retried again.
    Discard {
        /// The run's id, as `scarab submit` printed it.
        run: String,
        /// Why, kept in the run's history.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Re-run a finished run: its steps that did not succeed start a fresh try (new
    /// attempts, new fences); succeeded steps keep their attempts and outputs.
    Retry {
        /// The run's id, as `scarab submit` printed it.
        run: String,
        /// Also re-run this step and every step downstream of it, even if they succeeded
        /// (allowed on a succeeded run too).
        #[arg(long, value_name = "STEP")]
        from: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Follow a run to its end with live progress on stderr; exit 0 when it succeeded, 1
    /// when it ended otherwise (`-o json`: also the run detail on stdout).
    Watch {
        /// The run's id, as `scarab submit` printed it.
        run: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel a run: running steps are stopped, pending ones never start.
    Cancel {
        /// The run's id, as `scarab submit` printed it.
        run: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Approve a gate: the run goes on past it.
    Approve {
        /// The run's id, as `scarab submit` printed it.
        run: String,
        /// The gate step's name.
        step: String,
        #[command(flatten)]
        decision: DecisionArgs,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Reject a gate: it fails with reason GateRejected, and steps after it are skipped.
    Reject {
        /// The run's id, as `scarab submit` printed it.
        run: String,
        /// The gate step's name.
        step: String,
        #[command(flatten)]
        decision: DecisionArgs,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Measure the performance targets beside this machine's limits (docs/benchmarks.md).
    Bench {
        /// Scratch directory (on the disk to measure).
        #[arg(long, default_value = "target/bench")]
        dir: PathBuf,
        /// Fewer iterations, for a smoke run.
        #[arg(long)]
        quick: bool,
        /// Finished runs to store for the start-up measurement.
        #[arg(long, default_value_t = 1_000_000)]
        stored_runs: u64,
        /// In-flight attempts to store for the start-up measurement.
        #[arg(long, default_value_t = 10_000)]
        inflight: u64,
        /// Steps in flight when the service is killed.
        #[arg(long, default_value_t = 1_000)]
        crash_steps: u64,
        /// Dead-lettered runs in the store for the auto-retry sweep measurement.
        #[arg(long, default_value_t = 100_000)]
        dead_lettered: u64,
        /// Queued steps for the admission control measurements.
        #[arg(long, default_value_t = 100_000)]
        queued: u64,
        /// Run only this measurement (`throughput`, `sweep`, `admission`, `dashboard`).
        #[arg(long)]
        only: Option<String>,
    },
    /// Inside a step: report an output (`scarab output set KEY VALUE`), fenced by the
    /// attempt's own token (SCARAB_URL, SCARAB_RUN_ID, SCARAB_STEP, SCARAB_STEP_TOKEN).
    Output {
        #[command(subcommand)]
        action: OutputCommand,
    },
    /// Supervise one local attempt (started by the service; not for direct use).
    #[command(hide = true)]
    Supervise {
        #[arg(required_unless_present = "zygote")]
        dir: Option<PathBuf>,
        /// Fork supervisors on the service's request (stdin is its socket).
        #[arg(long, conflicts_with = "dir")]
        zygote: bool,
    },
}

/// Who decides a gate and why; both are recorded with the decision.
#[derive(clap::Args, Clone, Debug)]
pub struct DecisionArgs {
    /// A comment kept with the decision.
    #[arg(long)]
    pub comment: Option<String>,
    /// Your name as recorded (default: $USER, else the token's identity).
    #[arg(long)]
    pub by: Option<String>,
}

pub fn main() -> ExitCode {
    // The supervisor zygote is started by the service with exactly these arguments. It
    // skips clap's parse, which would build every command's definition in it: the
    // zygote stays small, and every supervisor is forked from it.
    let command = if std::env::args_os()
        .skip(1)
        .eq(crate::executor::local::zygote::ARGS)
    {
        Command::Supervise {
            dir: None,
            zygote: true,
        }
    } else {
        Cli::parse().command
    };
    match dispatch(command) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {}", error_text(&error));
            ExitCode::from(1)
        }
    }
}

/// An error and its causes on one line, each said once: a cause whose text the message
/// before it already holds (`store: {0}` over the redb error it wraps) is left out.
fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve {
            state_dir,
            listen,
            tls_cert,
            tls_key,
            log_format,
            engine,
        } => {
            let file = engine.file()?;
            let settings = engine.settings(&file)?;
            let state_dir = state_dir.or(file.state_dir.clone()).context(
                "no state dir: pass --state-dir (or SCARAB_STATE_DIR) or set state_dir in the config",
            )?;
            let listen = listen
                .or(file.listen.clone())
                .unwrap_or_else(|| "127.0.0.1:7300".to_string());
            let tls = match (tls_cert, tls_key) {
                (Some(cert), Some(key)) => Some((cert, key)),
                _ => file.tls_cert.clone().zip(file.tls_key.clone()),
            };
            let log_format = log_format
                .or(file.log.format.as_deref().and_then(LogFormat::parse))
                .unwrap_or_default();
            serve::serve(serve::Options {
                state_dir,
                listen,
                tls,
                log_format,
                log_level: file.log.level.clone(),
                shutdown_deadline: file
                    .engine
                    .shutdown_deadline
                    .unwrap_or(Duration::from_secs(20)),
                config: engine.config.clone(),
                settings,
            })
        }
        Command::Config {
            action: ConfigCommand::Check { file, output },
        } => config_check(file, output),
        Command::Run {
            file,
            state_dir,
            params,
            output,
            engine,
        } => {
            let state_dir = match state_dir {
                Some(dir) => dir,
                None => default_run_state_dir()?,
            };
            run(
                &file,
                &params,
                &state_dir,
                engine.settings(&engine.file()?)?,
                output,
            )
        }
        Command::Validate { file, output } => validate(&file, output),
        Command::ExplainPod {
            file,
            now,
            container,
            output,
        } => explain::run(
            &file,
            now.as_deref(),
            container.as_deref(),
            matches!(output, Output::Json),
        ),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "scarab", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Version { output } => {
            version(output);
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&pipeline::doc::json_schema())?
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Submit {
            file,
            quiet,
            wait,
            params,
            idempotency_key,
            origin,
            admission,
            client,
        } => client::submit(
            &client,
            &file,
            quiet,
            wait,
            idempotency_key.as_deref(),
            origin.as_deref(),
            &with_params(admission.query()?, &params),
        ),
        Command::Queue { limit, client } => client::queue(&client, limit),
        Command::Runs {
            state,
            limit,
            cursor,
            client,
        } => client::runs(&client, state.as_deref(), limit, cursor.as_deref()),
        Command::Show { run, client } => client::show(&client, &run),
        Command::Logs {
            run,
            step,
            stream,
            attempt,
            follow,
            client,
        } => match step {
            Some(step) => client::logs(&client, &run, &step, &stream, attempt, follow),
            None => client::logs_of_every_step(&client, &run, &stream),
        },
        Command::Cancel { run, client } => client::cancel(&client, &run),
        Command::Watch { run, client } => client::watch(&client, &run),
        Command::Retry { run, from, client } => client::retry(&client, &run, from.as_deref()),
        Command::Backup { out, client } => client::backup(&client, &out),
        Command::Restore { file, state_dir } => restore(&file, &state_dir),
        Command::Requeue { run, client } => client::run_action(&client, &run, "requeue", None),
        Command::Discard {
            run,
            reason,
            client,
        } => client::run_action(&client, &run, "discard", Some(&reason)),
        Command::Approve {
            run,
            step,
            decision,
            client,
        } => client::decide(&client, &run, &step, &decision, true),
        Command::Reject {
            run,
            step,
            decision,
            client,
        } => client::decide(&client, &run, &step, &decision, false),
        Command::Schedule { action, client } => match action {
            ScheduleCommand::Create {
                name,
                cron,
                timezone,
                file,
                params,
                catch_up,
                overlap,
            } => schedule::create(
                &client,
                &schedule::Create {
                    name: &name,
                    cron: &cron,
                    timezone: timezone.as_deref(),
                    file: &file,
                    params: &params,
                    catch_up: catch_up.as_deref(),
                    overlap: overlap.as_deref(),
                },
            ),
            ScheduleCommand::List => schedule::list(&client),
            ScheduleCommand::Show { name } => schedule::show(&client, &name),
            ScheduleCommand::Pause { name } => schedule::act(&client, &name, "pause"),
            ScheduleCommand::Resume { name } => schedule::act(&client, &name, "resume"),
            ScheduleCommand::Delete { name } => schedule::act(&client, &name, "delete"),
        },
        Command::Dlq { action, client } => match action {
            DlqCommand::List { after, limit } => client::dlq_list(&client, after, limit),
            DlqCommand::Show { id } => client::dlq_show(&client, id),
            DlqCommand::Requeue { id } => client::dlq_action(&client, id, "requeue", None),
            DlqCommand::Discard { id, reason } => {
                client::dlq_action(&client, id, "discard", Some(&reason))
            }
        },
        Command::Bench {
            dir,
            quick,
            stored_runs,
            inflight,
            crash_steps,
            dead_lettered,
            queued,
            only,
        } => {
            crate::bench::run(&crate::bench::Options {
                dir,
                quick,
                stored_runs,
                inflight,
                crash_steps,
                dead_lettered,
                queued,
                only,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Output {
            action: OutputCommand::Set { key, value },
        } => client::output_set(&key, &value),
        Command::Supervise { dir, zygote } => {
            if zygote {
                // SAFETY: descriptor 0 is this process's stdin, the socket the service
                // passed, and nothing else in this process owns it.
                let socket =
                    unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(0) };
                crate::executor::local::zygote::serve(socket)?;
            } else if let Some(dir) = dir {
                crate::executor::local::supervisor::supervise(&dir)?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Reads and parses a pipeline file. `Err` holds the printed exit code 2 case.
/// A pipeline file read and parsed; `Err` is the exit code after its problems were said
/// (on stderr, or with `-o json` as `{"file", "valid": false, "errors"}` on stdout).
fn load_pipeline(
    file: &Path,
    binding: pipeline::Binding,
    output: Output,
) -> anyhow::Result<Result<(PipelineSource, pipeline::ParseOutcome), ExitCode>> {
    let metadata =
        std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?;
    if metadata.is_dir() {
        anyhow::bail!("{}: is a directory, not a pipeline file", file.display());
    }
    if metadata.len() > crate::limits::PIPELINE_MAX_BYTES as u64 {
        let error = pipeline::FieldError {
            field: String::new(),
            line: None,
            message: format!(
                "file is {} bytes, over the limit of {}",
                metadata.len(),
                crate::limits::PIPELINE_MAX_BYTES
            ),
        };
        return Ok(Err(refuse(file, &[error], output)));
    }
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let format = match file.extension().and_then(|e| e.to_str()) {
        Some("json") => Format::Json,
        _ => Format::Yaml,
    };
    match pipeline::parse_with(&text, format, binding) {
        Ok(outcome) => {
            let source = PipelineSource {
                format: match format {
                    Format::Yaml => SourceFormat::Yaml,
                    Format::Json => SourceFormat::Json,
                },
                text,
                params: Some(outcome.pipeline.params.clone()),
            };
            Ok(Ok((source, outcome)))
        }
        Err(errors) => Ok(Err(refuse(file, &errors, output))),
    }
}

/// Says why a pipeline file is refused, each problem once with its field and line; exit 2.
fn refuse(file: &Path, errors: &[pipeline::FieldError], output: Output) -> ExitCode {
    match output {
        Output::Json => {
            let errors: Vec<_> = errors
                .iter()
                .map(
                    |e| serde_json::json!({"field": e.field, "line": e.line, "message": e.message}),
                )
                .collect();
            println!(
                "{}",
                serde_json::json!({"file": file.display().to_string(), "valid": false, "errors": errors})
            );
        }
        Output::Table => {
            for error in errors {
                eprintln!("{}: {error}", file.display());
            }
        }
    }
    ExitCode::from(2)
}

fn validate(file: &Path, output: Output) -> anyhow::Result<ExitCode> {
    match load_pipeline(file, pipeline::Binding::Check, output)? {
        Ok((_, outcome)) => {
            let steps = outcome.pipeline.steps.len();
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::json!({
                        "file": file.display().to_string(),
                        "valid": true,
                        "pipeline": outcome.pipeline.name,
                        "steps": steps,
                        "warnings": outcome.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    })
                ),
                Output::Table => {
                    for warning in &outcome.warnings {
                        eprintln!("warning: {warning}");
                    }
                    println!("{}: valid ({steps} steps)", file.display());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(code) => Ok(code),
    }
}

/// `scarab run`'s state dir when none is given: one per working directory, outside it.
///
/// Not in the working directory itself: steps may not create entries directly in the
/// ancestors of the state dir (see `executor::local::confine`), and the working directory
/// is where a pipeline's steps most often write.
fn default_run_state_dir() -> anyhow::Result<PathBuf> {
    use sha2::Digest;
    let base = match (std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME")) {
        (Some(state), _) if Path::new(&state).is_absolute() => PathBuf::from(state),
        (_, Some(home)) if Path::new(&home).is_absolute() => {
            Path::new(&home).join(".local").join("state")
        }
        _ => anyhow::bail!("--state-dir: no default without HOME or XDG_STATE_HOME; name one"),
    };
    let cwd = std::env::current_dir()
        .and_then(std::fs::canonicalize)
        .context("--state-dir: the working directory")?;
    let digest = sha2::Sha256::digest(cwd.as_os_str().as_encoded_bytes());
    let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let name: String = cwd
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    Ok(base
        .join("scarab")
        .join("run")
        .join(format!("{name}-{hash}")))
}

fn run(
    file: &Path,
    params: &[(String, String)],
    state_dir: &Path,
    settings: Settings,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let (source, outcome) = match load_pipeline(file, pipeline::Binding::Values(params), output)? {
        Ok(loaded) => loaded,
        Err(code) => return Ok(code),
    };
    for warning in &outcome.warnings {
        eprintln!("warning: {warning}");
    }
    let mut missing = settings.live().secrets.check(&outcome.pipeline);
    missing.extend(settings.live().admission.check(&outcome.pipeline));
    missing.extend(settings.check_executors(&outcome.pipeline));
    if !missing.is_empty() {
        return Ok(refuse(file, &missing, output));
    }
    serve::init_logging(LogFormat::Human, None, "warn");
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(run_in_process(
        state_dir,
        settings,
        source,
        outcome.pipeline,
        output,
    ))
}

async fn run_in_process(
    state_dir: &Path,
    settings: Settings,
    source: PipelineSource,
    pipeline: pipeline::Pipeline,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("locating the scarab binary")?;
    let running = match service::start(StateDir::new(state_dir), settings, exe).await {
        Ok(running) => running,
        // These name the state dir themselves.
        Err(error @ (StartError::Held { .. } | StartError::StateDir { .. })) => {
            return Err(error.into());
        }
        Err(error) => {
            return Err(anyhow::Error::new(error)
                .context(format!("starting on state dir {}", state_dir.display())));
        }
    };
    let service = running.service.clone();
    let origin = crate::engine::run_failure::LOCAL_ORIGIN.to_string();
    let admission = crate::engine::RunAdmission::of(&pipeline);
    let submitted = service
        .submit(source, Arc::new(pipeline), origin, admission, None)
        .await?;
    eprintln!(
        "run {} submitted (state dir {})",
        submitted.id,
        state_dir.display()
    );
    let mut progress = live::Progress::new();
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut cancelled = false;
    let run = loop {
        let stored = service
            .store
            .read()?
            .run(submitted.id)?
            .context("the submitted run vanished")?;
        let run = service::driver_rebuild(stored).map_err(anyhow::Error::msg)?;
        progress.show(&live::View::of_run(&run));
        if run.header.state.is_terminal() {
            break run;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = interrupts.recv() => {
                if cancelled {
                    eprintln!("interrupted again: leaving; running steps will be re-adopted by the next start");
                    return Ok(ExitCode::from(130));
                }
                cancelled = true;
                eprintln!("cancelling (interrupt again to leave at once)");
                let _ = service.cancel(submitted.id, "cli".into()).await;
            }
        }
    };
    let auto_retry_max = service.settings.live().auto_retry.max;
    running.stop().await;
    let state = run.header.state;
    let ending = match crate::engine::classify_run(&run) {
        Some(c) => live::failure_sentence(c.category, c.step.as_deref(), &c.reason),
        None => String::new(),
    };
    eprintln!(
        "{}",
        live::verdict_line(&run.header.id.to_string(), state.as_str(), &ending)
    );
    if let Output::Json = output {
        let detail = crate::api::dto::run_detail(&run, auto_retry_max, &[]);
        println!("{}", serde_json::to_string_pretty(&detail)?);
    }
    Ok(if state == crate::engine::RunState::Succeeded {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `scarab version`: what a bug report and an upgrade plan need.
fn version(output: Output) {
    let version = env!("CARGO_PKG_VERSION");
    let commit = env!("SCARAB_BUILD_COMMIT");
    let schema = crate::store::SCHEMA_VERSION;
    let format = crate::store::codec::FORMAT_VERSION;
    let readable = crate::store::codec::READABLE_FORMATS;
    match output {
        Output::Json => println!(
            "{}",
            serde_json::json!({
                "version": version,
                "commit": commit,
                "store_schema": schema,
                "record_format": format,
                "readable_record_formats": readable,
            })
        ),
        Output::Table => {
            let readable: Vec<String> = readable.iter().map(u8::to_string).collect();
            println!("scarab {version}");
            println!("commit {commit}");
            println!(
                "store schema {schema}, record format {format} (reads formats {})",
                readable.join(", ")
            );
        }
    }
}

/// `--param NAME=VALUE`.
fn parse_param(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .ok_or_else(|| format!("{text:?}: expected NAME=VALUE"))
}

/// The submit query with each `--param` added as `param=NAME=VALUE`, encoded.
fn with_params(query: String, params: &[(String, String)]) -> String {
    let mut serializer = form_urlencoded::Serializer::new(String::new());
    for (name, value) in params {
        serializer.append_pair("param", &format!("{name}={value}"));
    }
    let encoded = serializer.finish();
    match (query.is_empty(), encoded.is_empty()) {
        (_, true) => query,
        (true, false) => format!("?{encoded}"),
        (false, false) => format!("{query}&{encoded}"),
    }
}

#[cfg(test)]
mod help_tests {
    use super::*;

    /// The zygote's arguments, which `main` recognises before the parser, parse to the
    /// command `main` then runs: the shortcut and the parser agree.
    #[test]
    fn the_zygote_arguments_parse_to_the_zygote() {
        let args = std::iter::once("scarab").chain(crate::executor::local::zygote::ARGS);
        let cli = Cli::try_parse_from(args).expect("the zygote's arguments parse");
        assert!(matches!(
            cli.command,
            Command::Supervise {
                dir: None,
                zygote: true
            }
        ));
    }

    /// Every command says what it does, and every argument and option what it is
    /// (`--help` lists the values of those that take a fixed set).
    #[test]
    fn every_command_and_argument_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", command.get_name());
            if command.get_about().is_none() && path != " scarab" {
                missing.push(format!("{path}: no about"));
            }
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}: no help"));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_name() != "help" && !sub.is_hide_set() {
                    walk(sub, &path, missing);
                }
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    /// The README's usage block shows every command (and every subcommand of
    /// `schedule`, `dlq`, `config` and `output`).
    #[test]
    fn the_readme_shows_every_command() {
        let readme = include_str!("../../README.md");
        let usage = &readme[readme.find("## Usage").expect("a Usage section")..];
        let mut missing = Vec::new();
        for command in Cli::command().get_subcommands() {
            let name = command.get_name();
            if command.is_hide_set() || name == "help" {
                continue;
            }
            if !usage.contains(&format!("scarab {name}")) {
                missing.push(name.to_string());
            }
            for sub in command.get_subcommands() {
                let sub = sub.get_name();
                if sub != "help" && !usage.contains(sub) {
                    missing.push(format!("{name} {sub}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "missing from README's usage: {missing:?}"
        );
    }
}
