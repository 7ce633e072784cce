//! Was a rank that died of SIGKILL killed by the kernel's OOM killer?
//!
//! Two sources, both best-effort (either may be missing or unreadable):
//!
//! 1. The kernel log. The OOM killer logs
//!    `Out of memory: Killed process 1234 (python) total-vm:...` (or
//!    `Memory cgroup out of memory: Killed process ...`) as it sends SIGKILL.
//!    We read `/dev/kmsg` without blocking (needs CAP_SYSLOG or
//!    `kernel.dmesg_restrict=0`), falling back to running `dmesg`, and take
//!    the line that names the dead rank's pid, logged no earlier than shortly
//!    before the rank started (pids are reused; the log is not).
//! 2. The launcher's memory cgroup, which the ranks share: cgroup v2
//!    `memory.events` and cgroup v1 `memory.oom_control` both count kills in
//!    a line `oom_kill N`. The count is read when the launcher starts and
//!    again at each SIGKILL death; a rise with no log line still says "OOM
//!    killer" (without the kernel's words).

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How far before a rank's start a log line may be and still be about it:
/// the kernel log clock and CLOCK_MONOTONIC can drift apart a little.
const LOG_SLACK_US: u64 = 5_000_000;

/// Watches for OOM kills of the launcher's children.
#[derive(Debug)]
pub(crate) struct OomWatch {
    /// The cgroup file with the `oom_kill` count and the count last seen.
    counter: Option<(PathBuf, u64)>,
}

impl OomWatch {
    /// Finds the launcher's cgroup and reads its OOM kill count.
    pub(crate) fn start() -> OomWatch {
        let counter = fs::read_to_string("/proc/self/cgroup")
            .ok()
            .map(|t| counter_files(&t))
            .unwrap_or_default()
            .into_iter()
            .find_map(|p| read_oom_kill(&p).map(|n| (p, n)));
        OomWatch { counter }
    }

    /// After process `pid`, started at `started_us` (CLOCK_MONOTONIC
    /// microseconds, see [`monotonic_us`]), died of SIGKILL: the kernel's
    /// line about it, or a note that the cgroup's OOM kill count rose, or
    /// `None` when nothing points at the OOM killer.
    pub(crate) fn check(&mut self, pid: u32, started_us: u64) -> Option<String> {
        let rose = self.count_rose();
        let since = started_us.saturating_sub(LOG_SLACK_US);
        if let Some(line) = find_kill_in_kernel_log(pid, since) {
            return Some(line);
        }
        if let Some((path, before, after)) = rose {
            // The count went up before the log line was readable; look once more.
            std::thread::sleep(Duration::from_millis(100));
            if let Some(line) = find_kill_in_kernel_log(pid, since) {
                return Some(line);
            }
            return Some(format!("oom_kill in {} rose from {before} to {after}", path.display()));
        }
        None
    }

    /// Re-reads the count; `(file, before, after)` when it went up.
    fn count_rose(&mut self) -> Option<(PathBuf, u64, u64)> {
        let (path, seen) = self.counter.as_mut()?;
        let now = read_oom_kill(path)?;
        let before = std::mem::replace(seen, now);
        (now > before).then(|| (path.clone(), before, now))
    }
}

/// The OOM killer's lines in the kernel log, for `ringleader doctor`.
#[derive(Debug)]
pub(crate) enum KernelLog {
    /// Neither `/dev/kmsg` nor `dmesg` could be read; why.
    Unreadable(String),
    /// Every `Killed process ...` line, oldest first, with its timestamp
    /// (CLOCK_MONOTONIC microseconds) where it has one.
    Kills(Vec<(Option<u64>, String)>),
}

/// Reads the OOM killer's lines from the kernel log (`/dev/kmsg`, else `dmesg`).
pub(crate) fn oom_kills_in_kernel_log() -> KernelLog {
    let is_kill = |m: &str| m.contains("Killed process ");
    match read_kmsg() {
        Ok(records) => KernelLog::Kills(
            records
                .iter()
                .filter_map(|r| parse_kmsg_record(r))
                .filter(|(_, m)| is_kill(m))
                .map(|(ts, m)| (Some(ts), m.trim().to_string()))
                .collect(),
        ),
        Err(kmsg) => {
            let out = std::process::Command::new("dmesg")
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .output();
            match out {
                Ok(o) if o.status.success() => KernelLog::Kills(
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .filter_map(parse_dmesg_line)
                        .filter(|(_, m)| is_kill(m))
                        .map(|(ts, m)| (ts, m.trim().to_string()))
                        .collect(),
                ),
                Ok(o) => KernelLog::Unreadable(format!(
                    "/dev/kmsg: {kmsg}; dmesg: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => KernelLog::Unreadable(format!("/dev/kmsg: {kmsg}; dmesg: {e}")),
            }
        }
    }
}

/// This process's memory cgroup's `oom_kill` count, and the file it is in.
pub(crate) fn cgroup_oom_kills() -> Option<(PathBuf, u64)> {
    OomWatch::start().counter
}

/// CLOCK_MONOTONIC in microseconds, the clock of the kernel log's timestamps.
pub(crate) fn monotonic_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000 + (t.tv_nsec as u64) / 1_000
}

/// The files that may hold the `oom_kill` count of the cgroup described by
/// `/proc/self/cgroup`, most specific first.
fn counter_files(proc_self_cgroup: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut files = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            // cgroup v2: "0::/path".
            files.push(root.join(rel).join("memory.events"));
            files.push(root.join("unified").join(rel).join("memory.events"));
        } else if controllers.split(',').any(|c| c == "memory") {
            // cgroup v1: "4:memory:/path".
            files.push(root.join("memory").join(rel).join("memory.oom_control"));
        }
    }
    // In a container the listed path may be the host's view; the
    // container's own cgroup is then mounted at the root.
    files.push(root.join("memory.events"));
    files.push(root.join("memory").join("memory.oom_control"));
    files.dedup();
    files
}

fn read_oom_kill(path: &Path) -> Option<u64> {
    parse_oom_kill(&fs::read_to_string(path).ok()?)
}

/// The `oom_kill N` count of a `memory.events` or `memory.oom_control` file.
fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some("oom_kill")).then(|| words.next()?.parse().ok()).flatten()
    })
}

/// The kernel's OOM line about `pid`, logged at or after `since_us`.
fn find_kill_in_kernel_log(pid: u32, since_us: u64) -> Option<String> {
    match read_kmsg() {
        Ok(records) => records
            .iter()
            .rev()
            .filter_map(|r| parse_kmsg_record(r))
            .find(|(ts, msg)| *ts >= since_us && names_killed_pid(msg, pid))
            .map(|(_, msg)| msg.trim().to_string()),
        Err(_) => {
            let out = std::process::Command::new("dmesg")
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .rev()
                .filter_map(parse_dmesg_line)
                .find(|(ts, msg)| ts.is_none_or(|t| t >= since_us) && names_killed_pid(msg, pid))
                .map(|(_, msg)| msg.trim().to_string())
        }
    }
}

/// Every record in the kernel's log buffer, read from `/dev/kmsg` without
/// blocking: one `read` returns one record.
fn read_kmsg() -> io::Result<Vec<Vec<u8>>> {
    let mut f = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open("/dev/kmsg")?;
    let mut records = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => records.push(buf[..n].to_vec()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // EPIPE: records were overwritten while we read; the next read
            // continues with the oldest one still there.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(records)
}

/// A `/dev/kmsg` record, `prio,seq,ts_us,flags[,...];message\n[ KEY=value\n]...`:
/// its timestamp in microseconds and its message line.
fn parse_kmsg_record(record: &[u8]) -> Option<(u64, String)> {
    let text = String::from_utf8_lossy(record);
    let (header, rest) = text.split_once(';')?;
    let ts = header.split(',').nth(2)?.parse().ok()?;
    let msg = rest.lines().next().unwrap_or("");
    Some((ts, msg.to_string()))
}

/// A `dmesg` line, `[ 1234.567890] message`: its timestamp in microseconds
/// (when it has one) and its message.
fn parse_dmesg_line(line: &str) -> Option<(Option<u64>, String)> {
    if let Some(rest) = line.strip_prefix('[') {
        if let Some((ts, msg)) = rest.split_once(']') {
            let us = ts.trim().parse::<f64>().ok().map(|s| (s * 1e6) as u64);
            return Some((us, msg.to_string()));
        }
    }
    Some((None, line.to_string()))
}

/// Whether a kernel message is the OOM killer's `Killed process <pid> (...`.
fn names_killed_pid(msg: &str, pid: u32) -> bool {
    let needle = format!("Killed process {pid} ");
    msg.contains(&needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        let v2 = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kill(v2), Some(2));
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n";
        assert_eq!(parse_oom_kill(v1), Some(5));
        assert_eq!(parse_oom_kill("oom 1\n"), None);
    }

    #[test]
    fn cgroup_files() {
        let v2 = counter_files("0::/user.slice/job-1\n");
        assert_eq!(v2[0], PathBuf::from("/sys/fs/cgroup/user.slice/job-1/memory.events"));
        let v1 = counter_files("5:devices:/\n4:memory:/process_api/abc\n0::/\n");
        assert!(v1.contains(&PathBuf::from("/sys/fs/cgroup/memory/process_api/abc/memory.oom_control")));
        assert!(v1.contains(&PathBuf::from("/sys/fs/cgroup/memory.events")));
    }

    #[test]
    fn kernel_lines() {
        let rec = b"3,1234,987654321,-;Out of memory: Killed process 4242 (python) total-vm:123kB, anon-rss:99kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0\n SUBSYSTEM=x\n";
        let (ts, msg) = parse_kmsg_record(rec).unwrap();
        assert_eq!(ts, 987_654_321);
        assert!(msg.starts_with("Out of memory: Killed process 4242 (python)"));
        assert!(!msg.contains("SUBSYSTEM"));
        assert!(names_killed_pid(&msg, 4242));
        assert!(!names_killed_pid(&msg, 424));
        assert!(!names_killed_pid(&msg, 42421));

        let (ts, msg) =
            parse_dmesg_line("[ 1234.500000] Memory cgroup out of memory: Killed process 7 (sh) x").unwrap();
        assert_eq!(ts, Some(1_234_500_000));
        assert!(names_killed_pid(&msg, 7));
        assert_eq!(parse_dmesg_line("plain").unwrap().0, None);
    }

    #[test]
    fn no_false_alarm_for_a_live_pid() {
        let mut watch = OomWatch::start();
        assert_eq!(watch.check(std::process::id(), monotonic_us()), None);
    }
}
