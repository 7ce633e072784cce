//! What the store lets one run, one connection and a stranger use.
//!
//! Every bound here is enforced before the memory it protects is spent: a
//! write is refused before it is stored, an answer before it is built, a
//! wait before it is parked. A refusal is an `invalid-argument` error that
//! names the limit and the numbers (`the run's memory budget of 1073741824
//! bytes`), and the connection stays usable.

use std::time::Duration;

/// Bounds on what the store holds and whom it admits. The defaults are far
/// above what a job of ringleader ranks uses (a few hundred bytes per rank
/// and collective failure), and far below what would take a host down.
///
/// ```
/// use ringleader_store::{Limits, ServerOptions};
/// let mut opts = ServerOptions::new("job-42");
/// opts.limits = Limits { run_bytes: 64 << 20, ..Limits::default() };
/// assert_eq!(opts.limits.conn_waits, 64);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Bytes one run may hold: its keys and values (64 bytes of bookkeeping
    /// added per key), its rank records with their heartbeats, its abort
    /// record and the keys its parked waits name. Default 1 GiB.
    pub run_bytes: u64,
    /// The same, summed over every run of the store. Default 2 GiB.
    pub store_bytes: u64,
    /// Keys one run may hold. Default 1,048,576.
    pub run_keys: u64,
    /// Keys one connection may hold: those it created that nobody has
    /// deleted yet. Default 65,536.
    pub conn_keys: u64,
    /// Waits (get, wait, multi_get, status polls) one connection may have
    /// parked at once. Default 64.
    pub conn_waits: usize,
    /// Bytes of answers queued for one connection that its socket has not
    /// taken yet. Default 272 MiB: the largest frame, and some.
    pub conn_queued_bytes: u64,
    /// The same, summed over every connection. Default 1 GiB.
    pub queued_bytes: u64,
    /// Bytes of large requests (frames over 64 KiB) being read at once,
    /// over every connection; a large frame waits for room before it is
    /// read. Default 512 MiB.
    pub input_bytes: u64,
    /// Connections that have not sent their hello yet. One more closes the
    /// oldest of them (it is told the store is busy), so silent sockets
    /// cannot lock ranks out. Default 128.
    pub pending: usize,
    /// How long a new connection has to send its hello. Default 5 s.
    pub hello_timeout: Duration,
    /// Helper connections one rank may have (an aux connection with the
    /// member's rank, host and pid). Default 3.
    pub helpers_per_rank: usize,
    /// Connections other than the ranks' own (launchers, tools, other
    /// helpers) admitted at once: this many per rank of the world sizes the
    /// runs' members declared (the largest per run, summed over runs), ...
    /// Default 3.
    pub conns_per_rank: usize,
    /// ... plus this many (tools, launchers). Default 64.
    pub conns_margin: usize,
    /// ... and never fewer than this. Default 256.
    pub conns_floor: usize,
    /// ... nor more than this. Default 16,384.
    pub conns_max: usize,
    /// How long a connection other than the ranks' own may stay silent
    /// (no request, no parked wait) before the store closes it. Default 10
    /// minutes; the launcher reconnects when it has something to record.
    pub idle_timeout: Duration,
    /// Runs a store of any run (the standalone `ringleader store`) serves
    /// at once. Default 64.
    pub runs: usize,
    /// How long such a store keeps a run after its last connection closed
    /// (for `ringleader status` after the job ended). Default 10 minutes.
    pub run_linger: Duration,
    /// How long a connected rank may go without a heartbeat before the
    /// store tells the ranks following its changes that it went silent (a
    /// stopped or frozen process keeps its connection open). Ranks
    /// heartbeat every 500 ms. Default 3 s.
    pub silent_after: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            run_bytes: 1 << 30,
            store_bytes: 2 << 30,
            run_keys: 1 << 20,
            conn_keys: 1 << 16,
            conn_waits: 64,
            conn_queued_bytes: (crate::codec::MAX_FRAME as u64) + (16 << 20),
            queued_bytes: 1 << 30,
            input_bytes: 512 << 20,
            pending: 128,
            hello_timeout: Duration::from_secs(5),
            helpers_per_rank: 3,
            conns_per_rank: 3,
            conns_margin: 64,
            conns_floor: 256,
            conns_max: 16384,
            idle_timeout: Duration::from_secs(600),
            runs: 64,
            run_linger: Duration::from_secs(600),
            silent_after: Duration::from_secs(3),
        }
    }
}

impl Limits {
    /// Connections other than members admitted at once, for runs whose
    /// world sizes add up to `ranks`.
    pub(crate) fn conns_for(&self, ranks: u64) -> usize {
        let wanted = (self.conns_per_rank as u64).saturating_mul(ranks).saturating_add(self.conns_margin as u64);
        usize::try_from(wanted).unwrap_or(usize::MAX).max(self.conns_floor).min(self.conns_max.max(self.conns_floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_limit_follows_the_world_size_within_its_bounds() {
        let l = Limits::default();
        assert_eq!(l.conns_for(0), 256);
        assert_eq!(l.conns_for(64), 256);
        assert_eq!(l.conns_for(1000), 3064);
        assert_eq!(l.conns_for(u64::MAX), 16384);
    }
}
