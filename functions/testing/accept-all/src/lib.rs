//! Test-only filter that accepts every event (the hot-swap tests push it as
//! version 1 and [`reject-all`] as version 2 of the same name).

use laurel_guest::{Event, Filter};

pub struct AcceptAll;

impl Filter for AcceptAll {
    fn from_config(_config: &str) -> Result<Self, String> {
        Ok(AcceptAll)
    }

    fn matches(&self, _event: &Event<'_>) -> bool {
        true
    }
}

laurel_guest::export_filter!(AcceptAll);
