use super::*;
use crate::job::{JobChanges, JobStatus, Presence, RankStatus, Role};
use proptest::prelude::*;
use std::collections::HashSet;
use std::mem::discriminant;
use std::time::Duration;

fn challenge() -> Challenge {
    Challenge { magic: MAGIC, protocol_version: PROTOCOL_VERSION, library_version: "0.1.0".into(), nonce: [7; 32] }
}

fn hello() -> ClientHello {
    ClientHello {
        magic: MAGIC,
        protocol_version: PROTOCOL_VERSION,
        library_version: "0.1.0".into(),
        run_id: "job-42".into(),
        role: Role::Member,
        rank: Some(3),
        world_size: Some(8),
        host: "node-b".into(),
        pid: 4242,
        client_nonce: [9; 32],
        mac: Some([1; 32]),
    }
}

fn requests() -> Vec<Request> {
    let t = Duration::from_millis(1500);
    let keys = vec!["a".to_string(), "b/ü".to_string()];
    vec![
        Request::Set { key: "k".into(), value: b"v".to_vec() },
        Request::Get { key: "k".into(), timeout: t },
        Request::TryGet { key: "".into() },
        Request::Add { key: "n".into(), delta: -5 },
        Request::CompareSet { key: "k".into(), expected: None, desired: b"x".to_vec() },
        Request::CompareSet { key: "k".into(), expected: Some(vec![]), desired: vec![] },
        Request::Wait { keys: keys.clone(), timeout: Duration::from_secs(u32::MAX.into()) },
        Request::Check { keys: keys.clone() },
        Request::Delete { key: "k".into() },
        Request::NumKeys,
        // Empty on the wire: the server stamps it.
        Request::Clock { received_ns: 0 },
        Request::MultiGet { keys: vec![], timeout: Duration::ZERO },
        Request::MultiSet { pairs: vec![("a".into(), vec![1, 2]), ("b".into(), vec![])] },
        Request::Append { key: "log".into(), value: b"line\n".to_vec() },
        Request::KeysWithPrefix { prefix: "rank/".into() },
        Request::Heartbeat { payload: b"all_reduce #7".to_vec() },
        Request::Leave,
        Request::AbortJob { record: b"rank 1 died".to_vec() },
        Request::Status { since: Some(3), timeout: t },
        Request::Status { since: None, timeout: Duration::ZERO },
        Request::Changes { since: 7, timeout: t },
        Request::Changes { since: 0, timeout: Duration::ZERO },
    ]
}

fn wire_errors() -> Vec<WireError> {
    vec![
        WireError::VersionMismatch {
            detail: "protocols differ".into(),
            versions: vec![("the store".into(), "0.1.0".into()), ("a pid 1".into(), "0.2.0".into())],
        },
        WireError::ForeignRun { store_run: "a".into(), client_run: "b".into() },
        WireError::AuthFailed { detail: "wrong token".into() },
        WireError::DuplicateRank { rank: 2, first: "a pid 1".into(), second: "b pid 2".into() },
        WireError::InvalidArgument { what: "key".into(), detail: "not a number".into() },
        WireError::Protocol { detail: "odd".into() },
        WireError::Busy { detail: "too many connections".into() },
    ]
}

fn status() -> JobStatus {
    let rank = |rank, liveness, heartbeat_age| RankStatus {
        rank,
        liveness,
        host: "node-a".into(),
        pid: 100 + rank as u32,
        version: "0.1.0".into(),
        world_size: Some(4),
        since_change: Duration::from_millis(1234),
        heartbeat_age,
        heartbeat: vec![rank as u8],
    };
    JobStatus {
        generation: 9,
        ranks: vec![
            rank(0, Presence::Connected, Some(Duration::from_millis(5))),
            rank(1, Presence::Left, None),
            rank(2, Presence::Vanished, Some(Duration::from_secs(3))),
        ],
        abort: Some(b"rank 2 died".to_vec()),
    }
}

fn responses() -> Vec<Response> {
    let mut r = vec![
        Response::Ok,
        Response::Value(b"v".to_vec()),
        Response::MaybeValue(None),
        Response::MaybeValue(Some(vec![])),
        Response::Int(i64::MIN),
        Response::Bool(true),
        Response::Count(u64::MAX),
        Response::Values(vec![vec![1], vec![]]),
        Response::Keys(vec!["a".into(), "b".into()]),
        Response::Status(status()),
        Response::Status(JobStatus::default()),
        Response::Changes(JobChanges { generation: 9, ranks: status().ranks, abort: Some(b"x".to_vec()), more: true }),
        Response::Changes(JobChanges::default()),
        Response::Timeout { missing: vec!["late".into()] },
    ];
    r.extend(wire_errors().into_iter().map(Response::Error));
    r
}

fn client_msgs() -> Vec<ClientMsg> {
    let mut anonymous = hello();
    (anonymous.role, anonymous.rank, anonymous.world_size, anonymous.mac) = (Role::Tool, None, None, None);
    let mut msgs = vec![ClientMsg::Hello(hello()), ClientMsg::Hello(anonymous)];
    msgs.extend(requests().into_iter().enumerate().map(|(i, req)| ClientMsg::Request { id: i as u64, req }));
    msgs
}

fn server_msgs() -> Vec<ServerMsg> {
    let mut msgs = vec![
        ServerMsg::Challenge(challenge()),
        ServerMsg::Welcome(Welcome { server_mac: None }),
        ServerMsg::Welcome(Welcome { server_mac: Some([3; 32]) }),
    ];
    msgs.extend(wire_errors().into_iter().map(ServerMsg::Reject));
    msgs.extend(
        responses().into_iter().enumerate().map(|(i, resp)| ServerMsg::Response { id: u64::MAX - i as u64, resp }),
    );
    msgs
}

fn client_frame(m: &ClientMsg) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_client(m, &mut buf).unwrap();
    buf
}

fn server_frame(m: &ServerMsg) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_server(m, &mut buf).unwrap();
    buf
}

fn kinds<T>(items: &[T]) -> usize {
    items.iter().map(discriminant).collect::<HashSet<_>>().len()
}

#[test]
fn samples_cover_every_variant() {
    assert_eq!(kinds(&requests()), 19);
    assert_eq!(kinds(&responses()), 12);
    assert_eq!(kinds(&wire_errors()), 7);
}

fn all_frames() -> Vec<Vec<u8>> {
    let client = client_msgs().iter().map(client_frame).collect::<Vec<_>>();
    let server = server_msgs().iter().map(server_frame).collect::<Vec<_>>();
    [client, server].concat()
}

#[test]
fn every_client_message_round_trips() {
    for m in client_msgs() {
        let buf = client_frame(&m);
        assert_eq!(decode_client(&buf).unwrap(), Some((m.clone(), buf.len())), "{m:?}");
    }
}

#[test]
fn every_server_message_round_trips() {
    for m in server_msgs() {
        let buf = server_frame(&m);
        assert_eq!(decode_server(&buf).unwrap(), Some((m.clone(), buf.len())), "{m:?}");
    }
}

#[test]
fn handshake_messages_round_trip_through_their_own_decoders() {
    let buf = server_frame(&ServerMsg::Challenge(challenge()));
    assert_eq!(decode_greeting(&buf).unwrap(), Some((challenge(), buf.len())));
    let buf = client_frame(&ClientMsg::Hello(hello()));
    assert_eq!(decode_hello(&buf).unwrap(), Some((hello(), buf.len())));
}

#[test]
fn truncated_input_needs_more() {
    let frames = all_frames();
    for buf in frames {
        for cut in 0..buf.len() {
            assert_eq!(decode_client(&buf[..cut]), Ok(None), "cut {cut} of {buf:?}");
            assert_eq!(decode_server(&buf[..cut]), Ok(None), "cut {cut} of {buf:?}");
        }
    }
}

#[test]
fn frames_in_one_buffer_decode_one_at_a_time() {
    let msgs = client_msgs();
    let stream: Vec<u8> = msgs.iter().flat_map(client_frame).collect();
    let mut rest = &stream[..];
    for m in msgs {
        let (got, used) = decode_client(rest).unwrap().unwrap();
        assert_eq!(got, m);
        rest = &rest[used..];
    }
    assert!(rest.is_empty());
}

#[test]
fn an_oversized_frame_is_refused_from_its_header() {
    let header = ((MAX_FRAME + 1) as u32).to_le_bytes();
    assert!(matches!(decode_client(&header), Err(CodecError::FrameTooLarge { .. })));
    assert!(matches!(decode_server(&u32::MAX.to_le_bytes()), Err(CodecError::FrameTooLarge { .. })));
}

/// A frame whose payload is `payload`.
fn framed(payload: &[u8]) -> Vec<u8> {
    [&(payload.len() as u32).to_le_bytes()[..], payload].concat()
}

/// The payload of a request frame up to (excluding) the request's fields.
fn request_head(op: u8) -> Vec<u8> {
    [&[0x02][..], &7u64.to_le_bytes(), &[op]].concat()
}

#[test]
fn an_oversized_key_is_refused_before_allocation() {
    let mut payload = request_head(1);
    payload.extend(((MAX_KEY + 1) as u32).to_le_bytes());
    payload.extend(vec![b'k'; MAX_KEY + 1]);
    payload.extend(0u32.to_le_bytes());
    let err = decode_client(&framed(&payload)).unwrap_err();
    assert_eq!(err, CodecError::TooLarge { what: "key", len: MAX_KEY + 1, max: MAX_KEY });
}

#[test]
fn huge_lengths_and_counts_in_short_frames_are_errors() {
    let mut value = request_head(1);
    value.extend([1, 0, 0, 0, b'k']);
    value.extend(u32::MAX.to_le_bytes());
    assert!(matches!(decode_client(&framed(&value)), Err(CodecError::TooLarge { what: "value", .. })));

    let mut count = request_head(7);
    count.extend(((MAX_ITEMS + 1) as u32).to_le_bytes());
    assert!(matches!(decode_client(&framed(&count)), Err(CodecError::TooLarge { what: "keys", .. })));

    let mut short = request_head(7);
    short.extend((MAX_ITEMS as u32).to_le_bytes());
    assert_eq!(decode_client(&framed(&short)), Err(CodecError::Truncated("key")));
}

#[test]
fn the_encoder_refuses_what_the_decoder_would() {
    let mut out = vec![1, 2, 3];
    let long_key = ClientMsg::Request { id: 1, req: Request::TryGet { key: "k".repeat(MAX_KEY + 1) } };
    assert!(matches!(encode_client(&long_key, &mut out), Err(CodecError::TooLarge { what: "key", .. })));
    let many = Request::Check { keys: vec![String::new(); MAX_ITEMS + 1] };
    assert!(encode_request(2, &many, &mut out).is_err());
    assert_eq!(out, [1, 2, 3], "a failed encode leaves the buffer as it was");
}

#[test]
fn non_canonical_encodings_are_refused() {
    let mut trailing = client_frame(&ClientMsg::Request { id: 1, req: Request::NumKeys });
    trailing.push(0);
    trailing[0] += 1;
    assert_eq!(decode_client(&trailing), Err(CodecError::Trailing(1)));

    let mut bad_bool = request_head(17);
    bad_bool.push(2);
    assert!(matches!(decode_client(&framed(&bad_bool)), Err(CodecError::UnknownTag { .. })));

    let mut bad_utf8 = request_head(3);
    bad_utf8.extend([1, 0, 0, 0, 0xff]);
    assert_eq!(decode_client(&framed(&bad_utf8)), Err(CodecError::BadUtf8("key")));

    assert!(matches!(decode_client(&framed(&request_head(99))), Err(CodecError::UnknownTag { .. })));
    assert!(matches!(decode_server(&framed(&[0x42])), Err(CodecError::UnknownTag { .. })));
    assert_eq!(decode_client(&framed(&[])), Err(CodecError::Truncated("message tag")));
}

#[test]
fn a_greeting_from_a_stranger_fails_early() {
    // An HTTP server's first bytes: not the challenge's tag.
    assert_eq!(decode_greeting(b"HTTP/1.1 400 Bad Request\r\n"), Err(CodecError::BadMagic));
    // A huge length is refused before anything else arrives.
    let huge = [&u32::MAX.to_le_bytes()[..], &[TAG_CHALLENGE]].concat();
    assert!(matches!(decode_greeting(&huge), Err(CodecError::FrameTooLarge { .. })));
    // A plausible length, then the wrong tag or magic: no need to wait for the rest.
    assert_eq!(decode_greeting(&[100, 0, 0, 0, 0x42]), Err(CodecError::BadMagic));
    assert_eq!(decode_greeting(&[100, 0, 0, 0, TAG_CHALLENGE, b'R', b'X']), Err(CodecError::BadMagic));
    assert_eq!(decode_greeting(&[100, 0, 0, 0, TAG_CHALLENGE, b'R', b'L']), Ok(None));
    // A request where a hello belongs.
    let req = client_frame(&ClientMsg::Request { id: 1, req: Request::NumKeys });
    assert_eq!(decode_hello(&req), Err(CodecError::BadMagic));
}

#[test]
fn a_greeting_of_another_protocol_version_still_names_its_version() {
    let mut payload = vec![TAG_CHALLENGE];
    payload.extend(MAGIC.to_le_bytes());
    payload.extend(99u16.to_le_bytes());
    payload.extend([3, 0, 0, 0]);
    payload.extend(b"9.9");
    payload.extend(b"fields we do not know");
    let (c, _) = decode_greeting(&framed(&payload)).unwrap().unwrap();
    assert_eq!((c.protocol_version, c.library_version.as_str()), (99, "9.9"));

    payload[0] = TAG_HELLO;
    let (h, _) = decode_hello(&framed(&payload)).unwrap().unwrap();
    assert_eq!((h.protocol_version, h.library_version.as_str()), (99, "9.9"));
}

proptest! {
    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        fuzz_round_trip(&data);
    }

    #[test]
    fn random_payloads_behind_a_valid_header_never_panic(
        tag in prop::sample::select(vec![0x01u8, 0x02, 0x81, 0x82, 0x83, 0x84]),
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let payload = [&[tag][..], &body].concat();
        fuzz_round_trip(&framed(&payload));
    }

    #[test]
    fn arbitrary_sets_round_trip(
        id in any::<u64>(),
        key in "\\PC{0,40}",
        value in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let m = ClientMsg::Request { id, req: Request::Set { key, value } };
        let buf = client_frame(&m);
        prop_assert_eq!(decode_client(&buf).unwrap(), Some((m, buf.len())));
    }
}

/// Every file of the committed seed corpus must be a valid frame, so that
/// the fuzzer starts from the interesting part of the input space.
#[test]
fn the_seed_corpus_decodes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        let ok = matches!(decode_client(&data), Ok(Some(_))) || matches!(decode_server(&data), Ok(Some(_)));
        assert!(ok, "{data:?}");
        fuzz_round_trip(&data);
    }
}

/// Regenerates the seed corpus: `cargo test -p ringleader-store write_seed_corpus -- --ignored`.
#[test]
#[ignore]
fn write_seed_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode");
    std::fs::create_dir_all(&dir).unwrap();
    let frames = all_frames();
    for (i, frame) in frames.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:02}")), frame).unwrap();
    }
}
