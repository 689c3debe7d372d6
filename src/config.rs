//! The configuration file (TOML, `/etc/scarab/scarab.toml` in the package). Every key is
//! optional. Precedence: a command-line flag, then its `SCARAB_*` variable, then the file,
//! then the default. Every error names its key. `docs/configuration.md` lists them all.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Where the store, the admin token and the attempt directories live.
    pub state_dir: Option<PathBuf>,
    /// The API's listen address.
    pub listen: Option<String>,
    /// The listener's certificate chain (PEM, leaf first); with `tls_key`, `serve` speaks
    /// only HTTPS. Both files are re-read on SIGHUP.
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub tls_key: Option<PathBuf>,
    #[serde(default)]
    pub log: LogSection,
    #[serde(default)]
    pub engine: EngineSection,
    #[serde(default)]
    pub kubernetes: KubernetesSection,
    #[serde(default)]
    pub auto_retry: AutoRetryConfig,
    #[serde(default)]
    pub webhooks: Vec<WebhookConfig>,
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    #[serde(default)]
    pub secrets: SecretsSection,
    #[serde(default)]
    pub locks: Vec<LockConfig>,
}

/// `[[locks]]` (reloaded by SIGHUP): a named lock steps take with `locks: [NAME]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockConfig {
    pub name: String,
    /// Steps holding it at once. Default 1.
    pub limit: Option<u32>,
}

/// `[secrets]` (reloaded by SIGHUP): named secrets for `env: {VAR: {secret: NAME}}`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretsSection {
    /// One file per secret, named as the secret (docs/security.md).
    pub dir: Option<PathBuf>,
}

/// `[log]` (reloaded by SIGHUP: `level`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// A tracing filter: `info`, `debug`, `scarab=debug,kube=warn`.
    pub level: Option<String>,
    /// `auto` (human on a terminal, journald-friendly under systemd), `human`, `json`.
    pub format: Option<String>,
}

/// `[engine]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    #[serde(default, with = "optional_duration")]
    pub default_step_timeout: Option<Duration>,
    pub infra_retries: Option<u32>,
    #[serde(default, with = "optional_duration")]
    pub kill_grace: Option<Duration>,
    pub max_deliveries: Option<u32>,
    #[serde(default, with = "optional_duration")]
    pub log_retention: Option<Duration>,
    /// How long SIGTERM waits for in-flight requests and the last commit before exiting.
    #[serde(default, with = "optional_duration")]
    pub shutdown_deadline: Option<Duration>,
    /// Variables of the service's environment that local steps also see (beside `PATH`,
    /// `HOME`, `LANG`, Scarab's `SCARAB_*` and their pipeline's `env`).
    pub step_env_passthrough: Option<Vec<String>>,
    /// Slots of local steps active at once (reloaded by SIGHUP). Default: the CPUs.
    pub max_parallel_local: Option<u32>,
    /// One point of run priority is worth this much waiting (reloaded by SIGHUP).
    #[serde(default, with = "optional_duration")]
    pub priority_aging: Option<Duration>,
    /// Runs in progress at most; a submission beyond gets 429 (reloaded by SIGHUP).
    pub max_active_runs: Option<u32>,
    /// Local steps whose launch is prepared ahead while the pool is full, so a freed slot
    /// starts the next at once (reloaded by SIGHUP). Default: `max_parallel_local`, at
    /// most 4; 0 prepares none.
    pub prepared_local: Option<u32>,
}

/// `[kubernetes]`: where `executor: kubernetes` steps run.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSection {
    pub kubeconfig: Option<PathBuf>,
    pub in_cluster: Option<bool>,
    pub namespace: Option<String>,
    #[serde(default, with = "optional_duration")]
    pub grace_image_pull: Option<Duration>,
    #[serde(default, with = "optional_duration")]
    pub grace_config: Option<Duration>,
    #[serde(default, with = "optional_duration")]
    pub grace_unschedulable: Option<Duration>,
    #[serde(default, with = "optional_duration")]
    pub grace_pending: Option<Duration>,
    /// Pods of Scarab's steps at once (reloaded by SIGHUP). Default 100.
    pub max_pods: Option<u32>,
    /// The grace period of Scarab's Pod deletions. Default 30s.
    #[serde(default, with = "optional_duration")]
    pub delete_grace: Option<Duration>,
    /// The API's URL as the cluster's Pods reach it; set, Pod steps get `SCARAB_URL` and
    /// their attempt's token and can report outputs.
    pub callback_url: Option<String>,
}

/// `[[tokens]]`: API tokens besides the admin token (reloaded by SIGHUP). The secret is
/// given as its SHA-256 (`sha256`, hex) or read from a file (`file`, first line); the
/// plain token never needs to be in this file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Recorded as the caller of what the token does (gate decisions, logs).
    pub name: String,
    /// `read_only` or `approver` (read, and approve or reject gates).
    pub role: String,
    pub sha256: Option<String>,
    pub file: Option<PathBuf>,
}

/// A configured token, checked and ready to compare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub name: String,
    pub role: TokenRole,
    /// SHA-256 of the token.
    pub digest: [u8; 32],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenRole {
    ReadOnly,
    Approver,
}

/// Most configured tokens.
pub const TOKENS_MAX: usize = 64;

impl TokenConfig {
    fn resolve(&self, index: usize) -> Result<Token, String> {
        let key = |k: &str| format!("tokens[{index}].{k}");
        if self.name.is_empty()
            || self.name.len() > 64
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(format!(
                "{}: 1 to 64 characters of [A-Za-z0-9._-]",
                key("name")
            ));
        }
        if self.name == "admin" || self.name == crate::engine::SYSTEM {
            return Err(format!("{}: {:?} is reserved", key("name"), self.name));
        }
        let role = match self.role.as_str() {
            "read_only" => TokenRole::ReadOnly,
            "approver" => TokenRole::Approver,
            other => {
                return Err(format!(
                    "{}: {other:?} is not a role; one of read_only, approver",
                    key("role")
                ));
            }
        };
        let digest = match (&self.sha256, &self.file) {
            (Some(hex), None) => parse_digest(hex).ok_or_else(|| {
                format!(
                    "{}: must be 64 hex digits (the token's SHA-256)",
                    key("sha256")
                )
            })?,
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: reading {}: {e}", key("file"), path.display()))?;
                let token = text.lines().next().unwrap_or("").trim();
                if token.len() < 16 {
                    return Err(format!(
                        "{}: the token in {} must be at least 16 characters",
                        key("file"),
                        path.display()
                    ));
                }
                digest_of(token)
            }
            _ => {
                return Err(format!(
                    "tokens[{index}]: give exactly one of sha256 or file"
                ));
            }
        };
        Ok(Token {
            name: self.name.clone(),
            role,
            digest,
        })
    }
}

/// SHA-256 of a presented token.
pub fn digest_of(token: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
        let text = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// The settings a SIGHUP replaces at once: webhooks, tokens, the log level and the
/// auto-retry sweep. Built only from a config that validated completely.
#[derive(Clone, Debug, Default)]
pub struct Live {
    pub webhooks: Vec<WebhookConfig>,
    pub tokens: Vec<Token>,
    pub log_level: Option<String>,
    pub auto_retry: crate::engine::AutoRetrySettings,
    /// The named secrets, as last loaded from `[secrets] dir`.
    pub secrets: std::sync::Arc<crate::secrets::Secrets>,
    /// What of this configuration local steps must not reach: the token files and the
    /// secrets dir.
    pub step_protected: Vec<PathBuf>,
    /// Admission control's limits: the pools, the locks, priority aging.
    pub admission: crate::engine::admission::Limits,
}

impl Default for crate::engine::admission::Limits {
    fn default() -> Self {
        crate::engine::admission::Limits {
            local: default_max_parallel_local(),
            pods: DEFAULT_MAX_PODS,
            locks: Default::default(),
            aging_ms: DEFAULT_PRIORITY_AGING.as_millis() as u64,
            active_runs: DEFAULT_MAX_ACTIVE_RUNS,
            prepared_local: default_prepared_local(default_max_parallel_local()),
        }
    }
}

/// `engine.max_active_runs` when unset.
pub const DEFAULT_MAX_ACTIVE_RUNS: u32 = 100_000;

/// `kubernetes.max_pods` when unset.
pub const DEFAULT_MAX_PODS: u32 = 100;
/// `engine.priority_aging` when unset.
pub const DEFAULT_PRIORITY_AGING: Duration = Duration::from_secs(60);

/// `engine.prepared_local` when unset: one launch prepared per local slot, at most
/// `limits::PREPARED_LOCAL_DEFAULT_MAX`.
pub fn default_prepared_local(local: u32) -> u32 {
    local.min(crate::limits::PREPARED_LOCAL_DEFAULT_MAX)
}

/// `engine.max_parallel_local` when unset: the CPUs this process may use.
pub fn default_max_parallel_local() -> u32 {
    std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(1)
        .clamp(1, crate::limits::POOL_LIMIT_MAX)
}

impl ConfigFile {
    /// The limits of admission control: the file's values, then `SCARAB_MAX_PARALLEL_LOCAL`,
    /// `SCARAB_MAX_PODS`, `SCARAB_PRIORITY_AGING` and `SCARAB_PREPARED_LOCAL` from `env`.
    /// Errors name the key.
    pub fn admission(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<crate::engine::admission::Limits, String> {
        let max = crate::limits::POOL_LIMIT_MAX;
        let pool = |file: Option<u32>, key: &str, var: &str, default: u32| -> Result<u32, String> {
            let (value, name) = match env(var) {
                Some(text) => {
                    let value = text
                        .trim()
                        .parse::<u32>()
                        .map_err(|_| format!("{var}: {text:?} is not a whole number"))?;
                    (value, var.to_string())
                }
                None => match file {
                    Some(value) => (value, key.to_string()),
                    None => return Ok(default),
                },
            };
            if !(1..=max).contains(&value) {
                return Err(format!("{name}: must be between 1 and {max}"));
            }
            Ok(value)
        };
        let local = pool(
            self.engine.max_parallel_local,
            "engine.max_parallel_local",
            "SCARAB_MAX_PARALLEL_LOCAL",
            default_max_parallel_local(),
        )?;
        let pods = pool(
            self.kubernetes.max_pods,
            "kubernetes.max_pods",
            "SCARAB_MAX_PODS",
            DEFAULT_MAX_PODS,
        )?;
        let (aging, name) = match env("SCARAB_PRIORITY_AGING") {
            Some(text) => (
                humantime::parse_duration(text.trim()).map_err(|e| {
                    format!("SCARAB_PRIORITY_AGING: {text:?} is not a duration ({e})")
                })?,
                "SCARAB_PRIORITY_AGING",
            ),
            None => (
                self.engine.priority_aging.unwrap_or(DEFAULT_PRIORITY_AGING),
                "engine.priority_aging",
            ),
        };
        let (min, top) = (
            crate::limits::PRIORITY_AGING_MIN,
            crate::limits::PRIORITY_AGING_MAX,
        );
        if aging < min || aging > top {
            return Err(format!(
                "{name}: must be between {} and {}",
                humantime::format_duration(min),
                humantime::format_duration(top)
            ));
        }
        if self.locks.len() > crate::limits::LOCKS_MAX {
            return Err(format!(
                "locks: at most {} locks (found {})",
                crate::limits::LOCKS_MAX,
                self.locks.len()
            ));
        }
        let mut locks = std::collections::BTreeMap::new();
        for (i, lock) in self.locks.iter().enumerate() {
            crate::limits::check_admission_name(&lock.name, crate::limits::LOCK_NAME_MAX_BYTES)
                .map_err(|problem| format!("locks[{i}].name: {problem}"))?;
            let limit = lock.limit.unwrap_or(1);
            if !(1..=crate::limits::LOCK_LIMIT_MAX).contains(&limit) {
                return Err(format!(
                    "locks[{i}].limit: must be between 1 and {}",
                    crate::limits::LOCK_LIMIT_MAX
                ));
            }
            if locks.insert(lock.name.clone(), limit).is_some() {
                return Err(format!("locks[{i}].name: {:?} is named twice", lock.name));
            }
        }
        let active_runs = self
            .engine
            .max_active_runs
            .unwrap_or(DEFAULT_MAX_ACTIVE_RUNS);
        if !(1..=crate::limits::ACTIVE_RUNS_MAX).contains(&active_runs) {
            return Err(format!(
                "engine.max_active_runs: must be between 1 and {}",
                crate::limits::ACTIVE_RUNS_MAX
            ));
        }
        let (prepared_local, name) = match env("SCARAB_PREPARED_LOCAL") {
            Some(text) => (
                text.trim().parse::<u32>().map_err(|_| {
                    format!("SCARAB_PREPARED_LOCAL: {text:?} is not a whole number")
                })?,
                "SCARAB_PREPARED_LOCAL",
            ),
            None => (
                self.engine
                    .prepared_local
                    .unwrap_or_else(|| default_prepared_local(local)),
                "engine.prepared_local",
            ),
        };
        if prepared_local > crate::limits::PREPARED_LOCAL_MAX {
            return Err(format!(
                "{name}: must be between 0 and {}",
                crate::limits::PREPARED_LOCAL_MAX
            ));
        }
        Ok(crate::engine::admission::Limits {
            local,
            pods,
            locks,
            active_runs,
            prepared_local,
            aging_ms: u64::try_from(aging.as_millis()).unwrap_or(u64::MAX),
        })
    }
}

impl ConfigFile {
    /// The reloadable part, with `SCARAB_AUTO_RETRY_*` applied from `env`.
    pub fn live(&self, env: impl Fn(&str) -> Option<String>) -> Result<Live, String> {
        let tokens = self
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| t.resolve(i))
            .collect::<Result<Vec<_>, _>>()?;
        let secrets = match &self.secrets.dir {
            Some(dir) => crate::secrets::Secrets::load(dir)?,
            None => crate::secrets::Secrets::default(),
        };
        Ok(Live {
            webhooks: self.webhooks.clone(),
            tokens,
            log_level: self.log.level.clone(),
            auto_retry: self.auto_retry.settings(&env)?,
            secrets: std::sync::Arc::new(secrets),
            step_protected: self
                .tokens
                .iter()
                .filter_map(|t| t.file.clone())
                .chain(self.secrets.dir.clone())
                .collect(),
            admission: self.admission(&env)?,
        })
    }
}

/// Optional human durations (`10s`, `1h30m`).
mod optional_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?;
        text.map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// `[auto_retry]`: the sweep of docs/auto-retry.md. Every key is optional (defaults in
/// `AutoRetrySettings`) and may be overridden by `SCARAB_AUTO_RETRY_<KEY>`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoRetryConfig {
    pub enabled: Option<bool>,
    pub interval: Option<String>,
    pub scan_limit: Option<u64>,
    pub sweep_limit: Option<u64>,
    pub window: Option<String>,
    pub max: Option<u64>,
    pub backoff_initial: Option<String>,
    pub backoff_max: Option<String>,
}

impl AutoRetryConfig {
    /// The file's values, then the environment's (`env` looks a variable up), checked.
    /// Errors name the key (`auto_retry.scan_limit` or `SCARAB_AUTO_RETRY_SCAN_LIMIT`).
    pub fn settings(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<crate::engine::AutoRetrySettings, String> {
        let mut settings = crate::engine::AutoRetrySettings::default();
        // (file value, env name) → a string to parse, with the name to blame.
        let pick = |file: Option<String>, key: &str| -> Option<(String, String)> {
            let var = format!("SCARAB_AUTO_RETRY_{}", key.to_ascii_uppercase());
            match env(&var) {
                Some(value) => Some((value, var)),
                None => file.map(|value| (value, format!("auto_retry.{key}"))),
            }
        };
        if let Some((value, name)) = pick(self.enabled.map(|b| b.to_string()), "enabled") {
            settings.enabled = match value.trim() {
                "true" | "1" | "yes" | "on" => true,
                "false" | "0" | "no" | "off" => false,
                other => return Err(format!("{name}: {other:?} is not a boolean")),
            };
        }
        let duration = |value: &str, name: &str, min: Duration, max: Duration| {
            let d = humantime::parse_duration(value.trim())
                .map_err(|e| format!("{name}: {value:?} is not a duration ({e})"))?;
            if d < min || d > max {
                return Err(format!(
                    "{name}: must be between {} and {}",
                    humantime::format_duration(min),
                    humantime::format_duration(max)
                ));
            }
            Ok(d)
        };
        let number = |value: &str, name: &str, min: u64, max: u64| {
            let n: u64 = value
                .trim()
                .parse()
                .map_err(|_| format!("{name}: {value:?} is not a whole number"))?;
            if n < min || n > max {
                return Err(format!("{name}: must be between {min} and {max}"));
            }
            Ok(n)
        };
        let secs = Duration::from_secs;
        if let Some((v, name)) = pick(self.interval.clone(), "interval") {
            settings.interval = duration(&v, &name, secs(1), secs(24 * 3600))?;
        }
        if let Some((v, name)) = pick(self.window.clone(), "window") {
            settings.window = duration(&v, &name, secs(60), secs(30 * 24 * 3600))?;
        }
        if let Some((v, name)) = pick(self.backoff_initial.clone(), "backoff_initial") {
            settings.backoff_initial = duration(&v, &name, secs(1), secs(24 * 3600))?;
        }
        if let Some((v, name)) = pick(self.backoff_max.clone(), "backoff_max") {
            settings.backoff_max = duration(&v, &name, secs(1), secs(24 * 3600))?;
        }
        if let Some((v, name)) = pick(self.scan_limit.map(|n| n.to_string()), "scan_limit") {
            settings.scan_limit = number(&v, &name, 1, 10_000)? as usize;
        }
        if let Some((v, name)) = pick(self.sweep_limit.map(|n| n.to_string()), "sweep_limit") {
            settings.sweep_limit = number(&v, &name, 1, 1_000)? as usize;
        }
        if let Some((v, name)) = pick(self.max.map(|n| n.to_string()), "max") {
            settings.max = number(&v, &name, 0, 20)? as u32;
        }
        if settings.backoff_max < settings.backoff_initial {
            return Err("auto_retry.backoff_max: must be at least backoff_initial".into());
        }
        Ok(settings)
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// `http://` or `https://` URL the events are POSTed to.
    pub url: String,
    /// Which events: `run_state` (every run state change), `dead_lettered` (operator
    /// alerts), `gate_waiting` (a gate opened and waits for a decision), `quarantined` (the
    /// auto-retry sweep set a run aside; an operator alert). Default: all.
    #[serde(default = "all_events")]
    pub events: Vec<WebhookEvent>,
    /// The HMAC-SHA256 key of `X-Scarab-Signature`.
    pub secret: String,
    /// Per-request timeout, a human duration. Default 10s.
    #[serde(default = "default_timeout", with = "humantime_serde_compat")]
    pub timeout: Duration,
    /// For an `https://` URL whose certificate a private CA signed: that CA's
    /// certificate (PEM). Default: the system's roots.
    pub ca_cert: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookEvent {
    RunState,
    DeadLettered,
    GateWaiting,
    /// The auto-retry sweep set a run aside (an operator alert).
    Quarantined,
}

impl WebhookEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookEvent::RunState => "run_state",
            WebhookEvent::DeadLettered => "dead_lettered",
            WebhookEvent::GateWaiting => "gate_waiting",
            WebhookEvent::Quarantined => "quarantined",
        }
    }
}

fn all_events() -> Vec<WebhookEvent> {
    vec![
        WebhookEvent::RunState,
        WebhookEvent::DeadLettered,
        WebhookEvent::GateWaiting,
        WebhookEvent::Quarantined,
    ]
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

/// Durations in the file are human strings (`10s`, `1m`).
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// Most webhooks one service will deliver to.
pub const WEBHOOKS_MAX: usize = 32;
const SECRET_MIN_BYTES: usize = 16;

impl ConfigFile {
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.display().to_string(),
            message,
        };
        let config: ConfigFile = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        config.validate().map_err(invalid)?;
        Ok(config)
    }

    /// Every problem names its key, e.g. `webhooks[1].url`.
    fn validate(&self) -> Result<(), String> {
        let range = |key: &str, value: Option<Duration>, min: Duration, max: Duration| match value {
            Some(d) if d < min || d > max => Err(format!(
                "{key}: must be between {} and {}",
                humantime::format_duration(min),
                humantime::format_duration(max)
            )),
            _ => Ok(()),
        };
        let secs = Duration::from_secs;
        let e = &self.engine;
        range(
            "engine.default_step_timeout",
            e.default_step_timeout,
            crate::limits::STEP_TIMEOUT_MIN,
            crate::limits::STEP_TIMEOUT_MAX,
        )?;
        range("engine.kill_grace", e.kill_grace, secs(0), secs(600))?;
        range(
            "engine.log_retention",
            e.log_retention,
            secs(1),
            secs(3650 * 86400),
        )?;
        range(
            "engine.shutdown_deadline",
            e.shutdown_deadline,
            secs(1),
            secs(600),
        )?;
        if e.infra_retries
            .is_some_and(|n| n > crate::limits::INFRA_RETRIES_MAX)
        {
            return Err(format!(
                "engine.infra_retries: must be at most {}",
                crate::limits::INFRA_RETRIES_MAX
            ));
        }
        if e.max_deliveries.is_some_and(|n| !(1..=1000).contains(&n)) {
            return Err("engine.max_deliveries: must be between 1 and 1000".into());
        }
        let passthrough = e.step_env_passthrough.as_deref().unwrap_or_default();
        if passthrough.len() > crate::limits::STEP_ENV_PASSTHROUGH_MAX {
            return Err(format!(
                "engine.step_env_passthrough: at most {} names",
                crate::limits::STEP_ENV_PASSTHROUGH_MAX
            ));
        }
        for (i, name) in passthrough.iter().enumerate() {
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && name.len() <= crate::limits::ENV_NAME_MAX_BYTES;
            if !valid {
                return Err(format!(
                    "engine.step_env_passthrough[{i}]: {name:?} is not a variable name"
                ));
            }
            if name.starts_with("SCARAB_") {
                return Err(format!(
                    "engine.step_env_passthrough[{i}]: {name:?}: the service's SCARAB_* variables never reach a step"
                ));
            }
        }
        let k = &self.kubernetes;
        for (key, value) in [
            ("kubernetes.grace_image_pull", k.grace_image_pull),
            ("kubernetes.grace_config", k.grace_config),
            ("kubernetes.grace_unschedulable", k.grace_unschedulable),
            ("kubernetes.grace_pending", k.grace_pending),
        ] {
            range(key, value, secs(1), secs(7 * 86400))?;
        }
        range(
            "kubernetes.delete_grace",
            k.delete_grace,
            secs(0),
            secs(3600),
        )?;
        if let Some(url) = &k.callback_url {
            check_callback_url(url).map_err(|e| format!("kubernetes.callback_url: {e}"))?;
        }
        if k.kubeconfig.is_some() && k.in_cluster == Some(true) {
            return Err("kubernetes.in_cluster: cannot be true with kubernetes.kubeconfig".into());
        }
        if let Some(listen) = &self.listen
            && listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(format!(
                "listen: {listen:?} is not an address like 127.0.0.1:7300"
            ));
        }
        if let Some(format) = &self.log.format
            && !["auto", "human", "json"].contains(&format.as_str())
        {
            return Err(format!(
                "log.format: {format:?} is not one of auto, human, json"
            ));
        }
        if let Some(level) = &self.log.level
            && tracing_subscriber::EnvFilter::try_new(level).is_err()
        {
            return Err(format!("log.level: {level:?} is not a valid filter"));
        }
        if self.tokens.len() > TOKENS_MAX {
            return Err(format!("tokens: at most {TOKENS_MAX}"));
        }
        let mut names = std::collections::HashSet::new();
        for (i, token) in self.tokens.iter().enumerate() {
            if !names.insert(&token.name) {
                return Err(format!("tokens[{i}].name: {:?} is used twice", token.name));
            }
        }
        self.live(|_| None)?;
        if self.webhooks.len() > WEBHOOKS_MAX {
            return Err(format!(
                "webhooks: at most {WEBHOOKS_MAX} (found {})",
                self.webhooks.len()
            ));
        }
        for (i, hook) in self.webhooks.iter().enumerate() {
            if !(hook.url.starts_with("http://") || hook.url.starts_with("https://"))
                || hook.url.len() > 2048
            {
                return Err(format!(
                    "webhooks[{i}].url: must be an http:// or https:// URL of at most 2048 bytes"
                ));
            }
            if hook.secret.len() < SECRET_MIN_BYTES {
                return Err(format!(
                    "webhooks[{i}].secret: must be at least {SECRET_MIN_BYTES} bytes"
                ));
            }
            if hook.events.is_empty() {
                return Err(format!(
                    "webhooks[{i}].events: must name at least one event"
                ));
            }
            if hook.timeout.is_zero() || hook.timeout > Duration::from_secs(120) {
                return Err(format!("webhooks[{i}].timeout: must be between 1ms and 2m"));
            }
            if let Some(ca) = &hook.ca_cert {
                if !hook.url.starts_with("https://") {
                    return Err(format!("webhooks[{i}].ca_cert: only for an https:// url"));
                }
                crate::tls::certificates(ca, "CA certificate")
                    .map_err(|e| format!("webhooks[{i}].ca_cert: {e}"))?;
            }
        }
        match (&self.tls_cert, &self.tls_key) {
            (None, None) => {}
            (Some(cert), Some(key)) => {
                crate::tls::server_config(cert, key)?;
            }
            (Some(_), None) => return Err("tls_key: needed with tls_cert".to_string()),
            (None, Some(_)) => return Err("tls_cert: needed with tls_key".to_string()),
        }
        Ok(())
    }
}

/// A URL Pods can call back on: `http://` or `https://`, a host, no credentials, no
/// query or fragment, printable ASCII, at most `limits::CALLBACK_URL_MAX_BYTES`.
pub fn check_callback_url(url: &str) -> Result<(), String> {
    if url.len() > crate::limits::CALLBACK_URL_MAX_BYTES {
        return Err(format!(
            "longer than {} bytes",
            crate::limits::CALLBACK_URL_MAX_BYTES
        ));
    }
    if !url.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!(
            "{url:?} has a space or a character that is not printable ASCII"
        ));
    }
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} does not start with http:// or https://"))?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    if host.contains('@') {
        return Err(format!("{url:?}: credentials do not belong in the URL"));
    }
    if rest.contains(['?', '#']) {
        return Err(format!("{url:?}: no query or fragment"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<ConfigFile, ConfigError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("scarab.toml");
        std::fs::write(&path, text).expect("write");
        ConfigFile::load(&path)
    }

    #[test]
    fn webhooks_load_with_defaults_and_bad_keys_are_named() {
        let config =
            load("[[webhooks]]\nurl = \"http://127.0.0.1:9/h\"\nsecret = \"0123456789abcdef\"\n")
                .expect("valid");
        assert_eq!(config.webhooks[0].events, all_events());
        assert_eq!(config.webhooks[0].timeout, Duration::from_secs(10));
        let error = load("[[webhooks]]\nurl = \"ftp://x\"\nsecret = \"0123456789abcdef\"\n")
            .expect_err("bad url");
        assert!(error.to_string().contains("webhooks[0].url"), "{error}");
        let error = load("[[webhooks]]\nurl = \"http://x\"\nsecret = \"short\"\n")
            .expect_err("short secret");
        assert!(error.to_string().contains("webhooks[0].secret"), "{error}");
        let error =
            load("[[webhooks]]\nurl = \"http://x\"\nsecret = \"0123456789abcdef\"\ncolour = 1\n")
                .expect_err("unknown");
        assert!(error.to_string().contains("colour"), "{error}");
    }

    #[test]
    fn a_callback_url_must_be_one_a_pod_can_use() {
        let ok = load("[kubernetes]\ncallback_url = \"http://scarab.scarab.svc:7300\"\n")
            .expect("valid");
        assert_eq!(
            ok.kubernetes.callback_url.as_deref(),
            Some("http://scarab.scarab.svc:7300")
        );
        for bad in [
            "ftp://x",
            "http://",
            "http://user:pw@host",
            "https://host/?q=1",
            "http://host /x",
            "scarab:7300",
        ] {
            let error = load(&format!("[kubernetes]\ncallback_url = \"{bad}\"\n")).expect_err(bad);
            assert!(
                error.to_string().contains("kubernetes.callback_url"),
                "{bad}: {error}"
            );
        }
        let long = format!(
            "http://h/{}",
            "a".repeat(crate::limits::CALLBACK_URL_MAX_BYTES)
        );
        assert!(check_callback_url(&long).is_err());
    }
}
