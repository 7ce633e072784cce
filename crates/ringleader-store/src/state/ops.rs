//! The requests, served within one run, with their costs checked first.
//!
//! Every write is checked against the run's and the store's memory budget
//! and the key limits before anything is stored; every answer that carries
//! data is sized (saturating) before it is built and refused when it would
//! pass the frame limit or what may be queued for its connection; every
//! wait is counted before it is parked.

use super::membership::{Conn, Session, MAX_ABORT_RECORD, MAX_HEARTBEAT};
use super::run::{entry_cost, Entry, Run, WAITER, WAIT_KEY};
use super::waiters::{WaitKind, Waiter, WaiterId};
use super::{invalid, response_weight, ConnId, Limits, Outbox, BASE, ITEM};
use crate::codec::{Request, Response, ServerMsg, MAX_FRAME, MAX_VALUE};
use crate::job::Presence;
use std::collections::{HashMap, HashSet};
use std::ops::Bound;
use std::time::{Duration, Instant};

/// Most bytes of ranks one answer to a `changes` request carries; a
/// reader far behind (or new) gets the rest in further answers, so no
/// answer grows with the world size.
pub(super) const CHANGES_CHUNK: u64 = 1 << 20;

/// One run, with the store-wide books it shares with the others.
pub(super) struct Cx<'a> {
    pub(super) run: &'a mut Run,
    pub(super) conns: &'a mut HashMap<ConnId, Conn>,
    /// Bytes charged over every run.
    pub(super) used: &'a mut u64,
    /// Bytes of answers queued over every connection.
    pub(super) queued: &'a mut u64,
    pub(super) limits: &'a Limits,
    pub(super) now: Instant,
}

impl Cx<'_> {
    /// Performs `req` of `conn`; `None` when it was parked until keys
    /// appear, an event happens or its deadline passes.
    pub(super) fn apply(&mut self, conn: ConnId, id: u64, req: Request, out: &mut Outbox) -> Option<Response> {
        Some(match req {
            Request::Set { key, value } => self.set(conn, vec![(key, value)], out),
            Request::Get { key, timeout } => return self.wait_keys(conn, id, WaitKind::Get, vec![key], timeout),
            Request::TryGet { key } => self.try_get(conn, &key),
            Request::Add { key, delta } => self.add(conn, key, delta, out),
            Request::CompareSet { key, expected, desired } => self.compare_set(conn, key, expected, desired, out),
            Request::Wait { keys, timeout } => return self.wait_keys(conn, id, WaitKind::Wait, keys, timeout),
            Request::Check { keys } => Response::Bool(keys.iter().all(|k| self.run.data.contains_key(k))),
            Request::Delete { key } => Response::Bool(self.delete(&key)),
            Request::NumKeys => Response::Count(self.run.data.len() as u64),
            Request::Clock { received_ns } => Response::Count(received_ns),
            Request::MultiGet { keys, timeout } => return self.wait_keys(conn, id, WaitKind::MultiGet, keys, timeout),
            Request::MultiSet { pairs } => self.set(conn, pairs, out),
            Request::Append { key, value } => self.append(conn, key, value, out),
            Request::KeysWithPrefix { prefix } => self.keys_with_prefix(conn, &prefix),
            Request::Heartbeat { payload } => self.heartbeat(conn, payload, out),
            Request::Leave => self.leave(conn, out),
            Request::AbortJob { record } => self.abort_job(conn, record, out),
            Request::Status { since, timeout } => return self.wait_status(conn, id, since, timeout),
            Request::Changes { since, timeout } => return self.wait_changes(conn, id, since, timeout),
        })
    }

    fn session(&self, conn: ConnId) -> Option<&Session> {
        match self.conns.get(&conn)? {
            Conn::Ready(s) => Some(s),
            Conn::Greeted { .. } => None,
        }
    }

    fn session_mut(&mut self, conn: ConnId) -> Option<&mut Session> {
        match self.conns.get_mut(&conn)? {
            Conn::Ready(s) => Some(s),
            Conn::Greeted { .. } => None,
        }
    }

    // ---- the books ----

    pub(super) fn charge(&mut self, n: u64) {
        self.run.used += n;
        *self.used += n;
    }

    pub(super) fn release(&mut self, n: u64) {
        let n = n.min(self.run.used);
        self.run.used -= n;
        *self.used -= n.min(*self.used);
    }

    /// Whether the run may hold `bytes` more and `conn` may create
    /// `new_keys` keys; the refusal names the limit.
    fn room(&self, conn: ConnId, bytes: u64, new_keys: u64) -> Result<(), Response> {
        let l = self.limits;
        if self.run.used.saturating_add(bytes) > l.run_bytes {
            return Err(over_budget(format!(
                "storing {bytes} more bytes would pass the run's memory budget of {} bytes ({} in use); delete \
                 keys that are no longer needed",
                l.run_bytes, self.run.used
            )));
        }
        if self.used.saturating_add(bytes) > l.store_bytes {
            return Err(over_budget(format!(
                "storing {bytes} more bytes would pass the store's memory budget of {} bytes ({} in use by \
                 every run)",
                l.store_bytes, *self.used
            )));
        }
        if new_keys == 0 {
            return Ok(());
        }
        let keys = self.run.data.len() as u64;
        if keys.saturating_add(new_keys) > l.run_keys {
            return Err(over_budget(format!(
                "creating {new_keys} keys would pass the run's limit of {} keys ({keys} exist)",
                l.run_keys
            )));
        }
        let held = self.session(conn).map_or(0, |s| s.keys);
        if held.saturating_add(new_keys) > l.conn_keys {
            return Err(over_budget(format!(
                "creating {new_keys} keys would pass the limit of {} keys per connection (this one created {held} \
                 that still exist)",
                l.conn_keys
            )));
        }
        Ok(())
    }

    /// Whether an answer weighing `weight` may be queued for `conn`.
    fn answer_room(&self, conn: ConnId, weight: u64) -> Result<(), Response> {
        let l = self.limits;
        if weight > MAX_FRAME as u64 {
            return Err(invalid(
                "request",
                format!(
                    "the answer would take about {weight} bytes, over the frame limit of {MAX_FRAME} bytes; ask for \
                     fewer keys at a time"
                ),
            ));
        }
        let mine = self.session(conn).map_or(0, |s| s.queued);
        if mine.saturating_add(weight) > l.conn_queued_bytes {
            return Err(invalid(
                "request",
                format!(
                    "{mine} bytes of earlier answers to this connection are not read yet; with this answer of about \
                     {weight} bytes they would pass the limit of {} bytes per connection",
                    l.conn_queued_bytes
                ),
            ));
        }
        if (*self.queued).saturating_add(weight) > l.queued_bytes {
            return Err(invalid(
                "request",
                format!(
                    "{} bytes of answers wait to be sent on the store's connections; with this one of about {weight} \
                     bytes they would pass the store's limit of {} bytes: try again later",
                    *self.queued, l.queued_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Queues `resp` as the answer to request `id` of `conn`, counting it
    /// against what may be queued. An answer that does not fit (the data
    /// answers were sized before they were built, so this is a last line)
    /// becomes the error saying so.
    pub(super) fn deliver(&mut self, conn: ConnId, id: u64, resp: Response, out: &mut Outbox) {
        let mut resp = resp;
        let mut weight = response_weight(&resp);
        if !matches!(resp, Response::Error(_)) {
            if let Err(refused) = self.answer_room(conn, weight) {
                resp = refused;
                weight = response_weight(&resp);
            }
        }
        let Some(s) = self.session_mut(conn) else { return };
        s.queued += weight;
        *self.queued += weight;
        out.push((conn, ServerMsg::Response { id, resp }));
    }

    // ---- keys ----

    /// Checks that the pairs fit: an upper bound of what they add (a key
    /// written twice counts twice) against the budgets.
    fn room_to_store<'k>(&self, conn: ConnId, pairs: impl Iterator<Item = (&'k str, usize)>) -> Result<(), Response> {
        let (mut grow, mut shrink, mut new_keys) = (0u64, 0u64, 0u64);
        let mut replaced = HashSet::new();
        for (k, len) in pairs {
            grow = grow.saturating_add(super::run::ENTRY + (k.len() + len) as u64);
            match self.run.data.get(k) {
                Some(e) if replaced.insert(k) => shrink += entry_cost(k, &e.value),
                Some(_) => {}
                None => new_keys += 1,
            }
        }
        self.room(conn, grow.saturating_sub(shrink), new_keys)
    }

    /// Stores `value` under `key` (the budgets were checked).
    fn put(&mut self, conn: ConnId, key: String, value: Vec<u8>) {
        let new = entry_cost(&key, &value);
        match self.run.data.get_mut(&key) {
            Some(e) => {
                let old = entry_cost(&key, &e.value);
                e.value = value;
                self.release(old);
            }
            None => {
                self.run.data.insert(key, Entry { value, owner: conn });
                if let Some(s) = self.session_mut(conn) {
                    s.keys += 1;
                }
            }
        }
        self.charge(new);
    }

    fn delete(&mut self, key: &str) -> bool {
        let Some(e) = self.run.data.remove(key) else {
            return false;
        };
        self.release(entry_cost(key, &e.value));
        if let Some(s) = self.session_mut(e.owner) {
            s.keys = s.keys.saturating_sub(1);
        }
        true
    }

    fn set(&mut self, conn: ConnId, pairs: Vec<(String, Vec<u8>)>, out: &mut Outbox) -> Response {
        if let Err(refused) = self.room_to_store(conn, pairs.iter().map(|(k, v)| (k.as_str(), v.len()))) {
            return refused;
        }
        let keys: Vec<String> = pairs.iter().map(|(k, _)| k.clone()).collect();
        for (k, v) in pairs {
            self.put(conn, k, v);
        }
        self.wake(&keys, out);
        Response::Ok
    }

    fn try_get(&mut self, conn: ConnId, key: &str) -> Response {
        let len = self.run.data.get(key).map_or(0, |e| e.value.len() as u64);
        if let Err(refused) = self.answer_room(conn, BASE + len) {
            return refused;
        }
        Response::MaybeValue(self.run.data.get(key).map(|e| e.value.clone()))
    }

    /// Adds to a counter stored as decimal ASCII (as torch's TCPStore does),
    /// starting from 0 when the key is absent.
    fn add(&mut self, conn: ConnId, key: String, delta: i64, out: &mut Outbox) -> Response {
        let current = match self.run.data.get(&key).map(|e| parse_counter(&e.value).ok_or(&e.value)) {
            None => 0,
            Some(Ok(n)) => n,
            Some(Err(v)) => {
                let detail = format!("holds {}, not a decimal integer, so add() cannot count on it", preview(v));
                return key_invalid(&key, detail);
            }
        };
        let Some(new) = current.checked_add(delta) else {
            return key_invalid(&key, format!("adding {delta} to {current} overflows a 64-bit counter"));
        };
        let value = new.to_string().into_bytes();
        if let Err(refused) = self.room_to_store(conn, std::iter::once((key.as_str(), value.len()))) {
            return refused;
        }
        self.put(conn, key.clone(), value);
        self.wake(&[key], out);
        Response::Int(new)
    }

    /// Stores `desired` if the current value is `expected` (`None`: if the
    /// key is absent). Answers the value stored afterwards, empty if none.
    fn compare_set(
        &mut self,
        conn: ConnId,
        key: String,
        expected: Option<Vec<u8>>,
        desired: Vec<u8>,
        out: &mut Outbox,
    ) -> Response {
        let current = self.run.data.get(&key).map(|e| &e.value);
        let answer = BASE + current.map_or(0, Vec::len).max(desired.len()) as u64;
        if let Err(refused) = self.answer_room(conn, answer) {
            return refused;
        }
        if current != expected.as_ref() {
            return Response::Value(current.cloned().unwrap_or_default());
        }
        if let Err(refused) = self.room_to_store(conn, std::iter::once((key.as_str(), desired.len()))) {
            return refused;
        }
        self.put(conn, key.clone(), desired.clone());
        self.wake(&[key], out);
        Response::Value(desired)
    }

    fn append(&mut self, conn: ConnId, key: String, value: Vec<u8>, out: &mut Outbox) -> Response {
        let existing = self.run.data.get(&key).map(|e| e.value.len());
        let value_len = existing.unwrap_or(0);
        if value_len + value.len() > MAX_VALUE {
            return key_invalid(
                &key,
                format!("appending {} bytes to {value_len} would pass the {MAX_VALUE}-byte value limit", value.len()),
            );
        }
        let grow = match existing {
            Some(_) => value.len() as u64,
            None => entry_cost(&key, &value),
        };
        if let Err(refused) = self.room(conn, grow, u64::from(existing.is_none())) {
            return refused;
        }
        match self.run.data.get_mut(&key) {
            Some(e) => {
                e.value.extend_from_slice(&value);
                self.charge(grow);
            }
            None => self.put(conn, key.clone(), value),
        }
        self.wake(&[key], out);
        Response::Ok
    }

    fn keys_with_prefix(&self, conn: ConnId, prefix: &str) -> Response {
        let matching = || {
            self.run
                .data
                .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
                .map(|(k, _)| k)
                .take_while(|k| k.starts_with(prefix))
        };
        // Sized first, and no further than needed to know it is too large.
        let mut weight = BASE;
        for k in matching() {
            weight += ITEM + k.len() as u64;
            if weight > MAX_FRAME as u64 {
                break;
            }
        }
        if let Err(refused) = self.answer_room(conn, weight) {
            return refused;
        }
        Response::Keys(matching().cloned().collect())
    }

    fn missing(&self, keys: &[String]) -> Vec<String> {
        keys.iter().filter(|k| !self.run.data.contains_key(*k)).cloned().collect()
    }

    /// The answer of a key wait whose keys are all present, sized before it
    /// is built.
    fn answer(&self, conn: ConnId, kind: WaitKind, keys: &[String]) -> Response {
        let len = |k: &String| self.run.data.get(k).map_or(0, |e| e.value.len() as u64);
        let weight = match kind {
            WaitKind::Get => BASE + keys.first().map_or(0, len),
            WaitKind::MultiGet => keys.iter().fold(BASE, |w, k| w.saturating_add(ITEM + len(k))),
            WaitKind::Wait | WaitKind::Status { .. } | WaitKind::Changes { .. } => BASE,
        };
        if let Err(refused) = self.answer_room(conn, weight) {
            return refused;
        }
        let value = |k: &String| self.run.data.get(k).map(|e| e.value.clone()).unwrap_or_default();
        match kind {
            WaitKind::Get => Response::Value(keys.first().map(value).unwrap_or_default()),
            WaitKind::MultiGet => Response::Values(keys.iter().map(value).collect()),
            WaitKind::Wait | WaitKind::Status { .. } | WaitKind::Changes { .. } => Response::Ok,
        }
    }

    /// Answers at once when every key is present (or the timeout is zero),
    /// else parks the request, if the connection and the run have room.
    fn wait_keys(
        &mut self,
        conn: ConnId,
        id: u64,
        kind: WaitKind,
        keys: Vec<String>,
        timeout: Duration,
    ) -> Option<Response> {
        let missing = self.missing(&keys);
        if missing.is_empty() {
            return Some(self.answer(conn, kind, &keys));
        }
        if timeout.is_zero() {
            return Some(Response::Timeout { missing });
        }
        let cost = keys.iter().fold(WAITER, |c, k| c.saturating_add(WAIT_KEY + k.len() as u64));
        self.park(conn, id, kind, keys, timeout, cost, &missing).err()
    }

    /// Parks a wait, charging `cost`; the refusal when it does not fit.
    #[allow(clippy::too_many_arguments)]
    fn park(
        &mut self,
        conn: ConnId,
        id: u64,
        kind: WaitKind,
        keys: Vec<String>,
        timeout: Duration,
        cost: u64,
        missing: &[String],
    ) -> Result<(), Response> {
        let parked = self.run.waiters.count_for(conn);
        if parked >= self.limits.conn_waits {
            return Err(invalid(
                "request",
                format!(
                    "this connection has {parked} waits parked, the limit per connection; an abandoned wait ends at \
                     its timeout"
                ),
            ));
        }
        self.room(conn, cost, 0)?;
        self.charge(cost);
        // A timeout too large for the clock never expires.
        let deadline = self.now.checked_add(timeout);
        self.run.waiters.add(Waiter { conn, id, kind, keys, deadline, cost }, missing);
        Ok(())
    }

    /// Unparks waiter `wid`, releasing its cost.
    fn unpark(&mut self, wid: WaiterId) -> Option<Waiter> {
        let w = self.run.waiters.remove(wid)?;
        self.release(w.cost);
        Some(w)
    }

    /// Completes the waits that `keys` may have satisfied.
    fn wake(&mut self, keys: &[String], out: &mut Outbox) {
        for wid in self.run.waiters.take_for_keys(keys.iter().map(String::as_str)) {
            let Some(w) = self.run.waiters.get(wid) else {
                continue;
            };
            let missing = self.missing(&w.keys);
            if !missing.is_empty() {
                missing.iter().for_each(|k| self.run.waiters.index_key(wid, k));
                continue;
            }
            if let Some(w) = self.unpark(wid) {
                let resp = self.answer(w.conn, w.kind, &w.keys);
                self.deliver(w.conn, w.id, resp, out);
            }
        }
    }

    /// Answers the waits whose deadline passed.
    pub(super) fn expire_waits(&mut self, out: &mut Outbox) {
        for w in self.run.waiters.take_expired(self.now) {
            self.release(w.cost);
            let resp = match w.kind {
                WaitKind::Status { .. } => self.status_answer(w.conn),
                WaitKind::Changes { since } => self.changes_answer(w.conn, since),
                _ => Response::Timeout { missing: self.missing(&w.keys) },
            };
            self.deliver(w.conn, w.id, resp, out);
        }
    }

    // ---- the job ----

    /// The job's status for `conn`, sized before it is built.
    fn status_answer(&self, conn: ConnId) -> Response {
        match self.answer_room(conn, self.run.status_weight()) {
            Ok(()) => Response::Status(self.run.status(self.now)),
            Err(refused) => refused,
        }
    }

    /// Answers at once when an event newer than `since` happened, else
    /// parks the poll until one does or the timeout passes.
    fn wait_status(&mut self, conn: ConnId, id: u64, since: Option<u64>, timeout: Duration) -> Option<Response> {
        match since {
            Some(since) if since >= self.run.generation && !timeout.is_zero() => {
                self.park(conn, id, WaitKind::Status { since }, vec![], timeout, WAITER, &[]).err()
            }
            _ => Some(self.status_answer(conn)),
        }
    }

    /// The changes after `since` for `conn`: as many as fit in
    /// [`CHANGES_CHUNK`] bytes (the reader asks again for the rest).
    fn changes_answer(&self, conn: ConnId, since: u64) -> Response {
        let plan = self.run.changes_since(since, CHANGES_CHUNK);
        match self.answer_room(conn, plan.weight) {
            Ok(()) => Response::Changes(self.run.changes(&plan, self.now)),
            Err(refused) => refused,
        }
    }

    /// Answers at once when a change newer than `since` happened, else
    /// parks the poll until one does or the timeout passes (then it answers
    /// no changes).
    fn wait_changes(&mut self, conn: ConnId, id: u64, since: u64, timeout: Duration) -> Option<Response> {
        if since == self.run.generation && !timeout.is_zero() {
            return self.park(conn, id, WaitKind::Changes { since }, vec![], timeout, WAITER, &[]).err();
        }
        Some(self.changes_answer(conn, since))
    }

    /// Records a job event (a rank's liveness change, or the abort record
    /// when `rank` is `None`) and answers the polls waiting for one.
    pub(super) fn event(&mut self, rank: Option<u32>, out: &mut Outbox) {
        self.run.record_event(rank);
        for wid in self.run.waiters.status_due(self.run.generation) {
            if let Some(w) = self.unpark(wid) {
                let resp = match w.kind {
                    WaitKind::Changes { since } => self.changes_answer(w.conn, since),
                    _ => self.status_answer(w.conn),
                };
                self.deliver(w.conn, w.id, resp, out);
            }
        }
    }

    /// Sets the job-wide abort record unless one is set; answers whether this
    /// call set it.
    fn abort_job(&mut self, conn: ConnId, record: Vec<u8>, out: &mut Outbox) -> Response {
        if record.len() > MAX_ABORT_RECORD {
            return invalid(
                "abort record",
                format!("{} bytes is over the {MAX_ABORT_RECORD}-byte limit", record.len()),
            );
        }
        if self.run.abort.is_some() {
            return Response::Bool(false);
        }
        if let Err(refused) = self.room(conn, record.len() as u64, 0) {
            return refused;
        }
        tracing::warn!(record = %String::from_utf8_lossy(&record[..record.len().min(512)]), "job abort record set");
        self.charge(record.len() as u64);
        self.run.abort = Some(record);
        self.event(None, out);
        Response::Bool(true)
    }

    fn member_of(&self, conn: ConnId) -> Option<u32> {
        self.session(conn).and_then(|s| s.member_of)
    }

    fn leave(&mut self, conn: ConnId, out: &mut Outbox) -> Response {
        let Some(rank) = self.member_of(conn) else {
            return invalid("leave", "only a rank's member connection can leave the job".into());
        };
        if let Some(s) = self.session_mut(conn) {
            s.member_of = None;
        }
        self.change(rank, Presence::Left, out);
        Response::Ok
    }

    fn heartbeat(&mut self, conn: ConnId, payload: Vec<u8>, out: &mut Outbox) -> Response {
        if payload.len() > MAX_HEARTBEAT {
            return invalid("heartbeat", format!("{} bytes is over the {MAX_HEARTBEAT}-byte limit", payload.len()));
        }
        let Some(rank) = self.member_of(conn) else {
            return invalid("heartbeat", "only a rank's member connection sends heartbeats".into());
        };
        let old = self.run.ranks.get(&rank).and_then(|e| e.heartbeat.as_ref()).map_or(0, |(_, p)| p.len());
        let grow = payload.len().saturating_sub(old) as u64;
        if let Err(refused) = self.room(conn, grow, 0) {
            return refused;
        }
        let Some(entry) = self.run.ranks.get_mut(&rank) else {
            return invalid("heartbeat", "this rank's record is gone".into());
        };
        entry.heartbeat = Some((self.now, payload));
        let new = entry.heartbeat.as_ref().map_or(0, |(_, p)| p.len());
        let was_silent = std::mem::replace(&mut entry.silent, false);
        let (before, now) = (std::mem::replace(&mut entry.beat_at, self.now), self.now);
        if entry.liveness == Presence::Connected {
            self.run.beats.remove(&(before, rank));
            self.run.beats.insert((now, rank));
        }
        self.charge(new as u64);
        self.release(old as u64);
        if was_silent {
            // Beating again is news to the ranks told it went silent.
            tracing::info!(rank, "rank heartbeats again");
            self.event(Some(rank), out);
        }
        Response::Ok
    }

    /// A rank's member connection left or closed.
    pub(super) fn change(&mut self, rank: u32, liveness: Presence, out: &mut Outbox) {
        let Some(entry) = self.run.ranks.get_mut(&rank) else {
            return;
        };
        if entry.liveness != Presence::Connected {
            return;
        }
        match liveness {
            // Once the job has aborted, ranks going away is its teardown, not
            // news: a line each would make a big job's log grow with its size.
            Presence::Vanished if self.run.abort.is_none() => {
                tracing::warn!(rank, host = %entry.host, pid = entry.pid, "rank vanished without leaving")
            }
            Presence::Vanished => {
                tracing::info!(rank, host = %entry.host, pid = entry.pid, "rank vanished after the job aborted")
            }
            _ => tracing::info!(rank, host = %entry.host, pid = entry.pid, "rank left"),
        }
        entry.liveness = liveness;
        entry.changed = self.now;
        entry.silent = false;
        let at = entry.beat_at;
        self.run.beats.remove(&(at, rank));
        self.event(Some(rank), out);
    }

    /// Marks silent the connected ranks whose last heartbeat (or arrival) is
    /// [`Limits::silent_after`] old, each a job event: a stopped process's
    /// connection stays open, so only the missing heartbeats tell.
    pub(super) fn expire_silence(&mut self, out: &mut Outbox) {
        while let Some(&(at, rank)) = self.run.beats.first() {
            if at.checked_add(self.limits.silent_after).is_some_and(|t| t > self.now) {
                break;
            }
            self.run.beats.pop_first();
            let Some(entry) = self.run.ranks.get_mut(&rank) else { continue };
            if entry.liveness != Presence::Connected {
                continue;
            }
            entry.silent = true;
            entry.was_silent = true;
            tracing::info!(rank, host = %entry.host, pid = entry.pid, "rank went silent (no heartbeat)");
            self.event(Some(rank), out);
        }
    }
}

fn over_budget(detail: String) -> Response {
    invalid("store budget", detail)
}

fn key_invalid(key: &str, detail: String) -> Response {
    invalid(format!("key {key:?}"), detail)
}

fn parse_counter(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

/// The start of a value, for messages.
fn preview(v: &[u8]) -> String {
    let head = String::from_utf8_lossy(&v[..v.len().min(32)]).into_owned();
    match v.len() > 32 {
        true => format!("{head:?}... ({} bytes)", v.len()),
        false => format!("{head:?}"),
    }
}
