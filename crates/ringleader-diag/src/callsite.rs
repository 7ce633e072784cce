//! Where the user's code made a call: what the flight recorder keeps per
//! operation so that a verdict can say `all_reduce #2 called at train.py:24`.
//!
//! Recording must stay as cheap as the rest of the recorder (a few tens of
//! nanoseconds), so a [`CallSite`] is a pointer, never an allocation: Rust
//! callers pass their `#[track_caller]` [`Location`], which the compiler
//! keeps in static memory; language bindings (C, Python) pass a text tag
//! that is [`intern`]ed once per distinct text and then referred to by its
//! `&'static str`. Text is formed only when someone reads the recorder.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::fmt;
use std::panic::Location;

/// Where an operation was called from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallSite {
    /// A Rust caller (`#[track_caller]`).
    Rust(&'static Location<'static>),
    /// A tag given by a binding or a C caller (`train.py:24 in step`),
    /// interned with [`intern`].
    Tag(&'static str),
}

impl fmt::Display for CallSite {
    /// `src/main.rs:24` or the tag as given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallSite::Rust(l) => write!(f, "{}:{}", l.file(), l.line()),
            CallSite::Tag(t) => f.write_str(t),
        }
    }
}

/// At most this many distinct tags are kept: a binding tags by code
/// location, so a real program has a few hundred at most; a C caller that
/// makes up a new tag per call must not grow memory without bound.
pub const MAX_TAGS: usize = 16_384;
/// At most this many bytes of a tag are kept.
pub const MAX_TAG_LEN: usize = 256;
/// What tags beyond [`MAX_TAGS`] become.
pub const TOO_MANY: &str = "(call site not kept: too many distinct tags)";

static TAGS: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

/// The interned copy of `tag` (cut to [`MAX_TAG_LEN`] bytes at a character
/// boundary), allocated once per distinct text for the life of the process;
/// [`TOO_MANY`] once [`MAX_TAGS`] texts are kept.
///
/// ```
/// use ringleader_diag::callsite::intern;
/// let a = intern("train.py:24 in step");
/// assert!(std::ptr::eq(a, intern("train.py:24 in step")));
/// ```
pub fn intern(tag: &str) -> &'static str {
    let mut end = tag.len().min(MAX_TAG_LEN);
    while !tag.is_char_boundary(end) {
        end -= 1;
    }
    let tag = &tag[..end];
    let mut tags = TAGS.lock();
    let set = tags.get_or_insert_with(HashSet::new);
    if let Some(t) = set.get(tag) {
        return t;
    }
    if set.len() >= MAX_TAGS {
        return TOO_MANY;
    }
    let t: &'static str = Box::leak(tag.to_string().into_boxed_str());
    set.insert(t);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_sites_name_file_and_line() {
        #[track_caller]
        fn here() -> CallSite {
            CallSite::Rust(Location::caller())
        }
        let line = line!() + 1;
        let s = here().to_string();
        assert_eq!(s, format!("{}:{line}", file!()));
    }

    #[test]
    fn tags_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_TAG_LEN);
        let t = intern(&long);
        assert!(t.len() <= MAX_TAG_LEN && t.chars().all(|c| c == 'é'), "{t}");
        assert_eq!(CallSite::Tag(intern("x.py:1 in f")).to_string(), "x.py:1 in f");
    }
}
