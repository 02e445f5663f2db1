use super::*;

#[test]
fn an_account_stays_in_one_sub_queue_and_accounts_spread_over_all() {
    assert_eq!(shard_of("anyone", 1), 0);
    assert_eq!(shard_of("fan-1", 4), shard_of("fan-1", 4));
    let mut per = [0u32; 4];
    for i in 0..40_000 {
        per[shard_of(&format!("fan-{i}"), 4) as usize] += 1;
    }
    // Each sub-queue gets its quarter within 3 %.
    for n in per {
        assert!((9_700..=10_300).contains(&n), "{per:?}");
    }
}

#[test]
fn the_merge_takes_the_lowest_scores_over_every_sub_queue() {
    let h = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(m, s)| ((*m).to_owned(), (*s).to_owned()))
            .collect()
    };
    let heads = vec![
        h(&[("a", "-5"), ("b", "10.5"), ("c", "30")]),
        h(&[("d", "1"), ("e", "2"), ("f", "3")]),
        h(&[]),
    ];
    let cuts = merge_heads(&heads, 4);
    assert_eq!(
        cuts,
        vec![
            (1, "-5".to_owned()),
            (3, "3".to_owned()),
            (0, String::new())
        ]
    );
    // Fewer waiting than the batch: everyone.
    let cuts = merge_heads(&heads, 100);
    assert_eq!(cuts[0], (3, "30".to_owned()));
    assert_eq!(cuts[1], (3, "3".to_owned()));
}
