//! The gateway section: routes and trusted proxies, and their located errors.

use sluice_rules::{EntrySpec, RouteHeaders, RuleSet, ValueSource};

const GATEWAY: &str = r#"
domain: gw
descriptors:
  - key: client_ip
    rate_limit: {unit: minute, requests_per_unit: 5}
trusted_proxies: [10.0.0.0/8, "::1"]
routes:
  - name: users
    path: /users/{id}
    methods: [get, POST]
    host: "*.example.com"
    headers: both
    cost: 2
    descriptors:
      - - {key: client_ip, from: client_ip}
      - - {key: user, from: "param:id"}
        - {key: plan, from: "header:X-Plan", default: free}
      - - {key: global, value: all}
  - path: /api/*
    descriptors:
      - [{key: client_ip, from: client_ip}]
"#;

#[test]
fn a_gateway_file_loads_with_its_routes_in_order() {
    let rules = RuleSet::parse("gw.yaml", GATEWAY).unwrap();
    let g = rules.gateway().expect("gateway section");
    assert_eq!(g.trusted_proxies.len(), 2);
    assert!(g.trusted_proxies[0].contains("10.2.3.4".parse().unwrap()));
    assert_eq!(g.routes.len(), 2);
    let users = &g.routes[0];
    assert_eq!(&*users.name, "users");
    assert_eq!(users.methods, ["GET", "POST"]);
    assert_eq!(users.headers, RouteHeaders::Both);
    assert_eq!(users.cost, 2);
    assert_eq!(users.domain, "gw");
    assert_eq!(
        users.descriptors[1][1],
        EntrySpec {
            key: "plan".into(),
            source: ValueSource::Header("x-plan".into()),
            default: Some("free".into()),
        }
    );
    assert_eq!(
        users.descriptors[2][0].source,
        ValueSource::Constant("all".into())
    );
    assert_eq!(
        users.matches("GET", Some("a.example.com"), "/users/7"),
        Some(vec![("id", "7")])
    );
    assert_eq!(
        users.matches("DELETE", Some("a.example.com"), "/users/7"),
        None
    );
    assert_eq!(users.matches("GET", Some("example.org"), "/users/7"), None);
    assert_eq!(&*g.routes[1].name, "/api/*");
    assert_eq!(g.routes[1].headers, RouteHeaders::Ietf);
}

#[test]
fn a_file_without_routes_has_no_gateway() {
    let rules = RuleSet::parse("r.yaml", "domain: a\n").unwrap();
    assert!(rules.gateway().is_none());
}

fn first_error(text: &str) -> String {
    RuleSet::parse("gw.yaml", text)
        .unwrap_err()
        .first()
        .unwrap()
        .to_string()
}

#[test]
fn route_errors_are_located() {
    let e = first_error("domain: gw\nroutes:\n  - path: api/*\n");
    assert!(e.starts_with("gw.yaml:3:11: `path` is `api/*`"), "{e}");
    let e = first_error("domain: gw\ntrusted_proxies: [10.0.0.0/8, 10.0.0.0/40]\n");
    assert!(
        e.starts_with("gw.yaml:2:31: `trusted_proxies` is `10.0.0.0/40`"),
        "{e}"
    );
    let e = first_error(
        "domain: gw\nroutes:\n  - path: /a\n    descriptors:\n      - [{key: k, from: clientip}]\n",
    );
    assert!(
        e.starts_with("gw.yaml:5:25: unknown value source `clientip` (did you mean `client_ip`?)"),
        "{e}"
    );
    let e = first_error(
        "domain: gw\nroutes:\n  - path: /users/{id}\n    descriptors:\n      - [{key: k, from: \"param:uid\"}]\n",
    );
    assert!(
        e.starts_with("gw.yaml:5:25: path parameter `uid` is not defined"),
        "{e}"
    );
    let e = first_error("domain: gw\nroutes:\n  - path: /a\n    domain: other\n");
    assert!(
        e.starts_with("gw.yaml:3:5: domain `other` is not defined"),
        "{e}"
    );
    let e = first_error("domain: gw\nroutes:\n  - path: /a\n    headrs: both\n");
    assert!(
        e.starts_with("gw.yaml:4:5: unknown field `headrs` in a route (did you mean `headers`?)"),
        "{e}"
    );
    let e = first_error(
        "domain: gw\nroutes:\n  - descriptors:\n      - [{key: k, from: method, value: x}]\n",
    );
    assert!(e.contains("`from` and `value` cannot both be set"), "{e}");
}

#[test]
fn routes_in_two_files_are_refused() {
    let e = RuleSet::from_sources([
        ("a.yaml", "domain: a\nroutes: []\n"),
        ("b.yaml", "domain: b\nroutes: []\n"),
    ])
    .unwrap_err();
    let e = e.first().unwrap().to_string();
    assert!(e.contains("is already set at"), "{e}");
}

const BUDGETED: &str = r#"
domain: gw
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 100000}
routes:
  - path: /v1/chat/completions
    usage:
      reserve: {from: "$.max_tokens", default: 1000, max: 8000, max_body: 65536}
      settle: {from: "usage.total_tokens"}
      ttl: 2m
    descriptors:
      - [{key: api_key, from: api_key}]
  - path: /v1/embeddings
    usage:
      reserve: {max: 500}
  - path: /v1/other
    descriptors:
      - [{key: api_key, from: api_key}]
"#;

#[test]
fn a_route_with_usage_loads_its_reservation_and_settle() {
    let rules = RuleSet::parse("gw.yaml", BUDGETED).unwrap();
    let routes = &rules.gateway().unwrap().routes;
    let chat = routes[0].usage.as_deref().expect("usage");
    assert_eq!(
        chat.reserve
            .from
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("max_tokens")
    );
    assert_eq!(
        (
            chat.reserve.default,
            chat.reserve.max,
            chat.reserve.max_body
        ),
        (1000, 8000, 65536)
    );
    assert_eq!(chat.settle.to_string(), "usage.total_tokens");
    assert_eq!(chat.ttl, Some(std::time::Duration::from_secs(120)));
    // Without `default`, a request reserves `max`; without `settle`, the OpenAI shape is read.
    let embeddings = routes[1].usage.as_deref().expect("usage");
    assert_eq!(embeddings.reserve.from, None);
    assert_eq!(
        (embeddings.reserve.default, embeddings.reserve.max),
        (500, 500)
    );
    assert_eq!(embeddings.reserve.max_body, sluice_rules::DEFAULT_MAX_BODY);
    assert_eq!(embeddings.settle.to_string(), "usage.total_tokens");
    assert_eq!(embeddings.ttl, None);
    assert!(routes[2].usage.is_none());
}

#[test]
fn usage_errors_are_located() {
    let route = |usage: &str| format!("domain: gw\nroutes:\n  - path: /a\n    usage: {usage}\n");
    let cases = [
        (
            "{reserve: {from: \"usage..x\", default: 5}}",
            "gw.yaml:4:29: `from` is `usage..x`, which is not valid: a JSON path",
        ),
        (
            "{reserve: {default: 0}}",
            "gw.yaml:4:32: `default` is 0, outside the range of 1 to 4294967295",
        ),
        (
            "{reserve: {default: 4294967296}}",
            "gw.yaml:4:32: `default` is 4294967296, outside the range",
        ),
        (
            "{reserve: {default: 10, max: 5}}",
            "gw.yaml:4:32: `default` is 10, outside the range of 1 to `max`",
        ),
        (
            "{reserve: {from: max_tokens}}",
            "gw.yaml:4:22: a route's usage reserve without `max` needs `default`",
        ),
        (
            "{settle: {from: x}}",
            "gw.yaml:4:12: a route's usage needs `reserve`",
        ),
        (
            "{reserve: {default: 5}, ttl: 0s}",
            "gw.yaml:4:41: `ttl` is `0`, which is not valid",
        ),
        (
            "{reserve: {default: 5}, ttl: soon}",
            "gw.yaml:4:41: `soon` is not a duration",
        ),
        (
            "{reserve: {default: 5, max_body: 0}}",
            "gw.yaml:4:45: `max_body` is 0, outside the range of 1 byte or more",
        ),
        (
            "{reserve: {default: 5}, setle: {from: x}}",
            "gw.yaml:4:36: unknown field `setle` in a route's usage (did you mean `settle`?)",
        ),
        (
            "{reserve: {default: -5}}",
            "gw.yaml:4:32: `default` is -5, but it cannot be negative",
        ),
    ];
    for (usage, expected) in cases {
        let e = first_error(&route(usage));
        assert!(e.starts_with(expected), "{usage}: {e}");
    }
}

#[test]
fn the_token_budget_example_loads() {
    let text = include_str!("../../../examples/token-budget.yaml");
    let rules = RuleSet::parse("token-budget.yaml", text).unwrap();
    let chat = &rules.gateway().unwrap().routes[0];
    let usage = chat.usage.as_deref().expect("a token budget");
    assert_eq!((usage.reserve.default, usage.reserve.max), (1000, 8000));
    assert!(rules.unmatched_route_keys().is_empty());
}
