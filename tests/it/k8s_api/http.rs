//! A deliberately small HTTP/1.1 server over tokio sockets.
//!
//! Written by hand rather than on axum because a watch or a followed log is a
//! chunked body produced over time, and building such a body with axum needs a
//! `Stream` implementation (futures-core), which the package does not depend on.
//! The wire format is what the apiserver sends: `Content-Length` bodies for
//! plain responses, `Transfer-Encoding: chunked` for watch and `follow=true`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::store::Shared;
use super::{Fault, routes, watch};

/// Largest request head we accept (request line plus headers).
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body we accept.
const MAX_BODY: usize = 8 * 1024 * 1024;
/// An idle keep-alive connection is closed after this long.
const IDLE: Duration = Duration::from_secs(120);

/// One parsed request.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The raw query string, undecoded, without the `?`.
    pub raw_query: String,
    /// Decoded query pairs in order.
    pub query: Vec<(String, String)>,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.param(key), Some("true" | "1"))
    }

    /// `path?query` as it came over the wire.
    pub fn target(&self) -> String {
        if self.raw_query.is_empty() {
            self.path.clone()
        } else {
            format!("{}?{}", self.path, self.raw_query)
        }
    }
}

/// What a route produced.
pub enum Response {
    Full {
        code: u16,
        content_type: &'static str,
        body: Vec<u8>,
    },
    Watch(watch::WatchSpec),
    Log(watch::LogSpec),
}

impl Response {
    pub fn json(code: u16, body: Vec<u8>) -> Response {
        Response::Full {
            code,
            content_type: "application/json",
            body,
        }
    }
}

pub fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        413 => "Request Entity Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Unknown",
    }
}

/// Serves one accepted connection until it closes.
pub async fn serve_connection(shared: Arc<Shared>, mut sock: TcpStream) {
    let _ = sock.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let req = match tokio::time::timeout(IDLE, read_request(&mut sock, &mut buf)).await {
            Err(_) | Ok(Ok(None)) | Ok(Err(ReadError::Io)) => return,
            Ok(Err(ReadError::Bad(code, msg))) => {
                let body = super::status::bad_request(&msg).to_json();
                let _ = write_full(&mut sock, code, "application/json", &body, true).await;
                return;
            }
            Ok(Ok(Some(req))) => req,
        };
        if shared.fault() == Fault::Unreachable || shared.is_closed() {
            // Drop the connection without answering: the client sees a reset or an
            // incomplete message, as with an apiserver that went away.
            return;
        }
        shared.log_request(&req);
        let close = req
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let keep = match routes::handle(&shared, &req) {
            Response::Full {
                code,
                content_type,
                body,
            } => write_full(&mut sock, code, content_type, &body, close)
                .await
                .is_ok(),
            Response::Watch(spec) => watch::serve_watch(&shared, spec, &mut sock).await,
            Response::Log(spec) => watch::serve_log(&shared, spec, &mut sock).await,
        };
        if !keep || close {
            let _ = sock.shutdown().await;
            return;
        }
    }
}

enum ReadError {
    Io,
    Bad(u16, String),
}

async fn fill(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Result<bool, ReadError> {
    let mut chunk = [0u8; 16 * 1024];
    match sock.read(&mut chunk).await {
        Ok(0) => Ok(false),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(true)
        }
        Err(_) => Err(ReadError::Io),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads one request. `buf` keeps bytes that arrived after it (pipelining).
async fn read_request(
    sock: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Option<Request>, ReadError> {
    let head_end = loop {
        if let Some(pos) = find(buf, b"\r\n\r\n") {
            break pos;
        }
        if buf.len() > MAX_HEAD {
            return Err(ReadError::Bad(431, "request head too large".into()));
        }
        if !fill(sock, buf).await? {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(ReadError::Io)
            };
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end + 4);
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(_version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Bad(
            400,
            format!("malformed request line {request_line:?}"),
        ));
    };
    let mut headers = Vec::new();
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let chunked =
        header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        read_chunked(sock, buf).await?
    } else {
        let len: usize = match header("content-length") {
            None => 0,
            Some(v) => v
                .parse()
                .map_err(|_| ReadError::Bad(400, format!("bad Content-Length {v:?}")))?,
        };
        if len > MAX_BODY {
            return Err(ReadError::Bad(413, "request body too large".into()));
        }
        while buf.len() < len {
            if !fill(sock, buf).await? {
                return Err(ReadError::Io);
            }
        }
        buf.drain(..len).collect()
    };
    let (path, raw_query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target.to_string(), String::new()),
    };
    let query = raw_query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(pair), String::new()),
        })
        .collect();
    Ok(Some(Request {
        method: method.to_string(),
        path: percent_decode_path(&path),
        raw_query,
        query,
        headers,
        body,
    }))
}

async fn read_chunked(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(pos) = find(buf, b"\r\n") {
                break pos;
            }
            if buf.len() > MAX_HEAD {
                return Err(ReadError::Bad(400, "bad chunk header".into()));
            }
            if !fill(sock, buf).await? {
                return Err(ReadError::Io);
            }
        };
        let line = String::from_utf8_lossy(&buf[..line_end]).into_owned();
        buf.drain(..line_end + 2);
        let size_str = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_str, 16)
            .map_err(|_| ReadError::Bad(400, format!("bad chunk size {size_str:?}")))?;
        if body.len() + size > MAX_BODY {
            return Err(ReadError::Bad(413, "request body too large".into()));
        }
        if size == 0 {
            // Trailers (ignored) end with an empty line.
            loop {
                if let Some(pos) = find(buf, b"\r\n") {
                    let empty = pos == 0;
                    buf.drain(..pos + 2);
                    if empty {
                        return Ok(body);
                    }
                } else if !fill(sock, buf).await? {
                    return Err(ReadError::Io);
                }
            }
        }
        while buf.len() < size + 2 {
            if !fill(sock, buf).await? {
                return Err(ReadError::Io);
            }
        }
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
    }
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn decode(s: &str, plus_is_space: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex_val(bytes[i + 1]), hex_val(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Decodes a query component (`application/x-www-form-urlencoded`).
pub fn percent_decode(s: &str) -> String {
    decode(s, true)
}

fn percent_decode_path(s: &str) -> String {
    decode(s, false)
}

pub async fn write_full(
    sock: &mut TcpStream,
    code: u16,
    content_type: &str,
    body: &[u8],
    close: bool,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-cache, private\r\n",
        reason_phrase(code),
        body.len()
    );
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    sock.write_all(&out).await?;
    sock.flush().await
}

pub async fn write_stream_head(sock: &mut TcpStream, content_type: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache, private\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).await?;
    sock.flush().await
}

pub async fn write_chunk(sock: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    sock.write_all(&out).await?;
    sock.flush().await
}

pub async fn write_last_chunk(sock: &mut TcpStream) -> std::io::Result<()> {
    sock.write_all(b"0\r\n\r\n").await?;
    sock.flush().await
}
