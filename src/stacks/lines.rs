//! Source lines of native frames (`launch_hangs.rs:95 in load_batch`), from
//! the objects' DWARF line tables, where they were built with debug info.
//!
//! Names come from the symbol tables ([`super::elf`]); a line needs the
//! debug sections, which `addr2line` reads from a memory map of the object
//! (nothing is copied, and only the compilation units that hold the
//! addresses asked for are parsed). Objects without DWARF (a stripped
//! release build, most system libraries) give no line, and the frame keeps
//! its object's name instead. The source line's text is read from the file
//! when it is where the build left it and not larger than [`MAX_SOURCE`].

use ringleader_diag::stacks::source_line;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Largest source file read for a line's text.
const MAX_SOURCE: u64 = 4 << 20;

/// Wall-clock time one capture spends finding lines, a backstop (only a
/// few frames per thread are looked up); frames past it keep their
/// function's name without a line.
pub(crate) const LINES_BUDGET: Duration = Duration::from_secs(2);

/// One source location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    /// The source file, as the build recorded it.
    pub(crate) file: String,
    /// 1-based.
    pub(crate) line: u32,
    /// The line's text, trimmed, when the file could be read.
    pub(crate) text: Option<String>,
}

/// Line lookups, one loader per object, kept for the capture.
#[derive(Default)]
pub(crate) struct Lines {
    objects: HashMap<String, Option<addr2line::Loader>>,
    sources: HashMap<String, Option<String>>,
    /// When the first line was looked up.
    started: Option<Instant>,
    /// Whether a lookup was skipped for [`LINES_BUDGET`].
    pub(crate) out_of_time: bool,
}

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines").field("objects", &self.objects.len()).finish()
    }
}

impl Lines {
    /// Where `probe` (an address as the object `path` numbers it: relative
    /// to its load base for a shared object or a position-independent
    /// executable) is in the source, if the object says.
    pub(crate) fn find(&mut self, path: &str, probe: u64) -> Option<Line> {
        if self.started.get_or_insert_with(Instant::now).elapsed() > LINES_BUDGET {
            self.out_of_time = true;
            return None;
        }
        let loader = self.objects.entry(path.to_string()).or_insert_with(|| addr2line::Loader::new(path).ok());
        let loc = loader.as_ref()?.find_location(probe).ok()??;
        let (file, line) = (loc.file?.to_string(), loc.line.filter(|l| *l > 0)?);
        let source = self.sources.entry(file.clone()).or_insert_with(|| {
            let small = std::fs::metadata(&file).is_ok_and(|m| m.is_file() && m.len() <= MAX_SOURCE);
            small.then(|| std::fs::read_to_string(&file).ok()).flatten()
        });
        let text = source.as_deref().and_then(|s| source_line(s, line)).filter(|t| !t.is_empty());
        Some(Line { file, line, text })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn here() -> (usize, u32) {
        (here as fn() -> (usize, u32) as usize, line!())
    }

    #[test]
    fn finds_the_line_of_a_function_of_this_very_binary() {
        let (addr, line) = here();
        let exe = std::fs::read_link("/proc/self/exe").unwrap().display().to_string();
        // SAFETY: dladdr only reads the loader's tables; a zeroed Dl_info
        // is valid for it to fill.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        assert_ne!(unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) }, 0);
        let probe = (addr - info.dli_fbase as usize) as u64;
        let mut lines = Lines::default();
        let Some(found) = lines.find(&exe, probe) else {
            // A build without debug info: nothing to find, nothing wrong.
            eprintln!("no DWARF in {exe}: skipped");
            return;
        };
        assert!(found.file.ends_with("lines.rs"), "{found:?}");
        assert!(found.line.abs_diff(line) <= 2, "{found:?}, expected about line {line}");
        assert!(lines.find("/nonexistent/object", 0x1000).is_none());
    }
}
