/* The epoch ticker of filters/engine.py as a native thread: it advances a wasmtime engine's
 * epoch every interval without ever taking Python's GIL.
 *
 * The thread is handed the address of wasmtime_engine_increment_epoch and an engine of its
 * own (a wasmtime_engine_clone the caller made, so the engine outlives any Python object), and
 * calls nothing else. Catch-up follows the Python ticker it replaces: a slightly late wake-up
 * adds the ticks that were due, a long gap adds at most `max_catch_up` of them, so time the
 * thread was not scheduled is not charged to a guest call that has only just started.
 *
 * While parked (no guest call in flight for a while: the engine's watcher decides) the thread
 * waits on a condition variable and costs nothing; et_resume wakes it and the clock restarts.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef void (*et_increment_fn)(void *engine);

typedef struct et_ticker {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    et_increment_fn increment;
    void *engine;
    int64_t interval_ns;
    int64_t max_catch_up;
    /* Written under `lock`, read by the thread without it between ticks. */
    volatile int parked;
    volatile int stop;
    /* Epochs added so far (tests and diagnostics). */
    volatile uint64_t ticks;
} et_ticker;

static int64_t et_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void et_sleep_ns(int64_t ns) {
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void *et_run(void *arg) {
    et_ticker *t = (et_ticker *)arg;
    for (;;) {
        pthread_mutex_lock(&t->lock);
        while (t->parked && !t->stop) {
            pthread_cond_wait(&t->cond, &t->lock);
        }
        int stop = t->stop;
        pthread_mutex_unlock(&t->lock);
        if (stop) {
            return NULL;
        }
        int64_t started = et_now_ns();
        int64_t done = 0;
        for (;;) {
            et_sleep_ns(t->interval_ns);
            if (__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
                return NULL;
            }
            int64_t due = (et_now_ns() - started) / t->interval_ns;
            if (due - done > t->max_catch_up) {
                done = due - t->max_catch_up;
            }
            while (done < due) {
                t->increment(t->engine);
                __atomic_add_fetch(&t->ticks, 1, __ATOMIC_RELAXED);
                done++;
            }
            if (__atomic_load_n(&t->parked, __ATOMIC_ACQUIRE)) {
                break;
            }
        }
    }
}

et_ticker *et_start(uintptr_t increment, uintptr_t engine, int64_t interval_ns,
                    int64_t max_catch_up, int parked) {
    if (increment == 0 || engine == 0 || interval_ns <= 0 || max_catch_up < 0) {
        return NULL;
    }
    et_ticker *t = (et_ticker *)calloc(1, sizeof(et_ticker));
    if (t == NULL) {
        return NULL;
    }
    t->increment = (et_increment_fn)increment;
    t->engine = (void *)engine;
    t->interval_ns = interval_ns;
    t->max_catch_up = max_catch_up;
    t->parked = parked != 0;
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
    if (pthread_create(&t->thread, NULL, et_run, t) != 0) {
        pthread_cond_destroy(&t->cond);
        pthread_mutex_destroy(&t->lock);
        free(t);
        return NULL;
    }
    return t;
}

void et_park(et_ticker *t) {
    pthread_mutex_lock(&t->lock);
    __atomic_store_n(&t->parked, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&t->lock);
}

void et_resume(et_ticker *t) {
    pthread_mutex_lock(&t->lock);
    __atomic_store_n(&t->parked, 0, __ATOMIC_RELEASE);
    pthread_cond_signal(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

uint64_t et_ticks(et_ticker *t) {
    return __atomic_load_n(&t->ticks, __ATOMIC_RELAXED);
}

/* Stop the thread and wait for it (at most one interval), then free the ticker. The engine
 * clone is the caller's to delete, after this returns. */
void et_stop(et_ticker *t) {
    pthread_mutex_lock(&t->lock);
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&t->cond);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->lock);
    free(t);
}
