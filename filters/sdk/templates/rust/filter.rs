//! {{NAME}}: a Sluice Wasm filter (Sluice ABI v1, Rust SDK).
//!
//! `on_record` runs once per record and returns what becomes of it:
//!   Ok(Decision::Keep)                  pass it on unchanged
//!   Ok(rec.with_value(bytes))           pass it on with a new value (rec.with_key: new key)
//!   Ok(Decision::Rewrite { .. })        ... or a new key, value and headers
//!   Ok(Decision::Drop)                  silently remove it
//!   Ok(Decision::reject("why"))         refuse it (the producer gets INVALID_RECORD)
//!   Err("why".into())                   fail the whole batch (the on_error policy applies)
//! Memory (Vec, String) lives until the end of the batch; what `configure` builds is kept.
//!
//! This starter rejects records without a value, drops records whose "x-drop" header is "yes",
//! tags the rest by appending the configured suffix to the value, and counts what it did.
use sluice::{Decision, Filter, Json, Record};

struct Starter {
    suffix: Vec<u8>, // from the config: {"suffix": "..."}
}

impl Filter for Starter {
    fn configure(config: &Json) -> Result<Self, String> {
        let suffix = config.get("suffix").and_then(Json::as_str).unwrap_or(" [checked]");
        Ok(Starter { suffix: suffix.as_bytes().to_vec() }) // Err("...") refuses the config
    }

    fn on_record<'a>(&mut self, rec: &Record<'a>) -> Result<Decision<'a>, String> {
        let value = rec.value.unwrap_or_default();
        if value.is_empty() {
            sluice::count("rejected_empty", 1);
            return Ok(Decision::reject("{{NAME}}: a record needs a value"));
        }
        if rec.header("x-drop") == Some(b"yes") {
            sluice::count("dropped", 1);
            return Ok(Decision::Drop);
        }
        let mut out = Vec::with_capacity(value.len() + self.suffix.len());
        out.extend_from_slice(value);
        out.extend_from_slice(&self.suffix);
        sluice::count("tagged", 1);
        Ok(rec.with_value(out))
    }
}

sluice::export_filter!(Starter);
