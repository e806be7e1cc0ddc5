use serde::de::DeserializeOwned;

/// Parses a function's JSON config. Config structs should say
/// `#[serde(deny_unknown_fields)]`: a typo is an error, not a silent default.
/// The error text names the problem and where it is, e.g.
/// `invalid config: missing field `sources` at line 1 column 2`.
pub fn parse_config<T: DeserializeOwned>(config: &str) -> Result<T, String> {
    serde_json::from_str(config).map_err(|error| format!("invalid config: {error}"))
}
