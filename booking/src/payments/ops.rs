//! The money side of the ops API (issue 18): refunds and cancellation of paid orders, and
//! event cancellation with its resumable refund job. Refunds booking asks for are recorded
//! in `order_refunds` before the provider is called ([`refund`]); the job
//! ([`event_cancel::RefundJob`]) finishes whatever a request or a crashed process left.

pub mod event_cancel;
pub mod http;
pub mod refund;

pub use http::router;
