//! The dashboard's pages as HTML text, built from the API's JSON answers. Every value
//! that came from the API (or a user) goes through `esc` or `attr`; nothing else is ever
//! put into the markup.

use std::collections::HashMap;
use std::fmt::Write;
use std::time::SystemTime;

use axum::http::StatusCode;
use serde_json::Value;

use super::Viewer;
use crate::api::auth::Permission;
use crate::cli::table::{self, age, run_took, took};
// A path segment or query value, percent-encoded (then safe in an attribute too).
use crate::text::url_encode as enc;

/// Text for an HTML text node or a quoted attribute value.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A string field of the API's JSON, escaped (empty when absent).
fn s(value: &Value) -> String {
    esc(value.as_str().unwrap_or_default())
}

/// A CSS class name from a state: only `[a-z_]` survives.
fn class_of(state: &str) -> String {
    state
        .chars()
        .filter(|c| c.is_ascii_lowercase() || *c == '_')
        .collect()
}

fn badge(state: &str) -> String {
    format!(
        "<span class=\"badge st-{}\">{}</span>",
        class_of(state),
        esc(&state.replace('_', " "))
    )
}

/// A page: its title, which navigation entry it is, the event stream that refreshes it,
/// and its main region (what a live refresh fetches alone).
pub struct View {
    pub title: String,
    pub nav: &'static str,
    pub live: Option<String>,
    pub main: String,
}

pub fn layout(viewer: &Viewer, view: View) -> String {
    let nav: String = [
        ("runs", "/ui/runs", "Runs"),
        ("queue", "/ui/queue", "Queue &amp; schedules"),
        ("operator", "/ui/operator", "Operator"),
    ]
    .iter()
    .map(|(key, href, label)| {
        let current = if *key == view.nav {
            " aria-current=\"page\""
        } else {
            ""
        };
        format!("<a href=\"{href}\"{current}>{label}</a>")
    })
    .collect();
    let live = view
        .live
        .map(|url| format!(" data-live=\"{}\"", esc(&url)))
        .unwrap_or_default();
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · Scarab</title>\
         <link rel=\"stylesheet\" href=\"/ui/assets/app.css\">\
         <script src=\"/ui/assets/app.js\" defer></script></head>\
         <body{live}><header class=\"top\"><a class=\"brand\" href=\"/ui/runs\">Scarab</a>\
         <nav>{nav}</nav><span class=\"who\" id=\"who\">{who} · {role}</span>\
         <form method=\"post\" action=\"/ui/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <button type=\"submit\" class=\"link\">Sign out</button></form></header>\
         <main id=\"main\">{main}</main></body></html>\n",
        title = esc(&view.title),
        who = esc(&viewer.caller.name),
        role = esc(viewer.caller.role.as_str()),
        csrf = esc(&viewer.csrf),
        main = view.main,
    )
}

fn bare(title: &str, main: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · Scarab</title><link rel=\"stylesheet\" href=\"/ui/assets/app.css\"></head>\
         <body><main id=\"main\" class=\"narrow\">{main}</main></body></html>\n",
        esc(title)
    )
}

pub fn login(problem: Option<&str>) -> String {
    let problem = problem
        .map(|p| format!("<p class=\"problem\" role=\"alert\">{}</p>", esc(p)))
        .unwrap_or_default();
    bare(
        "Sign in",
        &format!(
            "<h1>Scarab</h1><form method=\"post\" action=\"/ui/login\" class=\"login\">\
             <label for=\"token\">API token</label>\
             <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required autofocus>\
             <button type=\"submit\" id=\"sign-in\">Sign in</button>{problem}</form>\
             <p class=\"hint\">The admin token is <code>STATE_DIR/admin.token</code>; \
             read-only and approver tokens are configured as <code>[[tokens]]</code>.</p>"
        ),
    )
}

pub fn error(status: StatusCode, message: &str) -> String {
    bare(
        "Error",
        &format!(
            "<h1>{} {}</h1><p class=\"problem\">{}</p><p><a href=\"/ui/runs\">Back to the runs</a></p>",
            status.as_u16(),
            esc(status.canonical_reason().unwrap_or("")),
            esc(message)
        ),
    )
}

/// Why a run is where it is (`auto-retrying (1/2)`, `quarantined: …`, its category), as
/// the CLI says it.
fn why(run: &Value) -> String {
    esc(&table::why(run))
}

const STATES: [&str; 8] = [
    "queued",
    "running",
    "waiting",
    "succeeded",
    "failed",
    "dead_lettered",
    "cancelled",
    "quarantined",
];

pub struct RunsPage<'a> {
    pub runs: &'a [Value],
    pub state: Option<&'a str>,
    pub pipeline: Option<&'a str>,
    pub next: Option<&'a str>,
    pub positions: &'a HashMap<String, u64>,
    pub now: SystemTime,
}

pub fn runs(page: &RunsPage) -> View {
    let mut main = String::from("<h1>Runs</h1>");
    let options: String = std::iter::once(("", "every state"))
        .chain(STATES.iter().map(|s| (*s, *s)))
        .map(|(value, label)| {
            let selected =
                if page.state == Some(value) || (value.is_empty() && page.state.is_none()) {
                    " selected"
                } else {
                    ""
                };
            format!(
                "<option value=\"{value}\"{selected}>{}</option>",
                label.replace('_', " ")
            )
        })
        .collect();
    let _ = write!(
        main,
        "<form class=\"filters\" method=\"get\" action=\"/ui/runs\">\
         <label>State <select name=\"state\" id=\"filter-state\">{options}</select></label>\
         <label>Pipeline <input name=\"pipeline\" id=\"filter-pipeline\" value=\"{}\" placeholder=\"any\"></label>\
         <button type=\"submit\">Filter</button></form>",
        esc(page.pipeline.unwrap_or_default())
    );
    if page.runs.is_empty() {
        main.push_str("<p class=\"empty\">No runs.</p>");
    } else {
        main.push_str(
            "<table class=\"runs\"><thead><tr><th>Run</th><th>Pipeline</th><th>State</th>\
             <th>Age</th><th>Duration</th><th>Why</th></tr></thead><tbody>",
        );
        for run in page.runs {
            let id = run["id"].as_str().unwrap_or_default();
            let state = run["state"].as_str().unwrap_or_default();
            let position = page
                .positions
                .get(id)
                .map(|p| format!(" <span class=\"position\">#{p} in the queue</span>"))
                .unwrap_or_default();
            let _ = write!(
                main,
                "<tr class=\"run\" data-run=\"{}\"><td><a href=\"/ui/runs/{}\">{}</a></td><td>{}</td>\
                 <td>{}{position}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(id),
                enc(id),
                esc(id),
                s(&run["pipeline"]),
                badge(state),
                age(&run["created_at"], page.now),
                run_took(run, page.now),
                why(run),
            );
        }
        main.push_str("</tbody></table>");
    }
    if let Some(next) = page.next {
        let mut href = format!("/ui/runs?cursor={}", enc(next));
        if let Some(state) = page.state {
            href.push_str(&format!("&state={}", enc(state)));
        }
        if let Some(pipeline) = page.pipeline {
            href.push_str(&format!("&pipeline={}", enc(pipeline)));
        }
        let _ = write!(
            main,
            "<p class=\"more\"><a href=\"{}\" id=\"older\">Older runs →</a></p>",
            esc(&href)
        );
    }
    View {
        title: "Runs".into(),
        nav: "runs",
        live: Some("/ui/events".into()),
        main,
    }
}

/// A small form posting to `action` with the session's CSRF token.
fn form(
    viewer: &Viewer,
    action: &str,
    fields: &str,
    label: &str,
    id: &str,
    danger: bool,
) -> String {
    format!(
        "<form method=\"post\" action=\"{}\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">{fields}\
         <button type=\"submit\" id=\"{}\"{}>{}</button></form>",
        esc(action),
        esc(&viewer.csrf),
        esc(id),
        if danger { " class=\"danger\"" } else { "" },
        esc(label)
    )
}

pub fn run(viewer: &Viewer, run: &Value, history: &Value, now: SystemTime) -> View {
    let id = run["id"].as_str().unwrap_or_default();
    let state = run["state"].as_str().unwrap_or_default();
    let base = format!("/ui/runs/{}", enc(id));
    let mut main = format!(
        "<h1>Run <code>{}</code> {}</h1><p class=\"meta\">pipeline <strong>{}</strong> · origin {} · \
         created {} · updated {} · took {}</p>",
        esc(id),
        badge(state),
        s(&run["pipeline"]),
        s(&run["origin"]),
        s(&run["created_at"]),
        s(&run["updated_at"]),
        run_took(run, now),
    );
    let standing = why(run);
    if standing.starts_with("auto-retrying") || standing.starts_with("quarantined") {
        let _ = write!(main, "<p class=\"standing\">{standing}</p>");
    }
    let failure = table::failure_of(run);
    if !failure.is_empty() {
        let _ = write!(
            main,
            "<p class=\"failure\" id=\"failure\">{} <span class=\"category\">{}</span></p>",
            esc(&failure),
            s(&run["failure_classification"]["category"])
        );
    }
    // What this user may do to the run, as the API would allow it.
    let mut actions = String::new();
    if viewer.may(Permission::Write) {
        if !table::run_ended(run) {
            actions.push_str(&form(
                viewer,
                &format!("{base}/cancel"),
                "",
                "Cancel run",
                "cancel",
                true,
            ));
        }
        if table::run_ended(run) {
            let steps: String = run["steps"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|step| {
                    let name = step["name"].as_str().unwrap_or_default();
                    format!(
                        "<option value=\"{}\">from {}</option>",
                        esc(name),
                        esc(name)
                    )
                })
                .collect();
            let select = format!(
                "<select name=\"from\" aria-label=\"re-run from\"><option value=\"\">what did not succeed</option>{steps}</select>"
            );
            actions.push_str(&form(
                viewer,
                &format!("{base}/retry"),
                &select,
                "Retry",
                "retry",
                false,
            ));
        }
        if state == "quarantined" {
            actions.push_str(&form(
                viewer,
                &format!("{base}/requeue"),
                "",
                "Requeue",
                "requeue",
                false,
            ));
            actions.push_str(&form(
                viewer,
                &format!("{base}/discard"),
                "<input name=\"reason\" required placeholder=\"why\" aria-label=\"reason\">",
                "Discard",
                "discard",
                true,
            ));
        }
    }
    if !actions.is_empty() {
        let _ = write!(main, "<div class=\"actions\">{actions}</div>");
    }
    let steps = run["steps"].as_array().cloned().unwrap_or_default();
    let _ = write!(
        main,
        "<section><h2>Graph</h2>{}</section>",
        super::dag::svg(&steps, &base)
    );
    main.push_str("<section><h2>Steps</h2>");
    for step in &steps {
        main.push_str(&step_section(viewer, &base, step, now));
    }
    main.push_str("</section>");
    main.push_str("<section><h2>History</h2><ol class=\"history\">");
    for event in history["events"].as_array().into_iter().flatten() {
        let detail = event["detail"]
            .as_object()
            .map(|fields| {
                fields
                    .iter()
                    .map(|(k, v)| {
                        let v = match v {
                            Value::String(text) => text.clone(),
                            other => other.to_string(),
                        };
                        format!("{}={}", esc(k), esc(&v))
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let _ = write!(
            main,
            "<li><time>{}</time> <strong>{}</strong> {detail}</li>",
            s(&event["at"]),
            s(&event["kind"])
        );
    }
    main.push_str("</ol></section>");
    View {
        title: format!("Run {id}"),
        nav: "runs",
        live: Some(format!("/ui/events?run={}", enc(id))),
        main,
    }
}

fn step_section(viewer: &Viewer, base: &str, step: &Value, now: SystemTime) -> String {
    let name = step["name"].as_str().unwrap_or_default();
    let state = step["state"].as_str().unwrap_or_default();
    let mut out = format!(
        "<article class=\"step\" id=\"step-{}\"><h3>{} {} <small>{}</small></h3>",
        esc(name),
        esc(name),
        badge(state),
        s(&step["executor"])
    );
    if let Some(gate) = step["gate"].as_object() {
        let text = |key: &str| gate.get(key).and_then(Value::as_str);
        if let Some(decision) = gate.get("decision").and_then(Value::as_object) {
            let field = |key: &str| esc(decision.get(key).and_then(Value::as_str).unwrap_or(""));
            let _ = write!(
                out,
                "<p class=\"gate\">Gate {} by {} at {}{}</p>",
                field("outcome"),
                field("by"),
                field("at"),
                decision
                    .get("comment")
                    .and_then(Value::as_str)
                    .map(|c| format!(": “{}”", esc(c)))
                    .unwrap_or_default()
            );
        } else if let Some(opened) = text("opened_at") {
            let _ = write!(
                out,
                "<p class=\"gate\">Gate waiting since {}{}{}{}</p>",
                esc(opened),
                text("auto_release_at")
                    .map(|t| format!(", auto-release at {}", esc(t)))
                    .unwrap_or_default(),
                text("expires_at")
                    .map(|t| format!(", expires at {}", esc(t)))
                    .unwrap_or_default(),
                text("message")
                    .map(|m| format!(" — {}", esc(m)))
                    .unwrap_or_default(),
            );
            if viewer.may(Permission::Approve) {
                let comment =
                    "<input name=\"comment\" placeholder=\"comment\" aria-label=\"comment\">";
                let gate_base = format!("{base}/gates/{}", enc(name));
                out.push_str("<div class=\"actions\">");
                out.push_str(&form(
                    viewer,
                    &format!("{gate_base}/approve"),
                    comment,
                    "Approve",
                    &format!("approve-{name}"),
                    false,
                ));
                out.push_str(&form(
                    viewer,
                    &format!("{gate_base}/reject"),
                    comment,
                    "Reject",
                    &format!("reject-{name}"),
                    true,
                ));
                out.push_str("</div>");
            }
        } else {
            out.push_str("<p class=\"gate\">Gate not reached yet</p>");
        }
    }
    if let Some(wait) = step["waiting_for"].as_object() {
        let field = |key: &str| esc(&wait.get(key).map(value_text).unwrap_or_default());
        let _ = write!(
            out,
            "<p class=\"waiting\">Waits for {} {} (position {}) for {}</p>",
            field("reason"),
            field("name"),
            field("position"),
            wait.get("since")
                .map(|since| age(since, now))
                .unwrap_or_default()
        );
    }
    let attempts = step["attempts"].as_array().cloned().unwrap_or_default();
    if step["earlier_attempts"].as_u64().unwrap_or(0) > 0 {
        let _ = write!(
            out,
            "<p class=\"earlier\">{} earlier attempt(s) of an earlier try (in the history)</p>",
            step["earlier_attempts"]
        );
    }
    if !attempts.is_empty() {
        out.push_str(
            "<table class=\"attempts\"><thead><tr><th>#</th><th>Fence</th><th>Class</th>\
             <th>Reason</th><th>Exit</th><th>Start</th><th>End</th><th>Duration</th>\
             <th>Started</th></tr></thead><tbody>",
        );
        for attempt in &attempts {
            let class = attempt["class"].as_str();
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                attempt["number"],
                attempt["fence"],
                class.map_or_else(
                    || "–".to_string(),
                    |c| format!("<span class=\"class cl-{}\">{}</span>", class_of(c), esc(c))
                ),
                s(&attempt["reason"]),
                attempt["exit_code"]
                    .as_i64()
                    .map_or_else(|| "–".to_string(), |c| c.to_string()),
                s(&attempt["started_at"]),
                s(&attempt["finished_at"]),
                took(&attempt["started_at"], &attempt["finished_at"], now),
                if attempt["started"] == true {
                    "yes"
                } else {
                    "no"
                },
            );
        }
        out.push_str("</tbody></table>");
        // Outputs of the latest attempt.
        if let Some(outputs) = attempts
            .last()
            .and_then(|a| a["outputs"].as_object())
            .filter(|o| !o.is_empty())
        {
            out.push_str("<dl class=\"outputs\">");
            for (key, value) in outputs {
                let _ = write!(
                    out,
                    "<dt>{}</dt><dd>{}</dd>",
                    esc(key),
                    esc(value.as_str().unwrap_or_default())
                );
            }
            out.push_str("</dl>");
        }
        for (index, attempt) in attempts.iter().enumerate() {
            let number = attempt["number"].as_u64().unwrap_or(0);
            let open = if index + 1 == attempts.len() {
                " open"
            } else {
                ""
            };
            let log = format!("{base}/log?step={}&attempt={number}", enc(name));
            let _ = write!(
                out,
                "<details class=\"logs\"{open}><summary>Log of attempt {number}</summary>\
                 <pre class=\"log\" data-log=\"{}\" id=\"log-{}-{number}\"></pre>\
                 <pre class=\"log stderr\" data-log=\"{}&amp;stream=stderr\"></pre></details>",
                esc(&log),
                esc(name),
                esc(&log),
            );
        }
    }
    out.push_str("</article>");
    out
}

/// The requeue and discard (with a reason) forms of a dead letter or a quarantined run at
/// `base`, for a user who may write; nothing for others. `id` names the buttons.
fn requeue_or_discard(viewer: &Viewer, base: &str, id: &str) -> String {
    if !viewer.may(Permission::Write) {
        return String::new();
    }
    let reason = "<input name=\"reason\" required placeholder=\"why\" aria-label=\"reason\">";
    format!(
        "{}{}",
        form(
            viewer,
            &format!("{base}/requeue"),
            "",
            "Requeue",
            &format!("requeue-{id}"),
            false
        ),
        form(
            viewer,
            &format!("{base}/discard"),
            reason,
            "Discard",
            &format!("discard-{id}"),
            true
        )
    )
}

fn value_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

pub fn queue(queue: &Value, schedules: &Value, now: SystemTime) -> View {
    let mut main = String::from("<h1>Queue</h1><div class=\"cards\">");
    for pool in queue["pools"].as_array().into_iter().flatten() {
        let _ = write!(
            main,
            "<div class=\"card\"><h3>pool {}</h3><p><strong>{}</strong> of {} slots in use</p></div>",
            s(&pool["name"]),
            pool["used"],
            pool["limit"]
        );
    }
    for lock in queue["locks"].as_array().into_iter().flatten() {
        let _ = write!(
            main,
            "<div class=\"card\"><h3>lock {}</h3><p><strong>{}</strong> of {} held</p></div>",
            s(&lock["name"]),
            lock["held"],
            lock["limit"]
        );
    }
    main.push_str("</div>");
    let queued = queue["queued"].as_array().cloned().unwrap_or_default();
    if queued.is_empty() {
        main.push_str("<p class=\"empty\">Nothing waits.</p>");
    } else {
        main.push_str(
            "<table><thead><tr><th>Position</th><th>Run</th><th>Step</th><th>Waits for</th>\
             <th>Name</th><th>Waiting</th></tr></thead><tbody>",
        );
        for entry in &queued {
            let run = entry["run"].as_str().unwrap_or_default();
            let _ = write!(
                main,
                "<tr><td>{}</td><td><a href=\"/ui/runs/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                entry["position"],
                enc(run),
                esc(run),
                s(&entry["step"]),
                s(&entry["reason"]),
                s(&entry["name"]),
                age(&entry["since"], now)
            );
        }
        main.push_str("</tbody></table>");
    }
    main.push_str("<h1>Schedules</h1>");
    let list = schedules["schedules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if list.is_empty() {
        main.push_str("<p class=\"empty\">No schedules.</p>");
    } else {
        main.push_str(
            "<table><thead><tr><th>Name</th><th>Cron</th><th>Time zone</th><th>Pipeline</th>\
             <th>Next fire</th><th>Last run</th></tr></thead><tbody>",
        );
        for schedule in &list {
            let next = if schedule["paused"] == true {
                "paused".to_string()
            } else {
                s(&schedule["next_fire_local"])
            };
            let last = match schedule["last_run"].as_str() {
                Some(run) => format!(
                    "<a href=\"/ui/runs/{}\">{}</a> {}",
                    enc(run),
                    esc(run),
                    badge(schedule["last_run_state"].as_str().unwrap_or_default())
                ),
                None => "–".to_string(),
            };
            let _ = write!(
                main,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{next}</td><td>{last}</td></tr>",
                s(&schedule["name"]),
                s(&schedule["cron"]),
                s(&schedule["timezone"]),
                s(&schedule["pipeline"]),
            );
        }
        main.push_str("</tbody></table>");
    }
    View {
        title: "Queue and schedules".into(),
        nav: "queue",
        live: Some("/ui/events".into()),
        main,
    }
}

pub fn operator(viewer: &Viewer, letters: &Value, quarantined: &Value, ready: &Value) -> View {
    let mut main = String::from("<h1>Service</h1><div class=\"cards\">");
    let _ = write!(
        main,
        "<div class=\"card\"><h3>readiness</h3><p>{}</p>{}</div>",
        if ready["ready"] == true {
            "<strong class=\"ok\">ready</strong>".to_string()
        } else {
            format!(
                "<strong class=\"bad\">not ready</strong>: {}",
                s(&ready["reason"])
            )
        },
        ready["outbox_depth"]
            .as_u64()
            .map(|d| format!("<p>{d} message(s) in the outbox</p>"))
            .unwrap_or_default()
    );
    for (name, executor) in ready["executors"].as_object().into_iter().flatten() {
        let _ = write!(
            main,
            "<div class=\"card\"><h3>executor {}</h3><p>{}</p></div>",
            esc(name),
            if executor["available"] == true {
                "<strong class=\"ok\">available</strong>".to_string()
            } else {
                format!(
                    "<strong class=\"bad\">unavailable</strong>: {}",
                    s(&executor["last_error"])
                )
            }
        );
    }
    if let Some(isolation) = ready["step_isolation"].as_str() {
        let _ = write!(
            main,
            "<div class=\"card\"><h3>step isolation</h3><p>{}</p></div>",
            esc(isolation)
        );
    }
    let stuck = ready["progress"]["stuck"].as_array().map_or(0, Vec::len);
    let _ = write!(
        main,
        "<div class=\"card\"><h3>forward progress</h3><p>{stuck} stuck run(s)</p></div></div>"
    );

    main.push_str("<h1>Dead-letter queue</h1>");
    let list = letters["dead_letters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if list.is_empty() {
        main.push_str("<p class=\"empty\">No dead letters.</p>");
    } else {
        main.push_str(
            "<table><thead><tr><th>Id</th><th>Kind</th><th>Run</th><th>Category</th>\
             <th>Deliveries</th><th>Last error</th><th></th></tr></thead><tbody>",
        );
        for letter in &list {
            let id = letter["id"].to_string();
            let run = letter["run"].as_str().unwrap_or_default();
            let actions = requeue_or_discard(
                viewer,
                &format!("/ui/dlq/{}", enc(&id)),
                &format!("dlq-{id}"),
            );
            let _ = write!(
                main,
                "<tr><td>{}</td><td>{}</td><td><a href=\"/ui/runs/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{actions}</td></tr>",
                esc(&id),
                s(&letter["kind"]),
                enc(run),
                esc(run),
                s(&letter["category"]),
                letter["deliveries"],
                s(&letter["last_error"]),
            );
        }
        main.push_str("</tbody></table>");
    }
    main.push_str("<h1>Quarantine</h1>");
    let runs = quarantined["runs"].as_array().cloned().unwrap_or_default();
    if runs.is_empty() {
        main.push_str("<p class=\"empty\">No quarantined runs.</p>");
    } else {
        main.push_str(
            "<table><thead><tr><th>Run</th><th>Pipeline</th><th>Why</th><th>Failure</th><th></th></tr></thead><tbody>",
        );
        for run in &runs {
            let id = run["id"].as_str().unwrap_or_default();
            let actions = requeue_or_discard(viewer, &format!("/ui/runs/{}", enc(id)), id);
            let _ = write!(
                main,
                "<tr><td><a href=\"/ui/runs/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{actions}</td></tr>",
                enc(id),
                esc(id),
                s(&run["pipeline"]),
                why(run),
                esc(&table::failure_of(run)),
            );
        }
        main.push_str("</tbody></table>");
    }
    View {
        title: "Operator".into(),
        nav: "operator",
        live: Some("/ui/events".into()),
        main,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_from_the_api_is_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        assert_eq!(
            class_of("dead_lettered\" onclick=x"),
            "dead_letteredonclickx"
        );
        let runs = vec![serde_json::json!({
            "id": "r1\"><img src=x>", "pipeline": "<b>p</b>", "state": "failed",
            "created_at": "2026-12-04T10:00:00Z", "updated_at": "2026-12-04T10:00:01Z",
            "failure_classification": {"category": "step<i>", "step": "s", "reason": "r"},
            "auto_retry": {"attempts": 0, "max": 0, "quarantined": false}
        })];
        let view = runs_view(&runs);
        assert!(
            !view.contains("<b>p</b>") && view.contains("&lt;b&gt;p&lt;/b&gt;"),
            "{view}"
        );
        assert!(!view.contains("<img") && !view.contains("<i>"), "{view}");
    }

    fn runs_view(runs: &[Value]) -> String {
        runs_page(runs).main
    }

    fn runs_page(runs: &[Value]) -> View {
        super::runs(&RunsPage {
            runs,
            state: None,
            pipeline: None,
            next: None,
            positions: &HashMap::new(),
            now: SystemTime::now(),
        })
    }
}
