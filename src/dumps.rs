//! Where flight-recorder dumps go, and writing them safely.
//!
//! Dumps go to `RINGLEADER_DUMP_DIR/<run>/` (see
//! [`ringleader_core::Config::run_dump_dir`]); by default the folder is
//! `$TMPDIR/ringleader-dumps-$UID`, one per user. On a shared host `/tmp` is
//! everyone's, so nothing here trusts what it finds there:
//!
//! - the default folder and every run folder are created with mode 0700,
//!   opened without following a symbolic link, and refused unless this user
//!   owns them (a folder someone else planted, or a link, is an error, and
//!   no dump is written);
//! - a dump is written to a temporary file created next to its final name
//!   (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600) and then renamed over it,
//!   so a reader never sees half a dump, and a link planted at the final
//!   name is replaced, never followed.
//!
//! A folder named by `RINGLEADER_DUMP_DIR` is the user's choice: it is
//! created if missing (0700) and may itself be reached through a link; the
//! run folder inside it is checked as above.

use rustix::fd::OwnedFd;
use rustix::fs::{Mode, OFlags};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Creates (0700, where missing) and opens `dir` for writing dumps into:
/// `strict` refuses a symbolic link or a folder another user owns (and
/// makes a folder of ours that others can read private again).
pub(crate) fn open_dir(dir: &Path, strict: bool) -> io::Result<OwnedFd> {
    if strict {
        match rustix::fs::mkdir(dir, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    } else {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    let mut flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if strict {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = rustix::fs::open(dir, flags, Mode::empty()).map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => io::Error::other(format!(
            "{} is a symbolic link or not a folder; refusing to write dumps through it",
            dir.display()
        )),
        e => e.into(),
    })?;
    if strict {
        let st = rustix::fs::fstat(&fd)?;
        let me = rustix::process::getuid().as_raw();
        if st.st_uid != me {
            return Err(io::Error::other(format!(
                "{} belongs to uid {}, not to this user (uid {me}); refusing to write dumps into it (set \
                 RINGLEADER_DUMP_DIR to a folder of yours)",
                dir.display(),
                st.st_uid
            )));
        }
        if st.st_mode & 0o077 != 0 {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700))?;
        }
    }
    Ok(fd)
}

/// Writes `data` as `name` in the folder `dir`: to a temporary file first,
/// renamed over `name` once complete (replacing whatever is there, a link
/// included, without following it).
pub(crate) fn write_in(dir: &OwnedFd, name: &str, data: &[u8]) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let tmp = format!(".{name}.{}.{}.tmp", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, tmp.as_str(), flags, Mode::from_raw_mode(0o600))?;
    let written = (|| {
        let mut rest = data;
        while !rest.is_empty() {
            match rustix::io::write(&fd, rest) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => rest = &rest[n..],
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        drop(fd);
        rustix::fs::renameat(dir, tmp.as_str(), dir, name)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), rustix::fs::AtFlags::empty());
    }
    written
}

/// Writes a dump named `name` of the run `cfg` describes, into
/// [`ringleader_core::Config::run_dump_dir`]; returns its path.
pub(crate) fn write_run_dump(cfg: &ringleader_core::Config, name: &str, data: &[u8]) -> io::Result<PathBuf> {
    // The default folder is in everyone's /tmp: trust nothing found there.
    let default = cfg.dump_dir == ringleader_core::config::default_dump_dir();
    open_dir(&cfg.dump_dir, default)?;
    let run = cfg.run_dump_dir();
    let fd = open_dir(&run, true)?;
    write_in(&fd, name, data)?;
    Ok(run.join(name))
}

/// Writes `data` to `path`, in its folder as [`write_in`] does; `strict`
/// as for [`open_dir`] (applied to that folder).
pub(crate) fn write_file(path: &Path, data: &[u8], strict: bool) -> io::Result<()> {
    let (dir, name) = match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(d), Some(n)) => (if d.as_os_str().is_empty() { Path::new(".") } else { d }, n),
        _ => return Err(io::Error::other(format!("{} is not a file path", path.display()))),
    };
    let fd = open_dir(dir, strict)?;
    write_in(&fd, name, data)
}

/// Reads the text file at `path`, refusing one over `max` bytes or a
/// symbolic link (a dump folder is private, but a reader still does not
/// follow what it did not write).
pub(crate) fn read_bounded(path: &Path, max: u64) -> io::Result<String> {
    use std::io::Read;
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::open(path, flags, Mode::empty())?;
    let mut text = String::new();
    std::fs::File::from(fd).take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(io::Error::other(format!("{} is over {max} bytes", path.display())));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rl-dumps-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_link_at_the_dump_path_is_replaced_not_followed() {
        let d = scratch("link");
        let target = d.join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        let run = d.join("run");
        let fd = open_dir(&run, true).unwrap();
        std::os::unix::fs::symlink(&target, run.join("ringleader-rank0.json")).unwrap();
        write_in(&fd, "ringleader-rank0.json", b"{}").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
        let meta = std::fs::symlink_metadata(run.join("ringleader-rank0.json")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(std::fs::read(run.join("ringleader-rank0.json")).unwrap(), b"{}");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_folder_of_another_user_is_refused() {
        if rustix::process::getuid().as_raw() != 0 {
            return; // handing a folder to another user needs root
        }
        let d = scratch("owner");
        let theirs = d.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = open_dir(&theirs, true).unwrap_err();
        assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_link_as_the_folder_is_refused() {
        let d = scratch("dirlink");
        let elsewhere = d.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, d.join("run")).unwrap();
        let e = write_file(&d.join("run").join("ringleader-rank0.json"), b"{}", true).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
