//! SDK probe for tests/filters/sdk/test_sdk_abi.py and tests/filters/test_native_path.py:
//! exercises every hook of sluice.zig; each record value is a command ("keep", "drop",
//! "count", "ctx" as in probe_c; anything unknown is rewritten to prefix + value + "@" + topic).
const std = @import("std");
const sluice = @import("sluice");
comptime { sluice.exportAbi(@This()); }
var prefix: []const u8 = "";
pub fn onConfig(cfg: []const u8) !void {
    const C = struct { prefix: []const u8 = "", refuse: bool = false };
    const c = try std.json.parseFromSliceLeaky(C, sluice.allocator(), cfg, .{});
    if (c.refuse) return error.RefusedOnPurpose;
    prefix = c.prefix;
}
pub fn onRecord(rec: *const sluice.Record) !sluice.Decision {
    const v = rec.value orelse return .drop;
    if (std.mem.eql(u8, v, "fail")) return error.AskedToFail;
    if (std.mem.eql(u8, v, "reject")) return .{ .reject = "no" };
    if (std.mem.eql(u8, v, "key")) return rec.withKey(null);
    if (std.mem.eql(u8, v, "keep")) return .keep;
    if (std.mem.eql(u8, v, "drop")) return .drop;
    if (std.mem.eql(u8, v, "count")) {
        sluice.count("a", 2);
        sluice.count("b", 1);
        return .keep;
    }
    if (std.mem.eql(u8, v, "ctx")) {
        const text = try std.fmt.allocPrint(sluice.allocator(), "{s}|{d}|{s}|{s}|{d}|{d}|{d}|{s}", .{
            rec.topic, rec.partition, rec.client_id, rec.principal, @intFromEnum(rec.direction),
            rec.offset, rec.timestamp_ms, prefix,
        });
        return rec.withValue(text);
    }
    sluice.count("seen", 1);
    const out = try std.mem.concat(sluice.allocator(), u8, &.{ prefix, v, "@", rec.topic });
    return .{ .rewrite = .{ .key = rec.key, .value = out, .headers = &.{.{ .key = "h", .value = null }} } };
}
pub fn onAdmin(req: []const u8) ![]const u8 {
    const R = struct { name: []const u8 };
    const r = try std.json.parseFromSliceLeaky(R, sluice.allocator(), req, .{ .ignore_unknown_fields = true });
    if (std.mem.startsWith(u8, r.name, "tmp")) return "{\"decision\":\"deny\",\"message\":\"no tmp topics\"}";
    return "{\"decision\":\"allow\",\"message\":\"\"}";
}
