//! The web dashboard, served by `scarab serve` under `/ui` (and `/` redirects there).
//!
//! Server-rendered HTML over the public API: every page is built from the JSON answers of
//! the same `/v1` handlers clients use (called in-process, with the session's caller and
//! the API's own permission rule), and every write goes through them too, so the
//! dashboard can show or do nothing the API would not. Live updates: the page's script
//! listens to the event stream (`/ui/events`, the API's `/v1/events`) and fetches the
//! page's main region again when something changed; log tails poll the logs endpoint.
//!
//! Security: login by token, then a session cookie (HttpOnly, SameSite=Strict, Secure
//! under TLS) naming an in-memory session (a restart logs everyone out); every write form
//! carries the session's CSRF token and is refused without it (and from another origin);
//! a strict Content-Security-Policy with no inline script or style; every value escaped.

mod dag;
mod pages;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::Value;
use tower::ServiceExt;

use crate::api::ApiState;
use crate::api::auth::{self, Caller};
use crate::service::tokens::random_hex;
use crate::text::url_encode as encode;

/// Sessions kept at once; a login beyond it ends the oldest.
const SESSIONS_MAX: usize = 1024;
/// How long a session lasts after its login.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The session cookie's name.
const COOKIE: &str = "scarab_session";
/// Bytes of a form the dashboard reads (a token, a comment, a reason).
const FORM_MAX_BYTES: usize = 16 * 1024;
/// Runs one page of the runs view shows.
const RUNS_PAGE: usize = 50;
/// Runs read at most to fill one page filtered by pipeline (the API has no such index).
const PIPELINE_SCAN_MAX: usize = 5000;

/// The policy every page is served with: scripts and styles only from `/ui/assets`,
/// nothing inline, no frames, forms only to this origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const APP_CSS: &str = include_str!("assets/app.css");
const APP_JS: &str = include_str!("assets/app.js");

struct Session {
    caller: Caller,
    csrf: String,
    created: Instant,
}

/// What the dashboard's handlers share.
#[derive(Clone)]
pub struct Dashboard {
    /// The `/v1` routes without their authentication layer: the dashboard checks the
    /// session's caller with the API's own rule and hands the caller in.
    api: Router,
    state: ApiState,
    sessions: Arc<Mutex<HashMap<String, Session>>>,
}

/// The dashboard's routes, to nest under `/ui`: `api` is the `/v1` routes without their
/// authentication layer.
pub fn router(api: Router, state: ApiState) -> Router {
    let dashboard = Dashboard {
        api,
        state,
        sessions: Arc::default(),
    };
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/runs") }))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route(
            "/assets/app.css",
            get(|| async { asset("text/css", APP_CSS) }),
        )
        .route(
            "/assets/app.js",
            get(|| async { asset("text/javascript", APP_JS) }),
        )
        .route("/runs", get(runs))
        .route("/runs/{id}", get(run))
        .route("/runs/{id}/log", get(log))
        .route("/runs/{id}/{action}", post(run_action))
        .route("/runs/{id}/gates/{step}/{decision}", post(gate_action))
        .route("/queue", get(queue))
        .route("/operator", get(operator))
        .route("/dlq/{id}/{action}", post(dlq_action))
        .route("/events", get(events))
        .layer(axum::extract::DefaultBodyLimit::max(FORM_MAX_BYTES))
        .with_state(dashboard)
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        text,
    )
        .into_response()
}

/// An HTML page with the security headers every page gets.
fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The signed-in user of a request.
struct Viewer {
    caller: Caller,
    csrf: String,
}

impl Viewer {
    fn may(&self, permission: auth::Permission) -> bool {
        auth::permit(&self.caller, permission).is_ok()
    }
}

impl Dashboard {
    fn viewer(&self, headers: &HeaderMap) -> Option<Viewer> {
        let id = cookie(headers, COOKIE)?;
        let mut sessions = self.sessions.lock().expect("sessions");
        let session = sessions.get(&id)?;
        if session.created.elapsed() > SESSION_TTL {
            sessions.remove(&id);
            return None;
        }
        Some(Viewer {
            caller: session.caller.clone(),
            csrf: session.csrf.clone(),
        })
    }

    /// Calls the API as `caller`: the API's permission rule first, then its handler.
    /// Answers the status and the JSON (or the text of a non-JSON answer).
    async fn call(
        &self,
        caller: &Caller,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let api_path = format!("/v1{path}");
        let route = api_path.split('?').next().unwrap_or_default();
        if let Err(refused) = auth::permit(caller, auth::needed(&method, route)) {
            let response = refused.into_response();
            return (response.status(), answer_json(response).await);
        }
        let mut request = Request::builder().method(method).uri(api_path);
        let body = match body {
            Some(value) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Body::from(value.to_string())
            }
            None => Body::empty(),
        };
        let request = request.body(body).expect("a request");
        let response = self.raw(caller, request).await;
        (response.status(), answer_json(response).await)
    }

    /// Runs one `/v1` request as `caller`, who was already checked, and answers as the
    /// handler did (a stream stays a stream).
    async fn raw(&self, caller: &Caller, mut request: Request) -> Response {
        request.extensions_mut().insert(caller.clone());
        match self.api.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }

    async fn get(&self, caller: &Caller, path: &str) -> Result<Value, Response> {
        match self.call(caller, Method::GET, path, None).await {
            (status, value) if status.is_success() => Ok(value),
            (status, value) => Err(error_page(status, &value)),
        }
    }
}

async fn answer_json(response: Response) -> Value {
    let bytes = axum::body::to_bytes(response.into_body(), 8 * 1024 * 1024)
        .await
        .unwrap_or_default();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
}

fn error_page(status: StatusCode, value: &Value) -> Response {
    let message = value["error"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| value.as_str().unwrap_or("error").to_string());
    html(status, pages::error(status, &message))
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_string())
}

/// The sign-in page for anyone without a session.
fn to_login() -> Response {
    Redirect::to("/ui/login").into_response()
}

/// A write must come from this origin (when the browser says where it came from) and
/// carry the session's CSRF token; a refusal says which.
fn check_write(headers: &HeaderMap, viewer: &Viewer, csrf: &str) -> Result<(), &'static str> {
    use subtle::ConstantTimeEq;
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let (Some(origin), Some(host)) = (
        headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()),
        host,
    ) {
        let bare = origin
            .strip_prefix("https://")
            .or_else(|| origin.strip_prefix("http://"))
            .unwrap_or(origin);
        if bare != host {
            return Err("a form from another origin");
        }
    }
    if !bool::from(csrf.as_bytes().ct_eq(viewer.csrf.as_bytes())) {
        return Err("the form's CSRF token is missing or stale; reload the page");
    }
    Ok(())
}

fn forbidden(why: &str) -> Response {
    html(
        StatusCode::FORBIDDEN,
        pages::error(StatusCode::FORBIDDEN, why),
    )
}

async fn login_page(State(dashboard): State<Dashboard>, headers: HeaderMap) -> Response {
    if dashboard.viewer(&headers).is_some() {
        return Redirect::to("/ui/runs").into_response();
    }
    html(StatusCode::OK, pages::login(None))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    State(dashboard): State<Dashboard>,
    form: Result<Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return html(StatusCode::BAD_REQUEST, pages::login(Some("enter a token")));
    };
    let live = dashboard.state.service.settings.live();
    let Some(caller) = auth::identify(
        form.token.trim(),
        &dashboard.state.admin_token,
        &live.tokens,
    ) else {
        tracing::warn!("dashboard login refused");
        return html(
            StatusCode::UNAUTHORIZED,
            pages::login(Some("that token is not valid")),
        );
    };
    let (Ok(id), Ok(csrf)) = (random_hex(), random_hex()) else {
        return html(
            StatusCode::INTERNAL_SERVER_ERROR,
            pages::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "no randomness for a session (/dev/urandom)",
            ),
        );
    };
    tracing::info!(caller = %caller.name, role = caller.role.as_str(), "dashboard login");
    {
        let mut sessions = dashboard.sessions.lock().expect("sessions");
        sessions.retain(|_, s| s.created.elapsed() <= SESSION_TTL);
        if sessions.len() >= SESSIONS_MAX
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.created)
                .map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(
            id.clone(),
            Session {
                caller,
                csrf,
                created: Instant::now(),
            },
        );
    }
    let secure = if dashboard.state.tls { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        SESSION_TTL.as_secs()
    );
    let mut response = Redirect::to("/ui/runs").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("a cookie"),
    );
    response
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: String,
}

async fn logout(
    State(dashboard): State<Dashboard>,
    headers: HeaderMap,
    form: Result<Form<CsrfForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let Some(viewer) = dashboard.viewer(&headers) else {
        return to_login();
    };
    let csrf = form.map(|Form(f)| f.csrf).unwrap_or_default();
    if let Err(why) = check_write(&headers, &viewer, &csrf) {
        return forbidden(why);
    }
    if let Some(id) = cookie(&headers, COOKIE) {
        dashboard.sessions.lock().expect("sessions").remove(&id);
    }
    let mut response = Redirect::to("/ui/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("scarab_session=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    response
}

/// Whether the page asks only for its main region (the live refresh).
fn fragment(headers: &HeaderMap) -> bool {
    headers.contains_key("x-scarab-fragment")
}

/// The event id a page's stream resumes after: read before the page's data, so that
/// whatever changes after the read reaches the page (none is lost between the render
/// and the stream's start).
fn since(dashboard: &Dashboard) -> String {
    let events = &dashboard.state.service.events;
    events.id(events.latest())
}

fn page(headers: &HeaderMap, viewer: &Viewer, mut view: pages::View, since: &str) -> Response {
    if let Some(live) = &mut view.live {
        let separator = if live.contains('?') { '&' } else { '?' };
        live.push_str(&format!("{separator}since={}", encode(since)));
    }
    let body = if fragment(headers) {
        view.main
    } else {
        pages::layout(viewer, view)
    };
    html(StatusCode::OK, body)
}

#[derive(Deserialize, Default)]
struct RunsQuery {
    state: Option<String>,
    pipeline: Option<String>,
    cursor: Option<String>,
}

async fn runs(
    State(dashboard): State<Dashboard>,
    headers: HeaderMap,
    query: Result<Query<RunsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Some(viewer) = dashboard.viewer(&headers) else {
        return to_login();
    };
    let since = since(&dashboard);
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let state = query.state.filter(|s| !s.is_empty());
    let pipeline = query.pipeline.filter(|p| !p.is_empty());
    let mut found: Vec<Value> = Vec::new();
    let mut cursor = query.cursor.filter(|c| !c.is_empty());
    let mut scanned = 0;
    // Without a pipeline filter one API page is the page; with one, API pages are read
    // (at most PIPELINE_SCAN_MAX runs) until the page is full.
    let next = loop {
        let mut path = format!(
            "/runs?limit={}",
            if pipeline.is_some() { 500 } else { RUNS_PAGE }
        );
        if let Some(state) = &state {
            path.push_str(&format!("&state={}", encode(state)));
        }
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={}", encode(cursor)));
        }
        let page = match dashboard.get(&viewer.caller, &path).await {
            Ok(page) => page,
            Err(refused) => return refused,
        };
        let runs = page["runs"].as_array().cloned().unwrap_or_default();
        scanned += runs.len();
        let next = page["next_cursor"].as_str().map(str::to_string);
        for run in runs {
            if pipeline.as_deref().is_none_or(|p| run["pipeline"] == p) {
                found.push(run);
            }
            if found.len() == RUNS_PAGE {
                break;
            }
        }
        if pipeline.is_none()
            || found.len() >= RUNS_PAGE
            || next.is_none()
            || scanned >= PIPELINE_SCAN_MAX
        {
            // With a filter, the next page starts after the last run shown.
            break if pipeline.is_some() && found.len() >= RUNS_PAGE {
                found.last().and_then(cursor_of).or(next)
            } else {
                next
            };
        }
        cursor = next;
    };
    // Queue positions of queued runs (one call: the first steps in admission order).
    let mut positions: HashMap<String, u64> = HashMap::new();
    if found.iter().any(|r| r["state"] == "queued")
        && let Ok(queue) = dashboard.get(&viewer.caller, "/queue?limit=1000").await
    {
        for entry in queue["queued"].as_array().into_iter().flatten() {
            if let (Some(run), Some(position)) = (entry["run"].as_str(), entry["position"].as_u64())
            {
                positions.entry(run.to_string()).or_insert(position);
            }
        }
    }
    let view = pages::runs(&pages::RunsPage {
        runs: &found,
        state: state.as_deref(),
        pipeline: pipeline.as_deref(),
        next: next.as_deref(),
        positions: &positions,
        now: std::time::SystemTime::now(),
    });
    page(&headers, &viewer, view, &since)
}

/// The cursor that lists runs after `run` (as the API issues them).
fn cursor_of(run: &Value) -> Option<String> {
    let updated = humantime::parse_rfc3339(run["updated_at"].as_str()?).ok()?;
    let ms = updated
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis();
    Some(format!("{ms}.{}", run["id"].as_str()?))
}

async fn run(
    State(dashboard): State<Dashboard>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(viewer) = dashboard.viewer(&headers) else {
        return to_login();
    };
    let since = since(&dashboard);
    let path = format!("/runs/{}", encode(&id));
    let detail = match dashboard.get(&viewer.caller, &path).await {
        Ok(detail) => detail,
        Err(refused) => return refused,
    };
    let history = dashboard
        .get(&viewer.caller, &format!("{path}/history?limit=200"))
        .await
        .unwrap_or(Value::Null);
    let view = pages::run(&viewer, &detail, &history, std::time::SystemTime::now());
    page(&headers, &viewer, view, &since)
}

#[derive(Deserialize)]
struct LogQuery {
    step: String,
    attempt: u32,
    stream: Option<String>,
    offset: Option<u64>,
}

/// A chunk of an attempt's log as text (the page appends it as text, never as HTML),
/// with `X-Next-Offset` and `X-Done` (the attempt ended and everything was read).
async fn log(
    State(dashboard): State<Dashboard>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(query): Query<LogQuery>,
) -> Response {
    let Some(viewer) = dashboard.viewer(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let stream = match query.stream.as_deref() {
        Some("stderr") => "stderr",
        _ => "stdout",
    };
    let path = format!(
        "/v1/runs/{}/steps/{}/logs?attempt={}&stream={stream}&offset={}&limit=65536",
        encode(&id),
        encode(&query.step),
        query.attempt,
        query.offset.unwrap_or(0)
    );
    if auth::permit(&viewer.caller, auth::Permission::Read).is_err() {
        return StatusCode::FORBIDDEN.into_response();
    }
    let request = Request::builder()
        .method(Method::GET)
        .uri(&path)
        .body(Body::empty())
        .expect("a request");
    let response = dashboard.raw(&viewer.caller, request).await;
    let status = response.status();
    let (next, size, finished) = {
        let headers = response.headers();
        let number = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
        };
        (
            number("x-scarab-next-offset"),
            number("x-scarab-log-size"),
            headers
                .get("x-scarab-attempt-finished")
                .is_some_and(|v| v == "true"),
        )
    };
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    if !status.is_success() {
        return (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            bytes,
        )
            .into_response();
    }
    let mut answer = (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        bytes,
    )
        .into_response();
    if let Some(next) = next {
        answer
            .headers_mut()
            .insert("x-next-offset", HeaderValue::from(next));
    }
    let done = finished && next.zip(size).is_some_and(|(next, size)| next >= size);
    answer.headers_mut().insert(
        "x-done",
        HeaderValue::from_static(if done { "1" } else { "0" }),
    );
    answer
}

#[derive(Deserialize)]
struct ActionForm {
    csrf: String,
    reason: Option<String>,
    comment: Option<String>,
    from: Option<String>,
}

/// After a write: back to where the form was (a redirect), or the API's refusal.
async fn write(
    dashboard: &Dashboard,
    headers: &HeaderMap,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
    path: String,
    body: impl FnOnce(&ActionForm, &Viewer) -> Value,
    back: String,
) -> Response {
    let Some(viewer) = dashboard.viewer(headers) else {
        return to_login();
    };
    let Ok(Form(form)) = form else {
        return html(
            StatusCode::BAD_REQUEST,
            pages::error(StatusCode::BAD_REQUEST, "the form is incomplete"),
        );
    };
    if let Err(why) = check_write(headers, &viewer, &form.csrf) {
        return forbidden(why);
    }
    let body = body(&form, &viewer);
    match dashboard
        .call(&viewer.caller, Method::POST, &path, Some(body))
        .await
    {
        (status, _) if status.is_success() => Redirect::to(&back).into_response(),
        (status, value) => error_page(status, &value),
    }
}

/// The name recorded for the signed-in user's decisions and actions.
fn by(viewer: &Viewer) -> String {
    format!("{} (dashboard)", viewer.caller.name)
}

async fn run_action(
    State(dashboard): State<Dashboard>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if !matches!(action.as_str(), "cancel" | "retry" | "requeue" | "discard") {
        return html(
            StatusCode::NOT_FOUND,
            pages::error(StatusCode::NOT_FOUND, "no such action"),
        );
    }
    let back = format!("/ui/runs/{}", encode(&id));
    let path = format!("/runs/{}/{action}", encode(&id));
    write(
        &dashboard,
        &headers,
        form,
        path,
        |form, viewer| {
            let mut body = serde_json::json!({"by": by(viewer)});
            if let Some(reason) = form.reason.as_deref().filter(|r| !r.trim().is_empty()) {
                body["reason"] = reason.into();
            }
            if let Some(from) = form.from.as_deref().filter(|f| !f.is_empty()) {
                body["from"] = from.into();
            }
            body
        },
        back,
    )
    .await
}

async fn gate_action(
    State(dashboard): State<Dashboard>,
    headers: HeaderMap,
    Path((id, step, decision)): Path<(String, String, String)>,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if !matches!(decision.as_str(), "approve" | "reject") {
        return html(
            StatusCode::NOT_FOUND,
            pages::error(StatusCode::NOT_FOUND, "no such decision"),
        );
    }
    let back = format!("/ui/runs/{}", encode(&id));
    let path = format!("/runs/{}/gates/{}/{decision}", encode(&id), encode(&step));
    write(
        &dashboard,
        &headers,
        form,
        path,
        |form, viewer| {
            let mut body = serde_json::json!({"by": by(viewer)});
            if let Some(comment) = form.comment.as_deref().filter(|c| !c.trim().is_empty()) {
                body["comment"] = comment.into();
            }
            body
        },
        back,
    )
    .await
}

async fn dlq_action(
    State(dashboard): State<Dashboard>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if !matches!(action.as_str(), "requeue" | "discard") {
        return html(
            StatusCode::NOT_FOUND,
            pages::error(StatusCode::NOT_FOUND, "no such action"),
        );
    }
    let path = format!("/dlq/{}/{action}", encode(&id));
    write(
        &dashboard,
        &headers,
        form,
        path,
        |form, viewer| {
            let mut body = serde_json::json!({"by": by(viewer)});
            if let Some(reason) = form.reason.as_deref().filter(|r| !r.trim().is_empty()) {
                body["reason"] = reason.into();
            }
            body
        },
        "/ui/operator".to_string(),
    )
    .await
}

async fn queue(State(dashboard): State<Dashboard>, headers: HeaderMap) -> Response {
    let Some(viewer) = dashboard.viewer(&headers) else {
        return to_login();
    };
    let since = since(&dashboard);
    let queue = match dashboard.get(&viewer.caller, "/queue?limit=200").await {
        Ok(queue) => queue,
        Err(refused) => return refused,
    };
    let schedules = dashboard
        .get(&viewer.caller, "/schedules")
        .await
        .unwrap_or(Value::Null);
    let view = pages::queue(&queue, &schedules, std::time::SystemTime::now());
    page(&headers, &viewer, view, &since)
}

async fn operator(State(dashboard): State<Dashboard>, headers: HeaderMap) -> Response {
    let Some(viewer) = dashboard.viewer(&headers) else {
        return to_login();
    };
    let since = since(&dashboard);
    let letters = match dashboard.get(&viewer.caller, "/dlq?limit=100").await {
        Ok(letters) => letters,
        Err(refused) => return refused,
    };
    let quarantined = dashboard
        .get(&viewer.caller, "/runs?state=quarantined&limit=100")
        .await
        .unwrap_or(Value::Null);
    let ready = answer_json(crate::api::readiness(&dashboard.state, true).await).await;
    let view = pages::operator(&viewer, &letters, &quarantined, &ready);
    page(&headers, &viewer, view, &since)
}

#[derive(Deserialize)]
struct EventsQuery {
    run: Option<String>,
    /// The id the page was rendered at: the stream starts after it (unless the browser
    /// reconnects with its own `Last-Event-ID`).
    since: Option<String>,
}

/// The API's event stream for the signed-in user (an `EventSource` sends the cookie, not
/// a bearer token).
async fn events(
    State(dashboard): State<Dashboard>,
    headers: HeaderMap,
    Query(query): Query<EventsQuery>,
) -> Response {
    let Some(viewer) = dashboard.viewer(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if auth::permit(&viewer.caller, auth::Permission::Read).is_err() {
        return StatusCode::FORBIDDEN.into_response();
    }
    let mut path = "/v1/events".to_string();
    if let Some(run) = query.run {
        path.push_str(&format!("?run={}", encode(&run)));
    }
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(path)
        .body(Body::empty())
        .expect("a request");
    let resume = headers.get("last-event-id").cloned().or_else(|| {
        query
            .since
            .as_deref()
            .and_then(|since| HeaderValue::from_str(since).ok())
    });
    if let Some(last) = resume {
        request.headers_mut().insert("last-event-id", last);
    }
    dashboard.raw(&viewer.caller, request).await
}
