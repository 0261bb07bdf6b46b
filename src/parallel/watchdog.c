/*
 * watchdog.c — the collective watchdog: a stalled collective ends the job.
 *
 * Why: MPI has no portable timeout. A rank that is stopped (SIGSTOP), swapped
 * out, or stuck outside MPI leaves every other rank of its group blocked in
 * the next collective forever, and mpirun sees nothing wrong (no process
 * died). The waiting rank is the only one that can notice.
 *
 * Design (the simplest correct one we found): the main thread marks each
 * blocking collective (and each wait on a non-blocking one) in shared state
 * (comm.c: mt_comm_wd_enter / _leave around the dispatch); one watchdog
 * thread wakes every min(1 s, timeout / 4), and when it sees the SAME
 * collective (same sequence number) still in progress for timeout seconds it
 * prints one line naming this rank, the collective, its group size and the
 * step, then calls the caller's on_expire (tools/: _exit(1); mpirun then ends
 * the other ranks). The thread never calls MPI (MPI_THREAD_FUNNELED).
 *
 * The alternative — every collective non-blocking, polled with MPI_Test
 * against a deadline — would replace the tuned blocking algorithms by the
 * (slower) non-blocking ones and rewrite every call; the marking here costs
 * three atomic stores per collective (measured in docs/parallel.md).
 *
 * Precision: the watchdog fires between timeout and timeout + one poll
 * period after the collective began (never before: it times from the first
 * poll that saw it). Nested marks (an implementation calling another
 * collective) keep the outermost one.
 */
#define _GNU_SOURCE
#include "comm_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* All of the watchdog's state, in one place: one of the few pieces of
 * mutable process-wide state, which mt_core.h names. Why not on a handle: the
 * watchdog watches the process (one thread for every communicator, started
 * and stopped by tools/ around the run), collectives mark it from comm.c
 * where no context is at hand, and on_expire takes no argument, so there is
 * no handle for it to hang off. */
static struct watchdog {
    /* shared between the main thread (writer) and the watchdog thread (reader) */
    _Atomic(const char *) op;        /* the collective in progress; NULL: none */
    atomic_uint_fast64_t  seq;       /* bumped by every outermost enter        */
    atomic_int            group;     /* its group size                         */
    atomic_int            step;      /* for the message; -1: setup             */
    atomic_int            armed;     /* the thread runs                        */
    int                   depth;     /* main thread only: nesting              */
    /* the thread's own state, under mu */
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    pthread_t       thread;
    int             stop;
    double          timeout_s;
    int             rank;
    void          (*expire)(void);
} wd = {.step = -1, .mu = PTHREAD_MUTEX_INITIALIZER};

int mt_comm_wd_enter(const char *op, int group_size)
{
    if (!atomic_load_explicit(&wd.armed, memory_order_relaxed) || group_size <= 1) return 0;
    if (wd.depth++ > 0) return 1;
    atomic_store_explicit(&wd.group, group_size, memory_order_relaxed);
    /* one writer (the main thread): a load and a store, no locked read-modify-write */
    atomic_store_explicit(&wd.seq, atomic_load_explicit(&wd.seq, memory_order_relaxed) + 1, memory_order_relaxed);
    atomic_store_explicit(&wd.op, op, memory_order_release);
    return 1;
}

void mt_comm_wd_leave(int entered)
{
    if (!entered) return;
    if (--wd.depth == 0) atomic_store_explicit(&wd.op, NULL, memory_order_release);
}

void mt_comm_watchdog_set_step(int step)
{
    atomic_store_explicit(&wd.step, step, memory_order_relaxed);
}

static void *wd_main(void *arg)
{
    (void)arg;
    double period = wd.timeout_s / 4 < 1.0 ? wd.timeout_s / 4 : 1.0;
    uint_fast64_t seen = 0;
    double since = 0;
    pthread_mutex_lock(&wd.mu);
    while (!wd.stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + period;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        int w = pthread_cond_timedwait(&wd.cv, &wd.mu, &ts);
        if (wd.stop) break;
        if (w != ETIMEDOUT && w != 0) continue;
        const char *op = atomic_load_explicit(&wd.op, memory_order_acquire);
        uint_fast64_t seq = atomic_load_explicit(&wd.seq, memory_order_relaxed);
        double now = mt_time_sec();
        if (!op) { seen = 0; continue; }
        if (seq != seen) { seen = seq; since = now; continue; }
        if (now - since < wd.timeout_s) continue;
        int step = atomic_load_explicit(&wd.step, memory_order_relaxed);
        char where[48];
        if (step >= 0) snprintf(where, sizeof where, "at step %d", step);
        else snprintf(where, sizeof where, "during setup");
        fprintf(stderr,
                "meshtrain: rank %d: collective %s on a group of %d ranks %s has not completed after %g s "
                "(comm_timeout_s): another rank of the group is stopped, dead or stuck; ending the job\n",
                wd.rank, op, atomic_load_explicit(&wd.group, memory_order_relaxed), where, wd.timeout_s);
        fflush(stderr);
        break;
    }
    int fired = !wd.stop;
    pthread_mutex_unlock(&wd.mu);
    if (fired) wd.expire(); /* tools/: _exit(1); should it return, the watchdog has stopped watching */
    return NULL;
}

enum mt_status mt_comm_watchdog_start(struct mt_ctx *ctx, double timeout_s, void (*on_expire)(void))
{
    if (!on_expire) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "watchdog: NULL on_expire");
    if (atomic_load(&wd.armed)) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "watchdog: already running");
    if (!(timeout_s > 0)) return MT_OK; /* off */
    int world = 1, rank = 0;
    mt_comm_world_info(&world, &rank);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wd.cv, &ca);
    pthread_condattr_destroy(&ca);
    wd.stop = 0;
    wd.timeout_s = timeout_s;
    wd.rank = rank;
    wd.expire = on_expire;
    wd.depth = 0;
    atomic_store(&wd.op, NULL);
    if (pthread_create(&wd.thread, NULL, wd_main, NULL) != 0) {
        pthread_cond_destroy(&wd.cv);
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "watchdog: cannot start its thread");
    }
    atomic_store(&wd.armed, 1);
    return MT_OK;
}

void mt_comm_watchdog_stop(void)
{
    if (!atomic_load(&wd.armed)) return;
    atomic_store(&wd.armed, 0);
    pthread_mutex_lock(&wd.mu);
    wd.stop = 1;
    pthread_cond_signal(&wd.cv);
    pthread_mutex_unlock(&wd.mu);
    pthread_join(wd.thread, NULL);
    pthread_cond_destroy(&wd.cv);
    atomic_store(&wd.op, NULL);
    wd.depth = 0;
}
