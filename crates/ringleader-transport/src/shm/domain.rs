//! A rank's shared-memory domain: creating its segment, mapping its local
//! peers' segments, and handing out the links between them.

use super::cross_memory::read_process;
use super::room::{allocate, check_room, human, leave_note, no_room, shm_error, FAILED_NOTE, SHM_DIR};
use super::segment::{cells_per_ring, remove_stale_segments, segment_len, segment_name, Mapping, MAGIC};
use ringleader_core::{AbortSignal, Error, Rank, Result};
use rustix::fs::Mode;
use rustix::shm::OFlags;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Why a peer's segment could not be mapped.
#[derive(Debug)]
pub(super) enum Opened {
    /// Not there yet, or not ready: worth waiting for.
    NotYet(String),
    /// Its owner could not allocate it, and left this message.
    Failed(String),
}

/// This rank's shared-memory state: its own segment and its local peers'.
pub struct Domain {
    pub(super) own: Mapping,
    pub(super) own_name: String,
    /// Local peers' segments, by global rank.
    pub(super) peers: Vec<Option<Mapping>>,
    /// Local ranks in ascending order (this rank included).
    pub(super) local: Vec<Rank>,
    pub(super) rank: Rank,
    pub(super) streams: usize,
    /// The nonce peers read to prove they can reach this process's memory.
    pub(super) _probe: Box<u64>,
    /// Frames from this many bytes on go single-copy (`None`: never).
    pub(super) single_copy: Option<usize>,
}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain").field("rank", &self.rank).field("local", &self.local).finish()
    }
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
        let len = segment_len(rings, cells_per_ring(local.len()));
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
        let len = segment_len((self.local.len() - 1) * self.streams, self.cells());
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
    pub(super) fn try_open(&self, name: &str, len: usize) -> std::result::Result<Mapping, Opened> {
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
    pub(super) fn allow_single_copy(&self, peer: Rank, m: &Mapping) {
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

    /// Fastbox cells per ring in this host's segments.
    pub(super) fn cells(&self) -> usize {
        cells_per_ring(self.local.len())
    }

    /// Index of `peer`'s rings among a segment owner's rings.
    pub(super) fn slot(&self, owner: Rank, peer: Rank, stream: usize) -> usize {
        let others: Vec<Rank> = self.local.iter().copied().filter(|r| *r != owner).collect();
        let i = others.iter().position(|r| *r == peer).expect("peer is local");
        i * self.streams + stream
    }
}

/// A 64-bit value no other process can guess, for the single-copy probe.
pub(super) fn nonce(name: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(name.as_bytes());
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish() | 1
}
