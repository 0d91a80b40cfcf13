//! Example (seeds 001/002): upper-case every record value, written with the Zig SDK.
//!
//! ASCII letters a-z become A-Z; other bytes (UTF-8 included) pass unchanged. Null values
//! (tombstones) are kept as they are. Counts upper-cased records as "upper_cased".
const sluice = @import("sluice");

comptime {
    sluice.exportAbi(@This());
}

pub fn onRecord(rec: *const sluice.Record) !sluice.Decision {
    const value = rec.value orelse return .keep;
    const out = try sluice.allocator().alloc(u8, value.len);
    var changed = false;
    for (value, out) |c, *o| {
        o.* = if (c >= 'a' and c <= 'z') c - 32 else c;
        changed = changed or o.* != c;
    }
    if (!changed) return .keep;
    sluice.count("upper_cased", 1);
    return rec.withValue(out);
}
