//! The upstream leg of admitted API calls: one HTTP/1.1 exchange with a booking upstream over
//! a pooled keep-alive connection, without pingora-proxy's proxy loop.
//!
//! Why: per request, pingora-proxy's loop (a channel pair, the request and response headers
//! copied into its task types, an idle-watch task spawned for every pooled connection, several
//! timers) cost ~7.5 µs of user CPU where nginx spends ~2 µs for the whole request
//! (docs/decisions.md). Pingora still accepts the connection, parses the fan's request,
//! routes, runs our checks and writes the answer; only the hop to booking is done here, and
//! only for requests that need none of pingora's streaming machinery (`eligible`): everything
//! else — WebSockets, chunked or large request bodies, `Expect`, webhooks — still goes
//! through pingora-proxy.
//!
//! The rules kept: a connection failure tries the next healthy upstream and marks the failed
//! one down; a request that was sent is never sent again, except an idempotent one whose
//! reused keep-alive connection turned out to be closed before any answer; hop-by-hop headers
//! are not forwarded; responses are framed by `Content-Length`, chunked encoding or the
//! connection closing, as RFC 9112 says, and any malformed answer is a 502.

use crate::upstream::{Upstreams, connect};
use bytes::{Buf, Bytes, BytesMut};
use pingora_http::{RequestHeader, ResponseHeader};
use std::ops::Range;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response header block and body accepted from an upstream.
const HEAD_MAX: usize = 64 * 1024;
const RESPONSE_MAX: usize = 64 * 1024 * 1024;
const MAX_HEADERS: usize = 100;

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1).
fn hop_by_hop(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// Whether the fast path may carry this request: no upgrade, no `Expect`, no chunked body,
/// and a body (if any) of known length up to `body_max` (booking's body limit: larger ones
/// are refused before this is asked, see `size.rs`).
pub fn eligible(req: &RequestHeader, body_max: usize) -> bool {
    let h = &req.headers;
    if h.contains_key(http::header::UPGRADE)
        || h.contains_key(http::header::EXPECT)
        || h.contains_key(http::header::TRANSFER_ENCODING)
        || req.version != http::Version::HTTP_11 && req.version != http::Version::HTTP_10
    {
        return false;
    }
    let mut lengths = h.get_all(http::header::CONTENT_LENGTH).iter();
    match (lengths.next(), lengths.next()) {
        (None, _) => true,
        (Some(v), None) => v
            .to_str()
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|n| n <= body_max),
        _ => false,
    }
}

/// Headers the gateway sets on every forwarded call (`extra`) that are not `x-floodgate-*`: a
/// fan's own are dropped, or booking would read the fan's (first) value.
const GATEWAY_SET: [&str; 1] = [shared::headers::REQUEST_ID];

/// Serializes the request for the upstream: request line, the fan's headers minus hop-by-hop
/// ones, `x-floodgate-*`, `x-request-id` and `Content-Length`, then `extra`, then the body's
/// length.
pub fn encode_request<'k, 'v>(
    req: &RequestHeader,
    internal_prefix: &str,
    extra: impl IntoIterator<Item = (&'k str, &'v str)>,
    body: &[u8],
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    let target = req.uri.path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (k, v) in &req.headers {
        let name = k.as_str();
        if hop_by_hop(name)
            || name.starts_with(internal_prefix)
            || k == http::header::CONTENT_LENGTH
            || GATEWAY_SET.contains(&name)
        {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for (k, v) in extra {
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let has_body_semantics = matches!(
        req.method,
        http::Method::POST | http::Method::PUT | http::Method::PATCH
    );
    if !body.is_empty() || has_body_semantics {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

pub struct Answer {
    pub head: Box<ResponseHeader>,
    pub body: Bytes,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// No healthy upstream accepted a connection: nothing was sent.
    Unavailable,
    /// The upstream did not answer within the read timeout.
    Timeout,
    /// The request was (or may have been) sent and no valid answer came back.
    Broken,
}

/// What went wrong in one exchange on one connection.
enum Trip {
    /// Closed or reset before a single byte of answer: on a reused connection, the upstream
    /// had closed it while idle.
    ClosedEarly,
    Timeout,
    Broken,
}

/// Sends `request` to a healthy upstream and reads its answer. `tried` and `chosen` are the
/// caller's record of upstreams attempted (bit mask) and the one that answered or failed.
pub async fn exchange(
    ups: &Upstreams,
    request: &[u8],
    idempotent: bool,
    head_only: bool,
    tried: &mut u64,
    chosen: &mut Option<usize>,
) -> Result<Answer, Failure> {
    loop {
        let i = ups.pick(*tried).ok_or(Failure::Unavailable)?;
        *tried |= 1 << i;
        *chosen = Some(i);
        let Some(addr) = ups.addr(i) else {
            return Err(Failure::Unavailable);
        };
        let (mut stream, reused) = match ups.take_idle(i) {
            Some(s) => (s, true),
            None => match connect(addr, ups.connect_timeout).await {
                Ok(s) => (s, false),
                Err(failure) => {
                    ups.connect_failed(i, failure);
                    continue;
                }
            },
        };
        let mut result = round_trip(&mut stream, request, head_only, ups.read_timeout).await;
        if reused && idempotent && matches!(result, Err(Trip::ClosedEarly)) {
            // The pooled connection was already dead; the upstream saw no request on it.
            stream = match connect(addr, ups.connect_timeout).await {
                Ok(fresh) => fresh,
                Err(failure) => {
                    ups.connect_failed(i, failure);
                    continue;
                }
            };
            result = round_trip(&mut stream, request, head_only, ups.read_timeout).await;
        }
        return match result {
            Ok((answer, keep)) => {
                if keep {
                    ups.put_idle(i, stream);
                }
                Ok(answer)
            }
            Err(Trip::Timeout) => Err(Failure::Timeout),
            Err(Trip::ClosedEarly | Trip::Broken) => Err(Failure::Broken),
        };
    }
}

/// Reads more into `buf` within `within`; `Ok(0)` is the peer closing.
async fn fill(s: &mut TcpStream, buf: &mut BytesMut, within: Duration) -> Result<usize, Trip> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(8192);
    }
    match tokio::time::timeout(within, s.read_buf(buf)).await {
        Err(_) => Err(Trip::Timeout),
        Ok(Err(_)) => Err(Trip::Broken),
        Ok(Ok(n)) => Ok(n),
    }
}

enum Framing {
    Empty,
    Length(usize),
    Chunked,
    UntilClose,
}

/// One request and its answer on `s`. Returns the answer and whether `s` can be reused.
async fn round_trip(
    s: &mut TcpStream,
    request: &[u8],
    head_only: bool,
    within: Duration,
) -> Result<(Answer, bool), Trip> {
    match tokio::time::timeout(within, s.write_all(request)).await {
        Err(_) => return Err(Trip::Timeout),
        // Nothing was answered yet: for a reused connection this is the idle-close race.
        Ok(Err(_)) => return Err(Trip::ClosedEarly),
        Ok(Ok(())) => {}
    }
    let mut buf = BytesMut::with_capacity(4096);
    let mut seen_any = false;
    let (head, framing, keep) = loop {
        match parse_head(&mut buf, head_only)? {
            Some(Parsed::Interim) => continue,
            Some(Parsed::Final(head, framing, keep)) => break (head, framing, keep),
            None => {}
        }
        if buf.len() > HEAD_MAX {
            return Err(Trip::Broken);
        }
        match fill(s, &mut buf, within).await {
            Ok(0) if !seen_any => return Err(Trip::ClosedEarly),
            Ok(0) => return Err(Trip::Broken),
            Ok(_) => seen_any = true,
            Err(Trip::Broken) if !seen_any => return Err(Trip::ClosedEarly),
            Err(e) => return Err(e),
        }
    };
    let (body, reusable) = match framing {
        Framing::Empty => (Bytes::new(), buf.is_empty()),
        Framing::Length(n) => {
            if n > RESPONSE_MAX {
                return Err(Trip::Broken);
            }
            while buf.len() < n {
                if fill(s, &mut buf, within).await? == 0 {
                    return Err(Trip::Broken);
                }
            }
            let body = buf.split_to(n).freeze();
            (body, buf.is_empty())
        }
        Framing::Chunked => {
            let mut body = BytesMut::new();
            loop {
                match dechunk(&mut buf, &mut body)? {
                    true => break,
                    false => {
                        if body.len() + buf.len() > RESPONSE_MAX {
                            return Err(Trip::Broken);
                        }
                        if fill(s, &mut buf, within).await? == 0 {
                            return Err(Trip::Broken);
                        }
                    }
                }
            }
            (body.freeze(), buf.is_empty())
        }
        Framing::UntilClose => {
            while fill(s, &mut buf, within).await? > 0 {
                if buf.len() > RESPONSE_MAX {
                    return Err(Trip::Broken);
                }
            }
            (buf.split().freeze(), false)
        }
    };
    Ok((Answer { head, body }, keep && reusable))
}

enum Parsed {
    /// A 1xx answer, skipped.
    Interim,
    /// The final header, its body framing, and whether the connection stays open.
    Final(Box<ResponseHeader>, Framing, bool),
}

/// Parses an answer's header block if `buf` holds all of it, and takes it off the front of
/// `buf`. Header values are slices of the received block (no copy per header).
fn parse_head(buf: &mut BytesMut, head_only: bool) -> Result<Option<Parsed>, Trip> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut headers);
    let len = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Trip::Broken),
    };
    let code = r.code.ok_or(Trip::Broken)?;
    if (100..200).contains(&code) {
        // 101 would switch protocols, which the fast path never asks for.
        if code == 101 {
            return Err(Trip::Broken);
        }
        buf.advance(len);
        return Ok(Some(Parsed::Interim));
    }
    let mut keep = r.version == Some(1);
    let mut length: Option<usize> = None;
    let mut chunked = None;
    // Where the headers passed on sit in the block (name, value): the parsed slices borrow
    // `buf`, which is split off below, so only their positions are kept.
    let base = buf.as_ptr() as usize;
    let at = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };
    let mut pass: [(Range<usize>, Range<usize>); MAX_HEADERS] =
        std::array::from_fn(|_| (0..0, 0..0));
    let mut passed = 0;
    for h in r.headers.iter() {
        if h.name.eq_ignore_ascii_case("connection") {
            if std::str::from_utf8(h.value).map_or(true, |v| {
                v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"))
            }) {
                keep = false;
            }
            continue;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.rsplit(',').next())
                .map(str::trim);
            chunked = Some(last.is_some_and(|c| c.eq_ignore_ascii_case("chunked")));
            continue;
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or(Trip::Broken)?;
            if length.is_some_and(|l| l != n) {
                return Err(Trip::Broken);
            }
            length = Some(n);
            continue;
        }
        if hop_by_hop(h.name) {
            continue;
        }
        pass[passed] = (at(h.name.as_bytes()), at(h.value));
        passed += 1;
    }
    let block = buf.split_to(len).freeze();
    // No case map: header case carries no meaning (RFC 9110 §5.1), and keeping the upstream's
    // spelling would cost a second map and a copy of every name.
    let mut head =
        ResponseHeader::build_no_case(code, Some(passed + 1)).map_err(|_| Trip::Broken)?;
    for (name, value) in &pass[..passed] {
        let name = http::HeaderName::from_bytes(&block[name.clone()]).map_err(|_| Trip::Broken)?;
        let value = http::HeaderValue::from_maybe_shared(block.slice(value.clone()))
            .map_err(|_| Trip::Broken)?;
        head.append_header(name, value).map_err(|_| Trip::Broken)?;
    }
    if head_only && let Some(n) = length {
        // A HEAD answer describes the body it did not send.
        head.append_header(http::header::CONTENT_LENGTH, n)
            .map_err(|_| Trip::Broken)?;
    }
    let framing = if head_only || code == 204 || code == 304 {
        Framing::Empty
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::UntilClose,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::UntilClose,
        }
    };
    if matches!(framing, Framing::UntilClose) {
        keep = false;
    }
    Ok(Some(Parsed::Final(Box::new(head), framing, keep)))
}

/// Moves the complete chunks at the front of `buf` into `body`. `Ok(true)` once the last
/// chunk and the trailers are consumed; `Ok(false)` when more input is needed.
fn dechunk(buf: &mut BytesMut, body: &mut BytesMut) -> Result<bool, Trip> {
    loop {
        let Some(eol) = find_crlf(buf) else {
            return if buf.len() > 1024 {
                Err(Trip::Broken)
            } else {
                Ok(false)
            };
        };
        let line = std::str::from_utf8(&buf[..eol]).map_err(|_| Trip::Broken)?;
        let hex = line.split(';').next().unwrap_or("").trim();
        if hex.is_empty() || hex.len() > 15 {
            return Err(Trip::Broken);
        }
        let size = usize::from_str_radix(hex, 16).map_err(|_| Trip::Broken)?;
        if size == 0 {
            // Trailers (ignored) up to an empty line.
            let mut at = eol + 2;
            loop {
                let Some(end) = find_crlf(&buf[at..]) else {
                    return if buf.len() - at > HEAD_MAX {
                        Err(Trip::Broken)
                    } else {
                        Ok(false)
                    };
                };
                if end == 0 {
                    buf.advance(at + 2);
                    return Ok(true);
                }
                at += end + 2;
            }
        }
        let need = eol + 2 + size + 2;
        if buf.len() < need {
            return Ok(false);
        }
        if &buf[need - 2..need] != b"\r\n" {
            return Err(Trip::Broken);
        }
        body.extend_from_slice(&buf[eol + 2..eol + 2 + size]);
        buf.advance(need);
    }
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

#[cfg(test)]
mod tests;
