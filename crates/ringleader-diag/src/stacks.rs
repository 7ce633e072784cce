//! Where a rank's threads are when the job fails: their Python and native
//! stacks, and the one frame a verdict shows for a culprit
//! (`rank 2 is at train.py:45 in load_batch: time.sleep(40)`).
//!
//! Capturing happens in the rank's process (the `ringleader` crate's
//! `stacks` module: a signal to itself that Python's `faulthandler`
//! answers, and one to each thread whose handler records instruction
//! pointers); this file is what comes after, as pure functions: parsing
//! `faulthandler`'s text, picking the culprit's innermost frame of its own
//! code, and bounding what a published snapshot carries. No IO.

use serde::{Deserialize, Serialize};

/// At most this many threads are kept per kind of stack.
pub const MAX_THREADS: usize = 64;
/// At most this many frames are kept per thread (innermost first).
pub const MAX_FRAMES: usize = 64;
/// At most this many frames of the chosen thread travel in a published
/// (compact) snapshot; the dump keeps [`MAX_FRAMES`].
pub const COMPACT_FRAMES: usize = 16;
/// At most this many bytes of a source line are kept.
pub const MAX_TEXT: usize = 160;

/// One frame of a stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// The function (`load_batch`; a demangled symbol for native frames;
    /// `??` when unknown).
    pub function: String,
    /// The source file (Python frames, and native frames of objects built
    /// with line tables), else the object the code lives in (native
    /// frames: `/usr/lib/x86_64-linux-gnu/libc.so.6`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The line (Python frames; native frames with line tables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// The source line's text, trimmed (Python frames, when the file could
    /// be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The object the code lives in, for a native frame whose `file` is
    /// its source file (the object had line tables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The instruction pointer (native frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<u64>,
}

impl Frame {
    /// `train.py:45 in load_batch: time.sleep(40)` (Python), or
    /// `hang_demo::load_batch (in /path/to/binary)` (native).
    pub fn label(&self) -> String {
        let mut s = match (&self.file, self.line) {
            (Some(f), Some(l)) => format!("{f}:{l} in {}", self.function),
            (Some(f), None) => format!("{} (in {f})", self.function),
            (None, _) => self.function.clone(),
        };
        if let Some(t) = self.text.as_deref().filter(|t| !t.is_empty()) {
            s += &format!(": {t}");
        }
        s
    }
}

/// One thread's stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadStack {
    /// The thread's id: Python's thread ident in hex (`0x7f3a...`, as
    /// `threading.get_ident()` gives it) or the kernel's thread id.
    pub id: String,
    /// The thread's name (`/proc/self/task/TID/comm` for native threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The kernel's state letter and word (`S (sleeping)`), native threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Whether it is the process's main thread.
    #[serde(default)]
    pub main: bool,
    /// Its frames, innermost first (at most [`MAX_FRAMES`]).
    pub frames: Vec<Frame>,
    /// Why there are no frames, when there are none (the thread did not
    /// answer in time, it blocks the signal, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Where a rank's threads were when it learned that the job failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stacks {
    /// The culprit line: the innermost frame of the user's own code on the
    /// thread that matters (Python's main thread, else the process's main
    /// thread), as [`Frame::label`] writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// Python stacks, one per thread (from `faulthandler`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python: Vec<ThreadStack>,
    /// Native stacks, one per thread.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub native: Vec<ThreadStack>,
    /// What could not be captured, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// How long capturing took, in milliseconds.
    #[serde(default)]
    pub took_ms: u64,
}

impl Stacks {
    /// What a published snapshot carries: the culprit line, the main
    /// thread's stacks cut to [`COMPACT_FRAMES`], the notes; the whole
    /// stacks stay in the dump.
    pub fn compact(&self) -> Stacks {
        let cut = |ts: &[ThreadStack]| -> Vec<ThreadStack> {
            ts.iter()
                .filter(|t| t.main)
                .take(1)
                .map(|t| {
                    let mut t = t.clone();
                    t.frames.truncate(COMPACT_FRAMES);
                    t
                })
                .collect()
        };
        Stacks {
            at: self.at.clone(),
            python: cut(&self.python),
            native: cut(&self.native),
            notes: self.notes.clone(),
            took_ms: self.took_ms,
        }
    }

    /// The stacks as text, for `ringleader analyze`: one block per thread,
    /// a frame per line, innermost first.
    pub fn render(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (kind, threads) in [("python", &self.python), ("native", &self.native)] {
            for t in threads.iter() {
                let mut head = format!("{kind} thread {}", t.id);
                if let Some(n) = &t.name {
                    head += &format!(" '{n}'");
                }
                if t.main {
                    head += " (main)";
                }
                if let Some(s) = &t.state {
                    head += &format!(" [{s}]");
                }
                if let Some(n) = &t.note {
                    head += &format!(": {n}");
                }
                out.push(head);
                out.extend(t.frames.iter().map(|f| format!("  {}", f.label())));
            }
        }
        out.extend(self.notes.iter().map(|n| format!("note: {n}")));
        out
    }
}

/// Parses the text Python's `faulthandler` writes for all threads:
///
/// ```text
/// Thread 0x00007f3a1b2c3700 (most recent call first):
///   File "/usr/lib/python3.11/threading.py", line 320 in wait
///
/// Current thread 0x00007f3a1c4d5740 (most recent call first):
///   File "train.py", line 45 in load_batch
///   File "train.py", line 60 in main
/// ```
///
/// Threads in the order written, frames innermost first, at most
/// [`MAX_THREADS`] and [`MAX_FRAMES`]; lines it does not know are skipped,
/// so a truncated or garbled dump yields what it holds. `main` marks the
/// thread whose ident is `main_ident`.
///
/// ```
/// use ringleader_diag::stacks::parse_faulthandler;
/// let t = parse_faulthandler("Current thread 0x00000000000000ff (most recent call first):\n  File \"a.py\", line 3 in f\n", Some(0xff));
/// assert_eq!((t[0].main, t[0].frames[0].label()), (true, "a.py:3 in f".to_string()));
/// ```
pub fn parse_faulthandler(text: &str, main_ident: Option<u64>) -> Vec<ThreadStack> {
    let mut threads: Vec<ThreadStack> = Vec::new();
    for line in text.lines() {
        let head = line.strip_prefix("Current thread ").or_else(|| line.strip_prefix("Thread "));
        if let Some(rest) = head {
            if threads.len() >= MAX_THREADS {
                break;
            }
            let id = rest.split_whitespace().next().unwrap_or_default().to_string();
            let ident = id.strip_prefix("0x").and_then(|h| u64::from_str_radix(h, 16).ok());
            threads.push(ThreadStack {
                id: ident.map_or(id, |v| format!("{v:#x}")),
                name: None,
                state: None,
                main: main_ident.is_some() && ident == main_ident,
                frames: Vec::new(),
                note: None,
            });
            continue;
        }
        let (Some(t), Some(frame)) = (threads.last_mut(), parse_frame_line(line)) else {
            continue;
        };
        if t.frames.len() < MAX_FRAMES {
            t.frames.push(frame);
        }
    }
    threads
}

/// `  File "train.py", line 45 in load_batch` as a frame. The file name
/// may itself hold quotes, so the line number is found from the right.
fn parse_frame_line(line: &str) -> Option<Frame> {
    let rest = line.trim_start().strip_prefix("File \"")?;
    let cut = rest.rfind("\", line ")?;
    let file = &rest[..cut];
    let after = &rest[cut + "\", line ".len()..];
    let (num, function) = after.split_once(" in ")?;
    Some(Frame {
        function: function.trim_end().to_string(),
        file: Some(file.to_string()),
        line: num.trim().parse().ok(),
        text: None,
        ip: None,
        object: None,
    })
}

/// The innermost frame of the user's own code on the thread that
/// matters: the main thread if it has one, else the first thread that
/// has any; `internal` says which frames are not the user's (see
/// [`python_internal`] and [`native_internal`]). `None` when every frame
/// is internal. Returns the thread's index too.
///
/// ```
/// use ringleader_diag::stacks::{innermost_user, python_internal, Frame, ThreadStack};
/// let f = |file: &str, line| Frame { function: "f".into(), file: Some(file.into()), line: Some(line), text: None, ip: None, object: None };
/// let t = ThreadStack { id: "1".into(), name: None, state: None, main: true, note: None,
///     frames: vec![f("/lib/ringleader/__init__.py", 9), f("train.py", 24)] };
/// let internal = ["/lib/ringleader/".to_string()];
/// let threads = [t];
/// let (_, at) = innermost_user(&threads, |f| python_internal(f, &internal)).unwrap();
/// assert_eq!(at.line, Some(24));
/// ```
pub fn innermost_user(threads: &[ThreadStack], internal: impl Fn(&Frame) -> bool) -> Option<(usize, &Frame)> {
    let pick = |i: usize| threads[i].frames.iter().find(|f| !internal(f)).map(|f| (i, f));
    let main = threads.iter().position(|t| t.main);
    main.and_then(pick).or_else(|| (0..threads.len()).filter(|&i| Some(i) != main).find_map(pick))
}

/// Whether a Python frame is not the user's: its file starts with one of
/// `prefixes` (the ringleader package, torch, the standard library, as the
/// Python package registers them), or it is frozen import machinery.
pub fn python_internal(f: &Frame, prefixes: &[String]) -> bool {
    let file = f.file.as_deref().unwrap_or_default();
    file.starts_with("<frozen ") || prefixes.iter().any(|p| !p.is_empty() && file.starts_with(p.as_str()))
}

/// Native functions that are not the user's code: Rust's runtime and
/// standard library, ringleader itself, libtest's harness, the unwinder,
/// thread start-up, and anything without a name.
const NATIVE_INTERNAL_FUNCTIONS: &[&str] = &[
    "std::",
    "core::",
    "alloc::",
    "<std::",
    "<core::",
    "<alloc::",
    "ringleader",
    "<ringleader",
    "parking_lot",
    "test::",
    "__",
    "_start",
    "start_thread",
    "clone",
    "_Unwind",
    "??",
];

/// Folders whose objects are the system's (the C library, the dynamic
/// loader, libgcc): a frame in them is not the user's code.
const NATIVE_SYSTEM_DIRS: &[&str] = &["/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/"];

/// Whether a native frame is not the user's: see
/// `NATIVE_INTERNAL_FUNCTIONS` and `NATIVE_SYSTEM_DIRS`.
pub fn native_internal(f: &Frame) -> bool {
    // A symbol still mangled is one the demangler could not read: better
    // skipped than shown as the user's line.
    let mangled = f.function.starts_with("_R") || f.function.starts_with("_ZN");
    mangled
        || NATIVE_INTERNAL_FUNCTIONS.iter().any(|p| f.function.starts_with(p))
        || f.object
            .as_deref()
            .or(f.file.as_deref())
            .is_some_and(|o| NATIVE_SYSTEM_DIRS.iter().any(|d| o.starts_with(d)))
}

/// Line `line` (1-based) of `source`, trimmed and cut to [`MAX_TEXT`]
/// bytes at a character boundary.
///
/// ```
/// assert_eq!(ringleader_diag::stacks::source_line("a\n    time.sleep(40)\n", 2).as_deref(), Some("time.sleep(40)"));
/// ```
pub fn source_line(source: &str, line: u32) -> Option<String> {
    let text = source.lines().nth((line as usize).checked_sub(1)?)?.trim();
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some(text[..end].to_string())
}

/// A Rust symbol as a person reads it: legacy mangling (`_ZN` ... `E`)
/// becomes `a::b::c` without the trailing hash; anything else (C symbols,
/// v0 mangling) stays as it is.
///
/// ```
/// use ringleader_diag::stacks::demangle;
/// assert_eq!(demangle("_ZN9hang_demo10load_batch17h0123456789abcdefE"), "hang_demo::load_batch");
/// assert_eq!(demangle("nanosleep"), "nanosleep");
/// ```
pub fn demangle(sym: &str) -> String {
    if let Some(v0) = sym.strip_prefix("_R") {
        return V0 { b: v0.as_bytes(), i: 0 }.symbol().unwrap_or_else(|| sym.to_string());
    }
    let Some(mut rest) = sym.strip_prefix("_ZN") else {
        return sym.to_string();
    };
    let mut parts: Vec<String> = Vec::new();
    while let Some(digits) = rest.find(|c: char| !c.is_ascii_digit()).filter(|&n| n > 0) {
        let Ok(len) = rest[..digits].parse::<usize>() else {
            return sym.to_string();
        };
        let Some(part) = rest.get(digits..digits + len) else {
            return sym.to_string();
        };
        rest = &rest[digits + len..];
        let is_hash = part.len() == 17 && part.starts_with('h') && part[1..].chars().all(|c| c.is_ascii_hexdigit());
        if !is_hash {
            parts.push(unescape(part));
        }
    }
    if !rest.starts_with('E') || parts.is_empty() {
        return sym.to_string();
    }
    parts.join("::")
}

/// Rust's v0 mangling (`_R...`, what the standard library is built
/// with), for the paths a stack shows: crate roots, nested names and
/// closures, and a generic function's path (its arguments left out as
/// `<..>`). Anything else (impl paths, back-references) is left to the
/// caller, which keeps the symbol as it is.
struct V0<'a> {
    b: &'a [u8],
    i: usize,
}

impl V0<'_> {
    fn next(&mut self) -> Option<u8> {
        let c = *self.b.get(self.i)?;
        self.i += 1;
        Some(c)
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// The whole symbol: an optional encoding version, then a path.
    fn symbol(&mut self) -> Option<String> {
        while self.peek()?.is_ascii_digit() {
            self.i += 1;
        }
        if self.peek()? == b'I' {
            self.i += 1;
            return Some(format!("{}<..>", self.path(0)?));
        }
        self.path(0)
    }

    fn path(&mut self, depth: usize) -> Option<String> {
        if depth > 64 {
            return None;
        }
        match self.next()? {
            b'C' => Some(self.ident()?.1),
            b'N' => {
                let ns = self.next()?;
                let parent = self.path(depth + 1)?;
                let (dis, id) = self.ident()?;
                Some(match ns {
                    b'C' => format!("{parent}::{{closure#{dis}}}"),
                    b'S' => format!("{parent}::{{shim#{dis}}}"),
                    _ if id.is_empty() => parent,
                    _ => format!("{parent}::{id}"),
                })
            }
            // An inherent impl: `<Type>`.
            b'M' => {
                self.impl_path(depth)?;
                Some(format!("<{}>", self.ty(depth + 1)?))
            }
            // A trait impl: `<Type as Trait>`.
            b'X' => {
                self.impl_path(depth)?;
                let ty = self.ty(depth + 1)?;
                Some(format!("<{ty} as {}>", self.path(depth + 1)?))
            }
            b'Y' => {
                let ty = self.ty(depth + 1)?;
                Some(format!("<{ty} as {}>", self.path(depth + 1)?))
            }
            b'B' => self.backref(depth, |p, d| p.path(d)),
            _ => None,
        }
    }

    /// An impl's own path (`[s<base62>_] path`), read past.
    fn impl_path(&mut self, depth: usize) -> Option<()> {
        if self.peek()? == b's' {
            self.i += 1;
            self.base62()?;
        }
        self.path(depth + 1).map(|_| ())
    }

    /// A type, where it names a path (structs, enums, traits); other types
    /// (references, tuples, ...) are not read.
    fn ty(&mut self, depth: usize) -> Option<String> {
        match self.peek()? {
            b'C' | b'N' | b'M' | b'X' | b'Y' => self.path(depth),
            b'B' => {
                self.i += 1;
                self.backref(depth, |p, d| p.ty(d))
            }
            _ => None,
        }
    }

    /// `B<base62>`: what is written at that offset, read there.
    fn backref(&mut self, depth: usize, read: impl Fn(&mut Self, usize) -> Option<String>) -> Option<String> {
        let at = usize::try_from(self.base62()?).ok()?;
        if at >= self.i || depth > 64 {
            return None;
        }
        let back = std::mem::replace(&mut self.i, at);
        let r = read(self, depth + 1);
        self.i = back;
        r
    }

    /// `[s<base62>_] <decimal> [_] <bytes>`: the disambiguator and the name.
    fn ident(&mut self) -> Option<(u64, String)> {
        let mut dis = 0;
        if self.peek()? == b's' {
            self.i += 1;
            dis = self.base62()? + 1;
        }
        let punycode = self.peek()? == b'u';
        if punycode {
            self.i += 1;
        }
        let start = self.i;
        while self.peek()?.is_ascii_digit() {
            self.i += 1;
        }
        let len: usize = std::str::from_utf8(&self.b[start..self.i]).ok()?.parse().ok()?;
        if self.peek() == Some(b'_') {
            self.i += 1;
        }
        let name = self.b.get(self.i..self.i.checked_add(len)?)?;
        self.i += len;
        Some((dis, String::from_utf8_lossy(name).into_owned()))
    }

    /// A base-62 number ended by `_` (`_` alone is 0, `0_` is 1, ...).
    fn base62(&mut self) -> Option<u64> {
        if self.peek()? == b'_' {
            self.i += 1;
            return Some(0);
        }
        let mut n: u64 = 0;
        loop {
            let c = self.next()?;
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'z' => 10 + c - b'a',
                b'A'..=b'Z' => 36 + c - b'A',
                b'_' => return n.checked_add(1),
                _ => return None,
            };
            n = n.checked_mul(62)?.checked_add(u64::from(d))?;
        }
    }
}

/// Legacy mangling's escapes (`$LT$`, `..`, ...) read back.
fn unescape(part: &str) -> String {
    // A leading `_` only escapes a `$` that starts the part.
    let part = part.strip_prefix('_').filter(|p| p.starts_with('$')).unwrap_or(part);
    let mut s = part.replace("..", "::");
    for (from, to) in [
        ("$LT$", "<"),
        ("$GT$", ">"),
        ("$RF$", "&"),
        ("$BP$", "*"),
        ("$LP$", "("),
        ("$RP$", ")"),
        ("$C$", ","),
        ("$u20$", " "),
        ("$u27$", "'"),
        ("$u5b$", "["),
        ("$u5d$", "]"),
        ("$u7b$", "{"),
        ("$u7d$", "}"),
        ("$u7e$", "~"),
        ("$SP$", "@"),
    ] {
        s = s.replace(from, to);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "Thread 0x00007f3a1b2c3700 (most recent call first):
  File \"/usr/lib/python3.11/threading.py\", line 320 in wait
  File \"/usr/lib/python3.11/threading.py\", line 1000 in _bootstrap

Current thread 0x00007f3a1c4d5740 (most recent call first):
  File \"/site/ringleader/__init__.py\", line 300 in all_reduce
  File \"train.py\", line 45 in load_batch
  File \"we\"ird.py\", line 60 in <module>

Thread 0x00007f3a00000001 (most recent call first):
  <no Python frame>
";

    #[test]
    fn parses_every_thread_and_frame() {
        let t = parse_faulthandler(DUMP, Some(0x7f3a1c4d5740));
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].id, "0x7f3a1b2c3700");
        assert!(!t[0].main && t[1].main && !t[2].main);
        assert_eq!(t[1].frames.len(), 3);
        assert_eq!(t[1].frames[2].file.as_deref(), Some("we\"ird.py"));
        assert_eq!(t[1].frames[2].function, "<module>");
        assert!(t[2].frames.is_empty());
    }

    #[test]
    fn a_truncated_dump_yields_what_it_holds() {
        let cut = &DUMP[..DUMP.find("line 45").unwrap()];
        let t = parse_faulthandler(cut, None);
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].frames.len(), 1);
        assert!(parse_faulthandler("garbage\n\0\n", None).is_empty());
    }

    #[test]
    fn picks_the_main_threads_innermost_user_frame() {
        let t = parse_faulthandler(DUMP, Some(0x7f3a1c4d5740));
        let internal = vec!["/site/ringleader/".to_string(), "/usr/lib/python3.11/".to_string()];
        let (i, f) = innermost_user(&t, |f| python_internal(f, &internal)).unwrap();
        assert_eq!((i, f.label()), (1, "train.py:45 in load_batch".to_string()));
    }

    #[test]
    fn without_a_main_thread_the_first_thread_with_user_code() {
        let t = parse_faulthandler(DUMP, None);
        let internal = vec!["/site/ringleader/".to_string()];
        // Thread 0 is all standard library, but not marked internal here.
        assert_eq!(innermost_user(&t, |f| python_internal(f, &internal)).unwrap().0, 0);
        let internal = vec!["/site/ringleader/".to_string(), "/usr/lib/python3.11/".to_string()];
        assert_eq!(innermost_user(&t, |f| python_internal(f, &internal)).unwrap().0, 1);
        let everything = vec!["/".to_string(), "train".to_string(), "we".to_string()];
        assert!(innermost_user(&t, |f| python_internal(f, &everything)).is_none());
    }

    #[test]
    fn native_frames_are_judged_by_function() {
        let f = |name: &str| Frame {
            function: name.into(),
            file: Some(if name.contains("sleep") { "/lib/libc.so.6" } else { "/job/bin" }.into()),
            line: None,
            text: None,
            ip: Some(1),
            object: None,
        };
        let t = ThreadStack {
            id: "7".into(),
            name: Some("main".into()),
            state: None,
            main: true,
            frames: vec![f("clock_nanosleep"), f("std::thread::sleep"), f("hang_stack::load_batch"), f("main")],
            note: None,
        };
        let (_, at) = innermost_user(std::slice::from_ref(&t), native_internal).unwrap();
        assert_eq!(at.label(), "hang_stack::load_batch (in /job/bin)");
    }

    #[test]
    fn source_lines_are_trimmed_and_bounded() {
        assert_eq!(source_line("x\n", 0), None);
        assert_eq!(source_line("x\n", 2), None);
        let long = format!("  {}\n", "é".repeat(200));
        let l = source_line(&long, 1).unwrap();
        assert!(l.len() <= MAX_TEXT && l.chars().all(|c| c == 'é'));
    }

    #[test]
    fn demangles_legacy_rust_symbols() {
        assert_eq!(
            demangle("_ZN4core3ptr85drop_in_place$LT$std..rt..lang_start$LT$$LP$$RP$$GT$..$u7b$$u7b$closure$u7d$$u7d$$GT$17h9d1ef3cd2d5a0e7cE"),
            "core::ptr::drop_in_place<std::rt::lang_start<()>::{{closure}}>"
        );
        assert_eq!(
            demangle(
                "_ZN10ringleader7failure44_$LT$impl$u20$ringleader..engine..Shared$GT$7resolve17h0123456789abcdefE"
            ),
            "ringleader::failure::<impl ringleader::engine::Shared>::resolve"
        );
        assert_eq!(demangle("_RNvNtNtCsjrHSEGnQ3l9_3std6thread9functions5sleep"), "std::thread::functions::sleep");
        assert_eq!(
            demangle("_RNCNvCs1234_7mycrate4main0B3_"),
            "mycrate::main::{closure#0}",
            "a closure (the back-reference after it is not read)"
        );
        assert_eq!(demangle("_RINvCs1_1a1fE"), "a::f<..>");
        assert_eq!(
            demangle("_RNvMNtNtNtNtCsjrHSEGnQ3l9_3std3sys3pal4unix4timeNtB2_8Timespec3now"),
            "<std::sys::pal::unix::time::Timespec>::now"
        );
        // What it does not read stays as it is.
        assert_eq!(demangle("_RNvMCs1_3fooRe3new"), "_RNvMCs1_3fooRe3new");
        assert_eq!(demangle("_RNvC"), "_RNvC");
        assert_eq!(demangle("_ZN3foo"), "_ZN3foo");
        assert_eq!(demangle("_ZN99999E"), "_ZN99999E");
    }

    #[test]
    fn compact_keeps_the_main_thread_cut_short() {
        let fr = Frame {
            function: "f".into(),
            file: Some("a.py".into()),
            line: Some(1),
            text: None,
            ip: None,
            object: None,
        };
        let t = |main| ThreadStack {
            id: "1".into(),
            name: None,
            state: None,
            main,
            frames: vec![fr.clone(); MAX_FRAMES],
            note: None,
        };
        let s = Stacks { at: Some("a.py:1 in f".into()), python: vec![t(false), t(true)], ..Default::default() };
        let c = s.compact();
        assert_eq!(c.python.len(), 1);
        assert!(c.python[0].main);
        assert_eq!(c.python[0].frames.len(), COMPACT_FRAMES);
        assert_eq!(c.at, s.at);
        assert!(s.render().iter().any(|l| l == "python thread 1 (main)"));
    }
}
