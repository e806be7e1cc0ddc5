//! `FieldFilter`: a payload field, addressed by JSON pointer, compared with
//! `equals`, `in`, `min` and/or `max` (all given comparisons must hold):
//!
//! ```json
//! {"field": "/rating", "min": 4}
//! {"field": "/kind", "in": ["cafe", "bar"]}
//! ```
//!
//! A missing field never matches. `min`/`max` are inclusive and need a number.

use laurel_guest::{Event, Filter, Value, parse_config};
use serde::Deserialize;
use serde_json::Value as Json;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    field: String,
    equals: Option<Json>,
    #[serde(rename = "in")]
    one_of: Option<Vec<Json>>,
    min: Option<f64>,
    max: Option<f64>,
}

/// A config scalar to compare payload values with.
enum Scalar {
    Null,
    Boolean(bool),
    Number(f64),
    Text(String),
}

pub struct FieldFilter {
    pointer: String,
    equals: Option<Scalar>,
    one_of: Option<Vec<Scalar>>,
    min: Option<f64>,
    max: Option<f64>,
}

fn scalar(value: Json, what: &str) -> Result<Scalar, String> {
    Ok(match value {
        Json::Null => Scalar::Null,
        Json::Bool(b) => Scalar::Boolean(b),
        Json::Number(n) => Scalar::Number(n.as_f64().unwrap_or(f64::NAN)),
        Json::String(s) => Scalar::Text(s),
        other => return Err(format!("`{what}` must be a JSON scalar, got {other}")),
    })
}

fn same(a: &Value<'_>, b: &Scalar) -> bool {
    match (a, b) {
        (Value::Null, Scalar::Null) => true,
        (Value::Boolean(a), Scalar::Boolean(b)) => a == b,
        (Value::Number(a), Scalar::Number(b)) => a == b,
        (Value::Text(a), Scalar::Text(b)) => a == b,
        _ => false,
    }
}

impl Filter for FieldFilter {
    fn from_config(config: &str) -> Result<Self, String> {
        let config: Config = parse_config(config)?;
        let pointer = if config.field.starts_with('/') {
            config.field
        } else if config.field.is_empty() {
            return Err("`field` is empty: give a JSON pointer such as \"/rating\"".into());
        } else {
            // A bare name is shorthand for a top-level field.
            format!("/{}", config.field)
        };
        if config.equals.is_none()
            && config.one_of.is_none()
            && config.min.is_none()
            && config.max.is_none()
        {
            return Err("no comparison: give at least one of `equals`, `in`, `min`, `max`".into());
        }
        if let (Some(min), Some(max)) = (config.min, config.max)
            && min > max
        {
            return Err(format!(
                "`min` ({min}) is greater than `max` ({max}): nothing could match"
            ));
        }
        let equals = config.equals.map(|v| scalar(v, "equals")).transpose()?;
        let one_of = config
            .one_of
            .map(|values| {
                values
                    .into_iter()
                    .map(|v| scalar(v, "in"))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        Ok(FieldFilter {
            pointer,
            equals,
            one_of,
            min: config.min,
            max: config.max,
        })
    }

    fn matches(&self, event: &Event<'_>) -> bool {
        let Some(value) = event.field(&self.pointer) else {
            return false;
        };
        if let Some(expected) = &self.equals
            && !same(&value, expected)
        {
            return false;
        }
        if let Some(options) = &self.one_of
            && !options.iter().any(|o| same(&value, o))
        {
            return false;
        }
        if self.min.is_some() || self.max.is_some() {
            let Value::Number(n) = value else {
                return false;
            };
            if self.min.is_some_and(|min| n < min) || self.max.is_some_and(|max| n > max) {
                return false;
            }
        }
        true
    }
}

laurel_guest::export_filter!(FieldFilter);
