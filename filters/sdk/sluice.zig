//! sluice.zig: the Zig SDK for Sluice Wasm filters (Sluice Wasm ABI v1).
//!
//! A filter's root source file imports this module and declares ONE function:
//!
//!     const sluice = @import("sluice");
//!     comptime { sluice.exportAbi(@This()); }
//!     pub fn onRecord(rec: *const sluice.Record) sluice.Decision { ... }
//!
//! `onRecord` may also return `!sluice.Decision`; an error fails the whole batch (the host
//! applies the filter's on_error policy). Optional hooks in the same file:
//!
//!     pub fn onConfig(config_json: []const u8) !void   // once at start-up ("" = no config)
//!     pub fn onAdmin(request_json: []const u8) ![]const u8   // admin filters: JSON in, JSON out
//!
//! The module exports the ABI (sluice_abi_version, sluice_alloc, sluice_init, sluice_filter,
//! sluice_filter_records, sluice_last_error, and sluice_admin when onAdmin exists), parses the
//! batch, calls onRecord per record and encodes the decisions and the detector counters for
//! the host. sluice_filter_records is the host's fast path: the same onRecord over Kafka's own
//! record encoding, answered with the new records section (kept records copied verbatim).
//!
//! Memory: `sluice.allocator()` is an arena reset at every call; there is no need to free.
//! What onConfig allocates stays for the life of the instance. Build with
//! `sluice filter build DIR` (zig build-exe -target wasm32-freestanding -fno-entry -rdynamic
//! -O ReleaseSmall -fstrip).

const std = @import("std");

pub const abi_version: i32 = 1;

pub const Direction = enum(u8) { produce = 0, fetch = 1, _ };

pub const Header = struct {
    key: []const u8,
    value: ?[]const u8,
};

pub const Record = struct {
    direction: Direction,
    topic: []const u8,
    partition: i32,
    client_id: []const u8,
    principal: []const u8,
    /// Position in the batch.
    index: u32,
    /// Produce: offset delta within the batch; fetch: absolute offset.
    offset: i64,
    timestamp_ms: i64,
    key: ?[]const u8,
    value: ?[]const u8,
    headers: []const Header,

    /// Value of the first header called `name`, or null.
    pub fn header(self: *const Record, name: []const u8) ?[]const u8 {
        for (self.headers) |h| {
            if (std.mem.eql(u8, h.key, name)) return h.value;
        }
        return null;
    }

    /// Same key and headers, new value.
    pub fn withValue(self: *const Record, value: ?[]const u8) Decision {
        return .{ .rewrite = .{ .key = self.key, .value = value, .headers = self.headers } };
    }

    /// Same value and headers, new key.
    pub fn withKey(self: *const Record, key: ?[]const u8) Decision {
        return .{ .rewrite = .{ .key = key, .value = self.value, .headers = self.headers } };
    }
};

pub const Rewrite = struct {
    key: ?[]const u8,
    value: ?[]const u8,
    headers: []const Header,
};

pub const Decision = union(enum) {
    keep,
    drop,
    /// The record is refused; the producer sees this reason.
    reject: []const u8,
    rewrite: Rewrite,
};

// ------------------------------------------------------------------------------------------
// Arena: grows linear memory past its initial end; reset by every sluice_alloc.
// ------------------------------------------------------------------------------------------

var arena_base: usize = 0;
var arena_top: usize = 0;
var arena_limit: usize = 0;

fn arenaSetup() void {
    if (arena_base == 0) {
        arena_limit = @wasmMemorySize(0) * std.wasm.page_size;
        arena_base = arena_limit;
        arena_top = arena_limit;
    }
}

fn bump(len: usize, alignment: usize) ?[*]u8 {
    arenaSetup();
    const start = std.mem.alignForward(usize, arena_top, alignment);
    const end = std.math.add(usize, start, len) catch return null;
    if (end > arena_limit) {
        const pages = (end - arena_limit + std.wasm.page_size - 1) / std.wasm.page_size;
        if (@wasmMemoryGrow(0, pages) < 0) return null;
        arena_limit = @wasmMemorySize(0) * std.wasm.page_size;
    }
    arena_top = end;
    return @ptrFromInt(start);
}

fn vAlloc(_: *anyopaque, len: usize, alignment: std.mem.Alignment, _: usize) ?[*]u8 {
    return bump(len, alignment.toByteUnits());
}

fn vResize(_: *anyopaque, memory: []u8, _: std.mem.Alignment, new_len: usize, _: usize) bool {
    const start = @intFromPtr(memory.ptr);
    if (new_len <= memory.len) {
        if (start + memory.len == arena_top) arena_top = start + new_len;
        return true;
    }
    if (start + memory.len != arena_top) return false;
    const end = start + new_len;
    if (end > arena_limit) {
        const pages = (end - arena_limit + std.wasm.page_size - 1) / std.wasm.page_size;
        if (@wasmMemoryGrow(0, pages) < 0) return false;
        arena_limit = @wasmMemorySize(0) * std.wasm.page_size;
    }
    arena_top = end;
    return true;
}

fn vRemap(ctx: *anyopaque, memory: []u8, alignment: std.mem.Alignment, new_len: usize, ra: usize) ?[*]u8 {
    return if (vResize(ctx, memory, alignment, new_len, ra)) memory.ptr else null;
}

fn vFree(_: *anyopaque, memory: []u8, _: std.mem.Alignment, _: usize) void {
    if (@intFromPtr(memory.ptr) + memory.len == arena_top) arena_top = @intFromPtr(memory.ptr);
}

const vtable: std.mem.Allocator.VTable = .{ .alloc = vAlloc, .resize = vResize, .remap = vRemap, .free = vFree };

/// The per-call arena allocator (reset before every batch; onConfig's memory is kept).
pub fn allocator() std.mem.Allocator {
    return .{ .ptr = undefined, .vtable = &vtable };
}

// ------------------------------------------------------------------------------------------
// Counters, errors, configuration
// ------------------------------------------------------------------------------------------

const max_counters = 32;
var counter_names: [max_counters][]const u8 = undefined;
var counter_values: [max_counters]u32 = undefined;
var counter_n: usize = 0;

/// Add `n` to the detector counter `name` for this batch (reported to the host's telemetry).
/// `name` must outlive the batch (a string literal, or memory from onConfig).
pub fn count(name: []const u8, n: u32) void {
    for (counter_names[0..counter_n], 0..) |existing, i| {
        if (std.mem.eql(u8, existing, name)) {
            counter_values[i] += n;
            return;
        }
    }
    if (counter_n < max_counters) {
        counter_names[counter_n] = name;
        counter_values[counter_n] = n;
        counter_n += 1;
    }
}

var error_buf: [256]u8 = undefined;
var error_len: usize = 0;

/// Set the message the host reads through sluice_last_error.
pub fn setError(message: []const u8) void {
    const n = @min(message.len, error_buf.len);
    @memcpy(error_buf[0..n], message[0..n]);
    error_len = n;
}

var config_json: []const u8 = "";

/// The configuration JSON handed over by the host ("" if none).
pub fn config() []const u8 {
    return config_json;
}

// ------------------------------------------------------------------------------------------
// Batch decoding / encoding
// ------------------------------------------------------------------------------------------

const Reader = struct {
    buf: []const u8,
    pos: usize = 0,

    fn u32le(self: *Reader) !u32 {
        if (self.buf.len - self.pos < 4) return error.Truncated;
        const v = std.mem.readInt(u32, self.buf[self.pos..][0..4], .little);
        self.pos += 4;
        return v;
    }

    fn i64le(self: *Reader) !i64 {
        if (self.buf.len - self.pos < 8) return error.Truncated;
        const v = std.mem.readInt(i64, self.buf[self.pos..][0..8], .little);
        self.pos += 8;
        return v;
    }

    fn byte(self: *Reader) !u8 {
        if (self.pos >= self.buf.len) return error.Truncated;
        self.pos += 1;
        return self.buf[self.pos - 1];
    }

    fn bytes(self: *Reader, nullable: bool) !?[]const u8 {
        const n: i32 = @bitCast(try self.u32le());
        if (n < 0) {
            if (!nullable or n != -1) return error.Malformed;
            return null;
        }
        const len: usize = @intCast(n);
        if (self.buf.len - self.pos < len) return error.Truncated;
        self.pos += len;
        return self.buf[self.pos - len .. self.pos];
    }

    fn str(self: *Reader) ![]const u8 {
        return (try self.bytes(false)).?;
    }
};

const Writer = struct {
    list: std.ArrayList(u8) = .empty,

    fn put(self: *Writer, data: []const u8) !void {
        try self.list.appendSlice(allocator(), data);
    }

    fn u32le(self: *Writer, v: u32) !void {
        var tmp: [4]u8 = undefined;
        std.mem.writeInt(u32, &tmp, v, .little);
        try self.put(&tmp);
    }

    fn bytes(self: *Writer, b: ?[]const u8) !void {
        if (b) |data| {
            try self.u32le(@intCast(data.len));
            try self.put(data);
        } else {
            try self.u32le(0xFFFF_FFFF);
        }
    }
};

fn pack(ptr: [*]const u8, len: usize) i64 {
    return @bitCast((@as(u64, @intFromPtr(ptr)) << 32) | @as(u64, @intCast(len)));
}

fn resetArena() void {
    arenaSetup();
    arena_top = arena_base;
}

/// Keep the host's input alive: the arena restarts after it.
fn beginCall(in_ptr: i32, in_len: i32) []const u8 {
    arenaSetup();
    const start: usize = @as(u32, @bitCast(in_ptr));
    const len: usize = @as(u32, @bitCast(in_len));
    if (start >= arena_base and start + len <= arena_limit and start + len > arena_top) arena_top = start + len;
    error_len = 0;
    counter_n = 0;
    return @as([*]const u8, @ptrFromInt(start))[0..len];
}

fn callOnRecord(comptime Root: type, rec: *const Record) anyerror!Decision {
    const R = @typeInfo(@TypeOf(Root.onRecord)).@"fn".return_type.?;
    if (@typeInfo(R) == .error_union) return try Root.onRecord(rec);
    return Root.onRecord(rec);
}

fn runBatch(comptime Root: type, input: []const u8) !i64 {
    var r: Reader = .{ .buf = input };
    if (try r.u32le() != abi_version) return error.UnsupportedVersion;
    var ctx: Record = undefined;
    ctx.direction = @enumFromInt(try r.byte());
    ctx.topic = try r.str();
    ctx.partition = @bitCast(try r.u32le());
    ctx.client_id = try r.str();
    ctx.principal = try r.str();
    const n = try r.u32le();
    if (n > input.len / 28 + 1) return error.Malformed;
    var w: Writer = .{};
    try w.u32le(n);
    var i: u32 = 0;
    while (i < n) : (i += 1) {
        var rec = ctx;
        rec.index = i;
        rec.offset = try r.i64le();
        rec.timestamp_ms = try r.i64le();
        rec.key = try r.bytes(true);
        rec.value = try r.bytes(true);
        const hn = try r.u32le();
        if (hn > (input.len - r.pos) / 8) return error.Malformed;
        const hs = try allocator().alloc(Header, hn);
        for (hs) |*h| {
            h.key = try r.str();
            h.value = try r.bytes(true);
        }
        rec.headers = hs;
        const d = try callOnRecord(Root, &rec);
        switch (d) {
            .keep => try w.put(&.{0}),
            .drop => try w.put(&.{2}),
            .reject => |reason| {
                try w.put(&.{3});
                try w.bytes(reason);
            },
            .rewrite => |rw| {
                try w.put(&.{1});
                try w.bytes(rw.key);
                try w.bytes(rw.value);
                try w.u32le(@intCast(rw.headers.len));
                for (rw.headers) |h| {
                    try w.bytes(h.key);
                    try w.bytes(h.value);
                }
            },
        }
    }
    try w.u32le(@intCast(counter_n));
    for (counter_names[0..counter_n], counter_values[0..counter_n]) |name, v| {
        try w.bytes(name);
        try w.u32le(v);
    }
    const out = w.list.items;
    return pack(out.ptr, out.len);
}

// ------------------------------------------------------------------------------------------
// sluice_filter_records: the same filter over Kafka's own record encoding
// ------------------------------------------------------------------------------------------
// The host hands over a batch's records section exactly as Kafka stores it (uncompressed) and
// gets back the new records section plus one fate byte per record, so it never decodes or
// re-encodes a record in Python. Same checks and same output bytes as the C SDK.

/// Sets the host-visible message; the caller returns the error.
fn refuse(message: []const u8) error{Refused} {
    setError(message);
    return error.Refused;
}

/// Kafka's zigzag varlong (at most ten bytes).
fn varlong(r: *Reader) !i64 {
    var v: u64 = 0;
    for (0..10) |i| {
        const b = try r.byte();
        v |= @as(u64, b & 0x7f) << @as(u6, @intCast(i * 7));
        if (b & 0x80 == 0) return @bitCast((v >> 1) ^ (0 -% (v & 1)));
    }
    return error.Malformed;
}

/// Kafka's varint fields are 32-bit; anything wider is a malformed record.
fn varint(r: *Reader) !i32 {
    const v = try varlong(r);
    return std.math.cast(i32, v) orelse error.Malformed;
}

fn varBytes(r: *Reader, nullable: bool) !?[]const u8 {
    const n = try varint(r);
    if (n < 0) {
        if (!nullable or n != -1) return error.Malformed;
        return null;
    }
    const len: usize = @intCast(n);
    if (r.buf.len - r.pos < len) return error.Truncated;
    r.pos += len;
    return r.buf[r.pos - len .. r.pos];
}

fn zigzag(v: i64) u64 {
    const u: u64 = @bitCast(v);
    return (u << 1) ^ @as(u64, @bitCast(v >> 63));
}

fn varSize(v: i64) u64 {
    var z = zigzag(v);
    var n: u64 = 1;
    while (z > 0x7f) : (z >>= 7) n += 1;
    return n;
}

fn varBytesSize(b: ?[]const u8) u64 {
    const data = b orelse return 1;
    return varSize(@intCast(data.len)) + data.len;
}

/// Writes into a buffer sized beforehand (the sizes are computed from the same decisions).
const Out = struct {
    buf: []u8,
    pos: usize = 0,

    fn put(self: *Out, data: []const u8) void {
        @memcpy(self.buf[self.pos..][0..data.len], data);
        self.pos += data.len;
    }

    fn u32le(self: *Out, v: u32) void {
        std.mem.writeInt(u32, self.buf[self.pos..][0..4], v, .little);
        self.pos += 4;
    }

    fn str(self: *Out, data: []const u8) void {
        self.u32le(@intCast(data.len));
        self.put(data);
    }

    fn varlong(self: *Out, v: i64) void {
        var z = zigzag(v);
        while (z > 0x7f) : (z >>= 7) {
            self.buf[self.pos] = @as(u8, @truncate(z & 0x7f)) | 0x80;
            self.pos += 1;
        }
        self.buf[self.pos] = @truncate(z);
        self.pos += 1;
    }

    fn varBytes(self: *Out, b: ?[]const u8) void {
        const data = b orelse return self.varlong(-1);
        self.varlong(@intCast(data.len));
        self.put(data);
    }
};

const NativeRecord = struct {
    /// The record as it came, length prefix included (a keep copies it verbatim).
    raw: []const u8,
    attributes: u8,
    timestamp_delta: i64,
    offset_delta: i32,
    decision: Decision,
};

/// Size of a rewritten record's body (everything after its length prefix).
fn rewriteBodySize(n: *const NativeRecord, rw: Rewrite) u64 {
    var size = 1 + varSize(n.timestamp_delta) + varSize(n.offset_delta) + varBytesSize(rw.key) +
        varBytesSize(rw.value) + varSize(@intCast(rw.headers.len));
    for (rw.headers) |h| size += varBytesSize(h.key) + varBytesSize(h.value);
    return size;
}

/// The fate byte of a decision (0 keep, 1 rewrite, 2 drop, 3 reject, as in sluice_filter).
fn fate(d: Decision) u8 {
    return switch (d) {
        .keep => 0,
        .rewrite => 1,
        .drop => 2,
        .reject => 3,
    };
}

fn readNativeHead(r: *Reader, ctx: *Record, offset_base: *i64, timestamp_base: *i64) !u32 {
    ctx.direction = @enumFromInt(try r.byte());
    ctx.topic = try r.str();
    ctx.partition = @bitCast(try r.u32le());
    ctx.client_id = try r.str();
    ctx.principal = try r.str();
    offset_base.* = try r.i64le();
    timestamp_base.* = try r.i64le();
    return r.u32le();
}

/// Parses one record body into `n` and `rec` (offset, timestamp, key, value, headers).
fn readNativeBody(body: *Reader, n: *NativeRecord, rec: *Record, offset_base: i64, timestamp_base: i64) !void {
    n.attributes = try body.byte();
    n.timestamp_delta = try varlong(body);
    n.offset_delta = try varint(body);
    rec.offset = offset_base +% n.offset_delta;
    rec.timestamp_ms = timestamp_base +% n.timestamp_delta;
    rec.key = try varBytes(body, true);
    rec.value = try varBytes(body, true);
    const hc = try varint(body);
    if (hc < 0 or @as(u32, @intCast(hc)) > (body.buf.len - body.pos) / 2) return error.Malformed;
    const hs = allocator().alloc(Header, @intCast(hc)) catch return refuse("out of memory");
    for (hs) |*h| {
        h.key = (try varBytes(body, false)).?;
        h.value = try varBytes(body, true);
    }
    if (body.pos != body.buf.len) return error.Malformed;
    rec.headers = hs;
}

fn runRecords(comptime Root: type, input: []const u8) !i64 {
    var r: Reader = .{ .buf = input };
    const version = r.u32le() catch return refuse("malformed batch header");
    if (version != abi_version) return refuse("unsupported input version");
    var ctx: Record = undefined;
    var offset_base: i64 = 0;
    var timestamp_base: i64 = 0;
    const n = readNativeHead(&r, &ctx, &offset_base, &timestamp_base) catch
        return refuse("malformed batch header");
    // The smallest Kafka record is 7 bytes (length and six one-byte fields).
    if (n > (input.len - r.pos) / 7 + 1) return refuse("malformed batch header");
    const recs = allocator().alloc(NativeRecord, n) catch return refuse("out of memory");
    var changed: u32 = 0;
    var rejects: u32 = 0;
    var records_size: u64 = 0;
    var rejects_size: u64 = 0;
    for (recs, 0..) |*nr, i| {
        const start = r.pos;
        const len = varint(&r) catch return refuse("malformed record");
        if (len < 0 or r.buf.len - r.pos < @as(u32, @intCast(len))) return refuse("malformed record");
        const end = r.pos + @as(u32, @intCast(len));
        var body: Reader = .{ .buf = input[r.pos..end] };
        r.pos = end;
        nr.raw = input[start..end];
        var rec = ctx;
        rec.index = @intCast(i);
        readNativeBody(&body, nr, &rec, offset_base, timestamp_base) catch |err| switch (err) {
            error.Refused => return err,
            else => return refuse("malformed record"),
        };
        nr.decision = try callOnRecord(Root, &rec);
        switch (nr.decision) {
            .keep => records_size += nr.raw.len,
            .rewrite => |rw| {
                const b = rewriteBodySize(nr, rw);
                records_size += varSize(@intCast(b)) + b;
                changed += 1;
            },
            .drop => changed += 1,
            .reject => |reason| {
                rejects_size += 8 + reason.len;
                changed += 1;
                rejects += 1;
            },
        }
    }
    if (r.pos != input.len) return refuse("malformed batch: bytes after the last record");
    var out_size: u64 = 4 + @as(u64, n) + 4 + (if (changed != 0) records_size else 0) + 4 + rejects_size + 4;
    for (counter_names[0..counter_n]) |name| out_size += 8 + name.len;
    if (out_size > 0x7fff_ffff or records_size > 0x7fff_ffff) return refuse("output too large");
    const buf = allocator().alloc(u8, @intCast(out_size)) catch return refuse("out of memory");
    var w: Out = .{ .buf = buf };
    w.u32le(n);
    for (recs) |nr| w.put(&.{fate(nr.decision)});
    if (changed == 0) {
        w.u32le(0xFFFF_FFFF); // -1: the records section is unchanged
    } else {
        w.u32le(@intCast(records_size));
        for (recs) |*nr| switch (nr.decision) {
            .keep => w.put(nr.raw),
            .rewrite => |rw| {
                w.varlong(@intCast(rewriteBodySize(nr, rw)));
                w.put(&.{nr.attributes});
                w.varlong(nr.timestamp_delta);
                w.varlong(nr.offset_delta);
                w.varBytes(rw.key);
                w.varBytes(rw.value);
                w.varlong(@intCast(rw.headers.len));
                for (rw.headers) |h| {
                    w.varBytes(h.key);
                    w.varBytes(h.value);
                }
            },
            .drop, .reject => {},
        };
    }
    w.u32le(rejects);
    for (recs, 0..) |nr, i| switch (nr.decision) {
        .reject => |reason| {
            w.u32le(@intCast(i));
            w.str(reason);
        },
        else => {},
    };
    w.u32le(@intCast(counter_n));
    for (counter_names[0..counter_n], counter_values[0..counter_n]) |name, v| {
        w.str(name);
        w.u32le(v);
    }
    return pack(buf.ptr, w.pos);
}

/// Export the Sluice ABI for the filter whose root file is `Root` (call from a comptime block).
pub fn exportAbi(comptime Root: type) void {
    const Exports = struct {
        fn abiVersion() callconv(.c) i32 {
            return abi_version;
        }

        fn alloc(size: i32) callconv(.c) i32 {
            resetArena();
            const n: usize = if (size > 0) @intCast(size) else 1;
            const p = bump(n, 8) orelse return 0;
            return @bitCast(@as(u32, @intCast(@intFromPtr(p))));
        }

        fn lastError() callconv(.c) i64 {
            return pack(&error_buf, error_len);
        }

        fn init(ptr: i32, len: i32) callconv(.c) i32 {
            const cfg = beginCall(ptr, len);
            config_json = cfg;
            if (@hasDecl(Root, "onConfig")) {
                Root.onConfig(cfg) catch |err| {
                    if (error_len == 0) setError(@errorName(err));
                    return 1;
                };
            }
            // Everything allocated so far (config text, the filter's state) stays.
            arena_base = std.mem.alignForward(usize, arena_top, 16);
            return 0;
        }

        fn filter(ptr: i32, len: i32) callconv(.c) i64 {
            const input = beginCall(ptr, len);
            return runBatch(Root, input) catch |err| {
                if (error_len == 0) setError(@errorName(err));
                return -1;
            };
        }

        fn filterRecords(ptr: i32, len: i32) callconv(.c) i64 {
            const input = beginCall(ptr, len);
            return runRecords(Root, input) catch |err| {
                if (error_len == 0) setError(@errorName(err));
                return -1;
            };
        }

        fn admin(ptr: i32, len: i32) callconv(.c) i64 {
            const input = beginCall(ptr, len);
            const out = Root.onAdmin(input) catch |err| {
                if (error_len == 0) setError(@errorName(err));
                return -1;
            };
            return pack(out.ptr, out.len);
        }
    };
    @export(&Exports.abiVersion, .{ .name = "sluice_abi_version" });
    @export(&Exports.alloc, .{ .name = "sluice_alloc" });
    @export(&Exports.lastError, .{ .name = "sluice_last_error" });
    @export(&Exports.init, .{ .name = "sluice_init" });
    @export(&Exports.filter, .{ .name = "sluice_filter" });
    @export(&Exports.filterRecords, .{ .name = "sluice_filter_records" });
    if (@hasDecl(Root, "onAdmin")) @export(&Exports.admin, .{ .name = "sluice_admin" });
}
