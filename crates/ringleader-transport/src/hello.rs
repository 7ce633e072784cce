//! The data-plane handshake, sans-IO.
//!
//! The accepting rank speaks first, with a [`Challenge`]: a fresh random
//! nonce. The connecting rank answers with a [`Hello`]: it names the run,
//! itself, the rank it means to reach and the stream index, and proves it
//! knows the job's token with an HMAC over those fields and the nonce (the
//! token never crosses the wire, and a hello recorded from one connection
//! is worthless on another). The accepting rank answers with one status
//! byte. Every message is small and fixed in shape, and the decoder bounds
//! the one variable field (the run id) before reading it.

use hmac::{Hmac, Mac};
use sha2::Sha256;

const MAGIC: u32 = 0x484c_4452; // "RDLH" read little endian
const CHALLENGE_MAGIC: u32 = 0x4843_4c52; // "RLCH" read little endian
/// Longest run id accepted on the wire, in bytes (init refuses longer ones,
/// see [`ringleader_core::config::check_run_id`]).
pub const MAX_RUN_ID: usize = ringleader_core::config::MAX_RUN_ID;
/// Bytes of a challenge's nonce.
pub const NONCE_LEN: usize = 16;

/// What the acceptor sends first: a nonce the connector's MAC must cover.
///
/// ```
/// use ringleader_transport::hello::Challenge;
/// let c = Challenge::fresh().unwrap();
/// let bytes = c.encode();
/// assert_eq!(Challenge::decode(&bytes), Ok(Some(c)));
/// assert_eq!(Challenge::decode(&bytes[..3]), Ok(None));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// Random bytes, new for every accepted connection.
    pub nonce: [u8; NONCE_LEN],
}

impl Challenge {
    /// Bytes on the wire.
    pub const LEN: usize = 4 + NONCE_LEN;

    /// A challenge with a nonce from the kernel's random source.
    pub fn fresh() -> std::io::Result<Challenge> {
        use std::io::Read;
        let mut nonce = [0u8; NONCE_LEN];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut nonce)?;
        Ok(Challenge { nonce })
    }

    /// Encodes the challenge.
    pub fn encode(&self) -> [u8; Challenge::LEN] {
        let mut b = [0u8; Challenge::LEN];
        b[..4].copy_from_slice(&CHALLENGE_MAGIC.to_le_bytes());
        b[4..].copy_from_slice(&self.nonce);
        b
    }

    /// Decodes a challenge from the front of `b`: `Ok(None)` while incomplete.
    pub fn decode(b: &[u8]) -> Result<Option<Challenge>, HelloError> {
        if b.len() >= 4 && b[0..4] != CHALLENGE_MAGIC.to_le_bytes() {
            return Err(HelloError::BadMagic);
        }
        if b.len() < Challenge::LEN {
            return Ok(None);
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[4..Challenge::LEN]);
        Ok(Some(Challenge { nonce }))
    }
}

/// What the connector sends, in answer to a [`Challenge`].
///
/// ```
/// use ringleader_transport::hello::Hello;
/// let nonce = [7u8; 16];
/// let h = Hello::new("run-1", 3, 0, 1, 4, Some("secret"), &nonce);
/// let bytes = h.encode();
/// let (back, used) = Hello::decode(&bytes).unwrap().unwrap();
/// assert_eq!((&back, used), (&h, bytes.len()));
/// assert!(back.verify(Some("secret"), &nonce));
/// assert!(!back.verify(Some("other"), &nonce));
/// assert!(!back.verify(Some("secret"), &[8u8; 16]), "a replay under another nonce");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Frame format version of the sender.
    pub version: u8,
    /// The sender's rank.
    pub src: u32,
    /// The rank the sender means to reach.
    pub dst: u32,
    /// Stream index, when several streams join one pair of ranks.
    pub stream: u16,
    /// The sender's world size.
    pub world: u32,
    /// The job's run id.
    pub run_id: String,
    /// HMAC-SHA256 over the other fields and the acceptor's nonce, keyed
    /// with the job token (zeros without one).
    pub mac: [u8; 32],
}

/// Why a handshake message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// Not a ringleader data connection.
    #[error("not a ringleader data-plane hello (bad magic)")]
    BadMagic,
    /// The run id is longer than [`MAX_RUN_ID`].
    #[error("run id of {0} bytes is too long")]
    TooLong(usize),
    /// The run id is not UTF-8.
    #[error("run id is not UTF-8")]
    NotUtf8,
}

/// The acceptor's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Accepted.
    Ok,
    /// Another run.
    ForeignRun,
    /// Wrong or missing token.
    AuthFailed,
    /// The connector meant another rank, or its world size differs.
    WrongPeer,
    /// Another frame version.
    Version,
}

impl Reply {
    /// One byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            Reply::Ok => 0,
            Reply::ForeignRun => 1,
            Reply::AuthFailed => 2,
            Reply::WrongPeer => 3,
            Reply::Version => 4,
        }
    }

    /// Inverse of [`Reply::code`]; unknown codes read as [`Reply::WrongPeer`].
    pub fn from_code(c: u8) -> Reply {
        match c {
            0 => Reply::Ok,
            1 => Reply::ForeignRun,
            2 => Reply::AuthFailed,
            4 => Reply::Version,
            _ => Reply::WrongPeer,
        }
    }
}

const FIXED: usize = 4 + 1 + 4 + 4 + 2 + 4 + 2 + 32;

impl Hello {
    /// A hello with its MAC computed from `token` and the acceptor's `nonce`.
    pub fn new(
        run_id: &str,
        src: u32,
        dst: u32,
        stream: u16,
        world: u32,
        token: Option<&str>,
        nonce: &[u8; NONCE_LEN],
    ) -> Hello {
        let mut h = Hello {
            version: crate::frame::FRAME_VERSION,
            src,
            dst,
            stream,
            world,
            run_id: run_id.to_string(),
            mac: [0; 32],
        };
        h.mac = h.compute_mac(token, nonce);
        h
    }

    fn compute_mac(&self, token: Option<&str>, nonce: &[u8; NONCE_LEN]) -> [u8; 32] {
        let Some(token) = token else { return [0; 32] };
        let Ok(mut m) = Hmac::<Sha256>::new_from_slice(token.as_bytes()) else {
            return [0; 32];
        };
        m.update(b"ringleader data hello");
        m.update(&self.src.to_le_bytes());
        m.update(&self.dst.to_le_bytes());
        m.update(&self.stream.to_le_bytes());
        m.update(&self.world.to_le_bytes());
        m.update(self.run_id.as_bytes());
        m.update(nonce);
        m.finalize().into_bytes().into()
    }

    /// Whether the MAC matches `token` and `nonce` (in constant time).
    pub fn verify(&self, token: Option<&str>, nonce: &[u8; NONCE_LEN]) -> bool {
        let want = self.compute_mac(token, nonce);
        want.iter().zip(self.mac.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// Encodes the hello.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED + self.run_id.len());
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.push(self.version);
        b.extend_from_slice(&self.src.to_le_bytes());
        b.extend_from_slice(&self.dst.to_le_bytes());
        b.extend_from_slice(&self.stream.to_le_bytes());
        b.extend_from_slice(&self.world.to_le_bytes());
        b.extend_from_slice(&(self.run_id.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.mac);
        b.extend_from_slice(self.run_id.as_bytes());
        b
    }

    /// Decodes a hello from the front of `b`: `Ok(None)` while incomplete,
    /// else the hello and the bytes it used.
    pub fn decode(b: &[u8]) -> Result<Option<(Hello, usize)>, HelloError> {
        if b.len() >= 4 && b[0..4] != MAGIC.to_le_bytes() {
            return Err(HelloError::BadMagic);
        }
        if b.len() < FIXED {
            return Ok(None);
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let run_len = u16_at(19) as usize;
        if run_len > MAX_RUN_ID {
            return Err(HelloError::TooLong(run_len));
        }
        if b.len() < FIXED + run_len {
            return Ok(None);
        }
        let mut mac = [0u8; 32];
        mac.copy_from_slice(&b[21..53]);
        let run_id = std::str::from_utf8(&b[FIXED..FIXED + run_len]).map_err(|_| HelloError::NotUtf8)?;
        Ok(Some((
            Hello {
                version: b[4],
                src: u32_at(5),
                dst: u32_at(9),
                stream: u16_at(13),
                world: u32_at(15),
                run_id: run_id.to_string(),
                mac,
            },
            FIXED + run_len,
        )))
    }

    /// The acceptor's decision about this hello, answering its challenge `nonce`.
    pub fn judge(&self, me: u32, world: u32, run_id: &str, token: Option<&str>, nonce: &[u8; NONCE_LEN]) -> Reply {
        if self.version != crate::frame::FRAME_VERSION {
            Reply::Version
        } else if self.run_id != run_id {
            Reply::ForeignRun
        } else if !self.verify(token, nonce) {
            Reply::AuthFailed
        } else if self.dst != me || self.world != world || self.src >= world {
            Reply::WrongPeer
        } else {
            Reply::Ok
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_and_bad_input() {
        let b = Hello::new("r", 1, 0, 0, 2, None, &[0; NONCE_LEN]).encode();
        for cut in 0..b.len() {
            assert_eq!(Hello::decode(&b[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(Hello::decode(b"GET / HTTP/1.1\r\n"), Err(HelloError::BadMagic));
        let mut long = b.clone();
        long[19..21].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(Hello::decode(&long), Err(HelloError::TooLong(_))));
    }

    #[test]
    fn judge_decisions() {
        let n = [3u8; NONCE_LEN];
        let h = Hello::new("run", 1, 0, 0, 2, Some("t"), &n);
        assert_eq!(h.judge(0, 2, "run", Some("t"), &n), Reply::Ok);
        assert_eq!(h.judge(0, 2, "other", Some("t"), &n), Reply::ForeignRun);
        assert_eq!(h.judge(0, 2, "run", None, &n), Reply::AuthFailed);
        assert_eq!(h.judge(0, 2, "run", Some("t"), &[4u8; NONCE_LEN]), Reply::AuthFailed);
        assert_eq!(h.judge(1, 2, "run", Some("t"), &n), Reply::WrongPeer);
        assert_eq!(h.judge(0, 3, "run", Some("t"), &n), Reply::WrongPeer);
        for r in [Reply::Ok, Reply::ForeignRun, Reply::AuthFailed, Reply::WrongPeer, Reply::Version] {
            assert_eq!(Reply::from_code(r.code()), r);
        }
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400)) {
            let _ = Hello::decode(&bytes);
            let mut framed = MAGIC.to_le_bytes().to_vec();
            framed.extend_from_slice(&bytes);
            let _ = Hello::decode(&framed);
            let _ = Challenge::decode(&bytes);
        }
    }

    /// Regenerates the fuzz target's seeds: `cargo test -p ringleader-transport write_hello_seeds -- --ignored`.
    #[test]
    #[ignore]
    fn write_hello_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/hello");
        std::fs::create_dir_all(&dir).unwrap();
        let hellos = [
            Hello::new("run-1", 1, 0, 0, 2, None, &[7; NONCE_LEN]),
            Hello::new("a-longer-run-id-with-ünïcode", 7, 3, 15, 8, Some("secret"), &[7; NONCE_LEN]),
            Hello::new(&"r".repeat(MAX_RUN_ID), 0, 1, 1, 2, Some("t"), &[7; NONCE_LEN]),
        ];
        for (i, h) in hellos.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), h.encode()).unwrap();
        }
    }

    /// The committed seeds decode: the fuzzer starts from valid hellos.
    #[test]
    fn the_seed_corpus_decodes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/hello");
        let Ok(entries) = std::fs::read_dir(&dir) else { return };
        for entry in entries {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            let (h, used) = Hello::decode(&data).unwrap().unwrap();
            assert_eq!((h.encode(), used), (data.clone(), data.len()));
        }
    }
}
