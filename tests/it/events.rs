//! `GET /v1/events` on a real service over real HTTP: a client that disconnects while
//! runs go on and resumes with `Last-Event-ID` has, in the end, every history record of
//! every run exactly once; `?run=` keeps one run; an id from before a restart gets a
//! `reset`; bad ids are refused naming the header; an open stream does not hold up a stop.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, Server};

const WITHIN: Duration = Duration::from_secs(60);

/// One server-sent event.
#[derive(Debug, Clone)]
struct Sse {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

/// A client of the event stream on a plain socket: HTTP/1.1, chunked body, SSE framing.
struct Stream {
    reader: BufReader<TcpStream>,
    /// Decoded body not yet split into events.
    pending: String,
}

fn open(
    server: &Server,
    query: &str,
    last_event_id: Option<&str>,
) -> Result<Stream, (u16, String)> {
    let address = server.url.trim_start_matches("http://");
    let mut socket = TcpStream::connect(address).expect("connect");
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let resume = last_event_id.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
    write!(
        socket,
        "GET /v1/events{query} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n{resume}\r\n",
        server.token
    )
    .expect("request");
    let mut reader = BufReader::new(socket);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).expect("status line");
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("header");
        if line.trim().is_empty() {
            break;
        }
        headers.push(line.trim().to_ascii_lowercase());
    }
    if status != 200 {
        let mut stream = Stream {
            reader,
            pending: String::new(),
        };
        let body = if headers.iter().any(|h| h == "transfer-encoding: chunked") {
            stream.chunk().unwrap_or_default()
        } else {
            let length = headers
                .iter()
                .find_map(|h| h.strip_prefix("content-length: "))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; length];
            stream.reader.read_exact(&mut body).expect("body");
            String::from_utf8_lossy(&body).into_owned()
        };
        return Err((status, body));
    }
    assert!(
        headers
            .iter()
            .any(|h| h.starts_with("content-type: text/event-stream")),
        "{headers:?}"
    );
    Ok(Stream {
        reader,
        pending: String::new(),
    })
}

impl Stream {
    /// The next chunk of the body; `None` at its end.
    fn chunk(&mut self) -> Option<String> {
        let mut size = String::new();
        if self.reader.read_line(&mut size).ok()? == 0 {
            return None;
        }
        let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if size == 0 {
            return None;
        }
        let mut data = vec![0; size + 2];
        self.reader.read_exact(&mut data).expect("chunk");
        data.truncate(size);
        Some(String::from_utf8(data).expect("utf-8"))
    }

    /// The next event (comments and keep-alives skipped); `None` when the stream ends.
    fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let block: String = self.pending.drain(..end + 2).collect();
                let mut event = Sse {
                    id: None,
                    event: None,
                    data: String::new(),
                };
                let mut any = false;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        event.id = Some(v.trim().to_string());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event.event = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        event.data.push_str(v.trim_start());
                        any = true;
                    }
                }
                if any {
                    return Some(event);
                }
                continue;
            }
            let chunk = self.chunk()?;
            self.pending.push_str(&chunk);
        }
    }
}

fn data(event: &Sse) -> Value {
    serde_json::from_str(&event.data).expect("JSON data")
}

/// Every history record of the run, as (seq, kind).
fn history(server: &Server, id: &str) -> Vec<(u64, String)> {
    let (status, body) = server.get(&format!("/v1/runs/{id}/history?limit=1000"));
    assert_eq!(status, 200, "{body}");
    body["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().expect("seq"),
                e["kind"].as_str().expect("kind").to_string(),
            )
        })
        .collect()
}

const ONE_STEP: &str = "name: quick\nsteps:\n  - name: a\n    run: [\"true\"]\n  - name: b\n    needs: [a]\n    run: [\"true\"]\n";

/// What a client has received: each (run, history seq) with its kind, and the runs whose
/// end it has seen.
#[derive(Default)]
struct Seen {
    events: BTreeMap<(String, u64), String>,
    ended: BTreeSet<String>,
}

impl Seen {
    /// Takes one event, asserting it was not delivered before; returns its id.
    fn take(&mut self, event: Sse) -> String {
        assert_eq!(event.event, None, "{event:?}");
        let value = data(&event);
        let run = value["run"].as_str().expect("run").to_string();
        let key = (run.clone(), value["seq"].as_u64().expect("seq"));
        let kind = value["kind"].as_str().expect("kind").to_string();
        if kind == "run_state"
            && ["succeeded", "failed", "cancelled"]
                .contains(&value["detail"]["to"].as_str().unwrap_or(""))
        {
            self.ended.insert(run);
        }
        assert!(
            self.events.insert(key.clone(), kind).is_none(),
            "event {key:?} delivered twice"
        );
        event.id.expect("an id")
    }

    /// Reads until every run of `runs` has ended; returns the last event id.
    fn read_until_ended(&mut self, stream: &mut Stream, runs: &BTreeSet<String>) -> String {
        let deadline = Instant::now() + WITHIN;
        let mut last_id = String::new();
        while !runs.is_subset(&self.ended) {
            assert!(Instant::now() < deadline, "runs did not end: {runs:?}");
            last_id = self.take(stream.next().expect("the stream goes on"));
        }
        last_id
    }
}

#[test]
fn a_resumed_stream_neither_loses_nor_repeats_an_event() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let mut seen = Seen::default();

    // First connection: three runs, read until they end.
    let mut stream = open(&server, "", None).expect("stream");
    let first: BTreeSet<String> = (0..3).map(|_| server.submit(ONE_STEP)).collect();
    seen.read_until_ended(&mut stream, &first);
    // Half-read: a few events of the next runs arrive on this connection, then it drops.
    let second: BTreeSet<String> = (0..5).map(|_| server.submit(ONE_STEP)).collect();
    let mut last_id = String::new();
    for _ in 0..3 {
        last_id = seen.take(stream.next().expect("event"));
    }
    drop(stream);
    // While no one listens, the runs end.
    for id in &second {
        server.wait_terminal(id, WITHIN);
    }

    // Resumed: what was missed comes first, nothing twice.
    let mut stream = open(&server, "", Some(&last_id)).expect("resumed stream");
    seen.read_until_ended(&mut stream, &second);

    // Everything every run recorded was delivered, and nothing else.
    let mut expected = BTreeMap::new();
    for id in first.iter().chain(&second) {
        for (seq, kind) in history(&server, id) {
            expected.insert((id.clone(), seq), kind);
        }
    }
    // (A run may record more after its end: read until as many events arrived.)
    while seen.events.len() < expected.len() {
        seen.take(stream.next().expect("event"));
    }
    assert_eq!(seen.events, expected);

    // A filtered stream, replayed from the first event this service sent: only that
    // run's events, in history order.
    let fourth = server.submit(ONE_STEP);
    let fifth = server.submit(ONE_STEP);
    server.wait_terminal(&fourth, WITHIN);
    server.wait_terminal(&fifth, WITHIN);
    let from_start = format!("{}-0", boot(&last_id));
    let mut only = open(&server, &format!("?run={fourth}"), Some(&from_start)).expect("filtered");
    let want: Vec<u64> = history(&server, &fourth).iter().map(|(s, _)| *s).collect();
    let mut seqs = Vec::new();
    while seqs.len() < want.len() {
        let value = data(&only.next().expect("event"));
        assert_eq!(value["run"], fourth.as_str(), "{value}");
        seqs.push(value["seq"].as_u64().expect("seq"));
    }
    assert_eq!(seqs, want);
}

/// The BOOT part of an event id.
fn boot(id: &str) -> &str {
    id.split_once('-').expect("BOOT-SEQ").0
}

#[test]
fn ids_from_another_start_reset_bad_ids_are_refused_and_a_stop_is_not_held_up() {
    let dir = common::tempdir().expect("tempdir");
    let mut server = Server::start(&dir.path().join("state"));
    let mut stream = open(&server, "", None).expect("stream");
    let id = server.submit(ONE_STEP);
    let event = stream.next().expect("event");
    let old_id = event.id.expect("id");
    server.wait_terminal(&id, WITHIN);
    drop(stream);

    // Refusals name what is wrong and change nothing.
    for (query, header, field) in [
        ("", Some("nonsense"), "Last-Event-ID"),
        ("", Some("zz-1"), "Last-Event-ID"),
        ("?run=nope", None, "run"),
    ] {
        let (status, body) = open(&server, query, header)
            .map(|_| ())
            .expect_err("refused");
        assert_eq!(status, 400, "{body}");
        let body: Value = serde_json::from_str(&body).expect("JSON error");
        assert_eq!(body["field"], field, "{body}");
    }
    let never = format!("{}-999999", boot(&old_id));
    let (status, body) = open(&server, "", Some(&never))
        .map(|_| ())
        .expect_err("refused");
    assert_eq!(status, 400, "{body}");
    let unknown = "r01jdxk0000000000000000000";
    let (status, _) = open(&server, &format!("?run={unknown}"), None)
        .map(|_| ())
        .expect_err("unknown run");
    assert!(status == 404 || status == 400, "{status}");

    // After a restart, an old id cannot be resumed from: the client is told so first.
    server.restart();
    let mut stream = open(&server, "", Some(&old_id)).expect("stream");
    let reset = stream.next().expect("reset");
    assert_eq!(reset.event.as_deref(), Some("reset"), "{reset:?}");
    assert!(
        data(&reset)["reason"]
            .as_str()
            .expect("reason")
            .contains("restarted")
    );
    let next = server.submit(ONE_STEP);
    let event = stream.next().expect("live event after the reset");
    assert_eq!(data(&event)["run"], next.as_str());

    // An open stream ends when the service stops, and the stop is orderly.
    server.wait_terminal(&next, WITHIN);
    let code = server.terminate();
    assert_eq!(code, Some(0), "{}", server.log());
    while stream.next().is_some() {}
}
