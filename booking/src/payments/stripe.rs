//! The shipped [`PaymentProvider`]: Stripe's own wire format spoken with reqwest over TLS
//! (rustls with ring; HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY from the environment
//! are honoured, as reqwest reads them when the client is built), bounded by connect and
//! request timeouts. Requests are form-encoded (`metadata[order_id]=...`) and pinned to
//! [`STRIPE_VERSION`]; every mutating call carries an `Idempotency-Key`, so retrying it can
//! never take money twice.
//!
//! Statuses: `succeeded` → paid; `requires_payment_method` with a `last_payment_error` →
//! declined; everything else (`requires_action` for 3-D Secure, `processing`...) is
//! [`PaymentStatus::Other`]: pending, never paid — the `payment_intent.succeeded` webhook or
//! reconciliation settles it later.
//!
//! Error mapping (Stripe's error objects; see [`ProviderError`]): connect failure →
//! `NotSent`; timeout → `Timeout`; `5xx`, `429` or a broken connection → `Unavailable`;
//! `409 idempotency_key_in_use` → `InProgress`; `402 card_error` → a declined payment (`Ok`);
//! other `4xx` → `Rejected`.

use super::PaymentSettings;
use super::provider::{
    CreatePayment, PaymentProvider, PaymentStatus, ProviderError, ProviderPayment, ProviderRefund,
};
use anyhow::Context;
use async_trait::async_trait;
use reqwest::StatusCode;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The Stripe API version every request is pinned to (the shapes parsed here are its).
pub const STRIPE_VERSION: &str = "2026-10-28.endive";

pub struct HttpProvider {
    client: reqwest::Client,
    base: String,
    api_key: SecretString,
}

impl HttpProvider {
    pub fn new(settings: &PaymentSettings) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(settings.connect_timeout_ms.max(1)))
            .timeout(Duration::from_millis(settings.request_timeout_ms.max(1)))
            .pool_max_idle_per_host(64)
            .use_rustls_tls()
            // Stripe's API never redirects; following one could resend a charge elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("failed to build the payment provider HTTP client")?;
        Ok(Self {
            client,
            base: settings.provider_url.trim_end_matches('/').to_owned(),
            api_key: settings.api_key.clone(),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, Value), ProviderError> {
        let resp = req
            .bearer_auth(self.api_key.expose_secret())
            .header("Stripe-Version", STRIPE_VERSION)
            .send()
            .await
            .map_err(map_send_error)?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(map_send_error)?;
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            // 429 (rate limit, lock timeout): not run; retried with the same key.
            return Err(ProviderError::Unavailable {
                status: Some(status.as_u16()),
            });
        }
        let value: Value = serde_json::from_slice(&body)
            .context("provider answered with a non-JSON body")
            .map_err(ProviderError::Protocol)?;
        Ok((status, value))
    }
}

fn map_send_error(e: reqwest::Error) -> ProviderError {
    if e.is_timeout() {
        ProviderError::Timeout
    } else if e.is_connect() {
        ProviderError::NotSent(e.into())
    } else {
        ProviderError::Unavailable { status: None }
    }
}

#[derive(Debug, Deserialize)]
struct Intent {
    id: String,
    status: String,
    amount: i64,
    #[serde(default)]
    currency: String,
    #[serde(default)]
    amount_refunded: i64,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    last_payment_error: Option<Value>,
}

impl Intent {
    fn into_payment(self) -> ProviderPayment {
        let status = match self.status.as_str() {
            "succeeded" => PaymentStatus::Succeeded,
            "requires_payment_method" if self.last_payment_error.is_some() => {
                PaymentStatus::Declined {
                    decline_code: decline_code(self.last_payment_error.as_ref()),
                }
            }
            other => PaymentStatus::Other(other.to_owned()),
        };
        ProviderPayment {
            id: self.id,
            status,
            amount: self.amount,
            currency: self.currency,
            amount_refunded: self.amount_refunded,
            metadata: self.metadata,
        }
    }
}

fn decline_code(error: Option<&Value>) -> String {
    error
        .and_then(|e| e.get("decline_code").or_else(|| e.get("code")))
        .and_then(Value::as_str)
        .unwrap_or("generic_decline")
        .to_owned()
}

fn parse<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ProviderError> {
    serde_json::from_value(v)
        .context("provider answer has an unexpected shape")
        .map_err(ProviderError::Protocol)
}

/// Stripe's form encoding of a confirmed card PaymentIntent: nested parameters as
/// `metadata[key]`, lists as `payment_method_types[0]` (card only: a redirect-based method
/// would need a `return_url`, and 3-D Secure still answers `requires_action`).
fn create_form(req: &CreatePayment) -> Vec<(String, String)> {
    let mut form = vec![
        ("amount".to_owned(), req.amount.to_string()),
        ("currency".to_owned(), req.currency.to_ascii_lowercase()),
        ("payment_method".to_owned(), req.payment_method.clone()),
        ("payment_method_types[0]".to_owned(), "card".to_owned()),
        ("confirm".to_owned(), "true".to_owned()),
    ];
    form.extend(
        req.metadata
            .iter()
            .map(|(k, v)| (format!("metadata[{k}]"), v.clone())),
    );
    form
}

/// `POST /v1/refunds`: the intent, and `amount` for a partial refund (Stripe refunds the rest
/// without it).
fn refund_form(payment_id: &str, amount: Option<i64>) -> Vec<(&'static str, String)> {
    let mut form = vec![("payment_intent", payment_id.to_owned())];
    if let Some(a) = amount {
        form.push(("amount", a.to_string()));
    }
    form
}

fn error_code(v: &Value) -> String {
    v.pointer("/error/code")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned()
}

/// Maps a non-2xx, non-5xx answer.
fn refusal(status: StatusCode, body: &Value) -> ProviderError {
    let code = error_code(body);
    if status == StatusCode::CONFLICT && code == "idempotency_key_in_use" {
        ProviderError::InProgress
    } else {
        ProviderError::Rejected {
            status: status.as_u16(),
            code,
        }
    }
}

#[async_trait]
impl PaymentProvider for HttpProvider {
    async fn create_payment(&self, req: &CreatePayment) -> Result<ProviderPayment, ProviderError> {
        let (status, value) = self
            .send(
                self.client
                    .post(self.url("/v1/payment_intents"))
                    .header("Idempotency-Key", &req.idempotency_key)
                    .form(&create_form(req)),
            )
            .await?;
        if status.is_success() {
            return Ok(parse::<Intent>(value)?.into_payment());
        }
        if status == StatusCode::PAYMENT_REQUIRED {
            // A card error carries the declined intent.
            let error = value.get("error").cloned().unwrap_or(Value::Null);
            let intent = error.get("payment_intent").cloned().ok_or_else(|| {
                ProviderError::Protocol(anyhow::anyhow!("decline without payment_intent"))
            })?;
            let mut payment = parse::<Intent>(intent)?.into_payment();
            payment.status = PaymentStatus::Declined {
                decline_code: decline_code(Some(&error)),
            };
            return Ok(payment);
        }
        Err(refusal(status, &value))
    }

    async fn retrieve(&self, payment_id: &str) -> Result<ProviderPayment, ProviderError> {
        let path = format!("/v1/payment_intents/{payment_id}");
        let (status, value) = self.send(self.client.get(self.url(&path))).await?;
        if status.is_success() {
            Ok(parse::<Intent>(value)?.into_payment())
        } else {
            Err(refusal(status, &value))
        }
    }

    async fn cancel(&self, payment_id: &str) -> Result<ProviderPayment, ProviderError> {
        let path = format!("/v1/payment_intents/{payment_id}/cancel");
        let (status, value) = self
            .send(
                self.client
                    .post(self.url(&path))
                    // One cancel per intent: a retry replays the first answer.
                    .header("Idempotency-Key", format!("cancel-{payment_id}"))
                    .form(&[("cancellation_reason", "abandoned")]),
            )
            .await?;
        if status.is_success() {
            Ok(parse::<Intent>(value)?.into_payment())
        } else {
            Err(refusal(status, &value))
        }
    }

    async fn find_by_order(&self, order_id: &str) -> Result<Vec<ProviderPayment>, ProviderError> {
        // Order ids are ours (UUIDv7 hex), but never let one break out of the quoted value.
        if order_id.contains('\'') || order_id.contains('\\') {
            return Ok(Vec::new());
        }
        let query = format!("metadata['order_id']:'{order_id}'");
        let (status, value) = self
            .send(
                self.client
                    .get(self.url("/v1/payment_intents/search"))
                    .query(&[("query", query)]),
            )
            .await?;
        if !status.is_success() {
            return Err(refusal(status, &value));
        }
        #[derive(Deserialize)]
        struct Search {
            data: Vec<Intent>,
        }
        Ok(parse::<Search>(value)?
            .data
            .into_iter()
            .map(Intent::into_payment)
            .collect())
    }

    async fn refund(
        &self,
        idempotency_key: &str,
        payment_id: &str,
        amount: Option<i64>,
    ) -> Result<ProviderRefund, ProviderError> {
        let (status, value) = self
            .send(
                self.client
                    .post(self.url("/v1/refunds"))
                    .header("Idempotency-Key", idempotency_key)
                    .form(&refund_form(payment_id, amount)),
            )
            .await?;
        if !status.is_success() {
            return Err(refusal(status, &value));
        }
        #[derive(Deserialize)]
        struct Refund {
            id: String,
            payment_intent: String,
            amount: i64,
        }
        let r: Refund = parse(value)?;
        Ok(ProviderRefund {
            id: r.id,
            payment_id: r.payment_intent,
            amount: r.amount,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_partial_refund_names_its_amount() {
        assert_eq!(
            refund_form("pi_1", None),
            [("payment_intent", "pi_1".to_owned())]
        );
        assert_eq!(
            refund_form("pi_1", Some(2500)),
            [
                ("payment_intent", "pi_1".to_owned()),
                ("amount", "2500".to_owned())
            ]
        );
    }

    #[test]
    fn create_is_form_encoded_with_nested_metadata() {
        let req = CreatePayment {
            idempotency_key: "k".into(),
            amount: 1200,
            currency: "JPY".into(),
            payment_method: "pm_card_visa".into(),
            metadata: BTreeMap::from([
                ("order_id".to_owned(), "o1".to_owned()),
                ("attempt".to_owned(), "2".to_owned()),
            ]),
        };
        let owned = create_form(&req);
        let pairs: Vec<(&str, &str)> = owned
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("amount", "1200"),
                ("currency", "jpy"),
                ("payment_method", "pm_card_visa"),
                ("payment_method_types[0]", "card"),
                ("confirm", "true"),
                ("metadata[attempt]", "2"),
                ("metadata[order_id]", "o1"),
            ]
        );
    }

    fn status_of(v: Value) -> PaymentStatus {
        parse::<Intent>(v).expect("an intent").into_payment().status
    }

    #[test]
    fn only_succeeded_is_paid_and_actions_are_pending() {
        let intent = |status: &str| json!({"id": "pi_1", "status": status, "amount": 5});
        assert_eq!(status_of(intent("succeeded")), PaymentStatus::Succeeded);
        for pending in ["requires_action", "processing", "requires_confirmation"] {
            assert_eq!(
                status_of(intent(pending)),
                PaymentStatus::Other(pending.to_owned()),
                "{pending} is pending, never paid"
            );
        }
        // A fresh intent is not a decline; one with a card error is.
        assert!(matches!(
            status_of(intent("requires_payment_method")),
            PaymentStatus::Other(_)
        ));
        let mut declined = intent("requires_payment_method");
        declined["last_payment_error"] = json!({"code": "card_declined",
                                                "decline_code": "insufficient_funds"});
        assert_eq!(
            status_of(declined),
            PaymentStatus::Declined {
                decline_code: "insufficient_funds".into()
            }
        );
    }

    #[test]
    fn stripe_errors_map_to_provider_errors() {
        let in_use = json!({"error": {"type": "idempotency_error",
                                      "code": "idempotency_key_in_use"}});
        assert!(matches!(
            refusal(StatusCode::CONFLICT, &in_use),
            ProviderError::InProgress
        ));
        let reused = json!({"error": {"type": "idempotency_error",
                                      "code": "idempotency_key_reused"}});
        assert!(matches!(
            refusal(StatusCode::BAD_REQUEST, &reused),
            ProviderError::Rejected { status: 400, code } if code == "idempotency_key_reused"
        ));
        let missing = json!({"error": {"type": "invalid_request_error",
                                       "code": "resource_missing", "param": "id"}});
        assert!(matches!(
            refusal(StatusCode::NOT_FOUND, &missing),
            ProviderError::Rejected { status: 404, .. }
        ));
    }
}
