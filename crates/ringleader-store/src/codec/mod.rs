//! The store's wire format, sans-IO: bytes in, messages out, and back.
//!
//! A frame is `u32 LE payload length | payload`, and a payload is one
//! message (a tag byte, then fields). As in mini-redis, checking that a frame
//! is complete ([`check_frame`]) is separate from parsing it, so a reader
//! knows how many bytes it still needs without parsing anything twice.
//!
//! Nothing read from the wire is trusted: the frame length is bounded by
//! [`MAX_FRAME`] before a byte of the payload is awaited, and every length or
//! count inside a payload is bounded by its limit (and by the bytes actually
//! present) before anything is allocated. A violation is a [`CodecError`],
//! never a panic. The encoder enforces the same limits, so a client learns
//! about an oversized value before sending it.

mod messages;
mod wire;

pub(crate) use messages::{Challenge, ClientHello, ClientMsg, Request, Response, ServerMsg, Welcome, WireError};

use messages::{TAG_CHALLENGE, TAG_HELLO};
use wire::{Dec, Enc};

/// "RLST" on the wire: the first four payload bytes after the tag of a
/// challenge or hello.
pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"RLST");
/// Bumped whenever an encoding changes incompatibly (2: the challenge no
/// longer carries the store's run id; the `busy` refusal; 3: the `changes`
/// long-poll; 4: the `clock` request).
pub(crate) const PROTOCOL_VERSION: u16 = 4;
/// Largest payload of one frame.
pub(crate) const MAX_FRAME: usize = 256 << 20;
/// Largest key (and key prefix).
pub(crate) const MAX_KEY: usize = 4 << 10;
/// Most items in one list (keys of a multi-op, values, ranks).
pub(crate) const MAX_ITEMS: usize = 65536;
/// Largest value.
pub(crate) const MAX_VALUE: usize = 128 << 20;
/// Largest free text (host names, versions, run ids, error details).
pub(crate) const MAX_TEXT: usize = 64 << 10;
/// Largest frame accepted before the handshake is done: a stranger gets no
/// more than this much of our memory (a hello's fields are bounded far
/// below it, see the state's admission checks).
pub(crate) const MAX_HANDSHAKE_FRAME: usize = 16 << 10;

const HEADER: usize = 4;

/// Why bytes are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CodecError {
    #[error("a frame of {len} bytes is over the {max}-byte limit")]
    FrameTooLarge { len: usize, max: usize },
    #[error("a {what} of {len} is over the limit of {max}")]
    TooLarge { what: &'static str, len: usize, max: usize },
    #[error("the frame ends inside the {0}")]
    Truncated(&'static str),
    #[error("unknown {what} tag {tag}")]
    UnknownTag { what: &'static str, tag: u8 },
    #[error("the {0} is not valid UTF-8")]
    BadUtf8(&'static str),
    #[error("{0} bytes follow the end of the message")]
    Trailing(usize),
    #[error("the greeting does not start with the store's magic bytes")]
    BadMagic,
}

/// The length of the first frame in `buf` (header included) once it is
/// complete; `Ok(None)` while more bytes are needed.
pub(crate) fn check_frame(buf: &[u8], max: usize) -> Result<Option<usize>, CodecError> {
    let Some(len) = declared_len(buf) else {
        return Ok(None);
    };
    if len > max {
        return Err(CodecError::FrameTooLarge { len, max });
    }
    Ok((buf.len() >= HEADER + len).then_some(HEADER + len))
}

/// The payload length the first frame's header declares, once the header
/// is there (a reader uses it to size its buffer).
pub(crate) fn declared_len(buf: &[u8]) -> Option<usize> {
    let header: [u8; HEADER] = buf.get(..HEADER)?.try_into().ok()?;
    Some(u32::from_le_bytes(header) as usize)
}

/// Decodes the first frame of `buf` as a client message: `Ok(None)` while
/// incomplete, else the message and the bytes it used.
pub(crate) fn decode_client(buf: &[u8]) -> Result<Option<(ClientMsg, usize)>, CodecError> {
    decode_with(buf, MAX_FRAME, ClientMsg::decode)
}

/// Decodes the first frame of `buf` as a server message.
pub(crate) fn decode_server(buf: &[u8]) -> Result<Option<(ServerMsg, usize)>, CodecError> {
    decode_with(buf, MAX_FRAME, ServerMsg::decode)
}

/// Decodes a server's first frame, which must be a challenge. Fails as soon
/// as the first bytes show that the peer is something else, without waiting
/// for a frame that a stranger may never finish.
pub(crate) fn decode_greeting(buf: &[u8]) -> Result<Option<(Challenge, usize)>, CodecError> {
    check_prefix(buf, TAG_CHALLENGE)?;
    decode_with(buf, MAX_HANDSHAKE_FRAME, |d| {
        d.u8("message tag")?;
        if peek_protocol(d) == Some(PROTOCOL_VERSION) {
            Challenge::decode(d)
        } else {
            Challenge::decode_foreign(d)
        }
    })
}

/// Decodes a client's first frame, which must be a hello; like
/// [`decode_greeting`] it refuses strangers early.
pub(crate) fn decode_hello(buf: &[u8]) -> Result<Option<(ClientHello, usize)>, CodecError> {
    check_prefix(buf, TAG_HELLO)?;
    decode_with(buf, MAX_HANDSHAKE_FRAME, |d| {
        d.u8("message tag")?;
        if peek_protocol(d) == Some(PROTOCOL_VERSION) {
            ClientHello::decode(d)
        } else {
            ClientHello::decode_foreign(d)
        }
    })
}

/// Checks the tag and magic as far as `buf` reaches.
fn check_prefix(buf: &[u8], tag: u8) -> Result<(), CodecError> {
    let expected = [&[tag][..], &MAGIC.to_le_bytes()].concat();
    let seen = buf.get(HEADER..).unwrap_or_default();
    let n = seen.len().min(expected.len());
    if seen[..n] != expected[..n] {
        return Err(CodecError::BadMagic);
    }
    Ok(())
}

fn peek_protocol(d: &Dec<'_>) -> Option<u16> {
    let rest = d.rest();
    Some(u16::from_le_bytes(rest.get(4..6)?.try_into().ok()?))
}

fn decode_with<T>(
    buf: &[u8],
    max: usize,
    parse: impl FnOnce(&mut Dec<'_>) -> Result<T, CodecError>,
) -> Result<Option<(T, usize)>, CodecError> {
    let Some(n) = check_frame(buf, max)? else {
        return Ok(None);
    };
    let mut d = Dec::new(&buf[HEADER..n]);
    let msg = parse(&mut d)?;
    d.finish()?;
    Ok(Some((msg, n)))
}

/// Appends one framed client message to `out`. On error `out` is left as it
/// was.
pub(crate) fn encode_client(msg: &ClientMsg, out: &mut Vec<u8>) -> Result<(), CodecError> {
    encode_frame(out, |e| msg.encode(e))
}

/// Appends one framed request to `out` (what [`encode_client`] does for a
/// [`ClientMsg::Request`], without cloning the request into one).
pub(crate) fn encode_request(id: u64, req: &Request, out: &mut Vec<u8>) -> Result<(), CodecError> {
    encode_frame(out, |e| ClientMsg::encode_request(e, id, req))
}

/// Appends one framed server message to `out`. On error `out` is left as it
/// was.
pub(crate) fn encode_server(msg: &ServerMsg, out: &mut Vec<u8>) -> Result<(), CodecError> {
    encode_frame(out, |e| msg.encode(e))
}

fn encode_frame(
    out: &mut Vec<u8>,
    body: impl FnOnce(&mut Enc<'_>) -> Result<(), CodecError>,
) -> Result<(), CodecError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    let result = body(&mut Enc(out)).and_then(|()| {
        let len = out.len() - start - HEADER;
        if len > MAX_FRAME {
            return Err(CodecError::FrameTooLarge { len, max: MAX_FRAME });
        }
        Ok(len as u32)
    });
    match result {
        Ok(len) => {
            out[start..start + HEADER].copy_from_slice(&len.to_le_bytes());
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// The fuzz oracle: whatever decodes must re-encode to the very same bytes
/// (every message has one encoding), and decoding must never panic.
pub(crate) fn fuzz_round_trip(data: &[u8]) {
    if let Ok(Some((msg, n))) = decode_client(data) {
        let mut out = Vec::new();
        encode_client(&msg, &mut out).expect("a decoded message re-encodes");
        assert_eq!(out, data[..n], "client message {msg:?} re-encodes differently");
    }
    if let Ok(Some((msg, n))) = decode_server(data) {
        let mut out = Vec::new();
        encode_server(&msg, &mut out).expect("a decoded message re-encodes");
        assert_eq!(out, data[..n], "server message {msg:?} re-encodes differently");
    }
    let _ = decode_greeting(data);
    let _ = decode_hello(data);
}

#[cfg(test)]
mod tests;
