//! The order of a content item's events: where an event was in its topic,
//! and where it stands against the last one applied to its item.
//!
//! A content item's events apply in `occurred_at` order. Of two events
//! with the same `occurred_at`, the later in its partition is the later
//! (Kafka keeps one key's events in the order they were written; a master
//! system writes an item's status changes in the order they happened,
//! often within one millisecond). An event whose place is not known, or is
//! in another partition, falls back to the larger id (byte order).

use chrono::{DateTime, Utc};

/// Where an event was in its topic; for an event a pipeline made, where
/// its raw record was, and which of the record's events it is (`n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub n: u32,
}

impl<'a> Place<'a> {
    /// `TOPIC:PARTITION:OFFSET[:N]` (Kafka topic names have no `:`), as
    /// `content_items.place` and the `laurel-place` header carry it.
    pub fn parse(text: &'a str) -> Option<Place<'a>> {
        let mut parts = text.split(':');
        let topic = parts.next().filter(|t| !t.is_empty())?;
        let partition = parts.next()?.parse().ok()?;
        let offset = parts.next()?.parse().ok()?;
        let n = match parts.next() {
            Some(n) => n.parse().ok()?,
            None => 0,
        };
        parts.next().is_none().then_some(Place {
            topic,
            partition,
            offset,
            n,
        })
    }

    pub fn text(&self) -> String {
        match self.n {
            0 => format!("{}:{}:{}", self.topic, self.partition, self.offset),
            n => format!("{}:{}:{}:{n}", self.topic, self.partition, self.offset),
        }
    }
}

/// An event's order among its item's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Order<'a> {
    pub occurred_at: DateTime<Utc>,
    pub event_id: &'a str,
    /// None: not known (an item's event applied before places were kept,
    /// or a backfill's).
    pub place: Option<Place<'a>>,
}

/// Most ids kept per item of events processed at its last `occurred_at`
/// before the last one (more in one millisecond than any master system
/// writes for one item).
pub(super) const MAX_TIED: usize = 64;

/// The last event processed for a content item, and the ids of the others
/// processed at the same `occurred_at` before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Last<'a> {
    pub order: Order<'a>,
    pub tied: Vec<&'a str>,
}

impl<'a> Last<'a> {
    pub fn of(order: Order<'a>) -> Last<'a> {
        Last {
            order,
            tied: Vec::new(),
        }
    }

    /// Where `event` stands against this.
    pub fn standing(&self, event: &Order<'a>) -> Standing {
        let last = &self.order;
        match event.occurred_at.cmp(&last.occurred_at) {
            std::cmp::Ordering::Less => Standing::Older,
            std::cmp::Ordering::Greater => Standing::Newer,
            std::cmp::Ordering::Equal if event.event_id == last.event_id => Standing::Last,
            std::cmp::Ordering::Equal if self.tied.contains(&event.event_id) => Standing::Seen,
            std::cmp::Ordering::Equal => {
                let later = match (event.place, last.place) {
                    (Some(a), Some(b)) if a.topic == b.topic && a.partition == b.partition => {
                        (a.offset, a.n) > (b.offset, b.n)
                    }
                    _ => event.event_id > last.event_id,
                };
                if later {
                    Standing::Newer
                } else {
                    Standing::Older
                }
            }
        }
    }

    /// This, after `event` (newer) was processed.
    pub fn then(&self, event: Order<'a>) -> Last<'a> {
        if event.occurred_at != self.order.occurred_at {
            return Last::of(event);
        }
        let mut tied = self.tied.clone();
        tied.push(self.order.event_id);
        if tied.len() > MAX_TIED {
            tied.remove(0);
        }
        Last { order: event, tied }
    }
}

/// Where an event stands against its item's last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Standing {
    /// Before it: it changes nothing.
    Older,
    /// It.
    Last,
    /// Processed before it, at the same time.
    Seen,
    /// After it.
    Newer,
}
