//! `rl_config`: explicit init parameters, each falling back to the
//! environment (docs/DESIGN.md §3: explicit arguments first, then torchrun's,
//! Slurm's or Open MPI's variables, then ringleader's own settings).

use crate::error::{fail, invalid};
use ringleader_core::config::Explicit;
use ringleader_core::{Config, Group};
use std::ffi::{c_char, c_int, CStr};
use std::time::Duration;

/// Explicit init parameters for `rl_init`. Fill it with `rl_config_init`
/// (every field "from the environment"), then set what you know.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RlConfig {
    /// This process's rank; negative: from the environment (`RANK`, ...).
    pub rank: i64,
    /// Number of ranks; 0 or negative: from the environment (`WORLD_SIZE`, ...).
    pub world_size: i64,
    /// Host of the store; NULL: `MASTER_ADDR` (or the host of `store_addr`).
    pub master_addr: *const c_char,
    /// Port of the store; 0: `MASTER_PORT` (or the port of `store_addr`).
    pub master_port: c_int,
    /// `host:port` of a store that already runs (a launcher's, or one made
    /// with `rl_store_start`); NULL: `RINGLEADER_STORE_ADDR`, else rank 0
    /// hosts the store on `master_port`.
    pub store_addr: *const c_char,
    /// The job's run id; NULL: `RINGLEADER_RUN_ID` (or torchrun's / Slurm's job id).
    pub run_id: *const c_char,
    /// Shared secret; NULL: `RINGLEADER_TOKEN`.
    pub token: *const c_char,
    /// Hard collective timeout in seconds; 0 or negative: `RINGLEADER_TIMEOUT` or the default (600 s).
    pub timeout_s: f64,
    /// Rendezvous timeout in seconds; 0 or negative: `RINGLEADER_INIT_TIMEOUT` or the default (300 s).
    pub init_timeout_s: f64,
    /// Stall warning delay in seconds; 0 or negative: `RINGLEADER_STALL_WARN` or the default (60 s).
    pub stall_warn_s: f64,
    /// Non-zero: SIGINT aborts the running collective (the process's own
    /// handler still runs). For runtimes that handle Ctrl-C themselves, such as Python.
    pub interrupt_on_sigint: c_int,
    /// For a communicator over a sub-group of the job: the global rank of
    /// each of its ranks (`group_ranks[g]` is group rank `g`'s), so that
    /// every message names global ranks. NULL (or `group_ranks_count` 0):
    /// the communicator is the whole job.
    pub group_ranks: *const i64,
    /// Entries in `group_ranks`; must equal the world size when set.
    pub group_ranks_count: usize,
    /// The sub-group's name, for messages (torch's group name); NULL: the
    /// ranks alone describe it.
    pub group_name: *const c_char,
}

impl Default for RlConfig {
    fn default() -> RlConfig {
        RlConfig {
            rank: -1,
            world_size: 0,
            master_addr: std::ptr::null(),
            master_port: 0,
            store_addr: std::ptr::null(),
            run_id: std::ptr::null(),
            token: std::ptr::null(),
            timeout_s: 0.0,
            init_timeout_s: 0.0,
            stall_warn_s: 0.0,
            interrupt_on_sigint: 0,
            group_ranks: std::ptr::null(),
            group_ranks_count: 0,
            group_name: std::ptr::null(),
        }
    }
}

/// Fills `cfg` with "everything from the environment". Does nothing when
/// `cfg` is NULL.
///
/// # Safety
/// `cfg` must be NULL or valid for writing one `rl_config`.
#[no_mangle]
pub unsafe extern "C" fn rl_config_init(cfg: *mut RlConfig) {
    if !cfg.is_null() {
        // SAFETY: checked non-null above; the caller guarantees it points to writable memory.
        unsafe { cfg.write(RlConfig::default()) };
    }
}

/// Reads an optional C string argument; `Err` holds the recorded code.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string.
pub(crate) unsafe fn opt_str(what: &str, p: *const c_char) -> Result<Option<String>, c_int> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, and the caller guarantees NUL termination.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(|s| Some(s.to_string())).map_err(|_| invalid(what, "is not valid UTF-8"))
}

fn opt_secs(what: &str, s: f64) -> Result<Option<Duration>, c_int> {
    if s.is_nan() || s.is_infinite() || s >= 1e9 {
        return Err(invalid(what, format!("{s} is not a usable number of seconds")));
    }
    Ok((s > 0.0).then(|| Duration::from_secs_f64(s)))
}

/// Splits `host:port` (IPv6 literals in brackets).
fn split_host_port(addr: &str) -> Option<(String, String)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.trim_start_matches('[').trim_end_matches(']').to_string(), port.to_string()))
}

/// Builds the configuration: `cfg`'s explicit fields over the environment.
///
/// # Safety
/// The string fields of `cfg` must be NULL or NUL-terminated strings.
pub(crate) unsafe fn build(cfg: &RlConfig) -> Result<Config, c_int> {
    let rank = usize::try_from(cfg.rank).ok();
    let world_size = usize::try_from(cfg.world_size).ok().filter(|&w| w > 0);
    let master_port = match cfg.master_port {
        0 => None,
        p => Some(u16::try_from(p).map_err(|_| invalid("master_port", format!("{p} is not a port (1-65535)")))?),
    };
    // SAFETY (four calls): the caller guarantees the string fields are NULL or NUL-terminated.
    let master_addr = unsafe { opt_str("master_addr", cfg.master_addr) }?;
    // SAFETY: as above.
    let store_addr = unsafe { opt_str("store_addr", cfg.store_addr) }?.filter(|s| !s.is_empty());
    // SAFETY: as above.
    let run_id = unsafe { opt_str("run_id", cfg.run_id) }?.filter(|s| !s.is_empty());
    // SAFETY: as above.
    let token = unsafe { opt_str("token", cfg.token) }?.filter(|s| !s.is_empty());
    let timeout = opt_secs("timeout_s", cfg.timeout_s)?;
    let init_timeout = opt_secs("init_timeout_s", cfg.init_timeout_s)?;
    let stall_warn = opt_secs("stall_warn_s", cfg.stall_warn_s)?;

    let explicit = Explicit { rank, world_size, master_addr, master_port };
    let env = |k: &str| std::env::var(k).ok();
    // With a store address in hand, MASTER_ADDR/MASTER_PORT are not needed:
    // default them to the store's host and port.
    let store_in_force = store_addr.clone().or_else(|| env("RINGLEADER_STORE_ADDR").filter(|s| !s.is_empty()));
    let from_store = store_in_force.as_deref().and_then(split_host_port);
    let lookup = |k: &str| {
        let v = env(k).filter(|v| !v.trim().is_empty());
        match (k, &from_store) {
            ("MASTER_ADDR", Some((h, _))) => v.or_else(|| Some(h.clone())),
            ("MASTER_PORT", Some((_, p))) => v.or_else(|| Some(p.clone())),
            _ => v,
        }
    };
    let mut c = Config::discover(&explicit, lookup).map_err(|e| fail(&e))?;
    if store_addr.is_some() {
        c.store_addr = store_addr;
    }
    if let Some(r) = run_id {
        c.run_id = r;
    }
    if token.is_some() {
        c.token = token;
    }
    if let Some(t) = timeout {
        c.timeout = t;
    }
    if let Some(t) = init_timeout {
        c.init_timeout = t;
    }
    if let Some(t) = stall_warn {
        c.stall_warn = t;
    }
    c.interrupt_on_sigint = cfg.interrupt_on_sigint != 0;
    // SAFETY: the caller guarantees `group_ranks` holds `group_ranks_count`
    // entries and `group_name` is NULL or NUL-terminated.
    c.group = unsafe { group(cfg, c.world_size) }?;
    Ok(c)
}

/// The sub-group `cfg` describes, checked against the world size.
///
/// # Safety
/// `cfg.group_ranks` must be NULL or valid for `cfg.group_ranks_count`
/// reads; `cfg.group_name` NULL or NUL-terminated.
unsafe fn group(cfg: &RlConfig, world_size: usize) -> Result<Option<Group>, c_int> {
    if cfg.group_ranks.is_null() || cfg.group_ranks_count == 0 {
        return Ok(None);
    }
    if cfg.group_ranks_count != world_size {
        return Err(invalid(
            "group_ranks",
            format!("holds {} ranks for a communicator of {world_size}", cfg.group_ranks_count),
        ));
    }
    // SAFETY: non-null, and the caller guarantees `group_ranks_count` entries.
    let raw = unsafe { std::slice::from_raw_parts(cfg.group_ranks, cfg.group_ranks_count) };
    let mut ranks = Vec::with_capacity(raw.len());
    for &r in raw {
        ranks.push(usize::try_from(r).map_err(|_| invalid("group_ranks", format!("{r} is not a rank")))?);
    }
    let mut sorted = ranks.clone();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid("group_ranks", format!("names a rank twice: {ranks:?}")));
    }
    // SAFETY: per the function contract.
    let name = unsafe { opt_str("group_name", cfg.group_name) }?.filter(|s| !s.is_empty());
    let name = name.unwrap_or_else(|| "(unnamed)".to_string());
    Ok(Some(Group::new(name, ranks)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_fields_win_and_store_addr_stands_in_for_master() {
        let cfg = RlConfig {
            rank: 1,
            world_size: 3,
            store_addr: c"10.0.0.7:4242".as_ptr(),
            run_id: c"job-1".as_ptr(),
            timeout_s: 2.5,
            interrupt_on_sigint: 1,
            ..RlConfig::default()
        };
        // SAFETY: every string field is a static C string or NULL.
        let c = unsafe { build(&cfg) }.unwrap();
        assert_eq!((c.rank, c.world_size), (1, 3));
        assert_eq!(c.store_addr.as_deref(), Some("10.0.0.7:4242"));
        assert_eq!(c.run_id, "job-1");
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert!(c.interrupt_on_sigint);
        if std::env::var("MASTER_ADDR").is_err() {
            assert_eq!(c.master_addr, "10.0.0.7");
        }
    }

    #[test]
    fn a_sub_group_maps_its_ranks_to_global_ones() {
        let ranks = [1i64, 2, 3];
        let cfg = RlConfig {
            rank: 2,
            world_size: 3,
            store_addr: c"10.0.0.7:4242".as_ptr(),
            group_ranks: ranks.as_ptr(),
            group_ranks_count: 3,
            group_name: c"1".as_ptr(),
            ..RlConfig::default()
        };
        // SAFETY: static C strings, and `ranks` outlives the call.
        let c = unsafe { build(&cfg) }.unwrap();
        assert_eq!(c.global_rank(), 3);
        assert_eq!(c.group.unwrap().to_string(), "group 1 (ranks 1-3)");
        let dup = [1i64, 1, 3];
        let cfg = RlConfig { group_ranks: dup.as_ptr(), ..cfg };
        // SAFETY: as above.
        assert_eq!(unsafe { build(&cfg) }.unwrap_err(), 17);
        let cfg = RlConfig { group_ranks_count: 2, ..cfg };
        // SAFETY: as above (two entries are read).
        assert_eq!(unsafe { build(&cfg) }.unwrap_err(), 17);
    }

    #[test]
    fn bad_values_are_invalid_arguments() {
        let cfg = RlConfig { rank: 0, world_size: 1, master_port: 70000, ..RlConfig::default() };
        // SAFETY: no string fields set.
        assert_eq!(unsafe { build(&cfg) }.unwrap_err(), 17);
        let cfg = RlConfig { rank: 0, world_size: 1, timeout_s: f64::NAN, ..RlConfig::default() };
        // SAFETY: no string fields set.
        assert_eq!(unsafe { build(&cfg) }.unwrap_err(), 17);
    }
}
