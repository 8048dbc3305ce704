//! Overlaid charts for the history comparison: two series (window A and window B) on one set of
//! axes, time measured from each window's start, drawn as a self-contained SVG so the same text
//! is shown in the page and exported (as SVG, or rasterised to PNG by the browser).

/// Chart size in SVG user units.
pub const WIDTH: f64 = 560.0;
pub const HEIGHT: f64 = 220.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 24.0;
const BOTTOM: f64 = 32.0;
/// Colours of A and B (blue, orange): distinguishable for the common colour-vision deficiencies.
pub const COLOURS: [&str; 2] = ["#2563eb", "#ea580c"];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A tick label: few significant digits, no trailing noise.
pub fn tick(v: f64) -> String {
    if v == 0.0 {
        return "0".to_owned();
    }
    let magnitude = v.abs();
    if magnitude >= 100.0 {
        format!("{v:.0}")
    } else if magnitude >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// The SVG of `a` and `b` (points are `(seconds since the window began, value)`), titled `title`,
/// with a legend naming the two windows.
pub fn svg(title: &str, a: &[(f64, f64)], b: &[(f64, f64)], a_label: &str, b_label: &str) -> String {
    let points = a.iter().chain(b).filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x_max, mut y_min, mut y_max) = (1.0_f64, f64::INFINITY, f64::NEG_INFINITY);
    for (x, y) in points {
        x_max = x_max.max(*x);
        y_min = y_min.min(*y);
        y_max = y_max.max(*y);
    }
    if !y_min.is_finite() {
        (y_min, y_max) = (0.0, 1.0);
    }
    y_min = y_min.min(0.0);
    if y_max <= y_min {
        y_max = y_min + 1.0;
    }
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + x / x_max * plot_w;
    let sy = |y: f64| TOP + plot_h - (y - y_min) / (y_max - y_min) * plot_h;
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">"#
    );
    out.push_str(&format!(r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#));
    out.push_str(&format!(r#"<text x="{LEFT}" y="15" font-weight="bold">{}</text>"#, escape(title)));
    for i in 0..=4 {
        let y = y_min + (y_max - y_min) * f64::from(i) / 4.0;
        let py = sy(y);
        out.push_str(&format!(
            r##"<line x1="{LEFT}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#e5e7eb"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 4.0,
            py + 4.0,
            tick(y)
        ));
    }
    for i in 0..=4 {
        let x = x_max * f64::from(i) / 4.0;
        out.push_str(&format!(
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{} s</text>"#,
            sx(x),
            HEIGHT - BOTTOM + 14.0,
            tick(x)
        ));
    }
    for (series, colour) in [(a, COLOURS[0]), (b, COLOURS[1])] {
        let path: Vec<String> = series
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        if path.len() == 1 {
            let (x, y) = path[0].split_once(',').unwrap_or(("0", "0"));
            out.push_str(&format!(r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#));
        } else if !path.is_empty() {
            out.push_str(&format!(
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                path.join(" ")
            ));
        }
    }
    let legend_x = WIDTH - RIGHT - 220.0;
    for (i, (label, colour)) in [(a_label, COLOURS[0]), (b_label, COLOURS[1])].into_iter().enumerate() {
        let x = legend_x + 110.0 * i as f64;
        out.push_str(&format!(
            r#"<rect x="{x}" y="6" width="10" height="10" fill="{colour}"/><text x="{}" y="15">{}</text>"#,
            x + 14.0,
            escape(&label.chars().take(16).collect::<String>())
        ));
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_series_are_drawn_with_their_legend() {
        let svg = svg("TTFT p95 <s>", &[(0.0, 0.1), (10.0, 0.2)], &[(0.0, 0.3)], "v1", "v2 & more");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 1, "A has a line");
        assert_eq!(svg.matches("<circle").count(), 1, "B's single point is a dot");
        assert!(svg.contains("TTFT p95 &lt;s&gt;") && svg.contains("v2 &amp; more"));
        assert!(svg.contains(COLOURS[0]) && svg.contains(COLOURS[1]));
    }

    #[test]
    fn empty_or_flat_data_still_draws_axes() {
        let empty = svg("x", &[], &[], "a", "b");
        assert!(empty.contains("<text") && !empty.contains("NaN"));
        let flat = svg("x", &[(0.0, 2.0), (5.0, 2.0)], &[], "a", "b");
        assert!(!flat.contains("NaN") && !flat.contains("inf"));
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(0.1234), "0.123");
        assert_eq!(tick(12.34), "12.3");
    }
}
