//! What an algorithm hands the driver: the transfers of one collective on
//! one rank, as data.
//!
//! A [`Plan`] lists sends ("this byte range to rank r") and receives ("the
//! next frame from rank s, copied or reduced into this range"), each on a
//! [`Chan`] (a peer and one of its streams), with the dependencies between
//! them. Ranges are [`Region`]s of the buffers the caller passes to
//! [`crate::Driver::run`]; the [`OpInfo`] names the collective every frame
//! of the plan belongs to. Nothing here does IO: plans are built by pure
//! functions (the `ringleader` crate's `algo` module) and checked by a
//! simulator before any link is involved.

use ringleader_core::{Fingerprint, Rank, ReduceOp};

/// A buffer an algorithm works on.
#[derive(Debug)]
pub enum Buf<'a> {
    /// Read only (an input that must not change).
    Ro(&'a [u8]),
    /// Read and written.
    Rw(&'a mut [u8]),
}

impl Buf<'_> {
    /// Its bytes, read only.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Buf::Ro(b) => b,
            Buf::Rw(b) => b,
        }
    }
}

/// A byte range of one of the buffers passed to [`crate::Driver::run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Index into the buffers.
    pub buf: u8,
    /// First byte.
    pub off: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Region {
    /// A region of buffer `buf`.
    pub const fn new(buf: u8, off: usize, len: usize) -> Region {
        Region { buf, off, len }
    }

    /// Its bytes as a range of the buffer.
    pub(crate) fn range(&self) -> std::ops::Range<usize> {
        self.off..self.off + self.len
    }
}

/// A link: a peer and one of its streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Chan {
    /// The peer's rank.
    pub peer: Rank,
    /// Stream index, below the mesh's streams per peer.
    pub stream: u16,
}

/// Send `region` to `chan`, once receive `after` (if any) is complete.
#[derive(Debug, Clone, Copy)]
pub struct SendItem {
    /// Where to.
    pub chan: Chan,
    /// What.
    pub region: Region,
    /// Index of a receive that must complete first.
    pub after: Option<u32>,
}

/// What to do with a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvMode {
    /// Store it in the region.
    Copy,
    /// `region = with op frame`, or `region = region op frame` when `with`
    /// is `None`.
    Reduce {
        /// The other operand, if not the region itself.
        with: Option<Region>,
    },
}

/// Receive the next frame from `chan` into `region`.
#[derive(Debug, Clone, Copy)]
pub struct RecvItem {
    /// From where.
    pub chan: Chan,
    /// Into what.
    pub region: Region,
    /// Copy or reduce.
    pub mode: RecvMode,
    /// Index of a receive that must complete before this one starts.
    pub after: Option<u32>,
    /// Index of a send that must complete before this one starts (the send
    /// reads the bytes this receive will overwrite).
    pub after_send: Option<u32>,
}

/// The transfers of one collective on one rank. Reused between
/// collectives: [`Plan::clear`] keeps the capacity.
///
/// Build plans through [`Plan::send`] and [`Plan::recv`] (after
/// [`Plan::clear`]): each change gives the plan a new [`Plan::id`], by
/// which the driver knows a plan it has run before.
#[derive(Debug, Default)]
pub struct Plan {
    /// Sends, in the order they are written to each link.
    pub sends: Vec<SendItem>,
    /// Receives, in the order frames arrive on each link.
    pub recvs: Vec<RecvItem>,
    id: u64,
}

/// Plan ids handed out so far (0 is never one: a new plan gets its id at
/// its first change).
static PLAN_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Plan {
    /// Empties the plan, keeping its memory.
    pub fn clear(&mut self) {
        self.sends.clear();
        self.recvs.clear();
        self.renew();
    }

    /// Identifies the plan's contents: no other plan, and no other
    /// contents of this one, made through its methods had the same id
    /// (0: an empty plan never changed).
    pub fn id(&self) -> u64 {
        self.id
    }

    fn renew(&mut self) {
        self.id = PLAN_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    }

    /// Adds a send; returns its index.
    pub fn send(&mut self, chan: Chan, region: Region, after: Option<u32>) -> u32 {
        self.sends.push(SendItem { chan, region, after });
        self.renew();
        (self.sends.len() - 1) as u32
    }

    /// Adds a receive; returns its index.
    pub fn recv(
        &mut self,
        chan: Chan,
        region: Region,
        mode: RecvMode,
        after: Option<u32>,
        after_send: Option<u32>,
    ) -> u32 {
        self.recvs.push(RecvItem { chan, region, mode, after, after_send });
        self.renew();
        (self.recvs.len() - 1) as u32
    }
}

/// The operation a plan's frames belong to: what every frame header
/// carries and every received header is checked against.
#[derive(Debug, Clone, Copy)]
pub struct OpInfo {
    /// Sequence number (per peer pair and direction for send/recv).
    pub seq: u64,
    /// This rank's call.
    pub fingerprint: Fingerprint,
    /// Compare peers' fingerprints (`RINGLEADER_CHECKS`).
    pub checks: bool,
}

impl OpInfo {
    /// The reduction of a reduce-receive (sum when the call names none).
    pub(crate) fn reduce_op(&self) -> ReduceOp {
        self.fingerprint.reduce_op.unwrap_or(ReduceOp::Sum)
    }
}
