//! `CsvTransform {"columns": [..], "fields": {..}}`: each row of a record
//! is one event; `columns` names the row's cells in order (the header), and
//! the event's fields are found by column name, as
//! [`laurel_guest::mapping`] describes. Cells follow RFC 4180: separated by
//! `delimiter` (`,` unless the config says otherwise), quoted with `"` when
//! they hold one, a quote or a line break (`""` is a quote). A row equal
//! to the header is skipped (producers that repeat it), as are blank rows;
//! a row with another number of cells makes the record malformed.

use std::borrow::Cow;

use laurel_guest::mapping::{Fields, Found};
use laurel_guest::{Envelope, Record, Transform, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    columns: Vec<String>,
    #[serde(default = "comma")]
    delimiter: char,
    fields: Fields,
}

fn comma() -> char {
    ','
}

pub struct CsvTransform {
    columns: Vec<String>,
    delimiter: char,
    fields: Fields,
}

impl Transform for CsvTransform {
    fn from_config(config: &str) -> Result<Self, String> {
        let Config {
            columns,
            delimiter,
            fields,
        } = parse_config(config)?;
        if columns.is_empty() {
            return Err("`columns` is empty: name the row's cells in order".into());
        }
        if matches!(delimiter, '"' | '\n' | '\r') {
            return Err(format!("{delimiter:?} cannot be the delimiter"));
        }
        for (field, column) in fields.places() {
            if !columns.iter().any(|c| c == column) {
                return Err(format!(
                    "`{field}`: {column:?} is not one of the columns ({})",
                    columns.join(", ")
                ));
            }
        }
        Ok(CsvTransform {
            columns,
            delimiter,
            fields,
        })
    }

    fn transform(&self, record: &Record<'_>) -> Result<Vec<Envelope>, String> {
        self.transform_wanted(record, &|_| true)
    }

    fn transform_wanted(
        &self,
        record: &Record<'_>,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Envelope>, String> {
        let text = record.text()?;
        let mut events = Vec::new();
        // Each row's event keeps its number (and so its id) whichever
        // others are left out.
        let mut n = 0;
        for (number, row) in rows(text, self.delimiter)?.into_iter().enumerate() {
            if row.len() == 1 && row[0].trim().is_empty() {
                continue;
            }
            if row.len() == self.columns.len() && row.iter().zip(&self.columns).all(|(a, b)| a == b)
            {
                continue;
            }
            if row.len() != self.columns.len() {
                return Err(format!(
                    "row {}: {} cells, the header has {}",
                    number + 1,
                    row.len(),
                    self.columns.len()
                ));
            }
            let find = |column: &str| {
                let at = self.columns.iter().position(|c| c == column)?;
                Some(Found::Text(row[at].as_ref()))
            };
            if self.fields.is_wanted(find, wanted) {
                let event = self
                    .fields
                    .envelope(record, n, find)
                    .map_err(|e| format!("row {}: {e}", number + 1))?;
                events.push(event);
            }
            n += 1;
        }
        Ok(events)
    }
}

/// The rows of `text` and their cells (RFC 4180).
pub fn rows(text: &str, delimiter: char) -> Result<Vec<Vec<Cow<'_, str>>>, String> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut rest = text;
    loop {
        let (cell, after) = if let Some(quoted) = rest.strip_prefix('"') {
            let (cell, after) = quoted_cell(quoted).ok_or_else(|| {
                format!("row {}: a quoted cell has no closing quote", rows.len() + 1)
            })?;
            if !(after.is_empty() || after.starts_with([delimiter, '\n', '\r'])) {
                return Err(format!(
                    "row {}: a quoted cell goes on after its closing quote",
                    rows.len() + 1
                ));
            }
            (cell, after)
        } else {
            let end = rest.find([delimiter, '\n', '\r']).unwrap_or(rest.len());
            (Cow::Borrowed(&rest[..end]), &rest[end..])
        };
        row.push(cell);
        let mut chars = after.chars();
        match chars.next() {
            Some(c) if c == delimiter => rest = chars.as_str(),
            Some('\r') | Some('\n') => {
                rows.push(std::mem::take(&mut row));
                rest = after.strip_prefix("\r\n").unwrap_or(&after[1..]);
                if rest.is_empty() {
                    return Ok(rows);
                }
            }
            _ => {
                rows.push(row);
                return Ok(rows);
            }
        }
    }
}

/// A quoted cell (after its opening quote) and what follows its closing
/// quote; `None` without one.
fn quoted_cell(text: &str) -> Option<(Cow<'_, str>, &str)> {
    let mut owned: Option<String> = None;
    let mut from = 0;
    loop {
        let at = from + text[from..].find('"')?;
        if text[at + 1..].starts_with('"') {
            let so_far = owned.get_or_insert_with(String::new);
            so_far.push_str(&text[from..=at]);
            from = at + 2;
        } else {
            let value = match owned {
                Some(mut so_far) => {
                    so_far.push_str(&text[from..at]);
                    Cow::Owned(so_far)
                }
                None => Cow::Borrowed(&text[..at]),
            };
            return Some((value, &text[at + 1..]));
        }
    }
}

laurel_guest::export_transform!(CsvTransform);

#[cfg(test)]
mod tests {
    use super::rows;

    fn read(text: &str) -> Vec<Vec<String>> {
        rows(text, ',')
            .unwrap()
            .into_iter()
            .map(|r| r.into_iter().map(|c| c.into_owned()).collect())
            .collect()
    }

    #[test]
    fn rows_follow_rfc_4180() {
        assert_eq!(read("a,b\r\n1,2\n"), [["a", "b"], ["1", "2"]]);
        assert_eq!(
            read("\"x, y\",\"say \"\"hi\"\"\",\"two\nlines\""),
            [["x, y", "say \"hi\"", "two\nlines"]]
        );
        assert_eq!(read("a,,c"), [["a", "", "c"]]);
        assert_eq!(read(""), [[""]]);
        assert!(
            rows("\"open,b", ',')
                .unwrap_err()
                .contains("no closing quote")
        );
        assert!(rows("\"a\"b,c", ',').unwrap_err().contains("goes on after"));
    }
}
