//! The upstream leg's parsing and encoding, without sockets.

use super::*;

/// Parses `wire`; returns the outcome and what is left of the buffer after it.
fn parse(wire: &[u8], head_only: bool) -> (Result<Option<Parsed>, Trip>, BytesMut) {
    let mut buf = BytesMut::from(wire);
    let r = parse_head(&mut buf, head_only);
    (r, buf)
}

fn head(wire: &[u8]) -> (u16, Framing, bool, BytesMut) {
    match parse(wire, false) {
        (Ok(Some(Parsed::Final(h, f, k))), rest) => (h.status.as_u16(), f, k, rest),
        _ => panic!("no final head in {:?}", String::from_utf8_lossy(wire)),
    }
}

#[test]
fn framing_follows_rfc_9112() {
    let (code, f, keep, rest) = head(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello");
    assert_eq!(code, 200);
    assert_eq!(&rest[..], b"hello", "the head is taken off, the body left");
    assert!(matches!(f, Framing::Length(5)));
    assert!(keep);
    let (_, f, keep, _) =
        head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\n");
    assert!(matches!(f, Framing::Chunked));
    assert!(keep);
    let (_, f, keep, _) = head(b"HTTP/1.1 200 OK\r\n\r\n");
    assert!(matches!(f, Framing::UntilClose));
    assert!(!keep);
    let (_, _, keep, _) =
        head(b"HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 0\r\n\r\n");
    assert!(!keep);
    let (_, _, keep, _) = head(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n");
    assert!(!keep, "HTTP/1.0 answers are not reused");
    let (_, f, _, _) = head(b"HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n");
    assert!(matches!(f, Framing::Empty));
    // A HEAD answer keeps its length header and has no body.
    match parse(b"HTTP/1.1 200 OK\r\ncontent-length: 42\r\n\r\n", true).0 {
        Ok(Some(Parsed::Final(h, Framing::Empty, true))) => {
            assert_eq!(h.headers.get("content-length").unwrap(), "42");
        }
        _ => panic!("HEAD framing"),
    }
}

#[test]
fn bad_answers_are_refused() {
    for bad in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1e3\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"garbage\r\n\r\n",
    ] {
        assert!(
            matches!(parse(bad, false).0, Err(Trip::Broken)),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    let (partial, rest) = parse(b"HTTP/1.1 200 OK\r\ncontent-le", false);
    assert!(matches!(partial, Ok(None)));
    assert_eq!(rest.len(), 27, "an incomplete head stays in the buffer");
    let (interim, rest) = parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n", false);
    assert!(matches!(interim, Ok(Some(Parsed::Interim))));
    assert_eq!(
        &rest[..],
        b"HTTP/1.1 200 OK\r\n",
        "only the 1xx answer is skipped"
    );
}

#[test]
fn hop_by_hop_headers_are_not_passed_on() {
    match parse(
        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive\r\nX-Ok: 1\r\ncontent-length: 0\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\nContent-Type: application/json\r\n\r\n",
        false,
    )
    .0
    {
        Ok(Some(Parsed::Final(h, _, _))) => {
            assert!(h.headers.get("keep-alive").is_none());
            assert!(h.headers.get("connection").is_none());
            assert!(h.headers.get("content-length").is_none(), "set from the body");
            assert_eq!(h.headers.get("x-ok").unwrap(), "1");
            let cookies: Vec<_> = h.headers.get_all("set-cookie").iter().collect();
            assert_eq!(cookies, ["a=1", "b=2"], "repeated headers kept, in order");
            assert_eq!(h.headers.get("content-type").unwrap(), "application/json");
        }
        _ => panic!("head"),
    }
}

#[test]
fn chunks_are_decoded_across_reads() {
    let wire = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
    // Fed one byte at a time, as the worst split of reads.
    let mut buf = BytesMut::new();
    let mut body = BytesMut::new();
    let mut done = false;
    for &b in wire.iter() {
        buf.extend_from_slice(&[b]);
        if dechunk(&mut buf, &mut body).ok().expect("valid chunks") {
            done = true;
            break;
        }
    }
    assert!(done);
    assert_eq!(&body[..], b"hello world");
    assert!(buf.is_empty(), "stops right after the trailers");
    for bad in [&b"zz\r\nhello\r\n"[..], b"5\r\nhelloXX0\r\n\r\n", b"\r\n"] {
        let mut buf = BytesMut::from(bad);
        assert!(matches!(
            dechunk(&mut buf, &mut BytesMut::new()),
            Err(Trip::Broken)
        ));
    }
}

#[test]
fn requests_lose_hop_by_hop_and_internal_headers() {
    let mut req = RequestHeader::build("POST", b"/api/orders?x=1", None).unwrap();
    req.insert_header("host", "shop.example").unwrap();
    req.insert_header("connection", "keep-alive").unwrap();
    req.insert_header("x-floodgate-account", "forged").unwrap();
    req.insert_header("x-request-id", "fan-chosen").unwrap();
    req.insert_header("content-length", "999").unwrap();
    req.insert_header("content-type", "application/json")
        .unwrap();
    let mut out = Vec::new();
    encode_request(
        &req,
        "x-floodgate-",
        [("x-floodgate-account", "fan"), ("x-request-id", "gw-1-1")],
        b"{}",
        &mut out,
    );
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with("POST /api/orders?x=1 HTTP/1.1\r\n"),
        "{text}"
    );
    assert!(text.contains("host: shop.example\r\n"));
    assert!(text.contains("content-type: application/json\r\n"));
    assert!(!text.contains("forged"));
    assert!(!text.to_ascii_lowercase().contains("connection"));
    assert!(text.contains("x-floodgate-account: fan\r\n"));
    assert!(
        !text.contains("fan-chosen"),
        "the fan's request id is dropped"
    );
    assert!(text.contains("x-request-id: gw-1-1\r\n"));
    assert!(text.ends_with("content-length: 2\r\n\r\n{}"), "{text}");
    assert!(!text.contains("999"));
}

#[test]
fn eligibility() {
    const BODY_MAX: usize = 64 * 1024;
    let get = RequestHeader::build("GET", b"/api/x", None).unwrap();
    assert!(eligible(&get, BODY_MAX));
    let mut ws = RequestHeader::build("GET", b"/ws/x", None).unwrap();
    ws.insert_header("upgrade", "websocket").unwrap();
    assert!(!eligible(&ws, BODY_MAX));
    let mut chunked = RequestHeader::build("POST", b"/api/x", None).unwrap();
    chunked
        .insert_header("transfer-encoding", "chunked")
        .unwrap();
    assert!(!eligible(&chunked, BODY_MAX));
    let mut big = RequestHeader::build("POST", b"/api/x", None).unwrap();
    big.insert_header("content-length", (BODY_MAX + 1).to_string())
        .unwrap();
    assert!(!eligible(&big, BODY_MAX));
    let mut small = RequestHeader::build("POST", b"/api/x", None).unwrap();
    small.insert_header("content-length", "12").unwrap();
    assert!(eligible(&small, BODY_MAX));
    let mut expect = RequestHeader::build("POST", b"/api/x", None).unwrap();
    expect.insert_header("expect", "100-continue").unwrap();
    assert!(!eligible(&expect, BODY_MAX));
}
