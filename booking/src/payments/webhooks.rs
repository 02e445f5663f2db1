//! `POST /webhooks/payments`: provider events, authenticated by their signature alone (the
//! gateway forwards this path without an admission token).
//!
//! Guarantees:
//! - The `Stripe-Signature` header (`t=<unix seconds>,v1=<hex>[,v1=<hex>...]`) is checked
//!   against HMAC-SHA256(secret, `"<t>.<raw body>"`) for every configured secret (rotation)
//!   and every `v1` signature, in constant time, before the body is even parsed. A missing,
//!   malformed, wrong or stale (more than `webhook_tolerance_s` from now) signature is
//!   `400 INVALID_SIGNATURE` and changes nothing.
//! - Each provider event is applied once: its id is inserted into `payment_webhook_events`
//!   in the same transaction as the change it causes, so a duplicate (providers retry for
//!   days) is a no-op and a rolled-back change leaves the event to be applied by the retry.
//! - Events go through the same conditional transitions as the pay request
//!   ([`crate::payments::flow`]): whichever of the two arrives first wins, the other changes
//!   nothing, whatever the order of arrival. A success for an order that can no longer take
//!   it is refunded, never resurrected.
//! - `charge.refunded` / `charge.dispute.created` for a paid order reverse it once
//!   ([`crate::payments::reversal`]): `REFUNDED` / `DISPUTED`, tickets voided, stock back on
//!   sale or held back, whatever the order and duplication of the events.

use crate::app::state::AppState;
use crate::payments::flow::{self, Success};
use crate::payments::provider::ProviderError;
use crate::payments::reversal::{self, Reversal, Reversed};
use crate::platform::db;
use crate::platform::error::{ApiError, ApiResult};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use ring::hmac;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};
use shared::error::codes;
use sqlx::PgConnection;
use std::time::{SystemTime, UNIX_EPOCH};
use subtle::ConstantTimeEq;

pub const SIGNATURE_HEADER: &str = "stripe-signature";
/// Longest signature header looked at, and most `v1` entries compared.
const MAX_HEADER_LEN: usize = 4096;
const MAX_SIGNATURES: usize = 8;

pub fn router() -> Router<AppState> {
    Router::new().route("/webhooks/payments", post(receive))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the signature header is missing")]
    Missing,
    #[error("the signature header is malformed")]
    Malformed,
    #[error("no signature matches")]
    Mismatch,
    #[error("the signature timestamp is outside the tolerance")]
    Stale,
}

impl SignatureError {
    fn reason(self) -> &'static str {
        match self {
            SignatureError::Missing => "missing",
            SignatureError::Malformed => "malformed",
            SignatureError::Mismatch => "mismatch",
            SignatureError::Stale => "stale",
        }
    }
}

/// Verifies a `Stripe-Signature` header over `body` (see the module docs). `now` is unix
/// seconds. Every secret is compared with every signature (no early exit), so timing does
/// not reveal which one matched.
pub fn verify_signature(
    header: Option<&str>,
    body: &[u8],
    secrets: &[SecretString],
    now: i64,
    tolerance_s: u64,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    if header.len() > MAX_HEADER_LEN {
        return Err(SignatureError::Malformed);
    }
    let mut timestamp: Option<i64> = None;
    let mut signatures: Vec<Vec<u8>> = Vec::new();
    for part in header.split(',') {
        let (k, v) = part
            .trim()
            .split_once('=')
            .ok_or(SignatureError::Malformed)?;
        match k {
            "t" => {
                if timestamp.is_some() {
                    return Err(SignatureError::Malformed);
                }
                timestamp = Some(v.parse().map_err(|_| SignatureError::Malformed)?);
            }
            "v1" => {
                // An undecodable entry cannot match; others may (rotation).
                if let Ok(sig) = hex::decode(v)
                    && sig.len() == 32
                    && signatures.len() < MAX_SIGNATURES
                {
                    signatures.push(sig);
                }
            }
            // Other schemes (v0 test signatures...) are ignored, as Stripe does.
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::Mismatch);
    }
    let mut matched = 0u8;
    for secret in secrets {
        let secret = secret.expose_secret();
        if secret.is_empty() {
            continue;
        }
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(timestamp.to_string().as_bytes());
        ctx.update(b".");
        ctx.update(body);
        let expected = ctx.sign();
        for sig in &signatures {
            matched |= expected.as_ref().ct_eq(sig).unwrap_u8();
        }
    }
    if matched == 0 {
        return Err(SignatureError::Mismatch);
    }
    // The tolerance bounds replays of a captured, validly signed request.
    if now.abs_diff(timestamp) > tolerance_s {
        return Err(SignatureError::Stale);
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
struct Event {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    data: EventData,
}

#[derive(Debug, Deserialize)]
struct EventData {
    object: Value,
}

fn meta<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object.get("metadata")?.get(key)?.as_str()
}

fn unix_now() -> i64 {
    // The signature's freshness is judged against the provider's clock, so the local clock
    // is the right reference here (not a business deadline; see docs/decisions.md).
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn count(state: &AppState, result: &str) {
    state
        .metrics
        .payments
        .webhooks
        .with_label_values(&[result])
        .inc();
}

async fn receive(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<axum::Json<Value>> {
    let settings = &state.config.payments;
    let header = headers
        .get(SIGNATURE_HEADER)
        .map(|v| v.to_str().map_err(|_| SignatureError::Malformed))
        .transpose();
    let verified = header.and_then(|h| {
        verify_signature(
            h,
            &body,
            &settings.webhook_secrets,
            unix_now(),
            settings.webhook_tolerance_s,
        )
    });
    if let Err(e) = verified {
        count(&state, "bad_signature");
        return Err(ApiError::bad_request(
            codes::INVALID_SIGNATURE,
            "webhook signature verification failed",
        )
        .with("reason", e.reason()));
    }
    let event: Event = serde_json::from_slice(&body).map_err(|_| {
        ApiError::bad_request(
            codes::MALFORMED_JSON,
            "webhook body is not a provider event",
        )
    })?;
    match event.kind.as_str() {
        "payment_intent.succeeded" | "payment_intent.payment_failed" => {
            apply_payment_event(&state, &event).await
        }
        "charge.refunded" | "charge.dispute.created" => apply_reversal_event(&state, &event).await,
        _ => ignored(&state),
    }
}

fn ignored(state: &AppState) -> ApiResult<axum::Json<Value>> {
    count(state, "ignored");
    Ok(axum::Json(json!({"received": true, "ignored": true})))
}

fn duplicate(state: &AppState) -> ApiResult<axum::Json<Value>> {
    count(state, "duplicate");
    Ok(axum::Json(json!({"received": true, "duplicate": true})))
}

/// `payment_intent.succeeded` / `payment_intent.payment_failed`: the attempt's outcome.
async fn apply_payment_event(state: &AppState, event: &Event) -> ApiResult<axum::Json<Value>> {
    let payment_id = meta(&event.data.object, "payment_id").map(str::to_owned);
    let object_id = event
        .data
        .object
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let (Some(payment_id), false) = (payment_id, object_id.is_empty()) else {
        return ignored(state);
    };
    let decline_code = event
        .data
        .object
        .pointer("/last_payment_error/decline_code")
        .and_then(Value::as_str)
        .unwrap_or("generic_decline")
        .to_owned();
    let applied = db::retry(3, || async {
        let mut tx = state.pool.begin().await?;
        if !record_event(&mut tx, &event.id, &event.kind, &payment_id).await? {
            return Ok::<_, sqlx::Error>(None);
        }
        let outcome = match event.kind.as_str() {
            "payment_intent.succeeded" => {
                flow::apply_success_tx(&mut tx, &payment_id, &object_id).await?
            }
            _ => {
                flow::apply_decline_tx(&mut tx, &payment_id, &object_id, &decline_code).await?;
                Success::Unknown
            }
        };
        tx.commit().await?;
        Ok(Some(outcome))
    })
    .await?;
    let Some(outcome) = applied else {
        return duplicate(state);
    };
    count(state, "applied");
    if let Success::RefundNeeded {
        payment_id,
        provider_payment_id,
    } = &outcome
    {
        // A failed refund stays refund_pending for reconciliation; the event itself is applied.
        let _refunded = flow::refund(state, payment_id, provider_payment_id).await;
    }
    Ok(axum::Json(json!({"received": true})))
}

/// `charge.refunded` / `charge.dispute.created`: a refund or dispute at the provider
/// ([`reversal`]). The charge or dispute names its payment intent; the attempt is found by
/// the payment's metadata, by the intent id we recorded, or — when this event overtook the
/// success that would have recorded it — by asking the provider for the intent.
async fn apply_reversal_event(state: &AppState, event: &Event) -> ApiResult<axum::Json<Value>> {
    let object = &event.data.object;
    let Some(intent_id) = object
        .get("payment_intent")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && s.len() <= 255)
        .map(str::to_owned)
    else {
        return ignored(state);
    };
    let object_id = object
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let reversal = if event.kind == "charge.refunded" {
        let amount = object.get("amount").and_then(Value::as_i64);
        let refunded = object.get("amount_refunded").and_then(Value::as_i64);
        let full = object.get("refunded").and_then(Value::as_bool) == Some(true)
            || matches!((amount, refunded), (Some(a), Some(r)) if r >= a);
        Reversal::Refund {
            reference: format!("charge:{object_id}"),
            full,
        }
    } else {
        Reversal::Dispute {
            reference: object_id,
        }
    };
    let Some(payment_id) = find_payment(state, object, &intent_id).await? else {
        return ignored(state);
    };
    let applied = db::retry(3, || async {
        let mut tx = state.pool.begin().await?;
        if !record_event(&mut tx, &event.id, &event.kind, &payment_id).await? {
            return Ok::<_, sqlx::Error>(None);
        }
        let outcome = reversal::apply_tx(&mut tx, &payment_id, &intent_id, &reversal).await?;
        tx.commit().await?;
        Ok(Some(outcome))
    })
    .await?;
    let Some(outcome) = applied else {
        return duplicate(state);
    };
    count(state, "applied");
    match &outcome {
        Reversed::Order {
            order_id,
            status,
            tickets_voided,
            released_skus,
        } => {
            tracing::info!(order_id = %order_id, payment_id = %payment_id, status, tickets_voided,
                "paid order reversed at the provider");
            state
                .metrics
                .payments
                .reversals
                .with_label_values(&[*status])
                .inc();
            // Returned units of hot SKUs: let the flash gate admit them again.
            for sku in released_skus {
                if let Err(e) =
                    crate::orders::flash::reconcile(&state.pool, &state.redis, sku).await
                {
                    tracing::warn!(error = ?e, sku, "flash gate reconcile after a refund failed");
                }
            }
        }
        Reversed::Partial => {
            tracing::warn!(payment_id = %payment_id, "partial refund at the provider: order kept");
        }
        other => {
            tracing::info!(payment_id = %payment_id, outcome = ?other, "reversal changed nothing")
        }
    }
    Ok(axum::Json(json!({"received": true})))
}

/// Our attempt behind a provider payment intent, or `None` when it is not ours.
async fn find_payment(
    state: &AppState,
    object: &Value,
    intent_id: &str,
) -> ApiResult<Option<String>> {
    if let Some(id) = meta(object, "payment_id") {
        return Ok(Some(id.to_owned()));
    }
    let known: Option<String> =
        sqlx::query_scalar("SELECT id FROM payments WHERE provider_payment_id = $1")
            .bind(intent_id)
            .fetch_optional(&state.pool)
            .await?;
    if known.is_some() {
        return Ok(known);
    }
    // Not recorded yet (this event overtook the success): the intent carries our metadata.
    match state.payments.retrieve(intent_id).await {
        Ok(p) => Ok(p.meta("payment_id").map(str::to_owned)),
        Err(ProviderError::Rejected { status: 404, .. }) => Ok(None),
        // Answer non-2xx: the provider retries the event later.
        Err(e) => Err(ApiError::Unavailable(
            anyhow::Error::new(e).context("could not look up the disputed/refunded payment"),
        )),
    }
}

/// Inserts the event id; false when it was applied before.
async fn record_event(
    conn: &mut PgConnection,
    event_id: &str,
    kind: &str,
    payment_id: &str,
) -> sqlx::Result<bool> {
    Ok(sqlx::query(
        "INSERT INTO payment_webhook_events (provider_event_id, event_type, payment_id)
         VALUES ($1, $2, $3) ON CONFLICT (provider_event_id) DO NOTHING",
    )
    .bind(event_id)
    .bind(kind)
    .bind(payment_id)
    .execute(conn)
    .await?
    .rows_affected()
        == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, t: i64, body: &[u8]) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
        let msg = [t.to_string().as_bytes(), b".", body].concat();
        hex::encode(hmac::sign(&key, &msg).as_ref())
    }

    fn secrets(s: &[&str]) -> Vec<SecretString> {
        s.iter()
            .map(|x| SecretString::from(x.to_string()))
            .collect()
    }

    #[test]
    fn accepts_a_good_signature() {
        let body = br#"{"id":"evt_1"}"#;
        let h = format!("t=1000,v1={}", sign("whsec_a", 1000, body));
        assert_eq!(
            verify_signature(Some(&h), body, &secrets(&["whsec_a"]), 1010, 300),
            Ok(())
        );
    }

    #[test]
    fn rotation_any_secret_any_signature() {
        let body = b"{}";
        let h = format!(
            "t=1000,v1={},v1={}",
            "00".repeat(32),
            sign("whsec_new", 1000, body)
        );
        assert_eq!(
            verify_signature(
                Some(&h),
                body,
                &secrets(&["whsec_old", "whsec_new"]),
                1000,
                300
            ),
            Ok(())
        );
        assert_eq!(
            verify_signature(Some(&h), body, &secrets(&["whsec_old"]), 1000, 300),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn refuses_tampering_staleness_and_garbage() {
        let body = b"{\"amount\":100}";
        let good = sign("whsec_a", 1000, body);
        let s = secrets(&["whsec_a"]);
        let h = format!("t=1000,v1={good}");
        assert_eq!(
            verify_signature(Some(&h), b"{\"amount\":999}", &s, 1000, 300),
            Err(SignatureError::Mismatch)
        );
        // Same signature, another timestamp: the timestamp is signed too.
        let h2 = format!("t=1001,v1={good}");
        assert_eq!(
            verify_signature(Some(&h2), body, &s, 1000, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(Some(&h), body, &s, 1301, 300),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify_signature(Some(&h), body, &s, 699, 300),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify_signature(None, body, &s, 1000, 300),
            Err(SignatureError::Missing)
        );
        for bad in ["", "garbage", "t=abc,v1=00", "v1=00", "t=1,t=2,v1=00"] {
            assert!(
                verify_signature(Some(bad), body, &s, 1000, 300).is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            verify_signature(Some(&h), body, &secrets(&[""]), 1000, 300),
            Err(SignatureError::Mismatch)
        );
    }
}
