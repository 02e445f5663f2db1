//! Request size limits, decided at the edge before anything reaches booking.
//!
//! Guarantees: a request whose header block is over `gateway.max_header_bytes` (16 KiB) is
//! answered `431 HEADERS_TOO_LARGE` and goes nowhere; a request body over booking's own limit
//! (`[booking] body_limit_bytes`, which the gateway reads from the same file; for the payment
//! webhook the smaller of that and `gateway.webhook_max_body_bytes`) is answered
//! `413 BODY_TOO_LARGE` by the gateway on both proxy paths, every time — at once when the declared `Content-Length` is over the limit
//! (booking is not contacted), and for a streamed (chunked) body as soon as the bytes seen
//! pass it (booking then never receives a complete request). Booking is never left to refuse
//! the body itself: it would close the connection at its limit while the gateway was still
//! sending, and the fan would get a `502`.

use crate::respond::Reply;
use pingora_http::RequestHeader;
use shared::error::{ErrorBody, codes};

/// Bytes of the request line and header block as received (names, values, `: ` and CRLFs).
pub fn header_block_len(req: &RequestHeader) -> usize {
    let target = req.uri.path_and_query().map_or(1, |p| p.as_str().len());
    let line = req.method.as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let headers: usize = req
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + 2 + v.len() + 2)
        .sum();
    line + headers + 2
}

/// The declared body length, when the request declares one (`Content-Length`). pingora has
/// already refused conflicting or malformed lengths.
pub fn declared_len(req: &RequestHeader) -> Option<u64> {
    req.headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// True when the declared body is over `limit` (the request is refused without reading it).
pub fn declared_too_large(req: &RequestHeader, limit: usize) -> bool {
    declared_len(req).is_some_and(|n| n > limit as u64)
}

/// Counts a streamed body against `limit`.
#[derive(Debug, Clone, Copy, Default)]
pub struct BodyBudget {
    seen: usize,
    limit: usize,
}

impl BodyBudget {
    pub fn new(limit: usize) -> Self {
        Self { seen: 0, limit }
    }

    /// The limit the body is counted against (named in the `413`).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Adds a chunk; `false` when the body is now over the limit (the chunk must not be
    /// forwarded).
    pub fn take(&mut self, chunk: usize) -> bool {
        self.seen = self.seen.saturating_add(chunk);
        self.seen <= self.limit
    }
}

pub fn body_too_large(limit: usize) -> Reply {
    Reply::from_error(
        413,
        ErrorBody::new(
            codes::BODY_TOO_LARGE,
            format!("request body larger than {limit} bytes"),
        )
        .with("limit_bytes", limit),
    )
}

pub fn header_too_large(limit: usize) -> Reply {
    Reply::from_error(
        431,
        ErrorBody::new(
            codes::HEADERS_TOO_LARGE,
            format!("request headers larger than {limit} bytes"),
        )
        .with("limit_bytes", limit),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_block_is_measured_as_sent() {
        let mut req = RequestHeader::build("GET", b"/api/x?y=1", None).unwrap();
        // "GET /api/x?y=1 HTTP/1.1\r\n" + "\r\n"
        assert_eq!(header_block_len(&req), 25 + 2);
        req.insert_header("host", "a").unwrap();
        assert_eq!(header_block_len(&req), 25 + "host: a\r\n".len() + 2);
        req.insert_header("x-big", "a".repeat(100 * 1024)).unwrap();
        assert!(header_block_len(&req) > 100 * 1024);
    }

    #[test]
    fn declared_lengths_over_the_limit_are_refused() {
        let mut req = RequestHeader::build("POST", b"/api/x", None).unwrap();
        assert!(!declared_too_large(&req, 10), "no length declared");
        req.insert_header("content-length", "10").unwrap();
        assert!(!declared_too_large(&req, 10));
        req.insert_header("content-length", "11").unwrap();
        assert!(declared_too_large(&req, 10));
        req.insert_header("content-length", u64::MAX.to_string())
            .unwrap();
        assert!(declared_too_large(&req, 1 << 40));
    }

    #[test]
    fn streamed_bodies_are_counted() {
        let mut b = BodyBudget::new(10);
        assert!(b.take(4));
        assert!(b.take(6), "exactly the limit is allowed");
        assert!(!b.take(1));
        let mut b = BodyBudget::new(10);
        assert!(!b.take(usize::MAX));
        assert!(!b.take(usize::MAX), "saturates, never wraps");
    }
}
