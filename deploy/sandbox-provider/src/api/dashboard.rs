//! `/_sandbox/*`: what an operator, a card holder's bank or a test does on the provider's side,
//! outside the merchant's API calls (JSON bodies: these endpoints are not Stripe's), each
//! announced by its Stripe-shaped webhook:
//! - `POST /_sandbox/payment_intents/{id}/refund` (`{"amount": n}` optional, default the
//!   rest) → `charge.refunded` with the Charge as `data.object`;
//! - `POST /_sandbox/payment_intents/{id}/dispute` (`{"reason": "..."}` optional) →
//!   `charge.dispute.created` with the Dispute (`charge`, `payment_intent`) as `data.object`;
//! - `POST /_sandbox/payment_intents/{id}/complete` (`{"outcome": "succeeded" | "failed"}`)
//!   settles a `requires_action` / `processing` intent → `payment_intent.succeeded` /
//!   `payment_intent.payment_failed`;
//! - orders, stats, webhook deliveries and the manual-mode flush, for tests and operators.

use super::{ApiErr, Shared, authorize, intents, refunds};
use crate::store::{Dispute, DisputeError};
use crate::webhooks::{self, Origin};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// A JSON body that may be left out: empty means every parameter takes its default.
fn parse_optional_body<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, ApiErr> {
    if body.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiErr::invalid(
            "parameter_invalid",
            None,
            &format!("Invalid JSON body for a /_sandbox endpoint: {e}"),
        )
    })
}

/// Dashboard actions have no merchant request behind them (Stripe: `request.id` null).
const DASHBOARD: Origin<'static> = Origin {
    request_id: None,
    idempotency_key: None,
};

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct DashboardRefund {
    /// Minor units; the whole remaining amount when absent.
    amount: Option<i64>,
}

/// A refund made by an operator in the provider's dashboard (no merchant API call, no
/// idempotency key): refunds the intent and sends `charge.refunded`.
pub async fn refund(
    State(inner): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    let params: DashboardRefund = match parse_optional_body(&body) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    if matches!(params.amount, Some(a) if a < 1) {
        return ApiErr::invalid(
            "parameter_invalid_integer",
            Some("amount"),
            "amount must be at least 1",
        )
        .into_response();
    }
    let metadata = BTreeMap::from([("source".to_owned(), "dashboard".to_owned())]);
    match refunds::refund(&inner, &id, params.amount, None, metadata) {
        Ok((refund, charge)) => {
            webhooks::emit(
                &inner,
                webhooks::event("charge.refunded", charge, &DASHBOARD),
            )
            .await;
            axum::Json(refund).into_response()
        }
        Err(e) => e.into_response(),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct DashboardDispute {
    reason: Option<String>,
}

/// A chargeback opened by the card holder's bank: records the dispute and sends
/// `charge.dispute.created` whose `data.object` is the dispute (it names the charge and the
/// payment intent; like Stripe's, its metadata is its own, not the payment's).
pub async fn dispute(
    State(inner): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    let params: DashboardDispute = match parse_optional_body(&body) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    let dispute = Dispute {
        id: format!("dp_{}", shared::ids::new_id()),
        object: "dispute",
        amount: 0,
        currency: String::new(),
        charge: None,
        payment_intent: id.clone(),
        reason: params.reason.unwrap_or_else(|| "fraudulent".into()),
        status: "needs_response",
        created: webhooks::unix_now(),
        metadata: BTreeMap::new(),
    };
    match inner.store.dispute(&id, dispute) {
        Ok(d) => {
            let object = serde_json::to_value(&d).unwrap_or(Value::Null);
            webhooks::emit(
                &inner,
                webhooks::event("charge.dispute.created", object, &DASHBOARD),
            )
            .await;
            axum::Json(d).into_response()
        }
        Err(DisputeError::NoSuchIntent) => ApiErr::missing("payment_intent", &id).into_response(),
        Err(e) => {
            let code = match e {
                DisputeError::AlreadyDisputed => "charge_already_disputed",
                _ => "charge_not_succeeded",
            };
            ApiErr::invalid(code, None, &e.to_string()).into_response()
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Complete {
    /// `succeeded` (default) or `failed`.
    outcome: Option<String>,
}

/// The customer finished (or abandoned) 3-D Secure, or a processing payment settled.
pub async fn complete(
    State(inner): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    let params: Complete = match parse_optional_body(&body) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    let succeed = match params.outcome.as_deref() {
        None | Some("succeeded") => true,
        Some("failed") => false,
        Some(other) => {
            return ApiErr::invalid(
                "parameter_invalid",
                Some("outcome"),
                &format!("outcome must be succeeded or failed, not {other}"),
            )
            .into_response();
        }
    };
    match intents::settle(&inner, &id, succeed) {
        None => ApiErr::missing("payment_intent", &id).into_response(),
        Some(Err(e)) => e.into_response(),
        Some(Ok((kind, object))) => {
            webhooks::emit(&inner, webhooks::event(kind, object.clone(), &DASHBOARD)).await;
            axum::Json(object).into_response()
        }
    }
}

pub async fn order_summary(
    State(inner): Shared,
    headers: HeaderMap,
    Path(order_id): Path<String>,
) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    axum::Json(inner.store.order_summary(&order_id)).into_response()
}

pub async fn stats(State(inner): Shared, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    axum::Json(inner.store.stats()).into_response()
}

pub async fn deliveries(State(inner): Shared, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    axum::Json(json!({"deliveries": inner.deliveries(), "queued": inner.queued()})).into_response()
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlushOptions {
    /// Deliver the queued events newest first.
    pub reverse: bool,
    /// Deliver every queued event twice.
    pub duplicate: bool,
}

pub async fn flush(State(inner): Shared, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    let opts: FlushOptions = match parse_optional_body(&body) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    let delivered = crate::flush_webhooks(&inner, &opts).await;
    (StatusCode::OK, axum::Json(json!({"delivered": delivered}))).into_response()
}
