//! One task per connection: decodes frames into events for the actor and
//! writes the actor's answers.
//!
//! Reading never stops while a request waits, because a closed socket is
//! how the store learns that a rank died, and a rank blocked in `get` is
//! exactly the one whose death matters. Reading and writing share one task
//! (a `select!` that prefers writing), so a peer that stops reading stops
//! being read too, which bounds what queues up for it; what the state
//! queued for it is weighed out again as it is written
//! (`ServerState::written`). A frame over [`SMALL_FRAME`] is read only
//! once it has room in the store-wide input budget ([`InputBudget`]).
//!
//! How long a connection may take to say hello is the state's business: it
//! sends a refusal when the time is up, which ends this task.

use super::event::Event;
use crate::codec::{self, ClientMsg, Request, Response, ServerMsg, WireError};
use crate::state::{weight, ConnId};
use bytes::{Buf, BytesMut};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

/// Read buffer growth step.
const READ_CHUNK: usize = 64 << 10;
/// Frames up to this size are read without asking the input budget (every
/// request ringleader itself sends is far smaller).
pub(super) const SMALL_FRAME: usize = 64 << 10;
/// The input budget's unit.
const KIB: usize = 1 << 10;

/// Room for large frames being read, over every connection, in KiB.
#[derive(Debug, Clone)]
pub(super) struct InputBudget(Arc<Semaphore>, u32);

impl InputBudget {
    pub(super) fn new(bytes: u64) -> InputBudget {
        let kib = (bytes / KIB as u64).clamp(1, Semaphore::MAX_PERMITS as u64).min(u64::from(u32::MAX)) as u32;
        InputBudget(Arc::new(Semaphore::new(kib as usize)), kib)
    }

    /// Waits for room for a frame of `len` bytes (all of the budget for a
    /// frame larger than it).
    async fn room(&self, len: usize) -> Option<OwnedSemaphorePermit> {
        let kib = u32::try_from(len.div_ceil(KIB)).unwrap_or(u32::MAX).min(self.1);
        self.0.clone().acquire_many_owned(kib).await.ok()
    }
}

/// What every connection of a server read and wrote, counted as it
/// happens (for load measurements and `StoreServer::traffic`).
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) bytes_in: AtomicU64,
    pub(super) bytes_out: AtomicU64,
    pub(super) requests: AtomicU64,
    pub(super) writes: AtomicU64,
}

/// Bytes gathered into one write, beyond the first message.
const WRITE_BATCH: usize = 1 << 20;

/// Why a connection ended.
#[derive(Debug)]
enum End {
    PeerClosed,
    /// The peer's end reset the connection: a process that exited (or was
    /// killed) with data still unread. What it means for the job, the state
    /// machine says (a member that vanished is warned about there).
    PeerReset,
    Rejected,
    Shutdown,
    Failed(String),
}

/// Serves one connection until it ends, then tells the actor. The permit
/// returns to the connection limit when this returns.
pub(super) async fn run(
    conn: ConnId,
    stream: TcpStream,
    peer: SocketAddr,
    events: mpsc::Sender<Event>,
    input: InputBudget,
    traffic: Arc<Counters>,
) {
    let span = tracing::info_span!("store_conn", conn = conn.0, %peer, rank = tracing::field::Empty);
    async move {
        tune(&stream);
        let (outbox, answers) = mpsc::unbounded_channel();
        if events.send(Event::Opened { conn, outbox }).await.is_err() {
            return;
        }
        let mut c = Connection {
            conn,
            stream,
            events: &events,
            rbuf: BytesMut::new(),
            wbuf: Vec::new(),
            greeted: false,
            input,
            room: None,
            traffic,
        };
        match c.serve(answers).await {
            End::Failed(why) => tracing::warn!(%why, "store connection dropped"),
            end => tracing::debug!(?end, "store connection ended"),
        }
        let _ = events.send(Event::Closed { conn }).await;
    }
    .instrument(span)
    .await
}

/// No Nagle delay for small request/answer frames, and TCP keepalive so that
/// a peer whose host vanished (no FIN, no RST) is noticed in about 25 s.
fn tune(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%e, "cannot turn off Nagle on a store socket");
    }
    if let Err(e) = keepalive(stream) {
        tracing::debug!(%e, "cannot turn on keepalive on a store socket");
    }
}

fn keepalive(stream: &TcpStream) -> rustix::io::Result<()> {
    use rustix::net::sockopt;
    sockopt::set_socket_keepalive(stream, true)?;
    sockopt::set_tcp_keepidle(stream, Duration::from_secs(10))?;
    sockopt::set_tcp_keepintvl(stream, Duration::from_secs(5))?;
    sockopt::set_tcp_keepcnt(stream, 3)
}

struct Connection<'a> {
    conn: ConnId,
    stream: TcpStream,
    events: &'a mpsc::Sender<Event>,
    rbuf: BytesMut,
    wbuf: Vec<u8>,
    /// Whether the hello arrived (later frames are requests).
    greeted: bool,
    input: InputBudget,
    /// The input budget's room taken for the large frame at the head of
    /// `rbuf`, handed to the actor with it.
    room: Option<OwnedSemaphorePermit>,
    traffic: Arc<Counters>,
}

impl Connection<'_> {
    async fn serve(&mut self, mut answers: mpsc::UnboundedReceiver<ServerMsg>) -> End {
        loop {
            self.take_input_room().await;
            self.make_room();
            tokio::select! {
                biased;
                msg = answers.recv() => match msg {
                    Some(msg) => {
                        if let Some(end) = self.write(msg, &mut answers).await {
                            return end;
                        }
                    }
                    None => return End::Shutdown,
                },
                read = self.stream.read_buf(&mut self.rbuf) => match read {
                    Ok(0) => return End::PeerClosed,
                    Ok(n) => {
                        self.traffic.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                        if let Err(end) = self.forward().await {
                            return end;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return End::PeerReset,
                    Err(e) => return End::Failed(format!("read failed: {e}")),
                },
            }
        }
    }

    /// Before the body of a large frame is read: waits for its room in the
    /// input budget.
    async fn take_input_room(&mut self) {
        let Some(len) = codec::declared_len(&self.rbuf) else { return };
        if self.room.is_none() && self.greeted && len > SMALL_FRAME && len <= codec::MAX_FRAME {
            self.room = self.input.room(len).await;
        }
    }

    /// Reserves room for the frame being read (its length is bounded by the
    /// codec before we get here), or for one more chunk.
    fn make_room(&mut self) {
        let frame = codec::declared_len(&self.rbuf).map_or(0, |len| len + 4);
        let want = frame.saturating_sub(self.rbuf.len()).clamp(READ_CHUNK / 8, READ_CHUNK * 16);
        self.rbuf.reserve(want);
    }

    /// Sends every complete frame in the buffer to the actor.
    async fn forward(&mut self) -> Result<(), End> {
        while let Some(event) = self.next_event()? {
            if self.events.send(event).await.is_err() {
                return Err(End::Shutdown);
            }
        }
        Ok(())
    }

    fn next_event(&mut self) -> Result<Option<Event>, End> {
        let decoded = match self.greeted {
            false => codec::decode_hello(&self.rbuf).map(|o| o.map(|(h, n)| (ClientMsg::Hello(h), n))),
            true => codec::decode_client(&self.rbuf),
        };
        let decoded = decoded.map_err(|e| End::Failed(format!("malformed frame: {e}")))?;
        let Some((msg, used)) = decoded else {
            return Ok(None);
        };
        self.rbuf.advance(used);
        if self.rbuf.is_empty() && self.rbuf.capacity() > READ_CHUNK * 16 {
            // After a large frame: give its memory back.
            self.rbuf = BytesMut::new();
        }
        let conn = self.conn;
        match (msg, self.greeted) {
            (ClientMsg::Hello(hello), false) => {
                self.greeted = true;
                if let Some(rank) = hello.rank {
                    tracing::Span::current().record("rank", rank);
                }
                Ok(Some(Event::Hello { conn, hello }))
            }
            (ClientMsg::Request { id, mut req }, true) => {
                self.traffic.requests.fetch_add(1, Ordering::Relaxed);
                if let Request::Clock { received_ns } = &mut req {
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                    *received_ns = now.map_or(0, |d| d.as_nanos() as u64);
                }
                Ok(Some(Event::Request { conn, id, req, input: self.room.take() }))
            }
            (msg, _) => Err(End::Failed(format!("unexpected {msg:?}"))),
        }
    }

    /// Writes `msg` and whatever else is queued in one go. Ends the
    /// connection after a rejection.
    async fn write(&mut self, msg: ServerMsg, answers: &mut mpsc::UnboundedReceiver<ServerMsg>) -> Option<End> {
        self.wbuf.clear();
        let mut weighs = weight(&msg);
        let mut rejected = self.encode(msg);
        // Up to a few frames at a time: the weights go back once written.
        while self.wbuf.len() < WRITE_BATCH {
            let Ok(more) = answers.try_recv() else { break };
            weighs += weight(&more);
            rejected |= self.encode(more);
        }
        if let Err(e) = self.stream.write_all(&self.wbuf).await {
            return Some(End::Failed(format!("write failed: {e}")));
        }
        self.traffic.bytes_out.fetch_add(self.wbuf.len() as u64, Ordering::Relaxed);
        self.traffic.writes.fetch_add(1, Ordering::Relaxed);
        if self.wbuf.capacity() > WRITE_BATCH {
            self.wbuf = Vec::new();
        }
        if weighs > 0 && self.events.send(Event::Written { conn: self.conn, weight: weighs }).await.is_err() {
            return Some(End::Shutdown);
        }
        rejected.then_some(End::Rejected)
    }

    /// Appends `msg` to the write buffer; answers whether it is a rejection.
    /// An answer too large for one frame is replaced by an error saying so.
    fn encode(&mut self, msg: ServerMsg) -> bool {
        let rejected = matches!(msg, ServerMsg::Reject(_));
        if let Err(e) = codec::encode_server(&msg, &mut self.wbuf) {
            let ServerMsg::Response { id, .. } = msg else {
                tracing::error!(%e, "cannot encode a handshake message");
                return true;
            };
            let detail = format!("the answer cannot be sent: {e}; ask for fewer keys at a time");
            let what = "request".into();
            let resp = Response::Error(WireError::InvalidArgument { what, detail });
            let fallback = ServerMsg::Response { id, resp };
            codec::encode_server(&fallback, &mut self.wbuf).expect("a short error always encodes");
        }
        rejected
    }
}
