//! Schedules where every rank talks to every other directly.

use super::{elems, Shape, IO, OUT};
use ringleader_transport::{Plan, RecvMode};

/// All-to-all: segment `j` of [`IO`] (`per_rank` elements) goes to rank `j`,
/// and rank `j`'s segment for us lands in segment `j` of [`OUT`]. Our own
/// segment is copied by the caller. Every exchange is independent, so the
/// driver runs them all at once.
pub(crate) fn all_to_all(plan: &mut Plan, sh: Shape, per_rank: usize) {
    for s in 1..sh.n {
        let to = sh.rel(s as isize);
        let from = sh.rel(-(s as isize));
        plan.send(sh.chan(to, 0), elems(IO, to * per_rank, per_rank, sh.esz), None);
        plan.recv(sh.chan(from, 0), elems(OUT, from * per_rank, per_rank, sh.esz), RecvMode::Copy, None, None);
    }
}
