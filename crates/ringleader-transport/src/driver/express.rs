//! Express runs: a boxed plan (every frame fits a fastbox, see `boxed.rs`)
//! compiled once into a straight line of sends and receives, run again
//! and again: by [`Driver::run`] for the last plan it saw, and by a caller
//! that keeps the compiled form with each of its plans (the runtime does,
//! per distinct call).
//!
//! The plan's items are put once in an order that keeps every dependency
//! (each channel's order, a send after the receive it forwards, a receive
//! after the send it waits for), so a run takes them one after the other:
//! a send goes whole into the peer's cell, a receive is taken whole from
//! ours, each checked and landed exactly as the general loop would (the
//! same frame tags, header checks and errors). Working out on every call
//! which item may move next, as the general loop does, costs more than
//! frames of a few bytes.
//!
//! Whatever falls outside that hands over to the general loop with what is
//! done so far: a frame that arrives in the ring (the peer had no free
//! cell), a wait (for a frame or for a free cell) longer than the polling
//! budget. Sleeping, deadlines and publishing the awaited peers
//! stay the general loop's. A send that finds no free cell waits for one
//! within that same polling budget (spinning, or yielding its core where
//! ranks share cores, so that the receiver it waits for can run) rather
//! than take the ring at once: a rooted collective's root that went on
//! through the ring would stay ahead of its receivers, and every frame
//! after it would take the ring's slower path on both sides.

use super::wait::{Doorbells, IdleSpan, Whereabouts};
use super::{fastbox, Driver, Links, Watch};
use crate::link::FASTBOX_MAX;
use crate::plan::{Buf, OpInfo, Plan, RecvItem, SendItem};
use crate::shm::Waiter;
use ringleader_core::fault::{self, Point};
use ringleader_core::{Rank, Result};

/// The most sends (and the most receives) a boxed plan has: their done
/// flags are the bits of one word.
const MAX_ITEMS: usize = 64;

/// Where a send or receive of a boxed plan stands on its channel.
#[derive(Debug, Clone, Copy)]
struct Position {
    /// Its frame tag: its place among its channel's sends (or receives).
    tag: u32,
    /// The send (receive) before it on its channel, which goes first.
    prev: Option<u32>,
}

/// Whether every frame of `plan` fits a fastbox of its link.
fn fits(links: &mut Links, plan: &Plan, streams: usize) -> bool {
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
fn positions(chans: impl Iterator<Item = (usize, u16)>) -> Vec<Position> {
    let chans: Vec<(usize, u16)> = chans.collect();
    (0..chans.len())
        .map(|i| {
            let mut before = chans[..i].iter().enumerate().filter(|(_, c)| **c == chans[i]);
            Position { tag: before.clone().count() as u32, prev: before.next_back().map(|(j, _)| j as u32) }
        })
        .collect()
}

/// Bit `i`.
#[inline]
pub(super) fn bit(i: u32) -> u64 {
    1u64 << i
}

/// One step of a compiled run: plan send (or receive) `item`, frame `tag`
/// of its channel, with the plan's item copied in (a run reads nothing
/// else of the plan).
#[derive(Debug, Clone, Copy)]
enum Step {
    Send { item: u32, tag: u32, send: SendItem },
    Recv { item: u32, tag: u32, recv: RecvItem },
}

impl Step {
    /// Which item of the plan, and its tag (for tests).
    #[cfg(test)]
    fn what(&self) -> (bool, u32, u32) {
        match *self {
            Step::Send { item, tag, .. } => (true, item, tag),
            Step::Recv { item, tag, .. } => (false, item, tag),
        }
    }
}

/// A plan compiled for [`Driver::run_express`] (see the module docs):
/// valid for the plan and the links it was compiled for, which the run
/// checks.
#[derive(Debug, Clone, Default)]
pub struct Express {
    /// The plan's id and the links (address, count) it was compiled for.
    key: (u64, usize, usize),
    steps: Vec<Step>,
    /// Streams per peer, and channels, of those links.
    streams: usize,
    nchans: usize,
    /// The fingerprint its frames carry ([`ringleader_core::Fingerprint::words`]
    /// of the one call it was compiled for).
    words: [u64; 2],
}

impl Express {
    /// Makes `words` the fingerprint its frames carry: a plan
    /// [`Driver::run`] compiled may run with calls of other fingerprints.
    pub(super) fn set_words(&mut self, words: [u64; 2]) {
        self.words = words;
    }

    /// Whether this was compiled for `plan` over `links`.
    #[inline]
    fn is_for(&self, links: &Links, plan: &Plan) -> bool {
        self.key == (plan.id(), links.as_ptr() as usize, links.len())
    }
}

/// The steps of `plan` in an order that keeps its dependencies: every send
/// that may go, then the first receive that may come, and again; `None`
/// when some item can never move (not a plan a rank can run).
fn order(plan: &Plan) -> Option<Vec<Step>> {
    let sends = positions(plan.sends.iter().map(|s| (s.chan.peer, s.chan.stream)));
    let recvs = positions(plan.recvs.iter().map(|r| (r.chan.peer, r.chan.stream)));
    let (mut sent, mut got) = (vec![false; sends.len()], vec![false; recvs.len()]);
    let mut out = Vec::with_capacity(sends.len() + recvs.len());
    while out.len() < sends.len() + recvs.len() {
        let before = out.len();
        for (i, (step, item)) in sends.iter().zip(&plan.sends).enumerate() {
            let ready = step.prev.is_none_or(|p| sent[p as usize]) && item.after.is_none_or(|r| got[r as usize]);
            if !sent[i] && ready {
                sent[i] = true;
                out.push(Step::Send { item: i as u32, tag: step.tag, send: *item });
            }
        }
        let next = recvs.iter().zip(&plan.recvs).enumerate().find(|(i, (step, item))| {
            !got[*i]
                && step.prev.is_none_or(|p| got[p as usize])
                && item.after.is_none_or(|r| got[r as usize])
                && item.after_send.is_none_or(|s| sent[s as usize])
        });
        if let Some((i, (step, item))) = next {
            got[i] = true;
            out.push(Step::Recv { item: i as u32, tag: step.tag, recv: *item });
        }
        if out.len() == before {
            return None;
        }
    }
    Some(out)
}

impl Driver {
    /// Compiles `plan`, the plan of the calls whose fingerprint is
    /// `words` ([`ringleader_core::Fingerprint::words`]), for express runs
    /// over `links`; `None` when some frame of it does not fit a fastbox of
    /// its link ([`Driver::run`] runs it through the general loop). Also
    /// sizes the general loop's scratch for it, so that a run that hands
    /// over allocates nothing.
    pub fn express(&mut self, links: &mut Links, plan: &Plan, words: [u64; 2]) -> Option<Express> {
        let streams = links.iter().map(Vec::len).max().unwrap_or(1).max(1);
        if !fits(links, plan, streams) {
            return None;
        }
        let steps = order(plan)?;
        let nchans = links.len() * streams;
        self.fit(nchans, plan);
        Some(Express { key: (plan.id(), links.as_ptr() as usize, links.len()), steps, streams, nchans, words })
    }

    /// Runs `plan`, compiled as `x` for these links ([`Driver::express`]),
    /// whose frames belong to `op` (a call of the fingerprint `x` was
    /// compiled for), as [`Driver::run`] would: the same frames, checks,
    /// errors and bounds (see the module docs). A plan or links other than
    /// those `x` was compiled for run through [`Driver::run`].
    pub fn run_express(
        &mut self,
        links: &mut Links,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        x: &Express,
        op: &OpInfo,
        watch: &Watch<'_>,
    ) -> Result<()> {
        let words = x.words;
        if !x.is_for(links, plan) {
            return self.run(links, bufs, plan, op, watch);
        }
        fault::check(Point::Driver, op.seq);
        self.runs = self.runs.wrapping_add(1);
        self.spun = Some(0);
        let (mut sent, mut got) = (0u64, 0u64);
        let mut idle = IdleSpan::default();
        // Called before the first receive is polled, or before a send
        // waits for a cell (see `Watch::under_way`): a run that only sends
        // and never waits leaves the caller's bookkeeping for after it.
        let mut under_way = watch.under_way;
        for step in &x.steps {
            let moved = match step {
                Step::Send { item, tag, send: s } => {
                    let data = &bufs[s.region.buf as usize].bytes()[s.region.range()];
                    let link = &mut *links[s.chan.peer][s.chan.stream as usize];
                    loop {
                        if fastbox::send(link, s.chan.peer, op, words, *tag, data)? {
                            sent |= bit(*item);
                            break true;
                        }
                        // Every cell to this peer is full: wait for the
                        // peer to free one, within the polling budget (see
                        // the module docs).
                        self.under_way(&mut under_way);
                        if !self.express_idle(&mut idle, watch, s.chan.peer)? {
                            break false;
                        }
                    }
                }
                Step::Recv { item, tag, recv: r } => {
                    let link = &mut *links[r.chan.peer][r.chan.stream as usize];
                    // Whether or not the frame is there yet: done only once
                    // it is found missing, the bookkeeping would take the
                    // moments that happen to be spare, differently from one
                    // call to the next as the peers' timing drifts.
                    self.under_way(&mut under_way);
                    loop {
                        if fastbox::recv(link, bufs, r, *tag, op, words)? {
                            got |= bit(*item);
                            break true;
                        }
                        // The frame is in the ring (the peer had no free
                        // cell), or the wait outlasted the polling budget.
                        if link.ready(false) || !self.express_idle(&mut idle, watch, r.chan.peer)? {
                            break false;
                        }
                    }
                }
            };
            if !moved {
                self.add_spun(&idle);
                let watch = Watch { under_way, ..*watch };
                return self.express_hand_over(links, bufs, plan, x, op, &watch, sent, got);
            }
            if idle.began() {
                self.add_spun(&std::mem::take(&mut idle));
            }
        }
        if under_way.is_some() {
            self.publish_cpu();
        }
        if !self.published.is_empty() {
            watch.awaited.replace(&self.published, &[]);
            self.published.clear();
        }
        Ok(())
    }

    /// One idle pass of an express run waiting for `peer`: whether to poll
    /// again (`false`: the polling budget is spent, hand over).
    #[inline]
    fn express_idle(&self, idle: &mut IdleSpan, watch: &Watch<'_>, peer: Rank) -> Result<bool> {
        watch.abort.check()?;
        let bells =
            self.waiter.as_ref().map(|waiter| Doorbells { waiter, awaited: |w: &Waiter, cpu| w.peer_on(peer, cpu) });
        Ok(self.idle(idle, bells.as_ref().map(|b| b as &dyn Whereabouts)))
    }

    /// The general loop runs the rest of an express run, which did the
    /// items in `sent` and `got`.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn express_hand_over(
        &mut self,
        links: &mut Links,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        x: &Express,
        op: &OpInfo,
        watch: &Watch<'_>,
        sent: u64,
        got: u64,
    ) -> Result<()> {
        // The general loop's fastbox frames carry the run's fingerprint.
        self.boxed.set_words(op.fingerprint, x.words);
        self.take_over(plan, x.streams, x.nchans, sent, got);
        let result = self.drive(links, bufs, plan, op, watch, x.streams);
        self.finish(links, x.streams, watch, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Chan, RecvMode, Region};

    fn chan(peer: Rank) -> Chan {
        Chan { peer, stream: 0 }
    }

    #[test]
    fn the_order_keeps_every_dependency() {
        // A chain's middle rank: receive from 0, forward to 2 (after the
        // receive), then receive 2's answer (after the send).
        let mut p = Plan::default();
        let r0 = p.recv(chan(0), Region::new(0, 0, 8), RecvMode::Copy, None, None);
        let s0 = p.send(chan(2), Region::new(0, 0, 8), Some(r0));
        p.recv(chan(2), Region::new(0, 8, 8), RecvMode::Copy, None, Some(s0));
        p.send(chan(0), Region::new(0, 0, 8), None);
        let o: Vec<_> = order(&p).unwrap().iter().map(Step::what).collect();
        assert_eq!(o, vec![(true, 1, 0), (false, 0, 0), (true, 0, 0), (false, 1, 0)]);
    }

    #[test]
    fn tags_count_each_channels_frames() {
        let mut p = Plan::default();
        p.send(chan(1), Region::new(0, 0, 8), None);
        p.send(chan(1), Region::new(0, 8, 8), None);
        p.recv(chan(1), Region::new(1, 0, 8), RecvMode::Copy, None, None);
        p.recv(chan(1), Region::new(1, 8, 8), RecvMode::Copy, None, None);
        let o: Vec<_> = order(&p).unwrap().iter().map(Step::what).collect();
        assert_eq!(o, vec![(true, 0, 0), (true, 1, 1), (false, 0, 0), (false, 1, 1)]);
    }

    #[test]
    fn a_plan_that_cannot_move_is_refused() {
        // A receive waiting for a send that waits for it.
        let mut p = Plan::default();
        p.send(chan(1), Region::new(0, 0, 8), Some(0));
        p.recv(chan(1), Region::new(0, 0, 8), RecvMode::Copy, None, Some(0));
        assert!(order(&p).is_none());
    }
}
