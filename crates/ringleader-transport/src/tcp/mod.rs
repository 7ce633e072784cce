//! TCP: choosing the address to listen on, building the full mesh of
//! connections at init, and the nonblocking socket behind a TCP [`crate::Link`].
//!
//! Every rank listens before it registers at the store, so by the time a
//! peer learns our address the listener exists: a refused connection then
//! means a wrong address or a firewall, never a race. Lower ranks accept,
//! higher ranks connect, all pairs at once on one thread, so a blocked port
//! costs one connect timeout, not one per peer.
//!
//! Where each part lives: `link.rs` the socket as a [`crate::Link`] (and sending
//! by reference with `vmsplice`); `listen.rs` choosing the address and
//! listening; `mesh.rs` connecting every pair at init.

mod link;
mod listen;
mod mesh;

#[cfg(test)]
mod tests;

pub use link::TcpLink;
pub use listen::{ip_of_interface, DataListener, ListenOptions};
pub use mesh::{Mesh, MeshOptions};

#[cfg(test)]
pub(crate) use link::{test_pair, test_pair_sized};
