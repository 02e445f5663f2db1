//! Signed webhook delivery, Stripe style.
//!
//! Each event is POSTed as JSON to the configured URL with
//! `Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`. A
//! non-`2xx` answer or a network error is retried with doubling backoff up to
//! `webhook_max_attempts`. Config can duplicate events and add random delays (out-of-order
//! arrival), or hold them for a test to flush in the order it wants.

use crate::SandboxInner;
use crate::config::{SandboxSettings, WebhookMode};
use ring::hmac;
use secrecy::ExposeSecret;
use serde::Serialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Header name (Stripe's).
pub const SIGNATURE_HEADER: &str = "Stripe-Signature";

/// An event as sent.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub body: Value,
}

/// One delivery attempt, kept for `GET /_sandbox/webhooks`.
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    pub event_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub attempt: u32,
    /// HTTP status, or `None` on a network error.
    pub status: Option<u16>,
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `t=<ts>,v1=<hex hmac>` for `body` at `timestamp`.
pub fn signature_header(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    format!("t={timestamp},v1={}", hex::encode(ctx.sign().as_ref()))
}

/// The API request that caused an event (none for dashboard actions), as Stripe's
/// `request` field names it.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub request_id: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
}

/// Builds an event in Stripe's shape around `object` (a PaymentIntent, Charge or Dispute).
pub fn event(kind: &str, object: Value, origin: &Origin<'_>) -> Event {
    let id = format!("evt_{}", shared::ids::new_id());
    let body = json!({
        "id": id,
        "object": "event",
        "api_version": crate::STRIPE_API_VERSION,
        "created": unix_now(),
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": origin.request_id, "idempotency_key": origin.idempotency_key},
        "type": kind,
        "data": {"object": object},
    });
    Event {
        id,
        kind: kind.to_owned(),
        body,
    }
}

/// Sends an event according to the configured mode. Returns once the event is queued (async,
/// manual) or after its first attempt (before_response).
pub async fn emit(inner: &Arc<SandboxInner>, ev: Event) {
    let settings = inner.settings();
    if !settings.webhooks_enabled {
        return;
    }
    let copies = if rand::random::<f64>() < settings.webhook_duplicate_rate {
        2
    } else {
        1
    };
    for _ in 0..copies {
        match settings.webhook_mode {
            WebhookMode::Manual => inner.queue_webhook(ev.clone()),
            WebhookMode::Async => {
                let delay = settings.webhook_delay_ms + jitter(settings.webhook_reorder_ms);
                spawn_retries(inner.clone(), ev.clone(), 1, delay);
            }
            WebhookMode::BeforeResponse => {
                if !deliver_once(inner, &settings, &ev, 1).await {
                    spawn_retries(inner.clone(), ev.clone(), 2, settings.webhook_backoff_ms);
                }
            }
        }
    }
}

fn jitter(max_ms: u64) -> u64 {
    if max_ms == 0 {
        0
    } else {
        rand::random::<u64>() % (max_ms + 1)
    }
}

/// Retries in the background from attempt `first` on, waiting `delay_ms` first.
pub fn spawn_retries(inner: Arc<SandboxInner>, ev: Event, first: u32, delay_ms: u64) {
    tokio::spawn(async move {
        let mut delay = delay_ms;
        let mut attempt = first;
        loop {
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let settings = inner.settings();
            if deliver_once(&inner, &settings, &ev, attempt).await
                || attempt >= settings.webhook_max_attempts
            {
                break;
            }
            let base = settings.webhook_backoff_ms.max(1);
            let exp = base.saturating_mul(1u64 << (attempt - first).min(20));
            delay = exp.min(settings.webhook_backoff_max_ms.max(base));
            attempt += 1;
        }
    });
}

/// One signed POST. True when the merchant answered `2xx`.
pub async fn deliver_once(
    inner: &SandboxInner,
    settings: &SandboxSettings,
    ev: &Event,
    attempt: u32,
) -> bool {
    let body = match serde_json::to_vec(&ev.body) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "cannot serialise webhook event");
            return false;
        }
    };
    let header = signature_header(settings.webhook_secret.expose_secret(), unix_now(), &body);
    let result = inner
        .http
        .post(&settings.webhook_url)
        .header(SIGNATURE_HEADER, header)
        .header("content-type", "application/json")
        .timeout(Duration::from_millis(settings.webhook_timeout_ms.max(1)))
        .body(body)
        .send()
        .await;
    let status = match &result {
        Ok(r) => Some(r.status().as_u16()),
        Err(e) => {
            tracing::debug!(event = %ev.id, attempt, error = %e, "webhook delivery failed");
            None
        }
    };
    inner.record_delivery(Delivery {
        event_id: ev.id.clone(),
        kind: ev.kind.clone(),
        attempt,
        status,
    });
    matches!(status, Some(s) if (200..300).contains(&s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_stripe_scheme() {
        // The v1 part must verify as HMAC-SHA256 over "<t>.<body>" with the secret.
        let h = signature_header("whsec_test", 1_700_000_000, b"{}");
        assert!(h.starts_with("t=1700000000,v1="));
        let hex_part = h.rsplit("v1=").next().unwrap_or_default();
        assert_eq!(hex_part.len(), 64);
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"whsec_test");
        let tag = hex::decode(hex_part).unwrap();
        assert!(hmac::verify(&key, b"1700000000.{}", &tag).is_ok());
    }
}
