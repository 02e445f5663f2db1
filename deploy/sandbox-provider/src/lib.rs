//! Floodgate's sandbox payment provider: a small server that speaks enough of Stripe's own
//! wire format (form-encoded PaymentIntents and Refunds, Stripe's error objects and event
//! shapes) for the booking core to run its whole payment flow locally and in tests, and for
//! Stripe's official client libraries to work against it unchanged.
//!
//! Guarantees that the merchant side relies on (and that tests assert through
//! `GET /_sandbox/orders/{order_id}`):
//! - a payment intent is created at most once per `Idempotency-Key`; a repeat with the same
//!   parameters replays the stored response, other parameters are `400 idempotency_error`,
//!   a concurrent repeat is `409 idempotency_key_in_use`;
//! - a refund happens at most once per key and never exceeds the charge;
//! - every state change emits a signed webhook (`payment_intent.succeeded`,
//!   `payment_intent.payment_failed`, `charge.refunded`, `charge.dispute.created`), retried
//!   until acknowledged;
//! - refunds and disputes can also come from the "dashboard" (`/_sandbox/payment_intents/
//!   {id}/refund|dispute`), as they do at a real provider, behind the merchant's back.
//!
//! Faults are configurable ([`config::SandboxSettings`]) and adjustable at run time through
//! [`Sandbox::update`]. Start it like the services: [`Application::build`] → `port()` →
//! `run_until_stopped()`.

pub mod api;
pub mod config;
pub mod form;
pub mod list;
pub mod store;
pub mod webhooks;

use anyhow::Context;
use config::SandboxSettings;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use store::Store;
use tokio::net::TcpListener;
use webhooks::{Delivery, Event};

/// The Stripe API version whose shapes the sandbox answers with and names in its events: the
/// one Stripe's Python library 16.1.0 pins (booking's adapter sends it too).
pub const STRIPE_API_VERSION: &str = "2026-10-28.endive";

/// Most delivery records kept for `GET /_sandbox/webhooks`.
const MAX_DELIVERY_LOG: usize = 10_000;

pub struct SandboxInner {
    settings: RwLock<SandboxSettings>,
    pub store: Store,
    pub http: reqwest::Client,
    queue: Mutex<Vec<Event>>,
    deliveries: Mutex<VecDeque<Delivery>>,
}

impl SandboxInner {
    /// A snapshot of the current settings (never hold a lock across an `await`).
    pub fn settings(&self) -> SandboxSettings {
        self.settings
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn queue_webhook(&self, ev: Event) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ev);
    }

    fn take_queue(&self) -> Vec<Event> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn queued(&self) -> usize {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn record_delivery(&self, d: Delivery) {
        let mut log = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() >= MAX_DELIVERY_LOG {
            log.pop_front();
        }
        log.push_back(d);
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.deliveries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// Delivers every queued (manual-mode) event now, in order or reversed, once or twice;
/// events whose delivery fails go on to background retries.
pub async fn flush_webhooks(inner: &Arc<SandboxInner>, opts: &api::FlushOptions) -> Vec<Value> {
    let mut events = inner.take_queue();
    if opts.reverse {
        events.reverse();
    }
    let settings = inner.settings();
    let mut out = Vec::new();
    for ev in events {
        let copies = if opts.duplicate { 2 } else { 1 };
        for _ in 0..copies {
            let ok = webhooks::deliver_once(inner, &settings, &ev, 1).await;
            if !ok {
                webhooks::spawn_retries(inner.clone(), ev.clone(), 2, settings.webhook_backoff_ms);
            }
            out.push(json!({"event_id": ev.id, "type": ev.kind, "acknowledged": ok}));
        }
    }
    out
}

/// A handle on a running sandbox, for tests and `main`.
#[derive(Clone)]
pub struct Sandbox(pub Arc<SandboxInner>);

impl Sandbox {
    /// Changes settings at run time (fault rates, webhook mode, webhook URL...).
    pub fn update(&self, f: impl FnOnce(&mut SandboxSettings)) {
        let mut s = self.0.settings.write().unwrap_or_else(|p| p.into_inner());
        f(&mut s);
    }

    pub fn settings(&self) -> SandboxSettings {
        self.0.settings()
    }

    /// Charges, declines and refunds recorded for one merchant order id.
    pub fn order_summary(&self, order_id: &str) -> store::OrderSummary {
        self.0.store.order_summary(order_id)
    }

    /// Events waiting in manual mode.
    pub fn queued_webhooks(&self) -> usize {
        self.0.queued()
    }

    /// Delivers the queued events (manual mode); see [`flush_webhooks`].
    pub async fn flush_webhooks(&self, reverse: bool, duplicate: bool) -> Vec<Value> {
        flush_webhooks(&self.0, &api::FlushOptions { reverse, duplicate }).await
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.0.deliveries()
    }
}

pub struct Application {
    listener: TcpListener,
    port: u16,
    sandbox: Sandbox,
}

impl Application {
    /// Validates settings and binds the listener (port 0 picks a free one).
    pub async fn build(settings: SandboxSettings) -> anyhow::Result<Self> {
        settings.validate()?;
        let listener = TcpListener::bind(&settings.listen)
            .await
            .with_context(|| format!("failed to bind {}", settings.listen))?;
        let port = listener.local_addr().context("no local address")?.port();
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .context("failed to build the webhook HTTP client")?;
        let inner = Arc::new(SandboxInner {
            settings: RwLock::new(settings),
            store: Store::default(),
            http,
            queue: Mutex::new(Vec::new()),
            deliveries: Mutex::new(VecDeque::new()),
        });
        Ok(Self {
            listener,
            port,
            sandbox: Sandbox(inner),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn sandbox(&self) -> Sandbox {
        self.sandbox.clone()
    }

    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let app = api::router(self.sandbox.0.clone());
        tracing::info!(port = self.port, "sandbox payment provider listening");
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .context("server error")
    }
}
