//! Reads single values out of a Prometheus text exposition (the gateway's `/metrics`): loadgen's
//! surge timeline shows what the gateway itself reports with it (queue length, admissions,
//! active admitted fans, the admit rate in force), and the gateway tests read their gauges.
//! Only what they need: a metric name plus an optional `label="value"` match, summed over
//! matching series.

/// Sum of the samples of `name` whose label set contains `label` (e.g. `event="demo"`),
/// or of all its samples when `label` is `None`. `None` if no sample matched.
pub fn value(text: &str, name: &str, label: Option<&str>) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        // `name{...} v` or `name v`; not `name_suffix...`.
        let (labels, val) = if let Some(r) = rest.strip_prefix('{') {
            match r.split_once('}') {
                Some((l, v)) => (l, v),
                None => continue,
            }
        } else if rest.starts_with(' ') {
            ("", rest)
        } else {
            continue;
        };
        if let Some(want) = label
            && !labels.split(',').any(|l| l.trim() == want)
        {
            continue;
        }
        if let Some(v) = val
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::value;

    const TEXT: &str = "# HELP fg_queue_length Fans waiting\n# TYPE fg_queue_length gauge\n\
fg_queue_length{event=\"demo\"} 1234\nfg_queue_length{event=\"other\"} 7\n\
fg_queue_length_extra{event=\"demo\"} 99\nfg_joins_total 5e3\n\
fg_upstream_responses_total{class=\"2xx\"} 10\nfg_upstream_responses_total{class=\"5xx\"} 2\n";

    #[test]
    fn picks_the_labelled_series_and_sums_unlabelled_matches() {
        assert_eq!(
            value(TEXT, "fg_queue_length", Some("event=\"demo\"")),
            Some(1234.0)
        );
        assert_eq!(value(TEXT, "fg_queue_length", Some("event=\"nope\"")), None);
        assert_eq!(value(TEXT, "fg_joins_total", None), Some(5000.0));
        assert_eq!(value(TEXT, "fg_upstream_responses_total", None), Some(12.0));
        assert_eq!(value(TEXT, "fg_missing", None), None);
    }
}
