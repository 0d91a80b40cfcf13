/* Preloaded (LD_PRELOAD) into componentize-py by filters/build.py, for that process tree only,
 * so that a Python filter builds to the same bytes every time.
 *
 * componentize-py pre-initialises CPython and snapshots its memory; whatever the host hands the
 * interpreter while it starts ends up in the module. This shim replaces the host's randomness
 * and clocks with values that depend only on SLUICE_REPRO_SEED (the sha256 of the build's
 * inputs, 64 hex digits) and SOURCE_DATE_EPOCH:
 *
 *  - getrandom/getentropy: a xoshiro256** stream keyed by the seed. Each thread counts its own
 *    calls and the n-th call of a thread gets the n-th block, so the bytes do not depend on how
 *    the threads are scheduled. (It is not a secret: the result is in the module anyway.)
 *  - clock_gettime/gettimeofday/time: SOURCE_DATE_EPOCH for wall clocks, 0 for the others, plus
 *    one microsecond per call of the calling thread, so time still moves forward for code that
 *    waits on it.
 *
 *  - file times: files and directories this process tree makes on the build's tmpfs
 *    (SLUICE_REPRO_ROOT) get SOURCE_DATE_EPOCH when closed or made; statx/newfstatat, which
 *    wasmtime makes directly (not through libc), are trapped with seccomp and answered with
 *    the access, change and birth times equal to that modification time and the device number
 *    equal to SANDBOX_DEV; the guest's mkdirat (CPython's __pycache__, whose files would carry
 *    the real time) is refused.
 *
 * Inode numbers are made deterministic by build.py: a fresh tmpfs, filled in a fixed order.
 */
#define _GNU_SOURCE
#ifndef __x86_64__
#error "reproducible_shim.c reads x86-64 registers in its SIGSYS handler"
#endif
#include <dlfcn.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <ucontext.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <sys/time.h>
#include <sys/types.h>
#include <time.h>

static uint64_t seed_words[4];
static dev_t sandbox_dev;  /* the build's tmpfs: only its files get clamped times */
/* The device number reported for the build's tmpfs. The kernel gives each tmpfs the lowest free
 * anonymous device number, which depends on how many other tmpfs/overlay mounts exist on the
 * machine at that moment (other builds, containers); wasmtime hashes the device with the inode
 * into the number the guest sees as st_ino, and it lands in the heap. The last anonymous minor
 * (MINORMASK), which the kernel practically never hands out. */
#define SANDBOX_DEV makedev(0, 0xfffff)
static long long epoch_seconds;
static int configured;

static __thread uint64_t random_calls;
static __thread uint64_t clock_calls;

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static long (*real_syscall)(long, ...);

static void set_ts(struct statx_timestamp *t, const struct timespec *from) {
    t->tv_sec = from->tv_sec;
    t->tv_nsec = (uint32_t)from->tv_nsec;
}

/* stat(2) for statx and newfstatat, from an O_PATH descriptor and fstat (neither trapped).
 * On the build's tmpfs, the access, change and birth times are reported as the modification
 * time (clamped by close()/mkdir() below): the kernel sets them from the real clock and
 * nothing can set them back, but wasmtime hands them to the guest. */
static long emulate_stat(int dirfd, const char *path, int flags, struct stat *st) {
    int fd = dirfd;
    int opened = 0;
    if (!(flags & AT_EMPTY_PATH) || (path && path[0])) {
        int oflags = O_PATH | O_CLOEXEC | ((flags & AT_SYMLINK_NOFOLLOW) ? O_NOFOLLOW : 0);
        long r = real_syscall(SYS_openat, dirfd, path, oflags, 0);
        if (r < 0) return r;
        fd = (int)r;
        opened = 1;
    }
    long r = real_syscall(SYS_fstat, fd, st);
    if (opened) real_syscall(SYS_close, fd);
    if (r == 0 && st->st_dev == sandbox_dev) {
        st->st_atim = st->st_mtim;
        st->st_ctim = st->st_mtim;
        st->st_dev = SANDBOX_DEV;
    }
    return r;
}

static void on_sigsys(int sig, siginfo_t *info, void *ctx) {
    (void)sig;
    greg_t *regs = ((ucontext_t *)ctx)->uc_mcontext.gregs;
    int saved = errno;
    long nr = info->si_syscall, ret;
    struct stat st;
    int dirfd = (int)regs[REG_RDI];
    const char *path = (const char *)regs[REG_RSI];
    if (nr == SYS_mkdirat) {
        /* Only the guest makes directories with mkdirat (wasmtime, directly): CPython's
         * __pycache__. Refused, so it writes no bytecode, whose files would carry the real
         * time; its imports are unaffected. */
        ret = -EROFS;
    } else if (nr == SYS_newfstatat) {
        ret = emulate_stat(dirfd, path, (int)regs[REG_R10], (struct stat *)regs[REG_RDX]);
    } else {  /* statx(dirfd, path, flags, mask, buf) */
        ret = emulate_stat(dirfd, path, (int)regs[REG_RDX], &st);
        if (ret == 0) {
            struct statx *sx = (struct statx *)regs[REG_R8];
            memset(sx, 0, sizeof *sx);
            sx->stx_mask = STATX_BASIC_STATS | STATX_BTIME;
            sx->stx_blksize = (uint32_t)st.st_blksize;
            sx->stx_nlink = (uint32_t)st.st_nlink;
            sx->stx_uid = st.st_uid;
            sx->stx_gid = st.st_gid;
            sx->stx_mode = (uint16_t)st.st_mode;
            sx->stx_ino = st.st_ino;
            sx->stx_size = (uint64_t)st.st_size;
            sx->stx_blocks = (uint64_t)st.st_blocks;
            set_ts(&sx->stx_atime, &st.st_atim);
            set_ts(&sx->stx_btime, &st.st_ctim);
            set_ts(&sx->stx_ctime, &st.st_ctim);
            set_ts(&sx->stx_mtime, &st.st_mtim);
            sx->stx_rdev_major = major(st.st_rdev);
            sx->stx_rdev_minor = minor(st.st_rdev);
            sx->stx_dev_major = major(st.st_dev);
            sx->stx_dev_minor = minor(st.st_dev);
        }
    }
    regs[REG_RAX] = ret;
    errno = saved;
}

/* statx, newfstatat and mkdirat raise SIGSYS (wasmtime makes them directly, not through libc), and the
 * handler answers them. The filter is inherited by every thread the process starts. */
static void trap_stat_calls(void) {
    real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSYS, &sa, NULL);
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_statx, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_newfstatat, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mkdirat, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
    };
    struct sock_fprog prog = {sizeof filter / sizeof filter[0], filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
        abort();
}

/* Runs before main; the variables are set by build.py, which refuses to start without them. */
__attribute__((constructor)) static void configure(void) {
    const char *seed = getenv("SLUICE_REPRO_SEED");
    const char *epoch = getenv("SOURCE_DATE_EPOCH");
    if (!seed || strlen(seed) != 64 || !epoch) abort();
    for (int i = 0; i < 64; i++) {
        int d = hex_digit(seed[i]);
        if (d < 0) abort();
        seed_words[i / 16] = (seed_words[i / 16] << 4) | (uint64_t)d;
    }
    epoch_seconds = strtoll(epoch, NULL, 10);
    const char *root = getenv("SLUICE_REPRO_ROOT");
    struct stat st;
    if (root && stat(root, &st) == 0) sandbox_dev = st.st_dev;
    configured = 1;
    if (sandbox_dev) trap_stat_calls();
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* splitmix64, to spread the call index into a xoshiro state that is never all zero. */
static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void fill(void *buf, size_t len) {
    uint64_t s[4], mix = random_calls++;
    for (int i = 0; i < 4; i++) s[i] = seed_words[i] ^ splitmix(&mix);
    unsigned char *out = buf;
    while (len > 0) {
        uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = rotl(s[3], 45);
        size_t n = len < 8 ? len : 8;
        memcpy(out, &r, n);
        out += n;
        len -= n;
    }
}

ssize_t getrandom(void *buf, size_t len, unsigned int flags) {
    (void)flags;
    if (!configured) abort();
    fill(buf, len);
    return (ssize_t)len;
}

int getentropy(void *buf, size_t len) {
    if (len > 256) {
        errno = EIO;
        return -1;
    }
    if (!configured) abort();
    fill(buf, len);
    return 0;
}

/* Rust's getrandom crate (0.2) asks the kernel through syscall(SYS_getrandom, ...), not through
 * libc's getrandom; every other system call goes through unchanged. */
long syscall(long number, ...) {
    va_list ap;
    long a[6];
    va_start(ap, number);
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_getrandom) return getrandom((void *)a[0], (size_t)a[1], (unsigned int)a[2]);
    if (number == SYS_clock_gettime)
        return clock_gettime((clockid_t)a[0], (struct timespec *)a[1]);
    static long (*real)(long, ...);
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

static int wall_clock(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    uint64_t us = ++clock_calls;
    ts->tv_sec = (time_t)((wall_clock(id) ? epoch_seconds : 0) + (long long)(us / 1000000));
    ts->tv_nsec = (long)(us % 1000000) * 1000;
    return 0;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timeval *volatile out = tv;  /* glibc declares it non-null; callers pass NULL */
    if (out) {
        uint64_t us = ++clock_calls;
        out->tv_sec = (time_t)(epoch_seconds + (long long)(us / 1000000));
        out->tv_usec = (long)(us % 1000000);
    }
    return 0;
}

time_t time(time_t *t) {
    time_t now = (time_t)epoch_seconds;
    if (t) *t = now;
    return now;
}

/* File times. componentize-py unpacks CPython's standard library into TMPDIR while it builds,
 * so the kernel stamps those files and their directories with the real time, and the guest
 * reads them (.pyc headers, importlib's directory cache). Files and directories that this
 * process tree creates on the build's tmpfs get SOURCE_DATE_EPOCH as soon as they are closed
 * or made, and so does their directory (whose time moved when they were added). */
static void clamp_path(int dirfd, const char *path) {
    struct timespec ts[2] = {{(time_t)epoch_seconds, 0}, {(time_t)epoch_seconds, 0}};
    utimensat(dirfd, path, ts, AT_SYMLINK_NOFOLLOW);
}

static void clamp_with_parent(const char *path) {
    char parent[4096];
    clamp_path(AT_FDCWD, path);
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof parent) return;
    memcpy(parent, path, n + 1);
    char *slash = strrchr(parent, '/');
    if (!slash) {
        clamp_path(AT_FDCWD, ".");
        return;
    }
    if (slash == parent) slash[1] = 0;
    else *slash = 0;
    clamp_path(AT_FDCWD, parent);
}

static int on_sandbox(int fd) {
    struct stat st;
    /* fstat(2) directly: libc's fstat is newfstatat, which the trap answers with SANDBOX_DEV. */
    return sandbox_dev && real_syscall && real_syscall(SYS_fstat, fd, &st) == 0
           && st.st_dev == sandbox_dev;
}

static void clamp_fd(int fd) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    if (path[0] == '/') clamp_with_parent(path);
}

int close(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "close");
    if (on_sandbox(fd)) clamp_fd(fd);
    return real(fd);
}

int mkdir(const char *path, mode_t mode) {
    static int (*real)(const char *, mode_t);
    if (!real) real = (int (*)(const char *, mode_t))dlsym(RTLD_NEXT, "mkdir");
    int rc = real(path, mode);
    if (rc == 0 && sandbox_dev) clamp_with_parent(path);
    return rc;
}
