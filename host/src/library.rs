//! The built-in function library: the components built from `functions/`,
//! embedded in the binary and registered by `laurel up` / `laurel migrate`.

use std::path::Path;

use sha2::{Digest, Sha256};
use tracing::info;

use crate::runtime::{FunctionKind, Runtime};
use crate::store::{PushOutcome, Store};

pub struct Builtin {
    pub name: &'static str,
    pub kind: FunctionKind,
    pub bytes: &'static [u8],
}

macro_rules! guest {
    ($file:literal) => {
        include_bytes!(concat!(env!("LAUREL_GUEST_DIR"), "/", $file, ".wasm"))
    };
}

/// The built-in HTTP functions, by the file name spin.toml's `source`
/// gives them: served when that file is not there (a `laurel` binary
/// carries them; `spin build` makes the files).
pub fn http_builtin(file: &str) -> Option<&'static [u8]> {
    match file {
        "progress_badge.wasm" => Some(guest!("progress_badge")),
        "ingest_adapter.wasm" => Some(guest!("ingest_adapter")),
        _ => None,
    }
}

pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "SourceFilter",
        kind: FunctionKind::Filter,
        bytes: guest!("source_filter"),
    },
    Builtin {
        name: "EventTypeFilter",
        kind: FunctionKind::Filter,
        bytes: guest!("event_type_filter"),
    },
    Builtin {
        name: "StatusFilter",
        kind: FunctionKind::Filter,
        bytes: guest!("status_filter"),
    },
    Builtin {
        name: "ReviewsLengthFilter",
        kind: FunctionKind::Filter,
        bytes: guest!("reviews_length_filter"),
    },
    Builtin {
        name: "FieldFilter",
        kind: FunctionKind::Filter,
        bytes: guest!("field_filter"),
    },
    Builtin {
        name: "ContentStatusRule",
        kind: FunctionKind::Rule,
        bytes: guest!("content_status_rule"),
    },
    Builtin {
        name: "CountRule",
        kind: FunctionKind::Rule,
        bytes: guest!("count_rule"),
    },
    Builtin {
        name: "ReviewUniqueByObjectRule",
        kind: FunctionKind::Rule,
        bytes: guest!("review_unique_by_object_rule"),
    },
    Builtin {
        name: "SumFieldRule",
        kind: FunctionKind::Rule,
        bytes: guest!("sum_field_rule"),
    },
    Builtin {
        name: "TreeStrategy",
        kind: FunctionKind::Strategy,
        bytes: guest!("tree_strategy"),
    },
    Builtin {
        name: "JsonTransform",
        kind: FunctionKind::Transform,
        bytes: guest!("json_transform"),
    },
    Builtin {
        name: "KeyValueTransform",
        kind: FunctionKind::Transform,
        bytes: guest!("key_value_transform"),
    },
    Builtin {
        name: "CsvTransform",
        kind: FunctionKind::Transform,
        bytes: guest!("csv_transform"),
    },
];

/// Where the build put every guest component, the test-only ones included
/// (`hostile_function.wasm`, `accept_all_filter.wasm`, `reject_all_filter.wasm`).
pub fn guest_dir() -> &'static Path {
    Path::new(env!("LAUREL_GUEST_DIR"))
}

pub fn builtin(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// Whether `sha256` is the digest of one of the built-ins' bytes (under
/// any name: the bytes are the binary's, whoever pushed them).
pub fn is_builtin(sha256: &str) -> bool {
    static DIGESTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    DIGESTS
        .get_or_init(|| {
            BUILTINS
                .iter()
                .map(|b| hex::encode(Sha256::digest(b.bytes)))
                .collect()
        })
        .iter()
        .any(|digest| digest == sha256)
}

/// Registers each built-in whose bytes were never registered under its name.
/// A name whose current version was pushed by someone else keeps it until
/// this binary brings new built-in bytes.
pub async fn register(
    store: &mut Store,
    runtime: &Runtime,
) -> anyhow::Result<Vec<(&'static str, PushOutcome)>> {
    let mut outcomes = Vec::new();
    for builtin in BUILTINS {
        let sha256 = hex::encode(Sha256::digest(builtin.bytes));
        if store.function_has_sha(builtin.name, &sha256).await? {
            continue;
        }
        let limits = crate::runtime::FunctionLimits::default();
        let kind = runtime.inspect(builtin.name, builtin.bytes, Some(builtin.kind), limits)?;
        let pushed = crate::store::Pushing {
            name: builtin.name,
            kind: kind.as_str(),
            sha256: &sha256,
            bytes: builtin.bytes,
            limits,
            builtin: true,
        };
        let outcome = store.push_function(pushed, false).await?;
        info!(
            message = "Registered a built-in function.",
            function = builtin.name,
            ?outcome
        );
        outcomes.push((builtin.name, outcome));
    }
    Ok(outcomes)
}
