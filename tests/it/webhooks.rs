//! Signed webhooks delivered through the outbox to real HTTP receivers on loopback.

use crate::common;

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Server;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const WITHIN: Duration = Duration::from_secs(60);
const SECRET: &str = "an-alert-secret-of-32-bytes-long";

#[derive(Clone, Debug)]
struct Delivery {
    headers: HashMap<String, String>,
    body: String,
    status: u16,
}

/// A loopback HTTP receiver that answers 500 to the first `failures` deliveries of each
/// event (all of them when `None`), then 200, and records every request.
struct Receiver {
    url: String,
    seen: Arc<Mutex<Vec<Delivery>>>,
    /// With `failures: None`, requests fail until this turns true.
    healthy: Arc<std::sync::atomic::AtomicBool>,
}

impl Receiver {
    fn start(failures: Option<usize>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let switch = healthy.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let Some((headers, body)) = common::read_http_request(&mut reader) else {
                    continue;
                };
                let mut seen = record.lock().expect("lock");
                let event = headers.get("x-scarab-event-id").cloned();
                let earlier = seen
                    .iter()
                    .filter(|d: &&Delivery| d.headers.get("x-scarab-event-id") == event.as_ref())
                    .count();
                let status = match failures {
                    Some(n) if earlier >= n => 200,
                    None if switch.load(std::sync::atomic::Ordering::SeqCst) => 200,
                    _ => 500,
                };
                seen.push(Delivery {
                    headers,
                    body: String::from_utf8_lossy(&body).into_owned(),
                    status,
                });
                drop(seen);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
        });
        Receiver { url, seen, healthy }
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().expect("lock").clone()
    }

    fn wait_for(&self, what: &str, check: impl Fn(&[Delivery]) -> bool) -> Vec<Delivery> {
        let deadline = Instant::now() + WITHIN;
        loop {
            let seen = self.deliveries();
            if check(&seen) {
                return seen;
            }
            assert!(Instant::now() < deadline, "{what}: {seen:#?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn valid_signature(delivery: &Delivery) -> bool {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("key");
    mac.update(delivery.body.as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    delivery.headers.get("x-scarab-signature") == Some(&format!("sha256={hex}"))
}

fn config(dir: &std::path::Path, hooks: &[(&str, &str)]) -> String {
    let mut text = String::new();
    for (url, events) in hooks {
        text.push_str(&format!("[[webhooks]]\nurl = \"{url}\"\nevents = {events}\nsecret = \"{SECRET}\"\ntimeout = \"2s\"\n\n"));
    }
    let path = dir.join("scarab.toml");
    std::fs::write(&path, text).expect("config");
    path.to_str().expect("utf-8").to_string()
}

#[test]
fn a_receiver_that_fails_three_times_gets_the_event_with_one_id_and_valid_signatures() {
    let dir = common::tempdir().expect("tempdir");
    let receiver = Receiver::start(Some(3));
    let config = config(dir.path(), &[(&receiver.url, "[\"run_state\"]")]);
    let server = Server::start_with(&dir.path().join("state"), &["--config", &config]);
    let id = server.submit("name: p\nsteps:\n  - name: a\n    run: ['true']\n");
    server.wait_terminal(&id, WITHIN);
    let seen = receiver.wait_for("the succeeded event arrives", |seen| {
        seen.iter()
            .any(|d| d.status == 200 && d.body.contains("\"state\":\"succeeded\""))
    });
    let mut by_event: HashMap<String, Vec<&Delivery>> = HashMap::new();
    for delivery in &seen {
        let event_id = delivery
            .headers
            .get("x-scarab-event-id")
            .cloned()
            .expect("event id header");
        by_event.entry(event_id).or_default().push(delivery);
    }
    let retried = by_event
        .values()
        .find(|d| d.len() >= 4)
        .expect("one event delivered 4 times (3 failures, then 200)");
    assert!(
        retried.iter().all(|d| d.body == retried[0].body),
        "the same body every time"
    );
    assert!(
        retried.iter().all(|d| valid_signature(d)),
        "every delivery is signed"
    );
    assert_eq!(retried.last().map(|d| d.status), Some(200));
    let body: serde_json::Value = serde_json::from_str(&retried[0].body).expect("JSON");
    assert_eq!(body["run"], id.as_str());
    assert_eq!(body["pipeline"], "p");
    assert!(body["event_id"].is_string());
    assert_eq!(
        &body["event_id"].as_str().map(str::to_string),
        &retried[0].headers.get("x-scarab-event-id").cloned()
    );
    assert!(body.get("failure_classification").is_some());
}

#[test]
fn an_always_failing_receiver_dead_letters_without_changing_the_verdict_and_alerts_the_operator() {
    let dir = common::tempdir().expect("tempdir");
    let broken = Receiver::start(None);
    let alerts = Receiver::start(Some(0));
    let config = config(
        dir.path(),
        &[
            (&broken.url, "[\"run_state\"]"),
            (&alerts.url, "[\"dead_lettered\"]"),
        ],
    );
    let server = Server::start_with(
        &dir.path().join("state"),
        &["--config", &config, "--max-deliveries", "2"],
    );
    let id = server.submit("name: p\nsteps:\n  - name: a\n    run: ['true']\n");
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded");
    let deadline = Instant::now() + WITHIN;
    let letters = loop {
        let (_, dlq) = server.get("/v1/dlq");
        let letters = dlq["dead_letters"].as_array().cloned().unwrap_or_default();
        if letters.iter().filter(|l| l["kind"] == "webhook").count() >= 2 {
            break letters;
        }
        assert!(
            Instant::now() < deadline,
            "webhook messages never dead-lettered: {dlq}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let webhook = letters
        .iter()
        .find(|l| l["kind"] == "webhook")
        .expect("a webhook dead letter");
    assert_eq!(webhook["category"], "outbox_poison");
    assert_eq!(webhook["deliveries"], 2);
    assert!(
        webhook["last_error"].as_str().unwrap_or("").contains("500"),
        "{webhook}"
    );
    assert_eq!(
        server.run(&id)["state"],
        "succeeded",
        "a notification never changes a verdict"
    );
    let alerts_seen = alerts.wait_for(
        "the operator alert about the dead-lettered webhook",
        |seen| {
            seen.iter().any(|d| {
                d.body.contains("\"type\":\"dead_lettered\"")
                    && d.body.contains("\"kind\":\"webhook\"")
            })
        },
    );
    assert!(alerts_seen.iter().all(valid_signature));
    assert!(broken.deliveries().len() >= 2);
}

#[test]
fn an_event_committed_before_a_kill9_is_delivered_after_the_restart() {
    let dir = common::tempdir().expect("tempdir");
    let receiver = Receiver::start(None);
    let config = config(dir.path(), &[(&receiver.url, "[\"run_state\"]")]);
    let mut server = Server::start_with(&dir.path().join("state"), &["--config", &config]);
    let id = server.submit("name: p\nsteps:\n  - name: a\n    run: ['true']\n");
    server.wait_terminal(&id, WITHIN);
    receiver.wait_for("a first, failed delivery", |seen| !seen.is_empty());
    server.kill9();
    receiver
        .healthy
        .store(true, std::sync::atomic::Ordering::SeqCst);
    server.restart();
    let seen = receiver.wait_for("the events delivered after the restart", |seen| {
        seen.iter()
            .any(|d| d.status == 200 && d.body.contains("\"state\":\"succeeded\""))
    });
    let failed: std::collections::HashSet<_> = seen
        .iter()
        .filter(|d| d.status != 200)
        .filter_map(|d| d.headers.get("x-scarab-event-id"))
        .collect();
    for event in failed {
        receiver.wait_for(
            "every event that failed before the kill is delivered after it",
            |seen| {
                seen.iter()
                    .any(|d| d.status == 200 && d.headers.get("x-scarab-event-id") == Some(event))
            },
        );
    }
}

#[test]
fn an_open_gate_sends_gate_waiting_to_subscribed_receivers() {
    let dir = common::tempdir().expect("tempdir");
    let receiver = Receiver::start(Some(0));
    let config = config(dir.path(), &[(&receiver.url, "[\"gate_waiting\"]")]);
    let server = Server::start_with(&dir.path().join("state"), &["--config", &config]);
    let id = server.submit(
        "name: g\nsteps:\n  - name: approve\n    gate: {expires: 1h, message: \"ship?\"}\n",
    );
    let seen = receiver.wait_for("the gate_waiting event arrives", |seen| !seen.is_empty());
    let body: serde_json::Value = serde_json::from_str(&seen[0].body).expect("JSON");
    assert_eq!(body["type"], "gate_waiting");
    assert_eq!(body["run"], id.as_str());
    assert_eq!(body["step"], "approve");
    assert_eq!(body["message"], "ship?");
    assert!(body["expires_at"].is_string(), "{body}");
    assert!(valid_signature(&seen[0]));
    // Only the subscribed event: no run_state deliveries.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        receiver.deliveries().len(),
        1,
        "{:#?}",
        receiver.deliveries()
    );
}
