//! Times as the event envelope writes them (RFC 3339, UTC), from the
//! numbers producers send (milliseconds or seconds since the Unix epoch).

/// `2026-12-01T10:00:00.250Z` for `ms` milliseconds since the Unix epoch.
pub fn rfc3339_from_millis(ms: i64) -> String {
    let seconds = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = seconds.div_euclid(86_400);
    let second_of_day = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (
        second_of_day / 3600,
        second_of_day % 3600 / 60,
        second_of_day % 60,
    );
    if millis == 0 {
        format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}Z")
    }
}

/// The proleptic Gregorian date of a day number (0 = 1970-01-01), after
/// Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::rfc3339_from_millis;

    #[test]
    fn epoch_milliseconds_become_rfc3339() {
        assert_eq!(rfc3339_from_millis(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_from_millis(1_764_583_200_250),
            "2025-12-01T10:00:00.250Z"
        );
        // A leap day, and the day after.
        assert_eq!(rfc3339_from_millis(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_from_millis(951_868_800_000), "2000-03-01T00:00:00Z");
        assert_eq!(rfc3339_from_millis(-1), "1969-12-31T23:59:59.999Z");
    }
}
