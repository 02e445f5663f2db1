//! The steps `PublicProxy`'s `ProxyHttp` callbacks call: forwarding an admitted API call,
//! refusing a body, the checkout session on booking's answer, the pages and readiness, and
//! the admission of an API call.

use super::*;
use crate::metrics::Retake;

impl PublicProxy {
    /// `<instance>-<counter>`: unique across instances (the instance id is a UUIDv7) without
    /// a random-number syscall or a heap allocation per request.
    pub(super) fn request_id(&self) -> RequestId {
        let n = self
            .request_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RequestId::new(&self.shared.instance, n)
    }

    /// An admitted API call through `forward.rs` (pingora parsed it and will write the answer;
    /// the hop to booking is ours). Failures answer exactly as `fail_to_proxy` does.
    pub(super) async fn forward(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let body = match read_body(session, self.body_limit()).await {
            Ok(b) => b,
            // Declared lengths are checked before; this is only a second line.
            Err(crate::respond::BodyError::TooLarge) => {
                return self.refuse_body(session, self.body_limit()).await;
            }
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
        self.checkout_session(&mut head, ctx).await;
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
    pub(super) fn body_limit(&self) -> usize {
        self.shared.config.booking.body_limit_bytes
    }

    /// The payment webhook's body limit: `gateway.webhook_max_body_bytes`, never more than
    /// booking accepts (booking would cut a larger body off mid-upload).
    pub(super) fn webhook_body_limit(&self) -> usize {
        self.shared
            .config
            .gateway
            .webhook_max_body_bytes
            .min(self.body_limit())
    }

    /// Answers `413 BODY_TOO_LARGE` and drains what the fan still sends, for a moment.
    pub(super) async fn refuse_body(&self, session: &mut Session, limit: usize) -> Result<bool> {
        drain_after_answer(session);
        send(session, size::body_too_large(limit)).await
    }

    /// `POST /webhooks/payments`, the provider-signed class: the provider's own rate budget
    /// (per IP, sized for a burst of retries; never the fans' per-IP budget) and body limit,
    /// then on to booking through pingora-proxy, whose path leaves the raw body the signature
    /// covers untouched. Over the budget: `429` with `Retry-After`, and the provider retries.
    pub(super) async fn webhook(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let s = &self.shared;
        let v = s
            .limits
            .check_ip(Scope::Webhook, queue::client_ip(s, session));
        if let Err(wait) = s.limits.settle(&self.store, v).await {
            // Answered before the body is read: drain it so the answer is not lost to a reset.
            drain_after_answer(session);
            return send(session, rate_limited(s, Scope::Webhook, wait)).await;
        }
        self.to_booking(session, ctx, false, self.webhook_body_limit())
            .await
    }

    /// A request on its way to booking (either proxy path): a declared body over `limit` is
    /// refused here, without contacting booking; any other body is counted as it streams
    /// (`request_body_filter`). `fast`: the request may take `forward.rs` (which reads at most
    /// booking's own limit).
    pub(super) async fn to_booking(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        fast: bool,
        limit: usize,
    ) -> Result<bool> {
        if size::declared_too_large(session.req_header(), limit) {
            return self.refuse_body(session, limit).await;
        }
        if fast && forward::eligible(session.req_header(), limit) {
            return self.forward(session, ctx).await;
        }
        ctx.body = Some(BodyBudget::new(limit));
        Ok(false)
    }

    /// Applies booking's `x-floodgate-session-until` to the caller's admission (see
    /// `session.rs`) and takes the header off the answer, on either proxy path. A slot's
    /// release is marked (`slots.rs`) before the answer goes out, so the fan's next checkout
    /// write finds it; the Redis work of an extension is spawned off the request path (a
    /// failure only shortens the slot, never the token).
    pub(super) async fn checkout_session(&self, head: &mut ResponseHeader, ctx: &mut Ctx) {
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
        let shards = s.live.queue_shards(&c.evt);
        match session::decide(&c, until, now, as_i64(slack_s), as_i64(max_session_s)) {
            Decision::Keep => {}
            Decision::Release => {
                // Once per finished checkout: awaited, so the release has landed (mark and
                // slot) before the fan can send another write.
                s.live
                    .freed
                    .freed(&c.evt, &c.sub, chrono::Utc::now().timestamp_millis());
                let keep_ms = freed_keep_ms(&s.live, &c.evt);
                if let Err(e) = store.release_active(&c.evt, shards, &c.sub, keep_ms).await {
                    s.metrics.redis_errors.inc();
                    tracing::debug!(error = %e, "releasing a finished fan's admission slot failed");
                }
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
                    if let Err(e) = store.extend_active(&c.evt, shards, &c.sub, until_ms).await {
                        tracing::debug!(error = %e, "extending an admission slot failed");
                    }
                });
            }
        }
    }

    /// The fan's answer when booking could not be used, on either proxy path.
    pub(super) fn upstream_failure(&self, f: forward::Failure) -> Reply {
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

    pub(super) fn page(&self, key: &str) -> Reply {
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
    pub(super) async fn ready(&self) -> Reply {
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
    pub(super) async fn admit_api(
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
            .map_err(|w| rate_limited(s, Scope::Api, w))?;
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
            .map_err(|w| rate_limited(s, Scope::Api, w))?;
        let req = session.req_header();
        let write = crate::slots::checkout(&req.method, req.uri.path());
        ctx.pays = write == Some(crate::slots::Checkout::Pay);
        if write.is_some_and(crate::slots::Checkout::takes_slot)
            && s.live.freed.must_retake(&claims)
        {
            self.retake_slot(&claims).await?;
        }
        ctx.claims = Some(claims);
        Ok(())
    }

    /// A fan whose `max_active` slot was freed takes one again before this write is forwarded
    /// (`slots.rs`): `409 ROOM_FULL` when every slot is taken. Redis failing: forwarded, as
    /// admitted fans' requests are, and counted.
    async fn retake_slot(&self, c: &AdmissionClaims) -> std::result::Result<(), Reply> {
        let s = &self.shared;
        let shards = s.live.queue_shards(&c.evt);
        let until_ms = c.exp.saturating_mul(1000);
        match self.store.take_slot(&c.evt, shards, &c.sub, until_ms).await {
            Ok(Some(at)) => {
                s.live.freed.taken(&c.evt, &c.sub, at);
                s.metrics.slot_retake(Retake::Taken);
                Ok(())
            }
            Ok(None) => {
                s.metrics.slot_retake(Retake::Full);
                Err(room_full(&c.evt))
            }
            Err(e) => {
                s.metrics.redis_errors.inc();
                s.metrics.slot_retake(Retake::FailedOpen);
                tracing::warn!(error = %e, "taking an admission slot again failed; letting the write through");
                Ok(())
            }
        }
    }
}
