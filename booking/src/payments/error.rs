//! The payments domain's error. Repository functions and the flow return it; the HTTP layer
//! ([`crate::payments::http`]) alone turns it into an answer. Every database error names the
//! statement that failed, so a `500` in the log says where.

use crate::payments::model::{OpenAttempt, Unpayable};
use crate::payments::provider::ProviderError;
use crate::payments::webhooks::signature::SignatureError;
use crate::platform::db::{MaybeRetryable, is_retryable};

#[derive(Debug, thiserror::Error)]
pub enum PaymentError {
    #[error("payment_method is not a provider payment method id")]
    InvalidPaymentMethod,
    /// A missing order, or someone else's (they look the same).
    #[error("no such order")]
    OrderNotFound,
    #[error("the order can no longer be paid ({why:?}, open attempt {open:?})")]
    NotPayable { why: Unpayable, open: OpenAttempt },
    /// `[payments] max_attempts` attempts of this order were made (nothing changed).
    #[error("the order's payment attempts are exhausted")]
    AttemptsExhausted { max: u32 },
    /// Another request for the same attempt (or another attempt) is still running.
    #[error("a payment for this order is still being processed")]
    InProgress { attempt: Option<i32> },
    #[error("the payment provider did not answer in time")]
    ProviderTimeout { attempt: i32 },
    #[error("the payment provider failed")]
    ProviderFailed { attempt: i32 },
    /// A provider lookup a webhook needs failed; the provider retries the event.
    #[error("could not look up the disputed/refunded payment")]
    ProviderLookup(#[source] ProviderError),
    #[error("webhook signature verification failed: {0}")]
    BadSignature(SignatureError),
    #[error("webhook body is not a provider event")]
    MalformedEvent,
    /// The `Idempotency-Key` could not be claimed (`422` another request, `409` in flight).
    #[error("idempotency key refused")]
    KeyRefused(#[source] crate::platform::error::ApiError),
    /// A step of an ops change failed (an audit entry, an order transition); the change rolls back.
    #[error("an ops change failed")]
    Ops(#[source] anyhow::Error),
    #[error("database statement failed: {statement}")]
    Db {
        statement: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

impl MaybeRetryable for PaymentError {
    fn retryable(&self) -> bool {
        matches!(self, PaymentError::Db { source, .. } if is_retryable(source))
    }
}

/// Names the statement a database error came from.
pub trait Statement<T> {
    fn statement(self, statement: &'static str) -> Result<T, PaymentError>;
}

impl<T> Statement<T> for Result<T, sqlx::Error> {
    fn statement(self, statement: &'static str) -> Result<T, PaymentError> {
        self.map_err(|source| PaymentError::Db { statement, source })
    }
}

pub type PaymentResult<T> = Result<T, PaymentError>;
