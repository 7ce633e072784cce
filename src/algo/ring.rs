//! Ring and chain schedules: bandwidth-optimal for large messages.
//!
//! All-reduce is a reduce-scatter followed by an all-gather around the ring
//! (left = rank - 1, right = rank + 1). In reduce-scatter step `s`, rank `r`
//! sends segment `r - s` and receives segment `r - s - 1`, reducing it into
//! its own copy; after `n - 1` steps rank `r` holds segment `r + 1` fully
//! reduced. All-gather step `s` sends segment `r + 1 - s` (what arrived in the
//! previous step) and receives segment `r - s`. Every segment is cut into
//! chunks, and chunk `k` of a step is forwarded as soon as chunk `k` of the
//! previous step arrived: a pipeline, so the reduction of one chunk overlaps
//! the transfer of the next.
//!
//! Each segment is reduced by one rank and then copied everywhere, so every
//! rank ends with bit-identical results.

use super::{chunk_elems, chunks, elems, segment, Scratch, Shape, IO, OUT, SCRATCH};
use ringleader_transport::{Plan, RecvMode};

/// Receives (by segment, chunk) of the previous step, for dependencies,
/// kept in reusable scratch so building a plan allocates nothing.
struct LastRecv<'a>(&'a mut Vec<Vec<Option<u32>>>);

impl<'a> LastRecv<'a> {
    fn new(n: usize, store: &'a mut Vec<Vec<Option<u32>>>) -> LastRecv<'a> {
        if store.len() < n {
            store.resize_with(n, Vec::new);
        }
        store.iter_mut().for_each(Vec::clear);
        LastRecv(store)
    }

    fn get(&self, seg: usize, k: usize) -> Option<u32> {
        self.0[seg].get(k).copied().flatten()
    }

    fn set(&mut self, seg: usize, k: usize, idx: u32) {
        let v = &mut self.0[seg];
        if v.len() <= k {
            v.resize(k + 1, None);
        }
        v[k] = Some(idx);
    }
}

/// In-place ring all-reduce of `count` elements in [`IO`].
pub(crate) fn all_reduce(plan: &mut Plan, sh: Shape, count: usize, scratch: &mut Scratch) {
    let per = chunk_elems(count.div_ceil(sh.n), sh.esz);
    let mut last = LastRecv::new(sh.n, &mut scratch.last);
    reduce_scatter_steps(plan, sh, count, per, Acc::InPlace, &mut last, &mut scratch.slot_readers);
    all_gather_steps(plan, sh, count, per, 1, IO, Own::InBuf, &mut last);
}

/// Where reduce-scatter accumulates.
#[derive(Clone, Copy)]
enum Acc {
    /// Into [`IO`] itself; rank r ends owning segment r + 1.
    InPlace,
    /// [`IO`] stays unchanged: partial sums alternate between two
    /// [`SCRATCH`] slots of `seg` elements, and the last step reduces into
    /// [`OUT`]; rank r ends owning segment r.
    OutOfPlace { seg: usize },
}

/// The reduce-scatter half. In step `s` a rank sends segment `own - s` and
/// receives segment `own - s - 1`, where it ends owning `own + 1`.
fn reduce_scatter_steps(
    plan: &mut Plan,
    sh: Shape,
    count: usize,
    per: usize,
    acc: Acc,
    last: &mut LastRecv<'_>,
    slot_readers: &mut [Vec<u32>; 2],
) {
    let n = sh.n;
    let shift: isize = match acc {
        Acc::InPlace => 0,
        Acc::OutOfPlace { .. } => -1,
    };
    // Sends reading each scratch slot, by chunk: a slot is refilled two
    // steps later, only once those sends are out.
    slot_readers.iter_mut().for_each(Vec::clear);
    for s in 0..n - 1 {
        let send_seg = sh.rel(shift - s as isize);
        let (start, len) = segment(count, n, send_seg);
        let (sbuf, sbase) = match acc {
            Acc::OutOfPlace { seg } if s > 0 => (SCRATCH, ((s - 1) % 2) * seg),
            _ => (IO, start),
        };
        if sbuf == SCRATCH {
            slot_readers[(s - 1) % 2].clear();
        }
        for (k, (off, l)) in chunks(len, per).enumerate() {
            let after = last.get(send_seg, k);
            let idx = plan.send(sh.chan(sh.right(), k), elems(sbuf, sbase + off, l, sh.esz), after);
            if sbuf == SCRATCH {
                slot_readers[(s - 1) % 2].push(idx);
            }
        }
        let recv_seg = sh.rel(shift - s as isize - 1);
        let (rstart, rlen) = segment(count, n, recv_seg);
        for (k, (off, l)) in chunks(rlen, per).enumerate() {
            let own = elems(IO, rstart + off, l, sh.esz);
            let (region, mode, after_send) = match acc {
                Acc::InPlace => (own, RecvMode::Reduce { with: None }, None),
                Acc::OutOfPlace { .. } if s == n - 2 => {
                    (elems(OUT, off, l, sh.esz), RecvMode::Reduce { with: Some(own) }, None)
                }
                Acc::OutOfPlace { seg } => (
                    elems(SCRATCH, (s % 2) * seg + off, l, sh.esz),
                    RecvMode::Reduce { with: Some(own) },
                    slot_readers[s % 2].get(k).copied(),
                ),
            };
            let idx = plan.recv(sh.chan(sh.left(), k), region, mode, None, after_send);
            last.set(recv_seg, k, idx);
        }
    }
}

/// Where the all-gather half finds this rank's own segment for its first
/// send.
#[derive(Clone, Copy)]
enum Own {
    /// In the buffer being gathered into, like every other segment.
    InBuf,
    /// At the start of [`IO`] (the out-of-place input), which holds the
    /// same bytes: reading it there leaves the copy into the output free to
    /// bypass the cache (nothing reads it back).
    Input,
}

/// The all-gather half: rank `r` owns segment `r + own_shift` at the start.
#[allow(clippy::too_many_arguments)]
fn all_gather_steps(
    plan: &mut Plan,
    sh: Shape,
    count: usize,
    per: usize,
    own_shift: isize,
    buf: u8,
    own: Own,
    last: &mut LastRecv<'_>,
) {
    let n = sh.n;
    for s in 0..n - 1 {
        let send_seg = sh.rel(own_shift - s as isize);
        let recv_seg = sh.rel(own_shift - s as isize - 1);
        let (start, len) = segment(count, n, send_seg);
        let (sbuf, sbase) = match own {
            Own::Input if s == 0 => (IO, 0),
            _ => (buf, start),
        };
        for (k, (off, l)) in chunks(len, per).enumerate() {
            let after = last.get(send_seg, k);
            plan.send(sh.chan(sh.right(), k), elems(sbuf, sbase + off, l, sh.esz), after);
        }
        let (rstart, rlen) = segment(count, n, recv_seg);
        for (k, (off, l)) in chunks(rlen, per).enumerate() {
            let idx = plan.recv(sh.chan(sh.left(), k), elems(buf, rstart + off, l, sh.esz), RecvMode::Copy, None, None);
            last.set(recv_seg, k, idx);
        }
    }
}

/// Out-of-place ring reduce-scatter: [`IO`] holds `n * per_rank` elements
/// (read only), [`OUT`] receives this rank's `per_rank`, [`SCRATCH`] needs
/// `2 * per_rank` elements.
pub(crate) fn reduce_scatter(plan: &mut Plan, sh: Shape, per_rank: usize, scratch: &mut Scratch) {
    let per = chunk_elems(per_rank, sh.esz);
    let mut last = LastRecv::new(sh.n, &mut scratch.last);
    let acc = Acc::OutOfPlace { seg: per_rank };
    reduce_scatter_steps(plan, sh, per_rank * sh.n, per, acc, &mut last, &mut scratch.slot_readers);
}

/// Out-of-place ring all-gather: [`OUT`] holds `n * per_rank` elements and
/// gets this rank's input copied into segment `rank` (by the caller, before
/// or while the plan runs: the plan reads that segment from [`IO`]).
pub(crate) fn all_gather(plan: &mut Plan, sh: Shape, per_rank: usize, scratch: &mut Scratch) {
    let per = chunk_elems(per_rank, sh.esz);
    let mut last = LastRecv::new(sh.n, &mut scratch.last);
    all_gather_steps(plan, sh, per_rank * sh.n, per, 0, OUT, Own::Input, &mut last);
}

/// Pipelined chain broadcast of [`IO`] from `root` along root, root+1, ...
pub(crate) fn broadcast(plan: &mut Plan, sh: Shape, count: usize, root: usize) {
    let pos = (sh.rank + sh.n - root) % sh.n;
    let per = chunk_elems(count, sh.esz);
    for (k, (off, l)) in chunks(count, per).enumerate() {
        let region = elems(IO, off, l, sh.esz);
        let got = (pos > 0).then(|| plan.recv(sh.chan(sh.left(), k), region, RecvMode::Copy, None, None));
        if pos < sh.n - 1 {
            plan.send(sh.chan(sh.right(), k), region, got);
        }
    }
}

/// Pipelined chain reduction toward `root` (root+1 starts, root ends).
/// Ranks between reduce into [`SCRATCH`] (`count` elements) so their own
/// buffer stays unchanged; the root reduces into [`IO`].
pub(crate) fn reduce(plan: &mut Plan, sh: Shape, count: usize, root: usize) {
    let pos = (sh.rank + sh.n - root - 1) % sh.n; // root is last: n - 1
    let per = chunk_elems(count, sh.esz);
    for (k, (off, l)) in chunks(count, per).enumerate() {
        let own = elems(IO, off, l, sh.esz);
        if pos == 0 {
            plan.send(sh.chan(sh.right(), k), own, None);
        } else if pos < sh.n - 1 {
            let acc = elems(SCRATCH, off, l, sh.esz);
            let got = plan.recv(sh.chan(sh.left(), k), acc, RecvMode::Reduce { with: Some(own) }, None, None);
            plan.send(sh.chan(sh.right(), k), acc, Some(got));
        } else {
            plan.recv(sh.chan(sh.left(), k), own, RecvMode::Reduce { with: None }, None, None);
        }
    }
}
