//! Unit tests of the pay endpoint's pure parts.

use super::*;
use crate::payments::webhooks::SignatureError;
use serde_json::json;

fn answer(e: PaymentError) -> (u16, String, Value) {
    let e = ApiError::from(e);
    let status = e.status().as_u16();
    let code = e.code().to_owned();
    let details = match e {
        ApiError::Client { body, .. } => serde_json::to_value(&body.details).unwrap(),
        _ => Value::Null,
    };
    (status, code, details)
}

#[test]
fn refusals_keep_their_status_code_and_details() {
    assert_eq!(
        answer(PaymentError::InvalidPaymentMethod).0,
        422,
        "validation"
    );
    assert_eq!(
        answer(PaymentError::OrderNotFound),
        (404, codes::NOT_FOUND.into(), json!({}))
    );
    assert_eq!(
        answer(PaymentError::NotPayable {
            why: Unpayable::Status("EXPIRED".into()),
            open: OpenAttempt::Refunded
        }),
        (
            409,
            codes::ORDER_NOT_PAYABLE.into(),
            json!({"status": "EXPIRED", "refunded": true})
        )
    );
    assert_eq!(
        answer(PaymentError::NotPayable {
            why: Unpayable::HoldLost,
            open: OpenAttempt::RefundPending
        }),
        (
            409,
            codes::HOLD_EXPIRED.into(),
            json!({"refund_pending": true})
        )
    );
    assert_eq!(
        answer(PaymentError::InProgress { attempt: Some(2) }),
        (
            409,
            codes::PAYMENT_IN_PROGRESS.into(),
            json!({"attempt": 2})
        )
    );
    assert_eq!(
        answer(PaymentError::ProviderTimeout { attempt: 1 }),
        (
            504,
            codes::PAYMENT_PROVIDER_TIMEOUT.into(),
            json!({"attempt": 1})
        )
    );
    assert_eq!(
        answer(PaymentError::ProviderFailed { attempt: 1 }),
        (
            502,
            codes::PAYMENT_PROVIDER_ERROR.into(),
            json!({"attempt": 1})
        )
    );
    assert_eq!(
        answer(PaymentError::BadSignature(SignatureError::Stale)),
        (
            400,
            codes::INVALID_SIGNATURE.into(),
            json!({"reason": "stale"})
        )
    );
    assert_eq!(
        answer(PaymentError::MalformedEvent),
        (400, codes::MALFORMED_JSON.into(), json!({}))
    );
}

#[test]
fn an_unreachable_database_stays_a_503_and_a_bug_a_500() {
    let down = PaymentError::Db {
        statement: "pin the order",
        source: sqlx::Error::PoolTimedOut,
    };
    let e = ApiError::from(down);
    assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(format!("{e:?}").contains("pin the order"), "{e:?}");
    let bug = PaymentError::Db {
        statement: "record the payment attempt",
        source: sqlx::Error::RowNotFound,
    };
    let e = ApiError::from(bug);
    assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        format!("{e:?}").contains("record the payment attempt"),
        "{e:?}"
    );
}
