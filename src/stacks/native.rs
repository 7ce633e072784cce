//! Native stacks of this process's threads, without ptrace: a real-time
//! signal to each thread (`tgkill` over `/proc/self/task`), whose handler
//! walks its own stack into a preallocated slot; names come afterwards,
//! outside any handler ([`super::elf`], `dladdr`).
//!
//! The trade-off, said plainly. A signal handler may only call
//! async-signal-safe functions, and the unwinder (`_Unwind_Backtrace`,
//! libgcc's, which Rust's own backtraces use) is not one: it reads the
//! objects' unwind tables and may take the dynamic loader's lock. If the
//! signalled thread holds that lock (it is inside `dlopen`, or unwinding
//! an exception), its handler blocks for good. The capture happens only
//! once the job has failed and the process is about to end, the requester
//! waits a bounded time ([`WAIT`]) and reports such threads as not
//! answering, and nothing else in the process waits for them; a stuck
//! thread is the price of a stack without ptrace (which containers often
//! forbid). The handler itself allocates nothing, takes no lock, and
//! touches only atomics in static slots and `errno` (saved and restored).
//!
//! A signal also interrupts the blocking call a thread is in. Calls the
//! kernel restarts (`read`, `write`, a futex wait, ... under `SA_RESTART`)
//! carry on unseen, but sleeps and waits with a timeout (`nanosleep`,
//! `poll`, `epoll_wait`, ...) return early with `EINTR`, and a C `sleep()`
//! then returns with its seconds left: the culprit would move on, and the
//! verdict would race with it. So a thread blocked in one of those
//! ([`WAIT_SYSCALLS`], read from `/proc/self/task/TID/syscall`, which a
//! process may read of itself without ptrace) is not signalled: its stack
//! is found by scanning its stack memory from the stack pointer the kernel
//! reports, keeping the words that point just after a call instruction in
//! executable code ([`scan`]). A scan may keep a stale return address that
//! a live frame left behind; such stacks carry a note saying how they were
//! found. Every read of another thread's memory goes through
//! `process_vm_readv` on this process, which fails instead of faulting.

#![allow(unsafe_code)]

use super::elf::Symbols;
use ringleader_diag::stacks::{demangle, Frame, ThreadStack, MAX_FRAMES, MAX_THREADS};

/// Frames of each thread given a source line, from its innermost frame of
/// the program's own code outwards.
const LINED_FRAMES: usize = 3;
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long the requester waits for every thread's handler in all.
pub(crate) const WAIT: Duration = Duration::from_millis(500);

/// One thread's answer: set up by the requester (`tid`), filled in by
/// that thread's handler (`ips`, `n`, `pc`), then `done`.
struct Slot {
    tid: AtomicI32,
    done: AtomicBool,
    n: AtomicUsize,
    /// The interrupted instruction, from the signal's context: the
    /// frames before it are the handler's own.
    pc: AtomicUsize,
    ips: [AtomicUsize; MAX_FRAMES + 4],
}

static SLOTS: [Slot; MAX_THREADS] = [const {
    Slot {
        tid: AtomicI32::new(0),
        done: AtomicBool::new(false),
        n: AtomicUsize::new(0),
        pc: AtomicUsize::new(0),
        ips: [const { AtomicUsize::new(0) }; MAX_FRAMES + 4],
    }
}; MAX_THREADS];

// libgcc's unwinder, which the Rust standard library links on Linux.
type UnwindCallback = extern "C" fn(ctx: *mut c_void, arg: *mut c_void) -> c_int;
extern "C" {
    fn _Unwind_Backtrace(cb: UnwindCallback, arg: *mut c_void) -> c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

/// `_URC_NO_REASON`: go on to the next frame; anything else stops.
const URC_NO_REASON: c_int = 0;
const URC_NORMAL_STOP: c_int = 4;

extern "C" fn record_frame(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the slot the handler passed, alive in static memory;
    // `ctx` is the unwinder's own context for this frame.
    let slot = unsafe { &*(arg as *const Slot) };
    let ip = unsafe { _Unwind_GetIP(ctx) };
    let n = slot.n.load(Ordering::Relaxed);
    if n >= slot.ips.len() || ip == 0 {
        return URC_NORMAL_STOP;
    }
    slot.ips[n].store(ip, Ordering::Relaxed);
    slot.n.store(n + 1, Ordering::Relaxed);
    URC_NO_REASON
}

/// The interrupted instruction, from the handler's `ucontext_t`.
fn interrupted_pc(uc: *mut c_void) -> usize {
    if uc.is_null() {
        return 0;
    }
    // SAFETY: the kernel passes a valid ucontext_t to an SA_SIGINFO handler.
    let uc = unsafe { &*(uc as *const libc::ucontext_t) };
    #[cfg(target_arch = "x86_64")]
    {
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize
    }
    #[cfg(target_arch = "aarch64")]
    {
        uc.uc_mcontext.pc as usize
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = uc;
        0
    }
}

extern "C" fn handler(_sig: c_int, _info: *mut libc::siginfo_t, uc: *mut c_void) {
    // SAFETY: errno is this thread's; saved and restored around the walk so
    // the interrupted code sees its own.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    if let Some(slot) = SLOTS.iter().find(|s| s.tid.load(Ordering::Acquire) == tid && !s.done.load(Ordering::Acquire)) {
        slot.n.store(0, Ordering::Relaxed);
        slot.pc.store(interrupted_pc(uc), Ordering::Relaxed);
        // SAFETY: see the module's docs for why an unwinder runs here; the
        // callback writes only into the slot.
        unsafe { _Unwind_Backtrace(record_frame, slot as *const Slot as *mut c_void) };
        slot.done.store(true, Ordering::Release);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Installs the handler on `sig` unless the program handles it itself.
fn install(sig: c_int) -> Result<(), String> {
    // SAFETY: plain sigaction calls with zeroed, then filled, structures.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            return Err(format!("signal {sig} cannot be used: {}", std::io::Error::last_os_error()));
        }
        let ours = handler as *const () as usize;
        if old.sa_sigaction == ours {
            return Ok(());
        }
        if old.sa_sigaction != libc::SIG_DFL {
            return Err(format!(
                "signal {sig} has a handler of the program's; set RINGLEADER_NATIVE_STACK_SIGNAL to a free one"
            ));
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ours;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        // Left installed for good: a thread that answers after the
        // requester gave up must still find this handler, never the
        // default action (which, for a real-time signal, ends the process).
        if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
            return Err(format!("signal {sig} cannot be used: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// The kernel's view of thread `tid`: its name, state, and whether it
/// blocks `sig`.
fn task_info(tid: i32, sig: c_int) -> (Option<String>, Option<String>, bool) {
    let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok().map(|s| s.trim_end().to_string());
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap_or_default();
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_string());
    let state = field("State:");
    let blocked = field("SigBlk:")
        .and_then(|m| u64::from_str_radix(&m, 16).ok())
        .is_some_and(|m| sig >= 1 && m & (1u64 << (sig - 1)) != 0);
    (comm, state, blocked)
}

/// Waits that end early, with `EINTR`, when a signal handler runs.
#[cfg(target_arch = "x86_64")]
const WAIT_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_pause,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigsuspend,
];
/// Waits that end early, with `EINTR`, when a signal handler runs.
#[cfg(not(target_arch = "x86_64"))]
const WAIT_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_epoll_pwait,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigsuspend,
];

/// Bytes of a thread's stack scanned above its stack pointer.
const SCAN_BYTES: usize = 64 << 10;

/// The system call thread `tid` is blocked in, if it is one of
/// [`WAIT_SYSCALLS`]: its number, stack pointer and program counter.
fn blocked_in_wait(tid: i32) -> Option<(libc::c_long, usize, usize)> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    // `NR arg1 .. arg6 SP PC` while in a system call.
    if fields.len() != 9 {
        return None;
    }
    let nr: libc::c_long = fields[0].parse().ok()?;
    let hex = |s: &str| usize::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    WAIT_SYSCALLS.contains(&nr).then_some((nr, hex(fields[7])?, hex(fields[8])?))
}

/// Copies `buf.len()` bytes at `addr` of this process; false when any of
/// them is not mapped (never a fault).
fn read_own(addr: usize, buf: &mut [u8]) -> bool {
    let local = libc::iovec { iov_base: buf.as_mut_ptr() as *mut c_void, iov_len: buf.len() };
    let remote = libc::iovec { iov_base: addr as *mut c_void, iov_len: buf.len() };
    // SAFETY: process_vm_readv on this process writes only into `buf`
    // and reports unmapped source addresses as an error.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == buf.len() as isize
}

/// This process's executable mappings, and the end of the mapping that
/// holds `sp` (where its stack ends).
fn mappings(sp: usize) -> (Vec<(usize, usize)>, Option<usize>) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut exec = Vec::new();
    let mut stack_end = None;
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms)) = (it.next(), it.next()) else { continue };
        let Some((a, b)) = range.split_once('-') else { continue };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else { continue };
        if perms.contains('x') {
            exec.push((a, b));
        }
        if (a..b).contains(&sp) {
            stack_end = Some(b);
        }
    }
    (exec, stack_end)
}

/// Whether the instruction ending at `ret` is a call (so `ret` is a
/// return address).
fn after_call(ret: usize) -> bool {
    let mut b = [0u8; 8];
    if ret < 8 || !read_own(ret - 8, &mut b) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // call rel32 (E8), call r/m (FF /2) in its 2, 3, 6 and 7 byte forms.
        let reg2 = |m: u8| (m >> 3) & 7 == 2;
        b[3] == 0xE8
            || (b[6] == 0xFF && reg2(b[7]) && b[7] >= 0xC0)
            || (b[5] == 0xFF && reg2(b[6]))
            || (b[2] == 0xFF && b[3] == 0x15)
            || (b[1] == 0xFF && reg2(b[2]))
    }
    #[cfg(target_arch = "aarch64")]
    {
        let insn = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        insn & 0xFC00_0000 == 0x9400_0000 || insn & 0xFFFF_FC1F == 0xD63F_0000
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// A blocked thread's likely frames, from its stack memory: `pc`, then
/// every word above `sp` that points just after a call in executable code.
fn scan(sp: usize, pc: usize) -> Vec<usize> {
    let (exec, end) = mappings(sp);
    let mut ips = vec![pc];
    let Some(end) = end else { return ips };
    let len = (end - sp).min(SCAN_BYTES) & !7;
    let mut stack = vec![0u8; len];
    if !read_own(sp, &mut stack) {
        return ips;
    }
    for word in stack.chunks_exact(8) {
        if ips.len() >= MAX_FRAMES {
            break;
        }
        let w = u64::from_le_bytes(word.try_into().unwrap_or_default()) as usize;
        if exec.iter().any(|&(a, b)| (a..b).contains(&w)) && after_call(w) {
            ips.push(w);
        }
    }
    ips
}

/// The default native-stack signal: SIGRTMIN + 7 (Python's dump takes + 6).
pub(crate) fn default_signal() -> c_int {
    libc::SIGRTMIN() + 7
}

/// Every thread's native stack (at most [`MAX_THREADS`]), innermost first,
/// named. `sig`: the real-time signal to use. Notes say what is missing.
pub(crate) fn capture(sig: c_int, notes: &mut Vec<String>) -> Vec<ThreadStack> {
    if let Err(e) = install(sig) {
        notes.push(format!("no native stacks: {e}"));
        return Vec::new();
    }
    let pid = std::process::id() as i32;
    let mut tids: Vec<i32> = match std::fs::read_dir("/proc/self/task") {
        Ok(d) => d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        Err(e) => {
            notes.push(format!("no native stacks: cannot list /proc/self/task ({e})"));
            return Vec::new();
        }
    };
    tids.sort_unstable();
    if tids.len() > MAX_THREADS {
        notes.push(format!("native stacks of {} of {} threads", MAX_THREADS, tids.len()));
        tids.truncate(MAX_THREADS);
    }
    let mut threads = Vec::new();
    let mut asked = Vec::new();
    let mut scanned: Vec<(usize, Vec<usize>)> = Vec::new();
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    for (i, &tid) in tids.iter().enumerate() {
        let (name, state, blocked) = task_info(tid, sig);
        let slot = &SLOTS[i];
        slot.done.store(false, Ordering::Release);
        slot.n.store(0, Ordering::Relaxed);
        slot.tid.store(tid, Ordering::Release);
        let mut note = None;
        if let Some((nr, sp, pc)) = blocked_in_wait(tid).filter(|_| tid != me) {
            let ips = scan(sp, pc);
            threads.push(ThreadStack {
                id: tid.to_string(),
                name,
                state,
                main: tid == pid,
                frames: Vec::new(),
                note: Some(format!(
                    "blocked in system call {nr}: not signalled (its wait would end early); frames found by scanning its stack"
                )),
            });
            scanned.push((threads.len() - 1, ips));
            continue;
        }
        if blocked {
            note = Some(format!("it blocks signal {sig}"));
        } else {
            // SAFETY: tgkill on a thread of this process with a handled signal.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
            if r == 0 {
                asked.push(i);
            } else {
                note = Some(format!("cannot signal it: {}", std::io::Error::last_os_error()));
            }
        }
        threads.push(ThreadStack { id: tid.to_string(), name, state, main: tid == pid, frames: Vec::new(), note });
    }
    let deadline = Instant::now() + WAIT;
    while asked.iter().any(|&i| !SLOTS[i].done.load(Ordering::Acquire)) && Instant::now() < deadline {
        // A bounded poll for the handlers' answers (a thread's handler
        // runs when the kernel next schedules it).
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut names = Namer::default();
    for (i, ips) in scanned {
        threads[i].frames = ips.iter().enumerate().map(|(k, &ip)| names.frame(ip, k == 0, false)).collect();
    }
    for (i, t) in threads.iter_mut().enumerate() {
        let slot = &SLOTS[i];
        if t.note.is_some() {
        } else if !slot.done.load(Ordering::Acquire) {
            t.note = Some(format!("did not answer within {} ms", WAIT.as_millis()));
        } else {
            let n = slot.n.load(Ordering::Relaxed).min(slot.ips.len());
            let ips: Vec<usize> = (0..n).map(|k| slot.ips[k].load(Ordering::Relaxed)).collect();
            let pc = slot.pc.load(Ordering::Relaxed);
            // Drop the handler's own frames: everything before the
            // interrupted instruction.
            let from = ips.iter().position(|&ip| ip == pc).unwrap_or(0);
            t.frames = ips[from..]
                .iter()
                .take(MAX_FRAMES)
                .enumerate()
                .map(|(k, &ip)| names.frame(ip, k == 0 && pc != 0, false))
                .collect();
        }
        // A late handler then finds no slot of its thread.
        slot.tid.store(0, Ordering::Release);
    }
    // Source lines for the frames a verdict shows: each thread's innermost
    // frames of the program's own code. Reading the line tables is the
    // costly part of a capture (a large debug build's took seconds per
    // process with 32 ranks on 2 cores), so the rest keep their names.
    for t in threads.iter_mut() {
        let Some(first_user) = t.frames.iter().position(|f| !ringleader_diag::stacks::native_internal(f)) else {
            continue;
        };
        for k in first_user..(first_user + LINED_FRAMES).min(t.frames.len()) {
            if let Some(ip) = t.frames[k].ip {
                t.frames[k] = names.frame(ip as usize, k == 0, true);
            }
        }
    }
    if names.lines.out_of_time {
        notes.push(format!(
            "source lines of the innermost frames only: looking them up stopped after {} ms",
            super::lines::LINES_BUDGET.as_millis()
        ));
    }
    threads
}

/// Names instruction pointers: `dladdr` for the object and its exported
/// symbols, the object's own symbol table for the rest.
#[derive(Default)]
struct Namer {
    objects: HashMap<String, Option<Symbols>>,
    lines: super::lines::Lines,
}

impl Namer {
    /// `first`: the interrupted instruction itself; other frames hold
    /// return addresses, which point after their call (so one byte back
    /// lies inside the calling function).
    fn frame(&mut self, ip: usize, first: bool, with_line: bool) -> Frame {
        let at = if first { ip } else { ip.saturating_sub(1) };
        // SAFETY: dladdr only reads the loader's tables; a zeroed Dl_info
        // is valid for it to fill.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        let found = unsafe { libc::dladdr(at as *const c_void, &mut info) } != 0;
        let cstr = |p: *const libc::c_char| {
            // SAFETY: dladdr's strings are NUL-terminated and live as long
            // as the object stays loaded.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        let (mut object, exported, base) = match found {
            true => (cstr(info.dli_fname).filter(|s| !s.is_empty()), cstr(info.dli_sname), info.dli_fbase as usize),
            false => (None, None, 0),
        };
        let path = match object.as_deref() {
            Some(p) if p.starts_with('/') => p.to_string(),
            // The main program: the loader keeps its name as it was
            // started, or none.
            _ => std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or_default(),
        };
        if found && !path.is_empty() {
            object = Some(path.clone());
        }
        let symbols = self.objects.entry(path.clone()).or_insert_with(|| found.then(|| Symbols::load(&path)).flatten());
        // Addresses as the object numbers them (relative to its load base
        // unless it is a fixed-address executable).
        let probe = match symbols {
            Some(s) if !s.relative => at,
            _ => at.wrapping_sub(base),
        } as u64;
        let own = symbols.as_ref().and_then(|s| s.lookup(probe)).map(str::to_string);
        let function = own.or(exported).map_or_else(|| "??".to_string(), |s| demangle(&s));
        let line = if with_line && found && !path.is_empty() { self.lines.find(&path, probe) } else { None };
        match line {
            Some(l) => {
                Frame { function, file: Some(l.file), line: Some(l.line), text: l.text, ip: Some(ip as u64), object }
            }
            None => Frame { function, file: object, line: None, text: None, ip: Some(ip as u64), object: None },
        }
    }
}
