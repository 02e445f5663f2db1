//! Building and sending the gateway's own responses (waiting-room JSON, errors, static
//! files). Every error body is the shared `{"code", "message", ...}` shape.

use bytes::Bytes;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use serde::Serialize;
use shared::error::ErrorBody;

/// A complete response the gateway answers itself.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    /// `Cache-Control`; API answers are never cached.
    pub cache: &'static str,
}

impl Reply {
    pub fn json<T: Serialize>(status: u16, value: &T) -> Reply {
        match serde_json::to_vec(value) {
            Ok(body) => Reply {
                status,
                body: Bytes::from(body),
                content_type: "application/json",
                headers: Vec::new(),
                cache: "no-store",
            },
            Err(_) => Reply::error(500, shared::error::codes::INTERNAL, "internal error"),
        }
    }

    pub fn error(status: u16, code: &str, message: &str) -> Reply {
        Reply::from_error(status, ErrorBody::new(code, message))
    }

    pub fn from_error(status: u16, body: ErrorBody) -> Reply {
        Reply {
            status,
            body: Bytes::from(body.to_json()),
            content_type: "application/json",
            headers: Vec::new(),
            cache: "no-store",
        }
    }

    pub fn bytes(
        status: u16,
        content_type: &'static str,
        body: Bytes,
        cache: &'static str,
    ) -> Reply {
        Reply {
            status,
            body,
            content_type,
            headers: Vec::new(),
            cache,
        }
    }

    pub fn redirect(to: &str) -> Reply {
        Reply {
            status: 302,
            body: Bytes::new(),
            content_type: "text/plain",
            headers: vec![("location", to.to_owned())],
            cache: "no-store",
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    /// Adds `Retry-After` (seconds).
    pub fn retry_after(self, secs: u64) -> Reply {
        self.header("retry-after", secs.max(1).to_string())
    }
}

/// Writes `reply` to the client. Returns `Ok(true)` so `request_filter` can return it directly.
pub async fn send(session: &mut Session, reply: Reply) -> pingora_core::Result<bool> {
    let mut h = ResponseHeader::build(reply.status, Some(4 + reply.headers.len()))?;
    h.insert_header("content-type", reply.content_type)?;
    h.insert_header("content-length", reply.body.len().to_string())?;
    h.insert_header("cache-control", reply.cache)?;
    for (k, v) in reply.headers {
        h.append_header(k, v)?;
    }
    let head_only = session.req_header().method == http::Method::HEAD;
    let empty = reply.body.is_empty() || head_only;
    session.write_response_header(Box::new(h), empty).await?;
    if !empty {
        session.write_response_body(Some(reply.body), true).await?;
    }
    Ok(true)
}

/// Reads the whole request body, refusing more than `limit` bytes.
pub async fn read_body(session: &mut Session, limit: usize) -> Result<Bytes, BodyError> {
    let mut buf = bytes::BytesMut::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if buf.len() + chunk.len() > limit {
                    return Err(BodyError::TooLarge);
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(buf.freeze()),
            Err(_) => return Err(BodyError::Unreadable),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    TooLarge,
    Unreadable,
}

impl BodyError {
    pub fn reply(self) -> Reply {
        match self {
            BodyError::TooLarge => Reply::error(
                413,
                shared::error::codes::PAYLOAD_TOO_LARGE,
                "request body too large",
            ),
            BodyError::Unreadable => Reply::error(
                400,
                shared::error::codes::INVALID_REQUEST,
                "request body could not be read",
            ),
        }
    }
}

/// Reads a body of at most `limit` bytes and parses it as JSON ([`read_body`], [`parse_json`]):
/// the refusal is the answer to send.
pub async fn read_json<T: serde::de::DeserializeOwned>(
    session: &mut Session,
    limit: usize,
) -> Result<T, Reply> {
    let body = read_body(session, limit).await.map_err(BodyError::reply)?;
    parse_json(&body)
}

/// Parses a JSON body: syntax errors are `400 MALFORMED_JSON`, wrong fields or types
/// `422 VALIDATION_FAILED` (the same split booking makes).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Reply> {
    use serde_json::error::Category;
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        Category::Data => Reply::from_error(
            422,
            ErrorBody::new(
                shared::error::codes::VALIDATION_FAILED,
                "invalid request fields",
            )
            .with("detail", e.to_string()),
        ),
        _ => Reply::error(
            400,
            shared::error::codes::MALFORMED_JSON,
            "request body is not valid JSON",
        ),
    })
}

/// True when the request's `Content-Type` is JSON (or absent on an empty body).
pub fn is_json(session: &Session) -> bool {
    session
        .req_header()
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        })
}

/// The public listener's OpenAPI 3.1 document, generated from the gateway's types
/// (`openapi::public_json`; `gateway/tests/openapi.rs` keeps the committed file equal).
pub const OPENAPI_PUBLIC: &str = include_str!("../../docs/openapi/gateway.json");
/// The admin listener's OpenAPI 3.1 document.
pub const OPENAPI_ADMIN: &str = include_str!("../../docs/openapi/gateway-admin.json");

/// An OpenAPI document as served: static bytes, cacheable for a minute.
pub fn openapi(doc: &'static str) -> Reply {
    Reply::bytes(
        200,
        "application/json",
        Bytes::from_static(doc.as_bytes()),
        "public, max-age=60",
    )
}
