//! Reading what a consumer group has not taken yet of a topic, up to the
//! end as it is when the read starts (a replay of dead letters): assigned,
//! not subscribed, so nothing else of the group is disturbed; the ends are
//! committed only when every one was reached.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};

use super::fetch::{OwnedRecord, Record};

/// The records of a topic from a group's committed offsets to the ends.
pub struct Span {
    consumer: StreamConsumer,
    topic: String,
    /// Per partition still read: the end (exclusive).
    ends: HashMap<i32, i64>,
    /// The ends of the partitions read to their end.
    done: TopicPartitionList,
    /// Records from the starts to the ends (compaction may leave fewer).
    total: u64,
}

impl Span {
    /// What `group` has not committed of `topic`, up to its end now; None
    /// when that is nothing.
    pub async fn open(brokers: &str, group: &str, topic: &str) -> anyhow::Result<Option<Span>> {
        let ranges = {
            let (brokers, group, topic) =
                (brokers.to_string(), group.to_string(), topic.to_string());
            tokio::task::spawn_blocking(move || ranges(&brokers, &group, &topic)).await??
        };
        let ends: HashMap<i32, i64> = ranges
            .iter()
            .filter(|(_, start, end)| start < end)
            .map(|(partition, _, end)| (*partition, *end))
            .collect();
        if ends.is_empty() {
            return Ok(None);
        }
        let consumer: StreamConsumer = super::client_config(brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .map_err(|e| anyhow::anyhow!("failed to create a consumer of {topic}: {e}"))?;
        let mut assignment = TopicPartitionList::new();
        for (partition, start, end) in &ranges {
            if start < end {
                assignment.add_partition_offset(topic, *partition, Offset::Offset(*start))?;
            }
        }
        consumer.assign(&assignment)?;
        let total = ranges
            .iter()
            .map(|(_, start, end)| u64::try_from(end - start).unwrap_or(0))
            .sum();
        Ok(Some(Span {
            consumer,
            topic: topic.to_string(),
            ends,
            done: TopicPartitionList::new(),
            total,
        }))
    }

    /// How many records the span holds at most.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The next record of the span, or None once every end is reached.
    /// It waits as long as the broker takes: bound it with a timeout.
    pub async fn next(&mut self) -> anyhow::Result<Option<OwnedRecord>> {
        while !self.ends.is_empty() {
            let message = self.consumer.recv().await?;
            let record = Record::borrowed(&message);
            let partition = record.partition();
            let Some(&end) = self.ends.get(&partition) else {
                continue;
            };
            if record.offset() >= end {
                continue;
            }
            if record.offset() + 1 >= end {
                self.ends.remove(&partition);
                self.done
                    .add_partition_offset(&self.topic, partition, Offset::Offset(end))?;
            }
            return Ok(Some(record.detach()));
        }
        Ok(None)
    }

    /// Commits the group's offsets at the ends reached.
    pub fn commit(self) -> anyhow::Result<()> {
        self.consumer.commit(&self.done, CommitMode::Sync)?;
        Ok(())
    }
}

/// Per partition of `topic`: where the group's read starts (its committed
/// offset, or the oldest kept) and the end now.
fn ranges(brokers: &str, group: &str, topic: &str) -> anyhow::Result<Vec<(i32, i64, i64)>> {
    let timeout = Duration::from_secs(10);
    let consumer: BaseConsumer = super::client_config(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| anyhow::anyhow!("failed to create a consumer of {topic}: {e}"))?;
    let partitions = super::partitions(&consumer, topic, timeout)?;
    let mut asked = TopicPartitionList::new();
    for partition in &partitions {
        asked.add_partition(topic, *partition);
    }
    let committed = consumer.committed_offsets(asked, timeout)?;
    let mut ranges = Vec::new();
    for partition in partitions {
        let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
        let start = match committed
            .find_partition(topic, partition)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(offset)) => offset.max(low),
            _ => low,
        };
        ranges.push((partition, start, high));
    }
    Ok(ranges)
}
