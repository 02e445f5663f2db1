//! The application layer: the only module that knows every domain. It assembles state,
//! routes, configuration, metrics and background jobs, and starts the service.

pub mod config;
pub mod health;
pub mod jobs;
pub mod metrics;
pub mod routes;
pub mod session;
pub mod startup;
pub mod state;
