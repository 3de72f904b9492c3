//! Traffic traces: requests with their arrival time, key and cost, read from a file or generated
//! from a named pattern.

use std::time::Duration;

use crate::rng::Rng;

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// Time since the trace began.
    pub at: Duration,
    /// Index into [`Trace::keys`].
    pub key: u32,
    /// Units the request takes (1 for a plain request).
    pub cost: u64,
}

/// Requests in arrival order, and the names of their keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// In order of `at`.
    pub arrivals: Vec<Arrival>,
    /// Key names; arrivals refer to them by index, so a million requests over a few keys do not
    /// carry a million strings.
    pub keys: Vec<String>,
    /// How long the traffic lasted, when that is more than its last arrival: a generated
    /// trace's duration (its last burst may come well before the end). Zero for a file.
    pub duration: Duration,
}

impl Trace {
    /// How long the trace lasts: the last arrival's time.
    pub fn span(&self) -> Duration {
        self.arrivals.last().map_or(Duration::ZERO, |a| a.at)
    }

    /// Where the report's time axis ends, and its samples of state: the trace's duration, and
    /// in any case a twentieth of the trace past its last request, so that the last burst is
    /// drawn whole (the limiter recovering from it included) and not against the plot's edge.
    pub fn end(&self) -> Duration {
        let span = self.span().max(Duration::from_millis(1));
        self.duration.max(span + span / 20)
    }

    /// The key with the most requests (the first such, on a tie).
    pub fn busiest_key(&self) -> u32 {
        let mut counts = vec![0u64; self.keys.len()];
        for a in &self.arrivals {
            counts[a.key as usize] += 1;
        }
        (0..counts.len())
            .max_by_key(|&k| (counts[k], std::cmp::Reverse(k)))
            .unwrap_or(0) as u32
    }

    /// A trace of one key, `client`, at these times, each of cost 1.
    pub fn single_key(times: impl IntoIterator<Item = Duration>) -> Self {
        let mut arrivals: Vec<Arrival> = times
            .into_iter()
            .map(|at| Arrival {
                at,
                key: 0,
                cost: 1,
            })
            .collect();
        arrivals.sort_by_key(|a| a.at);
        Trace {
            arrivals,
            keys: vec!["client".to_owned()],
            duration: Duration::ZERO,
        }
    }

    /// Reads a trace from text: one request a line, `SECONDS[,KEY[,COST]]`, where `SECONDS` is
    /// the arrival time (a decimal number, from any origin: the earliest becomes 0), `KEY` a name
    /// (default `client`) and `COST` a whole number (default 1). Blank lines and lines starting
    /// with `#` are skipped, and so is a first line that names the columns.
    pub fn parse(name: &str, text: &str) -> Result<Self, TraceError> {
        let mut keys: Vec<String> = Vec::new();
        let mut index = std::collections::HashMap::<String, u32>::new();
        let mut rows: Vec<(f64, u32, u64)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let at = |(column, _): (usize, &str), message: String| {
                TraceError::at(name, n + 1, column, message)
            };
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            let fields = fields_with_columns(line);
            if fields.len() > 3 {
                let message = "a line has at most three fields: SECONDS,KEY,COST".to_owned();
                return Err(at(fields[3], message));
            }
            let time = fields[0];
            let secs: f64 = match time.1.parse() {
                Ok(s) => s,
                // A first line that names the columns, such as `time,key,cost`.
                Err(_) if rows.is_empty() && !looks_numeric(time.1) => continue,
                Err(_) => return Err(at(time, format!("`{}` is not a time in seconds", time.1))),
            };
            if !secs.is_finite() || secs < 0.0 {
                let message = format!(
                    "the time `{}` must be a finite number of seconds, 0 or more",
                    time.1
                );
                return Err(at(time, message));
            }
            let key_name = fields
                .get(1)
                .map(|f| f.1)
                .filter(|k| !k.is_empty())
                .unwrap_or("client");
            let key = match index.get(key_name) {
                Some(&k) => k,
                None => {
                    let k = u32::try_from(keys.len())
                        .map_err(|_| at(fields[1], "more than 4 billion keys".to_owned()))?;
                    keys.push(key_name.to_owned());
                    index.insert(key_name.to_owned(), k);
                    k
                }
            };
            let cost = match fields.get(2) {
                None => 1,
                Some(&field) => field.1.parse::<u64>().map_err(|_| {
                    at(
                        field,
                        format!("`{}` is not a cost (a whole number, 0 or more)", field.1),
                    )
                })?,
            };
            rows.push((secs, key, cost));
        }
        let origin = rows.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
        let mut arrivals: Vec<Arrival> = rows
            .into_iter()
            .map(|(secs, key, cost)| Arrival {
                at: Duration::from_secs_f64(secs - origin),
                key,
                cost,
            })
            .collect();
        // Stable: requests at the same instant keep the file's order.
        arrivals.sort_by_key(|a| a.at);
        Ok(Trace {
            arrivals,
            keys,
            duration: Duration::ZERO,
        })
    }
}

/// A line's comma-separated fields, trimmed, each with the 1-based column where its text starts.
fn fields_with_columns(line: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut offset = 0;
    for field in line.split(',') {
        let leading = field.len() - field.trim_start().len();
        out.push((offset + leading + 1, field.trim()));
        offset += field.len() + 1;
    }
    out
}

fn looks_numeric(text: &str) -> bool {
    text.trim()
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '.' || c == '-' || c == '+')
}

/// A trace file that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct TraceError {
    /// The file, as named by the caller.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column of the offending field.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl TraceError {
    fn at(file: &str, line: usize, column: usize, message: String) -> Self {
        TraceError {
            file: file.to_owned(),
            line,
            column,
            message,
        }
    }
}

/// A generated traffic shape, all on one key unless said otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Evenly spaced requests.
    Steady,
    /// Quiet, then a burst of twice the limit at once, every two windows.
    Burst,
    /// Random arrivals at a constant average rate.
    Poisson,
    /// The window-edge attack: the limit's worth of requests just before each window boundary
    /// and again just after it, so a fixed window admits twice its limit within moments.
    Boundary,
    /// Random arrivals whose rate rises and falls once over the trace, like a day's traffic.
    Diurnal,
}

impl Pattern {
    /// Every pattern, in the order the CLI lists them.
    pub const ALL: [Pattern; 5] = [
        Pattern::Steady,
        Pattern::Burst,
        Pattern::Poisson,
        Pattern::Boundary,
        Pattern::Diurnal,
    ];

    /// What the pattern sends, for `--help` and the report: the words a user picks it by.
    pub fn description(self) -> &'static str {
        match self {
            Pattern::Steady => "evenly spaced requests at --rate",
            Pattern::Burst => {
                "quiet, then twice the limit at once; the first burst half a window in, then one \
                 every two windows"
            }
            Pattern::Poisson => "random arrivals at an average of --rate",
            Pattern::Boundary => {
                "the window-edge attack: the limit's worth in the last 1% of a window and again \
                 in the first 1% of the next, at every other boundary from the second (2, 4, 6 \
                 and 8 windows in over ten); a fixed window admits twice its limit within \
                 moments. Needs a --duration over two windows"
            }
            Pattern::Diurnal => {
                "random arrivals whose rate rises from 0.2 to 1.8 times --rate mid-trace and \
                 falls again, like a day's traffic"
            }
        }
    }

    /// The pattern's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Steady => "steady",
            Pattern::Burst => "burst",
            Pattern::Poisson => "poisson",
            Pattern::Boundary => "boundary",
            Pattern::Diurnal => "diurnal",
        }
    }
}

impl std::str::FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Pattern::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Pattern::ALL.iter().map(|p| p.name()).collect();
                format!("unknown pattern `{s}`; use one of {}", names.join(", "))
            })
    }
}

/// What a generated trace is shaped around: the nominal limit it tests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Requests the limit allows per window.
    pub limit: u64,
    /// The window.
    pub window: Duration,
    /// How long the trace lasts: no request arrives after it, not even the second half of a
    /// burst that straddles a boundary.
    pub duration: Duration,
    /// Average requests per second offered, for `steady`, `poisson` and `diurnal`.
    pub rate: f64,
    /// Fixes the random patterns.
    pub seed: u64,
}

impl Shape {
    /// A shape offering 1.5 times the limit's rate for ten windows.
    pub fn around(limit: u64, window: Duration) -> Self {
        Shape {
            limit,
            window,
            duration: window * 10,
            rate: 1.5 * limit as f64 / window.as_secs_f64(),
            seed: 1,
        }
    }
}

/// A trace of `pattern` on one key, `client`.
pub fn generate(pattern: Pattern, shape: &Shape) -> Trace {
    let end = shape.duration.as_secs_f64();
    let window = shape.window.as_secs_f64();
    let mut rng = Rng::new(shape.seed);
    let mut times: Vec<f64> = Vec::new();
    match pattern {
        Pattern::Steady => {
            let gap = 1.0 / shape.rate.max(f64::MIN_POSITIVE);
            let mut t = 0.0;
            while t < end {
                times.push(t);
                t += gap;
            }
        }
        Pattern::Poisson => poisson(&mut rng, shape.rate, end, |_| 1.0, &mut times),
        Pattern::Diurnal => {
            // The rate swings between 0.2 and 1.8 times the average, peaking mid-trace.
            let wave = |t: f64| 1.0 - 0.8 * (2.0 * std::f64::consts::PI * t / end).cos();
            poisson(&mut rng, shape.rate, end, wave, &mut times);
        }
        Pattern::Burst => {
            let mut start = window / 2.0;
            // Each burst whole, or not at all.
            while start + window * 1e-3 < end {
                for i in 0..shape.limit * 2 {
                    // Spread over a thousandth of the window: one burst, still in order.
                    times.push(start + window * 1e-3 * i as f64 / (shape.limit * 2) as f64);
                }
                start += 2.0 * window;
            }
        }
        Pattern::Boundary => {
            // The first window is left quiet; then at each boundary k·window, the limit's worth
            // in the last 1% before it and the limit's worth in the first 1% after it.
            let edge = window * 0.01;
            let mut boundary = 2.0 * window;
            // Both halves of a burst within the duration, or neither: half the attack is not it.
            while boundary + edge < end {
                for i in 0..shape.limit {
                    let step = edge * i as f64 / shape.limit as f64;
                    times.push(boundary - edge + step);
                }
                for i in 0..shape.limit {
                    times.push(boundary + edge * i as f64 / shape.limit as f64);
                }
                boundary += 2.0 * window;
            }
        }
    }
    Trace {
        duration: shape.duration,
        ..Trace::single_key(times.into_iter().map(Duration::from_secs_f64))
    }
}

/// Arrivals of a Poisson process of average `rate` scaled by `shape(t)` (at most 2), by thinning
/// a process of twice the rate.
fn poisson(rng: &mut Rng, rate: f64, end: f64, shape: impl Fn(f64) -> f64, out: &mut Vec<f64>) {
    if rate <= 0.0 {
        return;
    }
    let top = 2.0 * rate;
    let mut t = rng.exponential(top);
    while t < end {
        if rng.unit() * 2.0 < shape(t) {
            out.push(t);
        }
        t += rng.exponential(top);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_file_trace_keeps_keys_costs_and_order() {
        let t = Trace::parse(
            "t.csv",
            "time,key,cost\n# a comment\n10.5,alice,2\n10,bob\n\n11\n",
        )
        .unwrap();
        assert_eq!(t.keys, ["alice", "bob", "client"]);
        let got: Vec<(Duration, u32, u64)> =
            t.arrivals.iter().map(|a| (a.at, a.key, a.cost)).collect();
        assert_eq!(
            got,
            [(secs(0.0), 1, 1), (secs(0.5), 0, 2), (secs(1.0), 2, 1)]
        );
    }

    #[test]
    fn a_bad_line_is_named_with_its_column() {
        let err = Trace::parse("t.csv", "1,a\n2, b, x\n").unwrap_err();
        assert_eq!((err.line, err.column), (2, 7), "{err}");
        assert!(
            err.to_string().starts_with("t.csv:2:7: `x` is not a cost"),
            "{err}"
        );
        let err = Trace::parse("t.csv", "1\nsoon\n").unwrap_err();
        assert_eq!((err.line, err.column), (2, 1), "{err}");
        let err = Trace::parse("t.csv", "-1\n").unwrap_err();
        assert!(err.message.contains("0 or more"), "{err}");
        let err = Trace::parse("t.csv", "1,a,1,9\n").unwrap_err();
        assert_eq!((err.line, err.column), (1, 7), "{err}");
    }

    #[test]
    fn patterns_offer_what_they_promise() {
        let shape = Shape::around(5, Duration::from_secs(60));
        let steady = generate(Pattern::Steady, &shape);
        // 1.5 × 5 a minute for ten minutes.
        assert_eq!(steady.arrivals.len(), 75);
        let poisson = generate(Pattern::Poisson, &Shape { seed: 9, ..shape });
        assert!(
            (50..100).contains(&poisson.arrivals.len()),
            "{}",
            poisson.arrivals.len()
        );
        assert!(poisson.arrivals.windows(2).all(|w| w[0].at <= w[1].at));
        let burst = generate(Pattern::Burst, &shape);
        assert_eq!(burst.arrivals.len(), 5 * 10);
        let boundary = generate(Pattern::Boundary, &shape);
        // Boundaries at 2, 4, 6 and 8 minutes, ten requests around each.
        assert_eq!(boundary.arrivals.len(), 40);
        let around_two = boundary
            .arrivals
            .iter()
            .filter(|a| a.at > secs(119.0) && a.at < secs(121.0))
            .count();
        assert_eq!(around_two, 10);
        let diurnal = generate(Pattern::Diurnal, &shape);
        let half = diurnal
            .arrivals
            .iter()
            .filter(|a| a.at > secs(150.0) && a.at < secs(450.0));
        // The middle half of the trace carries most of it.
        assert!(half.count() * 2 > diurnal.arrivals.len());
    }

    #[test]
    fn no_request_arrives_after_the_duration() {
        let minute = Duration::from_secs(60);
        for (pattern, duration, requests) in [
            // The boundary at 2 minutes, its second half cut: no burst at all.
            (Pattern::Boundary, secs(120.3), 0),
            (Pattern::Boundary, secs(121.0), 10),
            (Pattern::Boundary, secs(240.0), 10),
            // The burst at 30 s lasts 60 ms.
            (Pattern::Burst, secs(30.05), 0),
            (Pattern::Burst, secs(31.0), 10),
        ] {
            let shape = Shape {
                duration,
                ..Shape::around(5, minute)
            };
            let trace = generate(pattern, &shape);
            assert_eq!(
                trace.arrivals.len(),
                requests,
                "{pattern:?} over {duration:?}"
            );
            assert!(trace.span() < duration, "{pattern:?} over {duration:?}");
        }
        for pattern in Pattern::ALL {
            let shape = Shape::around(5, minute);
            assert!(
                generate(pattern, &shape).span() < shape.duration,
                "{pattern:?}"
            );
        }
    }

    #[test]
    fn the_time_axis_leaves_room_after_the_last_burst() {
        // Boundary traffic's last burst ends 8 minutes and 0.6 s in; the axis runs to 10.
        let minute = Duration::from_secs(60);
        let trace = generate(Pattern::Boundary, &Shape::around(5, minute));
        assert_eq!(trace.end(), 10 * minute);
        // A file ends at its last request: the axis runs a twentieth further.
        let file = Trace::single_key([Duration::ZERO, Duration::from_secs(100)]);
        assert_eq!(file.end(), Duration::from_secs(105));
    }

    #[test]
    fn pattern_names_round_trip_and_unknown_ones_are_listed() {
        for p in Pattern::ALL {
            assert_eq!(p.name().parse::<Pattern>(), Ok(p));
        }
        let err = "spiky".parse::<Pattern>().unwrap_err();
        assert!(
            err.contains("steady, burst, poisson, boundary, diurnal"),
            "{err}"
        );
    }
}
