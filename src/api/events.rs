//! `GET /v1/events`: server-sent events of run and step changes (`service::events`).
//!
//! Each event is one history record as `GET /v1/runs/{id}/history` shows it, with its run:
//! `data: {"run", "seq", "at", "kind", "detail"}` and `id: BOOT-SEQ`. A client reconnecting
//! with `Last-Event-ID` gets every later event once; if that is no longer possible it gets
//! an `event: reset` first and must read the state again. `?run=ID` keeps one run's events.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, watch};

use super::{ApiError, ApiState, dto, parse_run_id, query_params};
use crate::engine::RunId;
use crate::limits;
use crate::service::events::{Events, Published, Resume};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    run: Option<String>,
}

pub(super) async fn stream(
    State(state): State<ApiState>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = query_params(query)?;
    let filter = match &query.run {
        Some(id) => {
            let run = parse_run_id(id).map_err(|_| {
                ApiError::field(
                    StatusCode::BAD_REQUEST,
                    "run",
                    format!("{id:?} is not a run id"),
                )
            })?;
            if state.service.store.read()?.run_header(run)?.is_none() {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("run {run} not found"),
                ));
            }
            Some(run)
        }
        None => None,
    };
    let last_event_id = match headers.get("last-event-id") {
        Some(value) => Some(value.to_str().map_err(|_| {
            ApiError::field(StatusCode::BAD_REQUEST, "Last-Event-ID", "not ASCII text")
        })?),
        None => None,
    };
    let events = state.service.events.clone();
    let resume = events
        .resume(last_event_id)
        .map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, "Last-Event-ID", e))?;
    let Some(permit) = events.admit_stream() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "too many event streams are open (at most {})",
                limits::EVENT_STREAMS_MAX
            ),
        ));
    };
    let changes = events.subscribe();
    let (position, reset) = match resume {
        Resume::After(seq) => (seq, None),
        Resume::Reset { reason, latest } => (latest, Some(reset_event(&events, latest, &reason))),
    };
    let stream = Client {
        events,
        changes,
        position,
        filter,
        ready: reset.into_iter().collect(),
        _permit: permit,
    };
    Ok(Sse::new(stream.into_stream())
        .keep_alive(KeepAlive::new().interval(limits::EVENTS_KEEPALIVE))
        .into_response())
}

fn reset_event(events: &Events, latest: u64, reason: &str) -> Event {
    Event::default()
        .event("reset")
        .id(events.id(latest))
        .retry(RECONNECT)
        .data(serde_json::json!({ "reason": reason }).to_string())
}

/// What a browser's `EventSource` waits before it reconnects.
const RECONNECT: Duration = Duration::from_secs(1);

/// One client's stream: its position in the published events and what is ready to send.
struct Client {
    events: Arc<Events>,
    changes: watch::Receiver<u64>,
    position: u64,
    filter: Option<RunId>,
    ready: std::collections::VecDeque<Event>,
    _permit: OwnedSemaphorePermit,
}

impl Client {
    fn into_stream(self) -> impl Stream<Item = Result<Event, std::convert::Infallible>> {
        futures::stream::unfold(self, |mut s| async move {
            loop {
                if let Some(event) = s.ready.pop_front() {
                    return Some((Ok(event), s));
                }
                if s.events.is_closed() {
                    return None;
                }
                match s.events.after(s.position, s.filter, limits::EVENTS_CHUNK) {
                    Ok((found, position)) => {
                        s.position = position;
                        s.ready
                            .extend(found.iter().map(|e| data_event(&s.events, e)));
                    }
                    Err(latest) => {
                        // Fell behind the buffer while sending: some events are gone.
                        s.position = latest;
                        let reason =
                            "this stream fell behind and events were dropped: read the state again";
                        s.ready.push_back(reset_event(&s.events, latest, reason));
                    }
                }
                if s.ready.is_empty() {
                    s.changes.mark_unchanged();
                    // Something may have been published between `after` and here.
                    if s.events.latest() > s.position && !s.events.is_closed() {
                        continue;
                    }
                    if s.changes.changed().await.is_err() {
                        return None;
                    }
                }
            }
        })
    }
}

fn data_event(events: &Events, published: &Published) -> Event {
    let body = dto::StreamEvent {
        run: published.run.to_string(),
        event: dto::HistoryEvent::of(published.history_seq, &published.record),
    };
    Event::default()
        .id(events.id(published.seq))
        .data(serde_json::to_string(&body).unwrap_or_default())
}
