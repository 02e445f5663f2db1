//! The sender job: claims due `mail_deliveries` rows, builds each message from the current
//! tickets and sends it over SMTP, then records the outcome for the claim it holds.
//!
//! A claim is one statement (`UPDATE ... WHERE id = ANY(ARRAY(SELECT ... FOR UPDATE SKIP
//! LOCKED))`) that moves due `pending` rows, and `sending` rows whose lease ran out (a sender
//! that died), to `sending` with a new lease and one more attempt. No transaction is open
//! while SMTP is talked to. Every outcome is written `WHERE state = 'sending' AND attempts =
//! <the claim's attempt>`: a sender that outlived its lease cannot overwrite the outcome of
//! the sender that took the row over.

use crate::platform::email::Email;
use crate::platform::jobs::Job;
use crate::tickets::code::TicketClaims;
use crate::tickets::mail::message::{self, Content, Envelope, TicketLine};
use crate::tickets::mail::{MailSettings, MailState, StartTls, message_id};
use anyhow::Context;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use lettre::message::Mailbox;
use lettre::transport::smtp::PoolConfig;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use secrecy::ExposeSecret;
use std::time::Duration;

/// The SMTP side: a pooled transport and the sender mailbox.
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// The `from` address's domain: the right-hand side of Message-IDs.
    domain: String,
    timeout: Duration,
}

impl Mailer {
    /// The mailer `[mail]` asks for, `None` when it sets no `smtp_url` (mailing off). Refuses
    /// unsafe settings outside dev mode ([`MailSettings::check`]).
    pub fn new(settings: &MailSettings, dev: bool) -> anyhow::Result<Option<Self>> {
        let from = settings.check(dev).map_err(|e| anyhow::anyhow!(e))?;
        let Some(url) = settings.smtp_url.as_deref() else {
            return Ok(None);
        };
        let from: Mailbox = from
            .parse()
            .map_err(|e| anyhow::anyhow!("mail.from: not a mailbox ({e})"))?;
        let domain = from.email.domain().to_owned();
        let (wrapped, rest) = match url.strip_prefix("smtps://") {
            Some(rest) => (true, rest),
            None => (false, url.strip_prefix("smtp://").unwrap_or(url)),
        };
        let rest = rest.trim_end_matches('/');
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .map_err(|_| anyhow::anyhow!("mail.smtp_url: invalid port"))?,
            ),
            None => (rest, if wrapped { 465 } else { 25 }),
        };
        anyhow::ensure!(!host.is_empty(), "mail.smtp_url: no host");
        let timeout = Duration::from_millis(settings.timeout_ms.max(1));
        let params =
            || TlsParameters::new(host.to_owned()).context("mail: failed to set up TLS parameters");
        let tls = if wrapped {
            Tls::Wrapper(params()?)
        } else {
            match settings.starttls {
                StartTls::Off => Tls::None,
                StartTls::Opportunistic => Tls::Opportunistic(params()?),
                StartTls::Required => Tls::Required(params()?),
            }
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
            .port(port)
            .tls(tls)
            .timeout(Some(timeout))
            // As many kept connections as messages in flight: fewer makes every pass open
            // and close the rest (measured: 84 connections for 1,500 messages at 16 with the
            // default 10).
            .pool_config(
                PoolConfig::new()
                    .max_size(u32::try_from(settings.concurrency.max(1)).unwrap_or(u32::MAX)),
            );
        if let (Some(user), Some(password)) = (&settings.username, &settings.password) {
            builder = builder.credentials(Credentials::new(
                user.clone(),
                password.expose_secret().to_owned(),
            ));
        }
        Ok(Some(Self {
            transport: builder.build(),
            from,
            domain,
            timeout,
        }))
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }
}

/// Most back-to-back passes of one run of the sender job.
const DRAIN_PASSES: usize = 20;

/// The sender job.
pub struct Sender(pub MailState);

#[async_trait]
impl Job for Sender {
    fn name(&self) -> &'static str {
        "ticket-mail"
    }

    fn period(&self) -> Duration {
        Duration::from_millis(self.0.settings.poll_ms.max(10))
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        // A full batch means more are probably due (a sold-out event's orders): claim again
        // at once rather than after a poll interval, a bounded number of times so the job
        // still yields to its runner.
        for _ in 0..DRAIN_PASSES {
            let claimed = send_once(&self.0).await?.len();
            if i64::try_from(claimed).unwrap_or(i64::MAX) < self.0.settings.batch.max(1) {
                break;
            }
        }
        Ok(())
    }
}

/// One claimed row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    pub id: i64,
    pub kind: String,
    pub key: String,
    pub order_id: String,
    /// This claim's attempt number (the fence of its outcome).
    pub attempts: i32,
}

/// Claims up to `$2` due rows with a `$1`-second lease (see the module docs).
pub const CLAIM: &str = "UPDATE mail_deliveries m
    SET state = 'sending', attempts = m.attempts + 1,
        lease_until = clock_timestamp() + make_interval(secs => $1)
  WHERE m.id = ANY (ARRAY(
        SELECT d.id FROM mail_deliveries d
         WHERE (d.state = 'pending' AND d.next_attempt_at <= clock_timestamp())
            OR (d.state = 'sending' AND d.lease_until <= clock_timestamp())
         ORDER BY d.next_attempt_at, d.id
         LIMIT $2
         FOR UPDATE SKIP LOCKED))
  RETURNING m.id, m.kind, m.key, m.order_id, m.attempts";

pub async fn claim(state: &MailState, limit: i64) -> anyhow::Result<Vec<Claimed>> {
    sqlx::query_as(CLAIM)
        .persistent(false)
        .bind(state.settings.lease_s.max(1) as f64)
        .bind(limit.max(1))
        .fetch_all(&state.pool)
        .await
        .context("failed to claim ticket e-mails")
}

/// What became of one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Sent,
    /// Temporarily refused: pending again with backoff.
    Retry,
    /// Permanently refused, or out of attempts.
    Dead,
    /// Nothing to send (address erased, no valid ticket): dead with the reason.
    Skipped,
    /// Another sender holds the row now (this claim's lease ran out).
    Lost,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Sent => "sent",
            Outcome::Retry => "retry",
            Outcome::Dead => "dead",
            Outcome::Skipped => "skipped",
            Outcome::Lost => "lost",
        }
    }
}

/// One sender pass: claim a batch, send its messages (`concurrency` at once), record each
/// outcome. Returns the outcomes.
pub async fn send_once(state: &MailState) -> anyhow::Result<Vec<Outcome>> {
    let Some(mailer) = state.mailer.clone() else {
        return Ok(Vec::new());
    };
    let claimed = claim(state, state.settings.batch).await?;
    let results: Vec<anyhow::Result<Outcome>> = futures::stream::iter(claimed)
        .map(|c| {
            let mailer = mailer.clone();
            async move { process(state, &mailer, &c).await }
        })
        .buffer_unordered(state.settings.concurrency.max(1))
        .collect()
        .await;
    let mut outcomes = Vec::with_capacity(results.len());
    for r in results {
        let outcome = r?;
        state
            .metrics
            .results
            .with_label_values(&[outcome.label()])
            .inc();
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// Why a send failed, as stored in `last_error`: the SMTP code and a fixed text, never the
/// server's words (which often quote the address).
#[derive(Debug)]
pub struct SendError {
    pub permanent: bool,
    pub text: String,
}

fn classify(e: &lettre::transport::smtp::Error) -> SendError {
    let code = e.status().map(|c| c.to_string());
    let (permanent, what) = if e.is_permanent() {
        (true, "permanent refusal")
    } else if e.is_transient() {
        (false, "temporary refusal")
    } else if e.is_timeout() {
        (false, "timeout")
    } else {
        (false, "connection or protocol error")
    };
    SendError {
        permanent,
        text: match code {
            Some(code) => format!("SMTP {code}: {what}"),
            None => what.to_owned(),
        },
    }
}

/// The message of one claimed row, from the database as it is now (`None`: nothing to send,
/// with the reason).
pub async fn compose(
    state: &MailState,
    mailer: &Mailer,
    c: &Claimed,
) -> anyhow::Result<Result<(Email, lettre::Message), &'static str>> {
    let address: Option<String> = sqlx::query_scalar(
        "SELECT email FROM order_contacts WHERE order_id = $1 AND email IS NOT NULL",
    )
    .bind(&c.order_id)
    .fetch_optional(&state.pool)
    .await
    .context("failed to read the order's address")?;
    let Some(to) = address.and_then(|a| Email::parse(&a).ok()) else {
        return Ok(Err("no address (erased)"));
    };
    let envelope = Envelope {
        from: &mailer.from,
        to: &to,
        message_id: message_id(&c.kind, &c.key, &mailer.domain),
        domain: &mailer.domain,
    };
    if c.kind == "void" {
        return compose_void(state, c, &envelope)
            .await
            .map(|r| r.map(|m| (to.clone(), m)));
    }
    let rows: Vec<TicketRow> = sqlx::query_as(
        "SELECT t.id, t.event_id, t.seat_id, t.ga_tier, t.version, t.issued_at,
                t.holder_account, e.name, e.venue, e.venue_address, e.starts_at, e.doors_at,
                e.timezone, e.ticket_code
           FROM tickets t JOIN events e ON e.id = t.event_id
           JOIN orders o ON o.id = t.order_id
          WHERE t.order_id = $1 AND t.voided_at IS NULL AND t.holder_account = o.account_id
          ORDER BY t.seat_id, t.ga_tier, t.id",
    )
    .bind(&c.order_id)
    .fetch_all(&state.pool)
    .await
    .context("failed to read the order's tickets")?;
    let Some(first) = rows.first() else {
        return Ok(Err("no valid ticket to send"));
    };
    let rotating = first.ticket_code == "rotating";
    let content = Content {
        order_id: c.order_id.clone(),
        event_name: first.name.clone(),
        venue: first.venue.clone(),
        venue_address: first.venue_address.clone(),
        starts_at: first.starts_at,
        doors_at: first.doors_at,
        timezone: first.timezone.clone(),
        rotating,
        ticket_page: state.settings.ticket_page(&first.event_id, &c.order_id),
        resend: c.kind == "resend",
        tickets: rows
            .iter()
            .map(|r| TicketLine {
                id: r.id.clone(),
                seat: r.seat_id.clone(),
                tier: r.ga_tier.clone(),
                // Rotating events: the static part alone does not get in, so no QR of it.
                code: (!rotating).then(|| {
                    state.keys.sign(&TicketClaims {
                        tid: r.id.clone(),
                        evt: r.event_id.clone(),
                        seat: r.seat_id.clone(),
                        tier: r.ga_tier.clone(),
                        hnd: state.keys.handle(&r.holder_account),
                        ver: r.version,
                        iat: r.issued_at.timestamp(),
                        rot: None,
                    })
                }),
            })
            .collect(),
    };
    // Drawing and deflating the QR images is most of a message's CPU: off the runtime's
    // threads, so several messages build at once on several cores and nothing else waits.
    let (from, domain, message_id, to_owned) = (
        mailer.from.clone(),
        mailer.domain.clone(),
        envelope.message_id,
        to.clone(),
    );
    let msg = tokio::task::spawn_blocking(move || {
        message::build(
            &content,
            &Envelope {
                from: &from,
                to: &to_owned,
                message_id,
                domain: &domain,
            },
        )
    })
    .await
    .context("the ticket e-mail builder stopped")??;
    Ok(Ok((to, msg)))
}

#[derive(sqlx::FromRow)]
struct VoidedRow {
    event_id: String,
    seat_id: Option<String>,
    ga_tier: Option<String>,
    void_reason: Option<String>,
    name: String,
}

/// The void notice of a `void` row (key `<ticket id>.v<version>`).
async fn compose_void(
    state: &MailState,
    c: &Claimed,
    envelope: &Envelope<'_>,
) -> anyhow::Result<Result<lettre::Message, &'static str>> {
    let Some((tid, _)) = c.key.rsplit_once(".v") else {
        return Ok(Err("malformed void key"));
    };
    let row: Option<VoidedRow> = sqlx::query_as(
        "SELECT t.event_id, t.seat_id, t.ga_tier, t.void_reason, e.name
           FROM tickets t JOIN events e ON e.id = t.event_id
          WHERE t.id = $1 AND t.order_id = $2",
    )
    .bind(tid)
    .bind(&c.order_id)
    .fetch_optional(&state.pool)
    .await
    .context("failed to read the voided ticket")?;
    let Some(VoidedRow {
        event_id,
        seat_id: seat,
        ga_tier: tier,
        void_reason: reason,
        name: event_name,
    }) = row
    else {
        return Ok(Err("no such ticket"));
    };
    let notice = message::VoidNotice {
        order_id: c.order_id.clone(),
        event_name,
        ticket: TicketLine {
            id: tid.to_owned(),
            seat,
            tier,
            code: None,
        },
        reason: reason.unwrap_or_default(),
        ticket_page: state.settings.ticket_page(&event_id, &c.order_id),
    };
    Ok(Ok(message::build_void(&notice, envelope)?))
}

#[derive(sqlx::FromRow)]
struct TicketRow {
    id: String,
    event_id: String,
    seat_id: Option<String>,
    ga_tier: Option<String>,
    version: i32,
    issued_at: DateTime<Utc>,
    holder_account: String,
    name: String,
    venue: String,
    venue_address: Option<String>,
    starts_at: Option<DateTime<Utc>>,
    doors_at: Option<DateTime<Utc>>,
    timezone: Option<String>,
    ticket_code: String,
}

/// What one SMTP exchange came to.
#[derive(Debug)]
pub enum Attempt {
    /// Accepted: the server's reply (`250 ...`).
    Accepted(String),
    Failed(SendError),
    /// Nothing to send, and why.
    Nothing(&'static str),
}

/// Sends a claimed row's message without recording anything (what a sender that dies right
/// after SMTP accepted leaves behind; [`process`] records).
pub async fn send_claimed(
    state: &MailState,
    mailer: &Mailer,
    c: &Claimed,
) -> anyhow::Result<Attempt> {
    let msg = match compose(state, mailer, c).await? {
        Ok((_, msg)) => msg,
        Err(why) => return Ok(Attempt::Nothing(why)),
    };
    // lettre's own timeout covers each command; this bounds the whole exchange, well within
    // the lease.
    let whole = mailer.timeout * 4;
    Ok(
        match tokio::time::timeout(whole, mailer.transport.send(msg)).await {
            Ok(Ok(resp)) => {
                let first = resp.message().next().unwrap_or("");
                Attempt::Accepted(
                    format!("{} {first}", resp.code())
                        .chars()
                        .filter(|c| !c.is_control())
                        .take(200)
                        .collect(),
                )
            }
            Ok(Err(e)) => Attempt::Failed(classify(&e)),
            Err(_) => Attempt::Failed(SendError {
                permanent: false,
                text: "timeout".into(),
            }),
        },
    )
}

/// Sends one claimed row and records the outcome (fenced by the claim's attempt).
pub async fn process(state: &MailState, mailer: &Mailer, c: &Claimed) -> anyhow::Result<Outcome> {
    let result = match send_claimed(state, mailer, c).await? {
        Attempt::Nothing(why) => return record_dead(state, c, why, Outcome::Skipped).await,
        Attempt::Accepted(reply) => Ok(reply),
        Attempt::Failed(e) => Err(e),
    };
    match result {
        Ok(reply) => {
            let n = sqlx::query(
                "UPDATE mail_deliveries
                    SET state = 'sent', sent_at = clock_timestamp(), lease_until = NULL,
                        smtp_reply = $3, last_error = NULL
                  WHERE id = $1 AND state = 'sending' AND attempts = $2",
            )
            .bind(c.id)
            .bind(c.attempts)
            .bind(&reply)
            .execute(&state.pool)
            .await
            .context("failed to mark a ticket e-mail sent")?
            .rows_affected();
            if n == 1 {
                tracing::info!(delivery = c.id, order_id = %c.order_id, kind = %c.kind, "ticket e-mail sent");
                Ok(Outcome::Sent)
            } else {
                Ok(Outcome::Lost)
            }
        }
        Err(e) if e.permanent => record_dead(state, c, &e.text, Outcome::Dead).await,
        Err(e) => {
            let backoff = state.settings.backoff_s(c.attempts);
            let new_state: Option<String> = sqlx::query_scalar(
                "UPDATE mail_deliveries
                    SET state = CASE WHEN attempts >= $3 THEN 'dead' ELSE 'pending' END,
                        next_attempt_at = clock_timestamp() + make_interval(secs => $4),
                        lease_until = NULL, last_error = $5
                  WHERE id = $1 AND state = 'sending' AND attempts = $2
                  RETURNING state",
            )
            .bind(c.id)
            .bind(c.attempts)
            .bind(state.settings.max_attempts)
            .bind(backoff as f64)
            .bind(&e.text)
            .fetch_optional(&state.pool)
            .await
            .context("failed to reschedule a ticket e-mail")?;
            tracing::warn!(delivery = c.id, attempt = c.attempts, error = %e.text, "ticket e-mail not sent");
            Ok(match new_state.as_deref() {
                Some("dead") => Outcome::Dead,
                Some(_) => Outcome::Retry,
                None => Outcome::Lost,
            })
        }
    }
}

async fn record_dead(
    state: &MailState,
    c: &Claimed,
    why: &str,
    outcome: Outcome,
) -> anyhow::Result<Outcome> {
    let n = sqlx::query(
        "UPDATE mail_deliveries SET state = 'dead', lease_until = NULL, last_error = $3
          WHERE id = $1 AND state = 'sending' AND attempts = $2",
    )
    .bind(c.id)
    .bind(c.attempts)
    .bind(why)
    .execute(&state.pool)
    .await
    .context("failed to mark a ticket e-mail dead")?
    .rows_affected();
    tracing::warn!(delivery = c.id, order_id = %c.order_id, error = why, "ticket e-mail dead");
    Ok(if n == 1 { outcome } else { Outcome::Lost })
}
