//! Shared memory between ranks on one host.
//!
//! Each rank owns one segment holding the rings it *reads* (one per local
//! peer and stream) and a doorbell: a futex word its peers ring when they
//! wrote into one of its rings or freed space in one they read. A ring is a
//! single-producer single-consumer byte stream, so the frames, the
//! fingerprint checks and the driver are the same as over TCP; only copies
//! are cheaper, and a receive can be reduced straight out of the ring.
//!
//! Waiting spins briefly, then sleeps on the doorbell (`FUTEX_WAIT` on shared
//! memory), so ranks that outnumber the cores do not starve each other. The
//! abort signal rings the doorbell too, so an abort wakes a sleeping wait at
//! once, as it does a `poll` on sockets.
//!
//! Segments are allocated in full when they are created (`fallocate`), not
//! merely sized: a sparse file on a tmpfs too small for it (a container's
//! 64 MiB `/dev/shm`) would kill the process with SIGBUS at the first write
//! past the space left. Before creating its segment each rank checks that
//! `/dev/shm` has room for every local rank's segment (this run's segments
//! already there count as room), so on a short `/dev/shm` every rank of the
//! host fails at once with the same error, which names the sizes and the
//! fixes. Should the allocation still fail (another job took the space
//! meanwhile), the rank leaves a note in its segment file that its peers
//! read instead of waiting for the segment.
//!
//! Segments are files under `/dev/shm` only until every local peer has
//! mapped them: the owner unlinks its file right after the local handshake,
//! so a job whose ranks are killed leaves nothing behind. Files of crashed
//! start-ups (the owner's pid is dead) are removed by the next job.
//!
//! Large frames can skip the ring ("single copy"): the writer puts only a
//! descriptor (the payload's address in its own memory) into the ring, the
//! reader copies the payload straight from the writer's process into its
//! destination with `process_vm_readv` (cross-memory attach), and then
//! acknowledges it in its ring header, which is when the writer's send
//! completes. One copy instead of two (into the ring, out of it) is what
//! bandwidth-bound transfers need. The reader only accepts descriptors from
//! a peer whose memory it proved it can read at set-up (a random nonce at a
//! published address), so ptrace restrictions, seccomp or separate pid
//! namespaces leave the ring in use rather than fail a collective.
//!
//! Everything read from shared memory (the ring positions) is bounded before
//! use: a corrupt or malicious peer can make this rank fail, never make it
//! read or write outside the mapping.
#![allow(unsafe_code)]

use crate::link::{Mapped, ReadOutcome, SingleCopy, Wake};
use ringleader_core::{AbortSignal, Error, Rank, Result};
use rustix::fd::OwnedFd;
use rustix::fs::Mode;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::shm::OFlags;
use rustix::thread::futex;
use std::io::IoSlice;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of one ring (a power of two, a multiple of 8).
pub const RING_BYTES: usize = 2 << 20;
/// A long write publishes its progress (and rings the reader's doorbell)
/// every this many bytes, so copying in and copying out overlap.
const PUBLISH_EVERY: usize = 128 << 10;
/// Spacing of what different sides write (one cache line), so that the
/// writer's position and the reader's never share a line. The layout is
/// shared between processes, so it is fixed here rather than taken from
/// `crossbeam_utils::CachePadded`, whose alignment depends on the target
/// (two lines on x86_64 and aarch64) and on the crate's version, and whose
/// layout is not `repr(C)`. Two-line spacing measured no faster
/// (docs/perf/deps-2026-12-01.md).
const LINE: usize = 64;
/// Doorbell line, then two lines per ring header.
const HEADER_BYTES: usize = LINE;
const RING_HEADER_BYTES: usize = 2 * LINE;
const MAGIC: u64 = 0x524c_5348_4d30_3031; // "RLSHM001"

/// The futex word and sleeper count a rank waits on, and what its peers
/// need to read its memory directly (its pid, and where a nonce lies).
#[repr(C)]
struct Doorbell {
    magic: AtomicU64,
    epoch: AtomicU32,
    sleepers: AtomicU32,
    pid: AtomicU32,
    _reserved: AtomicU32,
    probe_addr: AtomicU64,
    probe_nonce: AtomicU64,
}

/// Positions of one ring: total bytes written and read, on separate cache
/// lines. The writer owns the first line, the reader the second.
#[repr(C)]
struct RingHeader {
    head: AtomicU64,
    /// Single-copy frames the writer gave up on (it failed while the reader
    /// might still read them): a reader that finds its frame among them
    /// fails instead of trusting bytes that may have changed.
    abandoned: AtomicU64,
    _pad: [u8; LINE - 16],
    tail: AtomicU64,
    /// Single-copy frames the reader has copied (the writer's sends
    /// complete when this passes them).
    remote_done: AtomicU64,
    /// Non-zero when the reader can read the writer's memory.
    remote_ok: AtomicU64,
}

// The segment layout is shared between processes: fixed by these
// constants and `repr(C)`, not by the target or a dependency's choice.
const _: () = {
    assert!(std::mem::size_of::<Doorbell>() <= HEADER_BYTES);
    assert!(std::mem::offset_of!(RingHeader, tail) == LINE);
    assert!(std::mem::size_of::<RingHeader>() <= RING_HEADER_BYTES);
    assert!(std::mem::align_of::<RingHeader>() <= LINE);
};

/// A mapped segment.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
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
    fn map(fd: &OwnedFd, len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of a file we hold open; nothing else
        // in this process aliases it.
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, 0)?
        };
        Ok(Mapping { ptr: NonNull::new(ptr.cast()).ok_or(std::io::ErrorKind::InvalidData)?, len })
    }

    fn doorbell(&self) -> &Doorbell {
        // SAFETY: the segment starts with a Doorbell (alignment: mmap is
        // page aligned), whose fields are atomics valid for any bit pattern.
        unsafe { &*self.ptr.as_ptr().cast::<Doorbell>() }
    }

    fn ring_header(&self, i: usize) -> &RingHeader {
        let off = HEADER_BYTES + i * RING_HEADER_BYTES;
        assert!(off + RING_HEADER_BYTES <= self.len);
        // SAFETY: in bounds (checked), 64-byte aligned, atomics only.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<RingHeader>() }
    }

    fn ring_data(&self, rings: usize, i: usize) -> *mut u8 {
        let off = HEADER_BYTES + rings * RING_HEADER_BYTES + i * RING_BYTES;
        assert!(off + RING_BYTES <= self.len);
        // SAFETY: in bounds (checked).
        unsafe { self.ptr.as_ptr().add(off) }
    }
}

fn segment_len(rings: usize) -> usize {
    HEADER_BYTES + rings * (RING_HEADER_BYTES + RING_BYTES)
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
fn remove_stale_segments() {
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

/// Wakes the owner of `bell` if it sleeps.
#[inline]
fn ring_bell(bell: &Doorbell) {
    // Pairs with the fence in `Domain::wait`: either the sleeper sees our
    // write, or we see it registered as a sleeper.
    fence(Ordering::SeqCst);
    if bell.sleepers.load(Ordering::Relaxed) > 0 {
        bell.epoch.fetch_add(1, Ordering::Release);
        let _ = futex::wake(&bell.epoch, futex::Flags::empty(), i32::MAX as u32);
    }
}

/// Why a peer's segment could not be mapped.
#[derive(Debug)]
enum Opened {
    /// Not there yet, or not ready: worth waiting for.
    NotYet(String),
    /// Its owner could not allocate it, and left this message.
    Failed(String),
}

/// This rank's shared-memory state: its own segment and its local peers'.
pub struct Domain {
    own: Mapping,
    own_name: String,
    /// Local peers' segments, by global rank.
    peers: Vec<Option<Mapping>>,
    /// Local ranks in ascending order (this rank included).
    local: Vec<Rank>,
    rank: Rank,
    streams: usize,
    /// The nonce peers read to prove they can reach this process's memory.
    _probe: Box<u64>,
    /// Frames from this many bytes on go single-copy (`None`: never).
    single_copy: Option<usize>,
}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain").field("rank", &self.rank).field("local", &self.local).finish()
    }
}

/// Where `shm_open` puts segments.
const SHM_DIR: &str = "/dev/shm";
/// What a segment file holds instead of its rings when its owner could
/// not allocate it: this prefix, then the owner's error message.
const FAILED_NOTE: &[u8] = b"RLSHM-FAILED\n";

/// `n` bytes as a person reads them (`64.0 MiB`).
fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The prefix of this run's segment files in [`SHM_DIR`].
fn run_prefix(run_id: &str) -> String {
    segment_name(run_id, 0, 0).trim_start_matches('/').rsplitn(3, '-').nth(2).unwrap_or_default().to_string() + "-"
}

/// The error for a `/dev/shm` without room for `need` bytes.
fn no_room(size: u64, free: u64, need: u64, ranks: usize, seg: usize, streams: usize) -> Error {
    Error::invalid(
        "shared memory",
        format!(
            "{SHM_DIR} is too small for this job: it has {} free of {}, but the {ranks} ranks on this host need {} \
             ({ranks} segments of {}: {} rings of {} for each local peer, one per RINGLEADER_STREAMS stream plus one \
             for send/recv); set RINGLEADER_TRANSPORT=tcp to do without shared memory, give the container a larger \
             {SHM_DIR} (`docker run --shm-size={}m ...`, Kubernetes: an emptyDir with medium: Memory), or lower \
             RINGLEADER_STREAMS",
            human(free),
            human(size),
            human(need),
            human(seg as u64),
            streams,
            human(RING_BYTES as u64),
            // Room for the segments and half as much again for everything
            // else, in steps of 64 MiB.
            (need + need / 2).div_ceil(64 << 20).max(1) * 64,
        ),
    )
}

/// Checks that [`SHM_DIR`] has room for `ranks` segments of `seg` bytes,
/// counting the space this run's segments already hold as room (they are
/// among the `ranks`). Reads the free space first and the segments after,
/// so a peer allocating meanwhile can only make the room look larger,
/// never smaller: no rank fails for want of space another rank of the job
/// holds.
fn check_room(run_id: &str, ranks: usize, seg: usize, streams: usize) -> Result<()> {
    let Ok(st) = rustix::fs::statvfs(SHM_DIR) else { return Ok(()) };
    let block = st.f_frsize.max(1);
    let (free, size) = (st.f_bavail.saturating_mul(block), st.f_blocks.saturating_mul(block));
    let prefix = run_prefix(run_id);
    let mut ours = 0u64;
    if let Ok(dir) = std::fs::read_dir(SHM_DIR) {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                if let Ok(m) = e.metadata() {
                    ours += std::os::unix::fs::MetadataExt::blocks(&m) * 512;
                }
            }
        }
    }
    let need = (ranks as u64).saturating_mul(seg as u64);
    if free.saturating_add(ours) < need {
        return Err(no_room(size, free + ours, need, ranks, seg, streams));
    }
    Ok(())
}

/// Allocates the segment's `len` bytes (not a sparse file: see the module
/// docs). File systems without `fallocate` get a sized file.
fn allocate(fd: &OwnedFd, len: usize) -> std::io::Result<()> {
    match rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::empty(), 0, len as u64) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => Ok(rustix::fs::ftruncate(fd, len as u64)?),
        Err(e) => Err(e.into()),
    }
}

/// Leaves `msg` in a segment file whose rings could not be allocated, for
/// the peers waiting for it (best effort: on a full tmpfs even this may not fit).
fn leave_note(fd: &OwnedFd, msg: &str) {
    let _ = rustix::fs::ftruncate(fd, 0);
    let mut note = FAILED_NOTE.to_vec();
    note.extend_from_slice(msg.as_bytes());
    let _ = rustix::io::pwrite(fd, &note, 0);
}

fn shm_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::invalid("shared memory", format!("{what}: {e} (set RINGLEADER_TRANSPORT=tcp to do without)"))
}

impl Domain {
    /// Creates this rank's segment, with `streams` incoming rings per local
    /// peer. `local` lists the ranks on this host, this one included.
    /// Frames of `single_copy` bytes or more skip the ring where the peer
    /// allows it (`None`: never; see the module docs).
    pub fn create(
        run_id: &str,
        rank: Rank,
        world: usize,
        local: &[Rank],
        streams: usize,
        single_copy: Option<usize>,
    ) -> Result<Domain> {
        remove_stale_segments();
        let mut local = local.to_vec();
        local.sort_unstable();
        let rings = (local.len() - 1) * streams;
        let len = segment_len(rings);
        check_room(run_id, local.len(), len, streams)?;
        let name = segment_name(run_id, rank, std::process::id());
        let fd =
            rustix::shm::open(name.as_str(), OFlags::CREATE | OFlags::EXCL | OFlags::RDWR, Mode::RUSR | Mode::WUSR)
                .map_err(|e| shm_error(&format!("cannot create {name}"), e))?;
        if let Err(e) = allocate(&fd, len) {
            let err = match e.raw_os_error() {
                Some(libc::ENOSPC) => {
                    let st = rustix::fs::statvfs(SHM_DIR).ok();
                    let block = st.as_ref().map_or(1, |s| s.f_frsize.max(1));
                    let (size, free) = st.map_or((0, 0), |s| (s.f_blocks * block, s.f_bavail * block));
                    no_room(size, free, (local.len() * len) as u64, local.len(), len, streams)
                }
                _ => shm_error(&format!("cannot allocate {name} ({})", human(len as u64)), e),
            };
            // The peers read this instead of waiting for the segment.
            leave_note(&fd, &format!("rank {rank}: {err}"));
            return Err(err);
        }
        let own = Mapping::map(&fd, len).map_err(|e| {
            let _ = rustix::shm::unlink(name.as_str());
            shm_error(&format!("cannot map {name} ({})", human(len as u64)), e)
        })?;
        // Fresh pages are zero: positions start at 0. The magic says "ready".
        let probe = Box::new(nonce(&name));
        let bell = own.doorbell();
        bell.pid.store(std::process::id(), Ordering::Relaxed);
        bell.probe_addr.store(&*probe as *const u64 as u64, Ordering::Relaxed);
        bell.probe_nonce.store(*probe, Ordering::Relaxed);
        bell.magic.store(MAGIC, Ordering::Release);
        let peers = (0..world).map(|_| None).collect();
        Ok(Domain { own, own_name: name, peers, local, rank, streams, _probe: probe, single_copy })
    }

    /// The name peers open this rank's segment by.
    pub fn name(&self) -> &str {
        &self.own_name
    }

    /// Maps local peer `peer`'s segment, created under `name`. The peer
    /// creates it right after rendezvous; this waits (bounded) until the file
    /// exists, has its size and carries the ready mark (creating, sizing and
    /// marking are three steps another process can observe in between).
    pub fn open_peer(
        &mut self,
        peer: Rank,
        name: &str,
        deadline: std::time::Instant,
        abort: &AbortSignal,
    ) -> Result<()> {
        let len = segment_len((self.local.len() - 1) * self.streams);
        loop {
            abort.check()?;
            let why = match self.try_open(name, len) {
                Ok(m) => {
                    self.allow_single_copy(peer, &m);
                    self.peers[peer] = Some(m);
                    return Ok(());
                }
                Err(Opened::Failed(note)) => {
                    return Err(Error::invalid("shared memory", format!("rank {peer} could not set up: {note}")))
                }
                Err(Opened::NotYet(why)) => why,
            };
            if std::time::Instant::now() >= deadline {
                return Err(shm_error(&format!("rank {peer}'s segment {name}"), why));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Maps a ready segment, or says why it is not (yet), or that its
    /// owner failed to allocate it.
    fn try_open(&self, name: &str, len: usize) -> std::result::Result<Mapping, Opened> {
        let not_yet = |s: String| Opened::NotYet(s);
        let fd = rustix::shm::open(name, OFlags::RDWR, Mode::empty())
            .map_err(|e| not_yet(format!("never appeared ({e})")))?;
        let size = rustix::fs::fstat(&fd).map_err(|e| not_yet(e.to_string()))?.st_size as usize;
        if size != len {
            if size > FAILED_NOTE.len() && size < 64 << 10 {
                let mut note = vec![0u8; size];
                if let Ok(n) = rustix::io::pread(&fd, &mut note, 0) {
                    if let Some(msg) = note[..n].strip_prefix(FAILED_NOTE) {
                        return Err(Opened::Failed(String::from_utf8_lossy(msg).into_owned()));
                    }
                }
            }
            return Err(not_yet(format!("has {size} bytes, expected {len}")));
        }
        let m = Mapping::map(&fd, len).map_err(|e| not_yet(e.to_string()))?;
        if m.doorbell().magic.load(Ordering::Acquire) != MAGIC {
            return Err(not_yet("was never marked ready".into()));
        }
        Ok(m)
    }

    /// Tells `peer` it may send single-copy frames to this rank, if this
    /// rank can read the peer's memory: it reads the nonce the peer
    /// published and compares.
    fn allow_single_copy(&self, peer: Rank, m: &Mapping) {
        if self.single_copy.is_none() {
            return;
        }
        let bell = m.doorbell();
        let (pid, addr) = (bell.pid.load(Ordering::Relaxed), bell.probe_addr.load(Ordering::Relaxed));
        let mut got = [0u8; 8];
        match read_process(pid, addr, &mut got) {
            Ok(8) if u64::from_ne_bytes(got) == bell.probe_nonce.load(Ordering::Relaxed) => {
                for s in 0..self.streams {
                    self.own.ring_header(self.slot(self.rank, peer, s)).remote_ok.store(1, Ordering::Release);
                }
            }
            Ok(_) => tracing::debug!(peer, pid, "single copy from rank {peer} is off: its memory reads back wrong"),
            Err(e) => tracing::debug!(peer, pid, "single copy from rank {peer} is off: cannot read pid {pid}: {e}"),
        }
    }

    /// Removes this rank's segment file (the mapping stays). Call once
    /// every local peer has mapped it.
    pub fn unlink(&self) {
        let _ = rustix::shm::unlink(self.own_name.as_str());
    }

    /// Index of `peer`'s rings among a segment owner's rings.
    fn slot(&self, owner: Rank, peer: Rank, stream: usize) -> usize {
        let others: Vec<Rank> = self.local.iter().copied().filter(|r| *r != owner).collect();
        let i = others.iter().position(|r| *r == peer).expect("peer is local");
        i * self.streams + stream
    }

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
            let links = (0..d.streams)
                .map(|s| ShmLink {
                    domain: d.clone(),
                    peer,
                    rx: d.slot(d.rank, peer, s),
                    tx: d.slot(peer, d.rank, s),
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

/// Waits on this rank's doorbell.
#[derive(Clone)]
pub struct Waiter {
    domain: Arc<Domain>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").field("rank", &self.domain.rank).finish()
    }
}

impl Waiter {
    /// Sleeps until a peer rings the doorbell, `ready()` turns true, or
    /// `timeout` passes. `ready` is checked after registering as a sleeper,
    /// so a ring between the caller's last check and the sleep is not lost.
    pub fn wait(&self, timeout: Duration, ready: impl Fn() -> bool) {
        let bell = self.domain.own.doorbell();
        let epoch = bell.epoch.load(Ordering::Acquire);
        bell.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !ready() {
            let ts = rustix::thread::futex::Timespec {
                tv_sec: timeout.as_secs() as i64,
                tv_nsec: timeout.subsec_nanos() as i64,
            };
            let _ = futex::wait(&bell.epoch, futex::Flags::empty(), epoch, Some(&ts));
        }
        bell.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Rings this rank's own doorbell: wakes its sleeping waits (another
    /// thread of this rank has new work for them).
    pub fn ring(&self) {
        let bell = self.domain.own.doorbell();
        bell.epoch.fetch_add(1, Ordering::Release);
        let _ = futex::wake(&bell.epoch, futex::Flags::empty(), i32::MAX as u32);
    }

    /// Makes `abort` ring this rank's doorbell, so a sleeping wait wakes.
    pub fn wake_on(&self, abort: &AbortSignal) {
        let d = self.domain.clone();
        abort.on_abort(move || {
            let bell = d.own.doorbell();
            bell.epoch.fetch_add(1, Ordering::Release);
            let _ = futex::wake(&bell.epoch, futex::Flags::empty(), i32::MAX as u32);
        });
    }
}

/// One stream to one local peer: we write into its segment, read from ours.
pub struct ShmLink {
    domain: Arc<Domain>,
    peer: Rank,
    /// Our incoming ring (in our segment).
    rx: usize,
    /// Our outgoing ring (in the peer's segment).
    tx: usize,
    rings: usize,
    /// Single-copy frames written (the tickets their acks are matched to).
    remote_sent: u64,
    /// Single-copy frames read.
    remote_read: u64,
}

impl std::fmt::Debug for ShmLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmLink").field("peer", &self.peer).finish()
    }
}

/// A 64-bit value no other process can guess, for the single-copy probe.
fn nonce(name: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(name.as_bytes());
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish() | 1
}

/// Copies `dst.len()` bytes at `addr` in process `pid` into `dst`
/// (cross-memory attach); returns how many arrived.
fn read_process(pid: u32, addr: u64, dst: &mut [u8]) -> std::io::Result<usize> {
    let local = libc::iovec { iov_base: dst.as_mut_ptr().cast(), iov_len: dst.len() };
    let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: dst.len() };
    // SAFETY: `local` describes `dst`, which we borrow mutably for the
    // call; the kernel validates the remote range and fails with EFAULT
    // rather than touch anything else.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// A ring position that does not make sense: the peer corrupted it.
fn corrupt(peer: Rank) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("rank {peer} left an impossible ring position"))
}

impl ShmLink {
    fn peer_map(&self) -> &Mapping {
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
    /// the ring's end), bounded by `max`.
    fn readable(&self, max: usize) -> std::io::Result<(*const u8, usize)> {
        let m = &self.domain.own;
        let h = m.ring_header(self.rx);
        let head = h.head.load(Ordering::Acquire);
        let tail = h.tail.load(Ordering::Relaxed);
        let avail = head.wrapping_sub(tail);
        if avail > RING_BYTES as u64 {
            return Err(corrupt(self.peer));
        }
        let at = (tail % RING_BYTES as u64) as usize;
        let n = (avail as usize).min(RING_BYTES - at).min(max);
        // SAFETY: in bounds of the ring (n <= RING_BYTES - at).
        Ok((unsafe { m.ring_data(self.rings, self.rx).add(at) }, n))
    }

    fn consume(&self, n: usize) {
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

    fn read_with(&mut self, buf: &mut [u8], streaming: bool) -> std::io::Result<usize> {
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
            h.head.load(Ordering::Acquire) != h.tail.load(Ordering::Relaxed)
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

/// Two "ranks" in one process, each with its own domain; frames from 64
/// bytes on go single-copy.
#[cfg(test)]
pub(crate) fn test_pair(run: &str) -> (ShmLink, ShmLink, Waiter, Waiter) {
    test_pair_with(run, [Some(64), Some(64)])
}

/// [`test_pair`] with each rank's single-copy setting.
#[cfg(test)]
pub(crate) fn test_pair_with(run: &str, single_copy: [Option<usize>; 2]) -> (ShmLink, ShmLink, Waiter, Waiter) {
    let abort = AbortSignal::new().unwrap();
    let mut a = Domain::create(run, 0, 2, &[0, 1], 1, single_copy[0]).unwrap();
    let mut b = Domain::create(run, 1, 2, &[0, 1], 1, single_copy[1]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    let (na, nb) = (a.name().to_string(), b.name().to_string());
    a.open_peer(1, &nb, deadline, &abort).unwrap();
    b.open_peer(0, &na, deadline, &abort).unwrap();
    a.unlink();
    b.unlink();
    let (mut la, wa) = a.links();
    let (mut lb, wb) = b.links();
    (la.remove(0).1.remove(0), lb.remove(0).1.remove(0), wa, wb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(64 << 20), "64.0 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
        assert_eq!(run_prefix("job 7"), "rl-job_7-");
    }

    #[test]
    fn a_peer_that_could_not_allocate_is_an_error_at_once() {
        let run = format!("note-{}", std::process::id());
        let abort = AbortSignal::new().unwrap();
        let mut a = Domain::create(&run, 0, 2, &[0, 1], 1, None).unwrap();
        // Rank 1's segment as its owner leaves it when allocating failed.
        let name = segment_name(&run, 1, std::process::id());
        let fd =
            rustix::shm::open(name.as_str(), OFlags::CREATE | OFlags::EXCL | OFlags::RDWR, Mode::RUSR | Mode::WUSR)
                .unwrap();
        leave_note(&fd, "rank 1: no room");
        let t = std::time::Instant::now();
        let deadline = t + Duration::from_secs(10);
        let e = a.open_peer(1, &name, deadline, &abort).unwrap_err().to_string();
        assert!(t.elapsed() < Duration::from_secs(2), "waited {:?}", t.elapsed());
        assert!(e.contains("rank 1 could not set up: rank 1: no room"), "{e}");
        let _ = rustix::shm::unlink(name.as_str());
        a.unlink();
    }

    pub(crate) use super::test_pair as pair;

    #[test]
    fn bytes_flow_both_ways_across_the_wrap() {
        let (mut a, mut b, _, _) = pair("t-wrap");
        let msg: Vec<u8> = (0..RING_BYTES + 12345).map(|i| (i * 7) as u8).collect();
        let mut got = Vec::new();
        let mut sent = 0;
        let mut buf = vec![0u8; 70_001];
        while got.len() < msg.len() {
            sent += a.try_write(&[IoSlice::new(&msg[sent..])]).unwrap();
            let n = b.try_read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, msg);
        assert_eq!(b.try_write(&[IoSlice::new(b"back"), IoSlice::new(b" again")]).unwrap(), 10);
        let mut back = [0u8; 10];
        assert_eq!(a.try_read(&mut back).unwrap(), 10);
        assert_eq!(&back, b"back again");
        assert!(!std::path::Path::new("/dev/shm/rl-t-wrap-0").exists());
    }

    #[test]
    fn streaming_reads_deliver_the_same_bytes_across_the_wrap() {
        let (mut a, mut b, _, _) = pair("t-stream");
        let msg: Vec<u8> = (0..2 * RING_BYTES + 777).map(|i| (i * 11 + 3) as u8).collect();
        let mut got = vec![0u8; msg.len() + 1];
        let (mut sent, mut recvd) = (0, 1); // an odd destination offset
        while recvd < got.len() {
            sent += a.try_write(&[IoSlice::new(&msg[sent..])]).unwrap();
            let end = (recvd + 100_003).min(got.len());
            recvd += b.try_read_streaming(&mut got[recvd..end]).unwrap();
        }
        assert_eq!(&got[1..], &msg[..]);
    }

    #[test]
    fn a_full_ring_takes_no_more_and_in_place_reads_consume() {
        let (mut a, mut b, _, _) = pair("t-full");
        let big = vec![1u8; RING_BYTES + 10];
        assert_eq!(a.try_write(&[IoSlice::new(&big)]).unwrap(), RING_BYTES);
        assert_eq!(a.try_write(&[IoSlice::new(&big)]).unwrap(), 0);
        assert!(!a.ready(true) && b.ready(false));
        let mut sum = 0u64;
        let used = b.read_in_place(100, &mut |d| {
            sum = d.iter().map(|x| *x as u64).sum();
            d.len()
        });
        assert_eq!((used.unwrap(), sum), (100, 100));
        assert_eq!(a.try_write(&[IoSlice::new(&big)]).unwrap(), 100);
    }

    #[test]
    fn a_sleeping_reader_wakes_on_a_write_and_on_abort() {
        let (mut a, b, _, wb) = pair("t-wake");
        let t = std::thread::spawn(move || {
            let start = std::time::Instant::now();
            wb.wait(Duration::from_secs(5), || b.ready(false));
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        a.try_write(&[IoSlice::new(b"x")]).unwrap();
        assert!(t.join().unwrap() < Duration::from_secs(2));

        let (_, b, _, wb) = pair("t-abort");
        let abort = AbortSignal::new().unwrap();
        wb.wake_on(&abort);
        let t = std::thread::spawn(move || {
            let start = std::time::Instant::now();
            wb.wait(Duration::from_secs(5), || b.ready(false));
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        abort.abort(Error::aborted("stop"));
        assert!(t.join().unwrap() < Duration::from_secs(2));
    }

    #[test]
    fn single_copy_frames_are_read_from_the_writers_memory_and_acknowledged() {
        let (mut a, mut b, _, _) = pair("t-remote");
        // The probe at set-up read the other domain's nonce (same process here).
        assert_eq!(a.single_copy_min(), Some(64));
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
        let ticket = a.remote_sent();
        assert_eq!(a.remote_acked(), 0);
        let mut got = vec![0u8; 1000];
        assert_eq!(b.read_remote(payload.as_ptr() as u64, &mut got).unwrap(), 1000);
        assert_eq!(got, payload);
        b.finish_remote().unwrap();
        assert_eq!(a.remote_acked(), ticket);
        // A frame the writer abandoned fails the reader, even if it read.
        a.remote_sent();
        a.abandon_remote();
        b.read_remote(payload.as_ptr() as u64, &mut got).unwrap();
        assert_eq!(b.finish_remote().unwrap_err().kind(), std::io::ErrorKind::ConnectionAborted);
        // A bad address is an error, not a crash.
        assert!(b.read_remote(8, &mut got).is_err());
    }

    #[test]
    fn single_copy_is_refused_unless_the_reader_proved_it_can() {
        // Rank 1 turned single copy off: it never tells rank 0 it may.
        let (a, b, _, _) = super::test_pair_with("t-nocma", [Some(64), None]);
        assert_eq!(a.single_copy_min(), None, "rank 1 did not allow it");
        assert_eq!(b.single_copy_min(), None, "rank 1 does not use it");
        let mut got = [0u8; 8];
        assert_eq!(b.read_remote(got.as_ptr() as u64, &mut got).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn corrupt_positions_are_errors_not_wild_reads() {
        let (mut a, mut b, _, _) = pair("t-bad");
        b.domain.own.ring_header(b.rx).head.store(u64::MAX / 2, Ordering::Release);
        assert_eq!(b.try_read(&mut [0u8; 8]).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        a.peer_map().ring_header(a.tx).tail.store(7, Ordering::Release);
        assert!(a.try_write(&[IoSlice::new(b"x")]).is_err());
    }

    #[test]
    fn stale_segments_of_dead_processes_are_removed() {
        let name = "/rl-t-stale-0-999999999";
        let fd = rustix::shm::open(name, OFlags::CREATE | OFlags::RDWR, Mode::RUSR | Mode::WUSR).unwrap();
        drop(fd);
        assert!(std::path::Path::new("/dev/shm/rl-t-stale-0-999999999").exists());
        remove_stale_segments();
        assert!(!std::path::Path::new("/dev/shm/rl-t-stale-0-999999999").exists());
    }
}
