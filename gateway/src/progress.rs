//! Queue progress kept in gateway memory, so a waiting fan's status poll costs no Redis
//! command (docs/gateway.md, "Status polls from memory").
//!
//! A waiting place with score `s` has `rank(s) = queued_below(s) − admitted − revoked_below(s)`:
//! admission pops in score order, so everyone admitted while `s` waits scored lower (and
//! nobody is admitted before the sale start, when draw scores are still arriving). Each term
//! comes from a small per-event read the refresher does once a second:
//!
//! - `queued_below`: for a FIFO place it never changes (later arrivals score higher), so the
//!   join computes it exactly and the signed receipt carries it (`before`); for a pre-sale
//!   draw place it comes from the histogram of draw scores (2^14 buckets, one `u32` each,
//!   kept by the join script with `BITFIELD`), interpolated inside the fan's own bucket;
//! - `admitted`: the `popped` counter the tick keeps, with `cursor`, the highest score
//!   admitted so far;
//! - `revoked_below`: places revoked while waiting (`qgone`, scores) plus a count of those the
//!   cursor has passed.
//!
//! A place at or below the cursor may be admitted (or may have lapsed): only Redis can claim
//! it, so such polls, and anything this view cannot place, go to Redis as before.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

mod split;
pub use split::{FifoHistogram, Part, ProgressRead};

/// Buckets of the draw-score histogram: the top 14 bits of `score + 2^52`.
pub const HIST_BUCKETS: usize = 1 << 14;
/// Draw scores lie in `[-2^52, 0)`.
const DRAW_OFFSET: f64 = 4_503_599_627_370_496.0;
/// `2^52 / HIST_BUCKETS`.
const BUCKET_WIDTH: f64 = 274_877_906_944.0;
/// Revoked-while-waiting places read per refresh (revocations are rare; past this the view
/// undercounts and places that then look admitted ask Redis).
pub const GONE_READ_LIMIT: isize = 10_000;

/// How many pre-sale fans drew each score range.
#[derive(Debug)]
pub struct DrawHistogram {
    /// The `draws` counter when the histogram was read (it is re-read when that moves).
    pub draws: u64,
    /// `cum[i]` = fans in buckets below `i`; `HIST_BUCKETS + 1` entries.
    cum: Vec<u64>,
}

impl DrawHistogram {
    /// From the `BITFIELD` string: big-endian `u32` per bucket; Redis stores only up to the
    /// highest bucket written, so a short string means empty buckets after it.
    pub fn from_bitfield(draws: u64, bytes: &[u8]) -> Self {
        let mut cum = Vec::with_capacity(HIST_BUCKETS + 1);
        let mut total = 0u64;
        cum.push(0);
        for i in 0..HIST_BUCKETS {
            let n = bytes
                .get(i * 4..i * 4 + 4)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map_or(0, u32::from_be_bytes);
            total += u64::from(n);
            cum.push(total);
        }
        Self { draws, cum }
    }

    /// Estimated pre-sale fans with a score below `score` (exact to the bucket, linear
    /// inside it: the scores are uniform, so the error is about √(bucket count) / 2).
    pub fn below(&self, score: f64) -> f64 {
        let x = (score + DRAW_OFFSET).clamp(0.0, DRAW_OFFSET);
        let b = ((x / BUCKET_WIDTH) as usize).min(HIST_BUCKETS - 1);
        let frac = (x - b as f64 * BUCKET_WIDTH) / BUCKET_WIDTH;
        let in_bucket = self.cum[b + 1] - self.cum[b];
        self.cum[b] as f64 + frac.clamp(0.0, 1.0) * in_bucket as f64
    }
}

/// One event's queue progress as of the last refresh.
#[derive(Debug, Default)]
pub struct Progress {
    /// False until the first refresh that read it.
    pub known: bool,
    /// Fans admitted from the queue so far.
    pub popped: u64,
    /// The highest score admitted so far.
    pub cursor: Option<f64>,
    /// Revoked-while-waiting places whose score the cursor has passed.
    pub gone_passed: u64,
    /// Pre-sale (draw) and later (FIFO) places ever queued.
    pub draws: u64,
    pub fifos: u64,
    /// Scores of places revoked while waiting that the cursor has not passed, ascending.
    gone_scores: Vec<f64>,
    gone_accounts: HashSet<String>,
    pub hist: Option<Arc<DrawHistogram>>,
    /// A split queue's sub-queues (empty when the queue is not split); the fields above
    /// are their sums (`cursor`: the highest), `hist` the sum of theirs.
    pub parts: Vec<Part>,
}

/// Where a waiting place stands, from memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Located {
    Waiting {
        rank: u64,
        queue_len: u64,
    },
    /// Admitted, lapsed, revoked, or not placeable from this view: ask Redis.
    AskRedis,
}

impl Progress {
    /// From `HGETALL prog` and `ZRANGE qgone … WITHSCORES`.
    pub fn from_redis(prog: &HashMap<String, String>, gone: Vec<(String, f64)>) -> Self {
        let n = |k: &str| prog.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut gone_scores: Vec<f64> = gone.iter().map(|(_, s)| *s).collect();
        gone_scores.sort_by(f64::total_cmp);
        Self {
            known: true,
            popped: n("popped"),
            cursor: prog.get("cursor").and_then(|c| c.parse().ok()),
            gone_passed: n("gone_passed"),
            draws: n("draws"),
            fifos: n("fifos"),
            gone_scores,
            gone_accounts: gone.into_iter().map(|(a, _)| a).collect(),
            hist: None,
            parts: Vec::new(),
        }
    }

    /// Fans waiting now (as of the refresh).
    pub fn queue_len(&self) -> u64 {
        (self.draws + self.fifos)
            .saturating_sub(self.popped + self.gone_passed + self.gone_scores.len() as u64)
    }

    /// Where the place `(account, score, kind, before)` from a fan's receipt stands; `shard`:
    /// the sub-queue holding it (a split queue's receipt counts `before` in that one only).
    pub fn locate(
        &self,
        account: &str,
        shard: u32,
        score: &str,
        kind: &str,
        before: Option<u64>,
    ) -> Located {
        if !self.known || self.gone_accounts.contains(account) {
            return Located::AskRedis;
        }
        let Ok(s) = score.parse::<f64>() else {
            return Located::AskRedis;
        };
        if self.cursor.is_some_and(|c| s <= c) {
            return Located::AskRedis;
        }
        let mut queued_below = match (kind, before, &self.hist) {
            ("fifo", Some(b), _) => b as f64,
            ("draw", _, Some(h)) => h.below(s),
            _ => return Located::AskRedis,
        };
        if kind == "fifo" && self.parts.len() > 1 {
            match self.queued_elsewhere(shard, s, kind) {
                Some(n) => queued_below += n,
                None => return Located::AskRedis,
            }
        }
        let gone_below =
            self.gone_passed as f64 + self.gone_scores.partition_point(|g| *g < s) as f64;
        let rank = (queued_below - self.popped as f64 - gone_below).round();
        if rank < 0.0 {
            // The view is behind this receipt (a refresh ago); Redis knows.
            return Located::AskRedis;
        }
        let rank = rank as u64;
        Located::Waiting {
            rank,
            queue_len: self.queue_len().max(rank + 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prog(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn bitfield(counts: &[(usize, u32)]) -> Vec<u8> {
        let top = counts.iter().map(|(i, _)| *i).max().unwrap_or(0);
        let mut b = vec![0u8; (top + 1) * 4];
        for (i, n) in counts {
            b[i * 4..i * 4 + 4].copy_from_slice(&n.to_be_bytes());
        }
        b
    }

    #[test]
    fn fifo_rank_is_before_minus_admitted_minus_revoked_below() {
        let mut p = Progress::from_redis(
            &prog(&[
                ("popped", "40"),
                ("cursor", "1000.5"),
                ("fifos", "100"),
                ("gone_passed", "2"),
            ]),
            vec![("x".into(), 1500.0), ("y".into(), 3000.0)],
        );
        // 90 queued ahead of the place at 2000; 40 admitted, 2 revoked long ago, 1 revoked
        // just ahead.
        assert_eq!(
            p.locate("me", 0, "2000.25", "fifo", Some(90)),
            Located::Waiting {
                rank: 47,
                queue_len: 100 - 40 - 2 - 2
            }
        );
        // At or below the cursor: maybe admitted; a revoked account; no `before`; nothing
        // read yet; a view behind the receipt: Redis decides.
        assert_eq!(
            p.locate("me", 0, "1000.5", "fifo", Some(3)),
            Located::AskRedis
        );
        assert_eq!(
            p.locate("x", 0, "1500", "fifo", Some(50)),
            Located::AskRedis
        );
        assert_eq!(p.locate("me", 0, "2000", "fifo", None), Located::AskRedis);
        assert_eq!(
            p.locate("me", 0, "2000", "fifo", Some(10)),
            Located::AskRedis
        );
        assert_eq!(
            p.locate("me", 0, "not-a-number", "fifo", Some(90)),
            Located::AskRedis
        );
        p.known = false;
        assert_eq!(
            p.locate("me", 0, "2000.25", "fifo", Some(90)),
            Located::AskRedis
        );
    }

    #[test]
    fn draw_rank_interpolates_inside_the_fans_bucket() {
        let mut p = Progress::from_redis(&prog(&[("draws", "110")]), vec![]);
        assert_eq!(p.locate("me", 0, "-100", "draw", None), Located::AskRedis);
        // 10 fans in bucket 0, 100 in bucket 3.
        p.hist = Some(Arc::new(DrawHistogram::from_bitfield(
            110,
            &bitfield(&[(0, 10), (3, 100)]),
        )));
        let at =
            |bucket: f64, frac: f64| format!("{}", -DRAW_OFFSET + (bucket + frac) * BUCKET_WIDTH);
        assert_eq!(
            p.locate("me", 0, &at(3.0, 0.25), "draw", None),
            Located::Waiting {
                rank: 35,
                queue_len: 110
            }
        );
        assert_eq!(
            p.locate("me", 0, &at(1.0, 0.5), "draw", None),
            Located::Waiting {
                rank: 10,
                queue_len: 110
            }
        );
        // Past the last bucket written: everyone is ahead.
        assert_eq!(
            p.locate("me", 0, "-1", "draw", None),
            Located::Waiting {
                rank: 110,
                queue_len: 111
            }
        );
        // A short or empty bitfield is all zeros.
        assert_eq!(DrawHistogram::from_bitfield(0, &[]).below(0.0), 0.0);
    }

    /// The seed's launch: two million pre-sale fans. Every sampled fan's estimated rank is
    /// within 25 places or 1 % of the exact one.
    #[test]
    fn two_million_draws_place_every_fan_within_bounds() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        let n = 2_000_000usize;
        let mut scores: Vec<i64> = (0..n).map(|_| rng.random_range(-(1i64 << 52)..0)).collect();
        let mut counts = vec![0u32; HIST_BUCKETS];
        for s in &scores {
            counts[((s + (1i64 << 52)) >> 38) as usize] += 1;
        }
        let bytes: Vec<u8> = counts.iter().flat_map(|c| c.to_be_bytes()).collect();
        let h = DrawHistogram::from_bitfield(n as u64, &bytes);
        scores.sort_unstable();
        let mut worst = 0f64;
        for (exact, s) in scores.iter().enumerate().step_by(997) {
            let err = (h.below(*s as f64) - exact as f64).abs();
            assert!(
                err <= 25f64.max(exact as f64 / 100.0),
                "rank {exact}: off by {err}"
            );
            worst = worst.max(err);
        }
        assert!(
            worst > 0.0,
            "a histogram this coarse cannot be exact everywhere"
        );
    }
}
