//! Duration literals: `"250ms"`, `"30s"`, `"10m"`, `"12h"`.
//!
//! Parsed at compile time into whole milliseconds so the expansion can emit
//! `Duration::from_millis(N)` and every mistake is reported on the literal.

/// The longest duration any option accepts: 365 days, in milliseconds.
///
/// Redis rejects a `PX` whose expiry time overflows its signed 64-bit millisecond clock, and
/// `Instant + Duration` panics on overflow; a bound far below both keeps every later
/// addition safe. It is also the runtime's own limit for `ttl` and `min_hold`, so a duration
/// the attribute accepts is never refused at run time. No lease is meant to last a year.
pub(crate) const MAX_MILLIS: u64 = 365 * 24 * 60 * 60 * 1000;

/// The shortest `ttl`, in milliseconds: the runtime's own minimum. A lease's local deadline is
/// its ttl minus a drift margin of ttl/100 + 2 ms, so a shorter lease would be lost at once.
pub(crate) const MIN_TTL_MILLIS: u64 = 10;

/// The units a duration accepts, with their length in milliseconds.
const UNITS: &[(&str, u64)] = &[("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];

/// Why a duration literal was rejected. `Display` is the compile error's text.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DurationError {
    Empty,
    NoNumber,
    NoUnit { number: String },
    Fraction,
    UnknownUnit { unit: String },
    TooLong,
}

impl std::fmt::Display for DurationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DurationError::Empty => {
                f.write_str("empty duration; write a whole number and a unit, e.g. \"30s\"")
            }
            DurationError::NoNumber => f.write_str(
                "a duration starts with a whole number and ends with a unit, e.g. \"30s\"",
            ),
            DurationError::NoUnit { number } => write!(
                f,
                "`{number}` has no unit; append one of {}, e.g. \"{number}s\"",
                unit_list()
            ),
            DurationError::Fraction => f.write_str(
                "fractions are not supported; use a smaller unit, e.g. \"1500ms\" instead of \"1.5s\"",
            ),
            DurationError::UnknownUnit { unit } => {
                write!(f, "unknown unit `{unit}`; use one of {}", unit_list())
            }
            DurationError::TooLong => {
                f.write_str("duration too long; the maximum is 365 days, i.e. \"8760h\"")
            }
        }
    }
}

fn unit_list() -> String {
    let names: Vec<String> = UNITS.iter().map(|(name, _)| format!("`{name}`")).collect();
    names.join(", ")
}

/// Parses `"<whole number><unit>"` into milliseconds. Zero is accepted here: whether zero
/// makes sense depends on the option (`wait = "0s"` means "try once").
pub(crate) fn parse_millis(text: &str) -> Result<u64, DurationError> {
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    if number.is_empty() {
        return Err(DurationError::NoNumber);
    }
    if unit.is_empty() {
        return Err(DurationError::NoUnit {
            number: number.to_owned(),
        });
    }
    if unit.starts_with(['.', ',']) {
        return Err(DurationError::Fraction);
    }
    let Some(&(_, unit_millis)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(DurationError::UnknownUnit {
            unit: unit.to_owned(),
        });
    };
    // Digits beyond u64 are simply "too long": nothing that large passes the bound anyway.
    let count: u64 = number.parse().map_err(|_| DurationError::TooLong)?;
    match count.checked_mul(unit_millis) {
        Some(millis) if millis <= MAX_MILLIS => Ok(millis),
        _ => Err(DurationError::TooLong),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_converts_to_milliseconds() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("10m"), Ok(600_000));
        assert_eq!(parse_millis("12h"), Ok(43_200_000));
        assert_eq!(parse_millis("0s"), Ok(0));
        assert_eq!(parse_millis("007s"), Ok(7_000));
    }

    #[test]
    fn the_bound_is_inclusive() {
        assert_eq!(parse_millis(&format!("{MAX_MILLIS}ms")), Ok(MAX_MILLIS));
        assert_eq!(parse_millis("8760h"), Ok(MAX_MILLIS));
        assert_eq!(parse_millis("8761h"), Err(DurationError::TooLong));
        assert_eq!(
            parse_millis(&format!("{}ms", MAX_MILLIS + 1)),
            Err(DurationError::TooLong)
        );
    }

    #[test]
    fn overflow_of_u64_is_too_long_not_a_panic() {
        assert_eq!(
            parse_millis("18446744073709551616ms"),
            Err(DurationError::TooLong)
        );
        assert_eq!(
            parse_millis("18446744073709551615h"),
            Err(DurationError::TooLong)
        );
    }

    #[test]
    fn malformed_durations_say_what_is_wrong() {
        assert_eq!(parse_millis(""), Err(DurationError::Empty));
        assert_eq!(parse_millis("s"), Err(DurationError::NoNumber));
        assert_eq!(parse_millis("-5s"), Err(DurationError::NoNumber));
        assert_eq!(parse_millis(" 5s"), Err(DurationError::NoNumber));
        assert_eq!(
            parse_millis("60"),
            Err(DurationError::NoUnit {
                number: "60".into()
            })
        );
        assert_eq!(parse_millis("1.5s"), Err(DurationError::Fraction));
        assert_eq!(
            parse_millis("5sec"),
            Err(DurationError::UnknownUnit { unit: "sec".into() })
        );
        assert_eq!(
            parse_millis("5 s"),
            Err(DurationError::UnknownUnit { unit: " s".into() })
        );
        assert_eq!(
            parse_millis("5d"),
            Err(DurationError::UnknownUnit { unit: "d".into() })
        );
    }

    #[test]
    fn messages_name_the_valid_units() {
        let message = DurationError::UnknownUnit { unit: "d".into() }.to_string();
        assert_eq!(message, "unknown unit `d`; use one of `ms`, `s`, `m`, `h`");
    }
}
