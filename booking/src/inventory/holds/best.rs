//! Best available: which free seats to take for a quantity, as a pure function of the rows
//! (unit-tested exhaustively against a brute-force reference in `best/tests.rs`). The
//! request and the reads are in `pick.rs`, the batches and the retry loop in `batch.rs`.
//!
//! A row is split into *segments*: seats of consecutive numbers (a gap in the numbering is an
//! aisle, treated like a row end). The rule every pick obeys: **no stranded seat**. A seat is
//! stranded by a hold when, after it, the seat is free, neither neighbour is free (each is
//! taken or a segment end), and it was not so before (one of its neighbours is a seat the
//! hold takes). The hold statement checks the same rule under its locks ([`super::take`]).
//!
//! Order: a pick's cost is the sum of its seats' ranks (lower is better). With `adjacent`,
//! the best block of `q` consecutive seats in one segment (ties: the earlier segment, then the
//! lower seat); without, the best `q` seats anywhere in the candidate rows.

#[cfg(test)]
mod tests;

/// One seat of a segment, in seat-number order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Available (or held past its end): what the hold statement would take.
    pub free: bool,
    /// Matches the request's section and tiers (only eligible seats are picked; all free
    /// seats count for the stranding rule).
    pub eligible: bool,
    pub rank: i64,
}

impl Slot {
    fn takeable(&self) -> bool {
        self.free && self.eligible
    }
}

/// A pick: (segment index, position in the segment) of each seat, in segment then position
/// order, and its cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    pub seats: Vec<(usize, usize)>,
    pub cost: i64,
}

/// A partial pick: its cost and (segment, position) seats.
type Chosen = (i64, Vec<(usize, usize)>);

/// The best pick of `q` seats over `segments`, or `None` when nothing fits without stranding
/// a seat (or `q` is 0).
pub fn pick(segments: &[Vec<Slot>], q: usize, adjacent: bool) -> Option<Pick> {
    if q == 0 {
        return None;
    }
    if adjacent {
        let mut best: Option<(i64, usize, usize)> = None;
        for (s, seg) in segments.iter().enumerate() {
            if let Some((cost, start)) = best_block(seg, q)
                && best.is_none_or(|(c, _, _)| cost < c)
            {
                best = Some((cost, s, start));
            }
        }
        return best.map(|(cost, s, start)| Pick {
            seats: (start..start + q).map(|p| (s, p)).collect(),
            cost,
        });
    }
    // Knapsack over segments: best[k] = the cheapest k seats from the segments so far.
    let mut best: Vec<Option<Chosen>> = vec![None; q + 1];
    best[0] = Some((0, Vec::new()));
    for (s, seg) in segments.iter().enumerate() {
        let here = best_sets(seg, q);
        let mut next = best.clone();
        for (k, done) in best.iter().enumerate() {
            let Some((c0, seats0)) = done else { continue };
            for (j, set) in here.iter().enumerate().skip(1) {
                let Some((c1, positions)) = set else { continue };
                if k + j > q {
                    break;
                }
                let cost = c0 + c1;
                if next[k + j].as_ref().is_none_or(|(c, _)| cost < *c) {
                    let mut seats = seats0.clone();
                    seats.extend(positions.iter().map(|&p| (s, p)));
                    next[k + j] = Some((cost, seats));
                }
            }
        }
        best = next;
    }
    best[q].take().map(|(cost, seats)| Pick { seats, cost })
}

/// Whether the free seat next to a block (at `at`, with `beyond` the seat after it, away from
/// the block) would be stranded by taking the block.
fn strands(seg: &[Slot], at: Option<usize>, beyond: Option<usize>) -> bool {
    let free = |i: Option<usize>| i.and_then(|i| seg.get(i)).is_some_and(|s| s.free);
    free(at) && !free(beyond)
}

/// The cheapest block of `q` takeable seats in one segment that strands no seat: (cost,
/// start). Ties go to the lowest start.
pub fn best_block(seg: &[Slot], q: usize) -> Option<(i64, usize)> {
    if q == 0 || q > seg.len() {
        return None;
    }
    let mut best: Option<(i64, usize)> = None;
    for start in 0..=seg.len() - q {
        let end = start + q;
        if !seg[start..end].iter().all(Slot::takeable) {
            continue;
        }
        let left = strands(seg, start.checked_sub(1), start.checked_sub(2));
        let right = strands(seg, Some(end), Some(end + 1));
        if left || right {
            continue;
        }
        let cost = seg[start..end].iter().map(|s| s.rank).sum();
        if best.is_none_or(|(c, _)| cost < c) {
            best = Some((cost, start));
        }
    }
    best
}

/// For each k in 0..=q, the cheapest k takeable seats of one segment that strand no seat
/// (positions ascending), by dynamic programming over the seats: the state after seat i is
/// (k, taken(i-1), taken(i)), enough to decide whether seat i is stranded once seat i+1 is
/// decided.
pub fn best_sets(seg: &[Slot], q: usize) -> Vec<Option<(i64, Vec<usize>)>> {
    let n = seg.len();
    let mut out: Vec<Option<(i64, Vec<usize>)>> = vec![None; q + 1];
    out[0] = Some((0, Vec::new()));
    if n == 0 || q == 0 {
        return out;
    }
    let width = (q + 1) * 4;
    let at = |i: usize, k: usize, xp: usize, xc: usize| i * width + k * 4 + xp * 2 + xc;
    // cost[state], and the taken bit of seat i-2 that led there (to walk back).
    let mut cost: Vec<Option<i64>> = vec![None; n * width];
    let mut back: Vec<u8> = vec![0; n * width];
    // Seat i stranded, given taken bits of i-1, i, i+1 (out of range: not free, not taken).
    let stranded = |i: usize, xp: usize, xc: usize, xn: usize| {
        let free_after = |j: Option<usize>, x: usize| {
            j.and_then(|j| seg.get(j)).is_some_and(|s| s.free) && x == 0
        };
        free_after(Some(i), xc)
            && !free_after(i.checked_sub(1), xp)
            && !free_after(Some(i + 1), xn)
            && (xp == 1 || xn == 1)
    };
    for xc in 0..2 {
        if xc == 1 && !seg[0].takeable() {
            continue;
        }
        if xc <= q {
            cost[at(0, xc, 0, xc)] = Some(if xc == 1 { seg[0].rank } else { 0 });
        }
    }
    for i in 0..n - 1 {
        for k in 0..=q {
            for xp in 0..2 {
                for xc in 0..2 {
                    let Some(c) = cost[at(i, k, xp, xc)] else {
                        continue;
                    };
                    for xn in 0..2 {
                        if (xn == 1 && (!seg[i + 1].takeable() || k == q))
                            || stranded(i, xp, xc, xn)
                        {
                            continue;
                        }
                        let c2 = c + if xn == 1 { seg[i + 1].rank } else { 0 };
                        let to = at(i + 1, k + xn, xc, xn);
                        if cost[to].is_none_or(|old| c2 < old) {
                            cost[to] = Some(c2);
                            back[to] = xp as u8;
                        }
                    }
                }
            }
        }
    }
    for (k, slot) in out.iter_mut().enumerate().skip(1) {
        let mut end: Option<(i64, usize, usize)> = None;
        for xp in 0..2 {
            for xc in 0..2 {
                let Some(c) = cost[at(n - 1, k, xp, xc)] else {
                    continue;
                };
                if !stranded(n - 1, xp, xc, 0) && end.is_none_or(|(e, _, _)| c < e) {
                    end = Some((c, xp, xc));
                }
            }
        }
        let Some((c, mut xp, mut xc)) = end else {
            continue;
        };
        let mut positions = Vec::with_capacity(k);
        let mut kk = k;
        for i in (0..n).rev() {
            if xc == 1 {
                positions.push(i);
            }
            let before = back[at(i, kk, xp, xc)] as usize;
            kk -= xc;
            xc = xp;
            xp = before;
        }
        positions.reverse();
        *slot = Some((c, positions));
    }
    out
}

/// The seats of a segment that are free and have no free neighbour (whoever made them so):
/// what the concurrency tests check the final map against.
pub fn lonely(free: &[bool]) -> Vec<usize> {
    let f = |i: Option<usize>| i.and_then(|i| free.get(i)).copied().unwrap_or(false);
    (0..free.len())
        .filter(|&i| free[i] && !f(i.checked_sub(1)) && !f(Some(i + 1)))
        .collect()
}
