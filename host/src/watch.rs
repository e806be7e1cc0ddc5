//! How far long work is, told to whoever follows it (a command's progress
//! bar): replays and diffs take a [`Watch`]; the API passes [`unwatched`].

/// `done` of `total` steps, and what is being done now.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    pub done: u64,
    pub total: u64,
    pub note: &'a str,
}

/// Told each step as it ends.
pub type Watch<'a> = &'a (dyn Fn(Step<'_>) + Sync);

/// A watch that follows nothing.
pub fn unwatched(_: Step<'_>) {}
