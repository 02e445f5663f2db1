use super::*;

fn keys(kids: &[(&str, &str)], current: &str) -> TicketKeys {
    let signing: Vec<SigningKeySetting> = kids
        .iter()
        .map(|(kid, seed)| SigningKeySetting {
            kid: (*kid).into(),
            secret: SecretString::from(B64.encode(seed.as_bytes())),
        })
        .collect();
    TicketKeys::new(
        &signing,
        current,
        &SecretString::from("handle"),
        &SecretString::from("door"),
    )
    .expect("keys")
}

fn claims() -> TicketClaims {
    TicketClaims {
        tid: "t1".into(),
        evt: "ev".into(),
        seat: Some("S1-R1-1".into()),
        tier: None,
        hnd: "h".into(),
        ver: 1,
        iat: 1_800_000_000,
        rot: None,
    }
}

const SEED_A: &str = "0123456789abcdef0123456789abcdef";
const SEED_B: &str = "fedcba9876543210fedcba9876543210";

#[test]
fn a_signed_code_verifies_and_is_deterministic() {
    let k = keys(&[("a", SEED_A)], "a");
    let code = k.sign(&claims());
    assert_eq!(code, k.sign(&claims()), "one version, one code");
    assert_eq!(k.verify(&code), Ok(claims()));
    assert_eq!(code.split('.').count(), 3);
}

#[test]
fn refusals_are_named() {
    let a = keys(&[("a", SEED_A)], "a");
    let code = a.sign(&claims());
    // Another deployment's key under the same kid: bad signature.
    let other = keys(&[("a", SEED_B)], "a");
    assert_eq!(other.verify(&code), Err(CodeError::BadSignature));
    // A kid this deployment does not know.
    let b = keys(&[("b", SEED_B)], "b");
    assert_eq!(b.verify(&code), Err(CodeError::UnknownKey));
    // Tampered claims.
    let mut parts: Vec<String> = code.split('.').map(str::to_owned).collect();
    let mut c = claims();
    c.ver = 2;
    parts[1] = B64.encode(serde_json::to_vec(&c).expect("json"));
    assert_eq!(a.verify(&parts.join(".")), Err(CodeError::BadSignature));
    // Wrong typ, wrong alg.
    for (header, err) in [
        (
            r#"{"alg":"EdDSA","typ":"JWT","kid":"a"}"#,
            CodeError::WrongType,
        ),
        (
            r#"{"alg":"HS256","typ":"fg-ticket+jwt","kid":"a"}"#,
            CodeError::WrongAlgorithm,
        ),
    ] {
        let mut p = parts.clone();
        p[0] = B64.encode(header);
        assert_eq!(a.verify(&p.join(".")), Err(err));
    }
    for bad in [
        "",
        "a.b",
        "a.b.c.d",
        "!!.??.--",
        &"x".repeat(MAX_CODE_LEN + 1),
    ] {
        assert_eq!(a.verify(bad), Err(CodeError::Malformed), "{bad:.20}");
    }
}

#[test]
fn a_retired_key_still_verifies() {
    let old = keys(&[("a", SEED_A)], "a");
    let code = old.sign(&claims());
    let rotated = keys(&[("a", SEED_A), ("b", SEED_B)], "b");
    assert_eq!(rotated.verify(&code), Ok(claims()));
    assert!(rotated.sign(&claims()).len() > 10);
    assert_eq!(rotated.jwks().keys.len(), 2);
    assert_eq!(rotated.current_kid(), "b");
}

#[test]
fn handles_and_secrets_are_stable_and_distinct() {
    let k = keys(&[("a", SEED_A)], "a");
    assert_eq!(k.handle("fan-1"), k.handle("fan-1"));
    assert_ne!(k.handle("fan-1"), k.handle("fan-2"));
    assert_eq!(
        B64.decode(k.handle("fan-1")).expect("b64").len(),
        HANDLE_BYTES
    );
    assert!(!k.handle("fan-1").contains("fan"));
    assert_ne!(k.door_key("ev1"), k.door_key("ev2"));
    let s1 = k.ticket_secret("ev", "t1", 1);
    assert_ne!(
        s1,
        k.ticket_secret("ev", "t1", 2),
        "a new version, a new secret"
    );
    // The separator keeps ("t1", 12) and ("t11", 2) apart.
    assert_ne!(
        k.ticket_secret("ev", "t1", 12),
        k.ticket_secret("ev", "t11", 2)
    );
    assert_eq!(s1, ticket_secret(&k.door_key("ev"), "t1", 1));
}

#[test]
fn bad_key_settings_are_refused() {
    let h = SecretString::from("h");
    let d = SecretString::from("d");
    let key = |kid: &str, secret: &str| SigningKeySetting {
        kid: kid.into(),
        secret: SecretString::from(secret.to_owned()),
    };
    assert!(matches!(
        TicketKeys::new(&[], "a", &h, &d),
        Err(KeyError::NoKeys)
    ));
    assert!(matches!(
        TicketKeys::new(&[key("a", "c2hvcnQ")], "a", &h, &d),
        Err(KeyError::BadSeed(_))
    ));
    let good = B64.encode(SEED_A);
    assert!(matches!(
        TicketKeys::new(&[key("a", &good)], "b", &h, &d),
        Err(KeyError::UnknownCurrent(_))
    ));
    assert!(matches!(
        TicketKeys::new(&[key("a", &good), key("a", &good)], "a", &h, &d),
        Err(KeyError::DuplicateKid(_))
    ));
    assert!(matches!(
        TicketKeys::new(&[key("a", &good)], "a", &SecretString::from(""), &d),
        Err(KeyError::EmptySecret("handle_secret"))
    ));
}

#[test]
fn rotating_codes_split_back() {
    let text = rotating_text("h.p.s", b"secret", 1_800_000_000);
    let (code, totp) = split_rotating(&text);
    assert_eq!(code, "h.p.s");
    let totp = totp.expect("totp part");
    assert!(crate::tickets::totp::accepts(
        b"secret",
        totp,
        1_800_000_010,
        crate::tickets::totp::TICKET_STEP_S
    ));
    assert_eq!(split_rotating("h.p.s"), ("h.p.s", None));
}
