//! Example (seeds 001/002): upper-case every record value, written with the Rust SDK.
//!
//! ASCII letters a-z become A-Z; other bytes (UTF-8 included) pass unchanged. Null values
//! (tombstones) are kept as they are. Counts upper-cased records as "upper_cased". The same
//! filter as filters/examples/upper (Zig) and upper-as (AssemblyScript).
use sluice::{Decision, Filter, Json, Record};

struct Upper;

impl Filter for Upper {
    fn configure(_config: &Json) -> Result<Self, String> {
        Ok(Upper)
    }

    fn on_record<'a>(&mut self, rec: &Record<'a>) -> Result<Decision<'a>, String> {
        let value = match rec.value {
            Some(v) if v.iter().any(u8::is_ascii_lowercase) => v,
            _ => return Ok(Decision::Keep),
        };
        sluice::count("upper_cased", 1);
        Ok(rec.with_value(value.to_ascii_uppercase()))
    }
}

sluice::export_filter!(Upper);
