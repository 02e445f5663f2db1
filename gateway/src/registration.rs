//! Registered rooms: only accounts on the event's list may join (`access: "registered"`).
//!
//! Fans add themselves with `POST /queue/{event}/register` until `registration_closes` (Redis
//! time); ops upload lists with `PUT /admin/events/{event}/registrations` (newline-separated
//! account ids, `?mode=add|remove|replace`, default `add`). Guarantees: an upload with any
//! malformed id is refused as a whole (`422`, the bad lines listed) and changes nothing; a
//! valid one is idempotent (the same list again changes nothing) and concurrent uploads end as
//! their union; the join script itself checks the list (`store/scripts.rs`), so a join racing
//! an upload is refused or queued, never half.

use crate::limits::Scope;
use crate::queue::{admit_caller, rfc3339_ms, unavailable};
use crate::respond::Reply;
use crate::state::Shared;
use crate::store::{ListChange, RegisterOutcome, Store};
use bytes::{Bytes, BytesMut};
use pingora_proxy::Session;
use serde_json::json;
use shared::error::{ErrorBody, codes};
use shared::identity::is_valid_account;
use std::time::Duration;

/// Bad lines named in a refusal (the count covers all of them).
const MAX_REPORTED_LINES: usize = 20;
/// How long a refused oversized body is still read (and dropped) so the `413` reaches the
/// client instead of a reset.
const DRAIN_REFUSED_BODY: Duration = Duration::from_secs(2);

/// `POST /queue/{event}/register`: the caller's account joins the room's list.
pub async fn register(shared: &Shared, store: &Store, session: &mut Session, event: &str) -> Reply {
    let account = match admit_caller(shared, store, session, Scope::Join).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    // The body means nothing here; reading it keeps the connection usable for the answer.
    if let Err(e) = crate::respond::read_body(session, shared.config.gateway.max_body_bytes).await {
        return e.reply();
    }
    let closes = |ms: Option<i64>| ms.map(rfc3339_ms);
    // The sub-queue count decides where the registration lives, so it is read from Redis
    // when this instance has not seen the room yet (never guessed as 1).
    let shards = match crate::queue::snapshot(shared, store, event).await {
        Ok(s) => s.queue_shards(),
        Err(r) => return r,
    };
    match store.register(event, shards, &account).await {
        Err(e) => unavailable(shared, &e),
        Ok(RegisterOutcome::UnknownEvent) => {
            Reply::error(404, codes::UNKNOWN_EVENT, "no waiting room for this event")
        }
        Ok(RegisterOutcome::NotRequired) => Reply::error(
            409,
            codes::REGISTRATION_NOT_REQUIRED,
            "this sale is open to everyone: join the queue, no registration needed",
        ),
        Ok(RegisterOutcome::Closed { closes_ms }) => Reply::from_error(
            409,
            ErrorBody::new(
                codes::REGISTRATION_CLOSED,
                "registration for this sale has closed",
            )
            .with("registration_closes", closes(closes_ms)),
        ),
        Ok(RegisterOutcome::Registered { closes_ms }) => Reply::json(
            200,
            &json!({
                "event": event,
                "registered": true,
                "registration_closes": closes(closes_ms),
                "join_url": format!("/queue/{event}/join"),
            }),
        ),
    }
}

/// The refusal of a join from an account not on a registered room's list.
pub fn not_registered(event: &str, closes_ms: Option<i64>, now_ms: i64) -> Reply {
    let open = closes_ms.is_some_and(|c| now_ms < c);
    let mut body = ErrorBody::new(
        codes::NOT_REGISTERED,
        "this sale is for registered fans and this account is not registered",
    )
    .with("registration_closes", closes_ms.map(rfc3339_ms))
    .with("registration_open", open);
    if open {
        body = body.with("register_url", format!("/queue/{event}/register"));
    }
    Reply::from_error(403, body)
}

/// One query parameter, percent-decoded (account ids may carry `@`).
fn query_param(session: &Session, name: &str) -> Option<String> {
    let q = session.req_header().uri.query()?;
    q.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The account ids of an upload body: one per line (`\n` or `\r\n`), blank lines skipped.
fn lines(body: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    body.split(|b| *b == b'\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l.strip_suffix(b"\r").unwrap_or(l)))
        .filter(|(_, l)| !l.is_empty())
}

/// A named function, not a closure: generic over the lifetime, as the async caller needs.
fn account_of((_, line): (usize, &[u8])) -> &[u8] {
    line
}

/// Every malformed line (number and why), the first [`MAX_REPORTED_LINES`] of them named.
fn invalid_lines(body: &[u8]) -> (u64, Vec<serde_json::Value>) {
    let mut count = 0u64;
    let mut named = Vec::new();
    for (n, l) in lines(body) {
        let ok = std::str::from_utf8(l).is_ok_and(is_valid_account);
        if !ok {
            count += 1;
            if named.len() < MAX_REPORTED_LINES {
                named.push(json!({
                    "line": n,
                    "problem": "not an account id (1-128 of A-Z a-z 0-9 - _ . @)",
                }));
            }
        }
    }
    (count, named)
}

fn is_text(session: &Session) -> bool {
    session
        .req_header()
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/plain"))
}

fn too_large(session: &mut Session, limit: usize) -> Reply {
    session.set_close_on_response_before_downstream_finish(false);
    session.set_total_drain_timeout(Some(DRAIN_REFUSED_BODY));
    Reply::from_error(
        413,
        ErrorBody::new(
            codes::PAYLOAD_TOO_LARGE,
            "account list too large; split it into several uploads (mode=add)",
        )
        .with("limit_bytes", limit),
    )
}

/// Reads the whole upload, refusing it as soon as it passes `limit` (declared or streamed).
async fn read_upload(session: &mut Session, limit: usize) -> Result<Bytes, Reply> {
    let declared = session
        .req_header()
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large(session, limit));
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0));
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if buf.len() + chunk.len() > limit {
                    return Err(too_large(session, limit));
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(buf.freeze()),
            Err(_) => {
                return Err(Reply::error(
                    400,
                    codes::INVALID_REQUEST,
                    "request body could not be read",
                ));
            }
        }
    }
}

fn unknown_event() -> Reply {
    Reply::error(404, codes::UNKNOWN_EVENT, "no config for this event")
}

/// `PUT /admin/events/{event}/registrations?mode=add|remove|replace`.
pub async fn upload(
    shared: &Shared,
    store: &Store,
    session: &mut Session,
    event: &str,
    caller: &crate::admin::auth::Caller,
) -> Reply {
    let change = match query_param(session, "mode").as_deref() {
        None => ListChange::Add,
        Some(m) => match ListChange::parse(m) {
            Some(c) => c,
            None => {
                return Reply::error(
                    422,
                    codes::VALIDATION_FAILED,
                    "mode must be add, remove or replace",
                );
            }
        },
    };
    if !is_text(session) {
        return Reply::error(
            415,
            codes::UNSUPPORTED_MEDIA_TYPE,
            "send Content-Type: text/plain, one account id per line",
        );
    }
    let limit = shared.config.gateway.registrations_max_body_bytes;
    let body = match read_upload(session, limit).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (bad, named) = invalid_lines(&body);
    if bad > 0 {
        return Reply::from_error(
            422,
            ErrorBody::new(
                codes::INVALID_ACCOUNTS,
                "some lines are not account ids; nothing was changed",
            )
            .with("invalid", bad)
            .with("lines", named),
        );
    }
    let note = match crate::admin::caller_note(session, caller, false) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let who = crate::admin::who(caller, note.as_deref());
    let shards = match store.event_shards(event).await {
        Err(e) => return unavailable(shared, &e),
        Ok(None) => return unknown_event(),
        Ok(Some(n)) => n,
    };
    let accounts = lines(&body).count();
    let started = std::time::Instant::now();
    match store
        .change_registrations(event, shards, change, lines(&body).map(account_of))
        .await
    {
        Err(e) => unavailable(shared, &e),
        Ok((changed, size)) => {
            tracing::info!(
                event,
                mode = change.as_str(),
                accounts,
                changed,
                registered = size,
                upload.write_ms = started.elapsed().as_millis() as u64,
                "registration list uploaded"
            );
            let mut answer = json!({
                "event": event,
                "mode": change.as_str(),
                "accounts": accounts,
                "count": size,
            });
            // An upload is many pipelined commands, not one script, so its audit entry is
            // written after the list changed; if that write fails the upload still stands
            // and the failure is logged (docs/gateway.md, "Registered rooms").
            if let Err(e) = store
                .audit_registrations(event, who, change.as_str(), &answer.to_string())
                .await
            {
                tracing::error!(event, error = %e, "registration upload not recorded in the audit log");
            }
            if change != ListChange::Replace {
                answer["changed"] = json!(changed);
            }
            Reply::json(200, &answer)
        }
    }
}

/// `GET /admin/events/{event}/registrations[?account=]`.
pub async fn count(shared: &Shared, store: &Store, session: &Session, event: &str) -> Reply {
    let account = query_param(session, "account");
    if let Some(a) = &account
        && !is_valid_account(a)
    {
        return Reply::error(
            422,
            codes::VALIDATION_FAILED,
            "account is not an account id",
        );
    }
    let shards = match store.event_shards(event).await {
        Err(e) => return unavailable(shared, &e),
        Ok(None) => return unknown_event(),
        Ok(Some(n)) => n,
    };
    let n = match store.registration_count(event, shards).await {
        Ok(n) => n,
        Err(e) => return unavailable(shared, &e),
    };
    let mut answer = json!({"event": event, "count": n});
    if let Some(a) = account {
        match store.is_registered(event, shards, &a).await {
            Ok(r) => {
                answer["account"] = json!(a);
                answer["registered"] = json!(r);
            }
            Err(e) => return unavailable(shared, &e),
        }
    }
    Reply::json(200, &answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_skip_blanks_and_carriage_returns_and_keep_numbers() {
        let got: Vec<_> = lines(b"a\r\n\nb\nc\r\n")
            .map(|(n, l)| (n, String::from_utf8_lossy(l).into_owned()))
            .collect();
        assert_eq!(got, vec![(1, "a".into()), (3, "b".into()), (4, "c".into())]);
    }

    #[test]
    fn bad_lines_are_counted_and_named() {
        let (n, named) = invalid_lines(b"ok-1\nbad id\nok@x.y\n\xff\n");
        assert_eq!(n, 2);
        assert_eq!(named[0]["line"], 2);
        assert_eq!(named[1]["line"], 4);
        let many: Vec<u8> = (0..100).flat_map(|_| b"x y\n".to_vec()).collect();
        let (n, named) = invalid_lines(&many);
        assert_eq!((n, named.len()), (100, MAX_REPORTED_LINES));
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(percent_decode("fan%40example.com"), "fan@example.com");
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
