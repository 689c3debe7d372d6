//! `scarab schedule …`: schedules over the API (docs/schedules.md).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::{Value, json};

use super::client::{Client, fail, print_json, shown};
use super::{ClientArgs, Output, table};
// A schedule name in a URL path (names are `[A-Za-z0-9_.-]`, but a typo may not be).
use crate::text::url_encode as encode;

/// What `scarab schedule create` sends.
pub struct Create<'a> {
    pub name: &'a str,
    pub cron: &'a str,
    pub timezone: Option<&'a str>,
    pub file: &'a Path,
    pub params: &'a [(String, String)],
    pub catch_up: Option<&'a str>,
    pub overlap: Option<&'a str>,
}

pub fn create(args: &ClientArgs, create: &Create) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let pipeline = std::fs::read_to_string(create.file)
        .with_context(|| format!("reading {}", create.file.display()))?;
    let params: serde_json::Map<String, Value> = create
        .params
        .iter()
        .map(|(name, value)| (name.clone(), Value::String(value.clone())))
        .collect();
    let mut body = json!({
        "name": create.name,
        "cron": create.cron,
        "pipeline": pipeline,
        "params": params,
    });
    for (key, value) in [
        ("timezone", create.timezone),
        ("catch_up", create.catch_up),
        ("overlap", create.overlap),
    ] {
        if let Some(value) = value {
            body[key] = json!(value);
        }
    }
    let answer = client.post(
        "/v1/schedules",
        "application/json",
        body.to_string().as_bytes(),
        &[],
    )?;
    if !answer.ok() {
        return fail(&answer);
    }
    print_one(args.output, &answer.json()?)
}

pub fn list(args: &ClientArgs) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let answer = client.get("/v1/schedules")?;
    if !answer.ok() {
        return fail(&answer);
    }
    let value = answer.json()?;
    if let Output::Json = args.output {
        print_json(&value)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = table::new(
        &[
            "NAME",
            "CRON",
            "TIMEZONE",
            "PIPELINE",
            "NEXT FIRE",
            "LAST RUN",
        ],
        table::Width::Terminal,
    );
    for schedule in value["schedules"].as_array().into_iter().flatten() {
        rows.add_row(vec![
            shown(&schedule["name"]),
            shown(&schedule["cron"]),
            shown(&schedule["timezone"]),
            shown(&schedule["pipeline"]),
            next_fire(schedule),
            last_run(schedule),
        ]);
    }
    table::print(&rows);
    Ok(ExitCode::SUCCESS)
}

pub fn show(args: &ClientArgs, name: &str) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let answer = client.get(&format!("/v1/schedules/{}", encode(name)))?;
    if !answer.ok() {
        return fail(&answer);
    }
    print_one(args.output, &answer.json()?)
}

/// `pause`, `resume` or `delete`.
pub fn act(args: &ClientArgs, name: &str, action: &str) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let path = format!("/v1/schedules/{}", encode(name));
    let answer = if action == "delete" {
        client.delete(&path)?
    } else {
        client.post(&format!("{path}/{action}"), "application/json", b"{}", &[])?
    };
    if !answer.ok() {
        return fail(&answer);
    }
    if action == "delete" {
        match args.output {
            Output::Json => print_json(&json!({"name": name, "deleted": true}))?,
            Output::Table => println!("schedule {} deleted", crate::text::escape(name)),
        }
        return Ok(ExitCode::SUCCESS);
    }
    print_one(args.output, &answer.json()?)
}

fn print_one(output: Output, schedule: &Value) -> anyhow::Result<ExitCode> {
    if let Output::Json = output {
        print_json(schedule)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = table::new(&["FIELD", "VALUE"], table::Width::Terminal);
    let params: Vec<String> = schedule["params"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, value)| format!("{}={}", crate::text::escape(name), shown(value)))
        .collect();
    let upcoming: Vec<String> = schedule["upcoming"]
        .as_array()
        .into_iter()
        .flatten()
        .map(shown)
        .collect();
    let skip = match schedule["last_skip"].as_object() {
        Some(skip) => format!("{}: {}", shown(&skip["at"]), shown(&skip["reason"])),
        None => "-".to_string(),
    };
    for (field, value) in [
        ("name", shown(&schedule["name"])),
        ("cron", shown(&schedule["cron"])),
        ("timezone", shown(&schedule["timezone"])),
        ("pipeline", shown(&schedule["pipeline"])),
        ("params", or_dash(params.join(" "))),
        ("catch_up", shown(&schedule["catch_up"])),
        ("overlap", shown(&schedule["overlap"])),
        ("next fire", next_fire(schedule)),
        ("upcoming", or_dash(upcoming.join("\n"))),
        ("last run", last_run(schedule)),
        (
            "runs started",
            schedule["runs_started"].as_u64().unwrap_or(0).to_string(),
        ),
        (
            "fires skipped",
            schedule["fires_skipped"].as_u64().unwrap_or(0).to_string(),
        ),
        ("last skip", skip),
        ("created", shown(&schedule["created_at"])),
    ] {
        rows.add_row(vec![field.to_string(), value]);
    }
    table::print(&rows);
    Ok(ExitCode::SUCCESS)
}

fn next_fire(schedule: &Value) -> String {
    if schedule["paused"].as_bool() == Some(true) {
        return "paused".to_string();
    }
    match schedule["next_fire_local"].as_str() {
        Some(_) => shown(&schedule["next_fire_local"]),
        None => "-".to_string(),
    }
}

fn last_run(schedule: &Value) -> String {
    match schedule["last_run"].as_str() {
        Some(_) => format!(
            "{} ({})",
            shown(&schedule["last_run"]),
            match schedule["last_run_state"].as_str() {
                Some(_) => shown(&schedule["last_run_state"]),
                None => "cleaned up".to_string(),
            }
        ),
        None => "-".to_string(),
    }
}

fn or_dash(text: String) -> String {
    if text.is_empty() {
        "-".to_string()
    } else {
        text
    }
}
