//! The verdict engine: every rank's snapshot and the store's view of the job
//! in, one [`Diagnosis`] out. A pure function, so the watchdog at run time and
//! `ringleader analyze` afterwards reach the same verdict from the same data,
//! and every cause of docs/DESIGN.md §1 is unit-tested with synthetic snapshots.
//!
//! The questions are asked in order of how sure the answer is:
//! 1. did ranks call the collective with different arguments (`mismatch`)?
//! 2. did a rank's process end without leaving (`peer-died`)?
//! 3. did a rank leave cleanly before the collective (`missed-collective`)?
//! 4. do ranks blocked in send/recv wait for each other in a cycle, or for
//!    a rank that is elsewhere (`missed-collective`, see [`crate::deadlock`])?
//! 5. did a rank's process stop answering (`peer-stalled`)?
//! 6. is a live rank simply not in the collective (`missed-collective`)?
//! 7. otherwise, everyone is in it and nothing moves (`timeout`).
//!
//! In a sub-group (see [`ringleader_core::group`]) the snapshots and the
//! store speak in group ranks; the verdict names global ranks, in its text
//! and in its culprits, and says which group the collective belongs to.

use crate::deadlock::{self, Finding, Wait};
use crate::snapshot::{Beat, Liveness, Observation, P2pWait, PeerView, Running, Snapshot};
use ringleader_core::error::fmt_ranks;
use ringleader_core::{Diagnosis, ErrorKind, Fingerprint, Group, OpKind, Rank};

/// Everything known about a failure.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    /// The world size.
    pub world_size: usize,
    /// The store's view of each rank (missing ranks count as unknown).
    pub peers: Vec<PeerView>,
    /// The snapshots that arrived.
    pub snapshots: Vec<Snapshot>,
    /// A heartbeat older than this means the process stopped answering.
    pub stale_after_ms: u64,
    /// The sub-group the communicator spans, if it is one: ranks in
    /// `peers` and `snapshots` are group ranks, the verdict names global ones.
    pub group: Option<Group>,
}

impl Evidence {
    /// The global rank of group rank `r`.
    fn global(&self, r: Rank) -> Rank {
        ringleader_core::group::global(self.group.as_ref(), r)
    }
}

/// What is known of one rank, merged from its snapshot and the store.
#[derive(Debug)]
struct Facts<'a> {
    /// The global rank (what the verdict names).
    rank: Rank,
    /// The sub-group, to name the ranks this rank's records mention.
    group: Option<&'a Group>,
    host: Option<&'a str>,
    pid: Option<u32>,
    liveness: Liveness,
    heartbeat_age_ms: Option<u64>,
    exit: Option<&'a str>,
    snap: Option<&'a Snapshot>,
    beat: Option<&'a Beat>,
}

impl<'a> Facts<'a> {
    fn gather(ev: &'a Evidence) -> Vec<Facts<'a>> {
        // By rank, the first of each (analyze passes the newest first).
        let mut peers: Vec<Option<&PeerView>> = vec![None; ev.world_size];
        for p in &ev.peers {
            if let Some(slot) = peers.get_mut(p.rank).filter(|s| s.is_none()) {
                *slot = Some(p);
            }
        }
        let mut snaps: Vec<Option<&Snapshot>> = vec![None; ev.world_size];
        for sn in &ev.snapshots {
            if let Some(slot) = snaps.get_mut(sn.rank).filter(|s| s.is_none()) {
                *slot = Some(sn);
            }
        }
        (0..ev.world_size)
            .map(|rank| {
                let (peer, snap) = (peers[rank], snaps[rank]);
                Facts {
                    rank: ev.global(rank),
                    group: ev.group.as_ref(),
                    host: snap.map(|s| s.host.as_str()).or(peer.and_then(|p| p.host.as_deref())),
                    pid: snap.map(|s| s.pid).or(peer.and_then(|p| p.pid)),
                    liveness: peer.map_or(Liveness::Unknown, |p| p.liveness),
                    heartbeat_age_ms: peer.and_then(|p| p.heartbeat_age_ms),
                    exit: peer.and_then(|p| p.exit.as_deref()),
                    snap,
                    beat: snap.map(|s| &s.beat).or(peer.and_then(|p| p.beat.as_ref())),
                }
            })
            .collect()
    }

    /// `rank 1 (node-a pid 123)`.
    fn who(&self) -> String {
        match (self.host, self.pid) {
            (Some(h), Some(p)) => format!("rank {} ({h} pid {p})", self.rank),
            (None, Some(p)) => format!("rank {} (pid {p})", self.rank),
            _ => format!("rank {}", self.rank),
        }
    }

    /// The global rank of a group rank this rank's records mention.
    fn global(&self, r: Rank) -> Rank {
        ringleader_core::group::global(self.group, r)
    }

    fn last_completed(&self) -> u64 {
        self.beat.map_or(0, |b| b.last_completed)
    }

    /// The collective this rank runs, as far as its report can be believed:
    /// a report naming a collective that the same report counts as
    /// completed was read while the rank moved on (its counters and its
    /// running entry are read apart), so it says nothing of where it is.
    fn running(&self) -> Option<&Running> {
        let b = self.beat?;
        b.running.as_ref().filter(|r| r.seq == 0 || r.seq > b.last_completed)
    }

    /// What is known of this rank comes from its last heartbeat alone: its
    /// process ended, so it left no snapshot, and it may have gone on for
    /// up to a heartbeat's interval after that report.
    fn only_reported(&self) -> bool {
        self.snap.is_none() && self.died() && self.beat.is_some()
    }

    fn observation(&self) -> Option<&Observation> {
        self.snap.and_then(|s| s.observation.as_ref())
    }

    fn fingerprint_of(&self, seq: u64) -> Option<Fingerprint> {
        if let Some(s) = self.snap {
            return s.fingerprint_of(seq);
        }
        self.running().filter(|r| r.seq == seq).map(|r| r.fingerprint)
    }

    fn died(&self) -> bool {
        self.liveness == Liveness::Vanished || self.exit.is_some_and(|e| !e.contains("code 0"))
    }

    fn left(&self) -> bool {
        !self.died()
            && (self.liveness == Liveness::Left || self.exit.is_some() || self.snap.is_some_and(|s| s.destroyed))
    }

    fn stale(&self, limit_ms: u64) -> bool {
        self.liveness == Liveness::Alive && self.heartbeat_age_ms.is_some_and(|a| a > limit_ms)
    }

    /// Whether this rank finished collective `seq`, as far as we know.
    fn completed(&self, seq: u64) -> bool {
        self.last_completed() >= seq
    }

    /// One line: where the rank is (`all` lends labels for collectives
    /// this rank has no record of).
    fn position(&self, all: &[Facts<'_>]) -> String {
        format!("{}: {}", self.who(), describe(&[self], all))
    }

    /// What ranks in the same state share: everything [`describe`] says
    /// but the numbers that differ from rank to rank (ages, durations, whom
    /// each waits for in a ring).
    fn state_key(&self) -> StateKey<'a> {
        let liveness = match self.liveness {
            Liveness::Alive => 0,
            Liveness::Left => 1,
            Liveness::Vanished => 2,
            Liveness::Unknown => 3,
        };
        let running = self.running().map(|r| (r.seq, r.fingerprint));
        (liveness, self.exit, running, (self.beat.is_some(), self.only_reported()), self.last_completed(), self.p2p())
    }

    /// Where this rank's code called collective `seq`, if it said: from its
    /// flight record, else from its heartbeat.
    fn site_of(&self, seq: u64) -> Option<&'a str> {
        if let Some(s) = self.snap {
            let e = s.entries.iter().rev().find(|e| e.collective_seq_id == seq && !e.fingerprint.op.is_p2p());
            if let Some(site) = e.and_then(|e| e.call_site.as_deref()) {
                return Some(site);
            }
        }
        let b = self.beat?;
        match b.running.as_ref() {
            Some(r) if r.seq == seq => b.running_site.as_deref(),
            _ if b.last_completed == seq => b.last_completed_site.as_deref(),
            _ => None,
        }
    }

    /// Where this rank's code called send or receive `op` number `seq`
    /// with global rank `other`, if its flight record says.
    fn p2p_site_of(&self, op: OpKind, other: Rank, seq: u64) -> Option<&'a str> {
        let e = self.snap?.entries.iter().rev().find(|e| {
            e.fingerprint.op == op
                && e.p2p_seq_id == seq
                && e.fingerprint.root.is_some_and(|r| self.global(r as Rank) == other)
        });
        e?.call_site.as_deref()
    }

    /// The sends and receives this rank waits in.
    fn p2p(&self) -> &'a [P2pWait] {
        self.beat.map_or(&[], |b| b.p2p.as_slice())
    }
}

/// Where the ranks of `group` are, in one line (ranks in one state: see
/// [`Facts::state_key`]); for more than one rank, ages and durations as
/// ranges and the peers waited for as one set.
fn describe(group: &[&Facts<'_>], all: &[Facts<'_>]) -> String {
    let f = group[0];
    let many = group.len() > 1;
    let secs = |v: &mut Vec<u64>| {
        v.sort_unstable();
        let (lo, hi) = (v[0] as f64 / 1000.0, v[v.len() - 1] as f64 / 1000.0);
        if (hi - lo) < 0.05 {
            format!("{hi:.1} s")
        } else {
            format!("{lo:.1}-{hi:.1} s")
        }
    };
    let mut parts = Vec::new();
    match f.liveness {
        Liveness::Vanished if many => parts.push("their processes ended without leaving the job".to_string()),
        Liveness::Vanished => parts.push("its process ended without leaving the job".to_string()),
        Liveness::Left => parts.push("left the job cleanly".to_string()),
        Liveness::Alive => {
            let mut ages: Vec<u64> = group.iter().filter_map(|f| f.heartbeat_age_ms).collect();
            if !ages.is_empty() {
                parts.push(format!("alive, last heartbeat {} ago", secs(&mut ages)));
            }
        }
        Liveness::Unknown => {}
    }
    if let Some(e) = f.exit {
        parts.push(e.to_string());
    }
    match f.running() {
        Some(r) if r.seq > 0 || r.fingerprint.op.is_p2p() => {
            let label = if r.seq > 0 { format!("{} #{}", r.fingerprint.op, r.seq) } else { r.fingerprint.to_string() };
            let mut times: Vec<u64> = group.iter().filter_map(|f| f.running().map(|r| r.running_ms)).collect();
            // A dead rank's heartbeat says where it was, not where it died.
            let reported = f.only_reported();
            let mut s = if reported { format!("last reported in {label}") } else { format!("in {label}") };
            if let Some(site) = one_site(group, |f| f.site_of(r.seq).filter(|_| r.seq > 0)) {
                s += &format!(" called at {site}");
            }
            if !reported {
                s += &format!(" for {}", secs(&mut times));
            }
            let awaited: Vec<Rank> = group
                .iter()
                .filter_map(|f| f.running().map(|r| (f, r)))
                .flat_map(|(f, r)| r.awaited_peers.iter().map(|&p| f.global(p)))
                .collect();
            if !awaited.is_empty() {
                s += &format!(", waiting for {}", fmt_ranks(&awaited));
            }
            parts.push(s);
        }
        _ if f.beat.is_some() && f.p2p().is_empty() => parts.push("outside any collective".into()),
        _ => {}
    }
    if !f.p2p().is_empty() {
        let waits: Vec<String> = f
            .p2p()
            .iter()
            .map(|w| {
                let dir = if w.op == OpKind::Send { "to" } else { "from" };
                format!("{} #{} ({dir} rank {})", w.op, w.seq, f.global(w.peer))
            })
            .collect();
        parts.push(format!("waits in {}", waits.join(", ")));
    }
    match f.last_completed() {
        0 if f.beat.is_some() => parts.push("has completed no collective".into()),
        0 => parts.push("no progress report".into()),
        n => {
            let mut s = format!("last completed {}", label_for(all, f, n));
            if let Some(site) = one_site(group, |f| f.site_of(n)) {
                s += &format!(" at {site}");
            }
            parts.push(s)
        }
    }
    parts.join("; ")
}

/// The call site every rank of `group` reports (by `site`), if they agree.
fn one_site<'a>(group: &[&Facts<'a>], site: impl Fn(&Facts<'a>) -> Option<&'a str>) -> Option<&'a str> {
    let first = site(group[0])?;
    group.iter().all(|f| site(f) == Some(first)).then_some(first)
}

/// ` (called at train.py:24)` when the ranks in collective `seq` agree on
/// where their code called it; empty otherwise.
fn called_at(facts: &[Facts<'_>], waiters: &[Rank], seq: u64) -> String {
    let sites: Vec<&str> = facts.iter().filter(|f| waiters.contains(&f.rank)).filter_map(|f| f.site_of(seq)).collect();
    match sites.first() {
        Some(s) if sites.iter().all(|t| t == s) => format!(" (called at {s})"),
        _ => String::new(),
    }
}

/// At most this many ranks of a list are named with host and pid.
const NAMED: usize = 4;
/// At most this many groups of ranks make a verdict's details.
const GROUPS_SHOWN: usize = 8;

/// Names ranks for a headline: the first few with host and pid, the rest as
/// ranges (`rank 3 (node-b pid 12), rank 7 (...), and ranks 9-63 (55 ranks)`).
fn names(fs: &[&Facts<'_>]) -> String {
    names_with(fs, |f| f.who())
}

/// [`names`], with `who` naming each of the first few.
fn names_with(fs: &[&Facts<'_>], who: impl Fn(&Facts<'_>) -> String) -> String {
    let mut parts: Vec<String> = fs.iter().take(NAMED).map(|f| who(f)).collect();
    if fs.len() > NAMED {
        let rest: Vec<Rank> = fs[NAMED..].iter().map(|f| f.rank).collect();
        parts.push(format!("and {}", fmt_ranks(&rest)));
    }
    parts.join(", ")
}

/// Groups `items` by `key`, keeping the order in which keys first appear.
fn group_by<'f, 'a, K: PartialEq>(
    items: &[&'f Facts<'a>],
    key: impl Fn(&Facts<'a>) -> K,
) -> Vec<(K, Vec<&'f Facts<'a>>)> {
    let mut groups: Vec<(K, Vec<&'f Facts<'a>>)> = Vec::new();
    for &f in items {
        let k = key(f);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(f),
            None => groups.push((k, vec![f])),
        }
    }
    groups
}

/// Joins clauses with `; `, at most `max`, then how many ranks the rest name.
fn clauses(mut items: Vec<(String, usize)>, max: usize) -> String {
    let rest: usize = items.iter().skip(max).map(|(_, n)| n).sum();
    items.truncate(max);
    let mut s = items.into_iter().map(|(c, _)| c).collect::<Vec<_>>().join("; ");
    if rest > 0 {
        s += &format!("; and {rest} more rank{} (see the dumps)", if rest == 1 { "" } else { "s" });
    }
    s
}

/// The details of a verdict: ranks in one state as one line, culprits
/// first, at most [`GROUPS_SHOWN`] lines; the per-rank table is in the
/// dumps and `ringleader analyze`.
fn details(facts: &[Facts<'_>], culprits: &[Rank]) -> Vec<String> {
    let all: Vec<&Facts<'_>> = facts.iter().collect();
    let mut sorted = culprits.to_vec();
    sorted.sort_unstable();
    let mut groups = group_by(&all, |f| (sorted.binary_search(&f.rank).is_ok(), f.state_key()));
    // Culprits first, then by lowest rank (the order groups first appear).
    groups.sort_by_key(|((culprit, _), _)| !*culprit);
    let total = groups.len();
    let mut lines: Vec<String> = groups
        .iter()
        .take(GROUPS_SHOWN)
        .map(|(_, g)| match g.len() {
            1 => g[0].position(facts),
            _ => {
                let ranks: Vec<Rank> = g.iter().map(|f| f.rank).collect();
                format!("{}: {}", fmt_ranks(&ranks), describe(g, facts))
            }
        })
        .collect();
    if total > GROUPS_SHOWN {
        let more: usize = groups.iter().skip(GROUPS_SHOWN).map(|(_, g)| g.len()).sum();
        lines.push(format!(
            "and {more} more ranks in {} other states: every rank's position is in the dumps (`ringleader analyze`)",
            total - GROUPS_SHOWN
        ));
    }
    lines
}

/// Liveness, ending, the operation running, whether a beat is known (and
/// is all that is known), the last collective completed: what ranks in one
/// state share.
type StateKey<'a> = (u8, Option<&'a str>, Option<(u64, Fingerprint)>, (bool, bool), u64, &'a [P2pWait]);

/// The collective the job is stuck in: the lowest sequence number any rank
/// is running or failed in.
///
/// A dead rank's last heartbeat may place it in a collective another rank
/// has since completed, which it then certainly left (it may have
/// completed many more): such a report does not hold the job back.
fn stuck_seq(facts: &[Facts<'_>]) -> u64 {
    let done_elsewhere =
        |f: &Facts<'_>| facts.iter().filter(|o| o.rank != f.rank).map(Facts::last_completed).max().unwrap_or(0);
    let running = facts.iter().filter_map(|f| {
        f.running().map(|r| r.seq).filter(|s| *s > 0 && !(f.only_reported() && *s <= done_elsewhere(f)))
    });
    let observed = facts.iter().filter_map(|f| f.observation().and_then(|o| o.seq).filter(|s| *s > 0));
    running.chain(observed).min().unwrap_or_else(|| facts.iter().map(Facts::last_completed).max().unwrap_or(0) + 1)
}

/// `all_reduce #7`: from `f`'s own record if it has one, else from any rank's.
fn label_for(all: &[Facts<'_>], f: &Facts<'_>, seq: u64) -> String {
    match f.fingerprint_of(seq) {
        Some(fp) => format!("{} #{seq}", fp.op),
        None => label(all, seq).1,
    }
}

/// The label of collective `seq`, from whichever rank knows its op.
fn label(facts: &[Facts<'_>], seq: u64) -> (Option<OpKind>, String) {
    let op = facts.iter().find_map(|f| f.fingerprint_of(seq)).map(|fp| fp.op);
    (op, op.map_or(format!("collective #{seq}"), |op| format!("{op} #{seq}")))
}

/// One line per rank saying where it is (what it runs, since when, what it
/// last completed, whether it is alive), as in a verdict's details.
pub fn positions(ev: &Evidence) -> Vec<String> {
    let facts = Facts::gather(ev);
    facts.iter().map(|f| f.position(&facts)).collect()
}

/// Computes the verdict.
///
/// ```
/// use ringleader_core::{DType, ErrorKind, Fingerprint, OpKind};
/// use ringleader_diag::snapshot::{Beat, Liveness, PeerView, Running};
/// use ringleader_diag::verdict::{verdict, Evidence};
/// let waiting = Beat { last_started: 2, last_completed: 1, running: Some(Running {
///     seq: 2, fingerprint: Fingerprint::new(OpKind::AllReduce, DType::F32, 1), running_ms: 900, awaited_peers: vec![1] }),
///     p2p: vec![], running_site: None, last_completed_site: None };
/// let ev = Evidence {
///     world_size: 2,
///     peers: vec![
///         PeerView { rank: 0, liveness: Liveness::Alive, host: None, pid: Some(10), heartbeat_age_ms: Some(100), beat: Some(waiting), exit: None },
///         PeerView { rank: 1, liveness: Liveness::Left, host: None, pid: Some(11), heartbeat_age_ms: None,
///                    beat: Some(Beat { last_started: 1, last_completed: 1, running: None, p2p: Vec::new(), running_site: None, last_completed_site: None }), exit: None },
///     ],
///     snapshots: vec![],
///     stale_after_ms: 5000,
///     group: None,
/// };
/// let d = verdict(&ev);
/// assert_eq!((d.kind, d.culprits.clone(), d.seq), (ErrorKind::MissedCollective, vec![1], Some(2)));
/// assert!(d.headline.contains("rank 1"));
/// assert!(d.headline.contains("all_reduce #2"));
/// ```
pub fn verdict(ev: &Evidence) -> Diagnosis {
    let facts = Facts::gather(ev);
    let seq = stuck_seq(&facts);
    let (op, mut what) = label(&facts, seq);
    let of_group = match ev.group.as_ref() {
        Some(g) => format!(" of {g}"),
        None => String::new(),
    };
    what += &of_group;
    // A rank that died or left can garble what its peers received, so it
    // explains a rank's own observation before the observation stands alone.
    let mut d = internal(&facts)
        .or_else(|| mismatch(&facts, seq, &what, &of_group))
        .or_else(|| died(&facts, seq, &what))
        .or_else(|| left(&facts, seq, &what))
        .or_else(|| observed(&facts))
        .or_else(|| p2p_deadlock(&facts, ev))
        .or_else(|| stalled(&facts, seq, &what, ev.stale_after_ms))
        .or_else(|| absent(&facts, seq, &what, ev.stale_after_ms))
        .unwrap_or_else(|| timeout(&facts, &what));
    d.op = d.op.or(op);
    d.seq = d.seq.or(Some(seq));
    d.details = whereabouts(&facts, &d.culprits);
    d.details.extend(details(&facts, &d.culprits));
    d
}

/// `rank 2 is at train.py:45 in load_batch: time.sleep(40)`: the
/// innermost frame of its own code that each culprit's stacks show (see
/// [`crate::stacks`]), for the first few culprits that captured one.
fn whereabouts(facts: &[Facts<'_>], culprits: &[Rank]) -> Vec<String> {
    facts
        .iter()
        .filter(|f| culprits.contains(&f.rank))
        .filter_map(|f| Some(format!("rank {} is at {}", f.rank, f.snap?.stacks.as_ref()?.at.as_deref()?)))
        .take(NAMED)
        .collect()
}

fn diagnosis(kind: ErrorKind, culprits: Vec<Rank>, headline: String, hints: Vec<String>) -> Diagnosis {
    Diagnosis { kind, culprits, op: None, seq: None, headline, details: Vec::new(), hints, summary: None }
}

/// Waiting ranks, for "while ranks 0, 2 wait in ...".
fn waiting(facts: &[Facts<'_>], seq: u64) -> Vec<Rank> {
    facts
        .iter()
        .filter(|f| f.running().is_some_and(|r| r.seq == seq) || f.observation().is_some_and(|o| o.seq == Some(seq)))
        .map(|f| f.rank)
        .collect()
}

/// The collectives worth comparing: the stuck one, those named in
/// observations, and every one that two ranks both recorded, lowest first.
/// A rank that only sends in a collective (a broadcast root) cannot see that
/// a peer disagrees; the disagreement surfaces one call later, so the verdict
/// must look back to the first collective where the records differ.
fn candidate_seqs(facts: &[Facts<'_>], seq: u64) -> Vec<u64> {
    let mut seen: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    for f in facts {
        if let Some(s) = f.snap {
            let mut mine: Vec<u64> =
                s.entries.iter().filter(|e| !e.fingerprint.op.is_p2p()).map(|e| e.collective_seq_id).collect();
            mine.dedup();
            for q in mine {
                *seen.entry(q).or_default() += 1;
            }
        }
    }
    let mut c: Vec<u64> = seen.into_iter().filter(|(_, n)| *n >= 2).map(|(q, _)| q).collect();
    c.push(seq);
    for f in facts {
        if let Some(o) = f.observation() {
            c.extend(o.seq);
            c.extend(o.their_seq);
        }
    }
    c.retain(|q| *q > 0);
    c.sort_unstable();
    c.dedup();
    c
}

/// Which rank used which fingerprint for collective `seq` (a peer's call
/// seen in a mismatching frame counts as that peer's), grouped; the largest
/// group (ties: the one holding the lowest rank) first, taken as the
/// intended call.
fn fingerprint_groups(facts: &[Facts<'_>], seq: u64) -> Vec<(Fingerprint, Vec<Rank>)> {
    let mut calls: Vec<(Rank, Fingerprint)> =
        facts.iter().filter_map(|f| f.fingerprint_of(seq).map(|fp| (f.rank, fp))).collect();
    for f in facts {
        let Some(o) = f.observation() else { continue };
        if let (Some(peer), Some(theirs), Some(their_seq)) = (o.peer.map(|p| f.global(p)), o.theirs, o.their_seq) {
            if their_seq == seq && !calls.iter().any(|(r, _)| *r == peer) {
                calls.push((peer, theirs));
            }
        }
    }
    let mut groups: Vec<(Fingerprint, Vec<Rank>)> = Vec::new();
    for (rank, fp) in calls {
        if fp.op.is_p2p() {
            continue;
        }
        match groups.iter_mut().find(|(g, _)| *g == fp) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((fp, vec![rank])),
        }
    }
    for (_, ranks) in groups.iter_mut() {
        ranks.sort_unstable();
    }
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.1[0].cmp(&b.1[0])));
    groups
}

fn mismatch(facts: &[Facts<'_>], seq: u64, what: &str, of_group: &str) -> Option<Diagnosis> {
    let hint =
        "every rank must call the same collectives in the same order, with the same shape, dtype, root and reduce op: \
                look for rank-dependent shapes, a rank-conditional call, or an uneven number of iterations"
            .to_string();
    for q in candidate_seqs(facts, seq) {
        let groups = fingerprint_groups(facts, q);
        if groups.len() < 2 {
            continue;
        }
        let mut culprits: Vec<Rank> = groups[1..].iter().flat_map(|(_, r)| r.iter().copied()).collect();
        culprits.sort_unstable();
        let listing = clauses(
            groups.iter().map(|(fp, ranks)| (format!("{} called {fp}", fmt_ranks(ranks)), ranks.len())).collect(),
            NAMED,
        );
        let mut d = diagnosis(
            ErrorKind::Mismatch,
            culprits,
            format!("ranks called collective #{q}{of_group} with different arguments: {listing}"),
            vec![hint],
        );
        if groups.iter().any(|(fp, _)| fp.op != groups[0].0.op) {
            d.hints.insert(
                0,
                "the ranks are in different collectives: one rank skipped or added a call, or they run their calls in a different order".into(),
            );
        }
        if q != seq {
            d.hints.insert(
                0,
                format!("the ranks only noticed at collective #{seq}: in #{q} some rank only sent data, which cannot reveal a disagreement"),
            );
        }
        d.op = Some(groups[0].0.op);
        d.seq = Some(q);
        return Some(d);
    }
    // No two records disagree, but a frame came from another collective.
    let (rank, peer, ours, our_seq, theirs, their_seq) = facts.iter().find_map(|f| {
        let o = f.observation()?;
        let (peer, theirs, their_seq) = (f.global(o.peer?), o.theirs?, o.their_seq?);
        let our_seq = o.seq.unwrap_or(seq);
        (their_seq != our_seq).then_some((f.rank, peer, o.ours, our_seq, theirs, their_seq))
    })?;
    let ours = ours.map_or(what.to_string(), |fp| format!("{} #{our_seq}", fp.op));
    Some(diagnosis(
        ErrorKind::Mismatch,
        vec![peer],
        format!(
            "rank {peer} sent data of {} #{their_seq} to rank {rank}, which is in {ours}: the ranks' sequences of collectives diverged (a rank skipped or added a call)",
            theirs.op
        ),
        vec![hint],
    ))
}

/// A rank found a fault in the data itself that no record explains: a
/// peer's frame that follows another schedule, or bytes it cannot read.
/// Its own words beat a timeout that names nobody.
fn observed(facts: &[Facts<'_>]) -> Option<Diagnosis> {
    let (f, o) = facts.iter().find_map(|f| {
        let o = f.observation()?;
        matches!(o.kind, ErrorKind::Mismatch | ErrorKind::VersionMismatch).then_some((f, o))
    })?;
    let rank = f.rank;
    // A receive that got another send than it expects: both ends are named,
    // and the operation is the receive (its number counts that pair's
    // receives, not collectives).
    let p2p = o.ours.map(|fp| fp.op).filter(|op| op.is_p2p());
    let mut culprits = Vec::new();
    let mut sites = String::new();
    if let (Some(ours), Some(peer)) = (p2p, o.peer.map(|p| f.global(p))) {
        culprits = vec![rank, peer];
        culprits.sort_unstable();
        // Both calls' lines, where the records say: the next question.
        let mine = o.seq.and_then(|seq| f.p2p_site_of(ours, peer, seq));
        let theirs = (o.theirs.zip(o.their_seq))
            .and_then(|(fp, seq)| facts.iter().find(|g| g.rank == peer)?.p2p_site_of(fp.op, rank, seq));
        let mut at = Vec::new();
        if let Some(s) = mine {
            at.push(format!("rank {rank}'s {ours} #{} called at {s}", o.seq.unwrap_or(0)));
        }
        if let (Some(s), Some(fp), Some(seq)) = (theirs, o.theirs, o.their_seq) {
            at.push(format!("rank {peer}'s {} #{seq} at {s}", fp.op));
        }
        if !at.is_empty() {
            sites = format!(" ({})", at.join("; "));
        }
    }
    let hint = match p2p {
        Some(_) => "a send and the receive that takes it must agree on dtype and element count, and the sends and receives between two ranks must be called in the same order on both",
        None => "every rank must run the same ringleader build with the same RINGLEADER_* settings: compare the environment and `ringleader --version` of the ranks named",
    };
    let mut d = diagnosis(
        o.kind,
        culprits,
        format!("rank {rank} received data it did not expect: {}{sites}", without_kind(&o.message)),
        vec![hint.into()],
    );
    d.seq = o.seq;
    d.op = p2p;
    Some(d)
}

/// An error's message without its leading `[kind] `: the verdict says
/// the kind once.
fn without_kind(message: &str) -> &str {
    match message.strip_prefix('[').and_then(|m| m.split_once("] ")) {
        Some((kind, rest)) if !kind.contains(' ') => rest,
        _ => message,
    }
}

/// A rank caught a bug in ringleader itself (a panic): that explains
/// everything the others saw.
fn internal(facts: &[Facts<'_>]) -> Option<Diagnosis> {
    let (rank, o) = facts.iter().find_map(|f| {
        let o = f.observation()?;
        (o.kind == ErrorKind::Internal).then_some((f.rank, o))
    })?;
    let text = o.message.strip_prefix("[internal] ").unwrap_or(&o.message);
    let mut d = diagnosis(
        ErrorKind::Internal,
        vec![rank],
        text.to_string(),
        vec![
            format!("this is not a fault of the program or of the job: rank {rank}'s stderr has the panic's location; please report it with this message"),
            "the communicator was aborted on every rank; start a new one (or restart the job) to go on".into(),
        ],
    );
    d.seq = o.seq;
    d.op = o.op;
    Some(d)
}

fn died(facts: &[Facts<'_>], seq: u64, what: &str) -> Option<Diagnosis> {
    let dead: Vec<&Facts<'_>> = facts.iter().filter(|f| f.died() && !f.completed(seq)).collect();
    if dead.is_empty() {
        return None;
    }
    let names = names_with(&dead, |f| match f.exit {
        Some(e) => format!("{} ({e})", f.who()),
        None => f.who(),
    });
    let during = if dead.iter().all(|f| f.running().is_some_and(|r| r.seq == seq)) {
        format!("during {what}")
    } else {
        format!("before completing {what}")
    };
    let mut hosts: Vec<String> = dead.iter().filter_map(|f| f.host.map(str::to_string)).collect();
    hosts.sort();
    hosts.dedup();
    let on = match hosts.len() {
        0 => String::new(),
        n if n > NAMED => format!(" on {} and {} more hosts", hosts[..NAMED].join(", "), n - NAMED),
        _ => format!(" on {}", hosts.join(", ")),
    };
    Some(diagnosis(
        ErrorKind::PeerDied,
        dead.iter().map(|f| f.rank).collect(),
        format!("{names} died {during}; the surviving ranks cannot complete it"),
        vec![
            format!("check the kernel log{on} for an OOM kill: `dmesg -T | grep -i 'killed process'`"),
            "check the process's own output and exit status (segfault, uncaught exception, kill -9)".into(),
        ],
    ))
}

fn left(facts: &[Facts<'_>], seq: u64, what: &str) -> Option<Diagnosis> {
    let gone: Vec<&Facts<'_>> = facts.iter().filter(|f| f.left() && !f.completed(seq)).collect();
    if gone.is_empty() {
        return None;
    }
    let waiters = waiting(facts, seq);
    // Grouped on what each rank knows itself (cheap); labelled once per group.
    let mut line = clauses(
        group_by(&gone, |f| (f.last_completed(), f.fingerprint_of(f.last_completed())))
            .into_iter()
            .map(|(_, g)| {
                let after = match g[0].last_completed() {
                    0 => "before completing any collective".to_string(),
                    n => format!("after {}", label_for(facts, g[0], n)),
                };
                let (it, their) = if g.len() == 1 { ("it", "its") } else { ("they", "their") };
                let c = format!(
                    "{} did not enter {what}: {it} left the job (destroyed {their} communicator or exited) {after}",
                    names(&g)
                );
                (c, g.len())
            })
            .collect(),
        NAMED,
    );
    if !waiters.is_empty() {
        line += &format!(
            ", while {} wait{} in it{}",
            fmt_ranks(&waiters),
            if waiters.len() == 1 { "s" } else { "" },
            called_at(facts, &waiters, seq)
        );
    }
    Some(diagnosis(
        ErrorKind::MissedCollective,
        gone.iter().map(|f| f.rank).collect(),
        line,
        vec!["every rank must make the same collective calls: look for a rank-conditional call (`if rank == 0:`), uneven batches per rank (a custom sampler or filtering inside the loop), or an extra iteration".into()],
    ))
}

/// Ranks blocked in send/recv: the cycle they wait in, or the rank at the
/// end of their chain of waits (see [`crate::deadlock`]).
fn p2p_deadlock(facts: &[Facts<'_>], ev: &Evidence) -> Option<Diagnosis> {
    let waits: Vec<Vec<Wait>> =
        facts.iter().map(|f| f.p2p().iter().map(|w| Wait { op: w.op, peer: w.peer, seq: w.seq }).collect()).collect();
    if waits.iter().all(Vec::is_empty) {
        return None;
    }
    let finding = deadlock::find(&waits)?.renamed(|r| ev.global(r));
    let first = match &finding {
        Finding::Cycle(p) | Finding::Chain { path: p, .. } => p.first().map(|(_, w)| *w),
    };
    let mut d = match &finding {
        Finding::Cycle(_) => diagnosis(
            ErrorKind::MissedCollective,
            finding.culprits(),
            format!("deadlock: {}", finding.words()),
            vec![
                "each rank waits for the next to send or receive first, so none can: make one side send first                  (even ranks send then receive, odd ranks receive then send), or post both with send_async and                  recv_async (isend/irecv) before waiting"
                    .into(),
            ],
        ),
        Finding::Chain { end, .. } => {
            let f = facts.iter().find(|f| f.rank == *end);
            let state = match f {
                None => "which is not in the job".to_string(),
                Some(f) if f.died() => format!("whose process ended ({})", f.exit.unwrap_or("without leaving the job")),
                Some(f) if f.stale(ev.stale_after_ms) => format!(
                    "which stopped responding (no heartbeat for {:.1} s)",
                    f.heartbeat_age_ms.unwrap_or(0) as f64 / 1000.0
                ),
                Some(f) => match f.running() {
                    Some(r) if r.seq > 0 => format!("which is in {} #{} instead", r.fingerprint.op, r.seq),
                    _ if !f.p2p().is_empty() => "which waits in sends and receives with data in flight".into(),
                    _ if f.beat.is_none() => "of which nothing is known".into(),
                    _ => match f.last_completed() {
                        0 => "which is outside any operation and has completed no collective".into(),
                        n => format!("which is outside any operation (last completed {})", label_for(facts, f, n)),
                    },
                },
            };
            let pid = f.and_then(|f| f.pid).map_or("PID".into(), |p| p.to_string());
            diagnosis(
                ErrorKind::MissedCollective,
                finding.culprits(),
                format!("{}, {state}", finding.words()),
                vec![
                    format!("rank {end} never made the send or receive its peer waits for: it skipped the call or is busy or stuck in its own code"),
                    format!("see where it is: `py-spy dump --pid {pid}`"),
                ],
            )
        }
    };
    if let Some(w) = first {
        d.op = Some(w.op);
        d.seq = Some(w.seq);
    }
    Some(d)
}

fn stalled(facts: &[Facts<'_>], seq: u64, what: &str, limit_ms: u64) -> Option<Diagnosis> {
    let frozen: Vec<&Facts<'_>> = facts.iter().filter(|f| f.stale(limit_ms) && !f.completed(seq)).collect();
    if frozen.is_empty() {
        return None;
    }
    let inside = |f: &Facts<'_>| if f.running().is_some_and(|r| r.seq == seq) { "inside" } else { "before entering" };
    let line = clauses(
        group_by(&frozen, inside)
            .into_iter()
            .map(|(inside, g)| {
                let age = g.iter().filter_map(|f| f.heartbeat_age_ms).max().unwrap_or(0) as f64 / 1000.0;
                let (its, is) = if g.len() == 1 { ("its process is", "") } else { ("their processes are", " up to") };
                let c = format!(
                    "{} stopped responding {inside} {what}: {its} alive but sent no heartbeat for{is} {age:.1} s",
                    names(&g)
                );
                (c, g.len())
            })
            .collect(),
        NAMED,
    );
    let pids: Vec<String> = frozen.iter().filter_map(|f| f.pid.map(|p| p.to_string())).collect();
    let pid = pids.first().cloned().unwrap_or_else(|| "PID".into());
    Some(diagnosis(
        ErrorKind::PeerStalled,
        frozen.iter().map(|f| f.rank).collect(),
        line,
        vec![
            format!("a stopped process (SIGSTOP, a debugger) shows state T in `ps -o stat= -p {pid}`; a frozen one may be swapping or in uninterruptible IO"),
            format!("see where it is: `py-spy dump --pid {pid}` or `gdb -p {pid} -batch -ex 'thread apply all bt'`"),
        ],
    ))
}

fn absent(facts: &[Facts<'_>], seq: u64, what: &str, limit_ms: u64) -> Option<Diagnosis> {
    let outside: Vec<&Facts<'_>> = facts
        .iter()
        .filter(|f| {
            // A rank that reported nothing (no snapshot, no heartbeat
            // payload) is unknown, not outside: a host too loaded to
            // publish in time must not turn into hundreds of culprits.
            f.beat.is_some()
                && f.liveness != Liveness::Vanished
                && !f.stale(limit_ms)
                && !f.completed(seq)
                && f.running().is_none_or(|r| r.seq != seq)
                && f.observation().is_none_or(|o| o.seq != Some(seq))
        })
        .collect();
    if outside.is_empty() {
        return None;
    }
    let waiters = waiting(facts, seq);
    let names = names(&outside);
    let last = clauses(
        group_by(&outside, |f| (f.last_completed(), f.fingerprint_of(f.last_completed())))
            .into_iter()
            .map(|((n, _), g)| {
                let label = (n > 0).then(|| label_for(facts, g[0], n));
                let ranks: Vec<Rank> = g.iter().map(|f| f.rank).collect();
                let (who, has) = (fmt_ranks(&ranks), if g.len() == 1 { "has" } else { "have" });
                let c = match label {
                    None => format!("{who} {has} completed no collective"),
                    Some(l) => match one_site(&g, |f| f.site_of(n)) {
                        Some(site) => format!("{who} last completed {l} at {site}"),
                        None => format!("{who} last completed {l}"),
                    },
                };
                (c, g.len())
            })
            .collect(),
        NAMED,
    );
    let mut line = format!("{names} did not enter {what}; {last}");
    if !waiters.is_empty() {
        line += &format!(
            "; {} wait{} in it{}",
            fmt_ranks(&waiters),
            if waiters.len() == 1 { "s" } else { "" },
            called_at(facts, &waiters, seq)
        );
    }
    let pid = outside.iter().find_map(|f| f.pid).map_or("PID".into(), |p| p.to_string());
    Some(diagnosis(
        ErrorKind::MissedCollective,
        outside.iter().map(|f| f.rank).collect(),
        line,
        vec![
            "the rank is alive and outside any collective: it skipped the call (a rank-conditional call, uneven batches), or it is busy or stuck in its own code (a dataloader, a native call)".into(),
            format!("see where it is: `py-spy dump --pid {pid}`"),
        ],
    ))
}

fn timeout(facts: &[Facts<'_>], what: &str) -> Diagnosis {
    let waiting: Vec<Rank> = facts.iter().filter(|f| f.running().is_some()).map(|f| f.rank).collect();
    let silent: Vec<Rank> = facts.iter().filter(|f| f.beat.is_none() && !f.died()).map(|f| f.rank).collect();
    let unknown = match silent.is_empty() {
        true => String::new(),
        false => format!("; {} sent no progress report in time", fmt_ranks(&silent)),
    };
    diagnosis(
        ErrorKind::Timeout,
        Vec::new(),
        format!(
            "{what} did not complete: {} {} inside it and no rank is known to be at fault{unknown}",
            fmt_ranks(&waiting),
            if waiting.len() == 1 { "is" } else { "are" }
        ),
        vec!["data stopped flowing between ranks that are all inside the collective: check the network between their hosts (`ringleader doctor`)".into()],
    )
}

#[cfg(test)]
mod tests;
