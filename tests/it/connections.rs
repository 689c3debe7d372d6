//! Client connections never take what steps need: thousands of idle connections leave
//! `/healthz` answering and steps launching, and the server itself closes connections
//! that send nothing (the header-read timeout).

use crate::common;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::Server;

const IDLE: usize = 2000;

fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
}

#[test]
fn idle_connections_starve_neither_health_checks_nor_steps() {
    raise_open_files_limit();
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let address = server.url.trim_start_matches("http://").to_string();
    let mut idle: Vec<TcpStream> = (0..IDLE)
        .map(|_| TcpStream::connect(&address).expect("connect"))
        .collect();

    let started = Instant::now();
    let (status, _) = server.get("/healthz");
    assert_eq!(status, 200);
    eprintln!(
        "/healthz answered in {} ms beside {IDLE} idle connections",
        started.elapsed().as_millis()
    );
    let id = server.submit("name: c\nsteps:\n  - name: s\n    run: [sh, -c, 'echo ok']\n");
    let run = server.wait_terminal(&id, Duration::from_secs(60));
    assert_eq!(run["state"], "succeeded", "{run:#}");

    // Past the header-read timeout the server has closed every connection that sent
    // nothing: each read ends (EOF or reset) instead of waiting.
    std::thread::sleep(scarab::limits::HTTP_HEADER_READ_TIMEOUT + Duration::from_secs(2));
    let mut closed = 0;
    for stream in &mut idle {
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => closed += 1,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => closed += 1,
            Ok(_) => {}
        }
    }
    assert_eq!(closed, IDLE, "idle connections are closed by the server");
    let (status, _) = server.get("/healthz");
    assert_eq!(status, 200);
}

/// Oversized request headers get a JSON 431 naming `headers`, like every other refusal.
#[test]
fn oversized_headers_are_refused_as_json_naming_the_field() {
    use std::io::Write;
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let address = server.url.trim_start_matches("http://").to_string();
    let mut stream = TcpStream::connect(&address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let filler = "a".repeat(70 * 1024);
    write!(
        stream,
        "GET /v1/runs HTTP/1.1\r\nHost: x\r\nX-Filler: {filler}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).expect("body");
    let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(json["field"], "headers", "{json}");
}

/// A refusal decided before the body is read (a bad token) still reaches the client
/// when the body arrives late, and the connection stays usable: the server reads the
/// rest of the body before answering instead of closing on it (which makes the kernel
/// reset the connection and the client lose the answer).
#[test]
fn a_refusal_before_a_late_body_reaches_the_client_and_keeps_the_connection() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let address = server.url.trim_start_matches("http://").to_string();
    let body = vec![b'x'; 20_000];
    for (method, path) in [
        (
            "PUT",
            "/v1/runs/r01m8y57tfmvwmvb565r30rzdve/steps/s/outputs",
        ),
        ("POST", "/v1/runs"),
    ] {
        let mut stream = TcpStream::connect(&address).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: scarab\r\nAuthorization: Bearer 1.deadbeef\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).expect("head");
        // The body comes late and in pieces, after the server could have answered.
        for piece in body.chunks(body.len() / 4) {
            std::thread::sleep(Duration::from_millis(100));
            stream.write_all(piece).expect("body");
        }
        let (status, text) = read_response(&mut stream);
        assert_eq!(status, 401, "{method} {path}: {text}");
        assert!(text.contains("\"error\""), "{method} {path}: {text}");
        // The same connection answers the next request.
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: scarab\r\n\r\n")
            .expect("second request");
        let (status, text) = read_response(&mut stream);
        assert_eq!((status, text.as_str()), (200, "ok\n"), "{method} {path}");
    }
}

/// Reads one HTTP/1.1 response with a Content-Length body: (status, body).
fn read_response(stream: &mut TcpStream) -> (u16, String) {
    let mut buffer = Vec::new();
    let mut byte = [0u8; 1];
    while !buffer.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("response head");
        assert_eq!(
            n, 1,
            "the connection ended inside a response head: {buffer:?}"
        );
        buffer.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buffer).to_string();
    let status = head[9..12].parse().expect("status");
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .expect("content-length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("response body");
    (status, String::from_utf8_lossy(&body).to_string())
}
