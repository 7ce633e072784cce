//! Where this process's threads are, captured when the job fails so that
//! the verdict can show a culprit's own line (`rank 2 is at train.py:45 in
//! load_batch: time.sleep(40)`) and the dump can hold the whole stacks.
//!
//! Two sources, both in-process (no ptrace, no external tool):
//! - Python's stacks of every thread, when the Python package registered
//!   them ([`set_python_dump`]): it arms `faulthandler` on a real-time
//!   signal with a private file (a memfd) and hands the library that file.
//!   Capturing raises the signal on the capturing thread itself, so the
//!   kernel runs faulthandler's handler before `tgkill` returns, and
//!   faulthandler needs no GIL: a thread holding the GIL in native code
//!   does not stop it. The text is read back (bounded) and parsed
//!   ([`ringleader_diag::stacks`]).
//! - Native stacks of every thread (`stacks/native.rs`, with its trade-offs), on
//!   `RINGLEADER_NATIVE_STACK_SIGNAL` (default SIGRTMIN+7; 0 turns them
//!   off).
//!
//! A capture is kept for `REUSE` (10 s): the monitor (for a rank outside any
//! collective) and a failing call on the same rank, or a process's several
//! communicators, share one capture rather than signal every thread again.

#![allow(unsafe_code)]

mod elf;
mod lines;
mod native;

use parking_lot::Mutex;
use ringleader_diag::stacks::{
    innermost_user, native_internal, parse_faulthandler, python_internal, source_line, Stacks,
};
use std::collections::HashMap;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a capture serves later requests.
const REUSE: Duration = Duration::from_secs(10);
/// How long a request waits for another thread's capture under way.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// Most bytes of faulthandler's text read back.
const MAX_PYTHON_DUMP: usize = 1 << 20;
/// Largest source file read for a frame's line.
const MAX_SOURCE: u64 = 4 << 20;
/// Most source files read per capture.
const MAX_SOURCES: usize = 32;

/// What the Python package registered: where faulthandler writes and on
/// which signal.
#[derive(Debug, Clone)]
struct PythonDump {
    fd: RawFd,
    signal: i32,
    main_ident: u64,
    internal: Vec<String>,
}

static PYTHON: Mutex<Option<PythonDump>> = Mutex::new(None);

/// The kernel thread id of the thread that last started an operation on
/// any communicator of this process (0: none yet): whose native stack the
/// verdict's line is taken from, before the main thread's (a Rust program
/// may well run its collectives elsewhere).
static CALLER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

thread_local! {
    /// This thread's kernel id, read once (a system call) per thread.
    static TID: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// Notes the calling thread as the one making operations: a thread-local
/// read and an atomic store, cheap enough for every call.
pub(crate) fn note_caller() {
    let tid = TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid has no preconditions.
            t.set(unsafe { libc::syscall(libc::SYS_gettid) } as i32);
        }
        t.get()
    });
    CALLER.store(tid, std::sync::atomic::Ordering::Relaxed);
}
static LAST: Mutex<Option<(Instant, Arc<Stacks>)>> = Mutex::new(None);

/// Registers Python's stack dump: `fd`, a file of this process's own
/// (readable, writable, seekable) that `faulthandler` writes every
/// thread's stack to on `signal`; `main_ident`, Python's main thread
/// (`threading.main_thread().ident`); `internal`, path prefixes of code
/// that is not the user's (the ringleader package, torch, the standard
/// library). `signal` 0 unregisters. The caller keeps `fd` open for as
/// long as it stays registered.
pub fn set_python_dump(fd: RawFd, signal: i32, main_ident: u64, internal: Vec<String>) {
    *PYTHON.lock() = (signal > 0 && fd >= 0).then_some(PythonDump { fd, signal, main_ident, internal });
}

/// The native-stack signal from `RINGLEADER_NATIVE_STACK_SIGNAL`: a
/// number, `0` (off), or unset (the default).
fn native_signal() -> Option<i32> {
    match std::env::var("RINGLEADER_NATIVE_STACK_SIGNAL") {
        Ok(v) => v.trim().parse::<i32>().ok().filter(|&s| s > 0),
        Err(_) => Some(native::default_signal()),
    }
}

/// This process's stacks now, or as captured less than [`REUSE`] ago;
/// `None` when nothing could be captured at all. Bounded: about half a
/// second for the native stacks plus reading and naming them.
pub(crate) fn capture() -> Option<Arc<Stacks>> {
    let recent = |last: &Option<(Instant, Arc<Stacks>)>| {
        last.as_ref().filter(|(at, _)| at.elapsed() < REUSE).map(|(_, s)| s.clone())
    };
    // One capture at a time (the slots and the dump file are shared); a
    // second request waits for the first and takes its result.
    let mut last = LAST.try_lock_for(LOCK_WAIT)?;
    if let Some(s) = recent(&last) {
        return Some(s);
    }
    let started = Instant::now();
    let mut stacks = Stacks::default();
    let python = PYTHON.lock().clone();
    if let Some(py) = &python {
        capture_python(py, &mut stacks);
    }
    if let Some(sig) = native_signal() {
        stacks.native = native::capture(sig, &mut stacks.notes);
        if stacks.at.is_none() && python.is_none() {
            // The thread that made the last call, else the main thread.
            let caller = CALLER.load(std::sync::atomic::Ordering::Relaxed).to_string();
            let mut threads = stacks.native.clone();
            if threads.iter().any(|t| t.id == caller) {
                threads.iter_mut().for_each(|t| t.main = t.id == caller);
            }
            stacks.at = innermost_user(&threads, native_internal).map(|(_, f)| f.label());
        }
    }
    if stacks.python.is_empty() && stacks.native.is_empty() && stacks.notes.is_empty() {
        return None;
    }
    stacks.took_ms = started.elapsed().as_millis() as u64;
    let stacks = Arc::new(stacks);
    *last = Some((Instant::now(), stacks.clone()));
    Some(stacks)
}

/// Raises faulthandler's signal on this thread and reads its text back.
fn capture_python(py: &PythonDump, out: &mut Stacks) {
    // SAFETY: the Python package keeps the descriptor open while it is
    // registered (its promise in `rl_set_stack_dump`).
    let fd = unsafe { BorrowedFd::borrow_raw(py.fd) };
    let reset = rustix::fs::ftruncate(fd, 0).and_then(|()| rustix::fs::seek(fd, rustix::fs::SeekFrom::Start(0)));
    if let Err(e) = reset {
        out.notes.push(format!("no Python stacks: the dump file cannot be reset ({e})"));
        return;
    }
    // The signal goes to this very thread: the kernel runs faulthandler's
    // handler before the call returns, so the text is complete after it.
    let pid = std::process::id() as i32;
    // SAFETY: gettid and tgkill on this thread, with a signal that
    // faulthandler handles (registered by the Python package).
    let sent = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as i32;
        libc::syscall(libc::SYS_tgkill, pid, tid, py.signal)
    };
    if sent != 0 {
        out.notes.push(format!("no Python stacks: signal {} failed ({})", py.signal, std::io::Error::last_os_error()));
        return;
    }
    let mut buf = vec![0u8; MAX_PYTHON_DUMP];
    let mut len = 0;
    while len < buf.len() {
        match rustix::io::pread(fd, &mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                out.notes.push(format!("no Python stacks: cannot read the dump back ({e})"));
                return;
            }
        }
    }
    let text = String::from_utf8_lossy(&buf[..len]);
    out.python = parse_faulthandler(&text, Some(py.main_ident));
    if out.python.is_empty() {
        out.notes.push(format!("no Python stacks: faulthandler wrote nothing on signal {}", py.signal));
        return;
    }
    add_source_lines(&mut out.python);
    relative_paths(&mut out.python);
    out.at = innermost_user(&out.python, |f| python_internal(f, &py.internal)).map(|(_, f)| f.label());
}

/// Files under the working directory named relative to it, as call sites
/// are (`scripts/train.py:45`, not the whole path).
fn relative_paths(threads: &mut [ringleader_diag::stacks::ThreadStack]) {
    let Ok(cwd) = std::env::current_dir() else { return };
    let prefix = format!("{}/", cwd.display());
    for f in threads.iter_mut().flat_map(|t| t.frames.iter_mut()) {
        if let Some(rest) = f.file.as_deref().and_then(|p| p.strip_prefix(&prefix)) {
            f.file = Some(rest.to_string());
        }
    }
}

/// Fills in each Python frame's source line, reading each file once (at
/// most [`MAX_SOURCES`] files of at most [`MAX_SOURCE`] bytes). Relative
/// names resolve against this process's working directory, as Python's do.
fn add_source_lines(threads: &mut [ringleader_diag::stacks::ThreadStack]) {
    let mut files: HashMap<String, Option<String>> = HashMap::new();
    for f in threads.iter_mut().flat_map(|t| t.frames.iter_mut()) {
        let (Some(file), Some(line)) = (f.file.clone(), f.line) else {
            continue;
        };
        if !files.contains_key(&file) {
            if files.len() >= MAX_SOURCES || file.starts_with('<') {
                continue;
            }
            let text = std::fs::File::open(&file).ok().and_then(|h| {
                use std::io::Read;
                let mut s = String::new();
                h.take(MAX_SOURCE).read_to_string(&mut s).ok().map(|_| s)
            });
            files.insert(file.clone(), text);
        }
        f.text = files.get(&file).and_then(|s| s.as_deref()).and_then(|s| source_line(s, line));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn park_in_a_named_function(ready: &std::sync::Barrier, stop: &std::sync::atomic::AtomicBool) {
        ready.wait();
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::park_timeout(Duration::from_millis(50));
        }
    }

    /// A thread of this test parked in a function of its own: the native
    /// capture names that function on that thread, and the capture is
    /// reused when asked again at once.
    #[test]
    fn native_capture_names_a_parked_threads_function() {
        let ready = Arc::new(std::sync::Barrier::new(2));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (r, s) = (ready.clone(), stop.clone());
        let t = std::thread::Builder::new()
            .name("rl-test-parked".into())
            .spawn(move || park_in_a_named_function(&r, &s))
            .unwrap();
        ready.wait();
        let stacks = capture().expect("captured");
        stop.store(true, std::sync::atomic::Ordering::Release);
        t.thread().unpark();
        t.join().unwrap();
        let parked = stacks.native.iter().find(|t| t.name.as_deref() == Some("rl-test-parked")).expect("the thread");
        assert!(parked.frames.iter().any(|f| f.function.ends_with("park_in_a_named_function")), "{:#?}", parked.frames);
        assert!(stacks.native.iter().any(|t| t.main));
        assert!(Arc::ptr_eq(&stacks, &capture().unwrap()));
    }
}
