//! `GET /admin/orders?account=&event=&status=&created_from=&created_to=&limit=&cursor=`:
//! filters combine (AND), newest first, keyset pages (`next_cursor`, [`OrderCursor`]).
//!
//! The SQL names only the filters given, so the planner picks the index of the combination:
//! `orders_account (account_id, created_at)`, `orders_event_created (event_id, created_at,
//! id)`, else `orders_created (created_at, id)` walked backwards, stopping after `limit + 1`
//! rows (docs/decisions.md). Status is a filter on those walks, not an index.

use crate::ops::{OpsState, non_empty, query};
use crate::orders::OrderStatus;
use crate::orders::cursor::{OrderCursor, page_limit};
use crate::platform::audit::Viewer;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use anyhow::Context;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{Postgres, QueryBuilder};
use utoipa::{IntoParams, ToSchema};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    #[param(min_length = 1, max_length = 300)]
    account: Option<String>,
    #[param(min_length = 1, max_length = 300)]
    event: Option<String>,
    #[param(value_type = Option<OrderStatus>)]
    status: Option<String>,
    #[param(value_type = Option<DateTime<Utc>>)]
    created_from: Option<String>,
    #[param(value_type = Option<DateTime<Utc>>)]
    created_to: Option<String>,
    #[param(minimum = 1, maximum = 200, default = 50)]
    limit: Option<i64>,
    /// the `next_cursor` of the previous page (opaque)
    #[param(min_length = 1, max_length = 300)]
    cursor: Option<String>,
}

/// The validated search.
#[derive(Debug, Default, PartialEq)]
pub struct Search {
    pub account: Option<String>,
    pub event: Option<String>,
    pub status: Option<OrderStatus>,
    pub created_from: Option<DateTime<Utc>>,
    pub created_to: Option<DateTime<Utc>>,
    pub limit: i64,
    pub after: Option<OrderCursor>,
}

const STATUSES: [OrderStatus; 6] = [
    OrderStatus::PendingPayment,
    OrderStatus::Paid,
    OrderStatus::Expired,
    OrderStatus::Cancelled,
    OrderStatus::Refunded,
    OrderStatus::Disputed,
];

fn time(field: &str, v: Option<&str>) -> ApiResult<Option<DateTime<Utc>>> {
    v.map(|s| {
        DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| {
                ApiError::validation(format!("{field} must be an RFC 3339 time"))
                    .with("field", field)
            })
    })
    .transpose()
}

impl SearchQuery {
    /// Every filter checked: unknown status, bad times, an empty range, a bad limit or cursor
    /// are `422`s.
    pub fn validate(&self) -> ApiResult<Search> {
        let status = match non_empty("status", &self.status)? {
            None => None,
            Some(s) => Some(
                STATUSES
                    .into_iter()
                    .find(|st| st.as_str() == s)
                    .ok_or_else(|| {
                        ApiError::validation(format!("unknown status {s}"))
                            .with("field", "status")
                            .with(
                                "allowed",
                                STATUSES.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                            )
                    })?,
            ),
        };
        let created_from = time("created_from", self.created_from.as_deref())?;
        let created_to = time("created_to", self.created_to.as_deref())?;
        if let (Some(f), Some(t)) = (created_from, created_to)
            && f >= t
        {
            return Err(
                ApiError::validation("created_from must be before created_to")
                    .with("field", "created_to"),
            );
        }
        let limit =
            page_limit(self.limit).map_err(|m| ApiError::validation(m).with("field", "limit"))?;
        let after = match non_empty("cursor", &self.cursor)? {
            None => None,
            Some(c) => Some(OrderCursor::decode(c).ok_or_else(|| {
                ApiError::validation("cursor is not a next_cursor of this search")
                    .with("field", "cursor")
            })?),
        };
        Ok(Search {
            account: non_empty("account", &self.account)?.map(str::to_owned),
            event: non_empty("event", &self.event)?.map(str::to_owned),
            status,
            created_from,
            created_to,
            limit,
            after,
        })
    }
}

/// One order of a search page.
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
#[schema(as = OrderSearchLine)]
pub struct OrderLine {
    pub id: String,
    pub account_id: String,
    pub status: OrderStatus,
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// integer minor units
    pub total: i64,
    pub currency: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SearchPage {
    pub orders: Vec<OrderLine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The search's statement, naming only the filters given (`fetch` is the row count asked).
pub fn build(s: &Search, fetch: i64) -> QueryBuilder<Postgres> {
    let mut q = QueryBuilder::new(
        "SELECT id, account_id, status, source, event_id, total, currency, created_at,
                updated_at, paid_at
           FROM orders WHERE true",
    );
    if let Some(a) = &s.account {
        q.push(" AND account_id = ").push_bind(a.as_str());
    }
    if let Some(e) = &s.event {
        q.push(" AND event_id = ").push_bind(e.as_str());
    }
    if let Some(st) = s.status {
        q.push(" AND status = ").push_bind(st.as_str());
    }
    if let Some(f) = s.created_from {
        q.push(" AND created_at >= ").push_bind(f);
    }
    if let Some(t) = s.created_to {
        q.push(" AND created_at < ").push_bind(t);
    }
    if let Some(c) = &s.after {
        q.push(" AND (created_at, id) < (")
            .push_bind(c.created_at)
            .push(", ")
            .push_bind(c.id.as_str())
            .push(")");
    }
    q.push(" ORDER BY created_at DESC, id DESC LIMIT ")
        .push_bind(fetch);
    q
}

/// Search orders (newest first, keyset pages)
#[utoipa::path(get, path = "/admin/orders", tag = tags::OPS, security(("admin" = ["viewer"])),
    params(SearchQuery),
    responses(
        (status = 200, description = "OK", body = SearchPage),
        (status = 401, response = doc::Unauthorized),
        (status = 422, response = doc::Invalid),
    ))]
pub async fn search_orders(
    _caller: Viewer,
    State(state): State<OpsState>,
    q: Result<Query<SearchQuery>, QueryRejection>,
) -> ApiResult<ApiJson<SearchPage>> {
    let search = query(q)?.validate()?;
    // One row more than the page says whether there is a next one.
    let mut orders: Vec<OrderLine> = build(&search, search.limit + 1)
        .build_query_as()
        .fetch_all(&state.pool)
        .await
        .context("failed to search orders")?;
    let mut next_cursor = None;
    if orders.len() as i64 > search.limit {
        orders.truncate(search.limit as usize);
        next_cursor = orders.last().map(|o| {
            OrderCursor {
                created_at: o.created_at,
                id: o.id.clone(),
            }
            .encode()
        });
    }
    Ok(ApiJson(SearchPage {
        orders,
        next_cursor,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(f: impl FnOnce(&mut SearchQuery)) -> ApiResult<Search> {
        let mut s = SearchQuery {
            account: None,
            event: None,
            status: None,
            created_from: None,
            created_to: None,
            limit: None,
            cursor: None,
        };
        f(&mut s);
        s.validate()
    }

    #[test]
    fn filters_are_validated() {
        assert_eq!(q(|_| {}).expect("empty search").limit, 50);
        assert_eq!(
            q(|s| s.status = Some("PAID".into())).expect("paid").status,
            Some(OrderStatus::Paid)
        );
        for bad in [
            q(|s| s.status = Some("paid".into())),
            q(|s| s.status = Some("SHIPPED".into())),
            q(|s| s.created_from = Some("yesterday".into())),
            q(|s| {
                s.created_from = Some("2026-01-02T00:00:00Z".into());
                s.created_to = Some("2026-01-01T00:00:00Z".into());
            }),
            q(|s| s.limit = Some(-1)),
            q(|s| s.limit = Some(0)),
            q(|s| s.limit = Some(201)),
            q(|s| s.cursor = Some("nope".into())),
            q(|s| s.account = Some(String::new())),
        ] {
            let e = bad.expect_err("refused");
            assert_eq!(e.status().as_u16(), 422);
        }
    }

    #[test]
    fn the_statement_names_only_the_filters_given() {
        let s = Search {
            event: Some("ev".into()),
            limit: 10,
            ..Search::default()
        };
        let b = build(&s, 11);
        let sql = b.sql().as_str().to_owned();
        assert!(sql.contains("event_id = $1"), "{sql}");
        assert!(!sql.contains("account_id ="), "{sql}");
        assert!(sql.contains("LIMIT $2"), "{sql}");
    }
}
