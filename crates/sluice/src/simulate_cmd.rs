//! `sluice simulate`: the real algorithms on a simulated clock against a trace, written as an
//! HTML report with plots and a CSV of decisions; or the sliding counter's error against the
//! exact log; or many callers with random usage against one budget (`--usage`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use sluice_core::parse_duration_or_error;
use sluice_rules::RuleSet;
use sluice_sim::counter_error::{self, Estimator, Setup};
use sluice_sim::report::{self, About};
use sluice_sim::usage::{self, UsageSetup};
use sluice_sim::{Pattern, Shape, Trace, compare_lanes, generate, rule_lanes, simulate};

#[derive(Debug, clap::Args)]
pub(crate) struct SimulateArgs {
    /// Generated traffic, on one key, shaped around --limit per --window.
    #[arg(long, default_value = "boundary", conflicts_with = "trace", value_parser = patterns())]
    pattern: Pattern,
    /// Traffic from a file instead: one request a line, SECONDS[,KEY[,COST]].
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Run every algorithm at the same nominal limit (the default without --config).
    #[arg(long, conflicts_with = "config")]
    compare: bool,
    /// Run the limits of these rule files or directories instead.
    #[arg(long)]
    config: Vec<PathBuf>,
    /// The nominal limit: requests per window, for --compare and the generated traffic
    /// [default: 5, and 100 with --counter-error].
    #[arg(long)]
    limit: Option<u64>,
    /// The nominal window.
    #[arg(long, value_parser = parse_duration_or_error, default_value = "1m")]
    window: Duration,
    /// How long generated traffic lasts: no request arrives after it (a burst that would not fit
    /// whole is left out), and the plots span it [default: ten windows].
    #[arg(long, value_parser = parse_duration_or_error)]
    duration: Option<Duration>,
    /// Average requests per second of steady, poisson and diurnal traffic [default: 1.5 times
    /// the limit's rate].
    #[arg(long)]
    rate: Option<f64>,
    /// Fixes random traffic, so a run can be repeated exactly.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the report goes: DIR/report.html and DIR/decisions.csv.
    #[arg(long, default_value = "simulation")]
    out: PathBuf,
    /// Measure how often the sliding counter decides differently from the exact sliding log on
    /// heavy-tailed, bursty traffic, and print the table (uses --limit, --window, --duration and
    /// --seed when given).
    #[arg(long)]
    counter_error: bool,
    /// --counter-error: requests in the trace.
    #[arg(long, default_value_t = 1_000_000, requires = "counter_error")]
    requests: u64,
    /// --counter-error: distinct keys.
    #[arg(long, default_value_t = 10_000, requires = "counter_error")]
    keys: u32,
    /// --counter-error: the Zipf exponent of key popularity.
    #[arg(long, default_value_t = 1.0, requires = "counter_error")]
    zipf: f64,
    /// --counter-error: share of arrivals that are a burst.
    #[arg(long, default_value_t = 0.01, requires = "counter_error")]
    burst_share: f64,
    /// --counter-error: the largest burst, in requests within one second.
    #[arg(long, default_value_t = 50, requires = "counter_error")]
    burst_max: u64,
    /// --counter-error: measure the bucketed window with this many sub-windows instead of the
    /// sliding counter.
    #[arg(long, requires = "counter_error")]
    sub_windows: Option<u32>,
    /// Many callers at once, each using 50 to 500 units (500 declared) against one budget an
    /// hour: check-then-report (Envoy's flow) against reserve-then-settle, plotted in
    /// DIR/usage.html (uses --duration and --seed when given).
    #[arg(long, conflicts_with = "counter_error")]
    usage: bool,
    /// --usage: callers at once.
    #[arg(long, default_value_t = 1_000, requires = "usage")]
    callers: u32,
    /// --usage: the budget, in units an hour.
    #[arg(long, default_value_t = 100_000, requires = "usage")]
    budget: u64,
}

/// The patterns as `--help` lists them, each with what it sends.
fn patterns() -> impl clap::builder::TypedValueParser<Value = Pattern> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(
        Pattern::ALL.map(|p| PossibleValue::new(p.name()).help(p.description())),
    )
    .try_map(|name| name.parse::<Pattern>())
}

pub(crate) fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if args.counter_error {
        return measure_counter_error(&args);
    }
    if args.usage {
        return simulate_usage(&args);
    }
    let limit = args.limit.unwrap_or(5);
    anyhow::ensure!(limit > 0, "--limit must be at least 1");
    let (trace, traffic, described) = match &args.trace {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the trace {}", path.display()))?;
            let trace = Trace::parse(&path.display().to_string(), &text)?;
            anyhow::ensure!(
                !trace.arrivals.is_empty(),
                "{} holds no requests",
                path.display()
            );
            (trace, path.display().to_string(), String::new())
        }
        None => {
            let mut shape = Shape::around(limit, args.window);
            shape.seed = args.seed;
            if let Some(d) = args.duration {
                shape.duration = d;
            }
            if let Some(r) = args.rate {
                anyhow::ensure!(r > 0.0 && r.is_finite(), "--rate must be a positive number");
                shape.rate = r;
            }
            let trace = generate(args.pattern, &shape);
            anyhow::ensure!(
                !trace.arrivals.is_empty(),
                "{} traffic over --duration {:?} holds no request; it is {}",
                args.pattern.name(),
                shape.duration,
                args.pattern.description()
            );
            (
                trace,
                format!("{} traffic", args.pattern.name()),
                args.pattern.description().to_owned(),
            )
        }
    };
    let lanes = if args.config.is_empty() {
        compare_lanes(limit, args.window).context("the nominal limit makes no valid policy")?
    } else {
        let rules = RuleSet::load_all(&args.config)?;
        let lanes = rule_lanes(&rules);
        anyhow::ensure!(!lanes.is_empty(), "the rules hold no limit to simulate");
        lanes
    };
    let runs = simulate(&trace, &lanes);
    let about = About {
        traffic,
        described,
        window: args.window,
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let html = report::html(&trace, &runs, &about)?;
    let page = args.out.join("report.html");
    std::fs::write(&page, html).with_context(|| format!("cannot write {}", page.display()))?;
    let csv = args.out.join("decisions.csv");
    std::fs::write(&csv, report::csv(&trace, &runs))
        .with_context(|| format!("cannot write {}", csv.display()))?;
    print!("{}", report::summary(&runs, args.window).markdown());
    println!("\nwrote {} and {}", page.display(), csv.display());
    Ok(())
}

fn simulate_usage(args: &SimulateArgs) -> anyhow::Result<()> {
    let defaults = UsageSetup::default();
    let setup = UsageSetup {
        callers: args.callers,
        budget: args.budget,
        duration: args.duration.unwrap_or(defaults.duration),
        seed: args.seed,
        ..defaults
    };
    anyhow::ensure!(setup.callers > 0, "--callers must be at least 1");
    let runs = usage::simulate_usage(&setup).context("the budget makes no valid policy")?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let page = args.out.join("usage.html");
    std::fs::write(&page, usage::html(&setup, &runs)?)
        .with_context(|| format!("cannot write {}", page.display()))?;
    print!("{}", usage::markdown(&setup, &runs));
    println!("\nwrote {}", page.display());
    Ok(())
}

fn measure_counter_error(args: &SimulateArgs) -> anyhow::Result<()> {
    let defaults = Setup::default();
    let setup = Setup {
        estimator: Estimator::of_log(args.sub_windows)
            .context("no algorithm in the table estimates the sliding log")?,
        requests: args.requests,
        keys: args.keys.max(1),
        limit: args.limit.unwrap_or(defaults.limit),
        window: args.window,
        duration: args.duration.unwrap_or(defaults.duration),
        seed: args.seed,
        zipf: args.zipf,
        burst_share: args.burst_share,
        burst_max: args.burst_max,
    };
    anyhow::ensure!(
        (0.0..=1.0).contains(&setup.burst_share) && setup.burst_max >= 2,
        "--burst-share must be between 0 and 1, and --burst-max at least 2"
    );
    anyhow::ensure!(
        setup.zipf.is_finite() && setup.zipf >= 0.0,
        "--zipf must be 0 or more"
    );
    let tally = counter_error::measure(&setup).context("the limit makes no valid policy")?;
    print!("{}", tally.markdown(&setup));
    Ok(())
}
