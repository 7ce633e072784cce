//! Who holds a port: the answer a person needs when a listen fails.
//!
//! Linux lists listening sockets with their inode in `/proc/net/tcp{,6}`, and
//! every process's open sockets as `socket:[inode]` links under
//! `/proc/PID/fd`. Processes of other users cannot be inspected without
//! privileges; then the owner's uid is all we can say.

use std::collections::HashMap;
use std::fs;

/// Describes the process listening on TCP `port` on this host, e.g.
/// `"pid 1234 (python3)"`, or `"a process of uid 1000 (...)"` when its
/// descriptors cannot be inspected. `None` when nothing listens there or
/// `/proc` is unavailable.
///
/// ```
/// let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
/// let port = listener.local_addr().unwrap().port();
/// let holder = ringleader_store::port_holder(port).unwrap();
/// assert!(holder.starts_with(&format!("pid {} ", std::process::id())), "{holder}");
/// ```
pub fn port_holder(port: u16) -> Option<String> {
    let listeners = listening_inodes(port);
    let (_, uid) = listeners.iter().next()?;
    let uid = *uid;
    match owner_of(&listeners) {
        Some((pid, name)) => Some(format!("pid {pid} ({name})")),
        None => Some(format!("a process of uid {uid} (its pid is not visible to this user)")),
    }
}

/// Inode -> owner uid of the sockets listening on `port`.
fn listening_inodes(port: u16) -> HashMap<u64, u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| fs::read_to_string(path).ok())
        .flat_map(|table| table.lines().skip(1).filter_map(|line| parse_listener(line, port)).collect::<Vec<_>>())
        .collect()
}

/// Parses one `/proc/net/tcp` row: `sl local rem st tx:rx tr:when retr uid timeout inode ...`.
fn parse_listener(line: &str, port: u16) -> Option<(u64, u32)> {
    const LISTEN: &str = "0A";
    let fields: Vec<&str> = line.split_whitespace().collect();
    let local_port = fields.get(1)?.rsplit_once(':')?.1;
    if u16::from_str_radix(local_port, 16).ok()? != port || *fields.get(3)? != LISTEN {
        return None;
    }
    let uid = fields.get(7)?.parse().ok()?;
    let inode = fields.get(9)?.parse().ok().filter(|i| *i != 0)?;
    Some((inode, uid))
}

/// The first process with a descriptor on one of `inodes`: pid and command name.
fn owner_of(inodes: &HashMap<u64, u32>) -> Option<(u32, String)> {
    let pids = fs::read_dir("/proc").ok()?.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    for pid in pids {
        if holds_socket(pid, inodes) {
            let name = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            return Some((pid, name.trim().to_string()));
        }
    }
    None
}

fn holds_socket(pid: u32, inodes: &HashMap<u64, u32>) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|fd| fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| socket_inode(target.to_str()?))
        .any(|inode| inodes.contains_key(&inode))
}

fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listen_rows_only() {
        let listen = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0 100 0 0 10 0";
        assert_eq!(parse_listener(listen, 8080), Some((4242, 1000)));
        assert_eq!(parse_listener(listen, 8081), None);
        let established = listen.replace(" 0A ", " 01 ");
        assert_eq!(parse_listener(&established, 8080), None);
        assert_eq!(parse_listener("garbage", 8080), None);
    }

    #[test]
    fn socket_links() {
        assert_eq!(socket_inode("socket:[123]"), Some(123));
        assert_eq!(socket_inode("pipe:[123]"), None);
    }

    #[test]
    fn a_free_port_has_no_holder() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        assert_eq!(port_holder(port), None);
    }
}
