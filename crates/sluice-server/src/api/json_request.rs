//! The request body `/json` and `/v1/check` take: Envoy's `RateLimitRequest` in protobuf's JSON
//! form, with Sluice's `cost` beside `hits_addend`.

use serde::Deserialize;
use serde_json::Value;
use sluice_http::problem::Problem;
use sluice_limiter::{LimitOverride, LimitRequest, RequestDescriptor};
use sluice_rules::Unit;

use crate::envoy::EnvoyUnit;

/// An unsigned integer as protobuf's JSON mapping writes it: a number (`5`, or `5.0` with no
/// fraction) or a decimal string (`"5"`, how 64-bit integers are usually sent).
fn flex_u64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    let v = Option::<Value>::deserialize(d)?;
    let n = match &v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= 2f64.powi(53))
                .map(|f| f as u64)
        }),
        Some(Value::String(s)) => s.parse::<u64>().ok(),
        Some(_) => None,
    };
    n.map(Some).ok_or_else(|| {
        D::Error::custom(format!(
            "expected a non-negative whole number, found {}",
            v.unwrap_or(Value::Null)
        ))
    })
}

#[derive(Debug, Deserialize)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
struct JsonOverride {
    #[serde(alias = "requestsPerUnit", deserialize_with = "flex_u64", default)]
    requests_per_unit: Option<u64>,
    unit: Value,
}

#[derive(Debug, Deserialize)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "flex_u64")]
    hits_addend: Option<u64>,
    /// Sluice's native name for the descriptor's own cost.
    #[serde(default, deserialize_with = "flex_u64")]
    cost: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "flex_u64")]
    hits_addend: Option<u64>,
    /// Sluice's native name for the request's cost.
    #[serde(default, deserialize_with = "flex_u64")]
    cost: Option<u64>,
}

fn parse_unit(v: &Value, field: String) -> Result<Unit, Problem> {
    let unit = match v {
        Value::String(s) => Unit::parse(s),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| EnvoyUnit::try_from(i32::try_from(n).ok()?).ok())
            .and_then(|u| Unit::parse(u.as_str_name())),
        _ => None,
    };
    unit.ok_or_else(|| {
        Problem::bad_request(format!(
            "unknown unit {v}; expected one of {}",
            Unit::NAMES.join(", ")
        ))
        .with_field(field)
    })
}

impl JsonRequest {
    /// The request to decide, and the request-level cost as sent (0 when unset), which the
    /// Envoy answer's dynamic metadata repeats.
    pub(super) fn into_limit_request(self) -> Result<(LimitRequest, u64), Problem> {
        let mut descriptors = Vec::with_capacity(self.descriptors.len());
        for (i, d) in self.descriptors.into_iter().enumerate() {
            let limit_override = match d.limit {
                Some(o) => Some(LimitOverride {
                    requests_per_unit: o.requests_per_unit.ok_or_else(|| {
                        Problem::bad_request("a limit override needs requests_per_unit")
                            .with_field(format!("descriptors[{i}].limit.requests_per_unit"))
                    })?,
                    unit: parse_unit(&o.unit, format!("descriptors[{i}].limit.unit"))?,
                }),
                None => None,
            };
            if d.cost.is_some() && d.hits_addend.is_some() {
                return Err(
                    Problem::bad_request("give `cost` or `hits_addend`, not both")
                        .with_field(format!("descriptors[{i}].cost")),
                );
            }
            descriptors.push(RequestDescriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                envoy_hits: d.hits_addend.is_some(),
                cost: d.cost.or(d.hits_addend),
                limit_override,
            });
        }
        if self.cost.is_some() && self.hits_addend.is_some() {
            return Err(
                Problem::bad_request("give `cost` or `hits_addend`, not both").with_field("cost"),
            );
        }
        let sent = self.cost.or(self.hits_addend).unwrap_or(0);
        let request = LimitRequest {
            domain: self.domain,
            descriptors,
            cost: sent.max(1),
        };
        Ok((request, sent))
    }
}
