//! The admin endpoints: the rules in force, a counter inspected and reset, reloads refused and
//! taken.

use serde_json::Value;

use crate::harness::{Harness, json_one, key_path};

#[tokio::test]
async fn admin_shows_reloads_inspects_and_resets() {
    let h = Harness::start().await;
    let rules: Value = h.get("/v1/rules").await.json().await.unwrap();
    assert_eq!(rules["domains"][0]["domain"], "shop");

    // Exhaust a client, find its counter, inspect it and reset it.
    let body = json_one("client", "z");
    let mut key = String::new();
    for _ in 0..4 {
        let (_, r, _) = h.post("/v1/check", &body).await;
        key = r["descriptors"][0]["limits"][0]["key"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    let encoded = key_path(&key);
    let state: Value = h
        .get(&format!("/v1/keys/{encoded}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(state["remaining"], 0);
    assert_eq!(state["limited"], true);
    let reset: Value = h
        .delete(&format!("/v1/keys/{encoded}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(reset["reset"], true);
    let (status, _, _) = h.post("/v1/check", &body).await;
    assert_eq!(status, 200, "unblocked");
    let r = h.get("/v1/keys/%7Bshop%7Cclient%3Dz%7D%3Aabc").await;
    assert_eq!(r.status().as_u16(), 404);

    // A broken file is refused with its location and the old rules stay.
    std::fs::write(h.rules_path(), "domain: shop\ndescriptors:\n  - key: client\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    let r = h.post_body("/v1/reload", Vec::new()).await;
    assert_eq!(r.status().as_u16(), 422);
    let problem: Value = r.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("rules.yaml:4:"),
        "{problem}"
    );
    // A valid one takes over.
    std::fs::write(h.rules_path(), "domain: shop\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n").unwrap();
    let r: Value = h
        .post_body("/v1/reload", Vec::new())
        .await
        .json()
        .await
        .unwrap();
    assert!(
        r["result"] == "reloaded" || r["result"] == "unchanged",
        "{r}"
    );
    let (_, r, _) = h.post("/v1/check", &body).await;
    assert_eq!(r["descriptors"][0]["limits"][0]["limit"], 1000);
}
