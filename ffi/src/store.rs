//! `rl_store`: a ringleader store server hosted in this process, for
//! bindings that choose where the store lives (the PyTorch backend starts
//! one on an ephemeral port and tells the other ranks its address through
//! torch's own store).

use crate::config::opt_str;
use crate::error::{fail, guard, invalid, RL_OK};
use ringleader_core::{Error, OpKind};
use ringleader_store::{ClientOptions, Presence, Role, ServerOptions, StoreClient, StoreServer};
use std::ffi::{c_char, c_int};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A running store server (opaque).
#[derive(Debug)]
pub struct RlStore {
    server: StoreServer,
    run_id: String,
    token: Option<String>,
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

/// Starts a store server on `bind_addr` (`host:port`; port 0 picks a free
/// one, e.g. `"0.0.0.0:0"`) for run `run_id` (NULL: any run, several side by side) that admits
/// only clients knowing `token` (NULL: anyone). `*out` receives the handle.
///
/// # Safety
/// The strings NULL or NUL-terminated (`bind_addr` not NULL); `out` writable.
#[no_mangle]
pub unsafe extern "C" fn rl_store_start(
    bind_addr: *const c_char,
    run_id: *const c_char,
    token: *const c_char,
    out: *mut *mut RlStore,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return invalid("out", "is NULL");
        }
        // SAFETY: non-null and writable (caller guarantee).
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY (three calls): the caller guarantees NULL or NUL-terminated strings.
        let bind = tri!(unsafe { opt_str("bind_addr", bind_addr) });
        let Some(bind) = bind else { return invalid("bind_addr", "is NULL") };
        // SAFETY: as above.
        let run_id = tri!(unsafe { opt_str("run_id", run_id) }).filter(|s| !s.is_empty()).unwrap_or("*".into());
        // SAFETY: as above.
        let token = tri!(unsafe { opt_str("token", token) }).filter(|s| !s.is_empty());
        let mut opts = ServerOptions::new(run_id.clone());
        opts.token = token.clone();
        match StoreServer::bind(&bind, opts) {
            Ok(server) => {
                // SAFETY: `out` is non-null and writable.
                unsafe { out.write(Box::into_raw(Box::new(RlStore { server, run_id, token }))) };
                RL_OK
            }
            Err(e) => fail(&e),
        }
    })
}

/// The port the store listens on, or -1 when `store` is NULL.
///
/// # Safety
/// `store` NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rl_store_port(store: *const RlStore) -> c_int {
    crate::error::guard_value(-1, || {
        // SAFETY: forwarded caller guarantee.
        unsafe { store.as_ref() }.map_or(-1, |s| c_int::from(s.server.local_addr().port()))
    })
}

/// The address the store is bound to (`0.0.0.0:41234`); `*out` receives a
/// string to free with `rl_string_free`. Other hosts need a reachable host
/// name with this port.
///
/// # Safety
/// `store` NULL or live; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn rl_store_addr(store: *const RlStore, out: *mut *mut c_char) -> c_int {
    guard(|| {
        if out.is_null() {
            return invalid("out", "is NULL");
        }
        // SAFETY: forwarded caller guarantee.
        let Some(s) = (unsafe { store.as_ref() }) else { return invalid("store", "is NULL") };
        let addr = crate::error::c_string(&s.server.local_addr().to_string());
        // SAFETY: non-null and writable (caller guarantee).
        unsafe { out.write(addr.into_raw()) };
        RL_OK
    })
}

/// Waits at most `timeout_s` seconds until no rank is connected to the
/// store any more (each left or vanished), so that closing it does not cut
/// off ranks that are still finishing. Returns 0, or `timeout` with the
/// ranks still connected.
///
/// # Safety
/// `store` NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rl_store_wait_idle(store: *const RlStore, timeout_s: f64) -> c_int {
    guard(|| {
        // SAFETY: forwarded caller guarantee.
        let Some(s) = (unsafe { store.as_ref() }) else { return invalid("store", "is NULL") };
        if !(0.0..1e9).contains(&timeout_s) {
            return invalid("timeout_s", format!("{timeout_s} is not a usable number of seconds"));
        }
        match wait_idle(s, Duration::from_secs_f64(timeout_s)) {
            Ok(()) => RL_OK,
            Err(e) => fail(&e),
        }
    })
}

/// Serves a job to its end: waits at most `join_timeout_s` seconds for a
/// first rank to join, then until no rank is connected any more (every one
/// left or vanished), however long the job runs. What a store process of its
/// own runs (the Python package's detached store, which must outlive any one
/// rank so that its death is still reported). Returns 0, or `timeout` when
/// no rank joined in time.
///
/// # Safety
/// `store` NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rl_store_serve_job(store: *const RlStore, join_timeout_s: f64) -> c_int {
    guard(|| {
        // SAFETY: forwarded caller guarantee.
        let Some(s) = (unsafe { store.as_ref() }) else { return invalid("store", "is NULL") };
        if !(0.0..1e9).contains(&join_timeout_s) {
            return invalid("join_timeout_s", format!("{join_timeout_s} is not a usable number of seconds"));
        }
        match serve_job(s, Duration::from_secs_f64(join_timeout_s)) {
            Ok(()) => RL_OK,
            Err(e) => fail(&e),
        }
    })
}

fn serve_job(s: &RlStore, join_timeout: Duration) -> ringleader_core::Result<()> {
    let deadline = Instant::now() + join_timeout;
    let mut client = tool_client(s, join_timeout)?;
    let mut since = None;
    loop {
        let status = client.status(since, Duration::from_secs(1))?;
        let joined = !status.ranks.is_empty();
        if joined && status.with(Presence::Connected).is_empty() {
            return Ok(());
        }
        if !joined && Instant::now() >= deadline {
            return Err(Error::Timeout { op: OpKind::Barrier, seq: 0, waited: join_timeout, awaited: Vec::new() });
        }
        since = Some(status.generation);
    }
}

/// A tool connection to the store `s` serves.
fn tool_client(s: &RlStore, connect_limit: Duration) -> ringleader_core::Result<StoreClient> {
    let bound = s.server.local_addr();
    let ip = if bound.ip().is_unspecified() {
        if bound.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        }
    } else {
        bound.ip()
    };
    // A viewer: it reads the status and writes nothing.
    let mut opts = ClientOptions::new(s.run_id.clone());
    opts.role = Role::Tool;
    opts.token = s.token.clone();
    opts.connect_timeout = connect_limit.min(Duration::from_secs(5));
    StoreClient::connect(&SocketAddr::new(ip, bound.port()).to_string(), opts)
}

fn wait_idle(s: &RlStore, limit: Duration) -> ringleader_core::Result<()> {
    let deadline = Instant::now() + limit;
    let mut client = match tool_client(s, limit) {
        Ok(c) => c,
        // A store of any run that no rank ever joined: nobody to wait for.
        Err(Error::InvalidArgument { detail, .. }) if s.run_id == "*" && detail.contains("no run yet") => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut since = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let status = client.status(since, left.min(Duration::from_secs(1)))?;
        let connected = status.with(Presence::Connected);
        if connected.is_empty() {
            return Ok(());
        }
        if left.is_zero() {
            return Err(Error::Timeout { op: OpKind::Barrier, seq: 0, waited: limit, awaited: connected });
        }
        since = Some(status.generation);
    }
}

/// Stops the store server (connections close) and frees the handle. NULL
/// is ignored.
///
/// # Safety
/// `store` NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn rl_store_free(store: *mut RlStore) {
    guard(|| {
        if !store.is_null() {
            // SAFETY: the caller hands over a live handle made by Box::into_raw.
            let s = unsafe { Box::from_raw(store) };
            s.server.shutdown();
        }
        RL_OK
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_report_wait_and_free() {
        let mut s = std::ptr::null_mut();
        // SAFETY: static strings, writable out pointer.
        let code = unsafe { rl_store_start(c"127.0.0.1:0".as_ptr(), c"t".as_ptr(), std::ptr::null(), &mut s) };
        assert_eq!(code, 0);
        // SAFETY: live handle.
        let port = unsafe { rl_store_port(s) };
        assert!(port > 0);
        // SAFETY: live handle; nobody connected, so idle at once.
        assert_eq!(unsafe { rl_store_wait_idle(s, 2.0) }, 0);
        let mut addr = std::ptr::null_mut();
        // SAFETY: live handle, writable out pointer.
        assert_eq!(unsafe { rl_store_addr(s, &mut addr) }, 0);
        // SAFETY: a string from rl_store_addr.
        let a = unsafe { std::ffi::CStr::from_ptr(addr) }.to_str().unwrap().to_string();
        assert_eq!(a, format!("127.0.0.1:{port}"));
        // SAFETY: handing the string and handle back.
        unsafe {
            crate::comm::rl_string_free(addr);
            rl_store_free(s);
        }
    }

    #[test]
    fn a_store_of_any_run_that_nobody_joined_is_idle() {
        let mut s = std::ptr::null_mut();
        // SAFETY: static string, NULL run id and token, writable out pointer.
        let code = unsafe { rl_store_start(c"127.0.0.1:0".as_ptr(), std::ptr::null(), std::ptr::null(), &mut s) };
        assert_eq!(code, 0);
        // SAFETY: live handle.
        assert_eq!(unsafe { rl_store_wait_idle(s, 2.0) }, 0);
        // SAFETY: handing the handle back.
        unsafe { rl_store_free(s) };
    }

    #[test]
    fn a_taken_port_is_port_in_use() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = crate::error::c_string(&held.local_addr().unwrap().to_string());
        let mut s = std::ptr::null_mut();
        // SAFETY: valid strings, writable out pointer.
        let code = unsafe { rl_store_start(addr.as_ptr(), std::ptr::null(), std::ptr::null(), &mut s) };
        assert_eq!(code, ringleader_core::ErrorKind::PortInUse.code());
        assert!(s.is_null());
    }
}
