//! TLS on every connection that may leave the box, with a test CA made at test time:
//! `scarab serve` terminating HTTPS (and reloading its certificate on SIGHUP), curl and
//! the CLI trusting a private CA, an https webhook verified by a TLS receiver, and local
//! steps still reporting outputs over their loopback callback.

use crate::common;

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{BIN, Server};
use hmac::{Hmac, Mac};
use sha2::Sha256;

const WITHIN: Duration = Duration::from_secs(60);
const SECRET: &str = "a-webhook-secret-of-32-bytes-long";

/// A CA and a certificate it signed for 127.0.0.1 and localhost, as PEM files in `dir`.
struct Pki {
    ca: PathBuf,
    ca_pem: String,
    cert: PathBuf,
    key: PathBuf,
}

fn pki(dir: &Path, name: &str) -> Pki {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("Scarab test CA {name}"));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().expect("key"))
        .expect("CA");
    let leaf_key = rcgen::KeyPair::generate().expect("key");
    let leaf =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("params")
            .signed_by(&leaf_key, &ca)
            .expect("leaf");
    let pki = Pki {
        ca: dir.join(format!("{name}-ca.pem")),
        ca_pem: ca.pem(),
        cert: dir.join(format!("{name}-cert.pem")),
        key: dir.join(format!("{name}-key.pem")),
    };
    std::fs::write(&pki.ca, &pki.ca_pem).expect("write");
    std::fs::write(&pki.cert, leaf.pem()).expect("write");
    std::fs::write(&pki.key, leaf_key.serialize_pem()).expect("write");
    pki
}

/// `scarab ARGS`: (exit code, stdout, stderr).
fn scarab(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BIN).args(args).output().expect("scarab");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// One request read off a TLS connection: its headers (lower-case names) and body.
struct Delivery {
    headers: HashMap<String, String>,
    body: String,
}

/// An HTTPS webhook receiver on loopback with `pki`'s certificate: answers 200 and
/// records each request.
fn tls_receiver(pki: &Pki) -> (String, Arc<Mutex<Vec<Delivery>>>) {
    use rustls_pki_types::pem::PemObject;
    let chain = rustls_pki_types::CertificateDer::pem_file_iter(&pki.cert)
        .expect("cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("cert");
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&pki.key).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("config");
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("https://{}/hook", listener.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let connection = rustls::ServerConnection::new(config.clone()).expect("conn");
            let mut tls = rustls::StreamOwned::new(connection, stream);
            let mut reader = BufReader::new(&mut tls);
            // None: a handshake the client gave up (an untrusted certificate).
            let Some((headers, body)) = common::read_http_request(&mut reader) else {
                continue;
            };
            drop(reader);
            record.lock().expect("lock").push(Delivery {
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
            let _ =
                tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let _ = tls.flush();
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    (url, seen)
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

/// curl with `--cacert`: (HTTP status or 0, stderr).
fn curl(url: &str, ca: &Path) -> (u16, String) {
    let output = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(ca)
        .arg(url)
        .output()
        .expect("curl (Debian's curl; .ci/run installs it)");
    (
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap_or(0),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// The service speaks only HTTPS with its certificate: curl and the CLI that trust the
/// test CA get answers, without the CA the CLI is refused with the reason, plain HTTP
/// on the port gets nothing and holds nothing up; a local step reports its output over
/// its loopback callback; an https webhook reaches a TLS receiver with a valid
/// signature; and SIGHUP puts a new certificate (of another CA) in place for new
/// connections.
#[test]
fn https_for_the_api_the_cli_and_webhooks_with_a_test_ca() {
    if Command::new("curl").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must have curl (.ci/run installs it)"
        );
        eprintln!("skipped: curl is not installed (Debian: curl)");
        return;
    }
    let dir = common::tempdir().expect("tempdir");
    let first = pki(dir.path(), "first");
    let second = pki(dir.path(), "second");
    // The service's certificate files: replaced by `second`'s before the SIGHUP.
    let cert = dir.path().join("tls-cert.pem");
    let key = dir.path().join("tls-key.pem");
    std::fs::copy(&first.cert, &cert).expect("copy");
    std::fs::copy(&first.key, &key).expect("copy");
    let (hook, deliveries) = tls_receiver(&first);
    let config = dir.path().join("scarab.toml");
    std::fs::write(
        &config,
        format!(
            "[[webhooks]]\nurl = \"{hook}\"\nsecret = \"{SECRET}\"\nevents = [\"run_state\"]\nca_cert = \"{}\"\n",
            first.ca.display()
        ),
    )
    .expect("config");
    let config_arg = config.to_str().expect("utf-8");
    let server = Server::start_tls(
        &dir.path().join("state"),
        &cert,
        &key,
        &first.ca_pem,
        &["--config", config_arg],
    );
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );

    let (status, stderr) = curl(&format!("{}/healthz", server.url), &first.ca);
    assert_eq!(status, 200, "curl --cacert: {stderr}");
    let (status, _) = curl(&format!("{}/healthz", server.url), &second.ca);
    assert_eq!(status, 0, "another CA's certificate is not trusted");

    let first_ca = first.ca.to_str().expect("utf-8");
    let client = |ca: Option<&str>| {
        let mut args = vec!["runs", "--url", &server.url, "--token", &server.token];
        if let Some(ca) = ca {
            args.extend(["--ca-cert", ca]);
        }
        scarab(&args)
    };
    let (code, stdout, stderr) = client(Some(first_ca));
    assert_eq!(code, 0, "scarab runs --ca-cert: {stderr}");
    assert!(stdout.starts_with("ID"), "{stdout}");
    let (code, _, stderr) = client(None);
    assert_eq!(code, 1, "the system's roots do not know the test CA");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");

    // The dashboard's session cookie is Secure under TLS.
    let login = Command::new("curl")
        .args(["-sS", "-i", "--cacert"])
        .arg(&first.ca)
        .args(["--data-urlencode", &format!("token={}", server.token)])
        .arg(format!("{}/ui/login", server.url))
        .output()
        .expect("curl");
    let login = String::from_utf8_lossy(&login.stdout).to_string();
    let cookie = login
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie: {login}"));
    assert!(
        cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict")
            && cookie.contains("; Secure"),
        "{cookie}"
    );

    // Plain HTTP on the TLS port: refused, and the service goes on.
    let plain = server.url.replace("https://", "http://");
    let (code, _, stderr) = scarab(&["runs", "--url", &plain, "--token", &server.token]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(curl(&format!("{}/healthz", server.url), &first.ca).0, 200);

    // A local step reports an output over its loopback callback; the run's state
    // changes reach the https webhook, signed.
    let id = server.submit(&format!(
        "name: tls\nsteps:\n  - name: build\n    run: ['{BIN}', output, set, digest, 'sha256:abc']\n"
    ));
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(
        run["steps"][0]["attempts"][0]["outputs"]["digest"], "sha256:abc",
        "{run:#}"
    );
    let deadline = Instant::now() + WITHIN;
    loop {
        let seen = deliveries.lock().expect("lock");
        if seen
            .iter()
            .any(|d| d.body.contains(&id) && d.body.contains("succeeded"))
        {
            assert!(seen.iter().all(valid_signature), "every delivery is signed");
            break;
        }
        drop(seen);
        assert!(Instant::now() < deadline, "no https webhook delivery");
        std::thread::sleep(Duration::from_millis(100));
    }

    // SIGHUP: the second CA's certificate for new connections.
    std::fs::copy(&second.cert, &cert).expect("copy");
    std::fs::copy(&second.key, &key).expect("copy");
    server.signal(libc::SIGHUP);
    let deadline = Instant::now() + WITHIN;
    while curl(&format!("{}/healthz", server.url), &second.ca).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the new certificate never served"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(curl(&format!("{}/healthz", server.url), &first.ca).0, 0);
    // A broken file on the next SIGHUP leaves the certificate in use.
    std::fs::write(&key, "not a key").expect("write");
    server.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(curl(&format!("{}/healthz", server.url), &second.ca).0, 200);
    assert!(
        server.log().contains("TLS reload rejected"),
        "{}",
        server.log()
    );
}
