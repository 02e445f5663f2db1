//! `GET /admin/audit?event=&target=&action=&limit=&cursor=`: the ops audit log
//! (`platform::audit`), newest first, keyset pages on the entry id (indexes `ops_audit_target`
//! and `ops_audit_event` serve the target and event filters).

use crate::ops::{OpsState, non_empty, query};
use crate::orders::cursor::page_limit;
use crate::platform::audit::Viewer;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use anyhow::Context;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::QueryBuilder;
use utoipa::{IntoParams, ToSchema};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    #[param(min_length = 1, max_length = 300)]
    event: Option<String>,
    #[param(min_length = 1, max_length = 300)]
    target: Option<String>,
    #[param(min_length = 1, max_length = 300)]
    action: Option<String>,
    /// an operator's name, or `bootstrap`
    #[param(min_length = 1, max_length = 300)]
    actor: Option<String>,
    #[param(minimum = 1, maximum = 200, default = 50)]
    limit: Option<i64>,
    /// the `next_cursor` of the previous page (opaque)
    #[param(min_length = 1, max_length = 300)]
    cursor: Option<String>,
}

#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// The operator's name; `bootstrap` for the bootstrap admin secret; `payments` and the
    /// like for booking itself
    pub actor: String,
    /// The operator's role when they acted (absent on entries made before roles existed and
    /// on booking's own)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The operator credential's id
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operator_id: Option<String>,
    /// What a bootstrap caller sent in `X-Floodgate-Actor`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub action: String,
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

fn encode(id: i64) -> String {
    URL_SAFE_NO_PAD.encode(format!("a1.{id}"))
}

fn decode(raw: &str) -> Option<i64> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(raw).ok()?).ok()?;
    text.strip_prefix("a1.")?.parse().ok().filter(|n| *n > 0)
}

/// The ops audit log (newest first): who changed what, when
#[utoipa::path(get, path = "/admin/audit", tag = tags::OPS, security(("admin" = ["viewer"])),
    params(AuditQuery),
    responses(
        (status = 200, description = "OK", body = AuditPage),
        (status = 401, response = doc::Unauthorized),
        (status = 422, response = doc::Invalid),
    ))]
pub async fn read_audit(
    _caller: Viewer,
    State(state): State<OpsState>,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> ApiResult<ApiJson<AuditPage>> {
    let q = query(q)?;
    let limit = page_limit(q.limit).map_err(|m| ApiError::validation(m).with("field", "limit"))?;
    let before = match non_empty("cursor", &q.cursor)? {
        None => None,
        Some(c) => Some(decode(c).ok_or_else(|| {
            ApiError::validation("cursor is not a next_cursor of this log").with("field", "cursor")
        })?),
    };
    let mut b = QueryBuilder::new(
        "SELECT id, at, actor, role, operator_id, note, action, target, event_id, detail \
         FROM ops_audit WHERE true",
    );
    if let Some(e) = non_empty("event", &q.event)? {
        b.push(" AND event_id = ").push_bind(e);
    }
    if let Some(t) = non_empty("target", &q.target)? {
        b.push(" AND target = ").push_bind(t);
    }
    if let Some(a) = non_empty("action", &q.action)? {
        b.push(" AND action = ").push_bind(a);
    }
    if let Some(a) = non_empty("actor", &q.actor)? {
        b.push(" AND actor = ").push_bind(a);
    }
    if let Some(id) = before {
        b.push(" AND id < ").push_bind(id);
    }
    b.push(" ORDER BY id DESC LIMIT ").push_bind(limit + 1);
    let mut entries: Vec<AuditEntry> = b
        .build_query_as()
        .fetch_all(&state.pool)
        .await
        .context("failed to read the audit log")?;
    let mut next_cursor = None;
    if entries.len() as i64 > limit {
        entries.truncate(limit as usize);
        next_cursor = entries.last().map(|e| encode(e.id));
    }
    Ok(ApiJson(AuditPage {
        entries,
        next_cursor,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_cursors_round_trip() {
        assert_eq!(decode(&encode(42)), Some(42));
        assert_eq!(decode("garbage"), None);
        assert_eq!(decode(&URL_SAFE_NO_PAD.encode("a1.-3")), None);
    }
}
