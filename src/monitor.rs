//! The monitor thread: heartbeat, watchdog, and the job's news.
//!
//! One thread per communicator, holding the rank's member connection to the
//! store (the connection whose loss the store reads as the rank's death). It
//! needs neither the caller's thread nor Python's GIL, so a rank stuck in its
//! own code still beats, and a stopped process stops beating. Every tick it:
//! - sends a heartbeat carrying this rank's progress (twice a second;
//!   [`crate::heartbeat`] says when, and when a dump is requested);
//! - waits briefly on the store for news: another rank's abort, or a rank
//!   that left or vanished while this rank waits for it, which aborts the
//!   running collective at once instead of at the timeout. The store sends
//!   only what changed since the last answer ([`StoreClient::changes`]:
//!   departures and the abort), so a quiet job costs the store a few small
//!   answers per rank and second, and an event one short answer per rank,
//!   whatever the world size;
//! - checks the running operation against the stall warning and the hard
//!   timeout;
//! - polls the pidfds of the peers on its host ([`crate::pidwatch`]), so a
//!   dead same-host peer is named even when the store died with it.

use crate::agreement::AbortRecord;
use crate::engine::Shared;
use crate::heartbeat::Heartbeat;
use crate::log;
use crate::pidwatch::PidWatch;
use crate::watchdog::{Action, Watchdog};
use parking_lot::{Condvar, Mutex};
use ringleader_core::error::fmt_ranks;
use ringleader_core::{Config, Error, Fingerprint, Rank};
use ringleader_diag::Beat;
use ringleader_store::{keys, JobStatus, Presence, StoreClient};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TICK: Duration = Duration::from_millis(100);

/// How long the store may leave this rank's waits for news unanswered
/// before the rank concludes it is gone (a closed connection says so at
/// once). A single late answer is not enough: on a host with hundreds of
/// ranks per core pair, a healthy store thread answered after more than
/// the client's 2 s grace, and a rank that then dropped the store blamed
/// rank 0 (its host) for a failure elsewhere.
const STORE_PATIENCE: Duration = Duration::from_secs(10);

/// Largest world in which a stall warning reads every rank's heartbeat
/// (the whole status) to say who has not entered the operation: every
/// rank warns at about the same time, so the store sends the status
/// world-size times.
const STALL_STATUS_MAX_WORLD: usize = 1024;

/// A connected rank whose last heartbeat is this old is silent (the store
/// pushes it after its own `silent_after`, 3 s by default).
const SILENT_AFTER: Duration = Duration::from_secs(3);

/// The job after the store's changes since `view` (from generation 0, an
/// empty view, when there is none yet: the departures so far, not every
/// rank), waiting up to `wait` for the first change; this communicator's
/// ranks only.
fn catch_up(
    store: &mut StoreClient,
    view: Option<JobStatus>,
    world: usize,
    wait: Duration,
) -> ringleader_core::Result<JobStatus> {
    let (mut view, mut wait) = match view {
        Some(v) => (v, wait),
        None => (JobStatus::default(), Duration::ZERO),
    };
    loop {
        let mut changes = store.changes(view.generation, wait)?;
        changes.ranks.retain(|r| r.rank < world);
        let more = changes.more;
        view.apply(changes);
        if !more {
            return Ok(view);
        }
        wait = Duration::ZERO;
    }
}

/// Stops the monitor.
#[derive(Debug, Default)]
pub(crate) struct Stop {
    flag: Mutex<bool>,
    cv: Condvar,
}

impl Stop {
    pub(crate) fn stop(&self) {
        *self.flag.lock() = true;
        self.cv.notify_all();
    }

    fn stopped(&self) -> bool {
        *self.flag.lock()
    }

    /// Sleeps up to `d`; returns whether stopped.
    fn sleep(&self, d: Duration) -> bool {
        let mut g = self.flag.lock();
        if !*g {
            self.cv.wait_for(&mut g, d);
        }
        *g
    }
}

/// The global ranks of this communicator's ranks `rs`.
fn globals(cfg: &Config, rs: &[Rank]) -> Vec<Rank> {
    rs.iter().map(|&r| cfg.global(r)).collect()
}

struct Monitor {
    shared: Arc<Shared>,
    /// Raised by SIGUSR1: write a dump.
    sigusr1: Arc<std::sync::atomic::AtomicBool>,
    /// Raised by SIGINT when `interrupt_on_sigint` is on.
    sigint: Arc<std::sync::atomic::AtomicBool>,
    signal_ids: Vec<signal_hook::SigId>,
    store: Option<StoreClient>,
    stop: Arc<Stop>,
    beat: Heartbeat,
    /// The ranks that left or vanished, and the abort record, as the
    /// store's changes built them (this communicator's ranks only; a rank
    /// not in it is connected). Heartbeats in it are as of each departure.
    last_status: Option<JobStatus>,
    published: bool,
    dog: Watchdog,
    /// The ranks the last stall warning named as late.
    late: Vec<Rank>,
    /// The ranks this rank warned of as silent (the store pushed that they
    /// stopped heartbeating while this rank waited for them).
    silent: Vec<Rank>,
    arrivals: crate::arrivals::ArrivalWatch,
    pids: PidWatch,
    /// Since when the store has left this rank's waits unanswered.
    store_slow_since: Option<Instant>,
    /// The capture of this process's stacks after the job failed, running
    /// on a thread of its own (see [`Monitor::news`]).
    capturing: Option<JoinHandle<Option<Arc<ringleader_diag::stacks::Stacks>>>>,
}

/// Starts the monitor thread.
pub(crate) fn spawn(shared: Arc<Shared>, store: StoreClient, pids: PidWatch, stop: Arc<Stop>) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(format!("ringleader-monitor-{}", shared.rank))
        .spawn(move || {
            let sigusr1 = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let sigint = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut signal_ids: Vec<_> =
                signal_hook::flag::register(signal_hook::consts::SIGUSR1, sigusr1.clone()).into_iter().collect();
            if shared.cfg.interrupt_on_sigint {
                // Registered handlers run beside the process's own (Python's
                // KeyboardInterrupt still happens), they do not replace it.
                signal_ids.extend(signal_hook::flag::register(signal_hook::consts::SIGINT, sigint.clone()));
            }
            let stall_warn = shared.cfg.stall_warn;
            Monitor {
                shared,
                sigusr1,
                sigint,
                signal_ids,
                store: Some(store),
                stop,
                beat: Heartbeat::default(),
                last_status: None,
                published: false,
                dog: Watchdog::new(stall_warn),
                late: Vec::new(),
                silent: Vec::new(),
                arrivals: Default::default(),
                pids,
                store_slow_since: None,
                capturing: None,
            }
            .run()
        })
        .expect("spawning the monitor thread")
}

impl Monitor {
    fn run(mut self) {
        // A few round trips to the store, once, off the init path (a
        // 16,000-rank job would otherwise queue 64,000 of them at the store
        // before its first collective): what lines up the timelines of
        // several hosts.
        if let Some(store) = self.store.as_mut() {
            if let Ok(c) = store.clock_offset(4) {
                let _ = self.shared.clock.set(c);
            }
        }
        while !self.stop.stopped() {
            if self.store.is_some() {
                self.heartbeat();
                self.poll_store();
                if let Some(store) = self.store.as_mut() {
                    self.arrivals.tick(&self.shared, store);
                }
            } else if self.stop.sleep(TICK) {
                break;
            }
            self.publish_when_captured();
            self.peers_ended();
            self.watchdog();
            self.interrupt();
            if self.sigusr1.swap(false, Ordering::AcqRel) {
                if let Some(p) = self.shared.write_dump(None, None) {
                    log::warn(&self.shared.cfg, &format!("wrote the flight recorder dump {} on SIGUSR1", p.display()));
                }
            }
        }
        for id in self.signal_ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
        if let Some(mut store) = self.store.take() {
            // Last words: the final progress, then a clean goodbye, so the
            // others read "left" rather than "died".
            let _ = store.heartbeat(&self.shared.beat().encode());
            let _ = store.leave();
        }
    }

    fn heartbeat(&mut self) {
        if !self.beat.due(Instant::now()) {
            return;
        }
        let beat = self.shared.beat().encode();
        let Some(store) = self.store.as_mut() else {
            return;
        };
        let r = store.heartbeat(&beat).and_then(|()| store.try_get(keys::DUMP_REQUEST));
        match r {
            Ok(counter) => {
                if let Some(number) = self.beat.dump_requested(counter) {
                    if let Some(p) = self.shared.write_dump(None, None) {
                        let msg = format!("wrote the flight recorder dump {} on request", p.display());
                        log::warn(&self.shared.cfg, &msg);
                    }
                    // The same records, compact, where a tool on any host
                    // reads them (`ringleader status --trace`).
                    let snap = crate::agreement::compact(self.shared.snapshot(None));
                    let view = serde_json::json!({ "request": number, "snapshot": snap });
                    if let Err(e) = store.set(&keys::view(self.shared.rank), view.to_string().as_bytes()) {
                        self.store_lost(e);
                    }
                }
            }
            Err(e) => self.store_lost(e),
        }
    }

    fn poll_store(&mut self) {
        let Some(store) = self.store.as_mut() else {
            return;
        };
        // The view is a few departures: cloned, so that a lost store
        // still finds what it last said (store_lost reads it).
        match catch_up(store, self.last_status.clone(), self.shared.world, TICK) {
            Ok(status) => {
                self.store_slow_since = None;
                self.news(&status);
                if !self.shared.abort.is_aborted() {
                    self.silence_news(&status);
                }
                self.last_status = Some(status);
            }
            Err(e @ Error::StoreTimeout { waited, .. }) => {
                let since = *self.store_slow_since.get_or_insert_with(|| Instant::now() - waited);
                if since.elapsed() >= STORE_PATIENCE {
                    self.store_lost(e);
                } else {
                    tracing::debug!(rank = self.shared.rank, "the store is slow to answer: {e}");
                }
            }
            Err(e) => self.store_lost(e),
        }
    }

    /// Publishes this rank's snapshot once the stacks [`Monitor::news`]
    /// asked for are captured.
    fn publish_when_captured(&mut self) {
        if !self.capturing.as_ref().is_some_and(JoinHandle::is_finished) {
            return;
        }
        let stacks = self.capturing.take().and_then(|h| h.join().ok()).flatten();
        self.publish(stacks);
    }

    /// Publishes this rank's position (and `stacks`) as its snapshot,
    /// unless a failing call published one first.
    fn publish(&mut self, stacks: Option<Arc<ringleader_diag::stacks::Stacks>>) {
        self.published = true;
        let sh = &self.shared;
        let mut snap = crate::agreement::compact(sh.snapshot(None));
        snap.stacks = stacks.as_ref().map(|s| s.compact());
        if let Some(store) = self.store.as_mut() {
            let _ = store.compare_set(&keys::snapshot(sh.rank), None, snap.to_json().as_bytes());
        }
        // Its dump, with the whole stacks, when it is outside any
        // collective: such a rank may never make another call that would
        // write one, and the launcher ends it soon after the verdict (a
        // rank inside one writes its dump, with the verdict, as that call
        // fails).
        if stacks.is_some() && !sh.failure.is_set() && sh.current.is_idle() {
            let _ = sh.write_dump(None, None);
        }
    }

    /// Reacts to the job's events.
    fn news(&mut self, status: &JobStatus) {
        let sh = &self.shared;
        if let Some(raw) = &status.abort {
            if !sh.abort.is_aborted() {
                let reason = match serde_json::from_slice::<AbortRecord>(raw) {
                    Ok(r) => format!("rank {} failed: {}", sh.cfg.global(r.rank), r.observation.message),
                    Err(_) => "another rank aborted the job".to_string(),
                };
                sh.abort.abort(Error::aborted(reason));
            }
            // A rank inside a collective publishes from its failing call,
            // which the abort ends at once; capturing its stacks here too
            // would only delay that call (captures run one at a time).
            let outside = sh.current.is_idle();
            if !self.published && self.capturing.is_none() && outside {
                // Idle ranks too must say where they are, with where their
                // threads are (a rank outside any collective is often the
                // culprit: the verdict shows its own line from these
                // stacks). Naming the native frames' source lines reads the
                // binary's debug information, which took seconds per rank
                // with 32 ranks on 2 cores: on this thread it stopped the
                // heartbeats, and the verdict called the ranks stalled. So
                // the capture runs beside it, and the snapshot goes out
                // when it is done (`publish_when_captured`).
                let shared = self.shared.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("ringleader-stacks-{}", sh.rank))
                    .spawn(move || shared.failure_stacks());
                match spawned {
                    Ok(h) => self.capturing = Some(h),
                    Err(_) => self.publish(None),
                }
            }
            return;
        }
        self.p2p_news(status);
        let Some((seq, fp)) = sh.current.get() else {
            return;
        };
        for r in &status.ranks {
            if r.rank == sh.rank || r.liveness == Presence::Connected {
                continue;
            }
            let beat = Beat::decode(&r.heartbeat);
            if seq > 0 && beat.as_ref().is_some_and(|b| b.last_completed >= seq) {
                continue;
            }
            let reason = match r.liveness {
                Presence::Left => {
                    Error::PeerLeft { peer: r.rank, op: fp.op, seq, their_seq: beat.map_or(0, |b| b.last_started) }
                }
                _ => Error::PeerLost {
                    peer: r.rank,
                    op: fp.op,
                    seq,
                    detail: format!("its process ({} pid {}) ended without leaving the job", r.host, r.pid),
                },
            };
            sh.abort.abort(reason);
            return;
        }
    }

    /// Warns, once per episode, of a rank this one waits for that the store
    /// says stopped heartbeating while connected: a stopped (SIGSTOP, a
    /// debugger) or frozen process, named long before the watchdog's
    /// timeout, which still decides. Only the ranks that wait for it warn.
    fn silence_news(&mut self, status: &JobStatus) {
        let sh = &self.shared;
        for r in &status.ranks {
            if r.rank == sh.rank || r.liveness != Presence::Connected {
                continue;
            }
            let silent = r.heartbeat_age.is_some_and(|a| a >= SILENT_AFTER);
            let warned = self.silent.contains(&r.rank);
            if silent && !warned && sh.awaited.contains(r.rank) {
                self.silent.push(r.rank);
                let age = r.heartbeat_age.unwrap_or_default().as_secs_f64();
                let running = sh.current.get().map_or(String::new(), |(seq, fp)| format!(" in {} #{seq}", fp.op));
                log::warn(
                    &sh.cfg,
                    &format!(
                        "rank {} ({} pid {}) has sent no heartbeat for {age:.1} s while this rank waits for it{running}:                          stopped (SIGSTOP, a debugger) or frozen? (the collective's timeout, {:.0} s, decides)",
                        sh.cfg.global(r.rank),
                        r.host,
                        r.pid,
                        sh.cfg.timeout.as_secs_f64()
                    ),
                );
            } else if !silent && warned {
                self.silent.retain(|&x| x != r.rank);
            }
        }
    }

    /// Same-host peers whose process ended: abort an operation that needs
    /// one of them, unless the store says it left cleanly (a peer exits
    /// after it leaves; the store's news covers a departure).
    fn peers_ended(&mut self) {
        let ended = self.pids.ended();
        let sh = self.shared.clone();
        if !ended.is_empty() {
            sh.ended.lock().extend(&ended);
            // A fresh view: a peer that left cleanly exits right after.
            if let Some(store) = self.store.as_mut() {
                let view = self.last_status.clone();
                if let Ok(status) = catch_up(store, view, sh.world, Duration::ZERO) {
                    self.last_status = Some(status);
                }
            }
        }
        if sh.destroyed.load(Ordering::Relaxed) || sh.abort.is_aborted() {
            return;
        }
        let gone = sh.ended.lock().clone();
        if gone.is_empty() {
            return;
        }
        let running = sh.current.get();
        for r in gone {
            let seen = self.last_status.as_ref().and_then(|s| s.rank(r));
            if seen.is_some_and(|x| x.liveness == Presence::Left) {
                continue;
            }
            let beat = seen.and_then(|x| Beat::decode(&x.heartbeat));
            let (op, seq) = match running {
                // The engine runs collectives only (sends and receives are
                // the lane's, below).
                Some((seq, fp)) => {
                    if seq > 0 && beat.as_ref().is_some_and(|b| b.last_completed >= seq) {
                        continue;
                    }
                    (fp.op, seq)
                }
                _ if sh.p2p.pending.contains(r) => (ringleader_core::OpKind::Recv, 0),
                _ => continue,
            };
            let (host, pid) = sh.peers.get(r).map_or(("?".into(), 0), |p| (p.host.clone(), p.pid));
            sh.abort.abort(Error::PeerLost {
                peer: r,
                op,
                seq,
                detail: format!(
                    "its process ({host} pid {pid}) ended without leaving the job (seen through its pidfd)"
                ),
            });
            return;
        }
    }

    /// A peer that a send or receive waits for left or died: abort.
    fn p2p_news(&self, status: &JobStatus) {
        let sh = &self.shared;
        for r in &status.ranks {
            if !sh.p2p.pending.contains(r.rank) || r.liveness == Presence::Connected {
                continue;
            }
            let how = if r.liveness == Presence::Left { "left the job" } else { "ended without leaving the job" };
            sh.abort.abort(Error::PeerLost {
                peer: r.rank,
                op: ringleader_core::OpKind::Recv,
                seq: 0,
                detail: format!(
                    "its process ({} pid {}) {how} while a send or receive with it was pending",
                    r.host, r.pid
                ),
            });
        }
    }

    /// The store stopped answering. If it lived in rank 0 and a collective
    /// runs, rank 0 is gone; either way hang detection continues locally
    /// (timeouts) but without the store's news.
    fn store_lost(&mut self, e: Error) {
        self.store = None;
        let sh = &self.shared;
        if sh.destroyed.load(Ordering::Relaxed) {
            return;
        }
        let rank0_left =
            self.last_status.as_ref().and_then(|s| s.rank(0)).is_some_and(|r| r.liveness == Presence::Left);
        let running = sh.current.get();
        if let (Some((seq, fp)), true) = (running, sh.store_in_rank0 && sh.rank != 0) {
            let reason = if rank0_left {
                Error::PeerLeft { peer: 0, op: fp.op, seq, their_seq: 0 }
            } else {
                Error::PeerLost {
                    peer: 0,
                    op: fp.op,
                    seq,
                    detail: format!("the store it hosted at {} stopped answering ({e})", sh.store_addr),
                }
            };
            sh.abort.abort(reason);
        } else if !rank0_left {
            log::warn(
                &sh.cfg,
                &format!(
                    "lost the store at {} ({e}); other ranks' failures will now only show as timeouts",
                    sh.store_addr
                ),
            );
        }
    }

    /// Ctrl-C while an operation runs aborts it (an idle rank ignores it:
    /// the process's own handler decides).
    fn interrupt(&mut self) {
        if !self.sigint.swap(false, Ordering::AcqRel) {
            return;
        }
        let sh = &self.shared;
        if let Some((seq, fp)) = sh.current.get() {
            sh.user_aborted.store(true, Ordering::Release);
            sh.abort.abort(Error::aborted(format!("interrupted (SIGINT) in {}", self.label(seq, fp))));
        }
    }

    /// Stall warnings and the hard timeout of the running operation.
    /// Feeds the watchdog the running operation and carries out its action.
    fn watchdog(&mut self) {
        let sh = self.shared.clone();
        let running = sh.current.get().map(|(seq, fp)| {
            let since = sh.fr.progress().running_since.load(Ordering::Relaxed);
            (seq, fp, Duration::from_nanos(ringleader_diag::clock::Reader::new().age_ns(since)))
        });
        let timeout = Duration::from_millis(sh.op_timeout_ms.load(Ordering::Relaxed));
        match self.dog.poll(running, timeout, sh.abort.is_aborted()) {
            Some(Action::Expire { seq, fp, age }) => {
                sh.abort.abort(Error::Timeout { op: fp.op, seq, waited: age, awaited: sh.awaited.ranks() });
            }
            Some(Action::Stall { seq, fp, age, left }) => self.warn_stall(seq, fp, age, left),
            Some(Action::Recovered { seq, fp }) => self.report_completion(seq, fp),
            None => {}
        }
    }

    fn label(&self, seq: u64, fp: Fingerprint) -> String {
        let mut l = Self::op_label(seq, fp);
        if let Some(g) = self.shared.cfg.group.as_ref() {
            l += &format!(" of {g}");
        }
        l
    }

    fn op_label(seq: u64, fp: Fingerprint) -> String {
        if seq == 0 {
            fp.to_string()
        } else {
            format!("{} #{seq}", fp.op)
        }
    }

    fn warn_stall(&mut self, seq: u64, fp: Fingerprint, age: Duration, left: Duration) {
        let sh = &self.shared;
        let awaited = sh.awaited.ranks();
        // Ranks that have not entered it, by the last collective each
        // completed: their current heartbeats, which only the whole status
        // has. Read once per warning, and only while the job is small
        // enough for every rank to read it at once; beyond that the
        // warning names the ranks this one waits for.
        let mut outside: Vec<(u64, Rank)> = Vec::new();
        let fresh = match self.store.as_mut() {
            Some(store) if sh.world <= STALL_STATUS_MAX_WORLD => {
                store.status(None, Duration::ZERO).ok().map(|s| crate::failure::ours(s, sh.world))
            }
            _ => None,
        };
        if let Some(status) = &fresh {
            for r in &status.ranks {
                if r.rank == sh.rank {
                    continue;
                }
                let Some(b) = Beat::decode(&r.heartbeat) else {
                    continue;
                };
                let inside = b.running.as_ref().is_some_and(|x| x.seq == seq);
                if seq > 0 && !inside && b.last_completed < seq {
                    outside.push((b.last_completed, r.rank));
                }
            }
        }
        outside.sort_unstable();
        let mut notes = Vec::new();
        for chunk in outside.chunk_by(|a, b| a.0 == b.0).take(4) {
            let ranks: Vec<Rank> = chunk.iter().map(|&(_, r)| sh.cfg.global(r)).collect();
            let has = if ranks.len() == 1 { "has" } else { "have" };
            notes.push(format!("{} {has} not entered it (last completed #{})", fmt_ranks(&ranks), chunk[0].0));
        }
        self.late = if outside.is_empty() { awaited.clone() } else { outside.iter().map(|&(_, r)| r).collect() };
        let mut msg = format!("[straggler] {} has waited {:.1} s", self.label(seq, fp), age.as_secs_f64());
        if !notes.is_empty() {
            msg += &format!(": {}", notes.join(", "));
        }
        if !awaited.is_empty() {
            msg += &format!("; waiting for data from {}", fmt_ranks(&globals(&sh.cfg, &awaited)));
        }
        msg += &format!(" (timeout in {:.0} s)", left.as_secs_f64());
        log::warn(&sh.cfg, &msg);
    }

    fn report_completion(&self, seq: u64, fp: Fingerprint) {
        let sh = &self.shared;
        if sh.abort.is_aborted() {
            return;
        }
        let who = if self.late.is_empty() {
            String::new()
        } else {
            format!("; {} arrived late", fmt_ranks(&globals(&sh.cfg, &self.late)))
        };
        log::warn(&sh.cfg, &format!("[straggler] {} completed after a stall{who}", self.label(seq, fp)));
    }
}
