//! The public listener: a thin pingora `ProxyHttp`. `request_filter` routes the request
//! ([`crate::routes::public`]); the waiting room, static pages and health endpoints are
//! answered right there (`Ok(true)`), and only `/api/…`, `/ws/…` with a valid admission
//! token (plus the signed payment webhook) continue to a booking upstream.
//!
//! Guarantees for what reaches booking: the admission token verified (signature, `kid`,
//! algorithm, expiry, audience, issuer, event on event-scoped paths, not revoked); every
//! client-sent `x-floodgate-*` header removed and `x-floodgate-account`,
//! `x-floodgate-event`, `x-request-id` set from the verified token; a request is retried on
//! another upstream only when the connection could not be established (nothing was sent),
//! never after it was sent (pingora's default `error_while_proxy` keeps non-idempotent
//! requests unretried).

use crate::forward;
use crate::limits::Scope;
use crate::queue;
use crate::respond::{Reply, read_body, send};
use crate::routes::{self, EventPage, Route};
use crate::session::{self, Decision};
use crate::size::{self, BodyBudget};
use crate::state::Shared;
use crate::store::Store;
use crate::upstream::ConnectFailure;
use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::{Error, ErrorSource, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use serde_json::json;
use shared::error::codes;
use shared::headers;
use shared::token::AdmissionClaims;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod gate;
mod steps;
use gate::wants_html;
pub use gate::{admission_token, check_admission, is_pay, refusal, room_full};

pub struct PublicProxy {
    pub shared: Arc<Shared>,
    /// Shared with tasks spawned off the request path (slot release after payment).
    pub store: Arc<Store>,
    pub request_seq: std::sync::atomic::AtomicU64,
    /// Admitted API calls take `forward.rs` for the hop to booking (`gateway.fast_forward`).
    pub fast: bool,
}

/// Per-request state.
#[derive(Default)]
pub struct Ctx {
    claims: Option<Arc<AdmissionClaims>>,
    upstream: Option<usize>,
    tried: u64,
    sent_at: Option<Instant>,
    latency: Option<Duration>,
    status: u16,
    /// `POST /api/orders/{id}/pay`: a 200 means the fan is done shopping.
    pays: bool,
    /// A body streamed to booking through pingora-proxy, counted against its route's limit.
    body: Option<BodyBudget>,
    /// The fan's body was cut at the limit: booking's health is not what failed.
    body_refused: bool,
    /// Booking said how long the fan's checkout lasts (`x-floodgate-session-until`); that
    /// decides the slot instead of the payment rule.
    session_said: bool,
    /// Counts this request in `fg_requests_in_flight` until the context is dropped.
    _in_flight: Option<InFlight>,
}

/// One request in `fg_requests_in_flight` (the HPA's load signal besides CPU: it rises with
/// slow upstreams and many waiting connections, which CPU alone does not show).
pub struct InFlight(prometheus::IntGauge);

impl InFlight {
    pub fn new(g: &prometheus::IntGauge) -> Self {
        g.inc();
        Self(g.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// How long `event`'s freed marks are kept (`live::freed_keep_ms`; the defaults for an event
/// this instance does not know yet).
fn freed_keep_ms(live: &crate::live::Live, event: &str) -> i64 {
    crate::live::freed_keep_ms(live, event).unwrap_or(
        i64::try_from(crate::event_config::DEFAULT_MAX_SESSION_S + 60).unwrap_or(1860) * 1000,
    )
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// How long the gateway keeps reading (and dropping) a refused body after its `413`: closing
/// on unread bytes resets the connection, which can destroy the answer before the fan reads it.
const DRAIN_REFUSED_BODY: Duration = Duration::from_secs(2);

/// Keeps the connection open after an answer sent before the request body was read, so
/// pingora drains the rest of the body (for [`DRAIN_REFUSED_BODY`] at most) instead of closing
/// under the fan's upload (its default answers `Connection: close` and resets).
fn drain_after_answer(session: &mut Session) {
    session.set_close_on_response_before_downstream_finish(false);
    session.set_total_drain_timeout(Some(DRAIN_REFUSED_BODY));
}

/// A request id on the stack: `<prefix>-<n in hex>`.
pub struct RequestId {
    buf: [u8; RequestId::CAP],
    len: usize,
}

impl RequestId {
    const CAP: usize = 80;
    /// Longest prefix kept, leaving room for `-` and 16 hex digits (instance ids are `gw-` +
    /// a 36-character UUID).
    const PREFIX_MAX: usize = Self::CAP - 17;

    pub fn new(prefix: &str, n: u64) -> Self {
        use std::io::Write;
        let prefix = &prefix[..prefix.floor_char_boundary(Self::PREFIX_MAX)];
        let mut buf = [0u8; Self::CAP];
        let mut w = &mut buf[..];
        // Cannot run out of room: the prefix is cut to leave space for the rest.
        let _ = write!(w, "{prefix}-{n:x}");
        let len = Self::CAP - w.len();
        Self { buf, len }
    }

    pub fn as_str(&self) -> &str {
        // A whole-character prefix followed by ASCII: always UTF-8.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

/// What booking learns from the gateway on every forwarded call, on either proxy path (inbound
/// `x-floodgate-*` headers are dropped first): the verified account and event, and a request id.
fn identity_headers<'a>(
    claims: Option<&'a AdmissionClaims>,
    request_id: &'a str,
) -> impl Iterator<Item = (&'static str, &'a str)> {
    claims
        .into_iter()
        .flat_map(|c| {
            [
                (headers::ACCOUNT, c.sub.as_str()),
                (headers::EVENT, c.evt.as_str()),
            ]
        })
        .chain(std::iter::once((headers::REQUEST_ID, request_id)))
}

fn rate_limited(s: &Shared, scope: Scope, wait: Duration) -> Reply {
    s.metrics
        .rate_limited
        .with_label_values(&[scope.label()])
        .inc();
    Reply::error(429, codes::RATE_LIMITED, "too many requests; slow down")
        .retry_after(crate::limits::retry_after_secs(wait))
}

enum Action {
    /// An admitted API call: on to booking.
    Forward,
    /// The signed payment webhook: its own limits, then on to booking through pingora-proxy.
    Webhook,
    Reply(Reply),
    Join(String),
    Register(String),
    Status(String),
    Draw(String),
    Receipt(String),
    Challenge(String),
    DevLogin,
    Ready,
}

#[async_trait]
impl ProxyHttp for PublicProxy {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            _in_flight: Some(InFlight::new(&self.shared.metrics.in_flight)),
            ..Ctx::default()
        }
    }

    fn init_downstream_modules(&self, _modules: &mut pingora_core::modules::http::HttpModules) {
        // pingora's default adds its response-compression module switched off; it would still
        // be built and consulted on every request. Answers here are small JSON.
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        // pingora itself reads header blocks up to 1 MiB; nothing here needs more than a few
        // KiB, and booking must never see more.
        let max_header = self.shared.config.gateway.max_header_bytes;
        if size::header_block_len(session.req_header()) > max_header {
            return send(session, size::header_too_large(max_header)).await;
        }
        let action = {
            let req = session.req_header();
            match routes::public(&req.method, req.uri.path()) {
                Route::Api { event } => match self.admit_api(session, event, ctx).await {
                    Ok(()) => Action::Forward,
                    Err(r) => Action::Reply(r),
                },
                // Webhooks keep pingora-proxy's path: their signatures cover raw bodies, which
                // stay untouched there.
                Route::Webhook => Action::Webhook,
                Route::Healthz => Action::Reply(Reply::json(200, &json!({"status": "ok"}))),
                Route::Readyz => Action::Ready,
                Route::OpenApi => {
                    Action::Reply(crate::respond::openapi(crate::respond::OPENAPI_PUBLIC))
                }
                // Queue lengths and rates are for ops: on the admin listener, and on the public
                // one only when configured (`public_metrics`).
                Route::Metrics if !self.shared.config.gateway.public_metrics => {
                    Action::Reply(Reply::error(404, codes::NOT_FOUND, "not found"))
                }
                Route::Metrics => Action::Reply(Reply::bytes(
                    200,
                    "text/plain; version=0.0.4",
                    Bytes::from(self.shared.metrics.render()),
                    "no-store",
                )),
                Route::DevLogin => Action::DevLogin,
                Route::Join(e) => Action::Join(e.to_owned()),
                Route::Register(e) => Action::Register(e.to_owned()),
                Route::Status(e) => Action::Status(e.to_owned()),
                Route::Draw(e) => Action::Draw(e.to_owned()),
                Route::Receipt(e) => Action::Receipt(e.to_owned()),
                Route::Challenge(e) => Action::Challenge(e.to_owned()),
                Route::Page(p) => Action::Reply(self.page(p)),
                Route::EventPage {
                    page: EventPage::Tickets,
                    ..
                } => Action::Reply(self.page(EventPage::Tickets.file()).header(
                    "content-security-policy",
                    self.shared.pages.tickets_csp().to_owned(),
                )),
                Route::EventPage { page, .. } => Action::Reply(self.page(page.file())),
                Route::UnknownEvent => Action::Reply(Reply::error(
                    404,
                    codes::UNKNOWN_EVENT,
                    "no waiting room for this event",
                )),
                Route::MethodNotAllowed => Action::Reply(
                    Reply::error(405, codes::METHOD_NOT_ALLOWED, "method not allowed")
                        .header("allow", routes::public_allow(req.uri.path())),
                ),
                Route::BadPath => {
                    Action::Reply(Reply::error(400, codes::INVALID_REQUEST, "malformed path"))
                }
                Route::NotFound => Action::Reply(Reply::error(404, codes::NOT_FOUND, "not found")),
            }
        };
        let s = &self.shared;
        let st = &self.store;
        let reply = match action {
            Action::Forward => {
                return self
                    .to_booking(session, ctx, self.fast, self.body_limit())
                    .await;
            }
            Action::Webhook => return self.webhook(session, ctx).await,
            Action::Reply(r) => r,
            Action::Ready => self.ready().await,
            Action::DevLogin => queue::dev_login(s, session).await,
            Action::Join(e) => queue::join(s, st, session, &e).await,
            Action::Register(e) => crate::registration::register(s, st, session, &e).await,
            Action::Status(e) => queue::status(s, st, session, &e).await,
            Action::Draw(e) => queue::draw(s, st, &e).await,
            Action::Receipt(e) => queue::receipt(s, session, &e).await,
            Action::Challenge(e) => queue::challenge(s, st, session, &e).await,
        };
        send(session, reply).await
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let ups = &self.shared.upstreams;
        let i = ups.pick(ctx.tried).ok_or_else(|| {
            Error::explain(ErrorType::ConnectNoRoute, "no healthy booking upstream")
        })?;
        ctx.tried |= 1 << i;
        ctx.upstream = Some(i);
        ups.peer(i)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "upstream index out of range"))
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // Nothing reached this upstream, so trying another one is safe for any method.
        if let Some(i) = ctx.upstream {
            let failure = if e.etype() == &ErrorType::ConnectTimedout {
                ConnectFailure::TimedOut
            } else {
                ConnectFailure::Refused
            };
            self.shared.upstreams.connect_failed(i, failure);
        }
        e.set_retry(self.shared.upstreams.pick(ctx.tried).is_some());
        e
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        // After a WebSocket upgrade these are the fan's frames, not a request body.
        if session.was_upgraded() {
            return Ok(());
        }
        if let (Some(budget), Some(chunk)) = (ctx.body.as_mut(), body.as_ref())
            && !budget.take(chunk.len())
        {
            ctx.body_refused = true;
            // Booking never receives the rest: its request stays incomplete and changes
            // nothing. `fail_to_proxy` answers 413.
            return Err(Error::explain(
                ErrorType::HTTPStatus(413),
                "request body over its limit",
            ));
        }
        Ok(())
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let internal: Vec<http::HeaderName> = req
            .headers
            .keys()
            .filter(|k| k.as_str().starts_with(headers::INTERNAL_PREFIX))
            .cloned()
            .collect();
        for k in internal {
            req.remove_header(&k);
        }
        let request_id = self.request_id();
        for (k, v) in identity_headers(ctx.claims.as_deref(), request_id.as_str()) {
            req.insert_header(k, v)?;
        }
        ctx.sent_at = Some(Instant::now());
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        ctx.status = resp.status.as_u16();
        ctx.latency = ctx.sent_at.map(|t| t.elapsed());
        self.checkout_session(resp, ctx).await;
        Ok(())
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        use ErrorType::*;
        use forward::Failure;
        let reply = match e.etype() {
            ConnectTimedout | ConnectRefused | ConnectNoRoute | ConnectError | SocketError
            | TLSHandshakeFailure | TLSHandshakeTimedout | HandshakeError => {
                Some(self.upstream_failure(Failure::Unavailable))
            }
            HTTPStatus(413) => Some(size::body_too_large(
                ctx.body.map_or_else(|| self.body_limit(), |b| b.limit()),
            )),
            HTTPStatus(c) => Some(Reply::error(*c, codes::INVALID_REQUEST, "request refused")),
            ReadTimedout | WriteTimedout if e.esource() == &ErrorSource::Upstream => {
                Some(self.upstream_failure(Failure::Timeout))
            }
            _ => match e.esource() {
                ErrorSource::Upstream => Some(self.upstream_failure(Failure::Broken)),
                ErrorSource::Downstream => match e.etype() {
                    WriteError | ReadError | ConnectionClosed => None,
                    _ => Some(Reply::error(
                        400,
                        codes::INVALID_REQUEST,
                        "malformed request",
                    )),
                },
                ErrorSource::Internal | ErrorSource::Unset => {
                    Some(Reply::error(500, codes::INTERNAL, "internal error"))
                }
            },
        };
        let status = reply.as_ref().map_or(0, |r| r.status);
        // A refused streamed body: the connection is still in step with the fan, so pingora
        // may drain the rest of the body (briefly) instead of resetting the connection under
        // the 413.
        let mut refused_body = false;
        if let Some(reply) = reply
            && session.as_downstream().response_written().is_none()
        {
            if status == 413 {
                drain_after_answer(session);
            }
            refused_body = send(session, reply).await.is_ok() && status == 413;
        }
        FailToProxy {
            error_code: status,
            can_reuse_downstream: refused_body,
        }
    }

    async fn logging(&self, _session: &mut Session, _e: Option<&Error>, ctx: &mut Ctx) {
        // Upstream statistics (auto mode) count booking's answers only: a fan's oversized
        // body must not look like a failing upstream.
        if ctx.upstream.is_none() || ctx.body_refused {
            return;
        }
        if ctx.pays
            && ctx.status == 200
            && !ctx.session_said
            && let Some(c) = ctx.claims.take()
        {
            // Paid (and booking did not say more, see `checkout_session`): the fan is done,
            // so their slot goes back to the `max_active` budget now rather than when the
            // token expires (the token itself stays valid: receipts,
            // order pages). Off the request path; a failure only delays the slot.
            let store = self.store.clone();
            let live = &self.shared.live;
            let shards = live.queue_shards(&c.evt);
            let keep_ms = freed_keep_ms(live, &c.evt);
            live.freed
                .freed(&c.evt, &c.sub, chrono::Utc::now().timestamp_millis());
            tokio::spawn(async move {
                if let Err(e) = store.release_active(&c.evt, shards, &c.sub, keep_ms).await {
                    tracing::debug!(error = %e, "releasing a paid fan's admission slot failed");
                }
            });
        }
        let m = &self.shared.metrics;
        m.proxied.inc();
        let latency = ctx
            .latency
            .unwrap_or_else(|| ctx.sent_at.map(|t| t.elapsed()).unwrap_or_default());
        self.shared.window.record(latency, ctx.status);
        if ctx.status > 0 {
            m.upstream_latency.observe(latency.as_secs_f64());
        }
        m.upstream_response(ctx.status);
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, e: &Error) -> bool {
        // Clients hanging up are normal at the edge; logging each one is what made
        // pingora slow in benchmarks.
        matches!(
            e.etype(),
            ErrorType::ReadError | ErrorType::WriteError | ErrorType::ConnectionClosed
        ) && e.esource() == &ErrorSource::Downstream
    }
}

#[cfg(test)]
mod tests;
