//! `metav1.Status` failure bodies, shaped and worded as the apiserver writes them.
//!
//! Constructors follow staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go
//! (NewNotFound, NewAlreadyExists, NewForbidden, NewConflict, NewResourceExpired,
//! NewInvalid, NewBadRequest, NewMethodNotSupported); field order follows the Go
//! struct so the JSON reads like the real thing:
//! `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":...,"reason":...,"details":...,"code":...}`.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusBody {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub metadata: EmptyMeta,
    pub status: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
    pub code: u16,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct EmptyMeta {}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Details {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
}

/// `metav1.StatusCause`: JSON keys `reason`, `message`, `field`.
#[derive(Debug, Clone, Serialize)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

impl StatusBody {
    fn failure(code: u16, reason: &str, message: String, details: Option<Details>) -> StatusBody {
        StatusBody {
            kind: "Status",
            api_version: "v1",
            metadata: EmptyMeta {},
            status: "Failure",
            message,
            reason: reason.to_string(),
            details,
            code,
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

fn resource_details(kind: &str, name: &str) -> Option<Details> {
    Some(Details {
        name: name.to_string(),
        kind: kind.to_string(),
        ..Details::default()
    })
}

/// NewNotFound(pods, name): `pods "x" not found`.
pub fn not_found(resource: &str, name: &str) -> StatusBody {
    StatusBody::failure(
        404,
        "NotFound",
        format!("{resource} {name:?} not found"),
        resource_details(resource, name),
    )
}

/// NewAlreadyExists(pods, name): `pods "x" already exists`.
pub fn already_exists(resource: &str, name: &str) -> StatusBody {
    StatusBody::failure(
        409,
        "AlreadyExists",
        format!("{resource} {name:?} already exists"),
        resource_details(resource, name),
    )
}

/// NewConflict(pods, name, err): `Operation cannot be fulfilled on pods "x": <err>`.
pub fn conflict(resource: &str, name: &str, err: &str) -> StatusBody {
    StatusBody::failure(
        409,
        "Conflict",
        format!("Operation cannot be fulfilled on {resource} {name:?}: {err}"),
        resource_details(resource, name),
    )
}

/// NewForbidden with the RBAC authorizer's reason
/// (plugin/pkg/auth/authorizer/rbac: `User %q cannot %s resource %q in API group %q in the namespace %q`).
pub fn forbidden(
    user: &str,
    verb: &str,
    resource: &str,
    name: &str,
    namespace: &str,
) -> StatusBody {
    let top = resource.split('/').next().unwrap_or(resource);
    let why = format!(
        "User {user:?} cannot {verb} resource {resource:?} in API group \"\" in the namespace {namespace:?}"
    );
    let message = if name.is_empty() {
        format!("{top} is forbidden: {why}")
    } else {
        format!("{top} {name:?} is forbidden: {why}")
    };
    StatusBody::failure(403, "Forbidden", message, resource_details(top, name))
}

/// An admission plug-in's refusal of a create: 403 Forbidden, `pods "NAME" is forbidden:
/// WHY` (Pod Security admission, ResourceQuota).
pub fn admission_forbidden(name: &str, why: &str) -> StatusBody {
    StatusBody::failure(
        403,
        "Forbidden",
        format!("pods {name:?} is forbidden: {why}"),
        resource_details("pods", name),
    )
}

/// NewResourceExpired: code 410, reason Expired (the watch cache's "too old resource version").
pub fn expired(message: String) -> StatusBody {
    StatusBody::failure(410, "Expired", message, None)
}

/// NewBadRequest.
pub fn bad_request(message: &str) -> StatusBody {
    StatusBody::failure(400, "BadRequest", message.to_string(), None)
}

/// NewMethodNotSupported(pods, action).
pub fn method_not_supported(resource: &str, action: &str) -> StatusBody {
    StatusBody::failure(
        405,
        "MethodNotAllowed",
        format!("{action} is not supported on resources of kind {resource:?}"),
        Some(Details {
            kind: resource.to_string(),
            ..Details::default()
        }),
    )
}

/// 415 for a patch type we do not implement.
pub fn unsupported_media_type(content_type: &str) -> StatusBody {
    StatusBody::failure(
        415,
        "UnsupportedMediaType",
        format!(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type})"
        ),
        None,
    )
}

/// The mux's answer for an unknown path.
pub fn path_not_found() -> StatusBody {
    StatusBody::failure(
        404,
        "NotFound",
        "the server could not find the requested resource".to_string(),
        Some(Details {
            causes: vec![Cause {
                reason: "UnexpectedServerResponse".into(),
                message: "404 page not found".into(),
                field: String::new(),
            }],
            ..Details::default()
        }),
    )
}

/// One `field.Error`: its type string (FieldValueInvalid, FieldValueRequired, ...),
/// the field path and ErrorBody() text.
#[derive(Debug, Clone)]
pub struct FieldError {
    pub cause_type: &'static str,
    pub field: String,
    pub body: String,
}

impl FieldError {
    /// field.Invalid: `Invalid value: "v": detail`.
    pub fn invalid(field: &str, value: &str, detail: &str) -> FieldError {
        FieldError {
            cause_type: "FieldValueInvalid",
            field: field.to_string(),
            body: format!("Invalid value: {value:?}: {detail}"),
        }
    }

    /// field.Required: `Required value` (plus detail when given).
    pub fn required(field: &str, detail: &str) -> FieldError {
        FieldError {
            cause_type: "FieldValueRequired",
            field: field.to_string(),
            body: if detail.is_empty() {
                "Required value".to_string()
            } else {
                format!("Required value: {detail}")
            },
        }
    }

    fn display(&self) -> String {
        format!("{}: {}", self.field, self.body)
    }
}

/// NewInvalid(kind, name, errs): `Pod "x" is invalid: <aggregate>`; an aggregate of
/// one error prints bare, of several prints `[a, b]` (utilerrors.aggregate.Error).
pub fn invalid(kind: &str, name: &str, errs: &[FieldError]) -> StatusBody {
    let aggregate = match errs {
        [] => String::new(),
        [one] => one.display(),
        many => format!(
            "[{}]",
            many.iter()
                .map(FieldError::display)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let message = if aggregate.is_empty() {
        format!("{kind} {name:?} is invalid")
    } else {
        format!("{kind} {name:?} is invalid: {aggregate}")
    };
    StatusBody::failure(
        422,
        "Invalid",
        message,
        Some(Details {
            name: name.to_string(),
            kind: kind.to_string(),
            causes: errs
                .iter()
                .map(|e| Cause {
                    reason: e.cause_type.to_string(),
                    message: e.body.clone(),
                    field: e.field.clone(),
                })
                .collect(),
            ..Details::default()
        }),
    )
}
