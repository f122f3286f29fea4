//! Python's text renderings of JSON values, byte for byte: `json.dumps` (used for state and
//! criteria text the model reads, and for response bodies), `repr` (used in error messages), `round`.
//!
//! Upstream renders through Python, so the model sees Python's spellings (`1e-05`, `100.0`,
//! `{"a": 1}`) and clients see Python's messages (`question 'q': ...`). Numbers arrive here with
//! their original JSON text (serde_json's `arbitrary_precision`), so big integers stay exact.

use serde_json::{Number, Value};
use unicode_general_category::{GeneralCategory, get_general_category};

/// Separators between items and between a key and its value, as in `json.dumps(separators=...)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Separators {
    /// `", "` and `": "`: Python's default, used for every text the model reads.
    Spaced,
    /// `","` and `":"`: what Starlette's `JSONResponse` writes for response bodies.
    Compact,
}

/// Whether a JSON number's text is an integer literal (Python `int`) rather than a float.
fn is_int_text(text: &str) -> bool {
    !text.contains(['.', 'e', 'E'])
}

/// Python's `str(int)` for a JSON integer literal: the digits, with `-0` read as `0`.
fn int_text(text: &str) -> &str {
    if text == "-0" { "0" } else { text }
}

/// Python's `repr(float)`: shortest round-trip digits, fixed notation for decimal exponents in
/// [-4, 16), scientific (`1e-05`, `1e+16`) otherwise; `nan`, `inf`, `-inf` for the rest.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    // Rust's `{:e}` prints the shortest digits that round-trip, like Python's repr.
    let sci = format!("{x:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::with_capacity(digits.len() + 8);
    out.push_str(sign);
    if (-4..16).contains(&exponent) {
        if exponent >= 0 {
            let int_len = exponent as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exponent - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exponent < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exponent.unsigned_abs()));
    }
    out
}

/// The double a JSON number denotes, as Python would compute it (`1e400` is infinity).
pub fn number_as_f64(number: &Number) -> f64 {
    number.to_string().parse::<f64>().unwrap_or(f64::NAN)
}

/// Whether a JSON number is an integer literal (Python `int`) rather than a float.
pub fn number_is_int(number: &Number) -> bool {
    is_int_text(&number.to_string())
}

fn push_number(out: &mut String, number: &Number, json: bool) {
    let text = number.to_string();
    if is_int_text(&text) {
        out.push_str(int_text(&text));
        return;
    }
    let x = text.parse::<f64>().unwrap_or(f64::NAN);
    match x {
        x if json && x.is_nan() => out.push_str("NaN"),
        x if json && x.is_infinite() => out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" }),
        x => out.push_str(&py_float_repr(x)),
    }
}

/// `json.dumps(value, ensure_ascii=False)` with the given separators: keys in insertion order,
/// non-ASCII written raw, floats in Python's repr.
pub fn py_json(value: &Value, separators: Separators) -> String {
    let mut out = String::new();
    write_json(&mut out, value, separators);
    out
}

fn write_json(out: &mut String, value: &Value, separators: Separators) {
    let (item, key) = match separators {
        Separators::Spaced => (", ", ": "),
        Separators::Compact => (",", ":"),
    };
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => push_number(out, n, true),
        Value::String(s) => write_json_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                write_json(out, v, separators);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                write_json_string(out, k);
                out.push_str(key);
                write_json(out, v, separators);
            }
            out.push('}');
        }
    }
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `str.isprintable` for one character.
fn is_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if py_char::is_newer(c) {
        return false;
    }
    !matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::Surrogate
            | GeneralCategory::PrivateUse
            | GeneralCategory::Unassigned
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
            | GeneralCategory::SpaceSeparator
    )
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`, escapes for the
/// quote, backslash, `\t \n \r` and every non-printable character.
pub fn py_repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(quote);
    out
}

/// Python's `repr` of a parsed JSON value: `None`, `True`, `{'k': [1, 2.0]}`.
pub fn py_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value);
    out
}

fn write_repr(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Value::Number(n) => push_number(out, n, false),
        Value::String(s) => out.push_str(&py_repr_str(s)),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, v);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&py_repr_str(k));
                out.push_str(": ");
                write_repr(out, v);
            }
            out.push('}');
        }
    }
}

/// Python's `type(value).__name__` for a parsed JSON value.
pub fn py_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if number_is_int(n) => "int",
        Value::Number(_) => "float",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Python's `round(x, 4)`: correctly rounded, ties to even on the exact binary value.
pub fn round4(x: f64) -> f64 {
    if !x.is_finite() {
        return x;
    }
    // Rust's fixed-precision formatting is exact and breaks ties to even, like CPython's.
    format!("{x:.4}").parse::<f64>().unwrap_or(x)
}

/// C's `printf("%.0f", x)`, as Python's `%` operator formats it (ties to even).
pub fn printf_0f(x: f64) -> String {
    format!("{x:.0}")
}

/// Python's `str.strip()`.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(py_char::is_space)
}

/// Python's `str.lower()`.
pub fn py_lower(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    py_char::push_lower(s, &mut out);
    out
}

/// Python's `s[:n]`: the first `n` code points.
pub fn py_prefix(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(at, _)| &s[..at])
}

/// Python's `len(str)`: the number of code points.
pub fn py_len(s: &str) -> usize {
    s.chars().count()
}

/// A JSON number holding a double, spelt the way Python's `json` would write it.
pub fn float_value(x: f64) -> Value {
    // `from_f64` refuses NaN and infinities; upstream never produces them in answers.
    Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// CPython 3.11's character predicates (Unicode 14.0), checked against it for every code point.
pub(crate) mod py_char {
    use unicode_general_category::{GeneralCategory as Gc, get_general_category};
    use unicode_normalization::char::canonical_combining_class;

    /// Code points assigned after Unicode 14.0 whose properties would differ from CPython 3.11's
    /// (which sees them as unassigned) under the Unicode versions of this crate's tables
    /// (`unicode-general-category` 16.0, `unicode-normalization` 18.0, std 17.0). Gaps unassigned
    /// in every version are merged in. Generated by comparing against CPython 3.11 code point by
    /// code point; the test `unicode_tables_are_the_versions_checked` guards the versions.
    const NEWER_THAN_UNICODE_14: [(u32, u32); 33] = [
        (0x05C8, 0x05C9),
        (0x0897, 0x0897),
        (0x1ACF, 0x1AF0),
        (0x1C89, 0x1C8A),
        (0xA7CB, 0xA7CE),
        (0xA7D2, 0xA7D2),
        (0xA7D4, 0xA7D4),
        (0xA7DA, 0xA7DC),
        (0x105C0, 0x105F3),
        (0x10D40, 0x10D85),
        (0x10EC2, 0x10EFF),
        (0x1123F, 0x11240),
        (0x11380, 0x113D3),
        (0x116D0, 0x116E3),
        (0x11BC0, 0x11BF9),
        (0x11F02, 0x11F59),
        (0x1342F, 0x1342F),
        (0x13441, 0x143FA),
        (0x16100, 0x16139),
        (0x16D40, 0x16D79),
        (0x16EA0, 0x16EB8),
        (0x18CFF, 0x18CFF),
        (0x1B132, 0x1B132),
        (0x1B155, 0x1B155),
        (0x1CCF0, 0x1CCF9),
        (0x1D127, 0x1D128),
        (0x1D250, 0x1D2D3),
        (0x1DF25, 0x1DF2A),
        (0x1E030, 0x1E08F),
        (0x1E4D0, 0x1E6F5),
        (0x2B739, 0x2B739),
        (0x2EBF0, 0x2EE5D),
        (0x31350, 0x323AF),
    ];

    /// Whether CPython 3.11 (Unicode 14.0) treats `ch` as unassigned though newer tables do not.
    pub(crate) fn is_newer(ch: char) -> bool {
        let cp = u32::from(ch);
        NEWER_THAN_UNICODE_14
            .binary_search_by(|&(lo, hi)| {
                if hi < cp {
                    std::cmp::Ordering::Less
                } else if lo > cp {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
    }

    /// `str.isalpha` of one character: general category Lu, Ll, Lt, Lm or Lo.
    pub(crate) fn is_alpha(ch: char) -> bool {
        !is_newer(ch)
            && matches!(
                get_general_category(ch),
                Gc::UppercaseLetter | Gc::LowercaseLetter | Gc::TitlecaseLetter | Gc::ModifierLetter | Gc::OtherLetter
            )
    }

    /// `re`'s `\w` on a `str`: alphanumeric (letters and every numeric, Nd, Nl, No) or `_`.
    pub(crate) fn is_word(ch: char) -> bool {
        ch == '_'
            || (!is_newer(ch)
                && matches!(
                    get_general_category(ch),
                    Gc::UppercaseLetter
                        | Gc::LowercaseLetter
                        | Gc::TitlecaseLetter
                        | Gc::ModifierLetter
                        | Gc::OtherLetter
                        | Gc::DecimalNumber
                        | Gc::LetterNumber
                        | Gc::OtherNumber
                ))
    }

    /// `re`'s `\d` on a `str` (`str.isdecimal`): general category Nd.
    pub(crate) fn is_decimal(ch: char) -> bool {
        !is_newer(ch) && get_general_category(ch) == Gc::DecimalNumber
    }

    /// `str.isupper` of one character: the Unicode `Uppercase` property.
    pub(crate) fn is_upper(ch: char) -> bool {
        !is_newer(ch) && ch.is_uppercase()
    }

    /// Code points std's (Unicode 17.0) `Lowercase` property holds and CPython 3.11's does not:
    /// modifier letters made `Other_Lowercase` since 14.0, and letters assigned in 17.0. Found by
    /// comparing `str.islower` with [`is_lower`] for every code point.
    const LOWERCASE_SINCE_14: [(u32, u32); 5] = [
        (0x10FC, 0x10FC),
        (0xA7CF, 0xA7CF),
        (0xA7F1, 0xA7F4),
        (0xAB69, 0xAB69),
        (0x16EBB, 0x16ED3),
    ];

    /// `str.islower` of one character: the Unicode `Lowercase` property, as of Unicode 14.0.
    pub(crate) fn is_lower(ch: char) -> bool {
        // U+0295 LATIN LETTER PHARYNGEAL VOICED FRICATIVE was Ll until Unicode 16.0 made it Lo.
        if ch == '\u{295}' {
            return true;
        }
        let cp = u32::from(ch);
        !is_newer(ch) && ch.is_lowercase() && !LOWERCASE_SINCE_14.iter().any(|&(lo, hi)| (lo..=hi).contains(&cp))
    }

    /// `str.istitle`'s test of one character: general category Lt.
    pub(crate) fn is_title(ch: char) -> bool {
        !is_newer(ch) && get_general_category(ch) == Gc::TitlecaseLetter
    }

    /// Whether `unicodedata.category(ch)` is `Cn` (unassigned) on CPython 3.11.
    pub(crate) fn is_unassigned(ch: char) -> bool {
        is_newer(ch) || get_general_category(ch) == Gc::Unassigned
    }

    /// `str.isupper` of a whole string: no lower-case or title-case character, and at least one
    /// upper-case one (caseless characters are ignored).
    pub(crate) fn str_is_upper(text: &str) -> bool {
        let mut cased = false;
        for ch in text.chars() {
            if is_lower(ch) || is_title(ch) {
                return false;
            }
            cased |= is_upper(ch);
        }
        cased
    }

    /// `unicodedata.combining(ch) != 0`: a nonzero canonical combining class.
    pub(crate) fn is_combining(ch: char) -> bool {
        !is_newer(ch) && canonical_combining_class(ch) != 0
    }

    /// `str.isspace` of one character: Unicode `White_Space`, plus U+001C..U+001F, which
    /// CPython counts as separators.
    pub(crate) fn is_space(ch: char) -> bool {
        ch.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&ch)
    }

    /// Appends `str.lower(text)`: full lower-casing (`İ` → `i̇`, two code points).
    ///
    /// A final capital sigma becomes `σ`, where Python writes `ς`; nothing that reads the
    /// lowered text here can tell them apart (both are Greek letters of one code point).
    pub(crate) fn push_lower(text: &str, out: &mut String) {
        for ch in text.chars() {
            if is_newer(ch) {
                out.push(ch);
            } else {
                out.extend(ch.to_lowercase());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (100.0, "100.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e16, "1e+16"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (12.5, "12.5"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1.5e300, "1.5e+300"),
            (123456789012345.6, "123456789012345.6"),
            (1234567890123456.7, "1234567890123456.8"),
            (0.46153846153846156, "0.46153846153846156"),
            (f64::INFINITY, "inf"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float_repr(x), want, "repr({x})");
        }
    }

    #[test]
    fn json_matches_python_dumps() {
        let v: Value = serde_json::from_str(
            r#"{"amount": 12.5, "ids": [1, 2], "tiny": 1e-5, "big": 1e16, "ok": true, "none": null, "b": 12345678901234567890, "neg": -0, "inf": 1e400, "s": "é\u0001\n\"\\"}"#,
        )
        .expect("valid json");
        assert_eq!(
            py_json(&v, Separators::Spaced),
            r#"{"amount": 12.5, "ids": [1, 2], "tiny": 1e-05, "big": 1e+16, "ok": true, "none": null, "b": 12345678901234567890, "neg": 0, "inf": Infinity, "s": "é\u0001\n\"\\"}"#
        );
        assert_eq!(py_json(&json!([1, {"a": []}]), Separators::Compact), r#"[1,{"a":[]}]"#);
    }

    #[test]
    fn repr_matches_python() {
        assert_eq!(py_repr_str("q1"), "'q1'");
        assert_eq!(py_repr_str("it's"), "\"it's\"");
        assert_eq!(py_repr_str("it's \"x\""), "'it\\'s \"x\"'");
        assert_eq!(py_repr_str("a\tb\u{1}\u{200b}\u{a0}é😀"), "'a\\tb\\x01\\u200b\\xa0é😀'");
        let v: Value = serde_json::from_str(r#"{"a": [1, 2.0, null, true, "x"]}"#).expect("json");
        assert_eq!(py_repr(&v), "{'a': [1, 2.0, None, True, 'x']}");
    }

    #[test]
    fn lower_and_title_case_as_cpython_3_11() {
        use py_char::*;
        assert!(is_lower('a') && is_lower('ß') && is_lower('ª') && is_lower('\u{295}'));
        for ch in [
            '\u{10fc}',
            '\u{a7cf}',
            '\u{a7f1}',
            '\u{a7f4}',
            '\u{ab69}',
            '\u{16ebb}',
            'A',
            '1',
        ] {
            assert!(!is_lower(ch), "{ch:?}");
        }
        assert!(is_title('ǅ') && !is_title('Ǆ') && !is_title('ǆ'));
        assert!(str_is_upper("MON") && str_is_upper("É1 X") && !str_is_upper("ǅA") && !str_is_upper("12"));
        assert!(!str_is_upper("MoN") && str_is_upper("ПРИВЕТ"));
        assert!(is_unassigned('\u{1c89}') && is_unassigned('\u{378}') && !is_unassigned('a'));
    }

    #[test]
    fn round4_breaks_ties_to_even_on_the_binary_value() {
        assert_eq!(round4(0.03125), 0.0312);
        assert_eq!(round4(0.09375), 0.0938);
        assert_eq!(round4(0.12345), 0.1235); // 0.12345 is above the tie in binary
        assert_eq!(round4(0.95185), 0.9518); // and this one below
        assert_eq!(printf_0f(2.5), "2");
        assert_eq!(printf_0f(3.5), "4");
    }
}
