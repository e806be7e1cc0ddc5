//! How settings are read: flags, then environment variables, then defaults
//! (see docs/settings.md). A leaf: the parsers every settings struct uses,
//! and [`defaults`].
//!
//! Each capability owns its settings as a `clap::Args` struct with one
//! default per setting, in its attribute: `IngestSettings`,
//! `AwardsSettings`, `NotifySettings`, `ApiSettings` (with
//! `TokenSettings`), `runtime::Limits`, `HttpLimits`. The command line
//! (`cli::settings`) flattens them into the commands that use them; tests
//! and benches build them from the same attributes (`defaults`), so the
//! two cannot drift. Fields a process wires up itself (a URL, a broker
//! address) are `#[arg(skip)]`.

use std::time::Duration;

use clap::Args;

/// PostgreSQL, when none is given.
pub const DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/laurel";
/// Redis, when none is given.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Largest request body the HTTP server takes, unless
/// `LAUREL_HTTP_MAX_BODY_BYTES` says otherwise (also what HTTP functions
/// are passed in and out).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// A settings struct with every setting at its default, as the command
/// line would give it with no flags and no environment.
pub fn defaults<T: Args + clap::FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults"))
        .mut_args(|arg| arg.env(None::<&'static str>));
    let parsed = command
        .try_get_matches_from(["defaults"])
        .and_then(|matches| T::from_arg_matches(&matches));
    match parsed {
        Ok(settings) => settings,
        Err(error) => panic!("a setting has no default: {error}"),
    }
}

/// A whole number of `unit`s.
fn whole<T: std::str::FromStr>(text: &str, unit: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not a whole number{unit}"))
}

/// A number of milliseconds.
pub fn millis(text: &str) -> Result<Duration, String> {
    whole(text, " of milliseconds").map(Duration::from_millis)
}

/// A number of milliseconds above zero.
pub fn positive_millis(text: &str) -> Result<Duration, String> {
    let duration = millis(text)?;
    if duration.is_zero() {
        return Err("must be at least 1 millisecond".to_string());
    }
    Ok(duration)
}

/// A number of seconds.
pub fn seconds(text: &str) -> Result<Duration, String> {
    whole(text, " of seconds").map(Duration::from_secs)
}

/// A number of MiB above zero, as bytes.
pub fn mebibytes(text: &str) -> Result<usize, String> {
    let mib: usize = whole(text, " of MiB")?;
    if mib == 0 {
        return Err("must be at least 1 MiB".to_string());
    }
    mib.checked_mul(1 << 20)
        .ok_or_else(|| format!("{mib} MiB is more than this machine can address"))
}

/// A count above zero.
pub fn positive(text: &str) -> Result<usize, String> {
    let n: usize = whole(text, "")?;
    if n == 0 {
        return Err("must be at least 1".to_string());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_refuse_what_cannot_be_a_setting() {
        assert_eq!(millis("250"), Ok(Duration::from_millis(250)));
        assert!(millis("-1").unwrap_err().contains("milliseconds"));
        assert_eq!(
            positive_millis("0").unwrap_err(),
            "must be at least 1 millisecond"
        );
        assert_eq!(mebibytes("2"), Ok(2 << 20));
        assert_eq!(mebibytes("0").unwrap_err(), "must be at least 1 MiB");
        assert!(mebibytes(&usize::MAX.to_string()).is_err());
        assert_eq!(positive("0").unwrap_err(), "must be at least 1");
    }
}
