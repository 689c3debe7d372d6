//! Named secrets: files under the configured secrets dir (`[secrets] dir`), one per
//! secret, named as the secret. Loaded at start and on SIGHUP; referenced from a pipeline
//! as `env: {VAR: {secret: NAME}}`.
//!
//! A value lives only in this process's memory, in the handshake pipe to the supervisor
//! of a step that references it, and in that step's environment. It is never written to
//! the store, an attempt's spec, a backup, the history or an API answer, and every
//! captured log masks it (`executor::local::mask`).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::limits;

/// The secrets of one load of the secrets dir.
#[derive(Clone, Default)]
pub struct Secrets {
    dir: Option<PathBuf>,
    values: BTreeMap<String, String>,
    /// Files that are not usable secrets, by name, with why (a wrong mode, too large...).
    unusable: BTreeMap<String, String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: a value never reaches a log line.
        f.debug_struct("Secrets")
            .field("dir", &self.dir)
            .field("names", &self.values.keys().collect::<Vec<_>>())
            .field("unusable", &self.unusable)
            .finish()
    }
}

/// Why a secret reference cannot be resolved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretProblem {
    #[error("no secrets dir is configured ([secrets] dir)")]
    NoDir,
    #[error("unknown secret {0:?}")]
    Unknown(String),
    #[error("secret {name:?} is not usable: {why}")]
    Unusable { name: String, why: String },
}

impl Secrets {
    /// Loads every secret of `dir`. The directory itself must be safe (owned by root or
    /// this user, writable by nobody else); a file that is not a usable secret is left
    /// out and remembered with why, so a pipeline naming it is told.
    pub fn load(dir: &Path) -> Result<Secrets, String> {
        let key = "secrets.dir";
        let meta = std::fs::metadata(dir).map_err(|e| format!("{key}: {}: {e}", dir.display()))?;
        if !meta.is_dir() {
            return Err(format!("{key}: {} is not a directory", dir.display()));
        }
        let me = rustix::process::geteuid().as_raw();
        if meta.uid() != 0 && meta.uid() != me {
            return Err(format!(
                "{key}: {} belongs to uid {}; it must belong to root or to the service's user",
                dir.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "{key}: {} is writable by others (mode {:o}); make it 0750 or 0700",
                dir.display(),
                meta.mode() & 0o777
            ));
        }
        let mut secrets = Secrets {
            dir: Some(dir.to_path_buf()),
            ..Secrets::default()
        };
        let entries =
            std::fs::read_dir(dir).map_err(|e| format!("{key}: {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{key}: {}: {e}", dir.display()))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            if secrets.values.len() + secrets.unusable.len() >= limits::SECRETS_MAX {
                return Err(format!(
                    "{key}: more than {} secrets in {}",
                    limits::SECRETS_MAX,
                    dir.display()
                ));
            }
            match read_secret(&entry.path(), &name, me) {
                Ok(value) => {
                    secrets.values.insert(name, value);
                }
                Err(why) => {
                    tracing::warn!(secret = %name, %why, "secret left out");
                    secrets.unusable.insert(name, why);
                }
            }
        }
        Ok(secrets)
    }

    /// The value of a secret a step references.
    pub fn get(&self, name: &str) -> Result<&str, SecretProblem> {
        if self.dir.is_none() {
            return Err(SecretProblem::NoDir);
        }
        if let Some(value) = self.values.get(name) {
            return Ok(value);
        }
        match self.unusable.get(name) {
            Some(why) => Err(SecretProblem::Unusable {
                name: name.to_owned(),
                why: why.clone(),
            }),
            None => Err(SecretProblem::Unknown(name.to_owned())),
        }
    }

    /// Every usable value, for masking.
    pub fn values(&self) -> impl Iterator<Item = &str> {
        self.values.values().map(String::as_str)
    }

    /// `text` with every secret value in it replaced by `***`.
    pub fn mask(&self, text: &str) -> String {
        if !self.values().any(|v| text.contains(v)) {
            return text.to_owned();
        }
        let mut masker =
            crate::executor::local::mask::Masker::new(self.values().map(str::as_bytes));
        let mut out = masker.push(text.as_bytes());
        out.extend(masker.finish());
        // Whole values are replaced by ASCII, so the rest stays valid UTF-8.
        String::from_utf8_lossy(&out).into_owned()
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Every secret a pipeline's local steps name that this service cannot give, as
    /// errors at `steps[N].env.VAR.secret`. (A Pod step's secret is a Kubernetes Secret,
    /// which the cluster resolves.)
    pub fn check(&self, pipeline: &crate::pipeline::Pipeline) -> Vec<crate::pipeline::FieldError> {
        let mut errors = Vec::new();
        for (index, step) in pipeline.steps.iter().enumerate() {
            let crate::pipeline::StepAction::Local(command) = &step.action else {
                continue;
            };
            for (variable, name) in &command.secrets {
                if let Err(problem) = self.get(name) {
                    errors.push(crate::pipeline::FieldError {
                        field: format!("steps[{index}].env.{variable}.secret"),
                        line: None,
                        message: problem.to_string(),
                    });
                }
            }
        }
        errors
    }
}

/// One secret file: a regular file (never a link), owned by root or this user, with no
/// access for others and not writable by the group; its value is its UTF-8 text less one
/// trailing newline.
fn read_secret(path: &Path, name: &str, me: u32) -> Result<String, String> {
    use rustix::fs::{Mode, OFlags};
    if !limits::is_secret_name(name) {
        return Err(
            "the file name is not a secret name (lowercase letters, digits, '-' and '.')".into(),
        );
    }
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open it: {e}"))?;
    let mut file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.uid() != 0 && meta.uid() != me {
        return Err(format!(
            "it belongs to uid {}, not to root or the service's user",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o027 != 0 {
        return Err(format!(
            "mode {mode:o} lets others read it or the group write it; make it 0600 or 0640"
        ));
    }
    let mut bytes = Vec::new();
    file.by_ref()
        .take(limits::SECRET_VALUE_MAX_BYTES as u64 + 2)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    let mut value = String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())?;
    if value.ends_with('\n') {
        value.pop();
        if value.ends_with('\r') {
            value.pop();
        }
    }
    if value.len() > limits::SECRET_VALUE_MAX_BYTES {
        return Err(format!(
            "larger than {} bytes",
            limits::SECRET_VALUE_MAX_BYTES
        ));
    }
    if value.is_empty() {
        return Err("empty".into());
    }
    if value.contains('\0') {
        return Err("contains NUL, which no environment variable can hold".into());
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn loads_private_files_and_says_why_others_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
        write(dir.path(), "registry-key", "s3cr3t-value\n", 0o600);
        write(dir.path(), "group-read", "g-value", 0o640);
        write(dir.path(), "world", "w-value", 0o644);
        write(dir.path(), "Bad_Name", "x-value", 0o600);
        std::os::unix::fs::symlink(dir.path().join("registry-key"), dir.path().join("link"))
            .unwrap();
        let secrets = Secrets::load(dir.path()).unwrap();
        assert_eq!(secrets.get("registry-key"), Ok("s3cr3t-value"));
        assert_eq!(secrets.get("group-read"), Ok("g-value"));
        let unusable = |name: &str| match secrets.get(name) {
            Err(SecretProblem::Unusable { why, .. }) => why,
            other => panic!("{name}: {other:?}"),
        };
        assert!(unusable("world").contains("mode 644"));
        assert!(unusable("Bad_Name").contains("not a secret name"));
        assert!(unusable("link").contains("cannot open"));
        assert_eq!(
            secrets.get("missing"),
            Err(SecretProblem::Unknown("missing".into()))
        );
        assert!(!format!("{secrets:?}").contains("s3cr3t"));
    }

    #[test]
    fn a_dir_others_can_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = Secrets::load(dir.path()).unwrap_err();
        assert!(
            error.contains("secrets.dir") && error.contains("writable by others"),
            "{error}"
        );
    }
}
