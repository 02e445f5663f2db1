//! The one mapping of [`PaymentError`] to the fan's and ops' answer (`ApiError`), and to a
//! retryable transaction error (`TxError`).

use super::*;

impl From<PaymentError> for ApiError {
    fn from(e: PaymentError) -> Self {
        match e {
            PaymentError::InvalidPaymentMethod => ApiError::validation(
                "payment_method must be a provider payment method id such as pm_card_visa",
            ),
            PaymentError::OrderNotFound => ApiError::not_found(codes::NOT_FOUND, "no such order"),
            PaymentError::NotPayable { why, open } => {
                let e = match why {
                    Unpayable::Status(status) => ApiError::conflict(
                        codes::ORDER_NOT_PAYABLE,
                        "this order can no longer be paid",
                    )
                    .with("status", status),
                    Unpayable::HoldLost => ApiError::conflict(
                        codes::HOLD_EXPIRED,
                        "the seats of this order are no longer held",
                    ),
                };
                match open {
                    OpenAttempt::Untouched => e,
                    OpenAttempt::Refunded => e.with("refunded", true),
                    OpenAttempt::RefundPending => e.with("refund_pending", true),
                }
            }
            PaymentError::AttemptsExhausted { max } => ApiError::conflict(
                codes::PAYMENT_ATTEMPTS_EXHAUSTED,
                "this order had all the payment attempts it may have",
            )
            .with("max_attempts", max),
            PaymentError::InProgress { attempt } => {
                let e = ApiError::conflict(
                    codes::PAYMENT_IN_PROGRESS,
                    "a payment for this order is still being processed; check the order shortly",
                )
                .retry_after(2);
                match attempt {
                    Some(n) => e.with("attempt", n),
                    None => e,
                }
            }
            PaymentError::ProviderTimeout { attempt } => ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                codes::PAYMENT_PROVIDER_TIMEOUT,
                "the payment provider did not answer in time; retry: you will not be charged twice",
            )
            .with("attempt", attempt),
            PaymentError::ProviderFailed { attempt } => ApiError::new(
                StatusCode::BAD_GATEWAY,
                codes::PAYMENT_PROVIDER_ERROR,
                "the payment provider failed; retry: you will not be charged twice",
            )
            .with("attempt", attempt),
            PaymentError::ProviderLookup(e) => ApiError::Unavailable(
                anyhow::Error::new(e).context("could not look up the disputed/refunded payment"),
            ),
            PaymentError::BadSignature(e) => ApiError::bad_request(
                codes::INVALID_SIGNATURE,
                "webhook signature verification failed",
            )
            .with("reason", e.reason()),
            PaymentError::MalformedEvent => ApiError::bad_request(
                codes::MALFORMED_JSON,
                "webhook body is not a provider event",
            ),
            PaymentError::KeyRefused(e) => e,
            PaymentError::Ops(e) => ApiError::Unexpected(e),
            // Unavailability stays a 503 (ApiError's sqlx mapping); the statement goes into
            // the logged cause.
            PaymentError::Db { statement, source } => match ApiError::from(source) {
                ApiError::Unavailable(e) => ApiError::Unavailable(e.context(statement)),
                ApiError::Unexpected(e) => ApiError::Unexpected(e.context(statement)),
                client => client,
            },
        }
    }
}

/// Inside [`db::retry`]: a deadlock or serialization failure is retried, anything else is
/// the answer.
impl From<PaymentError> for TxError {
    fn from(e: PaymentError) -> Self {
        match e {
            PaymentError::Db { source, .. } if is_retryable(&source) => TxError::Db(source),
            other => TxError::Api(other.into()),
        }
    }
}
