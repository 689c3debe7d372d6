//! The outbox dispatcher: delivers committed launch and kill messages to the executor,
//! at least once, and reports each delivery's result back to the driver, which deletes
//! or reschedules the message in its next transaction.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, mpsc, watch};

use super::{Command, DeliveryFailure};
use crate::clock;
use crate::config::WebhookConfig;
use crate::executor::{Executor, Target};
use crate::limits;
use crate::store::Store;
use crate::store::records::{OutboxMessage, OutboxPayload};

/// Messages being delivered (so a pass never starts the same one twice) and the wake-up
/// the driver rings after committing new messages.
#[derive(Clone, Default)]
pub struct Outbox {
    inner: Arc<OutboxInner>,
}

#[derive(Default)]
struct OutboxInner {
    in_flight: Mutex<HashSet<u64>>,
    wake: Notify,
    /// The last delivery outcome per executor: `Some(error)` while it is unavailable.
    availability: Mutex<HashMap<&'static str, Option<String>>>,
}

impl Outbox {
    pub fn new() -> Outbox {
        Outbox::default()
    }

    /// Each executor's last delivery outcome: `None` = available, `Some(error)` = not.
    pub fn availability(&self) -> Vec<(&'static str, Option<String>)> {
        let map = self
            .inner
            .availability
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        let mut list: Vec<_> = map.into_iter().collect();
        list.sort();
        list
    }

    fn record(&self, executor: &'static str, result: &Result<(), DeliveryFailure>) {
        if let Ok(mut map) = self.inner.availability.lock() {
            map.insert(executor, result.as_ref().err().map(|f| f.error.clone()));
        }
    }

    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    fn claim(&self, id: u64) -> bool {
        self.inner
            .in_flight
            .lock()
            .map(|mut set| set.insert(id))
            .unwrap_or(false)
    }

    /// Whether the message is being delivered, or waits, delivered, for its settlement
    /// (a launch prepared ahead waits for a slot).
    fn claimed(&self, id: u64) -> bool {
        self.inner
            .in_flight
            .lock()
            .map(|set| set.contains(&id))
            .unwrap_or(false)
    }

    fn release(&self, id: u64) {
        if let Ok(mut set) = self.inner.in_flight.lock() {
            set.remove(&id);
        }
    }

    /// Called once the driver committed the result of these deliveries.
    pub fn settle(&self, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        if let Ok(mut set) = self.inner.in_flight.lock() {
            for id in ids {
                set.remove(id);
            }
        }
        self.wake();
    }
}

/// How long a message waits after its `attempts`-th failed delivery.
pub fn redelivery_delay(attempts: u32) -> Duration {
    let exponent = attempts.saturating_sub(1).min(20);
    limits::OUTBOX_BACKOFF_INITIAL
        .saturating_mul(1 << exponent)
        .min(limits::OUTBOX_BACKOFF_MAX)
}

pub async fn run<E: Executor>(
    store: Arc<Store>,
    settings: Arc<super::Settings>,
    executor: E,
    outbox: Outbox,
    commands: mpsc::Sender<Command>,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(limits::OUTBOX_CONCURRENCY_MAX));
    loop {
        let now = clock::now();
        let (due, next_due) = match store.read().and_then(|r| {
            Ok((
                r.due_outbox(now, limits::OUTBOX_BATCH_MAX, |id| outbox.claimed(id))?,
                r.next_outbox_due()?,
            ))
        }) {
            Ok(found) => found,
            Err(error) => {
                tracing::error!(%error, "outbox: cannot read due messages");
                (Vec::new(), None)
            }
        };
        for message in due {
            if !outbox.claim(message.id) {
                continue;
            }
            // The list above may be older than the last settlement: deliver only what the
            // store still holds as due, so a settled message is never delivered again.
            if !still_due(&store, message.id, now) {
                outbox.release(message.id);
                continue;
            }
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let executor = executor.clone();
            // The webhooks as configured now: a reload applies to the next delivery.
            let live = settings.live();
            let commands = commands.clone();
            let outbox = outbox.clone();
            tokio::spawn(async move {
                let result = deliver(&executor, &live.webhooks, &message).await;
                outbox.record(executor_of(&message.payload), &result);
                if let Err(error) = &result {
                    tracing::warn!(message = message.id, kind = message.payload.kind(), error = %error.error, "outbox delivery failed");
                }
                let _ = commands
                    .send(Command::Delivered {
                        message: message.id,
                        result,
                    })
                    .await;
                drop(permit);
            });
        }
        // Messages already being delivered are still "due": wait for their settlement
        // (which wakes us) rather than spinning on them.
        let wait = match next_due {
            Some(due) if due > now => due.since(now),
            _ => Duration::from_secs(1),
        };
        tokio::select! {
            _ = outbox.inner.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
    }
}

fn executor_of(payload: &OutboxPayload) -> &'static str {
    let kind = match payload {
        OutboxPayload::Launch(launch) => launch.action.executor(),
        OutboxPayload::Kill { executor, .. } | OutboxPayload::CleanUp { executor, .. } => *executor,
        OutboxPayload::Webhook { .. } => return "webhooks",
    };
    match kind {
        crate::store::records::ExecutorKind::Local => "local",
        crate::store::records::ExecutorKind::Kubernetes => "kubernetes",
    }
}

fn still_due(store: &Store, id: u64, now: crate::engine::Timestamp) -> bool {
    match store.read().and_then(|r| r.outbox_message(id)) {
        Ok(Some(message)) => message.next_at <= now,
        Ok(None) => false,
        Err(error) => {
            tracing::error!(%error, "outbox: cannot re-read a message");
            false
        }
    }
}

async fn deliver<E: Executor>(
    executor: &E,
    webhooks: &[WebhookConfig],
    message: &OutboxMessage,
) -> Result<(), DeliveryFailure> {
    let result = match &message.payload {
        OutboxPayload::Webhook {
            url,
            event_id,
            body,
            ..
        } => {
            let Some(hook) = webhooks.iter().find(|h| &h.url == url) else {
                return Err(DeliveryFailure {
                    error: format!("webhook {url} is no longer configured"),
                    unavailable: false,
                });
            };
            return super::webhooks::deliver(hook, event_id, body).await;
        }
        OutboxPayload::Launch(launch) => executor.launch(launch).await,
        OutboxPayload::Kill {
            fence,
            reason,
            executor: kind,
            ..
        } => {
            let target = Target {
                executor: *kind,
                fence: *fence,
            };
            executor.kill(target, *reason).await
        }
        OutboxPayload::CleanUp {
            fence,
            executor: kind,
            ..
        } => {
            let target = Target {
                executor: *kind,
                fence: *fence,
            };
            executor.clean_up(target).await
        }
    };
    result.map_err(|e| DeliveryFailure {
        unavailable: matches!(e, crate::executor::ExecutorError::Unavailable(_)),
        error: limits::clip(&e.to_string(), limits::OUTBOX_ERROR_MAX_BYTES),
    })
}
