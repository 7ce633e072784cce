//! The [`Qp`] and [`Device`] traits over rdma-core's verbs, through the
//! `ibverbs-sys` bindings. (Not the safe `ibverbs` wrapper: the protocol
//! registers memory it does not allocate, the callers' buffers and its own
//! slots, through a registration cache, and polls the completion channel's
//! descriptor, none of which the wrapper exposes.)
//!
//! One protection domain per opened device; one completion queue, one
//! completion channel (nonblocking, its descriptor polled beside the abort
//! eventfd) and one registered slot buffer per queue pair. Registrations go
//! through the device's [`RegCache`]. Work request ids carry the slot and,
//! in the top bit, whether it was a send.
//!
//! Nothing here runs without an adapter; `open` fails cleanly with the
//! reason when there is none (no kernel support, no device, no active port).

use super::regcache::{RegCache, Registrar};
use super::{Device, Endpoint, NoDevice, Qp, Wc, WcKind, WcStatus};
use ibverbs_sys as ffi;
use rustix::fd::BorrowedFd;
use std::ffi::CStr;
use std::io;
use std::sync::{Arc, Mutex};

/// Work request ids of sends have this bit set.
const SEND_BIT: u64 = 1 << 63;
/// Registered bytes kept for reuse when unused.
const CACHE_BUDGET: usize = 256 << 20;
/// Completions taken per poll call.
const POLL_BATCH: usize = 32;

/// A memory region's pointer (registrations are keyed by it).
#[derive(Debug, Clone, Copy)]
struct Mr(*mut ffi::ibv_mr);

/// The protection domain, as a [`Registrar`].
struct Pd(*mut ffi::ibv_pd);

impl Registrar for Pd {
    type Key = Mr;

    fn register(&mut self, addr: usize, len: usize) -> io::Result<Mr> {
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: the pd is live (owned by the device context); the range is
        // memory the caller owns for as long as the registration lives.
        let mr = unsafe { ffi::ibv_reg_mr(self.0, addr as *mut _, len, access) };
        if mr.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(Mr(mr))
    }

    fn deregister(&mut self, key: Mr) {
        // SAFETY: `key` came from `ibv_reg_mr` and is deregistered once.
        unsafe { ffi::ibv_dereg_mr(key.0) };
    }
}

/// An opened device: context, protection domain, chosen port.
struct Ctx {
    ctx: *mut ffi::ibv_context,
    pd: Mutex<(Pd, RegCache<Mr>)>,
    port: u8,
    lid: u16,
    gid: Option<(u8, [u8; 16])>,
    mtu: ffi::ibv_mtu,
    name: String,
}

// SAFETY: verbs objects may be used from any thread (rdma-core locks
// internally); the registration cache is behind a mutex.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Drop for Ctx {
    fn drop(&mut self) {
        let mut g = self.pd.lock().unwrap_or_else(|e| e.into_inner());
        let (pd, cache) = &mut *g;
        cache.clear(pd);
        // SAFETY: every queue pair holds an Arc<Ctx>, so none is left; the
        // pd and context are released once.
        unsafe {
            ffi::ibv_dealloc_pd(pd.0);
            ffi::ibv_close_device(self.ctx);
        }
    }
}

/// An opened RDMA adapter port.
#[derive(Clone)]
pub struct IbvDevice {
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for IbvDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvDevice").field("name", &self.ctx.name).finish()
    }
}

/// Opens `name` (`dev` or `dev:port`), or the first device with an active
/// port; the error says why none could be used.
pub fn open(name: Option<&str>) -> Result<IbvDevice, NoDevice> {
    let (want, want_port) = match name.map(|n| n.split_once(':').map_or((n, None), |(d, p)| (d, p.parse::<u8>().ok())))
    {
        Some((d, p)) => (Some(d.to_string()), p),
        None => (None, None),
    };
    let mut tried = Vec::new();
    let mut n = 0i32;
    // SAFETY: the list is freed below; entries are used only before that.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = io::Error::last_os_error();
        return Err(NoDevice(format!(
            "cannot list RDMA devices: {e} (no RDMA support in this kernel, or rdma-core missing)"
        )));
    }
    if n <= 0 {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ffi::ibv_free_device_list(list) };
        return Err(NoDevice("no RDMA device found (ibv_get_device_list is empty)".into()));
    }
    let mut found = None;
    for i in 0..n.max(0) as usize {
        // SAFETY: i < n entries of a live list.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a valid device; the name is a NUL-terminated string owned by it.
        let dname = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) }.to_string_lossy().into_owned();
        if want.as_deref().is_some_and(|w| w != dname) {
            continue;
        }
        match open_one(dev, &dname, want_port.unwrap_or(1)) {
            Ok(c) => {
                found = Some(c);
                break;
            }
            Err(e) => tried.push(format!("{dname}: {e}")),
        }
    }
    // SAFETY: the list came from ibv_get_device_list; opened contexts stay valid.
    unsafe { ffi::ibv_free_device_list(list) };
    match found {
        Some(ctx) => Ok(IbvDevice { ctx: Arc::new(ctx) }),
        None if tried.is_empty() => Err(NoDevice(format!("no RDMA device named {}", want.unwrap_or_default()))),
        None => Err(NoDevice(format!("no usable RDMA device: {}", tried.join("; ")))),
    }
}

fn open_one(dev: *mut ffi::ibv_device, name: &str, port: u8) -> io::Result<Ctx> {
    // SAFETY: `dev` is a live entry of the device list.
    let ctx = unsafe { ffi::ibv_open_device(dev) };
    if ctx.is_null() {
        return Err(io::Error::last_os_error());
    }
    let close = |e: io::Error| {
        // SAFETY: opened above, closed once on this error path.
        unsafe { ffi::ibv_close_device(ctx) };
        e
    };
    let mut attr = ffi::ibv_port_attr::default();
    // SAFETY: ctx is open; the compat struct is a prefix of ibv_port_attr.
    let rc = unsafe { ffi::ibv_query_port(ctx, port, &mut attr as *mut ffi::ibv_port_attr as *mut _) };
    if rc != 0 {
        return Err(close(io::Error::from_raw_os_error(rc)));
    }
    if attr.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
        return Err(close(io::Error::other(format!("port {port} is not active (state {})", attr.state))));
    }
    let ethernet = u32::from(attr.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET;
    let gid_index: Option<u8> = match std::env::var("RINGLEADER_RDMA_GID_INDEX").ok().and_then(|v| v.parse().ok()) {
        Some(i) => Some(i),
        None if ethernet => Some(0),
        None => None,
    };
    let gid = match gid_index {
        Some(i) => {
            let mut g = ffi::ibv_gid::default();
            // SAFETY: ctx is open; `g` is a valid out-parameter.
            let rc = unsafe { ffi::ibv_query_gid(ctx, port, i32::from(i), &mut g) };
            if rc != 0 {
                return Err(close(io::Error::from_raw_os_error(rc)));
            }
            // SAFETY: the union's raw view covers all of it.
            Some((i, unsafe { g.raw }))
        }
        None => None,
    };
    // SAFETY: ctx is open.
    let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return Err(close(io::Error::last_os_error()));
    }
    Ok(Ctx {
        ctx,
        pd: Mutex::new((Pd(pd), RegCache::new(CACHE_BUDGET))),
        port,
        lid: attr.lid,
        gid,
        mtu: attr.active_mtu,
        name: format!("{name}:{port}"),
    })
}

impl Device for IbvDevice {
    fn name(&self) -> String {
        self.ctx.name.clone()
    }

    fn create_qp(&self, slots: usize, chunk: usize) -> io::Result<Box<dyn Qp>> {
        Ok(Box::new(IbvQp::new(self.ctx.clone(), slots, chunk)?))
    }
}

/// One queue pair with its completion queue, channel and slot memory.
pub struct IbvQp {
    ctx: Arc<Ctx>,
    channel: *mut ffi::ibv_comp_channel,
    cq: *mut ffi::ibv_cq,
    qp: *mut ffi::ibv_qp,
    mem: Vec<u8>,
    lkey: u32,
    slots: usize,
    chunk: usize,
    psn: u32,
    /// Events taken from the channel and not yet acknowledged.
    unacked: u32,
    wcs: Vec<ffi::ibv_wc>,
}

// SAFETY: the queue pair is used by one thread at a time (the link owning
// it); verbs objects are not tied to the creating thread.
unsafe impl Send for IbvQp {}

impl std::fmt::Debug for IbvQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvQp").field("device", &self.ctx.name).field("slots", &self.slots).finish()
    }
}

fn errno(rc: i32) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc.abs()))
    }
}

impl IbvQp {
    fn new(ctx: Arc<Ctx>, slots: usize, chunk: usize) -> io::Result<IbvQp> {
        let mut q = IbvQp {
            ctx,
            channel: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            mem: vec![0u8; 2 * slots * chunk],
            lkey: 0,
            slots,
            chunk,
            psn: (std::process::id().wrapping_mul(2654435761)) & 0xff_ffff,
            unacked: 0,
            // SAFETY: ibv_wc is plain C data; all-zero is a valid value.
            wcs: vec![unsafe { std::mem::zeroed() }; POLL_BATCH],
        };
        // Fields are filled one by one so that Drop releases what exists.
        // SAFETY: the context is open.
        q.channel = unsafe { ffi::ibv_create_comp_channel(q.ctx.ctx) };
        if q.channel.is_null() {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the channel's fd is a live descriptor owned by the channel.
        let fd = unsafe { BorrowedFd::borrow_raw((*q.channel).fd) };
        let flags = rustix::fs::fcntl_getfl(fd)?;
        rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
        // SAFETY: context and channel are live.
        q.cq = unsafe { ffi::ibv_create_cq(q.ctx.ctx, (2 * slots + 1) as i32, std::ptr::null_mut(), q.channel, 0) };
        if q.cq.is_null() {
            return Err(io::Error::last_os_error());
        }
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: q.cq,
            recv_cq: q.cq,
            srq: std::ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: slots as u32,
                max_recv_wr: slots as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 1,
        };
        {
            let mut g = q.ctx.pd.lock().unwrap_or_else(|e| e.into_inner());
            let (pd, cache) = &mut *g;
            // SAFETY: pd is live; `init` is a valid attribute block.
            q.qp = unsafe { ffi::ibv_create_qp(pd.0, &mut init) };
            if q.qp.is_null() {
                return Err(io::Error::last_os_error());
            }
            let mr = cache.acquire(pd, q.mem.as_ptr() as usize, q.mem.len())?;
            // SAFETY: mr came from ibv_reg_mr and stays registered while held.
            q.lkey = unsafe { (*mr.0).lkey };
        }
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: q.ctx.port,
            qp_access_flags: ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        // SAFETY: the qp is live; attr/mask describe the INIT transition.
        errno(unsafe { ffi::ibv_modify_qp(q.qp, &mut attr, mask.0 as i32) })?;
        Ok(q)
    }

    fn slot_addr(&self, send: bool, slot: usize) -> u64 {
        let base = if send { 0 } else { self.slots * self.chunk };
        self.mem.as_ptr() as u64 + (base + slot * self.chunk) as u64
    }
}

impl Drop for IbvQp {
    fn drop(&mut self) {
        // SAFETY: each object was created by this queue pair and is
        // destroyed once, queue pair first, with events acknowledged
        // before the completion queue goes.
        unsafe {
            if !self.qp.is_null() {
                ffi::ibv_destroy_qp(self.qp);
            }
            if !self.cq.is_null() {
                if self.unacked > 0 {
                    ffi::ibv_ack_cq_events(self.cq, self.unacked);
                }
                ffi::ibv_destroy_cq(self.cq);
            }
            if !self.channel.is_null() {
                ffi::ibv_destroy_comp_channel(self.channel);
            }
        }
        let mut g = self.ctx.pd.lock().unwrap_or_else(|e| e.into_inner());
        let (pd, cache) = &mut *g;
        cache.invalidate(pd, self.mem.as_ptr() as usize, self.mem.len());
    }
}

fn status(s: ffi::ibv_wc_status::Type) -> WcStatus {
    use ffi::ibv_wc_status as st;
    match s {
        st::IBV_WC_SUCCESS => WcStatus::Success,
        st::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
        st::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
        st::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
        st::IBV_WC_REM_ACCESS_ERR | st::IBV_WC_REM_OP_ERR | st::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteError,
        st::IBV_WC_LOC_PROT_ERR | st::IBV_WC_LOC_LEN_ERR | st::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocalError,
        other => WcStatus::Other(other),
    }
}

impl Qp for IbvQp {
    fn endpoint(&self) -> Endpoint {
        // SAFETY: the qp is live.
        let qpn = unsafe { (*self.qp).qp_num };
        Endpoint { lid: self.ctx.lid, qpn, psn: self.psn, gid: self.ctx.gid.map_or([0; 16], |g| g.1) }
    }

    fn connect(&mut self, remote: &Endpoint) -> io::Result<()> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: self.ctx.mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ffi::ibv_ah_attr {
                dlid: remote.lid,
                sl: 0,
                src_path_bits: 0,
                port_num: self.ctx.port,
                ..Default::default()
            },
            ..Default::default()
        };
        if let Some((index, _)) = self.ctx.gid {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = ffi::ibv_gid { raw: remote.gid };
            attr.ah_attr.grh.hop_limit = 0xff;
            attr.ah_attr.grh.sgid_index = index;
        }
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: the qp is live; attr/mask describe the RTR transition.
        errno(unsafe { ffi::ibv_modify_qp(self.qp, &mut attr, mask.0 as i32) })?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: self.psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        // SAFETY: as above, for the RTS transition.
        errno(unsafe { ffi::ibv_modify_qp(self.qp, &mut attr, mask.0 as i32) })
    }

    fn send_buf(&mut self, slot: usize) -> &mut [u8] {
        &mut self.mem[slot * self.chunk..(slot + 1) * self.chunk]
    }

    fn recv_buf(&self, slot: usize) -> &[u8] {
        let base = self.slots * self.chunk;
        &self.mem[base + slot * self.chunk..base + (slot + 1) * self.chunk]
    }

    fn post_send(&mut self, slot: usize, len: usize, imm: u32) -> io::Result<()> {
        let mut sge = ffi::ibv_sge { addr: self.slot_addr(true, slot), length: len as u32, lkey: self.lkey };
        let mut wr = ffi::ibv_send_wr {
            wr_id: slot as u64 | SEND_BIT,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: if len == 0 { 0 } else { 1 },
            opcode: ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            __bindgen_anon_1: ffi::ibv_send_wr__bindgen_ty_1 { imm_data: imm.to_be() },
            wr: Default::default(),
            qp_type: Default::default(),
            __bindgen_anon_2: Default::default(),
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the qp and its context are live; post_send is set by every
        // provider; `wr` and `sge` outlive the call, and the slot memory is
        // registered and not reused until this send's completion.
        let rc = unsafe {
            let ops = &mut (*(*self.qp).context).ops;
            (ops.post_send.ok_or_else(|| io::Error::other("provider without post_send"))?)(self.qp, &mut wr, &mut bad)
        };
        errno(rc)
    }

    fn post_recv(&mut self, slot: usize) -> io::Result<()> {
        let mut sge = ffi::ibv_sge { addr: self.slot_addr(false, slot), length: self.chunk as u32, lkey: self.lkey };
        let mut wr = ffi::ibv_recv_wr { wr_id: slot as u64, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = std::ptr::null_mut();
        // SAFETY: as for post_send; the receive slot is not read until its
        // completion arrives.
        let rc = unsafe {
            let ops = &mut (*(*self.qp).context).ops;
            (ops.post_recv.ok_or_else(|| io::Error::other("provider without post_recv"))?)(self.qp, &mut wr, &mut bad)
        };
        errno(rc)
    }

    fn poll(&mut self, out: &mut Vec<Wc>) -> io::Result<()> {
        loop {
            // SAFETY: the cq is live; `wcs` holds POLL_BATCH entries.
            let n = unsafe {
                let ops = &mut (*(*self.cq).context).ops;
                (ops.poll_cq.ok_or_else(|| io::Error::other("provider without poll_cq"))?)(
                    self.cq,
                    POLL_BATCH as i32,
                    self.wcs.as_mut_ptr(),
                )
            };
            if n < 0 {
                return Err(io::Error::other("ibv_poll_cq failed"));
            }
            for wc in &self.wcs[..n as usize] {
                let id = wc.wr_id();
                let (kind, slot) = if id & SEND_BIT != 0 {
                    (WcKind::Send, (id & !SEND_BIT) as usize)
                } else {
                    (WcKind::Recv, id as usize)
                };
                let st = wc.error().map_or(WcStatus::Success, |(s, _)| status(s));
                out.push(Wc { kind, slot, status: st, len: wc.len(), imm: u32::from_be(wc.imm_data) });
            }
            if (n as usize) < POLL_BATCH {
                return Ok(());
            }
        }
    }

    fn arm(&mut self) -> io::Result<()> {
        // SAFETY: the cq is live; req_notify_cq is set by every provider.
        let rc = unsafe {
            let ops = &mut (*(*self.cq).context).ops;
            (ops.req_notify_cq.ok_or_else(|| io::Error::other("provider without req_notify_cq"))?)(self.cq, 0)
        };
        errno(rc)
    }

    fn ack_events(&mut self) -> io::Result<()> {
        loop {
            let mut cq = std::ptr::null_mut();
            let mut cq_ctx = std::ptr::null_mut();
            // SAFETY: the channel is live and nonblocking: this returns -1
            // (EAGAIN) at once when no event is queued.
            let rc = unsafe { ffi::ibv_get_cq_event(self.channel, &mut cq, &mut cq_ctx) };
            if rc != 0 {
                break;
            }
            self.unacked += 1;
        }
        if self.unacked > 0 {
            // SAFETY: acknowledging events taken from this cq's channel.
            unsafe { ffi::ibv_ack_cq_events(self.cq, self.unacked) };
            self.unacked = 0;
        }
        Ok(())
    }

    fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel and its descriptor live as long as `self`.
        unsafe { BorrowedFd::borrow_raw((*self.channel).fd) }
    }
}
