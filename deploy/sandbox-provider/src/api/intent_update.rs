//! `POST /v1/payment_intents/{id}` (Stripe's update): `amount`, `currency`, `payment_method`,
//! `metadata`, `description`, `receipt_email`.
//!
//! As Stripe: `metadata` merges into the intent's (a key set to `""` is deleted, `metadata=""`
//! deletes them all; at most 50 keys after the merge); `description` / `receipt_email` set to
//! `""` are unset; `amount`, `currency` and `payment_method` may change only while the intent
//! is `requires_payment_method`, `requires_confirmation` or `requires_action`, else `400
//! payment_intent_unexpected_state` naming the parameter and carrying the intent, so money
//! already taken (or an intent canceled) never changes its amount. Changing them sends an
//! intent that was waiting for 3-D Secure (or had no method) back to `requires_confirmation`:
//! what the customer authenticated is no longer what would be charged, so it must be
//! confirmed again. No event is sent (Stripe has no `payment_intent.updated`).

use super::intents::{abandon, check_amount, check_currency, check_method};
use super::{
    ApiErr, Halt, Shared, answer, authorize, begin, content_type, detached, halt, idempotency_key,
    request_id, simulate_latency,
};
use crate::SandboxInner;
use crate::form::Form;
use crate::store::Intent;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The statuses Stripe lets `amount`, `currency` and `payment_method` change in.
const CHANGEABLE: [&str; 3] = [
    "requires_payment_method",
    "requires_confirmation",
    "requires_action",
];

/// What an update asks for; `None` leaves a field as it is.
#[derive(Debug, Default)]
struct Changes {
    amount: Option<i64>,
    currency: Option<String>,
    payment_method: Option<String>,
    /// `metadata=""`: drop every key before merging.
    clear_metadata: bool,
    /// Merged in; an empty value deletes the key.
    metadata: BTreeMap<String, String>,
    /// `Some("")` unsets.
    description: Option<String>,
    receipt_email: Option<String>,
}

fn parse(form: &mut Form) -> Result<Changes, ApiErr> {
    let amount = form.take_i64("amount")?;
    if let Some(a) = amount {
        check_amount(a)?;
    }
    let currency = form.take("currency")?;
    if let Some(c) = &currency {
        check_currency(c)?;
    }
    let clear_metadata = match form.take("metadata")?.as_deref() {
        None => false,
        Some("") => true,
        Some(_) => {
            return Err(ApiErr::invalid(
                "parameter_invalid",
                Some("metadata"),
                "Invalid object: metadata must be a hash, or \"\" to unset it.",
            ));
        }
    };
    let changes = Changes {
        amount,
        currency: currency.map(|c| c.to_ascii_lowercase()),
        payment_method: form.take("payment_method")?,
        clear_metadata,
        metadata: form.take_metadata()?,
        description: form.take("description")?,
        receipt_email: form.take("receipt_email")?,
    };
    std::mem::take(form).finish()?;
    Ok(changes)
}

/// The refusal of a change to `param` in the intent's status, as Stripe words it.
fn unexpected_state(intent: &Intent, param: &str) -> ApiErr {
    let mut e = ApiErr::invalid(
        "payment_intent_unexpected_state",
        Some(param),
        &format!(
            "This PaymentIntent's {param} could not be updated because it has a status of {}. \
             You may only update the {param} of a PaymentIntent with one of the following \
             statuses: {}.",
            intent.status,
            CHANGEABLE.join(", ")
        ),
    );
    e.body["error"]["payment_intent"] = serde_json::to_value(intent).unwrap_or_default();
    e
}

/// Applies `c` to `intent`, all or nothing. Pure over the intent, so the caller runs it under
/// the store's lock: a status check and the change it allows are one step.
fn apply(intent: &mut Intent, c: &Changes) -> Result<(), ApiErr> {
    let money = [
        ("amount", c.amount.is_some()),
        ("currency", c.currency.is_some()),
        ("payment_method", c.payment_method.is_some()),
    ];
    if let Some((param, _)) = money
        .iter()
        .find(|(_, given)| *given && !CHANGEABLE.contains(&intent.status.as_str()))
    {
        return Err(unexpected_state(intent, param));
    }
    let mut metadata = if c.clear_metadata {
        BTreeMap::new()
    } else {
        intent.metadata.clone()
    };
    for (k, v) in &c.metadata {
        if v.is_empty() {
            metadata.remove(k);
        } else {
            metadata.insert(k.clone(), v.clone());
        }
    }
    if metadata.len() > 50 {
        return Err(ApiErr::invalid(
            "parameter_invalid",
            Some("metadata"),
            "Metadata can have at most 50 keys.",
        ));
    }
    let reconfirm = money.iter().any(|(_, given)| *given)
        && matches!(
            intent.status.as_str(),
            "requires_action" | "requires_payment_method"
        );
    intent.metadata = metadata;
    if let Some(a) = c.amount {
        intent.amount = a;
    }
    if let Some(cur) = &c.currency {
        intent.currency = cur.clone();
    }
    if let Some(pm) = &c.payment_method {
        intent.payment_method = Some(pm.clone());
    }
    if let Some(d) = &c.description {
        intent.description = Some(d.clone()).filter(|d| !d.is_empty());
    }
    if let Some(e) = &c.receipt_email {
        intent.receipt_email = Some(e.clone()).filter(|e| !e.is_empty());
    }
    if reconfirm && intent.payment_method.is_some() {
        intent.status = "requires_confirmation".into();
        intent.next_action = None;
    }
    Ok(())
}

pub async fn update(
    State(inner): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    detached(async move { update_inner(&inner, &headers, &id, &body).await }).await
}

async fn update_inner(
    inner: &Arc<SandboxInner>,
    headers: &HeaderMap,
    id: &str,
    body: &Bytes,
) -> Result<Response, Halt> {
    authorize(inner, headers).map_err(halt)?;
    simulate_latency(inner).await;
    let mut form = Form::parse(content_type(headers), body).map_err(halt)?;
    let fp = format!("{id}?{}", form.fingerprint());
    let changes = parse(&mut form).map_err(halt)?;
    if let Some(pm) = &changes.payment_method {
        check_method(pm, &inner.settings()).map_err(halt)?;
    }
    let key = idempotency_key(headers).map_err(halt)?;
    begin(inner, key.as_deref(), "payment_intents.update", &fp)?;
    let result = inner.store.update_intent(id, |intent| {
        apply(intent, &changes)?;
        Ok::<_, ApiErr>(serde_json::to_value(&*intent).unwrap_or(Value::Null))
    });
    let body = match result {
        None => {
            return Err(abandon(
                inner,
                key.as_deref(),
                ApiErr::missing("payment_intent", id),
            ));
        }
        Some(Err(e)) => return Err(abandon(inner, key.as_deref(), e)),
        Some(Ok(b)) => b,
    };
    if let Some(k) = &key {
        inner.store.idem_finish(k, 200, &body);
    }
    Ok(answer(StatusCode::OK, body, &request_id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(status: &str) -> Intent {
        Intent {
            id: "pi_1".into(),
            object: "payment_intent",
            amount: 1000,
            amount_refunded: 0,
            amount_received: 0,
            currency: "jpy".into(),
            status: status.into(),
            payment_method: Some("pm_card_visa".into()),
            payment_method_types: vec!["card".into()],
            capture_method: "automatic",
            confirmation_method: "automatic",
            livemode: false,
            metadata: BTreeMap::from([("a".into(), "1".into()), ("b".into(), "2".into())]),
            description: None,
            receipt_email: None,
            created: 0,
            latest_charge: None,
            last_payment_error: None,
            next_action: None,
            canceled_at: None,
            cancellation_reason: None,
        }
    }

    fn changes(body: &str) -> Changes {
        let mut form =
            Form::parse(Some("application/x-www-form-urlencoded"), body.as_bytes()).expect("form");
        parse(&mut form).expect("valid update")
    }

    #[test]
    fn metadata_merges_and_empty_values_delete() {
        let mut pi = intent("succeeded");
        apply(
            &mut pi,
            &changes("metadata[a]=&metadata[c]=3&description=x"),
        )
        .expect("applies");
        let keys: Vec<&str> = pi.metadata.keys().map(String::as_str).collect();
        assert_eq!(keys, ["b", "c"]);
        assert_eq!(pi.description.as_deref(), Some("x"));
        apply(&mut pi, &changes("metadata=&description=")).expect("applies");
        assert!(pi.metadata.is_empty());
        assert_eq!(pi.description, None);
    }

    #[test]
    fn money_is_fixed_once_taken_or_canceled() {
        for status in ["succeeded", "canceled", "processing"] {
            for (body, param) in [
                ("amount=5", "amount"),
                ("currency=usd", "currency"),
                ("payment_method=pm_card_amex", "payment_method"),
            ] {
                let mut pi = intent(status);
                let e = apply(&mut pi, &changes(body)).expect_err(body);
                assert_eq!(e.body["error"]["code"], "payment_intent_unexpected_state");
                assert_eq!(e.body["error"]["param"], param);
                assert_eq!(e.body["error"]["payment_intent"]["amount"], 1000);
                assert_eq!((pi.amount, pi.currency.as_str()), (1000, "jpy"));
            }
        }
        // All or nothing: the metadata of a refused update is not kept either.
        let mut pi = intent("succeeded");
        assert!(apply(&mut pi, &changes("amount=5&metadata[z]=1")).is_err());
        assert!(!pi.metadata.contains_key("z"));
    }

    #[test]
    fn a_changed_amount_must_be_confirmed_again() {
        let mut pi = intent("requires_action");
        pi.next_action = Some(serde_json::json!({"type": "use_stripe_sdk"}));
        apply(&mut pi, &changes("amount=1500&currency=USD")).expect("applies");
        assert_eq!((pi.amount, pi.currency.as_str()), (1500, "usd"));
        assert_eq!(pi.status, "requires_confirmation");
        assert_eq!(pi.next_action, None);
    }
}
