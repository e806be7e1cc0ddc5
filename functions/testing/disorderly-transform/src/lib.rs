//! Test-only transform of the `scoped-transform` world, written with
//! wit-bindgen alone so that its answers can be wrong as the SDK never
//! makes them: its config lists record places (`"3,1"`), and
//! `apply-for-types` answers for exactly those, in that order, each record
//! named being malformed ("named"), whether or not the batch has it.
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
        named: Vec<u32>,
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
                .map(|n| n.trim().parse().map_err(|e| format!("{n:?}: {e}")))
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
                .map(|&index| Answer {
                    index,
                    events: Err("named".to_string()),
                })
                .collect()
        }
    }

    bindings::export!(Component with_types_in bindings);
}
