//! SIGINT, SIGTERM and SIGHUP delivered as ordinary messages.
//!
//! The signals are blocked in every thread and one thread takes them with
//! `sigwait(3)` and hands each to a callback, which typically sends it on a
//! channel to the supervisor. There is no signal handler, so nothing has to be
//! async-signal-safe, and the supervisor never polls for signals.
//!
//! A thread inherits the signal mask of the thread that creates it, so
//! [`BlockedSignals::block`] must run before the process starts any thread;
//! subcommands call it first. A child process inherits the mask too (across
//! `exec`, and `std::process::Command` does not reset it), so whoever starts
//! children calls [`clear_mask_in_child`] between fork and exec; the launch
//! tests check through `/proc/self/status` that ranks start with no signal
//! blocked.

use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::thread::JoinHandle;

/// A set of signals that is blocked in the calling thread (and in every thread
/// it starts afterwards), waiting to be taken by [`BlockedSignals::listen`].
pub(crate) struct BlockedSignals {
    set: libc::sigset_t,
}

impl fmt::Debug for BlockedSignals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockedSignals").finish_non_exhaustive()
    }
}

impl BlockedSignals {
    /// Blocks `signals` in the calling thread. Call it before starting any
    /// thread, so that no thread is left where the default action (ending
    /// the process) could still run.
    pub(crate) fn block(signals: &[i32]) -> io::Result<BlockedSignals> {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: `sigemptyset` initializes the set it is given a valid pointer to.
        if unsafe { libc::sigemptyset(set.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `sigemptyset` succeeded, so the set is initialized.
        let mut set = unsafe { set.assume_init() };
        for &sig in signals {
            // SAFETY: `set` is an initialized sigset_t owned by this frame.
            if unsafe { libc::sigaddset(&mut set, sig) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: `set` is initialized; a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(BlockedSignals { set })
    }

    /// Starts a thread that takes the blocked signals one at a time and calls
    /// `on_signal` with each signal number, for as long as the process lives.
    pub(crate) fn listen(self, mut on_signal: impl FnMut(i32) + Send + 'static) -> io::Result<JoinHandle<()>> {
        std::thread::Builder::new().name("signals".into()).spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `self.set` is an initialized sigset_t and `sig` a valid
            // out-pointer; both live for the duration of the call.
            let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
            if rc == 0 {
                on_signal(sig);
            } else if rc != libc::EINTR {
                // Only EINVAL is documented, for an invalid set: not ours.
                return;
            }
        })
    }
}

/// Unblocks every signal in the calling thread. Meant for a freshly forked
/// child (a `pre_exec` closure): it only calls `sigemptyset` and
/// `sigprocmask`, both async-signal-safe, and allocates nothing.
pub(crate) fn clear_mask_in_child() -> io::Result<()> {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: `sigemptyset` initializes the set it is given a valid pointer to.
    if unsafe { libc::sigemptyset(set.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the set was initialized just above; a null old-set pointer is allowed.
    if unsafe { libc::sigprocmask(libc::SIG_SETMASK, set.as_ptr(), std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The name of a signal, e.g. `SIGKILL`, or `signal N` for one without a name.
pub(crate) fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(200), "signal 200");
    }
}
