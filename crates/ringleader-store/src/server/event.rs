//! What connection tasks tell the actor that owns the state: the one type
//! the two sides of the server share, in a file of its own so that neither
//! imports the other.

use crate::codec::{ClientHello, Request, ServerMsg};
use crate::state::ConnId;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// One thing that happened on a connection, in the order it happened.
#[derive(Debug)]
pub(super) enum Event {
    /// A connection was accepted; answers to it go to `outbox`.
    Opened { conn: ConnId, outbox: mpsc::UnboundedSender<ServerMsg> },
    /// The connection's hello arrived.
    Hello { conn: ConnId, hello: ClientHello },
    /// A request arrived.
    Request {
        conn: ConnId,
        id: u64,
        req: Request,
        /// The room a large frame took in the input budget, returned once
        /// the state has the request.
        input: Option<OwnedSemaphorePermit>,
    },
    /// Answers weighing this much in all left for the socket.
    Written { conn: ConnId, weight: u64 },
    /// The connection ended, for whatever reason.
    Closed { conn: ConnId },
}
