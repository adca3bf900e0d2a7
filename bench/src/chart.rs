//! The chart: latency distributions (cumulative, log time axis) of the uncontended cycle next
//! to the PING round trip, and of the handoff. SVG only, no fonts needed.

use std::path::Path;

use plotters::prelude::*;

use crate::libs::{Lib, PerLib};
use crate::stats::Samples;

fn color(lib: Lib) -> RGBColor {
    match lib {
        Lib::Runtime => RGBColor(31, 119, 180),
        Lib::Rslock => RGBColor(214, 39, 40),
        Lib::Arl => RGBColor(44, 160, 44),
    }
}

struct Curve {
    name: String,
    color: RGBColor,
    dashed: bool,
    /// Sorted microseconds.
    values: Vec<f64>,
}

pub fn render(
    path: &Path,
    rtt: &PerLib<Samples>,
    cycle: &PerLib<Samples>,
    handoff: &PerLib<Samples>,
    cold_rtt: &Samples,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1200, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);

    let mut cycles: Vec<Curve> = Lib::ALL
        .iter()
        .map(|&lib| Curve {
            name: format!("{} acquire+release", lib.name()),
            color: color(lib),
            dashed: false,
            values: cycle.get(lib).micros(),
        })
        .collect();
    let ping = rtt.get(Lib::Runtime).micros();
    cycles.push(Curve {
        name: "PING round trip (MultiplexedConnection)".to_owned(),
        color: RGBColor(150, 150, 150),
        dashed: true,
        values: ping.clone(),
    });
    cycles.push(Curve {
        name: "2 × PING: the floor of two round trips".to_owned(),
        color: RGBColor(60, 60, 60),
        dashed: true,
        values: ping.iter().map(|us| 2.0 * us).collect(),
    });
    panel(&left, "Uncontended acquire + release, one key", cycles)?;

    let mut handoffs: Vec<Curve> = Lib::ALL
        .iter()
        .map(|&lib| Curve {
            name: format!("{} ({} samples)", lib.name(), handoff.get(lib).len()),
            color: color(lib),
            dashed: false,
            values: handoff.get(lib).micros(),
        })
        .collect();
    handoffs.push(Curve {
        name: "3 × PING (target), PING back to back".to_owned(),
        color: RGBColor(60, 60, 60),
        dashed: true,
        values: ping.iter().map(|us| 3.0 * us).collect(),
    });
    handoffs.push(Curve {
        name: "PING after the same idle time (cold)".to_owned(),
        color: RGBColor(150, 150, 150),
        dashed: true,
        values: cold_rtt.micros(),
    });
    panel(
        &right,
        "Handoff: holder starts release -> waiter holds",
        handoffs,
    )?;
    root.present()?;
    Ok(())
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    curves: Vec<Curve>,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let lo = curves
        .iter()
        .filter_map(|c| c.values.first())
        .fold(f64::MAX, |a, &b| a.min(b));
    let hi = curves
        .iter()
        .filter_map(|c| c.values.last())
        .fold(0.0f64, |a, &b| a.max(b));
    let (lo, hi) = (lo * 0.8, hi * 1.25);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(52)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0f64..1.0)?;
    chart
        .configure_mesh()
        .x_desc("latency (log scale)")
        .y_desc("fraction of samples at or below")
        .x_label_formatter(&|us| label(*us))
        .y_label_formatter(&|f| format!("{f:.1}"))
        .draw()?;
    for curve in curves {
        let points = cdf(&curve.values);
        let style = curve.color.stroke_width(2);
        let series: Vec<(f64, f64)> = points;
        let drawn = if curve.dashed {
            chart.draw_series(DashedLineSeries::new(series, 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(series, style))?
        };
        let legend_color = curve.color;
        drawn.label(curve.name).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], legend_color.stroke_width(2))
        });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

/// At most ~400 points of the empirical distribution: (value, fraction at or below it).
fn cdf(values: &[f64]) -> Vec<(f64, f64)> {
    let n = values.len();
    if n == 0 {
        return Vec::new();
    }
    let step = (n / 400).max(1);
    let mut points: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (values[i], (i + 1) as f64 / n as f64))
        .collect();
    if points.last().is_some_and(|p| p.1 < 1.0) {
        points.push((values[n - 1], 1.0));
    }
    points
}

fn label(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.0} ms", us / 1e3)
    } else {
        format!("{:.1} s", us / 1e6)
    }
}
