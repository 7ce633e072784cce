//! One task per connection: decodes frames into events for the actor and
//! writes the actor's answers.
//!
//! Reading never stops while a request waits, because a closed socket is
//! how the store learns that a rank died, and a rank blocked in `get` is
//! exactly the one whose death matters. Reading and writing share one task
//! (a `select!` that prefers writing), so a peer that stops reading stops
//! being read too, which bounds what queues up for it.

use super::runtime::Event;
use crate::codec::{self, ClientMsg, Response, ServerMsg, WireError};
use crate::state::ConnId;
use bytes::{Buf, BytesMut};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tracing::Instrument;

/// A client that connects must say hello within this time.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Read buffer growth step.
const READ_CHUNK: usize = 64 << 10;

/// Why a connection ended.
#[derive(Debug)]
enum End {
    PeerClosed,
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
    _permit: OwnedSemaphorePermit,
) {
    let span = tracing::info_span!("store_conn", conn = conn.0, %peer, rank = tracing::field::Empty);
    async move {
        tune(&stream);
        let (outbox, answers) = mpsc::unbounded_channel();
        if events.send(Event::Opened { conn, outbox }).await.is_err() {
            return;
        }
        let mut c =
            Connection { conn, stream, events: &events, rbuf: BytesMut::new(), wbuf: Vec::new(), greeted: false };
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
}

impl Connection<'_> {
    async fn serve(&mut self, mut answers: mpsc::UnboundedReceiver<ServerMsg>) -> End {
        let hello_by = tokio::time::Instant::now() + HELLO_TIMEOUT;
        loop {
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
                    Ok(_) => {
                        if let Err(end) = self.forward().await {
                            return end;
                        }
                    }
                    Err(e) => return End::Failed(format!("read failed: {e}")),
                },
                () = tokio::time::sleep_until(hello_by), if !self.greeted => {
                    return End::Failed(format!("no hello within {HELLO_TIMEOUT:?}"));
                }
            }
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
        let conn = self.conn;
        match (msg, self.greeted) {
            (ClientMsg::Hello(hello), false) => {
                self.greeted = true;
                if let Some(rank) = hello.rank {
                    tracing::Span::current().record("rank", rank);
                }
                Ok(Some(Event::Hello { conn, hello }))
            }
            (ClientMsg::Request { id, req }, true) => Ok(Some(Event::Request { conn, id, req })),
            (msg, _) => Err(End::Failed(format!("unexpected {msg:?}"))),
        }
    }

    /// Writes `msg` and whatever else is queued in one go. Ends the
    /// connection after a rejection.
    async fn write(&mut self, msg: ServerMsg, answers: &mut mpsc::UnboundedReceiver<ServerMsg>) -> Option<End> {
        self.wbuf.clear();
        let mut rejected = self.encode(msg);
        while let Ok(more) = answers.try_recv() {
            rejected |= self.encode(more);
        }
        if let Err(e) = self.stream.write_all(&self.wbuf).await {
            return Some(End::Failed(format!("write failed: {e}")));
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
