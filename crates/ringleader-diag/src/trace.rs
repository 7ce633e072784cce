//! The ranks' flight records as a timeline: a trace in the Trace Event
//! Format (JSON object form) that Perfetto's UI and `chrome://tracing` open.
//!
//! One process per rank (named with its host and pid), one track (thread)
//! per communicator, one complete slice per operation from when it was
//! enqueued to when it completed (or, for one still running, to when the
//! dump was taken), with its op, sizes, sequence number and call site as
//! arguments. The failing operation is marked: its slice is named
//! `... FAILED`, carries the error, and an instant event sits at its end.
//!
//! Times are on the store's clock: each rank measured its wall clock's
//! offset to the store's as it started ([`Snapshot::clock_offset_ns`], within
//! half a round trip to the store), and its times are shifted by it, so
//! ranks of different hosts line up even where the hosts' clocks disagree.
//! A snapshot without an offset (an older dump) keeps its own clock. Times
//! are shown relative to the earliest event of the trace.

use crate::recorder::{Entry, State};
use crate::snapshot::Snapshot;
use ringleader_core::Rank;
use serde_json::{json, Value};

/// The trace of `snaps` (one per rank and communicator; ranks named
/// globally).
///
/// ```
/// use ringleader_diag::{snapshot::Snapshot, trace::trace};
/// let t = trace(&[Snapshot::new(0, 1, "node-a", 42, "run")]);
/// assert_eq!(t["traceEvents"][0]["args"]["name"], "rank 0 (node-a pid 42)");
/// ```
pub fn trace(snaps: &[Snapshot]) -> Value {
    // A rank's time on the store's clock.
    let aligned = |s: &Snapshot, ns: u64| crate::clock::on_store_clock(ns, s.clock_offset_ns);
    let origin = snaps
        .iter()
        .flat_map(|s| s.entries.iter().filter(|e| e.time_created_ns > 0).map(|e| aligned(s, e.time_created_ns)))
        .min()
        .unwrap_or(0);
    let us = |ns: u64| ns.saturating_sub(origin) as f64 / 1000.0;
    let mut events = Vec::new();
    let mut named: Vec<Rank> = Vec::new();
    let mut tracks: Vec<String> = Vec::new();
    for s in snaps {
        let rank = s.global_rank.unwrap_or(s.rank);
        if !named.contains(&rank) {
            named.push(rank);
            events.push(json!({
                "ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                "args": {"name": format!("rank {rank} ({} pid {})", s.host, s.pid)},
            }));
            events.push(
                json!({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}),
            );
        }
        let track = match &s.group {
            Some(g) => format!("{g}"),
            None => "world".to_string(),
        };
        let tid = match tracks.iter().position(|t| *t == track) {
            Some(i) => i + 1,
            None => {
                tracks.push(track.clone());
                tracks.len()
            }
        };
        events.push(json!({
            "ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
            "args": {"name": format!("communicator: {track}")},
        }));
        for e in &s.entries {
            if e.time_created_ns == 0 {
                continue;
            }
            let start = aligned(s, e.time_created_ns);
            let end = aligned(s, e.time_discovered_completed_ns.unwrap_or(s.time_ns)).max(start);
            let failed = e.state == State::Failed;
            let mut name = e.label();
            if failed {
                name += " FAILED";
            }
            let mut slice = json!({
                "ph": "X", "name": name, "cat": category(e), "pid": rank, "tid": tid,
                "ts": us(start), "dur": us(end) - us(start), "args": args(e),
            });
            if failed {
                slice["cname"] = json!("terrible");
                events.push(json!({
                    "ph": "i", "s": "t", "name": format!("{} failed", e.label()), "cat": "failure",
                    "pid": rank, "tid": tid, "ts": us(end),
                    "args": {"error": e.error.clone().unwrap_or_default()},
                }));
            }
            events.push(slice);
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": format!("ringleader {}", ringleader_core::VERSION), "origin_unix_ns": origin},
    })
}

fn category(e: &Entry) -> &'static str {
    if e.fingerprint.op.is_p2p() {
        "p2p"
    } else {
        "collective"
    }
}

/// A slice's arguments: what the flight record says of the operation.
fn args(e: &Entry) -> Value {
    let fp = &e.fingerprint;
    let mut a = json!({
        "op": fp.op.name(),
        "seq": if fp.op.is_p2p() { e.p2p_seq_id } else { e.collective_seq_id },
        "record_id": e.record_id,
        "dtype": fp.dtype.torch_name(),
        "count": fp.count,
        "bytes": fp.count.saturating_mul(fp.dtype.size() as u64),
        "call": fp.to_string(),
        "state": format!("{:?}", e.state).to_lowercase(),
    });
    if let Some(t) = e.time_discovered_started_ns {
        a["queued_us"] = json!(t.saturating_sub(e.time_created_ns) as f64 / 1000.0);
    }
    if let Some(site) = &e.call_site {
        a["call_site"] = json!(site);
    }
    if let Some(err) = &e.error {
        a["error"] = json!(err);
    }
    if !e.awaited_peers.is_empty() {
        a["awaited_peers"] = json!(e.awaited_peers);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::FlightRecorder;
    use ringleader_core::{DType, Fingerprint, Group, OpKind};

    fn snap(rank: Rank, fail_at: u64, group: Option<Group>) -> Snapshot {
        let fr = FlightRecorder::new(8, 1000);
        let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 256);
        for seq in 1..=fail_at {
            let id = fr.record(fp, seq, 0);
            fr.started(id);
            if seq < fail_at {
                fr.completed(id);
            } else {
                fr.failed(id, "timed out", vec![1]);
            }
        }
        let mut s = Snapshot::new(rank, 2, "h", 10 + rank as u32, "run").in_group(group);
        s.entries = fr.entries();
        s
    }

    #[test]
    fn one_process_per_rank_one_track_per_communicator_and_the_failure_marked() {
        let g = Group::new("pp", vec![2, 3]);
        let t = trace(&[snap(0, 3, None), snap(1, 3, None), snap(0, 2, Some(g))]);
        let ev = t["traceEvents"].as_array().unwrap();
        let procs: Vec<&Value> = ev.iter().filter(|e| e["name"] == "process_name").collect();
        assert_eq!(procs.len(), 3, "ranks 0, 1 and global rank 2: {procs:?}");
        let tracks: Vec<(u64, u64)> = ev
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
            .collect();
        assert_eq!(tracks, vec![(0, 1), (1, 1), (2, 2)]);
        let slices: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(slices.len(), 3 + 3 + 2);
        let failed: Vec<&Value> = slices.iter().copied().filter(|e| e["args"]["state"] == "failed").collect();
        assert_eq!(failed.len(), 3);
        assert_eq!(failed[0]["name"], "all_reduce #3 FAILED");
        assert_eq!((failed[0]["args"]["seq"].as_u64(), failed[0]["args"]["bytes"].as_u64()), (Some(3), Some(1024)));
        assert!(slices.iter().all(|e| e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0));
        assert_eq!(ev.iter().filter(|e| e["ph"] == "i").count(), 3);
    }

    #[test]
    fn ranks_of_hosts_whose_clocks_disagree_line_up_on_the_stores_clock() {
        // Two ranks that started the same collective at the same moment,
        // on hosts whose clocks are 5 s apart; each measured its offset.
        let mut a = snap(0, 1, None);
        let mut b = snap(1, 1, None);
        let t0 = 1_700_000_000_000_000_000u64;
        for (s, local, offset) in [(&mut a, t0, 0i64), (&mut b, t0 + 5_000_000_000, -5_000_000_000)] {
            s.entries[0].time_created_ns = local;
            s.entries[0].time_discovered_completed_ns = Some(local + 2_000_000);
            s.clock_offset_ns = Some(offset);
        }
        let starts = |t: &Value| -> Vec<f64> {
            t["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["ph"] == "X")
                .map(|e| e["ts"].as_f64().unwrap())
                .collect()
        };
        let t = trace(&[a.clone(), b.clone()]);
        assert_eq!(starts(&t), vec![0.0, 0.0], "aligned: {t}");
        assert_eq!(t["otherData"]["origin_unix_ns"], t0);
        // Without the offsets, the 5 s between the clocks show.
        a.clock_offset_ns = None;
        b.clock_offset_ns = None;
        assert_eq!(starts(&trace(&[a, b])), vec![0.0, 5_000_000.0]);
    }
}
