//! The job's secret when the user set none.
//!
//! A store that admits anyone can be read, steered and aborted by any process
//! that reaches its port, loopback included on a host shared with other
//! users. So `ringleader launch` (one node) and `ringleader perf` make a
//! random token when RINGLEADER_TOKEN is not set, and hand it to their ranks
//! in the environment. Tools started by the same user on the same host
//! (`ringleader status` from another terminal) find it in a file only that
//! user can read, under a private directory (`$TMPDIR/ringleader-$UID`,
//! 0700, owned by the user, not a symlink), named after the store's port;
//! the launcher removes the file when the job ends. A launcher that was
//! killed cannot: the file also names the process that wrote it (pid and
//! start time), and a tool that finds the writer gone removes the file
//! instead of offering its token to whatever store holds that port now.
//! Across nodes there is no such channel: a multi-node launch without
//! RINGLEADER_TOKEN says so once.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

/// The variable that holds the job's secret.
pub(crate) const TOKEN_VAR: &str = "RINGLEADER_TOKEN";

/// 16 random bytes from the kernel, as hex.
pub(crate) fn new_token() -> io::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// This user's private directory for ringleader's secrets, created 0700 if
/// missing; refused when it is a symlink, another user's, or open to others.
pub(crate) fn private_dir() -> io::Result<PathBuf> {
    let uid = rustix::process::getuid().as_raw();
    let dir = std::env::temp_dir().join(format!("ringleader-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a private directory of this user (a symlink, another owner, or open to others)",
                dir.display()
            ),
        ));
    }
    Ok(dir)
}

fn token_path(port: u16) -> io::Result<PathBuf> {
    Ok(private_dir()?.join(format!("store-{port}.token")))
}

/// A token file, removed when dropped.
#[derive(Debug)]
pub(crate) struct TokenFile {
    path: PathBuf,
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Leaves `token` for this user's tools that talk to the store on `port`.
pub(crate) fn publish(port: u16, token: &str) -> io::Result<TokenFile> {
    let path = token_path(port)?;
    // A file left by a job that was killed: the port is ours now.
    let _ = std::fs::remove_file(&path);
    let mut f =
        OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(&path)?;
    let pid = std::process::id();
    let writer = start_time(pid).map_or(String::new(), |t| format!("{pid} {t}\n"));
    f.write_all(format!("{token}\n{writer}").as_bytes())?;
    Ok(TokenFile { path })
}

/// When process `pid` started (clock ticks since boot, /proc's field 22),
/// which tells it from a later process given the same pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from its ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The token a launcher of this user left for the store on `port`, if any.
/// A file whose writer is gone (a launcher that was killed) is removed,
/// not read: the port may serve another store now.
pub(crate) fn find(port: u16) -> Option<String> {
    let path = token_path(port).ok()?;
    let f = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path).ok()?;
    let mut s = String::new();
    f.take(4096).read_to_string(&mut s).ok()?;
    let mut lines = s.lines();
    let t = lines.next().unwrap_or_default().trim().to_string();
    let writer: Vec<u64> = lines.next().unwrap_or_default().split_whitespace().filter_map(|x| x.parse().ok()).collect();
    if let [pid, started] = writer[..] {
        let alive = u32::try_from(pid).ok().and_then(start_time) == Some(started);
        if !alive {
            let _ = std::fs::remove_file(&path);
            return None;
        }
    }
    (!t.is_empty()).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_token_is_found_then_gone() {
        let t = new_token().unwrap();
        assert_eq!(t.len(), 32);
        assert_ne!(t, new_token().unwrap());
        // A port number no store listens on in tests.
        let port = 1;
        let f = publish(port, &t).unwrap();
        assert_eq!(find(port), Some(t));
        let mode = std::fs::metadata(token_path(port).unwrap()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(f);
        assert_eq!(find(port), None);
    }

    #[test]
    fn a_token_left_by_a_process_that_is_gone_is_removed_not_used() {
        let port = 2;
        let path = token_path(port).unwrap();
        let _ = std::fs::remove_file(&path);
        // A real process that ended: its pid and start time, as a killed
        // launcher's file would name them.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let (pid, started) = (child.id(), start_time(child.id()));
        child.wait().unwrap();
        let writer = started.map_or(format!("{pid} 1"), |t| format!("{pid} {t}"));
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).unwrap();
        f.write_all(format!("{}\n{writer}\n", new_token().unwrap()).as_bytes()).unwrap();
        assert_eq!(find(port), None);
        assert!(!path.exists(), "the stale file is removed");
        // This process is alive: its file is read.
        let t = new_token().unwrap();
        let live = publish(port, &t).unwrap();
        assert_eq!(find(port), Some(t));
        drop(live);
    }
}
