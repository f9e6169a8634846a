//! Text formats the Go side prints, reproduced so our output is byte-compatible:
//! `time.Time` as JSON (RFC 3339 with trimmed nanoseconds), the HTTP `Date` header,
//! `strconv.FormatFloat(f, 'g', -1, 64)` (what the Prometheus text encoder uses) and
//! `%q` for plain strings.

use std::time::{SystemTime, UNIX_EPOCH};

/// What Go's `time.Time{}` (the zero time) marshals to.
pub const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Seconds (may be negative) and nanoseconds since the Unix epoch.
fn split(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                (-s, 0)
            } else {
                (-s - 1, 1_000_000_000 - n)
            }
        }
    }
}

/// `t` in UTC as Go's `time.Time.MarshalJSON` prints it (`time.RFC3339Nano`, without
/// the quotes): `2024-05-01T10:00:00Z`, `2024-05-01T10:00:00.5Z` — trailing zeros of
/// the fraction are dropped, and the fraction is omitted when it is zero.
pub fn rfc3339_nano(t: SystemTime) -> String {
    let (secs, nanos) = split(t);
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let mut s = format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    );
    if nanos != 0 {
        let frac = format!("{nanos:09}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push('Z');
    s
}

/// `t` as an HTTP `Date` header value (IMF-fixdate, what Go's `http.TimeFormat`
/// prints): `Mon, 02 Jan 2006 15:04:05 GMT`.
pub fn http_date(t: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (secs, _) = split(t);
    let days = secs.div_euclid(86_400);
    let (y, mo, d) = civil_from_days(days);
    let sod = secs.rem_euclid(86_400);
    format!(
        "{}, {d:02} {} {y:04} {:02}:{:02}:{:02} GMT",
        DAYS[days.rem_euclid(7) as usize],
        MONTHS[(mo - 1) as usize],
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

/// `v` as Go's `strconv.FormatFloat(v, 'g', -1, 64)`, with the Prometheus text
/// encoder's spellings of the specials (`+Inf`, `-Inf`, `NaN`): the shortest digits
/// that round-trip, in `%e` form (`1.5e+09`, `1e-05`) when the decimal exponent is
/// below -4 or at least 6, else plain (`0.001`, `16.384`, `300`).
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.7165e9".
    let e = format!("{v:e}");
    let (mant, exp) = e.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if !(-4..6).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.abs()));
    } else if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            for _ in digits.len()..int_len {
                out.push('0');
            }
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
    out
}

/// `s` as Go's `%q` prints it, for the characters Kubernetes names can hold and the
/// usual escapes (`\"`, `\\`, `\n`, `\t`, `\r`, other control bytes as `\x..`/`\u....`).
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_like_go() {
        let t = UNIX_EPOCH + Duration::from_secs(1_714_557_600);
        assert_eq!(rfc3339_nano(t), "2024-05-01T10:00:00Z");
        assert_eq!(
            rfc3339_nano(t + Duration::from_millis(500)),
            "2024-05-01T10:00:00.5Z"
        );
        assert_eq!(
            rfc3339_nano(t + Duration::from_nanos(1)),
            "2024-05-01T10:00:00.000000001Z"
        );
        assert_eq!(rfc3339_nano(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_nano(UNIX_EPOCH - Duration::from_millis(250)),
            "1969-12-31T23:59:59.75Z"
        );
        // leap day
        assert_eq!(
            rfc3339_nano(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
    }

    #[test]
    fn http_date_like_go() {
        // Go: time.Date(2006, 1, 2, 15, 4, 5, 0, time.UTC).Format(http.TimeFormat)
        let t = UNIX_EPOCH + Duration::from_secs(1_136_214_245);
        assert_eq!(http_date(t), "Mon, 02 Jan 2006 15:04:05 GMT");
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
    }

    #[test]
    fn floats_like_strconv_g() {
        for (v, s) in [
            (0.0, "0"),
            (1.0, "1"),
            (0.001, "0.001"),
            (16.384, "16.384"),
            (0.25, "0.25"),
            (300.0, "300"),
            (123456.0, "123456"),
            (1e6, "1e+06"),
            (1_714_557_600.5, "1.7145576005e+09"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (-2.5, "-2.5"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(go_float(v), s, "{v}");
        }
    }

    #[test]
    fn quote_like_go() {
        assert_eq!(go_quote("kube-system"), "\"kube-system\"");
        assert_eq!(go_quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
    }
}
