//! Progress of long command-line work: a bar on a terminal, a plain line
//! every few seconds otherwise (a log file, CI), and always the last one.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a plain line is written when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(2);

/// One piece of work's progress, shown on stderr.
pub struct Progress {
    /// On a terminal.
    bar: Option<ProgressBar>,
    /// Otherwise: when the last line was written, and what it said.
    line: Mutex<(Option<Instant>, String)>,
    what: &'static str,
}

impl Progress {
    /// `what`: what is counted, as the bar's prefix ("proxies checked").
    pub fn new(what: &'static str) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            let style =
                ProgressStyle::with_template("[{bar:30}] {percent:>3}% {pos}/{len} {prefix} {msg}")
                    .expect("a valid template")
                    .progress_chars("#>-");
            bar.set_style(style);
            bar.set_prefix(what);
            bar
        });
        Progress {
            bar,
            line: Mutex::new((None, String::new())),
            what,
        }
    }

    /// `done` of `total`, with a note after the counts.
    pub fn update(&self, done: u64, total: u64, note: String) {
        match &self.bar {
            Some(bar) => {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(note);
            }
            None => {
                let text = format!("{} {}{}", counts(done, total), self.what, suffix(&note));
                let mut line = self.line.lock().unwrap_or_else(|p| p.into_inner());
                let due = line.0.is_none_or(|at| at.elapsed() >= LINE_EVERY);
                if (due || done >= total) && line.1 != text {
                    eprintln!("{text}");
                    *line = (Some(Instant::now()), text);
                }
            }
        }
    }

    /// A step of work that tells how far it is (`crate::watch`).
    pub fn follow(&self, step: crate::watch::Step<'_>) {
        self.update(step.done, step.total, step.note.to_string());
    }

    /// A message of its own (an error it goes on after), above the bar.
    pub fn say(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// The work ended: the bar is taken away (the command prints what came
    /// of it).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

fn counts(done: u64, total: u64) -> String {
    let percent = if total == 0 {
        100.0
    } else {
        done as f64 * 100.0 / total as f64
    };
    format!("{percent:.1}% {done} of {total}")
}

fn suffix(note: &str) -> String {
    if note.is_empty() {
        String::new()
    } else {
        format!(" {note}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_line_says_how_far() {
        assert_eq!(counts(0, 0), "100.0% 0 of 0");
        assert_eq!(
            format!("{} proxies checked{}", counts(1, 3), suffix("(1 refused)")),
            "33.3% 1 of 3 proxies checked (1 refused)"
        );
    }
}
