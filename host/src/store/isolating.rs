//! A batch PostgreSQL refuses for its data, split until the events it
//! refuses are found.

use std::collections::HashSet;

use tracing::{error, warn};

use super::{Applied, Batch, BatchPart, DeadEvent, Store, StoreError};

impl Store {
    /// Applies a batch; if PostgreSQL refuses it for its data (a class 22 or
    /// 54 error that the checks before it did not foresee), splits it in
    /// stream order until the events it refuses are found. Those are kept as
    /// dead letters (returned, for the topic); the rest applies once.
    /// Environment faults are returned as they are.
    pub async fn apply_isolating(
        &mut self,
        batch: &Batch<'_>,
    ) -> Result<(Applied, Vec<DeadEvent>), StoreError> {
        let error = match self.apply_batch(*batch).await {
            Ok(applied) => return Ok((applied, Vec::new())),
            Err(error) if !error.is_data_error() => return Err(error),
            Err(error) => error,
        };
        warn!(message = "PostgreSQL refused a batch for its data; finding the events it refuses.", source = %batch.source, %error);
        let mut applied = Applied::default();
        let mut refused = Vec::new();
        // Parts in stream order, front first: a refused part is replaced by
        // its two halves.
        let indexes: Vec<usize> = batch.indexes().into_iter().collect();
        let mut parts: std::collections::VecDeque<(Vec<usize>, Option<StoreError>)> =
            std::collections::VecDeque::from([(indexes, Some(error))]);
        while let Some((part, error)) = parts.pop_front() {
            let error = match error {
                Some(error) => error,
                None => {
                    let keep: HashSet<usize> = part.iter().copied().collect();
                    let input = BatchPart::of(batch, |i| keep.contains(&i));
                    match self.apply_batch(input.batch(batch)).await {
                        Ok(done) => {
                            applied.merge(done);
                            continue;
                        }
                        Err(error) if !error.is_data_error() => return Err(error),
                        Err(error) => error,
                    }
                }
            };
            if part.len() > 1 {
                let (left, right) = part.split_at(part.len() / 2);
                parts.push_front((right.to_vec(), None));
                parts.push_front((left.to_vec(), None));
                continue;
            }
            // The event PostgreSQL refuses: kept as a dead letter alone.
            let index = part[0];
            let (event_id, user_id) = batch
                .outcomes
                .iter()
                .find(|o| o.index == index)
                .map(|o| (Some(o.event_id.clone()), Some(o.user_id.clone())))
                .or_else(|| {
                    batch
                        .log
                        .iter()
                        .find(|l| l.index == index)
                        .map(|l| (l.event_id.clone(), l.user_id.clone()))
                })
                .or_else(|| {
                    batch
                        .dead
                        .iter()
                        .find(|d| d.index == index)
                        .map(|d| (d.event_id.clone(), d.user_id.clone()))
                })
                .unwrap_or((None, None));
            let dead = DeadEvent {
                index,
                event_id,
                user_id,
                reason: format!("PostgreSQL refused the event: {error}"),
            };
            let alone = BatchPart {
                dead: vec![dead.clone()],
                ..BatchPart::default()
            };
            match self.apply_batch(alone.batch(batch)).await {
                Ok(_) => {}
                Err(error) if error.is_data_error() => {
                    error!(message = "Could not keep a refused event in the database; it goes to the dead-letter topic only.", source = %batch.source, %error);
                }
                Err(error) => return Err(error),
            }
            refused.push(dead);
        }
        Ok((applied, refused))
    }
}
