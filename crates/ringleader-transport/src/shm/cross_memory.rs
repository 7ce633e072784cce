//! Reading another process's memory (cross-memory attach,
//! `process_vm_readv`): how a single-copy receive takes a payload straight
//! from the writer, and how set-up proves that it may.

/// Copies `dst.len()` bytes at `addr` in process `pid` into `dst`
/// (cross-memory attach); returns how many arrived.
pub(super) fn read_process(pid: u32, addr: u64, dst: &mut [u8]) -> std::io::Result<usize> {
    let local = libc::iovec { iov_base: dst.as_mut_ptr().cast(), iov_len: dst.len() };
    let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: dst.len() };
    // SAFETY: `local` describes `dst`, which we borrow mutably for the
    // call; the kernel validates the remote range and fails with EFAULT
    // rather than touch anything else.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}
