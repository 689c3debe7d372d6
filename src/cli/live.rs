//! Live progress of one run, for `scarab run` (from the store), `scarab watch` and
//! `scarab submit --wait` (from the API's run detail): each step's state, attempt, fence
//! and elapsed time, redrawn in place on a terminal, one line per change otherwise.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use serde_json::Value;

use crate::clock;
use crate::engine::{AttemptState, Run, StepState, Timestamp};

/// What the display shows of a run, whichever side it was read from.
pub struct View {
    pub id: String,
    pub pipeline: String,
    pub state: String,
    pub steps: Vec<StepView>,
}

pub struct StepView {
    pub name: String,
    /// For people: `running`, `retry in 1.2s`, `failed (StepFailed)`, …
    pub state: String,
    /// What counts as a change worth a new line when not on a terminal.
    pub key: String,
    pub attempt: Option<AttemptView>,
}

pub struct AttemptView {
    pub number: u64,
    pub fence: u64,
    pub elapsed: Duration,
    pub class: Option<String>,
}

impl View {
    /// From the engine's run (`scarab run`, in-process).
    pub fn of_run(run: &Run) -> View {
        let now = clock::now();
        View {
            id: run.header.id.to_string(),
            pipeline: run.pipeline.name.clone(),
            state: run.header.state.as_str().to_string(),
            steps: (0..run.steps.len())
                .map(|i| step_of_run(run, i, now))
                .collect(),
        }
    }

    /// From the API's run detail (`GET /v1/runs/{id}`).
    pub fn of_detail(run: &Value) -> View {
        let now = clock::now();
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        View {
            id: text(&run["id"]),
            pipeline: text(&run["pipeline"]),
            state: text(&run["state"]),
            steps: run["steps"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|step| step_of_detail(step, now))
                .collect(),
        }
    }
}

pub struct Progress {
    terminal: bool,
    drawn_lines: usize,
    last_seen: HashMap<usize, String>,
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            terminal: std::io::stderr().is_terminal(),
            drawn_lines: 0,
            last_seen: HashMap::new(),
        }
    }

    pub fn show(&mut self, view: &View) {
        // Every step's columns start where the longest name ends.
        let width = view
            .steps
            .iter()
            .map(|s| s.name.chars().count())
            .max()
            .unwrap_or(0);
        let lines: Vec<String> = view.steps.iter().map(|s| step_line(s, width)).collect();
        let mut err = std::io::stderr().lock();
        if self.terminal {
            if self.drawn_lines > 0 {
                let _ = write!(err, "\x1b[{}A", self.drawn_lines);
            }
            let header = format!("run {} ({}): {}", view.id, view.pipeline, view.state);
            let _ = writeln!(err, "\x1b[2K{header}");
            for line in &lines {
                let _ = writeln!(err, "\x1b[2K  {line}");
            }
            self.drawn_lines = lines.len() + 1;
        } else {
            for (i, (line, step)) in lines.iter().zip(&view.steps).enumerate() {
                if self.last_seen.get(&i) != Some(&step.key) {
                    let _ = writeln!(err, "  {line}");
                    self.last_seen.insert(i, step.key.clone());
                }
            }
        }
        let _ = err.flush();
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

fn step_of_run(run: &Run, step: usize, now: Timestamp) -> StepView {
    let progress = &run.steps[step];
    let attempt = progress.attempts.last();
    let attempt_state = attempt.map_or("", |a| match a.state {
        AttemptState::Launching => "launching",
        AttemptState::Running { .. } => "running",
        AttemptState::Finished(_) => "finished",
    });
    let state = match &progress.state {
        StepState::Active => match attempt.map(|a| &a.state) {
            Some(AttemptState::Running { .. }) => "running".to_string(),
            _ => "launching".to_string(),
        },
        StepState::RetryWaiting { due } => format!("retry in {:.1}s", due.since(now).as_secs_f64()),
        StepState::Queued { since } => {
            format!("queued for a slot {:.1}s", now.since(*since).as_secs_f64())
        }
        StepState::Failed { reason } | StepState::DeadLettered { reason } => {
            format!("{} ({reason})", progress.state.as_str())
        }
        StepState::Waiting => {
            let gate = progress.gate.as_ref();
            match gate.and_then(|g| g.release_at.or(g.expires_at)) {
                Some(due) if gate.and_then(|g| g.release_at).is_some() => {
                    format!("gate: auto-release in {:.0}s", due.since(now).as_secs_f64())
                }
                Some(due) => format!("gate: expires in {:.0}s", due.since(now).as_secs_f64()),
                None => "gate: waiting for approval".to_string(),
            }
        }
        other => other.as_str().to_string(),
    };
    StepView {
        name: run.pipeline.steps[step].name.clone(),
        state,
        key: format!(
            "{}/{}/{attempt_state}",
            progress.state.as_str(),
            attempt.map_or(0, |a| a.number)
        ),
        attempt: attempt.map(|a| AttemptView {
            number: u64::from(a.number),
            fence: a.fence.0,
            elapsed: match &a.state {
                AttemptState::Finished(v) => {
                    v.finished_at.since(v.started_at.unwrap_or(a.created_at))
                }
                _ => now.since(a.created_at),
            },
            class: a.class().map(|c| c.to_string()),
        }),
    }
}

fn step_of_detail(step: &Value, now: Timestamp) -> StepView {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let attempt = step["attempts"].as_array().and_then(|a| a.last());
    let attempt_state = attempt.map_or(String::new(), |a| text(&a["state"]));
    let step_state = text(&step["state"]);
    let state = match step_state.as_str() {
        "active" => attempt_state.clone(),
        "retry_waiting" => "waiting for a retry".to_string(),
        "queued" => format!(
            "queued for {} {}",
            text(&step["waiting_for"]["reason"]),
            text(&step["waiting_for"]["name"])
        ),
        "failed" | "dead_lettered" => format!("{step_state} ({})", text(&step["reason"])),
        "waiting" => "gate: waiting for approval".to_string(),
        other => other.to_string(),
    };
    let at = |v: &Value| {
        v.as_str()
            .and_then(|s| humantime::parse_rfc3339(s).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| Timestamp(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
    };
    StepView {
        name: text(&step["name"]),
        state,
        key: format!(
            "{step_state}/{}/{attempt_state}",
            attempt.and_then(|a| a["number"].as_u64()).unwrap_or(0)
        ),
        attempt: attempt.map(|a| {
            let started = at(&a["started_at"]).unwrap_or(now);
            let finished = at(&a["finished_at"]).unwrap_or(now);
            AttemptView {
                number: a["number"].as_u64().unwrap_or(0),
                fence: a["fence"].as_u64().unwrap_or(0),
                elapsed: finished.since(started),
                class: a["class"].as_str().map(str::to_string),
            }
        }),
    }
}

fn step_line(step: &StepView, width: usize) -> String {
    let name = &step.name;
    let state = &step.state;
    let Some(attempt) = &step.attempt else {
        return format!("{name:<width$}  {state}");
    };
    let class = attempt
        .class
        .as_ref()
        .map(|c| format!("  class {c}"))
        .unwrap_or_default();
    format!(
        "{name:<width$}  {state:<28} attempt {:<2} fence {:<6} {:>6.1}s{class}",
        attempt.number,
        attempt.fence,
        attempt.elapsed.as_secs_f64()
    )
}

/// Why a run did not succeed, as a sentence: `step build failed: exit code 101`,
/// `step deploy timed out: …`. The category decides the verb; the reason is the
/// executor's own words.
pub fn failure_sentence(category: &str, step: Option<&str>, reason: &str) -> String {
    let what = step.map_or_else(|| "the run".to_string(), |step| format!("step {step}"));
    match category {
        "step" => format!("{what} failed: {reason}"),
        "timeout" => format!("{what} timed out: {reason}"),
        "config" => format!("{what} could not run as configured: {reason}"),
        "infra_never_started" => format!("{what} never started: {reason}"),
        "infra_post_start" => {
            format!("{what} was stopped by the infrastructure after it started: {reason}")
        }
        "lost" => format!("{what} was lost and may have run: {reason}"),
        "gate" => match step {
            Some(gate) => format!("gate {gate} stopped the run: {reason}"),
            None => format!("a gate stopped the run: {reason}"),
        },
        "budget" => format!("the run's budget ran out: {reason}"),
        "cancelled" => reason.to_string(),
        other => format!("{what} failed ({other}): {reason}"),
    }
}

/// The last line of a followed run: `run ID succeeded`, or `run ID failed: ` and why.
pub fn verdict_line(id: &str, state: &str, why: &str) -> String {
    if why.is_empty() {
        format!("run {id} {state}")
    } else {
        format!("run {id} {state}: {why}")
    }
}

#[cfg(test)]
mod sentence_tests {
    use super::*;

    #[test]
    fn failures_read_as_sentences() {
        assert_eq!(
            failure_sentence("step", Some("build"), "exit code 101"),
            "step build failed: exit code 101"
        );
        assert_eq!(
            failure_sentence("timeout", Some("t"), "timed out after 1s"),
            "step t timed out: timed out after 1s"
        );
        assert_eq!(
            failure_sentence("cancelled", None, "cancelled by admin"),
            "cancelled by admin"
        );
        assert_eq!(
            verdict_line("R", "failed", "step b failed: exit code 1"),
            "run R failed: step b failed: exit code 1"
        );
        assert_eq!(verdict_line("R", "succeeded", ""), "run R succeeded");
    }
}
