use super::*;

fn input(json: &str) -> EventConfigInput {
    serde_json::from_str(json).unwrap()
}

#[test]
fn defaults_filled() {
    let c = input(r#"{"sale_start":"2027-01-10T10:00:00+09:00","admit_per_minute":600}"#)
        .validate(600, 120)
        .unwrap();
    assert_eq!(c.mode, Mode::Queue);
    assert_eq!(c.max_active, 0);
    assert_eq!(c.token_ttl_s, 600);
    assert_eq!(c.max_session_s, 1800);
    assert_eq!(c.claim_deadline_s, 120);
    assert_eq!(c.pow_difficulty, 0);
    assert_eq!(c.sale_start_ms(), 1_799_542_800_000);
}

#[test]
fn bad_values_all_reported() {
    let errs = input(
        r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":-5,"max_active":-1,
            "token_ttl_s":0,"pow_difficulty":99,"claim_deadline_s":1,
            "auto":{"floor":100,"ceiling":10,"max_error_ratio":2.0}}"#,
    )
    .validate(600, 120)
    .unwrap_err();
    let fields: Vec<_> = errs.iter().map(|e| e.field).collect();
    for f in [
        "admit_per_minute",
        "max_active",
        "token_ttl_s",
        "claim_deadline_s",
        "pow_difficulty",
        "auto.ceiling",
        "auto.max_error_ratio",
    ] {
        assert!(fields.contains(&f), "{f} not reported in {fields:?}");
    }
}

#[test]
fn max_session_is_at_least_one_token_and_old_configs_read_the_default() {
    let base = r#""sale_start":"2027-01-10T10:00:00Z","admit_per_minute":1"#;
    let long = input(&format!(r#"{{{base},"token_ttl_s":3600}}"#))
        .validate(600, 120)
        .unwrap();
    assert_eq!(
        long.max_session_s, 3600,
        "the default never undercuts the token"
    );
    let errs = input(&format!(
        r#"{{{base},"token_ttl_s":600,"max_session_s":599}}"#
    ))
    .validate(600, 120)
    .unwrap_err();
    assert_eq!(errs[0].field, "max_session_s");
    let mut stored = serde_json::to_value(&long).unwrap();
    stored.as_object_mut().unwrap().remove("max_session_s");
    let old: EventConfig = serde_json::from_value(stored).unwrap();
    assert_eq!(old.max_session_s, DEFAULT_MAX_SESSION_S);
}

#[test]
fn registered_rooms_need_a_closing_time_before_the_sale() {
    let base = r#""sale_start":"2027-01-10T10:00:00Z","admit_per_minute":1"#;
    let ok = input(&format!(
        r#"{{{base},"access":"registered","registration_closes":"2027-01-10T10:00:00Z"}}"#
    ))
    .validate(600, 120)
    .unwrap();
    assert_eq!(ok.access, Access::Registered);
    assert_eq!(ok.registration_closes_ms(), Some(ok.sale_start_ms()));
    for (extra, why) in [
        (r#","access":"registered""#, "required"),
        (
            r#","access":"registered","registration_closes":"2027-01-10T10:00:01Z""#,
            "after sale_start",
        ),
        (
            r#","registration_closes":"2027-01-09T10:00:00Z""#,
            "only applies",
        ),
    ] {
        let errs = input(&format!("{{{base}{extra}}}"))
            .validate(600, 120)
            .unwrap_err();
        assert_eq!(errs[0].field, "registration_closes");
        assert!(errs[0].problem.contains(why), "{errs:?}");
    }
    let open = input(&format!("{{{base}}}")).validate(600, 120).unwrap();
    let mut stored = serde_json::to_value(&open).unwrap();
    assert!(stored.get("registration_closes").is_none());
    stored.as_object_mut().unwrap().remove("access");
    let old: EventConfig = serde_json::from_value(stored).unwrap();
    assert_eq!(old.access, Access::Open);
}

#[test]
fn absurd_rate_refused() {
    assert!(
        input(r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":99999999999}"#)
            .validate(600, 120)
            .is_err()
    );
}

#[test]
fn unknown_fields_and_modes_refused() {
    assert!(
        serde_json::from_str::<EventConfigInput>(
            r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":1,"x":1}"#
        )
        .is_err()
    );
    assert!(
        serde_json::from_str::<EventConfigInput>(
            r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":1,"mode":"fast"}"#
        )
        .is_err()
    );
}
