//! Arrival curves: how many fans reach the waiting room in each second, from a CSV
//! (`second,arrivals`) or a named shape (`ramp:…`, `seed:…`, `flat:…`).
//!
//! Second 0 is the curve's origin; where the sale starts on that axis is the caller's
//! choice, with each shape's natural default ([`Curve::sale_start_s`]). Counts per second are
//! differences of the rounded cumulative curve, so a shape's total is exact.

use thiserror::Error;

/// Longest curve accepted (a week), so a typo cannot allocate the machine away.
pub const MAX_SECONDS: u64 = 7 * 24 * 3600;
/// Most fans accepted in one curve.
pub const MAX_FANS: u64 = 100_000_000;

#[derive(Debug, Error, PartialEq)]
pub enum CurveError {
    #[error("arrivals CSV line {line}: {problem}")]
    Line { line: usize, problem: String },
    #[error("arrivals CSV: {0}")]
    Csv(String),
    #[error("arrival shape {spec:?}: {problem}")]
    Shape { spec: String, problem: String },
}

/// Arrivals per second from second 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    pub per_second: Vec<u64>,
    /// What the curve is, for the report.
    pub name: String,
    /// Where the sale starts on the curve's axis unless told otherwise.
    pub sale_start_s: f64,
}

impl Curve {
    pub fn total(&self) -> u64 {
        self.per_second.iter().sum()
    }

    /// Arrival times (ms from the origin) of second `s`'s fans, spread evenly inside it.
    pub fn times_in(&self, s: usize) -> impl Iterator<Item = i64> {
        let n = self.per_second.get(s).copied().unwrap_or(0);
        let base = s as i64 * 1000;
        (0..n).map(move |i| base + ((2 * i + 1) * 1000 / (2 * n)) as i64)
    }

    fn from_cumulative(
        name: String,
        seconds: u64,
        sale_start_s: f64,
        c: impl Fn(f64) -> f64,
    ) -> Curve {
        let mut per_second = Vec::with_capacity(seconds as usize);
        let mut prev = 0u64;
        for s in 1..=seconds {
            let now = c(s as f64).round().max(0.0) as u64;
            per_second.push(now.saturating_sub(prev));
            prev = prev.max(now);
        }
        Curve {
            per_second,
            name,
            sale_start_s,
        }
    }
}

/// Arrivals expected by `t` s into a ramp (up over `ramp`, flat at `peak` for `hold`, down
/// to zero over `down`): the same integral as `loadgen surge` (`arrivals_by` in
/// deploy/loadgen/src/surge.rs), so the surge profile replays the bench's own curve.
pub fn ramp_by(t: f64, peak: f64, ramp: f64, hold: f64, down: f64) -> f64 {
    let t = t.max(0.0);
    let up = |x: f64| {
        if ramp > 0.0 {
            0.5 * peak * x * x / ramp
        } else {
            peak * x
        }
    };
    if t <= ramp {
        return up(t);
    }
    let a_ramp = up(ramp);
    if t <= ramp + hold {
        return a_ramp + peak * (t - ramp);
    }
    let x = (t - ramp - hold).min(down);
    let a_down = if down > 0.0 {
        peak * x - 0.5 * peak * x * x / down
    } else {
        0.0
    };
    a_ramp + peak * hold + a_down
}

/// Fans expected by `t` s into the seed launch: `share` of them arrive before the sale start
/// at `presale` s, at a rate rising linearly (people open the page as the hour approaches);
/// the rest from the start, at a rate decaying with time constant `tau` s to `duration`.
pub fn seed_by(t: f64, fans: f64, duration: f64, presale: f64, share: f64, tau: f64) -> f64 {
    let pre = fans * share;
    if t <= presale {
        return if presale > 0.0 {
            pre * (t.max(0.0) / presale).powi(2)
        } else {
            0.0
        };
    }
    let span = (duration - presale).max(1e-9);
    let x = (t - presale).min(span);
    pre + (fans - pre) * (1.0 - (-x / tau).exp()) / (1.0 - (-span / tau).exp())
}

/// Parses `name[:key=value,...]`.
pub fn shape(spec: &str) -> Result<Curve, CurveError> {
    let err = |problem: String| CurveError::Shape {
        spec: spec.to_owned(),
        problem,
    };
    let (name, params) = spec.split_once(':').unwrap_or((spec, ""));
    let mut kv: Vec<(&str, f64)> = Vec::new();
    for p in params.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| err(format!("{p:?} is not key=value")))?;
        let v: f64 = v
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| err(format!("{}: {v:?} is not a number ≥ 0", k.trim())))?;
        kv.push((k.trim(), v));
    }
    let take = |known: &[(&str, f64)]| -> Result<Vec<f64>, CurveError> {
        if let Some((k, _)) = kv.iter().find(|(k, _)| !known.iter().any(|(n, _)| n == k)) {
            let names: Vec<_> = known.iter().map(|(n, _)| *n).collect();
            return Err(err(format!(
                "unknown key {k:?} (known: {})",
                names.join(", ")
            )));
        }
        Ok(known
            .iter()
            .map(|(n, d)| {
                kv.iter()
                    .rev()
                    .find(|(k, _)| k == n)
                    .map_or(*d, |(_, v)| *v)
            })
            .collect())
    };
    let seconds = |d: f64| -> Result<u64, CurveError> {
        let s = d.ceil();
        if s < 1.0 || s > MAX_SECONDS as f64 {
            return Err(err(format!("lasts {d} s; must be 1..{MAX_SECONDS}")));
        }
        Ok(s as u64)
    };
    let curve = match name.trim() {
        "ramp" => {
            let v = take(&[
                ("peak", 5000.0),
                ("ramp", 30.0),
                ("hold", 10.0),
                ("down", 30.0),
            ])?;
            let (peak, ramp, hold, down) = (v[0], v[1], v[2], v[3]);
            Curve::from_cumulative(
                format!("ramp to {peak}/s over {ramp} s, hold {hold} s, down over {down} s"),
                seconds(ramp + hold + down)?,
                0.0,
                |t| ramp_by(t, peak, ramp, hold, down),
            )
        }
        "seed" => {
            let v = take(&[
                ("fans", 2_000_000.0),
                ("duration", 600.0),
                ("presale", 120.0),
                ("presale_share", 0.25),
                ("tau", 90.0),
            ])?;
            let (fans, duration, presale, share, tau) = (v[0], v[1], v[2], v[3], v[4]);
            if presale >= duration || share > 1.0 || tau <= 0.0 {
                return Err(err(
                    "needs presale < duration, presale_share ≤ 1 and tau > 0".into(),
                ));
            }
            Curve::from_cumulative(
                format!(
                    "seed launch: {fans} fans over {duration} s, {:.0} % in the {presale} s before the sale start, then decaying (tau {tau} s)",
                    share * 100.0
                ),
                seconds(duration)?,
                presale,
                |t| seed_by(t, fans, duration, presale, share, tau),
            )
        }
        "flat" => {
            let v = take(&[("rate", 1000.0), ("duration", 60.0)])?;
            let (rate, duration) = (v[0], v[1]);
            Curve::from_cumulative(
                format!("flat {rate}/s for {duration} s"),
                seconds(duration)?,
                0.0,
                |t| rate * t.min(duration),
            )
        }
        other => {
            return Err(err(format!(
                "unknown shape {other:?} (known: ramp, seed, flat)"
            )));
        }
    };
    if curve.total() > MAX_FANS {
        return Err(err(format!("{} fans; at most {MAX_FANS}", curve.total())));
    }
    Ok(curve)
}

/// Parses `second,arrivals` rows (a header line, blank lines and `#` comments allowed;
/// seconds strictly increasing, missing seconds have no arrivals).
pub fn csv(text: &str, name: &str) -> Result<Curve, CurveError> {
    let mut per_second: Vec<u64> = Vec::new();
    let mut last: Option<u64> = None;
    let mut total = 0u64;
    let mut seen_data = false;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let bad = |problem: String| CurveError::Line { line, problem };
        let row = raw.trim();
        if row.is_empty() || row.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = row.split(',').map(str::trim).collect();
        if !seen_data && fields.first().is_some_and(|f| f.parse::<u64>().is_err()) {
            // A header (e.g. `second,arrivals`) before the first row.
            seen_data = true;
            continue;
        }
        seen_data = true;
        let [second, arrivals] = fields[..] else {
            return Err(bad(format!(
                "expected 2 fields (second,arrivals), found {}",
                fields.len()
            )));
        };
        let second: u64 = second
            .parse()
            .map_err(|_| bad(format!("second {second:?} is not a whole number ≥ 0")))?;
        let arrivals: u64 = arrivals
            .parse()
            .map_err(|_| bad(format!("arrivals {arrivals:?} is not a whole number ≥ 0")))?;
        if second >= MAX_SECONDS {
            return Err(bad(format!(
                "second {second} is past the limit of {MAX_SECONDS}"
            )));
        }
        if let Some(prev) = last.filter(|p| second <= *p) {
            return Err(bad(format!(
                "second {second} does not come after second {prev}"
            )));
        }
        total = total.saturating_add(arrivals);
        if total > MAX_FANS {
            return Err(bad(format!("more than {MAX_FANS} fans in total")));
        }
        per_second.resize(second as usize, 0);
        per_second.push(arrivals);
        last = Some(second);
    }
    if per_second.is_empty() {
        return Err(CurveError::Csv("no rows".into()));
    }
    Ok(Curve {
        per_second,
        name: format!("CSV {name}"),
        sale_start_s: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ramp_is_the_surge_bench_profile() {
        let c = shape("ramp:peak=5000,ramp=30,hold=10,down=30").unwrap();
        assert_eq!(c.total(), 200_000);
        assert_eq!(c.per_second.len(), 70);
        assert_eq!(c.per_second[35], 5000);
        assert_eq!(c.per_second, shape("ramp").unwrap().per_second);
        // The surge's own test figures.
        assert!((ramp_by(60.0, 5000.0, 20.0, 30.0, 10.0) - 225_000.0).abs() < 1e-6);
        assert!((ramp_by(10.0, 5000.0, 20.0, 30.0, 10.0) - 12_500.0).abs() < 1e-6);
    }

    #[test]
    fn seed_is_two_million_front_loaded() {
        let c = shape("seed").unwrap();
        assert_eq!(c.total(), 2_000_000);
        assert_eq!(c.per_second.len(), 600);
        assert_eq!(c.sale_start_s, 120.0);
        let pre: u64 = c.per_second[..120].iter().sum();
        assert_eq!(pre, 500_000);
        // The busiest second is right at the start; the last minutes are quiet.
        let peak = c
            .per_second
            .iter()
            .enumerate()
            .max_by_key(|(_, n)| **n)
            .unwrap();
        assert_eq!(peak.0, 120);
        assert!(c.per_second[599] < peak.1 / 50);
    }

    #[test]
    fn shape_errors_name_the_problem() {
        for (spec, needle) in [
            ("wave", "unknown shape"),
            ("ramp:peak=5000,ramps=3", "unknown key \"ramps\""),
            ("ramp:peak=-1", "peak"),
            ("ramp:peak", "not key=value"),
            ("flat:duration=0", "lasts"),
            ("seed:presale=700", "presale < duration"),
        ] {
            let e = shape(spec).unwrap_err().to_string();
            assert!(e.contains(needle), "{spec}: {e}");
        }
    }

    #[test]
    fn csv_rows_gaps_header_and_errors() {
        let c = csv("second,arrivals\n# comment\n0,5\n\n3,7\n", "x").unwrap();
        assert_eq!(c.per_second, vec![5, 0, 0, 7]);
        assert_eq!(
            c.times_in(0).collect::<Vec<_>>(),
            vec![100, 300, 500, 700, 900]
        );
        for (text, needle) in [
            (
                "0,5\n0,6\n",
                "line 2: second 0 does not come after second 0",
            ),
            ("0,5\n1,x\n", "line 2: arrivals \"x\""),
            ("0,5,6\n", "line 1: expected 2 fields"),
            ("0,5\n-1,3\n", "line 2: second \"-1\""),
            ("second,arrivals\n", "no rows"),
        ] {
            let e = csv(text, "x").unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }
}
