//! Signed webhooks: run events and operator alerts, delivered through the outbox so the
//! engine never waits on a receiver. The event id is the idempotency key: every delivery
//! of one event carries the same id and the same signed body.

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use super::DeliveryFailure;
use crate::clock;
use crate::config::{WebhookConfig, WebhookEvent};
use crate::engine::{FailureClassification, Run, Timestamp};
use crate::limits;

/// `sha256=<hex HMAC-SHA256 of the body>`, the `X-Scarab-Signature` header.
pub fn signature(secret: &str, body: &[u8]) -> String {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC accepts any key length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

pub fn new_event_id() -> String {
    format!("e{}", ulid::Ulid::new().to_string().to_ascii_lowercase())
}

fn classification_json(classification: Option<FailureClassification>) -> Value {
    match classification {
        Some(c) => {
            json!({"category": c.category, "auto_retryable": c.auto_retryable, "step": c.step, "reason": c.reason})
        }
        None => Value::Null,
    }
}

/// A run's state change (`run_state`) or, for `dead_lettered`, the operator alert.
pub fn run_event(
    kind: WebhookEvent,
    event_id: &str,
    run: &Run,
    previous: &str,
    at: Timestamp,
) -> String {
    json!({
        "event_id": event_id,
        "type": kind.as_str(),
        "run": run.header.id.to_string(),
        "pipeline": run.header.pipeline_name,
        "origin": run.header.origin,
        "state": run.header.state.as_str(),
        "previous_state": previous,
        "failure_classification": classification_json(crate::engine::classify_run(run)),
        "at": clock::rfc3339(at),
    })
    .to_string()
}

/// A gate opened: someone may approve or reject it.
pub fn gate_event(event_id: &str, run: &Run, step: usize, at: Timestamp) -> String {
    let spec = &run.pipeline.steps[step];
    let gate = run.steps[step].gate.as_ref();
    json!({
        "event_id": event_id,
        "type": WebhookEvent::GateWaiting.as_str(),
        "run": run.header.id.to_string(),
        "pipeline": run.header.pipeline_name,
        "origin": run.header.origin,
        "step": spec.name,
        "message": spec.action.gate().and_then(|g| g.message.clone()),
        "auto_release_at": gate.and_then(|g| g.release_at).map(clock::rfc3339),
        "expires_at": gate.and_then(|g| g.expires_at).map(clock::rfc3339),
        "at": clock::rfc3339(at),
    })
    .to_string()
}

/// The operator alert for an outbox message that was dead-lettered.
pub fn message_alert(
    event_id: &str,
    run: crate::engine::RunId,
    message: Value,
    at: Timestamp,
) -> String {
    json!({
        "event_id": event_id,
        "type": WebhookEvent::DeadLettered.as_str(),
        "run": run.to_string(),
        "message": message,
        "at": clock::rfc3339(at),
    })
    .to_string()
}

/// POSTs one event. Any answer but 2xx is a failed delivery, retried by the outbox.
pub async fn deliver(
    hook: &WebhookConfig,
    event_id: &str,
    body: &str,
) -> Result<(), DeliveryFailure> {
    let tls =
        crate::tls::client_config(hook.ca_cert.as_deref()).map_err(|error| DeliveryFailure {
            error: limits::clip(&error, limits::OUTBOX_ERROR_MAX_BYTES),
            unavailable: false,
        })?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(hook.timeout))
        .tls_config(tls)
        .build()
        .into();
    let url = hook.url.clone();
    let signature = signature(&hook.secret, body.as_bytes());
    let event_id = event_id.to_string();
    let body = body.to_string();
    let sent = tokio::task::spawn_blocking(move || {
        agent
            .post(&url)
            .header("Content-Type", "application/json")
            .header("X-Scarab-Event-Id", &event_id)
            .header("Idempotency-Key", &event_id)
            .header("X-Scarab-Signature", &signature)
            .send(body.as_bytes())
            .map(|response| response.status().as_u16())
    })
    .await;
    let failure = |error: String| DeliveryFailure {
        error: limits::clip(&error, limits::OUTBOX_ERROR_MAX_BYTES),
        unavailable: false,
    };
    match sent {
        Ok(Ok(status)) if (200..300).contains(&status) => Ok(()),
        Ok(Ok(status)) => Err(failure(format!("webhook {} answered {status}", hook.url))),
        Ok(Err(error)) => Err(failure(format!("webhook {}: {error}", hook.url))),
        Err(error) => Err(failure(format!("webhook task: {error}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_the_hex_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2.
        let sig = signature("Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
