//! The refresher's reads: every configured event's config, sold-out flag, revocations and
//! queue progress, and the draw-score histograms.

use super::outcomes::snapshot;
use super::{EventSnapshot, Store, StoreError};
use crate::progress::{GONE_READ_LIMIT, Progress, ProgressRead};
use redis::Value;
use shared::redis_conn::query_per_slot;
use std::sync::Arc;

impl Store {
    /// ProgressRead one event's snapshot (`None`: no config), its queue progress included (without
    /// the draw histogram, which the refresher adds).
    pub async fn load_event(&self, event: &str) -> Result<Option<EventSnapshot>, StoreError> {
        let mut all = self.load_events(&[event.to_owned()], true).await?;
        Ok(all.pop().and_then(|(_, s)| s.config.is_some().then_some(s)))
    }

    /// ProgressRead every configured event's snapshot in one pipelined round trip (plus one for
    /// the index). `with_progress`: also each event's queue progress (two more small reads
    /// per event; the refresher asks once a second).
    pub async fn load_all(
        &self,
        with_progress: bool,
    ) -> Result<Vec<(String, EventSnapshot)>, StoreError> {
        let key = self.events_key();
        let mut events: Vec<String> = self
            .with(|mut c| async move { redis::cmd("SMEMBERS").arg(key).query_async(&mut c).await })
            .await?;
        events.sort();
        self.load_events(&events, with_progress).await
    }

    async fn load_events(
        &self,
        events: &[String],
        with_progress: bool,
    ) -> Result<Vec<(String, EventSnapshot)>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipes = Vec::with_capacity(events.len());
        for e in events {
            let mut pipe = redis::pipe();
            pipe.cmd("HGETALL").arg(self.key(e, "cfg"));
            pipe.cmd("EXISTS").arg(self.key(e, "sold_out"));
            pipe.cmd("HGETALL").arg(self.key(e, "revoked"));
            if with_progress {
                self.progress_reads(&mut pipe, e, 0);
            }
            pipes.push(pipe);
        }
        let per_event = if with_progress { 5 } else { 3 };
        let (mut snaps, mut homes): (Vec<EventSnapshot>, Vec<Option<ProgressRead>>) = self
            .with(|mut c| async move {
                let flat = query_per_slot(&mut c, &pipes).await?;
                let mut snaps = Vec::with_capacity(flat.len() / per_event);
                let mut homes = Vec::with_capacity(flat.len() / per_event);
                let mut it = flat.into_iter();
                while let (Some(a), Some(b), Some(d)) = (it.next(), it.next(), it.next()) {
                    snaps.push(snapshot(
                        redis::from_redis_value(a)?,
                        redis::from_redis_value(b)?,
                        redis::from_redis_value(d)?,
                    ));
                    homes.push(if with_progress {
                        let prog = it.next().unwrap_or(Value::Nil);
                        Some(progress_read(prog, it.next().unwrap_or(Value::Nil))?)
                    } else {
                        None
                    });
                }
                Ok((snaps, homes))
            })
            .await?;
        // A split queue's other sub-queues: the same two reads each, one more round trip.
        let mut split = Vec::new();
        let mut pipes = Vec::new();
        for (i, (e, snap)) in events.iter().zip(&snaps).enumerate() {
            let shards = snap.queue_shards();
            if homes[i].is_none() || shards <= 1 {
                continue;
            }
            split.push((i, shards));
            for k in 1..shards {
                let mut pipe = redis::pipe();
                self.progress_reads(&mut pipe, e, k);
                pipes.push(pipe);
            }
        }
        let mut others: Vec<ProgressRead> = Vec::new();
        if !pipes.is_empty() {
            others = self
                .with(|mut c| async move {
                    let flat = query_per_slot(&mut c, &pipes).await?;
                    let mut out = Vec::with_capacity(flat.len() / 2);
                    let mut it = flat.into_iter();
                    while let (Some(a), Some(b)) = (it.next(), it.next()) {
                        out.push(progress_read(a, b)?);
                    }
                    Ok(out)
                })
                .await?;
        }
        let mut others = others.into_iter();
        for (i, shards) in split {
            if let Some(home) = homes[i].take() {
                let mut reads = vec![home];
                reads.extend(others.by_ref().take(shards as usize - 1));
                snaps[i].progress = Arc::new(Progress::from_parts(reads));
            }
        }
        for (snap, home) in snaps.iter_mut().zip(homes) {
            if let Some((prog, gone)) = home {
                snap.progress = Arc::new(Progress::from_redis(&prog, gone));
            }
        }
        Ok(events.iter().cloned().zip(snaps).collect())
    }

    /// Sub-queue `k`'s queue progress: its counters and the places revoked while waiting.
    fn progress_reads(&self, pipe: &mut redis::Pipeline, event: &str, k: u32) {
        pipe.cmd("HGETALL").arg(self.shard_key(event, k, "prog"));
        pipe.cmd("ZRANGE")
            .arg(self.shard_key(event, k, "qgone"))
            .arg(0)
            .arg(GONE_READ_LIMIT - 1)
            .arg("WITHSCORES");
    }

    /// The bytes of each string from its offset on (`GETRANGE key from -1`), one pipelined
    /// round trip per slot.
    pub async fn load_tails(&self, keys: Vec<(String, usize)>) -> Result<Vec<Vec<u8>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let pipes: Vec<redis::Pipeline> = keys
            .into_iter()
            .map(|(k, from)| {
                let mut p = redis::pipe();
                p.cmd("GETRANGE").arg(k).arg(from).arg(-1);
                p
            })
            .collect();
        self.with(|mut c| async move {
            let v = query_per_slot(&mut c, &pipes).await?;
            v.into_iter()
                .map(|x| {
                    redis::from_redis_value::<Option<Vec<u8>>>(x)
                        .map(Option::unwrap_or_default)
                        .map_err(redis::RedisError::from)
                })
                .collect()
        })
        .await
    }

    /// The draw-score histograms of `events` (the `BITFIELD` strings), in one round trip.
    pub async fn load_histograms(&self, events: &[String]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.load_tails(events.iter().map(|e| (self.key(e, "hist"), 0)).collect())
            .await
    }
}

/// The replies to [`Store::progress_reads`].
fn progress_read(prog: Value, gone: Value) -> redis::RedisResult<ProgressRead> {
    Ok((
        redis::from_redis_value(prog)?,
        redis::from_redis_value(gone)?,
    ))
}
