//! The CLI's tables: aligned columns that fit the terminal's width (long cells wrap in
//! their column instead of pushing the others out of line), plain when not a terminal;
//! and the durations and times they show.

use std::time::{Duration, SystemTime};

use comfy_table::{Cell, ContentArrangement, Table};
use serde_json::Value;

/// How wide a table may be.
#[derive(Clone, Copy, Debug)]
pub enum Width {
    /// `$COLUMNS` when set, else the terminal's width; unbounded when stdout is not a
    /// terminal (a pipe or a file gets whole cells).
    Terminal,
    /// At most this many columns (tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Fixed(u16),
}

/// A table with these column headers.
pub(super) fn new(header: &[&str], width: Width) -> Table {
    let mut table = Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().map(Cell::new));
    let fixed = match width {
        Width::Fixed(columns) => Some(columns),
        Width::Terminal => std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse::<u16>().ok())
            .filter(|&c| c >= 20),
    };
    if let Some(columns) = fixed {
        table.force_no_tty().set_width(columns);
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

/// Columns that are never wrapped (states, numbers, durations, classes): the width left
/// goes to the others (names, reasons), which wrap instead.
pub(super) fn keep_whole(table: &mut Table, columns: &[usize]) {
    for &index in columns {
        if let Some(column) = table.column_mut(index) {
            column.set_constraint(comfy_table::ColumnConstraint::ContentWidth);
        }
    }
}

/// `table`'s lines with no trailing spaces, each ending in a newline.
pub(super) fn render(table: &Table) -> String {
    let mut text = String::new();
    for line in table.lines() {
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// Prints `table` with no trailing spaces on its lines.
pub(super) fn print(table: &Table) {
    print!("{}", render(table));
}

/// An RFC 3339 time of the API.
pub(crate) fn time(value: &Value) -> Option<SystemTime> {
    value
        .as_str()
        .and_then(|s| humantime::parse_rfc3339(s).ok())
}

/// How long from `start` to `end` (to `now` when there is no end yet), as `took` shows
/// it; `-` without a start.
pub(crate) fn took(start: &Value, end: &Value, now: SystemTime) -> String {
    let Some(start) = time(start) else {
        return "-".to_string();
    };
    let end = time(end).unwrap_or(now);
    duration(end.duration_since(start).unwrap_or_default())
}

/// `0.4s`, `12.0s`, `3m04s`, `2h05m`, `3d04h`: short, and sortable by eye.
pub(crate) fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0..60 => format!("{secs}.{}s", d.subsec_millis() / 100),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86400, secs % 86400 / 3600),
    }
}

/// How long ago `at` was, as `duration` writes it.
pub(crate) fn age(at: &Value, now: SystemTime) -> String {
    match time(at) {
        Some(at) => duration(now.duration_since(at).unwrap_or_default()),
        None => "-".to_string(),
    }
}

/// A string of the API's answer as a terminal may show it (`text::escape`); empty when
/// it is not a string.
fn shown(value: &Value) -> String {
    crate::text::escape(value.as_str().unwrap_or_default()).into_owned()
}

/// Whether a run (its detail or summary) has ended.
pub(crate) fn run_ended(run: &Value) -> bool {
    run["state"]
        .as_str()
        .and_then(crate::engine::RunState::parse)
        .is_some_and(crate::engine::RunState::is_terminal)
}

/// How long a run took: from its submission to its end, or to `now` while it goes on.
pub(crate) fn run_took(run: &Value, now: SystemTime) -> String {
    let end = if run_ended(run) {
        &run["updated_at"]
    } else {
        &Value::Null
    };
    took(&run["created_at"], end, now)
}

/// Why a run did not succeed, as a sentence (`step build failed: exit code 101`); empty
/// when it did or is still going.
pub(crate) fn failure_of(run: &Value) -> String {
    let failure = &run["failure_classification"];
    if !failure.is_object() {
        return String::new();
    }
    let step = shown(&failure["step"]);
    super::live::failure_sentence(
        &shown(&failure["category"]),
        (!step.is_empty()).then_some(step.as_str()),
        &shown(&failure["reason"]),
    )
}

/// The WHY of a run for people: its failure category, and where the auto-retry sweep
/// stands ("auto-retrying (1/2)", "quarantined: …").
pub(crate) fn why(run: &Value) -> String {
    let retry = &run["auto_retry"];
    if retry["quarantined"] == true {
        return format!("quarantined: {}", shown(&retry["reason"]));
    }
    let attempts = retry["attempts"].as_u64().unwrap_or(0);
    if attempts > 0 && !run_ended(run) {
        return format!("auto-retrying ({attempts}/{})", retry["max"]);
    }
    shown(&run["failure_classification"]["category"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_short_and_exact_to_their_unit() {
        let cases = [
            (400, "0.4s"),
            (12_000, "12.0s"),
            (59_990, "59.9s"),
            (184_000, "3m04s"),
            (7_500_000, "2h05m"),
            (273_600_000, "3d04h"),
        ];
        for (ms, text) in cases {
            assert_eq!(duration(Duration::from_millis(ms)), text, "{ms} ms");
        }
    }
}
