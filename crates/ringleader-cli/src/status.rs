//! `ringleader status --store HOST:PORT`: a live view of a running job
//! (docs/DESIGN.md §3), read from its store.
//!
//! It connects as a [`Role::Tool`] (which never counts as a member, writes
//! only dump requests, and may name the run `*`: the store's only run) and
//! prints, per rank, what the store
//! knows: host, pid, whether its member connection is alive, the age of its
//! last heartbeat, and what the heartbeat says it is doing (a
//! [`Beat`]: the collective it is in, for how long, whom it awaits, the last
//! one it completed). Then the job's abort record, the verdict and how
//! ranks ended (`rl/exit/*`), when the store holds them.
//!
//! `--dump` bumps [`keys::DUMP_REQUEST`], which makes every rank write its
//! flight-recorder dump; `--trace FILE` makes the same request and writes
//! the ranks' answers as a timeline (`status/timeline.rs`); `--watch SECS` repeats the view until Ctrl-C,
//! at once when the store reports an event (a rank joined, left, vanished,
//! the job aborted), else every SECS. `--json` prints the same facts as one
//! JSON document per view ([`to_json`]).
//!
//! Without `--store`, the address comes from RINGLEADER_STORE_ADDR, which
//! `ringleader launch` sets for its ranks (so `status` run from inside a rank
//! finds its job).

mod timeline;

use crate::error::Result;
use clap::Args;
use ringleader_core::error::fmt_ranks;
use ringleader_core::{Diagnosis, Group, Rank};
use ringleader_diag::snapshot::Running;
use ringleader_diag::straggler::{self, Arrivals, RankStats};
use ringleader_diag::Beat;
use ringleader_store::{keys, ClientOptions, JobStatus, Presence, RankStatus, Role, StoreClient};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::time::Duration;

/// How long to try reaching the store.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on each answer of the store (beyond a status long-poll's own wait).
const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// The variable `ringleader launch` sets to its store's address in every rank.
const STORE_ADDR_VAR: &str = "RINGLEADER_STORE_ADDR";

/// Arguments of `ringleader status`.
#[derive(Debug, Args)]
#[command(after_help = "\
The store is ringleader's, not torch's: `ringleader launch` puts its address in \
RINGLEADER_STORE_ADDR of every rank (it is not MASTER_PORT), and `status` reads it \
when --store is not given.

--json prints one JSON object per view (pretty-printed; with --watch, one per line):
  store               the store's address
  generation          counts the job's events (a rank joined, left or vanished; the abort)
  world_size          the largest world size a rank declared, or null
  ranks_known         ranks that ever connected;  ranks_connected: those connected now
  never_connected     ranks below world_size that never connected
  ranks[]             one object per rank that ever connected, ascending:
    rank, host, pid, version   (rank: the global rank; in a sub-group also group_rank)
    liveness            \"connected\", \"left\" or \"vanished\"
    liveness_for_s      seconds since liveness last changed
    heartbeat_age_s     seconds since its last heartbeat, or null before the first
    state               \"running\" (in a collective), \"idle\", \"unknown\" (heartbeat \
not understood) or \"no-heartbeat\"
    current             null, or the collective it is in: {op, seq (null for send/recv), \
call (as printed), fingerprint {op, dtype, count, root?, reduce_op?}, for_s (seconds in it: up \
to now while connected, else as of its last heartbeat), waiting_for [ranks]}
    last_started, last_completed   sequence numbers (0: none yet), null without a heartbeat
  abort, verdict      null, or {message, diagnosis (the verdict's JSON, or null)}
  exits[]             {rank, ending}: how ranks ended, as their launchers recorded it
  dump_request        the request number with --dump, else null
  group               null, or the sub-group the job's communicator spans: {name, ranks (the global rank of each group rank)}; every rank above is global

Example: ringleader status --store node-a:29501 --watch 2")]
pub(crate) struct StatusArgs {
    /// Address of the job's ringleader store [default: RINGLEADER_STORE_ADDR].
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) store: Option<String>,

    /// Run id of the job (`*`: whichever run the store serves; a standalone
    /// store serving several asks for the id).
    #[arg(long, default_value = "*", value_name = "ID")]
    pub(crate) run_id: String,

    /// Name of an environment variable holding the store's shared secret
    /// [default: RINGLEADER_TOKEN, when set].
    #[arg(long, value_name = "VAR")]
    pub(crate) token_env: Option<String>,

    /// Print the view again every SECS (and at once on a job event) until
    /// Ctrl-C.
    #[arg(long, value_parser = crate::launch::parse_secs, value_name = "SECS")]
    pub(crate) watch: Option<Duration>,

    /// Ask every rank to write its flight-recorder dump (under its
    /// RINGLEADER_DUMP_DIR), then show the view.
    #[arg(long)]
    pub(crate) dump: bool,

    /// Also write the job's timeline to FILE: the same request, after
    /// which every rank publishes its newest flight records to the store;
    /// those that answer within 10 s become a Chrome/Perfetto trace (one
    /// process per rank, a slice per collective), from any host.
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<std::path::PathBuf>,

    /// Print each view as one JSON object (schema below) instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The store's address: `--store`, else RINGLEADER_STORE_ADDR (as `env`
/// reads it), else an `invalid-argument` error naming both.
fn store_addr(arg: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Result<String> {
    if let Some(a) = arg {
        return Ok(a.to_string());
    }
    match env(STORE_ADDR_VAR).map(|a| a.trim().to_string()).filter(|a| !a.is_empty()) {
        Some(a) => Ok(a),
        None => Err(ringleader_core::Error::invalid(
            "--store",
            format!(
                "no store address: give --store HOST:PORT or set {STORE_ADDR_VAR} (`ringleader launch` sets it in \
                 every rank)"
            ),
        )
        .into()),
    }
}

/// Runs `ringleader status`; returns the process exit code.
pub(crate) fn run(args: StatusArgs) -> i32 {
    match watch(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ringleader status: error: {e}");
            e.exit_code()
        }
    }
}

fn watch(args: &StatusArgs) -> Result<()> {
    let store = store_addr(args.store.as_deref(), |k| std::env::var(k).ok())?;
    let token = crate::store::token(args.token_env.as_deref())?
        .map(|(t, _)| t)
        // The secret a launcher of this user made for a job on this host.
        .or_else(|| store.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).and_then(crate::secret::find));
    let mut opts = ClientOptions::new(args.run_id.clone());
    opts.role = Role::Tool;
    opts.token = token;
    opts.connect_timeout = CONNECT_TIMEOUT;
    opts.op_timeout = OP_TIMEOUT;
    let mut client = StoreClient::connect(&store, opts)?;

    let mut dump_request = None;
    if args.dump || args.trace.is_some() {
        let n = client.add(keys::DUMP_REQUEST, 1)?;
        let note = format!(
            "requested a flight-recorder dump from every rank (request #{n}): each writes it \
             under its RINGLEADER_DUMP_DIR; read them with `ringleader analyze DIR`"
        );
        // With --json, stdout holds the JSON alone.
        if args.json {
            eprintln!("ringleader status: {note}");
        } else {
            println!("{note}\n");
        }
        dump_request = Some(n);
        if let Some(path) = &args.trace {
            let got = timeline::collect(&mut client, n, timeline::ANSWER_WITHIN)?;
            let note = timeline::write(&got, path).map_err(|e| {
                ringleader_core::Error::invalid("--trace", format!("cannot write {}: {e}", path.display()))
            })?;
            if args.json {
                eprintln!("ringleader status: {note}");
            } else {
                println!("{note}\n");
            }
        }
    }
    let clear = args.watch.is_some() && !args.json && std::io::stdout().is_terminal();
    let mut seen = None;
    loop {
        let wait = if seen.is_some() { args.watch.unwrap_or_default() } else { Duration::ZERO };
        let status = client.status(seen, wait)?;
        let extra = Extras { dump_request, ..Extras::read(&mut client)? };
        let mut text = String::new();
        if args.json {
            let doc = to_json(&store, &status, &extra);
            let printed =
                if args.watch.is_some() { serde_json::to_string(&doc) } else { serde_json::to_string_pretty(&doc) };
            text += &printed.unwrap_or_default();
            text += "\n";
        } else {
            if clear {
                text += "\x1b[H\x1b[2J";
            }
            text += &render(&store, &status, &extra);
            if let Some(every) = args.watch {
                let _ = writeln!(text, "(every {:.1} s and on each job event; Ctrl-C to stop)\n", every.as_secs_f64());
            }
        }
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        drop(out);
        if args.watch.is_none() {
            return Ok(());
        }
        seen = Some(status.generation);
    }
}

/// What the store holds beside the status: the verdict and exit records.
#[derive(Debug, Default)]
pub(crate) struct Extras {
    /// The verdict the ranks agreed on (`rl/verdict`), raw.
    pub(crate) verdict: Option<Vec<u8>>,
    /// How ranks ended, by rank (`rl/exit/{rank}`).
    pub(crate) exits: Vec<(Rank, String)>,
    /// The dump request this invocation made (`--dump`), by number.
    pub(crate) dump_request: Option<i64>,
    /// The sub-group the job's communicator spans (`rl/group`), if it is
    /// one: the store numbers its ranks in the group, the view names global ranks.
    pub(crate) group: Option<Group>,
    /// Who arrived last at the recent collectives, from what the ranks
    /// published (`rl/arrivals/{rank}`); empty until every rank has.
    pub(crate) arrivals: Vec<RankStats>,
}

impl Extras {
    /// The global rank of the store's rank `r`.
    fn global(&self, r: Rank) -> Rank {
        ringleader_core::group::global(self.group.as_ref(), r)
    }

    fn globals(&self, rs: &[Rank]) -> Vec<Rank> {
        rs.iter().map(|&r| self.global(r)).collect()
    }
}

impl Extras {
    fn read(client: &mut StoreClient) -> Result<Extras> {
        let verdict = client.try_get(keys::VERDICT)?;
        let mut exits = Vec::new();
        for key in client.keys_with_prefix(keys::EXIT_PREFIX)? {
            let Some(rank) = key.strip_prefix(keys::EXIT_PREFIX).and_then(|r| r.parse::<Rank>().ok()) else {
                continue;
            };
            if let Some(v) = client.try_get(&key)? {
                exits.push((rank, String::from_utf8_lossy(&v).into_owned()));
            }
        }
        exits.sort();
        let group = client.try_get(keys::GROUP)?.and_then(|v| serde_json::from_slice(&v).ok());
        let mut published: Vec<Arrivals> = Vec::new();
        for key in client.keys_with_prefix(keys::ARRIVALS_PREFIX)? {
            if let Some(a) = client.try_get(&key)?.and_then(|v| serde_json::from_slice(&v).ok()) {
                published.push(a);
            }
        }
        published.sort_by_key(|a| a.rank);
        let arrivals = if published.len() >= 2 { straggler::stats(&published, straggler::WINDOW) } else { Vec::new() };
        Ok(Extras { verdict, exits, dump_request: None, group, arrivals })
    }
}

/// The whole view, as printed.
pub(crate) fn render(store: &str, status: &JobStatus, extra: &Extras) -> String {
    let mut out = String::new();
    let world = status.ranks.iter().filter_map(|r| r.world_size).max();
    let connected = status.with(Presence::Connected).len();
    let _ = write!(
        out,
        "job at {store}: {} rank{} known, {connected} connected",
        status.ranks.len(),
        if status.ranks.len() == 1 { "" } else { "s" }
    );
    if let Some(w) = world {
        let _ = write!(out, ", world size {w}");
    }
    if let Some(g) = &extra.group {
        let _ = write!(out, "; a sub-group, {g}: ranks below are global ranks");
    }
    out += "\n";
    let mut rows = vec![vec![
        "RANK".to_string(),
        "HOST".into(),
        "PID".into(),
        "LIVENESS".into(),
        "HEARTBEAT".into(),
        "NOW".into(),
        "LAST DONE".into(),
    ]];
    rows.extend(status.ranks.iter().map(|r| rank_row(r, extra)));
    out += &table(&rows);
    if let Some(w) = world {
        let absent: Vec<Rank> = (0..w).filter(|r| status.rank(*r).is_none()).map(|r| extra.global(r)).collect();
        if !absent.is_empty() {
            let _ = writeln!(out, "{} never connected", fmt_ranks(&absent));
        }
    }
    if let Some(abort) = &status.abort {
        let _ = writeln!(out, "job aborted: {}", record_text(abort));
    }
    if let Some(v) = &extra.verdict {
        let _ = writeln!(out, "verdict: {}", record_text(v));
    }
    for (rank, text) in &extra.exits {
        let _ = writeln!(out, "rank {} {text}", extra.global(*rank));
    }
    if let Some(first) = extra.arrivals.first() {
        let _ =
            writeln!(out, "arrivals at the last {} collectives (lag: after the first rank to arrive):", first.compared);
        for s in &extra.arrivals {
            let _ = writeln!(out, "  {}{}", s.line(), if s.is_straggler() { "  <- straggler" } else { "" });
        }
    }
    out
}

/// One rank's row.
fn rank_row(r: &RankStatus, extra: &Extras) -> Vec<String> {
    let liveness = match r.liveness {
        Presence::Connected => "connected".to_string(),
        other => format!("{other} {:.1} s ago", r.since_change.as_secs_f64()),
    };
    let heartbeat = r.heartbeat_age.map_or("-".into(), |a| format!("{:.1} s ago", a.as_secs_f64()));
    let beat = Beat::decode(&r.heartbeat);
    let now = match (&beat, r.heartbeat_age) {
        (_, None) => "-".to_string(),
        (None, Some(_)) => "? (heartbeat not understood)".to_string(),
        (Some(b), Some(age)) => doing(b, age, r.liveness == Presence::Connected, extra),
    };
    let last = match &beat {
        Some(b) if b.last_completed > 0 => format!("#{}", b.last_completed),
        Some(_) => "none".into(),
        None => "-".into(),
    };
    vec![extra.global(r.rank).to_string(), r.host.clone(), r.pid.to_string(), liveness, heartbeat, now, last]
}

/// What a heartbeat says the rank is doing: `all_reduce #7 (f32 x 4, sum)
/// for 12.3 s, waiting for rank 1`. The time counts from the heartbeat's
/// report to now (`age` later) while the rank is connected.
fn doing(b: &Beat, age: Duration, connected: bool, extra: &Extras) -> String {
    let Some(r) = &b.running else {
        return "idle (outside any collective)".into();
    };
    let fp = r.fingerprint.to_string();
    let args = fp.find('(').map_or(String::new(), |i| format!(" {}", &fp[i..]));
    let label = if r.fingerprint.op.is_p2p() {
        format!("{}{args}", r.fingerprint.op)
    } else {
        format!("{} #{}{args}", r.fingerprint.op, r.seq)
    };
    let ms = running_ms(r, age, connected);
    let mut s = format!("{}{label} for {:.1} s", if connected { "" } else { "last seen in " }, ms as f64 / 1000.0);
    if !r.awaited_peers.is_empty() {
        let _ = write!(s, ", waiting for {}", fmt_ranks(&extra.globals(&r.awaited_peers)));
    }
    s
}

/// How long a rank has been in the collective its heartbeat reports: up to
/// now while it is connected (the heartbeat is `age` old), else as of the
/// heartbeat.
fn running_ms(r: &Running, age: Duration, connected: bool) -> u64 {
    if connected {
        r.running_ms + age.as_millis() as u64
    } else {
        r.running_ms
    }
}

/// The view as JSON (`--json`; the schema is in the help text).
pub(crate) fn to_json(store: &str, status: &JobStatus, extra: &Extras) -> Value {
    let world = status.ranks.iter().filter_map(|r| r.world_size).max();
    let never: Vec<Rank> =
        world.map_or(Vec::new(), |w| (0..w).filter(|r| status.rank(*r).is_none()).map(|r| extra.global(r)).collect());
    let ranks: Vec<Value> = status.ranks.iter().map(|r| rank_json(r, extra)).collect();
    let exits: Vec<Value> =
        extra.exits.iter().map(|(rank, ending)| json!({"rank": extra.global(*rank), "ending": ending})).collect();
    json!({
        "store": store,
        "generation": status.generation,
        "world_size": world,
        "ranks_known": status.ranks.len(),
        "ranks_connected": status.with(Presence::Connected).len(),
        "never_connected": never,
        "ranks": ranks,
        "abort": status.abort.as_deref().map(record_json),
        "verdict": extra.verdict.as_deref().map(record_json),
        "exits": exits,
        "dump_request": extra.dump_request,
        "group": extra.group,
        "arrivals": extra.arrivals,
        "stragglers": extra.arrivals.iter().filter(|s| s.is_straggler()).map(|s| s.rank).collect::<Vec<_>>(),
    })
}

/// One rank's object in [`to_json`].
fn rank_json(r: &RankStatus, extra: &Extras) -> Value {
    let connected = r.liveness == Presence::Connected;
    let beat = Beat::decode(&r.heartbeat);
    let state = match (&beat, r.heartbeat_age) {
        (_, None) => "no-heartbeat",
        (None, Some(_)) => "unknown",
        (Some(b), Some(_)) if b.running.is_some() => "running",
        (Some(_), Some(_)) => "idle",
    };
    let current = match (&beat, r.heartbeat_age) {
        (Some(Beat { running: Some(run), .. }), Some(age)) => {
            let p2p = run.fingerprint.op.is_p2p();
            json!({
                "op": run.fingerprint.op.name(),
                "seq": if p2p { None } else { Some(run.seq) },
                "call": run.fingerprint.to_string(),
                "fingerprint": run.fingerprint,
                "for_s": secs(Duration::from_millis(running_ms(run, age, connected))),
                "waiting_for": extra.globals(&run.awaited_peers),
            })
        }
        _ => Value::Null,
    };
    let beat = beat.filter(|_| r.heartbeat_age.is_some());
    json!({
        "rank": extra.global(r.rank),
        "group_rank": extra.group.as_ref().map(|_| r.rank),
        "host": r.host,
        "pid": r.pid,
        "version": r.version,
        "liveness": r.liveness.to_string(),
        "liveness_for_s": secs(r.since_change),
        "heartbeat_age_s": r.heartbeat_age.map(secs),
        "state": state,
        "current": current,
        "last_started": beat.as_ref().map(|b| b.last_started),
        "last_completed": beat.as_ref().map(|b| b.last_completed),
    })
}

/// Seconds, to the millisecond.
fn secs(d: Duration) -> f64 {
    d.as_millis() as f64 / 1000.0
}

/// A record as JSON: its message, and the verdict itself when it is one.
fn record_json(raw: &[u8]) -> Value {
    let diagnosis = serde_json::from_slice::<Diagnosis>(raw).ok();
    json!({"message": record_text(raw), "diagnosis": diagnosis})
}

/// A record the runtime wrote: a verdict as JSON (printed as its message),
/// or text.
fn record_text(raw: &[u8]) -> String {
    match serde_json::from_slice::<Diagnosis>(raw) {
        Ok(d) => d.to_string(),
        Err(_) => String::from_utf8_lossy(raw).trim().to_string(),
    }
}

/// Left-aligned columns two spaces apart (the last one unpadded).
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line += cell;
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
        out += line.trim_end();
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringleader_core::{DType, Fingerprint, OpKind, ReduceOp};
    use ringleader_diag::snapshot::Running;

    fn rank(r: Rank, liveness: Presence, beat: Option<&Beat>) -> RankStatus {
        RankStatus {
            rank: r,
            liveness,
            host: "node-a".into(),
            pid: 100 + r as u32,
            version: "0.1.0".into(),
            world_size: Some(3),
            since_change: Duration::from_millis(2500),
            heartbeat_age: beat.map(|_| Duration::from_millis(400)),
            heartbeat: beat.map_or(Vec::new(), Beat::encode),
        }
    }

    #[test]
    fn view_of_a_stuck_job() {
        let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 4).with_reduce_op(ReduceOp::Sum);
        let stuck = Beat {
            last_started: 3,
            last_completed: 2,
            running: Some(Running { seq: 3, fingerprint: fp, running_ms: 9_600, awaited_peers: vec![1] }),
            p2p: Vec::new(),
            running_site: None,
            last_completed_site: None,
        };
        let idle = Beat {
            last_started: 2,
            last_completed: 2,
            running: None,
            p2p: Vec::new(),
            running_site: None,
            last_completed_site: None,
        };
        let status = JobStatus {
            generation: 4,
            ranks: vec![rank(0, Presence::Connected, Some(&stuck)), rank(1, Presence::Vanished, Some(&idle))],
            abort: Some(b"rank 1 died".to_vec()),
        };
        let late = |rank, us: u64| Arrivals {
            rank,
            first_seq: 1,
            base_ns: 0,
            offsets_us: (0..100u64).map(|i| i * 100_000 + us).collect(),
        };
        let extra = Extras {
            exits: vec![(1, "killed by signal 9 (SIGKILL)".into())],
            arrivals: straggler::stats(&[late(0, 0), late(1, 40_000)], straggler::WINDOW),
            ..Extras::default()
        };
        let text = render("h:1", &status, &extra);
        assert!(
            text.contains("rank 1 arrived last in 100% of the last 100 collectives, median lag 40.0 ms, p99 40.0 ms  <- straggler"),
            "{text}"
        );
        assert_eq!(to_json("h:1", &status, &extra)["stragglers"], json!([1]));
        assert!(text.contains("2 ranks known, 1 connected, world size 3"), "{text}");
        assert!(text.contains("all_reduce #3 (f32 x 4, sum) for 10.0 s, waiting for rank 1"), "{text}");
        assert!(text.contains("vanished 2.5 s ago"), "{text}");
        assert!(text.contains("idle (outside any collective)"), "{text}");
        assert!(text.contains("rank 2 never connected"), "{text}");
        assert!(text.contains("job aborted: rank 1 died"), "{text}");
        assert!(text.contains("rank 1 killed by signal 9 (SIGKILL)"), "{text}");
        let row0 = text.lines().find(|l| l.starts_with("0 ")).unwrap();
        assert!(row0.ends_with("#2"), "{row0}");
    }

    #[test]
    fn a_sub_group_is_shown_in_global_ranks() {
        let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 4).with_reduce_op(ReduceOp::Sum);
        let stuck = Beat {
            last_started: 3,
            last_completed: 2,
            running: Some(Running { seq: 3, fingerprint: fp, running_ms: 9_600, awaited_peers: vec![2] }),
            p2p: Vec::new(),
            running_site: None,
            last_completed_site: None,
        };
        let status = JobStatus {
            generation: 4,
            ranks: vec![rank(0, Presence::Connected, Some(&stuck)), rank(1, Presence::Connected, None)],
            abort: None,
        };
        let extra = Extras {
            exits: vec![(1, "exited with code 0".into())],
            group: Some(Group::new("1", vec![1, 2, 3])),
            ..Extras::default()
        };
        let text = render("h:1", &status, &extra);
        assert!(text.contains("a sub-group, group 1 (ranks 1-3): ranks below are global ranks"), "{text}");
        assert!(text.contains("waiting for rank 3"), "{text}");
        assert!(text.contains("rank 3 never connected"), "{text}");
        assert!(text.contains("rank 2 exited with code 0"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("1 ")) && text.lines().any(|l| l.starts_with("2 ")), "{text}");
        let j = to_json("h:1", &status, &extra);
        assert_eq!((j["ranks"][0]["rank"].clone(), j["ranks"][0]["group_rank"].clone()), (json!(1), json!(0)));
        assert_eq!(j["ranks"][0]["current"]["waiting_for"], json!([3]));
        assert_eq!(j["never_connected"], json!([3]));
        assert_eq!(j["group"]["name"], "1");
    }

    #[test]
    fn json_of_a_stuck_job() {
        let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 4).with_reduce_op(ReduceOp::Sum);
        let stuck = Beat {
            last_started: 3,
            last_completed: 2,
            running: Some(Running { seq: 3, fingerprint: fp, running_ms: 9_600, awaited_peers: vec![1] }),
            p2p: Vec::new(),
            running_site: None,
            last_completed_site: None,
        };
        let idle = Beat {
            last_started: 2,
            last_completed: 2,
            running: None,
            p2p: Vec::new(),
            running_site: None,
            last_completed_site: None,
        };
        let mut late = rank(3, Presence::Connected, None);
        late.world_size = Some(4);
        let status = JobStatus {
            generation: 4,
            ranks: vec![rank(0, Presence::Connected, Some(&stuck)), rank(1, Presence::Vanished, Some(&idle)), late],
            abort: Some(b"rank 1 died".to_vec()),
        };
        let extra = Extras {
            exits: vec![(1, "killed by signal 9 (SIGKILL)".into())],
            dump_request: Some(2),
            ..Extras::default()
        };
        let j = to_json("h:1", &status, &extra);
        assert_eq!(j["store"], "h:1");
        assert_eq!(j["generation"], 4);
        assert_eq!(j["world_size"], 4);
        assert_eq!(j["ranks_known"], 3);
        assert_eq!(j["ranks_connected"], 2);
        assert_eq!(j["never_connected"], json!([2]));
        let r0 = &j["ranks"][0];
        assert_eq!(r0["rank"], 0);
        assert_eq!(r0["host"], "node-a");
        assert_eq!(r0["pid"], 100);
        assert_eq!(r0["liveness"], "connected");
        assert_eq!(r0["heartbeat_age_s"], 0.4);
        assert_eq!(r0["state"], "running");
        assert_eq!(r0["current"]["op"], "all_reduce");
        assert_eq!(r0["current"]["seq"], 3);
        assert_eq!(r0["current"]["call"], "all_reduce(f32 x 4, sum)");
        assert_eq!(r0["current"]["fingerprint"]["dtype"], "f32");
        assert_eq!(r0["current"]["for_s"], 10.0);
        assert_eq!(r0["current"]["waiting_for"], json!([1]));
        assert_eq!(r0["last_started"], 3);
        assert_eq!(r0["last_completed"], 2);
        let r1 = &j["ranks"][1];
        assert_eq!(r1["liveness"], "vanished");
        assert_eq!(r1["liveness_for_s"], 2.5);
        assert_eq!(r1["state"], "idle");
        assert_eq!(r1["current"], Value::Null);
        let r3 = &j["ranks"][2];
        assert_eq!(r3["state"], "no-heartbeat");
        assert_eq!(r3["heartbeat_age_s"], Value::Null);
        assert_eq!(r3["last_completed"], Value::Null);
        assert_eq!(j["abort"]["message"], "rank 1 died");
        assert_eq!(j["abort"]["diagnosis"], Value::Null);
        assert_eq!(j["verdict"], Value::Null);
        assert_eq!(j["exits"], json!([{"rank": 1, "ending": "killed by signal 9 (SIGKILL)"}]));
        assert_eq!(j["dump_request"], 2);
    }

    #[test]
    fn store_address_falls_back_to_the_launchers_variable() {
        let env =
            |v: Option<&'static str>| move |k: &str| (k == STORE_ADDR_VAR).then_some(v).flatten().map(String::from);
        assert_eq!(store_addr(Some("a:1"), env(Some("b:2"))).unwrap(), "a:1");
        assert_eq!(store_addr(None, env(Some(" b:2 "))).unwrap(), "b:2");
        for unset in [None, Some(""), Some("  ")] {
            let e = store_addr(None, env(unset)).unwrap_err();
            assert_eq!(e.exit_code(), 2);
            let msg = e.to_string();
            assert!(msg.contains("--store") && msg.contains(STORE_ADDR_VAR), "{msg}");
        }
    }

    #[test]
    fn verdict_records_print_as_messages() {
        let d = Diagnosis {
            kind: ringleader_core::ErrorKind::PeerDied,
            culprits: vec![1],
            op: None,
            seq: None,
            headline: "rank 1 died".into(),
            details: vec![],
            hints: vec![],
            summary: None,
        };
        let raw = serde_json::to_vec(&d).unwrap();
        assert_eq!(record_text(&raw), "[peer-died] rank 1 died");
        assert_eq!(record_text(b"plain\n"), "plain");
        let j = record_json(&raw);
        assert_eq!(j["message"], "[peer-died] rank 1 died");
        assert_eq!(j["diagnosis"]["culprits"], json!([1]));
    }

    #[test]
    fn table_aligns() {
        let t = table(&[vec!["a".into(), "bb".into(), "c".into()], vec!["ddd".into(), "e".into(), "f".into()]]);
        assert_eq!(t, "a    bb  c\nddd  e   f\n");
    }
}
