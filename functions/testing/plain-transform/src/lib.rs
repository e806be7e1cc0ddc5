//! Test-only transform of the plain `transform` world, written with
//! wit-bindgen alone, as a transform was built before `transform-scope`
//! existed: it cannot be told which types are kept, so it makes them all.
//! Each record `USER TYPE` becomes one event (id: its offset).

#[cfg(target_arch = "wasm32")]
mod component {
    #[allow(missing_docs, clippy::all)]
    mod bindings {
        wit_bindgen::generate!({
            world: "transform",
            path: "../../../wit",
        });
    }

    use bindings::exports::laurel::award::transforms::{self, Envelope, RecordBatch};

    struct Component;

    struct PlainTransform;

    impl transforms::Guest for Component {
        type Transform = PlainTransform;
    }

    /// 11 words per record; its value is the first range.
    const RECORD_WORDS: usize = 11;

    impl transforms::GuestTransform for PlainTransform {
        fn create(_config: String) -> Result<transforms::Transform, String> {
            Ok(transforms::Transform::new(PlainTransform))
        }

        fn apply(&self, batch: RecordBatch) -> Vec<Result<Vec<Envelope>, String>> {
            batch
                .records
                .chunks_exact(RECORD_WORDS)
                .map(|words| {
                    let (at, len) = (words[0] as usize, words[1] as usize);
                    let offset = u64::from(words[5]) | (u64::from(words[6]) << 32);
                    let text = std::str::from_utf8(&batch.bytes[at..at + len])
                        .map_err(|e| e.to_string())?;
                    let (user, event_type) = text
                        .split_once(' ')
                        .ok_or_else(|| format!("{text:?} is not `USER TYPE`"))?;
                    Ok(vec![Envelope {
                        id: format!("plain-{offset}"),
                        event_type: event_type.to_string(),
                        user_id: user.to_string(),
                        authorized: true,
                        content_id: None,
                        status: None,
                        occurred_at: "2026-12-01T10:00:00Z".to_string(),
                        payload: "{}".to_string(),
                    }])
                })
                .collect()
        }
    }

    bindings::export!(Component with_types_in bindings);
}
