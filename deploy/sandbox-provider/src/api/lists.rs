//! `GET /v1/payment_intents` and `GET /v1/refunds` (optionally `payment_intent` or `charge`):
//! Stripe's list object `{"object": "list", "data", "has_more", "url"}`, newest first, with
//! Stripe's parameters `limit` (1..=100, default 10), `starting_after` / `ending_before` (one of
//! them, an id in the list) and `created` (`created=t` or `created[gt|gte|lt|lte]=t`), paged
//! by [`crate::list`]. Query parameters are read like a form body, so an unknown one is
//! refused by name, as Stripe does.

use super::{ApiErr, Shared, authorize, simulate_latency};
use crate::form::Form;
use crate::list::{Created, Cursor, ListQuery, MAX_LIMIT, NoSuchCursor, Page};
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::json;

/// The query string as Stripe's parameters, after the key check.
async fn parsed(
    inner: &crate::SandboxInner,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Form, ApiErr> {
    authorize(inner, headers)?;
    simulate_latency(inner).await;
    Form::parse(None, query.unwrap_or("").as_bytes())
}

/// Takes the pagination parameters out of `form`.
pub fn list_query(form: &mut Form) -> Result<ListQuery, ApiErr> {
    let mut q = ListQuery::default();
    if let Some(limit) = form.take_i64("limit")? {
        q.limit = match usize::try_from(limit) {
            Ok(l) if (1..=MAX_LIMIT).contains(&l) => l,
            _ if limit < 1 => {
                return Err(ApiErr::invalid(
                    "parameter_invalid_integer",
                    Some("limit"),
                    "This value must be greater than or equal to 1.",
                ));
            }
            _ => {
                return Err(ApiErr::invalid(
                    "parameter_invalid_integer",
                    Some("limit"),
                    "This value must be less than or equal to 100.",
                ));
            }
        };
    }
    q.cursor = match (form.take("starting_after")?, form.take("ending_before")?) {
        (Some(_), Some(_)) => {
            return Err(ApiErr::invalid(
                "parameters_exclusive",
                Some("ending_before"),
                "You may only specify one of these parameters: ending_before, starting_after.",
            ));
        }
        (Some(id), None) => Some(Cursor::After(id)),
        (None, Some(id)) => Some(Cursor::Before(id)),
        (None, None) => None,
    };
    q.created = created(form)?;
    Ok(q)
}

fn created(form: &mut Form) -> Result<Created, ApiErr> {
    let int = |name: String, v: &str| {
        v.parse::<i64>().map_err(|_| {
            ApiErr::invalid(
                "parameter_invalid_integer",
                Some(name.as_str()),
                &format!("Invalid integer: {v}"),
            )
        })
    };
    let mut c = Created::default();
    if let Some(exact) = form.take("created")? {
        let t = int("created".into(), &exact)?;
        c.gte = Some(t);
        c.lte = Some(t);
    }
    for (bound, v) in form.take_map("created")? {
        let name = format!("created[{bound}]");
        let slot = match bound.as_str() {
            "gt" => &mut c.gt,
            "gte" => &mut c.gte,
            "lt" => &mut c.lt,
            "lte" => &mut c.lte,
            _ => {
                return Err(ApiErr::invalid(
                    "parameter_unknown",
                    Some(name.as_str()),
                    &format!("Received unknown parameter: {name}"),
                ));
            }
        };
        *slot = Some(int(name, &v)?);
    }
    Ok(c)
}

fn cursor_missing(kind: &str, e: &NoSuchCursor) -> ApiErr {
    ApiErr::invalid(
        "resource_missing",
        Some(e.param),
        &format!("No such {kind}: '{}'", e.id),
    )
}

fn list_object<T: Serialize>(url: &str, page: Page<T>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": page.data,
        "has_more": page.has_more,
        "url": url,
    }))
    .into_response()
}

pub async fn payment_intents(
    State(inner): Shared,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let run = async {
        let mut form = parsed(&inner, &headers, query.as_deref()).await?;
        let q = list_query(&mut form)?;
        form.finish()?;
        inner
            .store
            .list_intents(&q)
            .map_err(|e| cursor_missing("payment_intent", &e))
    };
    match run.await {
        Ok(page) => list_object("/v1/payment_intents", page),
        Err(e) => e.into_response(),
    }
}

pub async fn refunds(
    State(inner): Shared,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let run = async {
        let mut form = parsed(&inner, &headers, query.as_deref()).await?;
        let q = list_query(&mut form)?;
        let payment_intent = form.take("payment_intent")?;
        let charge = form.take("charge")?;
        form.finish()?;
        inner
            .store
            .list_refunds(payment_intent.as_deref(), charge.as_deref(), &q)
            .map_err(|e| cursor_missing("refund", &e))
    };
    match run.await {
        Ok(page) => list_object("/v1/refunds", page),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(s: &str) -> Result<ListQuery, ApiErr> {
        let mut form = Form::parse(None, s.as_bytes())?;
        let q = list_query(&mut form)?;
        form.finish()?;
        Ok(q)
    }

    #[test]
    fn parameters_as_stripe_takes_them() {
        assert_eq!(query("").expect("defaults"), ListQuery::default());
        let q = query("limit=3&starting_after=pi_1&created%5Bgte%5D=5&created[lt]=9").expect("ok");
        assert_eq!(q.limit, 3);
        assert_eq!(q.cursor, Some(Cursor::After("pi_1".into())));
        assert_eq!((q.created.gte, q.created.lt), (Some(5), Some(9)));
        let q = query("created=7&ending_before=pi_2").expect("ok");
        assert_eq!((q.created.gte, q.created.lte), (Some(7), Some(7)));
        assert_eq!(q.cursor, Some(Cursor::Before("pi_2".into())));
        for (bad, param) in [
            ("limit=0", "limit"),
            ("limit=101", "limit"),
            ("limit=x", "limit"),
            ("starting_after=a&ending_before=b", "ending_before"),
            ("created[since]=1", "created[since]"),
            ("created[gt]=soon", "created[gt]"),
            ("colour=red", "colour"),
        ] {
            let e = query(bad).expect_err(bad);
            assert_eq!(e.status.as_u16(), 400, "{bad}");
            assert_eq!(e.body["error"]["param"], param, "{bad}");
        }
    }
}
