//! Text from outside, made safe to store and print.

/// Text from outside (a reason quoting a key, an id from a message that
/// could not be used) made safe to store and print: NUL and other control
/// characters escaped, at most `max` bytes.
pub fn printable(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.chars() {
        if out.len() >= max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn printable_escapes_controls_and_bounds_length() {
        assert_eq!(printable("a\u{0}b\nc", 100), "a\\u{0}b\\nc");
        assert_eq!(printable(&"x".repeat(10), 4), "xxxx…");
    }
}
