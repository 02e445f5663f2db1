//! `ApiJson<T>`: axum's `Json` extractor with Floodgate's error codes, so malformed JSON,
//! wrong content types, unknown fields and oversized bodies get a clear JSON `4xx`.
//!
//! It also refuses any string (value or key) holding U+0000: Postgres text cannot store it,
//! so such a request would otherwise reach a statement and fail there as a `500` (found by
//! the OpenAPI fuzzer: `POST /api/orders {"hold_id": "\u0000..."}`).

use crate::platform::error::ApiError;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::Value;
use shared::error::codes;

#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !is_json(req.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                codes::UNSUPPORTED_MEDIA_TYPE,
                "expected Content-Type: application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    codes::PAYLOAD_TOO_LARGE,
                    "request body too large",
                )
            } else {
                ApiError::bad_request(codes::INVALID_REQUEST, e.body_text())
            }
        })?;
        let axum::Json(value) = axum::Json::<T>::from_bytes(&bytes)?;
        if holds_nul(&bytes) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::VALIDATION_FAILED,
                "invalid request body: text may not contain U+0000",
            ));
        }
        Ok(ApiJson(value))
    }
}

/// `application/json` or any `application/*+json`, parameters ignored (as axum's `Json`).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

/// Whether a (valid JSON) body has a string or key containing U+0000. JSON can only carry it
/// escaped, so bodies without the text `\u0000` are answered by one scan; the rare body with it
/// is parsed to tell a real NUL from an escaped backslash followed by `u0000`.
fn holds_nul(body: &[u8]) -> bool {
    const ESCAPE: &[u8] = b"\\u0000";
    if !body.windows(ESCAPE.len()).any(|w| w == ESCAPE) {
        return false;
    }
    fn walk(v: &Value) -> bool {
        match v {
            Value::String(s) => s.contains('\0'),
            Value::Array(a) => a.iter().any(walk),
            Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || walk(v)),
            _ => false,
        }
    }
    serde_json::from_slice::<Value>(body).is_ok_and(|v| walk(&v))
}

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        match rejection {
            JsonRejection::JsonDataError(e) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::VALIDATION_FAILED,
                // serde's message names the field and the problem, never internal state.
                format!("invalid request body: {}", e.body_text()),
            ),
            JsonRejection::JsonSyntaxError(_) => {
                ApiError::bad_request(codes::MALFORMED_JSON, "request body is not valid JSON")
            }
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                codes::UNSUPPORTED_MEDIA_TYPE,
                "expected Content-Type: application/json",
            ),
            JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    codes::PAYLOAD_TOO_LARGE,
                    "request body too large",
                )
            }
            other => ApiError::bad_request(codes::INVALID_REQUEST, other.body_text()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn nul_in_any_string_or_key_is_found_and_escaped_backslashes_are_not() {
        assert!(holds_nul(br#"{"hold_id":"a\u0000b"}"#));
        assert!(holds_nul(br#"{"seats":["x","\u0000"]}"#));
        assert!(holds_nul(br#"{"a\u0000":1}"#));
        assert!(
            !holds_nul(br#"{"hold_id":"a\\u0000b"}"#),
            "an escaped backslash, then text"
        );
        assert!(!holds_nul(br#"{"hold_id":"abc","n":0}"#));
    }

    #[test]
    fn json_content_types() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_str(v).expect("header"));
            is_json(&h)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(with("application/merge-patch+json"));
        assert!(!with("text/json"));
        assert!(!with("application/x-www-form-urlencoded"));
        assert!(!is_json(&HeaderMap::new()));
    }
}
