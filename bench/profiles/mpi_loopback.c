/*
 * mpi_loopback.c — what two MPI ranks on this machine get from each other:
 * ping-pong latency (8 bytes) and bandwidth of the collectives meshtrain uses
 * (allreduce, allgather, point-to-point) at large sizes. One JSON line.
 *
 * Build and run (bench/profiles/measure_cpu.sh does both):
 *   mpicc -O2 bench/profiles/mpi_loopback.c -o mpi_loopback
 *   mpirun -np 2 ./mpi_loopback
 *
 * Convention (the cost model's, src/plan/plan.c): a ring all-gather of S
 * bytes over n ranks moves V = (n-1)/n * S per rank, an all-reduce twice
 * that, a send/recv pair S/2 each way. Each collective is timed at sizes
 * 4 KiB .. 64 MiB and t = latency + V / bandwidth is fitted by least
 * squares of the RELATIVE error (small messages count as much as large
 * ones) over sizes up to 4 MiB, which stay in the caches; beyond that the
 * bandwidth of the largest size is reported as large_bandwidth. These are
 * the numbers the profile gives a link.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* messages up to LARGE bytes stay in the caches: fitted as latency +
 * volume / bandwidth; above it the bandwidth is the largest size's */
#define LARGE (4 << 20)

static double best_time(void (*fn)(void *, size_t), void *buf, size_t bytes, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        fn(buf, bytes);
        double dt = MPI_Wtime() - t0, mx;
        MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r > 0 && mx < best) best = mx;   /* rep 0 warms up */
    }
    return best;
}

static void do_allreduce(void *buf, size_t bytes)
{
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)(bytes / 4), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static void do_allgather(void *buf, size_t bytes)
{
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)(bytes / 4 / (size_t)n), MPI_FLOAT, MPI_COMM_WORLD);
}

static void do_sendrecv(void *buf, size_t bytes)
{
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    char *b = buf;
    MPI_Sendrecv(b, (int)(bytes / 2), MPI_BYTE, (rank + 1) % n, 0, b + bytes / 2, (int)(bytes / 2), MPI_BYTE,
                 (rank + n - 1) % n, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t big = (size_t)64 << 20;
    char *buf = calloc(big, 1);
    /* latency: half a ping-pong of 8 bytes */
    double lat = 1e30;
    for (int r = 0; r < 2000; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(buf, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
            MPI_Recv(buf, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
        }
        double dt = (MPI_Wtime() - t0) / 2;
        if (r > 10 && dt < lat) lat = dt;
    }
    MPI_Bcast(&lat, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    double f = (double)(n - 1) / n;
    /* time t(S) of each collective over sizes 4 KiB .. 64 MiB; least squares
     * t = a + V(S) / bw, V = the per-rank volume of the ring algorithm */
    void (*fns[3])(void *, size_t) = {do_allreduce, do_allgather, do_sendrecv};
    const char *names[3] = {"allreduce", "allgather", "sendrecv"};
    if (rank == 0) printf("{\"ranks\": %d, \"pingpong_latency_s\": %.3g", n, lat);
    for (int k = 0; k < 3; k++) {
        /* relative least squares: minimise sum ((a + c V - t) / t)^2, i.e. fit
         * a/t + c V/t = 1 (small sizes count as much as large ones) */
        double s11 = 0, s12 = 0, s22 = 0, b1 = 0, b2 = 0;
        if (rank == 0) printf(", \"%s\": {\"points\": [", names[k]);
        double large_bw = 0;
        for (size_t S = 4096; S <= big; S *= 4) {
            double t = best_time(fns[k], buf, S, S < (1 << 20) ? 50 : 6);
            double V = k == 0 ? 2 * f * (double)S : k == 1 ? f * (double)S : (double)S / 2;
            double x1 = 1 / t, x2 = V / t;
            if (S <= LARGE) { s11 += x1 * x1; s12 += x1 * x2; s22 += x2 * x2; b1 += x1; b2 += x2; }
            else large_bw = V / t;   /* the largest size: buffers far beyond the caches */
            if (rank == 0) printf("%s[%zu, %.4g]", S == 4096 ? "" : ", ", S, t);
        }
        double det = s11 * s22 - s12 * s12;
        double icpt = (b1 * s22 - b2 * s12) / det, slope = (s11 * b2 - s12 * b1) / det;
        if (rank == 0)
            printf("], \"bandwidth_bytes_per_s\": %.4g, \"latency_s\": %.3g, \"large_bytes\": %d, "
                   "\"large_bandwidth_bytes_per_s\": %.4g}", 1.0 / slope, icpt, LARGE, large_bw);
    }
    if (rank == 0) printf("}\n");
    free(buf);
    MPI_Finalize();
    return 0;
}
