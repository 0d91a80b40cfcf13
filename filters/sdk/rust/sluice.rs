//! sluice.rs: the Rust SDK for Sluice Wasm filters (Sluice Wasm ABI v1).
//!
//! A filter is ONE Rust file (`filter.rs`, a `cdylib` for `wasm32-unknown-unknown`) that
//! implements [`Filter`] for a type and exports the ABI for it:
//!
//! ```ignore
//! use sluice::{Decision, Filter, Json, Record};
//!
//! struct Upper;
//! impl Filter for Upper {
//!     fn configure(_config: &Json) -> Result<Self, String> { Ok(Upper) }
//!     fn on_record<'a>(&mut self, rec: &Record<'a>) -> Result<Decision<'a>, String> {
//!         let v = match rec.value { Some(v) => v, None => return Ok(Decision::Keep) };
//!         Ok(rec.with_value(v.to_ascii_uppercase()))
//!     }
//! }
//! sluice::export_filter!(Upper);
//! ```
//!
//! `export_filter!(T)` exports `sluice_abi_version`, `sluice_alloc`, `sluice_init`,
//! `sluice_filter`, `sluice_filter_records` (the host's fast path over Kafka's own record
//! encoding: kept records are copied verbatim, one call per batch) and `sluice_last_error`;
//! `export_filter!(T, admin)` adds `sluice_admin`, which calls [`Filter::on_admin`].
//!
//! Memory: this crate installs a bump allocator as the global allocator. It is reset before
//! every call, so a batch needs no freeing; what `configure` allocates (the filter value
//! itself) is kept for the life of the instance. Do not keep memory allocated in
//! `on_record` across batches. The crate uses only `core` and `alloc` types (through `std`,
//! because Debian's rustc 1.63 cannot build a `no_std` + `alloc` crate on stable) and needs no
//! other crate: `sluice filter build DIR` compiles it with `rustc`, offline.

use std::alloc::{GlobalAlloc, Layout};
use std::borrow::Cow;

pub const ABI_VERSION: i32 = 1;

// ------------------------------------------------------------------------------------------
// Public types
// ------------------------------------------------------------------------------------------

/// Produce (client -> broker) or fetch (broker -> client).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Produce,
    Fetch,
}

/// One record header: the key is never null, the value may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header<'a> {
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// A record and its context. The byte slices point into the host's input (valid for the batch).
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    pub direction: Direction,
    pub topic: &'a [u8],
    pub partition: i32,
    pub client_id: &'a [u8],
    pub principal: &'a [u8],
    /// Position in the batch.
    pub index: u32,
    /// Produce: offset delta within the batch; fetch: absolute offset.
    pub offset: i64,
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: &'a [Header<'a>],
}

impl<'a> Record<'a> {
    /// Value of the first header called `name` (None when absent or null).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers.iter().find(|h| h.key == name.as_bytes()).and_then(|h| h.value)
    }

    /// Same key and headers, new value.
    pub fn with_value(&self, value: impl Into<Cow<'a, [u8]>>) -> Decision<'a> {
        Decision::Rewrite {
            key: self.key.map(Cow::Borrowed),
            value: Some(value.into()),
            headers: Cow::Borrowed(self.headers),
        }
    }

    /// Same value and headers, new key (None: no key).
    pub fn with_key(&self, key: Option<Cow<'a, [u8]>>) -> Decision<'a> {
        Decision::Rewrite {
            key,
            value: self.value.map(Cow::Borrowed),
            headers: Cow::Borrowed(self.headers),
        }
    }
}

/// What becomes of a record.
#[derive(Clone, Debug)]
pub enum Decision<'a> {
    /// Pass it on unchanged.
    Keep,
    /// Silently remove it.
    Drop,
    /// Refuse it: the producer gets INVALID_RECORD with this reason.
    Reject(Cow<'a, str>),
    /// Pass it on with a new key, value and headers (offset, timestamp, attributes kept).
    Rewrite {
        key: Option<Cow<'a, [u8]>>,
        value: Option<Cow<'a, [u8]>>,
        headers: Cow<'a, [Header<'a>]>,
    },
}

impl<'a> Decision<'a> {
    pub fn reject(reason: impl Into<Cow<'a, str>>) -> Self {
        Decision::Reject(reason.into())
    }

    fn code(&self) -> u8 {
        match self {
            Decision::Keep => 0,
            Decision::Rewrite { .. } => 1,
            Decision::Drop => 2,
            Decision::Reject(_) => 3,
        }
    }
}

/// The functions a filter author writes.
pub trait Filter: Sized {
    /// Once per instance, with the filter's `config:` mapping (`Json::Null` without one). An
    /// `Err` refuses the configuration: the proxy does not start and prints the message.
    fn configure(config: &Json) -> Result<Self, String>;

    /// Once per record. An `Err` fails the whole batch (the filter's `on_error` policy applies);
    /// prefer `Decision::Reject` for a bad record.
    fn on_record<'a>(&mut self, rec: &Record<'a>) -> Result<Decision<'a>, String>;

    /// Admin filters (`export_filter!(T, admin)`): one resource request as JSON, answered with
    /// JSON (FILTER_ABI.md section 5).
    fn on_admin(&mut self, _request: &[u8]) -> Result<Vec<u8>, String> {
        Err(String::from("this filter does not handle admin requests"))
    }
}

// ------------------------------------------------------------------------------------------
// Arena: the global allocator. It grows linear memory past its initial end and is reset by
// every sluice_alloc; memory allocated before the end of sluice_init is kept.
// ------------------------------------------------------------------------------------------

const PAGE: usize = 65536;
static mut ARENA_BASE: usize = 0;
static mut ARENA_TOP: usize = 0;
static mut ARENA_LIMIT: usize = 0;

fn arena_setup() {
    unsafe {
        if ARENA_BASE == 0 {
            ARENA_LIMIT = core::arch::wasm32::memory_size(0) * PAGE;
            ARENA_BASE = ARENA_LIMIT;
            ARENA_TOP = ARENA_LIMIT;
        }
    }
}

fn bump(size: usize, align: usize) -> *mut u8 {
    arena_setup();
    unsafe {
        let start = (ARENA_TOP + align - 1) & !(align - 1);
        let end = match start.checked_add(size) {
            Some(e) => e,
            None => return core::ptr::null_mut(),
        };
        if end > ARENA_LIMIT {
            let pages = (end - ARENA_LIMIT + PAGE - 1) / PAGE;
            if core::arch::wasm32::memory_grow(0, pages) == usize::MAX {
                return core::ptr::null_mut();
            }
            ARENA_LIMIT = core::arch::wasm32::memory_size(0) * PAGE;
        }
        ARENA_TOP = end;
        start as *mut u8
    }
}

/// The bump allocator behind `Vec`, `String` and `Box` in a filter.
pub struct Arena;

unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump(layout.size(), layout.align())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Only the most recent block can be given back.
        if ptr as usize + layout.size() == ARENA_TOP {
            ARENA_TOP = ptr as usize;
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let start = ptr as usize;
        if start + layout.size() == ARENA_TOP {
            if new_size <= layout.size() {
                ARENA_TOP = start + new_size;
                return ptr;
            }
            if let Some(end) = start.checked_add(new_size) {
                if end <= ARENA_LIMIT {
                    ARENA_TOP = end;
                    return ptr;
                }
            }
        }
        let new = bump(new_size, layout.align());
        if !new.is_null() {
            core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Arena = Arena;

// ------------------------------------------------------------------------------------------
// Counters and errors
// ------------------------------------------------------------------------------------------

const MAX_COUNTERS: usize = 32;
static mut COUNTERS: [(&str, u32); MAX_COUNTERS] = [("", 0); MAX_COUNTERS];
static mut COUNTER_N: usize = 0;

/// Add `n` to the detector counter `name` for this batch (reported to the host's telemetry).
pub fn count(name: &'static str, n: u32) {
    unsafe {
        for c in COUNTERS[..COUNTER_N].iter_mut() {
            if c.0 == name {
                c.1 += n;
                return;
            }
        }
        if COUNTER_N < MAX_COUNTERS {
            COUNTERS[COUNTER_N] = (name, n);
            COUNTER_N += 1;
        }
    }
}

static mut ERROR: [u8; 256] = [0; 256];
static mut ERROR_LEN: usize = 0;

/// Set the message the host reads through sluice_last_error (first 256 bytes kept).
pub fn set_error(message: &str) {
    unsafe {
        let n = message.len().min(ERROR.len());
        ERROR[..n].copy_from_slice(&message.as_bytes()[..n]);
        ERROR_LEN = n;
    }
}

// ------------------------------------------------------------------------------------------
// JSON (RFC 8259, strict, UTF-8 checked, depth-limited): the same rules and messages as the C
// SDK's parser.
// ------------------------------------------------------------------------------------------

/// A parsed JSON value. Numbers keep their text.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// Why a text is not JSON, and the byte offset where parsing stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonError {
    pub message: &'static str,
    pub offset: usize,
}

const JSON_MAX_DEPTH: usize = 64;

impl Json {
    /// Parse one JSON text.
    pub fn parse(data: &[u8]) -> Result<Json, JsonError> {
        let mut p = JsonParser { s: data, i: 0, depth: 0 };
        let v = p.value().map_err(|m| JsonError { message: m, offset: p.i })?;
        p.ws();
        if p.i != data.len() {
            return Err(JsonError { message: "trailing characters after JSON value", offset: p.i });
        }
        Ok(v)
    }

    /// Member of an object by name (the last duplicate wins, like most parsers).
    pub fn get(&self, name: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members.iter().rev().find(|m| m.0 == name).map(|m| &m.1),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Integer value of a number or of a string holding an integer (as Kafka configs are).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Number(s) | Json::String(s) => s.parse().ok(),
            _ => None,
        }
    }
}

struct JsonParser<'s> {
    s: &'s [u8],
    i: usize,
    depth: usize,
}

/// Length of the valid UTF-8 sequence at the start of `p` (1..4), or 0 if invalid.
fn utf8_len(p: &[u8]) -> usize {
    let n = match p[0] {
        0..=0x7f => return 1,
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => return 0,
    };
    if p.len() < n {
        return 0;
    }
    core::str::from_utf8(&p[..n]).map(|_| n).unwrap_or(0)
}

impl<'s> JsonParser<'s> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn hex4(&self, at: usize) -> Option<u32> {
        let digits = self.s.get(at..at + 4)?;
        let mut v = 0u32;
        for &c in digits {
            v = (v << 4) | (c as char).to_digit(16)?;
        }
        Some(v)
    }

    fn string(&mut self) -> Result<String, &'static str> {
        self.i += 1; // opening quote
        let mut out = Vec::new();
        loop {
            let c = match self.s.get(self.i) { Some(&v) => v, None => return Err("unterminated string") };
            match c {
                b'"' => {
                    self.i += 1;
                    // Every byte pushed came from a checked sequence or an encoded char.
                    return Ok(String::from_utf8(out).unwrap_or_default());
                }
                0..=0x1f => return Err("control character in string"),
                b'\\' => {
                    let e = match self.s.get(self.i + 1) { Some(&v) => v, None => return Err("bad escape") };
                    let lit = match e {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 8,
                        b'f' => 12,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => 0,
                        _ => return Err("bad escape"),
                    };
                    if e != b'u' {
                        out.push(lit);
                        self.i += 2;
                        continue;
                    }
                    let mut cp = match self.hex4(self.i + 2) { Some(v) => v, None => return Err("bad \\u escape") };
                    self.i += 6;
                    if (0xd800..=0xdbff).contains(&cp) {
                        // A high surrogate must be followed by a low one.
                        let lo = if self.s.get(self.i..self.i + 2) == Some(b"\\u") {
                            self.hex4(self.i + 2)
                        } else {
                            None
                        };
                        match lo {
                            Some(lo) if (0xdc00..=0xdfff).contains(&lo) => {
                                self.i += 6;
                                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                            }
                            _ => cp = 0xfffd, // lone surrogate: UTF-8 cannot hold it
                        }
                    } else if (0xdc00..=0xdfff).contains(&cp) {
                        cp = 0xfffd;
                    }
                    let ch = char::from_u32(cp).unwrap_or('\u{fffd}');
                    let mut tmp = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut tmp).as_bytes());
                }
                _ => {
                    let n = utf8_len(&self.s[self.i..]);
                    if n == 0 {
                        return Err("invalid UTF-8");
                    }
                    out.extend_from_slice(&self.s[self.i..self.i + n]);
                    self.i += n;
                }
            }
        }
    }

    fn number(&mut self) -> Result<Json, &'static str> {
        let s = self.s;
        let start = self.i;
        let mut p = self.i;
        let digit = |p: usize| p < s.len() && s[p].is_ascii_digit();
        if p < s.len() && s[p] == b'-' {
            p += 1;
        }
        if p >= s.len() {
            return Err("bad number");
        }
        if s[p] == b'0' {
            p += 1;
        } else if digit(p) {
            while digit(p) {
                p += 1;
            }
        } else {
            return Err("bad number");
        }
        if p < s.len() && s[p] == b'.' {
            p += 1;
            if !digit(p) {
                return Err("bad number");
            }
            while digit(p) {
                p += 1;
            }
        }
        if p < s.len() && (s[p] == b'e' || s[p] == b'E') {
            p += 1;
            if p < s.len() && (s[p] == b'+' || s[p] == b'-') {
                p += 1;
            }
            if !digit(p) {
                return Err("bad number");
            }
            while digit(p) {
                p += 1;
            }
        }
        self.i = p;
        Ok(Json::Number(String::from_utf8_lossy(&s[start..p]).into_owned()))
    }

    fn literal(&mut self, lit: &[u8], v: Json) -> Result<Json, &'static str> {
        if self.s[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(v)
        } else {
            Err("unexpected token")
        }
    }

    fn value(&mut self) -> Result<Json, &'static str> {
        self.ws();
        let c = match self.s.get(self.i) { Some(&v) => v, None => return Err("unexpected end of input") };
        match c {
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth > JSON_MAX_DEPTH {
                    return Err("nesting too deep");
                }
                let object = c == b'{';
                let close = if object { b'}' } else { b']' };
                let mut members: Vec<(String, Json)> = Vec::new();
                let mut items: Vec<Json> = Vec::new();
                self.i += 1;
                self.ws();
                if self.s.get(self.i) == Some(&close) {
                    self.i += 1;
                } else {
                    loop {
                        self.ws();
                        let mut key = String::new();
                        if object {
                            if self.s.get(self.i) != Some(&b'"') {
                                return Err("expected member name");
                            }
                            key = self.string()?;
                            self.ws();
                            if self.s.get(self.i) != Some(&b':') {
                                return Err("expected ':'");
                            }
                            self.i += 1;
                        }
                        let v = self.value()?;
                        if object {
                            members.push((key, v));
                        } else {
                            items.push(v);
                        }
                        self.ws();
                        match self.s.get(self.i) {
                            None => return Err("unexpected end of input"),
                            Some(b',') => self.i += 1,
                            Some(&x) if x == close => {
                                self.i += 1;
                                break;
                            }
                            _ if object => return Err("expected ',' or '}'"),
                            _ => return Err("expected ',' or ']'"),
                        }
                    }
                }
                self.depth -= 1;
                Ok(if object { Json::Object(members) } else { Json::Array(items) })
            }
            b'"' => self.string().map(Json::String),
            b'-' | b'0'..=b'9' => self.number(),
            b't' => self.literal(b"true", Json::Bool(true)),
            b'f' => self.literal(b"false", Json::Bool(false)),
            b'n' => self.literal(b"null", Json::Null),
            _ => Err("unexpected character"),
        }
    }
}

// ------------------------------------------------------------------------------------------
// The ABI (called by the code export_filter! generates; do not call these yourself)
// ------------------------------------------------------------------------------------------

#[doc(hidden)]
pub mod abi {
    use super::*;

    struct Reader<'a> {
        buf: &'a [u8],
        pos: usize,
        ok: bool,
    }

    impl<'a> Reader<'a> {
        fn new(buf: &'a [u8]) -> Self {
            Reader { buf, pos: 0, ok: true }
        }

        fn left(&self) -> usize {
            self.buf.len() - self.pos
        }

        fn u8(&mut self) -> u8 {
            if self.left() < 1 {
                self.ok = false;
                return 0;
            }
            self.pos += 1;
            self.buf[self.pos - 1]
        }

        fn u32(&mut self) -> u32 {
            if self.left() < 4 {
                self.ok = false;
                return 0;
            }
            let b = &self.buf[self.pos..self.pos + 4];
            self.pos += 4;
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        }

        fn i64(&mut self) -> i64 {
            let lo = self.u32() as u64;
            let hi = self.u32() as u64;
            (lo | (hi << 32)) as i64
        }

        /// `n` bytes for a length just read (-1 = null where `nullable`).
        fn take(&mut self, n: i64, nullable: bool) -> Option<&'a [u8]> {
            if !self.ok {
                return None;
            }
            if n < 0 {
                if !nullable || n != -1 {
                    self.ok = false;
                }
                return None;
            }
            if (self.left() as i64) < n {
                self.ok = false;
                return None;
            }
            let start = self.pos;
            self.pos += n as usize;
            Some(&self.buf[start..self.pos])
        }

        fn bytes(&mut self, nullable: bool) -> Option<&'a [u8]> {
            let n = self.u32() as i32 as i64;
            self.take(n, nullable)
        }

        fn str(&mut self) -> &'a [u8] {
            self.bytes(false).unwrap_or(&[])
        }

        fn varlong(&mut self) -> i64 {
            let mut v: u64 = 0;
            let mut shift = 0;
            while shift < 64 {
                if self.pos >= self.buf.len() {
                    break;
                }
                let b = self.buf[self.pos];
                self.pos += 1;
                v |= ((b & 0x7f) as u64) << shift;
                if b & 0x80 == 0 {
                    return ((v >> 1) as i64) ^ -((v & 1) as i64);
                }
                shift += 7;
            }
            self.ok = false;
            0
        }

        /// Kafka's varint fields are 32-bit; anything wider is a malformed record.
        fn varint(&mut self) -> i32 {
            let v = self.varlong();
            if v < i32::MIN as i64 || v > i32::MAX as i64 {
                self.ok = false;
            }
            if self.ok {
                v as i32
            } else {
                0
            }
        }

        fn vbytes(&mut self, nullable: bool) -> Option<&'a [u8]> {
            let n = self.varint() as i64;
            self.take(n, nullable)
        }
    }

    fn w32(out: &mut Vec<u8>, v: u32) {
        out.extend_from_slice(&v.to_le_bytes());
    }

    fn wbytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
        match b {
            None => w32(out, u32::MAX),
            Some(b) => {
                w32(out, b.len() as u32);
                out.extend_from_slice(b);
            }
        }
    }

    fn vsize(v: i64) -> usize {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        let mut n = 1;
        while z > 0x7f {
            z >>= 7;
            n += 1;
        }
        n
    }

    fn wvar(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z > 0x7f {
            out.push((z as u8 & 0x7f) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }

    fn vblen(b: Option<&[u8]>) -> usize {
        b.map_or(1, |b| vsize(b.len() as i64) + b.len())
    }

    fn wvbytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
        match b {
            None => wvar(out, -1),
            Some(b) => {
                wvar(out, b.len() as i64);
                out.extend_from_slice(b);
            }
        }
    }

    fn pack(ptr: *const u8, len: usize) -> i64 {
        (((ptr as usize as u64) << 32) | len as u64) as i64
    }

    /// The output buffer stays in the arena until the next call: the host reads it first.
    fn finish(out: Vec<u8>) -> i64 {
        let packed = pack(out.as_ptr(), out.len());
        core::mem::forget(out);
        packed
    }

    fn fail(message: &str) -> i64 {
        unsafe {
            if ERROR_LEN == 0 {
                set_error(message);
            }
        }
        -1
    }

    fn write_counters(out: &mut Vec<u8>) {
        unsafe {
            w32(out, COUNTER_N as u32);
            for (name, n) in COUNTERS[..COUNTER_N].iter() {
                wbytes(out, Some(name.as_bytes()));
                w32(out, *n);
            }
        }
    }

    /// The input of a call: it stays alive, the arena restarts after it wherever the host put it.
    unsafe fn begin_call<'a>(ptr: i32, len: i32) -> &'a [u8] {
        arena_setup();
        let start = ptr as u32 as usize;
        let end = start + len.max(0) as usize;
        if start >= ARENA_BASE && end <= ARENA_LIMIT && end > ARENA_TOP {
            ARENA_TOP = end;
        }
        ERROR_LEN = 0;
        COUNTER_N = 0;
        if len <= 0 {
            &[]
        } else {
            core::slice::from_raw_parts(start as *const u8, len as usize)
        }
    }

    pub fn abi_version() -> i32 {
        ABI_VERSION
    }

    pub fn alloc(size: i32) -> i32 {
        // The host allocates the input of the next call: the previous call's memory is dead.
        arena_setup();
        unsafe {
            ARENA_TOP = ARENA_BASE;
        }
        bump(size.max(1) as usize, 8) as usize as i32
    }

    pub fn last_error() -> i64 {
        unsafe { pack(ERROR.as_ptr(), ERROR_LEN) }
    }

    pub unsafe fn init<F: Filter>(slot: &mut Option<F>, ptr: i32, len: i32) -> i32 {
        let cfg = begin_call(ptr, len);
        let config = if cfg.is_empty() {
            Json::Null
        } else {
            match Json::parse(cfg) {
                Ok(c) => c,
                Err(_) => {
                    set_error("configuration is not valid JSON");
                    return 1;
                }
            }
        };
        match F::configure(&config) {
            Ok(f) => *slot = Some(f),
            Err(e) => {
                fail(if e.is_empty() { "configuration rejected by the filter" } else { &e });
                return 1;
            }
        }
        // Everything allocated so far (the filter value and what it holds) stays.
        ARENA_BASE = (ARENA_TOP + 15) & !15;
        0
    }

    fn ensure<F: Filter>(slot: &mut Option<F>) -> Option<&mut F> {
        if slot.is_none() {
            match F::configure(&Json::Null) {
                Ok(f) => *slot = Some(f),
                Err(e) => {
                    fail(if e.is_empty() { "filter needs a configuration" } else { &e });
                    return None;
                }
            }
        }
        slot.as_mut()
    }

    /// The fields both batch entry points start with; None (error set) on a foreign version.
    fn read_context<'a>(r: &mut Reader<'a>) -> Option<Record<'a>> {
        let version = r.u32();
        if r.ok && version != ABI_VERSION as u32 {
            set_error("unsupported input version");
            return None;
        }
        let direction = if r.u8() == 1 { Direction::Fetch } else { Direction::Produce };
        let topic = r.str();
        let partition = r.u32() as i32;
        let client_id = r.str();
        let principal = r.str();
        Some(Record {
            direction,
            topic,
            partition,
            client_id,
            principal,
            index: 0,
            offset: 0,
            timestamp_ms: 0,
            key: None,
            value: None,
            headers: &[],
        })
    }

    fn header_key<'h>(h: &Header<'h>) -> Option<&'h [u8]> {
        Some(h.key)
    }

    pub unsafe fn filter<F: Filter>(slot: &mut Option<F>, ptr: i32, len: i32) -> i64 {
        let input = begin_call(ptr, len);
        let f = match ensure(slot) { Some(v) => v, None => return -1 };
        let mut r = Reader::new(input);
        let ctx = match read_context(&mut r) { Some(v) => v, None => return -1 };
        let count = r.u32();
        if !r.ok || count as usize > r.left() / 28 + 1 {
            return fail("malformed batch header");
        }
        let mut out = Vec::with_capacity(64 + count as usize);
        w32(&mut out, count);
        for i in 0..count {
            let mut rec = ctx;
            rec.index = i;
            rec.offset = r.i64();
            rec.timestamp_ms = r.i64();
            rec.key = r.bytes(true);
            rec.value = r.bytes(true);
            let hc = r.u32();
            if !r.ok || hc as usize > r.left() / 8 {
                return fail("malformed record");
            }
            let mut hs = Vec::with_capacity(hc as usize);
            for _ in 0..hc {
                let key = r.str();
                hs.push(Header { key, value: r.bytes(true) });
            }
            if !r.ok {
                return fail("malformed header");
            }
            let hs = &*hs.leak();
            rec.headers = hs;
            let d = match f.on_record(&rec) {
                Ok(d) => d,
                Err(e) => return fail(if e.is_empty() { "filter error" } else { &e }),
            };
            out.push(d.code());
            match &d {
                Decision::Rewrite { key, value, headers } => {
                    wbytes(&mut out, key.as_deref());
                    wbytes(&mut out, value.as_deref());
                    w32(&mut out, headers.len() as u32);
                    for h in headers.iter() {
                        wbytes(&mut out, header_key(h));
                        wbytes(&mut out, h.value);
                    }
                }
                Decision::Reject(reason) => wbytes(&mut out, Some(reason.as_bytes())),
                Decision::Keep | Decision::Drop => {}
            }
        }
        write_counters(&mut out);
        finish(out)
    }

    struct Native<'a> {
        raw: &'a [u8],
        attributes: u8,
        timestamp_delta: i64,
        offset_delta: i32,
        decision: Decision<'a>,
    }

    fn rewrite_body(n: &Native<'_>) -> usize {
        let (key, value, headers) = match &n.decision { Decision::Rewrite { key, value, headers } => (key, value, headers), _ => return 0 };
        let mut size = 1
            + vsize(n.timestamp_delta)
            + vsize(n.offset_delta as i64)
            + vblen(key.as_deref())
            + vblen(value.as_deref())
            + vsize(headers.len() as i64);
        for h in headers.iter() {
            size += vblen(Some(h.key)) + vblen(h.value);
        }
        size
    }

    pub unsafe fn filter_records<F: Filter>(slot: &mut Option<F>, ptr: i32, len: i32) -> i64 {
        let input = begin_call(ptr, len);
        let f = match ensure(slot) { Some(v) => v, None => return -1 };
        let mut r = Reader::new(input);
        let ctx = match read_context(&mut r) { Some(v) => v, None => return -1 };
        let offset_base = r.i64();
        let timestamp_base = r.i64();
        let count = r.u32();
        // The smallest Kafka record is 7 bytes (length and six one-byte fields).
        if !r.ok || count as usize > r.left() / 7 + 1 {
            return fail("malformed batch header");
        }
        let mut recs: Vec<Native<'_>> = Vec::with_capacity(count as usize);
        let (mut changed, mut rejects) = (0u32, 0u32);
        let mut records_size = 0usize;
        for i in 0..count {
            let start = r.pos;
            let n = r.varint();
            if !r.ok || n < 0 || r.left() < n as usize {
                return fail("malformed record");
            }
            let mut body = Reader::new(&input[r.pos..r.pos + n as usize]);
            r.pos += n as usize;
            let raw = &input[start..r.pos];
            let attributes = body.u8();
            let timestamp_delta = body.varlong();
            let offset_delta = body.varint();
            let mut rec = ctx;
            rec.index = i;
            rec.offset = offset_base.wrapping_add(offset_delta as i64);
            rec.timestamp_ms = timestamp_base.wrapping_add(timestamp_delta);
            rec.key = body.vbytes(true);
            rec.value = body.vbytes(true);
            let hc = body.varint();
            if !body.ok || hc < 0 || hc as usize > body.left() / 2 {
                return fail("malformed record");
            }
            let mut hs = Vec::with_capacity(hc as usize);
            for _ in 0..hc {
                let key = body.vbytes(false).unwrap_or(&[]);
                hs.push(Header { key, value: body.vbytes(true) });
            }
            if !body.ok || body.left() != 0 {
                return fail("malformed record");
            }
            rec.headers = &*hs.leak();
            let decision = match f.on_record(&rec) {
                Ok(d) => d,
                Err(e) => return fail(if e.is_empty() { "filter error" } else { &e }),
            };
            let native = Native { raw, attributes, timestamp_delta, offset_delta, decision };
            match &native.decision {
                Decision::Keep => records_size += raw.len(),
                Decision::Rewrite { .. } => {
                    let b = rewrite_body(&native);
                    records_size += vsize(b as i64) + b;
                    changed += 1;
                }
                Decision::Drop => changed += 1,
                Decision::Reject(_) => {
                    changed += 1;
                    rejects += 1;
                }
            }
            recs.push(native);
        }
        if r.left() != 0 {
            return fail("malformed batch: bytes after the last record");
        }
        if records_size > 0x7fff_ffff {
            return fail("output too large");
        }
        let mut out =
            Vec::with_capacity(16 + count as usize + if changed > 0 { records_size } else { 0 });
        w32(&mut out, count);
        out.extend(recs.iter().map(|n| n.decision.code()));
        if changed == 0 {
            w32(&mut out, u32::MAX); // -1: the records section is unchanged
        } else {
            w32(&mut out, records_size as u32);
            for n in recs.iter() {
                match &n.decision {
                    Decision::Keep => out.extend_from_slice(n.raw),
                    Decision::Rewrite { key, value, headers } => {
                        wvar(&mut out, rewrite_body(n) as i64);
                        out.push(n.attributes);
                        wvar(&mut out, n.timestamp_delta);
                        wvar(&mut out, n.offset_delta as i64);
                        wvbytes(&mut out, key.as_deref());
                        wvbytes(&mut out, value.as_deref());
                        wvar(&mut out, headers.len() as i64);
                        for h in headers.iter() {
                            wvbytes(&mut out, Some(h.key));
                            wvbytes(&mut out, h.value);
                        }
                    }
                    Decision::Drop | Decision::Reject(_) => {}
                }
            }
        }
        w32(&mut out, rejects);
        for (i, n) in recs.iter().enumerate() {
            if let Decision::Reject(reason) = &n.decision {
                w32(&mut out, i as u32);
                wbytes(&mut out, Some(reason.as_bytes()));
            }
        }
        write_counters(&mut out);
        finish(out)
    }

    pub unsafe fn admin<F: Filter>(slot: &mut Option<F>, ptr: i32, len: i32) -> i64 {
        let input = begin_call(ptr, len);
        let f = match ensure(slot) { Some(v) => v, None => return -1 };
        match f.on_admin(input) {
            Ok(out) => finish(out),
            Err(e) => fail(if e.is_empty() { "admin handler failed" } else { &e }),
        }
    }
}

/// Export the Sluice ABI for the filter type `T` (`export_filter!(T, admin)` for admin filters).
#[macro_export]
macro_rules! export_filter {
    ($t:ty) => {
        static mut __SLUICE_FILTER: Option<$t> = None;

        #[no_mangle]
        pub extern "C" fn sluice_abi_version() -> i32 {
            $crate::abi::abi_version()
        }

        #[no_mangle]
        pub extern "C" fn sluice_alloc(size: i32) -> i32 {
            $crate::abi::alloc(size)
        }

        #[no_mangle]
        pub extern "C" fn sluice_last_error() -> i64 {
            $crate::abi::last_error()
        }

        #[no_mangle]
        pub extern "C" fn sluice_init(ptr: i32, len: i32) -> i32 {
            unsafe { $crate::abi::init::<$t>(&mut __SLUICE_FILTER, ptr, len) }
        }

        #[no_mangle]
        pub extern "C" fn sluice_filter(ptr: i32, len: i32) -> i64 {
            unsafe { $crate::abi::filter::<$t>(&mut __SLUICE_FILTER, ptr, len) }
        }

        #[no_mangle]
        pub extern "C" fn sluice_filter_records(ptr: i32, len: i32) -> i64 {
            unsafe { $crate::abi::filter_records::<$t>(&mut __SLUICE_FILTER, ptr, len) }
        }
    };
    ($t:ty, admin) => {
        $crate::export_filter!($t);

        #[no_mangle]
        pub extern "C" fn sluice_admin(ptr: i32, len: i32) -> i64 {
            unsafe { $crate::abi::admin::<$t>(&mut __SLUICE_FILTER, ptr, len) }
        }
    };
}
