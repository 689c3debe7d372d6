//! Every error the API answers, made a response in one place: [`ApiError`] (a JSON body
//! `{"error": …, "field": …?, …}` with its status), built from a handler's own checks,
//! from the store's errors, and from each [`ServiceError`] through [`Refusal`], which
//! says how each domain refusal of the service shows over HTTP.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::engine::RejectedInput;
use crate::pipeline::FieldError;
use crate::service::{
    DecideRejected, DlqRejected, OutputRejected, RunRejected, ScheduleRejected, ServiceError,
    SubmitRejected,
};
use crate::store::StoreError;

/// A JSON error: `{"error": …, "field": …?, "errors": […]?}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: serde_json::Value,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: json!({"error": message.into()}),
        }
    }

    pub(super) fn invalid(errors: &[FieldError]) -> ApiError {
        let first = errors.first();
        let list: Vec<_> = errors
            .iter()
            .map(|e| json!({"field": e.field, "line": e.line, "message": e.message}))
            .collect();
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            body: json!({
                "error": first.map(ToString::to_string).unwrap_or_else(|| "invalid pipeline".into()),
                "field": first.map(|e| e.field.clone()),
                "errors": list,
            }),
        }
    }

    pub(super) fn field(status: StatusCode, field: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: json!({"error": message.into(), "field": field}),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        tracing::error!(%error, "store error serving a request");
        if error.is_disk_full() {
            return ApiError::new(StatusCode::INSUFFICIENT_STORAGE, error.to_string());
        }
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
    }
}

/// How a domain refusal of the service shows over HTTP.
pub trait Refusal: std::error::Error + 'static {
    fn status(&self) -> StatusCode;
    /// The request field the refusal is about.
    fn field(&self) -> Option<String> {
        None
    }
    /// More members of the JSON body, beside `error` and `field`.
    fn detail(&self) -> Option<(&'static str, serde_json::Value)> {
        None
    }
}

impl<E: Refusal> From<ServiceError<E>> for ApiError {
    fn from(error: ServiceError<E>) -> Self {
        match &error {
            ServiceError::Domain(refusal) => {
                let mut body = json!({"error": refusal.to_string()});
                if let Some(field) = refusal.field() {
                    body["field"] = json!(field);
                }
                if let Some((key, value)) = refusal.detail() {
                    body[key] = value;
                }
                ApiError {
                    status: refusal.status(),
                    body,
                }
            }
            ServiceError::Store(message) => {
                tracing::error!(error = %message, "store error serving a request");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
            }
            ServiceError::DiskFull(message) => {
                tracing::error!(error = %message, "the state dir's disk is full");
                ApiError::new(StatusCode::INSUFFICIENT_STORAGE, error.to_string())
            }
            ServiceError::ShuttingDown => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
            }
        }
    }
}

impl<E: Refusal> IntoResponse for ServiceError<E> {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

impl Refusal for SubmitRejected {
    fn status(&self) -> StatusCode {
        match self {
            SubmitRejected::IdempotencyConflict(_) => StatusCode::CONFLICT,
            SubmitRejected::Full { .. } => StatusCode::TOO_MANY_REQUESTS,
            SubmitRejected::DiskFull => StatusCode::INSUFFICIENT_STORAGE,
        }
    }
    fn field(&self) -> Option<String> {
        match self {
            SubmitRejected::IdempotencyConflict(_) => Some("Idempotency-Key".into()),
            SubmitRejected::Full { .. } | SubmitRejected::DiskFull => None,
        }
    }
}

impl Refusal for ScheduleRejected {
    fn status(&self) -> StatusCode {
        match self {
            ScheduleRejected::NotFound(_) => StatusCode::NOT_FOUND,
            ScheduleRejected::Exists(_) | ScheduleRejected::Full { .. } => StatusCode::CONFLICT,
            ScheduleRejected::Invalid(_) => StatusCode::BAD_REQUEST,
        }
    }
    fn field(&self) -> Option<String> {
        match self {
            ScheduleRejected::NotFound(_) => None,
            ScheduleRejected::Exists(_) | ScheduleRejected::Full { .. } => Some("name".into()),
            ScheduleRejected::Invalid(_) => Some("cron".into()),
        }
    }
}

impl Refusal for RunRejected {
    fn status(&self) -> StatusCode {
        match self {
            RunRejected::NotFound(_) | RunRejected::StepNotFound { .. } => StatusCode::NOT_FOUND,
            RunRejected::Rejected(_) => StatusCode::CONFLICT,
        }
    }
}

impl Refusal for DecideRejected {
    fn status(&self) -> StatusCode {
        match self {
            DecideRejected::RunNotFound(_) | DecideRejected::StepNotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            DecideRejected::Rejected(RejectedInput::NotAGate(_)) => StatusCode::BAD_REQUEST,
            DecideRejected::Rejected(_) => StatusCode::CONFLICT,
            DecideRejected::Unreadable { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
    fn field(&self) -> Option<String> {
        match self {
            DecideRejected::StepNotFound { .. }
            | DecideRejected::Rejected(RejectedInput::NotAGate(_)) => Some("step".into()),
            DecideRejected::RunNotFound(_)
            | DecideRejected::Rejected(_)
            | DecideRejected::Unreadable { .. } => None,
        }
    }
}

impl Refusal for DlqRejected {
    fn status(&self) -> StatusCode {
        match self {
            DlqRejected::NotFound(_) => StatusCode::NOT_FOUND,
            DlqRejected::Rejected(_) => StatusCode::CONFLICT,
        }
    }
}

impl Refusal for OutputRejected {
    fn status(&self) -> StatusCode {
        match self {
            OutputRejected::Rejected(RejectedInput::TooManyOutputs { .. }) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            OutputRejected::StaleFence { .. } | OutputRejected::Rejected(_) => StatusCode::CONFLICT,
        }
    }
    fn field(&self) -> Option<String> {
        match self {
            OutputRejected::Rejected(RejectedInput::TooManyOutputs { key, .. }) => {
                Some(key.clone())
            }
            OutputRejected::StaleFence { .. } | OutputRejected::Rejected(_) => None,
        }
    }
    /// A stale writer learns the current fence (none once the step has no attempt in
    /// flight).
    fn detail(&self) -> Option<(&'static str, serde_json::Value)> {
        match self {
            OutputRejected::StaleFence { current } => {
                Some(("current", json!(current.map(|fence| fence.0))))
            }
            OutputRejected::Rejected(_) => None,
        }
    }
}
