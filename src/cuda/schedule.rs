//! The staging schedule, pure: how a collective on device buffers is cut
//! into chunks, which device bytes each chunk copies to and from pinned host
//! memory, and in which order copies and host collectives are issued so
//! that device copies overlap the transfer.
//!
//! Every collective here works element-wise along one axis, so chunk `k`
//! (elements `[k*c, k*c + len)` of each rank's segment) is itself a
//! collective of the same kind on `len` elements: all_reduce, broadcast and
//! reduce on `buf[k*c..]`; all_gather from `in[k*c..]` into
//! `out[r*count + k*c..]` for every rank `r`; reduce_scatter from
//! `in[r*count + k*c..]` into `out[k*c..]`; all_to_all from and to
//! `[r*count + k*c..]`. Staging buffer `b = k % 2` holds chunk `k`'s input
//! segments (then its output) contiguously.
//!
//! Issue order (two buffers, a copy-in and a copy-out stream):
//! `in(0); for k { wait in(k); in(k+1) [after out(k-1) freed its buffer];
//! collective(k); out(k) }` — the copy of chunk k+1 to the host and of
//! chunk k-1 back to the device run while chunk k is on the wire.

use ringleader_core::OpKind;

/// Default bytes per chunk of one rank's segment.
pub const CHUNK_BYTES: usize = 4 << 20;

/// A copy between device memory and a staging buffer (byte offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Offset in the device buffer.
    pub dev: usize,
    /// Offset in the staging buffer.
    pub host: usize,
    /// Bytes.
    pub len: usize,
}

/// One chunk: what to copy in, how many elements the host collective runs
/// on, and what to copy out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Device input (or in-place buffer) to staging.
    pub copy_in: Vec<Piece>,
    /// Elements of one rank's segment in this chunk.
    pub elems: usize,
    /// Staging to device output.
    pub copy_out: Vec<Piece>,
    /// Bytes of staging the host collective's input occupies (at offset 0).
    pub in_bytes: usize,
    /// Offset of the host collective's output in the staging buffer
    /// (in-place ops: 0).
    pub out_at: usize,
}

/// Cuts a collective of `count` elements per rank segment (`esz` bytes
/// each, `world` ranks) into chunks of at most `chunk_elems` elements.
/// `count` is the in-place count (all_reduce, broadcast, reduce), the
/// input count of all_gather, the output count of reduce_scatter, and the
/// per-peer count of all_to_all. `root_here`: whether this rank is the
/// root (reduce copies back on the root only).
pub fn chunks(op: OpKind, count: usize, esz: usize, world: usize, chunk_elems: usize, root_here: bool) -> Vec<Chunk> {
    let c = chunk_elems.max(1);
    let n = count.div_ceil(c);
    (0..n)
        .map(|k| {
            let (start, len) = (k * c, c.min(count - k * c));
            let (b, at) = (len * esz, start * esz);
            let seg = count * esz;
            let all = |base: usize| (0..world).map(move |r| Piece { dev: r * seg + at, host: base + r * b, len: b });
            match op {
                OpKind::AllGather => Chunk {
                    copy_in: vec![Piece { dev: at, host: 0, len: b }],
                    elems: len,
                    copy_out: all(b).collect(),
                    in_bytes: b,
                    out_at: b,
                },
                OpKind::ReduceScatter => Chunk {
                    copy_in: all(0).collect(),
                    elems: len,
                    copy_out: vec![Piece { dev: at, host: world * b, len: b }],
                    in_bytes: world * b,
                    out_at: world * b,
                },
                OpKind::AllToAll => Chunk {
                    copy_in: all(0).collect(),
                    elems: len,
                    copy_out: all(world * b).collect(),
                    in_bytes: world * b,
                    out_at: world * b,
                },
                // In place: all_reduce, broadcast, reduce. Reduce leaves
                // non-root buffers alone, so only the root copies back.
                _ => Chunk {
                    copy_in: vec![Piece { dev: at, host: 0, len: b }],
                    elems: len,
                    copy_out: if op == OpKind::Reduce && !root_here {
                        Vec::new()
                    } else {
                        vec![Piece { dev: at, host: 0, len: b }]
                    },
                    in_bytes: b,
                    out_at: 0,
                },
            }
        })
        .collect()
}

/// Staging bytes one buffer needs for chunks of `chunk_elems`.
pub fn staging_bytes(op: OpKind, esz: usize, world: usize, chunk_elems: usize) -> usize {
    let b = chunk_elems * esz;
    match op {
        OpKind::AllGather => b + world * b,
        OpKind::ReduceScatter => world * b + b,
        OpKind::AllToAll => 2 * world * b,
        _ => b,
    }
}

/// One step of the double-buffered pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Issue chunk `k`'s device-to-host copies into buffer `buf` (on the
    /// copy-in stream, after buffer `buf`'s previous copy-out).
    CopyIn {
        /// The chunk.
        k: usize,
        /// The staging buffer.
        buf: usize,
    },
    /// Wait on the host until chunk `k`'s copy-in completed.
    WaitIn {
        /// The chunk.
        k: usize,
        /// The staging buffer.
        buf: usize,
    },
    /// Run the host collective of chunk `k` on buffer `buf`.
    Collective {
        /// The chunk.
        k: usize,
        /// The staging buffer.
        buf: usize,
    },
    /// Issue chunk `k`'s host-to-device copies from buffer `buf` (on the
    /// copy-out stream); record the event that frees the buffer.
    CopyOut {
        /// The chunk.
        k: usize,
        /// The staging buffer.
        buf: usize,
    },
}

/// The issue order for `n` chunks through `bufs` staging buffers (2: double
/// buffering; 1: no overlap, for comparison and tests).
pub fn pipeline(n: usize, bufs: usize) -> Vec<Step> {
    let bufs = bufs.max(1);
    let mut s = Vec::with_capacity(4 * n);
    if n == 0 {
        return s;
    }
    s.push(Step::CopyIn { k: 0, buf: 0 });
    for k in 0..n {
        let buf = k % bufs;
        s.push(Step::WaitIn { k, buf });
        if bufs > 1 && k + 1 < n {
            s.push(Step::CopyIn { k: k + 1, buf: (k + 1) % bufs });
        }
        s.push(Step::Collective { k, buf });
        s.push(Step::CopyOut { k, buf });
        if bufs == 1 && k + 1 < n {
            s.push(Step::CopyIn { k: k + 1, buf: 0 });
        }
    }
    s
}

/// Where a reduction runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceSite {
    /// In the transport, on the host, as data arrives (the ring).
    Host,
    /// On the GPU: the ranks' chunks are gathered to the host, copied to
    /// the device and reduced by a kernel compiled with NVRTC.
    Device,
}

/// Chooses where an all_reduce of `bytes` per rank over `world` ranks
/// reduces. Gathering moves `(world - 1) x bytes` per rank where the ring
/// moves `2 (world - 1) / world x bytes`, so the device path only pays
/// while the world is small (at most 4 ranks: at most twice the traffic)
/// and the buffer large enough for a kernel launch to vanish (1 MiB), and
/// for 16-bit floats (whose host reductions convert every element), or
/// once the buffer is large (16 MiB), where host arithmetic is the
/// bottleneck. Without NVRTC, always the host.
pub fn reduce_site(bytes: usize, world: usize, half_float: bool, nvrtc: bool) -> ReduceSite {
    let big_enough = bytes >= if half_float { 1 << 20 } else { 16 << 20 };
    if nvrtc && (2..=4).contains(&world) && big_enough {
        ReduceSite::Device
    } else {
        ReduceSite::Host
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays a pipeline against a model of the two buffers and checks
    /// that no buffer is refilled before its copy-out was issued, chunks
    /// flow in order, and copy-in of k+1 precedes collective k (overlap).
    fn check(steps: &[Step], n: usize, bufs: usize) {
        #[derive(Clone, Copy, PartialEq, Debug)]
        enum B {
            Free,
            Filling(usize),
            Ready(usize),
            Done(usize),
        }
        let mut state = vec![B::Free; bufs];
        let mut next_coll = 0;
        let mut outs = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            match *s {
                Step::CopyIn { k, buf } => {
                    assert!(
                        matches!(state[buf], B::Free | B::Done(_)),
                        "step {i}: refill of busy buffer {buf}: {state:?}"
                    );
                    state[buf] = B::Filling(k);
                }
                Step::WaitIn { k, buf } => {
                    assert_eq!(state[buf], B::Filling(k), "step {i}");
                    state[buf] = B::Ready(k);
                }
                Step::Collective { k, buf } => {
                    assert_eq!((state[buf], k), (B::Ready(k), next_coll), "step {i}");
                    next_coll += 1;
                }
                Step::CopyOut { k, buf } => {
                    assert_eq!(state[buf], B::Ready(k), "step {i}");
                    state[buf] = B::Done(k);
                    outs.push(k);
                }
            }
        }
        assert_eq!(outs, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn double_buffering_overlaps_and_never_overwrites_a_busy_buffer() {
        for n in 0..9 {
            check(&pipeline(n, 2), n, 2);
            check(&pipeline(n, 1), n, 1);
        }
        let p = pipeline(3, 2);
        let pos = |s: Step| p.iter().position(|x| *x == s).unwrap();
        for k in 0..2 {
            assert!(pos(Step::CopyIn { k: k + 1, buf: (k + 1) % 2 }) < pos(Step::Collective { k, buf: k % 2 }));
        }
    }

    #[test]
    fn chunks_cover_every_byte_once_per_op() {
        for op in [OpKind::AllReduce, OpKind::Broadcast, OpKind::AllGather, OpKind::ReduceScatter, OpKind::AllToAll] {
            for (count, c, world) in [(10, 3, 2), (1, 4, 3), (1000, 1000, 4), (7, 1, 1), (0, 5, 2)] {
                let esz = 4;
                let ch = chunks(op, count, esz, world, c, true);
                assert_eq!(ch.iter().map(|x| x.elems).sum::<usize>(), count);
                let (in_total, out_total) = match op {
                    OpKind::AllGather => (count, world * count),
                    OpKind::ReduceScatter => (world * count, count),
                    OpKind::AllToAll => (world * count, world * count),
                    _ => (count, count),
                };
                for (pieces, total) in [
                    (ch.iter().flat_map(|x| x.copy_in.clone()).collect::<Vec<_>>(), in_total),
                    (ch.iter().flat_map(|x| x.copy_out.clone()).collect(), out_total),
                ] {
                    let mut covered = vec![0u8; total * esz];
                    for p in pieces {
                        covered[p.dev..p.dev + p.len].iter_mut().for_each(|b| *b += 1);
                    }
                    assert!(covered.iter().all(|&b| b == 1), "{op} count {count} chunk {c} world {world}");
                }
                for x in &ch {
                    let stage = staging_bytes(op, esz, world, c);
                    assert!(x.copy_in.iter().chain(&x.copy_out).all(|p| p.host + p.len <= stage));
                    assert!(x.in_bytes <= stage && x.out_at <= stage);
                }
            }
        }
    }

    #[test]
    fn reduce_copies_back_on_the_root_only() {
        assert!(chunks(OpKind::Reduce, 10, 4, 2, 4, false).iter().all(|c| c.copy_out.is_empty()));
        assert!(chunks(OpKind::Reduce, 10, 4, 2, 4, true).iter().all(|c| c.copy_out.len() == 1));
    }

    #[test]
    fn the_reduction_site_follows_size_world_and_nvrtc() {
        assert_eq!(reduce_site(64 << 20, 2, false, true), ReduceSite::Device);
        assert_eq!(reduce_site(2 << 20, 2, true, true), ReduceSite::Device);
        assert_eq!(reduce_site(2 << 20, 2, false, true), ReduceSite::Host);
        assert_eq!(reduce_site(64 << 20, 8, false, true), ReduceSite::Host);
        assert_eq!(reduce_site(64 << 20, 2, false, false), ReduceSite::Host);
        assert_eq!(reduce_site(4 << 10, 2, true, true), ReduceSite::Host);
    }
}
