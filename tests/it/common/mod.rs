//! Shared helpers for the integration tests: a real `scarab serve` process on a real
//! state dir, talked to over real HTTP on loopback.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_scarab");

/// A test's scratch directory, whose `state` entry is the service's state dir and whose
/// `etc` entry is a directory for its config file.
///
/// Steps are confined away from the state dir and the config and cannot create entries
/// directly in their ancestors (see `executor::local::confine`), so both live in trees of
/// their own (under cargo's target tmp dir) and `<scratch>/state` and `<scratch>/etc` link
/// to them: steps write their markers into the scratch dir, beside the links, and `/tmp`
/// stays theirs.
pub struct TestDir {
    scratch: tempfile::TempDir,
    _state: tempfile::TempDir,
    _etc: tempfile::TempDir,
}

impl TestDir {
    pub fn path(&self) -> &Path {
        self.scratch.path()
    }
}

pub fn tempdir() -> std::io::Result<TestDir> {
    let scratch = tempfile::tempdir()?;
    let state = tempfile::Builder::new()
        .prefix("state-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let etc = tempfile::Builder::new()
        .prefix("etc-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    std::os::unix::fs::symlink(state.path(), scratch.path().join("state"))?;
    std::os::unix::fs::symlink(etc.path(), scratch.path().join("etc"))?;
    Ok(TestDir {
        scratch,
        _state: state,
        _etc: etc,
    })
}

pub struct Server {
    pub state_dir: PathBuf,
    pub url: String,
    pub token: String,
    child: Option<Child>,
    port: u16,
    extra_args: Vec<String>,
    /// The `scarab` executable the service runs (and its supervisors with it).
    bin: PathBuf,
    /// Variables added to the service's environment.
    extra_env: Vec<(String, String)>,
    /// How the test talks to it (HTTPS trusting a test CA for `start_tls`).
    agent: ureq::Agent,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Server {
    pub fn start(state_dir: &Path) -> Server {
        Server::start_with(state_dir, &[])
    }

    pub fn start_with(state_dir: &Path, extra_args: &[&str]) -> Server {
        Server::start_binary(Path::new(BIN), state_dir, extra_args)
    }

    /// A service with more variables in its environment.
    pub fn start_with_env(state_dir: &Path, extra_args: &[&str], env: &[(&str, &str)]) -> Server {
        Server::launch(Path::new(BIN), state_dir, extra_args, env)
    }

    /// The service of another `scarab` executable (an installed copy of the build).
    pub fn start_binary(bin: &Path, state_dir: &Path, extra_args: &[&str]) -> Server {
        Server::launch(bin, state_dir, extra_args, &[])
    }

    /// A service speaking HTTPS with `cert` and `key` (PEM files), reached by tests
    /// that trust `ca` (PEM text).
    pub fn start_tls(
        state_dir: &Path,
        cert: &Path,
        key: &Path,
        ca: &str,
        extra_args: &[&str],
    ) -> Server {
        let mut server = Server::unstarted(Path::new(BIN), state_dir, extra_args, &[]);
        server.url = server.url.replace("http://", "https://");
        server.extra_args.extend([
            "--tls-cert".to_string(),
            cert.display().to_string(),
            "--tls-key".to_string(),
            key.display().to_string(),
        ]);
        server.agent = tls_agent(ca);
        server.spawn();
        server
    }

    /// The agent the test uses to talk to this service.
    pub fn agent(&self) -> ureq::Agent {
        self.agent.clone()
    }

    fn launch(bin: &Path, state_dir: &Path, extra_args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut server = Server::unstarted(bin, state_dir, extra_args, env);
        server.spawn();
        server
    }

    fn unstarted(
        bin: &Path,
        state_dir: &Path,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        let port = free_port();
        Server {
            agent: agent(),
            state_dir: state_dir.to_path_buf(),
            url: format!("http://127.0.0.1:{port}"),
            token: String::new(),
            child: None,
            port,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            bin: bin.to_path_buf(),
            extra_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state_dir.with_extension("log"))
            .expect("server log");
        std::fs::create_dir_all(&self.state_dir).expect("state dir");
        let child = Command::new(&self.bin)
            .arg("serve")
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .args(&self.extra_args)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .env("SCARAB_LOG", "info")
            .pre_exec_umask(0o022)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn scarab serve");
        self.child = Some(child);
        self.wait_ready();
        self.token = std::fs::read_to_string(self.state_dir.join("admin.token"))
            .expect("admin token")
            .trim()
            .to_string();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let agent = self.agent.clone();
        while Instant::now() < deadline {
            if let Ok(response) = agent.get(format!("{}/readyz", self.url)).call()
                && response.status() == 200
            {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "scarab serve exited early with {status}; log at {}",
                    self.state_dir.with_extension("log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("scarab serve not ready in time");
    }

    /// The service's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// kill -9: no drain, no flush, nothing.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` to the service process.
    pub fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            unsafe {
                libc::kill(child.id() as i32, signal);
            }
        }
    }

    /// The service's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state_dir.with_extension("log")).unwrap_or_default()
    }

    /// Waits up to `within` for the process to exit; its code, or `None` if it did not.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return status.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM and wait for a clean exit; returns the exit status code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        child.wait().ok()?.code()
    }

    /// Starts the service again after `kill9` or `terminate`, on the same port.
    pub fn resume(&mut self) {
        self.spawn();
    }

    pub fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let body = body.to_string();
        self.request("POST", path, "application/json", body.as_bytes(), &[])
    }

    /// The kinds of the run's history events, in order.
    pub fn history_kinds(&self, id: &str) -> Vec<String> {
        let (status, history) = self.get(&format!("/v1/runs/{id}/history?limit=1000"));
        assert_eq!(status, 200, "{history}");
        history["events"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| e["kind"].as_str().unwrap_or("").to_string())
            .collect()
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let agent = self.agent.clone();
        let url = format!("{}{path}", self.url);
        let auth = format!("Bearer {}", self.token);
        let response = if method == "GET" {
            let mut request = agent.get(&url).header("Authorization", &auth);
            for (k, v) in headers {
                request = request.header(*k, *v);
            }
            request.call()
        } else {
            let mut request = agent
                .post(&url)
                .header("Authorization", &auth)
                .header("Content-Type", content_type);
            for (k, v) in headers {
                request = request.header(*k, *v);
            }
            request.send(body)
        };
        let mut response = response.expect("http call");
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        self.request("GET", path, "", b"", &[])
    }

    pub fn submit_yaml(&self, yaml: &str) -> (u16, Value) {
        self.request("POST", "/v1/runs", "application/yaml", yaml.as_bytes(), &[])
    }

    /// Submits and returns the run id, asserting 201.
    pub fn submit(&self, yaml: &str) -> String {
        let (status, body) = self.submit_yaml(yaml);
        assert_eq!(status, 201, "submit answered {body}");
        body["id"].as_str().expect("id").to_string()
    }

    pub fn run(&self, id: &str) -> Value {
        let (status, body) = self.get(&format!("/v1/runs/{id}"));
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Polls until the run is terminal.
    pub fn wait_terminal(&self, id: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let run = self.run(id);
            let state = run["state"].as_str().unwrap_or("");
            if [
                "succeeded",
                "failed",
                "dead_lettered",
                "cancelled",
                "quarantined",
            ]
            .contains(&state)
            {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "run {id} not terminal in time: {run:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls until `check` holds for the run detail.
    pub fn wait_for(&self, id: &str, within: Duration, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let run = self.run(id);
            if check(&run) {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "condition not met in time: {run:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    /// The service goes, and so does everything it left running: no test leaves a
    /// supervisor or a step behind.
    fn drop(&mut self) {
        self.kill9();
        reap_attempts(&self.state_dir.join("attempts"));
    }
}

/// Kills the supervisor and the step (its whole process group) of every attempt
/// directory, each only if it is still the process the directory names (its start time
/// matches, so a reused pid is left alone).
pub fn reap_attempts(attempts: &Path) {
    let Ok(entries) = std::fs::read_dir(attempts) else {
        return;
    };
    for entry in entries.flatten() {
        for (pid, ticks, group) in recorded_processes(&entry.path()) {
            if start_ticks(pid) == Some(ticks) {
                unsafe {
                    libc::kill(if group { -pid } else { pid }, libc::SIGKILL);
                }
            }
        }
    }
}

/// The processes an attempt directory records: (pid, start ticks, is the step). The
/// records of `attempt.jsonl` after its spec: `{"supervisor": ...}`, then `{"child": ...}`.
pub fn recorded_processes(attempt: &Path) -> Vec<(i32, u64, bool)> {
    let Ok(text) = std::fs::read_to_string(attempt.join("attempt.jsonl")) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|record| {
            let (identity, group) = match (&record["supervisor"], &record["child"]) {
                (Value::Object(_), _) => (&record["supervisor"], false),
                (_, Value::Object(_)) => (&record["child"], true),
                _ => return None,
            };
            let pid = i32::try_from(identity["pid"].as_i64()?).ok()?;
            Some((pid, identity["start_ticks"].as_u64()?, group))
        })
        .collect()
}

fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Starts a command under a given umask (services in these tests start under the
/// common 022, whatever this process has).
pub trait UmaskExt {
    fn pre_exec_umask(&mut self, mask: u32) -> &mut Self;
}

impl UmaskExt for Command {
    fn pre_exec_umask(&mut self, mask: u32) -> &mut Self {
        use std::os::unix::process::CommandExt;
        // SAFETY: umask is async-signal-safe.
        unsafe {
            self.pre_exec(move || {
                libc::umask(mask as libc::mode_t);
                Ok(())
            })
        }
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// One HTTP/1.1 request read off `reader`: its headers (lower-case names) and its body
/// (`Content-Length` bytes). `None` when the connection closed before a request line.
pub fn read_http_request(
    reader: &mut impl std::io::BufRead,
) -> Option<(std::collections::HashMap<String, String>, Vec<u8>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let mut headers = std::collections::HashMap::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.trim_end().split_once(": ") {
            headers.insert(name.to_ascii_lowercase(), value.to_string());
        }
    }
    let length = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    let _ = reader.read_exact(&mut body);
    Some((headers, body))
}

/// An HTTPS agent that trusts only the CA certificate `ca` (PEM text).
pub fn tls_agent(ca: &str) -> ureq::Agent {
    let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(ca.as_bytes())
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert.to_owned()),
            _ => None,
        })
        .collect();
    assert!(!certs.is_empty(), "a CA certificate");
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
                .build(),
        )
        .build()
        .into()
}

pub fn attempts(run: &Value, step: usize) -> Vec<Value> {
    run["steps"][step]["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

pub fn fences(run: &Value, step: usize) -> Vec<u64> {
    attempts(run, step)
        .iter()
        .map(|a| a["fence"].as_u64().expect("fence"))
        .collect()
}

/// Waits for a file to exist and hold a pid; returns it.
pub fn wait_pid_file(path: &Path, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid in {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}
