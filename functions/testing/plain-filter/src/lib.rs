//! Test-only filter of the plain `filter` world, written with wit-bindgen
//! alone, as a filter was built before the `filter-scope` interface
//! existed: it exports `filters` and nothing else, so it declares no event
//! types. It accepts every event (16 words per event in the batch).

#[cfg(target_arch = "wasm32")]
mod component {
    #[allow(missing_docs, clippy::all)]
    mod bindings {
        wit_bindgen::generate!({
            world: "filter",
            path: "../../../wit",
        });
    }

    use bindings::exports::laurel::award::filters::{self, EventBatch};

    struct Component;

    struct PlainFilter;

    impl filters::Guest for Component {
        type Filter = PlainFilter;
    }

    impl filters::GuestFilter for PlainFilter {
        fn create(_config: String) -> Result<filters::Filter, String> {
            Ok(filters::Filter::new(PlainFilter))
        }

        fn sources(&self) -> Option<Vec<String>> {
            None
        }

        fn matches(&self, batch: EventBatch) -> Vec<bool> {
            vec![true; batch.events.len() / 16]
        }
    }

    bindings::export!(Component with_types_in bindings);
}
