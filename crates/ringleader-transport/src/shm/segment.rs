//! The segment layout shared between processes (doorbell, ring headers,
//! rings, fastbox cells) and a mapping of it.

use super::RING_BYTES;
use ringleader_core::Rank;
use rustix::fd::OwnedFd;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::thread::futex;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Spacing of what different sides write (one cache line), so that the
/// writer's position and the reader's never share a line. The layout is
/// shared between processes, so it is fixed here rather than taken from
/// `crossbeam_utils::CachePadded`, whose alignment depends on the target
/// (two lines on x86_64 and aarch64) and on the crate's version, and whose
/// layout is not `repr(C)`. Two-line spacing measured no faster
/// (docs/perf/deps-2026-12-01.md).
pub(super) const LINE: usize = 64;
/// Doorbell line, then two lines per ring header.
pub(super) const HEADER_BYTES: usize = LINE;
pub(super) const RING_HEADER_BYTES: usize = 2 * LINE;
/// Bumped with every change of the layout (002: fastboxes; 003: the CPU
/// beside the doorbell, fastbox cells of 4 KiB; 004: 32 cells per ring;
/// 005: 128 where a host has at most 4 ranks).
pub(super) const MAGIC: u64 = 0x524c_5348_4d30_3035; // "RLSHM005"

/// The futex word and sleeper count a rank waits on, and what its peers
/// need to read its memory directly (its pid, and where a nonce lies).
#[repr(C)]
pub(super) struct Doorbell {
    pub(super) magic: AtomicU64,
    pub(super) epoch: AtomicU32,
    pub(super) sleepers: AtomicU32,
    pub(super) pid: AtomicU32,
    /// The CPU this rank's last wait ran on, plus one (0: none yet).
    pub(super) cpu: AtomicU32,
    pub(super) probe_addr: AtomicU64,
    pub(super) probe_nonce: AtomicU64,
}

/// Positions of one ring: total bytes written and read, on separate cache
/// lines. The writer owns the first line, the reader the second.
#[repr(C)]
pub(super) struct RingHeader {
    pub(super) head: AtomicU64,
    /// Single-copy frames the writer gave up on (it failed while the reader
    /// might still read them): a reader that finds its frame among them
    /// fails instead of trusting bytes that may have changed.
    pub(super) abandoned: AtomicU64,
    pub(super) _pad: [u8; LINE - 16],
    pub(super) tail: AtomicU64,
    /// Single-copy frames the reader has copied (the writer's sends
    /// complete when this passes them).
    pub(super) remote_done: AtomicU64,
    /// Non-zero when the reader can read the writer's memory.
    pub(super) remote_ok: AtomicU64,
    /// Fastbox frames the reader has taken (see [`Cell`]): the writer
    /// reuses a cell once this passes its last occupant.
    pub(super) box_read: AtomicU64,
}

/// One fastbox cell (see `fastbox.rs`): a whole small frame, header fields
/// and payload, the header and the payload's first bytes in the cell's
/// first cache line, so that a small frame costs the reader the transfer
/// of the lines it fills and nothing else. Each ring has
/// [`cells_per_ring`] of them, used in turn; the writer fills one, then
/// stamps it.
#[repr(C)]
pub(super) struct Cell {
    /// The count of fastbox frames written on this ring, as of this one
    /// (1, 2, ...), stored last: a cell holds the reader's next fastbox
    /// frame when its stamp is one more than the frames it has taken.
    pub(super) stamp: AtomicU64,
    /// The ring position the frame sits at: it follows every ring byte
    /// before it, and precedes every one from it on.
    pub(super) pos: AtomicU64,
    /// The frame header's sequence number...
    pub(super) seq: AtomicU64,
    /// ...its encoded fingerprint...
    pub(super) fingerprint: [AtomicU64; 2],
    /// ...its tag...
    pub(super) tag: AtomicU32,
    /// ...and its payload length (at most [`BOX_PAYLOAD`]).
    pub(super) len: AtomicU32,
    /// The payload (`len` bytes of it), copied in and out as bytes: the
    /// stamp orders it, as the ring's positions order ring bytes.
    pub(super) payload: [AtomicU64; BOX_PAYLOAD / 8],
}

/// Fastbox cells per ring on a host of at most [`DEEP_UP_TO`] ranks: a
/// writer runs out only when it is this many small frames ahead of its
/// reader (it then waits for one or writes to the ring). A broadcast's
/// root runs ahead of its receivers, and the further it can, the less
/// often it stalls on one of them; where ranks share cores each stall is
/// a trip through the scheduler for the root and for the receiver it waits
/// on, so the depth sets how many calls share that cost
/// (docs/perf/express-2026-12-06.md and docs/perf/cells-2026-12-07.md have
/// the measurements). The cells cost 520 KiB per ring, beside its 2 MiB.
pub(super) const CELLS_DEEP: usize = 128;
/// Fastbox cells per ring on a host of more ranks (130 KiB per ring). A
/// cell is longer than a page, so a rank cycles through a page per cell
/// of each of its rings, both ways: with 8 ranks on 2 cores, 128 cells
/// made collectives that move in step slower, the pages of the ranks
/// sharing a core likely outgrowing what its TLB holds, and the rooted
/// ones gained little (docs/perf/cells-2026-12-07.md).
pub(super) const CELLS_SHALLOW: usize = 32;
/// The most ranks on a host for which its rings get [`CELLS_DEEP`] cells.
pub(super) const DEEP_UP_TO: usize = 4;

/// Fastbox cells per ring in a host of `local` ranks: every rank of the
/// host works it out alike from the same count (rendezvous gives it), and
/// the segment layout follows. Always a power of two.
pub(super) const fn cells_per_ring(local: usize) -> usize {
    if local <= DEEP_UP_TO {
        CELLS_DEEP
    } else {
        CELLS_SHALLOW
    }
}
/// Bytes of one cell: 4 KiB of payload and the header's line (a frame of
/// a few hundred bytes to a few kilobytes then costs its lines too, not
/// a ring frame's bookkeeping).
pub(super) const CELL_BYTES: usize = 65 * LINE;
/// Payload bytes a cell holds: what its lines leave after the header
/// fields (the first 16 in the header's line).
pub const BOX_PAYLOAD: usize = CELL_BYTES - 48;

// The segment layout is shared between processes: fixed by these
// constants and `repr(C)`, not by the target or a dependency's choice.
const _: () = {
    assert!(std::mem::size_of::<Doorbell>() <= HEADER_BYTES);
    assert!(std::mem::offset_of!(RingHeader, tail) == LINE);
    assert!(std::mem::size_of::<RingHeader>() <= RING_HEADER_BYTES);
    assert!(std::mem::align_of::<RingHeader>() <= LINE);
    assert!(std::mem::size_of::<Cell>() == CELL_BYTES);
    assert!(std::mem::offset_of!(Cell, payload) == CELL_BYTES - BOX_PAYLOAD);
    assert!(BOX_PAYLOAD % 8 == 0);
    assert!(BOX_PAYLOAD == crate::link::FASTBOX_MAX);
    assert!(CELLS_DEEP.is_power_of_two() && CELLS_SHALLOW.is_power_of_two());
};

/// A mapped segment.
pub(super) struct Mapping {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
}

// SAFETY: the mapping is plain memory shared with other processes; all
// access to it goes through atomics (positions, doorbell) or through byte
// ranges that the ring protocol hands to exactly one side at a time.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len come from a successful mmap and are unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl Mapping {
    pub(super) fn map(fd: &OwnedFd, len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of a file we hold open; nothing else
        // in this process aliases it.
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, 0)?
        };
        Ok(Mapping { ptr: NonNull::new(ptr.cast()).ok_or(std::io::ErrorKind::InvalidData)?, len })
    }

    pub(super) fn doorbell(&self) -> &Doorbell {
        // SAFETY: the segment starts with a Doorbell (alignment: mmap is
        // page aligned), whose fields are atomics valid for any bit pattern.
        unsafe { &*self.ptr.as_ptr().cast::<Doorbell>() }
    }

    pub(super) fn ring_header(&self, i: usize) -> &RingHeader {
        let off = HEADER_BYTES + i * RING_HEADER_BYTES;
        assert!(off + RING_HEADER_BYTES <= self.len);
        // SAFETY: in bounds (checked), 64-byte aligned, atomics only.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<RingHeader>() }
    }

    pub(super) fn ring_data(&self, rings: usize, i: usize) -> *mut u8 {
        let off = HEADER_BYTES + rings * RING_HEADER_BYTES + i * RING_BYTES;
        assert!(off + RING_BYTES <= self.len);
        // SAFETY: in bounds (checked).
        unsafe { self.ptr.as_ptr().add(off) }
    }

    /// Fastbox cell `i` of ring `ring` (of `rings`, `cells` cells each),
    /// after all the rings' data.
    pub(super) fn cell(&self, rings: usize, cells: usize, ring: usize, i: usize) -> &Cell {
        let off = HEADER_BYTES + rings * (RING_HEADER_BYTES + RING_BYTES) + (ring * cells + i) * CELL_BYTES;
        assert!(i < cells && off + CELL_BYTES <= self.len);
        // SAFETY: in bounds (checked), 64-byte aligned (the rings before it
        // are whole lines), atomics only.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<Cell>() }
    }
}

/// Where one link's fastbox lines lie (its outgoing ring's header and
/// cells in the peer's segment, its incoming ring's in ours, the peer's
/// doorbell), worked out and bounds-checked once, when the link is made:
/// a small frame then costs no offset arithmetic or bounds check.
pub(super) struct BoxLines {
    tx: NonNull<RingHeader>,
    rx: NonNull<RingHeader>,
    tx_cells: NonNull<Cell>,
    rx_cells: NonNull<Cell>,
    /// Cells per ring (a power of two).
    cells: usize,
    bell: NonNull<Doorbell>,
}

// SAFETY: the pointers lie in mappings that the link holding this keeps
// alive (its `Arc<Domain>`), and all access through them is atomic.
unsafe impl Send for BoxLines {}

impl BoxLines {
    /// The lines of the link that writes ring `tx` of `peer` (of `rings`
    /// in each segment, `cells` cells each, a power of two) and reads ring
    /// `rx` of `own`. The mappings must outlive what is made here (the
    /// link keeps them).
    pub(super) fn new(own: &Mapping, peer: &Mapping, rings: usize, cells: usize, tx: usize, rx: usize) -> BoxLines {
        assert!(cells.is_power_of_two());
        // `cell` asserts that a ring's last cell is in bounds, hence all.
        let (_, _) = (peer.cell(rings, cells, tx, cells - 1), own.cell(rings, cells, rx, cells - 1));
        map_in_cells(peer.cell(rings, cells, tx, 0), cells);
        map_in_cells(own.cell(rings, cells, rx, 0), cells);
        // A ring's bytes are not atomics: where the kernel cannot populate,
        // they fault in as they are first used, as before.
        map_in(peer.ring_data(rings, tx) as usize, RING_BYTES);
        map_in(own.ring_data(rings, rx) as usize, RING_BYTES);
        BoxLines {
            tx: NonNull::from(peer.ring_header(tx)),
            rx: NonNull::from(own.ring_header(rx)),
            tx_cells: NonNull::from(peer.cell(rings, cells, tx, 0)),
            rx_cells: NonNull::from(own.cell(rings, cells, rx, 0)),
            cells,
            bell: NonNull::from(peer.doorbell()),
        }
    }

    /// The outgoing ring's header (in the peer's segment).
    #[inline]
    pub(super) fn tx(&self) -> &RingHeader {
        // SAFETY: see the type's docs; in bounds (checked at construction).
        unsafe { self.tx.as_ref() }
    }

    /// The incoming ring's header (in ours).
    #[inline]
    pub(super) fn rx(&self) -> &RingHeader {
        // SAFETY: as for `tx`.
        unsafe { self.rx.as_ref() }
    }

    /// Cells per ring (a power of two).
    #[inline]
    pub(super) fn cells(&self) -> usize {
        self.cells
    }

    /// Outgoing cell `i` (below [`BoxLines::cells`]).
    #[inline]
    pub(super) fn tx_cell(&self, i: usize) -> &Cell {
        debug_assert!(i < self.cells);
        // SAFETY: the ring's cells lie one after the other (`Cell` is
        // `CELL_BYTES` long), all in bounds (checked at construction), and
        // `i` is taken modulo the cells (a power of two) here too.
        unsafe { &*self.tx_cells.as_ptr().add(i & (self.cells - 1)) }
    }

    /// Incoming cell `i` (below [`BoxLines::cells`]).
    #[inline]
    pub(super) fn rx_cell(&self, i: usize) -> &Cell {
        debug_assert!(i < self.cells);
        // SAFETY: as for `tx_cell`.
        unsafe { &*self.rx_cells.as_ptr().add(i & (self.cells - 1)) }
    }

    /// The peer's doorbell.
    #[inline]
    pub(super) fn bell(&self) -> &Doorbell {
        // SAFETY: as for `tx`.
        unsafe { self.bell.as_ref() }
    }
}

/// The size of a page, from the C library (rustix's own answer reads the
/// auxiliary vector, and under valgrind that read faults).
pub(super) fn page_size() -> usize {
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

/// Maps the pages of `len` bytes from `start`, in a live shared mapping,
/// into this process's page tables, writable, without changing a byte;
/// false where the kernel cannot (before 5.14). The segment's pages exist
/// already (it is allocated in full when created): only the mappings are
/// made. Left to fault in on first use, a link's first frames pay for them:
/// a cell is longer than a page, so each of a link's first small frames,
/// one per cell, took a page fault on both sides, about 3 us each in a virtual
/// machine, ten times the frame; a ring's first pass took one per 4 KiB.
fn map_in(start: usize, len: usize) -> bool {
    let page = page_size();
    let (lo, hi) = (start & !(page - 1), (start + len).next_multiple_of(page));
    // SAFETY: whole pages of a live shared mapping (the range and at most
    // the partial pages around it, which belong to the same mapping: every
    // caller's range lies inside one segment, whose mapping is whole
    // pages); populating changes no contents.
    unsafe { rustix::mm::madvise(lo as *mut std::ffi::c_void, hi - lo, rustix::mm::Advice::LinuxPopulateWrite) }.is_ok()
}

/// Maps in the pages of the `cells` cells from `first` on (see
/// [`map_in`]), on kernels that cannot populate by [`write_fault`].
fn map_in_cells(first: &Cell, cells: usize) {
    if !map_in(first as *const Cell as usize, cells * CELL_BYTES) {
        write_fault(first, cells);
    }
}

/// Maps in the pages of the `cells` cells from `first` on by a write
/// fault per page: a compare-and-swap of one word of it with its own
/// value, which changes nothing and loses no concurrent store of the
/// peer's (an atomic add of nothing would not do: the compiler may turn it
/// into a load, and drop the load).
pub(super) fn write_fault(first: &Cell, cells: usize) {
    let (words, n) = (first as *const Cell as *const AtomicU64, cells * CELL_BYTES / 8);
    // A word a page apart from the first, and the last word: the cells need
    // not start on a page, so the last page may hold only their end.
    for w in (0..n).step_by(page_size() / 8).chain([n - 1]) {
        // SAFETY: in bounds of the cells (w < n), 8-byte aligned, and every
        // word of a cell is an atomic.
        let word = unsafe { &*words.add(w) };
        let v = word.load(Ordering::Relaxed);
        let _ = word.compare_exchange(v, v, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Bytes of a segment holding `rings` rings (their headers, data and
/// `cells` fastbox cells each) after the doorbell.
pub(super) fn segment_len(rings: usize, cells: usize) -> usize {
    HEADER_BYTES + rings * (RING_HEADER_BYTES + RING_BYTES + cells * CELL_BYTES)
}

/// The name of a rank's segment: the run, the rank and the owner's pid (so
/// leftovers of dead processes can be recognized).
pub fn segment_name(run_id: &str, rank: Rank, pid: u32) -> String {
    let run: String =
        run_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).take(64).collect();
    format!("/rl-{run}-{rank}-{pid}")
}

/// Removes segment files of processes that no longer exist (crashed before
/// the handshake that unlinks them).
pub(super) fn remove_stale_segments() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("rl-").and_then(|n| n.rsplit('-').next()).and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = rustix::shm::unlink(format!("/{name}").as_str());
        }
    }
}

/// A ring position that does not make sense: the peer corrupted it.
pub(super) fn corrupt(peer: Rank) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("rank {peer} left an impossible ring position"))
}

/// Wakes the owner of `bell` if it sleeps.
#[inline]
pub(super) fn ring_bell(bell: &Doorbell) {
    // Pairs with the fence in `Domain::wait`: either the sleeper sees our
    // write, or we see it registered as a sleeper.
    fence(Ordering::SeqCst);
    if bell.sleepers.load(Ordering::Relaxed) > 0 {
        bell.epoch.fetch_add(1, Ordering::Release);
        let _ = futex::wake(&bell.epoch, futex::Flags::empty(), i32::MAX as u32);
    }
}
