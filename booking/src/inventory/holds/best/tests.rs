//! The pick against a brute-force reference: every taken/free pattern of a row of 8, every
//! quantity 1..=8, adjacent or not, with centre-first ranks and with scrambled ranks.

use super::*;

const N: usize = 8;

/// The rule in its own words, independently of the code under test: a seat is stranded when
/// it is free after the hold, has no free neighbour after it, and had one before.
fn strands_any(free: &[bool], taken: &[usize]) -> bool {
    let after: Vec<bool> = (0..free.len())
        .map(|i| free[i] && !taken.contains(&i))
        .collect();
    let has_free_neighbour =
        |v: &[bool], i: usize| (i > 0 && v[i - 1]) || (i + 1 < v.len() && v[i + 1]);
    (0..free.len())
        .any(|i| after[i] && !has_free_neighbour(&after, i) && has_free_neighbour(free, i))
}

/// Every subset of `0..n` of size `q`, as sorted positions.
fn subsets(n: usize, q: usize) -> Vec<Vec<usize>> {
    (0u32..1 << n)
        .filter(|m| m.count_ones() as usize == q)
        .map(|m| (0..n).filter(|i| m & (1 << i) != 0).collect())
        .collect()
}

/// The reference: the cheapest valid subset (contiguous when `adjacent`); ties to the first
/// in enumeration order by lowest start for blocks.
fn reference(free: &[bool], ranks: &[i64], q: usize, adjacent: bool) -> Option<(i64, Vec<usize>)> {
    let mut best: Option<(i64, Vec<usize>)> = None;
    let mut candidates = subsets(free.len(), q);
    candidates.sort(); // lexicographic: for blocks, lowest start first
    for set in candidates {
        if !set.iter().all(|&i| free[i]) || strands_any(free, &set) {
            continue;
        }
        if adjacent && set.windows(2).any(|w| w[1] != w[0] + 1) {
            continue;
        }
        let cost = set.iter().map(|&i| ranks[i]).sum();
        if best.as_ref().is_none_or(|(c, _)| cost < *c) {
            best = Some((cost, set));
        }
    }
    best
}

fn row(mask: u32, ranks: &[i64]) -> Vec<Slot> {
    (0..N)
        .map(|i| Slot {
            free: mask & (1 << i) != 0,
            eligible: true,
            rank: ranks[i],
        })
        .collect()
}

fn rank_sets() -> Vec<Vec<i64>> {
    // Centre first (the default: distance from the centre of 1..=8), flat, and scrambled.
    let centre: Vec<i64> = (1..=N as i64).map(|n| (2 * n - 9).abs()).collect();
    let mut sets = vec![centre, vec![5; N]];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..6 {
        sets.push(
            (0..N)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % 10) as i64
                })
                .collect(),
        );
    }
    sets
}

#[test]
fn every_row_of_8_and_quantity_matches_the_brute_force_reference() {
    let mut fits = [0usize; 2];
    for ranks in rank_sets() {
        for mask in 0u32..1 << N {
            let free: Vec<bool> = (0..N).map(|i| mask & (1 << i) != 0).collect();
            let seg = row(mask, &ranks);
            for q in 1..=N {
                for (a, adjacent) in [false, true].into_iter().enumerate() {
                    let want = reference(&free, &ranks, q, adjacent);
                    let got = pick(std::slice::from_ref(&seg), q, adjacent);
                    let ctx = format!("mask {mask:08b} q {q} adjacent {adjacent} ranks {ranks:?}");
                    match (&want, &got) {
                        (None, None) => {}
                        (Some((cost, set)), Some(p)) => {
                            fits[a] += 1;
                            assert_eq!(p.cost, *cost, "{ctx}: {p:?} vs {set:?}");
                            let positions: Vec<usize> = p.seats.iter().map(|&(_, i)| i).collect();
                            assert_eq!(positions.len(), q, "{ctx}");
                            assert!(positions.iter().all(|&i| free[i]), "{ctx}");
                            assert!(!strands_any(&free, &positions), "{ctx}: {positions:?}");
                            assert_eq!(
                                p.cost,
                                positions.iter().map(|&i| ranks[i]).sum::<i64>(),
                                "{ctx}"
                            );
                            if adjacent {
                                // Blocks tie-break to the lowest start, like the reference.
                                assert_eq!(&positions, set, "{ctx}");
                            }
                        }
                        _ => panic!("{ctx}: reference {want:?}, pick {got:?}"),
                    }
                }
            }
        }
    }
    // The test explores both outcomes, in both modes.
    assert!(fits.iter().all(|&f| f > 1000), "{fits:?}");
}

#[test]
fn an_adjacent_pick_never_leaves_one_seat_against_a_row_end() {
    let ranks: Vec<i64> = (0..5).collect();
    let seg: Vec<Slot> = ranks
        .iter()
        .map(|&rank| Slot {
            free: true,
            eligible: true,
            rank,
        })
        .collect();
    // Cheapest would be 0..2, but 0..=1 leaves 2..=4 (fine); q=4 from 0 leaves seat 4 alone.
    assert_eq!(best_block(&seg, 4), None);
    assert_eq!(best_block(&seg, 2), Some((1, 0)));
    assert_eq!(best_block(&seg, 5), Some((10, 0)));
    // A seat that was alone already is not stranded by the hold.
    let mut seg2 = seg.clone();
    seg2[1].free = false;
    // 2,3 would strand 4 against the row end, 3,4 would strand 2 next to the taken seat 1.
    assert_eq!(best_block(&seg2, 2), None);
    assert_eq!(best_block(&seg2, 3), Some((9, 2)));
}

#[test]
fn the_best_block_is_searched_across_segments_and_tiers() {
    let slot = |free, eligible, rank| Slot {
        free,
        eligible,
        rank,
    };
    let front = vec![
        slot(true, false, 0),
        slot(true, false, 1),
        slot(true, true, 2),
    ];
    let back = vec![slot(true, true, 10), slot(true, true, 11)];
    // The front row's free seats are of another tier: taking the one eligible seat there
    // would do for q=1 only if it strands nothing (seat 1 keeps seat 0 as neighbour).
    let p = pick(&[front.clone(), back.clone()], 1, true).expect("one seat");
    assert_eq!(p.seats, vec![(0, 2)]);
    let p = pick(&[front, back], 2, true).expect("two together");
    assert_eq!((p.seats, p.cost), (vec![(1, 0), (1, 1)], 21));
}

#[test]
fn without_adjacency_seats_may_come_from_several_rows() {
    let slot = |free, rank| Slot {
        free,
        eligible: true,
        rank,
    };
    // Two pairs in two rows; nothing takes 4 together.
    let a = vec![slot(false, 0), slot(true, 1), slot(true, 2), slot(false, 3)];
    let b = vec![slot(true, 5), slot(true, 6)];
    assert_eq!(pick(&[a.clone(), b.clone()], 4, true), None);
    let p = pick(&[a, b], 4, false).expect("two pairs");
    assert_eq!(p.seats, vec![(0, 1), (0, 2), (1, 0), (1, 1)]);
    assert_eq!(p.cost, 14);
    assert_eq!(pick(&[], 1, false), None);
    assert_eq!(pick(&[vec![slot(true, 0)]], 0, false), None);
}

#[test]
fn lonely_seats_are_free_seats_without_a_free_neighbour() {
    assert_eq!(lonely(&[true, false, true, true, false, true]), vec![0, 5]);
    assert!(lonely(&[true, true]).is_empty());
    assert_eq!(lonely(&[true]), vec![0]);
}
