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
//! sluice_last_error, and sluice_admin when onAdmin exists), parses the batch, calls onRecord
//! per record and encodes the decisions and the detector counters for the host.
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
    if (@hasDecl(Root, "onAdmin")) @export(&Exports.admin, .{ .name = "sluice_admin" });
}
