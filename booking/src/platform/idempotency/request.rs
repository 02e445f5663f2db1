//! The request side of an idempotent call: the validated `Idempotency-Key` header and the
//! fingerprint that says whether a retry is "the same request". Pure; no database.

use super::{HEADER, MAX_KEY_LEN};
use crate::platform::error::ApiError;
use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method};
use shared::error::codes;

/// A validated `Idempotency-Key` header value. As an extractor it answers `400
/// IDEMPOTENCY_KEY_MISSING` when the header is absent or empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Validates a raw header value (see the module docs for the rules).
    pub fn parse(raw: Option<&HeaderValue>) -> Result<Self, ApiError> {
        let missing = || {
            ApiError::bad_request(
                codes::IDEMPOTENCY_KEY_MISSING,
                "this endpoint needs an Idempotency-Key header (1 to 255 printable characters)",
            )
        };
        let raw = raw.ok_or_else(missing)?;
        let bytes = raw.as_bytes();
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Err(missing());
        }
        if bytes.len() > MAX_KEY_LEN || !bytes.iter().all(|b| (0x20..0x7f).contains(b)) {
            return Err(ApiError::validation(
                "Idempotency-Key must be 1 to 255 printable ASCII characters",
            ));
        }
        // All bytes are printable ASCII, so this cannot fail; map defensively anyway.
        let s = std::str::from_utf8(bytes).map_err(|_| missing())?;
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Self::parse(parts.headers.get(HEADER))
    }
}

/// `Option<IdempotencyKey>`: no header is `None`; a header that is there must be a valid key.
impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, ApiError> {
        match parts.headers.get(HEADER) {
            None => Ok(None),
            raw => Self::parse(raw).map(Some),
        }
    }
}

/// SHA-256 over method, path and body: what "the same request" means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Fingerprint of a JSON request: the body is hashed in serde_json's canonical form
    /// (object keys sorted, no insignificant whitespace), so a retry that re-serialises the same
    /// document differently still matches.
    pub fn of_json(method: &Method, path: &str, body: &serde_json::Value) -> Self {
        let mut canonical = Vec::with_capacity(128);
        write_canonical(body, &mut canonical);
        Self::of_bytes(method, path, &canonical)
    }

    /// Fingerprint of raw body bytes.
    pub fn of_bytes(method: &Method, path: &str, body: &[u8]) -> Self {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(method.as_str().as_bytes());
        ctx.update(b"\0");
        ctx.update(path.as_bytes());
        ctx.update(b"\0");
        ctx.update(body);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        Self(out)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// JSON with object keys sorted recursively, independent of serde_json's `preserve_order`.
fn write_canonical(v: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(&Value::String((*k).clone()), out);
                out.push(b':');
                if let Some(inner) = map.get(*k) {
                    write_canonical(inner, out);
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => {
            // Serialising a scalar JSON value into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn canonical_fingerprint_ignores_key_order_and_whitespace() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"b": 1, "a": [1, {"y":2,"x":1}]}"#).expect("json");
        let b: serde_json::Value =
            serde_json::from_str(r#"{"a":[1,{"x":1,"y":2}],"b":1}"#).expect("json");
        let m = Method::POST;
        assert_eq!(
            Fingerprint::of_json(&m, "/api/orders", &a),
            Fingerprint::of_json(&m, "/api/orders", &b)
        );
        assert_ne!(
            Fingerprint::of_json(&m, "/api/orders", &a),
            Fingerprint::of_json(&m, "/api/orders/x", &a)
        );
    }

    #[test]
    fn key_rules() {
        let hv = |s: &str| HeaderValue::from_str(s).expect("header");
        assert!(IdempotencyKey::parse(None).is_err());
        assert_eq!(
            IdempotencyKey::parse(Some(&hv("")))
                .expect_err("empty")
                .status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            IdempotencyKey::parse(Some(&hv(&"k".repeat(256))))
                .expect_err("long")
                .status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert!(IdempotencyKey::parse(Some(&hv(&"k".repeat(255)))).is_ok());
        assert!(IdempotencyKey::parse(Some(&hv("9f2b1c4e-6a3d"))).is_ok());
    }
}
