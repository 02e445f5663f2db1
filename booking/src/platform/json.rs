//! `ApiJson<T>`: axum's `Json` extractor with Floodgate's error codes, so malformed JSON,
//! wrong content types, unknown fields and oversized bodies get a clear JSON `4xx`.

use crate::platform::error::ApiError;
use axum::extract::FromRequest;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use shared::error::codes;

#[derive(Debug, Clone, Copy, Default, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

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
