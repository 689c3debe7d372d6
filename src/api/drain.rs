//! Answers that are decided before the request's body is read (a 401 for a bad token, a
//! 413 for a body over the limit) must still reach the client. Closing a TCP connection
//! with unread bytes in its receive queue makes the kernel send a reset instead of a
//! FIN, and a reset makes the client drop the answer it had already received: it sees
//! "connection reset" instead of the 401. So the rest of an unread body is read and
//! discarded after the handler, within a bound, before the answer goes out; the
//! connection then stays usable for the client's next request.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

/// At most this much of an unread body is read and discarded; a client sending more
/// has its connection closed (and may then see a reset).
pub const DRAIN_MAX_BYTES: usize = 256 * 1024;
/// A body that does not arrive within this is abandoned the same way.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Middleware: hands the handler a body it shares with this layer, and after the
/// handler has answered reads what it left of the body.
pub async fn drain_unread_body(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let shared = Shared(Arc::new(Mutex::new(body)));
    let response = next
        .run(Request::from_parts(parts, Body::new(shared.clone())))
        .await;
    if !shared.is_end_stream() {
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, discard(shared, DRAIN_MAX_BYTES)).await;
        if !matches!(drained, Ok(true)) {
            tracing::debug!("an unread request body was not drained; its connection closes");
        }
    }
    response
}

/// Reads and discards frames until the body ends (true) or `max` bytes were read.
async fn discard(mut body: Shared, max: usize) -> bool {
    let mut read = 0usize;
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => return true,
            Some(Err(_)) => return false,
            Some(Ok(frame)) => {
                read += frame.data_ref().map_or(0, Bytes::len);
                if read > max {
                    return false;
                }
            }
        }
    }
}

/// The request body, shared between the handler's copy and this layer's.
#[derive(Clone)]
struct Shared(Arc<Mutex<Body>>);

impl HttpBody for Shared {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut body = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Pin::new(&mut *body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .size_hint()
    }
}
