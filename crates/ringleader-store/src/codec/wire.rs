//! Primitive encoders and decoders: little-endian integers, length-prefixed
//! byte strings, options and lists.
//!
//! The decoder works on one complete frame payload, so "need more bytes" never
//! arises here: running out of bytes is an error. Every length is checked
//! against its limit and against the bytes that remain before anything is
//! allocated, so a hostile length costs nothing.

use super::CodecError;
use std::time::Duration;

/// Appends primitives to a frame under construction.
pub(crate) struct Enc<'a>(pub(crate) &'a mut Vec<u8>);

impl Enc<'_> {
    // The fixed-size writers cannot fail; they answer a `Result` anyway so
    // that every field of an encoder reads alike (`e.u32(x)?`).

    pub(crate) fn u8(&mut self, v: u8) -> Result<(), CodecError> {
        self.0.push(v);
        Ok(())
    }

    pub(crate) fn bool(&mut self, v: bool) -> Result<(), CodecError> {
        self.u8(v as u8)
    }

    pub(crate) fn u16(&mut self, v: u16) -> Result<(), CodecError> {
        self.put(&v.to_le_bytes())
    }

    pub(crate) fn u32(&mut self, v: u32) -> Result<(), CodecError> {
        self.put(&v.to_le_bytes())
    }

    pub(crate) fn u64(&mut self, v: u64) -> Result<(), CodecError> {
        self.put(&v.to_le_bytes())
    }

    pub(crate) fn i64(&mut self, v: i64) -> Result<(), CodecError> {
        self.put(&v.to_le_bytes())
    }

    /// Nanoseconds, saturating at about 584 years.
    pub(crate) fn duration(&mut self, d: Duration) -> Result<(), CodecError> {
        self.u64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    pub(crate) fn array32(&mut self, v: &[u8; 32]) -> Result<(), CodecError> {
        self.put(v)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), CodecError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    /// `u32` length, then the bytes; refuses what the peer would refuse.
    pub(crate) fn bytes(&mut self, what: &'static str, v: &[u8], max: usize) -> Result<(), CodecError> {
        check_len(what, v.len(), max)?;
        self.u32(v.len() as u32)?;
        self.put(v)
    }

    pub(crate) fn str(&mut self, what: &'static str, v: &str, max: usize) -> Result<(), CodecError> {
        self.bytes(what, v.as_bytes(), max)
    }

    /// A presence byte (0 or 1), then the value.
    pub(crate) fn opt<T>(
        &mut self,
        v: Option<&T>,
        f: impl FnOnce(&mut Self, &T) -> Result<(), CodecError>,
    ) -> Result<(), CodecError>
    where
        T: ?Sized,
    {
        self.bool(v.is_some())?;
        v.map_or(Ok(()), |v| f(self, v))
    }

    /// A `u32` count, then the items.
    pub(crate) fn list<T>(
        &mut self,
        what: &'static str,
        items: &[T],
        max: usize,
        mut f: impl FnMut(&mut Self, &T) -> Result<(), CodecError>,
    ) -> Result<(), CodecError> {
        check_len(what, items.len(), max)?;
        self.u32(items.len() as u32)?;
        items.iter().try_for_each(|item| f(self, item))
    }
}

fn check_len(what: &'static str, len: usize, max: usize) -> Result<(), CodecError> {
    if len > max {
        return Err(CodecError::TooLarge { what, len, max });
    }
    Ok(())
}

/// Reads primitives from one complete frame payload.
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
}

impl<'a> Dec<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Dec { buf }
    }

    /// Errors if anything is left over: a valid message has one encoding.
    pub(crate) fn finish(&self) -> Result<(), CodecError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(CodecError::Trailing(n)),
        }
    }

    /// What has not been read yet.
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.buf
    }

    /// Ignores the rest (for messages of another protocol version).
    pub(crate) fn skip_rest(&mut self) {
        self.buf = &[];
    }

    fn take(&mut self, what: &'static str, n: usize) -> Result<&'a [u8], CodecError> {
        if self.buf.len() < n {
            return Err(CodecError::Truncated(what));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn fixed<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], CodecError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(what, N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, CodecError> {
        Ok(self.fixed::<1>(what)?[0])
    }

    /// Only 0 and 1 are booleans, so that every message has one encoding.
    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, CodecError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(CodecError::UnknownTag { what, tag }),
        }
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, CodecError> {
        self.fixed(what).map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, CodecError> {
        self.fixed(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, CodecError> {
        self.fixed(what).map(u64::from_le_bytes)
    }

    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, CodecError> {
        self.fixed(what).map(i64::from_le_bytes)
    }

    pub(crate) fn duration(&mut self, what: &'static str) -> Result<Duration, CodecError> {
        self.u64(what).map(Duration::from_nanos)
    }

    pub(crate) fn array32(&mut self, what: &'static str) -> Result<[u8; 32], CodecError> {
        self.fixed(what)
    }

    /// A length checked against `max` and the remaining bytes before the
    /// copy is allocated.
    pub(crate) fn bytes(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>, CodecError> {
        let len = self.u32(what)? as usize;
        check_len(what, len, max)?;
        Ok(self.take(what, len)?.to_vec())
    }

    pub(crate) fn string(&mut self, what: &'static str, max: usize) -> Result<String, CodecError> {
        String::from_utf8(self.bytes(what, max)?).map_err(|_| CodecError::BadUtf8(what))
    }

    pub(crate) fn opt<T>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut Self) -> Result<T, CodecError>,
    ) -> Result<Option<T>, CodecError> {
        if self.bool(what)? {
            f(self).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A count checked against `max`; the vector grows with the items
    /// actually decoded, so a large count in a short frame allocates little.
    pub(crate) fn list<T>(
        &mut self,
        what: &'static str,
        max: usize,
        mut f: impl FnMut(&mut Self) -> Result<T, CodecError>,
    ) -> Result<Vec<T>, CodecError> {
        let n = self.u32(what)? as usize;
        check_len(what, n, max)?;
        // Every item takes at least one byte, which bounds the reservation.
        let mut out = Vec::with_capacity(n.min(self.buf.len()));
        for _ in 0..n {
            out.push(f(self)?);
        }
        Ok(out)
    }
}
