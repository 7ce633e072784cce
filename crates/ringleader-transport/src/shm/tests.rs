//! Segments, rings and single copy between two domains in one process.

use super::domain::*;
use super::room::*;
use super::segment::*;
use super::*;
use ringleader_core::Error;
use rustix::fs::Mode;
use rustix::shm::OFlags;
use std::io::IoSlice;
use std::sync::atomic::Ordering;

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
    let fd = rustix::shm::open(name.as_str(), OFlags::CREATE | OFlags::EXCL | OFlags::RDWR, Mode::RUSR | Mode::WUSR)
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

fn fp() -> ringleader_core::Fingerprint {
    use ringleader_core::{DType, Fingerprint, OpKind};
    Fingerprint::new(OpKind::AllReduce, DType::U8, 9)
}

fn head(tag: u32) -> crate::link::BoxHead {
    crate::link::BoxHead { seq: 5, fingerprint: fp().words(), tag }
}

fn hdr(tag: u32, len: usize) -> crate::frame::FrameHeader {
    crate::frame::FrameHeader::data(5, fp(), tag, len as u64)
}

#[test]
fn fastbox_frames_keep_their_place_among_ring_bytes() {
    let (mut a, mut b, _, _) = pair("t-box-order");
    // Ring bytes, then a fastbox frame, then ring bytes again.
    assert_eq!(a.try_write(&[IoSlice::new(b"first...")]).unwrap(), 8);
    assert!(a.box_send(&head(1), b"box").unwrap());
    assert_eq!(a.try_write(&[IoSlice::new(b"third...")]).unwrap(), 8);
    // The box waits for the ring bytes before it, and they stop at it.
    assert!(!b.box_recv(&mut |_, _| panic!("nothing to take")).unwrap());
    let mut buf = [0u8; 64];
    assert_eq!(b.try_read(&mut buf).unwrap(), 8);
    assert_eq!(&buf[..8], b"first...");
    assert_eq!(b.try_read(&mut buf).unwrap(), 0, "read past a waiting fastbox frame");
    assert!(b.ready(false), "a waiting fastbox frame is something to read");
    let mut got = None;
    assert!(
        b.box_recv(&mut |h, p| got = Some((h.header(p.len()).unwrap(), p.to_vec()))).unwrap(),
        "the fastbox frame is next"
    );
    assert_eq!(got, Some((hdr(1, 3), b"box".to_vec())));
    assert!(!b.box_recv(&mut |_, _| panic!("taken once")).unwrap());
    assert_eq!(b.try_read(&mut buf).unwrap(), 8);
    assert_eq!(&buf[..8], b"third...");
    assert!(!b.ready(false));
}

#[test]
fn a_writer_without_a_free_cell_is_told_so_and_reuses_cells_once_read() {
    let (mut a, mut b, _, _) = pair("t-box-full");
    let payload: Vec<u8> = (0..BOX_PAYLOAD).map(|i| i as u8).collect();
    assert!(!a.box_send(&head(0), &[0; BOX_PAYLOAD + 1]).unwrap(), "too large");
    for tag in 0..CELLS_PER_RING as u32 {
        assert!(a.box_send(&head(tag), &payload).unwrap());
    }
    assert!(!a.box_send(&head(99), b"x").unwrap(), "every cell is taken");
    // Around the cells twice, one frame at a time, every byte intact.
    for tag in 0..3 * CELLS_PER_RING as u32 {
        let mut got = None;
        assert!(b.box_recv(&mut |h, p| got = Some((h.tag, p.to_vec()))).unwrap(), "a frame");
        assert_eq!(got, Some((tag, payload.clone())));
        assert!(a.box_send(&head(tag + CELLS_PER_RING as u32), &payload).unwrap());
    }
}

#[test]
fn corrupt_fastbox_cells_are_errors_not_wild_reads() {
    let (mut a, mut b, _, _) = pair("t-box-bad");
    assert!(a.box_send(&head(0), b"12345678").unwrap());
    let d = b.domain.clone();
    let cell = d.own.cell(b.rings, d.cells(), b.rx, 0);
    cell.len.store(u32::MAX, Ordering::Relaxed);
    assert_eq!(b.box_recv(&mut |_, _| ()).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
    // A position far past the ring's.
    cell.len.store(8, Ordering::Relaxed);
    cell.pos.store(u64::MAX / 2, Ordering::Relaxed);
    assert_eq!(b.box_recv(&mut |_, _| ()).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(b.try_read(&mut [0u8; 8]).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
    // A reader count past what was written.
    a.peer_map().ring_header(a.tx).box_read.store(1000, Ordering::Release);
    for _ in 1..CELLS_PER_RING {
        assert!(a.box_send(&head(0), b"x").unwrap());
    }
    assert_eq!(a.box_send(&head(0), b"x").unwrap_err().kind(), std::io::ErrorKind::InvalidData);
}

#[test]
fn a_rank_moves_off_a_shared_core_and_keeps_its_affinity_mask() {
    use rustix::thread::{sched_getaffinity, CpuSet};
    let (_a, _b, wa, wb) = test_pair("t-move-off");
    // On a thread of its own: the move changes the calling thread only.
    std::thread::spawn(move || {
        let mask = sched_getaffinity(None).unwrap();
        let allowed = (0..CpuSet::MAX_CPU).filter(|&c| mask.is_set(c)).count();
        let here = wa.note_cpu();
        if allowed < 2 {
            assert!(!wa.move_off(here), "nowhere to go, yet it moved");
            eprintln!("skipped the move itself: this thread may run on {allowed} CPU only");
            return;
        }
        // The peer says it runs here too: exactly the case a move is for.
        let peer_cpu = &wb.domain.own.doorbell().cpu;
        peer_cpu.store(here + 1, Ordering::Relaxed);
        assert!(wa.move_off(here), "a second CPU is allowed, yet it did not move");
        // SAFETY: no arguments; -1 only on failure.
        let now = unsafe { libc::sched_getcpu() };
        assert!(now >= 0 && now as u32 != here, "still on CPU {here}");
        assert!(!wa.peer_on(1, now as u32), "the peer is not where it moved");
        // What it published is where it runs, and the mask is as it was.
        assert_eq!(wa.domain.own.doorbell().cpu.load(Ordering::Relaxed), now as u32 + 1);
        let after = sched_getaffinity(None).unwrap();
        assert!((0..CpuSet::MAX_CPU).all(|c| after.is_set(c) == mask.is_set(c)), "the affinity mask changed");
        // Every other allowed CPU taken by ranks of the job: nowhere to go.
        if allowed == 2 {
            peer_cpu.store(here + 1, Ordering::Relaxed);
            assert!(!wa.move_off(now as u32), "both CPUs are taken, yet it moved");
        }
    })
    .join()
    .unwrap();
}

/// Whether every page of `len` bytes from `start` is in this process's
/// page tables (the present bit of `/proc/self/pagemap`).
fn mapped(start: usize, len: usize) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let page = page_size();
    let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
    (start / page..(start + len).div_ceil(page)).all(|p| {
        let mut entry = [0u8; 8];
        f.seek(SeekFrom::Start(p as u64 * 8)).unwrap();
        f.read_exact(&mut entry).unwrap();
        u64::from_ne_bytes(entry) >> 63 == 1
    })
}

/// Rank 0's domain of a 2-rank run named after `what`, with rank 1's
/// segment mapped and no link made yet (both segments already unlinked).
fn peer_mapped(what: &str) -> Domain {
    let abort = AbortSignal::new().unwrap();
    let run = format!("{what}-{}", std::process::id());
    let mut a = Domain::create(&run, 0, 2, &[0, 1], 1, None).unwrap();
    let b = Domain::create(&run, 1, 2, &[0, 1], 1, None).unwrap();
    a.open_peer(1, b.name(), std::time::Instant::now() + Duration::from_secs(1), &abort).unwrap();
    a.unlink();
    b.unlink();
    a
}

#[test]
fn a_links_cells_and_ring_are_mapped_in_before_its_first_frame() {
    // Left to fault in, each of a link's first small frames (one per cell)
    // took a page fault on each side (its cell is longer than a page).
    let a = peer_mapped("mapped");
    let (rings, tx, rx) = (1, a.slot(1, 0, 0), a.slot(0, 1, 0));
    let peer = a.peers[1].as_ref().unwrap();
    let spans = [
        (peer.cell(rings, a.cells(), tx, 0) as *const Cell as usize, a.cells() * CELL_BYTES),
        (a.own.cell(rings, a.cells(), rx, 0) as *const Cell as usize, a.cells() * CELL_BYTES),
        (peer.ring_data(rings, tx) as usize, RING_BYTES),
        (a.own.ring_data(rings, rx) as usize, RING_BYTES),
    ];
    // Nothing has touched them in this process yet (the test can fail).
    for (start, len) in spans {
        assert!(!mapped(start, len), "{len} bytes at {start:#x} mapped before the link was made");
    }
    let (_links, _waiter) = a.links();
    for (start, len) in spans {
        assert!(mapped(start, len), "{len} bytes at {start:#x} not mapped once the link was made");
    }
}

#[test]
fn cells_are_mapped_in_by_write_faults_where_the_kernel_cannot_populate() {
    let a = peer_mapped("faulted");
    let n = a.cells();
    let cells = a.peers[1].as_ref().unwrap().cell(1, n, a.slot(1, 0, 0), 0);
    let first = cells as *const Cell as usize;
    // A stamp written before stays: the fault adds nothing.
    cells.stamp.store(7, Ordering::Relaxed);
    let page = page_size();
    assert!(!mapped(first + page, n * CELL_BYTES - page));
    write_fault(cells, n);
    assert!(mapped(first, n * CELL_BYTES));
    assert_eq!(cells.stamp.load(Ordering::Relaxed), 7);
}

#[test]
fn hosts_of_up_to_four_ranks_get_deep_cells_and_larger_hosts_shallow_ones() {
    use super::segment::{cells_per_ring, segment_len, CELLS_DEEP, CELLS_SHALLOW, DEEP_UP_TO};
    const { assert!(CELLS_DEEP > CELLS_SHALLOW) };
    for local in 1..=16 {
        let want = if local <= DEEP_UP_TO { CELLS_DEEP } else { CELLS_SHALLOW };
        assert_eq!(cells_per_ring(local), want, "{local} ranks");
    }
    // Segments are made and mapped at that depth, on every rank alike: a
    // host of 5 ranks, the first with shallow cells, every link working.
    let run = format!("t-depth-{}", std::process::id());
    let local: Vec<ringleader_core::Rank> = (0..5).collect();
    let abort = AbortSignal::new().unwrap();
    let mut doms: Vec<Domain> = local.iter().map(|&r| Domain::create(&run, r, 5, &local, 1, None).unwrap()).collect();
    let names: Vec<String> = doms.iter().map(|d| d.name().to_string()).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for (r, d) in doms.iter_mut().enumerate() {
        assert_eq!(d.cells(), CELLS_SHALLOW);
        assert_eq!(d.own.len, segment_len(4, CELLS_SHALLOW));
        for (p, name) in names.iter().enumerate() {
            if p != r {
                d.open_peer(p, name, deadline, &abort).unwrap();
            }
        }
    }
    for d in &doms {
        d.unlink();
    }
    let (mut links0, _w0) = doms.remove(0).links();
    let (mut links1, _w1) = doms.remove(0).links();
    assert_eq!((links0[0].0, links1[0].0), (1, 0));
    let (a, b) = (&mut links0[0].1[0], &mut links1[0].1[0]);
    // Around the shallow cells twice.
    for tag in 0..2 * CELLS_SHALLOW as u32 {
        assert!(a.box_send(&head(tag), b"depth").unwrap());
        let mut got = None;
        assert!(b.box_recv(&mut |h, p| got = Some((h.tag, p.to_vec()))).unwrap());
        assert_eq!(got, Some((tag, b"depth".to_vec())));
    }
}
