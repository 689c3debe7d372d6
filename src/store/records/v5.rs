//! Record format 5. **Frozen** once released, like formats 2 to 4: a pipeline as
//! submitted carries the run's parameter values (`params`, by name), so the run rebuilds
//! with the same substitutions. Every other record is format 4's, re-exported.
//! `tests/fixtures/stores/format-5` is a store of this format.

use serde::{Deserialize, Serialize};

use super::v2;
pub use super::v4::{
    Attempt, DeadLetter, HistoryRecord, LaunchRecord, OutboxMessage, RunHeader, step_from_row,
    step_row,
};
use crate::store::records as domain;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineSource {
    pub format: v2::SourceFormat,
    pub text: String,
    /// (name, value), sorted by name.
    pub params: Vec<(String, String)>,
}

impl From<&domain::PipelineSource> for PipelineSource {
    fn from(source: &domain::PipelineSource) -> Self {
        let old = v2::PipelineSource::from(source);
        PipelineSource {
            format: old.format,
            text: old.text,
            params: source.params.clone().unwrap_or_default(),
        }
    }
}

impl TryFrom<PipelineSource> for domain::PipelineSource {
    type Error = v2::Implausible;

    fn try_from(source: PipelineSource) -> Result<Self, Self::Error> {
        if source.params.len() > crate::limits::PARAMS_MAX {
            return Err(v2::implausible(
                "pipeline",
                "params",
                format!(
                    "{} parameter values, at most {} are declared",
                    source.params.len(),
                    crate::limits::PARAMS_MAX
                ),
            ));
        }
        let mut domain = domain::PipelineSource::from(v2::PipelineSource {
            format: source.format,
            text: source.text,
        });
        domain.params = Some(source.params);
        Ok(domain)
    }
}
