//! Where the user's code made a call: what the flight recorder keeps per
//! operation so that a verdict can say `all_reduce #2 called at train.py:24`.
//!
//! Recording must stay as cheap as the rest of the recorder (a few tens of
//! nanoseconds), so a [`CallSite`] is a pointer, never an allocation: Rust
//! callers pass their `#[track_caller]` [`Location`], which the compiler
//! keeps in static memory; language bindings (C, Python) pass a text tag
//! that is [`intern`]ed once per distinct text and then referred to by a
//! [`Tag`]. Both are one thin pointer, so the recorder stores a call site
//! in one atomic word. Text is formed only when someone reads the recorder.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::panic::Location;

/// Where an operation was called from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallSite {
    /// A Rust caller (`#[track_caller]`).
    Rust(&'static Location<'static>),
    /// A tag given by a binding or a C caller (`train.py:24 in step`),
    /// interned with [`intern`].
    Tag(Tag),
}

/// An interned call-site text: a thin pointer to text kept for the life of
/// the process, compared by address (one text, one [`Tag`]).
#[derive(Clone, Copy)]
pub struct Tag(&'static TagText);

/// The text behind a [`Tag`]: sized, so that a tag is a thin pointer.
pub(crate) struct TagText(String);

impl Tag {
    /// The text.
    pub fn as_str(self) -> &'static str {
        &self.0 .0
    }

    pub(crate) fn text(self) -> &'static TagText {
        self.0
    }

    pub(crate) fn from_text(t: &'static TagText) -> Tag {
        Tag(t)
    }
}

impl PartialEq for Tag {
    fn eq(&self, other: &Tag) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for Tag {}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for CallSite {
    /// `src/main.rs:24` or the tag as given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallSite::Rust(l) => write!(f, "{}:{}", l.file(), l.line()),
            CallSite::Tag(t) => f.write_str(t.as_str()),
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

static TAGS: Mutex<Option<HashMap<&'static str, Tag>>> = Mutex::new(None);

/// The interned copy of `tag` (cut to [`MAX_TAG_LEN`] bytes at a character
/// boundary), allocated once per distinct text for the life of the process;
/// [`TOO_MANY`] once [`MAX_TAGS`] texts are kept.
///
/// ```
/// use ringleader_diag::callsite::intern;
/// let a = intern("train.py:24 in step");
/// assert_eq!(a, intern("train.py:24 in step"));
/// assert_eq!(a.as_str(), "train.py:24 in step");
/// ```
pub fn intern(tag: &str) -> Tag {
    let mut end = tag.len().min(MAX_TAG_LEN);
    while !tag.is_char_boundary(end) {
        end -= 1;
    }
    let tag = &tag[..end];
    let mut tags = TAGS.lock();
    let map = tags.get_or_insert_with(HashMap::new);
    if let Some(&t) = map.get(tag) {
        return t;
    }
    let (text, over) = match map.len() >= MAX_TAGS {
        true => (TOO_MANY, true),
        false => (tag, false),
    };
    if over {
        if let Some(&t) = map.get(TOO_MANY) {
            return t;
        }
    }
    let t = Tag(Box::leak(Box::new(TagText(text.to_string()))));
    map.insert(t.as_str(), t);
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
        let t = intern(&long).as_str();
        assert!(t.len() <= MAX_TAG_LEN && t.chars().all(|c| c == 'é'), "{t}");
        assert_eq!(CallSite::Tag(intern("x.py:1 in f")).to_string(), "x.py:1 in f");
    }
}
