//! The platform layer: what every domain stands on and none of them owns. It imports no
//! domain module.

pub mod audit;
pub mod auth;
pub mod credentials;
pub mod db;
pub mod email;
pub mod error;
pub mod idempotency;
pub mod jobs;
pub mod json;
pub mod kept;
pub mod lanes;
pub mod openapi;
pub mod redis;
pub mod revocation;
pub mod session_until;
