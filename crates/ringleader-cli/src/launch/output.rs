//! Re-printing a rank's output with its rank in front of every line.
//!
//! One thread per pipe reads whole lines and writes each, prefix included,
//! with a single `write_all` under the lock of the launcher's stdout or
//! stderr, so lines of different ranks never interleave inside a line. Bytes
//! that are not UTF-8 are replaced (lossily), a final line without a newline
//! is still printed (with one), and a line longer than [`MAX_LINE`] bytes is
//! printed in pieces rather than held in memory.
//!
//! The library's own lines (`[ringleader rank R] error: ...`) say the
//! same on every rank once a job has failed: every rank that is not the
//! one printing the whole verdict prints one line naming the culprit. A
//! big job would repeat it hundreds of times, so [`Repeats`] lets the
//! first few ranks print each such line and counts the others, which the
//! launcher names at the end (`503 more copies of the line rank 1
//! printed above, from ranks 9-511 (503 ranks), were not printed`).

use ringleader_core::error::fmt_ranks;
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::Mutex;

/// How many ranks print each of the library's lines before the rest are
/// counted instead.
pub(crate) const REPEATS_SHOWN: usize = 8;
/// Distinct lines [`Repeats`] keeps track of (past that, lines print as
/// they come).
const REPEATS_TRACKED: usize = 1024;
/// Longer lines are not tracked (they print as they come).
const REPEAT_MAX_LEN: usize = 2048;
/// How the library starts its lines.
const LIBRARY_PREFIX: &str = "[ringleader rank ";

/// The library's lines that several ranks printed alike (see the module
/// docs).
#[derive(Debug, Default)]
pub(crate) struct Repeats {
    lines: Mutex<HashMap<String, Seen>>,
}

#[derive(Debug, Default)]
struct Seen {
    /// The ranks that printed it.
    shown: Vec<usize>,
    /// The ranks whose copy was not printed.
    hidden: Vec<usize>,
    /// When it was first seen (the report keeps that order).
    order: usize,
}

impl Repeats {
    /// Whether rank `rank`'s line `text` is printed: every line but one
    /// of the library's that [`REPEATS_SHOWN`] ranks already printed.
    pub(crate) fn admit(&self, rank: usize, text: &str) -> bool {
        let Some(key) = library_line(text) else { return true };
        let Ok(mut lines) = self.lines.lock() else { return true };
        let n = lines.len();
        if !lines.contains_key(&key) && n >= REPEATS_TRACKED {
            return true;
        }
        let seen = lines.entry(key).or_insert_with(|| Seen { order: n, ..Seen::default() });
        if seen.shown.len() < REPEATS_SHOWN {
            seen.shown.push(rank);
            return true;
        }
        seen.hidden.push(rank);
        false
    }

    /// One line per repeated line that was not printed by every rank that
    /// printed it.
    pub(crate) fn report(&self) -> Vec<String> {
        let Ok(lines) = self.lines.lock() else { return Vec::new() };
        let mut out: Vec<(usize, String)> = lines
            .values()
            .filter(|s| !s.hidden.is_empty())
            .map(|s| {
                let mut hidden = s.hidden.clone();
                hidden.sort_unstable();
                let first = s.shown.first().copied().unwrap_or_default();
                let copies = match hidden.len() {
                    1 => "1 more copy".to_string(),
                    n => format!("{n} more copies"),
                };
                let were = if hidden.len() == 1 { "was" } else { "were" };
                let from = fmt_ranks(&hidden);
                (s.order, format!("{copies} of the line rank {first} printed above, from {from}, {were} not printed"))
            })
            .collect();
        out.sort();
        out.into_iter().map(|(_, l)| l).collect()
    }
}

/// The library line `text` with its rank taken out (`None`: not one).
fn library_line(text: &str) -> Option<String> {
    let rest = text.strip_prefix(LIBRARY_PREFIX)?;
    let end = rest.find(']')?;
    if text.len() > REPEAT_MAX_LEN || !rest[..end].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(rest[end..].to_string())
}

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
/// until end of file or a read error; with `repeats`, the library's lines
/// of rank `.1` go through [`Repeats::admit`].
pub(crate) fn forward_lines(src: impl Read, prefix: &str, sink: Sink, repeats: Option<(&Repeats, usize)>) {
    copy_lines(src, prefix, repeats, |line| sink.write_line(line));
}

/// The pure part of [`forward_lines`]: calls `emit` with each finished line
/// (prefix, text, `\n`) that is printed.
pub(crate) fn copy_lines(
    src: impl Read,
    prefix: &str,
    repeats: Option<(&Repeats, usize)>,
    mut emit: impl FnMut(&[u8]),
) {
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
        let text = String::from_utf8_lossy(text);
        if let Some((r, rank)) = repeats {
            if !r.admit(rank, &text) {
                continue;
            }
        }
        out.clear();
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(text.as_bytes());
        out.push(b'\n');
        emit(&out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8]) -> Vec<String> {
        let mut got = Vec::new();
        copy_lines(input, "[rank3]: ", None, |l| got.push(String::from_utf8(l.to_vec()).unwrap()));
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

    #[test]
    fn the_librarys_lines_print_from_a_few_ranks_and_the_rest_are_counted() {
        let r = Repeats::default();
        let verdict = |rank: usize| format!("[ringleader rank {rank}] error: [peer-died] rank 7 (vm pid 9) died");
        let printed: Vec<usize> = (0..20).filter(|&k| r.admit(k, &verdict(k))).collect();
        assert_eq!(printed, (0..REPEATS_SHOWN).collect::<Vec<_>>());
        // Other lines, the user's and different ones of the library's, print.
        assert!(r.admit(9, "[ringleader rank 9] error: [peer-died] rank 8 (vm pid 10) died"));
        assert!((0..20).all(|k| r.admit(k, "step 3 loss 0.5")));
        assert!(r.admit(3, "[ringleader rank x] error: not the library's"));
        assert_eq!(
            r.report(),
            [format!(
                "{n} more copies of the line rank 0 printed above, from ranks {REPEATS_SHOWN}-19 ({n} ranks), were not printed",
                n = 20 - REPEATS_SHOWN
            )]
        );
        // Through the copying, as the launcher uses it.
        let mut got = Vec::new();
        copy_lines(verdict(30).as_bytes(), "[rank30]: ", Some((&r, 30)), |l| got.push(l.to_vec()));
        assert!(got.is_empty());
    }
}
