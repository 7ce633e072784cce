//! The C ABI from C: compiles examples/c/allreduce.c and
//! ffi/tests/c/skip.c against include/ringleader.h and libringleader.so,
//! and runs each as two real processes with a store hosted here (as
//! `ringleader launch` hosts it), each job under a hard time limit.
#![allow(missing_docs)]

use ringleader_store::{ServerOptions, StoreServer};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// target/<profile>, where cargo puts libringleader.so next to deps/.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    assert!(
        dir.join("libringleader.so").exists(),
        "libringleader.so not found in {}: build it first with `cargo build --release -p ringleader-ffi` \
         (scripts/test.sh does)",
        dir.display()
    );
    dir
}

/// Compiles `src` with the system C compiler into a temporary directory.
fn compile(src: &Path, name: &str) -> PathBuf {
    let out_dir = std::env::temp_dir().join(format!("rl-c-abi-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join(name);
    let lib = lib_dir();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg(src)
        .arg("-I")
        .arg(repo().join("ffi/include"))
        .arg("-L")
        .arg(&lib)
        .arg("-lringleader")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(out.status.success(), "{cc} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

/// Runs `exe` as `world` ranks; kills everything after `limit`.
fn run_job(exe: &Path, world: usize, limit: Duration) -> Vec<Output> {
    let run_id = format!("c-abi-{}-{}", std::process::id(), exe.file_name().unwrap().to_string_lossy());
    let store = StoreServer::bind("127.0.0.1:0", ServerOptions::new(run_id.clone())).unwrap();
    let unused_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut children: Vec<Child> = (0..world)
        .map(|rank| {
            Command::new(exe)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", unused_port.to_string())
                .env("RINGLEADER_STORE_ADDR", store.local_addr().to_string())
                .env("RINGLEADER_RUN_ID", &run_id)
                .env("RINGLEADER_INIT_TIMEOUT", "30")
                .env("RINGLEADER_TIMEOUT", "20")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    while children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        if start.elapsed() > limit {
            for c in &mut children {
                let _ = c.kill();
            }
            let outs: Vec<String> = children
                .into_iter()
                .map(|c| {
                    let o = c.wait_with_output().unwrap();
                    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
                })
                .collect();
            panic!("job exceeded its hard limit of {limit:?}; killed every rank:\n{}", outs.join("\n---\n"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    children.into_iter().map(|c| c.wait_with_output().unwrap()).collect()
}

fn text(o: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn c_example_all_reduces_on_two_ranks() {
    let exe = compile(&repo().join("examples/c/allreduce.c"), "allreduce");
    let outs = run_job(&exe, 2, Duration::from_secs(60));
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank} failed: {}", text(o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains(&format!("rank {rank} of 2: sum 3, max 1")), "rank {rank}: {}", text(o));
    }
}

#[test]
fn c_skipped_collective_reports_structured_fields() {
    let exe = compile(&repo().join("ffi/tests/c/skip.c"), "skip");
    let start = Instant::now();
    let outs = run_job(&exe, 2, Duration::from_secs(60));
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank} failed: {}", text(o));
    }
    let stdout = String::from_utf8_lossy(&outs[0].stdout).into_owned();
    let line = stdout.lines().find(|l| l.starts_with("ERROR ")).unwrap_or_else(|| panic!("{}", text(&outs[0])));
    assert!(line.contains("kind=missed-collective"), "{line}\n{}", text(&outs[0]));
    assert!(line.contains("op=all_reduce"), "{line}");
    assert!(line.contains("ranks=1"), "{line}");
    assert!(line.contains("seq=2"), "{line}");
    assert!(stdout.contains("[missed-collective]"), "{stdout}");
    // Where rank 0 made the call it waits in, as its thread tagged it.
    assert!(stdout.contains("rank 0 waits in it (called at skip.c:second in main)"), "{stdout}");
    // Rank 1 left cleanly: the verdict comes at once, not after the 20 s timeout.
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
}

#[test]
fn c_device_calls_without_a_driver_fail_by_name_and_leave_the_communicator_usable() {
    let exe = compile(&repo().join("ffi/tests/c/device.c"), "device");
    let start = Instant::now();
    let outs = run_job(&exe, 2, Duration::from_secs(60));
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank} failed: {}", text(o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains(&format!("rank {rank}: host sum 3")), "rank {rank}: {}", text(o));
    }
    let stdout = String::from_utf8_lossy(&outs[0].stdout).into_owned();
    if stdout.contains("HAVE-DRIVER") {
        eprintln!("a CUDA driver loads here: device buffers are checked by scripts/gpu_check.sh");
        return;
    }
    let line = stdout.lines().find(|l| l.starts_with("NO-DRIVER ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("libcuda.so.1"), "the error names the missing driver library: {line}");
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
}
