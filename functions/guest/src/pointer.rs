//! JSON pointers (RFC 6901), read once from a config, and found in a
//! record's text in one pass that allocates nothing: what a transform told
//! the kept types reads first, so a record no award needs costs a scan, not
//! a parse.
//!
//! The scan is at least as strict as a full parse with `serde_json`: where
//! it is unsure (the text is not a JSON object, nests deeper than a full
//! parse allows, holds a surrogate escape or a number near the limits of a
//! float), it says so, and the caller parses the record whole, which then
//! decides (and says what is wrong).

use std::borrow::Cow;
use std::ops::Range;

/// As deep as a full parse (`serde_json`'s recursion limit) nests.
const MAX_DEPTH: usize = 127;

/// A JSON pointer, split into its reference tokens once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointer {
    text: String,
    tokens: Vec<String>,
}

/// The scan could not vouch for the text: parse it whole to know why (or
/// to find the value after all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseWhole;

impl JsonPointer {
    /// `""` (the whole document) or `/a/b`; `None` for text that is not a
    /// JSON pointer (one starts with `/`).
    pub fn parse(pointer: &str) -> Option<JsonPointer> {
        let tokens = match pointer.strip_prefix('/') {
            Some(rest) => rest
                .split('/')
                .map(|t| t.replace("~1", "/").replace("~0", "~"))
                .collect(),
            None if pointer.is_empty() => Vec::new(),
            None => return None,
        };
        Some(JsonPointer {
            text: pointer.to_string(),
            tokens,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Where the value at this pointer is in `document` (a JSON object's
    /// text), as a range of its bytes; `Ok(None)` when it has none there
    /// (as `serde_json::Value::pointer` finds, the last of duplicate keys
    /// winning). The whole text is checked.
    pub fn find(&self, document: &[u8]) -> Result<Option<Range<usize>>, ParseWhole> {
        let mut scan = Scan {
            bytes: document,
            at: 0,
            non_ascii: false,
        };
        scan.space();
        if scan.peek() != Some(b'{') {
            return Err(ParseWhole);
        }
        let found = scan.find(&self.tokens, 0)?;
        scan.space();
        if scan.at != scan.bytes.len() {
            return Err(ParseWhole);
        }
        // Outside strings only ASCII is JSON (the scan refused anything
        // else); inside them, text must be UTF-8.
        if scan.non_ascii && std::str::from_utf8(document).is_err() {
            return Err(ParseWhole);
        }
        Ok(found)
    }

    /// The value at this pointer in `document` (a JSON object's text), or
    /// why the text is not one, as a full parse says it (what
    /// [`json_at`](crate::mapping::json_at) answers).
    pub fn json_in(&self, document: &[u8]) -> Result<Option<serde_json::Value>, String> {
        if let Ok(found) = self.find(document) {
            return Ok(found.and_then(|range| serde_json::from_slice(&document[range]).ok()));
        }
        // The scan could not vouch for the text: a full parse says why, or
        // finds the value after all.
        let whole: serde_json::Value =
            serde_json::from_slice(document).map_err(|e| format!("the record is not JSON: {e}"))?;
        if !whole.is_object() {
            return Err("the record is JSON but not an object".into());
        }
        Ok(whole.pointer(self.as_str()).cloned())
    }

    /// The text at this pointer, when there is a JSON string there
    /// (borrowed unless it has escapes); `Ok(None)` when there is nothing
    /// or something else.
    pub fn text_in<'a>(&self, document: &'a [u8]) -> Result<Option<Cow<'a, str>>, ParseWhole> {
        let Some(range) = self.find(document)? else {
            return Ok(None);
        };
        let found = &document[range];
        if found.first() != Some(&b'"') {
            return Ok(None);
        }
        let inner = &found[1..found.len() - 1];
        if !inner.contains(&b'\\') {
            return std::str::from_utf8(inner)
                .map(|t| Some(Cow::Borrowed(t)))
                .map_err(|_| ParseWhole);
        }
        serde_json::from_slice::<String>(found)
            .map(|t| Some(Cow::Owned(t)))
            .map_err(|_| ParseWhole)
    }
}

struct Scan<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Whether a string held bytes past ASCII (then the text's UTF-8 is
    /// checked once, at the end).
    non_ascii: bool,
}

impl Scan<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Consumes `byte` (after any space), or fails.
    fn expect(&mut self, byte: u8) -> Result<(), ParseWhole> {
        self.space();
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(ParseWhole)
        }
    }

    /// The value here, found at `tokens` within it; the scan ends after
    /// the value.
    fn find(
        &mut self,
        tokens: &[String],
        depth: usize,
    ) -> Result<Option<Range<usize>>, ParseWhole> {
        self.space();
        let Some((token, rest)) = tokens.split_first() else {
            let start = self.at;
            self.value(depth)?;
            return Ok(Some(start..self.at));
        };
        match self.peek() {
            Some(b'{') => {
                let mut found = None;
                self.members(depth, |scan, key| {
                    let matches = if key.contains(&b'\\') {
                        unescaped(key) == *token
                    } else {
                        key == token.as_bytes()
                    };
                    if matches {
                        found = scan.find(rest, depth + 1)?;
                    } else {
                        scan.value(depth + 1)?;
                    }
                    Ok(())
                })?;
                Ok(found)
            }
            Some(b'[') => {
                let index = array_index(token);
                let mut found = None;
                let mut at = 0;
                self.elements(depth, |scan| {
                    if Some(at) == index {
                        found = scan.find(rest, depth + 1)?;
                    } else {
                        scan.value(depth + 1)?;
                    }
                    at += 1;
                    Ok(())
                })?;
                Ok(found)
            }
            _ => {
                self.value(depth)?;
                Ok(None)
            }
        }
    }

    /// Skips one value (after any space).
    fn value(&mut self, depth: usize) -> Result<(), ParseWhole> {
        self.space();
        match self.peek() {
            Some(b'{') => self.members(depth, |scan, _| scan.value(depth + 1)),
            Some(b'[') => self.elements(depth, |scan| scan.value(depth + 1)),
            Some(b'"') => self.string().map(|_| ()),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.word(b"true"),
            Some(b'f') => self.word(b"false"),
            Some(b'n') => self.word(b"null"),
            _ => Err(ParseWhole),
        }
    }

    /// An object here: `member` is called after each key and its colon,
    /// with the key's text as written (escapes included), and reads the
    /// value.
    fn members(
        &mut self,
        depth: usize,
        mut member: impl FnMut(&mut Self, &[u8]) -> Result<(), ParseWhole>,
    ) -> Result<(), ParseWhole> {
        if depth >= MAX_DEPTH {
            return Err(ParseWhole);
        }
        self.at += 1;
        self.space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.space();
            if self.peek() != Some(b'"') {
                return Err(ParseWhole);
            }
            let key = self.string()?;
            let bytes = self.bytes;
            let key = &bytes[key.start + 1..key.end - 1];
            self.expect(b':')?;
            member(self, key)?;
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(ParseWhole),
            }
        }
    }

    /// An array here: `element` reads each element.
    fn elements(
        &mut self,
        depth: usize,
        mut element: impl FnMut(&mut Self) -> Result<(), ParseWhole>,
    ) -> Result<(), ParseWhole> {
        if depth >= MAX_DEPTH {
            return Err(ParseWhole);
        }
        self.at += 1;
        self.space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            element(self)?;
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(ParseWhole),
            }
        }
    }

    /// A string here, quotes included.
    fn string(&mut self) -> Result<Range<usize>, ParseWhole> {
        let start = self.at;
        self.at += 1;
        loop {
            self.plain();
            let Some(byte) = self.peek() else {
                return Err(ParseWhole);
            };
            self.at += 1;
            match byte {
                b'"' => return Ok(start..self.at),
                b'\\' => self.escape()?,
                0x00..=0x1f => return Err(ParseWhole),
                0x80..=0xff => self.non_ascii = true,
                _ => {}
            }
        }
    }

    /// Skips the bytes of a string that need no look: eight at a time
    /// while none of them is a quote, a backslash, a control character or
    /// past ASCII.
    fn plain(&mut self) {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        // Sets the high bit of each byte that is zero (and maybe of the
        // bytes after one that is).
        let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
        while let Some(chunk) = self.bytes.get(self.at..self.at + 8) {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            let special = zero(word ^ (ONES * u64::from(b'"')))
                | zero(word ^ (ONES * u64::from(b'\\')))
                | (word.wrapping_sub(ONES * 0x20) & !word & HIGH)
                | (word & HIGH);
            if special != 0 {
                // The first special byte (little-endian: the lowest).
                self.at += special.trailing_zeros() as usize / 8;
                return;
            }
            self.at += 8;
        }
        while let Some(b' '..=b'!' | b'#'..=b'[' | b']'..=0x7f) = self.peek() {
            self.at += 1;
        }
    }

    /// After a backslash. A surrogate (`\uD800` to `\uDFFF`) is left to a
    /// full parse, which knows whether it is half of a pair.
    fn escape(&mut self) -> Result<(), ParseWhole> {
        let byte = self.peek().ok_or(ParseWhole)?;
        self.at += 1;
        match byte {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Ok(()),
            b'u' => {
                let hex = self.bytes.get(self.at..self.at + 4).ok_or(ParseWhole)?;
                let hex = std::str::from_utf8(hex).map_err(|_| ParseWhole)?;
                if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(ParseWhole);
                }
                let unit = u16::from_str_radix(hex, 16).map_err(|_| ParseWhole)?;
                if (0xD800..=0xDFFF).contains(&unit) {
                    return Err(ParseWhole);
                }
                self.at += 4;
                Ok(())
            }
            _ => Err(ParseWhole),
        }
    }

    /// `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`; a number a float
    /// may not hold (an exponent, or very many digits) is left to a full
    /// parse unless it is surely within range.
    fn number(&mut self) -> Result<(), ParseWhole> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(ParseWhole),
        }
        let mut plain = true;
        if self.peek() == Some(b'.') {
            self.at += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(ParseWhole);
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            plain = false;
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(ParseWhole);
            }
            self.digits();
        }
        let text = &self.bytes[start..self.at];
        if !plain || text.len() > 300 {
            let number: f64 = std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or(ParseWhole)?;
            if number.abs() >= 1e300 {
                return Err(ParseWhole);
            }
        }
        Ok(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }

    fn word(&mut self, word: &[u8]) -> Result<(), ParseWhole> {
        if self.bytes[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(())
        } else {
            Err(ParseWhole)
        }
    }
}

/// A key with escapes, as its text (it was checked by the scan).
fn unescaped(key: &[u8]) -> String {
    let mut quoted = Vec::with_capacity(key.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(key);
    quoted.push(b'"');
    serde_json::from_slice(&quoted).unwrap_or_default()
}

/// An array index as RFC 6901 writes it: digits, no leading zero.
pub(crate) fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() > 1) {
        return None;
    }
    token.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::{JsonPointer, ParseWhole};
    use serde_json::Value;

    /// Whatever the scan vouches for, a full parse accepts, and the value
    /// it finds is the one `Value::pointer` finds.
    fn agrees(document: &[u8], pointer: &str) {
        let scanned = JsonPointer::parse(pointer).unwrap().find(document);
        let parsed: Result<Value, _> = serde_json::from_slice(document);
        match (scanned, parsed) {
            (Ok(found), Ok(value)) => {
                assert!(value.is_object(), "{:?}", String::from_utf8_lossy(document));
                let found: Option<Value> =
                    found.map(|r| serde_json::from_slice(&document[r]).unwrap());
                assert_eq!(
                    found.as_ref(),
                    value.pointer(pointer),
                    "{pointer} in {:?}",
                    String::from_utf8_lossy(document)
                );
            }
            (Ok(_), Err(error)) => panic!(
                "the scan vouched for {:?}, which a full parse refuses: {error}",
                String::from_utf8_lossy(document)
            ),
            (Err(ParseWhole), _) => {}
        }
    }

    #[test]
    fn the_scan_never_vouches_for_what_a_full_parse_refuses() {
        let documents: &[&[u8]] = &[
            br#"{"user":"u-1","event":"navi.trip_finished","ts":1,"distance":5}"#,
            br#"{"a":{"b":[10,{"c":"deep"},null]},"a~b":1,"a/b":2,"":3,"e\u0076ent":"escaped"}"#,
            br#"{"event":"first","event":"last"}"#,
            br#"{"list":[[1,2],[3,[4,5]]],"n":null,"t":true,"f":1.5e3,"g":-0.25E-2}"#,
            br#" { "spaced" : { "x" : [ ] } } "#,
            br#"{"s":"tab\there \" \\ \/ \b\f\n\r \u00e9 \ud83d\ude00"}"#,
            br#"{"big":1e400}"#,
            br#"{"long":123456789012345678901234567890}"#,
            "{\"utf8\":\"caf\u{e9} \u{1F600}\"}".as_bytes(),
        ];
        let pointers = [
            "",
            "/user",
            "/event",
            "/a",
            "/a/b",
            "/a/b/1/c",
            "/a/b/01",
            "/a~0b",
            "/a~1b",
            "/",
            "/list/1/1/0",
            "/spaced/x",
            "/s",
            "/big",
            "/long",
            "/utf8",
            "/t/x",
            "/missing",
        ];
        // Each document, and each of its prefixes and one-byte changes.
        let replacements: &[u8] = b" \"\\{}[],:0-1.eE+tnu\x00\x1f\xff\xc3";
        for document in documents {
            let mut variants: Vec<Vec<u8>> = vec![document.to_vec()];
            for end in 0..document.len() {
                variants.push(document[..end].to_vec());
            }
            for at in 0..document.len() {
                for &byte in replacements {
                    let mut changed = document.to_vec();
                    changed[at] = byte;
                    variants.push(changed.clone());
                    changed.remove(at);
                    variants.push(changed);
                }
            }
            for variant in &variants {
                for pointer in pointers {
                    agrees(variant, pointer);
                }
            }
        }
    }

    #[test]
    fn the_scan_reads_what_records_hold() {
        let record = br#"{"user":"u-1","event":"navi.trip_finished","ts":1764583200000,"distance":512.5,"tags":["a"],"more":{"k":null}}"#;
        let event = JsonPointer::parse("/event").unwrap();
        assert_eq!(
            event.text_in(record).unwrap().as_deref(),
            Some("navi.trip_finished")
        );
        let escaped = br#"{"event":"navi.trip\u005ffinished"}"#;
        assert_eq!(
            event.text_in(escaped).unwrap().as_deref(),
            Some("navi.trip_finished")
        );
        assert_eq!(event.text_in(br#"{"event":5}"#).unwrap(), None);
        assert_eq!(event.text_in(br#"{"other":"x"}"#).unwrap(), None);
        // Not an object, not JSON, too deep: parse whole to know why.
        assert_eq!(event.find(b"[1]"), Err(ParseWhole));
        assert_eq!(event.find(br#"{"event":"x""#), Err(ParseWhole));
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(event.find(deep.as_bytes()), Err(ParseWhole));
        assert_eq!(JsonPointer::parse("no-slash"), None);
    }
}
