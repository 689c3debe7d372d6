//! The HTTP listener: Scarab's own accept loop around hyper, so that clients can never
//! take what running steps need. Every connection has a header-read timeout (which also
//! closes idle keep-alive connections), the number of open connections is capped (beyond
//! the cap a new connection is closed at once), accept errors such as running out of
//! file descriptors back off instead of spinning, and a stop lets in-flight requests
//! finish.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::limits;

/// Serves `router` on `listener` until `stop` completes, then waits for the requests in
/// flight. With `tls`, every connection is TLS: its handshake runs in the connection's own
/// task within the header-read timeout, so a slow or plain-HTTP client holds up nobody.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    stop: impl Future<Output = ()>,
    tls: Option<Arc<crate::tls::ServerTls>>,
) {
    let connections_max = connections_max();
    tracing::info!(connections_max, "accepting connections");
    let permits = Arc::new(Semaphore::new(connections_max));
    let graceful = GracefulShutdown::new();
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut refused: u64 = 0;
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                stream
            }
            Err(error) => {
                // EMFILE, ENFILE, ENOBUFS...: wait for connections to close rather than
                // spin on the error.
                tracing::warn!(%error, backoff_ms = backoff.as_millis() as u64, "accepting a connection failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    connections_max,
                    refused,
                    "too many open connections: closing new ones at once"
                );
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let watcher = graceful.watcher();
        let router = router.clone();
        match &tls {
            None => {
                tokio::spawn(async move {
                    let _ = watcher.watch(http(stream, router)).await;
                    drop(permit);
                });
            }
            Some(tls) => {
                let acceptor = tls.acceptor();
                tokio::spawn(async move {
                    let handshake = tokio::time::timeout(
                        limits::HTTP_HEADER_READ_TIMEOUT,
                        acceptor.accept(stream),
                    )
                    .await;
                    match handshake {
                        Ok(Ok(stream)) => {
                            let _ = watcher.watch(http(stream, router)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                    drop(permit);
                });
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

/// One HTTP/1.1 connection over `stream` (plain TCP or TLS).
fn http<S>(
    stream: S,
    router: Router,
) -> hyper::server::conn::http1::Connection<TokioIo<S>, TowerToHyperService<Router>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits::HTTP_HEADER_READ_TIMEOUT)
        // Twice the limit: requests between the two get the API's JSON 431
        // (`header_limit`); only larger ones get hyper's bare one.
        .max_buf_size(2 * limits::HTTP_HEADER_MAX_BYTES.max(8192))
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router))
}

const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The cap on open client connections: `limits::HTTP_CONNECTIONS_MAX`, but never more than
/// a quarter of the file descriptors this process may open, so that launches, pidfds,
/// the store and logs always have theirs.
fn connections_max() -> usize {
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let share = usize::try_from(nofile / 4).unwrap_or(usize::MAX);
    limits::HTTP_CONNECTIONS_MAX.min(share).max(16)
}

/// Raises this process's soft limit on open files to its hard limit (as systemd's
/// `LimitNOFILE` or the shell allows), so the connection cap has room below it.
pub fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(error) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!(%error, "cannot raise the open files limit");
        }
    }
}
