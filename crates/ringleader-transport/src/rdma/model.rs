//! A software model of reliable-connected verbs queues, for tests.
//!
//! Each queue pair has a *wire* thread that carries its posted sends to the
//! peer one at a time, in order, as an adapter would: it takes the peer's
//! oldest posted receive, copies the bytes, queues a receive completion on
//! the peer and a send completion here, and writes to the completion
//! channel (a pipe) of whichever side armed it. What real queues do on
//! failure is modelled too: a send to a peer without a posted receive is
//! retried, then fails "receiver not ready"; a send to a peer that vanished
//! fails "retry exceeded" after a short timeout; after one failure every
//! later request of that queue pair completes "flushed".
//!
//! Faults can be injected per queue pair through its [`Control`]: dropped
//! credit-only messages (a peer whose credits never come back), an error
//! completion at the n-th send, two messages swapped in flight, inflated
//! credit grants, a per-message delay, and [`Control::kill`] (the process
//! behind the queue pair disappears).
//!
//! Queue pairs find each other by number on a [`Fabric`]: ranks that are
//! threads of one process can use the process-wide [`Fabric::global`]
//! (`RINGLEADER_RDMA_DEVICE=model`).

use super::{Device, Endpoint, Qp, Wc, WcKind, WcStatus};
use parking_lot::Mutex;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::pipe::{pipe_with, PipeFlags};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long a send to a vanished peer takes to fail (real adapters: the
/// retry count times the ack timeout, usually seconds).
const RETRY_TIMEOUT: Duration = Duration::from_millis(30);
/// How long a send waits for the peer to post a receive before it fails
/// "receiver not ready".
const RNR_TIMEOUT: Duration = Duration::from_millis(500);

/// Faults to inject into one queue pair's sends.
#[derive(Debug, Default)]
pub struct Faults {
    /// Credit-only (zero-byte) messages vanish on the wire; their send
    /// completes as if delivered.
    pub drop_credit_only: AtomicBool,
    /// The send of this message (1-based; 0: none) completes with a remote
    /// error instead of being delivered.
    pub fail_send_at: AtomicU64,
    /// The next two messages arrive in swapped order.
    pub swap_next: AtomicBool,
    /// Added to the credit grant of the next message.
    pub extra_credits: AtomicU32,
    /// Delay per message on the wire, in microseconds.
    pub delay_us: AtomicU64,
}

/// The half of a queue pair that its peer's wire reaches.
#[derive(Debug)]
struct Port {
    state: Mutex<PortState>,
    /// Write end of the completion channel.
    notify: OwnedFd,
    alive: AtomicBool,
    faults: Faults,
}

#[derive(Debug, Default)]
struct PortState {
    posted: VecDeque<usize>,
    /// Bytes delivered into each receive slot, taken at poll.
    delivered: Vec<Option<Vec<u8>>>,
    cq: VecDeque<Wc>,
    armed: bool,
    error: bool,
}

impl Port {
    fn complete(&self, wc: Wc) {
        let mut s = self.state.lock();
        s.cq.push_back(wc);
        if s.armed {
            s.armed = false;
            let _ = rustix::io::write(&self.notify, &[1]);
        }
    }
}

/// A network of model queue pairs that can reach each other by number.
#[derive(Debug, Clone, Default)]
pub struct Fabric {
    inner: Arc<FabricInner>,
}

#[derive(Debug, Default)]
struct FabricInner {
    ports: Mutex<HashMap<u32, Weak<Port>>>,
    next_qpn: AtomicU32,
}

impl Fabric {
    /// A fresh, empty fabric.
    pub fn new() -> Fabric {
        Fabric::default()
    }

    /// The process-wide fabric (`RINGLEADER_RDMA_DEVICE=model`).
    pub fn global() -> Fabric {
        static GLOBAL: OnceLock<Fabric> = OnceLock::new();
        GLOBAL.get_or_init(Fabric::new).clone()
    }

    /// A device on this fabric.
    pub fn device(&self) -> ModelDevice {
        ModelDevice { fabric: self.clone() }
    }

    /// A queue pair with `slots` slots of `chunk` bytes, not yet connected.
    pub fn create_qp(&self, slots: usize, chunk: usize) -> io::Result<ModelQp> {
        let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        let qpn = self.inner.next_qpn.fetch_add(1, Ordering::Relaxed) + 1;
        let port = Arc::new(Port {
            state: Mutex::new(PortState { delivered: vec![None; slots], ..PortState::default() }),
            notify: write,
            alive: AtomicBool::new(true),
            faults: Faults::default(),
        });
        self.inner.ports.lock().insert(qpn, Arc::downgrade(&port));
        Ok(ModelQp {
            fabric: self.clone(),
            qpn,
            port,
            read,
            send_bufs: vec![vec![0; chunk]; slots],
            recv_bufs: vec![vec![0; chunk]; slots],
            wire: None,
            sent: 0,
        })
    }
}

/// A [`Device`] on a [`Fabric`].
#[derive(Debug, Clone)]
pub struct ModelDevice {
    fabric: Fabric,
}

impl Device for ModelDevice {
    fn name(&self) -> String {
        "model".into()
    }

    fn create_qp(&self, slots: usize, chunk: usize) -> io::Result<Box<dyn Qp>> {
        Ok(Box::new(self.fabric.create_qp(slots, chunk)?))
    }
}

/// Test handle on one model queue pair: faults, and its disappearance.
#[derive(Debug, Clone)]
pub struct Control {
    port: Arc<Port>,
}

impl Control {
    /// The faults injected into this queue pair's sends.
    pub fn faults(&self) -> &Faults {
        &self.port.faults
    }

    /// The receive slots posted and the completions queued, for messages.
    pub fn queues(&self) -> (usize, usize) {
        let s = self.port.state.lock();
        (s.posted.len(), s.cq.len())
    }

    /// The process behind this queue pair vanishes: nothing reaches it any
    /// more, and its peer's sends fail after the retry timeout.
    pub fn kill(&self) {
        self.port.alive.store(false, Ordering::Release);
    }
}

/// A message on the wire.
#[derive(Debug)]
struct Msg {
    data: Vec<u8>,
    imm: u32,
    slot: usize,
    index: u64,
}

/// One model queue pair.
#[derive(Debug)]
pub struct ModelQp {
    fabric: Fabric,
    qpn: u32,
    port: Arc<Port>,
    read: OwnedFd,
    send_bufs: Vec<Vec<u8>>,
    recv_bufs: Vec<Vec<u8>>,
    wire: Option<mpsc::Sender<Msg>>,
    sent: u64,
}

impl ModelQp {
    /// The handle tests use to inject faults or kill this queue pair.
    pub fn control(&self) -> Control {
        Control { port: self.port.clone() }
    }
}

impl Drop for ModelQp {
    fn drop(&mut self) {
        // A destroyed queue pair is gone for its peer, as after a crash.
        self.port.alive.store(false, Ordering::Release);
        self.fabric.inner.ports.lock().remove(&self.qpn);
    }
}

impl Qp for ModelQp {
    fn endpoint(&self) -> Endpoint {
        Endpoint { lid: 0, qpn: self.qpn, psn: 0, gid: [0; 16] }
    }

    fn connect(&mut self, remote: &Endpoint) -> io::Result<()> {
        let peer = self.fabric.inner.ports.lock().get(&remote.qpn).and_then(Weak::upgrade).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no queue pair {} on the model fabric (model ranks must be threads of one process)",
                    remote.qpn
                ),
            )
        })?;
        let (tx, rx) = mpsc::channel();
        let me = self.port.clone();
        std::thread::Builder::new()
            .name(format!("rdma-model-wire-{}", self.qpn))
            .spawn(move || wire(rx, &me, &peer))?;
        self.wire = Some(tx);
        Ok(())
    }

    fn send_buf(&mut self, slot: usize) -> &mut [u8] {
        &mut self.send_bufs[slot]
    }

    fn recv_buf(&self, slot: usize) -> &[u8] {
        &self.recv_bufs[slot]
    }

    fn post_send(&mut self, slot: usize, len: usize, imm: u32) -> io::Result<()> {
        let wire = self.wire.as_ref().ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "not connected"))?;
        self.sent += 1;
        let msg = Msg { data: self.send_bufs[slot][..len].to_vec(), imm, slot, index: self.sent };
        wire.send(msg).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the wire thread ended"))
    }

    fn post_recv(&mut self, slot: usize) -> io::Result<()> {
        let mut s = self.port.state.lock();
        if s.error {
            drop(s);
            self.port.complete(Wc { kind: WcKind::Recv, slot, status: WcStatus::Flushed, len: 0, imm: 0 });
            return Ok(());
        }
        s.posted.push_back(slot);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Wc>) -> io::Result<()> {
        let mut s = self.port.state.lock();
        while let Some(wc) = s.cq.pop_front() {
            if wc.kind == WcKind::Recv && wc.status == WcStatus::Success {
                if let Some(data) = s.delivered[wc.slot].take() {
                    self.recv_bufs[wc.slot][..data.len()].copy_from_slice(&data);
                }
            }
            out.push(wc);
        }
        Ok(())
    }

    fn arm(&mut self) -> io::Result<()> {
        self.port.state.lock().armed = true;
        Ok(())
    }

    fn ack_events(&mut self) -> io::Result<()> {
        let mut b = [0u8; 64];
        loop {
            match rustix::io::read(&self.read, &mut b) {
                Ok(0) | Err(rustix::io::Errno::AGAIN) => return Ok(()),
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }
}

/// The wire thread of one queue pair: delivers its sends in order.
fn wire(rx: mpsc::Receiver<Msg>, me: &Port, peer: &Port) {
    let mut held: Option<Msg> = None;
    while let Ok(mut msg) = rx.recv() {
        let delay = me.faults.delay_us.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        let extra = me.faults.extra_credits.swap(0, Ordering::Relaxed);
        msg.imm = msg.imm.wrapping_add(extra);
        if held.is_none() && me.faults.swap_next.swap(false, Ordering::Relaxed) {
            held = Some(msg);
            continue;
        }
        deliver(msg, me, peer);
        if let Some(h) = held.take() {
            deliver(h, me, peer);
        }
    }
}

fn send_done(me: &Port, slot: usize, status: WcStatus) {
    if status != WcStatus::Success {
        me.state.lock().error = true;
    }
    me.complete(Wc { kind: WcKind::Send, slot, status, len: 0, imm: 0 });
}

fn deliver(msg: Msg, me: &Port, peer: &Port) {
    if me.state.lock().error {
        return send_done(me, msg.slot, WcStatus::Flushed);
    }
    if me.faults.fail_send_at.load(Ordering::Relaxed) == msg.index {
        return send_done(me, msg.slot, WcStatus::RemoteError);
    }
    if msg.data.is_empty() && me.faults.drop_credit_only.load(Ordering::Relaxed) {
        return send_done(me, msg.slot, WcStatus::Success);
    }
    let start = Instant::now();
    loop {
        if !peer.alive.load(Ordering::Acquire) {
            std::thread::sleep(RETRY_TIMEOUT);
            return send_done(me, msg.slot, WcStatus::RetryExceeded);
        }
        let mut s = peer.state.lock();
        if let Some(slot) = s.posted.pop_front() {
            let len = msg.data.len();
            s.delivered[slot] = Some(msg.data);
            drop(s);
            peer.complete(Wc { kind: WcKind::Recv, slot, status: WcStatus::Success, len, imm: msg.imm });
            return send_done(me, msg.slot, WcStatus::Success);
        }
        drop(s);
        if start.elapsed() >= RNR_TIMEOUT {
            return send_done(me, msg.slot, WcStatus::RnrRetryExceeded);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}
