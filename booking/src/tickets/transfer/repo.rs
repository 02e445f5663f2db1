//! The transfer statements. Each public function is one transaction; the lock order is the
//! ticket row, then the offer row, then usage rows in account order (see the parent module).

use crate::platform::audit::{self, Operator};
use crate::platform::email::Email;
use crate::tickets::transfer::{Statement, TransferError};
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool};

/// An offer as made.
#[derive(Debug)]
pub struct Offered {
    pub id: String,
    pub event_id: String,
    pub expires_at: DateTime<Utc>,
}

/// The audit actor of a fan's own action: their account (never an address).
fn fan(account: &str) -> Operator {
    Operator::system(&format!("fan:{account}"))
}

#[derive(sqlx::FromRow)]
struct Held {
    event_id: String,
    order_id: String,
    version: i32,
    voided: bool,
    entered: bool,
    transfers: bool,
    /// Where this holder's copy of the ticket was mailed: the order's address when the holder
    /// bought it, else the address they gave when they accepted it.
    holder_email: Option<String>,
}

/// Offers `ticket_id`, held by `account`, to `to` (`[tickets] transfer_offer_ttl_s` = `ttl_s`).
pub async fn offer(
    pool: &PgPool,
    account: &str,
    ticket_id: &str,
    to: &Email,
    ttl_s: u32,
) -> Result<Offered, TransferError> {
    let mut tx = pool.begin().await.statement("begin an offer")?;
    // The ticket's row lock: a check-in, an accept or a void of it waits for this offer (and
    // this offer for them), so what is read here stays true until the commit.
    let held: Option<Held> = sqlx::query_as(
        "SELECT t.event_id, t.order_id, t.version, t.voided_at IS NOT NULL AS voided,
                t.entries > 0 OR t.inside AS entered, e.transfers,
                CASE WHEN t.holder_account = o.account_id
                     THEN (SELECT c.email FROM order_contacts c WHERE c.order_id = t.order_id)
                     ELSE (SELECT x.receiver_email FROM ticket_transfers x
                            WHERE x.ticket_id = t.id AND x.status = 'accepted'
                              AND x.receiver_account = t.holder_account
                            ORDER BY x.accepted_at DESC LIMIT 1)
                END AS holder_email
           FROM tickets t JOIN events e ON e.id = t.event_id JOIN orders o ON o.id = t.order_id
          WHERE t.id = $1 AND t.holder_account = $2
            FOR UPDATE OF t",
    )
    .bind(ticket_id)
    .bind(account)
    .fetch_optional(&mut *tx)
    .await
    .statement("lock the offered ticket")?;
    let Some(held) = held else {
        return Err(TransferError::NotFound("no such ticket"));
    };
    if held.voided {
        return Err(TransferError::Voided);
    }
    if held.entered {
        return Err(TransferError::CheckedIn);
    }
    if !held.transfers {
        return Err(TransferError::Disabled);
    }
    // The identity token carries no address, so "to oneself" is judged by the address this
    // holder's ticket went to; an offer to another address of one's own is refused at accept.
    if held
        .holder_email
        .as_deref()
        .and_then(|a| Email::parse(a).ok())
        .is_some_and(|own| own.as_str().eq_ignore_ascii_case(to.as_str()))
    {
        return Err(TransferError::ToSelf { at_accept: false });
    }
    // An offer past its expiry no longer blocks a new one: marked expired here, lazily.
    sqlx::query(
        "UPDATE ticket_transfers SET status = 'expired', ended_at = clock_timestamp()
          WHERE ticket_id = $1 AND status = 'offered' AND expires_at <= clock_timestamp()",
    )
    .bind(ticket_id)
    .execute(&mut *tx)
    .await
    .statement("expire the ticket's lapsed offer")?;
    let id = shared::ids::new_id();
    let inserted: Option<DateTime<Utc>> = sqlx::query_scalar(
        "INSERT INTO ticket_transfers
                (id, ticket_id, event_id, order_id, from_account, from_email, to_email,
                 version_at_offer, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
                 clock_timestamp() + make_interval(secs => $9))
         ON CONFLICT (ticket_id) WHERE status = 'offered' DO NOTHING
         RETURNING expires_at",
    )
    .bind(&id)
    .bind(ticket_id)
    .bind(&held.event_id)
    .bind(&held.order_id)
    .bind(account)
    .bind(held.holder_email.as_deref())
    .bind(to.as_str())
    .bind(held.version)
    .bind(f64::from(ttl_s.max(1)))
    .fetch_optional(&mut *tx)
    .await
    .statement("insert the offer")?;
    let Some(expires_at) = inserted else {
        let open: String = sqlx::query_scalar(
            "SELECT id FROM ticket_transfers WHERE ticket_id = $1 AND status = 'offered'",
        )
        .bind(ticket_id)
        .fetch_one(&mut *tx)
        .await
        .statement("read the open offer")?;
        return Err(TransferError::Pending { transfer_id: open });
    };
    queue_mail(&mut tx, "transfer_offer", &id, &held.order_id).await?;
    audit::insert_tx(
        &mut tx,
        &fan(account),
        "ticket.transfer_offer",
        &format!("ticket:{ticket_id}"),
        Some(&held.event_id),
        &json!({ "transfer_id": id, "version": held.version, "expires_at": expires_at }),
    )
    .await
    .statement("audit the offer")?;
    tx.commit().await.statement("commit the offer")?;
    Ok(Offered {
        id,
        event_id: held.event_id,
        expires_at,
    })
}

async fn queue_mail(
    conn: &mut PgConnection,
    kind: &str,
    key: &str,
    order_id: &str,
) -> Result<(), TransferError> {
    sqlx::query(
        "INSERT INTO mail_deliveries (kind, key, order_id) VALUES ($1, $2, $3)
         ON CONFLICT (kind, key) DO NOTHING",
    )
    .bind(kind)
    .bind(key)
    .bind(order_id)
    .execute(&mut *conn)
    .await
    .statement("queue a transfer e-mail")?;
    Ok(())
}

/// Cancels `account`'s own open offer.
pub async fn cancel(pool: &PgPool, account: &str, transfer_id: &str) -> Result<(), TransferError> {
    let mut tx = pool.begin().await.statement("begin a cancel")?;
    let cancelled: Option<(String, String)> = sqlx::query_as(
        "UPDATE ticket_transfers SET status = 'cancelled', ended_at = clock_timestamp()
          WHERE id = $1 AND from_account = $2 AND status = 'offered'
            AND expires_at > clock_timestamp()
         RETURNING ticket_id, event_id",
    )
    .bind(transfer_id)
    .bind(account)
    .fetch_optional(&mut *tx)
    .await
    .statement("cancel the offer")?;
    let Some((ticket_id, event_id)) = cancelled else {
        return Err(why_not_open(&mut tx, transfer_id, Some(account)).await?);
    };
    audit::insert_tx(
        &mut tx,
        &fan(account),
        "ticket.transfer_cancel",
        &format!("ticket:{ticket_id}"),
        Some(&event_id),
        &json!({ "transfer_id": transfer_id }),
    )
    .await
    .statement("audit the cancel")?;
    tx.commit().await.statement("commit the cancel")?;
    Ok(())
}

/// Why an offer could not be moved on: not found (or, with `owner`, not theirs), not open,
/// or expired.
async fn why_not_open(
    conn: &mut PgConnection,
    transfer_id: &str,
    owner: Option<&str>,
) -> Result<TransferError, TransferError> {
    let row: Option<(String, String, bool)> = sqlx::query_as(
        "SELECT status, from_account, expires_at <= clock_timestamp()
           FROM ticket_transfers WHERE id = $1",
    )
    .bind(transfer_id)
    .fetch_optional(&mut *conn)
    .await
    .statement("read the offer")?;
    Ok(match row {
        None => TransferError::NotFound("no such transfer"),
        Some((_, from, _)) if owner.is_some_and(|o| o != from) => {
            TransferError::NotFound("no such transfer")
        }
        Some((status, _, _)) if status != "offered" => TransferError::NotOpen { status },
        Some((_, _, true)) => TransferError::Expired,
        Some(_) => TransferError::NotOpen {
            status: "offered".into(),
        },
    })
}

#[derive(sqlx::FromRow)]
struct Claimed {
    ticket_id: String,
    event_id: String,
    order_id: String,
    from_account: String,
    version_at_offer: i32,
    has_from_email: bool,
}

/// Accepts `transfer_id` for `account`, who gives `email` for their ticket. Returns the
/// ticket id.
pub async fn accept(
    pool: &PgPool,
    account: &str,
    transfer_id: &str,
    email: &Email,
) -> Result<String, TransferError> {
    let mut tx = pool.begin().await.statement("begin an accept")?;
    let ticket: Option<(String, String)> =
        sqlx::query_as("SELECT ticket_id, from_account FROM ticket_transfers WHERE id = $1")
            .bind(transfer_id)
            .fetch_optional(&mut *tx)
            .await
            .statement("find the offer")?;
    let Some((ticket_id, from_account)) = ticket else {
        return Err(TransferError::NotFound("no such transfer"));
    };
    if from_account == account {
        return Err(TransferError::ToSelf { at_accept: true });
    }
    // Ticket first (the lock order of offers, check-ins and voids), then the offer.
    sqlx::query("SELECT 1 FROM tickets WHERE id = $1 FOR UPDATE")
        .bind(&ticket_id)
        .execute(&mut *tx)
        .await
        .statement("lock the ticket")?;
    // The deciding statement: of any number of concurrent accepts, one finds it `offered`.
    let claimed: Option<Claimed> = sqlx::query_as(
        "UPDATE ticket_transfers
            SET status = 'accepted', accepted_at = clock_timestamp(),
                ended_at = clock_timestamp(), receiver_account = $2, receiver_email = $3
          WHERE id = $1 AND status = 'offered' AND expires_at > clock_timestamp()
            AND from_account <> $2
         RETURNING ticket_id, event_id, order_id, from_account, version_at_offer,
                   from_email IS NOT NULL AS has_from_email",
    )
    .bind(transfer_id)
    .bind(account)
    .bind(email.as_str())
    .fetch_optional(&mut *tx)
    .await
    .statement("accept the offer")?;
    let Some(c) = claimed else {
        return Err(why_not_open(&mut tx, transfer_id, None).await?);
    };
    // The ticket moves only as it was offered: still the sender's, same version, valid,
    // never entered, transfers still allowed.
    let moved: Option<i32> = sqlx::query_scalar(
        "UPDATE tickets t SET holder_account = $2, version = t.version + 1
           FROM events e
          WHERE t.id = $1 AND e.id = t.event_id AND t.holder_account = $3 AND t.version = $4
            AND t.voided_at IS NULL AND t.entries = 0 AND NOT t.inside AND e.transfers
         RETURNING t.version",
    )
    .bind(&c.ticket_id)
    .bind(account)
    .bind(&c.from_account)
    .bind(c.version_at_offer)
    .fetch_optional(&mut *tx)
    .await
    .statement("move the ticket to the receiver")?;
    let Some(version) = moved else {
        return Err(TransferError::Stale);
    };
    move_usage(&mut tx, &c.event_id, &c.from_account, account).await?;
    queue_mail(&mut tx, "transfer_ticket", transfer_id, &c.order_id).await?;
    if c.has_from_email {
        queue_mail(&mut tx, "transferred", transfer_id, &c.order_id).await?;
    }
    audit::insert_tx(
        &mut tx,
        &fan(account),
        "ticket.transfer_accept",
        &format!("ticket:{}", c.ticket_id),
        Some(&c.event_id),
        &json!({ "transfer_id": transfer_id, "from": c.from_account, "version": version }),
    )
    .await
    .statement("audit the accept")?;
    tx.commit().await.statement("commit the accept")?;
    Ok(c.ticket_id)
}

/// One ticket of usage from `from` to `to`, under `to`'s per-event limit. Rows are locked in
/// account order so two accepts in opposite directions cannot deadlock.
async fn move_usage(
    conn: &mut PgConnection,
    event: &str,
    from: &str,
    to: &str,
) -> Result<(), TransferError> {
    if to < from {
        take_usage(conn, event, to).await?;
        give_back_usage(conn, event, from).await
    } else {
        give_back_usage(conn, event, from).await?;
        take_usage(conn, event, to).await
    }
}

async fn take_usage(
    conn: &mut PgConnection,
    event: &str,
    account: &str,
) -> Result<(), TransferError> {
    // The same conditional upsert a hold makes: the limit cannot be raced.
    let taken: Option<i32> = sqlx::query_scalar(
        "INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
         SELECT e.id, $2, 1 FROM events e WHERE e.id = $1 AND e.max_tickets_per_account >= 1
         ON CONFLICT (event_id, account_id) DO UPDATE
             SET tickets = u.tickets + 1
             WHERE u.tickets + 1 <= (SELECT max_tickets_per_account FROM events WHERE id = $1)
         RETURNING u.tickets",
    )
    .bind(event)
    .bind(account)
    .fetch_optional(&mut *conn)
    .await
    .statement("count the ticket against the receiver's limit")?;
    if taken.is_some() {
        return Ok(());
    }
    let (limit, held): (i32, i32) = sqlx::query_as(
        "SELECT e.max_tickets_per_account, COALESCE(u.tickets, 0)
           FROM events e LEFT JOIN account_event_usage u
             ON u.event_id = e.id AND u.account_id = $2
          WHERE e.id = $1",
    )
    .bind(event)
    .bind(account)
    .fetch_one(&mut *conn)
    .await
    .statement("read the receiver's limit")?;
    Err(TransferError::LimitExceeded { limit, held })
}

async fn give_back_usage(
    conn: &mut PgConnection,
    event: &str,
    account: &str,
) -> Result<(), TransferError> {
    let n = sqlx::query(
        "UPDATE account_event_usage SET tickets = tickets - 1
          WHERE event_id = $1 AND account_id = $2 AND tickets >= 1",
    )
    .bind(event)
    .bind(account)
    .execute(&mut *conn)
    .await
    .statement("release the sender's usage")?
    .rows_affected();
    if n == 0 {
        // A holder always has the ticket counted; nothing to release means the count was
        // already off (a bug elsewhere), not a reason to refuse the fan.
        tracing::warn!(event_id = %event, "transfer: the sender had no usage to release");
    }
    Ok(())
}
