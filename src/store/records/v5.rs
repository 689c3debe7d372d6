//! Record format 5. **Frozen** once released, like formats 2 to 4: a pipeline as
//! submitted carries the run's parameter values (`params`, by name), so the run rebuilds
//! with the same substitutions; and schedules (`Schedule`), a kind first stored in this
//! format. Every other record is format 4's, re-exported.
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

/// A schedule with the pipeline it starts (`schedules` table, keyed by name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub name: String,
    pub cron: String,
    pub timezone: String,
    pub catch_up: CatchUp,
    pub overlap: Overlap,
    pub paused: bool,
    pub created_at: u64,
    pub next_fire: Option<u64>,
    pub last_fire: Option<u64>,
    pub last_run: Option<u128>,
    pub runs_started: u64,
    pub fires_skipped: u64,
    pub last_skip: Option<(u64, String)>,
    pub pipeline: PipelineSource,
    pub pipeline_name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CatchUp {
    None,
    One,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Overlap {
    Allow,
    Skip,
}

impl From<&domain::StoredSchedule> for Schedule {
    fn from(stored: &domain::StoredSchedule) -> Self {
        use crate::engine::schedule as s;
        let schedule = &stored.schedule;
        Schedule {
            name: schedule.name.clone(),
            cron: schedule.cron.clone(),
            timezone: schedule.timezone.clone(),
            catch_up: match schedule.catch_up {
                s::CatchUp::None => CatchUp::None,
                s::CatchUp::One => CatchUp::One,
            },
            overlap: match schedule.overlap {
                s::Overlap::Allow => Overlap::Allow,
                s::Overlap::Skip => Overlap::Skip,
            },
            paused: schedule.paused,
            created_at: schedule.created_at.0,
            next_fire: schedule.next_fire.map(|t| t.0),
            last_fire: schedule.last_fire.map(|t| t.0),
            last_run: schedule.last_run.map(|r| r.0),
            runs_started: schedule.runs_started,
            fires_skipped: schedule.fires_skipped,
            last_skip: schedule.last_skip.clone().map(|(at, why)| (at.0, why)),
            pipeline: PipelineSource::from(&stored.source),
            pipeline_name: stored.pipeline_name.clone(),
        }
    }
}

impl TryFrom<Schedule> for domain::StoredSchedule {
    type Error = v2::Implausible;

    fn try_from(record: Schedule) -> Result<Self, Self::Error> {
        use crate::engine::schedule as s;
        use crate::engine::{RunId, Timestamp};
        use crate::limits;
        let bad = |field, problem: String| v2::implausible("schedule", field, problem);
        limits::check_admission_name(&record.name, limits::SCHEDULE_NAME_MAX_BYTES)
            .map_err(|problem| bad("name", problem))?;
        if record.cron.len() > limits::SCHEDULE_CRON_MAX_BYTES {
            return Err(bad("cron", format!("{} bytes", record.cron.len())));
        }
        if record.timezone.len() > limits::SCHEDULE_TIMEZONE_MAX_BYTES {
            return Err(bad("timezone", format!("{} bytes", record.timezone.len())));
        }
        if let Some((_, why)) = &record.last_skip
            && why.len() > limits::SCHEDULE_REASON_MAX_BYTES
        {
            return Err(bad("last_skip", format!("{} bytes", why.len())));
        }
        if record.pipeline_name.chars().count() > limits::PIPELINE_NAME_MAX_CHARS {
            return Err(bad(
                "pipeline_name",
                format!("{} bytes", record.pipeline_name.len()),
            ));
        }
        let source = domain::PipelineSource::try_from(record.pipeline)?;
        Ok(domain::StoredSchedule {
            schedule: s::Schedule {
                name: record.name,
                cron: record.cron,
                timezone: record.timezone,
                catch_up: match record.catch_up {
                    CatchUp::None => s::CatchUp::None,
                    CatchUp::One => s::CatchUp::One,
                },
                overlap: match record.overlap {
                    Overlap::Allow => s::Overlap::Allow,
                    Overlap::Skip => s::Overlap::Skip,
                },
                paused: record.paused,
                created_at: Timestamp(record.created_at),
                next_fire: record.next_fire.map(Timestamp),
                last_fire: record.last_fire.map(Timestamp),
                last_run: record.last_run.map(RunId),
                runs_started: record.runs_started,
                fires_skipped: record.fires_skipped,
                last_skip: record.last_skip.map(|(at, why)| (Timestamp(at), why)),
            },
            source,
            pipeline_name: record.pipeline_name,
        })
    }
}
