//! Example (seed 000, Sluice ABI): enrich JSON events with a timestamp and drop events without
//! a user_id, written with the Rust SDK (the same filter as filters/examples/enrich in C).
//!
//! - value not a JSON object          -> reject ("value is not a JSON object: <parser error>")
//! - no top-level "user_id"           -> drop
//! - no top-level "timestamp"         -> add "timestamp": the record's own timestamp as
//!                                       RFC 3339 UTC with milliseconds (a Wasm filter has no
//!                                       clock; the record timestamp is what the producer set)
//! - otherwise                        -> keep, byte for byte
//! The original text is kept as it is; the new member is appended before the closing brace.
use sluice::{Decision, Filter, Json, Record};

/// Days since 1970-01-01 to a civil date (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", y, m, d, sod / 3600, sod / 60 % 60,
            sod % 60, ms.rem_euclid(1000))
}

struct Enrich;

impl Filter for Enrich {
    fn configure(_config: &Json) -> Result<Self, String> {
        Ok(Enrich)
    }

    fn on_record<'a>(&mut self, rec: &Record<'a>) -> Result<Decision<'a>, String> {
        let value = match rec.value {
            Some(v) => v,
            None => return Ok(Decision::reject("value is not a JSON object: null value")),
        };
        let doc = match Json::parse(value) {
            Ok(doc @ Json::Object(_)) => doc,
            Ok(_) => return Ok(Decision::reject("value is not a JSON object")),
            Err(e) => return Ok(Decision::reject(format!("value is not a JSON object: {}", e.message))),
        };
        if doc.get("user_id").is_none() {
            sluice::count("dropped_no_user_id", 1);
            return Ok(Decision::Drop);
        }
        if doc.get("timestamp").is_some() {
            return Ok(Decision::Keep);
        }
        // The object has a member (user_id), so a comma goes before the new one.
        let close = value.iter().rposition(|&c| c == b'}').unwrap_or(0);
        let mut out = Vec::with_capacity(value.len() + 40);
        out.extend_from_slice(&value[..close]);
        out.extend_from_slice(b",\"timestamp\":\"");
        out.extend_from_slice(rfc3339(rec.timestamp_ms).as_bytes());
        out.push(b'"');
        out.extend_from_slice(&value[close..]);
        sluice::count("timestamp_added", 1);
        Ok(rec.with_value(out))
    }
}

sluice::export_filter!(Enrich);
