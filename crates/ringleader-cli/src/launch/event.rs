//! What the supervisor reacts to: rank processes ending, their output
//! closing, signals to the launcher, and the ranks' published verdict. Children and the signal thread
//! send these; the supervisor receives them (a file of its own so neither
//! side imports the other).

use super::ending::Ending;

/// What the supervisor reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    /// The rank at `index` ended (it is left a zombie until reaped).
    Ended {
        /// Index into the supervisor's ranks.
        index: usize,
        /// How it ended.
        ending: Ending,
    },
    /// One output pipe of a rank reached end of file.
    OutputClosed,
    /// The launcher received this signal.
    Signal(i32),
    /// The ranks published their verdict (its headline).
    Verdict(String),
}
