//! Charts rendered by plotters to SVG strings from plain data: the fleet's TTFT p95 chart and
//! the replica detail's history charts (with policy-change markers).
//!
//! The fleet view sets the result as the inner HTML of its chart container. Rendering to a
//! string (rather than drawing onto a canvas) keeps this a pure function that host tests can
//! check, and lets the SVG scale with the page through its `viewBox`.

use fleetdeck_api::Series;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::format;

/// Drawing size in SVG user units; the SVG scales to its container's width in CSS.
pub const WIDTH: u32 = 1200;
/// See [`WIDTH`].
pub const HEIGHT: u32 = 300;

/// Width of the legend column at the right of the plot.
const LEGEND_WIDTH: u32 = 210;
/// Longest legend label, in characters, that fits [`LEGEND_WIDTH`].
const LEGEND_MAX_CHARS: usize = 24;

/// What the chart container shows before any replica has a TTFT point in the window.
pub const EMPTY_TEXT: &str = "waiting for the first scrapes…";

/// Line colours, one per series in snapshot order (Tableau 10: distinguishable, colour-blind
/// friendlier than the plotters defaults). The table uses the same colours for its swatches.
pub const PALETTE: [(u8, u8, u8); 10] = [
    (0x4e, 0x79, 0xa7),
    (0xf2, 0x8e, 0x2b),
    (0xe1, 0x57, 0x59),
    (0x59, 0xa1, 0x4f),
    (0x76, 0xb7, 0xb2),
    (0xb0, 0x7a, 0xa1),
    (0xed, 0xc9, 0x48),
    (0xff, 0x9d, 0xa7),
    (0x9c, 0x75, 0x5f),
    (0xba, 0xb0, 0xac),
];

/// The CSS colour of the `i`-th series.
pub fn css_colour(i: usize) -> String {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    format!("#{r:02x}{g:02x}{b:02x}")
}

fn colour(i: usize) -> RGBColor {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b)
}

/// The series' points inside the window, as (seconds relative to `now_ms`, value).
fn relative_points(series: &Series, now_ms: i64, window_s: u32) -> Vec<(f64, f64)> {
    let window = f64::from(window_s);
    series
        .points
        .iter()
        .map(|&(t, v)| ((t - now_ms) as f64 / 1000.0, v))
        .filter(|&(x, v)| x >= -window && x <= 0.0 && v.is_finite())
        .collect()
}

/// The chart container's inner HTML: the SVG chart, or the empty-state note when there is
/// nothing to draw yet (or, should plotters fail, the reason, so the failure is visible).
pub fn chart_html(series: &[Series], now_ms: i64, window_s: u32) -> String {
    let empty = series.iter().all(|s| relative_points(s, now_ms, window_s).is_empty());
    if empty {
        return format!(r#"<div class="chart-empty">{EMPTY_TEXT}</div>"#);
    }
    match render_svg(series, now_ms, window_s) {
        Ok(svg) => svg,
        Err(e) => format!(r#"<div class="chart-empty">chart unavailable: {}</div>"#, escape(&e)),
    }
}

/// Minimal HTML escaping for text we put into inner HTML ourselves.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A legend label short enough for the legend column (the table has the full URL).
fn legend_label(label: &str) -> String {
    if label.chars().count() <= LEGEND_MAX_CHARS {
        label.to_owned()
    } else {
        let head: String = label.chars().take(LEGEND_MAX_CHARS - 1).collect();
        format!("{head}…")
    }
}

/// The plot both kinds of chart draw on: x in seconds relative to now, y from 0.
type Plot<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The grid, axes and tick labels of a chart; every chart shares their look.
struct Axes<'f> {
    x_labels: usize,
    y_labels: usize,
    x_tick: &'f dyn Fn(&f64) -> String,
    y_tick: &'f dyn Fn(&f64) -> String,
    /// Axis descriptions (x, y), for a chart that stands alone.
    descriptions: Option<(&'static str, &'static str)>,
    /// Requested font size (plotters' SVG backend writes it divided by 1.24).
    font_size: u32,
}

fn draw_axes(plot: &mut Plot<'_, '_>, axes: Axes<'_>) -> Result<(), String> {
    let label_font = ("sans-serif", axes.font_size).into_font().color(&RGBColor(0x5f, 0x63, 0x68));
    let mut mesh = plot.configure_mesh();
    mesh.bold_line_style(RGBColor(0xe3, 0xe5, 0xe8))
        .light_line_style(RGBColor(0xf3, 0xf4, 0xf6))
        .axis_style(RGBColor(0xc4, 0xc7, 0xcc))
        .x_labels(axes.x_labels)
        .y_labels(axes.y_labels)
        .x_label_formatter(axes.x_tick)
        .y_label_formatter(axes.y_tick)
        .label_style(label_font.clone());
    if let Some((x, y)) = axes.descriptions {
        mesh.x_desc(x).y_desc(y).axis_desc_style(label_font);
    }
    mesh.draw().map_err(|e| e.to_string())
}

/// Draws the `index`-th line in its palette colour (with a dot when it is a lone point, which draws no
/// segment) and returns that colour for the legend.
fn draw_line(plot: &mut Plot<'_, '_>, index: usize, points: &[(f64, f64)]) -> Result<RGBColor, String> {
    let colour = colour(index);
    let point_size = if points.len() < 2 { 3 } else { 0 };
    plot.draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)).point_size(point_size))
        .map_err(|e| e.to_string())?;
    Ok(colour)
}

/// TTFT p95 over the last `window_s` seconds, one line per series, x in seconds relative to
/// `now_ms`, y in seconds.
pub fn render_svg(series: &[Series], now_ms: i64, window_s: u32) -> Result<String, String> {
    let lines: Vec<(&str, Vec<(f64, f64)>)> =
        series.iter().map(|s| (format::short_url(&s.url), relative_points(s, now_ms, window_s))).collect();
    let max_y = lines.iter().flat_map(|(_, pts)| pts.iter().map(|p| p.1)).fold(0.0_f64, f64::max);
    // Headroom above the highest point so the line never runs along the frame, and a floor so a
    // fleet idling at a few milliseconds does not look like a wall of noise.
    let y_top = (max_y * 1.15).max(0.05);
    let x_left = -f64::from(window_s);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        // The legend gets its own column right of the plot: inside the plot it would hide lines.
        let (plot_area, legend_area) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot_area)
            .margin_top(14)
            .margin_right(16)
            .margin_left(8)
            .margin_bottom(6)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x_left..0.0, 0.0..y_top)
            .map_err(|e| e.to_string())?;
        draw_axes(
            &mut chart,
            Axes {
                x_labels: 11,
                y_labels: 6,
                x_tick: &|x| if *x == 0.0 { "now".to_owned() } else { format!("{x:.0} s") },
                y_tick: &|y| format::axis_seconds(*y),
                descriptions: Some(("time relative to now", "TTFT p95")),
                // ~13px text.
                font_size: 16,
            },
        )?;

        let legend_font = ("sans-serif", 16).into_font().color(&RGBColor(0x20, 0x24, 0x28));
        for (i, (label, pts)) in lines.into_iter().enumerate() {
            let c = draw_line(&mut chart, i, &pts)?;
            let y = 22 + 24 * i as i32;
            legend_area
                .draw(&PathElement::new(vec![(4, y), (22, y)], c.stroke_width(3)))
                .map_err(|e| e.to_string())?;
            legend_area
                .draw(&Text::new(legend_label(label), (30, y - 8), legend_font.clone()))
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// What a history chart's y axis measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YUnit {
    Seconds,
    /// 0..=1, drawn as a percentage on a fixed 0..100% axis.
    Ratio,
    Count,
    PerSecond,
}

impl YUnit {
    fn tick(self, v: f64) -> String {
        match self {
            YUnit::Seconds => format::axis_seconds(v),
            YUnit::Ratio => format!("{:.0}%", v * 100.0),
            YUnit::Count | YUnit::PerSecond => {
                if v.abs() >= 10_000.0 {
                    format!("{:.0}k", v / 1000.0)
                } else if v.abs() >= 10.0 || v == v.round() {
                    format!("{v:.0}")
                } else {
                    format!("{v:.1}")
                }
            }
        }
    }
}

/// One line of a history chart.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    pub label: &'a str,
    pub points: &'a [(i64, f64)],
}

/// Size of a history chart (several share a row of the replica view).
pub const HISTORY_WIDTH: u32 = 640;
/// See [`HISTORY_WIDTH`].
pub const HISTORY_HEIGHT: u32 = 240;

/// The x-axis tick for `x` seconds before now, in the unit that suits a window of `window_s`.
pub fn relative_tick(x: f64, window_s: u32) -> String {
    if x >= 0.0 {
        "now".to_owned()
    } else if window_s <= 900 {
        format!("{x:.0} s")
    } else if window_s <= 3 * 3600 {
        format!("{:.0} min", x / 60.0)
    } else if window_s <= 3 * 86_400 {
        format!("{:.0} h", x / 3600.0)
    } else {
        format!("{:.0} d", x / 86_400.0)
    }
}

/// A history chart's inner HTML: lines over the window, a dashed vertical marker with its label
/// at each policy change, or the empty-state note when there are no points.
pub fn history_chart_html(
    unit: YUnit,
    lines: &[Line<'_>],
    markers: &[(i64, String)],
    now_ms: i64,
    window_s: u32,
) -> String {
    let window = f64::from(window_s);
    let relative: Vec<(&str, Vec<(f64, f64)>)> = lines
        .iter()
        .map(|l| {
            let pts = l
                .points
                .iter()
                .map(|&(t, v)| ((t - now_ms) as f64 / 1000.0, v))
                .filter(|&(x, v)| x >= -window && x <= 0.0 && v.is_finite())
                .collect();
            (l.label, pts)
        })
        .collect();
    if relative.iter().all(|(_, pts)| pts.is_empty()) {
        return format!(r#"<div class="chart-empty">{}</div>"#, HISTORY_EMPTY_TEXT);
    }
    match render_history(unit, &relative, markers, now_ms, window_s) {
        Ok(svg) => svg,
        Err(e) => format!(r#"<div class="chart-empty">chart unavailable: {}</div>"#, escape(&e)),
    }
}

/// What a history chart shows with nothing to draw.
pub const HISTORY_EMPTY_TEXT: &str = "no samples in this window yet";

fn render_history(
    unit: YUnit,
    lines: &[(&str, Vec<(f64, f64)>)],
    markers: &[(i64, String)],
    now_ms: i64,
    window_s: u32,
) -> Result<String, String> {
    let max_y = lines.iter().flat_map(|(_, pts)| pts.iter().map(|p| p.1)).fold(0.0_f64, f64::max);
    let y_top = match unit {
        YUnit::Ratio => 1.0,
        YUnit::Seconds => (max_y * 1.15).max(0.05),
        YUnit::Count | YUnit::PerSecond => (max_y * 1.15).max(1.0),
    };
    let x_left = -f64::from(window_s);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (HISTORY_WIDTH, HISTORY_HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .margin_top(22)
            .margin_right(14)
            .margin_left(6)
            .margin_bottom(4)
            .x_label_area_size(28)
            .y_label_area_size(56)
            .build_cartesian_2d(x_left..0.0, 0.0..y_top)
            .map_err(|e| e.to_string())?;
        draw_axes(
            &mut chart,
            Axes {
                x_labels: 7,
                y_labels: 5,
                x_tick: &|x| relative_tick(*x, window_s),
                y_tick: &|y| unit.tick(*y),
                descriptions: None,
                font_size: 15,
            },
        )?;
        // Markers first, so the lines stay on top of them.
        let marker_colour = RGBColor(0x8e, 0x44, 0xad);
        for (ts, label) in markers {
            let x = (*ts - now_ms) as f64 / 1000.0;
            if x < x_left || x > 0.0 {
                continue;
            }
            let mut y = 0.0;
            let step = y_top / 24.0;
            while y < y_top {
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(x, y), (x, (y + step).min(y_top))],
                        marker_colour.stroke_width(2),
                    )))
                    .map_err(|e| e.to_string())?;
                y += 2.0 * step;
            }
            chart
                .draw_series(std::iter::once(Text::new(
                    legend_label(label),
                    (x, y_top),
                    ("sans-serif", 13).into_font().color(&marker_colour),
                )))
                .map_err(|e| e.to_string())?;
        }
        let legend_font = ("sans-serif", 15).into_font().color(&RGBColor(0x20, 0x24, 0x28));
        for (i, (label, pts)) in lines.iter().enumerate() {
            let c = draw_line(&mut chart, i, pts)?;
            let x = 70 + 150 * i as i32;
            root.draw(&PathElement::new(vec![(x, 10), (x + 16, 10)], c.stroke_width(3)))
                .map_err(|e| e.to_string())?;
            root.draw(&Text::new(label.to_string(), (x + 22, 2), legend_font.clone()))
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(url: &str, points: &[(i64, f64)]) -> Series {
        Series { url: url.to_owned(), points: points.to_vec() }
    }

    #[test]
    fn no_points_is_the_empty_state() {
        assert!(chart_html(&[], 1_000_000, 300).contains(EMPTY_TEXT));
        let s = [series("http://a:1/metrics", &[])];
        assert!(chart_html(&s, 1_000_000, 300).contains(EMPTY_TEXT));
        // Points older than the window do not count either.
        let old = [series("http://a:1/metrics", &[(0, 0.2)])];
        assert!(chart_html(&old, 1_000_000, 300).contains(EMPTY_TEXT));
    }

    #[test]
    fn renders_one_line_per_series_with_a_legend() {
        let now = 10_000_000;
        let s = [
            series("http://a:1/metrics", &[(now - 60_000, 0.2), (now - 30_000, 0.25), (now, 0.3)]),
            series("http://b:2/metrics", &[(now - 60_000, 1.2), (now, 1.4)]),
        ];
        let html = chart_html(&s, now, 300);
        assert!(html.starts_with("<svg"), "{html}");
        assert!(html.contains("a:1") && html.contains("b:2"), "legend names each replica");
        // plotters writes colours as upper-case hex; each series is a 2px line in its colour.
        for i in 0..2 {
            let stroke = format!(r#"stroke="{}" stroke-width="2""#, css_colour(i).to_uppercase());
            assert_eq!(html.matches(&stroke).count(), 1, "one line for series {i}");
        }
        assert!(html.contains("TTFT p95"));
        assert!(html.contains("now"));
    }

    #[test]
    fn relative_points_clip_to_the_window() {
        let s = series("u", &[(0, 1.0), (700_000, 2.0), (1_000_000, 3.0), (1_000_500, 4.0)]);
        assert_eq!(relative_points(&s, 1_000_000, 300), vec![(-300.0, 2.0), (0.0, 3.0)]);
    }

    #[test]
    fn long_legend_labels_are_cut() {
        assert_eq!(legend_label("a:1"), "a:1");
        let long = "very-long-hostname.example.internal:8000";
        let cut = legend_label(long);
        assert_eq!(cut.chars().count(), LEGEND_MAX_CHARS);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn history_charts_draw_lines_and_policy_markers() {
        let now = 10_000_000;
        let p50 = [(now - 50_000, 0.1), (now - 10_000, 0.2)];
        let p95 = [(now - 50_000, 0.3), (now, 0.5)];
        let lines = [Line { label: "p50", points: &p50 }, Line { label: "p95", points: &p95 }];
        let markers = [(now - 30_000, "cache_aware v2".to_owned()), (now - 900_000, "too old".to_owned())];
        let html = history_chart_html(YUnit::Seconds, &lines, &markers, now, 300);
        assert!(html.starts_with("<svg"), "{html}");
        assert!(html.contains("p50") && html.contains("p95"));
        assert!(html.contains("cache_aware v2"), "the marker is labelled");
        assert!(!html.contains("too old"), "markers outside the window are left out");
        for i in 0..2 {
            let stroke = format!(r#"stroke="{}" stroke-width="2""#, css_colour(i).to_uppercase());
            assert_eq!(html.matches(&stroke).count(), 1, "one line for series {i}");
        }
        let empty = history_chart_html(YUnit::Ratio, &[Line { label: "x", points: &[] }], &[], now, 300);
        assert!(empty.contains(HISTORY_EMPTY_TEXT));
    }

    #[test]
    fn ticks_pick_units_by_window() {
        assert_eq!(relative_tick(0.0, 300), "now");
        assert_eq!(relative_tick(-60.0, 300), "-60 s");
        assert_eq!(relative_tick(-1800.0, 3600), "-30 min");
        assert_eq!(relative_tick(-7200.0, 86_400), "-2 h");
        assert_eq!(relative_tick(-172_800.0, 7 * 86_400), "-2 d");
        assert_eq!(YUnit::Ratio.tick(0.5), "50%");
        assert_eq!(YUnit::PerSecond.tick(25_000.0), "25k");
        assert_eq!(YUnit::Count.tick(2.5), "2.5");
    }

    #[test]
    fn css_colours_wrap() {
        assert_eq!(css_colour(0), "#4e79a7");
        assert_eq!(css_colour(10), css_colour(0));
    }
}
