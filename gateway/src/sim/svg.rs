//! Inline SVG line charts for the simulator's HTML report: plain text, no plotting
//! dependency, so a report is reproducible from the binary alone.

use std::fmt::Write;

const W: f64 = 860.0;
const H: f64 = 300.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 58.0;
/// Colour-blind-safe (Okabe–Ito), as the bench plots.
pub const PALETTE: [&str; 5] = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00"];
/// More points than this are thinned to each stretch's maximum (peaks stay visible).
const MAX_POINTS: usize = 1200;

pub struct Series<'a> {
    pub name: &'a str,
    pub points: Vec<(f64, f64)>,
}

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// 1, 2, 2.5, 5 × 10^k steps, about `n` of them over `range`.
fn nice_step(range: f64, n: f64) -> f64 {
    if !range.is_finite() || range <= 0.0 {
        return 1.0;
    }
    let raw = range / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .find(|x| f <= *x)
        .unwrap_or(10.0);
    nice * mag
}

/// 1200 → "1.2k", 2500000 → "2.5M".
pub fn short(v: f64) -> String {
    let (x, suffix) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    if (x - x.round()).abs() < 1e-9 || x.abs() >= 10.0 {
        format!("{x:.0}{suffix}")
    } else {
        format!("{x:.1}{suffix}")
    }
}

fn thin(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    if points.len() <= MAX_POINTS {
        return points.to_vec();
    }
    let per = points.len().div_ceil(MAX_POINTS);
    points
        .chunks(per)
        .filter_map(|c| {
            let y = c.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
            c.first().map(|p| (p.0, y))
        })
        .collect()
}

/// A line chart over seconds; `markers` are vertical lines (x, label).
pub fn line_chart(
    title: &str,
    y_label: &str,
    series: &[Series],
    markers: &[(f64, String)],
) -> String {
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let (x0, x1) = if x0.is_finite() && x1 > x0 {
        (x0, x1)
    } else {
        (0.0, 1.0)
    };
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let y_step = nice_step(if y_max > 0.0 { y_max } else { 1.0 }, 4.0);
    let y1 = ((y_max / y_step).ceil() * y_step).max(y_step);
    let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| TOP + ph - (y / y1).clamp(0.0, 1.0) * ph;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12" role="img">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    let mut v = 0.0;
    while v <= y1 + y_step / 2.0 {
        let y = sy(v);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            short(v)
        );
        v += y_step;
    }
    let x_step = nice_step(x1 - x0, 8.0);
    let mut x = (x0 / x_step).ceil() * x_step;
    while x <= x1 + 1e-9 {
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            sx(x),
            TOP + ph + 16.0,
            short(x)
        );
        x += x_step;
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds (0 = first arrival)</text>
<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
        LEFT + pw / 2.0,
        H - 24.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    for (x, label) in markers.iter().filter(|m| m.0 >= x0 && m.0 <= x1) {
        let px = sx(*x);
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#777" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#555">{}</text>"##,
            TOP + ph,
            px + 3.0,
            TOP + 12.0,
            esc(label)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let mut d = String::new();
        for (j, (x, y)) in thin(&s.points).iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if j == 0 { 'M' } else { 'L' },
                sx(*x),
                sy(*y)
            );
        }
        let _ = writeln!(
            out,
            r#"<path d="{}" fill="none" stroke="{colour}" stroke-width="1.6"/>"#,
            d.trim_end()
        );
        let lx = LEFT + 10.0 + i as f64 * 200.0;
        let _ = writeln!(
            out,
            r#"<rect x="{lx:.1}" y="{:.1}" width="14" height="3" fill="{colour}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            H - 12.0,
            lx + 18.0,
            H - 8.0,
            esc(s.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_a_path_per_series_and_thins_long_ones() {
        let long: Vec<_> = (0..5000).map(|i| (i as f64, (i % 97) as f64)).collect();
        let svg = line_chart(
            "a <b>",
            "fans",
            &[
                Series {
                    name: "x",
                    points: long,
                },
                Series {
                    name: "y",
                    points: vec![(0.0, 1.0), (10.0, 2.0)],
                },
            ],
            &[(5.0, "sold out".into())],
        );
        assert_eq!(svg.matches("<path").count(), 2);
        assert!(svg.contains("a &lt;b&gt;") && svg.contains("sold out"));
        assert!(svg.matches('L').count() < 1300);
        assert_eq!(short(1200.0), "1.2k");
        assert_eq!(short(2_500_000.0), "2.5M");
        assert_eq!(short(40.0), "40");
    }
}
