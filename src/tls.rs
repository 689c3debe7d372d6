//! TLS on every connection that may leave the box: the service's own listener (rustls,
//! certificate and key read from PEM files, re-read on SIGHUP), and the HTTPS clients of
//! the CLI and of webhooks (the system's roots, or a CA file for a private CA).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A PEM file larger than this is refused (a certificate chain is a few KiB).
const PEM_MAX_BYTES: u64 = 1024 * 1024;

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    let metadata =
        std::fs::metadata(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if !metadata.is_file() {
        return Err(format!("{what} {}: not a file", path.display()));
    }
    if metadata.len() > PEM_MAX_BYTES {
        return Err(format!(
            "{what} {}: {} bytes, over the limit of {PEM_MAX_BYTES}",
            path.display(),
            metadata.len()
        ));
    }
    std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// The certificates of a PEM file, in order (a chain: the leaf first).
pub fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            path.display()
        ));
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The listener's rustls configuration from a certificate chain and its private key.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = certificates(cert, "tls_cert")?;
    let key_pem = read_pem(key, "tls_key")?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        format!(
            "tls_key {}: no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}",
            key.display()
        )
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            format!(
                "tls_cert {} and tls_key {}: {e}",
                cert.display(),
                key.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The listener's TLS: the configuration in use, replaced whole by `reload`.
pub struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    config: ArcSwap<rustls::ServerConfig>,
}

impl ServerTls {
    /// Reads the certificate and key; an error names the file and what is wrong.
    pub fn load(cert: &Path, key: &Path) -> Result<ServerTls, String> {
        Ok(ServerTls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            config: ArcSwap::new(server_config(cert, key)?),
        })
    }

    /// Re-reads both files (SIGHUP). On an error the configuration in use stays.
    /// New connections get the new certificate; open ones keep theirs.
    pub fn reload(&self) -> Result<(), String> {
        self.config.store(server_config(&self.cert, &self.key)?);
        Ok(())
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.load_full())
    }
}

/// An HTTPS client's trust: the system's roots, or only the CA certificates of
/// `ca_cert` (a private CA).
pub fn client_config(ca_cert: Option<&Path>) -> Result<ureq::tls::TlsConfig, String> {
    let roots = match ca_cert {
        None => ureq::tls::RootCerts::PlatformVerifier,
        Some(path) => {
            let certs = certificates(path, "CA certificate")?;
            let certs: Vec<ureq::tls::Certificate<'static>> = certs
                .into_iter()
                .map(|der| ureq::tls::Certificate::from_der(der.as_ref()).to_owned())
                .collect();
            ureq::tls::RootCerts::new_with_certs(&certs)
        }
    };
    Ok(ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .root_certs(roots)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_refused_naming_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let missing = dir.path().join("missing.pem");
        for (path, expected) in [
            (&empty, "no PEM certificate"),
            (&missing, "No such file"),
            (&garbage, "garbage.pem"),
        ] {
            let error = server_config(path, path).unwrap_err();
            assert!(error.starts_with("tls_cert "), "{error}");
            assert!(error.contains(expected), "{error}");
            let error = client_config(Some(path)).unwrap_err();
            assert!(error.starts_with("CA certificate "), "{error}");
        }
        let key = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, key.cert.pem()).unwrap();
        let error = server_config(&cert, &empty).unwrap_err();
        assert!(error.starts_with("tls_key "), "{error}");
        let key_file = dir.path().join("key.pem");
        std::fs::write(&key_file, key.signing_key.serialize_pem()).unwrap();
        assert!(server_config(&cert, &key_file).is_ok());
        // A key that does not match the certificate.
        let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(&key_file, other.signing_key.serialize_pem()).unwrap();
        let error = server_config(&cert, &key_file).unwrap_err();
        assert!(
            error.contains("cert.pem") && error.contains("key.pem"),
            "{error}"
        );
    }
}
