//! The web dashboard in a real browser: Debian's Chromium, headless, driven through
//! ChromeDriver's WebDriver protocol (W3C WebDriver over HTTP; the small client below
//! speaks the handful of commands the tests need). `.ci/run` installs both packages;
//! without them the tests skip with a message, and fail under CI.
//!
//! Screenshots of every page land in `target/tmp/dashboard-screens/`.

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};
use sha2::Digest;

use common::Server;

const WITHIN: Duration = Duration::from_secs(60);
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// ChromeDriver on a free loopback port, killed on drop.
struct Driver {
    child: Child,
    url: String,
    agent: ureq::Agent,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn browser_available() -> bool {
    let found = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
    };
    if found("chromium") && found("chromedriver") {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must have chromium and chromium-driver (.ci/run installs them)"
    );
    eprintln!(
        "skipped: chromium or chromedriver is not installed (Debian: chromium chromium-driver)"
    );
    false
}

impl Driver {
    fn start() -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver");
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            agent: common::agent(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut response) = driver.agent.get(format!("{}/status", driver.url)).call()
                && let Ok(status) = response.body_mut().read_json::<Value>()
                && status["value"]["ready"] == true
            {
                return driver;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn send(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.url);
        let response = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            (_, body) => self
                .agent
                .post(&url)
                .send_json(body.unwrap_or_else(|| json!({}))),
        };
        let mut response = response.expect("webdriver call");
        let value: Value = response.body_mut().read_json().expect("webdriver json");
        value["value"].clone()
    }

    fn session(&self) -> Browser<'_> {
        let answer = self.send(
            "POST",
            "/session",
            Some(json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": "/usr/bin/chromium",
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--window-size=1400,1100"]
                }
            }}})),
        );
        let id = answer["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_string();
        Browser { driver: self, id }
    }
}

/// One browser session.
struct Browser<'a> {
    driver: &'a Driver,
    id: String,
}

impl Drop for Browser<'_> {
    fn drop(&mut self) {
        self.driver
            .send("DELETE", &format!("/session/{}", self.id), None);
    }
}

impl Browser<'_> {
    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.driver
            .send(method, &format!("/session/{}{path}", self.id), body)
    }

    fn go(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({"url": url})));
    }

    fn current_url(&self) -> String {
        self.cmd("GET", "/url", None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The elements matching `css` now.
    fn all(&self, css: &str) -> Vec<String> {
        self.cmd(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        )
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e[ELEMENT].as_str().map(str::to_string))
        .collect()
    }

    /// Waits until `css` matches an element whose text satisfies `check`; returns it.
    fn wait(&self, css: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WITHIN;
        loop {
            for element in self.all(css) {
                let text = self.text(&element);
                if check(&text) {
                    return element;
                }
            }
            if Instant::now() >= deadline {
                let source = self.cmd("GET", "/source", None);
                let source: String = source
                    .as_str()
                    .unwrap_or_default()
                    .chars()
                    .take(3000)
                    .collect();
                panic!(
                    "waited for {what} ({css}) on {}:\n{source}",
                    self.current_url()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn text(&self, element: &str) -> String {
        self.cmd("GET", &format!("/element/{element}/text"), None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn click(&self, element: &str) {
        self.cmd(
            "POST",
            &format!("/element/{element}/click"),
            Some(json!({})),
        );
    }

    fn type_into(&self, element: &str, text: &str) {
        self.cmd(
            "POST",
            &format!("/element/{element}/value"),
            Some(json!({"text": text})),
        );
    }

    fn script(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/async",
            Some(json!({"script": script, "args": []})),
        )
    }

    fn screenshot(&self, name: &str) {
        let png = self.cmd("GET", "/screenshot", None);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .expect("a PNG");
        let dir = screens();
        std::fs::create_dir_all(&dir).expect("screens dir");
        std::fs::write(dir.join(format!("{name}.png")), bytes).expect("screenshot");
    }

    fn login(&self, server: &Server, token: &str) {
        self.go(&format!("{}/ui/login", server.url));
        let field = self.wait("#token", "the token field", |_| true);
        self.type_into(&field, token);
        self.click(&self.wait("#sign-in", "the sign-in button", |_| true));
        self.wait("#who", "the signed-in name", |t| !t.is_empty());
    }
}

fn screens() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screens")
}

const READER_TOKEN: &str = "a-read-only-token-for-the-dashboard";

fn server(dir: &std::path::Path) -> Server {
    let digest: String = sha2::Sha256::digest(READER_TOKEN.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let config = dir.join("scarab.toml");
    std::fs::write(
        &config,
        format!("[[tokens]]\nname = \"viewer\"\nrole = \"read_only\"\nsha256 = \"{digest}\"\n"),
    )
    .expect("config");
    Server::start_with(
        &dir.join("state"),
        &["--config", config.to_str().expect("utf-8")],
    )
}

const GATED: &str = "name: release\nsteps:\n  - name: prep\n    run: [sh, -c, 'echo hello from prep; sleep 1; echo prep done']\n  - name: approve\n    needs: [prep]\n    gate: {message: ship it?}\n  - name: deploy\n    needs: [approve]\n    run: [sh, -c, 'echo deployed']\n";

/// Log in, see a submitted run appear without reloading, open it, see the DAG and a
/// live log line, approve its gate by clicking, see the run finish; then the queue and
/// operator pages; a read-only login has no approve button and its writes are refused.
#[test]
fn the_dashboard_follows_a_run_live_and_approves_its_gate() {
    if !browser_available() {
        return;
    }
    let dir = common::tempdir().expect("tempdir");
    let server = server(dir.path());
    let driver = Driver::start();
    let browser = driver.session();

    // The security headers every page carries.
    let response = server
        .agent()
        .get(format!("{}/ui/login", server.url))
        .call()
        .expect("login page");
    let csp = response
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );

    browser.go(&format!("{}/", server.url));
    assert!(
        browser.current_url().ends_with("/ui/login"),
        "{}",
        browser.current_url()
    );
    browser.screenshot("login");
    browser.login(&server, &server.token);
    assert!(
        browser.current_url().ends_with("/ui/runs"),
        "{}",
        browser.current_url()
    );

    // Submitted while the page is open: it appears without a reload.
    let marker = "the-page-was-not-reloaded";
    browser.script(&format!(
        "const done = arguments[arguments.length - 1]; window['{marker}'] = true; done(true);"
    ));
    let id = server.submit(GATED);
    let row = browser.wait(
        &format!("tr.run[data-run=\"{id}\"]"),
        "the new run's row",
        |text| text.contains("release"),
    );
    let still = browser.script(&format!(
        "const done = arguments[arguments.length - 1]; done(window['{marker}'] === true);"
    ));
    assert_eq!(still, true, "the runs page was reloaded");
    browser.screenshot("runs");

    // Open it: the DAG, and a live log line.
    let link = browser.all(&format!("tr.run[data-run=\"{id}\"] a"));
    assert_eq!(link.len(), 1, "{row}");
    browser.click(&link[0]);
    browser.wait("svg#dag", "the DAG", |_| true);
    assert_eq!(browser.all("svg#dag .node").len(), 3);
    assert_eq!(browser.all("svg#dag .edge").len(), 2);
    browser.wait("#log-prep-1", "the live log", |text| {
        text.contains("hello from prep")
    });
    // The gate opens once prep is done; its approve button comes with the refresh.
    let approve = browser.wait("#approve-approve", "the approve button", |_| true);
    browser.screenshot("run-waiting");
    let comment = browser.all("#step-approve input[name=comment]");
    browser.type_into(&comment[0], "looks good");
    browser.click(&approve);
    browser.wait("h1 .badge", "the run to succeed", |text| {
        text == "succeeded"
    });
    browser.wait("#step-approve .gate", "the decision", |text| {
        text.contains("approved") && text.contains("looks good")
    });
    browser.screenshot("run-succeeded");
    let run = server.run(&id);
    assert_eq!(run["state"], "succeeded");
    let decision = &run["steps"][1]["gate"]["decision"];
    assert_eq!(decision["outcome"], "approved");
    assert_eq!(decision["comment"], "looks good");
    assert_eq!(decision["by"], "admin (admin (dashboard))", "{decision}");

    browser.go(&format!("{}/ui/queue", server.url));
    browser.wait("h1", "the queue page", |t| t == "Queue");
    browser.screenshot("queue");
    browser.go(&format!("{}/ui/operator", server.url));
    browser.wait(".card", "readiness", |t| t.contains("ready"));
    browser.screenshot("operator");

    // A read-only login: no write buttons, and the server refuses its writes.
    let second = server.submit(GATED);
    server.wait_for(&second, WITHIN, |run| run["state"] == "waiting");
    let reader = driver.session();
    reader.login(&server, READER_TOKEN);
    reader.wait("#who", "the reader's name", |t| {
        t.contains("viewer") && t.contains("read_only")
    });
    reader.go(&format!("{}/ui/runs/{second}", server.url));
    reader.wait("#step-approve .gate", "the open gate", |t| {
        t.contains("waiting")
    });
    assert!(
        reader.all("#approve-approve").is_empty(),
        "a read-only user sees no approve button"
    );
    assert!(reader.all("#cancel").is_empty(), "nor a cancel button");
    reader.screenshot("run-read-only");
    let status = reader.script(&format!(
        "const done = arguments[arguments.length - 1];
         const csrf = document.querySelector('input[name=csrf]').value;
         fetch('/ui/runs/{second}/gates/approve/approve', {{method: 'POST', body: new URLSearchParams({{csrf}})}})
           .then(r => done(r.status), () => done(0));"
    ));
    assert_eq!(status, 403, "the server refuses a read-only write");
    // And a write without the session's CSRF token is refused even for the admin.
    let status = browser.script(&format!(
        "const done = arguments[arguments.length - 1];
         fetch('/ui/runs/{second}/cancel', {{method: 'POST', body: new URLSearchParams({{csrf: 'forged'}})}})
           .then(r => done(r.status), () => done(0));"
    ));
    assert_eq!(status, 403, "a forged CSRF token is refused");
    assert_eq!(server.run(&second)["state"], "waiting", "nothing changed");
}
