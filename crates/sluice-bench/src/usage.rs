//! Usage calls: each "request" is one call that spends a random number of units (tokens, say)
//! known only after it ran, admitted in one of two flows:
//!
//! - **reserve** (Sluice's): `POST /v1/reserve` with the declared maximum as `amount`; when
//!   admitted, the call spends its units and `POST /v1/settle`s with what it used, and the rest
//!   is refunded.
//! - **report** (Envoy's): `POST /json` with every descriptor's `hits_addend` 0, which asks
//!   whether one more would pass and takes nothing; when admitted, the call spends its units and
//!   reports them with `hits_addend` set to the amount used, counted even past the limit.
//!
//! The report adds what the budget needs: calls admitted, the units they spent, and for
//! reservations what was reserved and what the settles gave back. Over a run that fits in one
//! window of a budget, what was admitted beyond it is the units spent minus the budget.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::uri::Authority;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpStream;

use super::grpc::{DescriptorTemplate, parse_descriptor};
use super::{Answer, BenchError, Load, Report, Sender, Target};

/// How a usage call is admitted and charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Flow {
    /// Reserve the declared maximum, then settle with what was used.
    Reserve,
    /// Check with `hits_addend` 0 on `/json`, then report what was used (Envoy's flow).
    Report,
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flow::Reserve => "reserve-then-settle",
            Flow::Report => "check-then-report",
        })
    }
}

/// What the calls of a usage run look like.
#[derive(Debug, Clone)]
pub struct Usage {
    /// How each call is admitted and charged.
    pub flow: Flow,
    /// The most a call may use: the amount reserved.
    pub declared: u64,
    /// The fewest units a call uses.
    pub used_min: u64,
    /// The most units a call uses; uniform between the two, both included.
    pub used_max: u64,
    /// Seeds each worker's generator, so two runs with one seed spend alike.
    pub seed: u64,
    /// The reservations' `ttl` as `/v1/reserve` takes it (`"2m"`), or the server's default.
    pub ttl: Option<String>,
    /// The budget the run is measured against, for `beyond_budget`.
    pub budget: Option<u64>,
}

/// Running totals the workers share.
#[derive(Debug, Default)]
struct Totals {
    admitted: AtomicU64,
    used: AtomicU64,
    reserved: AtomicU64,
    refunded: AtomicU64,
    charged: AtomicU64,
}

/// One instance of the service: where calls go.
#[derive(Debug)]
struct Instance {
    url: String,
    authority: Authority,
}

/// Usage calls against one or more instances that share a store; worker `w` calls instance
/// `w % instances`, so calls spread round robin over them.
#[derive(Debug)]
pub struct UsageTarget {
    instances: Vec<Instance>,
    /// The domain, as a JSON string.
    domain: String,
    descriptors: Vec<DescriptorTemplate>,
    usage: Usage,
    totals: Totals,
}

impl UsageTarget {
    /// Calls to `urls` (`http://host:port`, one per instance) asking about `domain` with
    /// `descriptors` (`key=value,key=value`, `{n}` allowed in values), spending as `usage` says.
    pub fn new(
        urls: &[String],
        domain: &str,
        descriptors: &[String],
        usage: Usage,
    ) -> Result<Self, BenchError> {
        let invalid = |m: String| BenchError::Invalid(m);
        if urls.is_empty() {
            return Err(invalid("give at least one instance's URL".into()));
        }
        let instances = urls
            .iter()
            .map(|url| {
                let rest = url.strip_prefix("http://").ok_or_else(|| {
                    invalid(format!(
                        "the URL {url:?} must start with http:// (TLS is not supported)"
                    ))
                })?;
                let authority: Authority = rest.trim_end_matches('/').parse().map_err(|e| {
                    invalid(format!("the URL {url:?} must be http://host:port: {e}"))
                })?;
                if authority.port_u16().is_none() {
                    return Err(invalid(format!("the URL {url:?} needs a port")));
                }
                Ok(Instance {
                    url: url.clone(),
                    authority,
                })
            })
            .collect::<Result<_, _>>()?;
        if descriptors.is_empty() {
            return Err(invalid("give at least one --descriptor key=value".into()));
        }
        let descriptors = descriptors
            .iter()
            .map(|d| parse_descriptor(d).map_err(invalid))
            .collect::<Result<_, _>>()?;
        if usage.declared == 0 {
            return Err(invalid("the declared maximum must be at least 1".into()));
        }
        if usage.used_min > usage.used_max {
            return Err(invalid(format!(
                "the used range {}..{} is empty",
                usage.used_min, usage.used_max
            )));
        }
        Ok(UsageTarget {
            instances,
            domain: json_string(domain),
            descriptors,
            usage,
            totals: Totals::default(),
        })
    }

    /// The descriptors of call `key` as JSON, each with `hits_addend` when given.
    fn descriptors_json(&self, key: u64, hits_addend: Option<u64>) -> String {
        let mut out = String::from("[");
        for (i, entries) in self.descriptors.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"entries\":[");
            for (j, (k, v)) in entries.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                out.push_str(&format!(
                    "{{\"key\":{},\"value\":{}}}",
                    json_string(k),
                    json_string(&v.render(key))
                ));
            }
            out.push(']');
            if let Some(h) = hits_addend {
                out.push_str(&format!(",\"hits_addend\":{h}"));
            }
            out.push('}');
        }
        out.push(']');
        out
    }

    fn reserve_body(&self, key: u64) -> String {
        let ttl = self
            .usage
            .ttl
            .as_deref()
            .map_or_else(String::new, |t| format!(",\"ttl\":{}", json_string(t)));
        format!(
            "{{\"domain\":{},\"descriptors\":{},\"amount\":{}{ttl}}}",
            self.domain,
            self.descriptors_json(key, None),
            self.usage.declared
        )
    }

    fn envoy_body(&self, key: u64, hits_addend: u64) -> String {
        format!(
            "{{\"domain\":{},\"descriptors\":{}}}",
            self.domain,
            self.descriptors_json(key, Some(hits_addend))
        )
    }

    /// What the run spent, beside its answers.
    fn outcome(&self, run: Report) -> UsageReport {
        let t = &self.totals;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (used, reserved) = (load(&t.used), load(&t.reserved));
        UsageReport {
            run,
            flow: self.usage.flow,
            instances: self.instances.len(),
            declared: self.usage.declared,
            used_min: self.usage.used_min,
            used_max: self.usage.used_max,
            calls_admitted: load(&t.admitted),
            tokens_used: used,
            tokens_reserved: reserved,
            refunds_expected: reserved.saturating_sub(used),
            refunded: load(&t.refunded),
            charged: load(&t.charged),
            budget: self.usage.budget,
            beyond_budget: self.usage.budget.map(|b| used.saturating_sub(b)),
        }
    }
}

/// Runs `load` as usage calls against `target` and reports what happened and what was spent.
pub async fn run_usage(target: UsageTarget, load: Load) -> Result<UsageReport, BenchError> {
    let target = Arc::new(target);
    let run = super::run(&target, load).await?;
    Ok(target.outcome(run))
}

/// What a usage run did: its answers (one per call: allowed when admitted) and what it spent.
#[derive(Debug, Clone, Serialize)]
pub struct UsageReport {
    /// Answers, latency (of the whole call: both requests) and throughput in calls.
    #[serde(flatten)]
    pub run: Report,
    /// How calls were admitted.
    pub flow: Flow,
    /// Instances the calls were spread over.
    pub instances: usize,
    /// The declared maximum of a call (reserved in the reserve flow).
    pub declared: u64,
    /// The fewest units a call used.
    pub used_min: u64,
    /// The most units a call used.
    pub used_max: u64,
    /// Calls admitted, warm-up included.
    pub calls_admitted: u64,
    /// Units the admitted calls spent: the sum their callers used.
    pub tokens_used: u64,
    /// Units reserved by admitted calls (reserve flow; 0 otherwise).
    pub tokens_reserved: u64,
    /// What the settles should have given back: reserved minus used, when no call used more
    /// than it reserved.
    pub refunds_expected: u64,
    /// What the settles answered they gave back, in all.
    pub refunded: u64,
    /// What the settles answered they charged beyond reservations, in all.
    pub charged: u64,
    /// The budget the run is measured against, when given.
    pub budget: Option<u64>,
    /// Units spent beyond the budget: `tokens_used - budget`, floored at 0.
    pub beyond_budget: Option<u64>,
}

impl fmt::Display for UsageReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.run)?;
        writeln!(
            f,
            "usage       {} over {} instance(s), {} to {} used of {} declared",
            self.flow, self.instances, self.used_min, self.used_max, self.declared
        )?;
        writeln!(
            f,
            "spent       {} calls admitted used {} units",
            self.calls_admitted, self.tokens_used
        )?;
        if self.flow == Flow::Reserve {
            writeln!(
                f,
                "settled     {} reserved, {} refunded of {} expected, {} charged",
                self.tokens_reserved, self.refunded, self.refunds_expected, self.charged
            )?;
        }
        if let (Some(budget), Some(beyond)) = (self.budget, self.beyond_budget) {
            writeln!(f, "budget      {budget}: {beyond} admitted beyond it")?;
        }
        Ok(())
    }
}

/// A worker's side: one keep-alive HTTP/1.1 connection to its instance, and its own random
/// usage.
pub(crate) struct UsageSender {
    target: Arc<UsageTarget>,
    instance: usize,
    conn: Option<http1::SendRequest<Full<Bytes>>>,
    rng: XorShift,
}

impl Target for Arc<UsageTarget> {
    type Sender = UsageSender;

    async fn open(&self, index: usize) -> Result<UsageSender, String> {
        let instance = index % self.instances.len();
        let conn = open(&self.instances[instance].authority).await?;
        Ok(UsageSender {
            target: self.clone(),
            instance,
            conn: Some(conn),
            rng: XorShift::new(self.usage.seed, index as u64),
        })
    }

    fn describe(&self) -> String {
        let urls: Vec<&str> = self.instances.iter().map(|i| i.url.as_str()).collect();
        format!("{} on {}", self.usage.flow, urls.join(", "))
    }
}

async fn open(authority: &Authority) -> Result<http1::SendRequest<Full<Bytes>>, String> {
    let stream = TcpStream::connect(authority.as_str())
        .await
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let (send, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(send)
}

impl UsageSender {
    /// `POST path` with a JSON `body`: the status and the whole body, or why it failed.
    async fn post(&mut self, path: &str, body: String) -> Result<(StatusCode, Bytes), String> {
        let authority = &self.target.instances[self.instance].authority;
        // A connection that failed is replaced before the next request.
        let mut send = match self.conn.take() {
            Some(s) if !s.is_closed() => s,
            _ => open(authority).await.map_err(|e| format!("connect: {e}"))?,
        };
        if send.ready().await.is_err() {
            return Err("connection closed".into());
        }
        let request = Request::post(path)
            .header(HOST, authority.as_str())
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("request: {e}"))?;
        let response = send
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"));
        self.conn = Some(send);
        let response = response?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|_| "body cut short".to_owned())?
            .to_bytes();
        Ok((status, body))
    }

    async fn reserve_then_settle(&mut self, key: u64, used: u64) -> Answer {
        let target = self.target.clone();
        let totals = &target.totals;
        let (status, body) = match self.post("/v1/reserve", target.reserve_body(key)).await {
            Ok(r) => r,
            Err(e) => return Answer::Error(e),
        };
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Answer::Limited;
        }
        if !status.is_success() {
            return Answer::Error(format!("reserve: HTTP {}", status.as_u16()));
        }
        // Admitted: the caller goes on and spends its units, whatever the settle does.
        totals.admitted.fetch_add(1, Ordering::Relaxed);
        totals.used.fetch_add(used, Ordering::Relaxed);
        let reservation = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("reservation")?.as_str().map(str::to_owned));
        let Some(reservation) = reservation else {
            return Answer::Error("reserve: admitted without a reservation".into());
        };
        totals
            .reserved
            .fetch_add(target.usage.declared, Ordering::Relaxed);
        let settle = format!(
            "{{\"reservation\":{},\"used\":{used}}}",
            json_string(&reservation)
        );
        let (status, body) = match self.post("/v1/settle", settle).await {
            Ok(r) => r,
            Err(e) => return Answer::Error(format!("settle: {e}")),
        };
        if !status.is_success() {
            return Answer::Error(format!("settle: HTTP {}", status.as_u16()));
        }
        let settled: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let field = |name: &str| settled.get(name).and_then(serde_json::Value::as_u64);
        match (field("refunded"), field("charged")) {
            (Some(refunded), Some(charged)) => {
                totals.refunded.fetch_add(refunded, Ordering::Relaxed);
                totals.charged.fetch_add(charged, Ordering::Relaxed);
                Answer::Allowed
            }
            _ => Answer::Error("settle: no refunded and charged in the answer".into()),
        }
    }

    async fn check_then_report(&mut self, key: u64, used: u64) -> Answer {
        let target = self.target.clone();
        let totals = &target.totals;
        let (status, _) = match self.post("/json", target.envoy_body(key, 0)).await {
            Ok(r) => r,
            Err(e) => return Answer::Error(e),
        };
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Answer::Limited;
        }
        if !status.is_success() {
            return Answer::Error(format!("check: HTTP {}", status.as_u16()));
        }
        totals.admitted.fetch_add(1, Ordering::Relaxed);
        totals.used.fetch_add(used, Ordering::Relaxed);
        // The report is counted even past the limit, so a 429 here is no failure.
        match self.post("/json", target.envoy_body(key, used)).await {
            Ok((status, _)) if status.is_success() || status == StatusCode::TOO_MANY_REQUESTS => {
                Answer::Allowed
            }
            Ok((status, _)) => Answer::Error(format!("report: HTTP {}", status.as_u16())),
            Err(e) => Answer::Error(format!("report: {e}")),
        }
    }
}

impl Sender for UsageSender {
    async fn send(&mut self, key: u64) -> Answer {
        let usage = &self.target.usage;
        let used = self.rng.between(usage.used_min, usage.used_max);
        match usage.flow {
            Flow::Reserve => self.reserve_then_settle(key, used).await,
            Flow::Report => self.check_then_report(key, used).await,
        }
    }
}

/// `text` as a JSON string, quotes included.
fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// xorshift64*: enough randomness for usage amounts, and the same amounts for the same seed.
#[derive(Debug, Clone)]
struct XorShift(u64);

impl XorShift {
    /// The generator of worker `stream` under `seed`, mixed (splitmix64) so that neighbouring
    /// workers do not start alike; never zero, which xorshift could not leave.
    fn new(seed: u64, stream: u64) -> Self {
        let mut z = seed
            .wrapping_add(stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        XorShift(if z == 0 { 1 } else { z })
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[min, max]` (the modulo's bias is below 2^-50 for ranges this bench uses).
    fn between(&mut self, min: u64, max: u64) -> u64 {
        match (max - min).checked_add(1) {
            Some(span) => min + self.next() % span,
            None => self.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(flow: Flow) -> Usage {
        Usage {
            flow,
            declared: 500,
            used_min: 50,
            used_max: 500,
            seed: 7,
            ttl: Some("2m".into()),
            budget: Some(1_000),
        }
    }

    fn target(flow: Flow) -> UsageTarget {
        UsageTarget::new(
            &["http://127.0.0.1:8080".into()],
            "llm",
            &["tenant=t{n},model=m\"1".into()],
            usage(flow),
        )
        .unwrap()
    }

    #[test]
    fn bodies_are_json_with_the_key_rendered() {
        let t = target(Flow::Reserve);
        let reserve: serde_json::Value = serde_json::from_str(&t.reserve_body(3)).unwrap();
        assert_eq!(reserve["amount"], 500);
        assert_eq!(reserve["ttl"], "2m");
        assert_eq!(reserve["descriptors"][0]["entries"][0]["value"], "t3");
        assert_eq!(reserve["descriptors"][0]["entries"][1]["value"], "m\"1");
        assert!(reserve["descriptors"][0].get("hits_addend").is_none());
        let report: serde_json::Value = serde_json::from_str(&t.envoy_body(4, 180)).unwrap();
        assert_eq!(report["domain"], "llm");
        assert_eq!(report["descriptors"][0]["hits_addend"], 180);
        assert_eq!(report["descriptors"][0]["entries"][0]["value"], "t4");
    }

    #[test]
    fn usage_is_uniform_in_range_and_the_same_for_the_same_seed() {
        let mut a = XorShift::new(7, 3);
        let mut b = XorShift::new(7, 3);
        let mut other = XorShift::new(7, 4);
        let draws: Vec<u64> = (0..10_000).map(|_| a.between(50, 500)).collect();
        assert!(draws.iter().all(|u| (50..=500).contains(u)));
        assert!(draws.contains(&50) && draws.contains(&500));
        let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        assert!((mean - 275.0).abs() < 5.0, "{mean}");
        assert!(draws.iter().all(|u| *u == b.between(50, 500)));
        assert_ne!(
            draws[..8],
            (0..8).map(|_| other.between(50, 500)).collect::<Vec<_>>()[..]
        );
        assert_eq!(XorShift::new(0, 0).between(9, 9), 9);
        let _ = XorShift::new(1, 1).between(0, u64::MAX);
    }

    #[test]
    fn nonsense_is_refused_with_a_reason() {
        let url = ["http://127.0.0.1:8080".to_owned()];
        let d = ["tenant=a".to_owned()];
        let cases: [(&[String], &[String], Usage, &str); 5] = [
            (&[], &d, usage(Flow::Reserve), "at least one instance"),
            (&["https://h:1".into()], &d, usage(Flow::Reserve), "http://"),
            (&url, &[], usage(Flow::Report), "--descriptor"),
            (
                &url,
                &d,
                Usage {
                    declared: 0,
                    ..usage(Flow::Reserve)
                },
                "declared",
            ),
            (
                &url,
                &d,
                Usage {
                    used_min: 9,
                    used_max: 8,
                    ..usage(Flow::Report)
                },
                "empty",
            ),
        ];
        for (urls, descriptors, usage, why) in cases {
            let e = UsageTarget::new(urls, "llm", descriptors, usage)
                .expect_err(why)
                .to_string();
            assert!(e.contains(why), "{why}: {e}");
        }
    }
}
