//! What content items contribute to their objectives. Contributions are
//! *absolute* counters for an item's current status; an objective's total
//! is the sum over its units, a unit being an item on its own or a group
//! of items sharing a de-duplication key (the group counts each counter's
//! maximum). Counter arithmetic is checked.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use super::Counters;
use super::keys::{GroupKey, ObjectiveKey, ShareKey};

/// An item's contribution to one objective, as `shares` keeps it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Stored<'a> {
    pub counters: Counters,
    pub dedup_key: Option<&'a str>,
}

/// A unit of an objective's total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Unit<'a> {
    Item(&'a str),
    Group(&'a str),
}

fn unit_of<'a>(content: &'a str, dedup_key: Option<&'a str>) -> Unit<'a> {
    match dedup_key {
        Some(key) => Unit::Group(key),
        None => Unit::Item(content),
    }
}

/// `into += sign * from`, or the name of the counter that overflows.
pub(super) fn add_checked(into: &mut Counters, from: &Counters, sign: i64) -> Result<(), String> {
    for (name, value) in from {
        let term = value.checked_mul(sign).ok_or_else(|| name.clone())?;
        match into.get_mut(name) {
            Some(total) => *total = total.checked_add(term).ok_or_else(|| name.clone())?,
            None => {
                into.insert(name.clone(), term);
            }
        }
    }
    Ok(())
}

pub(super) fn nonzero(counters: Counters) -> Counters {
    counters.into_iter().filter(|(_, v)| *v != 0).collect()
}

pub(crate) fn counters_from(value: &Value) -> Counters {
    value
        .as_object()
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| v.as_i64().map(|v| (k.clone(), v)))
                .collect()
        })
        .unwrap_or_default()
}

/// What the content items a batch touches contribute, per objective.
#[derive(Default)]
pub(super) struct Contributions<'a> {
    pub items: HashMap<ShareKey<'a>, Stored<'a>>,
    /// Members of each group touched (content ids).
    groups: HashMap<GroupKey<'a>, BTreeSet<&'a str>>,
    /// De-duplication keys that changed: (share, old key, new key).
    pub rekeyed: Vec<(ShareKey<'a>, Option<&'a str>, Option<&'a str>)>,
}

impl<'a> Contributions<'a> {
    /// Loads one stored share of an item: `share` is `{"c": counters, "k": key}`.
    pub fn load(&mut self, key: ShareKey<'a>, share: &'a Value) {
        let dedup_key = share.get("k").and_then(Value::as_str);
        if let Some(dedup) = dedup_key {
            self.groups
                .entry(key.objective.group(dedup))
                .or_default()
                .insert(key.content);
        }
        let counters = share.get("c").map(counters_from).unwrap_or_default();
        self.items.entry(key).or_insert(Stored {
            counters,
            dedup_key,
        });
    }

    /// The groups of the items loaded so far.
    pub fn groups(&self) -> impl Iterator<Item = GroupKey<'a>> + '_ {
        self.groups.keys().copied()
    }

    /// A unit's value, with `item`'s contribution taken as `next` (None:
    /// as stored).
    fn unit_value(
        &self,
        objective: ObjectiveKey<'a>,
        unit: Unit<'a>,
        next: Option<(&'a str, &Stored<'a>)>,
    ) -> Counters {
        let stored = |content: &'a str| -> Option<&Stored<'a>> {
            match next {
                Some((item, next)) if item == content => Some(next),
                _ => self.items.get(&objective.share(content)),
            }
        };
        match unit {
            Unit::Item(content) => match stored(content) {
                Some(s) if s.dedup_key.is_none() => s.counters.clone(),
                _ => Counters::new(),
            },
            Unit::Group(dedup) => {
                let mut members: BTreeSet<&'a str> = self
                    .groups
                    .get(&objective.group(dedup))
                    .cloned()
                    .unwrap_or_default();
                if let Some((item, next)) = next {
                    if next.dedup_key == Some(dedup) {
                        members.insert(item);
                    } else {
                        members.remove(item);
                    }
                }
                let mut max = Counters::new();
                for content in members {
                    if let Some(s) = stored(content) {
                        for (name, value) in &s.counters {
                            let entry = max.entry(name.clone()).or_insert(*value);
                            *entry = (*entry).max(*value);
                        }
                    }
                }
                max
            }
        }
    }

    /// The change of the objective's counters if `key`'s contribution
    /// became `next`, without changing anything; `Err` names a counter that
    /// would overflow.
    pub fn preview(&self, key: ShareKey<'a>, next: &Stored<'a>) -> Result<Counters, String> {
        let previous = self
            .items
            .get(&key)
            .map(|s| unit_of(key.content, s.dedup_key));
        let mut units: Vec<Unit<'a>> = previous
            .into_iter()
            .chain([unit_of(key.content, next.dedup_key)])
            .collect();
        units.sort();
        units.dedup();
        let mut delta = Counters::new();
        for unit in units {
            add_checked(&mut delta, &self.unit_value(key.objective, unit, None), -1)?;
            add_checked(
                &mut delta,
                &self.unit_value(key.objective, unit, Some((key.content, next))),
                1,
            )?;
        }
        Ok(nonzero(delta))
    }

    /// Makes `next` the contribution of `key`.
    pub fn replace(&mut self, key: ShareKey<'a>, next: Stored<'a>) {
        let old_key = self.items.get(&key).and_then(|s| s.dedup_key);
        if let Some(old) = old_key
            && let Some(members) = self.groups.get_mut(&key.objective.group(old))
        {
            members.remove(key.content);
        }
        if let Some(new) = next.dedup_key {
            self.groups
                .entry(key.objective.group(new))
                .or_default()
                .insert(key.content);
        }
        if old_key != next.dedup_key {
            self.rekeyed.push((key, old_key, next.dedup_key));
        }
        self.items.insert(key, next);
    }
}
