//! The keys a batch's rows are found by. They borrow from the batch's
//! outcomes and the rows read for it: a batch touches thousands of keys,
//! and copying each one was a measurable share of ingest's CPU. Their
//! order (derived, field by field) is the order rows are locked and
//! written in.

use super::Outcome;

/// One user's objective: a row of `user_objective`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ObjectiveKey<'a> {
    pub user: &'a str,
    pub award: &'a str,
    pub objective: &'a str,
}

impl<'a> ObjectiveKey<'a> {
    pub fn of(o: &'a Outcome) -> ObjectiveKey<'a> {
        ObjectiveKey {
            user: &o.user_id,
            award: &o.award_id,
            objective: &o.objective_id,
        }
    }

    /// The share of `content` in this objective.
    pub fn share(self, content: &'a str) -> ShareKey<'a> {
        ShareKey {
            objective: self,
            content,
        }
    }

    /// The de-duplication group `dedup` of this objective.
    pub fn group(self, dedup: &'a str) -> GroupKey<'a> {
        GroupKey {
            objective: self,
            dedup,
        }
    }
}

/// A content item of the batch's source: a row of `content_items`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ItemKey<'a> {
    pub user: &'a str,
    pub content: &'a str,
}

impl<'a> ItemKey<'a> {
    /// The item of an outcome, if it has one (an analytics event has none).
    pub fn of(o: &'a Outcome) -> Option<ItemKey<'a>> {
        o.content_id.as_deref().map(|content| ItemKey {
            user: &o.user_id,
            content,
        })
    }
}

/// What one content item contributes to one objective (an entry of the
/// item's `shares`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ShareKey<'a> {
    pub objective: ObjectiveKey<'a>,
    pub content: &'a str,
}

impl<'a> ShareKey<'a> {
    pub fn item(&self) -> ItemKey<'a> {
        ItemKey {
            user: self.objective.user,
            content: self.content,
        }
    }
}

/// The items of one objective sharing a de-duplication key: rows of
/// `dedup_members`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct GroupKey<'a> {
    pub objective: ObjectiveKey<'a>,
    pub dedup: &'a str,
}
