//! A tiny SVG chart writer for the benchmark report: line charts over time (with an optional
//! right-hand axis for a second scale) and grouped bar charts (latency quantiles per
//! endpoint, optionally on a log scale). Plain text out, no plotting dependency: the report
//! is reproducible from `cargo run` alone and the files diff sensibly in git.

use std::fmt::Write;

const W: f64 = 860.0;
const H: f64 = 400.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 78.0;
const TOP: f64 = 48.0;
const BOTTOM: f64 = 86.0;
/// Colour-blind-safe palette (Okabe–Ito).
pub const PALETTE: [&str; 7] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Left,
    Right,
}

#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub axis: Axis,
}

impl Series {
    pub fn new(name: impl Into<String>, axis: Axis, points: Vec<(f64, f64)>) -> Self {
        Self {
            name: name.into(),
            points,
            axis,
        }
    }
}

/// A line chart; x is usually seconds since the start of a run.
#[derive(Debug, Clone, Default)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub left_label: String,
    pub right_label: String,
    pub series: Vec<Series>,
    /// Vertical markers (x, label), e.g. "arrivals end", "sold out".
    pub markers: Vec<(f64, String)>,
}

/// Escapes text for SVG content and attribute values.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// "Nice" tick step for a range split into about `n` intervals (1, 2, 2.5, 5 × 10^k).
pub fn nice_step(range: f64, n: usize) -> f64 {
    if !range.is_finite() || range <= 0.0 {
        return 1.0;
    }
    let raw = range / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 2.5 {
        2.5
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// Upper end of an axis from 0 that contains `max`, rounded up to a tick.
fn axis_max(max: f64) -> (f64, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let step = nice_step(max, 5);
    ((max / step).ceil() * step, step)
}

/// Compact number for tick labels: 1200 -> "1.2k", 2500000 -> "2.5M".
pub fn short(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = if (x - x.round()).abs() < 1e-9 {
        format!("{}", x.round() as i64)
    } else if x.abs() >= 10.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    };
    format!("{s}{suffix}")
}

fn header(out: &mut String, title: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>
"#,
        W / 2.0,
        esc(title)
    );
}

impl LineChart {
    pub fn render(&self) -> String {
        let pw = W - LEFT - RIGHT;
        let ph = H - TOP - BOTTOM;
        let all = || self.series.iter().flat_map(|s| s.points.iter());
        let x_min = all().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let x_max = all().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
        let (x_min, x_max) = if x_min.is_finite() && x_max > x_min {
            (x_min, x_max)
        } else {
            (0.0, 1.0)
        };
        let max_of = |axis: Axis| {
            self.series
                .iter()
                .filter(|s| s.axis == axis)
                .flat_map(|s| s.points.iter().map(|p| p.1))
                .fold(0.0, f64::max)
        };
        let (l_max, l_step) = axis_max(max_of(Axis::Left));
        let (r_max, r_step) = axis_max(max_of(Axis::Right));
        let has_right = self.series.iter().any(|s| s.axis == Axis::Right);
        let sx = |x: f64| LEFT + (x - x_min) / (x_max - x_min) * pw;
        let sy = |y: f64, axis: Axis| {
            let m = if axis == Axis::Left { l_max } else { r_max };
            TOP + ph - (y / m).clamp(0.0, 1.05) * ph
        };

        let mut out = String::new();
        header(&mut out, &self.title);
        // Grid and left ticks.
        let mut v = 0.0;
        while v <= l_max + l_step / 2.0 {
            let y = sy(v, Axis::Left);
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                short(v)
            );
            v += l_step;
        }
        if has_right {
            let mut v = 0.0;
            while v <= r_max + r_step / 2.0 {
                let y = sy(v, Axis::Right);
                let _ = writeln!(
                    out,
                    r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                    LEFT + pw + 6.0,
                    y + 4.0,
                    short(v)
                );
                v += r_step;
            }
        }
        // X ticks.
        let x_step = nice_step(x_max - x_min, 8);
        let mut x = (x_min / x_step).ceil() * x_step;
        while x <= x_max + 1e-9 {
            let px = sx(x);
            let _ = writeln!(
                out,
                r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#999"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + ph,
                TOP + ph + 5.0,
                TOP + ph + 18.0,
                short(x)
            );
            x += x_step;
        }
        // Frame and axis labels.
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>
<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            LEFT + pw / 2.0,
            TOP + ph + 36.0,
            esc(&self.x_label),
            TOP + ph / 2.0,
            esc(&self.left_label)
        );
        if has_right {
            let _ = writeln!(
                out,
                r#"<text transform="translate({:.1} {:.1}) rotate(90)" text-anchor="middle">{}</text>"#,
                W - 14.0,
                TOP + ph / 2.0,
                esc(&self.right_label)
            );
        }
        for (mx, label) in &self.markers {
            if *mx < x_min || *mx > x_max {
                continue;
            }
            let px = sx(*mx);
            let _ = writeln!(
                out,
                r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#777" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#555">{}</text>"##,
                TOP + ph,
                px + 3.0,
                TOP + 12.0,
                esc(label)
            );
        }
        // Lines.
        for (i, s) in self.series.iter().enumerate() {
            if s.points.is_empty() {
                continue;
            }
            let color = PALETTE[i % PALETTE.len()];
            let mut d = String::new();
            for (j, (x, y)) in s.points.iter().enumerate() {
                let _ = write!(
                    d,
                    "{}{:.1},{:.1}",
                    if j == 0 { "M" } else { " L" },
                    sx(*x),
                    sy(*y, s.axis)
                );
            }
            let dash = if s.axis == Axis::Right {
                r#" stroke-dasharray="6 3""#
            } else {
                ""
            };
            let _ = writeln!(
                out,
                r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.8"{dash}/>"#
            );
        }
        legend(
            &mut out,
            self.series.iter().map(|s| {
                let side = if has_right && s.axis == Axis::Right {
                    " (right axis)"
                } else {
                    ""
                };
                format!("{}{side}", s.name)
            }),
        );
        out.push_str("</svg>\n");
        out
    }
}

fn legend(out: &mut String, names: impl Iterator<Item = String>) {
    let mut x = LEFT;
    let y = H - 22.0;
    for (i, name) in names.enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let _ = writeln!(
            out,
            r#"<rect x="{x:.1}" y="{:.1}" width="14" height="4" fill="{color}"/><text x="{:.1}" y="{y:.1}">{}</text>"#,
            y - 6.0,
            x + 18.0,
            esc(&name)
        );
        x += 30.0 + name.chars().count() as f64 * 6.6;
    }
}

/// Grouped bars: one group per category (e.g. endpoint), one bar per series (e.g. p50, p99).
#[derive(Debug, Clone, Default)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// (series name, one value per category).
    pub series: Vec<(String, Vec<f64>)>,
    /// Log-10 y axis (latencies spanning decades).
    pub log: bool,
}

impl BarChart {
    pub fn render(&self) -> String {
        let pw = W - LEFT - RIGHT / 3.0;
        let ph = H - TOP - BOTTOM;
        let max = self
            .series
            .iter()
            .flat_map(|s| s.1.iter().copied())
            .fold(0.0, f64::max);
        let mut out = String::new();
        header(&mut out, &self.title);
        // y mapping and ticks.
        let (ticks, to_frac): (Vec<f64>, Box<dyn Fn(f64) -> f64>) = if self.log {
            let lo = self
                .series
                .iter()
                .flat_map(|s| s.1.iter().copied())
                .filter(|v| *v > 0.0)
                .fold(f64::INFINITY, f64::min);
            let lo = if lo.is_finite() { lo } else { 0.1 };
            let e_lo = lo.log10().floor();
            let e_hi = max.max(lo * 10.0).log10().ceil();
            let ticks = (e_lo as i32..=e_hi as i32).map(|e| 10f64.powi(e)).collect();
            (
                ticks,
                Box::new(move |v: f64| {
                    if v <= 0.0 {
                        0.0
                    } else {
                        ((v.log10() - e_lo) / (e_hi - e_lo)).clamp(0.0, 1.0)
                    }
                }),
            )
        } else {
            let (m, step) = axis_max(max);
            let n = (m / step).round() as usize;
            (
                (0..=n).map(|i| i as f64 * step).collect(),
                Box::new(move |v: f64| (v / m).clamp(0.0, 1.0)),
            )
        };
        for t in &ticks {
            let y = TOP + ph - to_frac(*t) * ph;
            let label = if *t < 1.0 { format!("{t}") } else { short(*t) };
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0
            );
        }
        let groups = self.categories.len().max(1) as f64;
        let gw = pw / groups;
        let bars = self.series.len().max(1) as f64;
        let bw = (gw * 0.8) / bars;
        for (ci, cat) in self.categories.iter().enumerate() {
            let gx = LEFT + ci as f64 * gw + gw * 0.1;
            for (si, (_, vals)) in self.series.iter().enumerate() {
                let v = vals.get(ci).copied().unwrap_or(0.0);
                let h = to_frac(v) * ph;
                let x = gx + si as f64 * bw;
                let color = PALETTE[si % PALETTE.len()];
                let _ = writeln!(
                    out,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{color}"><title>{} {}: {v:.2}</title></rect>"#,
                    TOP + ph - h,
                    (bw - 1.0).max(1.0),
                    esc(cat),
                    esc(&self.series[si].0)
                );
            }
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                gx + gw * 0.4,
                TOP + ph + 18.0,
                esc(cat)
            );
        }
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>
<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            TOP + ph / 2.0,
            esc(&self.y_label)
        );
        legend(&mut out, self.series.iter().map(|s| s.0.clone()));
        out.push_str("</svg>\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(100.0, 5), 20.0);
        assert_eq!(nice_step(7.0, 5), 2.0);
        assert_eq!(nice_step(1200.0, 5), 250.0);
        assert_eq!(nice_step(0.0, 5), 1.0);
        assert_eq!(short(1200.0), "1.2k");
        assert_eq!(short(2_500_000.0), "2.5M");
        assert_eq!(short(40.0), "40");
    }

    #[test]
    fn line_chart_is_well_formed_svg_with_escaped_text() {
        let c = LineChart {
            title: "queue <length> & rate".into(),
            x_label: "s".into(),
            left_label: "fans".into(),
            right_label: "per s".into(),
            series: vec![
                Series::new(
                    "queue",
                    Axis::Left,
                    vec![(0.0, 0.0), (1.0, 5000.0), (2.0, 100.0)],
                ),
                Series::new(
                    "admit/s",
                    Axis::Right,
                    vec![(0.0, 0.0), (1.0, 100.0), (2.0, 99.0)],
                ),
            ],
            markers: vec![(1.5, "sold out".into())],
        };
        let svg = c.render();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("queue &lt;length&gt; &amp; rate"));
        assert_eq!(svg.matches("<path").count(), 2);
        assert!(svg.contains("sold out"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn empty_and_log_charts_do_not_produce_nan() {
        assert!(!LineChart::default().render().contains("NaN"));
        let b = BarChart {
            title: "latency".into(),
            y_label: "ms".into(),
            categories: vec!["status".into(), "hold".into()],
            series: vec![
                ("p50".into(), vec![0.4, 3.0]),
                ("p99".into(), vec![12.0, 250.0]),
            ],
            log: true,
        };
        let svg = b.render();
        assert_eq!(svg.matches("<rect x=").count(), 4 + 1 + 2);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}
