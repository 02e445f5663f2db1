//! A split queue's progress (`queue_shards` > 1): each sub-queue as the refresher read it, and
//! what a fan's rank needs from the others (their score histograms).

use super::{DrawHistogram, HIST_BUCKETS, Progress};
use std::collections::HashMap;
use std::sync::Arc;

/// Arrival times of a sub-queue's FIFO places (a split queue's `fhist`): 1 ms buckets from
/// the sub-queue's first FIFO place (`f0`), one `u32` each (2.4 MB for ten minutes of
/// arrivals, read once, then only its end); past 2^22 buckets (70 minutes) the last one takes
/// the rest. At the seed's 3,300 arrivals/s a bucket holds ~3 places, so a fan's rank among
/// another sub-queue's places is off by a place or two.
#[derive(Debug)]
pub struct FifoHistogram {
    /// The sub-queue's `fifos` counter when it was read (re-read when that moves).
    pub fifos: u64,
    origin_ms: f64,
    /// `cum[i]` = places in buckets below `i`.
    cum: Vec<u32>,
}

/// Width of a FIFO histogram bucket (the join script's whole milliseconds).
const FIFO_BUCKET_MS: f64 = 1.0;
/// What a refresh re-reads of a FIFO histogram it already holds: the last second of buckets
/// (arrivals land at the tail; a place restored from a receipt may land a little earlier).
const FIFO_REREAD_BYTES: usize = 4 * 200;

impl FifoHistogram {
    pub fn from_bitfield(fifos: u64, origin_ms: f64, bytes: &[u8]) -> Self {
        Self {
            fifos,
            origin_ms,
            cum: vec![0],
        }
        .extended(fifos, 0, bytes)
    }

    /// Bytes of the `BITFIELD` string this histogram holds.
    pub fn bytes_len(&self) -> usize {
        (self.cum.len() - 1) * 4
    }

    /// This histogram with the string's bytes from `from` (a multiple of 4, at most
    /// [`Self::bytes_len`]) replaced by `tail`: a refresh reads only the end (`GETRANGE`).
    pub fn extended(&self, fifos: u64, from: usize, tail: &[u8]) -> Self {
        let keep = (from / 4).min(self.cum.len() - 1);
        let mut cum = Vec::with_capacity(keep + tail.len() / 4 + 1);
        cum.extend_from_slice(&self.cum[..=keep]);
        let mut total = cum[keep];
        for c in tail.chunks_exact(4) {
            let n = <[u8; 4]>::try_from(c).map_or(0, u32::from_be_bytes);
            total = total.saturating_add(n);
            cum.push(total);
        }
        Self {
            fifos,
            origin_ms: self.origin_ms,
            cum,
        }
    }

    /// Estimated places with an arrival score below `score` (linear inside its bucket).
    pub fn below(&self, score: f64) -> f64 {
        let buckets = self.cum.len() - 1;
        if buckets == 0 {
            return 0.0;
        }
        let x = ((score - self.origin_ms) / FIFO_BUCKET_MS).max(0.0);
        let b = x as usize;
        if b >= buckets {
            return f64::from(self.cum[buckets]);
        }
        let in_bucket = self.cum[b + 1] - self.cum[b];
        f64::from(self.cum[b]) + (x - b as f64).clamp(0.0, 1.0) * f64::from(in_bucket)
    }
}

/// One sub-queue's `HGETALL prog` and `ZRANGE qgone … WITHSCORES`.
pub type ProgressRead = (HashMap<String, String>, Vec<(String, f64)>);

/// One sub-queue of a split queue, as of the last refresh.
#[derive(Debug, Default)]
pub struct Part {
    pub popped: u64,
    pub gone_passed: u64,
    pub draws: u64,
    pub fifos: u64,
    /// The sub-queue's first FIFO score (the FIFO histogram's origin).
    pub fifo_origin_ms: Option<f64>,
    gone_scores: Vec<f64>,
    pub draw_hist: Option<Arc<DrawHistogram>>,
    pub fifo_hist: Option<Arc<FifoHistogram>>,
}

impl Part {
    /// Where a refresh re-reads this sub-queue's FIFO histogram from (0: the whole string).
    pub fn fifo_reread_from(&self) -> usize {
        self.fifo_hist
            .as_ref()
            .map_or(0, |h| h.bytes_len().saturating_sub(FIFO_REREAD_BYTES))
    }

    /// A histogram string read for this sub-queue: the draw one, or the FIFO one from byte
    /// `from` on (the tail of the one held, or all of it).
    pub fn attach(&mut self, fifo: bool, from: usize, bytes: &[u8]) {
        if !fifo {
            self.draw_hist = Some(Arc::new(DrawHistogram::from_bitfield(self.draws, bytes)));
            return;
        }
        let h = match &self.fifo_hist {
            Some(old) if from > 0 => old.extended(self.fifos, from, bytes),
            _ => {
                FifoHistogram::from_bitfield(self.fifos, self.fifo_origin_ms.unwrap_or(0.0), bytes)
            }
        };
        self.fifo_hist = Some(Arc::new(h));
    }

    fn gone_below(&self, s: f64) -> f64 {
        self.gone_passed as f64 + self.gone_scores.partition_point(|g| *g < s) as f64
    }

    /// Places of this sub-queue queued below `s`; `None` when a histogram it needs is missing.
    fn queued_below(&self, s: f64, kind: &str) -> Option<f64> {
        match kind {
            "fifo" => {
                let fifo = match &self.fifo_hist {
                    _ if self.fifos == 0 => 0.0,
                    Some(h) => h.below(s),
                    None => return None,
                };
                Some(self.draws as f64 + fifo)
            }
            _ => match &self.draw_hist {
                _ if self.draws == 0 => Some(0.0),
                Some(h) => Some(h.below(s)),
                None => None,
            },
        }
    }
}

impl Progress {
    /// A split queue's progress from each sub-queue's `HGETALL prog` and `qgone` read.
    pub fn from_parts(reads: Vec<ProgressRead>) -> Self {
        let mut total = Progress {
            known: true,
            ..Progress::default()
        };
        for (prog, gone) in reads {
            let p = Progress::from_redis(&prog, gone);
            total.popped += p.popped;
            total.gone_passed += p.gone_passed;
            total.draws += p.draws;
            total.fifos += p.fifos;
            total.cursor = match (total.cursor, p.cursor) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            total.gone_scores.extend_from_slice(&p.gone_scores);
            total.gone_accounts.extend(p.gone_accounts);
            total.parts.push(Part {
                popped: p.popped,
                gone_passed: p.gone_passed,
                draws: p.draws,
                fifos: p.fifos,
                fifo_origin_ms: prog.get("f0").and_then(|v| v.parse().ok()),
                gone_scores: p.gone_scores,
                draw_hist: None,
                fifo_hist: None,
            });
        }
        total.gone_scores.sort_by(f64::total_cmp);
        total
    }

    /// Keeps `old`'s sub-queue histograms where this read has none (the refresher re-reads
    /// only those whose counts moved), then sums the draw histograms.
    pub fn carry_part_histograms(&mut self, old: &Progress) {
        for (p, o) in self.parts.iter_mut().zip(&old.parts) {
            if p.draw_hist.is_none() {
                p.draw_hist.clone_from(&o.draw_hist);
            }
            if p.fifo_hist.is_none() {
                p.fifo_hist.clone_from(&o.fifo_hist);
            }
        }
        self.combine_draw_histograms();
    }

    /// The sum of the sub-queues' draw histograms (after they were attached).
    pub fn combine_draw_histograms(&mut self) {
        if self.parts.is_empty() || self.draws == 0 {
            return;
        }
        let mut cum = vec![0u64; HIST_BUCKETS + 1];
        for p in &self.parts {
            match &p.draw_hist {
                Some(h) => cum.iter_mut().zip(&h.cum).for_each(|(c, x)| *c += x),
                None if p.draws > 0 => return,
                None => {}
            }
        }
        self.hist = Some(Arc::new(DrawHistogram {
            draws: self.draws,
            cum,
        }));
    }

    /// A split queue: fans waiting in sub-queues other than `shard` with a lower score than
    /// `score` (to turn a sub-queue's own rank into the event's). `None` when this view
    /// cannot say (not split, not read yet, a histogram missing).
    pub fn waiting_elsewhere(&self, shard: u32, score: f64, kind: &str) -> Option<u64> {
        if self.parts.len() < 2 || !self.known {
            return None;
        }
        let mut n = 0.0;
        for p in self.others(shard) {
            n += (p.queued_below(score, kind)? - p.popped as f64 - p.gone_below(score)).max(0.0);
        }
        Some(n.round() as u64)
    }

    /// A split queue: places queued in sub-queues other than `shard` below `score`.
    pub(super) fn queued_elsewhere(&self, shard: u32, score: f64, kind: &str) -> Option<f64> {
        self.others(shard)
            .map(|p| p.queued_below(score, kind))
            .sum()
    }

    fn others(&self, shard: u32) -> impl Iterator<Item = &Part> {
        self.parts
            .iter()
            .enumerate()
            .filter(move |(j, _)| *j as u32 != shard)
            .map(|(_, p)| p)
    }
}
