//! Re-printing a rank's output with its rank in front of every line.
//!
//! One thread per pipe reads whole lines and writes each, prefix included,
//! with a single `write_all` under the lock of the launcher's stdout or
//! stderr, so lines of different ranks never interleave inside a line. Bytes
//! that are not UTF-8 are replaced (lossily), a final line without a newline
//! is still printed (with one), and a line longer than [`MAX_LINE`] bytes is
//! printed in pieces rather than held in memory.

use std::io::{self, BufRead, BufReader, Read, Write};

/// The longest piece of a line held before it is printed anyway.
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// Which of the launcher's streams a pipe is copied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    /// The launcher's stdout.
    Stdout,
    /// The launcher's stderr.
    Stderr,
}

impl Sink {
    fn write_line(self, line: &[u8]) {
        // A closed or broken launcher stream must not stop the copying: the
        // child would block on a full pipe. Errors are dropped.
        let _ = match self {
            Sink::Stdout => io::stdout().lock().write_all(line),
            Sink::Stderr => io::stderr().lock().write_all(line),
        };
    }
}

/// Copies `src` line by line to `sink`, each line prefixed with `prefix`,
/// until end of file or a read error.
pub(crate) fn forward_lines(src: impl Read, prefix: &str, sink: Sink) {
    copy_lines(src, prefix, |line| sink.write_line(line));
}

/// The pure part of [`forward_lines`]: calls `emit` with each finished line
/// (prefix, text, `\n`).
pub(crate) fn copy_lines(src: impl Read, prefix: &str, mut emit: impl FnMut(&[u8])) {
    let mut reader = BufReader::new(src);
    let mut raw = Vec::with_capacity(256);
    let mut out = Vec::with_capacity(256);
    loop {
        raw.clear();
        match (&mut reader).take(MAX_LINE as u64).read_until(b'\n', &mut raw) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = raw.strip_suffix(b"\n").unwrap_or(&raw);
        out.clear();
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(String::from_utf8_lossy(text).as_bytes());
        out.push(b'\n');
        emit(&out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8]) -> Vec<String> {
        let mut got = Vec::new();
        copy_lines(input, "[rank3]: ", |l| got.push(String::from_utf8(l.to_vec()).unwrap()));
        got
    }

    #[test]
    fn prefixes_every_line_and_keeps_the_last_unterminated_one() {
        assert_eq!(lines(b"a\n\nb\nlast"), ["[rank3]: a\n", "[rank3]: \n", "[rank3]: b\n", "[rank3]: last\n"]);
        assert!(lines(b"").is_empty());
    }

    #[test]
    fn non_utf8_is_replaced() {
        assert_eq!(lines(b"x\xffy\n"), ["[rank3]: x\u{fffd}y\n"]);
    }

    #[test]
    fn long_lines_come_in_pieces() {
        let mut input = vec![b'z'; MAX_LINE + 10];
        input.push(b'\n');
        let got = lines(&input);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].len(), "[rank3]: ".len() + MAX_LINE + 1);
        assert_eq!(got[1], format!("[rank3]: {}\n", "z".repeat(10)));
    }
}
