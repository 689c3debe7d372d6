//! The JSON shapes of the public contract (docs/api.md). Serde lives here, at the edge.

use serde::Serialize;

use crate::clock::rfc3339;
use crate::engine::{Attempt, AttemptState, FailureClassification, Run, RunHeader, classify_run};

#[derive(Serialize)]
pub struct RunDetail {
    pub id: String,
    pub pipeline: String,
    pub state: &'static str,
    pub origin: String,
    pub created_at: String,
    pub updated_at: String,
    pub cancel_requested_by: Option<String>,
    /// Why the system cancelled the run (`superseded`); null for a person's cancel.
    pub cancel_reason: Option<String>,
    /// The active-time budget, for pipelines that set one.
    pub budget: Option<BudgetDto>,
    /// The run's parameter values (given at submit, else the defaults), by name.
    pub params: std::collections::BTreeMap<String, String>,
    /// The run's place in admission control.
    pub admission: AdmissionDto,
    pub steps: Vec<StepDetail>,
    pub failure_classification: Option<ClassificationDto>,
    pub auto_retry: AutoRetryDto,
}

#[derive(Serialize)]
pub struct StepDetail {
    pub name: String,
    pub state: &'static str,
    pub reason: Option<String>,
    pub executor: &'static str,
    pub needs: Vec<String>,
    /// A gate step's state: its timers and, once decided, who decided what and when.
    pub gate: Option<GateDto>,
    /// Attempts of earlier tries (before an auto-retry resubmit), not listed here.
    pub earlier_attempts: usize,
    pub attempts: Vec<AttemptDto>,
    /// What a queued step waits for; null for a step that is not queued.
    pub waiting_for: Option<WaitDto>,
}

#[derive(Serialize)]
pub struct AdmissionDto {
    pub priority: i32,
    pub parallelism: Option<u32>,
    pub concurrency: Option<ConcurrencyDto>,
}

#[derive(Serialize)]
pub struct ConcurrencyDto {
    pub group: String,
    pub limit: u32,
    pub supersede: bool,
    /// The run holds a slot of its group (from its first admission until it ends).
    pub held: bool,
}

#[derive(Serialize)]
pub struct WaitDto {
    /// `pool`, `lock`, `group` or `parallelism`.
    pub reason: &'static str,
    /// The pool (`local`, `kubernetes`), the lock, the group, or the run's id.
    pub name: String,
    /// 1 for the first in that queue.
    pub position: usize,
    pub since: String,
}

impl From<&crate::engine::admission::Wait> for WaitDto {
    fn from(wait: &crate::engine::admission::Wait) -> Self {
        WaitDto {
            reason: wait.reason.as_str(),
            name: wait.name.clone(),
            position: wait.position,
            since: rfc3339(wait.since),
        }
    }
}

/// `GET /v1/queue`.
#[derive(Serialize)]
pub struct QueueDto {
    pub pools: Vec<PoolDto>,
    pub locks: Vec<LockDto>,
    /// Queued steps by what they wait for.
    pub waiting: std::collections::BTreeMap<&'static str, usize>,
    /// Queued steps in admission order (the first `limit`).
    pub queued: Vec<QueuedDto>,
}

#[derive(Serialize)]
pub struct PoolDto {
    pub name: &'static str,
    pub used: u64,
    pub limit: u32,
}

#[derive(Serialize)]
pub struct LockDto {
    pub name: String,
    pub held: u32,
    pub limit: u32,
}

#[derive(Serialize)]
pub struct QueuedDto {
    pub run: String,
    pub step: String,
    #[serde(flatten)]
    pub wait: WaitDto,
}

#[derive(Serialize)]
pub struct GateDto {
    pub message: Option<String>,
    pub opened_at: Option<String>,
    pub auto_release_at: Option<String>,
    pub expires_at: Option<String>,
    pub decision: Option<GateDecisionDto>,
}

#[derive(Serialize)]
pub struct GateDecisionDto {
    /// `approved`, `rejected`, `auto_released` or `expired`.
    pub outcome: &'static str,
    pub by: String,
    pub caller: String,
    pub at: String,
    pub comment: Option<String>,
}

#[derive(Serialize)]
pub struct BudgetDto {
    pub limit_ms: u64,
    /// Active time used so far (time `waiting` on gates excluded).
    pub used_ms: u64,
    /// Whether the clock runs now (it is paused while the run is `waiting`).
    pub running: bool,
    pub exceeded_at: Option<String>,
}

pub fn gate_decision(decision: &crate::engine::GateDecision) -> GateDecisionDto {
    GateDecisionDto {
        outcome: decision.outcome.as_str(),
        by: decision.by.clone(),
        caller: decision.caller.clone(),
        at: rfc3339(decision.at),
        comment: decision.comment.clone(),
    }
}

fn gate_dto(spec: &crate::pipeline::Step, progress: &crate::engine::RunStep) -> Option<GateDto> {
    let gate_spec = spec.action.gate()?;
    let gate = progress.gate.as_ref();
    Some(GateDto {
        message: gate_spec.message.clone(),
        opened_at: gate.map(|g| rfc3339(g.opened_at)),
        auto_release_at: gate.and_then(|g| g.release_at).map(rfc3339),
        expires_at: gate.and_then(|g| g.expires_at).map(rfc3339),
        decision: gate.and_then(|g| g.decision.as_ref()).map(gate_decision),
    })
}

#[derive(Serialize)]
pub struct AttemptDto {
    pub number: u32,
    pub fence: u64,
    pub state: &'static str,
    pub class: Option<&'static str>,
    pub started: bool,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub kill_requested: Option<&'static str>,
    /// What the attempt reported through the fenced output API.
    pub outputs: std::collections::BTreeMap<String, String>,
}

#[derive(Serialize)]
pub struct ClassificationDto {
    pub category: &'static str,
    pub auto_retryable: bool,
    pub step: Option<String>,
    pub reason: String,
}

/// The auto-retry block: resubmits so far against the configured `max`, when the run is
/// next eligible, and whether (and why) it is quarantined.
#[derive(Serialize)]
pub struct AutoRetryDto {
    pub attempts: u32,
    pub max: u32,
    pub next_at: Option<String>,
    pub quarantined: bool,
    pub reason: Option<String>,
}

#[derive(Serialize)]
pub struct RunSummary {
    pub id: String,
    pub pipeline: String,
    pub state: &'static str,
    pub origin: String,
    pub created_at: String,
    pub updated_at: String,
    pub failure_classification: Option<ClassificationDto>,
    pub auto_retry: AutoRetryDto,
}

impl From<FailureClassification> for ClassificationDto {
    fn from(c: FailureClassification) -> Self {
        ClassificationDto {
            category: c.category,
            auto_retryable: c.auto_retryable,
            step: c.step,
            reason: c.reason,
        }
    }
}

pub fn auto_retry(header: &RunHeader, max: u32) -> AutoRetryDto {
    let retry = &header.auto_retry;
    AutoRetryDto {
        attempts: retry.attempts,
        max,
        next_at: retry.next_at.map(rfc3339),
        quarantined: header.state == crate::engine::RunState::Quarantined,
        reason: retry
            .quarantined
            .clone()
            .filter(|_| header.state == crate::engine::RunState::Quarantined)
            .or_else(|| retry.discarded.clone()),
    }
}

/// The run detail. `attempts` shows the current try; a resubmitted run's earlier attempts
/// are counted in `earlier_attempts` and kept in the history (and their logs by number).
pub fn run_detail(
    run: &Run,
    auto_retry_max: u32,
    waits: &[crate::engine::admission::Wait],
) -> RunDetail {
    let header = &run.header;
    let steps = run
        .pipeline
        .steps
        .iter()
        .zip(&run.steps)
        .enumerate()
        .map(|(index, (spec, progress))| StepDetail {
            waiting_for: waits
                .iter()
                .find(|w| {
                    w.step == index
                        && matches!(progress.state, crate::engine::StepState::Queued { .. })
                })
                .map(WaitDto::from),
            name: spec.name.clone(),
            state: progress.state.as_str(),
            reason: match &progress.state {
                crate::engine::StepState::Failed { reason }
                | crate::engine::StepState::DeadLettered { reason } => Some(reason.clone()),
                _ => None,
            },
            executor: spec.action.executor_name(),
            needs: spec
                .needs
                .iter()
                .map(|&n| run.pipeline.steps[n].name.clone())
                .collect(),
            gate: gate_dto(spec, progress),
            earlier_attempts: progress.attempts.len() - progress.current_try().len(),
            attempts: progress.current_try().iter().map(attempt_dto).collect(),
        })
        .collect();
    RunDetail {
        id: header.id.to_string(),
        pipeline: header.pipeline_name.clone(),
        state: header.state.as_str(),
        origin: header.origin.clone(),
        created_at: rfc3339(header.created_at),
        updated_at: rfc3339(header.updated_at),
        cancel_requested_by: header.cancel.as_ref().map(|c| c.by.clone()),
        cancel_reason: header.cancel.as_ref().and_then(|c| c.reason.clone()),
        params: run.pipeline.params.iter().cloned().collect(),
        admission: AdmissionDto {
            priority: header.admission.priority,
            parallelism: header.admission.parallelism,
            concurrency: header.admission.group.as_ref().map(|g| ConcurrencyDto {
                group: g.group.clone(),
                limit: g.limit,
                supersede: g.supersede,
                held: header.admission.group_held,
            }),
        },
        budget: header.budget.as_ref().map(|clock| BudgetDto {
            limit_ms: clock.limit_ms,
            used_ms: clock.used_at(crate::clock::now()),
            running: clock.active_since.is_some(),
            exceeded_at: clock.exceeded_at.map(rfc3339),
        }),
        steps,
        failure_classification: classify_run(run).map(Into::into),
        auto_retry: auto_retry(header, auto_retry_max),
    }
}

pub fn run_summary(
    header: &RunHeader,
    classification: Option<FailureClassification>,
    auto_retry_max: u32,
) -> RunSummary {
    RunSummary {
        id: header.id.to_string(),
        pipeline: header.pipeline_name.clone(),
        state: header.state.as_str(),
        origin: header.origin.clone(),
        created_at: rfc3339(header.created_at),
        updated_at: rfc3339(header.updated_at),
        failure_classification: classification.map(Into::into),
        auto_retry: auto_retry(header, auto_retry_max),
    }
}

fn attempt_dto(attempt: &Attempt) -> AttemptDto {
    let (state, started, started_at, finished) = match &attempt.state {
        AttemptState::Launching => ("launching", false, None, None),
        AttemptState::Running { confirmed_at, .. } => ("running", true, Some(*confirmed_at), None),
        AttemptState::Finished(verdict) => (
            "finished",
            verdict.started,
            verdict.started_at,
            Some(verdict),
        ),
    };
    AttemptDto {
        number: attempt.number,
        fence: attempt.fence.0,
        state,
        class: attempt.class().map(|c| c.as_str()),
        started,
        reason: finished.map(|v| v.reason.clone()),
        exit_code: finished.and_then(|v| v.exit_code),
        started_at: started_at.map(rfc3339),
        finished_at: finished.map(|v| rfc3339(v.finished_at)),
        kill_requested: attempt.kill.map(|k| k.as_str()),
        outputs: attempt.outputs.iter().cloned().collect(),
    }
}

/// A dead letter as operators see it.
pub fn dead_letter(letter: &crate::store::records::DeadLetter) -> serde_json::Value {
    use crate::store::records::OutboxPayload;
    let message = &letter.message;
    let (step, fence) = match &message.payload {
        OutboxPayload::Launch(launch) => (Some(launch.step_name.clone()), launch.fence.0),
        OutboxPayload::Kill { fence, .. } => (None, fence.0),
        OutboxPayload::CleanUp { fence, .. } => (None, fence.0),
        OutboxPayload::Webhook { .. } => (None, 0),
    };
    serde_json::json!({
        "id": message.id,
        "kind": message.payload.kind(),
        "run": message.payload.run().to_string(),
        "step": step,
        "fence": fence,
        "category": letter.category.as_str(),
        "deliveries": message.delivery_attempts,
        "max_deliveries": message.max_deliveries,
        "last_error": message.last_error,
        "created_at": rfc3339(message.created_at),
        "dead_at": rfc3339(letter.dead_at),
    })
}

/// The header of `POST /v1/backup` carrying the snapshot's row counts.
pub const BACKUP_COUNTS_HEADER: &str = "x-scarab-backup-counts";

/// `table=rows,…`: how the service and the client compare a snapshot.
pub fn backup_counts(counts: &[(String, u64)]) -> String {
    counts
        .iter()
        .map(|(table, rows)| format!("{table}={rows}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `POST /v1/runs`.
#[derive(Serialize)]
pub struct SubmitAnswer {
    pub id: String,
    pub warnings: Vec<String>,
    /// True when the `Idempotency-Key` named an earlier run (answered 200, not 201).
    pub existing: bool,
}

/// `GET /v1/runs`.
#[derive(Serialize)]
pub struct RunPage {
    pub runs: Vec<RunSummary>,
    pub next_cursor: Option<String>,
}

/// One event of `GET /v1/runs/{id}/history`.
#[derive(Serialize)]
pub struct HistoryEvent {
    pub seq: u32,
    pub at: String,
    pub kind: String,
    pub detail: serde_json::Value,
}

impl HistoryEvent {
    pub fn of(seq: u32, record: &crate::store::records::HistoryRecord) -> HistoryEvent {
        HistoryEvent {
            seq,
            at: crate::clock::rfc3339(record.at),
            kind: record.kind.clone(),
            // The detail is stored as JSON text; an empty object if it ever is not.
            detail: serde_json::from_str(&record.detail)
                .unwrap_or_else(|_| serde_json::Value::Object(Default::default())),
        }
    }
}

/// One event of `GET /v1/events`: a history event and its run.
#[derive(Serialize)]
pub struct StreamEvent {
    pub run: String,
    #[serde(flatten)]
    pub event: HistoryEvent,
}

#[derive(Serialize)]
pub struct HistoryPage {
    pub events: Vec<HistoryEvent>,
    pub next_after: Option<u32>,
}

#[derive(Serialize)]
pub struct DeadLetterPage {
    pub dead_letters: Vec<serde_json::Value>,
    pub next_after: Option<u64>,
}

/// `POST /v1/runs/{id}/cancel`.
#[derive(Serialize)]
pub struct CancelAnswer {
    pub id: String,
    /// Always `requested`: the run ends once its steps are stopped.
    pub cancel: &'static str,
}

/// A retry of a finished run: the steps that start a fresh try, in pipeline order.
#[derive(Serialize)]
pub struct RetryAnswer {
    pub id: String,
    pub steps: Vec<String>,
}

/// A requeue of a quarantined run (`id` a run id) or of a dead letter (a message id).
#[derive(Serialize)]
pub struct RequeueAnswer<Id: Serialize> {
    pub id: Id,
    pub requeued: bool,
}

/// A discard of a quarantined run or of a dead letter.
#[derive(Serialize)]
pub struct DiscardAnswer<Id: Serialize> {
    pub id: Id,
    pub discarded: bool,
}

/// `POST /v1/runs/{id}/gates/{step}/approve|reject`.
#[derive(Serialize)]
pub struct DecisionAnswer {
    pub run: String,
    pub step: String,
    pub decision: GateDecisionDto,
}

/// `PUT /v1/runs/{id}/steps/{step}/outputs`.
#[derive(Serialize)]
pub struct OutputsAnswer {
    pub stored: bool,
    pub fence: u64,
}

/// `GET /readyz`.
#[derive(Serialize)]
pub struct Readiness {
    pub ready: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox_depth: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executors: Option<std::collections::BTreeMap<String, ExecutorAvailability>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressDto>,
    /// What keeps local steps away from Scarab's files: `landlock` or `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_isolation: Option<&'static str>,
}

#[derive(Serialize)]
pub struct ExecutorAvailability {
    pub available: bool,
    pub last_error: Option<String>,
}

/// The forward-progress check as `/readyz` shows it (or the error that kept it from
/// running).
#[derive(Serialize)]
#[serde(untagged)]
pub enum ProgressDto {
    Checked {
        runs: usize,
        stuck: Vec<NamedRun>,
        unreadable: Vec<NamedRun>,
    },
    Failed {
        error: String,
    },
}

#[derive(Serialize)]
pub struct NamedRun {
    pub run: String,
    pub problem: String,
}

impl ProgressDto {
    pub fn of(report: &crate::service::forward_progress::ProgressReport) -> ProgressDto {
        let named = |runs: &[crate::engine::Stuck]| {
            runs.iter()
                .map(|s| NamedRun {
                    run: s.run.to_string(),
                    problem: s.problem.clone(),
                })
                .collect()
        };
        ProgressDto::Checked {
            runs: report.runs,
            stuck: named(&report.stuck),
            unreadable: named(&report.unreadable),
        }
    }
}

/// A schedule, as every `/v1/schedules` route answers it (docs/schedules.md).
#[derive(Serialize)]
pub struct Schedule {
    pub name: String,
    pub cron: String,
    pub timezone: String,
    pub catch_up: &'static str,
    pub overlap: &'static str,
    pub paused: bool,
    /// The pipeline's name.
    pub pipeline: String,
    pub params: std::collections::BTreeMap<String, String>,
    pub created_at: String,
    pub next_fire: Option<String>,
    /// The next fire on the schedule's own clock, with its offset.
    pub next_fire_local: Option<String>,
    /// The next fires, the first of them `next_fire`; empty while paused.
    pub upcoming: Vec<String>,
    pub last_fire: Option<String>,
    pub last_run: Option<String>,
    /// The last run's state; `null` when it has been cleaned up or there is none.
    pub last_run_state: Option<&'static str>,
    pub runs_started: u64,
    pub fires_skipped: u64,
    pub last_skip: Option<ScheduleSkip>,
}

#[derive(Serialize)]
pub struct ScheduleSkip {
    pub at: String,
    pub reason: String,
}

#[derive(Serialize)]
pub struct ScheduleList {
    pub schedules: Vec<Schedule>,
}

impl Schedule {
    pub fn of(
        stored: &crate::store::records::StoredSchedule,
        last_run_state: Option<crate::engine::RunState>,
    ) -> Schedule {
        use crate::engine::schedule::Spec;
        let schedule = &stored.schedule;
        let spec = Spec::parse(&schedule.cron, &schedule.timezone).ok();
        let mut upcoming = Vec::new();
        if let (Some(spec), Some(first)) = (&spec, schedule.next_fire) {
            let mut next = Some(first);
            while let Some(at) = next.filter(|_| upcoming.len() < crate::limits::SCHEDULE_UPCOMING)
            {
                upcoming.push(rfc3339(at));
                next = spec.next_after(at);
            }
        }
        Schedule {
            name: schedule.name.clone(),
            cron: schedule.cron.clone(),
            timezone: schedule.timezone.clone(),
            catch_up: schedule.catch_up.as_str(),
            overlap: schedule.overlap.as_str(),
            paused: schedule.paused,
            pipeline: stored.pipeline_name.clone(),
            params: stored.source.params.iter().flatten().cloned().collect(),
            created_at: rfc3339(schedule.created_at),
            next_fire: schedule.next_fire.map(rfc3339),
            next_fire_local: spec
                .as_ref()
                .zip(schedule.next_fire)
                .and_then(|(spec, at)| spec.local_time(at)),
            upcoming,
            last_fire: schedule.last_fire.map(rfc3339),
            last_run: schedule.last_run.map(|run| run.to_string()),
            last_run_state: last_run_state.map(|state| state.as_str()),
            runs_started: schedule.runs_started,
            fires_skipped: schedule.fires_skipped,
            last_skip: schedule
                .last_skip
                .as_ref()
                .map(|(at, reason)| ScheduleSkip {
                    at: rfc3339(*at),
                    reason: reason.clone(),
                }),
        }
    }
}
