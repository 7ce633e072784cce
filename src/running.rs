//! The collective a communicator is running now, as the monitor, the
//! heartbeat and the verdicts read it.
//!
//! One thread at a time runs a communicator's collectives (the engine's
//! busy flag hands that role between the caller's thread and the engine
//! thread), and it writes this twice per collective; readers (the monitor
//! thread, failure handling) come a few times a second. So it is a
//! sequence lock with one writer: the writer's stores are plain, which on
//! the path of a sub-microsecond collective matters (a mutex costs two
//! atomic read-modify-writes per update), and a reader retries the rare
//! read that overlapped a write.

use ringleader_core::Fingerprint;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// The running collective: `(seq, fingerprint)` or nothing (see the module
/// docs).
#[derive(Debug, Default)]
pub(crate) struct Running {
    /// Even: stable; odd: a write is under way.
    version: AtomicU64,
    /// 0: nothing runs (collective sequence numbers start at 1).
    seq: AtomicU64,
    fingerprint: [AtomicU64; 2],
}

impl Running {
    /// Records what runs now. Only the thread running the communicator's
    /// collectives calls this.
    #[inline]
    pub(crate) fn set(&self, now: Option<(u64, Fingerprint)>) {
        self.set_words(now.map(|(seq, fp)| (seq, fp.words())));
    }

    /// [`Running::set`] with the fingerprint given as its
    /// [`Fingerprint::words`], which the engine computes once per call.
    #[inline]
    pub(crate) fn set_words(&self, now: Option<(u64, [u64; 2])>) {
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v.wrapping_add(1), Ordering::Relaxed);
        // The odd version is visible before any field changes.
        fence(Ordering::Release);
        match now {
            Some((seq, [w0, w1])) => {
                self.fingerprint[0].store(w0, Ordering::Relaxed);
                self.fingerprint[1].store(w1, Ordering::Relaxed);
                self.seq.store(seq, Ordering::Relaxed);
            }
            None => self.seq.store(0, Ordering::Relaxed),
        }
        self.version.store(v.wrapping_add(2), Ordering::Release);
    }

    /// What runs now.
    pub(crate) fn get(&self) -> Option<(u64, Fingerprint)> {
        loop {
            let v = self.version.load(Ordering::Acquire);
            if v % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let seq = self.seq.load(Ordering::Relaxed);
            let words = [self.fingerprint[0].load(Ordering::Relaxed), self.fingerprint[1].load(Ordering::Relaxed)];
            // The fields are read before the version is checked again.
            fence(Ordering::Acquire);
            if self.version.load(Ordering::Relaxed) != v {
                continue;
            }
            if seq == 0 {
                return None;
            }
            let mut raw = [0u8; 16];
            raw[..8].copy_from_slice(&words[0].to_le_bytes());
            raw[8..].copy_from_slice(&words[1].to_le_bytes());
            // The writer encoded a valid fingerprint.
            return Fingerprint::decode(&raw).map(|fp| (seq, fp));
        }
    }

    /// Whether nothing runs now.
    pub(crate) fn is_idle(&self) -> bool {
        self.get().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringleader_core::{DType, OpKind, ReduceOp};
    use std::sync::Arc;

    fn fp(n: u64) -> Fingerprint {
        Fingerprint::new(OpKind::AllReduce, DType::F32, n).with_reduce_op(ReduceOp::Sum)
    }

    #[test]
    fn reads_what_was_written_last() {
        let r = Running::default();
        assert_eq!(r.get(), None);
        r.set(Some((7, fp(3))));
        assert_eq!(r.get(), Some((7, fp(3))));
        assert!(!r.is_idle());
        r.set(None);
        assert!(r.is_idle());
    }

    #[test]
    fn a_reader_never_sees_half_a_write() {
        // The writer keeps seq and count equal; a torn read would not. It
        // writes until the reader has checked enough reads (or a bound
        // passed), so a reader scheduled late still overlaps it.
        use std::sync::atomic::AtomicBool;
        let r = Arc::new(Running::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (w, halt) = (r.clone(), stop.clone());
        let writer = std::thread::spawn(move || {
            let mut i = 0u64;
            while !halt.load(Ordering::Relaxed) {
                i += 1;
                w.set(Some((i, fp(i))));
                if i % 7 == 0 {
                    w.set(None);
                }
            }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut seen = 0;
        while seen < 100_000 && std::time::Instant::now() < deadline {
            if let Some((seq, f)) = r.get() {
                assert_eq!(seq, f.count, "a torn read");
                seen += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(seen > 0);
    }
}
