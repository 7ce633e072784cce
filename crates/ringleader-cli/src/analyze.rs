//! `ringleader analyze DIR`: the verdict on a failed job, from the
//! flight-recorder dumps its ranks left behind (docs/DESIGN.md §3).
//!
//! Every rank writes one JSON dump ([`Snapshot`]) when a collective fails, on
//! `dump()` and on demand (`ringleader status --dump`). This command reads
//! all of them, rebuilds the [`Evidence`] the watchdog had at run time (the
//! store's view of the job is inside the dumps), and runs the same verdict
//! engine, so the answer offline is the one the job printed, or a better one
//! when more ranks' dumps are at hand. It then shows what each rank last did
//! and which ranks left no dump.
//!
//! Loading ([`load`]) is the only IO; building the evidence
//! ([`evidence`]) and rendering are pure and unit-tested.

use crate::error::{CliError, Result};
use clap::Args;
use ringleader_core::error::fmt_ranks;
use ringleader_core::{Diagnosis, Group, Rank};
use ringleader_diag::recorder::{Entry, State};
use ringleader_diag::straggler::{self, Arrivals, RankStats};
use ringleader_diag::{verdict, Evidence, PeerView, Snapshot};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A heartbeat older than this (in the store's view inside a dump) counts as
/// a rank that stopped answering; the watchdog uses the same order of magnitude.
const STALE_AFTER_MS: u64 = 3000;

/// Exit code when DIR holds no dump.
const NO_DUMPS: i32 = 2;

/// Arguments of `ringleader analyze`.
#[derive(Debug, Args)]
#[command(after_help = "\
Exit status: 0 when a verdict was printed, 2 when DIR holds no dump.

Example: ringleader analyze /tmp/ringleader-dumps-1000/my-run --last 10")]
pub(crate) struct AnalyzeArgs {
    /// Folder holding the ranks' dumps (`*.json`): a run's folder, as
    /// written under RINGLEADER_DUMP_DIR, or RINGLEADER_DUMP_DIR itself (the
    /// run folder with the newest dump is read).
    #[arg(value_name = "DIR")]
    pub(crate) dir: PathBuf,

    /// Print one JSON object {verdict, ranks, missing} instead of text.
    #[arg(long)]
    pub(crate) json: bool,

    /// Operations to show per rank, newest last.
    #[arg(long, default_value_t = 5, value_name = "K")]
    pub(crate) last: usize,

    /// Analyze the dumps of this run [default: the run of the newest dump,
    /// when DIR holds dumps of several runs].
    #[arg(long, value_name = "ID")]
    pub(crate) run_id: Option<String>,

    /// Also write the ranks' flight records as a timeline to FILE: a trace
    /// (JSON, Trace Event Format) that <https://ui.perfetto.dev> and
    /// chrome://tracing open; one process per rank, one track per
    /// communicator, the failing operation marked.
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<PathBuf>,
}

/// One dump file, parsed.
#[derive(Debug, Clone)]
pub(crate) struct Dump {
    /// Where it was read from.
    pub(crate) path: PathBuf,
    /// Its content.
    pub(crate) snap: Snapshot,
}

/// Runs `ringleader analyze`; returns the process exit code.
pub(crate) fn run(args: AnalyzeArgs) -> i32 {
    let dumps = match load_run_folder(&args.dir, args.run_id.as_deref()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ringleader analyze: error: {e}");
            return NO_DUMPS;
        }
    };
    if dumps.is_empty() {
        eprintln!(
            "ringleader analyze: no ringleader dump in {} (expected one `*.json` file per rank, \
             as written under RINGLEADER_DUMP_DIR/<run>, nor a run folder holding them)",
            args.dir.display()
        );
        return NO_DUMPS;
    }
    let (run_id, dumps, others) = match pick_run(dumps, args.run_id.as_deref()) {
        Ok(picked) => picked,
        Err(e) => {
            eprintln!("ringleader analyze: {e}");
            return NO_DUMPS;
        }
    };
    if !others.is_empty() {
        eprintln!(
            "ringleader analyze: note: {} also holds dumps of other runs ({}); analyzing run {run_id} \
             (choose one with --run-id)",
            args.dir.display(),
            others.join(", ")
        );
    }
    let report = Report::build(&dumps, args.last);
    if let Some(path) = &args.trace {
        let snaps: Vec<Snapshot> = report.latest.iter().map(|d| d.snap.clone()).collect();
        let t = ringleader_diag::trace::trace(&snaps);
        match std::fs::write(path, serde_json::to_vec(&t).unwrap_or_default()) {
            Ok(()) => eprintln!(
                "ringleader analyze: wrote the timeline of {} rank(s) to {} (open it in https://ui.perfetto.dev)",
                snaps.len(),
                path.display()
            ),
            Err(e) => {
                eprintln!("ringleader analyze: error: cannot write the trace to {}: {e}", path.display());
                return 1;
            }
        }
    }
    if report.quiet {
        eprintln!(
            "ringleader analyze: note: no rank had failed when it wrote its dump (dumps on request, \
             of a job that was still running?): the verdict reads that moment, it does not diagnose \
             a failure"
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json()).unwrap_or_default());
    } else {
        print!("{}", report.to_text());
    }
    0
}

/// Reads every `*.json` file in `dir` that parses as a dump, sorted by
/// path; files that do not parse are skipped with a note on stderr.
pub(crate) fn load(dir: &Path) -> Result<Vec<Dump>> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| CliError::io(format!("reading the folder {}", dir.display()), e))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
        .collect();
    paths.sort();
    let mut dumps = Vec::new();
    for path in paths {
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| Snapshot::from_json(&text).map_err(|e| e.to_string()));
        match parsed {
            Ok(snap) => dumps.push(Dump { path, snap }),
            Err(e) => eprintln!("ringleader analyze: note: skipping {}: not a ringleader dump ({e})", path.display()),
        }
    }
    Ok(dumps)
}

/// The dumps in `dir`; when it holds none, `dir` is taken for the dump
/// folder above the runs' folders (`RINGLEADER_DUMP_DIR`, where each run
/// writes into a subfolder of its own) and the dumps of one run folder are
/// returned: the one holding run `wanted`'s dumps, else the one with the
/// newest dump (a note names the others).
pub(crate) fn load_run_folder(dir: &Path, wanted: Option<&str>) -> Result<Vec<Dump>> {
    let here = load(dir)?;
    if !here.is_empty() {
        return Ok(here);
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| CliError::io(format!("reading the folder {}", dir.display()), e))?;
    let mut folders: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect();
    folders.sort();
    let mut runs: Vec<(PathBuf, Vec<Dump>)> = Vec::new();
    for f in folders {
        let dumps = load(&f).unwrap_or_default();
        if !dumps.is_empty() {
            runs.push((f, dumps));
        }
    }
    let newest = |ds: &Vec<Dump>| ds.iter().map(|d| d.snap.time_ns).max().unwrap_or(0);
    let chosen = match wanted {
        Some(id) => runs
            .iter()
            .enumerate()
            .filter(|(_, (_, ds))| ds.iter().any(|d| d.snap.run_id == id))
            .max_by_key(|(_, (_, ds))| newest(ds))
            .map(|(i, _)| i),
        None => runs.iter().enumerate().max_by_key(|(_, (_, ds))| newest(ds)).map(|(i, _)| i),
    };
    let Some(i) = chosen else { return Ok(Vec::new()) };
    let (folder, dumps) = runs.swap_remove(i);
    if !runs.is_empty() {
        let mut others: Vec<String> =
            runs.iter().filter_map(|(f, _)| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
        others.sort();
        eprintln!(
            "ringleader analyze: note: reading the run folder {} ({}); {} also holds {} (pass one of them as DIR)",
            folder.display(),
            if wanted.is_some() { "it holds the run asked for" } else { "it has the newest dump" },
            dir.display(),
            others.join(", ")
        );
    }
    Ok(dumps)
}

/// The dumps of one run: run `wanted`, or else the run of the newest dump.
/// Returns its id, its dumps, and the ids of the other runs present.
pub(crate) fn pick_run(
    dumps: Vec<Dump>,
    wanted: Option<&str>,
) -> std::result::Result<(String, Vec<Dump>, Vec<String>), String> {
    let mut runs: Vec<String> = dumps.iter().map(|d| d.snap.run_id.clone()).collect();
    runs.sort();
    runs.dedup();
    let chosen = match wanted {
        Some(id) if runs.iter().any(|r| r == id) => id.to_string(),
        Some(id) => {
            return Err(format!(
                "no dump of run {id:?}; the dumps are of run{} {}",
                if runs.len() == 1 { "" } else { "s" },
                runs.join(", ")
            ))
        }
        None => dumps.iter().max_by_key(|d| d.snap.time_ns).map(|d| d.snap.run_id.clone()).unwrap_or_default(),
    };
    let others = runs.into_iter().filter(|r| *r != chosen).collect();
    let mine = dumps.into_iter().filter(|d| d.snap.run_id == chosen).collect();
    Ok((chosen, mine, others))
}

/// The evidence the dumps hold: the world size they name, per rank the
/// store's view from the newest dump that recorded one, and every dump as a
/// snapshot, newest first (the verdict engine takes the first snapshot of
/// each rank).
pub(crate) fn evidence(dumps: &[Dump]) -> Evidence {
    let mut newest_first: Vec<&Dump> = dumps.iter().collect();
    newest_first.sort_by_key(|d| std::cmp::Reverse(d.snap.time_ns));
    let mut peers: BTreeMap<Rank, PeerView> = BTreeMap::new();
    for d in &newest_first {
        for view in &d.snap.job {
            peers.entry(view.rank).or_insert_with(|| view.clone());
        }
    }
    let world_size = dumps
        .iter()
        .map(|d| d.snap.world_size.max(d.snap.rank + 1))
        .chain(peers.keys().map(|r| r + 1))
        .max()
        .unwrap_or(0);
    Evidence {
        world_size,
        peers: peers.into_values().collect(),
        snapshots: newest_first.iter().map(|d| d.snap.clone()).collect(),
        stale_after_ms: STALE_AFTER_MS,
        group: newest_first.iter().find_map(|d| d.snap.group.clone()),
    }
}

/// Everything `analyze` prints.
#[derive(Debug)]
pub(crate) struct Report<'a> {
    /// The recomputed verdict.
    pub(crate) verdict: Diagnosis,
    /// Run-time verdicts found in dumps that differ from it: (rank, verdict).
    pub(crate) runtime: Vec<(Rank, Diagnosis)>,
    /// The newest dump of each rank, by rank.
    pub(crate) latest: Vec<&'a Dump>,
    /// Ranks below the world size without any dump (global ranks).
    pub(crate) missing: Vec<Rank>,
    /// The sub-group the dumps are of, if they are of one.
    pub(crate) group: Option<Group>,
    /// Whether no rank had failed when it dumped (dumps on request).
    pub(crate) quiet: bool,
    /// Operations to show per rank.
    pub(crate) last: usize,
    /// Who arrived last at the collectives every rank recorded.
    pub(crate) arrivals: Vec<RankStats>,
}

impl<'a> Report<'a> {
    /// Computes the report over `dumps` (at least one).
    pub(crate) fn build(dumps: &'a [Dump], last: usize) -> Report<'a> {
        let ev = evidence(dumps);
        let verdict = verdict(&ev);
        let mut latest: BTreeMap<Rank, &Dump> = BTreeMap::new();
        for d in dumps {
            let slot = latest.entry(d.snap.rank).or_insert(d);
            if d.snap.time_ns > slot.snap.time_ns {
                *slot = d;
            }
        }
        let group = ev.group.clone();
        let g = |r: Rank| ringleader_core::group::global(group.as_ref(), r);
        let missing = (0..ev.world_size).filter(|r| !latest.contains_key(r)).map(g).collect();
        let mut runtime: Vec<(Rank, Diagnosis)> = Vec::new();
        for d in dumps {
            if let Some(v) = &d.snap.verdict {
                if !same_verdict(v, &verdict) && !runtime.iter().any(|(_, seen)| seen == v) {
                    runtime.push((g(d.snap.rank), v.clone()));
                }
            }
        }
        // A rank writes its dump on failure with what it observed; dumps
        // without any observation were written on request (or by `dump()`).
        let quiet = ev.snapshots.iter().all(|s| s.observation.is_none() && s.verdict.is_none())
            && ev.peers.iter().all(|p| p.liveness != ringleader_diag::Liveness::Vanished);
        let latest: Vec<&Dump> = latest.into_values().collect();
        let arrivals = straggler_stats(&latest, group.as_ref());
        Report { verdict, runtime, latest, missing, group, quiet, last, arrivals }
    }

    /// The human-readable report.
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.verdict);
        for (rank, v) in &self.runtime {
            let _ = writeln!(out, "\nThe run-time verdict in rank {rank}'s dump differs:\n{v}");
        }
        let _ = writeln!(out, "\nLast {} operations per rank (oldest first):", self.last);
        if let Some(g) = self.group.as_ref() {
            let _ = writeln!(out, "(the dumps are of {g}; ranks are global ranks, `awaited` included)");
        }
        for d in &self.latest {
            out += &rank_section(d, self.last, self.group.as_ref());
        }
        out += &arrivals_section(&self.arrivals);
        out += &stacks_section(&self.latest, self.group.as_ref());
        out += "\n";
        if self.missing.is_empty() {
            out += "Every rank left a dump.\n";
        } else {
            let _ = writeln!(
                out,
                "No dump from {} (look for their dumps on their own hosts, under their \
                 RINGLEADER_DUMP_DIR; a rank that was killed writes none).",
                fmt_ranks(&self.missing)
            );
        }
        out
    }

    /// `{verdict, runtime_verdicts, ranks: [{rank, host, pid, dump, last}], missing}`.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let ranks: Vec<serde_json::Value> = self
            .latest
            .iter()
            .map(|d| {
                json!({
                    "rank": ringleader_core::group::global(self.group.as_ref(), d.snap.rank),
                    "group_rank": d.snap.rank,
                    "host": d.snap.host,
                    "pid": d.snap.pid,
                    "dump": d.path.display().to_string(),
                    "last": last_entries(&d.snap, self.last),
                    "stacks": d.snap.stacks,
                })
            })
            .collect();
        let runtime: Vec<serde_json::Value> =
            self.runtime.iter().map(|(rank, v)| json!({"rank": rank, "verdict": v})).collect();
        json!({
            "run_id": self.latest.first().map(|d| d.snap.run_id.clone()),
            "group": self.group,
            "verdict": self.verdict,
            "runtime_verdicts": runtime,
            "no_failure_seen": self.quiet,
            "ranks": ranks,
            "missing": self.missing,
            "arrivals": self.arrivals,
            "stragglers": self.arrivals.iter().filter(|s| s.is_straggler()).map(|s| s.rank).collect::<Vec<_>>(),
        })
    }
}

/// Where each rank's threads were when it learned that the job failed
/// (the dumps' `stacks`): the line of its own code, then every thread's
/// Python and native frames. Empty when no dump holds stacks.
fn stacks_section(latest: &[&Dump], group: Option<&Group>) -> String {
    let mut out = String::new();
    for d in latest {
        let Some(s) = d.snap.stacks.as_ref() else { continue };
        if out.is_empty() {
            out += "\nStacks when each rank learned that the job failed (innermost frame first):\n";
        }
        let rank = ringleader_core::group::global(group, d.snap.rank);
        let at = s.at.as_deref().map_or(String::new(), |a| format!(": at {a}"));
        let _ = writeln!(out, "rank {rank} (pid {}){at} (captured in {} ms)", d.snap.pid, s.took_ms);
        for line in s.render() {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}

/// Who arrived last at the collectives that every rank's dump recorded
/// (nothing with fewer than two ranks' dumps).
fn straggler_stats(latest: &[&Dump], group: Option<&Group>) -> Vec<RankStats> {
    let arrivals: Option<Vec<Arrivals>> = latest
        .iter()
        .map(|d| {
            let rank = ringleader_core::group::global(group, d.snap.rank);
            Arrivals::from_entries(rank, &d.snap.entries, straggler::WINDOW)
                .map(|a| a.on_store_clock(d.snap.clock_offset_ns))
        })
        .collect();
    match arrivals {
        Some(a) if a.len() >= 2 => straggler::stats(&a, straggler::WINDOW),
        _ => Vec::new(),
    }
}

/// Per rank: how often it arrived last, its median and p99 lag, stragglers
/// flagged.
fn arrivals_section(stats: &[RankStats]) -> String {
    let Some(first) = stats.first() else { return String::new() };
    let mut out = format!(
        "\nArrivals at the last {} collectives every rank recorded (lag: after the first rank to arrive):\n",
        first.compared
    );
    for s in stats {
        let _ = write!(out, "  {}", s.line());
        if s.is_straggler() {
            out += "  <- straggler";
        }
        out += "\n";
    }
    out
}

/// Whether two verdicts say the same thing (ages in the text may differ).
fn same_verdict(a: &Diagnosis, b: &Diagnosis) -> bool {
    (a.kind, &a.culprits, a.op, a.seq) == (b.kind, &b.culprits, b.op, b.seq)
}

/// The last `k` entries of a dump's flight recorder, oldest first.
fn last_entries(snap: &Snapshot, k: usize) -> &[Entry] {
    &snap.entries[snap.entries.len().saturating_sub(k)..]
}

/// One rank's header line and table (ranks named globally under `group`).
fn rank_section(d: &Dump, k: usize, group: Option<&Group>) -> String {
    let s = &d.snap;
    let g = |r: Rank| ringleader_core::group::global(group, r);
    let mut out = format!("\nrank {} ({} pid {}), dump {}", g(s.rank), s.host, s.pid, d.path.display());
    if s.destroyed {
        out += ", communicator destroyed";
    }
    if let Some(o) = &s.observation {
        let _ = write!(out, "\n  it saw: {}", o.message);
    }
    out += "\n";
    let shown = last_entries(s, k);
    if shown.is_empty() {
        out += "  (no operation recorded)\n";
        return out;
    }
    let _ = writeln!(
        out,
        "  {:>7} {:>6}  {:<18} {:<24} {:<10} {:>12}  {:<24} awaited",
        "record", "seq", "op", "dtype x count", "state", "duration ms", "called at"
    );
    for e in shown {
        let _ = writeln!(
            out,
            "  {:>7} {:>6}  {:<18} {:<24} {:<10} {:>12}  {:<24} {}",
            e.record_id,
            seq_label(e),
            e.fingerprint.op.name(),
            args_label(e),
            state_name(e.state),
            duration_label(e, s.time_ns),
            e.call_site.as_deref().unwrap_or("-"),
            awaited_label(&awaited(s, e).iter().map(|&r| g(r)).collect::<Vec<_>>()),
        );
    }
    out
}

/// The peers `e` awaits: recorded in the entry when it failed; for the
/// operation in flight, from the progress counters (the heartbeat's view).
fn awaited<'a>(s: &'a Snapshot, e: &'a Entry) -> &'a [Rank] {
    match &s.beat.running {
        Some(r)
            if e.state == State::Started
                && e.awaited_peers.is_empty()
                && !e.fingerprint.op.is_p2p()
                && r.seq == e.collective_seq_id =>
        {
            &r.awaited_peers
        }
        _ => &e.awaited_peers,
    }
}

/// The sequence number; `p2p N` for a send or receive.
fn seq_label(e: &Entry) -> String {
    if e.fingerprint.op.is_p2p() {
        format!("p{}", e.p2p_seq_id)
    } else {
        e.collective_seq_id.to_string()
    }
}

/// `f32 x 1024, sum`: the fingerprint without its op.
fn args_label(e: &Entry) -> String {
    let fp = e.fingerprint.to_string();
    match (fp.find('('), fp.rfind(')')) {
        (Some(a), Some(b)) if a < b => fp[a + 1..b].to_string(),
        _ => fp,
    }
}

fn state_name(s: State) -> &'static str {
    match s {
        State::Scheduled => "scheduled",
        State::Started => "started",
        State::Completed => "completed",
        State::Failed => "failed",
    }
}

/// Milliseconds from start to end; for one still running, until the dump
/// was taken, marked `+`.
fn duration_label(e: &Entry, dump_ns: u64) -> String {
    match (e.time_discovered_started_ns, e.time_discovered_completed_ns) {
        (Some(a), Some(b)) => format!("{:.3}", b.saturating_sub(a) as f64 / 1e6),
        (Some(a), None) => format!("{:.1}+", dump_ns.saturating_sub(a) as f64 / 1e6),
        _ => "-".into(),
    }
}

fn awaited_label(peers: &[Rank]) -> String {
    if peers.is_empty() {
        "-".into()
    } else {
        peers.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringleader_core::{DType, ErrorKind, Fingerprint, OpKind, ReduceOp};
    use ringleader_diag::snapshot::{Beat, Liveness};
    use ringleader_diag::FlightRecorder;

    fn ar(n: u64) -> Fingerprint {
        Fingerprint::new(OpKind::AllReduce, DType::F32, n).with_reduce_op(ReduceOp::Sum)
    }

    /// Rank `rank` of 2 that completed `done` all_reduces and, if `stuck`,
    /// waits in the next one for rank `1 - rank`.
    fn dump(rank: Rank, done: u64, stuck: bool, time_ns: u64) -> Dump {
        let fr = FlightRecorder::new(8, 10_000);
        for seq in 1..=done {
            let id = fr.record(ar(4), seq, 0);
            fr.started(id);
            fr.completed(id);
        }
        let mut s = Snapshot::new(rank, 2, "h", 10 + rank as u32, "run");
        if stuck {
            let id = fr.record(ar(4), done + 1, 0);
            fr.started(id);
            s.beat = Beat::of(&fr, Some((done + 1, ar(4))), &ringleader_core::RankSet::new(0));
            if let Some(r) = s.beat.running.as_mut() {
                r.awaited_peers = vec![1 - rank];
            }
        } else {
            s.beat = Beat::of(&fr, None, &ringleader_core::RankSet::new(0));
        }
        s.entries = fr.entries();
        s.time_ns = time_ns;
        Dump { path: PathBuf::from(format!("rank{rank}-{time_ns}.json")), snap: s }
    }

    fn view(rank: Rank, liveness: Liveness) -> PeerView {
        PeerView {
            rank,
            liveness,
            host: Some("h".into()),
            pid: Some(10 + rank as u32),
            heartbeat_age_ms: Some(100),
            beat: None,
            exit: None,
        }
    }

    #[test]
    fn newest_job_view_per_rank_wins() {
        let mut old = dump(0, 1, true, 100);
        old.snap.job = vec![view(0, Liveness::Alive), view(1, Liveness::Alive)];
        let mut new = dump(0, 1, true, 200);
        new.snap.job = vec![view(1, Liveness::Left)];
        let ev = evidence(&[old, new]);
        assert_eq!(ev.world_size, 2);
        assert_eq!(ev.peers.len(), 2);
        assert_eq!(ev.peers[0].liveness, Liveness::Alive);
        assert_eq!(ev.peers[1].liveness, Liveness::Left);
        assert_eq!(ev.snapshots[0].time_ns, 200, "newest snapshot first");
    }

    #[test]
    fn report_names_missing_ranks_and_differing_runtime_verdicts() {
        let mut d0 = dump(0, 1, true, 100);
        d0.snap.job = vec![view(0, Liveness::Alive), view(1, Liveness::Left)];
        d0.snap.verdict = Some(Diagnosis {
            kind: ErrorKind::Timeout,
            culprits: vec![],
            op: Some(OpKind::AllReduce),
            seq: Some(2),
            headline: "all_reduce #2 did not complete".into(),
            details: vec![],
            hints: vec![],
            summary: None,
        });
        let dumps = [d0];
        let r = Report::build(&dumps, 5);
        assert_eq!(r.verdict.kind, ErrorKind::MissedCollective);
        assert_eq!(r.verdict.culprits, vec![1]);
        assert_eq!(r.missing, vec![1]);
        assert_eq!(r.runtime.len(), 1);
        assert!(!r.quiet);
        let text = r.to_text();
        assert!(text.starts_with("[missed-collective] "), "{text}");
        assert!(text.contains("run-time verdict in rank 0's dump differs"), "{text}");
        assert!(text.contains("No dump from rank 1"), "{text}");
        assert!(text.contains("f32 x 4, sum"), "{text}");
        assert!(text.contains("started"), "{text}");
        let j = r.to_json();
        assert_eq!(j["verdict"]["kind"], "missed-collective");
        assert_eq!(j["missing"], json!([1]));
        assert_eq!(j["ranks"][0]["last"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn dumps_of_the_newest_run_unless_told() {
        let mut old = dump(0, 1, true, 100);
        old.snap.run_id = "old".into();
        let new = dump(1, 1, true, 200);
        let both = vec![old, new];
        let (id, mine, others) = pick_run(both.clone(), None).unwrap();
        assert_eq!((id.as_str(), mine.len(), others), ("run", 1, vec!["old".to_string()]));
        let (id, mine, _) = pick_run(both.clone(), Some("old")).unwrap();
        assert_eq!((id.as_str(), mine[0].snap.rank), ("old", 0));
        let e = pick_run(both, Some("nope")).unwrap_err();
        assert!(e.contains("old, run"), "{e}");
    }

    #[test]
    fn labels() {
        let fr = FlightRecorder::new(4, 1000);
        let id = fr.record(Fingerprint::new(OpKind::Send, DType::U8, 3).with_root(1), 0, 7);
        fr.started(id);
        let e = fr.entry(id).unwrap();
        assert_eq!(seq_label(&e), "p7");
        assert_eq!(args_label(&e), "u8 x 3, peer 1");
        let started = e.time_discovered_started_ns.unwrap();
        assert_eq!(duration_label(&e, started + 2_500_000), "2.5+");
        assert_eq!(awaited_label(&[1, 3]), "1,3");
        assert_eq!(awaited_label(&[]), "-");
    }
}
