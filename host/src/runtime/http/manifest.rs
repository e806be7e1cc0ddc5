//! `spin.toml` (Spin manifest version 2): the HTTP routes, the components
//! that serve them, their outbound hosts, key-value stores and variables.
//!
//! Parsing is strict where a mistake would serve the wrong thing (unknown
//! manifest version, a route naming a missing component, a variable with no
//! value) and lenient where Spin has settings Laurel does not use (`build`,
//! `description`, `files`): those are ignored.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// A manifest, checked and resolved: every route names a component, every
/// component variable has a value.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub name: String,
    /// Where the manifest is; component sources are relative to it.
    pub dir: PathBuf,
    pub routes: Vec<Route>,
    pub components: BTreeMap<String, ComponentSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// As written, e.g. `/badge/...` or `/users/:user_id/badge`.
    pub pattern: String,
    pub segments: Vec<Segment>,
    /// The pattern ends in `/...`: any rest of the path matches.
    pub wildcard: bool,
    pub component: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    Exact(String),
    /// `:name`, any one segment.
    Param(String),
}

#[derive(Debug, Clone)]
pub struct ComponentSpec {
    pub id: String,
    /// The `source` path, relative to the manifest's directory.
    pub source: PathBuf,
    pub allowed_outbound_hosts: Vec<OutboundHost>,
    pub key_value_stores: Vec<String>,
    /// The component's variables with their resolved values.
    pub variables: HashMap<String, String>,
}

/// One `allowed_outbound_hosts` entry: `scheme://host[:port]`, where scheme,
/// host and port may be `*`.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboundHost {
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub text: String,
}

impl OutboundHost {
    fn parse(text: &str) -> Result<OutboundHost, String> {
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| format!("`{text}` needs a scheme, e.g. https://{text}"))?;
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') {
            return Err(format!("`{text}`: a host may not have a path"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        };
        let any = |v: &str| (v != "*").then(|| v.to_ascii_lowercase());
        let port = match port {
            None => match scheme {
                "http" => Some(80),
                "https" => Some(443),
                _ => None,
            },
            Some("*") => None,
            Some(p) => Some(
                p.parse()
                    .map_err(|_| format!("`{text}`: `{p}` is not a port"))?,
            ),
        };
        if host.is_empty() {
            return Err(format!("`{text}` has no host"));
        }
        Ok(OutboundHost {
            scheme: any(scheme),
            host: any(host),
            port,
            text: text.to_string(),
        })
    }

    /// Whether a request to `scheme://host:port` is allowed by this entry.
    pub fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        self.scheme.as_deref().is_none_or(|s| s == scheme)
            && self
                .host
                .as_deref()
                .is_none_or(|h| h.eq_ignore_ascii_case(host))
            && self.port.is_none_or(|p| p == port)
    }
}

impl Route {
    fn parse(pattern: &str, component: &str) -> Result<Route, String> {
        if !pattern.starts_with('/') {
            return Err(format!("route `{pattern}` must start with /"));
        }
        let (path, wildcard) = match pattern.strip_suffix("/...") {
            Some(path) => (path, true),
            None if pattern == "/..." => ("", true),
            None => (pattern, false),
        };
        let segments = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| match s.strip_prefix(':') {
                Some(name) if !name.is_empty() => Segment::Param(name.to_string()),
                _ => Segment::Exact(s.to_string()),
            })
            .collect();
        Ok(Route {
            pattern: pattern.to_string(),
            segments,
            wildcard,
            component: component.to_string(),
        })
    }

    /// The path's parameters if `path` matches, else None.
    pub fn matches(&self, path: &str) -> Option<Vec<(String, String)>> {
        let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        if parts.len() < self.segments.len()
            || (!self.wildcard && parts.len() != self.segments.len())
        {
            return None;
        }
        let mut params = Vec::new();
        for (segment, part) in self.segments.iter().zip(&parts) {
            match segment {
                Segment::Exact(s) if s == part => {}
                Segment::Exact(_) => return None,
                Segment::Param(name) => params.push((name.clone(), (*part).to_string())),
            }
        }
        Some(params)
    }

    /// More specific routes win: exact segments before parameters before
    /// wildcards, longer before shorter.
    fn rank(&self) -> (usize, bool, usize) {
        let exact = self
            .segments
            .iter()
            .filter(|s| matches!(s, Segment::Exact(_)))
            .count();
        (self.segments.len(), !self.wildcard, exact)
    }
}

// --- the file as written ------------------------------------------------

#[derive(Deserialize)]
struct File {
    spin_manifest_version: toml::Value,
    application: Application,
    #[serde(default)]
    variables: BTreeMap<String, VariableDecl>,
    #[serde(default)]
    trigger: Triggers,
    #[serde(default)]
    component: BTreeMap<String, ComponentFile>,
}

#[derive(Deserialize)]
struct Application {
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct VariableDecl {
    default: Option<String>,
    #[serde(default)]
    required: bool,
    #[serde(default)]
    secret: bool,
}

#[derive(Deserialize, Default)]
struct Triggers {
    #[serde(default)]
    http: Vec<HttpTrigger>,
}

#[derive(Deserialize)]
struct HttpTrigger {
    route: RouteSpec,
    component: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RouteSpec {
    Path(String),
    Private { private: bool },
}

#[derive(Deserialize)]
struct ComponentFile {
    source: toml::Value,
    #[serde(default)]
    allowed_outbound_hosts: Vec<String>,
    #[serde(default)]
    key_value_stores: Vec<String>,
    #[serde(default)]
    variables: BTreeMap<String, String>,
}

/// Reads and checks `path`. `env` looks up `SPIN_VARIABLE_<NAME>`
/// overrides (the process environment in production).
pub fn load(
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Manifest, ManifestFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ManifestFileError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    parse(&text, dir, env).map_err(|reason| ManifestFileError::Invalid {
        path: path.to_path_buf(),
        reason,
    })
}

/// Why a manifest file cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ManifestFileError {
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML, not version 2, or a route, component or setting Laurel
    /// cannot serve.
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

pub fn parse(
    text: &str,
    dir: PathBuf,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Manifest, String> {
    let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
    if file.spin_manifest_version.as_integer() != Some(2)
        && file.spin_manifest_version.as_str() != Some("2")
    {
        return Err(format!(
            "spin_manifest_version is {}; Laurel reads version 2",
            file.spin_manifest_version
        ));
    }

    // Application variables: environment, then default; required ones
    // must have a value.
    let mut values: HashMap<String, Option<String>> = HashMap::new();
    for (name, decl) in &file.variables {
        check_variable_name(name)?;
        if decl.required && decl.default.is_some() {
            return Err(format!(
                "variable `{name}` is required and has a default: choose one"
            ));
        }
        let value = env(&format!("SPIN_VARIABLE_{}", name.to_ascii_uppercase()))
            .or_else(|| decl.default.clone());
        if decl.required && value.is_none() {
            return Err(format!(
                "variable `{name}` is required: set SPIN_VARIABLE_{}",
                name.to_ascii_uppercase()
            ));
        }
        let _ = decl.secret;
        values.insert(name.clone(), value);
    }

    let mut components = BTreeMap::new();
    for (id, spec) in file.component {
        let source = match &spec.source {
            toml::Value::String(path) => PathBuf::from(path),
            _ => {
                return Err(format!(
                    "component `{id}`: source must be a local file path (Laurel does not download components)"
                ));
            }
        };
        let allowed_outbound_hosts = spec
            .allowed_outbound_hosts
            .iter()
            .map(|h| {
                OutboundHost::parse(h)
                    .map_err(|e| format!("component `{id}`: allowed_outbound_hosts: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut variables = HashMap::new();
        for (name, template) in &spec.variables {
            check_variable_name(name).map_err(|e| format!("component `{id}`: {e}"))?;
            let value = expand(template, &values)
                .map_err(|e| format!("component `{id}`, variable `{name}`: {e}"))?;
            variables.insert(name.clone(), value);
        }
        components.insert(
            id.clone(),
            ComponentSpec {
                id,
                source,
                allowed_outbound_hosts,
                key_value_stores: spec.key_value_stores,
                variables,
            },
        );
    }

    let mut routes = Vec::new();
    for trigger in &file.trigger.http {
        if !components.contains_key(&trigger.component) {
            return Err(format!(
                "a route names component `{}`, which the manifest does not define",
                trigger.component
            ));
        }
        match &trigger.route {
            RouteSpec::Path(pattern) => routes.push(Route::parse(pattern, &trigger.component)?),
            // Reachable only through other components: Laurel has no
            // component-to-component calls, so it serves nothing.
            RouteSpec::Private { private: true } => {}
            RouteSpec::Private { private: false } => {
                return Err(format!(
                    "component `{}`: a route is a path or {{ private = true }}",
                    trigger.component
                ));
            }
        }
    }
    for (i, a) in routes.iter().enumerate() {
        if let Some(b) = routes[..i]
            .iter()
            .find(|b| b.segments == a.segments && b.wildcard == a.wildcard)
        {
            return Err(format!(
                "routes `{}` and `{}` are the same route",
                b.pattern, a.pattern
            ));
        }
    }
    routes.sort_by_key(|r| std::cmp::Reverse(r.rank()));
    Ok(Manifest {
        name: file.application.name,
        dir,
        routes,
        components,
    })
}

/// Spin's rule: lowercase letters, digits and underscores, starting with a
/// letter.
fn check_variable_name(name: &str) -> Result<(), String> {
    let ok = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "variable name `{name}`: use lowercase letters, digits and _, starting with a letter"
        ))
    }
}

/// Expands `{{ name }}` references to application variables.
fn expand(template: &str, values: &HashMap<String, Option<String>>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("`{template}` has an unclosed {{{{"))?;
        let name = after[..end].trim();
        match values.get(name) {
            Some(Some(value)) => out.push_str(value),
            Some(None) => {
                return Err(format!(
                    "application variable `{name}` has no value: give it a default or set SPIN_VARIABLE_{}",
                    name.to_ascii_uppercase()
                ));
            }
            None => {
                return Err(format!(
                    "`{template}` refers to `{name}`, which [variables] does not declare"
                ));
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

impl Manifest {
    /// The component serving `path`, and the route's parameters.
    pub fn route(&self, path: &str) -> Option<(&Route, Vec<(String, String)>)> {
        self.routes
            .iter()
            .find_map(|r| r.matches(path).map(|params| (r, params)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = r#"
spin_manifest_version = 2

[application]
name = "laurel-http"
description = "ignored"

[variables]
title = { default = "Laurel" }
token = { required = true, secret = true }

[[trigger.http]]
route = "/badges/:user_id/..."
component = "badge"

[[trigger.http]]
route = "/badges/health"
component = "badge"

[[trigger.http]]
route = { private = true }
component = "badge"

[[trigger.http]]
route = "/ingest/checkins"
component = "adapter"

[component.badge]
source = "target/badge.wasm"
key_value_stores = ["default"]
[component.badge.variables]
title = "{{ title }} badge"
[component.badge.build]
command = "cargo build"

[component.adapter]
source = "target/adapter.wasm"
allowed_outbound_hosts = ["https://api.example.com", "http://127.0.0.1:*", "*://*.internal:8080"]
[component.adapter.variables]
token = "{{token}}"
"#;

    fn env(name: &str) -> Option<String> {
        (name == "SPIN_VARIABLE_TOKEN").then(|| "s3cret".to_string())
    }

    #[test]
    fn routes_components_and_variables_resolve() {
        let m = parse(MANIFEST, PathBuf::from("/apps"), &env).unwrap();
        assert_eq!(m.name, "laurel-http");
        let (route, params) = m.route("/badges/u-42/awards/x").unwrap();
        assert_eq!(route.component, "badge");
        assert_eq!(params, vec![("user_id".to_string(), "u-42".to_string())]);
        // The exact route wins over the parameter one.
        assert_eq!(
            m.route("/badges/health").unwrap().0.pattern,
            "/badges/health"
        );
        assert!(m.route("/ingest/checkins/more").is_none());
        assert!(m.route("/nothing").is_none());
        assert_eq!(m.components["badge"].variables["title"], "Laurel badge");
        assert_eq!(m.components["adapter"].variables["token"], "s3cret");
        assert_eq!(m.components["badge"].key_value_stores, ["default"]);
        let hosts = &m.components["adapter"].allowed_outbound_hosts;
        assert!(hosts[0].allows("https", "api.example.com", 443));
        assert!(!hosts[0].allows("http", "api.example.com", 80));
        assert!(!hosts[0].allows("https", "evil.example.com", 443));
        assert!(hosts[1].allows("http", "127.0.0.1", 31337));
        assert!(!hosts[1].allows("http", "127.0.0.2", 31337));
    }

    #[test]
    fn mistakes_are_named() {
        let error = |text: &str| parse(text, PathBuf::from("."), &|_| None).unwrap_err();
        assert_eq!(
            error(MANIFEST),
            "variable `token` is required: set SPIN_VARIABLE_TOKEN"
        );
        let v1 = MANIFEST.replace("spin_manifest_version = 2", "spin_manifest_version = 1");
        assert!(
            error(&v1).contains("Laurel reads version 2"),
            "{}",
            error(&v1)
        );
        let missing = MANIFEST.replace("component = \"adapter\"", "component = \"nope\"");
        assert_eq!(
            parse(&missing, PathBuf::from("."), &env).unwrap_err(),
            "a route names component `nope`, which the manifest does not define"
        );
        let undeclared = MANIFEST.replace("{{ title }} badge", "{{ colour }}");
        assert_eq!(
            parse(&undeclared, PathBuf::from("."), &env).unwrap_err(),
            "component `badge`, variable `title`: `{{ colour }}` refers to `colour`, which [variables] does not declare"
        );
        let no_scheme = MANIFEST.replace("\"https://api.example.com\"", "\"api.example.com\"");
        assert_eq!(
            parse(&no_scheme, PathBuf::from("."), &env).unwrap_err(),
            "component `adapter`: allowed_outbound_hosts: `api.example.com` needs a scheme, e.g. https://api.example.com"
        );
    }
}
