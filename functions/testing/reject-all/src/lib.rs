//! Test-only filter that rejects every event (see `accept-all`).

use laurel_guest::{Event, Filter};

pub struct RejectAll;

impl Filter for RejectAll {
    fn from_config(_config: &str) -> Result<Self, String> {
        Ok(RejectAll)
    }

    fn matches(&self, _event: &Event<'_>) -> bool {
        false
    }
}

laurel_guest::export_filter!(RejectAll);
