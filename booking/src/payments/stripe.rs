//! The shipped [`PaymentProvider`]: a Stripe-style HTTP API (JSON bodies) spoken with
//! reqwest, bounded by connect and request timeouts. Every mutating call carries an
//! `Idempotency-Key`, so retrying it can never take money twice.
//!
//! Error mapping (see [`ProviderError`]): connect failure → `NotSent`; timeout → `Timeout`;
//! `5xx` or a broken connection → `Unavailable`; `409 idempotency_key_in_use` → `InProgress`;
//! `402 card_error` → a declined payment (`Ok`); other `4xx` → `Rejected`.

use super::PaymentSettings;
use super::provider::{
    CreatePayment, PaymentProvider, PaymentStatus, ProviderError, ProviderPayment, ProviderRefund,
};
use anyhow::Context;
use async_trait::async_trait;
use reqwest::StatusCode;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

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
            .send()
            .await
            .map_err(map_send_error)?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(map_send_error)?;
        if status.is_server_error() {
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
        let body = json!({
            "amount": req.amount,
            "currency": req.currency.to_ascii_lowercase(),
            "payment_method": req.payment_method,
            "confirm": true,
            "metadata": req.metadata,
        });
        let (status, value) = self
            .send(
                self.client
                    .post(self.url("/v1/payment_intents"))
                    .header("Idempotency-Key", &req.idempotency_key)
                    .json(&body),
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
    ) -> Result<ProviderRefund, ProviderError> {
        let (status, value) = self
            .send(
                self.client
                    .post(self.url("/v1/refunds"))
                    .header("Idempotency-Key", idempotency_key)
                    .json(&json!({"payment_intent": payment_id})),
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
