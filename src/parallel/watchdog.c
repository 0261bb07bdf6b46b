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

/* shared between the main thread (writer) and the watchdog thread (reader) */
static _Atomic(const char *) wd_op;      /* the collective in progress; NULL: none */
static atomic_uint_fast64_t  wd_seq;     /* bumped by every outermost enter        */
static atomic_int            wd_group;   /* its group size                         */
static atomic_int            wd_step = -1;
static atomic_int            wd_armed;   /* the thread runs                        */
static int                   wd_depth;   /* main thread only: nesting              */

/* the thread's own state, under wd_mu */
static pthread_mutex_t wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  wd_cv;
static pthread_t       wd_thread;
static int             wd_stop;
static double          wd_timeout_s;
static int             wd_rank;
static void          (*wd_expire)(void);

int mt_comm_wd_enter(const char *op, int group_size)
{
    if (!atomic_load_explicit(&wd_armed, memory_order_relaxed) || group_size <= 1) return 0;
    if (wd_depth++ > 0) return 1;
    atomic_store_explicit(&wd_group, group_size, memory_order_relaxed);
    /* one writer (the main thread): a load and a store, no locked read-modify-write */
    atomic_store_explicit(&wd_seq, atomic_load_explicit(&wd_seq, memory_order_relaxed) + 1, memory_order_relaxed);
    atomic_store_explicit(&wd_op, op, memory_order_release);
    return 1;
}

void mt_comm_wd_leave(int entered)
{
    if (!entered) return;
    if (--wd_depth == 0) atomic_store_explicit(&wd_op, NULL, memory_order_release);
}

void mt_comm_watchdog_set_step(int step)
{
    atomic_store_explicit(&wd_step, step, memory_order_relaxed);
}

static void *wd_main(void *arg)
{
    (void)arg;
    double period = wd_timeout_s / 4 < 1.0 ? wd_timeout_s / 4 : 1.0;
    uint_fast64_t seen = 0;
    double since = 0;
    pthread_mutex_lock(&wd_mu);
    while (!wd_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + period;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        int w = pthread_cond_timedwait(&wd_cv, &wd_mu, &ts);
        if (wd_stop) break;
        if (w != ETIMEDOUT && w != 0) continue;
        const char *op = atomic_load_explicit(&wd_op, memory_order_acquire);
        uint_fast64_t seq = atomic_load_explicit(&wd_seq, memory_order_relaxed);
        double now = mt_time_sec();
        if (!op) { seen = 0; continue; }
        if (seq != seen) { seen = seq; since = now; continue; }
        if (now - since < wd_timeout_s) continue;
        int step = atomic_load_explicit(&wd_step, memory_order_relaxed);
        char where[48];
        if (step >= 0) snprintf(where, sizeof where, "at step %d", step);
        else snprintf(where, sizeof where, "during setup");
        fprintf(stderr,
                "meshtrain: rank %d: collective %s on a group of %d ranks %s has not completed after %g s "
                "(comm_timeout_s): another rank of the group is stopped, dead or stuck; ending the job\n",
                wd_rank, op, atomic_load_explicit(&wd_group, memory_order_relaxed), where, wd_timeout_s);
        fflush(stderr);
        break;
    }
    int fired = !wd_stop;
    pthread_mutex_unlock(&wd_mu);
    if (fired) wd_expire(); /* tools/: _exit(1); should it return, the watchdog has stopped watching */
    return NULL;
}

enum mt_status mt_comm_watchdog_start(struct mt_ctx *ctx, double timeout_s, void (*on_expire)(void))
{
    if (!on_expire) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "watchdog: NULL on_expire");
    if (atomic_load(&wd_armed)) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "watchdog: already running");
    if (!(timeout_s > 0)) return MT_OK; /* off */
    int world = 1, rank = 0;
    mt_comm_world_info(&world, &rank);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wd_cv, &ca);
    pthread_condattr_destroy(&ca);
    wd_stop = 0;
    wd_timeout_s = timeout_s;
    wd_rank = rank;
    wd_expire = on_expire;
    wd_depth = 0;
    atomic_store(&wd_op, NULL);
    if (pthread_create(&wd_thread, NULL, wd_main, NULL) != 0) {
        pthread_cond_destroy(&wd_cv);
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "watchdog: cannot start its thread");
    }
    atomic_store(&wd_armed, 1);
    return MT_OK;
}

void mt_comm_watchdog_stop(void)
{
    if (!atomic_load(&wd_armed)) return;
    atomic_store(&wd_armed, 0);
    pthread_mutex_lock(&wd_mu);
    wd_stop = 1;
    pthread_cond_signal(&wd_cv);
    pthread_mutex_unlock(&wd_mu);
    pthread_join(wd_thread, NULL);
    pthread_cond_destroy(&wd_cv);
    atomic_store(&wd_op, NULL);
    wd_depth = 0;
}
