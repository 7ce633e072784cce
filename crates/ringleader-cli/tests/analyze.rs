//! `ringleader analyze` over synthetic dumps: flight recorders filled by
//! hand, written as the runtime writes them, read back by the binary.

mod common;

use common::{run, Scratch};
use ringleader_core::{DType, ErrorKind, Fingerprint, OpKind, Rank, ReduceOp};
use ringleader_diag::snapshot::{Beat, Liveness, Observation, PeerView};
use ringleader_diag::{FlightRecorder, Snapshot};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(20);

fn ar(count: u64) -> Fingerprint {
    Fingerprint::new(OpKind::AllReduce, DType::F32, count).with_reduce_op(ReduceOp::Sum)
}

/// Rank `rank`'s dump: it completed collectives 1..=done (all `fp`), and
/// if `running` is given it waits in collective done+1 with that
/// fingerprint for `awaited`.
fn dump(
    rank: Rank,
    world: usize,
    done: u64,
    fp: Fingerprint,
    running: Option<Fingerprint>,
    awaited: &[Rank],
) -> Snapshot {
    let fr = FlightRecorder::new(16, 600_000);
    for seq in 1..=done {
        let id = fr.record(fp, seq, 0);
        fr.started(id);
        fr.completed(id);
    }
    let mut s = Snapshot::new(rank, world, "node-a", 4000 + rank as u32, "run-7");
    match running {
        Some(r) => {
            let id = fr.record(r, done + 1, 0);
            fr.started(id);
            s.beat = Beat::of(&fr, Some((done + 1, r)), &ringleader_core::RankSet::new(0));
            if let Some(run) = s.beat.running.as_mut() {
                run.awaited_peers = awaited.to_vec();
            }
        }
        None => s.beat = Beat::of(&fr, None, &ringleader_core::RankSet::new(0)),
    }
    s.entries = fr.entries();
    s
}

fn view(rank: Rank, liveness: Liveness) -> PeerView {
    PeerView {
        rank,
        liveness,
        host: Some("node-a".into()),
        pid: Some(4000 + rank as u32),
        heartbeat_age_ms: Some(300),
        beat: None,
        exit: None,
    }
}

fn write(dir: &Scratch, name: &str, s: &Snapshot) {
    std::fs::write(dir.0.join(name), s.to_json()).unwrap();
}

#[test]
fn missed_collective_names_the_rank_that_left() {
    let dir = Scratch::new("analyze-missed");
    // Rank 0 waits in all_reduce #3 for rank 1; rank 1 completed #2 and
    // destroyed its communicator. Rank 0's dump holds the store's view.
    let mut r0 = dump(0, 2, 2, ar(8), Some(ar(8)), &[1]);
    r0.job = vec![view(0, Liveness::Alive), view(1, Liveness::Left)];
    r0.observation = Some(Observation {
        kind: ErrorKind::MissedCollective,
        message: "rank 1 left the job while this rank waits for it in all_reduce #3".into(),
        peer: Some(1),
        seq: Some(3),
        their_seq: None,
        ours: None,
        theirs: None,
        op: None,
    });
    let mut r1 = dump(1, 2, 2, ar(8), None, &[]);
    r1.destroyed = true;
    r1.time_ns = r0.time_ns - 1_000_000_000;
    write(&dir, "rank0.json", &r0);
    write(&dir, "rank1.json", &r1);
    // A dump an older job of 8 ranks left in the same folder.
    let mut stale = dump(5, 8, 40, ar(2), Some(ar(2)), &[0]);
    stale.run_id = "older-job".into();
    stale.time_ns = r1.time_ns - 3_600_000_000_000;
    write(&dir, "old-rank5.json", &stale);
    std::fs::write(dir.0.join("notes.json"), "{\"not\": \"a dump\"}").unwrap();
    std::fs::write(dir.0.join("README.txt"), "ignored").unwrap();

    let f = run(&["analyze", dir.path()], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    let first = f.stdout.lines().next().unwrap_or_default();
    assert!(first.starts_with("[missed-collective] "), "{f:#?}");
    assert!(first.contains("rank 1 (node-a pid 4001) did not enter all_reduce #3"), "{f:#?}");
    assert!(f.stdout.contains("Every rank left a dump."), "{f:#?}");
    // The per-rank table: rank 0's collective #3 is still running.
    assert!(f.stdout.contains("rank 0 (node-a pid 4000), dump "), "{f:#?}");
    let running_row =
        f.stdout.lines().find(|l| l.contains(" started ")).unwrap_or_else(|| panic!("no running row: {f:#?}"));
    assert!(running_row.contains("all_reduce") && running_row.contains("f32 x 8, sum"));
    assert!(running_row.trim_end().ends_with('1'), "awaits rank 1: {running_row}");
    assert!(f.stderr.contains("skipping") && f.stderr.contains("notes.json"), "{f:#?}");
    assert!(!f.stderr.contains("README"), "{f:#?}");
    assert!(!f.stderr.contains("no rank had failed"), "{f:#?}");
    assert!(f.stdout.contains("it saw: rank 1 left the job"), "{f:#?}");
    assert!(f.stderr.contains("other runs (older-job); analyzing run run-7"), "{f:#?}");
    let f = run(&["analyze", dir.path(), "--run-id", "older-job"], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    assert!(f.stdout.contains("No dump from ranks 0-4, 6, 7 (7 ranks)"), "{f:#?}");

    // --last bounds the table.
    let f = run(&["analyze", dir.path(), "--last", "1"], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    let rows = |out: &str| out.lines().filter(|l| l.contains("f32 x 8, sum")).count();
    assert_eq!(rows(&f.stdout), 2, "one row per rank: {f:#?}");
    let f = run(&["analyze", dir.path()], LIMIT);
    assert_eq!(rows(&f.stdout), 5, "3 + 2 rows: {f:#?}");
}

#[test]
fn mismatch_names_both_calls_and_the_missing_dump() {
    let dir = Scratch::new("analyze-mismatch");
    // Three ranks; 0 and 1 call all_reduce #2 with different counts; rank 2
    // left no dump.
    let mut r0 = dump(0, 3, 1, ar(8), Some(ar(8)), &[1, 2]);
    r0.job = vec![view(0, Liveness::Alive), view(1, Liveness::Alive), view(2, Liveness::Alive)];
    let r1 = dump(1, 3, 1, ar(8), Some(ar(16)), &[0, 2]);
    write(&dir, "rank0.json", &r0);
    write(&dir, "rank1.json", &r1);

    let f = run(&["analyze", dir.path(), "--json"], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    let j: serde_json::Value = serde_json::from_str(&f.stdout).expect("one JSON object");
    assert_eq!(j["verdict"]["kind"], "mismatch", "{j:#}");
    assert_eq!(j["verdict"]["seq"], 2, "{j:#}");
    let headline = j["verdict"]["headline"].as_str().unwrap();
    assert!(headline.contains("all_reduce(f32 x 8, sum)"), "{headline}");
    assert!(headline.contains("all_reduce(f32 x 16, sum)"), "{headline}");
    assert!(headline.contains("rank 0") && headline.contains("rank 1"), "{headline}");
    assert_eq!(j["missing"], serde_json::json!([2]));
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    assert_eq!(ranks[1]["rank"], 1);
    assert_eq!(ranks[1]["pid"], 4001);
    assert!(ranks[1]["dump"].as_str().unwrap().ends_with("rank1.json"));
    let last = ranks[1]["last"].as_array().unwrap();
    assert_eq!(last.len(), 2);
    assert_eq!(last[1]["collective_seq_id"], 2);
    assert_eq!(last[1]["fingerprint"]["count"], 16);

    let f = run(&["analyze", dir.path()], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    assert!(f.stdout.starts_with("[mismatch] "), "{f:#?}");
    // No dump carries an observation: they were written on request.
    assert!(f.stderr.contains("no rank had failed when it wrote its dump"), "{f:#?}");
    assert!(f.stdout.contains("No dump from rank 2"), "{f:#?}");
}

#[test]
fn empty_or_missing_folder_exits_2() {
    let dir = Scratch::new("analyze-empty");
    let f = run(&["analyze", dir.path()], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
    assert!(f.stderr.contains("no ringleader dump"), "{f:#?}");
    assert!(f.stdout.is_empty(), "{f:#?}");

    std::fs::write(dir.0.join("junk.json"), "[1, 2").unwrap();
    let f = run(&["analyze", dir.path(), "--json"], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");

    let gone = dir.0.join("does-not-exist");
    let f = run(&["analyze", gone.to_str().unwrap()], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
    assert!(f.stderr.contains("does-not-exist"), "{f:#?}");
}

/// RINGLEADER_DUMP_DIR holds one folder per run: given that folder, analyze
/// reads the run folder with the newest dump (or the one --run-id names)
/// and says which others there are.
#[test]
fn the_dump_folder_above_the_runs_reads_the_newest_run() {
    let dir = Scratch::new("analyze-parent");
    let (older, newer) = (dir.0.join("default-29500"), dir.0.join("default-29501"));
    std::fs::create_dir_all(&older).unwrap();
    std::fs::create_dir_all(&newer).unwrap();
    // Both runs have the id every plain launch gets; only the folders differ.
    let mut a = dump(0, 2, 2, ar(8), Some(ar(8)), &[1]);
    a.run_id = "default".into();
    let mut b = dump(0, 2, 5, ar(4), Some(ar(4)), &[1]);
    b.run_id = "default".into();
    b.time_ns = a.time_ns + 1_000_000_000;
    std::fs::write(older.join("ringleader-rank0.json"), a.to_json()).unwrap();
    std::fs::write(newer.join("ringleader-rank0.json"), b.to_json()).unwrap();
    let f = run(&["analyze", dir.path()], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    assert!(f.stdout.contains("all_reduce #6"), "the newer run (stuck in #6): {f:#?}");
    assert!(f.stderr.contains("default-29501") && f.stderr.contains("also holds default-29500"), "{f:#?}");
    // The run folder itself, as the verdict's hint names it.
    let f = run(&["analyze", older.to_str().unwrap()], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    assert!(f.stdout.contains("all_reduce #3"), "{f:#?}");
    assert!(!f.stderr.contains("also holds"), "{f:#?}");
}
