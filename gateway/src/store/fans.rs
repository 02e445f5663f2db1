//! What ops and the proxy do to one fan's place or admission: revoke it, give its
//! `max_active` slot back, keep the slot while checkout refreshes the token.

use super::scripts::SCRIPTS;
use super::{AUDIT_MAX_LEN, Store, StoreError, Who, shard_of};
use shared::redis_conn::{LuaScript as Script, query_per_slot};
use std::sync::LazyLock;

/// KEYS: the freed marks, and the fan's active set when it shares their slot (else the caller
/// frees the slot after). ARGV: account, how long marks are kept (ms). Returns the time (ms).
const FREE_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
-- Marks older than the longest admission apply to no token still valid.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now - tonumber(ARGV[2])))
if KEYS[2] then redis.call('ZREM', KEYS[2], ARGV[1]) end
return now
"#;

/// KEYS: the fan's sub-queue's config, admitted and active sets, and the freed marks when they
/// share its slot. ARGV: account, the slot's end (ms), the other sub-queues' admitted and
/// active fans. Counts only admissions still running (the tick drops lapsed ones the same way
/// before it counts). Returns the time (ms) when the fan holds a slot, -1 when the room is full.
const TAKE_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not (held and tonumber(held) > now) then
  local maxa = tonumber(redis.call('HGET', KEYS[1], 'max_active')) or 0
  if maxa > 0 then
    local live = '(' .. string.format('%d', now)
    local used = redis.call('ZCOUNT', KEYS[2], live, '+inf') + redis.call('ZCOUNT', KEYS[3], live, '+inf')
      + (tonumber(ARGV[3]) or 0)
    if used >= maxa then return -1 end
  end
end
redis.call('ZADD', KEYS[3], 'GT', ARGV[2], ARGV[1])
if KEYS[4] then redis.call('ZREM', KEYS[4], ARGV[1]) end
return now
"#;

static FREE: LazyLock<Script> = LazyLock::new(|| Script::new(FREE_LUA));
static TAKE: LazyLock<Script> = LazyLock::new(|| Script::new(TAKE_LUA));

impl Store {
    /// Revokes an account's (field `a:<account>`) or a session's (`s:<session>`) admission.
    /// Returns the revocation time (unix s), or `None` for an unknown event. In a split queue
    /// the home records it (booking reads the home's list) and the fan's sub-queue (or, for a
    /// session, every sub-queue) frees the place.
    pub async fn revoke(
        &self,
        event: &str,
        field: &str,
        account: Option<&str>,
        session: Option<&str>,
        keep_s: u64,
        who: Who<'_>,
    ) -> Result<Option<i64>, StoreError> {
        // Read here, not from a snapshot: ops may revoke through an instance that has not yet
        // refreshed a room created a moment ago.
        let shards = self.event_shards(event).await?.unwrap_or(1);
        let fan_shard = account.map(|a| shard_of(a, shards));
        let at = self
            .revoke_in(
                event,
                0,
                field,
                account.filter(|_| fan_shard.unwrap_or(0) == 0),
                session,
                keep_s,
                who,
            )
            .await?;
        if at < 0 || shards <= 1 {
            return Ok((at >= 0).then_some(at));
        }
        for k in 1..shards {
            if fan_shard.is_none_or(|f| f == k) {
                self.revoke_in(event, k, field, account, session, keep_s, who)
                    .await?;
            }
        }
        Ok(Some(at))
    }

    #[expect(clippy::too_many_arguments, reason = "one script's arguments, named")]
    async fn revoke_in(
        &self,
        event: &str,
        k: u32,
        field: &str,
        account: Option<&str>,
        session: Option<&str>,
        keep_s: u64,
        who: Who<'_>,
    ) -> Result<i64, StoreError> {
        let mut inv = SCRIPTS.revoke.prepare_invoke();
        self.shard_keys(
            &mut inv,
            event,
            k,
            &[
                "cfg", "revoked", "q", "adm", "active", "places", "qgone", "cfglog",
            ],
        );
        inv.arg(field)
            .arg(account.unwrap_or(""))
            .arg(keep_s.max(60))
            .arg(session.unwrap_or(""))
            .arg(who.actor)
            .arg(AUDIT_MAX_LEN)
            .arg(if k > 0 { "1" } else { "" });
        for part in who.extra() {
            inv.arg(part);
        }
        let at: i64 = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        Ok(at)
    }

    /// Returns an admitted fan's slot to the `max_active` budget (their checkout ended, or they
    /// paid) and marks it freed (`slots.rs`), the mark first: there is no moment where the slot
    /// is free and the fan unmarked. Marks older than `keep_ms` are dropped on the way.
    /// In a split queue the mark lives on the home, the slot on the fan's sub-queue.
    pub async fn release_active(
        &self,
        event: &str,
        shards: u32,
        account: &str,
        keep_ms: i64,
    ) -> Result<(), StoreError> {
        let k = shard_of(account, shards);
        let mut inv = FREE.prepare_invoke();
        inv.key(self.key(event, "freed"));
        if k == 0 {
            inv.key(self.key(event, "active"));
        }
        inv.arg(account).arg(keep_ms);
        self.with(|mut c| async move { inv.invoke_async::<i64>(&mut c).await })
            .await?;
        if k == 0 {
            return Ok(());
        }
        let key = self.shard_key(event, k, "active");
        let account = account.to_owned();
        self.with(|mut c| async move {
            redis::cmd("ZREM")
                .arg(key)
                .arg(account)
                .query_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|_| ())
    }

    /// A freed fan takes a `max_active` slot again, until `until_ms` (their token's expiry):
    /// atomically under the cap of admitted and active fans (the tick's count; in a split
    /// queue the other sub-queues' sets as read just before). Returns the Redis time (ms) of
    /// a slot taken (or already held), `None` when the room is full.
    pub async fn take_slot(
        &self,
        event: &str,
        shards: u32,
        account: &str,
        until_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        let k = shard_of(account, shards);
        let others = if shards > 1 {
            self.other_counts_except(event, shards, k).await?
        } else {
            0
        };
        let mut inv = TAKE.prepare_invoke();
        self.shard_keys(&mut inv, event, k, &["cfg", "adm", "active"]);
        if k == 0 {
            inv.key(self.key(event, "freed"));
        }
        inv.arg(account).arg(until_ms).arg(others);
        let at: i64 = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        if at < 0 {
            return Ok(None);
        }
        if k > 0 {
            // The mark on the home: gone now, or one more (harmless) take on the next write.
            let key = self.key(event, "freed");
            let account = account.to_owned();
            self.with(|mut c| async move {
                redis::cmd("ZREM")
                    .arg(key)
                    .arg(account)
                    .query_async::<i64>(&mut c)
                    .await
            })
            .await?;
        }
        Ok(Some(at))
    }

    /// Admitted and active fans of every sub-queue but `k` (a take in sub-queue `k`).
    async fn other_counts_except(
        &self,
        event: &str,
        shards: u32,
        k: u32,
    ) -> Result<i64, StoreError> {
        let pipes: Vec<redis::Pipeline> = (0..shards)
            .filter(|j| *j != k)
            .map(|j| {
                let mut p = redis::pipe();
                p.cmd("ZCARD").arg(self.shard_key(event, j, "adm"));
                p.cmd("ZCARD").arg(self.shard_key(event, j, "active"));
                p
            })
            .collect();
        let counts: Vec<i64> = self
            .with(|mut c| async move {
                let v = query_per_slot(&mut c, &pipes).await?;
                v.into_iter()
                    .map(|x| redis::from_redis_value::<i64>(x).map_err(Into::into))
                    .collect()
            })
            .await?;
        Ok(counts.iter().sum())
    }

    /// Freed marks of each event from its given time on (account, unix ms), one pipelined
    /// round trip per slot (the refresher's incremental read, `slots.rs`).
    pub async fn load_freed(
        &self,
        from: &[(String, i64)],
    ) -> Result<Vec<Vec<(String, i64)>>, StoreError> {
        if from.is_empty() {
            return Ok(Vec::new());
        }
        let pipes: Vec<redis::Pipeline> = from
            .iter()
            .map(|(event, ms)| {
                let mut p = redis::pipe();
                p.cmd("ZRANGEBYSCORE")
                    .arg(self.key(event, "freed"))
                    .arg(*ms)
                    .arg("+inf")
                    .arg("WITHSCORES");
                p
            })
            .collect();
        self.with(|mut c| async move {
            let v = query_per_slot(&mut c, &pipes).await?;
            v.into_iter()
                .map(|x| redis::from_redis_value::<Vec<(String, i64)>>(x).map_err(Into::into))
                .collect()
        })
        .await
    }

    /// Keeps an admitted fan's `max_active` slot until `until_ms` (a refreshed token's
    /// expiry): only ever later, and only while the fan still holds the slot (`XX`), so a
    /// late extension cannot bring back a slot that was released, revoked or lapsed.
    pub async fn extend_active(
        &self,
        event: &str,
        shards: u32,
        account: &str,
        until_ms: i64,
    ) -> Result<(), StoreError> {
        let key = self.shard_key(event, shard_of(account, shards), "active");
        let account = account.to_owned();
        self.with(|mut c| async move {
            redis::cmd("ZADD")
                .arg(key)
                .arg("XX")
                .arg("GT")
                .arg(until_ms)
                .arg(account)
                .query_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|_| ())
    }
}
