#[no_mangle]
pub extern "C" fn transform_record(
    payload_ptr: *mut u8,
    payload_len: usize,
    key_ptr: *mut u8,
    key_len: usize,
) -> i64 {
    // Safety: We assume the pointers are valid and point to allocated memory
    // with the given lengths. In a real-world scenario, you'd have more robust
    // error handling and memory management.
    let payload_slice = unsafe { std::slice::from_raw_parts_mut(payload_ptr, payload_len) };
    let key_slice = unsafe { std::slice::from_raw_parts_mut(key_ptr, key_len) };

    // Convert payload to a mutable string
    let payload_str = match std::str::from_utf8_mut(payload_slice) {
        Ok(s) => s,
        Err(_) => return -1, // Indicate error
    };

    // Parse JSON
    let mut record: serde_json::Value = match serde_json::from_str(payload_str) {
        Ok(v) => v,
        Err(_) => return -1, // Indicate error
    };

    // Add timestamp if it doesn't exist
    if record.get("timestamp").is_none() {
        record["timestamp"] = serde_json::Value::String(
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        );
    }

    // Filter out records without a user_id
    if record.get("user_id").is_none() {
        return -2; // Special code to indicate record should be dropped
    }

    // Serialize back to JSON
    let new_payload = match serde_json::to_string(&record) {
        Ok(s) => s,
        Err(_) => return -1, // Indicate error
    };

    // Copy the new payload back into the provided buffer
    let new_payload_bytes = new_payload.as_bytes();
    if new_payload_bytes.len() > payload_len {
        return -1; // Buffer too small
    }
    payload_slice[..new_payload_bytes.len()].copy_from_slice(new_payload_bytes);

    // Return the new length of the payload
    new_payload_bytes.len() as i64
}
