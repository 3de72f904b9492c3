//! The dynamic metadata of an Envoy answer (envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`):
//! what was asked, and the `metadata` of every descriptor rule the request passed, merged, so
//! that Envoy can hand them to later filters and access logs. Built once for gRPC and `/json`.

use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use sluice_limiter::{LimitRequest, Verdict};
use sluice_rules::MetaValue;

use crate::envoy::EnvoyUnit;

/// The dynamic metadata for `request` decided as `verdict`. `hits_addend` is the request's own
/// field as sent (0 when unset). Fields, as Envoy's service names them: `domain`;
/// `descriptors`, each with its `entries` as `key=value`, its `limit` override and its own
/// `hitsAddend`; the request's `hitsAddend` when not 0; and `metadata`, the rules' metadata of
/// the descriptors that passed, merged (a field already present is kept, mappings merge).
pub fn dynamic_metadata(hits_addend: u32, request: &LimitRequest, verdict: &Verdict) -> Struct {
    let mut fields = Struct::default().fields;
    fields.insert("domain".into(), string(&request.domain));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut f = Struct::default().fields;
            let entries = d
                .entries
                .iter()
                .map(|(k, v)| string(&format!("{k}={v}")))
                .collect();
            f.insert("entries".into(), list(entries));
            if let Some(o) = d.limit_override {
                let unit = crate::envoy::envoy_unit(o.unit.duration());
                let text = format!(
                    "requests_per_unit:{} unit:{}",
                    o.requests_per_unit,
                    EnvoyUnit::as_str_name(&unit)
                );
                f.insert("limit".into(), string(&text));
            }
            if let Some(cost) = d.cost {
                f.insert("hitsAddend".into(), number(cost as f64));
            }
            structure(Struct { fields: f })
        })
        .collect();
    fields.insert("descriptors".into(), list(descriptors));
    if hits_addend != 0 {
        fields.insert("hitsAddend".into(), number(f64::from(hits_addend)));
    }
    let mut passed = Struct::default();
    for i in 0..request.descriptors.len() {
        if verdict.unlimited.contains(&i) || verdict.status(i).refused {
            continue;
        }
        let rule_metadata = verdict
            .for_descriptor(i)
            .find_map(|l| l.rule.metadata.clone());
        if let Some(m) = rule_metadata {
            merge(&mut passed, &to_struct(&m));
        }
    }
    if !passed.fields.is_empty() {
        fields.insert("metadata".into(), structure(passed));
    }
    Struct { fields }
}

/// Adds `src`'s fields to `dest`: a field `dest` lacks is added; where both hold a mapping,
/// they merge; otherwise `dest`'s value stays (the first passing descriptor's wins).
fn merge(dest: &mut Struct, src: &Struct) {
    for (k, v) in &src.fields {
        match dest.fields.get_mut(k) {
            None => {
                dest.fields.insert(k.clone(), v.clone());
            }
            Some(Value {
                kind: Some(Kind::StructValue(d)),
            }) => {
                if let Some(Kind::StructValue(s)) = &v.kind {
                    merge(d, s);
                }
            }
            Some(_) => {}
        }
    }
}

fn to_struct(m: &[(String, MetaValue)]) -> Struct {
    Struct {
        fields: m.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
    }
}

fn to_value(v: &MetaValue) -> Value {
    match v {
        MetaValue::Null => Value {
            kind: Some(Kind::NullValue(0)),
        },
        MetaValue::Bool(b) => Value {
            kind: Some(Kind::BoolValue(*b)),
        },
        MetaValue::Number(n) => number(*n),
        MetaValue::String(s) => string(s),
        MetaValue::List(items) => list(items.iter().map(to_value).collect()),
        MetaValue::Map(m) => structure(to_struct(m)),
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}

/// A protobuf `Struct` in its JSON form, as `/json` answers it and the xDS client reads rules.
pub fn struct_json(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::json!(n),
        Some(Kind::StringValue(s)) => serde_json::json!(s),
        Some(Kind::BoolValue(b)) => serde_json::json!(b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value_json).collect(),
    }
}
