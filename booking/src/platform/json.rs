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
        let value = match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(value)) => value,
            // `76.0` is the integer 76 to JSON and to JSON Schema (the OpenAPI documents say
            // `integer`); serde refuses it for an integer field. Only a body refused that way
            // pays for the second parse, so well-formed requests cost nothing more.
            Err(rejection @ JsonRejection::JsonDataError(_)) => {
                integral_floats_as_integers(&bytes).ok_or(rejection)?
            }
            Err(rejection) => return Err(rejection.into()),
        };
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

/// `body` read as `T` once every number written with a zero fraction (`76.0`, `1e2`) is an
/// integer; `None` when there is none or `T` still refuses it (the caller reports the first
/// error). Exact integers only: beyond 2^53 a float is not an exact count.
fn integral_floats_as_integers<T: DeserializeOwned>(body: &[u8]) -> Option<T> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    fn walk(v: &mut Value) -> bool {
        match v {
            Value::Number(n) if n.is_f64() => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() <= EXACT => {
                    // Whole and within 2^53: the cast is exact.
                    *v = Value::from(f as i64);
                    true
                }
                _ => false,
            },
            Value::Array(a) => a.iter_mut().fold(false, |changed, v| walk(v) | changed),
            Value::Object(m) => m.values_mut().fold(false, |changed, v| walk(v) | changed),
            _ => false,
        }
    }
    let mut value: Value = serde_json::from_slice(body).ok()?;
    if !walk(&mut value) {
        return None;
    }
    serde_json::from_value(value).ok()
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

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Line {
        quantity: i32,
        price: Option<i64>,
    }

    #[test]
    fn whole_numbers_written_as_floats_are_integers_and_fractions_are_not() {
        let read = |b: &str| integral_floats_as_integers::<Line>(b.as_bytes());
        assert_eq!(
            read(r#"{"quantity": 76.0, "price": 1e3}"#),
            Some(Line {
                quantity: 76,
                price: Some(1000)
            })
        );
        assert_eq!(
            read(r#"{"quantity": -0.0}"#),
            Some(Line {
                quantity: 0,
                price: None
            })
        );
        assert_eq!(read(r#"{"quantity": 76.5}"#), None);
        assert_eq!(read(r#"{"quantity": 1e300}"#), None);
        // Nothing to change: the first error stands.
        assert_eq!(read(r#"{"quantity": "76"}"#), None);
        // Still the type's own rules (unknown fields, ranges).
        assert_eq!(read(r#"{"quantity": 76.0, "extra": 1}"#), None);
        assert_eq!(read(r#"{"quantity": 3e9}"#), None);
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
