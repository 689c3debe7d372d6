//! `/v1/schedules`: create, list, show, pause, resume and delete schedules
//! (docs/schedules.md). Reads go to the store; changes through the driver.

use std::collections::BTreeMap;

use super::*;
use crate::engine::schedule::{CatchUp, Overlap, Schedule, Spec};
use crate::engine::{RunId, Timestamp};
use crate::service::{ScheduleAction, ScheduleRejected};
use crate::store::records::StoredSchedule;

/// The create body. Every field defaults, so a missing one is refused naming it.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct CreateBody {
    name: String,
    cron: String,
    timezone: Option<String>,
    pipeline: String,
    params: BTreeMap<String, String>,
    catch_up: Option<String>,
    overlap: Option<String>,
}

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::field(StatusCode::BAD_REQUEST, field, message.into())
}

pub(super) async fn create(
    State(state): State<ApiState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body: CreateBody = optional_json(body)?;
    limits::check_admission_name(&body.name, limits::SCHEDULE_NAME_MAX_BYTES)
        .map_err(|message| bad("name", message))?;
    let timezone = body.timezone.unwrap_or_else(|| "UTC".to_string());
    if timezone.len() > limits::SCHEDULE_TIMEZONE_MAX_BYTES {
        return Err(bad(
            "timezone",
            format!("longer than {} bytes", limits::SCHEDULE_TIMEZONE_MAX_BYTES),
        ));
    }
    Spec::parse(&body.cron, &timezone).map_err(|error| bad(error.field, error.message))?;
    let catch_up = match body.catch_up.as_deref() {
        None => CatchUp::One,
        Some(name) => CatchUp::parse(name).ok_or_else(|| {
            bad(
                "catch_up",
                format!("{name:?}: one of {}", CatchUp::NAMES.join(", ")),
            )
        })?,
    };
    let overlap = match body.overlap.as_deref() {
        None => Overlap::Allow,
        Some(name) => Overlap::parse(name).ok_or_else(|| {
            bad(
                "overlap",
                format!("{name:?}: one of {}", Overlap::NAMES.join(", ")),
            )
        })?,
    };
    if body.params.len() > limits::PARAMS_MAX {
        return Err(bad(
            "params",
            format!("at most {} parameters", limits::PARAMS_MAX),
        ));
    }
    if body.pipeline.trim().is_empty() {
        return Err(bad("pipeline", "the pipeline document's text is required"));
    }
    let format = if body.pipeline.trim_start().starts_with('{') {
        Format::Json
    } else {
        Format::Yaml
    };
    let params: Vec<(String, String)> = body.params.into_iter().collect();
    let outcome = accept_pipeline(&state, &body.pipeline, format, &params)?;
    let stored = StoredSchedule {
        schedule: Schedule {
            name: body.name,
            cron: body.cron,
            timezone,
            catch_up,
            overlap,
            paused: false,
            created_at: Timestamp(0),
            next_fire: None,
            last_fire: None,
            last_run: None,
            runs_started: 0,
            fires_skipped: 0,
            last_skip: None,
        },
        pipeline_name: outcome.pipeline.name.clone(),
        source: PipelineSource {
            format: match format {
                Format::Yaml => SourceFormat::Yaml,
                Format::Json => SourceFormat::Json,
            },
            text: body.pipeline,
            params: Some(outcome.pipeline.params.clone()),
        },
    };
    let created = state.service.create_schedule(stored).await?;
    let answer = answer(&state, &created)?;
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

pub(super) async fn list(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let read = state.service.store.read()?;
    let mut schedules = Vec::new();
    for stored in read.schedules()? {
        let last = last_run_state(&read, stored.schedule.last_run)?;
        schedules.push(dto::Schedule::of(&stored, last));
    }
    Ok(Json(dto::ScheduleList { schedules }).into_response())
}

pub(super) async fn show(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let read = state.service.store.read()?;
    let stored = read.schedule(&name)?.ok_or_else(|| not_found(&name))?;
    let last = last_run_state(&read, stored.schedule.last_run)?;
    Ok(Json(dto::Schedule::of(&stored, last)).into_response())
}

pub(super) async fn pause(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    act(state, name, ScheduleAction::Pause).await
}

pub(super) async fn resume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    act(state, name, ScheduleAction::Resume).await
}

pub(super) async fn delete(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    act(state, name, ScheduleAction::Delete).await
}

async fn act(state: ApiState, name: String, action: ScheduleAction) -> Result<Response, ApiError> {
    if name.len() > limits::SCHEDULE_NAME_MAX_BYTES {
        return Err(not_found(&name));
    }
    match state.service.schedule_action(name, action).await? {
        Some(stored) => Ok(Json(answer(&state, &stored)?).into_response()),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

fn answer(state: &ApiState, stored: &StoredSchedule) -> Result<dto::Schedule, ApiError> {
    let read = state.service.store.read()?;
    let last = last_run_state(&read, stored.schedule.last_run)?;
    Ok(dto::Schedule::of(stored, last))
}

fn last_run_state(
    read: &crate::store::ReadTx,
    run: Option<RunId>,
) -> Result<Option<RunState>, ApiError> {
    Ok(match run {
        Some(run) => read.run_header(run)?.map(|header| header.state),
        None => None,
    })
}

fn not_found(name: &str) -> ApiError {
    ApiError::from(crate::service::ServiceError::Domain(
        ScheduleRejected::NotFound(name.to_string()),
    ))
}
