//! {{NAME}}: a Sluice Wasm filter (Sluice ABI v1, Zig SDK).
//!
//! onRecord runs once per record and returns what becomes of it: `.keep`, `.drop`,
//! `.{ .reject = "why" }` (the producer gets INVALID_RECORD) or a rewrite
//! (`rec.withValue(bytes)`, `rec.withKey(bytes)`, or `.{ .rewrite = .{ ... } }`).
//! Memory from `sluice.allocator()` lives until the end of the batch; no free needed.
//!
//! This starter rejects records without a value, drops records whose "x-drop" header is
//! "yes", tags the rest by appending the configured suffix to the value, and counts what it did.
const std = @import("std");
const sluice = @import("sluice");

comptime {
    sluice.exportAbi(@This());
}

var suffix: []const u8 = " [checked]";

/// Called once with the filter's `config` as JSON ("" when there is none).
pub fn onConfig(config_json: []const u8) !void {
    if (config_json.len == 0) return;
    const Config = struct { suffix: ?[]const u8 = null };
    const cfg = try std.json.parseFromSliceLeaky(Config, sluice.allocator(), config_json, .{
        .ignore_unknown_fields = true,
    });
    if (cfg.suffix) |s| suffix = s;
}

pub fn onRecord(rec: *const sluice.Record) !sluice.Decision {
    const value = rec.value orelse "";
    if (value.len == 0) {
        sluice.count("rejected_empty", 1);
        return .{ .reject = "{{NAME}}: a record needs a value" };
    }
    if (rec.header("x-drop")) |v| {
        if (std.mem.eql(u8, v, "yes")) {
            sluice.count("dropped", 1);
            return .drop;
        }
    }
    const out = try std.mem.concat(sluice.allocator(), u8, &.{ value, suffix });
    sluice.count("tagged", 1);
    return rec.withValue(out);
}
