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
use crate::routes::{self, Route};
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
use gate::wants_html;
pub use gate::{admission_token, check_admission, is_pay, refusal};

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
    /// A body streamed to booking through pingora-proxy, counted against booking's limit.
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

impl PublicProxy {
    /// `<instance>-<counter>`: unique across instances (the instance id is a UUIDv7) without
    /// a random-number syscall or a heap allocation per request.
    fn request_id(&self) -> RequestId {
        let n = self
            .request_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RequestId::new(&self.shared.instance, n)
    }

    /// An admitted API call through `forward.rs` (pingora parsed it and will write the answer;
    /// the hop to booking is ours). Failures answer exactly as `fail_to_proxy` does.
    async fn forward(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let body = match read_body(session, self.body_limit()).await {
            Ok(b) => b,
            // Declared lengths are checked before; this is only a second line.
            Err(crate::respond::BodyError::TooLarge) => return self.refuse_body(session).await,
            // The fan's body broke off before its Content-Length: nothing to forward, nobody
            // left to answer.
            Err(crate::respond::BodyError::Unreadable) => {
                return Err(
                    Error::explain(ErrorType::ReadError, "reading the request body").into_down(),
                );
            }
        };
        let (idempotent, head_only) = {
            let m = &session.req_header().method;
            (
                *m == http::Method::GET || *m == http::Method::HEAD,
                *m == http::Method::HEAD,
            )
        };
        let request_id = self.request_id();
        let mut wire = Vec::with_capacity(1024 + body.len());
        forward::encode_request(
            session.req_header(),
            headers::INTERNAL_PREFIX,
            identity_headers(ctx.claims.as_deref(), request_id.as_str()),
            &body,
            &mut wire,
        );
        let sent = Instant::now();
        let outcome = forward::exchange(
            &self.shared.upstreams,
            &wire,
            idempotent,
            head_only,
            &mut ctx.tried,
            &mut ctx.upstream,
        )
        .await;
        ctx.latency = Some(sent.elapsed());
        let answer = match outcome {
            Ok(a) => a,
            Err(f) => return send(session, self.upstream_failure(f)).await,
        };
        ctx.status = answer.head.status.as_u16();
        let mut head = answer.head;
        self.checkout_session(&mut head, ctx);
        let empty = answer.body.is_empty();
        if !head_only && ctx.status != 204 && ctx.status != 304 {
            head.insert_header(http::header::CONTENT_LENGTH, answer.body.len())?;
        }
        session.write_response_header(head, empty).await?;
        if !empty {
            session.write_response_body(Some(answer.body), true).await?;
        }
        Ok(true)
    }

    /// Booking's request body limit (`[booking] body_limit_bytes`).
    fn body_limit(&self) -> usize {
        self.shared.config.booking.body_limit_bytes
    }

    /// Answers `413 BODY_TOO_LARGE` and drains what the fan still sends, for a moment.
    async fn refuse_body(&self, session: &mut Session) -> Result<bool> {
        drain_after_answer(session);
        send(session, size::body_too_large(self.body_limit())).await
    }

    /// A request on its way to booking (either proxy path): a declared body over booking's
    /// limit is refused here, without contacting booking; any other body is counted as it
    /// streams (`request_body_filter`). `fast`: the request may take `forward.rs`.
    async fn to_booking(&self, session: &mut Session, ctx: &mut Ctx, fast: bool) -> Result<bool> {
        let limit = self.body_limit();
        if size::declared_too_large(session.req_header(), limit) {
            return self.refuse_body(session).await;
        }
        if fast && forward::eligible(session.req_header(), limit) {
            return self.forward(session, ctx).await;
        }
        ctx.body = Some(BodyBudget::new(limit));
        Ok(false)
    }

    /// Applies booking's `x-floodgate-session-until` to the caller's admission (see
    /// `session.rs`) and takes the header off the answer, on either proxy path. Redis work is
    /// spawned off the request path; a failure only shortens the slot, never the token.
    fn checkout_session(&self, head: &mut ResponseHeader, ctx: &mut Ctx) {
        let Some(v) = head.headers.get(headers::SESSION_UNTIL) else {
            return;
        };
        let until = session::parse_until(v.as_bytes());
        head.remove_header(headers::SESSION_UNTIL);
        let (Some(until), Some(c)) = (until, ctx.claims.clone()) else {
            return;
        };
        ctx.session_said = true;
        let s = &self.shared;
        let now = unix_now();
        let max_session_s = s
            .live
            .get(&c.evt)
            .and_then(|snap| snap.config.as_ref().map(|cfg| cfg.max_session_s))
            .unwrap_or(crate::event_config::DEFAULT_MAX_SESSION_S);
        let slack_s = s.config.gateway.session_slack_s;
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let store = self.store.clone();
        match session::decide(&c, until, now, as_i64(slack_s), as_i64(max_session_s)) {
            Decision::Keep => {}
            Decision::Release => {
                tokio::spawn(async move {
                    if let Err(e) = store.release_active(&c.evt, &c.sub).await {
                        tracing::debug!(error = %e, "releasing a finished fan's admission slot failed");
                    }
                });
            }
            Decision::Extend { exp } => {
                let minted =
                    s.tokens
                        .mint_session(&c.sub, &c.sid, &c.evt, c.admitted_at(), now, exp);
                let token = match minted {
                    Ok((token, _)) => token,
                    Err(e) => {
                        tracing::error!(error = %e, "minting a refreshed admission token failed");
                        return;
                    }
                };
                let max_age = u64::try_from(exp - now).unwrap_or(0);
                let cookie = queue::admission_cookie(&token, max_age);
                if let Err(e) = head
                    .append_header(http::header::SET_COOKIE, cookie)
                    .and_then(|_| head.insert_header(headers::ADMISSION_TOKEN, token))
                {
                    tracing::error!(error = %e, "adding the refreshed admission token failed");
                    return;
                }
                s.metrics.session_refreshed.inc();
                tokio::spawn(async move {
                    let until_ms = exp.saturating_mul(1000);
                    if let Err(e) = store.extend_active(&c.evt, &c.sub, until_ms).await {
                        tracing::debug!(error = %e, "extending an admission slot failed");
                    }
                });
            }
        }
    }

    /// The fan's answer when booking could not be used, on either proxy path.
    fn upstream_failure(&self, f: forward::Failure) -> Reply {
        let e = |status, msg| Reply::error(status, codes::UPSTREAM_UNAVAILABLE, msg);
        match f {
            forward::Failure::Unavailable => {
                self.shared.metrics.upstream_unavailable.inc();
                e(503, "booking is unavailable; retry shortly").retry_after(2)
            }
            forward::Failure::Timeout => e(504, "booking did not answer in time"),
            forward::Failure::Broken => e(502, "booking failed to answer"),
        }
    }

    fn page(&self, key: &str) -> Reply {
        match self.shared.pages.get(key) {
            Some(f) => Reply::bytes(
                200,
                f.content_type,
                f.body.clone(),
                if self.shared.config.gateway.dev_mode {
                    "no-cache"
                } else {
                    "public, max-age=300"
                },
            ),
            None => Reply::error(404, codes::NOT_FOUND, "not found"),
        }
    }

    /// Unauthenticated: one Redis `PING` per second per instance at most (`answers.rs`).
    async fn ready(&self) -> Reply {
        let fill = || async {
            let redis = self.store.ping().await.is_ok();
            let upstream = self.shared.upstreams.any_healthy();
            let status = if redis && upstream { 200 } else { 503 };
            Reply::json(status, &json!({"redis": redis, "upstream": upstream}))
        };
        // Event slugs never start with `/`, so this key cannot meet a draw's.
        self.shared.answers.get_or_fill("/readyz", 0, fill).await
    }

    /// Decides a `/api/` or `/ws/` request; `Ok(())` lets it through to booking.
    async fn admit_api(
        &self,
        session: &Session,
        event: Option<&str>,
        ctx: &mut Ctx,
    ) -> std::result::Result<(), Reply> {
        let s = &self.shared;
        let v = s.limits.check_ip(Scope::Api, queue::client_ip(s, session));
        s.limits
            .settle(&self.store, v)
            .await
            .map_err(|w| rate_limited(s, w))?;
        let h = &session.req_header().headers;
        let now = unix_now();
        let claims = check_admission(&s.fast_tokens, &s.live, h, event, now).map_err(|e| {
            s.metrics.token_rejected(&e);
            refusal(&e, wants_html(h), event)
        })?;
        let v = s.limits.check_account(Scope::Api, &claims.sub);
        s.limits
            .settle(&self.store, v)
            .await
            .map_err(|w| rate_limited(s, w))?;
        ctx.claims = Some(claims);
        let req = session.req_header();
        ctx.pays = is_pay(&req.method, req.uri.path());
        Ok(())
    }
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

fn rate_limited(s: &Shared, wait: Duration) -> Reply {
    s.metrics
        .rate_limited
        .with_label_values(&[Scope::Api.label()])
        .inc();
    Reply::error(429, codes::RATE_LIMITED, "too many requests; slow down")
        .retry_after(crate::limits::retry_after_secs(wait))
}

enum Action {
    /// An admitted API call: on to booking.
    Forward,
    /// The signed payment webhook: on to booking through pingora-proxy.
    Webhook,
    Reply(Reply),
    Join(String),
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
                Route::Status(e) => Action::Status(e.to_owned()),
                Route::Draw(e) => Action::Draw(e.to_owned()),
                Route::Receipt(e) => Action::Receipt(e.to_owned()),
                Route::Challenge(e) => Action::Challenge(e.to_owned()),
                Route::Page(p) => Action::Reply(self.page(p)),
                Route::EventPage { shop, .. } => {
                    Action::Reply(self.page(if shop { "/shop.html" } else { "/waiting.html" }))
                }
                Route::UnknownEvent => Action::Reply(Reply::error(
                    404,
                    codes::UNKNOWN_EVENT,
                    "no waiting room for this event",
                )),
                Route::MethodNotAllowed => Action::Reply(Reply::error(
                    405,
                    codes::METHOD_NOT_ALLOWED,
                    "method not allowed",
                )),
                Route::BadPath => {
                    Action::Reply(Reply::error(400, codes::INVALID_REQUEST, "malformed path"))
                }
                Route::NotFound => Action::Reply(Reply::error(404, codes::NOT_FOUND, "not found")),
            }
        };
        let s = &self.shared;
        let st = &self.store;
        let reply = match action {
            Action::Forward => return self.to_booking(session, ctx, self.fast).await,
            Action::Webhook => return self.to_booking(session, ctx, false).await,
            Action::Reply(r) => r,
            Action::Ready => self.ready().await,
            Action::DevLogin => queue::dev_login(s, session).await,
            Action::Join(e) => queue::join(s, st, session, &e).await,
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
                "request body over booking's limit",
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
        self.checkout_session(resp, ctx);
        Ok(())
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, _ctx: &mut Ctx) -> FailToProxy {
        use ErrorType::*;
        use forward::Failure;
        let reply = match e.etype() {
            ConnectTimedout | ConnectRefused | ConnectNoRoute | ConnectError | SocketError
            | TLSHandshakeFailure | TLSHandshakeTimedout | HandshakeError => {
                Some(self.upstream_failure(Failure::Unavailable))
            }
            HTTPStatus(413) => Some(size::body_too_large(self.body_limit())),
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
            tokio::spawn(async move {
                if let Err(e) = store.release_active(&c.evt, &c.sub).await {
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
mod tests {
    use super::is_pay;
    use http::Method;

    #[test]
    fn request_ids_are_prefix_dash_hex() {
        use super::RequestId;
        assert_eq!(RequestId::new("gw-1", 0).as_str(), "gw-1-0");
        assert_eq!(RequestId::new("gw-1", 255).as_str(), "gw-1-ff");
        assert_eq!(
            RequestId::new("gw-0192a3b4-c5d6-7e8f-9a0b-1c2d3e4f5a6b", u64::MAX).as_str(),
            "gw-0192a3b4-c5d6-7e8f-9a0b-1c2d3e4f5a6b-ffffffffffffffff"
        );
        let long = "x".repeat(200);
        let id = RequestId::new(&long, 1);
        assert!(id.as_str().ends_with("x-1"));
    }

    #[test]
    fn wrong_event_is_403_for_api_clients_and_the_waiting_room_for_browsers() {
        use super::refusal;
        use shared::token::TokenError;
        let api = refusal(&TokenError::WrongEvent, false, Some("b"));
        assert_eq!(api.status, 403);
        let body: serde_json::Value = serde_json::from_slice(&api.body).expect("json");
        assert_eq!(body["code"], "WRONG_EVENT");
        let page = refusal(&TokenError::WrongEvent, true, Some("b"));
        assert!(
            page.headers
                .iter()
                .any(|(k, v)| k.eq_ignore_ascii_case("location") && v == "/e/b"),
            "{:?}",
            page.headers
        );
        for e in [
            TokenError::Expired,
            TokenError::BadSignature,
            TokenError::Revoked,
        ] {
            assert_eq!(refusal(&e, false, Some("b")).status, 401);
        }
    }

    #[test]
    fn pay_path() {
        assert!(is_pay(&Method::POST, "/api/orders/ord_1/pay"));
        assert!(!is_pay(&Method::GET, "/api/orders/ord_1/pay"));
        assert!(!is_pay(&Method::POST, "/api/orders//pay"));
        assert!(!is_pay(&Method::POST, "/api/orders/a/b/pay"));
        assert!(!is_pay(&Method::POST, "/api/orders/ord_1"));
        assert!(!is_pay(&Method::POST, "/api/orders/ord_1/payx"));
    }
}
