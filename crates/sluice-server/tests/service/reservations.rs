//! `/v1/reserve` and `/v1/settle` on the memory store: reservations all or none, what was not
//! used given back, usage beyond the reservation charged, one settle only, expiry, and bad
//! input refused with nothing taken.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Harness, json_one};

/// A reservation of `amount` tokens for `tenant` (the `tokens` rule: 100 a minute).
fn reserve(tenant: &str, amount: Value) -> Value {
    let mut body = json_one("tokens", tenant);
    body["amount"] = amount;
    body
}

/// What the `tokens` limit of `tenant` has left, by a check that consumes nothing.
async fn remaining(h: &Harness, tenant: &str) -> u64 {
    let mut body = json_one("tokens", tenant);
    body["descriptors"][0]["cost"] = json!(0);
    let (_, r, _) = h.post("/v1/check", &body).await;
    r["descriptors"][0]["limits"][0]["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("no remaining in {r}"))
}

async fn settle(h: &Harness, id: &Value, used: Value) -> (u16, Value) {
    let (status, r, _) = h
        .post("/v1/settle", &json!({"reservation": id, "used": used}))
        .await;
    (status, r)
}

#[tokio::test]
async fn what_was_reserved_and_not_used_is_given_back() {
    let h = Harness::start().await;
    let (status, r, headers) = h.post("/v1/reserve", &reserve("acme", json!(60))).await;
    assert_eq!(status, 200, "{r}");
    let id = r["reservation"].clone();
    assert!(id.as_str().unwrap().starts_with("rsv_"), "{r}");
    assert_eq!(r["amount"], 60);
    assert_eq!(r["ttl"], 300.0, "the default ttl");
    assert_eq!(r["descriptors"][0]["limits"][0]["remaining"], 40);
    assert!(headers.contains_key("ratelimit"), "{headers:?}");

    // 40 left: a reservation of 50 is refused whole, as a check would be, and takes nothing.
    let (status, refused, _) = h.post("/v1/reserve", &reserve("acme", json!(50))).await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["reservation"], Value::Null);
    assert_eq!(remaining(&h, "acme").await, 40);

    let (status, s) = settle(&h, &id, json!(20)).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(
        (&s["reserved"], &s["used"], &s["refunded"], &s["charged"]),
        (&json!(60), &json!(20), &json!(40), &json!(0))
    );
    assert_eq!(remaining(&h, "acme").await, 80);
    let (status, _, _) = h.post("/v1/reserve", &reserve("acme", json!(50))).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_second_settle_is_a_conflict_and_gives_nothing_back() {
    let h = Harness::start().await;
    let (_, r, _) = h.post("/v1/reserve", &reserve("beta", json!(30))).await;
    let id = r["reservation"].clone();
    assert_eq!(settle(&h, &id, json!(10)).await.0, 200);
    assert_eq!(remaining(&h, "beta").await, 90);
    let (status, again) = settle(&h, &id, json!(0)).await;
    assert_eq!(status, 409, "{again}");
    assert!(
        again["detail"].as_str().unwrap().contains("settled before"),
        "{again}"
    );
    assert_eq!(remaining(&h, "beta").await, 90, "nothing refunded twice");
}

#[tokio::test]
async fn usage_beyond_the_reservation_is_charged_past_the_limit() {
    let h = Harness::start().await;
    let (_, r, _) = h.post("/v1/reserve", &reserve("gamma", json!(10))).await;
    let (status, s) = settle(&h, &r["reservation"], json!(150)).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!((&s["refunded"], &s["charged"]), (&json!(0), &json!(140)));
    let (status, c, _) = h.post("/v1/check", &json_one("tokens", "gamma")).await;
    assert_eq!(status, 429, "the next request is refused: {c}");
    assert_eq!(c["descriptors"][0]["limits"][0]["remaining"], 0);
}

#[tokio::test]
async fn an_expired_reservation_counted_in_full_and_gives_nothing_back() {
    let h = Harness::start().await;
    let mut body = reserve("delta", json!(70));
    body["ttl"] = json!("10s");
    let (_, r, _) = h.post("/v1/reserve", &body).await;
    assert_eq!(r["ttl"], 10.0);
    h.clock.advance(Duration::from_secs(11));
    let (status, s) = settle(&h, &r["reservation"], json!(0)).await;
    assert_eq!(status, 410, "{s}");
    assert_eq!(remaining(&h, "delta").await, 30);
    // Remembered as expired for a second ttl, then forgotten.
    h.clock.advance(Duration::from_secs(10));
    assert_eq!(settle(&h, &r["reservation"], json!(0)).await.0, 404);
}

#[tokio::test]
async fn unknown_garbled_and_forged_ids_are_not_found() {
    let h = Harness::start().await;
    for id in [
        json!("rsv_0123456789abcdef0123456789abcdef"),
        json!("rsv_nothex"),
        json!(""),
        json!("x".repeat(5000)),
    ] {
        let (status, r) = settle(&h, &id, json!(1)).await;
        assert_eq!(status, 404, "{id}: {r}");
        assert_eq!(r["field"], "reservation", "{r}");
    }
}

#[tokio::test]
async fn a_reservation_takes_from_every_enforced_limit_or_from_none() {
    let h = Harness::start().await;
    // `user` has a daily limit of 5: a reservation of 6 is refused by it, and the token budget
    // of the same request is left whole.
    let body = json!({"domain": "shop", "amount": 6, "descriptors": [
        {"entries": [{"key": "tokens", "value": "eps"}]},
        {"entries": [{"key": "user", "value": "eps"}]},
    ]});
    let (status, r, _) = h.post("/v1/reserve", &body).await;
    assert_eq!(status, 429, "{r}");
    assert_eq!(r["reservation"], Value::Null);
    assert_eq!(remaining(&h, "eps").await, 100);
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_and_takes_nothing() {
    let h = Harness::start().await;
    let big = u64::from(u32::MAX) + 1;
    let cases = [
        (json!(0), "amount"),
        (json!(-1), "amount"),
        (json!(1.5), "amount"),
        (json!("ten"), "amount"),
        (json!(big), "amount"),
    ];
    for (amount, field) in cases {
        let (status, r, _) = h
            .post("/v1/reserve", &reserve("zeta", amount.clone()))
            .await;
        assert_eq!(status, 400, "{amount}: {r}");
        assert_eq!(r["field"], field, "{amount}: {r}");
    }
    let mut no_amount = json_one("tokens", "zeta");
    no_amount["ttl"] = json!("1m");
    let (status, r, _) = h.post("/v1/reserve", &no_amount).await;
    assert_eq!((status, r["field"].clone()), (400, json!("amount")), "{r}");
    for ttl in [
        json!("2h"),
        json!("0s"),
        json!("soon"),
        json!(-3),
        json!([1]),
    ] {
        let mut body = reserve("zeta", json!(5));
        body["ttl"] = ttl.clone();
        let (status, r, _) = h.post("/v1/reserve", &body).await;
        assert_eq!(
            (status, r["field"].clone()),
            (400, json!("ttl")),
            "{ttl}: {r}"
        );
    }
    let mut unknown = reserve("zeta", json!(5));
    unknown["amonut"] = json!(5);
    let (status, r, _) = h.post("/v1/reserve", &unknown).await;
    assert_eq!(status, 400, "{r}");
    let mut own_cost = reserve("zeta", json!(5));
    own_cost["descriptors"][0]["hits_addend"] = json!(3);
    let (status, r, _) = h.post("/v1/reserve", &own_cost).await;
    assert_eq!(status, 400, "{r}");
    assert_eq!(remaining(&h, "zeta").await, 100, "nothing was taken");

    let (_, r, _) = h.post("/v1/reserve", &reserve("zeta", json!(5))).await;
    let id = r["reservation"].clone();
    for used in [
        json!(-1),
        json!(2.5),
        json!("many"),
        Value::Null,
        json!(big),
    ] {
        let (status, s) = settle(&h, &id, used.clone()).await;
        assert_eq!(
            (status, s["field"].clone()),
            (400, json!("used")),
            "{used}: {s}"
        );
    }
    let (status, s, _) = h.post("/v1/settle", &json!({"reservation": id})).await;
    assert_eq!(status, 400, "{s}");
    assert_eq!(remaining(&h, "zeta").await, 95, "no bad settle refunded");
    assert_eq!(settle(&h, &id, json!(5)).await.0, 200, "nor settled it");
}

#[tokio::test]
async fn envoys_negative_hits_give_units_back_on_json_and_grpc() {
    use crate::harness::{addend, descriptor, request};

    let h = Harness::start().await;
    let mut take = json_one("tokens", "eta");
    take["hits_addend"] = json!(30);
    let (status, _, _) = h.post("/json", &take).await;
    assert_eq!(status, 200);
    assert_eq!(remaining(&h, "eta").await, 70);

    let give = |n: u64| {
        json!({"domain": "shop", "descriptors": [{
            "entries": [{"key": "tokens", "value": "eta"}],
            "hitsAddend": n,
            "isNegativeHits": true,
        }]})
    };
    let (status, r, _) = h.post("/json", &give(20)).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["statuses"][0]["code"], "OK");
    assert_eq!(r["statuses"][0]["limitRemaining"], 90);
    assert_eq!(remaining(&h, "eta").await, 90);
    // Floored: never more than the limit holds.
    h.post("/json", &give(500)).await;
    assert_eq!(remaining(&h, "eta").await, 100);

    // The same over gRPC, with Envoy's own field.
    let mut rls = h.grpc().await;
    let mut used = descriptor(&[("tokens", "theta")]);
    used.hits_addend = addend(50);
    rls.ask(request(vec![used.clone()])).await;
    assert_eq!(remaining(&h, "theta").await, 50);
    used.hits_addend = addend(15);
    used.is_negative_hits = true;
    let answer = rls.ask(request(vec![used])).await;
    assert_eq!(answer.overall_code, 1, "OK: {answer:?}");
    assert_eq!(answer.statuses[0].limit_remaining, 65);
    assert_eq!(remaining(&h, "theta").await, 65);

    let metrics = h.metrics().await;
    assert!(
        metrics.contains(
            r#"sluice_decisions_total{domain="shop",rule="shop/tokens",outcome="refunded"} 3"#
        ),
        "{metrics}"
    );
}
