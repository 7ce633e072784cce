//! Where a rank listens for data connections: the interface or the
//! address toward the store, and a listener bound before registration.

use ringleader_core::{config::join_host_port, Error, Result};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs, UdpSocket};

/// Socket buffer size asked for on data connections. Loopback and LAN
/// throughput need a few MiB in flight.
pub(super) const SOCKET_BUFFER: usize = 4 << 20;

/// Where and how to listen for data connections.
#[derive(Debug, Clone, Default)]
pub struct ListenOptions {
    /// Interface name or prefix (`RINGLEADER_IFNAME`).
    pub ifname: Option<String>,
    /// Inclusive port range (`RINGLEADER_PORT_RANGE`); any free port when `None`.
    pub port_range: Option<(u16, u16)>,
    /// `host:port` of the store; without an interface name we listen on the
    /// address the kernel would use to reach it.
    pub store_endpoint: String,
}

/// A bound listener and the address peers should dial.
#[derive(Debug)]
pub struct DataListener {
    pub(super) listener: TcpListener,
    pub(super) addr: SocketAddr,
}

impl DataListener {
    /// Binds per `opts`.
    ///
    /// ```
    /// use ringleader_transport::tcp::{DataListener, ListenOptions};
    /// let l = DataListener::bind(&ListenOptions { store_endpoint: "127.0.0.1:1".into(), ..Default::default() }).unwrap();
    /// assert!(l.addr().ip().is_loopback());
    /// ```
    pub fn bind(opts: &ListenOptions) -> Result<DataListener> {
        let ip = choose_ip(opts)?;
        let (lo, hi) = opts.port_range.unwrap_or((0, 0));
        let mut last = None;
        for port in lo..=hi {
            match listen_on(SocketAddr::new(ip, port)) {
                Ok(listener) => {
                    let addr = listener
                        .local_addr()
                        .map_err(|e| Error::invalid("RINGLEADER_IFNAME", format!("listener on {ip}: {e}")))?;
                    return Ok(DataListener { listener, addr });
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
                Err(e) => {
                    return Err(Error::invalid(
                        "RINGLEADER_IFNAME",
                        format!("cannot listen on {}: {e}", SocketAddr::new(ip, port)),
                    ))
                }
            }
        }
        let range = format!("{lo}-{hi}");
        Err(Error::PortInUse {
            addr: join_host_port(&ip.to_string(), lo)
                + &format!(
                    " (every port of RINGLEADER_PORT_RANGE {range}: {})",
                    last.map(|e| e.to_string()).unwrap_or_default()
                ),
            holder: None,
        })
    }

    /// The address peers dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Sizes the socket buffers. Set before `listen`/`connect` so that window
/// scaling is negotiated for them.
pub(super) fn set_buffers(s: &Socket) {
    let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = s.set_send_buffer_size(SOCKET_BUFFER);
}

pub(super) fn listen_on(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM.cloexec(), Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    // Buffers must be sized before listen() for accepted sockets to inherit
    // them with window scaling.
    set_buffers(&s);
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// The local IP to listen on: by interface name, else the source address the
/// kernel picks toward the store.
pub(super) fn choose_ip(opts: &ListenOptions) -> Result<IpAddr> {
    if let Some(name) = &opts.ifname {
        return ip_of_interface(name);
    }
    let target = opts.store_endpoint.to_socket_addrs().ok().and_then(|mut a| a.find(|a| a.is_ipv4()));
    if let Some(target) = target {
        if target.ip().is_loopback() {
            return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        // connect() on UDP sends nothing; it only asks the routing table.
        if let Ok(u) = UdpSocket::bind("0.0.0.0:0") {
            if u.connect(target).is_ok() {
                if let Ok(local) = u.local_addr() {
                    return Ok(local.ip());
                }
            }
        }
    }
    Ok(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// The IPv4 address of the interface named `name`, or of the first whose
/// name starts with it (as NCCL_SOCKET_IFNAME does).
///
/// ```
/// let ip = ringleader_transport::tcp::ip_of_interface("lo").unwrap();
/// assert!(ip.is_loopback());
/// ```
pub fn ip_of_interface(name: &str) -> Result<IpAddr> {
    let ifs = if_addrs::get_if_addrs()
        .map_err(|e| Error::invalid("RINGLEADER_IFNAME", format!("cannot list interfaces: {e}")))?;
    let pick = |exact: bool| {
        ifs.iter()
            .filter(|i| i.ip().is_ipv4())
            .find(|i| if exact { i.name == name } else { i.name.starts_with(name) })
            .map(|i| i.ip())
    };
    pick(true).or_else(|| pick(false)).ok_or_else(|| {
        let mut names: Vec<_> =
            ifs.iter().filter(|i| i.ip().is_ipv4()).map(|i| format!("{} ({})", i.name, i.ip())).collect();
        names.dedup();
        Error::invalid(
            "RINGLEADER_IFNAME",
            format!("no IPv4 interface named {name:?} or starting with it; this host has {}", names.join(", ")),
        )
    })
}
