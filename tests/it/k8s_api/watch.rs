//! Streaming responses: the watch hub and `log?follow=true`.
//!
//! A watch is served like the apiserver's watch cache
//! (staging/src/k8s.io/apiserver/pkg/storage/cacher): events after the requested
//! resourceVersion come from the bounded history; a resourceVersion older than the
//! history gets a single ERROR event carrying a 410 `Expired` Status ("too old
//! resource version: X (Y)") and the stream ends; BOOKMARK events carry a Pod whose
//! only metadata is the resourceVersion; `timeoutSeconds` ends the stream cleanly.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::Fault;
use super::http::{write_chunk, write_last_chunk, write_stream_head};
use super::selector::{FieldSelector, LabelSelector};
use super::status;
use super::store::{Key, Shared};

#[derive(Debug, Clone)]
pub struct WatchSpec {
    /// None: all namespaces.
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// None for "" or "0": start with synthetic ADDED events for the current state.
    pub resource_version: Option<u64>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
    /// Fault::NamespaceMissing at request time: the namespace holds nothing.
    pub empty_namespace: bool,
}

impl WatchSpec {
    fn matches(&self, pod: &Pod) -> bool {
        !self.empty_namespace
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| pod.metadata.namespace.as_ref() == Some(ns))
            && self.labels.matches(pod.metadata.labels.as_ref())
            && self.fields.matches(pod)
    }
}

fn event_line(kind: &str, object: serde_json::Value) -> Vec<u8> {
    let mut line =
        serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The object of a BOOKMARK event for Pods, as the Go serializer renders an empty
/// Pod carrying only a resourceVersion (and, for the end of initial events, the
/// `k8s.io/initial-events-end` annotation).
fn bookmark(rv: u64, initial_end: bool) -> Vec<u8> {
    let mut metadata = json!({ "resourceVersion": rv.to_string(), "creationTimestamp": null });
    if initial_end {
        metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    event_line(
        "BOOKMARK",
        json!({
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": metadata,
            "spec": { "containers": null },
            "status": {}
        }),
    )
}

fn pod_value(pod: &Pod) -> serde_json::Value {
    serde_json::to_value(pod).unwrap_or_default()
}

/// Resolves when the peer closes its side (or errors); used to notice a client
/// that walked away from an idle stream.
async fn peer_closed(sock: &mut TcpStream) {
    let mut scratch = [0u8; 512];
    loop {
        match sock.read(&mut scratch).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

enum Wake {
    Changed,
    Tick,
    Deadline,
    PeerGone,
}

async fn wait(
    rx: &mut tokio::sync::watch::Receiver<u64>,
    sock: &mut TcpStream,
    tick: Instant,
    deadline: Option<Instant>,
) -> Wake {
    let far = Instant::now() + Duration::from_secs(24 * 3600);
    tokio::select! {
        r = rx.changed() => if r.is_ok() { Wake::Changed } else { Wake::PeerGone },
        _ = tokio::time::sleep_until(tick) => Wake::Tick,
        _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => Wake::Deadline,
        _ = peer_closed(sock) => Wake::PeerGone,
    }
}

/// Serves one watch. Returns whether the connection may be reused.
pub async fn serve_watch(shared: &Arc<Shared>, spec: WatchSpec, sock: &mut TcpStream) -> bool {
    let mut rx = shared.subscribe();
    rx.mark_unchanged();
    if write_stream_head(sock, "application/json").await.is_err() {
        return false;
    }
    let deadline = spec.timeout.map(|t| Instant::now() + t);

    // Starting point: (cursor, epoch, bookmark interval, first lines, stream ends after them).
    let (mut cursor, epoch, interval, first, ends) = {
        let st = shared.lock();
        let mut out: Vec<Vec<u8>> = Vec::new();
        let mut ends = false;
        let cursor = match spec.resource_version {
            None => {
                for pod in st.pods.values().filter(|p| spec.matches(p)) {
                    out.push(event_line("ADDED", pod_value(pod)));
                }
                if spec.send_initial_events {
                    out.push(bookmark(st.rv, true));
                }
                st.rv
            }
            Some(rv) if rv < st.floor => {
                let gone =
                    status::expired(format!("too old resource version: {rv} ({})", st.floor));
                out.push(event_line("ERROR", gone.to_value()));
                ends = true;
                rv
            }
            Some(rv) => {
                if spec.send_initial_events {
                    for pod in st.pods.values().filter(|p| spec.matches(p)) {
                        out.push(event_line("ADDED", pod_value(pod)));
                    }
                    out.push(bookmark(st.rv, true));
                    st.rv
                } else {
                    rv
                }
            }
        };
        (cursor, st.epoch, st.bookmark_interval, out, ends)
    };
    for line in first {
        if write_chunk(sock, &line).await.is_err() {
            return false;
        }
    }
    if ends {
        return write_last_chunk(sock).await.is_ok();
    }

    let mut tick = Instant::now() + interval;
    loop {
        // Collect what happened after the cursor.
        let (lines, end) = {
            let st = shared.lock();
            if st.fault == Fault::Unreachable || st.closed {
                return false; // cut the stream mid-body
            }
            if st.epoch != epoch {
                (Vec::new(), Some(None))
            } else if cursor < st.floor {
                let gone =
                    status::expired(format!("too old resource version: {cursor} ({})", st.floor));
                (Vec::new(), Some(Some(event_line("ERROR", gone.to_value()))))
            } else {
                let lines: Vec<Vec<u8>> = st
                    .history
                    .iter()
                    .filter(|e| e.rv > cursor && spec.matches(&e.pod))
                    .map(|e| event_line(e.kind.as_str(), pod_value(&e.pod)))
                    .collect();
                cursor = st.rv;
                (lines, None)
            }
        };
        for line in lines {
            if write_chunk(sock, &line).await.is_err() {
                return false;
            }
        }
        if let Some(last) = end {
            if let Some(line) = last
                && write_chunk(sock, &line).await.is_err()
            {
                return false;
            }
            return write_last_chunk(sock).await.is_ok();
        }
        match wait(&mut rx, sock, tick, deadline).await {
            Wake::Changed => {}
            Wake::Tick => {
                tick = Instant::now() + interval;
                if spec.bookmarks && write_chunk(sock, &bookmark(cursor, false)).await.is_err() {
                    return false;
                }
            }
            Wake::Deadline => return write_last_chunk(sock).await.is_ok(),
            Wake::PeerGone => return false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct LogSpec {
    pub key: Key,
    pub uid: String,
    pub follow: bool,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<usize>,
}

/// The tail of a log per `tailLines`.
pub fn tail(data: &[u8], lines: Option<usize>) -> &[u8] {
    let Some(n) = lines else { return data };
    if n == 0 {
        return &data[data.len()..];
    }
    let mut count = 0;
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            count += 1;
            if count == n {
                return &data[i + 1..];
            }
        }
    }
    data
}

fn containers_done(pod: &Pod) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    match statuses {
        None => false,
        Some(list) => list
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some())),
    }
}

/// Streams a Pod's log until its containers have terminated (or it is gone).
pub async fn serve_log(shared: &Arc<Shared>, spec: LogSpec, sock: &mut TcpStream) -> bool {
    let mut rx = shared.subscribe();
    rx.mark_unchanged();
    if write_stream_head(sock, "text/plain").await.is_err() {
        return false;
    }
    // Absolute offset into the (front-trimmed) log.
    let mut offset = {
        let st = shared.lock();
        let buf = st.logs.get(&spec.uid).cloned().unwrap_or_default();
        let start = tail(&buf.data, spec.tail_lines);
        buf.dropped + (buf.data.len() - start.len())
    };
    let mut sent = 0usize;
    let interval = shared.lock().bookmark_interval;
    loop {
        let (data, done) = {
            let st = shared.lock();
            if st.fault == Fault::Unreachable || st.closed {
                return false;
            }
            let buf = st.logs.get(&spec.uid).cloned().unwrap_or_default();
            let begin = offset.max(buf.dropped) - buf.dropped;
            let data = buf.data.get(begin..).unwrap_or_default().to_vec();
            offset = buf.dropped + buf.data.len();
            let pod = st
                .pods
                .get(&spec.key)
                .filter(|p| p.metadata.uid.as_deref() == Some(spec.uid.as_str()));
            let done = !spec.follow || pod.is_none_or(containers_done);
            (data, done)
        };
        let mut data = data;
        if let Some(limit) = spec.limit_bytes {
            data.truncate(limit.saturating_sub(sent));
        }
        sent += data.len();
        if write_chunk(sock, &data).await.is_err() {
            return false;
        }
        if done || spec.limit_bytes.is_some_and(|l| sent >= l) {
            return write_last_chunk(sock).await.is_ok();
        }
        if let Wake::PeerGone = wait(&mut rx, sock, Instant::now() + interval, None).await {
            return false;
        }
    }
}
