//! Every error class names its exact `file:line:col` and a reason a person can act on.

use sluice_rules::{ErrorKind, RuleSet};

/// The single error a text produces, as (line, col, kind, message).
fn error(text: &str) -> (usize, usize, ErrorKind, String) {
    let err = RuleSet::parse("rules.yaml", text).expect_err("the text must be rejected");
    assert_eq!(err.errors().len(), 1, "expected one error, got:\n{err}");
    let e = &err.errors()[0];
    assert_eq!(&*e.location.file, "rules.yaml");
    (
        e.location.line,
        e.location.col,
        e.kind.clone(),
        e.to_string(),
    )
}

#[test]
fn unknown_field_with_did_you_mean() {
    let (line, col, kind, msg) = error(
        "domain: api
descriptors:
  - key: user
    rate_limit:
      unit: second
      request_per_unit: 5
",
    );
    assert_eq!((line, col), (6, 7));
    assert!(matches!(
        kind,
        ErrorKind::UnknownField {
            suggestion: Some("requests_per_unit"),
            ..
        }
    ));
    assert!(
        msg.starts_with(
            "rules.yaml:6:7: unknown field `request_per_unit` in a limit \
             (did you mean `requests_per_unit`?)"
        ),
        "{msg}"
    );
}

#[test]
fn unknown_top_level_field() {
    let (line, col, kind, _) = error("domain: api\ndescriptor:\n  - key: user\n");
    assert_eq!((line, col), (2, 1));
    assert!(matches!(
        kind,
        ErrorKind::UnknownField {
            suggestion: Some("descriptors"),
            ..
        }
    ));
}

#[test]
fn unknown_field_far_from_any_has_no_suggestion() {
    let (_, _, kind, msg) = error("domain: api\ncolour: blue\n");
    assert!(matches!(
        kind,
        ErrorKind::UnknownField {
            suggestion: None,
            ..
        }
    ));
    assert!(!msg.contains("did you mean"), "{msg}");
}

#[test]
fn wrong_type_points_at_the_value() {
    let (line, col, kind, msg) = error(
        "domain: api
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: \"10\"
",
    );
    assert_eq!((line, col), (6, 26));
    assert_eq!(
        kind,
        ErrorKind::WrongType {
            field: "requests_per_unit".into(),
            expected: "a whole number",
            found: "a string",
        }
    );
    assert!(
        msg.ends_with("`requests_per_unit` must be a whole number, found a string"),
        "{msg}"
    );
}

#[test]
fn wrong_type_for_a_list() {
    let (line, col, kind, _) = error("domain: api\ndescriptors: user\n");
    assert_eq!((line, col), (2, 14));
    assert!(matches!(
        kind,
        ErrorKind::WrongType {
            found: "a string",
            ..
        }
    ));
}

#[test]
fn wrong_type_for_a_flag() {
    let (line, col, kind, _) = error(
        "domain: api
descriptors:
  - key: user
    shadow_mode: maybe
    rate_limit: {unit: second, requests_per_unit: 1}
",
    );
    assert_eq!((line, col), (4, 18));
    assert!(matches!(
        kind,
        ErrorKind::WrongType {
            expected: "true or false",
            ..
        }
    ));
}

#[test]
fn negative_limit() {
    let (line, col, kind, msg) = error(
        "domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: -5}
",
    );
    assert_eq!((line, col), (4, 51));
    assert_eq!(
        kind,
        ErrorKind::Negative {
            field: "requests_per_unit".into(),
            value: "-5".into()
        }
    );
    assert!(msg.contains("cannot be negative"), "{msg}");
}

#[test]
fn zero_limit_is_valid() {
    RuleSet::parse(
        "rules.yaml",
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
    )
    .unwrap();
}

#[test]
fn duplicate_descriptor_points_at_the_second_and_names_the_first() {
    let (line, col, kind, msg) = error(
        "domain: api
descriptors:
  - key: user
    value: alice
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    value: alice
    rate_limit: {unit: minute, requests_per_unit: 5}
",
    );
    assert_eq!((line, col), (8, 5));
    assert_eq!(
        kind,
        ErrorKind::DuplicateDescriptor {
            what: "`user: alice`".into(),
            first_line: 3
        }
    );
    assert!(msg.contains("the first is at line 3"), "{msg}");
}

#[test]
fn duplicate_nested_key_only_descriptor() {
    let (line, col, kind, _) = error(
        "domain: api
descriptors:
  - key: route
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: user
        value: \"\"
        rate_limit: {unit: second, requests_per_unit: 2}
",
    );
    assert_eq!((line, col), (7, 9));
    assert!(matches!(
        kind,
        ErrorKind::DuplicateDescriptor { first_line: 5, .. }
    ));
}

#[test]
fn the_same_value_under_different_parents_is_not_a_duplicate() {
    RuleSet::parse(
        "rules.yaml",
        "domain: api
descriptors:
  - key: a
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
",
    )
    .unwrap();
}

#[test]
fn unknown_unit() {
    let (line, col, kind, msg) = error(
        "domain: api
descriptors:
  - key: user
    rate_limit:
      unit: secnd
      requests_per_unit: 1
",
    );
    assert_eq!((line, col), (5, 13));
    assert_eq!(
        kind,
        ErrorKind::UnknownUnit {
            unit: "secnd".into(),
            suggestion: Some("second")
        }
    );
    assert!(msg.contains("use `window:` for any other length"), "{msg}");
}

#[test]
fn unknown_algorithm() {
    let (line, col, kind, _) = error(
        "domain: api
descriptors:
  - key: user
    rate_limit:
      algorithm: token_buckt
      unit: second
      requests_per_unit: 1
",
    );
    assert_eq!((line, col), (5, 18));
    assert_eq!(
        kind,
        ErrorKind::UnknownAlgorithm {
            name: "token_buckt".into(),
            suggestion: Some("token_bucket")
        }
    );
}

#[test]
fn syntax_error() {
    let (line, col, kind, msg) = error("domain: api\ndescriptors:\n  - key: [user\n");
    assert!(matches!(kind, ErrorKind::Syntax(_)), "{msg}");
    assert_eq!(line, 4, "{msg}");
    assert!(col >= 1, "{msg}");
}

#[test]
fn invalid_duration() {
    let (line, col, kind, _) = error(
        "domain: api
descriptors:
  - key: user
    rate_limit: {window: 10 minutes, requests_per_unit: 1}
",
    );
    assert_eq!((line, col), (4, 26));
    assert_eq!(
        kind,
        ErrorKind::InvalidDuration {
            value: "10 minutes".into()
        }
    );
}

#[test]
fn zero_window_is_refused_by_the_policy_where_it_is_written() {
    let (line, col, kind, msg) = error(
        "domain: api
descriptors:
  - key: user
    rate_limit: {window: 0s, requests_per_unit: 1}
",
    );
    assert_eq!((line, col), (4, 26));
    assert!(matches!(kind, ErrorKind::Policy(_)), "{msg}");
}

#[test]
fn unit_and_window_conflict() {
    let (line, col, kind, _) = error(
        "domain: api
descriptors:
  - key: user
    rate_limit:
      unit: second
      window: 30s
      requests_per_unit: 1
",
    );
    assert_eq!((line, col), (6, 15));
    assert!(matches!(
        kind,
        ErrorKind::Conflict {
            first: "unit",
            second: "window",
            ..
        }
    ));
}

#[test]
fn parameter_of_another_algorithm() {
    let (line, col, kind, _) = error(
        "domain: api
descriptors:
  - key: user
    rate_limit:
      algorithm: sliding_log
      window: 1m
      requests_per_unit: 10
      burst: 5
",
    );
    assert_eq!((line, col), (8, 14));
    assert!(matches!(
        kind,
        ErrorKind::ParamNotForAlgorithm { param: "burst", .. }
    ));
}

#[test]
fn missing_key_and_missing_domain() {
    let (line, col, kind, _) = error("domain: api\ndescriptors:\n  - value: x\n");
    assert_eq!((line, col), (3, 5));
    assert!(matches!(kind, ErrorKind::MissingField { field: "key", .. }));
    let (line, col, kind, _) = error("descriptors: []\n");
    assert_eq!((line, col), (1, 1));
    assert!(matches!(
        kind,
        ErrorKind::MissingField {
            field: "domain",
            ..
        }
    ));
}

#[test]
fn unknown_action_and_store_error_policy() {
    let (line, col, kind, _) = error(
        "domain: api
descriptors:
  - key: user
    action: rejekt
    rate_limit: {unit: second, requests_per_unit: 1}
",
    );
    assert_eq!((line, col), (4, 13));
    assert!(matches!(
        kind,
        ErrorKind::UnknownVariant {
            suggestion: Some("reject"),
            ..
        }
    ));
    let (line, col, _, _) = error("domain: api\non_store_error: fail\n");
    assert_eq!((line, col), (2, 17));
}

#[test]
fn unit_with_unlimited_is_refused_as_envoy_does() {
    let (line, col, kind, _) = error(
        "domain: api
descriptors:
  - key: user
    rate_limit: {unlimited: true, unit: second}
",
    );
    assert_eq!((line, col), (4, 41));
    assert!(matches!(
        kind,
        ErrorKind::Conflict {
            first: "unlimited",
            second: "unit",
            ..
        }
    ));
}

#[test]
fn empty_file() {
    let (line, col, kind, _) = error("# nothing here\n");
    assert_eq!((line, col, kind), (1, 1, ErrorKind::Empty));
}

#[test]
fn several_errors_are_reported_together_in_file_order() {
    let err = RuleSet::parse(
        "rules.yaml",
        "domain: api
descriptors:
  - key: user
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: -1}
  - kee: path
",
    )
    .unwrap_err();
    let at: Vec<_> = err
        .errors()
        .iter()
        .map(|e| (e.location.line, e.location.col))
        .collect();
    assert_eq!(at, [(4, 24), (6, 51), (7, 5)]);
    let text = err.to_string();
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.lines().all(|l| l.starts_with("rules.yaml:")), "{text}");
}

#[test]
fn the_same_domain_in_two_files_names_both() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    std::fs::write(&a, "domain: api\n").unwrap();
    std::fs::write(&b, "# second\ndomain: api\n").unwrap();
    let err = RuleSet::load(dir.path()).unwrap_err();
    let e = err.first().unwrap();
    assert_eq!(&*e.location.file, b.display().to_string());
    assert_eq!((e.location.line, e.location.col), (2, 9));
    let ErrorKind::DuplicateDomain { domain, first } = &e.kind else {
        panic!("{e}")
    };
    assert_eq!(domain, "api");
    assert_eq!(&*first.file, a.display().to_string());
    assert_eq!((first.line, first.col), (1, 9));
    let msg = e.to_string();
    assert!(msg.contains(&format!("{}:1:9", a.display())), "{msg}");
    assert!(msg.starts_with(&format!("{}:2:9", b.display())), "{msg}");
}

#[test]
fn an_unreadable_path_is_an_error_at_its_start() {
    let err = RuleSet::load(std::path::Path::new("/nonexistent/sluice/rules.yaml")).unwrap_err();
    let e = err.first().unwrap();
    assert!(matches!(e.kind, ErrorKind::Io(_)));
    assert_eq!((e.location.line, e.location.col), (1, 1));
}

#[test]
fn syntax_error_inside_a_line() {
    let (line, col, kind, msg) = error("domain: api\n  bad indent: x\n");
    assert_eq!((line, col), (2, 13), "{msg}");
    assert!(matches!(kind, ErrorKind::Syntax(_)), "{msg}");
}

#[test]
fn an_action_without_parameters_says_so() {
    let (line, col, _, msg) = error(
        "domain: api
action: {reject: {status: 500}}
",
    );
    assert_eq!((line, col), (2, 19));
    assert!(
        msg.ends_with("unknown field `status` in the action's parameters; it takes no fields"),
        "{msg}"
    );
}

#[test]
fn deep_descriptor_nesting_loads_and_matches() {
    let depth = 100;
    let mut text = String::from("domain: deep\ndescriptors:\n");
    for d in 0..depth {
        let pad = "  ".repeat(2 * d + 1);
        text.push_str(&format!(
            "{pad}- key: k{d}\n{pad}  rate_limit: {{unit: second, requests_per_unit: {d}}}\n"
        ));
        if d + 1 < depth {
            text.push_str(&format!("{pad}  descriptors:\n"));
        }
    }
    let rules = RuleSet::parse("deep.yaml", &text).unwrap();
    let entries: Vec<(String, String)> = (0..depth)
        .map(|d| (format!("k{d}"), "v".to_owned()))
        .collect();
    let m = rules.checks("deep", &[entries], 1);
    assert_eq!(m.checks.len(), 1);
    assert_eq!(m.checks[0].rule.policy.limit(), depth as u64 - 1);
    assert!(m.checks[0].key.len() <= sluice_rules::MAX_KEY_LEN);
}

/// A store that holds windows of up to a day, as the redis store holds up to about 104 days.
fn daily_store(policy: &sluice_core::Policy) -> Result<(), sluice_core::UnsupportedPolicy> {
    if policy.window() <= std::time::Duration::from_secs(86_400) {
        Ok(())
    } else {
        Err(sluice_core::UnsupportedPolicy {
            store: "daily",
            reason: "windows up to a day only".to_owned(),
        })
    }
}

#[test]
fn rules_a_store_cannot_hold_are_each_named_where_written_in_file_order() {
    let rules = RuleSet::from_sources([
        (
            "b.yaml",
            "domain: b
descriptors:
  - key: k
    rate_limit: {unit: week, requests_per_unit: 1}
",
        ),
        (
            "a.yaml",
            "domain: a
descriptors:
  - key: plan
    value: free
    rate_limit: {unit: day, requests_per_unit: 100}
    descriptors:
      - key: user
        limits:
          - {name: per_user, requests_per_unit: 10, window: 200d}
          - {requests_per_unit: 1, unit: second}
  - key: ip
    value: 10.*
    rate_limit: {unit: month, requests_per_unit: 5}
",
        ),
    ])
    .unwrap();
    assert_eq!(rules.rules().count(), 5, "every limit, nested ones too");
    let err = rules.check_supported(daily_store).unwrap_err();
    let lines: Vec<String> = err.errors().iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "a.yaml:9:13: rule \"per_user\" cannot be held by the daily store: windows up to a \
             day only",
            "a.yaml:13:17: rule \"a/ip=10.*\" cannot be held by the daily store: windows up to \
             a day only",
            "b.yaml:4:17: rule \"b/k\" cannot be held by the daily store: windows up to a day \
             only",
        ]
    );
    assert!(matches!(
        err.errors()[0].kind,
        ErrorKind::Unsupported { .. }
    ));
}

#[test]
fn a_message_is_one_line_whatever_the_file_holds() {
    // A key with a newline and an escape character in it, echoed by the message.
    let err = RuleSet::parse(
        "rules.yaml",
        "domain: api\ndescriptors:\n  - key: user\n    \"bad\\nfield\\u001b[31m\": 1\n",
    )
    .expect_err("an unknown field");
    let msg = err.to_string();
    assert!(!msg.contains('\n') && !msg.contains('\u{1b}'), "{msg:?}");
    assert!(msg.contains("bad\\nfield\\u{1b}[31m"), "{msg}");
    assert!(msg.starts_with("rules.yaml:4:5:"), "{msg}");
}
