//! One stream to one local peer over a pair of rings, and the single-copy
//! frames that skip the ring (see the module docs).

use super::cross_memory::read_process;
use super::domain::Domain;
use super::fastbox::Fastbox;
use super::segment::{corrupt, ring_bell, BoxLines, Mapping};
use super::waiter::Waiter;
use super::{PUBLISH_EVERY, RING_BYTES};
use crate::link::{Mapped, ReadOutcome, SingleCopy, Wake};
use ringleader_core::Rank;
use std::io::IoSlice;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

/// One stream to one local peer: we write into its segment, read from ours.
pub struct ShmLink {
    pub(super) domain: Arc<Domain>,
    pub(super) peer: Rank,
    /// Our incoming ring (in our segment).
    pub(super) rx: usize,
    /// Our outgoing ring (in the peer's segment).
    pub(super) tx: usize,
    pub(super) rings: usize,
    /// Single-copy frames written (the tickets their acks are matched to).
    pub(super) remote_sent: u64,
    /// Single-copy frames read.
    pub(super) remote_read: u64,
    /// The fastboxes both ways (see `fastbox.rs`).
    pub(super) boxes: Fastbox,
}

impl std::fmt::Debug for ShmLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmLink").field("peer", &self.peer).finish()
    }
}

// Linking lives beside the link it builds, so that the domain (the
// segments) knows nothing of the links made from it.
impl Domain {
    /// The links to every mapped local peer, `streams` each, and a handle
    /// to this rank's doorbell for waiting.
    pub fn links(self) -> (Vec<(Rank, Vec<ShmLink>)>, Waiter) {
        let rings = (self.local.len() - 1) * self.streams;
        let d = Arc::new(self);
        let mut out = Vec::new();
        for &peer in &d.local {
            if peer == d.rank || d.peers[peer].is_none() {
                continue;
            }
            let Some(peer_map) = d.peers[peer].as_ref() else { continue };
            let links = (0..d.streams)
                .map(|s| ShmLink {
                    domain: d.clone(),
                    peer,
                    rx: d.slot(d.rank, peer, s),
                    tx: d.slot(peer, d.rank, s),
                    boxes: Fastbox::new(
                        BoxLines::new(
                            &d.own,
                            peer_map,
                            rings,
                            d.cells(),
                            d.slot(peer, d.rank, s),
                            d.slot(d.rank, peer, s),
                        ),
                        peer,
                    ),
                    rings,
                    remote_sent: 0,
                    remote_read: 0,
                })
                .collect();
            out.push((peer, links));
        }
        (out, Waiter { domain: d })
    }
}

impl ShmLink {
    pub(super) fn peer_map(&self) -> &Mapping {
        self.domain.peers[self.peer].as_ref().expect("peer mapped")
    }

    /// The peer.
    pub fn peer(&self) -> Rank {
        self.peer
    }

    /// Copies as much of `bufs` as fits into the outgoing ring.
    pub fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        let m = self.peer_map();
        let h = m.ring_header(self.tx);
        let data = m.ring_data(self.rings, self.tx);
        let head = h.head.load(Ordering::Relaxed);
        let tail = h.tail.load(Ordering::Acquire);
        let used = head.wrapping_sub(tail);
        if used > RING_BYTES as u64 {
            return Err(corrupt(self.peer));
        }
        let mut free = RING_BYTES - used as usize;
        let (mut pos, mut published) = (head, head);
        for b in bufs {
            let mut src: &[u8] = b;
            while !src.is_empty() && free > 0 {
                let at = (pos % RING_BYTES as u64) as usize;
                let n = src.len().min(free).min(RING_BYTES - at).min(PUBLISH_EVERY);
                // SAFETY: [at, at+n) lies in the ring (n <= RING_BYTES - at)
                // and in its free part, which the reader does not touch
                // until `head` moves past it below.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(at), n) };
                src = &src[n..];
                free -= n;
                pos += n as u64;
                // Publish as we go, so the reader copies out while we copy in.
                if pos - published >= PUBLISH_EVERY as u64 {
                    h.head.store(pos, Ordering::Release);
                    ring_bell(m.doorbell());
                    published = pos;
                }
            }
        }
        if pos != published {
            h.head.store(pos, Ordering::Release);
            ring_bell(m.doorbell());
        }
        Ok((pos - head) as usize)
    }

    /// Readable bytes of the incoming ring as one contiguous piece (up to
    /// the ring's end, and up to a fastbox frame that comes first), bounded
    /// by `max`.
    pub(super) fn readable(&self, max: usize) -> std::io::Result<(*const u8, usize)> {
        let m = &self.domain.own;
        let h = m.ring_header(self.rx);
        let head = h.head.load(Ordering::Acquire);
        let tail = h.tail.load(Ordering::Relaxed);
        let mut avail = head.wrapping_sub(tail);
        if avail > RING_BYTES as u64 {
            return Err(corrupt(self.peer));
        }
        if let Some(limit) = self.boxes.limit(tail)? {
            avail = avail.min(limit);
        }
        let at = (tail % RING_BYTES as u64) as usize;
        let n = (avail as usize).min(RING_BYTES - at).min(max);
        // SAFETY: in bounds of the ring (n <= RING_BYTES - at).
        Ok((unsafe { m.ring_data(self.rings, self.rx).add(at) }, n))
    }

    pub(super) fn consume(&self, n: usize) {
        let h = self.domain.own.ring_header(self.rx);
        let tail = h.tail.load(Ordering::Relaxed);
        h.tail.store(tail + n as u64, Ordering::Release);
        ring_bell(self.peer_map().doorbell());
    }

    /// Copies what has arrived into `buf`; 0 when nothing has.
    pub fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.read_with(buf, false)
    }

    /// [`ShmLink::try_read`] with streaming stores into `buf`: for
    /// destinations too large to stay in cache (see [`crate::stream_copy`]).
    pub fn try_read_streaming(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.read_with(buf, true)
    }

    pub(super) fn read_with(&mut self, buf: &mut [u8], streaming: bool) -> std::io::Result<usize> {
        let mut got = 0;
        // At most two pieces: up to the ring's end, then from its start.
        for _ in 0..2 {
            let (p, n) = self.readable(buf.len() - got)?;
            if n == 0 {
                break;
            }
            // SAFETY: [p, p+n) is readable ring data that the writer will
            // not touch until we move `tail` past it in `consume`.
            let data = unsafe { std::slice::from_raw_parts(p, n) };
            match streaming {
                true => crate::stream_copy::copy_streaming(&mut buf[got..got + n], data),
                false => buf[got..got + n].copy_from_slice(data),
            }
            got += n;
            self.consume(n);
        }
        Ok(got)
    }

    /// Hands up to `max` arrived bytes, in place, to `f`, which returns how
    /// many it used; those are consumed. Lets a reduction read straight out
    /// of the ring, without copying into a staging buffer first.
    pub fn read_in_place(&mut self, max: usize, f: &mut dyn FnMut(&[u8]) -> usize) -> std::io::Result<usize> {
        let (p, n) = self.readable(max)?;
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: as in `try_read`; the slice lives only during the call.
        let used = f(unsafe { std::slice::from_raw_parts(p, n) }).min(n);
        if used > 0 {
            self.consume(used);
        }
        Ok(used)
    }

    /// The size from which frames to this peer may go single-copy, if the
    /// peer can read this process's memory and this rank allows it.
    #[inline]
    pub fn single_copy_min(&self) -> Option<usize> {
        let min = self.domain.single_copy?;
        (self.peer_map().ring_header(self.tx).remote_ok.load(Ordering::Relaxed) != 0).then_some(min)
    }

    /// Records that a single-copy descriptor went into the ring; returns
    /// its ticket: the send completes once [`ShmLink::remote_acked`]
    /// reaches it.
    pub fn remote_sent(&mut self) -> u64 {
        self.remote_sent += 1;
        self.remote_sent
    }

    /// How many of our single-copy frames the peer has copied.
    #[inline]
    pub fn remote_acked(&self) -> u64 {
        self.peer_map().ring_header(self.tx).remote_done.load(Ordering::Acquire)
    }

    /// Gives up on every single-copy frame sent so far: the caller fails
    /// and may reuse the buffers, so a peer still reading one must not
    /// trust what it read.
    pub fn abandon_remote(&self) {
        let h = self.peer_map().ring_header(self.tx);
        h.abandoned.store(self.remote_sent, Ordering::SeqCst);
        ring_bell(self.peer_map().doorbell());
    }

    /// Copies part of a single-copy frame from the peer's memory at `addr`
    /// into `dst`; returns how many bytes arrived (never 0 for a non-empty
    /// `dst`: that is an error).
    pub fn read_remote(&self, addr: u64, dst: &mut [u8]) -> std::io::Result<usize> {
        if self.domain.own.ring_header(self.rx).remote_ok.load(Ordering::Relaxed) == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("rank {} sent a single-copy frame it was not allowed to", self.peer),
            ));
        }
        let pid = self.peer_map().doorbell().pid.load(Ordering::Relaxed);
        match read_process(pid, addr, dst)? {
            0 if !dst.is_empty() => Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("reading rank {}'s memory (pid {pid}) returned nothing", self.peer),
            )),
            n => Ok(n),
        }
    }

    /// Acknowledges a single-copy frame read in full, unless the writer
    /// abandoned it meanwhile (then the bytes read cannot be trusted).
    pub fn finish_remote(&mut self) -> std::io::Result<()> {
        self.remote_read += 1;
        let h = self.domain.own.ring_header(self.rx);
        fence(Ordering::SeqCst);
        if h.abandoned.load(Ordering::SeqCst) >= self.remote_read {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                format!("rank {} gave up on the transfer while it was read", self.peer),
            ));
        }
        h.remote_done.store(self.remote_read, Ordering::Release);
        ring_bell(self.peer_map().doorbell());
        Ok(())
    }

    /// Whether a read or a write (per `write`) could make progress now.
    pub fn ready(&self, write: bool) -> bool {
        if write {
            let h = self.peer_map().ring_header(self.tx);
            let used = h.head.load(Ordering::Relaxed).wrapping_sub(h.tail.load(Ordering::Acquire));
            used < RING_BYTES as u64
        } else {
            let h = self.domain.own.ring_header(self.rx);
            h.head.load(Ordering::Acquire) != h.tail.load(Ordering::Relaxed) || self.boxes.ready()
        }
    }
}

impl crate::link::Link for ShmLink {
    fn peer(&self) -> Rank {
        self.peer
    }

    #[inline]
    fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        ShmLink::try_write(self, bufs)
    }

    #[inline]
    fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<ReadOutcome> {
        Ok(match ShmLink::try_read(self, buf)? {
            0 => ReadOutcome::WouldBlock,
            n => ReadOutcome::Data(n),
        })
    }

    fn wake(&self) -> Wake<'_> {
        Wake::Doorbell
    }

    fn ready(&self, write: bool) -> bool {
        ShmLink::ready(self, write)
    }

    fn mapped(&mut self) -> Option<&mut dyn Mapped> {
        Some(self)
    }

    fn single_copy(&self) -> Option<&dyn SingleCopy> {
        Some(self)
    }

    fn single_copy_mut(&mut self) -> Option<&mut dyn SingleCopy> {
        Some(self)
    }

    #[inline]
    fn fastbox(&mut self) -> Option<&mut Fastbox> {
        Some(&mut self.boxes)
    }
}

impl Mapped for ShmLink {
    #[inline]
    fn read_in_place(&mut self, max: usize, f: &mut dyn FnMut(&[u8]) -> usize) -> std::io::Result<usize> {
        ShmLink::read_in_place(self, max, f)
    }

    fn read_streaming(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.try_read_streaming(buf)
    }
}

impl SingleCopy for ShmLink {
    #[inline]
    fn min_len(&self) -> Option<usize> {
        self.single_copy_min()
    }

    fn sent(&mut self) -> u64 {
        self.remote_sent()
    }

    #[inline]
    fn acked(&self) -> u64 {
        self.remote_acked()
    }

    fn abandon(&self) {
        self.abandon_remote()
    }

    fn read_remote(&self, addr: u64, dst: &mut [u8]) -> std::io::Result<usize> {
        ShmLink::read_remote(self, addr, dst)
    }

    fn finish_remote(&mut self) -> std::io::Result<()> {
        ShmLink::finish_remote(self)
    }
}

#[cfg(test)]
impl ShmLink {
    /// The tests' way to send through the fastbox.
    pub(crate) fn box_send(&mut self, head: &crate::link::BoxHead, payload: &[u8]) -> std::io::Result<bool> {
        self.boxes.try_send(head, payload)
    }

    /// Takes the next frame if it is in a cell: hands its header fields
    /// and payload, where they lie, to `take`, then frees the cell (the
    /// tests' way to read a cell; the driver peeks and releases).
    pub(crate) fn box_recv(&mut self, take: &mut dyn FnMut(&crate::link::BoxHead, &[u8])) -> std::io::Result<bool> {
        let Some((head, payload)) = self.boxes.peek()? else { return Ok(false) };
        take(&head, payload);
        self.boxes.release();
        Ok(true)
    }
}

/// What a test reads of a link's traffic after handing the link to a
/// driver: how many bytes its ring and its fastboxes carried out.
#[cfg(test)]
pub(crate) struct Traffic {
    domain: std::sync::Arc<super::domain::Domain>,
    peer: ringleader_core::Rank,
    tx: usize,
}

#[cfg(test)]
impl Traffic {
    /// Bytes written to the outgoing ring so far.
    pub(crate) fn ring_bytes(&self) -> u64 {
        self.map().ring_header(self.tx).head.load(Ordering::Acquire)
    }

    /// Fastbox frames the peer has taken so far.
    pub(crate) fn boxes_taken(&self) -> u64 {
        self.map().ring_header(self.tx).box_read.load(Ordering::Acquire)
    }

    fn map(&self) -> &super::segment::Mapping {
        self.domain.peers[self.peer].as_ref().expect("peer mapped")
    }
}

#[cfg(test)]
impl ShmLink {
    /// A view of this link's outgoing traffic that outlives lending it.
    pub(crate) fn traffic(&self) -> Traffic {
        Traffic { domain: self.domain.clone(), peer: self.peer, tx: self.tx }
    }
}
