//! Whether `/dev/shm` can hold the job's segments, and what a rank leaves
//! behind when it cannot allocate its own (see the module docs).

use super::segment::segment_name;
use super::RING_BYTES;
use ringleader_core::{Error, Result};
use rustix::fd::OwnedFd;

/// Where `shm_open` puts segments.
pub(super) const SHM_DIR: &str = "/dev/shm";
/// What a segment file holds instead of its rings when its owner could
/// not allocate it: this prefix, then the owner's error message.
pub(super) const FAILED_NOTE: &[u8] = b"RLSHM-FAILED\n";

/// `n` bytes as a person reads them (`64.0 MiB`).
pub(super) fn human(n: u64) -> String {
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
pub(super) fn run_prefix(run_id: &str) -> String {
    segment_name(run_id, 0, 0).trim_start_matches('/').rsplitn(3, '-').nth(2).unwrap_or_default().to_string() + "-"
}

/// The error for a `/dev/shm` without room for `need` bytes.
pub(super) fn no_room(size: u64, free: u64, need: u64, ranks: usize, seg: usize, streams: usize) -> Error {
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
pub(super) fn check_room(run_id: &str, ranks: usize, seg: usize, streams: usize) -> Result<()> {
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
pub(super) fn allocate(fd: &OwnedFd, len: usize) -> std::io::Result<()> {
    match rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::empty(), 0, len as u64) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => Ok(rustix::fs::ftruncate(fd, len as u64)?),
        Err(e) => Err(e.into()),
    }
}

/// Leaves `msg` in a segment file whose rings could not be allocated, for
/// the peers waiting for it (best effort: on a full tmpfs even this may not fit).
pub(super) fn leave_note(fd: &OwnedFd, msg: &str) {
    let _ = rustix::fs::ftruncate(fd, 0);
    let mut note = FAILED_NOTE.to_vec();
    note.extend_from_slice(msg.as_bytes());
    let _ = rustix::io::pwrite(fd, &note, 0);
}

pub(super) fn shm_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::invalid("shared memory", format!("{what}: {e} (set RINGLEADER_TRANSPORT=tcp to do without)"))
}
