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
        self.locate(document).map(|(found, _)| found)
    }

    /// As [`find`](Self::find), and whether the value found is a string
    /// with escapes.
    fn locate(&self, document: &[u8]) -> Result<(Option<Range<usize>>, bool), ParseWhole> {
        let mut scan = Scan {
            bytes: document,
            at: 0,
            non_ascii: false,
            escaped: false,
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
        Ok((found, scan.escaped))
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
        let (Some(range), escaped) = self.locate(document)? else {
            return Ok(None);
        };
        let found = &document[range];
        if found.first() != Some(&b'"') {
            return Ok(None);
        }
        let inner = &found[1..found.len() - 1];
        if !escaped {
            // SAFETY: `locate` vouched for the whole text as UTF-8 (it is
            // ASCII, or was checked), and `inner` lies between two ASCII
            // quotes, so it starts and ends on character boundaries.
            return Ok(Some(Cow::Borrowed(unsafe {
                std::str::from_utf8_unchecked(inner)
            })));
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
    /// Whether the last string found at the pointer holds escapes.
    escaped: bool,
}

impl Scan<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn space(&mut self) {
        self.at = space(self.bytes, self.at);
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
            if self.peek() == Some(b'"') {
                self.escaped = self.string()?.1;
            } else {
                self.value(depth)?;
            }
            return Ok(Some(start..self.at));
        };
        match self.peek() {
            Some(b'{') => {
                let mut found = None;
                self.members(depth, |scan, key, escaped| {
                    let matches = if escaped {
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
        self.at = skip(self.bytes, self.at, depth, &mut self.non_ascii)?;
        Ok(())
    }

    /// An object here: `member` is called after each key and its colon,
    /// with the key's text as written and whether it holds escapes, and
    /// reads the value.
    fn members(
        &mut self,
        depth: usize,
        mut member: impl FnMut(&mut Self, &[u8], bool) -> Result<(), ParseWhole>,
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
            let (key, escaped) = self.string()?;
            let bytes = self.bytes;
            let key = &bytes[key.start + 1..key.end - 1];
            self.expect(b':')?;
            member(self, key, escaped)?;
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

    /// A string here, quotes included, and whether it holds escapes.
    #[inline(always)]
    fn string(&mut self) -> Result<(Range<usize>, bool), ParseWhole> {
        let start = self.at;
        let (end, escaped) = string(self.bytes, start, &mut self.non_ascii)?;
        self.at = end;
        Ok((start..end, escaped))
    }
}

// What a value is skipped with: each takes where to start and answers where
// it stopped, so the position stays in a register rather than in memory
// (in Wasm, linear memory), and `skip` goes through nested values in one
// loop rather than by recursion. The steps a token takes are inlined: in
// Wasm a call that answers two values answers them through memory.

/// Past any space from `at`.
#[inline(always)]
fn space(bytes: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = bytes.get(at) {
        at += 1;
    }
    at
}

/// Past one value at `at` (after any space) that is nested `depth` deep.
fn skip(
    bytes: &[u8],
    mut at: usize,
    depth: usize,
    non_ascii: &mut bool,
) -> Result<usize, ParseWhole> {
    // Bit n: whether the n-th container open within the value is an array
    // (fewer than MAX_DEPTH are).
    let mut arrays: u128 = 0;
    let mut open = 0;
    loop {
        // A value here.
        at = space(bytes, at);
        match bytes.get(at) {
            Some(b'{' | b'[') if depth + open >= MAX_DEPTH => return Err(ParseWhole),
            Some(b'{') => {
                at = space(bytes, at + 1);
                if bytes.get(at) == Some(&b'}') {
                    at += 1;
                } else {
                    arrays &= !(1 << open);
                    open += 1;
                    at = member_key(bytes, at, non_ascii)?;
                    continue;
                }
            }
            Some(b'[') => {
                at = space(bytes, at + 1);
                if bytes.get(at) == Some(&b']') {
                    at += 1;
                } else {
                    arrays |= 1 << open;
                    open += 1;
                    continue;
                }
            }
            Some(b'"') => at = string(bytes, at, non_ascii)?.0,
            Some(b'-' | b'0'..=b'9') => at = number(bytes, at)?,
            Some(b't') => at = word(bytes, at, b"true")?,
            Some(b'f') => at = word(bytes, at, b"false")?,
            Some(b'n') => at = word(bytes, at, b"null")?,
            _ => return Err(ParseWhole),
        }
        // After a value: the containers it ends, then the next element, or
        // the next member's key.
        loop {
            if open == 0 {
                return Ok(at);
            }
            at = space(bytes, at);
            let array = (arrays >> (open - 1)) & 1 == 1;
            match bytes.get(at) {
                Some(b',') if array => {
                    at += 1;
                    break;
                }
                Some(b',') => {
                    at = member_key(bytes, space(bytes, at + 1), non_ascii)?;
                    break;
                }
                Some(b']') if array => {
                    at += 1;
                    open -= 1;
                }
                Some(b'}') if !array => {
                    at += 1;
                    open -= 1;
                }
                _ => return Err(ParseWhole),
            }
        }
    }
}

/// Past a member's key at `at` and its colon.
#[inline(always)]
fn member_key(bytes: &[u8], at: usize, non_ascii: &mut bool) -> Result<usize, ParseWhole> {
    if bytes.get(at) != Some(&b'"') {
        return Err(ParseWhole);
    }
    let (end, _) = string(bytes, at, non_ascii)?;
    let end = space(bytes, end);
    if bytes.get(end) != Some(&b':') {
        return Err(ParseWhole);
    }
    Ok(end + 1)
}

/// Past the string at `start` (its opening quote), and whether it holds
/// escapes.
#[inline(always)]
fn string(bytes: &[u8], start: usize, non_ascii: &mut bool) -> Result<(usize, bool), ParseWhole> {
    let mut at = start + 1;
    let mut escaped = false;
    loop {
        at = plain(bytes, at);
        let Some(&byte) = bytes.get(at) else {
            return Err(ParseWhole);
        };
        at += 1;
        match byte {
            b'"' => return Ok((at, escaped)),
            b'\\' => {
                escaped = true;
                at = escape(bytes, at)?;
            }
            0x00..=0x1f => return Err(ParseWhole),
            0x80..=0xff => *non_ascii = true,
            _ => {}
        }
    }
}

/// Past the bytes of a string that need no look: eight at a time while
/// none of them is a quote, a backslash, a control character or past
/// ASCII.
#[inline(always)]
fn plain(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Sets the high bit of each byte that is zero (and maybe of the bytes
    // after one that is).
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let special = zero(word ^ (ONES * u64::from(b'"')))
            | zero(word ^ (ONES * u64::from(b'\\')))
            | (word.wrapping_sub(ONES * 0x20) & !word & HIGH)
            | (word & HIGH);
        if special != 0 {
            // The first special byte (little-endian: the lowest).
            return at + special.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    while let Some(b' '..=b'!' | b'#'..=b'[' | b']'..=0x7f) = bytes.get(at) {
        at += 1;
    }
    at
}

/// Past an escape, `at` being after its backslash. A surrogate (`\uD800`
/// to `\uDFFF`) is left to a full parse, which knows whether it is half of
/// a pair.
fn escape(bytes: &[u8], at: usize) -> Result<usize, ParseWhole> {
    match bytes.get(at) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(at + 1),
        Some(b'u') => {
            let hex = bytes.get(at + 1..at + 5).ok_or(ParseWhole)?;
            let hex = std::str::from_utf8(hex).map_err(|_| ParseWhole)?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ParseWhole);
            }
            let unit = u16::from_str_radix(hex, 16).map_err(|_| ParseWhole)?;
            if (0xD800..=0xDFFF).contains(&unit) {
                return Err(ParseWhole);
            }
            Ok(at + 5)
        }
        _ => Err(ParseWhole),
    }
}

/// Past the number at `start`:
/// `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`; a number a float may
/// not hold (an exponent, or very many digits) is left to a full parse
/// unless it is surely within range.
#[inline(always)]
fn number(bytes: &[u8], start: usize) -> Result<usize, ParseWhole> {
    let mut at = start;
    if bytes.get(at) == Some(&b'-') {
        at += 1;
    }
    match bytes.get(at) {
        Some(b'0') => at += 1,
        Some(b'1'..=b'9') => at = digits(bytes, at),
        _ => return Err(ParseWhole),
    }
    let mut plain = true;
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        if !matches!(bytes.get(at), Some(b'0'..=b'9')) {
            return Err(ParseWhole);
        }
        at = digits(bytes, at);
    }
    if let Some(b'e' | b'E') = bytes.get(at) {
        plain = false;
        at += 1;
        if let Some(b'+' | b'-') = bytes.get(at) {
            at += 1;
        }
        if !matches!(bytes.get(at), Some(b'0'..=b'9')) {
            return Err(ParseWhole);
        }
        at = digits(bytes, at);
    }
    let text = &bytes[start..at];
    if !plain || text.len() > 300 {
        let number: f64 = std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or(ParseWhole)?;
        if number.abs() >= 1e300 {
            return Err(ParseWhole);
        }
    }
    Ok(at)
}

/// Past the digits from `at`: eight at a time while all eight are.
#[inline(always)]
fn digits(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        // A byte is a digit when its high nibble is 3 and its low one below
        // 10: (b & 0xF0) == 0x30 and ((b & 0x0F) + 6) & 0x10 == 0.
        let high_nibbles = (word & (ONES * 0xF0)) ^ (ONES * 0x30);
        let past_nine = (word & (ONES * 0x0F)).wrapping_add(ONES * 6) & (ONES * 0x10);
        let other = high_nibbles | past_nine;
        if other != 0 {
            // The first byte that is not a digit (little-endian: the
            // lowest set bit's byte).
            return at + other.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    while let Some(b'0'..=b'9') = bytes.get(at) {
        at += 1;
    }
    at
}

/// Past `word` at `at`.
fn word(bytes: &[u8], at: usize, word: &[u8]) -> Result<usize, ParseWhole> {
    if bytes[at..].starts_with(word) {
        Ok(at + word.len())
    } else {
        Err(ParseWhole)
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
                // And the text there, escapes or not.
                let text = JsonPointer::parse(pointer).unwrap().text_in(document);
                assert_eq!(
                    text.map(|t| t.map(|t| t.into_owned())),
                    Ok(found.and_then(|v| v.as_str().map(str::to_string))),
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
            br#"{"user":"u\"1","event":"navi.trip\u005ffinished\n","event":"x\/y"}"#,
            // Runs of digits across the eight-byte steps.
            br#"{"n":[1234567,12345678,123456789,1234567890123456,0.12345678901,9e99]}"#,
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
            "/n/3",
            "/t/x",
            "/missing",
        ];
        // Each document, and each of its prefixes and one-byte changes.
        // `/` and `:` are the bytes either side of the digits.
        let replacements: &[u8] = b" \"\\{}[],:0-1.eE+tnu/\x00\x1f\xff\xc3";
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
