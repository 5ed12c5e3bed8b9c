//! Time: UTC timestamps as LayerZero writes them (`YYYY-MM-DDTHH:MM:SSZ`) and the clock.
//!
//! The pure core never reads the clock: an instant is passed in (a policy in force at
//! `now`), and the edges (the runtime, PerfDB, tools, `files`' temporary names) read it here.

/// Now, in Unix seconds (0 if the clock is before 1970).
pub fn now_unix() -> i64 {
    since_epoch().map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Now, in Unix milliseconds (0 if the clock is before 1970).
pub fn now_unix_ms() -> u64 {
    since_epoch().map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The nanoseconds within the current second: a changing number for unique file names, not a
/// measure of anything.
pub fn now_subsec_nanos() -> u32 {
    since_epoch().map_or(0, |d| d.subsec_nanos())
}

fn since_epoch() -> Option<std::time::Duration> {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()
}

/// Seconds since the Unix epoch of a UTC timestamp `YYYY-MM-DDTHH:MM:SSZ`; `None` when the
/// text is not one.
pub fn parse_utc(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' || b[19] != b'Z'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (y, mo, d, h, mi, s) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let month_days = *days_in.get(usize::try_from(mo - 1).ok()?)?;
    if !(1..=month_days).contains(&d) || h > 23 || mi > 59 || s > 59 {
        return None;
    }
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's published
/// days-from-civil algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix seconds as (year, month, day, hour, minute, second) in UTC, proleptic Gregorian
/// (Howard Hinnant's published civil-from-days algorithm, the inverse of the above).
pub fn civil(secs: i64) -> [i64; 6] {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    [year, month, day, rem / 3600, rem % 3600 / 60, rem % 60]
}

/// Unix seconds as the UTC timestamp `expires_at` takes (`YYYY-MM-DDTHH:MM:SSZ`).
pub fn format_utc(secs: i64) -> String {
    let [y, mo, d, h, mi, s] = civil(secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_timestamps_parse_to_unix_seconds_and_malformed_ones_do_not() {
        assert_eq!(parse_utc("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_utc("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(parse_utc("2026-11-25T12:30:05Z"), Some(1_795_609_805));
        assert_eq!(parse_utc("2024-02-29T23:59:59Z"), Some(1_709_251_199));
        for t in [0, 951_868_800, 1_709_251_199, 1_795_609_805] {
            assert_eq!(parse_utc(&format_utc(t)), Some(t), "format_utc is parse_utc's inverse");
        }
        for bad in
            ["2023-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-11-25 12:30:05Z", "2026-11-25T24:00:00Z", "soon"]
        {
            assert_eq!(parse_utc(bad), None, "{bad}");
        }
    }
}
