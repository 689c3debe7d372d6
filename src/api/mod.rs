//! The HTTP API (`/v1`, JSON), health and readiness. Reads go straight to the store
//! (redb readers never block the writer); writes go through the service's driver.

pub mod auth;
mod drain;
pub mod dto;
mod errors;
mod events;
pub mod listen;
mod parsed;
mod schedules;

pub use errors::ApiError;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;

use crate::engine::{RunId, RunState};
use crate::limits;
use crate::pipeline::{self, Format};
use crate::service::{Service, driver_rebuild};
use crate::store::RunQuery;
use crate::store::records::{PipelineSource, SourceFormat};

#[derive(Clone)]
pub struct ApiState {
    pub service: Service,
    pub admin_token: Arc<String>,
    /// The listener speaks TLS (the dashboard's cookies are `Secure`).
    pub tls: bool,
    /// The pipeline documents parsed last.
    pub parsed: Arc<parsed::Parsed>,
}

pub fn router(state: ApiState) -> Router {
    let v1 = v1_routes().layer(middleware::from_fn_with_state(state.clone(), authenticate));
    let dashboard = crate::dashboard::router(
        Router::new()
            .nest("/v1", v1_routes())
            .with_state(state.clone()),
        state.clone(),
    );
    // Authenticated by the writing attempt's own step token, not the admin token.
    let outputs = Router::new().route("/v1/runs/{id}/steps/{step}/outputs", put(put_outputs));
    Router::new()
        .merge(outputs)
        .route(
            "/",
            get(|| async { axum::response::Redirect::to("/ui/runs") }),
        )
        .nest_service("/ui", dashboard)
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .nest("/v1", v1)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint") })
        // Spelled out: bodies above this are refused with 413 before they are read.
        .layer(DefaultBodyLimit::max(limits::API_BODY_MAX_BYTES))
        .layer(middleware::from_fn(request_deadline))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn(header_limit))
        .layer(middleware::from_fn(drain::drain_unread_body))
        .with_state(state)
}

/// The `/v1` routes, without authentication: `router` puts its layer around them; the
/// dashboard calls them in-process for a signed-in user it has checked the same way.
fn v1_routes() -> Router<ApiState> {
    Router::new()
        .route("/runs", post(submit).get(list_runs))
        .route("/runs/{id}", get(show_run))
        .route("/runs/{id}/history", get(history))
        .route("/runs/{id}/cancel", post(cancel))
        .route("/runs/{id}/requeue", post(release_run))
        .route("/runs/{id}/retry", post(retry_run))
        .route("/runs/{id}/discard", post(discard_run))
        .route("/runs/{id}/gates/{step}/approve", post(approve_gate))
        .route("/runs/{id}/gates/{step}/reject", post(reject_gate))
        .route("/runs/{id}/steps/{step}/logs", get(logs))
        .route("/events", get(events::stream))
        .route("/queue", get(queue))
        .route("/schedules", post(schedules::create).get(schedules::list))
        .route(
            "/schedules/{name}",
            get(schedules::show).delete(schedules::delete),
        )
        .route("/schedules/{name}/pause", post(schedules::pause))
        .route("/schedules/{name}/resume", post(schedules::resume))
        .route("/backup", post(backup))
        .route("/dlq", get(list_dead_letters))
        .route("/dlq/{id}", get(show_dead_letter))
        .route("/dlq/{id}/requeue", post(requeue_dead_letter))
        .route("/dlq/{id}/discard", post(discard_dead_letter))
}

/// Request headers over `limits::HTTP_HEADER_MAX_BYTES` are refused with a JSON 431
/// naming `headers`. The connection reads up to twice that (`listen`), so this answer,
/// not hyper's bare one, is what an oversized request gets unless it is larger still.
async fn header_limit(request: Request, next: Next) -> Response {
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + request.uri().to_string().len();
    if size > limits::HTTP_HEADER_MAX_BYTES {
        let message = format!(
            "request headers exceed {} bytes",
            limits::HTTP_HEADER_MAX_BYTES
        );
        return ApiError::field(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers",
            message,
        )
        .into_response();
    }
    next.run(request).await
}

/// Every refusal is JSON: what axum's extractors and the router answer on their own (a
/// path that does not decode, a method not allowed, a body of the wrong type) is wrapped
/// as `{"error": …}`, with `"field": "path"` for a path that cannot be parsed.
async fn json_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/html"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim().to_string();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let error = if message.starts_with("Invalid URL") {
        ApiError::field(status, "path", message)
    } else {
        ApiError::new(status, message)
    };
    // The router's own headers stay (a 405's `Allow`); the body is replaced.
    let mut wrapped = error.into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            wrapped.headers_mut().insert(name.clone(), value.clone());
        }
    }
    wrapped
}

/// Every request is answered within `HTTP_REQUEST_TIMEOUT` (503 past it), except the
/// backup, which copies the whole store before it answers.
async fn request_deadline(request: Request, next: Next) -> Response {
    if request.uri().path() == "/v1/backup" {
        return next.run(request).await;
    }
    match tokio::time::timeout(limits::HTTP_REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the request timed out").into_response()
        }
    }
}

async fn authenticate(State(state): State<ApiState>, mut request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let live = state.service.settings.live();
    let caller =
        presented.and_then(|token| auth::identify(token, &state.admin_token, &live.tokens));
    let Some(caller) = caller else {
        // Never log the presented token.
        tracing::warn!(path = %request.uri().path(), presented = presented.is_some(), "authentication failed");
        return ApiError::new(StatusCode::UNAUTHORIZED, "missing or invalid bearer token")
            .into_response();
    };
    let needed = auth::needed(request.method(), request.uri().path());
    if let Err(refused) = auth::permit(&caller, needed) {
        return refused.into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Prometheus scrapes this; like `/readyz` it needs no token (it names no run).
async fn metrics(State(state): State<ApiState>) -> Response {
    // Refreshes the unreadable-runs gauge (the check itself runs at most every few seconds).
    if state.service.is_ready()
        && let Err(error) = state.service.forward_progress().await
    {
        return ApiError::from(error).into_response();
    }
    match state.service.metrics_text() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => ApiError::from(error).into_response(),
    }
}

/// Readiness. Without a valid token it says only whether the service is ready: the
/// details (executor errors, runs, store errors) may name paths and runs.
async fn readyz(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let live = state.service.settings.live();
    let caller = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|token| auth::identify(token, &state.admin_token, &live.tokens));
    readiness(&state, caller.is_some()).await
}

/// `/readyz`'s answer: everything for a caller with a token (`known`), only whether the
/// service is ready for anyone else.
pub(crate) async fn readiness(state: &ApiState, known: bool) -> Response {
    if !state.service.is_ready() {
        return unready("re-adopting".into());
    }
    if state.service.metrics.disk_full.get() != 0 {
        return unready(
            "the state dir's disk is full: submissions are refused (507) until space returns; running steps are still recorded"
                .into(),
        );
    }
    let depth = match state.service.store.read().and_then(|r| r.outbox_depth()) {
        Ok(depth) => depth,
        Err(error) => {
            let reason = if known {
                error.to_string()
            } else {
                "the store cannot be read".into()
            };
            return unready(reason);
        }
    };
    if !known {
        return Json(dto::Readiness {
            ready: true,
            reason: None,
            outbox_depth: None,
            executors: None,
            progress: None,
            step_isolation: None,
        })
        .into_response();
    }
    // An unavailable executor does not make the service unready (other steps still
    // run), but it is shown: its launches are waiting in the outbox.
    let executors = state
        .service
        .executor_availability()
        .into_iter()
        .map(|(name, error)| {
            let availability = dto::ExecutorAvailability {
                available: error.is_none(),
                last_error: error,
            };
            (name.to_string(), availability)
        })
        .collect();
    let progress = match state.service.forward_progress().await {
        Ok(report) => dto::ProgressDto::of(&report),
        Err(error) => dto::ProgressDto::Failed {
            error: error.to_string(),
        },
    };
    Json(dto::Readiness {
        ready: true,
        reason: None,
        outbox_depth: Some(depth),
        executors: Some(executors),
        progress: Some(progress),
        step_isolation: Some(state.service.step_isolation.name()),
    })
    .into_response()
}

fn unready(reason: String) -> Response {
    let body = dto::Readiness {
        ready: false,
        reason: Some(reason),
        outbox_depth: None,
        executors: None,
        progress: None,
        step_isolation: None,
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// The one rule for the audit field `by` of every operator action (cancel, gate
/// decisions, release, discard, dead-letter requeue and discard): the authenticated
/// caller, annotated with the name the person gave, if any (`admin (alice)`). A body
/// cannot make an action look like someone else's.
fn audit_by(caller: &auth::Caller, given: Option<&str>) -> Result<String, ApiError> {
    let Some(given) = given.map(str::trim) else {
        return Ok(caller.name.clone());
    };
    let bad = |message: String| ApiError::field(StatusCode::BAD_REQUEST, "by", message);
    if given.is_empty() {
        return Err(bad("must not be empty".into()));
    }
    if !crate::text::fits(given, limits::ORIGIN_MAX_BYTES) {
        return Err(bad(format!(
            "must be at most {} bytes, counting every character as wide as the widest",
            limits::ORIGIN_MAX_BYTES
        )));
    }
    crate::text::check(given, false).map_err(bad)?;
    Ok(format!("{} ({given})", caller.name))
}

fn body_format(headers: &HeaderMap, body: &[u8]) -> Format {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.contains("json") {
        Format::Json
    } else if content_type.contains("yaml") {
        Format::Yaml
    } else if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        Format::Json
    } else {
        Format::Yaml
    }
}

/// A submitted pipeline document with its parameter values, validated and checked
/// against what this service can run: a value that does not fit its parameter is a 400
/// naming `params.NAME` (the request's fault, not the document's), anything else a 422
/// listing every error.
fn accept_pipeline(
    state: &ApiState,
    text: &str,
    format: Format,
    params: &[(String, String)],
) -> Result<parsed::Accepted, ApiError> {
    let accepted = state.parsed.parse(text, format, params).map_err(|errors| {
        match errors
            .iter()
            .find(|e| e.line.is_none() && e.field.starts_with("params."))
        {
            Some(error) => {
                ApiError::field(StatusCode::BAD_REQUEST, &error.field, error.message.clone())
            }
            None => ApiError::invalid(&errors),
        }
    })?;
    let refused = state.service.settings.check_pipeline(&accepted.pipeline);
    if !refused.is_empty() {
        return Err(ApiError::invalid(&refused));
    }
    Ok(accepted)
}

/// The run's parameter values: each `param=NAME=VALUE` of the query, in order. A `param`
/// without `=` is a 400 naming `param`; the values are checked against the pipeline's
/// declarations when it is parsed.
fn submit_params(pairs: Vec<(String, String)>) -> Result<Vec<(String, String)>, ApiError> {
    let mut params = Vec::new();
    for (key, value) in pairs.into_iter().filter(|(key, _)| key == "param") {
        let Some((name, value)) = value.split_once('=') else {
            return Err(ApiError::field(
                StatusCode::BAD_REQUEST,
                "param",
                format!("{value:?}: expected NAME=VALUE"),
            ));
        };
        if params.len() >= limits::PARAMS_MAX {
            return Err(ApiError::field(
                StatusCode::BAD_REQUEST,
                "param",
                format!("at most {} parameters", limits::PARAMS_MAX),
            ));
        }
        let _ = key;
        params.push((name.to_string(), value.to_string()));
    }
    Ok(params)
}

/// What a submitter may set for one run over its pipeline's values.
#[derive(Deserialize)]
struct SubmitQuery {
    priority: Option<i32>,
    parallelism: Option<u32>,
    concurrency_group: Option<String>,
    concurrency_limit: Option<u32>,
    supersede: Option<bool>,
}

impl SubmitQuery {
    /// The run's admission: the pipeline's, with what the query overrides. Errors name
    /// the query parameter.
    fn admission(
        &self,
        pipeline: &pipeline::Pipeline,
    ) -> Result<crate::engine::RunAdmission, ApiError> {
        let bad =
            |field: &str, message: String| ApiError::field(StatusCode::BAD_REQUEST, field, message);
        let mut admission = crate::engine::RunAdmission::of(pipeline);
        if let Some(priority) = self.priority {
            if !(limits::PRIORITY_MIN..=limits::PRIORITY_MAX).contains(&priority) {
                return Err(bad(
                    "priority",
                    format!(
                        "must be {}..={}",
                        limits::PRIORITY_MIN,
                        limits::PRIORITY_MAX
                    ),
                ));
            }
            admission.priority = priority;
        }
        if let Some(parallelism) = self.parallelism {
            if parallelism == 0 || parallelism as usize > limits::STEPS_MAX {
                return Err(bad(
                    "parallelism",
                    format!("must be 1..={}", limits::STEPS_MAX),
                ));
            }
            admission.parallelism = Some(parallelism);
        }
        if let Some(group) = &self.concurrency_group {
            limits::check_admission_name(group, limits::GROUP_NAME_MAX_BYTES)
                .map_err(|problem| bad("concurrency_group", problem))?;
            admission.group = Some(pipeline::Concurrency {
                group: group.clone(),
                limit: 1,
                supersede: false,
            });
        }
        let Some(group) = admission.group.as_mut() else {
            if self.concurrency_limit.is_some() || self.supersede.is_some() {
                let field = if self.concurrency_limit.is_some() {
                    "concurrency_limit"
                } else {
                    "supersede"
                };
                // Each parameter is valid alone; together with this pipeline they are
                // not: a 422, like the pipeline's own cross-field rules.
                return Err(ApiError::invalid(&[pipeline::FieldError {
                    field: field.to_string(),
                    line: None,
                    message: "needs concurrency_group: the pipeline has no concurrency group"
                        .into(),
                }]));
            }
            return Ok(admission);
        };
        if let Some(limit) = self.concurrency_limit {
            if !(1..=limits::GROUP_LIMIT_MAX).contains(&limit) {
                return Err(bad(
                    "concurrency_limit",
                    format!("must be 1..={}", limits::GROUP_LIMIT_MAX),
                ));
            }
            group.limit = limit;
        }
        if let Some(supersede) = self.supersede {
            group.supersede = supersede;
        }
        Ok(admission)
    }
}

async fn submit(
    State(state): State<ApiState>,
    headers: HeaderMap,
    query: Result<Query<SubmitQuery>, QueryRejection>,
    pairs: Result<Query<Vec<(String, String)>>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let query = query_params(query)?;
    let params = submit_params(query_params(pairs)?)?;
    let body = body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("request body exceeds {} bytes", limits::API_BODY_MAX_BYTES)
        } else {
            rejection.body_text()
        };
        ApiError::new(status, message)
    })?;
    let idempotency_key = idempotency_key(&headers)?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "body is not UTF-8"))?;
    let format = body_format(&headers, &body);
    let outcome = accept_pipeline(&state, text, format, &params)?;
    let admission = query.admission(&outcome.pipeline)?;
    let source = PipelineSource {
        format: match format {
            Format::Yaml => SourceFormat::Yaml,
            Format::Json => SourceFormat::Json,
        },
        text: text.to_string(),
        params: Some(outcome.pipeline.params.clone()),
    };
    let origin = origin(&headers)?;
    let submitted = state
        .service
        .submit(source, outcome.pipeline, origin, admission, idempotency_key)
        .await?;
    let body = dto::SubmitAnswer {
        id: submitted.id.to_string(),
        warnings: outcome.warnings.to_vec(),
        existing: submitted.existing,
    };
    // A replay answers 200 with the run the key first created; a new run is 201.
    let status = if submitted.existing {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(body)).into_response())
}

/// The run's origin: `X-Scarab-Origin` names the producing system; without it, `local`.
/// Runs of any other origin are never auto-retried (their producer owns them).
fn origin(headers: &HeaderMap) -> Result<String, ApiError> {
    let Some(value) = headers.get("x-scarab-origin") else {
        return Ok(crate::engine::run_failure::LOCAL_ORIGIN.to_string());
    };
    let bad = |message: &str| ApiError::field(StatusCode::BAD_REQUEST, "X-Scarab-Origin", message);
    let text = value
        .to_str()
        .map_err(|_| bad("must be visible ASCII"))?
        .trim();
    if text.is_empty() || text.len() > limits::ORIGIN_MAX_BYTES {
        return Err(bad(&format!(
            "must be 1 to {} bytes",
            limits::ORIGIN_MAX_BYTES
        )));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("must be visible ASCII without spaces"));
    }
    Ok(text.to_string())
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().map_err(|_| {
        ApiError::field(
            StatusCode::BAD_REQUEST,
            "Idempotency-Key",
            "must be visible ASCII",
        )
    })?;
    if key.is_empty() || key.len() > limits::IDEMPOTENCY_KEY_MAX_BYTES {
        let message = format!("must be 1..={} bytes", limits::IDEMPOTENCY_KEY_MAX_BYTES);
        return Err(ApiError::field(
            StatusCode::BAD_REQUEST,
            "Idempotency-Key",
            message,
        ));
    }
    Ok(Some(key.to_string()))
}

/// Query strings that do not parse are a JSON 400 like every other error.
fn query_params<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query.map(|Query(params)| params).map_err(|rejection| {
        ApiError::field(StatusCode::BAD_REQUEST, "query", rejection.body_text())
    })
}

/// A page size: the default when absent, else 1..=max (a 400 naming `limit`).
fn page_limit(limit: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    match limit.unwrap_or(default) {
        limit @ 1.. if limit <= max => Ok(limit),
        _ => Err(ApiError::field(
            StatusCode::BAD_REQUEST,
            "limit",
            format!("must be 1..={max}"),
        )),
    }
}

fn parse_run_id(id: &str) -> Result<RunId, ApiError> {
    id.parse()
        .map_err(|e: String| ApiError::field(StatusCode::BAD_REQUEST, "id", e))
}

#[derive(Deserialize)]
struct ListQuery {
    state: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn list_runs(
    State(state): State<ApiState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = query_params(query)?;
    let run_state = match &query.state {
        Some(name) => Some(RunState::parse(name).ok_or_else(|| {
            let known: Vec<_> = RunState::ALL.iter().map(|s| s.as_str()).collect();
            ApiError::field(
                StatusCode::BAD_REQUEST,
                "state",
                format!("unknown state {name:?}; one of {}", known.join(", ")),
            )
        })?),
        None => None,
    };
    let limit = page_limit(query.limit, limits::API_PAGE_DEFAULT, limits::API_PAGE_MAX)?;
    let after = query.cursor.as_deref().map(parse_cursor).transpose()?;
    let read = state.service.store.read()?;
    let headers = read.list_runs(&RunQuery {
        state: run_state,
        after,
        limit,
    })?;
    let next_cursor = (headers.len() == limit)
        .then(|| {
            headers
                .last()
                .map(|h| format!("{}.{}", h.updated_at.0, h.id))
        })
        .flatten();
    let mut runs = Vec::with_capacity(headers.len());
    for header in headers {
        let classification = if matches!(
            header.state,
            RunState::Failed | RunState::DeadLettered | RunState::Cancelled | RunState::Quarantined
        ) {
            read.run(header.id)?
                .and_then(|stored| driver_rebuild(stored).ok())
                .and_then(|run| crate::engine::classify_run(&run))
        } else {
            None
        };
        runs.push(dto::run_summary(
            &header,
            classification,
            state.service.settings.live().auto_retry.max,
        ));
    }
    Ok(Json(dto::RunPage { runs, next_cursor }).into_response())
}

fn parse_cursor(cursor: &str) -> Result<(u64, RunId), ApiError> {
    let bad = || {
        ApiError::field(
            StatusCode::BAD_REQUEST,
            "cursor",
            "not a cursor this server issued",
        )
    };
    let (updated, run) = cursor.split_once('.').ok_or_else(bad)?;
    // Only the spelling this server issues: decimal digits (no sign), as many as a u64
    // of milliseconds takes for the next three hundred million years.
    if updated.is_empty() || updated.len() > 19 || !updated.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    Ok((
        updated.parse().map_err(|_| bad())?,
        run.parse().map_err(|_| bad())?,
    ))
}

async fn load_run(state: &ApiState, id: &str) -> Result<crate::engine::Run, ApiError> {
    let id = parse_run_id(id)?;
    let stored = state
        .service
        .store
        .read()?
        .run(id)?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("run {id} not found")))?;
    driver_rebuild(stored).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("stored run {id}: {e}"),
        )
    })
}

async fn show_run(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let run = load_run(&state, &id).await?;
    // Only a run with queued steps asks the driver what they wait for.
    let queued = run
        .steps
        .iter()
        .any(|s| matches!(s.state, crate::engine::StepState::Queued { .. }));
    let waits = if queued {
        state
            .service
            .queue(Some(run.id()))
            .await
            .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down"))?
            .waits
            .into_iter()
            .map(|(wait, _)| wait)
            .collect()
    } else {
        Vec::new()
    };
    Ok(Json(dto::run_detail(
        &run,
        state.service.settings.live().auto_retry.max,
        &waits,
    ))
    .into_response())
}

#[derive(Deserialize)]
struct QueueQuery {
    limit: Option<usize>,
}

/// Admission control: pools, locks and what waits on what, in admission order.
async fn queue(
    State(state): State<ApiState>,
    query: Result<Query<QueueQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = query_params(query)?;
    let limit = page_limit(query.limit, limits::API_PAGE_MAX, limits::QUEUE_LIST_MAX)?;
    let view = state
        .service
        .queue(None)
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down"))?;
    let queued = view
        .waits
        .iter()
        .take(limit)
        .map(|(wait, step)| dto::QueuedDto {
            run: wait.run.to_string(),
            step: step.clone(),
            wait: dto::WaitDto::from(wait),
        })
        .collect();
    Ok(Json(dto::QueueDto {
        pools: view
            .pools
            .iter()
            .map(|(name, used, limit)| dto::PoolDto {
                name,
                used: *used,
                limit: *limit,
            })
            .collect(),
        locks: view
            .locks
            .iter()
            .map(|(name, held, limit)| dto::LockDto {
                name: name.clone(),
                held: *held,
                limit: *limit,
            })
            .collect(),
        waiting: view.waiting.iter().copied().collect(),
        queued,
    })
    .into_response())
}

#[derive(Deserialize)]
struct HistoryQuery {
    after: Option<u32>,
    limit: Option<usize>,
}

async fn history(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = query_params(query)?;
    let run = parse_run_id(&id)?;
    let limit = page_limit(
        query.limit,
        limits::HISTORY_PAGE_MAX,
        limits::HISTORY_PAGE_MAX,
    )?;
    let read = state.service.store.read()?;
    if read.run_header(run)?.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("run {run} not found"),
        ));
    }
    let events = read.history(run, query.after, limit)?;
    let next = (events.len() == limit)
        .then(|| events.last().map(|(seq, _)| *seq))
        .flatten();
    let events = events
        .iter()
        .map(|(seq, record)| dto::HistoryEvent::of(*seq, record))
        .collect();
    Ok(Json(dto::HistoryPage {
        events,
        next_after: next,
    })
    .into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    by: Option<String>,
}

async fn cancel(
    State(state): State<ApiState>,
    Extension(caller): Extension<auth::Caller>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let run = parse_run_id(&id)?;
    let body: CancelBody = optional_json(body)?;
    let by = audit_by(&caller, body.by.as_deref())?;
    state.service.cancel(run, by).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(dto::CancelAnswer {
            id: run.to_string(),
            cancel: "requested",
        }),
    )
        .into_response())
}

/// A consistent snapshot of the whole store, streamed. The service writes it into the state
/// dir from one read transaction (writers go on), unlinks it and streams the open file;
/// `X-Scarab-Backup-Counts` carries its row counts for the client's verification.
async fn backup(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let path = state
        .service
        .state_dir
        .root
        .join(format!(".backup-{}.redb", ulid::Ulid::new()));
    let store = state.service.store.clone();
    let target = path.clone();
    let counts = tokio::task::spawn_blocking(move || store.backup_to(&target))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let io_error =
        |e: std::io::Error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let file = tokio::fs::File::open(&path).await.map_err(io_error)?;
    let length = file.metadata().await.map_err(io_error)?.len();
    // The open file stays readable; nothing is left behind if the client goes away.
    tokio::fs::remove_file(&path).await.map_err(io_error)?;
    let counts = dto::backup_counts(&counts);
    tracing::info!(bytes = length, rows = %counts, "backup taken");
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, length.to_string()),
            (
                header::HeaderName::from_static(dto::BACKUP_COUNTS_HEADER),
                counts,
            ),
        ],
        body,
    )
        .into_response())
}

/// Release a quarantined run for a fresh try.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    /// Re-run this step and everything downstream of it, even if they succeeded.
    from: Option<String>,
    by: Option<String>,
}

/// Re-run a finished run: its unsucceeded steps (and with `from`, that step and what
/// follows it) start a fresh try in one transaction.
async fn retry_run(
    State(state): State<ApiState>,
    Extension(caller): Extension<auth::Caller>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let run = parse_run_id(&id)?;
    let body: RetryBody = optional_json(body)?;
    let by = audit_by(&caller, body.by.as_deref())?;
    let steps = state.service.retry(run, body.from, by).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(dto::RetryAnswer {
            id: run.to_string(),
            steps,
        }),
    )
        .into_response())
}

async fn release_run(
    State(state): State<ApiState>,
    Extension(caller): Extension<auth::Caller>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let run = parse_run_id(&id)?;
    let action = dlq_action(body)?;
    let by = audit_by(&caller, action.by.as_deref())?;
    state.service.release(run, by).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(dto::RequeueAnswer {
            id: run.to_string(),
            requeued: true,
        }),
    )
        .into_response())
}

/// Discard a quarantined run: it stays dead-lettered and is never auto-retried again.
async fn discard_run(
    State(state): State<ApiState>,
    Extension(caller): Extension<auth::Caller>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let run = parse_run_id(&id)?;
    let action = dlq_action(body)?;
    let reason = action.required_reason()?;
    let by = audit_by(&caller, action.by.as_deref())?;
    state.service.discard_run(run, by, reason).await?;
    Ok((
        StatusCode::OK,
        Json(dto::DiscardAnswer {
            id: run.to_string(),
            discarded: true,
        }),
    )
        .into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DecideBody {
    by: Option<String>,
    comment: Option<String>,
}

async fn approve_gate(
    state: State<ApiState>,
    caller: Extension<auth::Caller>,
    path: Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    decide_gate(state, caller, path, body, true).await
}

async fn reject_gate(
    state: State<ApiState>,
    caller: Extension<auth::Caller>,
    path: Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    decide_gate(state, caller, path, body, false).await
}

/// Approve or reject (the `authenticate` layer checked the approve permission): the
/// caller's identity is recorded with the name the person gave (`by`, default: the
/// caller's).
async fn decide_gate(
    State(state): State<ApiState>,
    Extension(caller): Extension<auth::Caller>,
    Path((id, step)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
    approve: bool,
) -> Result<Response, ApiError> {
    let run = parse_run_id(&id)?;
    let body = body.map_err(|r| ApiError::new(r.status(), r.body_text()))?;
    let body: DecideBody = if body.iter().all(u8::is_ascii_whitespace) {
        DecideBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::field(
                StatusCode::BAD_REQUEST,
                "body",
                format!("invalid JSON: {e}"),
            )
        })?
    };
    let by = audit_by(&caller, body.by.as_deref())?;
    if let Some(comment) = &body.comment {
        crate::text::check(comment, true)
            .map_err(|problem| ApiError::field(StatusCode::BAD_REQUEST, "comment", problem))?;
    }
    if let Some(comment) = &body.comment
        && !crate::text::fits(comment, limits::GATE_COMMENT_MAX_BYTES)
    {
        return Err(ApiError::field(
            StatusCode::BAD_REQUEST,
            "comment",
            format!(
                "must be at most {} bytes, counting every character as wide as the widest",
                limits::GATE_COMMENT_MAX_BYTES
            ),
        ));
    }
    let decided = state
        .service
        .decide(
            run,
            step.clone(),
            approve,
            by,
            caller.name.clone(),
            body.comment,
        )
        .await?;
    tracing::info!(%run, step, decision = decided.outcome.as_str(), by = %decided.by, caller = %decided.caller, "gate decided");
    Ok(Json(dto::DecisionAnswer {
        run: run.to_string(),
        step,
        decision: dto::gate_decision(&decided),
    })
    .into_response())
}

#[derive(Deserialize)]
struct LogQuery {
    stream: Option<String>,
    attempt: Option<u32>,
    offset: Option<u64>,
    limit: Option<u64>,
}

async fn logs(
    State(state): State<ApiState>,
    Path((id, step)): Path<(String, String)>,
    query: Result<Query<LogQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = query_params(query)?;
    let run = load_run(&state, &id).await?;
    let index = run.pipeline.step_index(&step).ok_or_else(|| {
        ApiError::field(
            StatusCode::NOT_FOUND,
            "step",
            format!("run has no step {step:?}"),
        )
    })?;
    let attempts = &run.steps[index].attempts;
    let attempt = match query.attempt {
        Some(n) => attempts.iter().find(|a| a.number == n),
        None => attempts.last(),
    }
    .ok_or_else(|| ApiError::field(StatusCode::NOT_FOUND, "attempt", "no such attempt"))?;
    let file = match query.stream.as_deref().unwrap_or("stdout") {
        "stdout" => crate::executor::local::files::STDOUT,
        "stderr" => crate::executor::local::files::STDERR,
        other => {
            return Err(ApiError::field(
                StatusCode::BAD_REQUEST,
                "stream",
                format!("{other:?} is not stdout or stderr"),
            ));
        }
    };
    let limit = query
        .limit
        .unwrap_or(limits::LOG_CHUNK_MAX_BYTES)
        .min(limits::LOG_CHUNK_MAX_BYTES);
    let offset = query.offset.unwrap_or(0);
    let dir = crate::executor::local::files::attempt_dir(
        &state.service.state_dir.attempts(),
        attempt.fence,
    );
    if !attempt.is_in_flight() && !dir.exists() {
        let message = "the attempt's logs were removed after the log retention period";
        return Err(ApiError::new(StatusCode::GONE, message));
    }
    let path = dir.join(file);
    let live_pod = match (&run.pipeline.steps[index].action, &state.service.pod_logs) {
        (crate::pipeline::StepAction::Kubernetes(_), Some(pods)) if attempt.is_in_flight() => {
            Some((
                pods,
                crate::executor::kubernetes::pod::pod_name(run.id(), index, attempt.fence),
            ))
        }
        _ => None,
    };
    let chunk = match live_pod {
        Some((pods, name)) => pod_log_chunk(pods, &name, offset, limit).await,
        None => read_chunk(&path, offset, limit).await,
    };
    let (bytes, size) = chunk.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading log: {e}"),
        )
    })?;
    let next = offset + bytes.len() as u64;
    let finished = !attempt.is_in_flight();
    Ok((
        [
            (
                header::CONTENT_TYPE,
                "text/plain; charset=utf-8".to_string(),
            ),
            (
                header::HeaderName::from_static("x-scarab-log-size"),
                size.to_string(),
            ),
            (
                header::HeaderName::from_static("x-scarab-next-offset"),
                next.to_string(),
            ),
            (
                header::HeaderName::from_static("x-scarab-attempt-finished"),
                finished.to_string(),
            ),
        ],
        bytes,
    )
        .into_response())
}

async fn read_chunk(
    path: &std::path::Path,
    offset: u64,
    limit: u64,
) -> std::io::Result<(Vec<u8>, u64)> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut file = match tokio::fs::File::open(path).await {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let size = file.metadata().await?.len();
    file.seek(std::io::SeekFrom::Start(offset.min(size)))
        .await?;
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes).await?;
    Ok((bytes, size))
}

/// A running Pod's log, read live from the Kubernetes API (a Pod has one stream: its
/// container's stdout and stderr together).
async fn pod_log_chunk(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    offset: u64,
    limit: u64,
) -> std::io::Result<(Vec<u8>, u64)> {
    let params = kube::api::LogParams {
        container: Some(crate::executor::kubernetes::pod::CONTAINER.to_string()),
        limit_bytes: i64::try_from(offset.saturating_add(limit)).ok(),
        ..kube::api::LogParams::default()
    };
    let text = match pods.logs(name, &params).await {
        Ok(text) => text,
        // Not started yet, or gone a moment ago: nothing to show (yet).
        Err(kube::Error::Api(status)) if matches!(status.code, 400 | 404) => String::new(),
        Err(error) => return Err(std::io::Error::other(error.to_string())),
    };
    let bytes = text.into_bytes();
    let size = bytes.len() as u64;
    let start = usize::try_from(offset.min(size)).unwrap_or(usize::MAX);
    let end = usize::try_from(offset.saturating_add(limit).min(size)).unwrap_or(usize::MAX);
    Ok((bytes[start..end].to_vec(), size))
}

// --- The dead-letter queue ---------------------------------------------------------------

#[derive(Deserialize)]
struct DlqQuery {
    after: Option<u64>,
    limit: Option<usize>,
}

async fn list_dead_letters(
    State(state): State<ApiState>,
    query: Result<Query<DlqQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = query_params(query)?;
    let limit = page_limit(query.limit, limits::API_PAGE_DEFAULT, limits::API_PAGE_MAX)?;
    let letters = state
        .service
        .store
        .read()?
        .dead_letters(query.after, limit)?;
    let next = (letters.len() == limit)
        .then(|| letters.last().map(|l| l.message.id))
        .flatten();
    let letters: Vec<_> = letters.iter().map(dto::dead_letter).collect();
    Ok(Json(dto::DeadLetterPage {
        dead_letters: letters,
        next_after: next,
    })
    .into_response())
}

fn parse_letter_id(id: &str) -> Result<u64, ApiError> {
    id.parse().map_err(|_| {
        ApiError::field(
            StatusCode::BAD_REQUEST,
            "id",
            "a dead letter id is a number",
        )
    })
}

async fn show_dead_letter(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_letter_id(&id)?;
    let letter = state
        .service
        .store
        .read()?
        .dead_letter(id)?
        .ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, format!("dead letter {id} not found"))
        })?;
    Ok(Json(dto::dead_letter(&letter)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DlqAction {
    by: Option<String>,
    reason: Option<String>,
}

impl DlqAction {
    /// Discarding needs a reason; it is kept (clipped) with who discarded.
    fn required_reason(&self) -> Result<String, ApiError> {
        let reason = self
            .reason
            .as_deref()
            .filter(|r| !r.trim().is_empty())
            .ok_or_else(|| {
                ApiError::field(
                    StatusCode::BAD_REQUEST,
                    "reason",
                    "discarding needs a reason",
                )
            })?;
        crate::text::check(reason, true)
            .map_err(|problem| ApiError::field(StatusCode::BAD_REQUEST, "reason", problem))?;
        Ok(limits::clip(reason, limits::REASON_MAX_BYTES))
    }
}

fn dlq_action(body: Result<Bytes, BytesRejection>) -> Result<DlqAction, ApiError> {
    optional_json(body)
}

/// An operator action's body: JSON, or empty (or blank) for all defaults.
fn optional_json<T: serde::de::DeserializeOwned + Default>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|r| ApiError::new(r.status(), r.body_text()))?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    // An object, not the array form serde would also take for a struct.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::field(
            StatusCode::BAD_REQUEST,
            "body",
            "must be a JSON object",
        ));
    }
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::field(
            StatusCode::BAD_REQUEST,
            "body",
            format!("invalid JSON: {e}"),
        )
    })
}

async fn requeue_dead_letter(
    State(state): State<ApiState>,
    Extension(caller): Extension<auth::Caller>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = parse_letter_id(&id)?;
    let action = dlq_action(body)?;
    let by = audit_by(&caller, action.by.as_deref())?;
    state.service.requeue(id, by).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(dto::RequeueAnswer { id, requeued: true }),
    )
        .into_response())
}

async fn discard_dead_letter(
    State(state): State<ApiState>,
    Extension(caller): Extension<auth::Caller>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = parse_letter_id(&id)?;
    let action = dlq_action(body)?;
    let reason = action.required_reason()?;
    let by = audit_by(&caller, action.by.as_deref())?;
    state.service.discard(id, by, reason).await?;
    Ok((
        StatusCode::OK,
        Json(dto::DiscardAnswer {
            id,
            discarded: true,
        }),
    )
        .into_response())
}

// --- The fenced step-output sink --------------------------------------------------------

/// Outputs a step may store: keys and values, bounded.
const OUTPUT_KEYS_MAX: usize = 32;
const OUTPUT_KEY_MAX_BYTES: usize = 64;
const OUTPUT_VALUE_MAX_BYTES: usize = 4096;
const OUTPUT_BODY_MAX_BYTES: usize = 16 * 1024;

async fn put_outputs(
    State(state): State<ApiState>,
    Path((id, step)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let unauthorized = || ApiError::new(StatusCode::UNAUTHORIZED, "missing or invalid step token");
    // Authenticated before anything is looked up or read: the token names its run, its
    // step's index and its fence, and is checked against the path's run alone.
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(unauthorized)?;
    let tokens = state
        .service
        .settings
        .step_tokens
        .as_ref()
        .ok_or_else(unauthorized)?;
    let run: RunId = id.parse().map_err(|_| unauthorized())?;
    let Some((index, fence)) = (0..limits::STEPS_MAX)
        .find_map(|index| tokens.verify(run, index, token).map(|fence| (index, fence)))
    else {
        tracing::warn!(%run, step, "output write with an invalid step token");
        return Err(unauthorized());
    };
    // The token is genuine: now the step it names must be the path's.
    let stored = state.service.store.read()?.run(run)?;
    let loaded = stored
        .map(crate::service::driver_rebuild)
        .transpose()
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("stored run {run}: {e}"),
            )
        })?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("run {run} not found")))?;
    if loaded.pipeline.step_index(&step) != Some(index) {
        tracing::warn!(%run, step, "output write with another step's token");
        return Err(unauthorized());
    }
    let body = axum::body::to_bytes(body, OUTPUT_BODY_MAX_BYTES)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("outputs exceed {OUTPUT_BODY_MAX_BYTES} bytes"),
            )
        })?;
    // A secret's value never reaches the store, even when a step reports it back.
    let secrets = state.service.settings.live().secrets.clone();
    let outputs = parse_outputs(&body)?
        .into_iter()
        .map(|(key, value)| (key, secrets.mask(&value)))
        .collect();
    state
        .service
        .set_outputs(run, index, fence, outputs)
        .await?;
    Ok(Json(dto::OutputsAnswer {
        stored: true,
        fence: fence.0,
    })
    .into_response())
}

fn parse_outputs(body: &[u8]) -> Result<Vec<(String, String)>, ApiError> {
    if body.len() > OUTPUT_BODY_MAX_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("outputs exceed {OUTPUT_BODY_MAX_BYTES} bytes"),
        ));
    }
    let bad =
        |field: &str, message: String| ApiError::field(StatusCode::BAD_REQUEST, field, message);
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body)
        .map_err(|e| bad("body", format!("must be a JSON object of strings: {e}")))?;
    if map.len() > OUTPUT_KEYS_MAX {
        return Err(bad("body", format!("at most {OUTPUT_KEYS_MAX} outputs")));
    }
    let mut outputs = Vec::with_capacity(map.len());
    for (key, value) in map {
        let key_ok = !key.is_empty()
            && key.len() <= OUTPUT_KEY_MAX_BYTES
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !key_ok {
            return Err(bad(
                &key,
                format!("output names are 1..={OUTPUT_KEY_MAX_BYTES} characters of [A-Za-z0-9_.-]"),
            ));
        }
        let Some(text) = value.as_str().filter(|t| t.len() <= OUTPUT_VALUE_MAX_BYTES) else {
            return Err(bad(
                &key,
                format!("must be a string of at most {OUTPUT_VALUE_MAX_BYTES} bytes"),
            ));
        };
        // A later step gets it in its environment, which cannot hold a NUL byte.
        if text.contains('\0') {
            return Err(bad(&key, "must not contain a NUL byte".into()));
        }
        outputs.push((key, text.to_string()));
    }
    Ok(outputs)
}
