//! The checked-in C header must be what cbindgen makes of the current
//! source. Regenerate it with
//! `cargo test -p ringleader-ffi --test header -- --ignored regenerate`.
#![allow(missing_docs)]

use std::path::PathBuf;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("reading cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

fn header_path() -> PathBuf {
    crate_dir().join("include").join("ringleader.h")
}

#[test]
fn checked_in_header_is_current() {
    let fresh = generate();
    let checked_in = std::fs::read_to_string(header_path()).unwrap_or_default();
    assert!(
        fresh == checked_in,
        "ffi/include/ringleader.h is stale; regenerate it with\n  \
         cargo test -p ringleader-ffi --test header -- --ignored regenerate\n--- generated:\n{fresh}"
    );
}

#[test]
#[ignore = "writes ffi/include/ringleader.h"]
fn regenerate() {
    std::fs::write(header_path(), generate()).expect("writing the header");
}
