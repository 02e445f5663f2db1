//! What ops and the proxy do to one fan's place or admission: revoke it, give its
//! `max_active` slot back, keep the slot while checkout refreshes the token.

use super::scripts::SCRIPTS;
use super::{AUDIT_MAX_LEN, Store, StoreError, shard_of};

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
        actor: &str,
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
                actor,
            )
            .await?;
        if at < 0 || shards <= 1 {
            return Ok((at >= 0).then_some(at));
        }
        for k in 1..shards {
            if fan_shard.is_none_or(|f| f == k) {
                self.revoke_in(event, k, field, account, session, keep_s, actor)
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
        actor: &str,
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
            .arg(actor)
            .arg(AUDIT_MAX_LEN)
            .arg(if k > 0 { "1" } else { "" });
        let at: i64 = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        Ok(at)
    }

    /// Returns an admitted fan's slot to the `max_active` budget (after a paid order).
    pub async fn release_active(
        &self,
        event: &str,
        shards: u32,
        account: &str,
    ) -> Result<(), StoreError> {
        let key = self.shard_key(event, shard_of(account, shards), "active");
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
