//! The sender job: claims due `mail_deliveries` rows, builds each message from the current
//! tickets and sends it over SMTP, then records the outcome for the claim it holds.
//!
//! A claim is one statement (`UPDATE ... WHERE id = ANY(ARRAY(SELECT ... FOR UPDATE SKIP
//! LOCKED))`) that moves due `pending` rows, and `sending` rows whose lease ran out (a sender
//! that died), to `sending` with a new lease and one more attempt. No transaction is open
//! while SMTP is talked to. Every outcome is written `WHERE state = 'sending' AND attempts =
//! <the claim's attempt>`: a sender that outlived its lease cannot overwrite the outcome of
//! the sender that took the row over.

use crate::platform::jobs::Job;
use crate::tickets::mail::compose::compose;
use crate::tickets::mail::{MailSettings, MailState, StartTls};
use anyhow::Context;
use async_trait::async_trait;
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
    pub(super) from: Mailbox,
    /// The `from` address's domain: the right-hand side of Message-IDs.
    pub(super) domain: String,
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
