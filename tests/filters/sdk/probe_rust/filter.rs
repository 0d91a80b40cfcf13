//! SDK probe for tests/filters/sdk/test_sdk_abi.py and tests/filters/test_native_path.py: the
//! Zig probe (probe_zig) in Rust, command for command: each record value is a command ("keep",
//! "drop", "count", "ctx", "fail", "reject", "key"); anything else is rewritten to
//! prefix + value + "@" + topic with the headers replaced by one null header "h".
use std::borrow::Cow;

use sluice::{Decision, Filter, Header, Json, Record};

struct Probe {
    prefix: String,
}

impl Filter for Probe {
    fn configure(config: &Json) -> Result<Self, String> {
        if config.get("refuse").and_then(Json::as_bool) == Some(true) {
            return Err("RefusedOnPurpose".into());
        }
        let prefix = config.get("prefix").and_then(Json::as_str).unwrap_or("");
        Ok(Probe { prefix: prefix.into() })
    }

    fn on_record<'a>(&mut self, rec: &Record<'a>) -> Result<Decision<'a>, String> {
        let v = match rec.value {
            Some(v) => v,
            None => return Ok(Decision::Drop),
        };
        match v {
            b"fail" => return Err("AskedToFail".into()),
            b"reject" => return Ok(Decision::reject("no")),
            b"key" => return Ok(rec.with_key(None)),
            b"keep" => return Ok(Decision::Keep),
            b"drop" => return Ok(Decision::Drop),
            b"count" => {
                sluice::count("a", 2);
                sluice::count("b", 1);
                return Ok(Decision::Keep);
            }
            b"ctx" => {
                let text = format!(
                    "{}|{}|{}|{}|{}|{}|{}|{}",
                    String::from_utf8_lossy(rec.topic), rec.partition,
                    String::from_utf8_lossy(rec.client_id), String::from_utf8_lossy(rec.principal),
                    rec.direction as u8, rec.offset, rec.timestamp_ms, self.prefix);
                return Ok(rec.with_value(text.into_bytes()));
            }
            _ => {}
        }
        sluice::count("seen", 1);
        let mut out = self.prefix.as_bytes().to_vec();
        out.extend_from_slice(v);
        out.push(b'@');
        out.extend_from_slice(rec.topic);
        Ok(Decision::Rewrite {
            key: rec.key.map(Cow::Borrowed),
            value: Some(out.into()),
            headers: Cow::Owned(vec![Header { key: b"h", value: None }]),
        })
    }

    fn on_admin(&mut self, request: &[u8]) -> Result<Vec<u8>, String> {
        let req = Json::parse(request).map_err(|e| e.message.to_string())?;
        let name = req.get("name").and_then(Json::as_str).ok_or("MissingField")?;
        Ok(if name.starts_with("tmp") {
            b"{\"decision\":\"deny\",\"message\":\"no tmp topics\"}".to_vec()
        } else {
            b"{\"decision\":\"allow\",\"message\":\"\"}".to_vec()
        })
    }
}

sluice::export_filter!(Probe, admin);
