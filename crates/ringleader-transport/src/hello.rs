//! The data-plane handshake, sans-IO.
//!
//! The connecting rank speaks first: it names the run, itself, the rank it
//! means to reach and the stream index, and proves it knows the job's token
//! with an HMAC (the token never crosses the wire). The accepting rank answers
//! with one status byte. Both messages are small and fixed in shape, and the
//! decoder bounds the one variable field (the run id) before reading it.

use hmac::{Hmac, Mac};
use sha2::Sha256;

const MAGIC: u32 = 0x484c_4452; // "RDLH" read little endian
/// Longest run id accepted on the wire, in bytes (init refuses longer ones,
/// see [`ringleader_core::config::check_run_id`]).
pub const MAX_RUN_ID: usize = ringleader_core::config::MAX_RUN_ID;

/// What the connector sends.
///
/// ```
/// use ringleader_transport::hello::Hello;
/// let h = Hello::new("run-1", 3, 0, 1, 4, Some("secret"));
/// let bytes = h.encode();
/// let (back, used) = Hello::decode(&bytes).unwrap().unwrap();
/// assert_eq!((&back, used), (&h, bytes.len()));
/// assert!(back.verify(Some("secret")));
/// assert!(!back.verify(Some("other")));
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
    /// HMAC-SHA256 over the other fields, keyed with the job token (zeros without one).
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
    /// A hello with its MAC computed from `token`.
    pub fn new(run_id: &str, src: u32, dst: u32, stream: u16, world: u32, token: Option<&str>) -> Hello {
        let mut h = Hello {
            version: crate::frame::FRAME_VERSION,
            src,
            dst,
            stream,
            world,
            run_id: run_id.to_string(),
            mac: [0; 32],
        };
        h.mac = h.compute_mac(token);
        h
    }

    fn compute_mac(&self, token: Option<&str>) -> [u8; 32] {
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
        m.finalize().into_bytes().into()
    }

    /// Whether the MAC matches `token` (in constant time).
    pub fn verify(&self, token: Option<&str>) -> bool {
        let want = self.compute_mac(token);
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

    /// The acceptor's decision about this hello.
    pub fn judge(&self, me: u32, world: u32, run_id: &str, token: Option<&str>) -> Reply {
        if self.version != crate::frame::FRAME_VERSION {
            Reply::Version
        } else if self.run_id != run_id {
            Reply::ForeignRun
        } else if !self.verify(token) {
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
        let b = Hello::new("r", 1, 0, 0, 2, None).encode();
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
        let h = Hello::new("run", 1, 0, 0, 2, Some("t"));
        assert_eq!(h.judge(0, 2, "run", Some("t")), Reply::Ok);
        assert_eq!(h.judge(0, 2, "other", Some("t")), Reply::ForeignRun);
        assert_eq!(h.judge(0, 2, "run", None), Reply::AuthFailed);
        assert_eq!(h.judge(1, 2, "run", Some("t")), Reply::WrongPeer);
        assert_eq!(h.judge(0, 3, "run", Some("t")), Reply::WrongPeer);
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
        }
    }

    /// Regenerates the fuzz target's seeds: `cargo test -p ringleader-transport write_hello_seeds -- --ignored`.
    #[test]
    #[ignore]
    fn write_hello_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/hello");
        std::fs::create_dir_all(&dir).unwrap();
        let hellos = [
            Hello::new("run-1", 1, 0, 0, 2, None),
            Hello::new("a-longer-run-id-with-ünïcode", 7, 3, 15, 8, Some("secret")),
            Hello::new(&"r".repeat(MAX_RUN_ID), 0, 1, 1, 2, Some("t")),
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
