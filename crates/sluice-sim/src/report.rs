//! The report: a self-contained HTML page (inline SVG, no script, no external file) with one plot
//! per lane and a summary table, and the decisions as CSV.

use std::fmt::Write as _;
use std::time::Duration;

use plotters::prelude::*;

use crate::run::{LaneRun, Outcome};

use crate::trace::Trace;

/// Points along the time axis of a plot.
const BUCKETS: usize = 200;

/// What the report is about, for its title.
#[derive(Debug, Clone)]
pub struct About {
    /// The traffic: a pattern's name or a file's.
    pub traffic: String,
    /// What the traffic is, in a sentence: a pattern's description; empty for a file.
    pub described: String,
    /// The nominal window, for "largest admitted in any window".
    pub window: Duration,
}

/// The summary table, one row per lane, in the same columns in the terminal and in the report:
/// lane, admitted, refused, the most admitted in any window, the limit, that most as a multiple
/// of the limit, the limit as the rule reads (which says why a queue's limit is one more than
/// its rate: the request released plus those waiting), and the longest queue wait.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The column names.
    pub header: Vec<String>,
    /// One row per lane, each with a cell per column.
    pub rows: Vec<Vec<String>>,
    /// Per row, whether more than the limit got through within a window.
    pub over: Vec<bool>,
}

/// The summary of `runs`, their peaks measured over `window`.
pub fn summary(runs: &[LaneRun], window: Duration) -> Summary {
    let header = [
        "lane".to_owned(),
        "admitted".to_owned(),
        "refused".to_owned(),
        format!("largest in any {window:?}"),
        "limit".to_owned(),
        "× limit".to_owned(),
        "policy".to_owned(),
        "longest queue wait".to_owned(),
    ];
    let (mut rows, mut over) = (Vec::new(), Vec::new());
    for run in runs {
        let limit = run.lane.policy.limit();
        let peak = run.peak_within(window);
        over.push(peak > limit);
        rows.push(vec![
            run.lane.name.clone(),
            run.admitted().to_string(),
            run.rejected().to_string(),
            peak.to_string(),
            limit.to_string(),
            format!("{:.2}×", peak as f64 / limit.max(1) as f64),
            run.lane.policy.to_string(),
            format!("{:.3} s", run.max_delay().as_secs_f64()),
        ]);
    }
    Summary {
        header: header.into(),
        rows,
        over,
    }
}

impl Summary {
    /// The table in Markdown, as the terminal shows it.
    pub fn markdown(&self) -> String {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let mut out = line(&self.header);
        let align: Vec<String> = (0..self.header.len())
            .map(|i| if self.is_text(i) { "---" } else { "---:" }.to_owned())
            .collect();
        out.push_str(&line(&align));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }

    /// The table in HTML; the most admitted and its multiple in red where over the limit.
    fn html(&self) -> String {
        let mut out = String::from("<table>\n<tr>");
        for h in &self.header {
            let _ = write!(out, "<th>{}</th>", escape(h));
        }
        out.push_str("</tr>\n");
        for (row, &over) in self.rows.iter().zip(&self.over) {
            out.push_str("<tr>");
            for (i, cell) in row.iter().enumerate() {
                // The lane, the first cell, is set left by the page's style.
                let class = match (i > 0 && self.is_text(i), over && (i == 3 || i == 5)) {
                    (_, true) => " class=\"over\"",
                    (true, false) => " class=\"text\"",
                    (false, false) => "",
                };
                let _ = write!(out, "<td{class}>{}</td>", escape(cell));
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n");
        out
    }

    /// Whether column `i` is words (the lane and the policy) rather than a number.
    fn is_text(&self, i: usize) -> bool {
        i == 0 || i == 6
    }
}

/// The HTML report of `runs` over `trace`.
pub fn html(trace: &Trace, runs: &[LaneRun], about: &About) -> Result<String, ReportError> {
    let span = trace.end();
    let busiest = trace.busiest_key();
    let mut out = String::new();
    let title = format!("Sluice simulation: {}", escape(&about.traffic));
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{title}</title>\n<style>\n\
         body {{ font-family: sans-serif; margin: 2em auto; max-width: 960px; color: #222; }}\n\
         table {{ border-collapse: collapse; margin: 1em 0; }}\n\
         td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}\n\
         td:first-child, th:first-child, td.text {{ text-align: left; }}\n\
         .over {{ color: #b00; font-weight: bold; }}\n\
         figure {{ margin: 1.5em 0; }}\n</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
    );
    if !about.described.is_empty() {
        let _ = writeln!(
            out,
            "<p>{}: {}.</p>",
            escape(&about.traffic),
            escape(&about.described)
        );
    }
    let _ = writeln!(
        out,
        "<p>{} requests over {} key(s) in {:.1} s, each decided by the real algorithm in a memory \
         store on a simulated clock. The state plots follow the busiest key, <code>{}</code>. \
         \"Largest in any {:?}\" is the most units admitted for one key within any stretch of \
         that long: above the limit, a burst got through. The limit is the most a lane admits \
         at once; its policy says how it refills.</p>",
        trace.arrivals.len(),
        trace.keys.len(),
        span.as_secs_f64(),
        escape(trace.keys.get(busiest as usize).map_or("", String::as_str)),
        about.window,
    );
    out.push_str(&summary(runs, about.window).html());
    for run in runs {
        let _ = write!(
            out,
            "<figure>\n<figcaption><strong>{}</strong> ({})</figcaption>\n{}\n</figure>\n",
            escape(&run.lane.name),
            run.lane.policy.algorithm().name(),
            plot(run, span, busiest)?
        );
    }
    out.push_str("</body>\n</html>\n");
    Ok(out)
}

/// The decisions as CSV: `lane,seconds,key,cost,allowed,used,remaining,delay_seconds`.
pub fn csv(trace: &Trace, runs: &[LaneRun]) -> String {
    let mut out = String::from("lane,seconds,key,cost,allowed,used,remaining,delay_seconds\n");
    for run in runs {
        for o in &run.outcomes {
            let _ = writeln!(
                out,
                "{},{:.6},{},{},{},{},{},{:.6}",
                csv_field(&run.lane.name),
                o.at.as_secs_f64(),
                csv_field(&trace.keys[o.key as usize]),
                o.cost,
                o.decision.allowed,
                o.used(),
                o.decision.remaining,
                o.decision.delay.as_secs_f64(),
            );
        }
    }
    out
}

/// A plot could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw the plot of {lane}: {message}")]
pub struct ReportError {
    pub(crate) lane: String,
    pub(crate) message: String,
}

/// One lane's SVG: admitted and refused over time, then the busiest key's state, then (for a
/// lane that queued) the queue wait.
fn plot(run: &LaneRun, span: Duration, busiest: u32) -> Result<String, ReportError> {
    let fail = |e: &dyn std::fmt::Display| ReportError {
        lane: run.lane.name.clone(),
        message: e.to_string(),
    };
    let span_s = span.as_secs_f64();
    let width = span_s / BUCKETS as f64;
    let mut admitted = vec![0u64; BUCKETS + 1];
    let mut refused = vec![0u64; BUCKETS + 1];
    // Every request lies before the axis's end, so no bucket piles up at its edge.
    for o in &run.outcomes {
        let i = ((o.at.as_secs_f64() / width) as usize).min(BUCKETS);
        if o.decision.allowed {
            admitted[i] += 1;
        } else {
            refused[i] += 1;
        }
    }
    let key: Vec<&Outcome> = run.outcomes.iter().filter(|o| o.key == busiest).collect();
    // The busiest key's state after each of its requests and at each sample between them, so
    // that a bucket refilling or a window sliding shows while the key is quiet.
    let mut state_points: Vec<(f64, f64)> = key
        .iter()
        .map(|o| (o.at.as_secs_f64(), o.used() as f64))
        .chain(
            run.samples
                .iter()
                .map(|(at, d)| (at.as_secs_f64(), d.limit.saturating_sub(d.remaining) as f64)),
        )
        .collect();
    state_points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let queued = run.max_delay() > Duration::ZERO;
    let panels = if queued { 3 } else { 2 };
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (900, 220 * panels as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let areas = root.split_evenly((panels, 1));
        let top = *admitted.iter().chain(&refused).max().unwrap_or(&1) as f64;
        // The legend is in the caption: drawn inside the plot, it covered the last burst. The
        // right margin holds the time axis's last label.
        let mut chart = ChartBuilder::on(&areas[0])
            .caption(
                format!("requests per {width:.2} s: admitted (green), refused (red)"),
                ("sans-serif", 15),
            )
            .margin(8)
            .margin_right(24)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..span_s, 0f64..top.max(1.0) * 1.1)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("requests")
            .draw()
            .map_err(|e| fail(&e))?;
        let series = |counts: &[u64]| -> Vec<(f64, f64)> {
            counts
                .iter()
                .enumerate()
                .map(|(i, &n)| (i as f64 * width, n as f64))
                .collect()
        };
        let green = RGBColor(0x1b, 0x9e, 0x4b);
        let red = RGBColor(0xc0, 0x39, 0x2b);
        chart
            .draw_series(LineSeries::new(series(&admitted), green.stroke_width(2)))
            .map_err(|e| fail(&e))?;
        chart
            .draw_series(LineSeries::new(series(&refused), red.stroke_width(2)))
            .map_err(|e| fail(&e))?;

        let limit = run.lane.policy.limit() as f64;
        let mut state = ChartBuilder::on(&areas[1])
            .caption("busiest key: units of the limit in use", ("sans-serif", 15))
            .margin(8)
            .margin_right(24)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..span_s, 0f64..limit.max(1.0) * 1.1)
            .map_err(|e| fail(&e))?;
        state
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("in use")
            .draw()
            .map_err(|e| fail(&e))?;
        let blue = RGBColor(0x2c, 0x6f, 0xbb);
        state
            .draw_series(LineSeries::new(state_points, blue.stroke_width(1)))
            .map_err(|e| fail(&e))?;
        state
            .draw_series(LineSeries::new(
                [(0.0, limit), (span_s, limit)],
                BLACK.mix(0.4).stroke_width(1),
            ))
            .map_err(|e| fail(&e))?;

        if queued {
            let waits: Vec<(f64, f64)> = key
                .iter()
                .filter(|o| o.decision.allowed)
                .map(|o| (o.at.as_secs_f64(), o.decision.delay.as_secs_f64()))
                .collect();
            let most = run.max_delay().as_secs_f64();
            let mut wait = ChartBuilder::on(&areas[2])
                .caption(
                    "busiest key: queue wait of each admitted request",
                    ("sans-serif", 15),
                )
                .margin(8)
                .margin_right(24)
                .x_label_area_size(30)
                .y_label_area_size(50)
                .build_cartesian_2d(0f64..span_s, 0f64..most * 1.1)
                .map_err(|e| fail(&e))?;
            wait.configure_mesh()
                .x_desc("seconds")
                .y_desc("wait (s)")
                .draw()
                .map_err(|e| fail(&e))?;
            wait.draw_series(
                waits
                    .into_iter()
                    .map(|p| Circle::new(p, 2, RGBColor(0x8e, 0x44, 0xad).filled())),
            )
            .map_err(|e| fail(&e))?;
        }
        root.present().map_err(|e| fail(&e))?;
    }
    Ok(svg)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{compare_lanes, simulate};
    use crate::trace::{Pattern, Shape, generate};

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn the_page_has_one_svg_per_lane_and_marks_the_fixed_windows_burst() {
        let trace = generate(Pattern::Boundary, &Shape::around(5, MINUTE));
        let runs = simulate(&trace, &compare_lanes(5, MINUTE).unwrap());
        let page = html(
            &trace,
            &runs,
            &About {
                traffic: "boundary <test>".into(),
                described: Pattern::Boundary.description().into(),
                window: MINUTE,
            },
        )
        .unwrap();
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.trim_end().ends_with("</html>"));
        assert_eq!(page.matches("<svg").count(), 7);
        assert_eq!(page.matches("</svg>").count(), 7);
        assert!(page.contains("boundary &lt;test&gt;"));
        assert!(!page.contains("<script"), "the report runs no script");
        let fixed_row = page
            .lines()
            .find(|l| l.starts_with("<tr><td>fixed_window"))
            .unwrap();
        assert!(
            fixed_row.contains("<td class=\"over\">10</td><td>5</td><td class=\"over\">2.00×</td>"),
            "{fixed_row}"
        );
        let log_row = page
            .lines()
            .find(|l| l.starts_with("<tr><td>sliding_log"))
            .unwrap();
        assert!(
            log_row.contains("<td>5</td><td>5</td><td>1.00×</td>"),
            "{log_row}"
        );
        assert!(
            page.contains("the window-edge attack"),
            "the pattern is described"
        );
    }

    #[test]
    fn the_terminal_and_the_page_show_one_table_in_one_order() {
        let trace = generate(Pattern::Burst, &Shape::around(5, MINUTE));
        let runs = simulate(&trace, &compare_lanes(5, MINUTE).unwrap());
        let table = summary(&runs, MINUTE);
        let markdown = table.markdown();
        let page = table.html();
        let columns = "| lane | admitted | refused | largest in any 60s | limit | × limit | policy \
                       | longest queue wait |";
        assert!(markdown.starts_with(columns), "{markdown}");
        let header: String = table
            .header
            .iter()
            .map(|h| format!("<th>{h}</th>"))
            .collect();
        assert!(page.contains(&format!("<tr>{header}</tr>")), "{page}");
        for row in &table.rows {
            assert!(
                markdown.contains(&format!("| {} |", row.join(" | "))),
                "{markdown}"
            );
        }
        assert_eq!(table.rows.len(), 7);
    }

    /// The queue's limit is one more than its rate's: the policy column says why.
    #[test]
    fn the_queues_limit_of_six_at_five_a_minute_is_explained() {
        let trace = generate(Pattern::Burst, &Shape::around(5, MINUTE));
        let runs = simulate(&trace, &compare_lanes(5, MINUTE).unwrap());
        let table = summary(&runs, MINUTE);
        let queue = table.rows.iter().find(|r| r[0] == "leaky_queue").unwrap();
        assert_eq!(queue[4], "6");
        assert_eq!(queue[6], "5 per minute, queue 5 (6 at once)");
        let bucket = table.rows.iter().find(|r| r[0] == "token_bucket").unwrap();
        assert_eq!((&*bucket[4], &*bucket[6]), ("5", "5 per minute, burst 5"));
    }

    #[test]
    fn the_csv_has_a_row_per_decision_per_lane() {
        let trace = Trace::parse("t", "0,a\n1,b\"q\n").unwrap();
        let runs = simulate(&trace, &compare_lanes(1, MINUTE).unwrap()[..2]);
        let text = csv(&trace, &runs);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + 2 * 2);
        assert_eq!(lines[1], "token_bucket,0.000000,a,1,true,1,0,0.000000");
        // A key with a quote in its name comes back quoted, the quote doubled.
        assert!(
            lines[2].starts_with("token_bucket,1.000000,\"b\"\"q\","),
            "{}",
            lines[2]
        );
    }
}
