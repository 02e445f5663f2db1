use crate::proxy::is_pay;
use http::Method;

#[test]
fn request_ids_are_prefix_dash_hex() {
    use super::RequestId;
    assert_eq!(RequestId::new("gw-1", 0).as_str(), "gw-1-0");
    assert_eq!(RequestId::new("gw-1", 255).as_str(), "gw-1-ff");
    assert_eq!(
        RequestId::new("gw-0192a3b4-c5d6-7e8f-9a0b-1c2d3e4f5a6b", u64::MAX).as_str(),
        "gw-0192a3b4-c5d6-7e8f-9a0b-1c2d3e4f5a6b-ffffffffffffffff"
    );
    let long = "x".repeat(200);
    let id = RequestId::new(&long, 1);
    assert!(id.as_str().ends_with("x-1"));
}

#[test]
fn wrong_event_is_403_for_api_clients_and_the_waiting_room_for_browsers() {
    use super::refusal;
    use shared::token::TokenError;
    let api = refusal(&TokenError::WrongEvent, false, Some("b"));
    assert_eq!(api.status, 403);
    let body: serde_json::Value = serde_json::from_slice(&api.body).expect("json");
    assert_eq!(body["code"], "WRONG_EVENT");
    let page = refusal(&TokenError::WrongEvent, true, Some("b"));
    assert!(
        page.headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("location") && v == "/e/b"),
        "{:?}",
        page.headers
    );
    for e in [
        TokenError::Expired,
        TokenError::BadSignature,
        TokenError::Revoked,
    ] {
        assert_eq!(refusal(&e, false, Some("b")).status, 401);
    }
}

#[test]
fn pay_path() {
    assert!(is_pay(&Method::POST, "/api/orders/ord_1/pay"));
    assert!(!is_pay(&Method::GET, "/api/orders/ord_1/pay"));
    assert!(!is_pay(&Method::POST, "/api/orders//pay"));
    assert!(!is_pay(&Method::POST, "/api/orders/a/b/pay"));
    assert!(!is_pay(&Method::POST, "/api/orders/ord_1"));
    assert!(!is_pay(&Method::POST, "/api/orders/ord_1/payx"));
}
