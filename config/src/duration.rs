//! Durations as people write them in a config file: `"500ms"`, `"30s"`, `"2m"`, `"1h"`, `"1.5s"`.
//! Used through `#[serde(with = "duration")]`; a bare number is refused because it has no unit.

use std::fmt;
use std::time::Duration;

use serde::{Deserializer, Serializer};

/// What a duration must look like, for error messages.
const EXPECTED: &str = r#"a duration with a unit, such as "500ms", "30s", "2m" or "1h""#;

/// Parses `<number><unit>` with unit `ms`, `s`, `m` or `h`; the number may have a fraction.
pub fn parse(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
        return None;
    }
    let number: f64 = number.parse().ok()?;
    let seconds_per_unit = match unit.trim() {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(number * seconds_per_unit).ok()
}

/// The shortest exact spelling: whole hours, minutes or seconds, else milliseconds.
pub fn format(duration: Duration) -> String {
    let millis = duration.as_millis();
    if !millis.is_multiple_of(1000) || millis == 0 {
        return format!("{millis}ms");
    }
    let secs = millis / 1000;
    if secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// Serde: writes [`format`].
pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*duration))
}

/// Serde: reads [`parse`], refusing numbers without a unit.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Duration;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(EXPECTED)
        }
        fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<Duration, E> {
            parse(value).ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(value), &self))
        }
    }
    deserializer.deserialize_str(Visitor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_fractions() {
        assert_eq!(parse("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse(" 2m "), Some(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse("0s"), Some(Duration::ZERO));
    }

    #[test]
    fn refuses_what_has_no_clear_meaning() {
        for text in ["30", "s", "", "1.s", ".5s", "-1s", "1 d", "10sec", "1e3s", "1..2s"] {
            assert_eq!(parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for millis in [0, 1, 500, 1000, 1500, 30_000, 60_000, 90_000, 3_600_000, 7_200_000] {
            let duration = Duration::from_millis(millis);
            assert_eq!(parse(&format(duration)), Some(duration), "{millis}ms");
        }
        assert_eq!(format(Duration::from_secs(120)), "2m");
        assert_eq!(format(Duration::from_millis(500)), "500ms");
    }
}
