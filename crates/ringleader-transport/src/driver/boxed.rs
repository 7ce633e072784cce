//! Plans whose every frame fits a fastbox: the small collectives a
//! training loop makes by the thousand (loss and metric reductions,
//! barriers, small parameter groups).
//!
//! The general loop ([`super::Driver::drive`]) keeps, per channel, a queue
//! of its sends and receives, a half-moved frame each way, and the states
//! of the zero-copy protocols; setting that up and walking it costs more
//! than moving a frame of a few bytes through a fastbox. A plan whose
//! frames all fit one ([`crate::link::Fastbox`]), on links that all have
//! one, runs as an express run instead (`express.rs`): compiled once into
//! a straight line of whole-frame sends and receives. [`super::Driver::run`]
//! compiles the last plan it saw, once ([`crate::Plan::id`]: a caller
//! reuses the plan of a repeated call); a caller that keeps several plans
//! keeps their compiled forms itself ([`super::Driver::express`]).
//!
//! Here: the last plan [`super::Driver::run`] compiled, the fingerprint
//! the run's fastbox frames carry, and the general loop's state when an
//! express run hands over to it, whole frames only, which are exactly its
//! state between frames. Which plans qualify, and how they are compiled:
//! `express.rs`.

use super::express::{bit, Express};
use super::{Driver, Links};
use crate::plan::Plan;

/// What boxed runs need, kept between plans.
#[derive(Debug, Default)]
pub(super) struct Boxed {
    /// The current run's fingerprint as fastbox frames carry it
    /// ([`ringleader_core::Fingerprint::words`]), encoded once per run (the
    /// general loop's fastbox frames use it too).
    pub(super) fingerprint: [u64; 2],
    /// What `fingerprint` encodes (a loop repeats its calls).
    encoded: Option<ringleader_core::Fingerprint>,
    /// The plan (its id, and the links it ran on) `compiled` is of.
    known: Option<(u64, usize, usize)>,
    /// That plan compiled for express runs, if it qualifies (taken out
    /// while it runs).
    compiled: Option<Express>,
}

impl Boxed {
    /// Makes `fp` the run's fingerprint.
    #[inline]
    pub(super) fn encode(&mut self, fp: &ringleader_core::Fingerprint) {
        if self.encoded.as_ref() != Some(fp) {
            self.fingerprint = fp.words();
            self.encoded = Some(*fp);
        }
    }

    /// Makes `fp`, encoded as `words` by the caller, the run's fingerprint.
    pub(super) fn set_words(&mut self, fp: ringleader_core::Fingerprint, words: [u64; 2]) {
        self.fingerprint = words;
        self.encoded = Some(fp);
    }
}

impl Driver {
    /// `plan` compiled for an express run over `links` if it qualifies,
    /// worked out on first sight and lent out for the run (give it back
    /// with [`Driver::keep_compiled`]); its frames carry the fingerprint
    /// [`Boxed::encode`] made the run's.
    pub(super) fn compiled(&mut self, links: &mut Links, plan: &Plan) -> Option<Express> {
        let key = (plan.id(), links.as_ptr() as usize, links.len());
        if self.boxed.known != Some(key) {
            self.boxed.known = Some(key);
            self.boxed.compiled = self.express(links, plan, self.boxed.fingerprint);
        }
        let mut x = self.boxed.compiled.take()?;
        x.set_words(self.boxed.fingerprint);
        Some(x)
    }

    /// Gives back what [`Driver::compiled`] lent.
    pub(super) fn keep_compiled(&mut self, x: Express) {
        self.boxed.compiled = Some(x);
    }

    /// The general loop's state for `plan` after an express run did the
    /// items in `sends` and `recvs` (whole frames, in each channel's order).
    pub(super) fn take_over(&mut self, plan: &Plan, streams: usize, nchans: usize, sends: u64, recvs: u64) {
        self.prepare(nchans, streams, plan);
        let flat = |c: crate::plan::Chan| c.peer * streams + c.stream as usize;
        for (i, s) in plan.sends.iter().enumerate() {
            if sends & bit(i as u32) != 0 {
                self.send_done[i] = true;
                self.chans[flat(s.chan)].st.send_pos += 1;
            }
        }
        for (i, r) in plan.recvs.iter().enumerate() {
            if recvs & bit(i as u32) != 0 {
                self.recv_done[i] = true;
                self.chans[flat(r.chan)].st.recv_pos += 1;
            }
        }
    }
}
