//! The report's charts, as SVG and PNG: IOPS against mean completion latency with stdev error
//! bars (one curve per run, one chart per workload and block size), and OSD CPU and memory over
//! the run. They are drawn from results.json, so `compare` can overlay runs of any age.

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const FONT: &str = "sans-serif";
const SIZE: (u32, u32) = (960, 600);

/// The font is compiled in: a report renders the same on a machine without fontconfig.
fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_err()
        {
            eprintln!("warning: the embedded chart font did not load; charts will lack text");
        }
    });
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}

/// A "Charts" markdown section showing `pngs` by paths relative to `dir`.
pub fn markdown_links(dir: &Path, pngs: &[PathBuf], note: &str) -> String {
    let mut s = format!("\n## Charts\n\n{note}\n\n");
    for p in pngs {
        let rel = p.strip_prefix(dir).unwrap_or(p).display().to_string();
        s.push_str(&format!("![{rel}]({rel})\n\n"));
    }
    s
}

/// One step of one run, as a chart point.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub depth: u64,
    pub iops: f64,
    pub mean_ms: f64,
    pub stdev_ms: f64,
}

/// A run's steps grouped by chart ("randread-4k" → points in step order).
pub fn curves(run: &Value) -> BTreeMap<String, Vec<Point>> {
    let mut out: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for r in run["rows"].as_array().into_iter().flatten() {
        let c = &r["carmine"];
        let num = |k: &str| c[k].as_f64().unwrap_or(0.0);
        let key = format!(
            "{}-{}k",
            r["workload"].as_str().unwrap_or("unknown"),
            r["bs"].as_u64().unwrap_or(0) >> 10
        );
        out.entry(key).or_default().push(Point {
            depth: r["depth"].as_u64().unwrap_or(0),
            iops: num("iops"),
            mean_ms: num("lat_mean_us") / 1000.0,
            stdev_ms: num("lat_stdev_us") / 1000.0,
        });
    }
    out
}

/// Draws the chart `$draw` (an expression of `$root`, generic over the backend) into
/// `$stem`.svg and `$stem`.png.
macro_rules! both_formats {
    ($stem:expr, |$root:ident| $draw:expr) => {{
        let stem: &Path = $stem;
        let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
        {
            let $root = SVGBackend::new(&svg, SIZE).into_drawing_area();
            $draw?;
            $root.present().map_err(err)?;
        }
        {
            let $root = BitMapBackend::new(&png, SIZE).into_drawing_area();
            $draw?;
            $root.present().map_err(err)?;
        }
        Ok::<PathBuf, anyhow::Error>(png)
    }};
}

/// One chart per workload and block size, with one curve per run. Returns the PNG paths.
pub fn latency_charts(dir: &Path, runs: &[(String, Value)]) -> Result<Vec<PathBuf>> {
    register_font();
    let per_run: Vec<(String, BTreeMap<String, Vec<Point>>)> = runs
        .iter()
        .map(|(label, v)| (label.clone(), curves(v)))
        .collect();
    let mut keys: Vec<&String> = per_run.iter().flat_map(|(_, c)| c.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut written = Vec::new();
    for key in keys {
        let lines: Vec<(&str, &[Point])> = per_run
            .iter()
            .filter_map(|(label, c)| c.get(key).map(|p| (label.as_str(), p.as_slice())))
            .collect();
        written.push(both_formats!(&dir.join(key), |root| latency_chart(
            &root, key, &lines
        ))?);
    }
    Ok(written)
}

/// IOPS (x) against mean completion latency (y), ± one stdev, each point labelled with its
/// queue depth: the seeds' chart.
fn latency_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    lines: &[(&str, &[Point])],
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let points = lines.iter().flat_map(|(_, p)| p.iter());
    let max_x = points.clone().map(|p| p.iops).fold(1.0, f64::max) * 1.1;
    let max_y = points.map(|p| p.mean_ms + p.stdev_ms).fold(0.001, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("{title}: IOPS vs mean completion latency (bars: ±1 stdev)"),
            (FONT, 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("IOPS")
        .y_desc("mean clat (ms)")
        .x_label_formatter(&|v| {
            if max_x >= 10_000.0 {
                format!("{:.0}K", v / 1000.0)
            } else {
                format!("{v:.0}")
            }
        })
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(err)?;
    for (i, (label, pts)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let style = ShapeStyle::from(color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.iops, p.mean_ms)),
                style,
            ))
            .map_err(err)?
            .label(label.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(pts.iter().map(|p| {
                ErrorBar::new_vertical(
                    p.iops,
                    (p.mean_ms - p.stdev_ms).max(0.0),
                    p.mean_ms,
                    p.mean_ms + p.stdev_ms,
                    color.filled(),
                    8,
                )
            }))
            .map_err(err)?;
        chart
            .draw_series(pts.iter().map(|p| {
                Text::new(
                    format!("qd{}", p.depth),
                    (p.iops, p.mean_ms),
                    (FONT, 12).into_font().color(&color),
                )
            }))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// One timeline sample as read back from results.json.
struct TimePoint {
    t: f64,
    step: Option<usize>,
    osd_cpu: f64,
    client_cpu: f64,
    busiest: f64,
    reactor_busy: f64,
    rss: f64,
}

fn timeline(run: &Value) -> Vec<TimePoint> {
    run["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let num = |k: &str| s[k].as_f64().unwrap_or(0.0);
            TimePoint {
                t: num("t"),
                step: s["step"].as_u64().map(|x| x as usize),
                osd_cpu: num("osd_cpu_pct"),
                client_cpu: num("client_cpu_pct"),
                busiest: num("busiest_thread_pct"),
                reactor_busy: num("reactor_busy_pct"),
                rss: num("osd_rss_mib"),
            }
        })
        .collect()
}

/// OSD CPU (all threads and the busiest one), client CPU and OSD RSS over the run, with the
/// workload changes marked. `None` when the run has no timeline (runs from before it existed).
pub fn usage_chart(dir: &Path, run: &Value) -> Result<Option<PathBuf>> {
    register_font();
    let samples = timeline(run);
    if samples.len() < 2 {
        return Ok(None);
    }
    let rows = run["rows"].as_array().cloned().unwrap_or_default();
    let workload_of = |step: usize| -> String {
        rows.get(step).map_or(String::new(), |r| {
            r["workload"].as_str().unwrap_or_default().to_string()
        })
    };
    // Where each workload begins on the run's clock.
    let mut marks: Vec<(f64, String)> = Vec::new();
    for s in &samples {
        if let Some(step) = s.step {
            let w = workload_of(step);
            if marks.last().is_none_or(|(_, last)| *last != w) {
                marks.push((s.t, w));
            }
        }
    }
    let png = both_formats!(&dir.join("osd-usage"), |root| usage_panels(
        &root, &samples, &marks
    ))?;
    Ok(Some(png))
}

type TimeChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One timeline panel: seconds on x from 0 to `max_t`, `y_desc` from 0 to `max_y`.
fn time_panel<'a, DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    x_desc: &str,
    y_desc: &str,
    max_t: f64,
    max_y: f64,
) -> Result<TimeChart<'a, DB>> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_t, 0.0..max_y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .draw()
        .map_err(err)?;
    Ok(chart)
}

fn usage_panels<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    samples: &[TimePoint],
    marks: &[(f64, String)],
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically(SIZE.1 * 3 / 5);
    let max_t = samples.last().map_or(1.0, |s| s.t).max(1.0);
    let max_cpu = samples
        .iter()
        .map(|s| s.osd_cpu.max(s.client_cpu))
        .fold(100.0, f64::max)
        * 1.1;
    let mut cpu = time_panel(
        &top,
        "CPU over the run (percent of one core)",
        "",
        "% of a core",
        max_t,
        max_cpu,
    )?;
    type Line = (&'static str, fn(&TimePoint) -> f64);
    let series: [Line; 4] = [
        ("OSD, all threads", |s| s.osd_cpu),
        ("OSD, busiest thread", |s| s.busiest),
        ("busiest reactor, busy by its own loop", |s| s.reactor_busy),
        ("client side (load generator or fio, gateway)", |s| {
            s.client_cpu
        }),
    ];
    for (i, (label, get)) in series.iter().enumerate() {
        // A line that is zero throughout (no perf socket: Ceph) would only clutter.
        if samples.iter().all(|s| get(s) == 0.0) {
            continue;
        }
        let style = ShapeStyle::from(Palette99::pick(i).to_rgba()).stroke_width(2);
        cpu.draw_series(LineSeries::new(
            samples.iter().map(|s| (s.t, get(s))),
            style,
        ))
        .map_err(err)?
        .label(*label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    for (t, name) in marks {
        cpu.draw_series(std::iter::once(PathElement::new(
            vec![(*t, 0.0), (*t, max_cpu)],
            BLACK.mix(0.3),
        )))
        .map_err(err)?;
        cpu.draw_series(std::iter::once(Text::new(
            name.clone(),
            (*t, max_cpu * 0.97),
            (FONT, 12),
        )))
        .map_err(err)?;
    }
    cpu.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    let max_rss = samples.iter().map(|s| s.rss).fold(1.0, f64::max) * 1.2;
    let mut mem = time_panel(
        &bottom,
        "OSD resident memory (MiB)",
        "seconds since the sweep started",
        "MiB",
        max_t,
        max_rss,
    )?;
    mem.draw_series(LineSeries::new(
        samples.iter().map(|s| (s.t, s.rss)),
        ShapeStyle::from(Palette99::pick(4).to_rgba()).stroke_width(2),
    ))
    .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> Value {
        serde_json::json!({
            "rows": [
                {"workload": "randread", "bs": 4096, "depth": 1,
                 "carmine": {"iops": 10000.0, "lat_mean_us": 95.0, "lat_stdev_us": 10.0}},
                {"workload": "randread", "bs": 4096, "depth": 16,
                 "carmine": {"iops": 80000.0, "lat_mean_us": 190.0, "lat_stdev_us": 40.0}},
                {"workload": "seqwrite", "bs": 65536, "depth": 1,
                 "carmine": {"iops": 3000.0, "lat_mean_us": 320.0, "lat_stdev_us": 30.0}}
            ],
            "timeline": [
                {"t": 0.5, "step": 0, "osd_cpu_pct": 40.0, "osd_rss_mib": 100.0, "client_cpu_pct": 60.0, "busiest_thread_pct": 35.0},
                {"t": 1.0, "step": 1, "osd_cpu_pct": 90.0, "osd_rss_mib": 101.0, "client_cpu_pct": 95.0, "busiest_thread_pct": 85.0},
                {"t": 1.5, "step": 2, "osd_cpu_pct": 70.0, "osd_rss_mib": 130.0, "client_cpu_pct": 50.0, "busiest_thread_pct": 65.0}
            ]
        })
    }

    #[test]
    fn rows_group_into_one_curve_per_workload_and_size() {
        let c = curves(&run());
        assert_eq!(
            c.keys().collect::<Vec<_>>(),
            ["randread-4k", "seqwrite-64k"]
        );
        assert_eq!(
            c["randread-4k"][1],
            Point {
                depth: 16,
                iops: 80000.0,
                mean_ms: 0.19,
                stdev_ms: 0.04
            }
        );
    }

    #[test]
    fn charts_are_written_as_svg_and_png() {
        let dir = std::env::temp_dir().join(format!("carmine-charts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pngs = latency_charts(&dir, &[("a".into(), run()), ("b".into(), run())]).unwrap();
        assert_eq!(pngs.len(), 2);
        for png in &pngs {
            let bytes = std::fs::read(png).unwrap();
            assert_eq!(&bytes[1..4], b"PNG");
            let svg = std::fs::read_to_string(png.with_extension("svg")).unwrap();
            assert!(
                svg.contains("qd16") || svg.contains("qd1"),
                "point labels drawn"
            );
        }
        let svg = std::fs::read_to_string(dir.join("randread-4k.svg")).unwrap();
        let texts: Vec<&str> = svg.lines().map(str::trim).collect();
        assert!(
            texts.contains(&"a") && texts.contains(&"b"),
            "one legend entry per run"
        );
        let usage = usage_chart(&dir, &run()).unwrap().unwrap();
        assert!(std::fs::read(&usage).unwrap().len() > 1000);
        let svg = std::fs::read_to_string(usage.with_extension("svg")).unwrap();
        assert!(svg.contains("seqwrite"), "workload changes are marked");
        assert!(usage_chart(&dir, &serde_json::json!({"rows": []}))
            .unwrap()
            .is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
