//! Test-only transform of the `scoped-transform` world, written with
//! wit-bindgen alone so that its answers can be wrong as the SDK never
//! makes them: its config lists record places (`"3,1"`), and
//! `apply-for-types` answers for exactly those, in that order, whether or
//! not the batch has them: each record named is malformed ("named"), or,
//! written `N:none`, made no event.
//! `apply` answers every record with no event.

#[cfg(target_arch = "wasm32")]
mod component {
    #[allow(missing_docs, clippy::all)]
    mod bindings {
        wit_bindgen::generate!({
            world: "scoped-transform",
            path: "../../../wit",
        });
    }

    use bindings::exports::laurel::award::transform_scope::{self, Answer};
    use bindings::exports::laurel::award::transforms::{
        self, Envelope, RecordBatch, TransformBorrow,
    };

    struct Component;

    struct DisorderlyTransform {
        /// Each record named, and whether it made no event (else it is
        /// malformed).
        named: Vec<(u32, bool)>,
    }

    /// 11 words per record.
    const RECORD_WORDS: usize = 11;

    impl transforms::Guest for Component {
        type Transform = DisorderlyTransform;
    }

    impl transforms::GuestTransform for DisorderlyTransform {
        fn create(config: String) -> Result<transforms::Transform, String> {
            let named = config
                .split(',')
                .map(|n| -> Result<(u32, bool), String> {
                    let (n, none) = match n.trim().strip_suffix(":none") {
                        Some(n) => (n, true),
                        None => (n.trim(), false),
                    };
                    let index = n.parse().map_err(|e| format!("{n:?}: {e}"))?;
                    Ok((index, none))
                })
                .collect::<Result<_, _>>()?;
            Ok(transforms::Transform::new(DisorderlyTransform { named }))
        }

        fn apply(&self, batch: RecordBatch) -> Vec<Result<Vec<Envelope>, String>> {
            (0..batch.records.len() / RECORD_WORDS)
                .map(|_| Ok(Vec::new()))
                .collect()
        }
    }

    impl transform_scope::Guest for Component {
        fn apply_for_types(
            transform: TransformBorrow<'_>,
            _batch: RecordBatch,
            _types: Option<Vec<String>>,
        ) -> Vec<Answer> {
            let this: &DisorderlyTransform = transform.get();
            this.named
                .iter()
                .map(|&(index, none)| Answer {
                    index,
                    events: if none {
                        Ok(Vec::new())
                    } else {
                        Err("named".to_string())
                    },
                })
                .collect()
        }
    }

    bindings::export!(Component with_types_in bindings);
}
