//! `application/problem+json` error answers (RFC 9457).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer: a status, a reason, and the field at fault if there is one.
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    detail: String,
    field: Option<String>,
}

impl Problem {
    /// An answer with `status` and a human-readable `detail`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Problem {
            status,
            detail: detail.into(),
            field: None,
        }
    }

    /// A `400 Bad Request`.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }

    /// Names the request field at fault.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        let field = field.into();
        if !field.is_empty() && field != "." {
            self.field = Some(field);
        }
        self
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut body = json!({
            "type": "about:blank",
            "title": self.status.canonical_reason().unwrap_or("Error"),
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let Some(field) = self.field {
            body["field"] = json!(field);
        }
        let mut response = (self.status, body.to_string()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}
