//! Plans whose every frame fits a fastbox, run without the per-channel
//! machinery: the small collectives a training loop makes by the
//! thousand (loss and metric reductions, barriers, small parameter groups).
//!
//! The general loop ([`super::Driver::drive`]) keeps, per channel, a queue
//! of its sends and receives, a half-moved frame each way, and the states
//! of the zero-copy protocols; setting that up and walking it costs more
//! than moving a frame of a few bytes through a fastbox. A plan whose
//! frames all fit one ([`crate::link::Fastbox`]), on links that all have
//! one, runs here instead: each send goes whole into the peer's cell, each
//! receive is taken whole from ours, with the plan's order per channel and
//! its dependencies kept by two bit masks. What the plan says is done
//! exactly as the general loop would do it: the same frame tags, header
//! checks and errors, the same landing of payloads.
//!
//! Whenever something falls outside that (a peer's frame arrives in the
//! ring because its cells were full, no cell of ours is free while ranks
//! share cores, or the wait outlasts the polling budget and the rank must
//! sleep), the run hands over to the general loop with what is done so
//! far: whole frames only, which are exactly its state between frames.
//! Sleeping, deadlines and publishing the awaited peers are then the
//! general loop's, unchanged. With a core per rank, a send that finds no
//! free cell waits for one within that same polling budget, rather than
//! take the ring at once (see the send loop).
//!
//! Which plans qualify is worked out once per plan ([`crate::Plan::id`]):
//! the engine reuses the plan of a repeated call.

use super::wait::{Idle, IdleSpan};
use super::{fastbox, Driver, Links, Watch};
use crate::link::FASTBOX_MAX;
use crate::plan::{Buf, OpInfo, Plan};
use ringleader_core::Result;

/// The most sends (and the most receives) a boxed plan has: their done
/// flags are the bits of one word.
const MAX_ITEMS: usize = 64;

/// One send or receive of a boxed plan, as worked out for it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Step {
    /// Its frame tag: its place among its channel's sends (or receives).
    pub(super) tag: u32,
    /// The send (receive) before it on its channel, which goes first.
    pub(super) prev: Option<u32>,
}

/// What boxed runs need, kept between plans.
#[derive(Debug, Default)]
pub(super) struct Boxed {
    /// The current run's fingerprint as fastbox frames carry it
    /// ([`ringleader_core::Fingerprint::words`]), encoded once per run (the
    /// general loop's fastbox frames use it too).
    pub(super) fingerprint: [u64; 2],
    /// What `fingerprint` encodes (a loop repeats its calls).
    encoded: Option<ringleader_core::Fingerprint>,
    /// The plan (its id, and the links it ran on) the facts below are of.
    known: Option<(u64, usize, usize)>,
    /// Whether that plan runs here.
    fits: bool,
    sends: Vec<Step>,
    recvs: Vec<Step>,
}

/// How a boxed run ended.
pub(super) enum Outcome {
    /// The plan is done, or failed.
    Done(Result<()>),
    /// The general loop takes over with these sends and receives done
    /// (bit `i`: item `i`).
    HandOver { sends: u64, recvs: u64 },
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

    /// Whether `plan` runs here over `links`; works it out on first sight.
    fn qualifies(&mut self, links: &mut Links, plan: &Plan, streams: usize) -> bool {
        let key = (plan.id(), links.as_ptr() as usize, links.len());
        if self.known == Some(key) {
            return self.fits;
        }
        self.known = Some(key);
        self.fits = fits(links, plan, streams);
        if self.fits {
            self.sends = steps(plan.sends.iter().map(|s| (s.chan.peer, s.chan.stream)));
            self.recvs = steps(plan.recvs.iter().map(|r| (r.chan.peer, r.chan.stream)));
        }
        self.fits
    }
}

/// Whether every frame of `plan` fits a fastbox of its link.
pub(super) fn fits(links: &mut Links, plan: &Plan, streams: usize) -> bool {
    if plan.sends.len() > MAX_ITEMS || plan.recvs.len() > MAX_ITEMS || plan.sends.len() + plan.recvs.len() == 0 {
        return false;
    }
    let chans =
        plan.sends.iter().map(|s| (s.chan, s.region.len)).chain(plan.recvs.iter().map(|r| (r.chan, r.region.len)));
    for (chan, len) in chans {
        let stream = chan.stream as usize;
        let Some(link) = links.get_mut(chan.peer).and_then(|l| l.get_mut(stream)) else { return false };
        if stream >= streams || len > FASTBOX_MAX || link.fastbox().is_none_or(|fb| len > fb.capacity()) {
            return false;
        }
    }
    true
}

/// The tags and channel order of items on `chans` (in plan order).
pub(super) fn steps(chans: impl Iterator<Item = (usize, u16)>) -> Vec<Step> {
    let chans: Vec<(usize, u16)> = chans.collect();
    (0..chans.len())
        .map(|i| {
            let mut before = chans[..i].iter().enumerate().filter(|(_, c)| **c == chans[i]);
            Step { tag: before.clone().count() as u32, prev: before.next_back().map(|(j, _)| j as u32) }
        })
        .collect()
}

/// Bit `i`.
#[inline]
pub(super) fn bit(i: u32) -> u64 {
    1u64 << i
}

/// The indices of `mask`'s set bits, lowest first.
fn ones(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            i
        })
    })
}

/// The first `n` bits.
#[inline]
pub(super) fn first(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

impl Driver {
    /// Runs `plan` boxed if it qualifies (`None`: it does not; nothing was
    /// done).
    pub(super) fn run_boxed(
        &mut self,
        links: &mut Links,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        op: &OpInfo,
        watch: &Watch<'_>,
        streams: usize,
    ) -> Option<Outcome> {
        if !self.boxed.qualifies(links, plan, streams) {
            return None;
        }
        Some(match self.boxed_loop(links, bufs, plan, op, watch) {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Done(Err(e)),
        })
    }

    fn boxed_loop(
        &mut self,
        links: &mut Links,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        op: &OpInfo,
        watch: &Watch<'_>,
    ) -> Result<Outcome> {
        let fingerprint = self.boxed.fingerprint;
        let (all_sends, all_recvs) = (first(plan.sends.len()), first(plan.recvs.len()));
        let (mut sent, mut got) = (0u64, 0u64);
        let mut idle = IdleSpan::default();
        let mut under_way = watch.under_way;
        loop {
            let mut progressed = false;
            let mut todo = all_sends & !sent;
            while todo != 0 {
                let i = todo.trailing_zeros();
                todo &= todo - 1;
                let step = self.boxed.sends[i as usize];
                let item = &plan.sends[i as usize];
                if step.prev.is_some_and(|p| sent & bit(p) == 0) || item.after.is_some_and(|r| got & bit(r) == 0) {
                    continue;
                }
                let link = &mut *links[item.chan.peer][item.chan.stream as usize];
                let data = &bufs[item.region.buf as usize].bytes()[item.region.range()];
                if !fastbox::send(link, item.chan.peer, op, fingerprint, step.tag, data)? {
                    // Every cell to this peer is full (the plan's frames
                    // fit them). With a core each, wait for the peer to
                    // free one: a rooted collective's root that went on
                    // through the ring would stay ahead of its receivers,
                    // and every frame after would take the ring's slower
                    // path on both sides. Sharing cores, go on through the
                    // ring, and yield.
                    if matches!(self.idle, Idle::Spin(_)) {
                        continue;
                    }
                    return Ok(Outcome::HandOver { sends: sent, recvs: got });
                }
                sent |= bit(i);
                progressed = true;
            }
            let mut todo = all_recvs & !got;
            while todo != 0 {
                let i = todo.trailing_zeros();
                todo &= todo - 1;
                let step = self.boxed.recvs[i as usize];
                let item = &plan.recvs[i as usize];
                if step.prev.is_some_and(|p| got & bit(p) == 0)
                    || item.after.is_some_and(|r| got & bit(r) == 0)
                    || item.after_send.is_some_and(|s| sent & bit(s) == 0)
                {
                    continue;
                }
                let link = &mut *links[item.chan.peer][item.chan.stream as usize];
                if fastbox::recv(link, bufs, item, step.tag, op, fingerprint)? {
                    got |= bit(i);
                    progressed = true;
                } else if link.ready(false) {
                    // The frame is in the ring (the peer had no free cell).
                    return Ok(Outcome::HandOver { sends: sent, recvs: got });
                }
            }
            self.under_way(&mut under_way);
            if sent == all_sends && got == all_recvs {
                self.add_spun(&idle);
                return Ok(Outcome::Done(Ok(())));
            }
            if progressed {
                self.add_spun(&std::mem::take(&mut idle));
                continue;
            }
            watch.abort.check()?;
            // The peers this run waits for: those of the receives not
            // done, and of the sends waiting for a free cell.
            let awaited = |waiter: &crate::shm::Waiter, cpu: u32| {
                ones(all_recvs & !got).any(|i| waiter.peer_on(plan.recvs[i].chan.peer, cpu))
                    || ones(all_sends & !sent).any(|i| waiter.peer_on(plan.sends[i].chan.peer, cpu))
            };
            if !self.idle(&mut idle, true, awaited) {
                self.add_spun(&idle);
                return Ok(Outcome::HandOver { sends: sent, recvs: got });
            }
        }
    }

    /// The general loop's state for `plan` after a boxed run did the
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
