//! Client commands: thin HTTP calls to a running service, tables for people and
//! `-o json` for scripts.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use serde_json::Value;

use super::{ClientArgs, Output, table};

pub(super) struct Client {
    agent: ureq::Agent,
    /// Whom HTTPS trusts (`--ca-cert`, else the system's roots).
    tls: ureq::tls::TlsConfig,
    base: String,
    token: String,
}

pub(super) struct Answer {
    status: u16,
    /// Logs may hold any bytes; everything else is JSON text.
    bytes: Vec<u8>,
    body: String,
    headers: ureq::http::HeaderMap,
}

impl Answer {
    pub(super) fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("the service answered {} with non-JSON", self.status))
    }

    pub(super) fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The service's error message, as the user should read it.
    fn error(&self) -> String {
        match serde_json::from_str::<Value>(&self.body) {
            Ok(body) => match body.get("errors").and_then(Value::as_array) {
                Some(errors) if !errors.is_empty() => errors
                    .iter()
                    .map(|e| {
                        let field = shown(&e["field"]);
                        let line = e["line"]
                            .as_u64()
                            .map(|l| format!(" (line {l})"))
                            .unwrap_or_default();
                        format!("{field}{line}: {}", shown(&e["message"]))
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => {
                    let error = shown_or(&body["error"], &self.body);
                    // A refusal naming its field says which: `params.tag: …`.
                    match body["field"].as_str() {
                        Some(field) if !field.is_empty() => {
                            format!("{}: {error}", shown(&body["field"]))
                        }
                        _ => error,
                    }
                }
            },
            Err(_) => self.body.clone(),
        }
    }
}

impl Client {
    pub(super) fn new(args: &ClientArgs) -> anyhow::Result<Client> {
        let base = base_url(&args.url)?;
        let token = match (&args.token, &args.state_dir) {
            (Some(token), _) => token.clone(),
            (None, Some(dir)) => {
                let path = dir.join("admin.token");
                std::fs::read_to_string(&path)
                    .with_context(|| format!("reading the admin token from {}", path.display()))?
                    .trim()
                    .to_string()
            }
            (None, None) => bail!("no token: pass --token (or SCARAB_TOKEN) or --state-dir"),
        };
        if args.ca_cert.is_some() && !base.starts_with("https://") {
            bail!("--ca-cert is for an https:// --url (this one is {base})");
        }
        let tls = crate::tls::client_config(args.ca_cert.as_deref()).map_err(anyhow::Error::msg)?;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .tls_config(tls.clone())
            .build()
            .into();
        Ok(Client {
            agent,
            tls,
            base,
            token,
        })
    }

    pub(super) fn get(&self, path: &str) -> anyhow::Result<Answer> {
        let response = self
            .agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .call()
            .with_context(|| format!("calling {}", self.base))?;
        answer(response)
    }

    pub(super) fn post(
        &self,
        path: &str,
        content_type: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Answer> {
        let mut request = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .header("Content-Type", content_type);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request
            .send(body)
            .with_context(|| format!("calling {}", self.base))?;
        answer(response)
    }
}

impl Client {
    pub(super) fn delete(&self, path: &str) -> anyhow::Result<Answer> {
        let response = self
            .agent
            .delete(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .call()
            .with_context(|| format!("calling {}", self.base))?;
        answer(response)
    }
}

/// `--url` checked before anything is sent: a scheme and a host, nothing after the path.
fn base_url(url: &str) -> anyhow::Result<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!("--url {url}: no scheme; write http://{url} (or https://…)");
    };
    if !matches!(scheme, "http" | "https") {
        bail!("--url {url}: the scheme must be http or https, not {scheme:?}");
    }
    if rest.is_empty() || rest.starts_with('/') {
        bail!("--url {url}: no host");
    }
    if rest.contains(['?', '#']) {
        bail!("--url {url}: a base URL has no query or fragment");
    }
    Ok(url.trim_end_matches('/').to_string())
}

fn answer(mut response: ureq::http::Response<ureq::Body>) -> anyhow::Result<Answer> {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response
        .body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_vec()
        .context("reading the answer")?;
    let body = String::from_utf8_lossy(&bytes).into_owned();
    Ok(Answer {
        status,
        bytes,
        body,
        headers,
    })
}

/// 4xx for bad input exits 2 (as `validate` does); anything else failing exits 1.
pub(super) fn fail(answer: &Answer) -> anyhow::Result<ExitCode> {
    eprintln!("{}", answer.error());
    Ok(ExitCode::from(if (400..500).contains(&answer.status) {
        2
    } else {
        1
    }))
}

/// A string of the server's answer as the terminal may show it (`text::escape`): empty
/// when it is not a string.
pub(super) fn shown(value: &Value) -> String {
    shown_or(value, "")
}

fn shown_or(value: &Value, otherwise: &str) -> String {
    crate::text::escape(value.as_str().unwrap_or(otherwise)).into_owned()
}

pub(super) fn print_json(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn submit(
    args: &ClientArgs,
    file: &Path,
    quiet: bool,
    wait: bool,
    idempotency_key: Option<&str>,
    origin: Option<&str>,
    query: &str,
) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let body = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let content_type = match file.extension().and_then(|e| e.to_str()) {
        Some("json") => "application/json",
        _ => "application/yaml",
    };
    let headers: Vec<(&str, &str)> = idempotency_key
        .map(|k| ("Idempotency-Key", k))
        .into_iter()
        .chain(origin.map(|o| ("X-Scarab-Origin", o)))
        .collect();
    let answer = client.post(&format!("/v1/runs{query}"), content_type, &body, &headers)?;
    if !answer.ok() {
        return fail(&answer);
    }
    let value = answer.json()?;
    if !quiet {
        for warning in value["warnings"].as_array().into_iter().flatten() {
            eprintln!("warning: {}", warning.as_str().unwrap_or_default());
        }
    }
    let id = value["id"].as_str().unwrap_or_default().to_string();
    if wait {
        // The id first (a script may want it), then the run followed to its end.
        println!("{id}");
        let _ = std::io::stdout().flush();
        return follow(&client, &id, Output::Table);
    }
    match args.output {
        Output::Json if !quiet => print_json(&value)?,
        _ => println!("{id}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `scarab watch RUN`: the run followed to its end.
pub fn watch(args: &ClientArgs, run: &str) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    follow(&client, run, args.output)
}

/// How long `follow` keeps trying while the service cannot be reached (a restart).
const FOLLOW_UNREACHABLE_MAX: Duration = Duration::from_secs(60);

/// Polls the run every 300 ms with the live progress on stderr (as `scarab run` shows
/// it) until it ends; then its verdict on stderr (and with `-o json` the run detail on
/// stdout). Exit 0 when it succeeded, 1 when it ended otherwise. A service that cannot be
/// reached (restarting) is waited for up to a minute.
fn follow(client: &Client, run: &str, output: Output) -> anyhow::Result<ExitCode> {
    let mut progress = super::live::Progress::new();
    let mut unreachable_since: Option<std::time::Instant> = None;
    loop {
        let answer = match client.get(&format!("/v1/runs/{run}")) {
            Ok(answer) => {
                unreachable_since = None;
                answer
            }
            Err(error) => {
                let since = *unreachable_since.get_or_insert_with(|| {
                    eprintln!("the service cannot be reached ({error:#}); trying again");
                    std::time::Instant::now()
                });
                if since.elapsed() > FOLLOW_UNREACHABLE_MAX {
                    return Err(error.context("the service stayed unreachable for a minute"));
                }
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        if !answer.ok() {
            return fail(&answer);
        }
        let detail = answer.json()?;
        progress.show(&super::live::View::of_detail(&detail));
        let state = detail["state"].as_str().unwrap_or_default();
        if table::run_ended(&detail) {
            eprintln!(
                "{}",
                super::live::verdict_line(run, state, &table::failure_of(&detail))
            );
            if let Output::Json = output {
                print_json(&detail)?;
            }
            return Ok(if state == "succeeded" {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            });
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

pub fn runs(
    args: &ClientArgs,
    state: Option<&str>,
    limit: usize,
    cursor: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let mut path = format!("/v1/runs?limit={limit}");
    if let Some(state) = state {
        path.push_str(&format!("&state={state}"));
    }
    if let Some(cursor) = cursor {
        path.push_str(&format!("&cursor={cursor}"));
    }
    let answer = client.get(&path)?;
    if !answer.ok() {
        return fail(&answer);
    }
    let value = answer.json()?;
    if let Output::Json = args.output {
        print_json(&value)?;
        return Ok(ExitCode::SUCCESS);
    }
    print!(
        "{}",
        render_runs(&value, SystemTime::now(), table::Width::Terminal)
    );
    Ok(ExitCode::SUCCESS)
}

/// `scarab runs` for people: a page of runs, how old each is and how long it took (or
/// has taken so far), and why it did not succeed.
pub(super) fn render_runs(page: &Value, now: SystemTime, width: table::Width) -> String {
    let mut rows = table::new(&["ID", "PIPELINE", "STATE", "AGE", "TOOK", "WHY"], width);
    table::keep_whole(&mut rows, &[0, 2, 3, 4]);
    for run in page["runs"].as_array().into_iter().flatten() {
        rows.add_row(vec![
            shown(&run["id"]),
            shown(&run["pipeline"]),
            shown(&run["state"]),
            table::age(&run["created_at"], now),
            table::run_took(run, now),
            table::why(run),
        ]);
    }
    let mut text = table::render(&rows);
    if let Some(next) = page["next_cursor"].as_str() {
        text.push_str(&format!("(more: --cursor {})\n", crate::text::escape(next)));
    }
    text
}

/// A gate in `scarab show`: who decided what and when, or what it waits for.
fn gate_line(gate: &serde_json::Map<String, serde_json::Value>) -> String {
    crate::text::escape(&gate_text(gate)).into_owned()
}

fn gate_text(gate: &serde_json::Map<String, serde_json::Value>) -> String {
    let text = |key: &str| gate.get(key).and_then(|v| v.as_str());
    if let Some(decision) = gate.get("decision").and_then(|d| d.as_object()) {
        let field = |key: &str| decision.get(key).and_then(|v| v.as_str()).unwrap_or("");
        let mut line = format!(
            "gate {} by {} at {}",
            field("outcome"),
            field("by"),
            field("at")
        );
        if let Some(comment) = decision.get("comment").and_then(|c| c.as_str()) {
            line.push_str(&format!(": {comment}"));
        }
        return line;
    }
    let Some(opened) = text("opened_at") else {
        return "gate not reached yet".to_string();
    };
    let mut line = format!("gate waiting since {opened}");
    if let Some(at) = text("auto_release_at") {
        line.push_str(&format!(", auto-release at {at}"));
    }
    if let Some(at) = text("expires_at") {
        line.push_str(&format!(", expires at {at}"));
    }
    if let Some(message) = text("message") {
        line.push_str(&format!(" — {message}"));
    }
    line
}

pub fn show(args: &ClientArgs, run: &str) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let answer = client.get(&format!("/v1/runs/{run}"))?;
    if !answer.ok() {
        return fail(&answer);
    }
    let value = answer.json()?;
    if let Output::Json = args.output {
        print_json(&value)?;
        return Ok(ExitCode::SUCCESS);
    }
    print!(
        "{}",
        render_show(&value, SystemTime::now(), table::Width::Terminal)
    );
    Ok(ExitCode::SUCCESS)
}

/// `scarab show` for people: the run, why it did not succeed (a sentence), and a table
/// of its steps with one row per attempt; a step's name and state only on its first row,
/// the CLASS column only ever a failure class (`-` while there is none).
pub(super) fn render_show(run: &Value, now: SystemTime, width: table::Width) -> String {
    let state = shown(&run["state"]);
    let mut text = format!(
        "run {}  pipeline {}  state {state}\ncreated {}  updated {}  took {}\n",
        shown(&run["id"]),
        shown(&run["pipeline"]),
        shown(&run["created_at"]),
        shown(&run["updated_at"]),
        table::run_took(run, now),
    );
    let standing = table::why(run);
    if standing.starts_with("auto-retrying") || standing.starts_with("quarantined") {
        text.push_str(&format!("{standing}\n"));
    }
    let failure = table::failure_of(run);
    if !failure.is_empty() {
        let retryable = if run["failure_classification"]["auto_retryable"] == true {
            "auto-retryable"
        } else {
            "not auto-retryable"
        };
        text.push_str(&format!("{failure} ({retryable})\n"));
    }
    let mut rows = table::new(
        &[
            "STEP", "STATE", "ATTEMPT", "FENCE", "CLASS", "EXIT", "TOOK", "REASON",
        ],
        width,
    );
    table::keep_whole(&mut rows, &[1, 2, 3, 4, 5, 6]);
    for step in run["steps"].as_array().into_iter().flatten() {
        let mut name = shown(&step["name"]);
        let mut state = shown(&step["state"]);
        let mut first = |rest: [String; 6]| {
            let mut row = vec![std::mem::take(&mut name), std::mem::take(&mut state)];
            row.extend(rest);
            rows.add_row(row);
        };
        let blank = || ["", "", "", "", ""].map(String::from);
        if let Some(gate) = step["gate"].as_object() {
            let [a, b, c, d, e] = blank();
            first([a, b, c, d, e, gate_line(gate)]);
            continue;
        }
        if let Some(wait) = step["waiting_for"].as_object() {
            let [a, b, c, d, e] = blank();
            first([
                a,
                b,
                c,
                d,
                e,
                format!(
                    "waits for {} {} (position {}) for {}",
                    shown(&wait["reason"]),
                    shown(&wait["name"]),
                    wait["position"],
                    table::age(&wait["since"], now)
                ),
            ]);
        }
        let attempts = step["attempts"].as_array().cloned().unwrap_or_default();
        if attempts.is_empty() && !step["waiting_for"].is_object() {
            let [a, b, c, d, e] = blank();
            first([a, b, c, d, e, shown(&step["reason"])]);
        }
        for attempt in &attempts {
            first([
                attempt["number"].to_string(),
                attempt["fence"].to_string(),
                shown_or(&attempt["class"], "-"),
                attempt["exit_code"]
                    .as_i64()
                    .map_or_else(|| "-".to_string(), |c| c.to_string()),
                table::took(&attempt["started_at"], &attempt["finished_at"], now),
                shown(&attempt["reason"]),
            ]);
        }
    }
    text.push('\n');
    text.push_str(&table::render(&rows));
    text
}

pub fn logs(
    args: &ClientArgs,
    run: &str,
    step: &str,
    stream: &str,
    attempt: Option<u32>,
    follow: bool,
) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let client = &client;
    let mut offset = 0u64;
    let mut said_waiting = false;
    let mut out = std::io::stdout().lock();
    loop {
        let mut path = format!("/v1/runs/{run}/steps/{step}/logs?stream={stream}&offset={offset}");
        if let Some(n) = attempt {
            path.push_str(&format!("&attempt={n}"));
        }
        let answer = client.get(&path)?;
        if follow && attempt.is_none() && not_started(client, run, &answer)? {
            if !said_waiting {
                eprintln!("waiting for step {step} to start");
                said_waiting = true;
            }
            std::thread::sleep(Duration::from_millis(300));
            continue;
        }
        if !answer.ok() {
            return fail(&answer);
        }
        out.write_all(&answer.bytes)?;
        out.flush()?;
        offset = header_u64(&answer, "x-scarab-next-offset").unwrap_or(offset);
        let finished = answer
            .headers
            .get("x-scarab-attempt-finished")
            .and_then(|v| v.to_str().ok())
            == Some("true");
        let size = header_u64(&answer, "x-scarab-log-size").unwrap_or(0);
        if !follow || (finished && offset >= size) {
            return Ok(ExitCode::SUCCESS);
        }
        if offset >= size {
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// The step has no attempt yet (404 naming `attempt`) and its run is still in progress:
/// `--follow` waits for it.
fn not_started(client: &Client, run: &str, answer: &Answer) -> anyhow::Result<bool> {
    if answer.status != 404 || answer.json().ok().is_none_or(|b| b["field"] != "attempt") {
        return Ok(false);
    }
    let detail = client.get(&format!("/v1/runs/{run}"))?;
    let state = detail.json().ok().map(|d| d["state"].clone());
    Ok(detail.ok()
        && state.is_some_and(|s| matches!(s.as_str(), Some("queued" | "running" | "waiting"))))
}

/// `scarab logs RUN`: every step's log of its latest attempt, in pipeline order, each
/// line prefixed with the step's name; steps that never ran are left out.
pub fn logs_of_every_step(args: &ClientArgs, run: &str, stream: &str) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let answer = client.get(&format!("/v1/runs/{run}"))?;
    if !answer.ok() {
        return fail(&answer);
    }
    let detail = answer.json()?;
    let steps: Vec<&Value> = detail["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["attempts"].as_array().is_some_and(|a| !a.is_empty()))
        .collect();
    let width = steps
        .iter()
        .filter_map(|s| s["name"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(0);
    let mut out = std::io::stdout().lock();
    for step in steps {
        let name = step["name"].as_str().unwrap_or_default();
        let mut log = Vec::new();
        loop {
            let answer = client.get(&format!(
                "/v1/runs/{run}/steps/{name}/logs?stream={stream}&offset={}",
                log.len()
            ))?;
            if answer.status == 410 {
                log = b"(log no longer kept)".to_vec();
                break;
            }
            if !answer.ok() {
                return fail(&answer);
            }
            log.extend_from_slice(&answer.bytes);
            let size = header_u64(&answer, "x-scarab-log-size").unwrap_or(0);
            if answer.bytes.is_empty() || log.len() as u64 >= size {
                break;
            }
        }
        let text = String::from_utf8_lossy(&log);
        for line in text.lines() {
            writeln!(out, "{name:<width$} | {line}")?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn header_u64(answer: &Answer, name: &str) -> Option<u64> {
    answer.headers.get(name)?.to_str().ok()?.parse().ok()
}

pub fn cancel(args: &ClientArgs, run: &str) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let answer = client.post(
        &format!("/v1/runs/{run}/cancel"),
        "application/json",
        br#"{"by":"cli"}"#,
        &[],
    )?;
    if !answer.ok() {
        return fail(&answer);
    }
    match args.output {
        Output::Json => print_json(&answer.json()?)?,
        Output::Table => println!("cancel requested for {run}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `scarab retry RUN [--from STEP]`: prints the steps that start over.
pub fn retry(args: &ClientArgs, run: &str, from: Option<&str>) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let body = serde_json::json!({"by": "cli", "from": from});
    let answer = client.post(
        &format!("/v1/runs/{run}/retry"),
        "application/json",
        body.to_string().as_bytes(),
        &[],
    )?;
    if !answer.ok() {
        return fail(&answer);
    }
    let json = answer.json()?;
    match args.output {
        Output::Json => print_json(&json)?,
        Output::Table => {
            let steps: Vec<&str> = json["steps"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str())
                .collect();
            println!("retrying {run}: {}", steps.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `scarab requeue RUN` and `scarab discard RUN --reason WHY` for quarantined runs.
pub fn run_action(
    args: &ClientArgs,
    run: &str,
    action: &str,
    reason: Option<&str>,
) -> anyhow::Result<ExitCode> {
    post_action(
        args,
        &format!("/v1/runs/{run}/{action}"),
        &format!("run {run}"),
        action,
        reason,
    )
}

/// POSTs `{"by": "cli", "reason": …}` to an operator action and reports it.
fn post_action(
    args: &ClientArgs,
    path: &str,
    what: &str,
    action: &str,
    reason: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let body = serde_json::json!({"by": "cli", "reason": reason}).to_string();
    let answer = client.post(path, "application/json", body.as_bytes(), &[])?;
    if !answer.ok() {
        return fail(&answer);
    }
    match args.output {
        Output::Json => print_json(&answer.json()?)?,
        Output::Table => println!("{what}: {action} done"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `scarab backup --out FILE`: the service writes a consistent snapshot while it runs; it
/// is streamed here, fsynced, verified by reopening it read-only (row counts must equal
/// the service's), and only then renamed to FILE.
pub fn backup(args: &ClientArgs, out: &Path) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let client = Client::new(args)?;
    anyhow::ensure!(
        !out.exists(),
        "{} already exists; choose a new file",
        out.display()
    );
    let partial = out.with_extension("partial");
    // A snapshot may be large: no overall timeout, only on connecting and on silence.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(10)))
        .timeout_recv_body(Some(Duration::from_secs(600)))
        .tls_config(client.tls.clone())
        .build()
        .into();
    let mut response = agent
        .post(format!("{}/v1/backup", client.base))
        .header("Authorization", format!("Bearer {}", client.token))
        .send_empty()
        .with_context(|| format!("calling {}", client.base))?;
    if !response.status().is_success() {
        let answer = answer(response)?;
        return fail(&answer);
    }
    let expected = response
        .headers()
        .get(crate::api::dto::BACKUP_COUNTS_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .context("the service sent no row counts")?;
    use std::os::unix::fs::OpenOptionsExt;
    // A backup holds everything the store does (pipelines with their env, step tokens'
    // inputs): private whatever the umask.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let written = std::io::copy(&mut response.body_mut().as_reader(), &mut file)
        .context("receiving the snapshot")?;
    file.flush()?;
    file.sync_all()?;
    drop(file);
    let verified = crate::store::verify_file(&partial);
    let counts = match verified {
        Ok((counts, _)) => crate::api::dto::backup_counts(&counts),
        Err(error) => {
            let _ = std::fs::remove_file(&partial);
            bail!("the snapshot does not verify: {error}");
        }
    };
    if counts != expected {
        let _ = std::fs::remove_file(&partial);
        bail!("the snapshot's rows ({counts}) differ from the service's ({expected})");
    }
    std::fs::rename(&partial, out)?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    match args.output {
        Output::Json => print_json(&serde_json::json!({
            "file": out.display().to_string(), "bytes": written, "rows": counts,
        }))?,
        Output::Table => println!(
            "backup written to {} ({written} bytes; {counts})",
            out.display()
        ),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn decide(
    args: &ClientArgs,
    run: &str,
    step: &str,
    decision: &super::DecisionArgs,
    approve: bool,
) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let by = decision
        .by
        .clone()
        .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()));
    let body = serde_json::json!({"by": by, "comment": decision.comment});
    let verb = if approve { "approve" } else { "reject" };
    let answer = client.post(
        &format!("/v1/runs/{run}/gates/{step}/{verb}"),
        "application/json",
        body.to_string().as_bytes(),
        &[],
    )?;
    if !answer.ok() {
        return fail(&answer);
    }
    let value = answer.json()?;
    match args.output {
        Output::Json => print_json(&value)?,
        Output::Table => println!(
            "gate {step} of {run}: {} by {}",
            shown(&value["decision"]["outcome"]),
            shown(&value["decision"]["by"])
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `scarab queue`: the pools, the locks, and the queued steps in admission order.
pub fn queue(args: &ClientArgs, limit: usize) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let answer = client.get(&format!("/v1/queue?limit={limit}"))?;
    if !answer.ok() {
        return fail(&answer);
    }
    let value = answer.json()?;
    if let Output::Json = args.output {
        print_json(&value)?;
        return Ok(ExitCode::SUCCESS);
    }
    let now = SystemTime::now();
    let width = table::Width::Terminal;
    let mut pools = table::new(&["POOL", "USED", "LIMIT"], width);
    for pool in value["pools"].as_array().into_iter().flatten() {
        pools.add_row(vec![
            shown(&pool["name"]),
            pool["used"].to_string(),
            pool["limit"].to_string(),
        ]);
    }
    table::print(&pools);
    let locks = value["locks"].as_array().cloned().unwrap_or_default();
    if !locks.is_empty() {
        let mut rows = table::new(&["LOCK", "HELD", "LIMIT"], width);
        for lock in &locks {
            rows.add_row(vec![
                shown(&lock["name"]),
                lock["held"].to_string(),
                lock["limit"].to_string(),
            ]);
        }
        println!();
        table::print(&rows);
    }
    let queued = value["queued"].as_array().cloned().unwrap_or_default();
    let waiting = &value["waiting"];
    let total: u64 = ["pool", "lock", "group", "parallelism"]
        .iter()
        .filter_map(|k| waiting[*k].as_u64())
        .sum();
    println!(
        "\n{total} queued (pool {}, lock {}, group {}, parallelism {})",
        waiting["pool"], waiting["lock"], waiting["group"], waiting["parallelism"]
    );
    if queued.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = table::new(
        &["RUN", "STEP", "WAITS FOR", "NAME", "POSITION", "WAITING"],
        width,
    );
    for entry in &queued {
        rows.add_row(vec![
            shown(&entry["run"]),
            shown(&entry["step"]),
            shown(&entry["reason"]),
            shown(&entry["name"]),
            entry["position"].to_string(),
            table::age(&entry["since"], now),
        ]);
    }
    table::print(&rows);
    if (queued.len() as u64) < total {
        println!("({} more: --limit)", total - queued.len() as u64);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn dlq_list(args: &ClientArgs, after: Option<u64>, limit: usize) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let mut path = format!("/v1/dlq?limit={limit}");
    if let Some(after) = after {
        path.push_str(&format!("&after={after}"));
    }
    let answer = client.get(&path)?;
    if !answer.ok() {
        return fail(&answer);
    }
    let value = answer.json()?;
    if let Output::Json = args.output {
        print_json(&value)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = table::new(
        &["ID", "KIND", "RUN", "CATEGORY", "DELIVERIES", "LAST ERROR"],
        table::Width::Terminal,
    );
    for letter in value["dead_letters"].as_array().into_iter().flatten() {
        rows.add_row(vec![
            letter["id"].to_string(),
            shown(&letter["kind"]),
            shown(&letter["run"]),
            shown(&letter["category"]),
            letter["deliveries"].to_string(),
            shown(&letter["last_error"]),
        ]);
    }
    table::print(&rows);
    if let Some(next) = value["next_after"].as_u64() {
        println!("(more: --after {next})");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn dlq_show(args: &ClientArgs, id: u64) -> anyhow::Result<ExitCode> {
    let client = Client::new(args)?;
    let answer = client.get(&format!("/v1/dlq/{id}"))?;
    if !answer.ok() {
        return fail(&answer);
    }
    print_json(&answer.json()?)?;
    Ok(ExitCode::SUCCESS)
}

pub fn dlq_action(
    args: &ClientArgs,
    id: u64,
    action: &str,
    reason: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let what = format!("dead letter {id}");
    post_action(
        args,
        &format!("/v1/dlq/{id}/{action}"),
        &what,
        action,
        reason,
    )
}

/// `scarab output set KEY VALUE` from inside a step, with the step's own environment.
pub fn output_set(key: &str, value: &str) -> anyhow::Result<ExitCode> {
    let var = |name: &str| {
        std::env::var(name)
            .with_context(|| format!("{name} is not set: run this inside a Scarab step"))
    };
    let (url, run, step, token) = (
        var("SCARAB_URL")?,
        var("SCARAB_RUN_ID")?,
        var("SCARAB_STEP")?,
        var("SCARAB_STEP_TOKEN")?,
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let body = serde_json::json!({ key: value }).to_string();
    let response = agent
        .put(format!(
            "{}/v1/runs/{run}/steps/{step}/outputs",
            url.trim_end_matches('/')
        ))
        .header("Authorization", format!("Bearer {token}"))
        .header("Content-Type", "application/json")
        .send(body.as_bytes())
        .with_context(|| format!("calling {url}"))?;
    let answer = answer(response)?;
    if !answer.ok() {
        return fail(&answer);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod golden {
    //! What `scarab show` and `scarab runs` print for a fixed answer of the API, held
    //! in `tests/golden/`: any change to these tables shows up in review as a change to
    //! those files (`SCARAB_UPDATE_GOLDEN=1 cargo test --lib golden` rewrites them).
    use super::*;

    fn golden(name: &str, rendered: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
        if std::env::var_os("SCARAB_UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, rendered).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            rendered,
            expected,
            "{} differs; rendered:\n{rendered}",
            path.display()
        );
    }

    fn input(name: &str) -> Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn now() -> SystemTime {
        humantime::parse_rfc3339("2026-12-04T10:10:00Z").unwrap()
    }

    #[test]
    fn show_prints_the_golden_table() {
        let run = input("run_detail.json");
        golden(
            "show.txt",
            &render_show(&run, now(), table::Width::Fixed(400)),
        );
    }

    #[test]
    fn runs_prints_the_golden_table() {
        let page = input("runs_page.json");
        golden(
            "runs.txt",
            &render_runs(&page, now(), table::Width::Fixed(400)),
        );
    }

    #[test]
    fn a_narrow_terminal_wraps_cells_and_keeps_every_column_in_line() {
        let run = input("run_detail.json");
        let text = render_show(&run, now(), table::Width::Fixed(90));
        let table: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("STEP"))
            .collect();
        let header = table[0];
        let starts: Vec<usize> = [
            "STATE", "ATTEMPT", "FENCE", "CLASS", "EXIT", "TOOK", "REASON",
        ]
        .iter()
        .map(|h| header.find(h).unwrap())
        .collect();
        for line in &table {
            assert!(line.chars().count() <= 90, "wider than 90: {line:?}");
            // A cell starts only where a column does: each character right after a run of
            // two spaces (or at the start) is at a column start.
            let bytes = line.as_bytes();
            for i in 1..bytes.len() {
                if bytes[i] != b' ' && bytes[i - 1] == b' ' && i >= 2 && bytes[i - 2] == b' ' {
                    assert!(
                        starts.contains(&i),
                        "a cell at {i} is out of line: {line:?}"
                    );
                }
            }
        }
        // The long step name and reason wrapped inside their columns.
        assert!(table.len() > 6, "{text}");
        assert!(text.contains("build-"), "{text}");
    }
}
