//! Live progress of one run for `scarab run`: each step's state, attempt, fence and
//! elapsed time, redrawn in place on a terminal, one line per change otherwise.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};

use crate::clock;
use crate::engine::{AttemptState, Run, StepState, Timestamp};

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

    pub fn show(&mut self, run: &Run) {
        let now = clock::now();
        let lines: Vec<String> = (0..run.steps.len())
            .map(|i| step_line(run, i, now))
            .collect();
        let mut err = std::io::stderr().lock();
        if self.terminal {
            if self.drawn_lines > 0 {
                let _ = write!(err, "\x1b[{}A", self.drawn_lines);
            }
            let header = format!(
                "run {} ({}): {}",
                run.header.id,
                run.pipeline.name,
                run.header.state.as_str()
            );
            let _ = writeln!(err, "\x1b[2K{header}");
            for line in &lines {
                let _ = writeln!(err, "\x1b[2K  {line}");
            }
            self.drawn_lines = lines.len() + 1;
        } else {
            for (i, line) in lines.iter().enumerate() {
                let key = key_of(run, i);
                if self.last_seen.get(&i) != Some(&key) {
                    let _ = writeln!(err, "  {line}");
                    self.last_seen.insert(i, key);
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

/// What counts as a change worth a new line when not on a terminal.
fn key_of(run: &Run, step: usize) -> String {
    let progress = &run.steps[step];
    let attempt = progress.attempts.last();
    format!(
        "{}/{}/{}",
        progress.state.as_str(),
        attempt.map_or(0, |a| a.number),
        attempt.map_or("", |a| match a.state {
            AttemptState::Launching => "launching",
            AttemptState::Running { .. } => "running",
            AttemptState::Finished(_) => "finished",
        })
    )
}

fn step_line(run: &Run, step: usize, now: Timestamp) -> String {
    let name = &run.pipeline.steps[step].name;
    let progress = &run.steps[step];
    let state = match &progress.state {
        StepState::Active => match progress.attempts.last().map(|a| &a.state) {
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
    let Some(attempt) = progress.attempts.last() else {
        return format!("{name:<24} {state}");
    };
    let elapsed = match &attempt.state {
        AttemptState::Finished(v) => v
            .finished_at
            .since(v.started_at.unwrap_or(attempt.created_at)),
        _ => now.since(attempt.created_at),
    };
    let class = attempt
        .class()
        .map(|c| format!("  class {c}"))
        .unwrap_or_default();
    format!(
        "{name:<24} {state:<28} attempt {:<2} fence {:<6} {:>6.1}s{class}",
        attempt.number,
        attempt.fence,
        elapsed.as_secs_f64()
    )
}
