//! The configuration file (TOML). For now it holds the webhooks; the rest of the service's
//! settings are flags and `SCARAB_*` variables until the full file arrives.

use std::path::Path;
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
    #[serde(default)]
    pub webhooks: Vec<WebhookConfig>,
    #[serde(default)]
    pub auto_retry: AutoRetryConfig,
}

/// `[auto_retry]`: the sweep of PRODUCT.md §8. Every key is optional (defaults in
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
        }
        Ok(())
    }
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
}
