//! `ringleader status --trace FILE`: a running job's timeline, from any
//! host that reaches its store.
//!
//! The dump request that `--dump` makes also has every rank publish its
//! compact snapshot (the newest flight records) under
//! [`keys::view`], with the request number it answers. This reads those
//! answers for the request just made, from every rank connected when it was
//! made, for a bounded time (ranks answer at their next heartbeat, every
//! 0.5 s, unless busy in a long native call), and writes the ones that came
//! as a Trace Event Format file ([`ringleader_diag::trace`]), the same
//! picture `ringleader analyze --trace` draws from dumps. Ranks that did
//! not answer are named, never waited for without bound.

use crate::error::Result;
use ringleader_core::error::fmt_ranks;
use ringleader_core::Rank;
use ringleader_diag::Snapshot;
use ringleader_store::{keys, Presence, StoreClient};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the ranks have to answer.
pub(crate) const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// Between two reads of the ranks that have not answered yet.
const REREAD: Duration = Duration::from_millis(200);

/// What a timeline request got.
#[derive(Debug)]
pub(crate) struct Collected {
    /// The answers of this request, by rank.
    pub(crate) snaps: Vec<Snapshot>,
    /// Connected ranks that did not answer in time.
    pub(crate) silent: Vec<Rank>,
}

/// The answer to request `request` in a rank's view value, if it is one.
fn answer(raw: &[u8], request: i64) -> Option<Snapshot> {
    let v: serde_json::Value = serde_json::from_slice(raw).ok()?;
    if v.get("request")?.as_i64()? < request {
        return None;
    }
    serde_json::from_value(v.get("snapshot")?.clone()).ok()
}

/// Reads the answers to dump request `request` from every rank connected
/// now, for at most `within`.
pub(crate) fn collect(client: &mut StoreClient, request: i64, within: Duration) -> Result<Collected> {
    let deadline = Instant::now() + within;
    let status = client.status(None, Duration::ZERO)?;
    let mut pending: Vec<Rank> =
        status.ranks.iter().filter(|r| r.liveness == Presence::Connected).map(|r| r.rank).collect();
    let mut snaps = Vec::new();
    loop {
        let mut still = Vec::new();
        for r in pending {
            match client.try_get(&keys::view(r))?.and_then(|raw| answer(&raw, request)) {
                Some(s) => snaps.push(s),
                None => still.push(r),
            }
        }
        pending = still;
        if pending.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(REREAD.min(deadline.saturating_duration_since(Instant::now())));
    }
    snaps.sort_by_key(|s| s.global_rank.unwrap_or(s.rank));
    Ok(Collected { snaps, silent: pending })
}

/// Writes `c` as a trace to `path`; returns the line that says what it holds.
pub(crate) fn write(c: &Collected, path: &Path) -> std::io::Result<String> {
    let t = ringleader_diag::trace::trace(&c.snaps);
    std::fs::write(path, serde_json::to_vec(&t).unwrap_or_default())?;
    let mut note = format!(
        "wrote the timeline of {} rank(s) to {} (open it in https://ui.perfetto.dev)",
        c.snaps.len(),
        path.display()
    );
    if !c.silent.is_empty() {
        note += &format!(
            "; {} did not answer within {} s (busy in a long call, or stopped?)",
            fmt_ranks(&c.silent),
            ANSWER_WITHIN.as_secs()
        );
    }
    Ok(note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_to_this_request_or_a_later_one_counts() {
        let snap = Snapshot::new(3, 4, "node-a", 42, "run");
        let raw = |n: i64| serde_json::json!({ "request": n, "snapshot": snap }).to_string().into_bytes();
        assert_eq!(answer(&raw(2), 3), None, "an older answer");
        assert_eq!(answer(&raw(3), 3).map(|s| s.rank), Some(3));
        assert_eq!(answer(&raw(4), 3).map(|s| s.rank), Some(3));
        assert_eq!(answer(b"not json", 1), None);
    }
}
